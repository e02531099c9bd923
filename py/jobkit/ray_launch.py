"""Run one command on every node of a Ray cluster: `python -m jobkit.ray_launch [options] -- CMD ARGS...`.

One actor per alive node (num_cpus=0, num_gpus=0, pinned to its node) starts CMD as a plain subprocess: its own
interpreter, no Ray threads, the driver's working directory, and the environment that node's `ray start` ran
with (each node's training environment: NODE_RANK and friends), minus what Ray adds to its workers (every RAY_*
variable, OMP_NUM_THREADS, PYTHONBREAKPOINT, the py-spy shim on PATH, ...), plus PYTHONUNBUFFERED=1. The
command's stdout and stderr, merged, come back to the driver line by line and are written to the driver's stdout
exactly as the command wrote them (no Ray prefix), flushed as they arrive; whole lines are never mixed between
nodes. Unless that node's `ray start` ran with JOBKIT_OUTPUT_SINK=PATH (e.g. /proc/<pid>/fd/1 of the shell that
started the node's part of the job): then the command writes straight to PATH, with no cost per line, and under
Slurm its lines carry that node's own task prefix as they would without Ray.

Options:
  --address HOST:PORT|auto   the Ray cluster (GCS address; default auto = RAY_ADDRESS or the local one)
  --nodes N                  wait until N nodes are alive, then run on all alive nodes (default 1)
  --nodes-timeout S          how long to wait for them, and for the actors to come up (default 120)
  --grace S                  on SIGTERM/SIGINT: seconds between TERM and KILL of the commands (default 5)
  --failure-grace S          once one node failed, seconds the others get to end by themselves before they
                             are stopped too (default 30; a multi-node job cannot go on without a node)
  --connect-timeout S        how long ray.init may take (default 60; it otherwise retries for minutes)
  --ready-file PATH          start while the cluster is still coming up: import Ray, then wait (at most
                             --connect-timeout) until PATH holds the status of the head's start; 0 goes on,
                             anything else exits EXIT_UNREACHABLE (saves the ~2 s import on the way to training)

Exit status: 0 when every node's command exited 0; else the status of the first failing node in rank order
(NODE_RANK from that node's environment, else node index; the head's node is index 0), 128+N for a command
killed by signal N, 1 when a node's actor died; nodes stopped because another failed count last;
143/130 after SIGTERM/SIGINT (commands stopped);
EXIT_UNREACHABLE (75, EX_TEMPFAIL) when no command was started: Ray not importable, the cluster not reachable,
fewer than N nodes, or an actor that could not start. Only then is it safe to run the command without Ray.
2: bad usage. Per node, one line on stderr: "[ray_launch] node <ip> rank <r>: exited with code N" or
"...: killed by SIGxxx".

Per node, the command runs in a process group of its own. A watchdog process (a shell blocked reading a pipe
that only the actor holds) kills that group when the actor dies for any reason, e.g. when Ray kills actors after
the driver died: Popen children outlive their parent otherwise, and PR_SET_PDEATHSIG would reach only the
direct child, not the training process a launcher script started. When the command exits, what is left of its
process group is killed (like Slurm ending a job step).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

EXIT_UNREACHABLE = 75
# Set in a node's `ray start` environment: where that node's command writes its output directly (a path to
# open for writing), bypassing the stream through Ray and the driver; not passed on to the command.
OUTPUT_SINK_VAR = "JOBKIT_OUTPUT_SINK"
EXIT_USAGE = 2
PREFIX = "[ray_launch]"
NAMESPACE = "jobkit"
# Environment variables Ray sets in its worker processes (not in `ray start`'s environment); used only when the
# raylet's environment cannot be read to compute the difference exactly.
# Measured with Ray 2.60: RAY_JOB_ID, RAY_RAYLET_PID, OMP_NUM_THREADS=1, PYTHONBREAKPOINT, SPT_NOENV; and Ray
# removes the LD_PRELOAD (its jemalloc) that `ray start` gave the raylet.
RAY_WORKER_VARS = ("OMP_NUM_THREADS", "PYTHONBREAKPOINT", "SPT_NOENV", "JOBKIT_PYSPY_SHIM_DIR", "JOBKIT_PYSPY_REAL")


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"{PREFIX} {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def describe_status(code: int) -> str:
    """'exited with code N' for N >= 0, 'killed by SIGxxx' for a Popen returncode of -N."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def shell_status(code: int) -> int:
    """The exit status a shell would report: 128+N for a process killed by signal N."""
    return 128 - code if code < 0 else code


def first_failure(results: list[tuple[tuple, int]]) -> int:
    """results: (order, shell status) per node, order e.g. (rank, index); the status of the first failing node in
    that order, else 0."""
    for _order, status in sorted(results):
        if status != 0:
            return status
    return 0


# ---------------------------------------------------------------------------------------------------------------
# Node side: runs inside the actor's worker process. Standard library only (the class is shipped by value).


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


def _open_sink(path: str | None) -> int | None:
    """A write descriptor on the node's output sink (e.g. /proc/<pid>/fd/1 of the shell that launched this
    node's part of the job, whose stdout is the job log there), or None to stream through the driver."""
    if not path:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return None


def _read_environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


class NodeRunner:
    """The per-node actor (threaded: the output stream and stop() run at the same time)."""

    def __init__(self, index: int):
        self.index = index
        self.proc = None
        self.watchdog = None
        self.start_code = 1
        self.lock = threading.Lock()

    def info(self) -> dict:
        env = os.environ
        rank = env.get("NODE_RANK", env.get("SLURM_NODEID", ""))
        return {
            "index": self.index,
            "rank": int(rank) if rank.isdigit() else None,
            "ip": _node_ip(),
            "host": socket.gethostname().split(".")[0],
            "worker_pid": os.getpid(),
        }

    def start(self, cmd: list[str], cwd: str) -> dict:
        import subprocess

        raylet = os.environ.get("RAY_RAYLET_PID", "")
        node_env = _read_environ(int(raylet)) if raylet.isdigit() else None
        if node_env is None:
            node_env = _read_environ(os.getppid())
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
            if sink is not None:
                os.close(sink)
            code = 127 if isinstance(exc, FileNotFoundError) else 126 if isinstance(exc, PermissionError) else 1
            self.start_code = code
            return {"pid": None, "error": f"cannot start {cmd[0]!r} in {cwd}: {_one_line(exc)} (exit {code})"}
        # The watchdog: a shell blocked reading a pipe that only this worker can write; it kills the command's
        # process group unless it reads "done", i.e. when this worker dies. It must not stay our child: when a
        # worker exits, Ray SIGKILLs the worker's direct children (and the worker's process group), which
        # would take the watchdog along before it can act, and leave the grandchildren (the training process a
        # launcher script started) running. So it is started in its own process group and detached (the shell
        # that starts it exits at once).
        try:
            starter = subprocess.Popen(
                [
                    "/bin/sh",
                    "-c",
                    'exec 3<&0; { read -r x <&3; [ "$x" = done ] || kill -KILL "-$1"; } & exit 0',
                    "jobkit-watchdog",
                    str(self.proc.pid),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                **_own_group(),
            )
            starter.wait(timeout=10)
            self.watchdog = starter.stdin
        except (OSError, subprocess.SubprocessError):
            self.watchdog = None
        if sink is not None:
            os.close(sink)  # the command holds it now
        return {"pid": self.proc.pid, "error": None}

    def stream(self):
        """Yields bytes (whole lines, batched) while the command runs, then {"code": returncode}."""
        import queue

        proc = self.proc
        if proc is None:
            yield {"code": self.start_code, "quiet": True}
            return
        if proc.stdout is None:  # the command writes to the node's own output sink: only wait for it
            while not _exited(proc):
                time.sleep(1.0)  # a wakeup costs training CPU; a second more to notice the end costs nothing
            self._killpg(signal.SIGKILL)
            code = proc.wait()
            self._release_watchdog()
            yield {"code": code}
            return
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in iter(proc.stdout.readline, b""):
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
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
                if size > 1 << 16:
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
        # Still a zombie here, so its PID (the group's id) cannot be reused yet: end what is left of the group.
        self._killpg(signal.SIGKILL)
        code = proc.wait()
        self._release_watchdog()
        yield {"code": code}

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
        for pid in _descendants(proc.pid):  # also those that left the group
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


def _exited(proc) -> bool:
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
    """Popen arguments for a process group of its own, in the same session where Python allows it (3.11+)."""
    return {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "?"


# ---------------------------------------------------------------------------------------------------------------
# Driver side.


class Usage(Exception):
    pass


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        cut = argv.index("--")
        opts, cmd = argv[:cut], argv[cut + 1 :]
    else:
        opts, cmd = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m jobkit.ray_launch",
        description="Run CMD on every node of a Ray cluster, output streamed back unchanged.",
        usage="%(prog)s [--address HOST:PORT|auto] [--nodes N] [--nodes-timeout S] [--grace S] "
        "[--failure-grace S] [--connect-timeout S] [--ready-file PATH] -- CMD ARGS...",
    )
    parser.add_argument("--address", default="auto")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--nodes-timeout", type=float, default=120.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--failure-grace", type=float, default=30.0)
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--ready-file")
    args = parser.parse_args(opts)
    if not cmd:
        parser.error("no command: put it after '--', e.g. -- bash _train.sh")
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    args.cmd = cmd
    return args


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _probe(address: str, timeout: float = 5.0) -> str | None:
    """None when HOST:PORT accepts a TCP connection, else why not (fails fast instead of Ray's long retries)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"'{address}' is not HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return _one_line(exc)


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.signal = 0
        self.stopped = threading.Event()
        self.out_lock = threading.Lock()
        self.out_broken = False
        self.actors = []
        self.infos = []
        self.streams = []
        self.results: dict[int, int] = {}
        self.stopped_nodes: set[int] = set()
        self.failed_at: float | None = None
        self.done = threading.Event()

    # Signals: the first one stops the commands; a second one leaves at once.
    def on_signal(self, signum, _frame):
        if self.signal:
            os._exit(128 + self.signal)
        self.signal = signum
        self.stopped.set()

    def write(self, data: bytes) -> None:
        if self.out_broken:
            return
        with self.out_lock:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, OSError, ValueError):
                self.out_broken = True

    def label(self, i: int) -> str:
        info = self.infos[i]
        rank = info["rank"] if info["rank"] is not None else info["index"]
        return f"node {info['ip']} rank {rank}"

    def follow(self, i: int) -> None:
        """Streams node i's output to stdout; records its shell status."""
        import ray

        code, quiet = None, False
        try:
            for ref in self.streams[i]:
                item = ray.get(ref)
                if isinstance(item, dict):
                    code, quiet = item["code"], item.get("quiet", False)
                else:
                    self.write(item)
        except Exception as exc:  # the actor died (node lost, worker killed)
            if not self.signal:
                _say(f"{self.label(i)}: its Ray actor died: {_one_line(exc)}")
            self.results[i] = 1
        else:
            if code is None:
                self.results[i] = 1
                _say(f"{self.label(i)}: the output stream ended without an exit status")
            else:
                self.results[i] = shell_status(code)
                if not quiet:
                    _say(f"{self.label(i)}: {describe_status(code)}")
        if self.results[i] != 0 and self.failed_at is None:
            self.failed_at = time.monotonic()
        self.done.set()

    def wait_ready_file(self, path: str, timeout: float) -> str | None:
        """The stripped content of PATH once it is there (None after TIMEOUT or a signal)."""
        deadline = time.monotonic() + timeout
        while not self.signal:
            try:
                with open(path) as f:
                    return f.read().strip()
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                return None
            self.stopped.wait(0.1)
        return None

    def run(self) -> int:
        args = self.args
        address = args.address
        if address != "auto" and _is_loopback(address):
            # Ray swaps a loopback address for the first routable one unless single-node mode is on.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        try:
            import logging

            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        except Exception as exc:
            _say(
                f"cannot reach the Ray cluster at {address}: ray is not importable ({_one_line(exc)}); "
                "pip install 'ray[default]'"
            )
            return EXIT_UNREACHABLE
        if args.ready_file:
            status = self.wait_ready_file(args.ready_file, args.connect_timeout)
            if status != "0":
                _say(
                    f"the Ray head did not start ({'no status' if status is None else 'status ' + status} in "
                    f"{args.ready_file}): not starting the command"
                )
                return 128 + self.signal if self.signal else EXIT_UNREACHABLE
        if address != "auto":
            why = _probe(address)
            if why:
                _say(f"cannot reach the Ray cluster at {address}: {why}")
                return EXIT_UNREACHABLE
        if __name__ != "__main__":
            # Ship NodeRunner by value: the nodes need not be able to import jobkit.
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        # ray.init retries for minutes (forever, seen with a wrong node address): bound it.
        connected = threading.Event()

        def give_up():
            if not connected.wait(args.connect_timeout):
                _say(
                    f"cannot reach the Ray cluster at {address}: no connection within {args.connect_timeout:g} s "
                    "(--connect-timeout)"
                )
                _exit(EXIT_UNREACHABLE)

        threading.Thread(target=give_up, daemon=True).start()
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        except Exception as exc:
            _say(f"cannot reach the Ray cluster at {address}: {_one_line(exc)}")
            return EXIT_UNREACHABLE
        finally:
            connected.set()
        # Ray's core installs its own SIGTERM handler (logs a stack and exits 15): ours again.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        if self.signal:
            return 128 + self.signal

        deadline = time.monotonic() + args.nodes_timeout
        while True:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            if len(nodes) >= args.nodes:
                break
            if time.monotonic() > deadline or self.signal:
                if self.signal:
                    return 128 + self.signal
                _say(
                    f"cannot reach the Ray cluster at {address}: only {len(nodes)} of {args.nodes} node(s) "
                    f"joined within {args.nodes_timeout:g} s"
                )
                return EXIT_UNREACHABLE
            self.stopped.wait(0.5)
        here = ray.get_runtime_context().get_node_id()
        nodes.sort(key=lambda n: (n["NodeID"] != here, n.get("NodeManagerAddress", ""), n["NodeID"]))

        remote = ray.remote(num_cpus=0, num_gpus=0, max_concurrency=4, max_restarts=0)(NodeRunner)
        job = ray.get_runtime_context().get_job_id()
        self.actors = [
            remote.options(
                name=f"node{i}-job{job}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False),
            ).remote(i)
            for i, n in enumerate(nodes)
        ]
        try:
            self.infos = ray.get([a.info.remote() for a in self.actors], timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:
            if self.signal:
                return 128 + self.signal
            _say(f"cannot reach the Ray cluster at {address}: the per-node actors did not start: {_one_line(exc)}")
            return EXIT_UNREACHABLE
        if self.signal:
            return 128 + self.signal

        cwd = os.getcwd()
        start_refs = [a.start.remote(args.cmd, cwd) for a in self.actors]
        starts = []
        for i, ref in enumerate(start_refs):
            try:
                starts.append(ray.get(ref))
            except Exception as exc:
                # Nothing worth keeping ran yet: stop what did start and let the caller run without Ray.
                _say(
                    f"cannot reach the Ray cluster at {address}: the actor on {self.label(i)} failed: {_one_line(exc)}"
                )
                for actor in self.actors:
                    try:
                        ray.get(actor.stop.remote(0), timeout=10)
                    except Exception:
                        pass
                return EXIT_UNREACHABLE
        self.streams = [a.stream.options(num_returns="streaming").remote() for a in self.actors]
        for i, st in enumerate(starts):
            if st["error"]:
                _say(f"{self.label(i)}: {st['error']}")
            else:
                _say(
                    f"{self.label(i)}: started pid {st['pid']} (Ray worker pid {self.infos[i]['worker_pid']}, "
                    f"host {self.infos[i]['host']})"
                )
        for i in range(len(self.actors)):
            threading.Thread(target=self.follow, args=(i,), daemon=True).start()

        stop_sent = None
        while len(self.results) < len(self.actors):
            self.done.wait(0.2)
            self.done.clear()
            if stop_sent is not None:
                if time.monotonic() - stop_sent > args.grace + 15:
                    _say(
                        f"{len(self.actors) - len(self.results)} node(s) did not report after being stopped; "
                        "leaving (Ray ends their actors and commands when this driver exits)"
                    )
                    break
                continue
            if self.signal:
                self._stop_all(f"got {signal.Signals(self.signal).name}")
                stop_sent = time.monotonic()
            elif self.failed_at is not None and time.monotonic() - self.failed_at > args.failure_grace:
                self._stop_all(f"a node failed {args.failure_grace:g} s ago")
                stop_sent = time.monotonic()
        if self.signal:
            return 128 + self.signal
        # Nodes stopped because another one failed are not the cause: they count only if nothing else failed.
        results = []
        for i, info in enumerate(self.infos):
            rank = info["rank"] if info["rank"] is not None else info["index"]
            results.append(((i in self.stopped_nodes, rank, i), self.results.get(i, 1)))
        return first_failure(results)

    def _stop_all(self, why: str) -> None:
        running = [i for i in range(len(self.actors)) if i not in self.results]
        if not running:
            return
        self.stopped_nodes.update(running)
        _say(f"{why}: stopping the command on {len(running)} node(s) (TERM, KILL after {self.args.grace:g} s)")
        for i in running:
            try:
                self.actors[i].stop.remote(self.args.grace)
            except Exception:
                pass


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else 0
    driver = Driver(args)
    old = {s: signal.signal(s, driver.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return driver.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _exit(code: int) -> None:
    """Leave without Ray's shutdown (it can take seconds and once failed a clean run); the cluster notices the
    driver is gone and ends its actors, whose commands have ended by now."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
