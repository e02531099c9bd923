"""Per-host resource series and summaries from a job's TSDB (jobkit.observe.tsdb_dump's series).

Each panel of the report is one RESOURCE: a name, a unit, and how its per-host line is made from the raw
series: gauges are combined across a host's devices sample by sample (one scrape stamps them all alike),
counters become rates first. Where the exporter's GPU plugin is absent (CPU nodes) or Ray's node metrics
are (RAY=1 without Ray), the resource has no host and the report says so.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from jobkit.observe.tsdb_dump import Series, increase, rate

MB = 1e6


@dataclass(frozen=True)
class Resource:
    key: str
    title: str
    unit: str
    metrics: tuple[str, ...]  # families summed into the line (after rate() for counters)
    counter: bool = False
    combine: str = "sum"  # across a host's series at one timestamp: sum | mean | max
    scale: float = 1.0
    ratio_of: tuple[str, ...] | None = None  # plot 100 * metrics / ratio_of (memory in use vs. total)


RESOURCES = (
    Resource("cpu", "CPU utilisation", "%", ("ray_node_cpu_utilization",), combine="mean"),
    Resource("memory", "host memory in use", "%", ("ray_node_mem_used",), ratio_of=("ray_node_mem_total",)),
    Resource(
        "net",
        "network throughput (rx+tx)",
        "MB/s",
        ("hw_net_rx_bytes_total", "hw_net_tx_bytes_total"),
        True,
        scale=1 / MB,
    ),
    Resource(
        "rdma",
        "RDMA throughput (rx+tx)",
        "MB/s",
        ("hw_rdma_rx_bytes_total", "hw_rdma_tx_bytes_total"),
        True,
        scale=1 / MB,
    ),
    Resource("gpu_util", "GPU busy (mean over GPUs)", "%", ("hw_gpu_busy_percent",), combine="mean"),
    Resource("gpu_mem", "GPU memory in use", "%", ("hw_gpu_vram_used_bytes",), ratio_of=("hw_gpu_vram_total_bytes",)),
    Resource("gpu_temp", "GPU temperature (hottest)", "°C", ("hw_gpu_temperature_celsius",), combine="max"),
    Resource("gpu_power", "GPU power (sum)", "W", ("hw_gpu_power_watts",)),
)

# Counters whose rise means trouble on the wire (network and RDMA errors, drops, retransmits, link flaps).
ERROR_COUNTERS = re.compile(
    r"^hw_(net_(rx|tx)_(errors|drop)_total|tcp_retransmits_total|rdma_.*(err|errors|symbol|downed|retx|timeout|discards).*_total)$"
)


def hosts_families() -> str:
    """The regex of every family the resources and the error check use (promtool's --match)."""
    names = sorted({n for r in RESOURCES for n in (*r.metrics, *(r.ratio_of or ()))})
    return "|".join([*names, ERROR_COUNTERS.pattern.strip("^$")])


_COMBINE: dict[str, Callable[[list[float]], float]] = {"sum": sum, "mean": statistics.fmean, "max": max}


def _by_host(series: list[Series], counter: bool, combine: str) -> dict[str, list[tuple[float, float]]]:
    """{host: [(t, value)]}: each series (rated when a counter), combined per host at each timestamp."""
    buckets: dict[str, dict[float, list[float]]] = {}
    for s in series:
        points = rate(s.points) if counter else s.points
        slot = buckets.setdefault(s.host, {})
        for t, v in points:
            slot.setdefault(round(t, 1), []).append(v)
    fn = _COMBINE[combine]
    return {host: [(t, fn(vs)) for t, vs in sorted(slots.items())] for host, slots in buckets.items()}


def host_lines(data: dict[str, list[Series]], res: Resource) -> dict[str, list[tuple[float, float]]]:
    series = [s for name in res.metrics for s in data.get(name, [])]
    lines = _by_host(series, res.counter, res.combine)
    if res.ratio_of:
        totals = _by_host([s for name in res.ratio_of for s in data.get(name, [])], False, "sum")
        out = {}
        for host, points in lines.items():
            total = dict(totals.get(host, []))
            out[host] = [(t, 100.0 * v / total[t]) for t, v in points if total.get(t)]
        lines = {h: p for h, p in out.items() if p}
    if res.scale != 1.0:
        lines = {h: [(t, v * res.scale) for t, v in p] for h, p in lines.items()}
    return lines


def summarize(lines: dict[str, list[tuple[float, float]]]) -> dict[str, dict]:
    """{host: {mean, min, max, last, samples}} of each host's line."""
    out = {}
    for host, points in sorted(lines.items()):
        values = [v for _, v in points]
        if values:
            out[host] = {
                "mean": round(statistics.fmean(values), 3),
                "min": round(min(values), 3),
                "max": round(max(values), 3),
                "last": round(values[-1], 3),
                "samples": len(values),
            }
    return out


def error_increases(data: dict[str, list[Series]]) -> list[dict]:
    """Error counters that rose during the job: [{host, metric, device, increase, first_rise}]."""
    found = []
    for name, group in data.items():
        if not ERROR_COUNTERS.match(name):
            continue
        for s in group:
            grew = increase(s.points)
            if grew > 0:
                first = next((t1 for (_, v0), (t1, v1) in zip(s.points, s.points[1:], strict=False) if v1 != v0), None)
                device = s.labels.get("device") or s.labels.get("port") or ""
                found.append({"host": s.host, "metric": name, "device": device, "increase": grew, "first_rise": first})
    return sorted(found, key=lambda e: (e["host"], e["metric"], e["device"]))


def hosts_seen(data: dict[str, list[Series]]) -> list[str]:
    return sorted({s.host for group in data.values() for s in group if s.host != "?"})


def value_near(points: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Mean of the samples in [t0, t1]; else the last sample before t1; None without one."""
    inside = [v for t, v in points if t0 <= t <= t1]
    if inside:
        return statistics.fmean(inside)
    before = [v for t, v in points if t <= t1]
    return before[-1] if before else None


# Around a hang: what each host was doing while no step came (CPU, GPU busy and power, network).
HANG_RESOURCES = ("cpu", "gpu_util", "gpu_power", "net")


def around(lines: dict[str, dict[str, list[tuple[float, float]]]], t0: float, t1: float) -> dict[str, dict]:
    """{host: {resource key: mean in [t0, t1], and `<key>_job_max`: its highest over the whole job}} for the
    HANG_RESOURCES the TSDB has; a host without a sample in the window has none of that resource."""
    out: dict[str, dict] = {}
    for key in HANG_RESOURCES:
        for host, points in lines.get(key, {}).items():
            inside = [v for t, v in points if t0 <= t <= t1]
            if not inside:
                continue
            row = out.setdefault(host, {})
            row[key] = round(statistics.fmean(inside), 3)
            row[f"{key}_job_max"] = round(max(v for _, v in points), 3)
    return dict(sorted(out.items()))


def hang_host_text(row: dict) -> str:
    """`CPU 3%, GPU busy 98% at 80 W (job max 300 W), network 0.00 MB/s` from a hang's per-host row."""
    said = []
    if "cpu" in row:
        said.append(f"CPU {row['cpu']:.0f}%")
    if "gpu_util" in row:
        power = f" at {row['gpu_power']:.0f} W (job max {row['gpu_power_job_max']:.0f} W)" if "gpu_power" in row else ""
        said.append(f"GPU busy {row['gpu_util']:.0f}%{power}")
    if "net" in row:
        said.append(f"network {row['net']:.2f} MB/s (job max {row['net_job_max']:.2f})")
    return ", ".join(said)
