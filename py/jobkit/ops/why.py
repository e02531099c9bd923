"""`jobkit why LOGFILE`: why a run failed (its class, evidence, the host to blame) and, after a crash, its core dump."""

import click

from jobkit.core import failures
from jobkit.core.commands import load_log
from jobkit.core.nodelist import expand_nodelist
from jobkit.core.verdict import STATUSES
from jobkit.ops import coredump


@click.command("why")
@click.argument("logfile")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False))
@click.option("--exit-code", type=int)
def why_command(logfile, status, exit_code):
    """Classify why the run in LOGFILE failed; after a crash, where its core dump is and how to open it."""
    log = load_log("why", logfile)
    nodes = expand_nodelist(log.header.get("JOB_NODELIST", ""))
    if exit_code is None:
        exit_code = log.footer_exit  # the JOB SUMMARY's: a signal's exit code names the signal
    text = failures.read_tail(logfile)
    found = failures.classify(text, status, exit_code, has_steps=bool(log.entries), nodes=nodes)
    click.echo(found.label)
    if found.evidence:
        click.echo(f"  evidence: {found.evidence}")
    if found.host:
        click.echo(f"  host: {found.host}")
    signal_name = found.detail if found.reason == "killed-by-signal" else None
    for line in coredump.report(text, logfile, signal_name):
        click.echo(line)
