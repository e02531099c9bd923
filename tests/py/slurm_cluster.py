"""A real Slurm cluster for tests: `utils/local_cluster.sh up -N 2` once per pytest session.

Use it from any test module:

    from slurm_cluster import local_cluster  # noqa: F401  (pytest finds the fixture by name)

    def test_something(local_cluster):
        job_id = local_cluster.run(["sbatch", "--parsable", "--wrap", "hostname"]).stdout.strip()
        record = local_cluster.wait_job(job_id)          # its jobcomp record: JobState, ExitCode, ...
        subprocess.run([...], env={**os.environ, **local_cluster.env})   # or set SLURM_CONF yourself

The fixture brings the cluster up the first time a test asks for it and runs `down` when the session ends.
Importing it into several modules is fine: they share one cluster. A cluster that was already up when the
session started (someone ran `up` by hand) is used as it is and left up. Without root the fixture skips
the test (network namespaces and daemons need root).

A test that needs three nodes takes `local_cluster_3nodes` instead (a fixture of its own, for one test): it
brings the cluster to 3 nodes, taking down a 2-node one first, and takes it down afterwards; a cluster this
session's `local_cluster` holds is brought back to 2 nodes, any other is left down, so it is never left at 3
and the next 2-node session starts its own. Only the slow proofs use it (tests/run.sh slow).

Running srun/salloc: they listen for call-backs on every address of the namespace they run in, so run them
inside a job (sbatch) or through `cluster.in_netns([...])` (the controller's namespace), not on the host.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_env import launcher_env

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "utils" / "local_cluster.sh"
NODES = 2
PREFIX = "mxlc"
LOGIN_NETNS = f"{PREFIX}-ctl"  # the controller's namespace doubles as the place to run srun from


def tool_env(**extra: str) -> dict[str, str]:
    """os.environ with the sbin directories on PATH (ip, nsenter's friends, the daemons) plus EXTRA."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    missing = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in path.split(":")]
    return {**os.environ, "PATH": ":".join([path, *missing]), **extra}


def state_dir() -> Path:
    return Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/mxlc").rstrip("/") or "/")


def script(*args: str, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    """Run utils/local_cluster.sh with ARGS; returns the completed process (text, captured)."""
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        stdin=subprocess.DEVNULL,
        env=tool_env(),
    )


def is_up() -> bool:
    return script("env", timeout=30).returncode == 0


def nodes_up() -> int:
    """How many nodes the cluster is up with (its state file's NODES=n), 0 when it is down."""
    if not is_up():
        return 0
    match = re.search(r"^NODES=(\d+)$", (state_dir() / "cluster.state").read_text(), re.M)
    return int(match.group(1)) if match else 0


def slurm_conf_from(export_line: str) -> str:
    """The path in an `export SLURM_CONF=...` line."""
    match = re.fullmatch(r"export SLURM_CONF=(\S+)", export_line.strip())
    if not match:
        raise AssertionError(f"not an export line: {export_line!r}")
    return match.group(1)


@dataclass(frozen=True)
class LocalCluster:
    slurm_conf: str
    nodes: tuple[str, ...]
    state_dir: Path
    partition: str = "local"

    @property
    def env(self) -> dict[str, str]:
        """What to add to an environment to use the cluster: {"SLURM_CONF": ...} (merge it: env.update(...))."""
        return {"SLURM_CONF": self.slurm_conf}

    @property
    def jobcomp(self) -> Path:
        return self.state_dir / "jobcomp.txt"

    def in_netns(self, argv: list[str], netns: str = LOGIN_NETNS) -> list[str]:
        """ARGV prefixed to run inside one of the cluster's network namespaces (for srun/salloc)."""
        return ["nsenter", f"--net=/run/netns/{netns}", *argv]

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run ARGV with SLURM_CONF set; text, captured, raises on failure unless check=False."""
        kw.setdefault("env", tool_env(**self.env))
        result = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{argv} exited {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result

    def job_record(self, job_id: str | int) -> dict[str, str] | None:
        """The job's line in the jobcomp file (written when it ends) as a dict, or None while it has not ended."""
        if not self.jobcomp.exists():
            return None
        prefix = f"JobId={job_id} "
        found = None
        for line in self.jobcomp.read_text().splitlines():
            if line.startswith(prefix):
                found = line  # the last record wins (a requeued job has several)
        if found is None:
            return None
        return dict(field.split("=", 1) for field in found.split() if "=" in field)

    def wait_job(self, job_id: str | int, timeout: float = 120) -> dict[str, str]:
        """Wait until the job has ended; returns its jobcomp record (JobState, ExitCode, NodeList, ...)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.job_record(job_id)
            if record is not None:
                return record
            time.sleep(0.1)
        squeue = self.run(["squeue", "-j", str(job_id)], check=False)
        raise AssertionError(f"job {job_id} did not end within {timeout}s\n{squeue.stdout}{squeue.stderr}")


def job_env(cluster: LocalCluster, workspace: Path, jax_cache: Path) -> dict[str, str]:
    """An environment for submitting real jobs to CLUSTER from the repo: launcher_env (no training settings
    leaked from the caller's shell, the workspace and a shared JAX compile cache given, native runtime) with
    the cluster's SLURM_CONF and the repo's venv."""
    return launcher_env(workspace, jax_cache, **cluster.env, VENV_DIR=str(REPO / ".venv"))


def submit_job(env: dict[str, str], *args: str) -> tuple[str, Path]:
    """`submit.sh ARGS` from the repo with ENV; returns (job id, the log path it announced). Fails the test
    with submit.sh's output when it does not submit."""
    result = subprocess.run(
        [str(REPO / "submit.sh"), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"submit.sh {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    job_id = re.search(r"Submitted job (\d+)", result.stdout).group(1)
    log = Path(re.search(r"^  log: +(\S+)$", result.stdout, re.M).group(1))
    return job_id, log


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    """PREDICATE's first truthy value, polled until TIMEOUT; fails the test naming WHAT. A job's progress is
    awaited by what its log says, never by a sleep of a guessed length."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    pytest.fail(f"{what}: not within {timeout:.0f}s")


def read(path: Path) -> str:
    """A job log as it is now ("" before it exists; bytes a dying rank cut in half do not fail the read)."""
    return path.read_text(errors="replace") if path.exists() else ""


def cluster_up(nodes: int = NODES) -> LocalCluster:
    """`up -N nodes` (a no-op when already up with that many nodes); returns the cluster."""
    result = script("up", "-N", str(nodes))
    if result.returncode != 0:
        raise AssertionError(f"local_cluster.sh up -N {nodes} failed ({result.returncode}):\n{result.stderr}")
    lines = result.stdout.strip().splitlines()
    return LocalCluster(
        slurm_conf=slurm_conf_from(lines[-1]),
        nodes=tuple(f"node{i}" for i in range(1, nodes + 1)),
        state_dir=state_dir(),
    )


def cluster_down() -> subprocess.CompletedProcess:
    result = script("down", timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"local_cluster.sh down failed ({result.returncode}):\n{result.stderr}")
    return result


# One cluster per process however many modules import the fixture (each import makes its own
# session-scoped fixture definition; all of them are finalized at session end, the last one runs down).
_session = {"users": 0, "cluster": None, "owned": False}


@pytest.fixture(scope="session")
def local_cluster():
    """The session's Slurm cluster (N=2): a LocalCluster with slurm_conf, nodes, env, run(), wait_job()."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (network namespaces, daemons)")
    if _session["users"] == 0:
        _session["owned"] = not is_up()
        _session["cluster"] = cluster_up(NODES)
    _session["users"] += 1
    try:
        yield _session["cluster"]
    finally:
        _session["users"] -= 1
        if _session["users"] == 0 and _session["owned"]:
            cluster_down()


@contextlib.contextmanager
def resized(nodes: int):
    """The cluster at NODES nodes while the block runs: one up at another size is taken down first (`up` refuses
    to change a live cluster's size); afterwards it is taken down, and brought back to this session's size only
    when this session's `local_cluster` holds it, so it is never left at NODES for the next user."""
    if nodes_up() not in (0, nodes):
        cluster_down()
    try:
        yield cluster_up(nodes)
    finally:
        cluster_down()
        if _session["users"]:
            _session["cluster"] = cluster_up(NODES)


@pytest.fixture
def local_cluster_3nodes():
    """The Slurm cluster at 3 nodes, for one test (`resized(3)`), then down. Run it alone (tests/run.sh slow),
    under the test lock."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (network namespaces, daemons)")
    with resized(3) as cluster:
        yield cluster
