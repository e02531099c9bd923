#!/usr/bin/env python3
"""Usage: bench/scale/table.py RESULTS.jsonl [BEFORE.jsonl]
Summary: The Scale table from measure.py's results: time and peak RSS per operation at each node count, the
growth order, and the model's prediction at 512 nodes x 24 h (1 s steps: 86,400 steps, ~10 GB of log)

For an operation over the job log the model is a straight line in the log's rank-lines (nodes x steps),
time = a + b*lines and RSS = c + d*lines, fitted by least squares to every measured point (the 4 node counts at
STEPS steps and the largest, 512 x BIG_STEPS); an operation that no longer grows (O(1) between the largest
node counts: it reads a big log at its ends) is predicted at its largest measured point. With BEFORE, each cell is
`before -> after`; so it is with one RESULTS file whose rows include measure.py's side-by-side ("side":
"before") rows. The limits (issue 24): 1 min and 2 GB on a login node, 1 % of a core per node for the watchdog.
"""

from __future__ import annotations

import json
import math
import sys

TARGET_NODES, TARGET_STEPS = 512, 86_400
LOG_OPS = ("verdict", "tgs", "why", "jobs", "analyze", "compare", "dashboard", "monitor poll (first)")
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
        rows = [r for r in results if r["op"] == op]
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
            if entry["order"] == "O(1)":  # read at its ends past logparse.BIG_LOG: the largest point holds
                top = max(rows, key=lambda r: r["nodes"] * r["steps"])
                entry["pred"] = (top["wall"], top["rss"])
        out[op] = entry
    return out


def main() -> int:
    rows = load(sys.argv[1])
    before_rows = [r for r in rows if r.get("side") == "before"]
    after = summarize([r for r in rows if r.get("side") != "before"])
    if len(sys.argv) > 2:
        before_rows = load(sys.argv[2])
    before = summarize(before_rows) if before_rows else None
    nodes = sorted({n for e in after.values() for n in e["cells"]})
    head = f"{'operation':<24}" + "".join(f"{str(n) + ' nodes':>30}" for n in nodes)
    print(head + f"{'512 x big steps':>30}{'order':>8}{'512 x 24 h (pred)':>34}")
    for op, e in after.items():
        unit = "ms" if op in ("watchdog look", "stacks collection") else "s"
        b = before.get(op) if before else None

        def both(now, then, unit=unit):
            text = cell(now, unit)
            return f"{cell(then, unit)} -> {text}" if before is not None else text

        cols = "".join(f"{both(e['cells'].get(n), b['cells'].get(n) if b else None):>30}" for n in nodes)
        big = both(e["big"], b["big"] if b else None) if e["big"] else "-"
        pred = "-"
        if e["pred"]:
            now = f"{e['pred'][0]:.0f}s {e['pred'][1]:.0f}MB"
            pred = f"{b['pred'][0]:.0f}s {b['pred'][1]:.0f}MB -> {now}" if b and b["pred"] else now
        if op == "watchdog look":
            top = e["cells"][max(e["cells"])]
            pred = f"{top['core_pct']:.3f}% of a core"
        if op == "stacks collection":
            top = e["cells"][max(e["cells"])]
            pred = f"{top['stack_bytes'] / 1e6:.0f} MB of stacks"
        print(f"{op:<24}{cols}{big:>30}{e['order']:>8}{pred:>34}")
    print(
        "cells: wall time and peak RSS of the command (watchdog look: CPU per look, 2 steps of every rank);"
        f" pred: a + b*(nodes x steps) fitted to the measured points, at {TARGET_NODES} x {TARGET_STEPS} steps"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
