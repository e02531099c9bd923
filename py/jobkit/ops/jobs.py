"""`jobkit jobs` and `jobkit tail`: the workspace's jobs as a table, and one job's log followed.

A job is its log, `<workspace>/<JOB_ID>-<JOB_NAME>.log`, written by run_local.sh and submit.sh alike; what the
table shows comes from that log alone (header, step lines, JOB SUMMARY), so it works on a login node with no
scheduler access and for jobs of any age. A job that did not succeed gets `jobkit why`'s verdict (its class and
blamed host, `hang@node2`; its retry decision and advice with --why and in --json), from the log's tail (the
read that finds the wall time, so no second read of a big log) with its step lines thinned first (_thin_steps);
the dashboard's rows are read the same way (read_job_and_log), so its failure column is this WHY. A job is named
on the command line by `latest`, its id (matched whole), a leading part of its id up to a '_', a unique part of
its name, or its log / job dir path (resolve). A log that cannot be read is a row that says so in `jobs`, and
one line from `tail`.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from jobkit.core import failures, logparse, metrics_state, tgs
from jobkit.core.errors import JobkitError
from jobkit.core.paths import workspace, workspace_problem
from jobkit.core.verdict import resolve_status
from jobkit.observe import hang_tsdb
from jobkit.ops import coredump

_WALL = re.compile(r"^\s*Wall:\s*(?P<wall>.+?)\s*$", re.M)
_JOB_LOG = re.compile(r"^(?P<id>(?:local_\d{8}_\d{6}_[0-9a-f]{4}|\d+(?:_\d+)?))-(?P<name>.+)\.log$")
# Public for jobkit tag and jobkit artifacts, which name jobs the same way (a tagged `<stem>-tgs5042.log` matches).
JOB_LOG = _JOB_LOG


class JobsError(Exception):
    """One line that says what was wrong and what to pass instead."""


@dataclass
class Job:
    job_id: str
    name: str
    model: str
    nodes: str
    status: str
    wall: str
    tgs: float | None
    log: str
    modified: float
    attempt: int = 1  # this job's attempt (ATTEMPT in its header; 2 = the first requeue)
    attempts: int = 1  # how many it may have: 1 + MAX_RETRIES
    retry_of: str = ""  # the attempt before it (RETRY_OF)
    metrics: str = "-"  # RAY=1's metrics: on, off, ? (running, no TSDB yet), - (not asked); core.metrics_state
    metrics_off_why: str | None = None  # why they were off (the log's reason, else that it gave none)
    why: str = "-"  # `jobkit why`'s class@host for a job that failed; `-` nothing to classify; `?` unreadable
    failure: dict | None = None  # that verdict whole (class, host, blamed_because, retry, advice, ...); --json

    @property
    def tries(self) -> str:
        """`2/3` for attempt 2 of at most 3; `-` for a job that was never to be requeued."""
        return f"{self.attempt}/{self.attempts}" if self.attempts > 1 or self.attempt > 1 else "-"


_LOCAL_ID = re.compile(r"^local_(\d{8}_\d{6})_")  # run_local.sh's ids: local_<YYYYmmdd_HHMMSS>_<hex>


def local_start(job_id: str) -> float | None:
    """When a local job started, from its id (run_local.sh stamps it there); None for a Slurm id."""
    m = _LOCAL_ID.match(job_id + "_")
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group(1), "%Y%m%d_%H%M%S"))
    except ValueError:
        return None


def job_logs(ws: Path) -> list[Path]:
    """The workspace's job logs, oldest first."""
    problem = workspace_problem(ws)
    if problem:
        raise JobsError(problem)
    try:
        logs = [p for p in ws.iterdir() if p.is_file() and _JOB_LOG.match(p.name)]
    except OSError as exc:
        raise JobsError(f"cannot read workspace {ws}: {exc.strerror}; pass one you can read") from None
    return sorted(logs, key=lambda p: p.stat().st_mtime)


def read_job(path: Path, why: bool = False) -> Job:
    """The job LOG records; OSError when it cannot be read (the dashboard makes that a row of its own). WHY:
    also `jobkit why`'s verdict on a job that did not succeed (classify_job), from the same tail read."""
    return read_job_and_log(path, why)[0]


def read_job_and_log(path: Path, why: bool = False) -> tuple[Job, logparse.JobLog]:
    """read_job's Job and the log's ends as it parsed them, for a reader that shows more of them (the dashboard:
    the model alias, MFU) without a second read of the log."""
    parsed = logparse.parse_ends(str(path), tgs.steps_needed())  # header, steady window, end: not a whole big log
    m = _JOB_LOG.match(path.name)
    header = parsed.header
    status = parsed.footer_status or "no summary"
    asked = why and _to_classify(parsed)
    tail = failures.read_tail(str(path)) if parsed.footer_status or asked else ""  # read once for both
    wall_match = _WALL.search(tail) if parsed.footer_status else None
    value = None
    if parsed.has_steps:
        summary = tgs.summarize(parsed)
        value = summary.tgs if summary.tgs is not None and math.isfinite(summary.tgs) else None
    obs = metrics_state.state(
        header, parsed.metrics_off, metrics_state.job_dir_of(str(path)), bool(parsed.footer_status)
    )
    job = Job(
        header.get("JOB_ID") or m.group("id"),
        header.get("JOB_NAME") or m.group("name"),
        header.get("MODEL_NAME", "?"),
        header.get("NNODES", "?"),
        status,
        wall_match.group("wall") if wall_match else "-",
        value,
        str(path),
        path.stat().st_mtime,
        _count(header.get("ATTEMPT"), 1),
        1 + _count(header.get("MAX_RETRIES"), 0),
        header.get("RETRY_OF", ""),
        obs.word,
        obs.reason if obs.off else None,
        *(_verdict(path, parsed, tail) if asked else ("-", None)),
    )
    return job, parsed


def _verdict(path: Path, parsed: logparse.JobLog, tail: str) -> tuple[str, dict | None]:
    """classify_job, or `?` with the problem (`error`, one line) when it cannot be had: the row goes on."""
    try:
        return classify_job(path, parsed, tail)
    except failures.CatalogueError as exc:  # the same for every row: jobs_command says it once
        return "?", {"error": exc.format_message()}
    except (OSError, UnicodeError) as exc:  # the job dir's hang stacks, say: this row only
        return "?", {"error": f"cannot classify {path}: {getattr(exc, 'strerror', None) or exc}; jobkit why {path}"}


def _to_classify(parsed: logparse.JobLog) -> bool:
    """Whether `jobkit why` would classify this job: not one that succeeded or stopped early with exit 0."""
    resolved = resolve_status(None, parsed.footer_exit, parsed)
    return not (resolved in ("SUCCESS", "STOPPED") and parsed.footer_exit in (0, None))


def classify_job(path: Path, parsed: logparse.JobLog, tail: str) -> tuple[str, dict | None]:
    """(`class@host`, the verdict as a dict) for the job whose log PATH parsed as PARSED and ends with TAIL, as
    `jobkit why PATH` gives it: the JOB SUMMARY's exit code, the header's nodes, the job dir's hang stacks. A
    log with no JOB SUMMARY whose tail names no cause (a running job, most likely) is `-`, as why's
    `incomplete`. OSError when the job dir's files cannot be read; a CatalogueError for a bad catalogue."""
    found = failures.classify(
        _thin_steps(tail),
        parsed.footer_status,  # as `jobkit why`: a CANCELLED job is read for Slurm's own reasons only
        parsed.footer_exit,
        has_steps=parsed.has_steps,
        nodes=logparse.header_nodes(parsed.header)[0],
        job_dir=coredump.job_dir_of(path),
        hang_window=hang_tsdb.read_window,  # a hang only, with a TSDB: one bounded promtool read, as why's
    )
    if parsed.footer_exit is None and not parsed.footer_status and found.reason in ("unknown", "no-steps"):
        return "-", None
    verdict = {
        "class": found.reason, "detail": found.detail, "host": found.host, "blamed_because": found.blame_how,
        "retry": found.retry_decision, "advice": found.advice, "evidence": found.evidence,
    }  # fmt: skip
    return (f"{found.reason}@{found.host}" if found.host else found.reason), verdict


_STEP = "completed step:"
_RANK = re.compile(r"\s*\d+: ")  # an `srun -l` rank prefix


def _thin_steps(text: str) -> str:
    """TEXT with each run of step lines cut to each rank's first and last step line in that run.

    Step lines are most of a big log's tail, no catalogue entry matches one, and classify reads them only to
    see whether a rank logged a step at all after a line (a JAX accusation: accused_state): what each rank
    logged first and last in a run keeps that, and every other line and its neighbours stay as they were.
    Every pattern of the catalogue scans the whole text, so this is what makes a 4 MiB tail take
    milliseconds instead of seconds (hundreds of failed jobs in one table). tests/py/test_jobs_why.py checks
    that the verdict is `jobkit why`'s on every log of the failure corpus."""
    lines = text.split("\n")
    keep: list[int] = []
    run: dict[str, list[int]] = {}  # rank prefix -> [first, last] line index in the current run
    for i, line in enumerate(lines):
        if _STEP in line:
            m = _RANK.match(line)
            ends = run.setdefault(m.group(0) if m else "", [i, i])
            ends[1] = i
            continue
        if run:
            keep.extend(sorted({i for ends in run.values() for i in ends}))
            run = {}
        keep.append(i)
    keep.extend(sorted({i for ends in run.values() for i in ends}))
    return text if len(keep) == len(lines) else "\n".join(lines[i] for i in keep)


def unreadable_job(path: Path) -> Job:
    """A row for a log that cannot be read: what its file name says, and that it is unreadable."""
    m = _JOB_LOG.match(path.name)
    try:
        modified = path.lstat().st_mtime
    except OSError:
        modified = 0.0
    return Job(
        m.group("id"), m.group("name"), "?", "?", "unreadable", "-", None, str(path), modified, metrics="?", why="?"
    )


def _count(value: str | None, default: int) -> int:
    return int(value) if value and value.isdigit() else default


def resolve(ws: Path, spec: str) -> Path:
    """The log of the job SPEC names: `latest`, a log or job dir path, a job id, or a unique part of a log name.

    A job id is matched whole (the log name's part before its first '-'), never as a piece of another id: `2`
    is job 2, not job 12 nor a local id stamped 2026. Only when no id matches is SPEC read as a leading part
    of an id (`local_20261124_222907`, `123` for the tasks `123_4`) or a part of a job name (`no_such_key`)."""
    if not spec.strip():
        raise JobsError("give a job: latest, a job id, a unique part of its name, or its log / job dir path")
    given = Path(spec)
    if given.is_file():
        return given
    if given.is_dir() and Path(f"{given}.log").is_file():
        return Path(f"{given}.log")
    logs = job_logs(ws)
    if not logs:
        raise JobsError(f"no job logs in {ws}; run a job first, or pass --workspace")
    if spec == "latest":
        return logs[-1]
    parts = [(p, _JOB_LOG.match(p.name)) for p in logs]
    exact = [p for p, m in parts if m.group("id") == spec]
    found = exact or [p for p, m in parts if _partly_names(spec, p.name, m.group("id"), m.group("name"))]
    if len(found) == 1:
        return found[0]
    if not found:
        raise JobsError(f"no job matching '{spec}' in {ws}; see 'jobkit jobs'")
    names = ", ".join(p.name.removesuffix(".log") for p in found[-5:])
    raise JobsError(f"'{spec}' matches {len(found)} jobs in {ws} ({names}); give more of the name or the job id")


def _partly_names(spec: str, log_name: str, job_id: str, name: str) -> bool:
    """SPEC is a leading part of JOB_ID up to one of its '_' (a local id's date and time, an array's job), the
    log name's start past the id (`31-JAX`), or a part of the job NAME; a bare piece of an id never is."""
    return (
        job_id.startswith(spec.rstrip("_") + "_")
        or (spec.startswith(f"{job_id}-") and log_name.startswith(spec))
        or spec in f"{name}.log"
    )


def _tgs_text(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def format_table(jobs: list[Job]) -> str:
    rows = [("JOB", "NAME", "NODES", "STATUS", "WALL", "TGS/device", "TRY", "METRICS", "WHY")]
    rows += [(j.job_id, j.name, j.nodes, j.status, j.wall, _tgs_text(j.tgs), j.tries, j.metrics, j.why) for j in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


@click.command("jobs")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--model", help="Only this model's jobs (MODEL_NAME in the log header).")
@click.option("--last", type=click.IntRange(1), help="Only the N newest jobs.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, one per line (failure: jobkit why's).")
@click.option("--why", "show_why", is_flag=True, help="Under the table, each failed job's retry decision and advice.")
def jobs_command(ws, model, last, as_json, show_why):
    """The workspace's jobs, oldest first: id, name, nodes, status, wall time, steady-state TGS/device, attempt,
    metrics, why (a failed job's class@host).

    WHY is `jobkit why`'s class and blamed host (`oom@node1`) for a job that did not succeed, `-` for one that
    did or stopped early, `?` when it cannot be said (an unreadable log); --why and --json add the retry
    decision and the advice."""
    try:
        logs = job_logs(workspace(ws))
    except JobsError as exc:
        raise JobkitError("jobs", str(exc)) from None
    found = []
    said: set[str] = set()
    for path in logs:
        try:
            found.append(read_job(path, why=True))
            problem = (found[-1].failure or {}).get("error")
            if problem and problem not in said:  # a bad catalogue is said once, not once per failed job
                said.add(problem)
                click.echo(f"jobkit jobs: {problem}; its WHY says ?", err=True)
        except OSError as exc:  # one unreadable log is one row that says so, not the end of the list
            click.echo(f"jobkit jobs: cannot read {path}: {exc.strerror or exc}; its row says unreadable", err=True)
            found.append(unreadable_job(path))
    if model:
        found = [j for j in found if j.model == model]
    if last:
        found = found[-last:]
    if as_json:
        for job in found:
            click.echo(json.dumps(asdict(job)))
    elif found:
        click.echo(format_table(found))
        for job in found:  # the table says `off`; why, one line each, where a person reads it and a parser does not
            if job.metrics_off_why:
                click.echo(f"jobkit jobs: job {job.job_id}: RAY=1 but metrics off: {job.metrics_off_why}", err=True)
        if show_why:
            for job in found:
                if job.failure and "advice" in job.failure:
                    click.echo(
                        f"{job.job_id}  {job.why}  retry: {job.failure['retry']}  advice: {job.failure['advice']}"
                    )
    else:
        click.echo(f"no jobs in {workspace(ws)}" + (f" for model {model}" if model else ""), err=True)


@click.command("tail")
@click.argument("job")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("-n", "--lines", type=click.IntRange(0), default=40, show_default=True, help="Lines to show first.")
@click.option("--no-follow", is_flag=True, help="Print the last lines and exit instead of following the log.")
def tail_command(job, ws, lines, no_follow):
    """Follow JOB's log: `latest`, a job id, a unique part of its name, or its log / job dir path."""
    try:
        log = resolve(workspace(ws), job)
    except JobsError as exc:
        raise JobkitError("tail", str(exc)) from None
    try:
        text = failures.read_tail(str(log))  # also proves the log readable before tail -F would retry forever
    except OSError as exc:
        raise JobkitError("tail", f"cannot read {log}: {exc.strerror or exc}; check its permissions") from None
    click.echo(f"jobkit tail: {log}", err=True)  # which job SPEC named: a name part may not be the one meant
    if no_follow:
        click.echo("\n".join(text.splitlines()[-lines:]) if lines else "", nl=bool(lines))
        return
    # tail -F follows the file across a rename (jobkit tag) and waits while it does not exist yet (a queued job).
    os.execvp("tail", ["tail", "-n", str(lines), "-F", str(log)])
