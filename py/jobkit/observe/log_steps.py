"""Steps the job log shows that the TensorBoard files lack, as backfill series.

MaxText's writer flushes its event file every `log_period` steps (and the writer's own timer), so a job that is
killed (scancel past KillWait, a time limit, a hang stopped with KILL) loses the steps since the last flush from
its event file, while its log has every one: rank 0's `completed step` lines carry the step's loss, time and
throughput, and absl's line prefix carries when it was printed. Those lines fill the gap, under the metric names
the TensorBoard bridge gives the same tags (jobkit.observe.tb_events.metric_name).
"""

from __future__ import annotations

import os
import re
import time

from jobkit.core.logparse import NUMBER, STEP_FIELDS
from jobkit.observe.tb_events import STEP_METRIC, metric_name

# absl's prefix: I1124 05:31:12.123456 <thread> file.py:123] ... (local time, no year), after srun -l's "N: "
# (the node) and, with several processes per node, the process's "[rank<G>]: " (its global rank).
_LINE = re.compile(
    r"^(?:\s*(?P<rank>\d+): )?(?:\[rank(?P<process>\d+)\]: )?[IWEF](?P<mon>\d\d)(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)\.(?P<us>\d{6}) "
    r".*?completed step: (?P<step>\d+),(?P<rest>.*)$"
)
# TensorBoard tag -> the step line's field holding the same value (logparse reads the common ones).
FIELDS = {
    "learning/loss": STEP_FIELDS["loss"],
    "learning/lm_loss": re.compile(rf"\blm_loss: {NUMBER}"),
    "learning/perplexity": re.compile(rf"\bperplexity: {NUMBER}"),
    "learning/total_weights": re.compile(rf"\btotal_weights: {NUMBER}"),
    "perf/step_time_seconds": STEP_FIELDS["seconds"],
    "perf/per_device_tflops_per_sec": STEP_FIELDS["tflops"],
    "perf/per_device_tokens_per_sec": STEP_FIELDS["tgs"],
}


def _epoch_ms(match: re.Match, year: int) -> int:
    parts = (year, int(match["mon"]), int(match["day"]), int(match["h"]), int(match["m"]), int(match["s"]), 0, 0, -1)
    return int(time.mktime(parts) * 1000) + int(match["us"]) // 1000


def series_after(
    log_path: str, after_step: int | None, after_by_metric: dict[str, int] | None = None
) -> dict[str, tuple[str | None, list[tuple[int, float]]]]:
    """{metric name: (tag, [(ms, value), ...])} for rank 0's steps above AFTER_STEP (all when None).

    AFTER_BY_METRIC raises or lowers that bound per metric: an event file cut in the middle of a step (the
    writer flushed some of its scalars, not all) has that step's tb_step but maybe not its loss, so each metric
    is filled from the log after its own last step in the event files."""
    bounds = after_by_metric or {}
    try:
        mtime = os.stat(log_path).st_mtime
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            return _series(fh, mtime, after_step, bounds)
    except OSError:
        return {}


def _series(lines, mtime: float, after_step: int | None, bounds: dict[str, int]) -> dict:
    """series_after over LINES (streamed: a log's lines are every rank's, only rank 0's are kept)."""
    year = time.localtime(mtime).tm_year
    found: dict[str, dict[int, float]] = {}
    seen: set[int] = set()
    for line in lines:
        m = _LINE.match(line)
        if m is None or m["rank"] not in (None, "0") or m["process"] not in (None, "0"):
            continue
        step = int(m["step"])
        if step in seen:
            continue
        seen.add(step)
        ms = _epoch_ms(m, year)
        if ms / 1000 > mtime + 86400:  # a line from December in a log last written in January
            ms = _epoch_ms(m, year - 1)
        if after_step is None or step > after_step:
            found.setdefault(STEP_METRIC, {})[ms] = float(step)
        for tag, pattern in FIELDS.items():
            name = metric_name(tag)
            bound = bounds.get(name, after_step)
            if bound is not None and step <= bound:
                continue
            value = pattern.search(m["rest"])
            if value:
                found.setdefault(name, {})[ms] = float(value.group(1))
    tags = {metric_name(tag): tag for tag in FIELDS}
    return {name: (tags.get(name), sorted(points.items())) for name, points in found.items()}


def merge(series: dict, extra: dict) -> dict:
    """SERIES with EXTRA's points added (a point already there for the same ms is kept)."""
    out = dict(series)
    for name, (tag, points) in extra.items():
        old_tag, old = out.get(name, (tag, []))
        by_ms = dict(points)
        by_ms.update(dict(old))
        out[name] = (old_tag or tag, sorted(by_ms.items()))
    return out
