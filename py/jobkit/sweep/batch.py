"""`jobkit sweep batch MODEL`: the value of one parameter (per_device_batch_size by default) with the best TGS.

The seed's upper-bound probe, not a binary search:
  1. Estimate how large the parameter can get from the model config (jobkit.sweep.memory) and probe at
     about 75 % of that (or at --start), rounded down to a round number (1, 2, 3, 4, 6, 8, 12, 16, 24 ...).
  2. If it runs, probe the ceiling, about 1.5x higher; while runs keep getting faster and nothing has
     failed yet, keep growing by 1.5x.
  3. An out-of-memory (or a hang: while compiling it is a silent OOM; elsewhere the engine already
     retried it) makes that value an upper bound; the next probe is the midpoint between the best value
     that ran and the lowest that did not.
  4. Stop when the interval cannot be split any more (for integers: when the failing value is within
     25 % of the passing one), when a higher value runs no faster (its mean not above the one below by
     more than the noise band: past the sweet spot), when a failure is not about memory, at the memory
     ceiling on CPU, or after --max-runs probes.
Every value runs --repeats times (points `name=v`, `name=v#2`, ...): its TGS is the mean of its runs,
its spread their range (jobkit.sweep.common.spread), and the noise band the largest spread of any value
(at least 1 %, the floor alone with one run each). The optimum is the value with the highest mean TGS,
not the largest that fits, and only when it beats the runner-up by more than the band; values within the
band of the best tie, and the smaller one is chosen (more memory headroom for the same throughput; for a
categorical parameter the one listed first), which the summary says. A sweep that --max-runs stopped
before its own rule did (or whose largest --values is still the fastest) is "not converged": the summary
names the best so far and the command that goes on. A value is never run again (the engine never
retries an OOM either). `--values` runs exactly the given values instead, and a categorical parameter
(remat_policy, ...) needs them. The values run one after another (their repeats together); the decisions
depend only on earlier outcomes, which is what lets `resume` replay them.

On CPU (--local on a host with no GPU, or `_env_JAX_PLATFORMS=cpu` after --) no device runs out of memory:
--device-memory is then the host RAM one CPU device may use (the node's RAM / CPU_DEVICES_PER_NODE), the
probe is refused without it, and the estimate's maximum caps the probe (a job past it would swap or
meet the kernel's OOM killer, not a clean out-of-memory). What a value costs is printed when it lands
(its wall time, and the next value's at the same time per unit of the parameter).

With --apply the winning value is written into configs/<model>.yml (its line replaced, its comment kept)
after the diff is shown and confirmed; without --apply no file outside the sweep dir is touched.
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import click

from jobkit.core import clitypes
from jobkit.core.config import parse_overrides
from jobkit.core.errors import JobkitError
from jobkit.core.paths import REPO_ROOT
from jobkit.sweep import common, config_edit, memory
from jobkit.sweep.engine import Engine
from jobkit.sweep.jobs import Outcome, Point
from jobkit.sweep.state import SweepError

# Where --apply edits (tests point it at a copy).
CONFIGS_DIR = REPO_ROOT / "configs"
# The noise band's floor, in percent: with one run per value the band is this alone (a higher value must
# beat the one below it by more than 1 % to count as faster); repeats measure it (common.noise_band).
BAND_FLOOR = 1.0
GROWTH = 1.5  # the ceiling probe, relative to the best value so far
# Narrowing stops once the lowest failing value is within 25 % of the highest passing one: from a 2x
# bracket that is two midpoints (the seed's "one or two more runs"), and TGS rarely moves more inside it.
RESOLUTION = 1.25
FIRST_SHARE = 0.75  # the first probe, relative to the estimated maximum


@dataclass(frozen=True)
class Param:
    """How a swept parameter's values behave: numbers on a grid of `step` above `low`, or choices."""

    name: str
    kind: str  # "int" | "float" | "choice"
    step: float = 1
    low: float = 0  # exclusive: every value is above it (batch >= 1)
    high: float | None = None  # inclusive cap
    cap: str = "its largest allowed value"  # what `high` is, for the stop reason

    @property
    def is_env(self) -> bool:
        return self.name.startswith("_env_")

    def parse(self, text: str):
        """TEXT as a value of this parameter; SweepError says what is wrong."""
        text = text.strip()
        if self.kind == "choice":
            if not text:
                raise SweepError(f"--values for {self.name} has an empty item; write e.g. --values full,minimal")
            return text
        try:
            value = int(text) if self.kind == "int" else float(text)
        except ValueError:
            kind = "integers" if self.kind == "int" else "numbers"
            raise SweepError(f"{self.name} takes {kind}; {text!r} is not one (e.g. --values 4,8,12)") from None
        if not math.isfinite(value) or value <= self.low or (self.high is not None and value > self.high):
            upper = f" and at most {self.high:g}" if self.high is not None else ""
            raise SweepError(f"{self.name}={text} is out of range: it must be above {self.low:g}{upper}")
        return value

    def text(self, value) -> str:
        return f"{value:.6g}" if self.kind == "float" else str(value)

    def grid(self, value: float) -> float | int:
        """VALUE on this parameter's grid (ints stay ints, floats keep 6 digits)."""
        snapped = round(value / self.step) * self.step
        return int(round(snapped)) if self.kind == "int" else round(snapped, 6)

    def grid_floor(self, value: float) -> float | int:
        """The largest grid value not above VALUE."""
        return self.grid(math.floor(value / self.step + 1e-9) * self.step)


KNOWN = {
    "per_device_batch_size": Param("per_device_batch_size", "int"),
    "max_target_length": Param("max_target_length", "int", step=128),
    "_env_XLA_PYTHON_CLIENT_MEM_FRACTION": Param("_env_XLA_PYTHON_CLIENT_MEM_FRACTION", "float", 0.01, 0, 0.98),
    "remat_policy": Param("remat_policy", "choice"),
    "quantization": Param("quantization", "choice"),
    "attention": Param("attention", "choice"),
}


def param_for(name: str, start: str | None, values: list[str] | None) -> Param:
    """The Param for NAME; an unknown one takes its kind from --start / --values (numbers or choices)."""
    if name in KNOWN:
        return KNOWN[name]
    if not (name.replace("_", "a").isalnum() and (name[0].isalpha() or name.startswith("_env_"))):
        raise SweepError(f"--param {name!r} is not a MaxText key or an _env_NAME setting")
    samples = [start] if start is not None else list(values or [])
    if not samples:
        raise SweepError(f"--param {name} has no memory model here: give --start V to probe it or --values A,B,C")
    if not all(s.strip().replace(".", "", 1).isdigit() for s in samples):
        return Param(name, "choice")
    whole = all("." not in s for s in samples)
    return Param(name, "int", 1) if whole else Param(name, "float", 0.01)


def nice_floor(value: float, param: Param) -> float | int:
    """The largest round number (1, 2, 3, 4, 6, 8, 12, 16, 24 ... times the grid step) not above VALUE."""
    units = max(1.0, value / param.step)
    power = 2 ** math.floor(math.log2(units))
    best = power * 1.5 if power * 1.5 <= units and power >= 2 else power
    return param.grid(best * param.step)


# --- the runs of one value ---
def memory_bound(outcome: Outcome) -> bool:
    """An outcome that says "too big": an OOM, or a hang (while compiling: a silent OOM; else retried already)."""
    return outcome.is_oom or outcome.status == "HANG"


@dataclass
class Runs:
    """The --repeats runs of one value, in the order they ran."""

    outcomes: list[Outcome]

    @property
    def passed(self) -> bool:
        return bool(self.outcomes) and all(o.passed and o.tgs is not None for o in self.outcomes)

    @property
    def samples(self) -> list[float]:
        return [o.tgs for o in self.outcomes if o.passed and o.tgs is not None]

    @property
    def tgs(self) -> float | None:
        """The mean TGS of the runs; None unless every run passed."""
        return statistics.fmean(self.samples) if self.passed else None

    @property
    def spread(self) -> float | None:
        return common.spread(self.samples) if self.passed else None

    @property
    def mfu(self) -> float | None:
        values = [o.mfu for o in self.outcomes if o.passed and o.mfu is not None]
        return statistics.fmean(values) if values else None

    @property
    def failure(self) -> Outcome | None:
        """The run that says most about a failing value: a memory-bound one first."""
        failed = [o for o in self.outcomes if not (o.passed and o.tgs is not None)]
        return next((o for o in failed if memory_bound(o)), failed[0] if failed else None)

    @property
    def bound(self) -> bool:
        """Too big: any run ran out of memory (an OOM is deterministic; a pass beside it had luck)."""
        return any(memory_bound(o) for o in self.outcomes)


History = list[tuple[object, Runs]]


def band_of(history: History) -> tuple[float, bool]:
    """(noise band in %, measured?) of the values so far (common.noise_band, BAND_FLOOR)."""
    return common.noise_band([r.samples for _, r in history if r.passed], BAND_FLOOR)


# --- the probe strategy (pure: values and outcomes in, next value out) ---


def grow(best, param: Param):
    """The next value above BEST with no upper bound known: ~1.5x, on the grid, capped; None at the cap."""
    value = max(param.grid(best * GROWTH), param.grid(best + param.step))
    if param.high is not None:
        value = min(value, param.grid_floor(param.high))
    return value if value > best else None


def between(low, high, param: Param):
    """The midpoint of (LOW, HIGH) on the grid above LOW; None when no grid value lies strictly between."""
    steps = round((high - low) / param.step)
    if steps <= 1:
        return None
    value = param.grid(low + max(1, round(steps / 2)) * param.step)
    return value if low < value < high else None  # a start off the grid can snap onto a bound


def next_probe(param: Param, history: History) -> tuple[object | None, str]:
    """(next value, "") or (None, why the probing stops), from the probes so far (in the order run)."""
    value, last = history[-1]
    key = f"{param.name}={param.text(value)}"
    if not last.passed and not last.bound:
        failure = common.fmt_status(last.failure)
        return None, f"{key} failed for a reason other than memory ({failure}); fix that first"
    passing = sorted((v, r.tgs or 0.0) for v, r in history if r.passed)
    if last.passed:
        below = [(v, t) for v, t in passing if v < value]
        band, _ = band_of(history)
        if below and (last.tgs or 0.0) <= below[-1][1] * (1 + band / 100):
            prev = f"{param.name}={param.text(below[-1][0])}"
            return None, (
                f"{key} ran no faster than {prev} (not above it by more than the ±{band:.1f} % noise band):"
                " past the sweet spot"
            )
    bounds = [v for v, r in history if r.bound]
    best = passing[-1][0] if passing else param.low
    if bounds:
        if passing and param.kind == "int" and min(bounds) <= best * RESOLUTION:
            return None, (
                f"converged: {param.name}={param.text(best)} runs, {param.text(min(bounds))} does not "
                f"(within {(RESOLUTION - 1) * 100:g} %)"
            )
        nxt = between(best, min(bounds), param)
        if nxt is None:
            if not passing:
                return None, f"{key} does not fit and there is no smaller value to try"
            return None, f"converged: {param.name}={param.text(best)} runs, {param.text(min(bounds))} does not"
    else:
        nxt = grow(best, param)
        if nxt is None:
            return None, f"{param.name} reached {param.cap} ({param.text(best)})"
    if nxt in {v for v, _ in history}:  # cannot happen with the rules above; never rerun a value
        return None, f"{param.name}={param.text(nxt)} was already run"
    return nxt, ""


def choose(param: Param, history: History) -> common.Pick | None:
    """The optimum: the best mean TGS when it beats the runner-up by more than the noise band, else the
    tie rule among the values within the band of the best (the smaller; a choice: the one run first)."""
    means = {v: r.tgs for v, r in history if r.passed}
    order = [v for v, _ in history]
    tie_rule = (lambda tied: min(tied, key=order.index)) if param.kind == "choice" else min
    return common.pick(means, band_of(history)[0], tie_rule)


def optimum(param: Param, history: History):
    """The chosen value, or None when nothing ran."""
    chosen = choose(param, history)
    return chosen.chosen if chosen else None


def not_converged(param: Param, history: History, why: str, probing: bool) -> str:
    """Why the sweep has not found its optimum yet ("" when it has): --max-runs stopped the probe before
    its own rule did, or the largest of --values is still the fastest (TGS may rise above it)."""
    chosen = choose(param, history)
    if chosen is None:
        return ""
    if probing and why.startswith("--max-runs"):
        ran = [v for v, r in history if r.passed]
        rising = chosen.best == max(ran) and not any(r.bound for v, r in history if v > chosen.best)
        what = "while TGS was still rising" if rising else "before it converged"
        return f"{why.split(' reached')[0]} stopped the probe {what}"
    if not probing and param.kind != "choice":
        ran = [v for v, r in history if r.passed]
        above_best = [v for v, r in history if v > chosen.best]
        if len(ran) > 1 and not above_best and not chosen.is_tie:
            return f"{param.text(chosen.best)} is the largest value given and the fastest: TGS may rise above it"
    return ""


# --- the report ---
def _status(param: Param, value, runs: Runs, chosen: common.Pick | None, open_why: str) -> str:
    """A row's status: the failure, or PASS with where the value stands against the best under the band."""
    if not runs.passed:
        word = common.fmt_status(runs.failure)
        return word if not runs.samples else f"{word} in {len(runs.outcomes) - len(runs.samples)}/{len(runs.outcomes)}"
    if chosen is None:
        return "PASS"
    if value == chosen.chosen:
        if open_why:
            return "PASS ← best so far (not converged)"
        if chosen.is_tie:
            rule = "listed first" if param.kind == "choice" else "the smaller"
            return f"PASS ← optimal (tie: {rule})"
        return "PASS ← optimal"
    return "PASS, within noise" if value in chosen.tied else "PASS, slower (beyond noise)"


def _rows(param: Param, history: History, chosen: common.Pick | None, open_why: str) -> list[list[str]]:
    ordered = sorted(history, key=lambda item: item[0]) if param.kind != "choice" else history
    best = dict(history)[chosen.best].tgs if chosen else None
    rows = []
    for value, runs in ordered:
        delta = common.above(runs.tgs, best) if runs.tgs is not None and best else None
        rows.append(
            [
                param.text(value),
                f"{len(runs.samples)}/{len(runs.outcomes)}",
                ",".join(o.job_id for o in runs.outcomes if o.job_id) or "—",
                common.fmt_tgs(runs.tgs) if runs.passed else "OOM" if runs.bound else "—",
                common.fmt_pct(runs.spread) if runs.spread is not None else "—",
                common.fmt_pct(delta, True) if delta is not None else "—",
                common.fmt_pct(runs.mfu),
                _status(param, value, runs, chosen, open_why),
            ]
        )
    return rows


def _verdict(param: Param, history: History, chosen: common.Pick, open_why: str, again) -> list[str]:
    """The lines that name the optimum (or the tie, or the best so far) and say why."""
    runs = dict(history)
    key = f"{param.name}={param.text(chosen.chosen)}"
    tgs = common.fmt_tgs(runs[chosen.chosen].tgs)
    band = f"±{chosen.band:.1f}%"
    if open_why:
        lines = [f"Best so far: {key} ({tgs} TGS/device). Not converged: {open_why}."]
        if again is not None:
            command = again(chosen.chosen)
            how = (
                "it probes on from where it stopped and runs only new values"
                if " sweep resume " in command
                else f"a new sweep that measures {param.text(chosen.chosen)} again beside larger values"
            )
            lines.append(f"Go on with: `{command}` ({how}).")
        return lines
    if chosen.is_tie:
        others = [param.text(v) for v in chosen.tied if v != chosen.chosen]
        best = f"{param.text(chosen.best)} has the highest mean" if chosen.best != chosen.chosen else ""
        rule = (
            "the one listed first (tie rule)"
            if param.kind == "choice"
            else "the smaller (tie rule: the same throughput with more memory headroom)"
        )
        return [
            f"Optimal: {key} ({tgs} TGS/device), a tie: {', '.join(others)} within the {band} noise band of the best"
            + (f" ({best})" if best else "")
            + f"; chosen: {param.text(chosen.chosen)}, {rule}."
        ]
    means = sorted((r.tgs for v, r in history if r.passed and v != chosen.chosen), reverse=True)
    if not means:
        return [f"Optimal: {key} ({tgs} TGS/device; the only value that ran)."]
    margin = common.fmt_pct(common.above(runs[chosen.chosen].tgs, means[0]), True)
    runner_up = next(v for v, r in history if r.passed and r.tgs == means[0])
    return [
        f"Optimal: {key} ({tgs} TGS/device; {margin} over the runner-up {param.text(runner_up)},"
        f" outside the {band} noise band)."
    ]


def report(
    model: str,
    param: Param,
    num_nodes: int,
    nodes: tuple[str, ...],
    history: History,
    why: str,
    notes: list[str],
    config_value,
    max_runs: int | None,
    again: Callable | None = None,
) -> str:
    """summary.md: the table, the noise band, the optimum (or tie, or best so far and how to go on)."""
    chosen = choose(param, history)
    open_why = not_converged(param, history, why, max_runs is not None)
    where = ",".join(nodes) if nodes else "this machine"
    headers = ["Value", "Runs", "Job", "TGS/device", "Spread", "Δ vs best", "MFU", "Status"]
    lines = [
        f"## Batch sweep: {model}, {param.name}, {num_nodes} node(s) on {where}\n",
        common.table(headers, _rows(param, history, chosen, open_why)),
    ]
    band, measured = band_of(history)
    if measured:
        lines.append(
            f"Noise band: ±{band:.1f}% (the largest spread of a value's runs, max-min over their mean, at least"
            f" {BAND_FLOOR:g}%). A value is faster or slower than the best only beyond it; within it, they tie."
        )
    else:
        lines.append(
            f"Noise band: unknown (one run per value); decisions use the {BAND_FLOOR:g}% floor alone:"
            " confirm a close optimum with --repeats 2 or more."
        )
    if chosen is None:
        lines.append(f"Optimal: none: no value of {param.name} ran.")
    else:
        lines += _verdict(param, history, chosen, open_why, again)
    most = f" of at most {max_runs}" if max_runs else ""
    each = max((len(r.outcomes) for _, r in history), default=0)
    stopped = "Stopped: " + why + "." if why else "Every given value ran."
    lines.append(f"Runs: {len(history)} value(s){most}, {each} job(s) each. {stopped}")
    best = chosen.chosen if chosen else None
    if best is not None and not param.is_env:
        current = param.text(config_value) if config_value is not None else "not set"
        if config_value is None or param.text(config_value) != param.text(best):
            what = "the best so far (not converged)" if open_why else "the optimum"
            lines.append(
                f"Config: configs/{model}.yml has {param.name}: {current}; {what} is {param.text(best)} "
                "(--apply writes it after showing the diff)."
            )
    elif best is not None:
        lines.append(f"{param.name} is an environment setting: put it in configs/{model}.env.sh or after --.")
    if notes:
        lines += ["", "Estimate:", *notes]
    return "\n".join(lines) + "\n"


# --- the command ---
def first_probe(param: Param, start: str | None, est: memory.Estimate | None, current):
    if start is not None:
        return param.parse(start)
    if est is not None:
        return max(nice_floor(est.max_value * FIRST_SHARE, param), param.grid(param.low + param.step))
    return current


# How long a value's jobs took (tests replace it).
CLOCK: Callable[[], float] = time.monotonic


def cost_of_next(param: Param, value, took: float, nxt) -> str:
    """What the value NXT should cost, from what VALUE took (compute grows with a numeric parameter)."""
    if param.kind == "choice" or not value:
        return f"about {took:,.0f} s"
    return f"about {took * nxt / value:,.0f} s (its time grows with {param.name})"


def run_probes(engine: Engine, points_for: Callable, param: Param, first, max_runs: int):
    history: History = []
    value, why = first, ""
    recorded = engine.sweep.done()
    while value is not None:
        if len(history) >= max_runs:
            why = f"--max-runs {max_runs} reached"
            break
        points = points_for(value)
        started = CLOCK()
        history.append((value, Runs(engine.run(points))))
        took = CLOCK() - started
        done, value, why = value, *next_probe(param, history)
        if not all(p.key in recorded for p in points):
            then = (
                f"; the next, {param.text(value)}, should take {cost_of_next(param, done, took, value)}"
                if value
                else ""
            )
            engine.echo(f"[batch] {param.name}={param.text(done)}: {len(points)} job(s) took {took:,.0f} s{then}")
    return history, why


def continue_command(
    value, *, model, n, nodelist, local, param, repeats, device_memory, steps, extra, values, max_runs, sweep_id=None
) -> str:
    """The command that goes on from VALUE, the best so far of a sweep that did not converge: a probe stopped
    by --max-runs is resumed with a larger one (`sweep resume` runs only the new values); a --values sweep goes
    on as a new sweep with the same nodes and settings, VALUE and two values above it (they need no memory
    bound, on CPU either)."""
    if values is None and sweep_id is not None:
        return shlex.join(["jobkit", "sweep", "resume", sweep_id, "--max-runs", str(2 * max_runs)])
    words = ["jobkit", "sweep", "batch", model, *(["--local"] if local else ["-N", str(n), "-w", nodelist or ""])]
    if param.name != "per_device_batch_size":
        words += ["--param", param.name]
    if device_memory is not None:
        words += ["--device-memory", f"{device_memory:g}"]
    if steps != common.MIN_STEPS:
        words += ["--steps", str(steps)]
    words += ["--repeats", str(repeats)]
    if values is None:
        words += ["--start", param.text(value), "--max-runs", str(max_runs)]
    else:
        larger = [value]
        while len(larger) < 3 and grow(larger[-1], param) is not None:
            larger.append(grow(larger[-1], param))
        words += ["--values", ",".join(param.text(v) for v in larger)]
    return shlex.join([*words, *(["--", *extra] if extra else [])])


def _setup(model, param_name, start, values_text, device_memory, mem_fraction, local, extra, num_nodes):
    """Everything the sweep needs, checked (SweepError on bad input): param, values, first, notes."""
    if start is not None and values_text is not None:
        raise SweepError("--start and --values exclude each other: --values runs exactly the listed values")
    values_raw = None
    if values_text is not None:
        values_raw = [v.strip() for v in values_text.split(",")]
    param = param_for(param_name, start, values_raw)
    values = None
    if values_raw is not None:
        values = [param.parse(v) for v in values_raw]
        dupes = sorted({param.text(v) for v in values if values.count(v) > 1})
        if dupes:
            raise SweepError(f"--values lists {', '.join(dupes)} more than once; a value is never run twice")
    elif param.kind == "choice":
        raise SweepError(f"{param.name} is categorical: list the choices to run with --values A,B,C")

    config_file = CONFIGS_DIR / f"{model}.yml"
    if not config_file.is_file():
        raise SweepError(f"{config_file} does not exist; the batch sweep reads the model's config from there")
    cfg = memory.model_config(config_file, extra)
    current = cfg.get(param.name) if not param.is_env else None
    if param.is_env:
        env = parse_overrides(extra)
        current = env.get(param.name)
        if param.name == "_env_XLA_PYTHON_CLIENT_MEM_FRACTION":
            current = memory.mem_fraction(None, extra, cpu=False)[0]
    if isinstance(current, float) and param.kind == "int" and current.is_integer():
        current = int(current)  # MaxText's own default is written 12.0
    try:
        current = param.parse(str(current)) if current is not None and param.kind != "choice" else current
    except SweepError:
        current = None

    needs_estimate = values is None and start is None and param.name in memory.ESTIMATED
    notes, est = [], None
    if param.name in memory.ESTIMATED:
        est, why_not, cpu = _estimate(param.name, cfg, device_memory, mem_fraction, local, extra, num_nodes)
        if est is None and (needs_estimate or (cpu and values is None)):
            raise SweepError(why_not)
        notes = est.lines() if est else []  # with --start / --values an estimate is only a bonus
        if est is not None and needs_estimate and est.available <= 0:
            raise SweepError(
                f"the estimate leaves no memory for activations (weights need {est.param_memory / memory.GIB:,.1f} "
                f"GiB of a {est.pool / memory.GIB:,.1f} GiB pool); use more nodes (-N) or give --start"
            )
        if cpu and est is not None and values is None:
            # No device runs out of memory on CPU: without this cap the probe grows until --max-runs.
            ceiling = max(param.grid_floor(est.max_value), param.grid(param.low + param.step))
            param = replace(
                param, high=ceiling, cap=f"the estimate's maximum for {est.device_gib:g} GB of RAM per CPU device"
            )
            notes.append(
                f"- CPU: no device memory runs out, so the probe stops at {param.name}={param.text(ceiling)}"
                " (the estimate's maximum for --device-memory, host RAM per CPU device)"
            )
    if values is None and start is None and param.name not in memory.ESTIMATED:
        if current is None:
            raise SweepError(f"{param.name} has no value in the config or after --: give --start V")
        notes = [f"- none: {param.name} is not sized by the memory estimate; the first probe is its current value"]
    first = first_probe(param, start, est if needs_estimate else None, current)
    return param, values, first, notes, current, config_file


def _estimate(name, cfg, device_memory, fraction_given, local, extra, num_nodes):
    """(Estimate, "", on CPU?) or (None, the one-line reason there is none, on CPU?)."""
    env = parse_overrides(extra)
    cpu = env.get("_env_JAX_PLATFORMS") == "cpu"
    detected, device_name = (None, "")
    if device_memory is None or (local and not cpu):
        detected, device_name = memory.detected_device_memory()
    if local and detected is None:
        cpu = True
    gib = device_memory if device_memory is not None else detected
    if gib is None and cpu:
        return (
            None,
            (
                f"on CPU no device runs out of memory, so nothing would stop the probe of {name}: give --device-memory"
                " GB, the host RAM one CPU device may use (the node's RAM / CPU_DEVICES_PER_NODE), or run exactly"
                " --values A,B,C"
            ),
            cpu,
        )
    if gib is None:
        where = "this machine" if local else "the nodes"
        return (
            None,
            (
                f"cannot estimate {name}: {device_name}; give the memory of one device on {where} with "
                "--device-memory GB (e.g. --device-memory 192), or the first value with --start"
            ),
            cpu,
        )
    fraction, source = memory.mem_fraction(fraction_given, extra, cpu)
    per_node = None
    if cpu:
        try:
            per_node = int(env.get("_env_CPU_DEVICES_PER_NODE") or os.environ.get("CPU_DEVICES_PER_NODE") or 1)
        except ValueError:
            per_node = 1
    try:
        return memory.estimate(name, cfg, gib, fraction, source, num_nodes, per_node), "", cpu
    except memory.EstimateError as exc:
        return None, f"cannot estimate {name} from the config ({exc}); give the first value with --start", cpu


@common.driver_command("batch")
@click.argument("model")
@click.option("-N", "--nodes", "num_nodes", type=click.IntRange(1), help="Nodes per job (default: all of -w; 1 local).")
@click.option("-w", "--nodelist", "nodelist", help="Nodes to pin every job to, e.g. 'node[1-4]' (not with --local).")
@click.option("--param", "param_name", default="per_device_batch_size", show_default=True, help="What to sweep.")
@click.option("--start", help="First value to probe (default: from the memory estimate).")
@click.option("--values", "values_text", help="Run exactly these values, e.g. 4,8,12 or full,minimal (no probing).")
@click.option(
    "--device-memory",
    type=clitypes.Positive("number of GB", max=1e6),
    help="GB per device for the estimate (default: the GPU of this host). On CPU (--local without a GPU,"
    " or _env_JAX_PLATFORMS=cpu) the host RAM one CPU device may use: required there to probe, and the"
    " estimate's maximum caps the probe (nothing runs out of device memory on CPU).",
)
@click.option(
    "--mem-fraction", type=clitypes.Finite("fraction", 0, 1, min_open=True), help="Share of it the pool gets."
)
@click.option("--max-runs", type=click.IntRange(1), default=6, show_default=True, help="Most values to probe.")
@click.option(
    "--repeats",
    type=click.IntRange(1, 10),
    default=2,
    show_default=True,
    help="Runs per value: their mean decides, their spread sets the noise band (a tie within it: the smaller).",
)
@click.option("--apply", "apply_it", is_flag=True, help="Write the optimum into configs/MODEL.yml (diff, confirm).")
@click.option("--yes", is_flag=True, help="With --apply: write without asking.")
@common.steps_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(
    model,
    num_nodes,
    nodelist,
    param_name,
    start,
    values_text,
    device_memory,
    mem_fraction,
    max_runs,
    repeats,
    apply_it,
    yes,
    steps,
    extra,
    **params,
):
    """Find the value of --param (per_device_batch_size) with the highest steady TGS for MODEL.

    Probes at ~75 % of the memory estimate, then ~1.5x higher, then between the best run and the lowest
    out-of-memory; stops when converged, past the TGS peak, or after --max-runs (then "not converged", with
    the command that goes on). Each value runs --repeats times; the optimum must beat the runner-up by more
    than the noise band (the largest spread of a value's runs), else the values tie and the smaller one is
    chosen. A sweep costs at most --max-runs x --repeats jobs; each value prints its wall time when it
    lands. EXTRA (after --) are MaxText key=value and _env_KEY=VALUE settings for every job.
    """
    local = bool(params.get("local"))
    try:
        model = common.resolve_model(model)
        nodes = common.parse_nodes(nodelist, num_nodes or 1, local=local)
        if local and (num_nodes or 1) != 1:
            raise SweepError(f"--local runs one node; -N {num_nodes} needs Slurm (drop --local, give -w)")
        n = num_nodes or max(1, len(nodes))
        param, values, first, notes, current, config_file = _setup(
            model, param_name, start, values_text, device_memory, mem_fraction, local, tuple(extra), n
        )
        if apply_it and param.is_env:
            raise SweepError(
                f"--apply writes MaxText keys into configs/{model}.yml; {param.name} is an environment setting: "
                f"export it in configs/{model}.env.sh or pass it after -- (drop --apply)"
            )
    except SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    read_at_start = config_file.read_text()
    base = tuple(a for a in extra if not a.startswith(f"{param.name}="))

    def points_for(value) -> list[Point]:
        """The --repeats points of VALUE: `name=v` (the key a sweep of one run had too), then `name=v#2` ..."""
        setting = f"{param.name}={param.text(value)}"
        args = common.with_steps((*base, setting), steps)
        keys = [setting] + [f"{setting}#{r}" for r in range(2, repeats + 1)]
        return [Point(key=k, model=model, num_nodes=n, nodes=nodes, args=args, label=k) for k in keys]

    result = {}
    where = ",".join(nodes) if nodes else "this machine"
    settings = dict(model=model, n=n, nodelist=nodelist, local=local, param=param, repeats=repeats)
    settings.update(device_memory=device_memory, steps=steps, extra=tuple(extra), values=values, max_runs=max_runs)

    def again(value) -> str:
        return continue_command(value, **settings)

    def body(engine: Engine) -> str:
        settings["sweep_id"] = engine.sweep.id
        count = len(values) if values is not None else max_runs
        engine.echo(
            f"[batch] at most {count} value(s) x {repeats} run(s) = {count * repeats} job(s) of {steps} steps on"
            f" {where}; each value prints its wall time when it lands"
        )
        if values is not None:
            started = CLOCK()
            outcomes = engine.run([p for v in values for p in points_for(v)])
            engine.echo(f"[batch] {len(outcomes)} job(s) took {CLOCK() - started:,.0f} s")
            history = [(v, Runs(outcomes[i * repeats : (i + 1) * repeats])) for i, v in enumerate(values)]
            why = ""
        else:
            history, why = run_probes(engine, points_for, param, first, max_runs)
        result["best"] = optimum(param, history)
        return report(model, param, n, nodes, history, why, notes, current, None if values else max_runs, again)

    common.execute("batch", model, body)
    if apply_it:
        if result.get("best") is None:
            raise JobkitError("sweep", f"nothing to apply: no value of {param.name} ran")
        config_edit.apply(config_file, read_at_start, param, result["best"], tuple(extra), yes)
