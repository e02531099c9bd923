"""`jobkit tb-bridge`: TensorBoard scalars as Prometheus gauges, live (serve) and after the job (backfill).

  jobkit tb-bridge serve --logdir DIR --host H --out FILE [--interval S] [--parent-pid PID] [--since EPOCH]
  jobkit tb-bridge backfill --logdir DIR --tsdb TSDB [--label NAME=VALUE ...] [--host H]
                            [--since EPOCH] [--promtool PATH] [--prometheus PATH] [--dry-run]

The work lives in jobkit.observe.tb_events (reading event files, tag -> metric name), jobkit.observe.tb_serve (the daemon) and
jobkit.observe.tb_backfill (the TSDB blocks); this module is only the command line.

Errors are one line on stderr (``jobkit tb-bridge <command>: ...``), exit status 1; bad arguments exit 2.
"""

import click

from jobkit.core.clitypes import SECONDS
from jobkit.core.errors import JobkitError
from jobkit.observe import promserver
from jobkit.observe.tb_events import EventsError

_ONE_LINE_ERRORS = (EventsError, promserver.PromServerError)


def _run(command, work):
    """Runs WORK(); its user-facing errors become a JobkitError (one line on stderr, exit 1)."""
    from jobkit.observe.tb_backfill import BackfillError

    try:
        return work()
    except (*_ONE_LINE_ERRORS, BackfillError) as e:
        message = str(e)
    except OSError as e:
        message = f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}"
    raise JobkitError(f"tb-bridge {command}", message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def group():
    """TensorBoard scalars as Prometheus gauges: live (serve) and after the job (backfill)."""


@group.command("serve")
@click.option("--logdir", required=True, help="Where to look for event files (recursively).")
@click.option("--host", required=True, help='Value of the host="..." label.')
@click.option("--out", required=True, help="Exposition file, replaced atomically; pid in FILE.pid.")
@click.option(
    "--interval",
    type=SECONDS,
    default=1.0,
    show_default=True,
    help="Seconds between polls.",
)
@click.option("--parent-pid", type=int, default=0, help="Exit when this process exits.")
@click.option("--since", type=int, default=0, help="Ignore event files created before this epoch second.")
def serve_command(logdir, host, out, interval, parent_pid, since):
    """Daemon: keep FILE up to date with the newest value of every scalar."""
    from jobkit.observe.tb_serve import serve

    _run("serve", lambda: serve(logdir, host, out, interval, parent_pid, since))


@group.command("backfill")
@click.option("--logdir", required=True, help="Dir searched recursively for event files, or one event file.")
@click.option("--tsdb", required=True, help="The TSDB dir (e.g. <job_dir>/prometheus); its Prometheus stopped.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="NAME=VALUE",
    help="A label Prometheus attached when scraping (job, instance, file_sd labels); repeatable.",
)
@click.option("--host", help="The bridge's own host label (default: --label host, else this host's name).")
@click.option("--since", type=int, default=0, help="Ignore event files created before this epoch second.")
@click.option("--promtool", help="promtool binary (default: PATH, then /usr/bin/promtool).")
@click.option(
    "--prometheus",
    help="prometheus binary, to persist the WAL first (default: $PROMETHEUS_BIN, PATH, /usr/bin/prometheus).",
)
@click.option("--dry-run", is_flag=True, help="Print the OpenMetrics text, touch nothing.")
@click.option(
    "--record",
    is_flag=True,
    help="Only record these arguments in the TSDB as a pending backfill (done later by the teardown or a reader).",
)
@click.option("--job-log", help="The job log: rank 0's steps after the event files' last one are added from it.")
def backfill_command(logdir, tsdb, labels, host, since, promtool, prometheus, dry_run, record, job_log):
    """Add every step of the event files (and of the job log after them) to a stopped Prometheus's TSDB."""
    from jobkit.observe.tb_backfill import backfill, record_pending

    if record:
        _run("backfill", lambda: record_pending(logdir, tsdb, labels, host, job_log))
        return
    _run(
        "backfill", lambda: backfill(logdir, tsdb, labels, host, since, promtool, prometheus, dry_run, job_log=job_log)
    )


@group.command("complete")
@click.option("--tsdb", required=True, help="The TSDB dir (e.g. <job_dir>/prometheus); its Prometheus stopped.")
def complete_command(tsdb):
    """Run a job's recorded TensorBoard backfill if its teardown did not (a no-op when done or never recorded)."""
    from jobkit.observe.tb_backfill import complete_pending

    _run("complete", lambda: complete_pending(tsdb))
