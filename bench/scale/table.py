#!/usr/bin/env python3
"""Usage: bench/scale/table.py RESULTS.jsonl [BEFORE.jsonl]
Summary: The Scale table from measure.py's results: time and peak RSS per operation at each node count, the
growth order, and the model's prediction at 512 nodes x 24 h (1 s steps: 86,400 steps, ~10 GB of log)

For an operation over the job log the model is a straight line in the log's rank-lines (nodes x steps),
time = a + b*lines and RSS = c + d*lines, fitted by least squares to every measured point (the 4 node counts at
STEPS steps and the largest, 512 x BIG_STEPS); an operation that no longer grows (O(1) between the largest
node counts: it reads a big log at its ends) is predicted at its largest measured point. With BEFORE, each cell is
`before -> after`; so it is with one RESULTS file whose rows include measure.py's side-by-side ("side":
"before") rows. A row measured on a sparse 512 x 86,400-step log (measure.py --day-steps, "hole") replaces the
prediction with that measurement (marked *). The limits (issue 24): 1 min and 2 GB on a login node, 1 % of a core per node for the watchdog.
Rows of scrape.py (op "prometheus scrape", the live scrape) are printed after it, per scrape interval measured:
Prometheus CPU, RSS and scrape duration, TSDB and WAL bytes per hour at each node count, the model fitted to
them (scrape_model) and its prediction at 512 nodes x 24 h.
"""

from __future__ import annotations

import json
import math
import sys

TARGET_NODES, TARGET_STEPS = 512, 86_400
LOG_OPS = (
    "verdict",
    "tgs",
    "why",
    "jobs",
    "tag",
    "metrics-state",
    "analyze",
    "analyze (TSDB)",
    "compare",
    "dashboard",
    "monitor poll (first)",
)
MONITOR_READ_LIMIT = 64 << 20  # ops/monitor.READ_LIMIT: one poll reads at most this much new log


def load(path: str) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares a + b*x; b is kept >= 0 (noise on a flat line)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    b = max(b, 0.0)
    return my - b * mx, b


def order(rows: list[dict], key: str) -> str:
    """The growth exponent in nodes between the two largest node counts at the same steps."""
    same = sorted((r for r in rows if r["steps"] == rows[0]["steps"]), key=lambda r: r["nodes"])
    if len(same) < 2 or same[-2][key] <= 0 or same[-1][key] <= 0:
        return "-"
    k = math.log(same[-1][key] / same[-2][key]) / math.log(same[-1]["nodes"] / same[-2]["nodes"])
    return "O(1)" if k < 0.25 else "O(n)" if k < 1.25 else f"O(n^{k:.1f})"


def cell(row: dict | None, unit: str = "s") -> str:
    if row is None:
        return "-"
    if unit == "ms":
        return f"{row.get('cpu_ms', row['wall'] * 1000):.2f}ms"
    return f"{row['wall']:.2f}s {row['rss']:.0f}MB"


def summarize(results: list[dict]) -> dict[str, dict]:
    """op -> {'cells': {nodes: row}, 'big': row, 'pred': (wall, rss) or None, 'order': str}."""
    out: dict[str, dict] = {}
    ops = list(dict.fromkeys(r["op"] for r in results))
    for op in ops:
        rows = [r for r in results if r["op"] == op and not r.get("hole")]
        day = next((r for r in results if r["op"] == op and r.get("hole")), None)  # measure.py --day-steps
        if not rows:
            continue
        small = min(r["steps"] for r in rows)
        cells = {r["nodes"]: r for r in rows if r["steps"] == small}
        big = next((r for r in rows if r["steps"] > small), None)
        key = "cpu_ms" if op == "watchdog look" else "wall"
        entry = {"cells": cells, "big": big, "order": order(rows, key), "pred": None}
        if op in LOG_OPS:
            pts = [(r["nodes"] * r["steps"], r) for r in rows]
            a, b = fit([(x, r["wall"]) for x, r in pts])
            c, d = fit([(x, r["rss"]) for x, r in pts])
            target = TARGET_NODES * TARGET_STEPS
            if op == "monitor poll (first)":  # one poll reads at most READ_LIMIT: the prediction is that poll
                per_line = max(r.get("log_bytes", 0) / max(r["nodes"] * r["steps"], 1) for _, r in pts) or 240
                target = min(target, MONITOR_READ_LIMIT / per_line)
            entry["pred"] = (a + b * target, c + d * target)
            if op == TSDB_OP and len(rows) >= 3 and all(r.get("step_s") for r in rows):  # PromQL's rows
                entry["pred"] = tsdb_predict(rows)
            same = cells.get(big["nodes"]) if big else None
            flat_in_steps = big is None or same is None or big["wall"] <= 2 * same["wall"]  # not noise in nodes
            if entry["order"] == "O(1)" and flat_in_steps:  # read at its ends past BIG_LOG: the largest point holds
                top = max(rows, key=lambda r: r["nodes"] * r["steps"])
                entry["pred"] = (top["wall"], top["rss"])
            if day is not None and (day["nodes"], day["steps"]) == (TARGET_NODES, TARGET_STEPS):
                entry["pred"] = (day["wall"], day["rss"])  # measured on a sparse 24 h log: no model needed
                entry["measured"] = True
        out[op] = entry
    return out


TSDB_OP = "analyze (TSDB)"


def _solve3(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares y = a + b*x1 + c*x2 over (x1, x2, y) rows (normal equations, Cramer's rule); b, c >= 0."""
    n = len(rows)
    s1, s2, sy = (sum(r[i] for r in rows) for i in range(3))
    s11 = sum(r[0] * r[0] for r in rows)
    s22 = sum(r[1] * r[1] for r in rows)
    s12 = sum(r[0] * r[1] for r in rows)
    s1y = sum(r[0] * r[2] for r in rows)
    s2y = sum(r[1] * r[2] for r in rows)
    m = [[n, s1, s2], [s1, s11, s12], [s2, s12, s22]]
    v = [sy, s1y, s2y]

    def det(a):
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(m)
    if not d:
        return sy / n, 0.0, 0.0
    a, b, c = (det([[v[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]) / d for k in range(3))
    return a, max(b, 0.0), max(c, 0.0)


TARGET_INTERVAL_S = 15  # utils/lib/prometheus.sh prometheus_scrape_interval 512: the job's scrape interval
MAX_POINTS, MIN_POINTS = 1500, 100  # jobkit.analysis.tsdb_query: points a host line may have


def tsdb_target(rows: list[dict]) -> tuple[float, float]:
    """(points handed to Python, samples Prometheus decodes) at 512 nodes x 24 h scraped every 15 s.
    Samples: samples per node per scrape from the rows (each row's interval_s, 5 s when it has none) times
    512 x 86,400 s / 15 s. Points: the lines (series per node of the longest row, x 512) times what a line gets:
    its scrapes up to MAX_POINTS, and with the rows' point budget (point_budget; 0: none) an equal share of it,
    never under MIN_POINTS."""
    scrapes = sum(r["nodes"] * r["steps"] / r.get("interval_s", 5) for r in rows)
    per_node_scrape = sum(r["samples"] for r in rows) / scrapes
    samples = per_node_scrape * TARGET_NODES * TARGET_STEPS / TARGET_INTERVAL_S
    longest = max(rows, key=lambda r: (r["steps"], -r["nodes"]))
    lines = longest["series_out"] / longest["nodes"] * TARGET_NODES
    per_line = min(MAX_POINTS, TARGET_STEPS // TARGET_INTERVAL_S)
    budget = max(r.get("point_budget", 0) for r in rows)
    if budget:
        per_line = min(per_line, max(MIN_POINTS, budget // lines))
    return lines * per_line, samples


def tsdb_predict(rows: list[dict]) -> tuple[float, float]:
    """analyze's TSDB part at 512 nodes x 24 h (tsdb_target): time = a + b*points handed to Python + c*samples
    in the TSDB (Prometheus decodes every sample; Python gets at most a line's share of points per host line),
    RSS = c + d*points (the lines Python holds and the JSON they come in), fitted to the rows."""
    points, samples = tsdb_target(rows)
    a, b, c = _solve3([(r["points_out"], r["samples"], r["wall"]) for r in rows])
    wall = a + b * points + c * samples
    c, d = fit([(r["points_out"], r["rss"]) for r in rows])  # memory: the lines Python holds
    return wall, c + d * points


SCRAPE_OP = "prometheus scrape"
CHUNK_OVERHEAD_B = 25 / 120  # per sample: a chunk's header, first timestamp and value, CRC over its 120 samples


def scrape_model(rows: list[dict]) -> dict:
    """The live scrape's model, fitted to scrape.py's rows at one interval: Prometheus CPU = a + b*samples/s,
    RSS = c + d*series, TSDB bytes/h = samples/h * B/sample + series * index B/series / 2 (one index per 2 h
    block), WAL bytes/h = e * samples/s; B/sample and index B/series are the means over the rows."""
    a, b = fit([(r["samples_per_s"], r["cpu_per_s"]) for r in rows])
    c, d = fit([(r["series"], r["rss_mb"]) for r in rows])
    _, e = fit([(r["samples_per_s"], r["wal_bytes_per_h"]) for r in rows] + [(0.0, 0.0)])
    per_sample = sum(r["chunk_b_per_sample"] for r in rows) / len(rows)
    per_series = sum(r["index_b_per_series"] for r in rows) / len(rows)
    return {"cpu": (a, b), "rss": (c, d), "wal": e, "b_per_sample": per_sample, "idx_per_series": per_series}


def scrape_predict(model: dict, series: float, samples_per_s: float) -> dict:
    a, b = model["cpu"]
    c, d = model["rss"]
    tsdb_h = samples_per_s * 3600 * model["b_per_sample"] + series * model["idx_per_series"] / 2
    return {
        "cpu": a + b * samples_per_s,
        "rss": c + d * series,
        "tsdb_h": tsdb_h,
        "wal_h": model["wal"] * samples_per_s,
    }


def seconds(every: str) -> float:
    return float(every.removesuffix("s"))


def scrape_table(rows: list[dict]) -> None:
    """Prometheus scrape and TSDB size/h at each node count, per group of rows (a fixed interval, or the
    interval by node count), and each group's prediction at 512 nodes x 24 h from the model fitted to all rows."""
    model = scrape_model(rows)
    _, per_node = fit([(r["nodes"], r["series"]) for r in rows])
    s0, _ = fit([(r["nodes"], r["series"]) for r in rows])
    r0, per_target_s = fit([(r["nodes"] / seconds(r["interval"]), r["samples_per_s"]) for r in rows])
    for rule in dict.fromkeys(r.get("rule", r["interval"]) for r in rows):
        at = sorted((r for r in rows if r.get("rule", r["interval"]) == rule), key=lambda r: r["nodes"])
        every = at[-1]["interval"]  # the interval at the group's largest node count (512 when it was measured)
        series = s0 + per_node * TARGET_NODES
        rate = r0 + per_target_s * TARGET_NODES / seconds(every)
        pred = scrape_predict(model, series, rate)
        title = "every " + every if rule != "auto" else "by node count"
        print(
            f"{'scrape ' + title:<24}"
            + "".join(f"{str(r['nodes']) + ' nodes, ' + r['interval']:>30}" for r in at)
            + f"{'512 x 24 h (pred, ' + every + ')':>34}"
        )
        cells = [
            f"{r['cpu_per_s'] * 100:.1f}% {r['rss_mb']:.0f}MB {r['scrape_avg_s'] * 1000:.0f}/{r['scrape_max_s'] * 1000:.0f}ms"
            for r in at
        ]
        print(
            f"{'Prometheus scrape':<24}"
            + "".join(f"{c:>30}" for c in cells)
            + f"{pred['cpu'] * 100:.1f}% {pred['rss']:.0f}MB".rjust(34)
        )
        cells = [f"{r['tsdb_bytes_per_h'] / 1e6:.0f}MB +WAL {r['wal_bytes_per_h'] / 1e6:.0f}MB" for r in at]
        day = pred["tsdb_h"] * 24 / 1e9
        print(
            f"{'TSDB size/h':<24}"
            + "".join(f"{c:>30}" for c in cells)
            + f"{pred['tsdb_h'] / 1e6:.0f}MB +WAL {pred['wal_h'] / 1e6:.0f}MB, {day:.1f}GB/24h".rjust(34)
        )
        cells = [
            f"{r['samples_per_s'] / 1e3:.1f}k/s {r['series'] / 1e3:.0f}k ld{r['load'][0]:.1f}-{r['load'][1]:.1f}"
            for r in at
        ]
        print(
            f"{'samples/s, series, load':<24}"
            + "".join(f"{c:>30}" for c in cells)
            + f"{rate / 1e3:.1f}k/s {series / 1e3:.0f}k".rjust(34)
        )
    print(
        f"model (all rows): CPU = {model['cpu'][0] * 100:.2f}% + {model['cpu'][1] * 1e6:.1f} us/sample;"
        f" RSS = {model['rss'][0]:.0f} MB + {model['rss'][1] * 1e3:.2f} KB/series; TSDB = {model['b_per_sample']:.2f}"
        f" B/sample + {model['idx_per_series']:.0f} B/series per 2 h block; WAL = {model['wal'] / 3600:.1f} B/sample"
        f" (holds the last ~2-3 h); {per_node:.0f} series per node"
    )
    print(
        "cells: Prometheus CPU (% of one core) and RSS, scrape duration avg/max; TSDB: compacted bytes/h (chunks +"
        " index) and WAL bytes/h; load: 1-min load average at the window's start-end"
    )


def main() -> int:
    every = load(sys.argv[1])
    scrape = [r for r in every if r.get("op") == SCRAPE_OP]
    rows = [r for r in every if r.get("op") != SCRAPE_OP]
    before_rows = [r for r in rows if r.get("side") == "before"]
    after = summarize([r for r in rows if r.get("side") != "before"])
    if len(sys.argv) > 2:
        before_rows = [r for r in load(sys.argv[2]) if r.get("op") != SCRAPE_OP]
    before = summarize(before_rows) if before_rows else None
    if not after:
        scrape_table(scrape)
        return 0
    nodes = sorted({n for e in after.values() for n in e["cells"]})
    head = f"{'operation':<24}" + "".join(f"{str(n) + ' nodes':>30}" for n in nodes)
    print(head + f"{'512 x big steps':>30}{'order':>8}{'512 x 24 h (pred)':>34}")
    for op, e in after.items():
        unit = "ms" if op in ("watchdog look", "stacks collection", "monitor poll (steady)") else "s"
        b = before.get(op) if before else None

        def both(now, then, unit=unit):
            text = cell(now, unit)
            return f"{cell(then, unit)} -> {text}" if before is not None else text

        cols = "".join(f"{both(e['cells'].get(n), b['cells'].get(n) if b else None):>30}" for n in nodes)
        big = both(e["big"], b["big"] if b else None) if e["big"] else "-"
        if e["big"] and e["big"]["nodes"] != TARGET_NODES:  # another shape (analyze (TSDB): 8 nodes x 24 h)
            big = f"{e['big']['nodes']}x{e['big']['steps']}: {big}"
        pred = "-"
        if e["pred"]:
            now = f"{e['pred'][0]:.0f}s {e['pred'][1]:.0f}MB" + ("*" if e.get("measured") else "")
            pred = f"{b['pred'][0]:.0f}s {b['pred'][1]:.0f}MB -> {now}" if b and b["pred"] else now
        if op == "watchdog look":
            top = e["cells"][max(e["cells"])]
            pred = f"{top['core_pct']:.3f}% of a core"
        if op == "stacks collection":
            top = e["cells"][max(e["cells"])]
            pred = f"{top['stack_bytes'] / 1e6:.0f} MB of stacks"
        print(f"{op:<24}{cols}{big:>30}{e['order']:>8}{pred:>34}")
    print(
        "cells: wall time and peak RSS of the command (watchdog look: CPU per look, 2 steps of every rank; monitor"
        " poll (steady): CPU of a poll, once caught up, over one more step of every rank);"
        f" pred: a + b*(nodes x steps) fitted to the measured points, at {TARGET_NODES} x {TARGET_STEPS} steps"
    )
    if any(e.get("measured") for e in after.values()):
        print("*: measured on a 512 x 86400-step log with a sparse middle (measure.py --day-steps), not predicted")
    if scrape:
        print()
        scrape_table(scrape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
