"""`jobkit tgs` (the throughput report of a job log; the numbers come from core.tgs), `jobkit reap` (core.reaper)
and `jobkit metrics-state` (core.metrics_state): click only."""

import json
import os

import click

from jobkit.core import clitypes, logparse, metrics_state, step_summary, tgs
from jobkit.core.config import default_yml
from jobkit.core.errors import EXIT_BAD_INPUT, EXIT_CANNOT_RUN, EXIT_NO_STEPS, EXIT_NOT_A_LOG, JobkitError, exit_with
from jobkit.core.paths import workspace, workspace_problem
from jobkit.core.verdict import STATUSES, verdict


def load_log(
    command: str, path: str, not_a_log_code: int = EXIT_BAD_INPUT, first_steps: int | None = None, steps: bool = True
) -> logparse.JobLog:
    """The job log at PATH, or a JobkitError naming the file and what is wrong with it (NOT_A_LOG_CODE for a
    file that is not a job log). FIRST_STEPS: a big log's ends only (logparse.parse_ends); else STEPS (every
    step wanted): a big log's ends and the job's step summary between them where it can be used (step_summary),
    not STEPS: every line of the log."""
    try:
        if first_steps is not None:
            return logparse.load(path, first_steps)
        return step_summary.load(path) if steps else logparse.load(path)
    except logparse.NotAJobLog as exc:
        raise JobkitError(command, str(exc), not_a_log_code) from None
    except logparse.LogError as exc:
        raise JobkitError(command, str(exc), EXIT_BAD_INPUT) from None


def _nnodes_error(logfile: str, log: logparse.JobLog) -> JobkitError:
    found = log.nnodes_header or ("NNODES", "")
    return JobkitError(
        "tgs",
        f"{logfile}: header line {found[0]}={found[1]!r} is not a number of nodes; "
        "fix that line of the header (the job's node count) and rerun",
        EXIT_NOT_A_LOG,
    )


def _check_config(path: str) -> None:
    """A JobkitError unless PATH is a readable yml of top-level keys: a --config that cannot be read would
    otherwise be ignored without a word (the profiler window would come from the log alone)."""
    import yaml  # deferred: only when --config is given

    fix = "pass the MaxText yml the run used, or leave --config out for configs/<MODEL_NAME>.yml"
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise JobkitError("tgs", f"--config {path}: cannot read it ({exc.strerror or exc}); {fix}") from None
    except (UnicodeDecodeError, yaml.reader.ReaderError):  # not UTF-8, or NUL and control bytes
        raise JobkitError("tgs", f"--config {path}: not a text file; {fix}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise JobkitError("tgs", f"--config {path}: not valid YAML{at}; {fix}") from None
    if not isinstance(data, dict):
        raise JobkitError("tgs", f"--config {path}: not a yml of KEY: VALUE settings; {fix}")


@click.command("tgs")
@click.argument("logfile")
@click.option("--steady", default="5:14", show_default=True, help="Steady window FIRST:LAST (inclusive steps).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--line", "as_line", is_flag=True, help="Print the one-line end-of-run summary.")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False), help="How the run ended (for --line).")
@click.option("--exit-code", type=click.IntRange(0, 255), help="The run's exit code, 0-255 (for --line).")
@click.option("--config", "yml", help="MaxText yml of the run (profiler window); default configs/<MODEL_NAME>.yml.")
def tgs_command(logfile, steady, as_json, as_line, status, exit_code, yml):
    """Throughput report for LOGFILE: windows table, --json, or --line.

    Exit codes: 1 bad input (log missing or unreadable, bad --steady, --config missing or not text), 3 no step
    lines, 4 not a job log (no JOB_ID and NNODES header) or an NNODES that is not a number (jobkit's table of
    codes: docs/architecture.md#exit-codes).
    """
    try:
        window = tgs.parse_steady(steady)
    except ValueError as exc:
        raise JobkitError("tgs", str(exc), EXIT_BAD_INPUT) from None
    if yml:
        _check_config(yml)
    # The end-of-run line needs the steady window and the end only: a big log is not read whole for it.
    log = load_log("tgs", logfile, EXIT_NOT_A_LOG, tgs.steps_needed(window) if as_line else None)
    if log.nnodes is None:
        raise _nnodes_error(logfile, log)
    summary = tgs.summarize(log, window, yml or default_yml(log.header))
    if as_line:
        click.echo(tgs.format_line(summary, verdict(log, status, exit_code)))
        return
    if not log.has_steps:
        raise JobkitError(
            "tgs",
            f"{logfile}: no 'completed step' lines (runs need steps>={window[1] + 1} for a steady TGS)",
            EXIT_NO_STEPS,
        )
    if as_json:
        click.echo(json.dumps(tgs.to_dict(summary), indent=2))
    else:
        click.echo(tgs.format_table(summary))


@click.command("reap", context_settings={"ignore_unknown_options": True})
@click.option(
    "--grace",
    type=clitypes.Seconds(0, 600, min_open=False),
    default=5.0,
    show_default=True,
    help="Seconds between TERM and KILL.",
)
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def reap_command(grace, argv):
    """Run ARGV... as a child subreaper: what it leaves behind (a daemon that detached, like Ray's GCS) stays in the
    job's process tree and is stopped when it ends. Exits with ARGV's status."""
    from jobkit.core import reaper

    try:
        rc = reaper.run(list(argv), grace)
    except reaper.ReaperError as exc:
        raise JobkitError("reap", str(exc), EXIT_CANNOT_RUN) from None
    exit_with(rc)  # ARGV's own status, passed on


def _metrics_rows(paths: list[str], ended: bool | None) -> list[tuple[str, metrics_state.Metrics | str]]:
    """(job dir name, its Metrics, or why its log cannot be read) for each log of PATHS that is a job log."""
    rows: list[tuple[str, metrics_state.Metrics | str]] = []
    for path in paths:
        name = os.path.basename(metrics_state.job_dir_of(path))
        try:
            log = logparse.parse_ends(path, 0)  # header to the first step, and the end (as --summary)
        except OSError as exc:  # one unreadable log is one row that says so, and the others are listed
            rows.append((name, f"cannot read {path}: {exc.strerror or exc}"))
            continue
        if log.is_job_log:
            done = log.footer_status is not None if ended is None else ended
            rows.append((name, metrics_state.state(log.header, log.metrics_off, metrics_state.job_dir_of(path), done)))
    return rows


def _metrics_detail(found: metrics_state.Metrics) -> str:
    if found.word == "on":
        return str(found.tsdb)
    if found.word == "off":
        return f"no TSDB: {found.reason}"
    return "no TSDB yet (running)" if found.word == "?" else "RAY=1 not asked"


@click.command("metrics-state")
@click.argument("logs", nargs=-1)
@click.option(
    "--workspace", "ws", help="Every job log of this workspace when no LOG is given (default $JOB_WORKSPACE)."
)
@click.option("--off", "only_off", is_flag=True, help="Only the RAY=1 jobs whose metrics are off.")
@click.option(
    "--summary", is_flag=True, help="One LOG of a job ending now: print its JOB SUMMARY `Metrics:` value (or nothing)."
)
def metrics_state_command(logs, ws, only_off, summary):
    """Whether each RAY=1 job's metrics were on: its TSDB, or off and the reason its log gives.

    One line per job log (LOGS, else every log of the workspace, oldest first): job dir name, `on` / `off` /
    `?` (running, no TSDB yet) / `-` (no RAY=1), then the TSDB or why there is none. An unreadable log is a
    line `<name>  ?  cannot read ...`, and the others are listed. Exit code 1: a bad workspace, or --summary
    without exactly one readable job log.
    """
    if summary:
        if len(logs) != 1:
            raise JobkitError("metrics-state", "--summary takes one job log; pass <JOB_WORKSPACE>/<JOB_DIR>.log")
        # The `[observability]` line comes from rank 0 before training starts (utils/lib/observability.sh), so it
        # sits above the first step: a big log is read there and at its end (run on the first node at every
        # job's end: a whole read of a 24 h log was minutes), as `jobkit jobs` reads it.
        log = load_log("metrics-state", logs[0], first_steps=0)
        found = metrics_state.state(log.header, log.metrics_off, metrics_state.job_dir_of(logs[0]), ended=True)
        if found.summary_value():
            click.echo(found.summary_value())
        return
    if not logs:
        where = workspace(ws)
        problem = workspace_problem(where)
        if problem:
            raise JobkitError("metrics-state", problem)
        found_logs = sorted((p for p in where.glob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
        logs = tuple(str(p) for p in found_logs)
    for name, found in _metrics_rows(list(logs), None):
        if isinstance(found, str):
            click.echo(f"{name}  ?  {found}")
        elif found.off or not only_off:
            click.echo(f"{name}  {found.word}  {_metrics_detail(found)}")
