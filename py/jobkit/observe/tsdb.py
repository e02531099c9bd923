"""`jobkit tsdb`: a finished job's Prometheus TSDB, browsed with a throwaway Prometheus.

  jobkit tsdb view TSDB [--port P] [--data-range TEXT]
  jobkit tsdb blocks TSDB
  jobkit tsdb await-scrape --port P --after EPOCH [--timeout S]   (a running job's Prometheus; jobkit.observe.final_scrape)


utils/prometheus.sh view resolves what the user typed (job id prefix, job dir, prometheus/ dir) to TSDB and runs
this in the foreground. It serves TSDB on 127.0.0.1, port P (default $PROMETHEUS_PORT, else 9190) or the next
free one of $PROMETHEUS_PORT_TRIES (10), with no scrape targets, 10y retention and --query.lookback-delta=1h
(sparse series still show), prints the URL and the ssh tunnel, and runs until Ctrl-C / SIGTERM, which stop it by
PID (exit 0).

Before anything touches TSDB it checks the WAL (jobkit.observe.tsdb_wal): Prometheus would silently truncate a damaged
one at start-up, so a damaged WAL is refused with one line naming the segment, the offset and what to do. A
start that fails leaves TSDB as it was (jobkit.observe.promserver removes what the attempt added). Prometheus has no
read-only mode: a healthy WAL may still be compacted into blocks in place (the samples are kept). A block whose
meta.json is damaged (jobkit.observe.tsdb_blocks) is skipped by Prometheus: view says which one, and the fix, before
it starts.

`blocks` prints one line per block of TSDB, "ULID ok MIN_MS MAX_MS" or "ULID damaged WHY": the check that
utils/lib/prometheus.sh's list and range text use, so that all readers call the same blocks damaged.

Errors are one line on stderr (``jobkit tsdb view: ...``), exit 1; bad arguments exit 2; `await-scrape` exits
EXIT_ANSWER_NO (8) when the scrape did not come in time.
"""

import os
import signal
import sys
import time

import click

from jobkit.core import metrics_state
from jobkit.core.errors import EXIT_ANSWER_NO, JobkitError, exit_with
from jobkit.core.tunnel import tunnel_hint
from jobkit.observe import promserver, tsdb_blocks, tsdb_wal

DEFAULT_PORT = 9190


def _say(message):
    click.echo(f"[Prometheus] {message}", err=True)


def _env_int(name, default):
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise JobkitError("tsdb view", f"{name}={text} is not a positive whole number; fix or unset it")
    return int(text)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def group():
    """Browse a job's Prometheus TSDB after the job."""


@group.command("view")
@click.argument("tsdb", type=click.Path(exists=True, file_okay=False))
@click.option("-p", "--port", type=click.IntRange(1, 65535), help="First port to try (default $PROMETHEUS_PORT, 9190).")
@click.option("--data-range", default="", help="Time range of the data, printed in the header.")
def view(tsdb, port, data_range):
    """Serve TSDB on 127.0.0.1 until Ctrl-C (refuses a damaged WAL, changes nothing when it cannot start)."""
    tsdb = os.path.abspath(tsdb)
    if not metrics_state.is_tsdb(tsdb):
        raise JobkitError(
            "tsdb view",
            f"{tsdb} is not a Prometheus TSDB (no wal/ and no block dirs); pass a job dir or its prometheus/ dir",
        )
    if port is None:
        port = _env_int("PROMETHEUS_PORT", DEFAULT_PORT)
    busy = promserver.serving_pid(tsdb)
    if busy:
        raise JobkitError(
            "tsdb view", f"a Prometheus (pid {busy}) still serves {tsdb}; browse that one, or stop it first"
        )
    damage = tsdb_wal.check(tsdb)
    if damage:
        raise JobkitError(
            "tsdb view",
            f"the WAL of {tsdb} is damaged at {damage.segment} byte {damage.offset} ({damage.why}); Prometheus "
            "would truncate it there at start-up, so nothing was started or changed. To browse the rest, view a "
            f"copy: cp -a {tsdb} /tmp/tsdb-copy && utils/prometheus.sh view /tmp/tsdb-copy",
        )
    bad = tsdb_blocks.damaged(tsdb)
    if bad:
        _say(f"WARNING: {tsdb_blocks.damage_text(tsdb, bad)}")
    try:
        binary = promserver.find_binary()
    except promserver.PromServerError as e:
        raise JobkitError("tsdb view", str(e)) from None
    if not binary:
        raise JobkitError("tsdb view", "prometheus is not installed; run 'utils/prometheus.sh install'")
    # A job stopped before its teardown finished has steps only in its TensorBoard files: add them first.
    from jobkit.observe.tb_backfill import BackfillError, complete_pending

    try:
        complete_pending(tsdb, prometheus=binary, out=lambda msg, **_: _say(msg))
    except BackfillError as e:
        _say(f"WARNING: the pending TensorBoard backfill failed ({e}); showing the TSDB without it")
    try:
        server = promserver.start(
            tsdb,
            binary,
            first_port=port,
            tries=_env_int("PROMETHEUS_PORT_TRIES", 10),
            extra_args=["--query.lookback-delta=1h"],
            ready_timeout=_env_int("PROMETHEUS_READY_TIMEOUT", 30),
            on_port_taken=lambda first, used: _say(f"WARNING: port {first} was occupied; using {used} instead"),
        )
    except promserver.PromServerError as e:
        raise JobkitError("tsdb view", str(e)) from None
    _serve_until_stopped(server, tsdb, data_range, said_damaged=bool(bad))


@group.command("blocks")
@click.argument("tsdb", type=click.Path(exists=True, file_okay=False))
def blocks(tsdb):
    """One line per block of TSDB: "ULID ok MIN_MS MAX_MS" or "ULID damaged WHY"."""
    for b in tsdb_blocks.blocks(tsdb):
        click.echo(f"{b.name} damaged {b.damage}" if b.damage else f"{b.name} ok {b.min_ms} {b.max_ms}")


@group.command("await-scrape")
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="The job's Prometheus on 127.0.0.1.")
@click.option(
    "--after", type=float, required=True, help="Epoch seconds (training's end) every target must be scraped after."
)
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds to wait at most."
)
def await_scrape(port, after, timeout):
    """Wait until the job's Prometheus has scraped every target once after AFTER (its last seconds land)."""
    from jobkit.observe import final_scrape

    done, why = final_scrape.await_scrape(port, after, timeout)
    if not done:
        _say(why)
        exit_with(EXIT_ANSWER_NO)


def _serve_until_stopped(server, tsdb, data_range, said_damaged=False):
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    _say(f"Started on port {server.port}")
    with open(server.log_path, errors="replace") as f:
        # data it could not read (e.g. blocks of another Prometheus version) is skipped with an error line
        problem = next((ln for ln in f if "level=error" in ln or "level=fatal" in ln), None)
    if problem and not (said_damaged and "meta.json" in problem):  # that one was named above, with its fix
        _say(f"WARNING: prometheus reports a problem with this TSDB (some data may be missing): {problem.strip()}")
    port = server.port
    data = data_range or "see the graph"
    if " .. " in data_range:  # a range, not "no data yet" or "damaged: ..."
        data += "  (set the graph's end time inside this range)"
    elif said_damaged:
        data += " (see the WARNING above)"
    click.echo(
        f"Prometheus for {tsdb}\n"
        f"  URL:        http://127.0.0.1:{port}\n"
        f"  data:       {data}\n"
        f"  from your laptop:  {tunnel_hint(port)}   then open http://localhost:{port}\n"
        f"  log:        {server.log_path}\n"
        "Ctrl-C stops it."
    )
    sys.stdout.flush()
    while not stopping and server.proc.poll() is None:
        time.sleep(0.2)
    if stopping:
        server.stop()
        _say(f"Stopped (pid {server.pid})")
        return
    rc = server.stop()
    raise JobkitError("tsdb view", f"prometheus (pid {server.pid}) exited with status {rc}; rerun to see its log")
