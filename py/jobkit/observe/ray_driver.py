"""The driver side of `jobkit ray-launch [options] -- CMD ARGS...`: run CMD on every node of a Ray cluster.

One actor per alive node (jobkit.observe.ray_actor.NodeRunner: num_cpus=0, num_gpus=0, pinned to its node) runs CMD as a
plain subprocess (see that module for its environment and process handling). What the commands write comes
back line by line and goes to this driver's stdout exactly as written (no Ray prefix), flushed as it arrives;
whole lines are never mixed between nodes. A node whose `ray start` set JOBKIT_OUTPUT_SINK writes there instead.

Exit status: 0 when every node's command exited 0; else the status of the first failing node in rank order
(NODE_RANK from that node's environment, else node index; the head's node is index 0), 128+N for a command
killed by signal N, 1 when a node's actor died; nodes stopped because another failed count last;
143/130 after SIGTERM/SIGINT (commands stopped);
EXIT_UNREACHABLE (75, EX_TEMPFAIL) when no command was started: Ray not importable, the cluster not reachable,
fewer than N nodes, or an actor that could not start. Only then is it safe to run the command without Ray.
2: bad usage. Per node, one line on stderr: "[ray_launch] node <ip> rank <r>: exited with code N" or
"...: killed by SIGxxx".

With a process per device (LOCAL_WORLD_SIZE > 1) it is still one actor per node: CMD is then `jobkit procs --
jobkit launch ...` (_train.sh), and that node's `jobkit procs` (jobkit.launch.procs) starts and watches the node's N
training processes. Why not one actor per device: placement (the node, its devices), failure (the first process
to fail stops the node's others, told as PROC_EXIT) and the `[rank<G>]:` prefix of every line then live in one
place, the same for the native, container and RAY=1 tiers, and Ray's view of the job (an actor per node, the
node's exit status) does not change with N. MaxText writes TensorBoard from process 0 only (node 0), so the
TensorBoard bridge and the TSDB find the one event stream where they found it before.

Ray is imported only when the command runs (the CLI lists commands by importing their modules).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import click

from jobkit.core import clitypes, procfs
from jobkit.core.errors import EXIT_UNREACHABLE
from jobkit.observe import ray_actor
from jobkit.observe.ray_actor import one_line

PREFIX = "[ray_launch]"  # what the job log's readers (and tests) look for; unchanged by the rename
NAMESPACE = "jobkit"


@dataclass
class Options:
    cmd: tuple[str, ...]
    address: str = "auto"
    nodes: int = 1
    nodes_timeout: float = 120.0
    grace: float = 5.0
    failure_grace: float = 30.0
    connect_timeout: float = 60.0
    ready_file: str | None = None


def _say(msg: str) -> None:
    try:
        sys.stderr.write(f"{PREFIX} {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


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
        return one_line(exc)


def node_registered(address: str, host: str | None = None) -> bool | None:
    """Whether the GCS at ADDRESS (HOST:PORT) lists an alive node on HOST (default: ADDRESS's); None when Ray's
    GCS client cannot say (a Ray whose internals differ, a GCS that does not answer within 1 s).

    ray.init looks for a raylet of this host among the GCS's alive nodes and, not finding one, sleeps a whole
    second before it looks again (Ray 2.60, services.get_node_to_connect_for_driver). The head is reported up
    (GCS, raylet socket, the agents' port files) a few tenths of a second before its raylet registers, so a
    driver that called ray.init at once paid that second on every RAY=1 start."""
    host = host or address.rpartition(":")[0].strip("[]")
    try:
        from ray._raylet import GcsClient
        from ray.core.generated.gcs_pb2 import GcsNodeInfo

        nodes = GcsClient(address=address).get_all_node_info(timeout=1, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
        return any(info.node_manager_address == host for info in nodes.values())
    except Exception:
        return None


class _Leave(Exception):
    """Ends Driver.run before the commands are followed, with STATUS as its exit status (see Driver.run)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class Driver:
    def __init__(self, args: Options):
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
                _say(f"{self.label(i)}: its Ray actor died: {one_line(exc)}")
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
        """Runs CMD on every node; the exit status described in the module docstring.

        A step of 1-3 that cannot go on raises _Leave with the status to leave with: Ray missing or unreachable
        (EXIT_UNREACHABLE: no command ran, the caller may run it without Ray) or a signal (128+N)."""
        try:
            # 1. Ray: importable, its head started (--ready-file), its address reachable, this driver connected.
            self._import_ray()
            self._wait_for_head()
            self._probe_address()
            self._connect()
            # 2. One actor pinned to each alive node, once --nodes of them joined (one --nodes-timeout for both).
            deadline = time.monotonic() + self.args.nodes_timeout
            self._spawn_actors(self._wait_for_nodes(deadline), deadline)
            # 3. The command started on every node.
            self._start_commands()
        except _Leave as leave:
            return leave.status
        # 4. Their output followed until every node reported (all stopped after a signal or a node's failure).
        self._follow_until_done()
        if self.signal:
            return 128 + self.signal
        # 5. The first failing node's status.
        return self._exit_status()

    def _leave_on_signal(self) -> None:
        """After SIGTERM/SIGINT nothing more is started."""
        if self.signal:
            raise _Leave(128 + self.signal)

    def _import_ray(self) -> None:
        """Ray's environment for this driver, then whether Ray imports at all."""
        address = self.args.address
        if address != "auto" and _is_loopback(address):
            # Ray swaps a loopback address for the first routable one unless single-node mode is on.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        try:  # the later steps import these again, from sys.modules
            import ray  # noqa: F401
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: F401
        except Exception as exc:
            _say(
                f"cannot reach the Ray cluster at {address}: ray is not importable ({one_line(exc)}); "
                "pip install 'ray[default]'"
            )
            raise _Leave(EXIT_UNREACHABLE) from None

    def _wait_for_head(self) -> None:
        """--ready-file: go on only once the head's start status there is 0."""
        args = self.args
        if not args.ready_file:
            return
        status = self.wait_ready_file(args.ready_file, args.connect_timeout)
        if status != "0":
            _say(
                f"the Ray head did not start ({'no status' if status is None else 'status ' + status} in "
                f"{args.ready_file}): not starting the command"
            )
            raise _Leave(128 + self.signal if self.signal else EXIT_UNREACHABLE)

    def _probe_address(self) -> None:
        address = self.args.address
        if address != "auto":
            why = _probe(address)
            if why:
                _say(f"cannot reach the Ray cluster at {address}: {why}")
                raise _Leave(EXIT_UNREACHABLE)

    def _connect(self) -> None:
        """ray.init, bounded by --connect-timeout; then our signal handlers again."""
        import logging

        import ray

        address = self.args.address
        # Ship the actor's code by value: the nodes need not be able to import jobkit.
        for module in (ray_actor, procfs):
            ray.cloudpickle.register_pickle_by_value(module)
        connected = threading.Event()
        threading.Thread(target=self._exit_unless_connected, args=(connected,), daemon=True).start()
        # Until the head's raylet has registered, polled every 0.05 s instead of by ray.init's 1 s sleeps
        # (node_registered); --connect-timeout bounds both. Anything unexpected leaves the wait to ray.init.
        while not self.signal and node_registered(address) is False:
            self.stopped.wait(0.05)
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=True,
            )
        except Exception as exc:
            _say(f"cannot reach the Ray cluster at {address}: {one_line(exc)}")
            raise _Leave(EXIT_UNREACHABLE) from None
        finally:
            connected.set()
        # Ray's core installs its own SIGTERM handler (logs a stack and exits 15): ours again.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        self._leave_on_signal()

    def _exit_unless_connected(self, connected: threading.Event) -> None:
        """ray.init retries for minutes (forever, seen with a wrong node address): a thread bounds it."""
        if not connected.wait(self.args.connect_timeout):
            _say(
                f"cannot reach the Ray cluster at {self.args.address}: no connection within "
                f"{self.args.connect_timeout:g} s (--connect-timeout)"
            )
            _exit(EXIT_UNREACHABLE)

    def _wait_for_nodes(self, deadline: float) -> list[dict]:
        """The alive nodes once there are --nodes of them, this driver's node first."""
        import ray

        args = self.args
        while True:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            if len(nodes) >= args.nodes:
                break
            if time.monotonic() > deadline or self.signal:
                self._leave_on_signal()
                _say(
                    f"cannot reach the Ray cluster at {args.address}: only {len(nodes)} of {args.nodes} node(s) "
                    f"joined within {args.nodes_timeout:g} s"
                )
                raise _Leave(EXIT_UNREACHABLE)
            self.stopped.wait(0.5)
        here = ray.get_runtime_context().get_node_id()
        nodes.sort(key=lambda n: (n["NodeID"] != here, n.get("NodeManagerAddress", ""), n["NodeID"]))
        return nodes

    def _spawn_actors(self, nodes: list[dict], deadline: float) -> None:
        """One NodeRunner pinned to each node (node i is actor i), and what each says about its node."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_cpus=0, num_gpus=0, max_concurrency=4, max_restarts=0)(ray_actor.NodeRunner)
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
            self._leave_on_signal()
            _say(
                f"cannot reach the Ray cluster at {self.args.address}: the per-node actors did not start: "
                f"{one_line(exc)}"
            )
            raise _Leave(EXIT_UNREACHABLE) from None
        self._leave_on_signal()

    def _start_commands(self) -> None:
        """CMD started by every actor, their output streams opened, one line per node on stderr."""
        import ray

        cwd = os.getcwd()
        start_refs = [a.start.remote(self.args.cmd, cwd) for a in self.actors]
        starts = []
        for i, ref in enumerate(start_refs):
            try:
                starts.append(ray.get(ref))
            except Exception as exc:
                # Nothing worth keeping ran yet: stop what did start and let the caller run without Ray.
                _say(
                    f"cannot reach the Ray cluster at {self.args.address}: the actor on {self.label(i)} failed: "
                    f"{one_line(exc)}"
                )
                for actor in self.actors:
                    try:
                        ray.get(actor.stop.remote(0), timeout=10)
                    except Exception:
                        pass
                raise _Leave(EXIT_UNREACHABLE) from None
        self.streams = [a.stream.options(num_returns="streaming").remote() for a in self.actors]
        for i, st in enumerate(starts):
            if st["error"]:
                _say(f"{self.label(i)}: {st['error']}")
            else:
                _say(
                    f"{self.label(i)}: started pid {st['pid']} (Ray worker pid {self.infos[i]['worker_pid']}, "
                    f"host {self.infos[i]['host']})"
                )
            if st.get("warning"):
                _say(f"{self.label(i)}: {st['warning']}")

    def _follow_until_done(self) -> None:
        """One thread per node follows its output. A signal, or a node that failed --failure-grace ago, stops the
        commands still running; nodes that have not reported --grace + 15 s later are left to Ray."""
        args = self.args
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

    def _exit_status(self) -> int:
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


def _exit(code: int) -> None:
    """Leave without Ray's shutdown (it can take seconds and once failed a clean run); the cluster notices the
    driver is gone and ends its actors, whose commands have ended by now."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def run(options: Options) -> int:
    """Runs the driver with its own SIGTERM/SIGINT handling; the exit status described above."""
    driver = Driver(options)
    old = {s: signal.signal(s, driver.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return driver.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_SECONDS = clitypes.Seconds()
_GRACE = clitypes.Seconds(min_open=False)


@click.command(
    "ray-launch",
    context_settings={"allow_interspersed_args": False},
    short_help="Run a command on every node of a Ray cluster.",
)
@click.option(
    "--address", default="auto", show_default=True, help="GCS HOST:PORT; auto = RAY_ADDRESS or the local one."
)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Wait until N nodes are alive.")
@click.option("--nodes-timeout", type=_SECONDS, default=120.0, show_default=True, help="Seconds to wait for them.")
@click.option("--grace", type=_GRACE, default=5.0, show_default=True, help="On SIGTERM/SIGINT: seconds TERM to KILL.")
@click.option(
    "--failure-grace",
    type=_GRACE,
    default=30.0,
    show_default=True,
    help="Seconds the other nodes get to end once one failed.",
)
@click.option("--connect-timeout", type=_SECONDS, default=60.0, show_default=True, help="Seconds ray.init may take.")
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="Import Ray, then wait (up to --connect-timeout) until this file holds the head's start status: 0 goes "
    "on, anything else exits 75.",
)
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(cmd, **opts):
    """Run CMD (after '--') on every node of a Ray cluster, its output streamed back unchanged.

    Exit status: the first failing node's (in rank order); 75 when no command was started (Ray missing, cluster
    unreachable, too few nodes: safe to run CMD without Ray); 143/130 after SIGTERM/SIGINT; 2 on bad usage.
    """
    if not cmd:
        raise click.UsageError("no command: put it after '--', e.g. -- bash _train.sh")
    _exit(run(Options(cmd=cmd, **opts)))
