"""Shared test helpers: repo paths, PATH stubs for accelerator tools, and the e2e and slow markers (tests/run.sh's
fast and slow tiers)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY_DIR = REPO / "py"
FIXTURES = REPO / "tests" / "fixtures"
JOBKIT_LOGS = FIXTURES / "jobkit"
TOOLS = FIXTURES / "tools"

# jobkit itself is installed (editable) in the venv that tests/run.sh sets up.

# ---------------------------------------------------------------------------------------------------------
# The e2e marker: tests that start real things (a training job, a Slurm cluster, a container, a Ray node, a
# Prometheus, a browser). `tests/run.sh fast` deselects them with -m "not e2e"; `tests/run.sh` runs them.
#
# A test is e2e when it uses one of these fixtures, directly or through another fixture (item.fixturenames
# is the whole closure). A fixture is named here by its name alone, so each name must be defined once in
# tests/py (tests/py/test_tiers.py checks that, and that each is defined in the module given here).
E2E_FIXTURES = {
    "local_cluster": "slurm_cluster",  # utils/local_cluster.sh up -N 2: real slurmctld/slurmd daemons
    "local_cluster_3nodes": "slurm_cluster",  # the same at 3 nodes, for one (slow) test, then down
    "profiled_job": "profile_job",  # run_local.sh tiny with the profiler and an XLA dump
    "cpu_image": "test_containers",  # utils/build_image.sh, then podman runs the image
    "ray_job": "test_analyze",  # RAY=1 run_local.sh tiny: Ray, the exporter, a Prometheus
    "plain_job": "test_analyze",  # run_local.sh tiny
    "failed_job": "test_analyze",  # run_local.sh tiny with a bad key (MaxText starts, then fails)
    "real_runs": "test_launch",  # `jobkit launch configs/tiny.yml`: real MaxText training, 3 steps
    "cluster": "test_ray_launch",  # a real Ray head (utils/lib/ray_cluster.sh ray_start_head)
    "prometheus_bin": "test_prometheus",  # installs Prometheus; the tests that take it run one
    "prometheus_installed": "conftest",  # installs Prometheus (apt) for the tests that run it or promtool
}
# Tests that start real things in their own bodies, with no such fixture, carry the mark themselves
# (`pytestmark = pytest.mark.e2e` in test_run_local.py, test_observability.py, test_coredump.py;
# `@pytest.mark.e2e` on the browser tests in test_dashboard.py and the run_local.sh test in
# test_hang_watchdog.py).


# The slow marker: the proofs that take 6-12 minutes each (a real job that waits out the hang watchdog's default
# 300 s floor, a 3-node cluster). Every tests/run.sh run leaves them out (-m "not slow") but `tests/run.sh slow`,
# which runs them alone. A slow test is e2e as well (it uses a cluster fixture), so the fast tier never sees it.


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: starts real things (a job, a Slurm cluster, a container, Ray, Prometheus, a browser); "
        "tests/run.sh fast leaves it out",
    )
    config.addinivalue_line(
        "markers",
        "slow: a proof that takes 6-12 minutes (real jobs past the default hang floor, a 3-node cluster); "
        "only tests/run.sh slow runs it",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.get_closest_marker("e2e") and E2E_FIXTURES.keys() & set(item.fixturenames):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def tool_path(tmp_path, monkeypatch):
    """Make PATH hold only stub tools; returns add(name, fixture=None, rc=0, sleep=None)."""
    bindir = tmp_path / "stub-bin"
    bindir.mkdir()
    cat, sleep_bin = shutil.which("cat"), shutil.which("sleep")
    monkeypatch.setenv("PATH", str(bindir))

    def add(name: str, fixture: Path | None = None, rc: int = 0, sleep: float | None = None) -> Path:
        lines = ["#!/bin/sh"]
        if sleep is not None:
            lines.append(f"exec {sleep_bin} {sleep}")
        if fixture is not None:
            lines.append(f"{cat} '{fixture}'")
        lines.append(f"exit {rc}")
        stub = bindir / name
        stub.write_text("\n".join(lines) + "\n")
        stub.chmod(0o755)
        return stub

    return add


@pytest.fixture
def clean_env(monkeypatch):
    """No MFU-related variables leak in from the developer's shell."""
    for name in ("HARDWARE_PEAK_TFLOPS", "JAX_PLATFORMS", "MAXTEXT_FAST_EXIT"):
        monkeypatch.delenv(name, raising=False)
    return os.environ


@pytest.fixture(scope="session")
def prometheus_installed():
    """Prometheus and promtool installed (utils/prometheus.sh install: apt on a fresh machine, else a no-op)."""
    proc = subprocess.run(
        [str(REPO / "utils" / "prometheus.sh"), "install"], check=False, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert shutil.which("promtool") or os.access("/usr/bin/promtool", os.X_OK), "promtool is not installed"


# Root with every capability dropped: file permissions then hold for it as for any other user (a mode-000 log
# or job dir is as closed to it). The one way the tests run jobkit "as someone who may not read this".
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")


def jobkit_without_root_powers(*args: str) -> subprocess.CompletedProcess:
    """`jobkit ARGS` (this venv's) as root with no capabilities."""
    import sys

    jobkit = str(Path(sys.executable).parent / "jobkit")
    return subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", jobkit, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
