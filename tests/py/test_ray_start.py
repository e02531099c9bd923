"""jobkit.observe.ray_start: which dashboard modules the head starts (read from Ray's source, never imported)."""

import pytest

from jobkit.observe import ray_start


def _modules_dir(tmp_path, classes):
    root = tmp_path / "modules"
    for i, (name, base) in enumerate(classes):
        pkg = root / f"m{i}"
        pkg.mkdir(parents=True)
        (pkg / f"m{i}_head.py").write_text(f"import x\n\nclass {name}(\n    {base}, Other\n):\n    pass\n")
    return str(root)


def test_unneeded_modules_are_left_out(tmp_path):
    classes = [(n, "SubprocessModule") for n in sorted(ray_start.UNNEEDED_DASHBOARD_MODULES)]
    classes += [("NodeHead", "SubprocessModule"), ("UsageStatsHead", "dashboard_utils.DashboardHeadModule")]
    classes += [("Helper", "object")]  # not a dashboard module
    assert ray_start.modules_to_load(_modules_dir(tmp_path, classes)) == "NodeHead,UsageStatsHead"


def test_an_unknown_ray_keeps_every_module(tmp_path):
    # One of the names to leave out is missing: this Ray's modules may be named otherwise, so none is left out.
    classes = [("NodeHead", "SubprocessModule"), ("DataHead", "SubprocessModule")]
    assert ray_start.modules_to_load(_modules_dir(tmp_path, classes)) is None


def test_the_installed_ray_is_recognised():
    import os

    import ray.dashboard

    modules = ray_start.modules_to_load(os.path.join(os.path.dirname(ray.dashboard.__file__), "modules"))
    assert modules is not None
    assert {"NodeHead", "ReportHead", "MetricsHead"} <= set(modules.split(","))
    assert not ray_start.UNNEEDED_DASHBOARD_MODULES & set(modules.split(","))


def test_the_raylet_prestarts_at_least_the_asked_workers():
    cmd = ["raylet", "--num_prestart_python_workers=0", "--dashboard_agent_command=python agent.py", "--head"]
    assert ray_start.raylet_command(cmd, 1) == [
        "raylet",
        "--num_prestart_python_workers=1",
        "--dashboard_agent_command=python agent.py",
        "--head",
    ]
    assert ray_start.raylet_command(["raylet", "--num_prestart_python_workers=4"], 1)[1].endswith("=4")
    assert ray_start.raylet_command(cmd, 0) == cmd


def test_prestart_settings_yield_to_the_callers(monkeypatch):
    monkeypatch.delenv("RAY_enable_worker_prestart", raising=False)
    monkeypatch.setenv("RAY_num_workers_soft_limit", "3")
    assert ray_start.prestart_config(2) == {"RAY_enable_worker_prestart": "1"}
    monkeypatch.setenv("RAY_PRESTART_WORKERS", "0")
    assert ray_start.prestart_workers() == 0
    monkeypatch.setenv("RAY_PRESTART_WORKERS", "x")
    assert ray_start.prestart_workers() == 1


@pytest.mark.parametrize("first, order, nice", [("1", "", None), ("0", "", "9"), ("", "", "9"), ("", "first", None)])
def test_spawns_are_patched_nice_only_for_a_dashboard_nobody_waits_for(monkeypatch, first, order, nice):
    from ray._private import services

    started = []
    monkeypatch.setattr(services, "start_ray_process", lambda cmd, kind, *a, **kw: started.append((cmd, kind, kw)))
    monkeypatch.setenv("RAY_DASHBOARD_FIRST", first)
    monkeypatch.setenv("RAY_DASHBOARD_ORDER", order)
    monkeypatch.setenv("JOBKIT_RAY_SPAWN_NICE", "9")
    monkeypatch.delenv("RAY_PRESTART_WORKERS", raising=False)
    monkeypatch.delenv("RAY_num_workers_soft_limit", raising=False)
    monkeypatch.delenv("RAY_enable_worker_prestart", raising=False)
    ray_start.patch_spawns(head=True)
    services.start_ray_process(["python", "dashboard.py"], "dashboard", fate_share=False)
    services.start_ray_process(["raylet", "--num_prestart_python_workers=0"], "raylet", env_updates={"A": "1"})
    (dash, _, _), (raylet, _, raylet_kw) = started
    assert (dash[dash.index("-n") + 1] if "-n" in dash else None) == nice
    assert dash[-1].startswith("--modules-to-load=") and "JobHead" not in dash[-1]
    assert raylet == ["raylet", "--num_prestart_python_workers=1"]
    assert raylet_kw["env_updates"] == {"A": "1", "RAY_enable_worker_prestart": "1", "RAY_num_workers_soft_limit": "1"}


@pytest.mark.parametrize(
    "order, first, expected",
    [("", "", "last"), ("", "0", "beside"), ("", "1", "first"), ("first", "0", "first"), ("x", "0", "beside")],
)
def test_dashboard_order_reads_its_setting_and_the_older_one(monkeypatch, order, first, expected):
    monkeypatch.setenv("RAY_DASHBOARD_ORDER", order)
    monkeypatch.setenv("RAY_DASHBOARD_FIRST", first)
    assert ray_start.dashboard_order() == expected
    assert ray_start.dashboard_first() == (expected == "first")
