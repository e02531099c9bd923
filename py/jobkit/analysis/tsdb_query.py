"""A job's TSDB, read through PromQL: a throwaway Prometheus over a scratch view, per-host lines downsampled.

Why: `promtool tsdb dump` (jobkit.observe.tsdb_dump) prints every sample of every series as text for Python
to parse, ~3 us a sample: 1.8 M samples for 8 nodes x 1 h, ~4 G for 512 nodes x 24 h. The analysis only ever
uses per-host lines (a host's devices combined) and the error counters that rose, so Prometheus is asked for
exactly those, at a step that keeps each line to at most MAX_POINTS points:

- gauges: `<combine> by (host) (avg_over_time(m[step]))`, combine being the resource's sum/avg across a
  host's devices; the hottest-device resources take `max by (host) (max_over_time(m[step]))` so a peak stays;
- counters: `sum by (host) (rate(m[step + interval]))` (the window holds two scrapes even at the finest step),
  handed back as a counter rebuilt from those rates, so the analysis's own rate() gives them back unchanged;
- error counters: `changes(m[whole run]) > 0` finds the series that moved (an instant query per family), and
  only those are fetched, as `last_over_time(m[step])`: their increase is exact unless a reset falls inside
  one step, and their first rise is known to within one step.

What Python holds is bounded whatever the node count: POINT_BUDGET points over every host line of every query
(hosts x queries lines), so a line gets an equal share, at most MAX_POINTS and never under MIN_POINTS (8 nodes:
1,500; 512 nodes: ~160, a 24 h line's step ~9 min). Each answer is turned into (time, value) tuples in the
worker that fetched it, so at most one parsed JSON answer (~200 B a point) per worker is alive at a time.
Each resource's step is its families' scrape interval (the median gap between one host's raw samples in the
last 10 minutes: the exporter's and Ray's differ) while the run has at most that share of them, else the run's
span / that share rounded up to whole seconds, on a grid that ends at the last sample: a mean is the same, a
min/max is that of step-long means, a "last" the last step's mean. The view is tsdb_dump's (dirs of links, so a file Prometheus adds, renames or removes is the
view's and the job's TSDB is never written); Prometheus (jobkit.observe.promserver) listens on 127.0.0.1 at a
kernel-chosen port behind a random password (private=True), may not compact blocks (min = max block duration),
and is stopped by PID; the scratch dir goes with it. Any failure raises QueryError, and the caller falls back
to the dump.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from jobkit.analysis import hosts
from jobkit.observe import promserver, tsdb_dump
from jobkit.observe.tsdb_dump import Series

MAX_POINTS = 1500  # per host line, whatever the budget
MIN_POINTS = 100  # per host line: under ~100 points a day's line no longer shows a stall's shape
POINT_BUDGET = 1_000_000  # over all host lines x resources: what Python holds (~110 B a point) stays ~0.1 GB
QUERY_TIMEOUT_S = 300
_AGG = {"sum": "sum", "mean": "avg", "max": "max"}


class QueryError(Exception):
    """One line: why the TSDB could not be read through Prometheus (the caller then dumps it)."""


def read(tsdb: str, prometheus: str | None = None) -> tuple[dict[str, list[Series]], int]:
    """({metric name: [Series per host (or per error-counter series)]}, step in seconds) for the analysis's
    families (hosts.RESOURCES and hosts.ERROR_COUNTERS). Raises QueryError."""
    try:
        binary = promserver.find_binary(prometheus)
    except promserver.PromServerError as e:
        raise QueryError(str(e)) from None
    if not binary:
        raise QueryError("prometheus is not installed")
    with tempfile.TemporaryDirectory(prefix="jobkit-promql-") as scratch:
        try:
            view = tsdb_dump.link_view(tsdb, scratch)
        except OSError as e:
            raise QueryError(f"cannot read {e.filename or tsdb}: {(e.strerror or str(e)).lower()}") from None
        try:
            server = promserver.start(
                view,
                binary,
                private=True,
                extra_args=[
                    "--storage.tsdb.min-block-duration=2h",
                    "--storage.tsdb.max-block-duration=2h",  # no block compaction in the view
                    "--query.max-samples=200000000",
                    "--log.level=error",
                ],
            )
        except promserver.PromServerError as e:
            raise QueryError(str(e)) from None
        try:
            return _read(_Client(server), view)
        finally:
            server.stop()


class _Client:
    def __init__(self, server):
        self.server = server

    def get(self, path: str, **params) -> dict | list:
        post = path.endswith(("/query", "/query_range"))  # a form: a long selector can pass a URL's length
        query = "" if post or not params else "?" + urllib.parse.urlencode(params)
        request = self.server.request(path + query, method="POST" if post else "GET")
        if post:
            request.data = urllib.parse.urlencode(params).encode()
            request.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(request, timeout=QUERY_TIMEOUT_S) as resp:
                doc = json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                why = json.load(e).get("error", e.reason)
            except ValueError:
                why = e.reason
            raise QueryError(f"Prometheus refused {params.get('query', path)!r}: {why}") from None
        except (OSError, ValueError) as e:
            raise QueryError(f"Prometheus did not answer {path}: {e}") from None
        if doc.get("status") != "success":
            raise QueryError(f"Prometheus answered {path} with {doc.get('error')}")
        return doc["data"]


def _span(client: _Client, view: str) -> tuple[float, float] | None:
    """(first, last) sample time in seconds over the view's blocks and the head (the WAL's samples)."""
    lows, highs = [], []
    for name in os.listdir(view):
        meta = os.path.join(view, name, "meta.json")
        if os.path.isfile(meta):
            try:
                with open(meta) as f:
                    doc = json.load(f)
                lows.append(int(doc["minTime"]))
                highs.append(int(doc["maxTime"]) - 1)  # a block's maxTime is exclusive
            except (OSError, ValueError, KeyError, TypeError):
                continue
    head = client.get("/api/v1/status/tsdb").get("headStats", {})
    if head.get("numSeries") and head.get("minTime", 0) <= head.get("maxTime", -1):
        lows.append(int(head["minTime"]))
        highs.append(int(head["maxTime"]))
    return (min(lows) / 1000.0, max(highs) / 1000.0) if lows else None


def _families() -> list[str]:
    return sorted({m for r in hosts.RESOURCES for m in (*r.metrics, *(r.ratio_of or ()))})


def _intervals(client: _Client, end: float, span: float) -> dict[str, float]:
    """{family: its scrape interval}, the median gap between the raw samples of one host's series of it in
    the run's last 10 minutes (the exporter's and Ray's families are scraped at different intervals)."""
    window = max(1, min(600, math.ceil(span) + 1))
    names = client.get("/api/v1/label/host/values", start=end - window, end=end)
    host = f',host="{_escape(names[0])}"' if names else ""
    out = {}
    for name in _families():
        result = client.get("/api/v1/query", query=f'{{__name__="{name}"{host}}}[{window}s]', time=end)["result"]
        gaps = sorted(
            float(t1) - float(t0)
            for item in result
            for (t0, _), (t1, _) in zip(item["values"], item["values"][1:], strict=False)
        )
        if gaps:
            out[name] = gaps[len(gaps) // 2]
    return out


def points_per_line(lines: int) -> int:
    """Points one host line may have when the analysis asks for LINES of them (hosts x queries): an equal
    share of POINT_BUDGET, between MIN_POINTS and MAX_POINTS."""
    return max(MIN_POINTS, min(MAX_POINTS, POINT_BUDGET // max(1, lines)))


def step_for(span: float, interval: float, points: int = MAX_POINTS) -> int:
    """Whole seconds: the scrape interval while the run has at most POINTS scrapes, else span / POINTS."""
    return max(1, math.ceil(interval - 0.05), math.ceil(span / points))  # 50 ms: a scrape's jitter


def _points(values) -> list[tuple[float, float]]:
    out = []
    for t, v in values:
        value = float(v)
        if math.isfinite(value):
            out.append((float(t), value))
    return out


def _read(client: _Client, view: str) -> tuple[dict[str, list[Series]], int]:
    span = _span(client, view)
    if span is None:
        return {}, 0
    start, end = span
    intervals = _intervals(client, end, end - start)
    if not intervals:  # no family sampled twice: too little for lines, nothing to downsample
        raise QueryError("the TSDB has no host series sampled twice in its last 10 minutes to find the scrape interval")
    coarsest = max(intervals.values())
    # The budget is shared by every host line of every query (the hosts of the whole run, not only its end).
    n_hosts = len(client.get("/api/v1/label/host/values", start=start, end=end)) or 1
    n_queries = sum(len(res.metrics) + len(res.ratio_of or ()) for res in hosts.RESOURCES)
    per_line = points_per_line(n_hosts * n_queries)
    queries = []  # (metric name, PromQL, counter?, step)
    for res in hosts.RESOURCES:
        # One step per resource (its families come from one source, so their points share timestamps).
        found = [intervals[m] for m in (*res.metrics, *(res.ratio_of or ())) if m in intervals]
        interval = max(found) if found else coarsest
        step = step_for(end - start, interval, per_line)
        window = step + math.ceil(interval)
        for name in res.metrics:
            if res.counter:
                queries.append((name, f'sum by (host) (rate({{__name__="{name}"}}[{window}s]))', True, step))
            elif res.combine == "max":
                queries.append((name, f'max by (host) (max_over_time({{__name__="{name}"}}[{step}s]))', False, step))
            else:
                agg = _AGG[res.combine]
                query = f'{agg} by (host) (avg_over_time({{__name__="{name}"}}[{step}s]))'
                queries.append((name, query, False, step))
        for name in res.ratio_of or ():
            query = f'sum by (host) (avg_over_time({{__name__="{name}"}}[{step}s]))'
            queries.append((name, query, False, step))
    step = max(q[3] for q in queries)

    def ranged(query: str, every: int) -> list[dict]:
        first = end - every * math.floor((end - start) / every)  # the grid ends on the last sample
        return client.get("/api/v1/query_range", query=query, start=first, end=end, step=every)["result"]

    def lines(query: tuple[str, str, bool, int]) -> list[Series]:
        # Each answer becomes compact (time, value) tuples in the worker, so at most one parsed JSON answer
        # per worker is alive at a time (~200 B a point, twice the tuples' size).
        name, promql, counter, every = query
        out = []
        for item in ranged(promql, every):
            points = _points(item["values"])
            if counter:
                points = _rebuilt_counter(points)
            if points:
                out.append(Series(name, dict(item["metric"]), points))
        return out

    data: dict[str, list[Series]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for (name, *_), series in zip(queries, pool.map(lines, queries), strict=True):
            if series:
                data.setdefault(name, []).extend(series)
        finest = step_for(end - start, min(intervals.values()), per_line)
        data.update(_error_counters(client, pool, start, end, finest))
    return data, step


def _rebuilt_counter(rates: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A counter whose increase between points is each point's rate times the time since the previous one: the
    analysis's rate() turns it back into RATES (the first point, as a first sample, has none)."""
    out, total, last = [], 0.0, None
    for t, r in rates:
        if last is not None:
            total += r * (t - last)
        out.append((t, total))
        last = t
    return out


def _error_counters(client: _Client, pool, start: float, end: float, step: int) -> dict[str, list[Series]]:
    pattern = hosts.ERROR_COUNTERS.pattern.strip("^$")
    names = client.get("/api/v1/label/__name__/values", **{"match[]": f'{{__name__=~"{pattern}"}}'})
    names = [n for n in names if hosts.ERROR_COUNTERS.match(n)]
    whole = max(1, math.ceil(end - start) + step)

    def moved(name: str) -> list[dict]:
        query = f'changes({{__name__="{name}"}}[{whole}s]) > 0'
        return client.get("/api/v1/query", query=query, time=end)["result"]

    wanted = []
    for name, result in zip(names, pool.map(moved, names), strict=True):
        for item in result:
            labels = {k: v for k, v in item["metric"].items() if k != "__name__"}
            matchers = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            wanted.append((name, labels, f'last_over_time({{__name__="{name}",{matchers}}}[{step}s])'))

    def ranged(query: str) -> list[dict]:
        first = end - step * math.floor((end - start) / step)
        return client.get("/api/v1/query_range", query=query, start=first, end=end, step=step)["result"]

    out: dict[str, list[Series]] = {}
    for (name, labels, _), result in zip(wanted, pool.map(lambda w: ranged(w[2]), wanted), strict=True):
        points = [p for item in result for p in _points(item["values"])]
        if points:
            out.setdefault(name, []).append(Series(name, labels, sorted(points)))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
