"""Anomalies in a finished (or running) job, each with the evidence that found it.

Rules, all robust to a noisy CPU run (medians and MADs, not means and standard deviations):
- nonfinite-loss: a step whose loss is NaN or inf.
- loss-spike: a loss above the median of the previous 10 steps by more than 6 robust sigmas and by 25%.
- step-time-outlier: a step (past the first two, which compile) slower than 3x the run's median step and
  than the median + 8 robust sigmas.
- steady-drift: the last third of the steady window is >15% slower or faster than its first third.
- host-stands-apart: at the first slow step, the host whose CPU / memory / network / GPU value is far from
  every other host's (robust z > 4 with 3+ hosts; with 2, one is 2x the other and they differ by 10+ units).
- network-errors: an error, drop, retransmit or RDMA error counter that rose during the job.
- memory-trend: host or GPU memory that ended at 90%+ of its size, or grew by 10+ points and at that rate
  would reach 100% within the job's length again.
"""

from __future__ import annotations

import math
import statistics

from jobkit.analysis import hosts as hostmod

MAD_SIGMA = 1.4826  # MAD -> sigma for normal data
LOSS_WINDOW = 10
LIST_LIMIT = 20  # per kind: the rest is counted, not listed


def _mad(values: list[float]) -> float:
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values)


def _anomaly(kind, message, evidence, step=None, time=None, host=None, severity="warning", **extra):
    return {
        "kind": kind,
        "severity": severity,
        "step": step,
        "time": time,
        "host": host,
        "message": message,
        "evidence": evidence,
        **extra,
    }


def loss_anomalies(points) -> list[dict]:
    """points: tgs.StepPoint list (loss = the mean over the nodes that logged the step)."""
    found = []
    history: list[float] = []
    for p in points:
        loss = p.loss
        if loss is None:
            continue
        if not math.isfinite(loss):
            found.append(
                _anomaly("nonfinite-loss", f"loss is {loss} at step {p.step}", f"step {p.step}: loss {loss}", p.step)
            )
            continue
        recent = history[-LOSS_WINDOW:]
        if len(recent) >= 5:
            base = statistics.median(recent)
            sigma = _mad(recent) * MAD_SIGMA
            if loss > base + 6 * sigma and loss > base * 1.25 + 1e-9:
                found.append(
                    _anomaly(
                        "loss-spike",
                        f"loss spiked to {loss:.4g} at step {p.step} ({loss / base:.2f}x the previous {len(recent)} steps' median {base:.4g})",
                        f"step {p.step}: loss {loss:.6g}; median of steps {p.step - len(recent)}..{p.step - 1}: {base:.6g}",
                        p.step,
                        value=loss,
                        baseline=base,
                    )
                )
        history.append(loss)
    return found


def step_time_outliers(points, step_times: dict[int, float]) -> list[dict]:
    timed = [(p.step, p.seconds) for p in points[2:] if p.seconds is not None and math.isfinite(p.seconds)]
    if len(timed) < 5:
        return []
    values = [s for _, s in timed]
    med = statistics.median(values)
    sigma = _mad(values) * MAD_SIGMA
    limit = max(3 * med, med + 8 * sigma)
    return [
        _anomaly(
            "step-time-outlier",
            f"step {step} took {sec:.4g}s ({sec / med:.1f}x the median {med:.4g}s)",
            f"step {step}: {sec:.6g}s; median {med:.6g}s, limit {limit:.6g}s",
            step,
            step_times.get(step),
            value=sec,
            baseline=med,
        )
        for step, sec in timed
        if sec > limit
    ]


def steady_drift(window_points) -> dict | None:
    secs = [p.seconds for p in window_points if p.seconds is not None and math.isfinite(p.seconds)]
    if len(secs) < 9:
        return None
    third = len(secs) // 3
    first, last = statistics.fmean(secs[:third]), statistics.fmean(secs[-third:])
    if first <= 0:
        return None
    change = (last - first) / first
    if abs(change) <= 0.15:
        return None
    a, b = window_points[0].step, window_points[-1].step
    way = "slower" if change > 0 else "faster"
    return _anomaly(
        "steady-drift",
        f"the steady window (steps {a}-{b}) drifts: its last third is {abs(change) * 100:.0f}% {way} than its first",
        f"mean step time {first:.6g}s over the first {third} steady steps, {last:.6g}s over the last {third}",
        a,
        value=last,
        baseline=first,
    )


def host_apart(
    lines_by_resource: dict[str, dict[str, list]], t: float, step: int | None, span: float = 15.0
) -> list[dict]:
    """The hosts whose resource value around time T stands apart from the others'."""
    found = []
    for res in hostmod.RESOURCES:
        lines = lines_by_resource.get(res.key) or {}
        values = {h: hostmod.value_near(p, t - span, t + span) for h, p in lines.items()}
        values = {h: v for h, v in values.items() if v is not None}
        if len(values) < 2:
            continue
        for host, v in values.items():
            others = [x for h, x in values.items() if h != host]
            med = statistics.median(others)
            if len(others) >= 2:
                sigma = max(_mad(others) * MAD_SIGMA, 0.05 * abs(med), 1e-9)
                apart = abs(v - med) / sigma > 4
            else:
                lo, hi = sorted((v, med))
                apart = hi - lo >= 10 and hi >= 2 * max(lo, 1e-9) and v == hi
            if apart:
                found.append(
                    _anomaly(
                        "host-stands-apart",
                        f"{host}'s {res.title} was {v:.4g} {res.unit} when the slowdown began, the other hosts' median {med:.4g}",
                        f"{res.key} around t={t:.0f} (step {step}): "
                        + ", ".join(f"{h}={x:.4g}" for h, x in sorted(values.items())),
                        step,
                        t,
                        host,
                        resource=res.key,
                        value=v,
                        baseline=med,
                    )
                )
    return found


def network_errors(errors: list[dict]) -> list[dict]:
    return [
        _anomaly(
            "network-errors",
            f"{e['metric']} rose by {e['increase']:.0f} on {e['host']}{' ' + e['device'] if e['device'] else ''}",
            f"{e['metric']}{{host={e['host']},device={e['device'] or '-'}}} increase {e['increase']:.0f}",
            time=e["first_rise"],
            host=e["host"],
            metric=e["metric"],
            value=e["increase"],
        )
        for e in errors
    ]


def memory_trend(lines: dict[str, list[tuple[float, float]]], what: str) -> list[dict]:
    found = []
    for host, points in sorted(lines.items()):
        if len(points) < 3:
            continue
        (t0, v0), (t1, v1) = points[0], points[-1]
        duration = t1 - t0
        if v1 >= 90:
            found.append(
                _anomaly(
                    "memory-trend",
                    f"{what} on {host} ended at {v1:.1f}% of its size",
                    f"{what} {v0:.1f}% -> {v1:.1f}%",
                    time=t1,
                    host=host,
                    value=v1,
                )
            )
            continue
        grew = v1 - v0
        if grew >= 10 and duration > 0:
            per_s = grew / duration
            eta = (100 - v1) / per_s
            if eta <= duration:
                found.append(
                    _anomaly(
                        "memory-trend",
                        f"{what} on {host} grew {grew:.1f} points to {v1:.1f}%; at that rate it is full in {eta / 60:.0f} min",
                        f"{what} {v0:.1f}% at start, {v1:.1f}% at end, over {duration / 60:.1f} min",
                        time=t1,
                        host=host,
                        value=v1,
                    )
                )
    return found


def find(facts, lines_by_resource, errors) -> tuple[list[dict], dict[str, int]]:
    """All anomalies, each kind's list cut at LIST_LIMIT; and the full count per kind."""
    points = facts.summary.points if facts.summary else []
    found = loss_anomalies(points)
    outliers = step_time_outliers(points, facts.step_times)
    found += outliers
    if facts.summary:
        drift = steady_drift(facts.summary.windows["steady"].points)
        if drift:
            found.append(drift)
    first_slow = next((o for o in outliers if o["time"] is not None), None)
    if first_slow:
        found += host_apart(lines_by_resource, first_slow["time"], first_slow["step"])
    found += network_errors(errors)
    found += memory_trend(lines_by_resource.get("memory") or {}, "host memory")
    found += memory_trend(lines_by_resource.get("gpu_mem") or {}, "GPU memory")
    counts: dict[str, int] = {}
    kept = []
    for a in found:
        counts[a["kind"]] = counts.get(a["kind"], 0) + 1
        if counts[a["kind"]] <= LIST_LIMIT:
            kept.append(a)
    return kept, counts
