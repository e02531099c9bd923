"""`jobkit analyze JOB`: <job dir>/analysis/analysis.json and report.html, and a summary on the terminal.

Writes nothing else: the TSDB is read with promtool (read-only), the log and event files are only read. Both
files are written to a temporary name in the same directory and renamed, so a reader never sees half a
report and an interrupted run leaves the previous one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from jobkit.analysis import build as buildmod
from jobkit.analysis import hosts, report
from jobkit.analysis.job import JobReadError, load
from jobkit.core import paths
from jobkit.core.errors import JobkitError
from jobkit.core.files import write_atomic
from jobkit.ops import jobs


class AnalyzeError(Exception):
    """One line: what is wrong and what to do."""


def json_safe(value):
    """VALUE with every NaN or infinite float as None: JSON has no such numbers, and a reader takes null for
    "no value" where a bare NaN token would make the whole file unreadable."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def analyze(log_path: Path, out_dir: Path | None = None) -> tuple[buildmod.Analysis, Path]:
    """Build and write one job's analysis; returns it and the directory written. Raises AnalyzeError."""
    try:
        facts = load(log_path)
    except JobReadError as e:
        raise AnalyzeError(str(e)) from None
    target = out_dir or facts.job_dir / "analysis"
    try:
        target.mkdir(parents=out_dir is not None, exist_ok=True)
    except FileNotFoundError:
        raise AnalyzeError(
            f"the job dir {facts.job_dir} does not exist (log only); pass --output DIR to write the analysis elsewhere"
        ) from None
    except OSError as e:  # permission denied, a read-only filesystem, ...
        raise AnalyzeError(
            f"cannot create {target}: {e.strerror.lower()}; pass --output DIR to write it elsewhere"
        ) from None
    result = buildmod.build(facts)
    try:
        write_atomic(target / "analysis.json", json.dumps(json_safe(result.doc), indent=1, allow_nan=False) + "\n")
        write_atomic(target / "report.html", report.render(result))
    except OSError as e:  # an analysis/ dir that exists but is not writable, a full disk
        raise AnalyzeError(
            f"cannot write in {target}: {e.strerror.lower()}; pass --output DIR to write it elsewhere"
        ) from None
    return result, target


def summary_lines(doc: dict) -> list[str]:
    job, thr = doc["job"], doc["throughput"]
    out = [f"{job['id']} ({job['name']}): {job['status'] or 'unknown'}, {doc['steps']['logged']} steps logged"]
    if doc["partial"]:
        out.append(f"  PARTIAL: {doc['partial']}")
    if thr["tgs"]:
        t, s = thr["tgs"], thr["step_time_s"]
        out.append(
            f"  steady steps {thr['window'][0]}-{thr['window'][1]}: TGS {t['mean']:,.1f} ± {t['std']:,.1f} (cv {t['cv_pct']}%), "
            f"step {s['mean']:.4g}s" + (f", MFU {thr['mfu_pct']['mean']:.1f}%" if thr["mfu_pct"] else "")
        )
    elif thr["unavailable"]:
        out.append(f"  no steady TGS: {thr['unavailable']}")
    if doc["failure"]:
        f = doc["failure"]
        out.append(
            f"  failure: {f['class']}"
            + (f" on {f['host']}" if f["host"] else "")
            + (f": {f['evidence']}" if f["evidence"] else "")
        )
        if f.get("noticed"):
            out.append(f"    noticed: {f['noticed']}")
        if f.get("blamed_because"):
            out.append(f"    {'blamed because' if f['host'] else 'blamed'}: {f['blamed_because']}")
        if f.get("metrics"):
            out.append(f"    metrics: {f['metrics']}")
    hang = doc.get("hang") or {}
    for host, row in (hang.get("hosts") or {}).items():
        out.append(f"  during the hang, {host}: {hosts.hang_host_text(row)}")
    for a in doc["anomalies"][:8]:
        out.append(f"  anomaly {a['kind']}: {a['message']}")
    if len(doc["anomalies"]) > 8:
        out.append(f"  ... {len(doc['anomalies']) - 8} more in the report")
    for m in doc["missing"]:
        out.append(f"  missing {m['panel']}: {m['why']}")
    return out


@click.command("analyze")
@click.argument("job")
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--output", "output", type=click.Path(file_okay=False), help="Write here instead of <job dir>/analysis/.")
@click.option("--json", "as_json", is_flag=True, help="Print analysis.json instead of the summary.")
def command(job, ws, output, as_json):
    """Analyse JOB (a job id, part of its name, its log or dir, or `latest`): writes analysis.json and a
    self-contained report.html under <job dir>/analysis/ and prints a summary.

    Steps, loss and throughput come from the log (the steady window is `jobkit tgs`'s); learning rate and grad
    norm from the TensorBoard event files; per-host CPU, memory, network, RDMA and GPU from the job's TSDB
    (RAY=1 jobs), read read-only with promtool. Anomalies: loss spikes and NaN/inf, step-time outliers, a
    drifting steady window, the host that stands apart when a slowdown starts, error counters that rose,
    memory heading for its limit.
    """
    try:
        log_path = jobs.resolve(paths.workspace(ws), job)
    except jobs.JobsError as e:
        raise JobkitError("analyze", str(e)) from None
    try:
        result, target = analyze(Path(log_path), Path(output) if output else None)
    except AnalyzeError as e:
        raise JobkitError("analyze", str(e)) from None
    if as_json:
        click.echo(json.dumps(json_safe(result.doc), indent=1, allow_nan=False))
        return
    for line in summary_lines(result.doc):
        click.echo(line)
    click.echo(f"report: {target / 'report.html'}")
    click.echo(f"data:   {target / 'analysis.json'}")
