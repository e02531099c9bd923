"""`jobkit launch` starting JAX's distributed runtime itself (launch/jax_distributed.py) with the heartbeat timeout
of JAX_HEARTBEAT_TIMEOUT (core/hang_settings.py), without Slurm: the arguments it builds, the default rule, the
one-line errors, and one real start of JAX 0.12's runtime (one process) with those keyword arguments."""

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from conftest import PY_DIR, REPO

from jobkit.core import hang_settings
from jobkit.core.errors import EXIT_SETTINGS
from jobkit.launch import entry as launch
from jobkit.launch import jax_distributed as jd
from jobkit.ops import hang_watchdog

CONFIG = REPO / "configs" / "tiny.yml"
TWO_NODES = {
    "NNODES": "2",
    "NODE_RANK": "1",
    "JAX_COORDINATOR_IP": "10.77.0.1",
    "JAX_COORDINATOR_PORT": "41234",
}


def test_default_heartbeat_outlasts_every_watchdog_allowance():
    # The rule: the longest no-step limit, the stack wait and the stop grace, plus the margin.
    assert hang_settings.heartbeat_timeout({}) == (3600 + 60 + 10 + 60, False)
    # A compile allowance below the floor: the floor is the longest limit.
    assert hang_settings.heartbeat_timeout({"HANG_TIMEOUT": "5000", "HANG_COMPILE_TIMEOUT": "100"}) == (5130, False)
    for env in ({}, {"HANG_TIMEOUT": "30"}, {"HANG_COMPILE_TIMEOUT": "7200.5"}, {"HANG_TIMEOUT": "off"}):
        settings = hang_settings.Settings.from_env(env)
        heartbeat, _ = hang_settings.heartbeat_timeout(env)
        # Before step 0, after steps 0-1, and at the floor: each limit plus stacks and stop is inside it.
        for limit in (settings.compile_allowance, max(settings.floor, settings.compile_allowance / 4), settings.floor):
            assert limit + hang_settings.STACK_WAIT + hang_settings.STOP_GRACE < heartbeat, (env, limit)
    assert hang_settings.heartbeat_timeout({"JAX_HEARTBEAT_TIMEOUT": "10"}) == (10, True)
    assert hang_settings.heartbeat_timeout({"JAX_HEARTBEAT_TIMEOUT": " 007 "}) == (7, True)


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", "1e3", "1000001", "١٢"])
def test_bad_heartbeat_setting_is_one_line(value):
    with pytest.raises(hang_settings.SettingsError) as err:
        hang_settings.heartbeat_timeout({"JAX_HEARTBEAT_TIMEOUT": value})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"JAX_HEARTBEAT_TIMEOUT={value} is not a whole number of seconds from 1 to 1000000;")
    assert "JAX_HEARTBEAT_TIMEOUT=3730" in message


def test_hang_watchdog_check_refuses_a_bad_heartbeat_as_a_refused_setting(monkeypatch):
    monkeypatch.setenv("JAX_HEARTBEAT_TIMEOUT", "soon")
    result = CliRunner().invoke(hang_watchdog.command, ["--check"])
    assert result.exit_code == EXIT_SETTINGS
    assert "JAX_HEARTBEAT_TIMEOUT=soon is not a whole number of seconds" in result.output
    monkeypatch.setenv("JAX_HEARTBEAT_TIMEOUT", "600")
    assert CliRunner().invoke(hang_watchdog.command, ["--check"]).exit_code == 0


def test_plan_for_a_two_node_run_has_maxtexts_arguments_and_the_heartbeat():
    plan = jd.plan(TWO_NODES, CONFIG, ["steps=5"])
    assert plan.kwargs == {
        "coordinator_address": "10.77.0.1:41234",
        "num_processes": 2,
        "process_id": 1,
        "initialization_timeout": 300,
        "heartbeat_timeout_seconds": 3730,
        "local_device_ids": None,
    }
    assert plan.all_devices  # no device variable: every GPU, as MaxText's GPU path sets it
    assert plan.line() == (
        "[launch] JAX distributed: process 1 of 2, coordinator 10.77.0.1:41234, init timeout 300 s, heartbeat"
        " timeout 3730 s (default: the hang watchdog's 3670 s + 60 s); MaxText: skip_jax_distributed_system=true"
    )


def test_plan_takes_devices_init_timeout_and_heartbeat_from_the_run():
    env = {**TWO_NODES, "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "4", "JAX_HEARTBEAT_TIMEOUT": "10"}
    plan = jd.plan(env, CONFIG, ["jax_distributed_initialization_timeout=900"])
    assert plan.kwargs["local_device_ids"] == [0, 1, 2, 3] and not plan.all_devices
    assert plan.kwargs["initialization_timeout"] == 900
    assert plan.kwargs["heartbeat_timeout_seconds"] == 10
    assert (
        "(JAX_HEARTBEAT_TIMEOUT; not above the hang watchdog's 3670 s: a stalled rank is killed by JAX" in plan.line()
    )
    assert jd.local_devices({"SLURM_STEP_GPUS": "2,3"}) == ([2, 3], False)
    assert jd.local_devices({"CUDA_VISIBLE_DEVICES": "GPU-uuid"}) == (None, False)  # MaxText's fallback


def test_init_timeout_from_the_config_file(tmp_path):
    config = tmp_path / "c.yml"
    config.write_text("base_config: base.yml\njax_distributed_initialization_timeout: 1200  # slow fabric\n")
    assert jd.init_timeout(config, []) == 1200
    assert jd.init_timeout(config, ["jax_distributed_initialization_timeout=60"]) == 60
    assert jd.init_timeout(tmp_path / "missing.yml", []) == 300
    with pytest.raises(jd.SetupError, match=r"^jax_distributed_initialization_timeout=soon on the command line is not"):
        jd.init_timeout(config, ["jax_distributed_initialization_timeout=soon"])


@pytest.mark.parametrize(
    "env, overrides",
    [
        ({}, []),  # run_local.sh: one node
        ({"NNODES": "1", "NODE_RANK": "0"}, []),
        ({"NNODES": "2", "NODE_RANK": "0"}, []),  # no coordinator: MaxText's own path, unchanged
        (TWO_NODES, ["skip_jax_distributed_system=false"]),  # the user's own say
    ],
)
def test_single_node_and_opt_out_runs_are_left_to_maxtext(env, overrides):
    assert jd.plan(env, CONFIG, overrides) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"NODE_RANK": "2"}, "NODE_RANK=2 is not a rank below NNODES=2"),
        ({"NNODES": "two"}, "NNODES=two is not a node count"),
        ({"JAX_COORDINATOR_PORT": ""}, "JAX_COORDINATOR_PORT= is not a port"),
        ({"JAX_HEARTBEAT_TIMEOUT": "-1"}, "JAX_HEARTBEAT_TIMEOUT=-1 is not a whole number of seconds"),
        ({"HANG_TIMEOUT": "nan"}, "HANG_TIMEOUT=nan is not a positive number of seconds"),
    ],
)
def test_launch_refuses_bad_settings_in_one_line_before_anything(change, message, monkeypatch, capsys, clean_env):
    for name, value in {**TWO_NODES, **change}.items():
        monkeypatch.setenv(name, value)
    started = []
    monkeypatch.setattr(jd, "start", started.append)
    monkeypatch.setattr(launch, "find_train_module", lambda: pytest.fail("MaxText imported before the check"))
    assert launch.main([str(CONFIG)]) == EXIT_SETTINGS
    out, err = capsys.readouterr()
    assert out == "" and started == []
    assert err.startswith(f"jobkit.launch: {message}") and err.count("\n") == 1, err


def test_launch_starts_the_runtime_then_tells_maxtext_to_skip_its_own(tmp_path, monkeypatch, capsys, clean_env):
    (tmp_path / "fake_train_dist.py").write_text(
        textwrap.dedent(
            """
            SEEN = []
            def main(argv):
                SEEN.append(list(argv))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(launch, "TRAIN_MODULES", ("fake_train_dist",))
    for name, value in {**TWO_NODES, "JAX_PLATFORMS": "cpu", "JAX_HEARTBEAT_TIMEOUT": "42"}.items():
        monkeypatch.setenv(name, value)
    plans = []
    monkeypatch.setattr(jd, "start", lambda plan: plans.append(plan) or ["skip_jax_distributed_system=true"])
    assert launch.main([str(CONFIG), "steps=3"]) == 0
    (plan,) = plans
    assert plan.kwargs["heartbeat_timeout_seconds"] == 42 and plan.kwargs["process_id"] == 1
    import fake_train_dist

    assert fake_train_dist.SEEN[0][1:] == [str(CONFIG), "steps=3", "skip_jax_distributed_system=true"]


def test_launch_without_a_coordinator_passes_maxtext_nothing_new(tmp_path, monkeypatch, clean_env):
    (tmp_path / "fake_train_one.py").write_text("SEEN = []\ndef main(argv):\n    SEEN.append(list(argv))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(launch, "TRAIN_MODULES", ("fake_train_one",))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(jd, "start", lambda plan: pytest.fail("a one-node run started a runtime"))
    assert launch.main([str(CONFIG), "steps=3"]) == 0
    import fake_train_one

    assert fake_train_one.SEEN[0][1:] == [str(CONFIG), "steps=3"]


START_ONE = """
import jax
from jobkit.launch import jax_distributed as jd
plan = jd.Plan(
    {"coordinator_address": "127.0.0.1:%d", "num_processes": 1, "process_id": 0, "initialization_timeout": 30,
     "heartbeat_timeout_seconds": 3730, "local_device_ids": None},
    all_devices=True,
)
print(jd.start(plan))
print("initialized", jax.distributed.is_initialized(), jax.process_count())
"""


def test_start_runs_jax_012s_initialize_with_the_heartbeat_keyword():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-c", START_ONE % port],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(PY_DIR), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "heartbeat timeout 3730 s" in result.stdout
    assert "['skip_jax_distributed_system=true']\ninitialized True 1\n" in result.stdout
