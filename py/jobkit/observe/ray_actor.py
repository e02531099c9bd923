"""The node side of `jobkit ray-launch`: the per-node Ray actor that runs the command as a plain subprocess.

The driver (jobkit.observe.ray_driver) pins one NodeRunner to every alive node. The command gets its own interpreter,
no Ray threads, the driver's working directory, and the environment that node's `ray start` ran with (each
node's training environment: NODE_RANK and friends), minus what Ray adds to its workers (every RAY_* variable,
OMP_NUM_THREADS, PYTHONBREAKPOINT, the py-spy shim on PATH, ...), plus PYTHONUNBUFFERED=1.

Output: stdout and stderr, merged, stream back to the driver as whole lines (stream()). Unless that node's
`ray start` ran with JOBKIT_OUTPUT_SINK=PATH (e.g. /proc/<pid>/fd/1 of the shell that started the node's part of
the job): then the command writes straight to PATH, with no cost per line, and under Slurm its lines carry that
node's own task prefix as they would without Ray.

Process handling: the command runs in a process group of its own. A watchdog (jobkit/ray_watchdog.py) KILLs
that group if the actor dies for any reason. When the command exits, what is left of its group is KILLed (like
Slurm ending a job step).

The driver ships this module (and jobkit.core.procfs) to the nodes by value: they need not be able to import jobkit.
Standard library only.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from jobkit.core import procfs

# Set in a node's `ray start` environment: where that node's command writes its output directly (a path to
# open for writing), bypassing the stream through Ray and the driver; not passed on to the command.
OUTPUT_SINK_VAR = "JOBKIT_OUTPUT_SINK"
# Environment variables Ray sets in its worker processes (not in `ray start`'s environment); used only when the
# raylet's environment cannot be read to compute the difference exactly.
# Measured with Ray 2.60: RAY_JOB_ID, RAY_RAYLET_PID, OMP_NUM_THREADS=1, PYTHONBREAKPOINT, SPT_NOENV; and Ray
# removes the LD_PRELOAD (its jemalloc) that `ray start` gave the raylet.
RAY_WORKER_VARS = ("OMP_NUM_THREADS", "PYTHONBREAKPOINT", "SPT_NOENV", "JOBKIT_PYSPY_SHIM_DIR", "JOBKIT_PYSPY_REAL")
# Run by file path (not by module name), so that a node without jobkit installed can start it too.
WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_watchdog.py")
BATCH_BYTES = 1 << 16  # output sent to the driver in one message, at most (a few lines more)


def one_line(exc: BaseException) -> str:
    """An exception as one line of at most ~300 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def child_env(environ: dict[str, str], node_env: dict[str, str] | None, cwd: str | None = None) -> dict[str, str]:
    """The command's environment: the node's `ray start` environment without what Ray put into its worker.

    environ is the actor's os.environ; node_env the raylet's environment (None when unreadable). A variable the
    worker has but the raylet has not was added by Ray for its workers and is dropped; one whose value differs
    gets the raylet's value back (e.g. OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES on GPU-assigned actors). Variables
    the raylet has and the worker lacks stay away (Ray strips its own LD_PRELOAD=jemalloc from workers).
    """
    env = {}
    for key, value in environ.items():
        if key.startswith("RAY_") or key in RAY_WORKER_VARS:
            continue
        if node_env is not None:
            if key not in node_env:
                continue
            value = node_env[key]
        env[key] = value
    shim = environ.get("JOBKIT_PYSPY_SHIM_DIR")
    if shim and "PATH" in env:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p and p != shim)
    env["PYTHONUNBUFFERED"] = "1"
    if cwd is not None:
        env["PWD"] = cwd
    return env


def node_environ() -> dict[str, str] | None:
    """The environment this node's `ray start` gave the raylet (the worker's parent), None when unreadable."""
    raylet = os.environ.get("RAY_RAYLET_PID", "")
    found = procfs.environ(int(raylet)) if raylet.isdigit() else None
    return found if found is not None else procfs.environ(os.getppid())


def _open_sink(path: str | None) -> int | None:
    """A write descriptor on the node's output sink, or None to stream through the driver."""
    if not path:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return None


def _exited(proc: subprocess.Popen) -> bool:
    """True once proc has ended, WITHOUT reaping it (Popen.poll would): while it is a zombie its PID, which is
    also its process group's id, cannot be given to another process, so killpg stays safe."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _own_group() -> dict:
    """Popen arguments for a process group of its own, in the same session where Python allows it (3.11+; a
    node's image may have an older Python than the driver)."""
    return {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "?"


class NodeRunner:
    """The per-node actor (threaded: the output stream and stop() run at the same time)."""

    def __init__(self, index: int):
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.watchdog = None  # the write end of the watchdog's pipe
        self.start_code = 1
        self.lock = threading.Lock()

    def info(self) -> dict:
        rank = os.environ.get("NODE_RANK", os.environ.get("SLURM_NODEID", ""))
        return {
            "index": self.index,
            "rank": int(rank) if rank.isdigit() else None,
            "ip": _node_ip(),
            "host": socket.gethostname().split(".")[0],
            "worker_pid": os.getpid(),
        }

    def start(self, cmd: list[str], cwd: str) -> dict:
        """Starts CMD in CWD; {"pid", "error", "warning"} (error: it did not start; warning: no watchdog)."""
        node_env = node_environ()
        env = child_env(dict(os.environ), node_env, cwd)
        sink = _open_sink((node_env or {}).get(OUTPUT_SINK_VAR))
        env.pop(OUTPUT_SINK_VAR, None)
        try:
            self.proc = subprocess.Popen(
                cmd,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if sink is None else sink,
                stderr=subprocess.STDOUT,
                close_fds=True,
                **_own_group(),
            )
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126 if isinstance(exc, PermissionError) else 1
            self.start_code = code
            return {"pid": None, "error": f"cannot start {cmd[0]!r} in {cwd}: {one_line(exc)} (exit {code})"}
        finally:
            if sink is not None:
                os.close(sink)  # the command holds it now
        warning = self._start_watchdog()
        return {"pid": self.proc.pid, "error": None, "warning": warning}

    def _start_watchdog(self) -> str | None:
        """Starts the watchdog on the command's group; None, or why there is none."""
        try:
            starter = subprocess.Popen(
                [sys.executable, "-I", "-S", WATCHDOG, str(self.proc.pid)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                **_own_group(),
            )
            code = starter.wait(timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"no watchdog ({one_line(exc)}): if this actor dies, the command may outlive it"
        if code != 0:
            starter.stdin.close()
            return f"no watchdog ({WATCHDOG} exited {code}): if this actor dies, the command may outlive it"
        self.watchdog = starter.stdin
        return None

    def stream(self):
        """Yields bytes (whole lines, batched) while the command runs, then {"code": returncode}."""
        proc = self.proc
        if proc is None:
            yield {"code": self.start_code, "quiet": True}
            return
        if proc.stdout is not None:
            yield from self._stream_output(proc)
        else:  # the command writes to the node's own output sink: only wait for it
            while not _exited(proc):
                time.sleep(1.0)  # a wakeup costs training CPU; a second more to notice the end costs nothing
        # Still a zombie here, so its PID (the group's id) cannot be reused yet: end what is left of the group.
        self._killpg(signal.SIGKILL)
        code = proc.wait()
        self._release_watchdog()
        yield {"code": code}

    def _stream_output(self, proc: subprocess.Popen):
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in iter(proc.stdout.readline, b""):
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        eof = False
        drain_until = None
        while not eof:
            try:
                item = lines.get(timeout=0.2)
            except queue.Empty:
                item = b""
            batch, size = [], 0
            while item:
                batch.append(item)
                size += len(item)
                if size > BATCH_BYTES:
                    break
                try:
                    item = lines.get_nowait()
                except queue.Empty:
                    item = b""
            if item is None:
                eof = True
            if batch:
                yield b"".join(batch)
            if not eof and _exited(proc):
                # The command ended; what it left running may hold the pipe open. Drain briefly, then end the
                # rest of its process group.
                if drain_until is None:
                    drain_until = time.monotonic() + 1.0
                elif time.monotonic() > drain_until:
                    self._killpg(signal.SIGKILL)
                    drain_until = time.monotonic() + 5.0
        while not _exited(proc):  # output closed before the command ended
            time.sleep(0.05)

    def stop(self, grace: float) -> None:
        """TERM the command's process group, KILL it after grace seconds (unless it ended)."""
        proc = self.proc
        if proc is None or _exited(proc):
            return
        self._killpg(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if _exited(proc):
                return
            time.sleep(0.05)
        for pid in procfs.descendants(proc.pid):  # also those that left the group
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._killpg(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            pass

    def _release_watchdog(self) -> None:
        with self.lock:
            pipe, self.watchdog = self.watchdog, None
        if pipe is None:
            return
        try:
            pipe.write(b"done\n")
            pipe.close()
        except OSError:
            pass
