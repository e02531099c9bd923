"""`jobkit tgs` (the throughput report of a job log; the numbers come from core.tgs) and `jobkit reap` (core.reaper):
click only."""

import json

import click

from jobkit.core import clitypes, logparse, tgs
from jobkit.core.config import default_yml
from jobkit.core.errors import EXIT_BAD_INPUT, EXIT_CANNOT_RUN, EXIT_NO_NNODES, EXIT_NO_STEPS, JobkitError
from jobkit.core.verdict import STATUSES, verdict


def load_log(command: str, path: str) -> logparse.JobLog:
    """The job log at PATH, or a JobkitError naming the file and what is wrong with it."""
    try:
        return logparse.load(path)
    except logparse.LogError as exc:
        raise JobkitError(command, str(exc), EXIT_BAD_INPUT) from None


def _nnodes_error(logfile: str, log: logparse.JobLog) -> JobkitError:
    found = log.nnodes_header
    if found is None:
        return JobkitError("tgs", f"{logfile}: no NNODES= header line (not a job log?)", EXIT_NO_NNODES)
    return JobkitError(
        "tgs",
        f"{logfile}: header line {found[0]}={found[1]!r} is not a number of nodes; "
        "fix that line of the header (the job's node count) and rerun",
        EXIT_NO_NNODES,
    )


@click.command("tgs")
@click.argument("logfile")
@click.option("--steady", default="5:14", show_default=True, help="Steady window FIRST:LAST (inclusive steps).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--line", "as_line", is_flag=True, help="Print the one-line end-of-run summary.")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False), help="How the run ended (for --line).")
@click.option("--exit-code", type=int, help="The run's exit code (for --line).")
@click.option("--config", "yml", help="MaxText yml of the run (profiler window); default configs/<MODEL_NAME>.yml.")
def tgs_command(logfile, steady, as_json, as_line, status, exit_code, yml):
    """Throughput report for LOGFILE: windows table, --json, or --line.

    Exit codes: 1 bad input (log missing or unreadable, bad --steady), 2 no step lines, 3 no NNODES header.
    """
    try:
        window = tgs.parse_steady(steady)
    except ValueError as exc:
        raise JobkitError("tgs", str(exc), EXIT_BAD_INPUT) from None
    log = load_log("tgs", logfile)
    if log.nnodes is None:
        raise _nnodes_error(logfile, log)
    summary = tgs.summarize(log, window, yml or default_yml(log.header))
    if as_line:
        click.echo(tgs.format_line(summary, verdict(log, status, exit_code)))
        return
    if not log.entries:
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
    raise SystemExit(rc)
