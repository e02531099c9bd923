"""`jobkit why LOGFILE`: why a run failed (its class, evidence, the host to blame) and, after a crash, its core dump."""

import click

from jobkit.core import failures, logparse
from jobkit.core.commands import load_log
from jobkit.core.verdict import STATUSES, resolve_status
from jobkit.ops import coredump

INCOMPLETE = "the log has no JOB SUMMARY: the job is still running, or it died without writing one"


@click.command("why")
@click.argument("logfile")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False), help="How the run ended.")
@click.option("--exit-code", type=click.IntRange(0, 255), help="The run's exit code (0-255).")
def why_command(logfile, status, exit_code):
    """Classify why the run in LOGFILE failed; after a crash, where its core dump is and how to open it.
    How it ended comes from --status/--exit-code, else from the log's JOB SUMMARY."""
    log = load_log("why", logfile)
    nodes, nodes_note = logparse.header_nodes(log.header)
    if nodes_note:
        click.echo(f"jobkit why: {logfile}: {nodes_note}", err=True)
    if exit_code is None:
        exit_code = log.footer_exit  # the JOB SUMMARY's: a signal's exit code names the signal
    told = status is not None or exit_code is not None  # by the caller or by the JOB SUMMARY
    if resolve_status(status, exit_code, log) == "SUCCESS" and exit_code in (0, None):
        click.echo("succeeded: nothing to classify")
        return
    text = failures.read_tail(logfile)
    found = failures.classify(text, status, exit_code, has_steps=bool(log.entries), nodes=nodes)
    if not told and found.reason in ("unknown", "no-steps"):
        click.echo(f"incomplete: {INCOMPLETE}")
        return
    click.echo(found.label)
    if found.evidence:
        click.echo(f"  evidence: {found.evidence}")
    if found.host:
        click.echo(f"  host: {found.host}")
    if not told:
        click.echo(f"  note: {INCOMPLETE}")
    signal_name = found.detail if found.reason == "killed-by-signal" else None
    for line in coredump.report(text, logfile, signal_name):
        click.echo(line)
