"""The job's step summary, `<job dir>/steps.tsv`: one line per step, written during the run by global rank 0.

Why: the job log holds one `completed step` line per rank (per process) per step, 44 M lines and ~10 GB at
512 nodes x 86,400 steps, and `jobkit tgs` (its table), `analyze` and `compare` need every step. Reading that
log line by line takes minutes; this file holds the same steps in ~6 MB.

Writing (StepTap, installed by `jobkit launch` on global rank 0 only: GLOBAL_RANK, else NODE_RANK, is 0): every
line that process prints is passed through unchanged, and each `completed step` line among them appends one
line here, the fields as the line spelled them (so a reader parses the same numbers the log holds):

    # jobkit steps 1: step unix_ms seconds tflops mfu tgs loss (global rank 0's lines)
    12<TAB>1764000123456<TAB>1.003<TAB>398.8<TAB>39.88<TAB>4083.5<TAB>2.310

`-` is a field the line lacked; unix_ms is the line's absl time (local time, as jobkit.observe.log_steps reads
it), `-` without one. One write per line, O_APPEND, created under the job's umask (private by default).

Reading (`load`): for a log of logparse.BIG_LOG bytes or more, when the command reads every step, the log's ends
(header, the first steps, the last END_BYTES: logparse.parse_ends) and this file for the steps between. The
ends' steps stay the exact fold of every rank's lines (the default steady window among them); the steps between
are rank 0's values. A smaller log, or a summary that is missing, damaged (a line that is not seven fields of
numbers, a wrong first line) or that does not reach the log's last steps (rank 0 killed before it wrote them,
a file from elsewhere), means the log is read whole, as without it; `JobLog.summary_note` says which.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

from jobkit.core import logparse
from jobkit.core.files import open_append

NAME = "steps.tsv"
FIRST_LINE = "# jobkit steps 1: step unix_ms seconds tflops mfu tgs loss (global rank 0's lines)\n"
HEAD_STEPS = 128  # steps read from the log's top past its first one (the default steady window is steps 5-14)
_ABSL = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")
_FIELDS = tuple(logparse.STEP_FIELDS.values())
_NUMBER = re.compile(logparse.NUMBER)


def job_dir_of(log_path: str | Path) -> Path:
    """The job dir of a log: <workspace>/<id>-<name>.log -> <workspace>/<id>-<name>; a job dir's `log` link -> its
    dir (as jobkit.analysis.job does)."""
    p = Path(log_path)
    return p.with_suffix("") if p.name.endswith(".log") else p.parent


def _ms(line: str, now: float) -> str:
    """The line's absl time as unix ms (local time; the year of NOW, or the one before for a December line
    read in January), else '-'."""
    m = _ABSL.search(line)
    if m is None:
        return "-"
    mon, day, h, mi, s, us = (int(x) for x in m.groups())
    year = time.localtime(now).tm_year
    t = time.mktime((year, mon, day, h, mi, s, 0, 0, -1))
    if t > now + 86400:
        t = time.mktime((year - 1, mon, day, h, mi, s, 0, 0, -1))
    return str(int(t * 1000) + us // 1000)


def summary_line(line: str, now: float | None = None) -> str | None:
    """The summary's line for one printed LINE (None: not a step line)."""
    if "completed step:" not in line:
        return None
    m = logparse._STEP.search(line)
    if m is None:
        return None
    rest = line[m.end() :]
    values = []
    for pat in _FIELDS:
        found = pat.search(rest)
        values.append(found.group(1) if found else "-")
    return "\t".join([m.group("step"), _ms(line, time.time() if now is None else now), *values]) + "\n"


def rank_zero(env) -> bool:
    """Whether this process is the job's global rank 0 (GLOBAL_RANK under `jobkit procs`, else NODE_RANK)."""
    raw = (env.get("GLOBAL_RANK") or env.get("NODE_RANK") or "0").strip()
    return raw == "0"


class Summary:
    """The summary file's one descriptor, shared by the taps on stdout and stderr. A write error closes it once
    and stops the summary (the readers then fall back to the log), never the training; no tap writes to the
    descriptor's number after that (it may be another file's by then)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def append(self, line: str) -> None:
        with self.lock:
            if self.fd < 0:
                return
            try:
                os.write(self.fd, line.encode())
            except OSError:
                fd, self.fd = self.fd, -1
                try:
                    os.close(fd)
                except OSError:
                    pass

    def close(self) -> None:
        with self.lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class StepTap:
    """A text-stream proxy that appends a summary line to SUMMARY for each whole `completed step` line written
    through it; the text itself goes on to the wrapped stream unchanged."""

    def __init__(self, stream, summary: Summary):
        self._stream, self._summary, self._held = stream, summary, ""
        self._lock = threading.Lock()

    @property
    def wrapped(self):
        return self._stream

    def write(self, text: str) -> int:
        n = self._stream.write(text)
        if self._summary.fd >= 0:
            with self._lock:
                data = self._held + text
                cut = data.rfind("\n") + 1
                self._held = data[cut:][-4096:]  # a partial line; a step line is far shorter than 4 KB
                for line in data[:cut].splitlines():
                    out = summary_line(line)
                    if out is not None:
                        self._summary.append(out)
        return n

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def open_summary(env) -> Summary | None:
    """The job dir's summary, appended to, for this process when it is global rank 0 of a job (JOB_WORKSPACE and
    JOB_DIR name an existing dir), else None. The first line is written when the file is new."""
    ws, job_dir = env.get("JOB_WORKSPACE", ""), env.get("JOB_DIR", "")
    if not (ws and job_dir and rank_zero(env)):
        return None
    path = Path(ws) / job_dir / NAME
    if not path.parent.is_dir():
        return None
    try:
        fd = open_append(path, 0o666)  # minus the job's umask (JOB_UMASK): private unless the team shares
        if os.fstat(fd).st_size == 0:
            os.write(fd, FIRST_LINE.encode())
    except OSError:
        return None
    return Summary(fd)


def read(path: str | Path) -> tuple[dict[int, list], str | None]:
    """({step: [(unix_ms or None, [the FOLDED fields' values]), ...]}, None), or ({}, why it cannot be used).
    A last line without its newline (a write cut short) is left out; any other bad line makes it unusable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            data = fh.read()
    except FileNotFoundError:
        return {}, f"no step summary ({path})"
    except OSError as exc:
        return {}, f"step summary {path} cannot be read ({exc.strerror or exc})"
    if not data.startswith(FIRST_LINE):
        return {}, f"step summary {path} does not start with its first line"
    lines = data[len(FIRST_LINE) :].split("\n")
    lines.pop()  # '' after the last newline, or a line cut short
    steps: dict[int, list] = {}
    for n, line in enumerate(lines, 2):
        parts = line.split("\t")
        try:
            if len(parts) != 7 or not parts[0].isdigit():
                raise ValueError
            ms = None if parts[1] == "-" else int(parts[1])
            values = [None if v == "-" else _number(v) for v in parts[2:]]
        except ValueError:
            return {}, f"step summary {path} is damaged at line {n}"
        steps.setdefault(int(parts[0]), []).append((ms, values))
    return steps, None


def _number(text: str) -> float:
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)


def load(path: str) -> logparse.JobLog:
    """logparse.load(PATH), but for a log of BIG_LOG bytes or more its ends plus the step summary between them
    (see the module's docstring); the log whole when the summary cannot be used (`summary_note` says why)."""
    try:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
    except OSError:
        size = 0
    if size < logparse.BIG_LOG:
        return logparse.load(path)
    summary = job_dir_of(path) / NAME
    if not os.path.lexists(summary):  # a job from before the summary, or not started by `jobkit launch`
        return logparse.load(path)
    steps, problem = read(summary)
    if problem is None:
        log = logparse.load(path, HEAD_STEPS)
        if not log.partial:  # the first steps ran to the end of the log: it was read whole
            return log
        problem = merge(log, steps)
    if problem is not None:
        log = logparse.load(path)
        log.summary_note = f"{problem}: every step line of the log was read"
    return log


def merge(log: logparse.JobLog, steps: dict[int, list]) -> str | None:
    """Fill LOG (parse_ends'd: its first and last steps) with the summary's STEPS between them; None when done,
    else why not (LOG is then left as it was)."""
    if not log.steps:
        return "the log's ends hold no step"
    ordered = sorted(log.steps)
    # the head's steps run up to the first gap; the end's start after it
    gap = next((i for i in range(1, len(ordered)) if ordered[i] != ordered[i - 1] + 1), None)
    if gap is None:
        return None  # nothing between the ends (the end read reached back into the head)
    first, last = ordered[gap - 1] + 1, ordered[gap] - 1
    if steps and min(steps) != ordered[0]:  # a file of another run (a resumed attempt starts later)
        return f"the step summary starts at step {min(steps)}, the log at step {ordered[0]}"
    if not steps or max(steps) < last:
        reach = f"ends at step {max(steps)}" if steps else "holds no step"
        return f"the step summary {reach}, short of the log's step {last}"
    missing = [s for s in range(first, last + 1) if s not in steps]
    if missing:
        return f"the step summary lacks step {missing[0]}, which the log has"
    counts = [f.lines for f in log.steps.values()]
    whole = max(set(counts), key=counts.count)  # the lines a step has: one per rank
    for s in range(first, last + 1):
        f = logparse.StepFold(s)
        for _ms, values in steps[s]:
            f.add(values)
        f.lines = whole * len(steps[s])  # rank 0 cannot see the others' lines: every rank is taken to have logged
        f.loss_max = f.loss_min = None  # and their spread is unknown
        log.steps[s] = f
    log.step_ms = {s: lines[0][0] for s, lines in steps.items() if lines[0][0] is not None}
    log.summarized = (first, last)
    log.partial = False
    return None
