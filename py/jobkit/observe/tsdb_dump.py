"""A job's TSDB, read without changing it: `promtool tsdb dump` parsed into series.

Why promtool and not a throwaway Prometheus: promtool opens the TSDB read-only (blocks and WAL, replaying the
WAL into a head in memory); a Prometheus would write a lock file, a new WAL segment and maybe compact. promtool
is still given a private view of links to the TSDB's files, not the TSDB itself, since it creates chunks_head/ in
the dir it opens: analysing a job never touches its job dir. It is also one process for the whole read, and its output is
plain text: `{__name__="m", host="h", ...} value ms` per sample.

Only the families the caller names are dumped (one regex selector): reading every hw_/ray_node_/tb_ family
took twice the time for data the analysis never used. Counters are turned into rates here, with Prometheus's reset rule (a drop
means the counter restarted from 0).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from jobkit.core import metrics_state
from jobkit.observe import promserver

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
    """A directory that holds a WAL or at least one block (core.metrics_state's one test); one it may not list
    counts, so that read() says why rather than "no TSDB"."""
    return metrics_state.is_tsdb(path)


def read(
    tsdb: str, families: str, promtool: str | None = None, min_time: float | None = None, max_time: float | None = None
) -> dict[str, list[Series]]:
    """{metric name: [Series, ...]} of every sample of the FAMILIES regex in TSDB, only those from MIN_TIME to
    MAX_TIME (unix seconds) when given. Raises TsdbReadError.

    promtool's output is parsed as it streams: an 8-node hour is ~1M lines, and holding them as one string
    and then a list of lines costs gigabytes (bench/analyze_speed.sh)."""
    tool = promserver.find_tool("promtool", promtool, "PROMTOOL")
    if not tool:
        raise TsdbReadError("promtool is not installed; run 'utils/prometheus.sh install'")
    with tempfile.TemporaryDirectory(prefix="jobkit-tsdb-") as scratch:
        try:
            where = link_view(tsdb, scratch)
        except OSError as e:  # a TSDB (or a part of it) this user may not list
            raise TsdbReadError(f"cannot read {e.filename or tsdb}: {(e.strerror or str(e)).lower()}") from None
        argv = [tool, "tsdb", "dump", f'--match={{__name__=~"{families}"}}']
        argv += [f"--min-time={int(min_time * 1000)}"] if min_time is not None else []
        argv += [f"--max-time={int(max_time * 1000)}"] if max_time is not None else []
        argv.append(where)
        try:
            with open(os.path.join(scratch, "stderr"), "w+") as err:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1 << 20)
                try:
                    data = parse(proc.stdout)
                    rc = proc.wait(timeout=TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise TsdbReadError(f"promtool tsdb dump of {tsdb} took more than {TIMEOUT_S}s") from None
                finally:
                    proc.stdout.close()
                err.seek(0)
                stderr = err.read()
        except OSError as e:
            raise TsdbReadError(f"could not run {tool}: {e.strerror}") from None
    if rc != 0:
        why = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), f"exit {rc}")
        raise TsdbReadError(f"promtool could not read {tsdb}: {why[:300]}")
    return data


def _link_dir(src: str, dst: str, recurse: bool = False) -> None:
    """DST as a real directory of symlinks to SRC's entries (subdirs linked whole, or mirrored with RECURSE).
    A TSDB lists its blocks and WAL checkpoints by directory entry and skips a symlinked dir there, while
    the files themselves are opened by path, through links."""
    os.mkdir(dst)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if recurse and os.path.isdir(path) and not os.path.islink(path):
            _link_dir(path, os.path.join(dst, name))
        else:
            os.symlink(path, os.path.join(dst, name))


def link_view(tsdb: str, scratch: str) -> str:
    """A private view of TSDB in SCRATCH for promtool: its blocks, WAL (and out-of-order WBL) and head chunks
    as dirs of links, and an empty wal/ when it has none (promtool 2.42 refuses a TSDB without one). promtool
    opens the TSDB read-only but still creates chunks_head/ in the dir it is given, and may repair (remove) a
    damaged last head-chunk file there: here that happens to the view, and the job dir stays as it was."""
    tsdb = os.path.abspath(tsdb)
    view = os.path.join(scratch, "tsdb")
    os.mkdir(view)
    for name in os.listdir(tsdb):
        path = os.path.join(tsdb, name)
        if os.path.isfile(os.path.join(path, "meta.json")):  # a block: immutable once written
            _link_dir(path, os.path.join(view, name))
        elif name in ("wal", "wbl", "chunks_head") and os.path.isdir(path):
            _link_dir(path, os.path.join(view, name), recurse=True)  # wal/checkpoint.N/ must be a real dir
    os.makedirs(os.path.join(view, "wal"), exist_ok=True)
    return view


def parse(lines) -> dict[str, list[Series]]:
    """The dump's lines (a text or an iterable of lines) as series; label sets are parsed once each (a dump
    repeats them on every sample)."""
    by_key: dict[str, Series] = {}
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        if not line.startswith("{"):
            continue
        try:
            key, value, ms = line.rsplit(" ", 2)
            point = (int(ms) / 1000.0, float(value))
        except ValueError:
            continue
        if not math.isfinite(point[1]):
            # NaN is a staleness marker (a target that went away: a node of a job that ended) or a value the
            # exporter could not compute; +-Inf are not a resource's level. None is a sample to average.
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
