"""One job's analysis: the analysis.json document and the plot panels of its report.

Numbered steps, each its own function: 1. read the log and job dir (jobkit.analysis.job); 2. read the TSDB,
when the job has one, read-only (tsdb_query, else tsdb_dump); 3. per-host resource lines and summaries (hosts); 4. anomalies;
5. the document, with every key present (null where unknown) and `missing` saying which panels have no data
and why. The keys are listed in docs/analysis.md (analysis.json keys); SCHEMA goes up when one changes meaning.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.analysis import anomalies, hosts, tsdb_query
from jobkit.analysis.job import JobFacts, mfu_note, provenance
from jobkit.core import metrics_state, tgs
from jobkit.observe import tsdb_blocks, tsdb_dump
from jobkit.ops.hang_watchdog import MARKER_NAME

SCHEMA = 1


@dataclass
class Analysis:
    facts: JobFacts
    doc: dict
    lines: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)  # resource -> host -> points
    tb_series: dict[str, list] = field(default_factory=dict)


def _round(v, digits=6):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return round(v, digits) if isinstance(v, float) else v


def _stat(values) -> dict | None:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    mean = statistics.fmean(vals)
    std = statistics.pstdev(vals)
    return {
        "n": len(vals),
        "mean": _round(mean),
        "std": _round(std),
        "cv_pct": _round(100 * std / mean, 3) if mean else None,
        "min": _round(vals[0]),
        "p50": _round(statistics.median(vals)),
        "max": _round(vals[-1]),
    }


def _tsdb_dir(job_dir: Path) -> Path | None:
    for candidate in (job_dir / "prometheus", job_dir):
        if tsdb_dump.is_tsdb(str(candidate)):
            return candidate
    return None


def _read_tsdb(facts: JobFacts) -> tuple[dict, str | None, str | None, str | None, dict | None]:
    """(series, tsdb path, why there are none, which blocks are damaged, how it was read: {via: promql and its
    step_s, or promtool tsdb dump and why}). Prometheus answers PromQL over a view (tsdb_query: per-host lines,
    downsampled past MAX_POINTS scrapes); the dump is the fallback. promtool skips a block whose meta.json
    is damaged: the series are what the healthy blocks hold, and the damage is named, never "no data"."""
    ray = metrics_state.ray_asked(facts.header)
    where = _tsdb_dir(facts.job_dir)
    if where is None:
        if ray and facts.log.metrics_off:  # the reason the job itself gave (core.metrics_state)
            return {}, None, f"RAY=1 but metrics were off: {facts.log.metrics_off}", None, None
        if (facts.job_dir / "prometheus").is_dir():
            return (
                {},
                str(facts.job_dir / "prometheus"),
                "the job's prometheus/ dir holds no TSDB data (no WAL, no block)",
                None,
                None,
            )
        why = "the job ran without RAY=1, so no metrics were scraped" if not ray else "the job has no prometheus/ dir"
        return {}, None, why, None, None
    bad = tsdb_blocks.damaged(str(where))
    damage = tsdb_blocks.damage_text(str(where), bad) if bad else None
    data = None
    if not bad:  # a damaged block stops Prometheus; promtool skips it and reads the rest
        try:
            data, step = tsdb_query.read(str(where))
            read = {"via": "promql", "step_s": step}
        except tsdb_query.QueryError as e:
            read = {"via": "promtool tsdb dump", "why": f"Prometheus could not answer: {e}"}
    else:
        read = {"via": "promtool tsdb dump", "why": "a damaged block"}
    try:
        if not data:  # also an empty answer: the dump says why (a WAL Prometheus repaired in its view, say)
            if data is not None:
                read = {"via": "promtool tsdb dump", "why": "Prometheus found no host series"}
            data = tsdb_dump.read(str(where), hosts.hosts_families())
    except tsdb_dump.TsdbReadError as e:
        return {}, str(where), f"{e}; also, {damage}" if damage else str(e), damage, read
    if not data:
        return {}, str(where), damage or "the TSDB holds none of the exporter's or Ray's host series", damage, read
    return data, str(where), None, damage, read


def _job_section(facts: JobFacts) -> dict:
    h = facts.header
    status = facts.log.footer_status or ("RUNNING" if facts.partial else None)
    return {
        "id": h.get("JOB_ID") or h.get("SLURM_JOB_ID"),
        "name": h.get("JOB_NAME"),
        "log": str(facts.log_path),
        "dir": str(facts.job_dir),
        "status": status,
        "exit_code": facts.log.footer_exit,
        "nnodes": facts.log.nnodes,
        "nodelist": facts.nodes,
        "tag": h.get("EXP_TAG") or None,
        "attempt": int(h.get("ATTEMPT", "1") or 1) if (h.get("ATTEMPT", "1") or "1").isdigit() else 1,
        "max_retries": int(h["MAX_RETRIES"]) if h.get("MAX_RETRIES", "").isdigit() else 0,
        "retry_of": h.get("RETRY_OF") or None,
        "container_runtime": h.get("CONTAINER_RUNTIME") or None,
        "ray": metrics_state.ray_asked(h),
        "start": _round(facts.start, 3),
        "end": _round(facts.end, 3),
        "wall_s": _round(facts.end - facts.start, 1) if facts.start and facts.end else None,
    }


def _provenance(facts: JobFacts) -> dict:
    out = provenance(facts.text)
    link = facts.job_dir / "artifact"
    out["artifact"] = os.readlink(link) if link.is_symlink() else None
    return out


def _throughput(facts: JobFacts) -> dict:
    s = facts.summary
    if s is None:
        return {
            "window": None,
            "steps": 0,
            "tgs": None,
            "step_time_s": None,
            "tflops": None,
            "mfu_pct": None,
            "mfu_note": mfu_note(facts.text),
            "unavailable": "the log has no 'completed step' lines",
        }
    pts = s.windows["steady"].points
    return {
        "window": list(s.windows["steady"].span) if pts else list(s.steady_range),
        "steps": len(pts),
        "tgs": _stat(p.tgs for p in pts),
        "step_time_s": _stat(p.seconds for p in pts),
        "tflops": _stat(p.tflops for p in pts),
        "mfu_pct": _stat(p.mfu for p in pts),
        "mfu_note": mfu_note(facts.text),
        "unavailable": None if s.tgs is not None else tgs.to_dict(s)["tgs_unavailable"],
        "warnings": s.warnings,
    }


def _steps(facts: JobFacts) -> dict:
    s = facts.summary
    points = s.points if s else []
    tb = {k: dict(v) for k, v in facts.tb.items()}
    return {
        "logged": len(points),
        "first": points[0].step if points else None,
        "last": points[-1].step if points else None,
        "entries_per_step": s.entries_per_step if s else 0,
        # a big log's middle steps read from the job's step summary (global rank 0's values), or why it was not
        **({"from_step_summary": list(facts.log.summarized)} if facts.log.summarized else {}),
        **({"step_summary_note": facts.log.summary_note} if facts.log.summary_note else {}),
        "per_step": [
            {
                "step": p.step,
                "time": _round(facts.step_times.get(p.step), 3),
                "loss": _round(p.loss),
                "seconds": _round(p.seconds),
                "tgs": _round(p.tgs, 3),
                "tflops": _round(p.tflops),
                "mfu": _round(p.mfu, 3),
                **{k: _round(tb[k].get(p.step)) for k in tb},
            }
            for p in points
        ],
    }


def _loss(facts: JobFacts) -> dict | None:
    pts = [p for p in (facts.summary.points if facts.summary else []) if p.loss is not None]
    if not pts:
        return None
    finite = [p for p in pts if math.isfinite(p.loss)]
    best = min(finite, key=lambda p: p.loss) if finite else None
    return {
        "first": _round(pts[0].loss),
        "final": _round(pts[-1].loss),
        "min": _round(best.loss) if best else None,
        "min_step": best.step if best else None,
        "nonfinite_steps": [p.step for p in pts if not math.isfinite(p.loss)],
    }


def _hang(facts: JobFacts, lines: dict) -> dict | None:
    """The watchdog's marker, its time, the stacks files, and (RAY=1, a TSDB) each host's CPU, GPU busy and
    power and network during the stall (`N s since` before the marker), with what they read as."""
    marker = facts.job_dir / "hang" / MARKER_NAME
    if not marker.is_file():
        return None
    try:
        text = marker.read_text(errors="replace").strip()
        when = marker.stat().st_mtime
    except OSError:
        text, when = "", None
    stacks = sorted(p.name for p in (facts.job_dir / "hang").glob("*.txt"))
    stalled = re.search(r"(\d+) s since", text)
    per_host = hosts.around(lines, when - float(stalled.group(1)), when) if when and stalled and lines else {}
    return {
        "marker": text,
        "time": _round(when, 3),
        "stacks": stacks,
        "hosts": per_host,
    }


def build(facts: JobFacts) -> Analysis:
    data, tsdb_path, tsdb_why, damage, tsdb_read = _read_tsdb(facts)
    lines = {res.key: hosts.host_lines(data, res) for res in hosts.RESOURCES} if data else {}
    errors = hosts.error_increases(data) if data else []
    found, counts = anomalies.find(facts, lines, errors)
    missing = []
    if tsdb_why:
        missing.append({"panel": "per-host resources", "why": tsdb_why})
    else:
        if damage:  # the healthy blocks' series are shown; the damaged blocks' part is named, not passed over
            missing.append({"panel": "per-host resources (part)", "why": damage})
        for res in hosts.RESOURCES:
            if not lines.get(res.key):
                names = ", ".join(res.metrics)
                missing.append({"panel": res.title, "why": f"no {names} samples in the TSDB"})
    if not facts.tb:
        missing.append({"panel": "learning rate / grad norm", "why": facts.tb_problem or "not in the event files"})
    if not facts.summary:
        missing.append({"panel": "loss, step time, TGS", "why": "the log has no 'completed step' lines"})
    failure = facts.failure
    doc = {
        "schema": SCHEMA,
        "generated_at": round(time.time(), 3),
        "partial": facts.partial,
        "job": _job_section(facts),
        "provenance": _provenance(facts),
        "model": {
            "name": facts.header.get("MODEL_NAME"),
            "alias": facts.header.get("MODEL_NAME_ALIAS") or None,
            "passthrough": facts.log.passthrough_args(),
        },
        "stages": facts.stages,
        "steps": _steps(facts),
        "throughput": _throughput(facts),
        "loss": _loss(facts),
        "failure": {
            "class": failure.reason,
            "detail": failure.detail or None,
            "evidence": failure.evidence or None,
            "host": failure.host or None,
            "blamed_because": failure.blame_how or None,
            "noticed": failure.noticed or None,
            "waiting": list(failure.waiting),
            "metrics": failure.metrics or None,  # the verdict's own reading of the stall (core.hang_metrics)
            "retry": failure.retry_decision,
        }
        if failure
        else None,
        "hang": _hang(facts, lines),
        "hosts": {
            "tsdb": tsdb_path,
            "available": bool(data),
            "why_not": tsdb_why,
            "read": tsdb_read,
            "names": hosts.hosts_seen(data) if data else [],
            "time_range": list(tsdb_dump.time_range(data) or []) or None,
            "resources": {
                res.key: {"title": res.title, "unit": res.unit, "per_host": hosts.summarize(lines.get(res.key, {}))}
                for res in hosts.RESOURCES
                if lines.get(res.key)
            },
            "error_counters": errors,
        },
        "anomalies": found,
        "anomaly_counts": counts,
        "missing": missing,
    }
    return Analysis(facts, doc, lines)
