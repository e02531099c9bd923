"""Read a job log: KEY=VALUE header, MaxText step lines, JOB SUMMARY footer, a RAY=1 job's "metrics are off".

Step lines may carry an `srun -l` task prefix (`0: `, ` 1: `: the node rank), then, with several processes per
node (LOCAL_WORLD_SIZE=N, `jobkit procs`), the process's `[rank<G>]: ` (its global rank: node G // N, process
G % N on it), and may or may not carry the `MFU: X%` field that jobkit.launch inserts. A step then has
NNODES x N lines, one per process (= per device): readers average them per step, as they do the nodes'.
The step lines are folded per step while they are read (StepFold: the count of lines, each field's exact sum,
the loss's spread), so a parsed log holds one object per step whatever the number of ranks: 512 ranks x 86,400
steps is 44 M lines but 86,400 folds. A reader that wants the lines themselves (the monitor: rank 0's) asks
parse_lines for them (keep_lines).

A big log (BIG_LOG bytes or more: 512 ranks write ~100 MB per 1,000 steps) is read whole only by the readers
that need every step (`tgs`'s table, `analyze`, `compare`); those that need its header, its first steps (the
steady window) and its end (the JOB SUMMARY, the failure) read just those (`parse_ends`), in a time that does
not grow with the run's length.
"""

import math
import os
import re
import shlex
from dataclasses import dataclass, field

from jobkit.core.metrics_state import off_reason
from jobkit.core.nodelist import expand_nodelist

BIG_LOG = 16 << 20  # bytes: from this size on, `load(..., first_steps=N)` reads the log's ends only
END_BYTES = 4 << 20  # the end read by parse_ends (as failures.TAIL_BYTES): the JOB SUMMARY and the failure
RANK_LAG_STEPS = 64  # steps read past the ones needed: a slow rank's lines for a step come after others' later ones
HEADER_SCAN_LINES = 50  # header sits at the top; stop looking after this
_HEADER = re.compile(r"^(?P<key>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")
_PREFIX = re.compile(r"^\s*(?:(?P<node>\d+): )?(?:\[rank(?P<rank>\d+)\]: )?")
LINE_PREFIX = r"(?:[ \t]*\d+: )?(?:\[rank\d+\]: )?"  # for a pattern anchored at ^: srun -l's node, a process's rank
_STEP = re.compile(r"completed step: (?P<step>\d+),")
NUMBER = r"(-?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf))"
STEP_FIELDS = {  # a step line's fields (shared with jobkit.observe.log_steps)
    "seconds": re.compile(rf"\bseconds: {NUMBER}"),
    "tflops": re.compile(rf"TFLOP/s/device: {NUMBER}"),
    "mfu": re.compile(rf"\bMFU: {NUMBER}%"),
    "tgs": re.compile(rf"Tokens/s/device: {NUMBER}"),
    # `, loss:` and not `lm_loss:` / `mtp_loss:`
    "loss": re.compile(rf"(?:^|[\s,])loss: {NUMBER}"),
}
_CONFIG_PARAM = re.compile(r"Config param (?P<key>[A-Za-z0-9_]+): (?P<value>.*)$")
_STATUS = re.compile(r"Status:\s*(?P<status>SUCCESS|FAILED|CANCELLED|HANG|STOPPED)\s*\(exit (?P<rc>-?\d+)\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One `completed step` line (one process's view of one step: one node's, with one process per node)."""

    step: int
    node: int | None
    seconds: float | None
    tflops: float | None
    mfu: float | None
    tgs: float | None
    loss: float | None
    rank: int | None = None  # the process's global rank (`[rank<G>]: `); None with one process per node

    @property
    def first_process(self) -> bool:
        """Whether this is rank 0's line (node 0's with one process per node, or a log with no prefixes)."""
        return self.node in (None, 0) and self.rank in (None, 0)


FOLDED = tuple(STEP_FIELDS)  # StepFold's fields, in StepEntry's order: seconds, tflops, mfu, tgs, loss
_NAN, _POS_INF, _NEG_INF = 1, 2, 4  # StepFold.special bits


@dataclass(slots=True)
class StepFold:
    """Every line of one step folded into what the readers use: how many lines, and per field how many values,
    their exact sum and the non-finite ones (so `mean` is statistics.fmean's of the same values, to the bit, in
    O(1) memory per step), and the loss's spread (max - min, as max()/min() over the lines in log order give it).
    """

    step: int
    lines: int = 0
    count: list[int] = field(default_factory=lambda: [0] * len(FOLDED))
    # the finite values' exact sum: num / 2**(exp - 1) (exp: the largest denominator's bit length seen)
    num: list[int] = field(default_factory=lambda: [0] * len(FOLDED))
    exp: list[int] = field(default_factory=lambda: [0] * len(FOLDED))
    special: list[int] = field(default_factory=lambda: [0] * len(FOLDED))
    loss_max: float | None = None
    loss_min: float | None = None

    def add(self, values) -> None:
        """Fold one line's field VALUES (FOLDED order; None where the line lacks the field)."""
        self.lines += 1
        count, num, exp = self.count, self.num, self.exp
        for i, v in enumerate(values):
            if v is None:
                continue
            count[i] += 1
            if v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
                m, d = v.as_integer_ratio()
                k = d.bit_length()
                e = exp[i]
                if k > e:
                    num[i] <<= k - e
                    exp[i] = e = k
                num[i] += m << (e - k)
            else:
                self.special[i] |= _NAN if v != v else _POS_INF if v > 0 else _NEG_INF
        loss = values[-1]
        if loss is not None:
            if self.loss_max is None:
                self.loss_max = self.loss_min = loss
            else:  # max()'s and min()'s own rule, line by line: a nan first stays, a nan later is passed over
                if loss > self.loss_max:
                    self.loss_max = loss
                if loss < self.loss_min:
                    self.loss_min = loss

    def mean(self, name: str) -> float | None:
        """The mean of the field's values over the step's lines (None: no line had it); nan or inf where
        math.fsum would give one (nan, not an error, for +inf and -inf together)."""
        i = FOLDED.index(name)
        if not self.count[i]:
            return None
        special = self.special[i]
        if special:
            if special & _NAN or special == _POS_INF | _NEG_INF:
                return math.nan
            return math.inf if special == _POS_INF else -math.inf
        total = self.num[i] / (1 << (self.exp[i] - 1)) if self.exp[i] else 0.0  # int / int rounds correctly
        return total / self.count[i]

    @property
    def loss_spread(self) -> float | None:
        """max - min of the step's losses (None: no line had one)."""
        return None if self.loss_max is None else self.loss_max - self.loss_min


def fold(entries) -> dict[int, StepFold]:
    """The StepFolds of ENTRIES (StepEntry lines), by step in order of first appearance."""
    steps: dict[int, StepFold] = {}
    for e in entries:
        f = steps.get(e.step)
        if f is None:
            f = steps[e.step] = StepFold(e.step)
        f.add((e.seconds, e.tflops, e.mfu, e.tgs, e.loss))
    return steps


@dataclass
class JobLog:
    path: str
    header: dict[str, str] = field(default_factory=dict)
    steps: dict[int, StepFold] = field(default_factory=dict)  # every step line, folded per step
    node_prefixes: set[int] = field(default_factory=set)  # the srun `N: ` prefixes the step lines carried
    rank_prefixes: set[int] = field(default_factory=set)  # the `[rank<G>]: ` prefixes the step lines carried
    entries: list[StepEntry] = field(default_factory=list)  # the lines themselves: parse_lines(keep_lines=True)
    config_params: dict[str, str] = field(default_factory=dict)
    footer_status: str | None = None
    footer_exit: int | None = None
    metrics_off: str | None = None  # why a RAY=1 job's metrics were off, as its first such line says (metrics_state)
    partial: bool = False  # parse_ends: steps hold the first steps and the last END_BYTES' steps, not every step
    # step_summary.load: the steps (first, last) filled from the job's step summary (rank 0's values), their
    # rank 0 times (step -> unix ms), or why the summary was not used (the log was then read whole)
    summarized: tuple[int, int] | None = None
    step_ms: dict[int, int] = field(default_factory=dict)
    summary_note: str | None = None

    @property
    def has_steps(self) -> bool:
        """Whether the log has any step line."""
        return bool(self.steps or self.entries)

    def step_folds(self) -> dict[int, StepFold]:
        """The steps folded: those parse_lines folded, else those of `entries` (a JobLog made of lines)."""
        return self.steps if self.steps or not self.entries else fold(self.entries)

    def prefixes(self) -> tuple[set[int], set[int]]:
        """(node prefixes, rank prefixes) the step lines carried (of `entries` for a JobLog made of lines)."""
        if self.steps or not self.entries:
            return self.node_prefixes, self.rank_prefixes
        nodes = {e.node for e in self.entries if e.node is not None}
        return nodes, {e.rank for e in self.entries if e.rank is not None}

    @property
    def nnodes_header(self) -> tuple[str, str] | None:
        """(key, raw value) of the node-count header line: NNODES, else the legacy SLURM_JOB_NUM_NODES."""
        for key in ("NNODES", "SLURM_JOB_NUM_NODES"):
            if self.header.get(key):
                return key, self.header[key]
        return ("NNODES", "") if "NNODES" in self.header else None

    @property
    def local_world_size(self) -> int:
        """Processes per node (the LOCAL_WORLD_SIZE header; 1 when absent or not a whole number >= 1)."""
        try:
            value = int(self.header.get("LOCAL_WORLD_SIZE", "1"))
        except ValueError:
            return 1
        return value if value >= 1 else 1

    @property
    def devices(self) -> int | None:
        """The job's device count (= processes with LOCAL_WORLD_SIZE > 1): NNODES x LOCAL_WORLD_SIZE."""
        return self.nnodes * self.local_world_size if self.nnodes is not None else None

    @property
    def is_job_log(self) -> bool:
        """Whether the log starts with the header submit.sh and run_local.sh write: JOB_ID and a node count."""
        return bool(self.header.get("JOB_ID")) and self.nnodes_header is not None

    @property
    def nnodes(self) -> int | None:
        found = self.nnodes_header
        try:
            return int(found[1]) if found else None
        except ValueError:
            return None

    def passthrough_args(self) -> list[str]:
        raw = self.header.get("PASSTHROUGH_ARGS", "")
        try:
            return shlex.split(raw)
        except ValueError:
            return raw.split()


def header_nodes(header: dict[str, str]) -> tuple[list[str], str | None]:
    """The job's hosts in rank order (NODELIST_EXPANDED, else JOB_NODELIST expanded) and, when the nodelist
    cannot be expanded, a note saying so: a reader still reads the log, it only names no host by rank."""
    if header.get("NODELIST_EXPANDED"):
        return [n for n in header["NODELIST_EXPANDED"].split(",") if n], None
    raw = header.get("JOB_NODELIST", "")
    try:
        return expand_nodelist(raw), None
    except ValueError as exc:  # core.nodelist's own error class subclasses ValueError
        return [], f"JOB_NODELIST={raw} cannot be expanded ({exc}); no host is named by rank"


def parse_header_line(line: str) -> tuple[str, str] | None:
    """`KEY=VALUE` (value may be shell-quoted) -> (key, value); else None."""
    m = _HEADER.match(line.rstrip("\r\n"))
    if not m:
        return None
    value = m.group("value").strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return m.group("key"), value


_PATTERNS = tuple(STEP_FIELDS.values())


def _step_fields(line: str) -> tuple[int, int | None, int | None, list[float | None]] | None:
    """(step, node, rank, [the FOLDED fields' values]) of a `completed step:` line, else None."""
    m = _STEP.search(line)
    if not m:
        return None
    prefix = _PREFIX.match(line)  # always matches (both parts are optional)
    rest = line[m.end() :]
    values = []
    for pat in _PATTERNS:
        found = pat.search(rest)
        values.append(float(found.group(1)) if found else None)
    node, rank = prefix.group("node"), prefix.group("rank")
    return int(m.group("step")), int(node) if node is not None else None, int(rank) if rank else None, values


def parse_step_line(line: str) -> StepEntry | None:
    """A StepEntry for a MaxText `completed step:` line, else None."""
    found = _step_fields(line)
    if found is None:
        return None
    step, node, rank, values = found
    return StepEntry(step, node, *values, rank=rank)


def parse_text(text: str, path: str = "<text>") -> JobLog:
    """Parse a whole log held in memory."""
    return parse_lines(text.splitlines(), path)


def parse_lines(lines, path: str = "<lines>", scan_header: bool = True, keep_lines: bool = False) -> JobLog:
    """SCAN_HEADER False: the lines come from the middle of a log, and none of them is a header line.
    KEEP_LINES: `entries` holds every step line too (a StepEntry each: memory grows with ranks x steps)."""
    log = JobLog(path)
    steps, nodes, ranks = log.steps, log.node_prefixes, log.rank_prefixes
    # lines of the top looked at for the header; `set -x` trace lines (_DEBUG=1) do not count
    scanned = 0 if scan_header else HEADER_SCAN_LINES
    for line in lines:
        if scanned < HEADER_SCAN_LINES and not line.startswith("+"):
            scanned += 1
            kv = parse_header_line(line)
            if kv and kv[0] not in log.header:
                log.header[kv[0]] = kv[1]
                continue
        if "completed step:" in line:
            found = _step_fields(line)
            if found:
                step, node, rank, values = found
                f = steps.get(step)
                if f is None:
                    f = steps[step] = StepFold(step)
                f.add(values)
                if node is not None:
                    nodes.add(node)
                if rank is not None:
                    ranks.add(rank)
                if keep_lines:
                    log.entries.append(StepEntry(step, node, *values, rank=rank))
            continue
        if "Config param " in line:
            m = _CONFIG_PARAM.search(line)
            if m:
                log.config_params[m.group("key")] = m.group("value").strip()
            continue
        if "[observability]" in line and log.metrics_off is None:
            log.metrics_off = off_reason(line)
            if log.metrics_off is not None:
                continue
        if "Status:" in line:
            m = _STATUS.search(_ANSI.sub("", line))
            if m:
                log.footer_status, log.footer_exit = m.group("status"), int(m.group("rc"))
    return log


class LogError(Exception):
    """A path that cannot be read as a job log; the message is one line that says what to pass instead."""


class NotAJobLog(LogError):
    """A readable file without a job log's header."""


def not_a_job_log(path: str) -> str:
    """The one line every command that reads a job log gives for a file that is not one."""
    return (
        f"{path}: not a job log (no KEY=VALUE header with JOB_ID and NNODES); "
        "give a log written by submit.sh or run_local.sh"
    )


def load(path: str, first_steps: int | None = None) -> JobLog:
    """parse_file (parse_ends with FIRST_STEPS for a log of BIG_LOG bytes or more), with a LogError for a missing path, a directory, an unreadable file, or a file that is not a
    job log (no JOB_ID and NNODES header: a random, binary or empty file). The one reader of a job log for the
    commands that are given one (tgs, why, analyze, compare, requeue)."""
    if os.path.isdir(path):
        raise LogError(f"{path} is a directory, not a log file; {_log_in_dir_hint(path)}")
    if not os.path.exists(path):
        raise LogError(f"no such log file: {path}")
    if not os.path.isfile(path):
        raise LogError(f"{path} is not a regular file; pass a job log, <JOB_WORKSPACE>/<JOB_ID>-<JOB_NAME>.log")
    try:
        log = parse_ends(path, first_steps) if first_steps is not None else parse_file(path)
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not log.is_job_log:
        raise NotAJobLog(not_a_job_log(path))
    return log


def _log_in_dir_hint(path: str) -> str:
    # A job dir links its log as `log`; a workspace holds the logs themselves.
    job_log = os.path.join(path, "log")
    if os.path.isfile(job_log):
        return f"for this job dir pass its log: {job_log}"
    try:
        logs = [e for e in os.scandir(path) if e.name.endswith(".log") and e.is_file()]
    except OSError:
        logs = []
    if logs:
        newest = max(logs, key=lambda e: e.stat().st_mtime)
        return f"pass one of its .log files, e.g. the newest: {newest.path}"
    return "pass a job log, <JOB_WORKSPACE>/<JOB_ID>-<JOB_NAME>.log (or a job dir's log link)"


def parse_file(path: str) -> JobLog:
    """Parse a log file (streamed; undecodable bytes are replaced)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return parse_lines(fh, path)


def parse_ends(path: str, first_steps: int) -> JobLog:
    """parse_file for a log under BIG_LOG bytes; for a bigger one, only its ends: from the top up to FIRST_STEPS
    steps past its first logged step (header, Config params, the steady window; RANK_LAG_STEPS more for ranks
    that log late), then its last END_BYTES (the last steps, the JOB SUMMARY, a failure's lines). The steps
    between are left out (JobLog.partial)."""
    with open(path, "rb") as raw:
        size = raw.seek(0, os.SEEK_END)
    if size < BIG_LOG:
        return parse_file(path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = _HeadLines(fh, first_steps)
        log = parse_lines(head, path)
    if head.stopped is None:  # the first steps ran to the end of the file: it was read whole
        return log
    with open(path, "rb") as raw:
        raw.seek(size - END_BYTES)
        data = raw.read()
    lines = data.decode("utf-8", errors="replace").splitlines()[1:]  # the first line is cut
    tail = parse_lines(lines, path, scan_header=False)
    # Only whole steps are kept: the head's up to the steps needed (the lag read past them may have cut some),
    # the end's with as many lines as most of its steps have (its first ones may have lost a rank's lines).
    log.steps = {s: f for s, f in log.steps.items() if s <= head.needed}
    ends = [f for s, f in tail.steps.items() if s > head.stopped]
    whole = max((f.lines for f in ends), default=0)
    log.steps.update((f.step, f) for f in ends if f.lines == whole)
    log.node_prefixes |= tail.node_prefixes  # the prefixes of every line read, a dropped step's too
    log.rank_prefixes |= tail.rank_prefixes
    log.config_params.update(tail.config_params)
    log.footer_status, log.footer_exit = tail.footer_status, tail.footer_exit
    log.metrics_off = log.metrics_off or tail.metrics_off
    log.partial = True
    return log


class _HeadLines:
    """The lines of FH up to the first step line FIRST_STEPS + RANK_LAG_STEPS past the first logged step;
    `needed` is the last step needed, `stopped` the last one read (None: the file ended first)."""

    def __init__(self, fh, first_steps: int):
        self.fh, self.first_steps, self.stopped, self.needed = fh, first_steps, None, None

    def __iter__(self):
        limit = None
        for line in self.fh:
            if "completed step:" in line:
                m = _STEP.search(line)
                if m:
                    step = int(m.group("step"))
                    if limit is None:
                        self.needed = step + self.first_steps
                        limit = self.needed + RANK_LAG_STEPS
                    elif step > limit:
                        self.stopped = limit
                        return
            yield line
