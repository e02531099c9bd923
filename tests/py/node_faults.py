"""Real faults on one node of the local Slurm cluster, for tests and benches that must find them.

Each node of utils/local_cluster.sh is a slurmd process; every job step on that node is its descendant,
and descendants inherit the cgroups of their parent at fork. So putting the node's slurmd into a cgroup
(v1 here: /sys/fs/cgroup/<controller>/) throttles or limits every job that node runs afterwards, with the
kernel doing the enforcement: a CPU quota makes the node really slow, a memory limit makes training
really run out of memory.

    with cpu_quota("node2", percent=40):     # node2 gets 40 % of one CPU
        ...
    with memory_limit("node2", 900 << 20):  # jobs on node2 share 900 MiB
        ...
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def slurmd_pid(node: str, state_dir: Path | None = None) -> int:
    state = state_dir or Path(os.environ.get("LOCAL_CLUSTER_DIR", "/tmp/mxlc"))
    return int((state / "pids" / f"slurmd-{node}.pid").read_text().split()[0])


def own_cgroup(controller: str) -> Path:
    """The v1 cgroup directory this process is in for CONTROLLER (where a child group may be made)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return CGROUP_ROOT / controller / path.lstrip("/")
    raise RuntimeError(f"no v1 cgroup controller {controller!r} mounted under {CGROUP_ROOT}")


def available(controller: str) -> bool:
    try:
        return os.access(own_cgroup(controller), os.W_OK)
    except (OSError, RuntimeError):
        return False


@contextlib.contextmanager
def _group(controller: str, name: str, settings: dict[str, str], pid: int):
    parent = own_cgroup(controller)
    group = parent / name
    group.mkdir(exist_ok=True)
    try:
        for key, value in settings.items():
            (group / key).write_text(value)
        (group / "tasks").write_text(str(pid))
        yield group
    finally:
        # Everything still in the group (the slurmd, leftovers of its jobs) goes back to the parent group,
        # else rmdir refuses. A process may exit between the read and the write: ignore those.
        for _ in range(50):
            for task in (group / "tasks").read_text().split():
                with contextlib.suppress(OSError):
                    (parent / "tasks").write_text(task)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def cpu_quota(node: str, percent: int):
    """Jobs that NODE starts get PERCENT % of one CPU in total (CFS quota)."""
    # A 10 ms period, not the default 100 ms: tiny's ~20 ms steps would otherwise alternate between
    # throttled and free, and the mean of per-step TGS would hide the slowdown.
    period = 10_000
    settings = {"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(period * percent // 100)}
    with _group("cpu", f"mxlc-slow-{node}", settings, slurmd_pid(node)) as group:
        yield group


@contextlib.contextmanager
def memory_limit(node: str, limit_bytes: int):
    """Jobs that NODE starts share LIMIT_BYTES of memory; beyond it the kernel's OOM killer acts."""
    settings = {"memory.limit_in_bytes": str(limit_bytes)}
    with _group("memory", f"mxlc-mem-{node}", settings, slurmd_pid(node)) as group:
        yield group
