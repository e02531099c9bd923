"""Throughput (TGS = tokens/s/device) statistics over step windows of a job log.

Windows: warmup = steps before the steady window, steady = the window (5..14
by default) minus any profiler steps, tail = steps after it, all = every step.
The window counts from the run's first logged step. A resumed attempt (a requeued
job restored from a checkpoint: its first step is not 0) compiles and restores at
its first steps and may take longer to settle than a fresh run: its window also
moves past the steps still slow after the restore (`settle`, at most one window
length), so its number compares with the first attempt's.
Per step, values from several nodes (several processes, one per device, with LOCAL_WORLD_SIZE > 1) are averaged
first; the stats are the mean
and population std over steps. A step whose value is not finite (MaxText logs
`inf` when a step's time rounds to zero, `nan` after a bad step) is left out of
the stats and counted instead: every output says how many there were.
"""

import math
import statistics
from dataclasses import dataclass, field

from jobkit.core.config import load_yaml_keys, parse_overrides
from jobkit.core.logparse import JobLog, StepEntry, StepFold, fold

DEFAULT_STEADY = (5, 14)
METRICS = ("tgs", "tflops", "mfu", "seconds")
LOW_SAMPLE_FRACTION = 0.95  # a steady step this far below the mean is worth a warning
# A resumed attempt is still warming up while the median TGS of the next SETTLE_RUN steps is below
# SETTLE_FRACTION of its settle horizon's median (a median of 3 lets one noisy step on a shared host pass).
SETTLE_FRACTION = 0.8
SETTLE_RUN = 3
# MaxText base.yml defaults for the profiler window.
PROFILER_DEFAULT_SKIP = 1
PROFILER_DEFAULT_STEPS = 5


@dataclass(frozen=True)
class Stat:
    n: int
    mean: float
    std: float  # population standard deviation ("spread")


METRIC_NAMES = {"tgs": "Tokens/s/device", "tflops": "TFLOP/s/device", "mfu": "MFU", "seconds": "seconds"}


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def stat(values) -> Stat | None:
    """Mean and spread of the finite values; None when there is none."""
    vals = [v for v in values if finite(v)]
    if not vals:
        return None
    return Stat(len(vals), statistics.fmean(vals), statistics.pstdev(vals))


@dataclass(frozen=True)
class StepPoint:
    """One logical step: metrics averaged over the entries (the lines: one per node, or per process) that logged it."""

    step: int
    entries: int
    tgs: float | None
    tflops: float | None
    mfu: float | None
    seconds: float | None
    loss: float | None  # the mean of the lines' losses
    loss_spread: float | None = None  # max - min of the lines' losses (None: no line had one)


def step_points(folds: dict[int, StepFold]) -> list[StepPoint]:
    """The steps (sorted), each with its lines' values averaged."""
    return [
        StepPoint(step, f.lines, *(f.mean(name) for name in METRICS), f.mean("loss"), f.loss_spread)
        for step, f in sorted(folds.items())
    ]


def per_step(entries: list[StepEntry]) -> list[StepPoint]:
    """Group entries by step (sorted) and average across nodes."""
    return step_points(fold(entries))


def points_of(log: JobLog) -> list[StepPoint]:
    """The log's steps, averaged over their lines."""
    return step_points(log.step_folds())


def steps_needed(steady: tuple[int, int] = DEFAULT_STEADY) -> int:
    """How many steps past the first logged one the steady window can reach: its end, plus the settle horizon
    of a resumed attempt (the window moves at most one window length). What logparse.load(first_steps=) of a
    reader of the steady mean and the end (the end-of-run line, `jobs`, the dashboard) reads of a big log."""
    a, b = steady
    return b + 2 * (b - a + 1)


def parse_steady(spec: str) -> tuple[int, int]:
    """`5:14` -> (5, 14), inclusive; ValueError on anything else."""
    first, sep, last = spec.partition(":")
    if not sep:
        raise ValueError(f"steady window {spec!r} is not FIRST:LAST")
    a, b = int(first), int(last)
    if a < 0 or b < a:
        raise ValueError(f"steady window {spec!r} needs 0 <= FIRST <= LAST")
    return a, b


def _int(value, default: int) -> int:
    try:
        return int(str(value).strip().strip("'\""))
    except (TypeError, ValueError):
        return default


def profiler_window(log: JobLog, yml_path: str | None = None) -> tuple[int, int] | None:
    """Steps S..S+P disturbed by a profiler, or None when no profiler ran.

    Measured on a real CPU run (S=5, P=3): step S pays the trace start and step
    S+P (the stop/dump) is the slow one. Values come from, last wins: the yml,
    the PASSTHROUGH_ARGS header, MaxText's own `Config param` lines.
    """
    keys = ("profiler", "skip_first_n_steps_for_profiler", "profiler_steps")
    merged = {k: v for k, v in load_yaml_keys(yml_path).items() if k in keys}
    merged.update({k: v for k, v in parse_overrides(log.passthrough_args()).items() if k in keys})
    merged.update({k: v for k, v in log.config_params.items() if k in keys})
    profiler = str(merged.get("profiler") or "").strip().strip("'\"")
    if not profiler:
        return None
    skip = _int(merged.get("skip_first_n_steps_for_profiler"), PROFILER_DEFAULT_SKIP)
    steps = _int(merged.get("profiler_steps"), PROFILER_DEFAULT_STEPS)
    return (skip, skip + steps) if steps > 0 else None


def settle(values: list[tuple[int, float | None]], start: int, length: int) -> tuple[int, bool]:
    """Where a resumed attempt's steady window of LENGTH steps starts: START, or later while it is still warming up.

    VALUES are (step, TGS) pairs (the profiler's steps left out). The horizon is the steps START to
    START + 2*LENGTH - 1; the upper quartile of their TGS is the attempt's settled level (the fast end: neither
    the restore's slow steps nor a burst of load on a shared host, up to 3/4 of the horizon, can pull it down).
    The window starts at the first step that reaches SETTLE_FRACTION of it and so does the median of the
    SETTLE_RUN steps from it (one fast step among the restore's slow ones does not end the warm-up), moving at
    most LENGTH steps.
    Returns (step, settled): settled is False when the attempt was still slow LENGTH steps past START. The
    monitor calls this with the steps it has seen so far, `summarize` with the whole log: the same rule."""
    horizon = [(step, v) for step, v in values if start <= step < start + 2 * length and finite(v)]
    if len(horizon) < SETTLE_RUN:
        return start, True
    floor = SETTLE_FRACTION * statistics.quantiles([v for _, v in horizon], n=4)[2]
    for i, (step, value) in enumerate(horizon):
        if step >= start + length:
            return start + length, False
        if value >= floor and statistics.median(v for _, v in horizon[i : i + SETTLE_RUN]) >= floor:
            return step, True
    return start, True  # too few steps past START to tell: the window stays where it was


@dataclass
class Window:
    name: str
    points: list[StepPoint]

    @property
    def steps(self) -> list[int]:
        return [p.step for p in self.points]

    @property
    def span(self) -> tuple[int, int] | None:
        return (self.points[0].step, self.points[-1].step) if self.points else None

    def stats(self, metric: str) -> Stat | None:
        return stat(getattr(p, metric) for p in self.points)

    def nonfinite(self, metric: str) -> list[StepPoint]:
        """The steps whose value of `metric` is inf or nan (left out of stats())."""
        return [p for p in self.points if getattr(p, metric) is not None and not math.isfinite(getattr(p, metric))]


@dataclass
class Summary:
    log: JobLog
    points: list[StepPoint]
    steady_range: tuple[int, int]
    excluded: tuple[int, int] | None
    windows: dict[str, Window]
    entries_per_step: int
    loss_mismatch_steps: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the numbers mean where they could mislead
    first_step: int = 0  # the attempt's first logged step: not 0 for one resumed from a checkpoint
    nominal_start: int | None = None  # the window's first step before `settle` moved it (None: not moved)
    settled: bool = True  # False: a resumed attempt still slow one window length past its warm-up

    @property
    def steady_target(self) -> int:
        """How many steady steps a long enough run would have."""
        a, b = self.steady_range
        return sum(1 for s in range(a, b + 1) if not self._excluded(s))

    def _excluded(self, step: int) -> bool:
        return self.excluded is not None and self.excluded[0] <= step <= self.excluded[1]

    def _steady_mean(self, metric: str) -> float | None:
        s = self.windows["steady"].stats(metric)
        return s.mean if s else None

    @property
    def tgs(self) -> float | None:
        return self._steady_mean("tgs")

    @property
    def mfu(self) -> float | None:
        return self._steady_mean("mfu")

    @property
    def final_loss(self) -> float | None:
        return self.points[-1].loss if self.points else None


def summarize(log: JobLog, steady: tuple[int, int] = DEFAULT_STEADY, yml_path: str | None = None) -> Summary:
    """Windows, stats and warnings for one parsed log."""
    points = points_of(log)
    # A run resumed from a checkpoint (a requeued attempt) starts at the saved step and compiles again
    # there: its steady window counts from its own first step, not from step 0.
    offset = points[0].step if points and points[0].step > 0 else 0
    a, b = steady[0] + offset, steady[1] + offset
    excluded = profiler_window(log, yml_path)

    def in_excluded(step: int) -> bool:
        return excluded is not None and excluded[0] <= step <= excluded[1]

    nominal, settled = None, True
    if offset:  # the restore's slow steps may outlast the warm-up a fresh run needs: move past them
        start, settled = settle([(p.step, p.tgs) for p in points if not in_excluded(p.step)], a, b - a + 1)
        if start != a:
            nominal, a, b = a, start, start + (b - a)
    steady = (a, b)

    windows = {
        "all": Window("all", points),
        "warmup": Window("warmup", [p for p in points if p.step < a]),
        "steady": Window("steady", [p for p in points if a <= p.step <= b and not in_excluded(p.step)]),
        "tail": Window("tail", [p for p in points if p.step > b]),
    }
    counts = [p.entries for p in points]
    entries_per_step = max(set(counts), key=counts.count) if counts else 0
    summary = Summary(log, points, steady, excluded, windows, entries_per_step)
    summary.first_step, summary.nominal_start, summary.settled = offset, nominal, settled
    summary.loss_mismatch_steps = [p.step for p in points if p.loss_spread is not None and p.loss_spread > 1e-9]
    summary.warnings = _warnings(summary)
    summary.notes = _notes(summary)
    return summary


def _notes(s: Summary) -> list[str]:
    """One line each where a number could mislead: a moved window, a warm-up faster than the steady state."""
    out = []
    a, b = s.steady_range
    if s.first_step:
        moved = (
            f"; steps {s.nominal_start}-{a - 1} were still slow after the restore, so they count as warm-up"
            if s.nominal_start is not None
            else ""
        )
        out.append(
            f"resumed at step {s.first_step}: the steady window {a}-{b} counts from this attempt's first step{moved}"
        )
    if s.log.summarized:
        first, last = s.log.summarized
        out.append(
            f"steps {first}-{last} are global rank 0's values from the job's step summary (steps.tsv), the others "
            "the mean of every rank's lines: the log is too big to read each line (synchronous steps take the same "
            "time on every rank)"
        )
    elif s.log.summary_note:
        out.append(s.log.summary_note)
    warm, steady = s.windows["warmup"].stats("tgs"), s.windows["steady"].stats("tgs")
    if warm and steady and warm.mean > steady.mean:
        span = s.windows["warmup"].span
        out.append(
            f"the warm-up steps {span[0]}-{span[1]} averaged faster than the steady window "
            f"({fmt_tgs(warm.mean)} vs {fmt_tgs(steady.mean)}): a mean of per-step rates follows its fastest steps "
            "and the steady steps ran slower (load on a shared host, checkpoint saves); compare the steady mean, never "
            "the warm-up, and see whether the tail window agrees"
        )
    return out


def _warnings(s: Summary) -> list[str]:
    out = []
    a, b = s.steady_range
    if s.points and s.points[-1].step < b:
        out.append(
            f"run logged steps {s.points[0].step}-{s.points[-1].step}; the steady window {a}-{b} needs steps>={b + 1}"
        )
    steady = s.windows["steady"]
    for metric in METRICS:
        bad = steady.nonfinite(metric)
        if bad:
            n = len([p for p in steady.points if finite(getattr(p, metric))])
            used = f"the steady mean uses the {n} finite one(s)" if n else "no steady mean"
            out.append(
                f"steady window {a}-{b}: {len(bad)} step(s) logged non-finite {METRIC_NAMES[metric]} "
                f"({_describe_nonfinite(bad, metric)}); {used}"
            )
    mean = s.tgs
    if mean:
        low = [p.step for p in steady.points if finite(p.tgs) and p.tgs < LOW_SAMPLE_FRACTION * mean]
        if low:
            out.append(
                f"{len(low)} of {len(steady.points)} steady steps ran below {LOW_SAMPLE_FRACTION:.0%} of the steady "
                f"mean (steps {_ranges(low)}): throughput varied inside the window, so the mean is noisy "
                f"(±{fmt_tgs(steady.stats('tgs').std)}); most often other load on a shared host. Rerun with more "
                "steps and a later --steady window, or on an idle host, and see `jobkit analyze` for the slow steps"
            )
    if s.first_step and not s.settled:
        out.append(
            f"resumed at step {s.first_step}: still below {SETTLE_FRACTION:.0%} of its settled TGS at step {a}, one "
            f"window past its warm-up; the steady window {a}-{b} may still hold the restore's slow steps"
        )
    nodes, ranks = s.log.prefixes()
    # Fewer prefixes than nodes means a node logged nothing; more is fine
    # (1-GPU-per-process launches label every process).
    if s.log.nnodes and nodes and len(nodes) < s.log.nnodes:
        out.append(f"NNODES={s.log.nnodes} but step lines came from {len(nodes)} node prefix(es)")
    procs = s.log.local_world_size
    if procs > 1 and s.log.devices and ranks and len(ranks) < s.log.devices:
        out.append(
            f"NNODES={s.log.nnodes} x LOCAL_WORLD_SIZE={procs} = {s.log.devices} processes but step lines came from "
            f"{len(ranks)} process prefix(es) ([rank<G>]: )"
        )
    if s.loss_mismatch_steps:
        out.append(f"loss differs between nodes at steps {_ranges(s.loss_mismatch_steps)}")
    return out


def _describe_nonfinite(points: list[StepPoint], metric: str) -> str:
    """'inf at 7,9-10, nan at 12'."""
    by_kind: dict[str, list[int]] = {}
    for p in points:
        by_kind.setdefault(str(getattr(p, metric)), []).append(p.step)
    return ", ".join(f"{kind} at {_ranges(steps)}" for kind, steps in by_kind.items())


def _ranges(steps: list[int]) -> str:
    """[1,2,3,7] -> '1-3,7'."""
    parts, start = [], None
    for i, step in enumerate(steps):
        if start is None:
            start = step
        if i + 1 == len(steps) or steps[i + 1] != step + 1:
            parts.append(str(start) if start == step else f"{start}-{step}")
            start = None
    return ",".join(parts)


# ---- presentation -------------------------------------------------------


def fmt_tgs(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def fmt_pct(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def _clean(value):
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def _stat_dict(s: Stat | None, nonfinite: int = 0) -> dict | None:
    """n/mean/std of the finite values plus how many were not finite; None when there were no values."""
    if s is None:
        return {"n": 0, "mean": None, "std": None, "nonfinite": nonfinite} if nonfinite else None
    return {"n": s.n, "mean": _clean(s.mean), "std": _clean(s.std), "nonfinite": nonfinite}


def to_dict(s: Summary) -> dict:
    """JSON-ready summary (NaN/inf become null)."""
    h = s.log.header
    return {
        "log": s.log.path,
        "job_id": h.get("JOB_ID") or h.get("SLURM_JOB_ID"),
        "job_name": h.get("JOB_NAME") or h.get("SLURM_JOB_NAME"),
        "model": h.get("MODEL_NAME"),
        "exp_tag": h.get("EXP_TAG"),
        "nnodes": s.log.nnodes,
        "local_world_size": s.log.local_world_size,
        "devices": s.log.devices,
        "entries_per_step": s.entries_per_step,
        "steps_logged": len(s.points),
        "steady_window": list(s.steady_range),
        "profiler_excluded": list(s.excluded) if s.excluded else None,
        "windows": {
            name: {
                "range": list(w.span) if w.span else None,
                "n": len(w.points),
                **{m: _stat_dict(w.stats(m), len(w.nonfinite(m))) for m in METRICS},
            }
            for name, w in s.windows.items()
        },
        "tgs": _clean(s.tgs),
        "tgs_unavailable": None if s.tgs is not None else _no_steady_reason(s),
        "mfu": _clean(s.mfu),
        "final_loss": _clean(s.final_loss),
        "loss_mismatch_steps": s.loss_mismatch_steps,
        "per_step": [
            {
                "step": p.step,
                "entries": p.entries,
                "loss": _clean(p.loss),
                **{m: _clean(getattr(p, m)) for m in METRICS},
            }
            for p in s.points
        ],
        "warnings": s.warnings,
        "first_step": s.first_step,
        "steady_moved_from": s.nominal_start,
        "notes": s.notes,
    }


def _cell(st: Stat | None, fmt, nonfinite: int = 0) -> str:
    bad = f" +{nonfinite} inf/nan" if nonfinite else ""
    if st is None:
        return f"-{bad}"
    spread = f" ±{fmt(st.std)}" if st.n > 1 else ""
    return f"{fmt(st.mean)}{spread}{bad}"


def format_table(s: Summary) -> str:
    """Human table: one row per window."""
    d = to_dict(s)
    nodes = "?" if s.log.nnodes is None else s.log.nnodes
    lines = [
        f"log:   {s.log.path}",
        f"job:   {d['job_id'] or '?'} ({d['job_name'] or '?'})  model {d['model'] or '?'}  "
        f"{nodes} node(s){_procs_words(s.log)}, {s.entries_per_step} line(s) per step",
        "",
        f"{'window':<8} {'steps':<9} {'n':>3}  {'TGS/device':<22} {'TFLOP/s/device':<18} {'MFU %':<14} {'s/step':<14}",
    ]
    for name, w in s.windows.items():
        span = f"{w.span[0]}-{w.span[1]}" if w.span else "-"
        lines.append(
            f"{name:<8} {span:<9} {len(w.points):>3}  "
            f"{_cell(w.stats('tgs'), fmt_tgs, len(w.nonfinite('tgs'))):<22} "
            f"{_cell(w.stats('tflops'), lambda v: f'{v:.3f}', len(w.nonfinite('tflops'))):<18} "
            f"{_cell(w.stats('mfu'), lambda v: f'{v:.2f}', len(w.nonfinite('mfu'))):<14} "
            f"{_cell(w.stats('seconds'), lambda v: f'{v:.3f}', len(w.nonfinite('seconds'))):<14}"
        )
    lines.append("")
    if s.excluded:
        lines.append(f"steady window leaves out profiler steps {s.excluded[0]}-{s.excluded[1]}")
    steady = s.windows["steady"].stats("tgs")
    if steady:
        rel = f" ({steady.std / steady.mean:.1%})" if steady.mean else ""
        bad = len(s.windows["steady"].nonfinite("tgs"))
        skipped = f" ({bad} non-finite step(s) left out)" if bad else ""
        lines.append(
            f"TGS (steady mean): {fmt_tgs(steady.mean)} ±{fmt_tgs(steady.std)}{rel} over {steady.n} step(s){skipped}"
        )
    else:
        lines.append(f"TGS: n/a ({_no_steady_reason(s)})")
    if s.final_loss is not None:
        lines.append(f"final loss: {s.final_loss:.3f}")
    lines.extend(f"note: {n}" for n in s.notes)
    lines.extend(f"warning: {w}" for w in s.warnings)
    return "\n".join(lines)


def _procs_words(log: JobLog) -> str:
    """` x 2 processes (4 devices)` with several processes per node; "" with one."""
    n = log.local_world_size
    return f" x {n} processes ({log.devices} devices)" if n > 1 and log.devices else ""


def layout(log: JobLog) -> str:
    """`2N`, or `2N×2` with two processes (devices) per node: the job's shape in one word."""
    nodes = log.nnodes if log.nnodes is not None else "?"
    procs = log.local_world_size
    return f"{nodes}N" + (f"×{procs}" if procs > 1 else "")


def _no_steady_reason(s: Summary) -> str:
    a, b = s.steady_range
    if not s.points:
        return "no step lines"
    steady = s.windows["steady"].points
    if steady:
        bad = s.windows["steady"].nonfinite("tgs")
        if bad:
            return (
                f"all {len(bad)} logged steady step(s) {a}-{b} have non-finite Tokens/s/device "
                f"({_describe_nonfinite(bad, 'tgs')})"
            )
        return f"no Tokens/s/device in the steady steps {a}-{b}"
    if s.excluded and s.points[-1].step > b:
        return f"every step of the steady window {a}-{b} is inside the profiler window {s.excluded[0]}-{s.excluded[1]}"
    return f"steady window {a}-{b} needs steps>={b + 1}, run logged {len(s.points)}"


def format_line(s: Summary, verdict: str) -> str:
    """`tiny 1N (job X): 12,345 TGS/device, 1.2% MFU — PASS`; with 2 processes (devices) per node
    `tiny 2N×2 (job X): 12,345 TGS/device over 4 devices, 1.2% MFU — PASS` (TGS and MFU are per device)."""
    h = s.log.header
    model = h.get("MODEL_NAME") or h.get("JOB_NAME") or "?"
    job_id = h.get("JOB_ID") or h.get("SLURM_JOB_ID")
    who = f"{model} {layout(s.log)}" + (f" (job {job_id})" if job_id else "")
    over = f" over {s.log.devices} devices" if s.log.local_world_size > 1 and s.log.devices else ""
    tgs = s.tgs
    if tgs is None:
        perf = f"TGS n/a ({_no_steady_reason(s)})"
    else:
        n = s.windows["steady"].stats("tgs").n
        bad = len(s.windows["steady"].nonfinite("tgs"))
        partial = f" ({n}/{s.steady_target} steady steps)" if n < s.steady_target else ""
        if bad:
            partial = f" ({n}/{s.steady_target} steady steps, {bad} non-finite)"
        perf = f"{fmt_tgs(tgs)} TGS/device{over}{partial}"
        if s.mfu is not None:
            perf += f", {fmt_pct(s.mfu)}% MFU"
    return f"{who}: {perf} — {verdict}"
