#!/usr/bin/env python3
"""Metrics exporter plugin: MaxText's TensorBoard scalars as tb_* gauges, on rank 0 only.

Usage: tb_metrics_plugin.py <short hostname>

Run by the exporter engine (utils/metrics_exporter.sh) inside one long-lived worker process that calls collect()
once per cycle (py/jobkit/observe/plugin_worker.py); run as a script it prints one cycle's output. Only rank 0
reads TensorBoard: NODE_RANK other than 0, or no OUTPUT_PATH (MaxText's base_output_directory), exits 99 (never
called again) before importing anything beyond the standard library.

The worker keeps the reader between cycles (jobkit.observe.tb_serve.Follower): it finds the newest
events.out.tfevents.* under OUTPUT_PATH, remembers its offset and reads only the records written since the last
cycle (at most READ_LIMIT bytes a cycle, so a long backlog is read over several cycles, never past the plugin's
timeout). It prints per scalar tag the newest step's value (e.g. tb_learning_loss{host="<host>"}) with its event's
time as the sample timestamp, plus tb_step and tb_metrics_plugin_staleness_fill, then "# STATE tb2 <since>";
before the first scalar only the STATE line. The exposition is the one the bash plugin printed from its reader
daemon (`jobkit tb-bridge serve`), byte for byte (tests/fixtures/metrics/golden/tb.*.prom).

  <since>  event files created before this epoch second are ignored: 0 when OUTPUT_PATH is the job's own dir
           ($JOB_WORKSPACE/$JOB_DIR), else the first cycle's time minus 60 s (a checkpointing run's output dir is
           shared with earlier jobs). Kept in the STATE line, so a worker restarted after a timeout keeps it.
Logs ("reading <file>", damaged records): stderr, i.e. the exporter's log.
"""

import os
import sys
import time

PY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "py")
READ_LIMIT = 16 << 20  # bytes of event records read per cycle at most (~0.5 s of CPU on a slow core)
DISABLE_RC = 99

_reader = None  # the worker's Follower, made on the first rank-0 cycle
_text = ""  # the exposition of the newest scalars, rendered when they change


def _since(state):
    """The STATE's since, else what the first cycle decides (see the module docstring)."""
    if state and state.startswith("tb2 ") and state[4:].isdigit():
        return int(state[4:])
    workspace, job_dir = os.environ.get("JOB_WORKSPACE", ""), os.environ.get("JOB_DIR", "")
    job_path = f"{workspace}/{job_dir}"
    if workspace and job_dir and os.environ["OUTPUT_PATH"].rstrip("/") == job_path.rstrip("/"):
        return 0
    return int(time.time()) - 60


def collect(host, state=None):
    """One cycle's output: the newest scalars' exposition and the STATE line."""
    global _reader, _text
    if os.environ.get("NODE_RANK", "0") != "0" or not os.environ.get("OUTPUT_PATH"):
        raise SystemExit(DISABLE_RC)
    since = _since(state)
    if _reader is None:
        # TensorBoard's protos and prometheus_client are imported here, on rank 0 only.
        if PY_DIR not in sys.path:
            sys.path.insert(0, PY_DIR)
        from jobkit.observe.tb_serve import Follower, stderr_log

        interval = float(os.environ.get("POLL_INTERVAL") or 10)
        log = stderr_log(f"[tb_metrics_plugin {host}] ")
        _reader = Follower(os.environ["OUTPUT_PATH"], since, interval, log, limit=READ_LIMIT)
    if _reader.cycle():
        _text = _reader.latest.render(host)
    return f"{_text}# STATE tb2 {since}\n"


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1]:
        print("Usage: tb_metrics_plugin.py <short hostname>", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] in ("-h", "--help"):
        print("Usage: tb_metrics_plugin.py <short hostname>")
        sys.exit(0)
    sys.stdout.write(collect(sys.argv[1], os.environ.get("_PLUGIN_STATE")))
