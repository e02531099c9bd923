"""jobkit.observe.ray_start: which dashboard modules the head starts (read from Ray's source, never imported)."""

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
