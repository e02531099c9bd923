"""utils/local_cluster.sh with real daemons: a 2-node Slurm cluster in network namespaces on this machine."""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from slurm_cluster import PREFIX, SCRIPT, cluster_down, cluster_up, local_cluster, script, tool_env  # noqa: F401

from jobkit.core import procfs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def recorded_pids(state_dir: Path) -> dict[str, int]:
    """name -> PID of every daemon the script recorded."""
    return {p.stem: int(p.read_text().split()[0]) for p in (state_dir / "pids").glob("*.pid")}


def running(pid: int) -> bool:
    """True while PID is a live process (a zombie waiting for a late reaper has stopped)."""
    return procfs.alive(pid)


def netns_pids(name: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, env=tool_env()).stdout
    return {int(p) for p in out.split()}


def our_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True, env=tool_env()).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{PREFIX}-")]


def our_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True, env=tool_env()).stdout
    names = [line.split(": ")[1].split("@")[0] for line in out.splitlines()]
    return [n for n in names if n.startswith(f"{PREFIX}-")]


def assert_all_gone(pids: set[int] | dict[str, int]) -> None:
    values = set(pids.values()) if isinstance(pids, dict) else pids
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(running(p) for p in values):
        time.sleep(0.1)
    assert not [p for p in values if running(p)], f"still running after down: {pids}"


def assert_network_gone() -> None:
    assert our_namespaces() == []
    assert our_links() == []
    assert not list(Path("/run/netns").glob(f"{PREFIX}-*"))
    assert f"/run/netns/{PREFIX}-" not in Path("/proc/self/mountinfo").read_text()


def wait_running(cluster, job_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
        if state == "RUNNING":
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not RUNNING after {timeout}s")


# ------------------------------------------------------------------------------ without a cluster


def test_help_prints_the_header():
    result = script("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: utils/local_cluster.sh up [-N n]")
    assert "Summary:" in result.stdout


def test_bad_node_count_is_refused():
    result = script("up", "-N", "zero")
    assert result.returncode == 1
    assert result.stderr.startswith("local_cluster.sh: -N must be a whole number")


@needs_root
def test_up_needs_root():
    # An unprivileged user may not be able to reach the checkout (CI clones into a 0700 dir), so it runs a
    # world-readable copy of the script and the libraries it sources.
    scratch = Path(tempfile.mkdtemp(prefix="lc-nonroot-", dir="/tmp"))
    try:
        (scratch / "lib").mkdir(parents=True)
        for path in (scratch, scratch / "lib"):
            path.chmod(0o755)
        copy = scratch / "local_cluster.sh"
        shutil.copy2(SCRIPT, copy)
        for lib in ("process.sh", "workspace.sh"):  # the libraries it sources
            shutil.copy2(SCRIPT.parent / "lib" / lib, scratch / "lib" / lib)
        copy.chmod(0o755)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(copy), "up"],
            capture_output=True,
            text=True,
            timeout=30,
            env=tool_env(),
            cwd="/",
        )
    finally:
        shutil.rmtree(scratch)
    assert result.returncode == 1
    assert "needs root" in result.stderr


# --------------------------------------------------------------------------------- with a cluster


def test_two_nodes_idle_in_partition_local(local_cluster):
    out = local_cluster.run(["sinfo", "-h", "-N", "-o", "%N %t %P"]).stdout
    assert sorted(out.split("\n")[:-1]) == ["node1 idle local*", "node2 idle local*"]
    assert local_cluster.nodes == ("node1", "node2")
    assert Path(local_cluster.slurm_conf) == local_cluster.state_dir / "slurm.conf"


def test_status_and_env_when_up(local_cluster):
    env = script("env")
    assert env.returncode == 0
    assert env.stdout == f"export SLURM_CONF={local_cluster.slurm_conf}\n"
    status = script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("munged", "slurmctld", "slurmd-node1", "slurmd-node2"):
        assert re.search(rf"^\s+{name}\s+alive\s+pid \d+", status.stdout, re.M), status.stdout
    assert re.search(r"local\*\s+up\s+infinite\s+2\s+idle node\[1-2\]", status.stdout), status.stdout


def test_up_twice_is_safe(local_cluster):
    before = recorded_pids(local_cluster.state_dir)
    again = script("up", "-N", "2")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"export SLURM_CONF={local_cluster.slurm_conf}"
    assert recorded_pids(local_cluster.state_dir) == before
    other = script("up", "-N", "3")
    assert other.returncode == 1
    assert "already up with 2 nodes" in other.stderr and "down first" in other.stderr
    assert recorded_pids(local_cluster.state_dir) == before


def test_srun_runs_on_distinct_hosts_with_their_own_addresses(local_cluster):
    out = local_cluster.run(local_cluster.in_netns(["srun", "-N", "2", "-l", "hostname"])).stdout
    assert sorted(out.splitlines()) == ["0: node1", "1: node2"]
    out = local_cluster.run(local_cluster.in_netns(["srun", "-N", "2", "-l", "ip", "-4", "-o", "addr"])).stdout
    for rank in (0, 1):
        addresses = re.findall(rf"^{rank}: \d+: (\S+)\s+inet (\S+)", out, re.M)
        assert sorted(addresses) == [("eth0", f"10.77.0.{11 + rank}/24"), ("lo", "127.0.0.1/8")], out


def test_sbatch_round_trip(local_cluster, tmp_path):
    start = time.monotonic()
    job_id = local_cluster.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            "1",
            f"--chdir={tmp_path}",
            "--output=job.out",
            "--wrap",
            "echo hello from $(hostname) > result.txt",
        ]
    ).stdout.strip()
    record = local_cluster.wait_job(job_id, timeout=60)
    assert record["JobState"] == "COMPLETED", record
    assert record["ExitCode"] == "0:0"
    assert (tmp_path / "result.txt").read_text() == f"hello from {record['NodeList']}\n"
    assert time.monotonic() - start < 15


def test_batch_job_srun_spans_nodes_on_shared_storage(local_cluster, tmp_path):
    job_id = local_cluster.run(
        [
            "sbatch",
            "--parsable",
            "-N",
            "2",
            f"--chdir={tmp_path}",
            "--output=job.out",
            "--wrap",
            "srun -l sh -c 'echo $SLURM_PROCID > rank.$(hostname)'; srun -l hostname",
        ]
    ).stdout.strip()
    record = local_cluster.wait_job(job_id, timeout=60)
    assert record["JobState"] == "COMPLETED", record
    assert record["NodeList"] == "node[1-2]"
    assert (tmp_path / "rank.node1").read_text() == "0\n"
    assert (tmp_path / "rank.node2").read_text() == "1\n"
    assert sorted((tmp_path / "job.out").read_text().splitlines()) == ["0: node1", "1: node2"]
    sacct = local_cluster.run(["sacct", "-c", "-j", job_id, "-n", "-o", "jobid,state"]).stdout.split()
    assert sacct == [job_id, "COMPLETED"]


# ---------------------------------------------------- destructive: each ends with the cluster up again


def test_down_stops_everything_and_is_safe_twice(local_cluster):
    daemons = recorded_pids(local_cluster.state_dir)
    assert set(daemons) == {"munged", "slurmctld", "slurmd-node1", "slurmd-node2"}
    try:
        cluster_down()
        assert_all_gone(daemons)
        assert_network_gone()
        assert list((local_cluster.state_dir / "pids").glob("*.pid")) == []
        env = script("env")
        assert env.returncode == 1 and env.stdout == ""
        assert "no local cluster is up" in env.stderr
        assert script("status").returncode == 1
        again = script("down")
        assert again.returncode == 0 and "nothing is up" in again.stderr
    finally:
        cluster_up()
    assert script("status").returncode == 0


def test_down_after_a_crash_cleans_up(local_cluster):
    job_id = local_cluster.run(
        ["sbatch", "--parsable", "-N", "2", "--chdir=/tmp", "--output=/dev/null", "--wrap", "srun sleep 300"]
    ).stdout.strip()
    try:
        wait_running(local_cluster, job_id)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            Path(f"/proc/{p}/comm").read_text().strip() == "sleep" for p in netns_pids(f"{PREFIX}-node2") if running(p)
        ):
            time.sleep(0.1)
        daemons = recorded_pids(local_cluster.state_dir)
        in_namespaces = set().union(*(netns_pids(ns) for ns in our_namespaces()))
        assert len(in_namespaces) > 3  # daemons plus the job's slurmstepd, script and sleeps
        os.kill(daemons["slurmctld"], signal.SIGKILL)
        os.kill(daemons["slurmd-node1"], signal.SIGKILL)
        status = script("status")
        assert status.returncode == 1 and "DEAD" in status.stdout
        cluster_down()
        assert_all_gone(daemons)
        assert_all_gone(in_namespaces)
        assert_network_gone()
    finally:
        cluster_up()
    # The controller recovered the job from its saved state; up ends such leftovers.
    assert local_cluster.wait_job(job_id, timeout=30)["JobState"] in ("CANCELLED", "NODE_FAIL")
    assert local_cluster.run(["squeue", "-h", "-t", "pending,running"]).stdout == ""
