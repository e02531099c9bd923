"""A hang's window in a RAY=1 job's TSDB: each host's GPU busy and power, network and CPU from the last progress
to the HANG, and the same minutes of training before it, for core.hang_metrics to judge.

The window comes from the watchdog's marker, `<job dir>/hang/HANG`: it is written when the hang is declared
(its mtime is the end) and says `N s since` the last progress (the start). Only a few families and a few minutes
are read (promtool's --match and --min-time/--max-time), for every host; a stall longer than STALL_MAX_S is read
as its last STALL_MAX_S. The TSDB is read the way `jobkit analyze` reads it (observe.tsdb_dump: blocks and the
WAL, where a just-ended job's last hours are, without changing the job dir).

Names are the exporter plugins' (utils/plugins/*: hw_gpu_*, hw_net_*, hw_rdma_*) and Ray's node CPU metric.
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

from jobkit.core import files, metrics_state
from jobkit.core.hang_metrics import HostWindow, Window
from jobkit.observe import tsdb_dump

TRAIN_S = 180.0  # the minutes of training before the last progress: each GPU's own working level
STALL_MAX_S = 600.0  # the stall read at most: its last minutes (a 1-hour pre-step-0 hang is not read whole)
SLACK_S = 15.0  # past the HANG: the scrape that lands just after it
MARKER = "HANG"  # ops.hang_watchdog.MARKER_NAME (observe may not import ops)

GPU_BUSY = "hw_gpu_busy_percent"
GPU_POWER = "hw_gpu_power_watts"
CPU = "ray_node_cpu_utilization"
NET = ("hw_net_rx_bytes_total", "hw_net_tx_bytes_total", "hw_rdma_rx_bytes_total", "hw_rdma_tx_bytes_total")
# Counters whose rise is a GPU fault: uncorrectable memory errors (NVIDIA ECC, AMD RAS blocks) and fatal PCIe.
FAULTS = re.compile(r"^hw_gpu_(ecc_uncorrected_total|ras_\w+_ue_total|pcie_fatal_total)$")
# promtool's --match is a PromQL string: a backslash there is a string escape, so no \w in it.
FAMILIES = "|".join([GPU_BUSY, GPU_POWER, CPU, *NET, "hw_gpu_ecc_uncorrected_total", "hw_gpu_ras_[a-z0-9_]+_ue_total",
                     "hw_gpu_pcie_fatal_total"])  # fmt: skip
_SINCE = re.compile(r"\b(\d+(?:\.\d+)?) s since\b")


def stall_bounds(job_dir: Path) -> tuple[float, float] | None:
    """(last progress, HANG) in unix seconds from the job's own hang/HANG marker; None without one."""
    marker = Path(job_dir) / "hang" / MARKER
    try:
        text = files.read_own(marker, in_own_dir=True)
        end = os.stat(marker).st_mtime
    except (OSError, files.Untrusted):
        return None
    m = _SINCE.search(text.partition("\n")[0])
    return (end - float(m.group(1)), end) if m else None


def read_window(job_dir: Path, promtool: str | None = None) -> Window | None:
    """The hang's Window from JOB_DIR's TSDB; None when the job has no TSDB or no marker to place it. A TSDB that
    cannot be read gives a Window without hosts whose note says why."""
    tsdb = Path(job_dir) / "prometheus"
    bounds = stall_bounds(job_dir)
    if bounds is None or not metrics_state.is_tsdb(str(tsdb)):
        return None
    start, end = bounds
    first = max(start, end - STALL_MAX_S)
    ranges = [(start - TRAIN_S, end + SLACK_S)]
    if first > start:  # a long stall: its training minutes and its last minutes, not the hour between
        ranges = [(start - TRAIN_S, start + SLACK_S), (first, end + SLACK_S)]
    data: dict[str, list[tsdb_dump.Series]] = {}
    try:
        for lo, hi in ranges:
            for name, series in tsdb_dump.read(str(tsdb), FAMILIES, promtool, lo, hi).items():
                data.setdefault(name, []).extend(series)
    except tsdb_dump.TsdbReadError as e:
        return Window(first, end, (), f"metrics not read: {e}")
    return Window(first, end, hosts_in(data, start, first, end))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _gauge(series: list[tsdb_dump.Series], lo: float, hi: float) -> dict[str, float | None]:
    """{host: mean of every sample of its series (all its GPUs) in (LO, HI]}: a sample at LO itself (the last
    progress) belongs to what came before."""
    by_host: dict[str, list[float]] = {}
    for s in series:
        by_host.setdefault(s.host, []).extend(v for t, v in s.points if lo < t <= hi)
    return {host: _mean(values) for host, values in by_host.items()}


def _rate(series: list[tsdb_dump.Series], lo: float, hi: float) -> dict[str, float | None]:
    """{host: bytes/s summed over its counters in [LO, HI]}; a counter with under two samples there is left out."""
    out: dict[str, float | None] = {}
    for s in series:
        points = [p for p in s.points if lo <= p[0] <= hi]
        out.setdefault(s.host, None)
        if len(points) >= 2 and points[-1][0] > points[0][0]:
            out[s.host] = (out[s.host] or 0.0) + tsdb_dump.increase(points) / (points[-1][0] - points[0][0])
    return out


def hosts_in(data: dict[str, list[tsdb_dump.Series]], start: float, first: float, end: float) -> tuple[HostWindow, ...]:
    """Each host's numbers: the stall is [FIRST, END] (FIRST = START unless the stall was cut), training is the
    TRAIN_S before START; a fault counter counts when it rose anywhere from training to the HANG."""
    hi = end + SLACK_S
    busy = _gauge(data.get(GPU_BUSY, []), first, hi)
    power = _gauge(data.get(GPU_POWER, []), first, hi)
    power_train = _gauge(data.get(GPU_POWER, []), start - TRAIN_S, start)
    cpu = _gauge(data.get(CPU, []), first, hi)
    net_series = [s for name in NET for s in data.get(name, [])]
    net = _rate(net_series, first, hi)
    net_train = _rate(net_series, start - TRAIN_S, start)
    faults: dict[str, list[str]] = {}
    for name, group in data.items():
        if not FAULTS.match(name):
            continue
        for s in group:
            points = [p for p in s.points if start - TRAIN_S <= p[0] <= hi]
            rose = tsdb_dump.increase(points)
            if rose > 0:
                gpu = f" on GPU {s.labels['gpu']}" if "gpu" in s.labels else ""
                faults.setdefault(s.host, []).append(f"{name} rose by {rose:g}{gpu}")
    hosts = sorted(set(busy) | set(power) | set(cpu) | set(net) | set(faults))
    return tuple(
        HostWindow(
            host,
            busy.get(host),
            power.get(host),
            power_train.get(host),
            net.get(host),
            net_train.get(host),
            cpu.get(host),
            tuple(faults.get(host, ())),
        )  # fmt: skip
        for host in hosts
        if host != "?"
    )
