"""A hang's root cause from the stacks the hang watchdog took: `<job dir>/hang/<host>.txt`, one per node.

Each file (ops/hang_watchdog.py writes it) starts with `HANG on <host> (rank N): <the marker's line>`, then
`pid P, state <letter> (<word>)[, wchan <kernel function>]` (the training process's state in /proc), then
py-spy's dump (`Thread T (idle): "MainThread"`, innermost frame first), or `no training process found`.
With LOCAL_WORLD_SIZE > 1 (a process per device) there is one file per process, `<host>.proc<i>.txt` (i its
LOCAL_RANK), whose first line is `HANG on <host> (rank N, process i, global rank G): ...`; each process is then
one entry below ("rank" reads "process"), named `<host> process i (global rank G)`, and the blamed host is its
node (a retry without the node excludes all of its processes).

Per rank: its process state and the innermost frames of its main thread. The rank unlike the others is
blamed, in this order: a process stopped (T, t) or in uninterruptible sleep (D): something outside the
job froze it or it waits on I/O or a driver, a cause on that node; then a node that wrote no stacks (its
watchdog did not answer: the node itself may be stuck); then a rank whose training is gone (Z, or none
found: it ended there while the others wait for it); then a rank not waiting while the others wait (in a
collective, `BlockUntilReady`, a barrier), or in another function than all the others. The others are
named as waiting, with the frame they wait in. When every rank waits in the same place nobody is blamed:
a collective deadlock, or a stall outside the job (the network). `node_local` says whether the cause is
the node's own (stopped or D-state process, a node that did not answer): retry without that node.

A stack file is read only when it is this user's own, in a hang dir of this user's (core.files.read_own),
as the watchdog's marker is: a teammate's planted file is listed as ignored, not believed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.core import files

MARKER_NAME = "HANG"  # ops.hang_watchdog.MARKER_NAME (core may not import ops)
FRAMES = 40  # innermost frames kept per rank (native frames: the wait is often 10-20 frames deep)
SHOWN = 3  # innermost frames said in the blame

# What each process state means for the person reading why (proc(5): State).
STATE_MEANING = {
    "T": "stopped by a signal (SIGSTOP, Ctrl-Z) or a debugger: someone or something outside the job froze it",
    "t": "stopped by a debugger (traced): someone outside the job attached to it",
    "D": "in uninterruptible sleep: waiting on I/O (a file system, NFS, a disk) or a driver (the GPU's); look "
    "at the node (dmesg -T, its mounts)",
    "Z": "exited (a zombie not yet reaped): training ended on this node while the others went on",
    "R": "busy on the CPU",
    "S": "asleep, waiting for something",
    "I": "idle (a kernel thread's state)",
    "none": "no training process was found: training had already ended on this node",
    "missing": "its watchdog wrote no stacks: the node (or its watchdog) did not answer within the wait",
    "unknown": "its state could not be read",
}
NODE_LOCAL_STATES = {"T", "t", "D", "missing"}
GONE_STATES = {"Z", "X", "none"}

_HEADER = re.compile(r"^HANG on (\S+) \(rank (\d+)(?:, process (\d+), global rank (\d+))?\): (.*)$")
_PROC_FILE = re.compile(r"^(.+)\.proc(\d+)$")  # <host>.proc<LOCAL_RANK>.txt: one of LOCAL_WORLD_SIZE processes
_PROCESS = re.compile(r"^pid (\d+), state (\S+)(?: \(([^)]*)\))?(?:, wchan (\S+))?")
_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \(([^)]*)\)(?:: "(.*)")?')
_FRAME = re.compile(r"^\s+(\S.*?)(?:\s+\(([^()]*)\))?\s*$")
_NOTICED = re.compile(r"noticed on (\S+) \(rank (\d+)\)")
# Frames that mean "waiting for the other ranks or the device" (XLA/PJRT, JAX, NCCL/RCCL, the coordination
# service): a rank in one of them is a follower of whichever rank does not arrive.
WAIT_FRAME = re.compile(
    r"BlockUntilReady|block_until_ready|barrier|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
    r"collective|psum|nccl|rccl|sync_global_devices|"
    r"_single_device_array_to_np_array|device_get|wait_until_finished|GetKeyValue|key_value_get",
    re.I,
)
# A generic wait (a futex, a condition variable, a Python `wait`): a waiting rank when nothing says more.
GENERIC_WAIT = re.compile(
    r"\b_?wait\b|\bwait_for|WaitForNotification|futex|pthread_cond|Mutex::Block|Condition::Wait", re.I
)


@dataclass(frozen=True)
class RankStacks:
    """One node's stacks file, read: where its training was when the hang was declared."""

    host: str
    rank: int | None
    state: str  # proc's letter (R, S, D, T, t, Z, ...), or none / missing / unknown
    state_word: str = ""  # as /proc says it: stopped, sleeping, disk sleep ...
    pid: int | None = None
    wchan: str = ""  # the kernel function it sleeps in, when the watchdog recorded it
    frames: tuple[str, ...] = ()  # the main thread's innermost frames, innermost first
    how: str = ""  # how the stacks were taken: py-spy --native, --nonblocking, or why not
    note: str = ""  # why the file was not read (ignored / unreadable)
    process: int | None = None  # LOCAL_RANK with LOCAL_WORLD_SIZE > 1 (hang/<host>.proc<i>.txt), else None
    global_rank: int | None = None  # its GLOBAL_RANK (node rank x LOCAL_WORLD_SIZE + LOCAL_RANK)

    @property
    def name(self) -> str:
        """`node2 (rank 1)`; with a process per device `node2 process 1 (global rank 3)`."""
        if self.process is not None:
            ranked = f" (global rank {self.global_rank})" if self.global_rank is not None else ""
            return f"{self.host} process {self.process}{ranked}"
        return f"{self.host} (rank {self.rank})" if self.rank is not None else self.host

    @property
    def waits_in(self) -> str:
        """The innermost frame that waits for the others or the device, else ''."""
        for pattern in (WAIT_FRAME, GENERIC_WAIT):
            found = next((f for f in self.frames if pattern.search(_function(f))), "")
            if found:
                return found
        return ""

    @property
    def function(self) -> str:
        """What it was doing: the frame it waits in, else its innermost Python frame, else its innermost frame."""
        return _function(
            self.waits_in or next((f for f in self.frames if ".py:" in f), self.frames[0] if self.frames else "")
        )

    @property
    def state_text(self) -> str:
        if self.state in ("none", "missing", "unknown"):
            return self.state
        return f"{self.state_word} ({self.state})" if self.state_word else self.state

    def describe(self) -> str:
        """`node2's training (rank 1, pid 9) is stopped (T): <meaning>; innermost: a < b`; with a process per
        device `node2 process 1 (global rank 3, pid 9) is stopped (T): ...`."""
        who = f"{self.host}'s training" + (
            f" (rank {self.rank}" + (f", pid {self.pid})" if self.pid else ")") if self.rank is not None else ""
        )
        if self.process is not None:
            ranked = f"global rank {self.global_rank}" if self.global_rank is not None else ""
            inside = ", ".join(x for x in (ranked, f"pid {self.pid}" if self.pid else "") if x)
            who = f"{self.host} process {self.process}" + (f" ({inside})" if inside else "")
        if self.state in ("none", "missing"):
            said = f"{self.name}: {STATE_MEANING[self.state]}"
        else:
            meaning = STATE_MEANING.get(self.state, "")
            said = f"{who} is {self.state_text}" + (f": {meaning}" if meaning else "")
        if self.wchan and self.wchan != "0":
            said += f" (kernel: {self.wchan})"
        if self.frames:
            shown = list(self.frames[:SHOWN])
            python = next((f for f in self.frames if ".py:" in f), "")
            if python and python not in shown:  # native frames first: add where in Python it was
                shown.append(f"... {python}")
            said += f"; innermost: {' < '.join(_function(f) for f in shown)}"
        return said


@dataclass(frozen=True)
class HangCause:
    """What the stacks say: where the hang was noticed, the rank blamed (or none), and the ranks waiting."""

    noticed: str  # from the marker: `on <host> (rank N), phase training, last step S, T s since`
    noticed_host: str
    ranks: tuple[RankStacks, ...]
    blamed: RankStacks | None
    because: str  # why that rank, in words (or why nobody)
    node_local: bool  # the cause is on the blamed node itself: retry without it
    waiting: tuple[str, ...] = field(default_factory=tuple)  # `node1 (rank 0) in BlockUntilReadyWithCancel`

    @property
    def host(self) -> str:
        return self.blamed.host if self.blamed else ""


def _function(frame: str) -> str:
    """A frame line's function: `BlockUntilReady (libxla.so)` -> `BlockUntilReady`; `step (train.py:12)` kept;
    a C++ name past 120 characters is cut."""
    m = _FRAME.match(" " + frame)
    if not m:
        return frame[:120]
    where = m.group(2) or ""
    name = m.group(1) if len(m.group(1)) <= 120 else m.group(1)[:117] + "..."
    return f"{name} ({where})" if ".py:" in where else name


def parse(text: str, host: str, process: int | None = None) -> RankStacks:
    """One stacks file's TEXT (the watchdog's format, see the module doc) of HOST (and of its PROCESS, the
    LOCAL_RANK a `<host>.proc<i>.txt` names)."""
    lines = text.splitlines()
    rank = global_rank = None
    if lines:
        m = _HEADER.match(lines[0])
        if m:
            host, rank = m.group(1), int(m.group(2))
            if m.group(3) is not None:
                process, global_rank = int(m.group(3)), int(m.group(4))
    pid, state, word, wchan = None, "unknown", "", ""
    for line in lines[1:4]:
        m = _PROCESS.match(line)
        if m:
            pid, state, word, wchan = int(m.group(1)), m.group(2)[:1], m.group(3) or "", m.group(4) or ""
            if m.group(2) == "unknown":
                state = "unknown"
            break
        if line.startswith("no training process found"):
            state = "none"
    if pid is None and any(ln.startswith("no training process found") for ln in lines[:3]):
        state = "none"
    how = next((ln.strip("[]") for ln in lines if re.fullmatch(r"\[py-spy [\w-]+\]", ln)), "")
    if not how:
        failed = [ln for ln in lines if re.match(r"\[py-spy [\w-]+\] failed", ln)]
        how = failed[-1][:200] if failed else ""
    return RankStacks(host, rank, state, word, pid, wchan, _main_frames(lines), how, "", process, global_rank)


def _main_frames(lines: list[str]) -> tuple[str, ...]:
    """The innermost FRAMES frames of the main thread (MainThread, else the first thread py-spy shows)."""
    threads: list[tuple[str, list[str]]] = []
    for line in lines:
        m = _THREAD.match(line)
        if m:
            threads.append((m.group(2) or "", []))
        elif threads and line.startswith((" ", "\t")) and line.strip():
            threads[-1][1].append(line.strip())
    if not threads:
        return ()
    main = next((t for t in threads if t[0] == "MainThread"), threads[0])
    return tuple(main[1][:FRAMES])


def read(hang_dir: Path, nodes: list[str] | None = None) -> HangCause | None:
    """The cause the stacks in HANG_DIR (`<job dir>/hang`) show; None when there is no stacks file to read.
    NODES (the job's nodelist, rank order) names the nodes that wrote none."""
    try:
        marker = files.read_own(hang_dir / MARKER_NAME, in_own_dir=True).partition("\n")[0]
    except (FileNotFoundError, files.Untrusted, OSError):
        marker = ""
    ranks: list[RankStacks] = []
    try:
        paths = sorted(hang_dir.glob("*.txt"))
    except OSError:
        paths = []
    for path in paths:
        host, process = path.stem, None
        m = _PROC_FILE.match(host)
        if m:
            host, process = m.group(1), int(m.group(2))
        try:
            ranks.append(parse(files.read_own(path, in_own_dir=True), host, process))
        except (FileNotFoundError, files.Untrusted, OSError) as exc:
            note = str(exc) if isinstance(exc, files.Untrusted) else f"cannot be read ({exc})"
            ranks.append(RankStacks(host, None, "unknown", note=f"ignored: {note}", process=process))
    read_ranks = [r for r in ranks if not r.note]
    if not read_ranks:
        return None
    seen = {r.host for r in ranks}
    # A node of the nodelist without a file did not answer, when the files are named as the nodelist names
    # hosts (HANG_HOST, or a host name that is not the Slurm node name, would make every node look missing).
    if nodes and seen <= set(nodes):
        for i, node in enumerate(nodes):
            if node not in seen:
                ranks.append(RankStacks(node, i, "missing"))
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.host, r.process or 0))
    if not marker:
        marker = next((_HEADER.match(_first_line(hang_dir, r)) for r in read_ranks), None)
        marker = marker.group(5) if marker else ""
    m = _NOTICED.search(marker)
    noticed_host = m.group(1) if m else ""
    if m:  # `phase training, ..., 31 s since, noticed on node1 (rank 0)` -> `on node1 (rank 0), phase ...`
        marker = f"on {m.group(1)} (rank {m.group(2)}), {marker[: m.start()].rstrip(', ')}"
    return _decide(marker, noticed_host, tuple(ranks))


def _first_line(hang_dir: Path, rank: RankStacks) -> str:
    try:
        name = rank.host if rank.process is None else f"{rank.host}.proc{rank.process}"
        return files.read_own(hang_dir / f"{name}.txt", in_own_dir=True).partition("\n")[0]
    except (OSError, files.Untrusted):
        return ""


def _decide(marker: str, noticed_host: str, ranks: tuple[RankStacks, ...]) -> HangCause:
    usable = [r for r in ranks if not r.note]

    def cause(blamed: RankStacks | None, because: str, node_local: bool) -> HangCause:
        others = [r for r in usable if r is not blamed and r.state not in ("missing", "none")]
        waiting = tuple(
            f"{r.name} in {r.function}" if r.waits_in else f"{r.name} ({r.state_text}) in {r.function or '?'}"
            for r in others
        )
        return HangCause(marker, noticed_host, ranks, blamed, because, node_local, waiting)

    def others_said(blamed: RankStacks) -> str:
        rest = [r for r in usable if r is not blamed and r.state not in ("missing", "none")]
        if not rest:
            return ""
        waits = [r for r in rest if r.waits_in]
        if waits and len(waits) == len(rest):
            places = sorted({r.function for r in waits})
            return f"; the others wait for it ({', '.join(places)})"
        said = [f"{r.name} {r.state_text} in {r.function or '?'}" for r in rest]
        return f"; the others: {', '.join(said)}"

    frozen = {r.state for r in usable}
    if len(usable) > 1 and len(frozen) == 1 and frozen <= {"T", "t", "D"}:
        first = usable[0]
        meaning = STATE_MEANING[first.state]
        return cause(None, f"stacks: every rank is {first.state_text}: {meaning}; no single node is blamed", False)
    for states, node_local in ((("T", "t", "D"), True), (("missing",), True), (tuple(GONE_STATES), False)):
        found = [r for r in usable if r.state in states]
        if found and len(found) < len(usable):
            blamed = found[0]
            more = f" (also {', '.join(r.name for r in found[1:])})" if found[1:] else ""
            return cause(blamed, f"stacks: {blamed.describe()}{more}{others_said(blamed)}", node_local)
        if found and len(usable) == 1 and states != ("missing",):
            return cause(found[0], f"stacks: {found[0].describe()}", node_local)
    alive = [r for r in usable if r.frames]
    waiting = [r for r in alive if r.waits_in]
    not_waiting = [r for r in alive if not r.waits_in]
    if waiting and len(not_waiting) == 1:
        odd = not_waiting[0]
        return cause(odd, f"stacks: {odd.describe()}: the only rank not waiting{others_said(odd)}", False)
    if len(alive) >= 3:
        counts = Counter(r.function for r in alive)
        (common, n), *_ = counts.most_common(1)
        odd = [r for r in alive if r.function != common]
        if len(odd) == 1 and n == len(alive) - 1:
            return cause(odd[0], f"stacks: {odd[0].describe()}: in another function than the others ({common})", False)
    if alive and len({r.function for r in alive}) == 1:
        place = alive[0].function or "the same frame"
        return cause(
            None,
            f"stacks: every rank is in {place} and none stands out: a collective deadlock or a stall outside the "
            "job (the network, the coordinator); no node is blamed",
            False,
        )
    return cause(None, "stacks: no rank stands out (see hang/<host>[.proc<i>].txt); no node is blamed", False)
