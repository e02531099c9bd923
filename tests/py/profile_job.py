"""One real tiny job with a captured profile and an XLA dump, shared by test_profile.py and test_hlo.py.

`./run_local.sh tiny` on the CPU with two emulated devices (so the program has collectives), MaxText's profiler
on for steps 5-7 and ENABLE_XLA_DUMP=1, in a private workspace with a fresh JAX cache (a cached compile would
leave no dump). Session-scoped: the job runs once (about 25 s) however many tests use it.
"""

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_env import launcher_env

REPO = Path(__file__).resolve().parents[2]
PROFILER_STEPS = 3
SKIP_STEPS = 5
CPU_DEVICES = 2


@dataclass
class ProfiledJob:
    workspace: Path
    log: Path
    job_dir: Path

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Every file under the job dir with its size and mtime: what a read-only command must leave alone."""
        out = {}
        for path in sorted(self.job_dir.rglob("*")):
            st = path.lstat()
            out[str(path.relative_to(self.job_dir))] = (st.st_size, st.st_mtime_ns)
        return out


_RAN: dict[str, ProfiledJob] = {}


@pytest.fixture(scope="session")
def profiled_job(tmp_path_factory) -> ProfiledJob:
    # Each test module that imports this fixture gets its own definition of it, so the session scope alone
    # would run the job once per module; this module is imported once, so its memo makes it once per session.
    if "job" not in _RAN:
        _RAN["job"] = _run_job(tmp_path_factory)
    return _RAN["job"]


def _run_job(tmp_path_factory) -> ProfiledJob:
    workspace = tmp_path_factory.mktemp("profile_ws")
    cache = tmp_path_factory.mktemp("profile_jax_cache")
    args = [
        "steps=10",
        "profiler=xplane",
        f"skip_first_n_steps_for_profiler={SKIP_STEPS}",
        f"profiler_steps={PROFILER_STEPS}",
        "_env_ENABLE_XLA_DUMP=1",
        f"_env_CPU_DEVICES_PER_NODE={CPU_DEVICES}",
    ]
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", *args],
        env=launcher_env(workspace, cache),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    logs = sorted(workspace.glob("local_*.log"))
    assert len(logs) == 1, logs
    return ProfiledJob(workspace, logs[0], workspace / logs[0].name.removesuffix(".log"))


def fake_job(workspace: Path, name: str = "local_20260101_000000_abcd-JAX-tiny") -> Path:
    """A job log and an empty job dir, as a job that ran without profiler or dump leaves them."""
    workspace.mkdir(parents=True, exist_ok=True)
    log = workspace / f"{name}.log"
    log.write_text("JOB_ID=local_20260101_000000_abcd\nJOB_NAME=JAX-tiny\nMODEL_NAME=tiny\nNNODES=1\n")
    job_dir = workspace / name
    job_dir.mkdir()
    return job_dir


def someone_elses(job_dir: Path) -> None:
    """JOB_DIR as a teammate's private job dir: owned by nobody, mode 700."""
    import os

    os.chown(job_dir, 65534, 65534)
    job_dir.chmod(0o700)
