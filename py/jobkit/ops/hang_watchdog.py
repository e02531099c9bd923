"""`jobkit hang-watchdog`: notice that training stopped making progress, capture every node's stacks, act.

One watchdog runs beside training on every node (started by _train.sh, natively or in the container). It
follows the job log (every rank's `completed step` lines land there, prefixed `N: ` under srun -l) and
watches its own rank's step number (each of its processes' with LOCAL_WORLD_SIZE > 1, below). Progress is a new step, never the log's size or mtime: a job printing
warnings in a loop is not making progress.

The limit adapts (Settings): before the first step it is the compile allowance, HANG_COMPILE_TIMEOUT
(loading, compiling and the first step of a big model take long); after it, HANG_STEP_FACTOR times the
median step time so far, never less than HANG_TIMEOUT. When it is exceeded:

1. the first watchdog to notice writes <job dir>/hang/HANG (one line: phase, last step, seconds since) and
   prints `== HANG detected (...) ==`; every watchdog polls for that file, so
2. each node captures its own training process's stacks into <job dir>/hang/<host>.txt (its /proc state and
   wchan, then py-spy with native frames, else Python frames only: a stopped process cannot be paused
   again; core.hang_stacks reads them to blame the rank unlike the others), then
3. with HANG_ACTION=cancel (default) the first watchdog waits until every node's stacks are in (bounded),
   and each watchdog stops its own node's training (TERM, CONT, KILL after a grace), so the allocation is
   not wasted; the job then ends with status HANG. HANG_ACTION=report only records and keeps watching.

With a process per device (LOCAL_WORLD_SIZE=N > 1, launch/procs.py) the node's one watchdog watches its N
training processes (`jobkit launch` with LOCAL_RANK i, not their `jobkit procs` supervisor), each by its own
`[rank<G>]: ` lines (after srun's `N: `, or alone under run_local.sh); the node's progress is its slowest running
process's (one frozen process stops every other in JAX anyway). Their stacks go to hang/<host>.proc<i>.txt, one
file per process, taken together; HANG_ACTION=cancel stops all N. The watchdog ends as soon as every process has
(it waits on their pidfds between looks), and `jobkit procs`, its parent after _train.sh's exec, waits for it.

HANG_TIMEOUT=off (or 0) turns the watchdog off. Bad settings (and a bad JAX_HEARTBEAT_TIMEOUT, whose default
follows them: core/hang_settings.py) are one-line errors before training starts
(`jobkit hang-watchdog --check`).

A workspace may be shared with a team (group-writable), so a marker is believed only when this job's own
watchdog or batch script could have written it (`read_marker`, `time_limit_requested`): a regular file of this
uid with one link (core.files.read_own), naming this job (`job=<JOB_ID>` on its second line), and HANG only in a
hang/ dir of this uid that nobody else can write (each watchdog creates it at start, 0755 minus the umask).
Anything else is ignored, and said in the log (`[hang] <host>: ignored ...`). The batch script's summary and
`jobkit requeue` read the marker through the same check (`jobkit hang-watchdog --marker`).
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import click

from jobkit.core import clitypes, files, procfs
from jobkit.core.errors import EXIT_ANSWER_NO, EXIT_OK, EXIT_SETTINGS, EXIT_STOPPED, JobkitError, exit_with
from jobkit.core.hang_settings import STACK_WAIT, STOP_GRACE, Settings, SettingsError, heartbeat_timeout
from jobkit.launch import procs

STARTUP, COMPILE, TRAINING = "startup", "compile", "training"
# Written into the job dir by _job.sbatch when Slurm warns of the time limit: the watchdog TERMs training.
TIME_LIMIT_MARKER = "time-limit-stop"
INIT_MARKER = "After params initialized"  # MaxText prints it once the parameters exist; compiling follows
STEP_RE = re.compile(r"completed step: (\d+), seconds: ([0-9.]+)")
RANK_RE = re.compile(r"^\s*(\d+): ")
# `jobkit procs` puts each process's lines behind `[rank<G>]: ` (after srun -l's `N: ` under Slurm).
PROC_RE = re.compile(r"^\s*(?:\d+: )?\[rank(\d+)\]: ")
MARKER_NAME = "HANG"


@dataclass
class Progress:
    """One rank's (or, with LOCAL_WORLD_SIZE > 1, one process's) progress as read from the job log."""

    rank: str | None  # the `N: ` prefix srun -l gives this rank's lines; None when lines carry no prefix
    changed_at: float  # monotonic time of the last new step (or of the start)
    proc: str | None = None  # the global rank G of a process's `[rank<G>]: ` prefix (jobkit procs), else None
    last_step: int | None = None
    step_times: list[float] = field(default_factory=list)
    initialised: bool = False

    @property
    def phase(self) -> str:
        if self.last_step is not None:
            return TRAINING
        return COMPILE if self.initialised else STARTUP

    def feed(self, line: str, now: float) -> None:
        if self.proc is not None:
            m = PROC_RE.match(line)
            if m is None or m.group(1) != self.proc:
                return
        elif self.rank is not None:
            m = RANK_RE.match(line)
            if m is None or m.group(1) != self.rank:
                return
        if INIT_MARKER in line:
            self.initialised = True
        m = STEP_RE.search(line)
        if m:
            step = int(m.group(1))
            if self.last_step is None or step > self.last_step:
                self.last_step = step
                self.changed_at = now
                # Steps 0-1 include compilation and first dispatch; they would inflate the median.
                if step >= 2:
                    self.step_times.append(float(m.group(2)))


def limit(settings: Settings, progress: Progress) -> float:
    """Seconds without a new step after which this rank counts as hung."""
    if progress.last_step is None:
        return settings.compile_allowance
    if not progress.step_times:
        return max(settings.floor, settings.compile_allowance / 4)  # steps 0-1 only: still warming up
    return max(settings.floor, settings.factor * statistics.median(progress.step_times))


class LogFollower:
    """The lines appended to a file since the last call (a partial last line is kept for the next)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines


def find_trainings(job_id: str, node_rank: str, per_node: int = 1) -> dict[int, int]:
    """This job's and node's training processes, local rank -> pid: `jobkit launch` with JOB_ID and NODE_RANK in
    its environment (several nodes of one job share a machine on a test cluster, so the rank is part of the match).
    With PER_NODE > 1 (LOCAL_WORLD_SIZE) each is keyed by the LOCAL_RANK `jobkit procs` gave it; their supervisor
    (`jobkit procs -- ... jobkit launch ...`) holds training's command line but is not training."""
    found: dict[int, int] = {}
    for pid in procfs.pids():
        if pid == os.getpid():
            continue
        argv = procfs.cmdline(pid)
        pairs = list(zip(argv, argv[1:], strict=False))
        if not any(a.endswith("jobkit") and b == "launch" for a, b in pairs):
            continue
        if "ray-launch" in argv:
            continue  # RAY=1's driver on rank 0: its command line holds training's, but it is not training
        if any(a.endswith("jobkit") and b == "procs" for a, b in pairs):
            continue  # the supervisor of a node's LOCAL_WORLD_SIZE processes
        env = procfs.environ(pid) or {}
        if env.get("JOB_ID") != job_id or env.get("NODE_RANK") != node_rank:
            continue
        local = 0
        if per_node > 1:
            raw = env.get("LOCAL_RANK", "")
            if not (raw.isascii() and raw.isdigit()) or int(raw) >= per_node:
                continue  # not one of the processes `jobkit procs` started
            local = int(raw)
        found[local] = min(found.get(local, pid), pid)  # a fork of training (same command line) is not it
    return found


def find_training(job_id: str, node_rank: str) -> int | None:
    """The training process of this job and node (one process per node), else None."""
    found = find_trainings(job_id, node_rank)
    return found.get(0)


def marker_body(first_line: str, job_id: str) -> str:
    """What a marker holds: its line for people, then the job it belongs to (an old job's marker moved into
    this job dir is not this job's)."""
    return f"{first_line}\njob={job_id}\n"


def _own_marker(path: Path, job_id: str, in_own_dir: bool) -> str | None:
    """The first line of the marker at PATH when it is this job's (see the module doc); None when there is none
    (or it is still being written); files.Untrusted when it is someone else's."""
    try:
        text = files.read_own(path, in_own_dir=in_own_dir)
    except FileNotFoundError:
        return None
    if not text.endswith("\n"):
        return None  # its writer has not finished its one write yet
    first, _, rest = text.partition("\n")
    if rest != f"job={job_id}\n":
        raise files.Untrusted(f"{path} is not this job's marker (it does not say job={job_id})")
    return first


def read_marker(job_dir: Path, job_id: str) -> str | None:
    """The hang marker's line (phase, last step, ...) when this job's watchdog wrote it, else None;
    files.Untrusted (the why) when a marker is there that it did not write."""
    return _own_marker(job_dir / "hang" / MARKER_NAME, job_id, in_own_dir=True)


def time_limit_requested(job_dir: Path, job_id: str) -> bool:
    """Whether this job's batch script asked training to save and stop for Slurm's time limit (the marker in the
    job dir, which a team may be allowed to write: its owner and content are what count); files.Untrusted when a
    marker is there that the batch script did not write."""
    return _own_marker(job_dir / TIME_LIMIT_MARKER, job_id, in_own_dir=False) is not None


def request_time_limit_stop(job_dir: Path, job_id: str) -> None:
    """The batch script's marker (`jobkit hang-watchdog --time-limit`): written whole, never through a link."""
    files.write_atomic(job_dir / TIME_LIMIT_MARKER, marker_body("time limit near: save and stop", job_id))


def capture_stacks(pid: int | None, out: Path | None, header: str) -> str:
    """Writes PID's stacks to OUT (to stdout, the job log, when OUT is None); returns how they were taken. A live process is paused for native frames;
    a stopped one cannot be paused again, so its Python frames are read without pausing it."""
    lines = [header]
    how = "no training process found"
    if pid is not None:
        state = ""
        try:
            state = next(
                (ln.split(":", 1)[1].strip() for ln in open(f"/proc/{pid}/status") if ln.startswith("State:")), ""
            )
        except OSError:
            pass
        try:  # the kernel function it sleeps in: for a D state, the file system or driver it waits on
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        wchan = f", wchan {wchan}" if wchan and wchan != "0" and " " not in wchan else ""
        lines.append(f"pid {pid}, state {state or 'unknown'}{wchan}")
        ways = [("py-spy --native", ["--native"]), ("py-spy --nonblocking", ["--nonblocking"])]
        if state.startswith("T"):
            ways = ways[1:]  # stopped: py-spy cannot pause it again, so no native frames
        for how, extra in ways:
            try:
                dump = subprocess.run(
                    [pyspy(), "dump", "--pid", str(pid), *extra], capture_output=True, text=True, timeout=60
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                lines.append(f"[{how}] failed: {exc}")
                continue
            if dump.returncode == 0 and "Thread " in dump.stdout:
                lines += [f"[{how}]", dump.stdout.rstrip()]
                break
            said = (dump.stderr or dump.stdout).split("Stack backtrace:")[0].strip()
            lines.append(f"[{how}] failed: {said[-400:]}")
        else:
            how = "py-spy failed"
    if out is None:
        say("\n".join(lines))
    else:
        files.write_atomic(out, "\n".join(lines) + "\n")  # a reader never sees half a file
    return how


def pyspy() -> str:
    """The py-spy of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


def stop_training(pids: int | list[int] | None) -> None:
    """CONT first (a stopped process cannot act on TERM), then procfs.stop: TERM, KILL after STOP_GRACE; every
    process of the node together (one grace for all)."""
    if pids is None:
        return
    live = []
    for pid in [pids] if isinstance(pids, int) else pids:
        if not procfs.alive(pid):
            continue
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            continue
        live.append(pid)
    if live:
        procfs.stop(live, STOP_GRACE)


def nap(pids, seconds: float) -> None:
    """Sleeps SECONDS, or less: until every one of PIDS has ended (a pidfd turns readable at its exit), so the
    watchdog ends with training and not up to a look later, when whoever waits for the node (jobkit procs,
    jobkit reap) may already be stopping what is left."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue  # ended already: no need to wait for it
            except (OSError, AttributeError):  # a kernel (or Python) without pidfds: a plain sleep
                time.sleep(seconds)
                return
        if not fds:
            if not list(pids):
                time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        waiting = list(fds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(waiting, [], [], left)
            waiting = [fd for fd in waiting if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def say(message: str) -> None:
    print(message, flush=True)


@dataclass
class Watchdog:
    settings: Settings
    log: Path
    hang_dir: Path
    job_id: str
    node_rank: str
    nnodes: int
    host: str
    interval: float = 2.0
    declared: bool = False  # this watchdog noticed the hang (and wrote the marker, if the hang dir is ours)
    start_wait: float = 300.0  # seconds to wait for training to appear before giving up
    hang_dir_ok: bool = True  # the hang dir is this user's own: markers and stacks go there
    marker_line: str = ""  # the HANG marker's line, once a trusted one (or our own) is seen
    reported: set[str] = field(default_factory=set)  # the ignored files already said in the log
    training_pid: int | None = None  # the training process being watched, once found (tests wait on it)
    per_node: int = 1  # LOCAL_WORLD_SIZE: training processes on this node (jobkit procs)
    training_pids: dict[int, int] = field(default_factory=dict)  # local rank -> pid, once found

    def ignore(self, why: str) -> None:
        """Says once in the log which file was ignored and why (a teammate may have planted it)."""
        if why not in self.reported:
            self.reported.add(why)
            say(f"[hang] {self.host}: ignored {why}")

    def prepare(self) -> None:
        """Creates the hang dir as this user's own; a planted one is reported and not used."""
        try:
            files.make_own_dir(self.hang_dir)
        except (files.Untrusted, OSError) as exc:
            self.hang_dir_ok = False
            self.ignore(f"{exc}: no hang marker is trusted there; this node acts on the hangs it notices itself")

    def hang_declared(self) -> bool:
        """Whether a hang was declared: by this watchdog, or by another node's (a trusted marker)."""
        if self.declared:
            return True
        if not self.hang_dir_ok:
            return False
        try:
            line = read_marker(self.hang_dir.parent, self.job_id)
        except files.Untrusted as exc:
            self.ignore(str(exc))
            return False
        if line is None:
            return False
        self.marker_line = line
        return True

    def time_limit_near(self) -> bool:
        try:
            return time_limit_requested(self.hang_dir.parent, self.job_id)
        except files.Untrusted as exc:
            self.ignore(str(exc))
            return False

    def progresses(self, started: float) -> dict[int, Progress]:
        """What is read from the log, per local process: the node's rank (`N: `) with one process per node, each
        process's `[rank<G>]: ` prefix with LOCAL_WORLD_SIZE > 1 (the node prefix is then not needed: G is)."""
        if self.per_node == 1:
            return {0: Progress(self.node_rank if self.nnodes > 1 else None, changed_at=started)}
        base = int(self.node_rank) * self.per_node
        return {i: Progress(None, changed_at=started, proc=str(base + i)) for i in range(self.per_node)}

    def global_rank(self, local: int) -> int:
        return int(self.node_rank) * self.per_node + local

    def slowest(self, progress: dict[int, Progress], pids: dict[int, int], now: float) -> tuple[int, float, bool]:
        """The node's progress is its slowest process's (one frozen process stops every other in JAX anyway):
        (its local rank, seconds since its last step, whether that is past its limit). Only processes that run
        count: one that has ended makes no more steps, and is no hang."""
        worst: tuple[float, int, float] | None = None
        for local, prog in progress.items():
            if local not in pids:
                continue
            stalled = now - prog.changed_at
            over = stalled - limit(self.settings, prog)
            if worst is None or over > worst[0]:
                worst = (over, local, stalled)
        if worst is None:
            return 0, 0.0, False
        return worst[1], worst[2], worst[0] > 0

    def run(self, clock=time.monotonic) -> int:
        """Watch until training ends (EXIT_OK), or this node's training was stopped for a hang (EXIT_STOPPED)."""
        follower = LogFollower(self.log)
        started = clock()
        progress = self.progresses(started)
        seen_training = False
        self.prepare()
        saving = False  # TERM sent for the time limit: training is saving a checkpoint, not hanging
        pids: dict[int, int] = {}
        while True:
            now = clock()
            for line in follower.new_lines():
                for prog in progress.values():
                    prog.feed(line, now)
            # /proc is scanned until every process is found; after that one liveness check each per look.
            if len(pids) < self.per_node or not all(procfs.alive(pid) for pid in pids.values()):
                pids = find_trainings(self.job_id, self.node_rank, self.per_node)
            if not pids:
                if seen_training or now - started > self.start_wait:
                    return EXIT_OK  # training ended (or never started): nothing to watch
            else:
                seen_training = True
                self.training_pids = dict(pids)
                self.training_pid = min(pids.values())
            if pids and not saving and self.time_limit_near():
                # Only training gets the TERM (MaxText saves at its next step and stops): a TERM to the whole job
                # step would also stop Ray and the exporters under training while it saves.
                saving = True
                for pid in pids.values():
                    os.kill(pid, signal.SIGTERM)
                listed = ", ".join(str(pid) for pid in sorted(pids.values()))
                say(f"[hang] {self.host}: Slurm's time limit is near: TERM to training (pid {listed}) to save and stop")
            local, stalled, over = self.slowest(progress, pids, now)
            declared = self.hang_declared()
            if pids and not saving and not declared and over:
                self.declare(progress[local], stalled)
                declared = self.hang_declared()
            if declared and not pids and not seen_training and now - started <= self.start_wait:
                # Another node declared a hang before this node's training showed up (a slow start): wait for
                # it, or its stacks would say "no training process found" and it would run on unwatched.
                time.sleep(self.interval)
                continue
            if declared:
                self.respond(pids)
                if self.settings.action == "cancel":
                    stop_training(list(pids.values()))
                    return EXIT_STOPPED
                return self.keep_reporting(follower, progress, clock)
            nap(pids.values(), self.interval)

    def keep_reporting(self, follower: LogFollower, progress: dict[int, Progress], clock) -> int:
        """HANG_ACTION=report: training goes on; say so once if it makes progress again, until it ends."""

        def slowest_step():
            steps = [p.last_step for p in progress.values()]
            return None if None in steps else min(steps)

        last = slowest_step()
        while find_trainings(self.job_id, self.node_rank, self.per_node):
            for line in follower.new_lines():
                for prog in progress.values():
                    prog.feed(line, clock())
            if slowest_step() != last:
                last = slowest_step()
                say(f"[hang] {self.host}: training made progress again (step {last})")
            time.sleep(self.interval)
        return EXIT_OK

    def declare(self, progress: Progress, stalled: float) -> None:
        """Write the marker (the first watchdog wins: O_EXCL) and the HANG line."""
        last = "none" if progress.last_step is None else str(progress.last_step)
        text = f"phase {progress.phase}, last step {last}, {stalled:.0f} s since"
        line = f"{text}, noticed on {self.host} (rank {self.node_rank})"
        if self.hang_dir_ok:
            try:
                # One write of a short line: another node reads it whole, or not yet (no final newline).
                fd = os.open(self.hang_dir / MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except FileExistsError:
                if self.hang_declared():
                    return  # another node noticed first; its marker stands
            else:
                with os.fdopen(fd, "w") as fh:
                    fh.write(marker_body(line, self.job_id))
        self.declared = True
        self.marker_line = line
        say(f"== HANG detected ({text}) ==")

    def stacks_file(self, local: int) -> str:
        """`<host>.txt` with one process per node; `<host>.proc<LOCAL_RANK>.txt` with LOCAL_WORLD_SIZE > 1."""
        return f"{self.host}.txt" if self.per_node == 1 else f"{self.host}.proc{local}.txt"

    def respond(self, pids: dict[int, int]) -> None:
        """Capture the stacks of this node's processes (together: py-spy may take seconds each). Before anything is
        stopped every node waits (bounded) for the others' stacks: stopping one node's training ends the job step
        on every node (srun --kill-on-bad-exit)."""

        def take(local: int) -> tuple[int, Path | None, str]:
            who = f"rank {self.node_rank}"
            if self.per_node > 1:
                who += f", process {local}, global rank {self.global_rank(local)}"
            out = self.hang_dir / self.stacks_file(local) if self.hang_dir_ok else None
            return local, out, capture_stacks(pids.get(local), out, f"HANG on {self.host} ({who}): {self.marker_line}")

        with ThreadPoolExecutor(max_workers=self.per_node) as pool:
            taken = list(pool.map(take, range(self.per_node)))
        for local, out, how in taken:
            where = f"in {out}" if out else "above (the hang dir is not this user's)"
            what = "training" if self.per_node == 1 else f"process {local} (global rank {self.global_rank(local)})"
            say(f"[hang] {self.host}: stacks of {what} (pid {pids.get(local)}) {where} ({how})")
        if self.settings.action != "cancel":
            say(f"[hang] {self.host}: training left running (HANG_ACTION=report)")
            return
        if not self.hang_dir_ok:
            say(f"[hang] {self.host}: stopping training (HANG_ACTION=cancel)")
            return
        expected = self.nnodes * self.per_node
        deadline = time.monotonic() + STACK_WAIT
        while time.monotonic() < deadline and len(list(self.hang_dir.glob("*.txt"))) < expected:
            time.sleep(0.5)
        have = len(list(self.hang_dir.glob("*.txt")))
        if have < expected:
            of = f"{self.nnodes} nodes" if self.per_node == 1 else f"{expected} processes"
            say(f"[hang] stacks from {have} of {of} after {STACK_WAIT} s; stopping anyway")
        say(f"[hang] {self.host}: stopping training (HANG_ACTION=cancel)")


@click.command("hang-watchdog")
@click.option("--log", "log", type=click.Path(path_type=Path), help="The job log to follow.")
@click.option("--job-dir", type=click.Path(path_type=Path), help="The job dir (hang/ is written there).")
@click.option(
    "--interval", type=clitypes.Seconds(max=3600), default=2.0, show_default=True, help="Seconds between looks."
)
@click.option(
    "--check",
    is_flag=True,
    help=f"Only check the HANG_* settings and JAX_HEARTBEAT_TIMEOUT: one line and exit {EXIT_SETTINGS} when bad.",
)
@click.option(
    "--marker",
    is_flag=True,
    help=f"Only print the hang marker of --job-dir when this job's watchdog wrote it (exit 0), else exit "
    f"{EXIT_ANSWER_NO} (saying on stderr why a marker there was ignored).",
)
@click.option("--time-limit", is_flag=True, help="Only write --job-dir's time-limit marker (the batch script's).")
def command(log, job_dir, interval, check, marker, time_limit):
    """Watch this node's training for a hang (settings: HANG_TIMEOUT, HANG_COMPILE_TIMEOUT, HANG_STEP_FACTOR,
    HANG_ACTION; JAX_HEARTBEAT_TIMEOUT is checked with them; identity: JOB_ID, NODE_RANK, NNODES from the
    environment)."""
    if marker or time_limit:
        job_id = os.environ.get("JOB_ID", "")
        if job_dir is None or not job_id:
            raise click.UsageError("--marker and --time-limit need --job-dir and JOB_ID in the environment")
        if time_limit:
            request_time_limit_stop(job_dir, job_id)
            return
        try:
            line = read_marker(job_dir, job_id)
        except files.Untrusted as exc:
            click.echo(f"[hang] ignored {exc}", err=True)
            exit_with(EXIT_ANSWER_NO)
        if line is None:
            exit_with(EXIT_ANSWER_NO)
        click.echo(line)
        return
    try:
        settings = Settings.from_env(dict(os.environ))
        heartbeat_timeout(dict(os.environ))  # JAX's heartbeat follows these settings: checked with them
    except SettingsError as exc:
        raise JobkitError("hang-watchdog", str(exc), EXIT_SETTINGS) from None
    if check:
        return
    if not settings.enabled:
        return
    if log is None or job_dir is None:
        raise click.UsageError("--log and --job-dir are required (or --check)")
    env = os.environ
    try:  # checked before training started (jobkit procs --check): an error here means a hand-made environment
        per_node = procs.Layout.from_env(env).per_node
    except procs.LayoutError as exc:
        raise JobkitError("hang-watchdog", str(exc), EXIT_SETTINGS) from None
    host = (env.get("HANG_HOST") or socket.gethostname()).split(".")[0]
    dog = Watchdog(
        settings,
        log,
        job_dir / "hang",
        env.get("JOB_ID", ""),
        env.get("NODE_RANK", "0"),
        int(env.get("NNODES", "1") or 1),
        host,
        interval,
        per_node=per_node,
    )
    exit_with(dog.run())
