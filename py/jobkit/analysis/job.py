"""What a job's log and job dir say about it: identity, code provenance, stages, steps with their times, the
TensorBoard scalars, the failure. Read only; nothing here writes.

Steps come from the log's `completed step` lines (the same parse and steady window as `jobkit tgs`, so the two
never disagree); absl's line prefix gives each of rank 0's steps its wall time, which puts steps on the host
metrics' time axis. Learning rate and gradient norm are not in the step line: they come from MaxText's
TensorBoard event files under the job dir, read directly (a RAY=0 job has them too).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.core import failures, logparse, step_summary, tgs
from jobkit.core.config import default_yml
from jobkit.observe import hang_tsdb
from jobkit.observe.log_steps import series_after
from jobkit.observe.tb_events import STEP_METRIC, ScalarReader, find_event_files
from jobkit.ops import jobs

# Slurm jobs print `== <Stage> BEGIN ... ==` / `== <Stage> END (12s) ==` (utils/lib/stage_timeout.sh).
_STAGE_END = re.compile(r"^== (?P<name>.+?) (?P<how>END|TIMEOUT|FAILED) \((?:exit=\d+, )?(?P<s>\d+)s", re.M)
_STAGE_SKIPPED = re.compile(r"^== (?P<name>.+?) SKIPPED \((?P<why>[^)]*)\)", re.M)
_PROVENANCE = re.compile(r"^== (SOURCE|BRANCH|COMMIT) ==\n(.*?)(?=^== |\Z)", re.M | re.S)
_ABSL_TIME = re.compile(r"^(?:\s*\d+: )?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ", re.M)
_MFU_NOTE = re.compile(r"^(?:\s*\d+: )?\[MFU\] (.+)$", re.M)
# TensorBoard tags shown per step besides the log's loss (MaxText's names).
TB_TAGS = {
    "learning_rate": "learning/current_learning_rate",
    "grad_norm": "learning/grad_norm",
    "raw_grad_norm": "learning/raw_grad_norm",
    "param_norm": "learning/param_norm",
}


class JobReadError(Exception):
    """One line: why the job could not be read, and what to do."""


@dataclass
class JobFacts:
    log_path: Path
    job_dir: Path
    log: logparse.JobLog
    text: str  # the log's text, but past its first TEXT_HEAD characters without its step lines (read_text)
    summary: tgs.Summary | None
    step_times: dict[int, float]  # step -> unix seconds (rank 0's line)
    tb: dict[str, list[tuple[int, float]]]  # TB_TAGS key -> [(step, value)]
    tb_problem: str | None
    stages: list[dict] = field(default_factory=list)
    partial: str | None = None
    failure: failures.Failure | None = None
    start: float | None = None
    end: float | None = None

    @property
    def header(self) -> dict[str, str]:
        return self.log.header

    @property
    def nodes(self) -> list[str]:
        return logparse.header_nodes(self.header)[0]


def load(log_path: Path, yml_path: str | None = None) -> JobFacts:
    try:
        log = step_summary.load(str(log_path))
        text = read_text(log_path)
    except logparse.LogError as e:
        raise JobReadError(str(e)) from None
    except OSError as e:
        raise JobReadError(f"cannot read {log_path}: {e.strerror}; check its permissions") from None
    job_dir = log_path.with_suffix("") if log_path.name.endswith(".log") else log_path.parent
    # The same steady window and profiler exclusion as `jobkit tgs` (the model's yml names the profiler steps).
    summary = tgs.summarize(log, tgs.DEFAULT_STEADY, yml_path or default_yml(log.header)) if log.has_steps else None
    if log.summarized:  # rank 0's times are in the step summary: the big log is not read again for them
        step_times = {step: ms / 1000.0 for step, ms in sorted(log.step_ms.items())}
    else:
        steps = series_after(str(log_path), None).get(STEP_METRIC, (None, []))[1]
        step_times = {int(v): ms / 1000.0 for ms, v in steps}
    tb, tb_problem = _tb_scalars(job_dir)
    facts = JobFacts(log_path, job_dir, log, text, summary, step_times, tb, tb_problem)
    facts.stages = _stages(text, step_times)
    facts.start, facts.end = _time_bounds(log_path, text, log)
    if not log.footer_status:
        facts.partial = "the log has no JOB SUMMARY: the job is still running, or it ended before writing one"
    status = log.footer_status or "RUNNING"
    if log.footer_status and log.footer_status != "SUCCESS":
        tail = failures.read_tail(str(log_path))
        facts.failure = failures.classify(
            tail, status, log.footer_exit, has_steps=log.has_steps, nodes=facts.nodes or None, job_dir=job_dir,
            procs=log.local_world_size, hang_window=hang_tsdb.read_window,
        )  # fmt: skip
    elif log.footer_status is None and not log.has_steps:
        facts.failure = None
    return facts


TEXT_HEAD = 200_000  # characters: where provenance() looks for the SOURCE / BRANCH / COMMIT blocks


def read_text(log_path: Path) -> str:
    """The log's text for the readers of its other lines (stages, provenance, the first absl time, the MFU note):
    its first TEXT_HEAD characters whole, then every line but the step lines (`log` holds them, folded), once an
    absl time has been seen (the first one may be a step line's). What those readers find is what they would in
    the whole text, in memory that does not grow with ranks x steps (512 x 86,400 step lines are ~10 GB).
    A log of logparse.BIG_LOG bytes or more: its head and its last END_BYTES only (the stages run before and after
    training; the lines printed between the first steps and the end, a checkpoint's, are left out), so that its
    ~10 GB are not scanned line by line."""
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(TEXT_HEAD)
        parts = [head, fh.readline()]  # the rest of a line the head cut
        timed = _ABSL_TIME.search(head) is not None
        size = os.fstat(fh.fileno()).st_size
        if size >= logparse.BIG_LOG and fh.tell() < size - logparse.END_BYTES:
            fh.seek(size - logparse.END_BYTES)
            fh.readline()  # a line the seek cut
        for line in fh:
            if "completed step:" in line and timed:
                continue
            if not timed:
                timed = _ABSL_TIME.match(line) is not None
            parts.append(line)
    return "".join(parts)


def provenance(text: str) -> dict[str, str | None]:
    """The code the job ran: SOURCE / BRANCH / COMMIT blocks that _job.sbatch prints (None when absent)."""
    found = {k.lower(): v.strip() for k, v in _PROVENANCE.findall(text[:TEXT_HEAD])}
    commit = found.get("commit", "")
    return {
        "source": found.get("source") or None,
        "branch": (found.get("branch") or "").removeprefix("## ") or None,
        "commit": commit.split("\n", 1)[0].strip() or None,
        "commit_subject": commit.split("\n", 2)[1].strip() if commit.count("\n") >= 1 else None,
    }


def mfu_note(text: str) -> str | None:
    m = _MFU_NOTE.search(text)
    return m.group(1).strip() if m else None


def _tb_scalars(job_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], str | None]:
    """Per-step learning rate / gradient norm from the job dir's event files (last value wins per step)."""
    if not job_dir.is_dir():
        return {}, "no job dir"
    try:
        files = find_event_files(str(job_dir))
    except OSError as e:
        return {}, f"cannot list {job_dir}: {e.strerror}"
    if not files:
        return {}, "no TensorBoard event files in the job dir"
    wanted = {tag: key for key, tag in TB_TAGS.items()}
    values: dict[str, dict[int, float]] = {}
    problem = None
    for path in files:
        try:
            for tag, step, _wall, value in ScalarReader(path).read_tuples():
                key = wanted.get(tag)
                if key:
                    values.setdefault(key, {})[step] = value
        except Exception as e:  # OSError, EventsError, a damaged record: keep what was read before it
            problem = f"{os.path.basename(path)}: {str(e)[:200]}"
    return {k: sorted(v.items()) for k, v in values.items()}, problem


def _stages(text: str, step_times: dict[int, float]) -> list[dict]:
    found = [
        (m.start(), {"name": m["name"], "seconds": int(m["s"]), "result": m["how"].lower()})
        for m in _STAGE_END.finditer(text)
    ]
    found += [
        (m.start(), {"name": m["name"], "seconds": 0, "result": f"skipped ({m['why']})"})
        for m in _STAGE_SKIPPED.finditer(text)
    ]
    stages = [stage for _, stage in sorted(found, key=lambda pair: pair[0])]  # in the order the job ran them
    absl = _first_absl_time(text)
    if step_times:
        first, last = min(step_times), max(step_times)
        if absl is not None and step_times[first] >= absl:
            stages.append(
                {
                    "name": "startup to first step (init, compile)",
                    "seconds": round(step_times[first] - absl, 3),
                    "result": "derived",
                }
            )
        stages.append(
            {
                "name": f"steps {first}-{last}",
                "seconds": round(step_times[last] - step_times[first], 3),
                "result": "derived",
            }
        )
    return stages


def _first_absl_time(text: str) -> float | None:
    m = _ABSL_TIME.search(text)
    if not m:
        return None
    year = time.localtime().tm_year
    mon, day, hh, mm, ss, us = (int(x) for x in m.groups())
    return time.mktime((year, mon, day, hh, mm, ss, 0, 0, -1)) + us / 1e6


def _time_bounds(log_path: Path, text: str, log: logparse.JobLog) -> tuple[float | None, float | None]:
    """Job start (a local job id's stamp, else the first absl line) and end (the log's last write)."""
    start = jobs.local_start(log.header.get("JOB_ID", ""))
    if start is None:
        start = _first_absl_time(text)
    try:
        end = log_path.stat().st_mtime
    except OSError:
        end = None
    return start, end
