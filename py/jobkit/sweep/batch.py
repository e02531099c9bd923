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
     25 % of the passing one), when a higher value runs no faster (at most +1 %:
     past the sweet spot), when a failure is not about memory, or after --max-runs probes.
The optimum is the value with the highest steady TGS, not the largest that fits. A value is never run
twice (the engine never retries an OOM either). `--values` runs exactly the given values instead, and a
categorical parameter (remat_policy, ...) needs them. Each probe is one job, so the probes run one after
another; the decisions depend only on earlier outcomes, which is what lets `resume` replay them.

With --apply the winning value is written into configs/<model>.yml (its line replaced, its comment kept)
after the diff is shown and confirmed; without --apply no file outside the sweep dir is touched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

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
FLAT = 1.01  # a higher value must beat the one below it by more than 1 % to count as faster
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


# --- the probe strategy (pure: values and outcomes in, next value out) ---
def memory_bound(outcome: Outcome) -> bool:
    """An outcome that says "too big": an OOM, or a hang (while compiling: a silent OOM; else retried already)."""
    return outcome.is_oom or outcome.status == "HANG"


def grow(best, param: Param):
    """The next value above BEST with no upper bound known: ~1.5x, on the grid, capped; None at the cap."""
    value = max(param.grid(best * GROWTH), param.grid(best + param.step))
    if param.high is not None:
        value = min(value, param.grid(param.high))
    return value if value > best else None


def between(low, high, param: Param):
    """The midpoint of (LOW, HIGH) on the grid above LOW; None when no grid value lies strictly between."""
    steps = round((high - low) / param.step)
    if steps <= 1:
        return None
    value = param.grid(low + max(1, round(steps / 2)) * param.step)
    return value if low < value < high else None  # a start off the grid can snap onto a bound


def next_probe(param: Param, history: list[tuple[object, Outcome]]) -> tuple[object | None, str]:
    """(next value, "") or (None, why the probing stops), from the probes so far (in the order run)."""
    value, last = history[-1]
    key = f"{param.name}={param.text(value)}"
    if not last.passed and not memory_bound(last):
        return None, f"{key} failed for a reason other than memory ({common.fmt_status(last)}); fix that first"
    passing = sorted((v, o.tgs or 0.0) for v, o in history if o.passed)
    if last.passed:
        below = [(v, t) for v, t in passing if v < value]
        if below and (last.tgs or 0.0) <= below[-1][1] * FLAT:
            prev = f"{param.name}={param.text(below[-1][0])}"
            return None, f"{key} ran no faster than {prev} (within +{(FLAT - 1) * 100:g} %): past the sweet spot"
    bounds = [v for v, o in history if memory_bound(o)]
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
            return None, f"{param.name} reached its largest allowed value ({param.text(best)})"
    if nxt in {v for v, _ in history}:  # cannot happen with the rules above; never rerun a value
        return None, f"{param.name}={param.text(nxt)} was already run"
    return nxt, ""


def optimum(history: list[tuple[object, Outcome]]):
    """The value with the highest steady TGS (the first one on a tie), or None when nothing ran."""
    ran = [(v, o.tgs) for v, o in history if o.passed and o.tgs is not None]
    return max(ran, key=lambda item: item[1])[0] if ran else None


# --- the report ---
def report(
    model: str,
    param: Param,
    num_nodes: int,
    nodes: tuple[str, ...],
    history: list[tuple[object, Outcome]],
    why: str,
    notes: list[str],
    config_value,
    max_runs: int | None,
) -> str:
    best = optimum(history)
    rows_in = sorted(history, key=lambda item: item[0]) if param.kind != "choice" else history
    rows, last_tgs = [], None
    for value, outcome in rows_in:
        status = common.fmt_status(outcome)
        if outcome.passed and last_tgs is not None and outcome.tgs is not None and outcome.tgs < last_tgs:
            status += " (regression)" if param.kind != "choice" else ""
        if outcome.passed and outcome.tgs is not None:
            last_tgs = outcome.tgs
        if value == best:
            status += " ← optimal"
        rows.append(
            [
                param.text(value),
                outcome.job_id or "—",
                common.fmt_tgs(outcome.tgs) if outcome.passed else "OOM" if outcome.is_oom else "—",
                common.fmt_pct(outcome.mfu),
                status,
            ]
        )
    where = ",".join(nodes) if nodes else "this machine"
    lines = [
        f"## Batch sweep: {model}, {param.name}, {num_nodes} node(s) on {where}\n",
        common.table(["Value", "Job", "TGS/device", "MFU", "Status"], rows),
    ]
    if best is None:
        lines.append(f"Optimal: none: no value of {param.name} ran.")
    else:
        tgs = dict((v, o.tgs) for v, o in history)[best]
        lines.append(f"Optimal: {param.name}={param.text(best)} ({common.fmt_tgs(tgs)} TGS/device).")
    runs = f" of at most {max_runs}" if max_runs else ""
    lines.append(f"Runs: {len(history)}{runs}. {'Stopped: ' + why + '.' if why else 'Every given value ran.'}")
    if best is not None and not param.is_env:
        current = param.text(config_value) if config_value is not None else "not set"
        if config_value is None or param.text(config_value) != param.text(best):
            lines.append(
                f"Config: configs/{model}.yml has {param.name}: {current}; the optimum is {param.text(best)} "
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


def run_probes(engine: Engine, point_for: Callable, param: Param, first, max_runs: int):
    history: list[tuple[object, Outcome]] = []
    value, why = first, ""
    while value is not None:
        if len(history) >= max_runs:
            why = f"--max-runs {max_runs} reached"
            break
        history.append((value, engine.run([point_for(value)])[0]))
        value, why = next_probe(param, history)
    return history, why


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
        est, why_not = _estimate(param.name, cfg, device_memory, mem_fraction, local, extra, num_nodes)
        if est is None and needs_estimate:
            raise SweepError(why_not)
        notes = est.lines() if est else []  # with --start / --values an estimate is only a bonus
        if est is not None and needs_estimate and est.available <= 0:
            raise SweepError(
                f"the estimate leaves no memory for activations (weights need {est.param_memory / memory.GIB:,.1f} "
                f"GiB of a {est.pool / memory.GIB:,.1f} GiB pool); use more nodes (-N) or give --start"
            )
    if values is None and start is None and param.name not in memory.ESTIMATED:
        if current is None:
            raise SweepError(f"{param.name} has no value in the config or after --: give --start V")
        notes = [f"- none: {param.name} is not sized by the memory estimate; the first probe is its current value"]
    first = first_probe(param, start, est if needs_estimate else None, current)
    return param, values, first, notes, current, config_file


def _estimate(name, cfg, device_memory, fraction_given, local, extra, num_nodes):
    """(Estimate, "") or (None, the one-line reason there is none)."""
    env = parse_overrides(extra)
    cpu = env.get("_env_JAX_PLATFORMS") == "cpu"
    detected, device_name = (None, "")
    if device_memory is None or (local and not cpu):
        detected, device_name = memory.detected_device_memory()
    if local and detected is None:
        cpu = True
    gib = device_memory if device_memory is not None else detected
    if gib is None:
        where = "this machine" if local else "the nodes"
        return None, (
            f"cannot estimate {name}: {device_name}; give the memory of one device on {where} with "
            "--device-memory GB (e.g. --device-memory 192), or the first value with --start"
        )
    fraction, source = memory.mem_fraction(fraction_given, extra, cpu)
    per_node = None
    if cpu:
        try:
            per_node = int(env.get("_env_CPU_DEVICES_PER_NODE") or os.environ.get("CPU_DEVICES_PER_NODE") or 1)
        except ValueError:
            per_node = 1
    try:
        return memory.estimate(name, cfg, gib, fraction, source, num_nodes, per_node), ""
    except memory.EstimateError as exc:
        return None, f"cannot estimate {name} from the config ({exc}); give the first value with --start"


@common.driver_command("batch")
@click.argument("model")
@click.option("-N", "--nodes", "num_nodes", type=click.IntRange(1), help="Nodes per job (default: all of -w; 1 local).")
@click.option("-w", "--nodelist", "nodelist", help="Nodes to pin every job to, e.g. node[1-4] (not with --local).")
@click.option("--param", "param_name", default="per_device_batch_size", show_default=True, help="What to sweep.")
@click.option("--start", help="First value to probe (default: from the memory estimate).")
@click.option("--values", "values_text", help="Run exactly these values, e.g. 4,8,12 or full,minimal (no probing).")
@click.option(
    "--device-memory", type=clitypes.Positive("number of GB", max=1e6), help="GB per device for the estimate."
)
@click.option(
    "--mem-fraction", type=clitypes.Finite("fraction", 0, 1, min_open=True), help="Share of it the pool gets."
)
@click.option("--max-runs", type=click.IntRange(1), default=6, show_default=True, help="Most probes to run.")
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
    apply_it,
    yes,
    steps,
    extra,
    **params,
):
    """Find the value of --param (per_device_batch_size) with the highest steady TGS for MODEL.

    Probes at ~75 % of the memory estimate, then ~1.5x higher, then between the best run and the lowest
    out-of-memory; stops when converged, past the TGS peak, or after --max-runs. EXTRA (after --) are
    MaxText key=value and _env_KEY=VALUE settings for every job.
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

    def point_for(value) -> Point:
        key = f"{param.name}={param.text(value)}"
        args = common.with_steps((*base, key), steps)
        return Point(key=key, model=model, num_nodes=n, nodes=nodes, args=args, label=key)

    result = {}

    def body(engine: Engine) -> str:
        if values is not None:
            outcomes = engine.run([point_for(v) for v in values])
            history, why = list(zip(values, outcomes, strict=True)), ""
        else:
            history, why = run_probes(engine, point_for, param, first, max_runs)
        result["best"] = optimum(history)
        return report(model, param, n, nodes, history, why, notes, current, None if values else max_runs)

    common.execute("batch", model, body)
    if apply_it:
        if result.get("best") is None:
            raise JobkitError("sweep", f"nothing to apply: no value of {param.name} ran")
        config_edit.apply(config_file, read_at_start, param, result["best"], tuple(extra), yes)
