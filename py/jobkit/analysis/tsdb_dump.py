"""A job's TSDB, read without changing it: `promtool tsdb dump` parsed into series.

Why promtool and not a throwaway Prometheus: promtool opens the TSDB read-only (blocks and WAL, replaying the
WAL into a temporary head elsewhere), so analysing a job never touches its job dir; a Prometheus would write
a lock file, a new WAL segment and maybe compact. It is also one process for the whole read, and its output is
plain text: `{__name__="m", host="h", ...} value ms` per sample.

Only the families the analysis uses are dumped (FAMILIES, one regex selector), which keeps the read in
seconds for an 8-node hour. Counters are turned into rates here, with Prometheus's reset rule (a drop
means the counter restarted from 0).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field

from jobkit import promserver

# Families read from the TSDB (hw_*: our exporter's plugins; ray_node_*: Ray's per-node metrics; tb_*: the
# TensorBoard scalars, scraped live and backfilled).
FAMILIES = r"hw_.*|ray_node_.*|tb_.*"
TIMEOUT_S = 300
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class TsdbReadError(Exception):
    """One line: why the TSDB could not be read."""


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)  # (unix seconds, value), time order

    @property
    def host(self) -> str:
        return self.labels.get("host", "?")


def is_tsdb(path: str) -> bool:
    """A directory that holds a WAL or at least one block (ULID-named dir with meta.json)."""
    if not os.path.isdir(path):
        return False
    if os.path.isdir(os.path.join(path, "wal")):
        return True
    return any(os.path.isfile(os.path.join(path, d, "meta.json")) for d in os.listdir(path))


def read(tsdb: str, families: str = FAMILIES, promtool: str | None = None) -> dict[str, list[Series]]:
    """{metric name: [Series, ...]} of every sample of FAMILIES in TSDB. Raises TsdbReadError."""
    tool = promserver.find_tool("promtool", promtool, "PROMTOOL")
    if not tool:
        raise TsdbReadError("promtool is not installed; run 'utils/prometheus.sh install'")
    try:
        proc = subprocess.run(
            [tool, "tsdb", "dump", f'--match={{__name__=~"{families}"}}', tsdb],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TsdbReadError(f"promtool tsdb dump of {tsdb} took more than {TIMEOUT_S}s") from None
    except OSError as e:
        raise TsdbReadError(f"could not run {tool}: {e.strerror}") from None
    if proc.returncode != 0:
        why = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), f"exit {proc.returncode}")
        raise TsdbReadError(f"promtool could not read {tsdb}: {why[:300]}")
    return parse(proc.stdout)


def parse(text: str) -> dict[str, list[Series]]:
    """The dump's lines as series; label sets are parsed once each (a dump repeats them on every sample)."""
    by_key: dict[str, Series] = {}
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            key, value, ms = line.rsplit(" ", 2)
            point = (int(ms) / 1000.0, float(value))
        except ValueError:
            continue
        series = by_key.get(key)
        if series is None:
            labels = dict(_LABEL.findall(key))
            series = by_key[key] = Series(labels.pop("__name__", "?"), labels)
        series.points.append(point)
    out: dict[str, list[Series]] = {}
    for series in by_key.values():
        series.points.sort()
        out.setdefault(series.name, []).append(series)
    return out


def rate(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Per-second increase of a counter between samples; a drop is a reset (the new value counts from 0)."""
    out = []
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        if t1 <= t0:
            continue
        out.append((t1, ((v1 - v0) if v1 >= v0 else v1) / (t1 - t0)))
    return out


def increase(points: list[tuple[float, float]]) -> float:
    """Total increase of a counter over its samples, resets counted as Prometheus does."""
    total = 0.0
    for (_, v0), (_, v1) in zip(points, points[1:], strict=False):
        total += (v1 - v0) if v1 >= v0 else v1
    return total


def time_range(series: dict[str, list[Series]]) -> tuple[float, float] | None:
    times = [p[0] for group in series.values() for s in group for p in (s.points[0], s.points[-1]) if s.points]
    return (min(times), max(times)) if times else None
