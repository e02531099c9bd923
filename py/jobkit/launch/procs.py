"""`jobkit procs -- CMD...`: one training process per device on this node (LOCAL_WORLD_SIZE of them).

Why a process per device: expert-parallel kernels on MI300X/MI355X (and some NVIDIA stacks) need
`jax.local_device_count() == 1`. Slurm still runs one task per node (one container per node, one Ray actor per
node); this is the one place that turns it into LOCAL_WORLD_SIZE processes, for the native, container and
RAY=1 tiers alike.

Steps:
1. Settings (`Layout.from_env`): LOCAL_WORLD_SIZE (a whole number, 1 = the usual one process per node),
   NNODES and NODE_RANK from the tiers. A bad one is a one-line error (EXIT_SETTINGS, 5) before anything starts.
2. On one node with no coordinator (run_local.sh), JAX still needs one: 127.0.0.1 on a free port, bound to
   loopback only (JAX_COORDINATOR_BIND_ADDRESS).
3. Start process i (0..N-1) with LOCAL_RANK=i, GLOBAL_RANK=NODE_RANK*N+i, NPROCS=NNODES*N and
   LOCAL_WORLD_SIZE=N. Every device stays visible to every process (peer-to-peer copies between GPUs need
   it); `jobkit launch` gives JAX `local_device_ids=[LOCAL_RANK]` (launch/jax_distributed.py).
4. Each line a process prints (stdout and stderr) is written to this node's output as `[rank<G>]: <line>`,
   whole lines only, so the job log stays readable per process (`grep '\\[rank3\\]'`) and srun's `N: ` node
   prefix still comes first under Slurm.
5. TERM/INT/HUP reach every process. The first process to fail is told as
   `PROC_EXIT host=<h> rank=<G> local=<i> exit=<rc>` (the process-level twin of _job.sbatch's NODE_EXIT line),
   and the others are stopped (TERM, KILL after KILL_GRACE s), as srun --kill-on-bad-exit does for nodes: a
   JAX job with a process gone cannot make progress. Exit status: the first failure's, else 0. A signal that
   comes while the processes are being started reaches the ones started so far, and no more are started (the
   exit status is then 128+signal: not every process ran).
   Where EXIT_FILE_ENV (PROCS_EXIT_FILE) names a file, `<pid> <rank> <local> <rc>` of that first failure is
   written to it: _train.sh (COREDUMP=1) looks for the core of that process, not of this supervisor.
6. Before exiting, wait (INHERITED_WAIT s at most) for the children this process inherited from the shell
   that exec'd it: the hang watchdog, which ends with the processes (so nothing is left for `jobkit reap`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobkit.core.files import write_atomic

SETTING = "LOCAL_WORLD_SIZE"
MAX_PER_NODE = 64  # more processes than any node has devices: a typo, not a layout
KILL_GRACE = 30.0  # seconds between the TERM and the KILL of the processes left after a failure
PREFIX = "[rank{rank}]: "
EXIT_FILE_ENV = "PROCS_EXIT_FILE"
INHERITED_WAIT = 10.0  # seconds to wait, after the processes, for the hang watchdog that ends with them


class LayoutError(ValueError):
    """A setting the processes cannot be laid out with; the message names it and the fix (one line)."""


def _whole(env: Mapping[str, str], name: str, default: str, fix: str) -> int:
    raw = (env.get(name) or default).strip()
    if not (raw.isascii() and raw.isdigit()):
        raise LayoutError(f"{name}={raw} is not a whole number; {fix}")
    return int(raw)


def host() -> str:
    """This node's short name, as `hostname -s` (and so NODE_EXIT) gives it."""
    return socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class Layout:
    """Which processes run on this node, and their ranks."""

    per_node: int
    nnodes: int
    node_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Layout:
        raw = env.get(SETTING) or "1"
        if raw != raw.strip():  # the header and _train.sh's checks would see the spaces
            raise LayoutError(f"{SETTING}='{raw}' has spaces around it; set a whole number 1..{MAX_PER_NODE} or auto")
        per_node = _whole(env, SETTING, "1", f"set 1..{MAX_PER_NODE} or auto (one per GPU)")
        if not 1 <= per_node <= MAX_PER_NODE:
            raise LayoutError(
                f"{SETTING}={per_node} is not a process count per node; set 1..{MAX_PER_NODE} or auto (one per GPU)"
            )
        nnodes = _whole(env, "NNODES", "1", "start training through submit.sh or run_local.sh")
        node_rank = _whole(env, "NODE_RANK", "0", "start training through submit.sh or run_local.sh")
        if nnodes < 1 or node_rank >= nnodes:
            raise LayoutError(f"NODE_RANK={node_rank} is not below NNODES={nnodes}; start training through submit.sh")
        return cls(per_node, nnodes, node_rank)

    @property
    def nprocs(self) -> int:
        return self.nnodes * self.per_node

    def global_rank(self, local: int) -> int:
        return self.node_rank * self.per_node + local

    def child_env(self, env: Mapping[str, str], local: int) -> dict[str, str]:
        child = dict(env)
        child.update(
            LOCAL_RANK=str(local),
            GLOBAL_RANK=str(self.global_rank(local)),
            NPROCS=str(self.nprocs),
            LOCAL_WORLD_SIZE=str(self.per_node),
        )
        return child

    def line(self) -> str:
        first, last = self.global_rank(0), self.global_rank(self.per_node - 1)
        return (
            f"[procs] {self.per_node} process{'es' if self.per_node > 1 else ''} on node {self.node_rank} ({host()}):"
            f" global ranks {first}-{last} of NPROCS={self.nprocs} ({SETTING}={self.per_node})"
        )


def local_coordinator(env: dict[str, str]) -> str | None:
    """Step 2: a loopback coordinator for a one-node run that has none; returns what was set, else None."""
    if env.get("JAX_COORDINATOR_IP", "").strip():
        return None
    with socket.socket() as s:  # the kernel's free port; JAX binds it a moment later (a race no worse than Slurm's)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env.update(JAX_COORDINATOR_IP="127.0.0.1", JAX_COORDINATOR_PORT=str(port))
    env.setdefault("JAX_COORDINATOR_BIND_ADDRESS", f"127.0.0.1:{port}")
    return f"127.0.0.1:{port}"


def _pump(stream, prefix: bytes, out, lock: threading.Lock) -> None:
    """Step 4: copy whole lines from a process's pipe to OUT, each behind PREFIX."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's returncode (a signal N is 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


class Group:
    """The node's processes, started together and stopped together."""

    def __init__(self, layout: Layout, command: Sequence[str], env: Mapping[str, str], out=None):
        self.layout, self.command, self.env = layout, list(command), env
        self.out = out if out is not None else sys.stdout.buffer
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        self.cancelled = 0  # the signal the supervisor got (TERM/INT/HUP), 0: none
        self.reached = 0  # how many of self.procs that signal was passed to

    def say(self, text: str) -> None:
        with self.lock:
            self.out.write((text + "\n").encode())
            self.out.flush()

    def start(self) -> None:
        for local in range(self.layout.per_node):
            if self.cancelled:  # a TERM between two starts: start no more (the started ones have it already)
                break
            proc = subprocess.Popen(
                self.command,
                env=self.layout.child_env(self.env, local),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.procs.append(proc)
            if self.cancelled and self.reached < len(self.procs):  # it came while this process was being started
                proc.send_signal(self.cancelled)
                self.reached = len(self.procs)
            prefix = PREFIX.format(rank=self.layout.global_rank(local)).encode()
            pump = threading.Thread(target=_pump, args=(proc.stdout, prefix, self.out, self.lock), daemon=True)
            pump.start()
            self.pumps.append(pump)
            self.say(f"[procs] rank {self.layout.global_rank(local)} (local {local}): pid {proc.pid}")

    def failed(self, local: int, status: int) -> None:
        """Tell the first failure: the PROC_EXIT line, and the failed process's pid in EXIT_FILE_ENV's file."""
        rank = self.layout.global_rank(local)
        self.say(f"PROC_EXIT host={host()} rank={rank} local={local} exit={status}")
        path = self.env.get(EXIT_FILE_ENV)
        if path:
            try:
                write_atomic(path, f"{self.procs[local].pid} {rank} {local} {status}\n")
            except OSError as exc:  # the core is then looked for by the supervisor's pid: say why
                self.say(f"[procs] cannot write {EXIT_FILE_ENV}={path}: {exc.strerror or exc}")

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def cancel(self, signum: int) -> None:
        """Step 5: a TERM/INT/HUP to the supervisor reaches every process, and none is started after it."""
        self.cancelled = self.cancelled or signum
        self.signal_all(signum)
        self.reached = len(self.procs)

    def wait(self, poll: float = 0.2) -> int:
        """Step 5: wait for every process; the first failure stops the others. Returns the exit status."""
        first_failure: int | None = None
        kill_at: float | None = None
        while any(p.poll() is None for p in self.procs):
            for local, proc in enumerate(self.procs):
                rc = proc.poll()
                if rc is None or rc == 0 or first_failure is not None:
                    continue
                first_failure = exit_status(rc)
                rank = self.layout.global_rank(local)
                self.failed(local, first_failure)
                left = [p for p in self.procs if p.poll() is None]
                if left:
                    self.say(f"[procs] rank {rank} failed: stopping the other {len(left)} process(es) on this node")
                    self.signal_all(signal.SIGTERM)
                    kill_at = time.monotonic() + KILL_GRACE
            if kill_at is not None and time.monotonic() >= kill_at:
                self.signal_all(signal.SIGKILL)
                kill_at = None
            time.sleep(poll)
        for pump in self.pumps:
            pump.join(timeout=10)  # the last lines of a process that just ended
        if first_failure is None:
            # A failure seen only now (every process ended between two polls): the lowest rank's.
            for local, proc in enumerate(self.procs):
                if proc.returncode != 0:
                    first_failure = exit_status(proc.returncode)
                    self.failed(local, first_failure)
                    break
        if first_failure is None and self.cancelled and len(self.procs) < self.layout.per_node:
            # Not every process ran: the job did not succeed, even where the started ones ended with 0.
            self.say(
                f"[procs] signal {self.cancelled} before every process started: {len(self.procs)} of"
                f" {self.layout.per_node} ran"
            )
            return 128 + self.cancelled
        return first_failure or 0


def main(command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run COMMAND as this node's LOCAL_WORLD_SIZE processes; returns the exit status (LayoutError for a bad
    setting)."""
    env = dict(os.environ if env is None else env)
    layout = Layout.from_env(env)
    group = Group(layout, command, env)
    if layout.nnodes == 1 and layout.per_node > 1:
        where = local_coordinator(group.env)
        if where:
            group.say(f"[procs] one node: JAX coordinator on {where} (loopback only)")
    group.say(layout.line())
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: group.cancel(s))
    group.start()
    rc = group.wait()
    wait_inherited(INHERITED_WAIT)
    return rc


def wait_inherited(seconds: float) -> None:
    """Waits up to SECONDS for the children this process has but did not start: _train.sh starts the hang
    watchdog and then execs this process, so the watchdog is its child. It ends with training (at once: it
    waits on the processes' exit); without this wait `jobkit reap` (run_local.sh), which stops whatever a
    node's training leaves behind the moment it ends, would find it still there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if pid == 0:
            time.sleep(0.05)
