"""What every sweep driver's command shares: options, model and nodelist checks, the run wrapper, tables.

A driver is a click command whose body builds points and calls `engine.run`; `execute` wraps it with the
sweep's life cycle: create or reopen the sweep dir (only after every input is checked, so bad input
leaves nothing behind), turn Ctrl-C / SIGTERM into a clean interrupt, stop on a bail-out rule, write
summary.md, and exit 0 (finished), 1 (bad input), 9 (EXIT_STOPPED: stopped by a rule) or 130/143 (interrupted).

Noise, for every driver that names a winner (batch, xla): a setting's runs (repeats) give a mean and a
`spread`, the full max-min range of their TGS as a percentage of their mean (the one definition both
drivers show). The `noise_band` is the largest spread among the settings that ran at least twice, at least
a floor; with no repeats it is the floor alone and unmeasured. `pick` names a winner only when the best
mean beats the runner-up's by more than the band; otherwise the values within the band of the best tie
and the driver's tie rule chooses among them (the batch driver: the smaller value).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from jobkit.core import clitypes, tgs
from jobkit.core.errors import EXIT_STOPPED, SIGNAL_BASE, JobkitError, exit_with
from jobkit.core.nodelist import expand_nodelist
from jobkit.core.paths import REPO_ROOT
from jobkit.sweep import state
from jobkit.sweep.engine import Engine, Policy, SweepInterrupted, SweepStopped
from jobkit.sweep.jobs import LocalRunner, Runner, SlurmRunner

# A job's TGS is the mean of its steady window (5-14 by default): fewer steps give none, or a partial window that
# the verdict warns about, so every driver refuses them before anything is submitted.
MIN_STEPS = tgs.DEFAULT_STEADY[1] + 1
# More nodes than any sweep means: past this a typo (node[1-100000]) would queue that many jobs.
MAX_NODES = 10_000

# After the scheduler lets a job go, how long to wait for its log's JOB SUMMARY (shared filesystems lag).
FOOTER_GRACE = 30.0


def resolve_model(name: str, repo: Path = REPO_ROOT) -> str:
    """The config name utils/lib/resolve_model.sh gives NAME (exact, alias, unique part); SweepError if none."""
    script = 'source "$1/utils/lib/resolve_model.sh" && resolve_model "$2" "$1/configs"'
    result = subprocess.run(["bash", "-c", script, "jobkit", str(repo), name], capture_output=True, text=True)
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"unknown model {name!r}"
        raise state.SweepError(message.removeprefix("jobkit: "))
    return result.stdout.strip()


def parse_nodes(text: str | None, need: int = 1, local: bool = False) -> tuple[str, ...]:
    """-w NODES (Slurm list syntax) as a tuple; checks duplicates and that there are at least NEED."""
    if local:
        if text:
            raise state.SweepError("-w names Slurm nodes; --local runs on this machine only (drop -w or --local)")
        return ()
    if not text:
        raise state.SweepError("give the nodes to pin the sweep to with -w (e.g. -w 'node[1-4]'); sweeps never float")
    try:
        nodes = tuple(expand_nodelist(text))
    except ValueError as exc:
        raise state.SweepError(
            f"-w {text!r} is not a node list ({exc}); write e.g. node1,node2 or 'node[1-4]'"
        ) from exc
    if len(nodes) > MAX_NODES:
        raise state.SweepError(
            f"-w {text!r} names {len(nodes):,} nodes; a sweep takes at most {MAX_NODES:,} (split it)"
        )
    seen: set[str] = set()
    dupes = sorted({n for n in nodes if n in seen or seen.add(n)})
    if dupes:
        raise state.SweepError(f"-w {text!r} names {', '.join(dupes)} more than once; list each node once")
    if len(nodes) < need:
        raise state.SweepError(f"-w {text!r} has {len(nodes)} node(s) but -N is {need}; give at least {need} nodes")
    return nodes


def with_steps(extra: tuple[str, ...], steps: int) -> tuple[str, ...]:
    """EXTRA with steps=STEPS appended unless the user set steps= themselves."""
    return extra if any(a.startswith("steps=") for a in extra) else (*extra, f"steps={steps}")


def _too_few_steps(what: str) -> str:
    first, last = tgs.DEFAULT_STEADY
    return (
        f"{what} is below {MIN_STEPS}: a job's TGS is its steady steps {first}-{last}, so it needs steps>={MIN_STEPS}"
    )


class Steps(click.IntRange):
    """--steps of every driver: a whole number of at least MIN_STEPS."""

    def __init__(self):
        super().__init__(min=MIN_STEPS)

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(_too_few_steps(repr(str(value))), param, ctx)


def steps_option(func):
    first, last = tgs.DEFAULT_STEADY
    help_text = f"Steps per job (TGS from steps {first}-{last})."
    return click.option("--steps", type=Steps(), default=MIN_STEPS, show_default=True, help=help_text)(func)


def check_steps(params: dict) -> None:
    """The steps a sweep's jobs run (steps= after --, else --steps) are at least MIN_STEPS; JobkitError if not."""
    given = [a.partition("=")[2] for a in params.get("extra") or () if a.startswith("steps=")]
    if given:
        what = f"steps={given[-1]} after --"
        try:
            steps = int(given[-1])
        except ValueError:
            raise JobkitError("sweep", f"{what} is not a whole number of steps; e.g. steps={MIN_STEPS}") from None
    else:
        what, steps = f"--steps {params.get('steps')}", params.get("steps", MIN_STEPS)
    if steps < MIN_STEPS:
        raise JobkitError("sweep", _too_few_steps(what))


def default_id(driver: str, model: str) -> str:
    return f"{driver}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


def options(func):
    """The options every driver takes."""
    decorators = [
        click.option("--id", "sweep_id", help="Sweep id (default <driver>-<model>-<time>); an existing id resumes."),
        click.option("--local", is_flag=True, help="Run each job with run_local.sh on this machine, one at a time."),
        click.option("--serial", is_flag=True, help="One job at a time on Slurm too (nodes that share hardware)."),
        click.option(
            "--hang-after",
            type=clitypes.SECONDS,
            default=900,
            show_default=True,
            help="A running job with no new step for this many seconds is a hang.",
        ),
        click.option("--poll", type=clitypes.SECONDS, default=10, show_default=True, help="Seconds between checks."),
        click.option("--max-retries", type=click.IntRange(0, 5), default=2, show_default=True),
        click.option(
            "--sbatch-arg",
            "sbatch_args",
            multiple=True,
            help="Extra sbatch argument for every job (repeat), e.g. --sbatch-arg=--time=30:00.",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


# The sbatch options a sweep passes on (--sbatch-arg), and `resume` replays from plan.json: where and how
# long the jobs run. Not where their output goes, which directory or environment they start in, their name,
# or a script of their own (--output, --chdir, --export, -J, --wrap, a stray word sbatch would take for the
# batch script...): submit.sh sets those, and a plan edited by someone else must not.
SBATCH_VALUE_OPTIONS = {
    "--partition": "-p",
    "--time": "-t",
    "--time-min": None,
    "--account": "-A",
    "--qos": "-q",
    "--reservation": None,
    "--gres": None,
    "--gpus": "-G",
    "--gpus-per-node": None,
    "--gpus-per-task": None,
    "--gpus-per-socket": None,
    "--constraint": "-C",
    "--mem": None,
    "--mem-per-cpu": None,
    "--mem-per-gpu": None,
    "--cpus-per-task": "-c",
    "--cpus-per-gpu": None,
    "--ntasks": "-n",
    "--ntasks-per-node": None,
}
SBATCH_FLAGS = {"--exclusive"}  # takes its value only as --exclusive=...: never the next word
# Which nodes a job runs on is the sweep's own choice (-w, -N per point; its records name them): submit.sh puts
# --sbatch-arg after the sweep's -w, and sbatch's last -w wins, so one here would move jobs off their nodes.
SBATCH_NODE_OPTIONS = {"--nodes": "-N", "--nodelist": "-w", "--exclude": "-x"}
_SHORT = {short: long for long, short in SBATCH_VALUE_OPTIONS.items() if short}
_NODE_NAMES = {*SBATCH_NODE_OPTIONS, *SBATCH_NODE_OPTIONS.values()}


def check_sbatch_args(args: tuple[str, ...] | list[str]) -> None:
    """Raises JobkitError (one line) unless every word of ARGS is an allowed sbatch option or its value, read
    the way sbatch's getopt reads them."""
    allowed = ", ".join([*(f"{s + '/' if s else ''}{long}" for long, s in SBATCH_VALUE_OPTIONS.items()), *SBATCH_FLAGS])

    def refuse(word: str) -> JobkitError:
        return JobkitError("sweep", f"sbatch argument {word!r} is not one a sweep passes on; use only {allowed}")

    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        name = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        if name in SBATCH_FLAGS:
            i += 1
            continue
        if name in _NODE_NAMES:  # a getopt prefix of one (--nodel) is refused below as not allowed
            raise JobkitError(
                "sweep",
                f"sbatch argument {word!r} would move the sweep's jobs off the nodes it pins and records;"
                " name the nodes with the sweep's own -w (and -N), not --sbatch-arg",
            )
        if name not in SBATCH_VALUE_OPTIONS and name not in _SHORT:
            raise refuse(word)
        attached = "=" in word if word.startswith("--") else len(word) > 2
        if not attached and (i + 1 >= len(words) or words[i + 1].startswith("-")):
            # A value that looks like an option ('--' above all, where submit.sh splits its arguments) is refused.
            raise JobkitError("sweep", f"sbatch argument {word!r} needs a value (as {_SHORT.get(name, name)}=VALUE)")
        i += 1 if attached else 2


def runner_for(sweep: state.Sweep, params: dict) -> Runner:
    env = dict(os.environ, JOB_WORKSPACE=str(state.workspace()))
    if params.get("local"):
        return LocalRunner(sweep.path / "console", env=env)
    return SlurmRunner(env=env, sbatch_args=tuple(params.get("sbatch_args") or ()))


# A test can set this to build its own runner (recorded outcomes) instead of Slurm / run_local.
RUNNER_FACTORY: Callable[[state.Sweep, dict], Runner] = runner_for


def execute(driver: str, model: str, body: Callable[[Engine], str]) -> None:
    """Run BODY (which returns the summary markdown) as the sweep of DRIVER that the current command names.

    The settings stored for `resume` are the command's own parsed parameters (click's ctx.params, which
    `ctx.invoke` fills in the same way), so no driver lists its options a second time."""
    params = dict(click.get_current_context().params)
    sweep_id = params.get("sweep_id") or default_id(driver, model)
    stored = {k: v for k, v in params.items() if k != "sweep_id"}
    check_sbatch_args(params.get("sbatch_args") or ())
    check_steps(params)
    try:
        sweep, resumed = state.start(sweep_id, driver, _jsonable(stored))
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    policy = Policy(
        hang_after=params["hang_after"],
        max_retries=params["max_retries"],
        poll=params["poll"],
        serial=params["serial"],
        footer_grace=FOOTER_GRACE,
    )
    engine = Engine(sweep, RUNNER_FACTORY(sweep, params), policy, echo=lambda s: click.echo(s))
    click.echo(f"[sweep] {'resuming' if resumed else 'started'} {sweep.id} in {sweep.path}")
    restore_signals = engine.guard_signals()
    try:
        summary = body(engine)
    except SweepInterrupted as exc:
        engine.interrupted(exc)
        click.echo(f"[sweep] interrupted; resume with: jobkit sweep resume {sweep.id}", err=True)
        exit_with(SIGNAL_BASE + exc.signum)
    except SweepStopped as exc:
        engine.cancel_all()
        sweep.set_state(state.STOPPED, str(exc))
        raise JobkitError("sweep", f"sweep {sweep.id} stopped: {exc}", EXIT_STOPPED) from None
    except state.SweepError as exc:
        engine.cancel_all()
        sweep.set_state(state.STOPPED, str(exc))
        raise JobkitError("sweep", str(exc)) from None
    finally:
        restore_signals()
    sweep.write_summary(summary)
    sweep.set_state(state.FINISHED)
    click.echo("")
    click.echo(summary.rstrip())
    click.echo(f"\n[sweep] {sweep.id} finished; summary: {sweep.summary_file}")


def _jsonable(params: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


def driver_command(name: str):
    """A driver's click command NAME with the options every driver shares (jobkit/sweep/cli.py lists it)."""

    def wrap(func):
        return click.command(name)(options(func))

    return wrap


# --- noise: one definition of spread and band for every driver that names a winner ---
def spread(values: Sequence[float]) -> float | None:
    """The full range of VALUES (max - min) as a percentage of their mean; None with fewer than two."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / mean * 100 if mean else None


def noise_band(groups: Iterable[Sequence[float]], floor: float) -> tuple[float, bool]:
    """(band in %, measured?): the largest spread of GROUPS (each the runs of one setting), at least FLOOR;
    FLOOR and unmeasured when no group has two runs."""
    spreads = [s for s in (spread(g) for g in groups) if s is not None]
    return (max(floor, *spreads), True) if spreads else (floor, False)


def above(value: float, reference: float) -> float:
    """VALUE relative to REFERENCE, in percent (+2.0: 2 % higher)."""
    return (value - reference) / reference * 100


@dataclass(frozen=True)
class Pick:
    """The choice among settings by mean TGS: `chosen`, the one with the `best` mean, and `tied` (within the
    band of the best, best first; just [best] when the best beats the runner-up by more than the band)."""

    chosen: Hashable
    best: Hashable
    tied: tuple
    band: float

    @property
    def is_tie(self) -> bool:
        return len(self.tied) > 1


def pick(means: dict, band: float, tie_rule: Callable[[list], Hashable]) -> Pick | None:
    """The winner of MEANS (setting -> mean TGS) under BAND; TIE_RULE(tied settings) chooses on a tie."""
    if not means:
        return None
    ranked = sorted(means, key=lambda k: -means[k])
    best = ranked[0]
    tied = tuple(k for k in ranked if means[best] <= 0 or above(means[best], means[k]) <= band)
    return Pick(tie_rule(list(tied)) if len(tied) > 1 else best, best, tied, band)


# --- tables ---
def table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table (what summary.md and the terminal show)."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    fmt = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"  # noqa: E731
    return "\n".join([fmt(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)]) + "\n"


def fmt_tgs(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "—"


def fmt_pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def fmt_status(outcome) -> str:
    if outcome.passed:
        return "PASS"
    if outcome.status == "HANG":
        return f"HANG ({outcome.detail})"
    if outcome.status == "SKIPPED":
        return f"SKIPPED ({outcome.reason})"
    return "OOM" if outcome.is_oom else f"FAIL ({outcome.reason})"
