"""Read a job log: KEY=VALUE header, MaxText step lines, JOB SUMMARY footer, a RAY=1 job's "metrics are off".

Step lines may carry an `srun -l` task prefix (`0: `, ` 1: `: the node rank), then, with several processes per
node (LOCAL_WORLD_SIZE=N, `jobkit procs`), the process's `[rank<G>]: ` (its global rank: node G // N, process
G % N on it), and may or may not carry the `MFU: X%` field that jobkit.launch inserts. A step then has
NNODES x N lines, one per process (= per device): readers average them per step, as they do the nodes'.

A big log (BIG_LOG bytes or more: 512 ranks write ~100 MB per 1,000 steps) is read whole only by the readers
that need every step (`tgs`'s table, `analyze`, `compare`); those that need its header, its first steps (the
steady window) and its end (the JOB SUMMARY, the failure) read just those (`parse_ends`), in a time that does
not grow with the run's length.
"""

import os
import re
import shlex
from collections import Counter
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


@dataclass(frozen=True, slots=True)  # slots: a 512-rank log holds ~500 of these per step
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


@dataclass
class JobLog:
    path: str
    header: dict[str, str] = field(default_factory=dict)
    entries: list[StepEntry] = field(default_factory=list)
    config_params: dict[str, str] = field(default_factory=dict)
    footer_status: str | None = None
    footer_exit: int | None = None
    metrics_off: str | None = None  # why a RAY=1 job's metrics were off, as its first such line says (metrics_state)
    partial: bool = False  # parse_ends: entries hold the first steps and the last END_BYTES' steps, not every step

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


def parse_step_line(line: str) -> StepEntry | None:
    """A StepEntry for a MaxText `completed step:` line, else None."""
    m = _STEP.search(line)
    if not m:
        return None
    prefix = _PREFIX.match(line)  # always matches (both parts are optional)
    rest = line[m.end() :]
    values = {}
    for name, pat in STEP_FIELDS.items():
        found = pat.search(rest)
        values[name] = float(found.group(1)) if found else None
    node, rank = prefix.group("node"), prefix.group("rank")
    return StepEntry(
        int(m.group("step")), int(node) if node is not None else None, **values, rank=int(rank) if rank else None
    )


def parse_text(text: str, path: str = "<text>") -> JobLog:
    """Parse a whole log held in memory."""
    return parse_lines(text.splitlines(), path)


def parse_lines(lines, path: str = "<lines>", scan_header: bool = True) -> JobLog:
    """SCAN_HEADER False: the lines come from the middle of a log, and none of them is a header line."""
    log = JobLog(path)
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
            entry = parse_step_line(line)
            if entry:
                log.entries.append(entry)
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
    log.entries = [e for e in log.entries if e.step <= head.needed]
    counts = Counter(e.step for e in tail.entries if e.step > head.stopped)
    whole = max(counts.values(), default=0)
    log.entries.extend(e for e in tail.entries if e.step > head.stopped and counts[e.step] == whole)
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
