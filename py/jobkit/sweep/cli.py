"""`jobkit sweep`: the click group, its `list` and `resume`, and the table of drivers (imported when run).

The drivers are plain click commands in their own modules; this group names them in DRIVERS and imports one
only when it runs, so no driver imports the group and `jobkit sweep --help` imports none of them.
"""

from __future__ import annotations

import click

from jobkit.core.errors import JobkitError
from jobkit.core.lazy_group import CommandTable, LazyGroup
from jobkit.sweep import state

# name -> ("module:attribute", summary); `resume` runs a sweep again through the driver its plan.json names.
DRIVERS: CommandTable = {
    "batch": (
        "jobkit.sweep.batch:command",
        "Find the value of --param (per_device_batch_size) with the highest steady TGS for MODEL.",
    ),
    "models": (
        "jobkit.sweep.models:command",
        "Every model of the table at its node counts, each always on the same nodes; one commit or two side by side.",
    ),
    "network": (
        "jobkit.sweep.network:command",
        "All NODES in one job of MODEL; if slower than expected, bisect to the node or link to blame.",
    ),
    "nodes": (
        "jobkit.sweep.nodes:command",
        "One 1-node job of MODEL per node; TGS vs the median; the healthy nodelist.",
    ),
    "xla": (
        "jobkit.sweep.xla:command",
        "Rank the tuning profiles of a catalog for MODEL against the deployed baseline, by real TGS.",
    ),
}


@click.group("sweep", cls=LazyGroup, table=DRIVERS)
def group():
    """Run a family of real jobs and rank them: batch size, nodes, network, models, XLA flags.

    Every job goes through submit.sh (Slurm, pinned with -w) or run_local.sh (--local), is watched until
    it ends, and lands as one verdict line; state lives in $JOB_WORKSPACE/sweeps/<id>/ so an interrupted
    sweep resumes where it stopped.
    """


@group.command("list")
def list_command():
    """Sweeps in $JOB_WORKSPACE/sweeps: id, driver, state, points done, created."""
    sweeps = state.list_sweeps()
    if not sweeps:
        click.echo(f"no sweeps in {state.sweeps_dir()}")
        return
    click.echo(f"{'ID':40} {'DRIVER':8} {'STATE':12} {'DONE':>5}  CREATED")
    damaged = []
    for sweep in sweeps:
        try:
            plan = sweep.plan()
            done = str(len(sweep.done()))
        except (state.SweepError, OSError, ValueError, KeyError, TypeError) as exc:
            # One damaged sweep dir is marked and the list goes on; why is said once below the table.
            damaged.append(
                str(exc)
                if isinstance(exc, state.SweepError)
                else f"sweep {sweep.id}: cannot read {sweep.points_file} ({exc!r})"
            )
            click.echo(f"{sweep.id:40} {'?':8} {'UNREADABLE':12} {'?':>5}")
            continue
        click.echo(
            f"{sweep.id:40} {plan.get('driver', '?')!s:8} {plan.get('state', '?')!s:12} {done:>5}  {plan.get('created', '')}"
        )
    for reason in damaged:
        click.echo(f"jobkit sweep list: {reason}", err=True)


# What `resume` may change in a sweep's settings: how its jobs are watched, and the budget of a search, which may
# only grow (a larger --max-runs lets the batch probe go on where --max-runs stopped it, even after it finished).
# Anything else would make the recorded points answer a different sweep.
RAISES = ("max_runs",)
# Options a driver gained after some plans were written, with the value that means what those plans ran: an
# older batch sweep ran each value once, and its recorded points must answer for it on resume.
ADDED_LATER = {"batch": {"repeats": 1}}


@group.command("resume")
@click.argument("sweep_id")
# Taken as text and checked by the driver's own option of that name (its click type), so a value resume accepts
# is one the driver accepts, and no driver is imported to list the commands.
@click.option(
    "--max-runs",
    metavar="N",
    help="Raise the sweep's --max-runs (batch probing): it probes on from where it stopped, a finished sweep too.",
)
@click.option("--hang-after", metavar="SECONDS", help="New --hang-after for the jobs still to watch.")
@click.option("--poll", metavar="SECONDS", help="New --poll (seconds between checks).")
@click.option("--max-retries", metavar="N", help="New --max-retries for the points still to run.")
@click.pass_context
def resume_command(ctx, sweep_id, **changes):
    """Run sweep SWEEP_ID again with its own settings; finished points are not run again, and jobs that a
    killed run left queued or running are waited for, not submitted again. Options change those settings."""
    try:
        sweep = state.open_sweep(sweep_id)
        plan = sweep.trusted_plan()
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    driver = plan.get("driver", "")
    command = group.get_command(ctx, driver) if driver in DRIVERS else None
    if command is None:
        raise JobkitError("sweep", f"sweep {sweep_id}: plan.json names no known driver ({plan.get('driver')!r})")
    if not isinstance(plan.get("params"), dict):
        raise JobkitError(
            "sweep", f"sweep {sweep_id}: {sweep.plan_file} has no settings (params); it cannot be resumed"
        )
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in plan["params"].items()}
    for name, value in ADDED_LATER.get(driver, {}).items():
        params.setdefault(name, value)
    changed = _changes(ctx, sweep_id, command, params, {k: v for k, v in changes.items() if v is not None})
    extended = any(name in RAISES for name in changed)
    if plan.get("state") == state.FINISHED and not extended:
        hint = (
            f"; extend it with `jobkit sweep resume {sweep_id} --max-runs N` (N above {params['max_runs']})"
            if "max_runs" in params and not params.get("values_text")
            else "; start a new one with another --id"
        )
        raise JobkitError("sweep", f"sweep {sweep_id} already finished (results in {sweep.summary_file}){hint}")
    if changed:
        said = ", ".join(f"--{n.replace('_', '-')} {params[n]} -> {v}" for n, v in changed.items())
        params.update(changed)
        plan["params"] = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
        if plan.get("state") == state.FINISHED:
            plan.update(state=state.INTERRUPTED, reason=f"extended: {said}")
        sweep.write_plan(plan)
        click.echo(f"[sweep] {sweep_id}: {said}")
    ctx.invoke(command, **params, sweep_id=sweep_id)


def _changes(ctx, sweep_id: str, command: click.Command, params: dict, given: dict) -> dict:
    """The settings in GIVEN that differ from the sweep's PARAMS, each checked by the driver's own option type
    (JobkitError, one line, for one the driver has not, or a budget made smaller)."""
    options = {p.name: p for p in command.params}
    changed = {}
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        if name not in options or name not in params:
            raise JobkitError("sweep", f"sweep {sweep_id} ({command.name}) has no {flag}; resume it without {flag}")
        try:
            value = options[name].type.convert(value, options[name], ctx)
        except click.BadParameter as exc:
            raise JobkitError("sweep", f"{flag} {value!r}: {exc.message}") from None
        if name in RAISES:
            if params.get("values_text"):
                raise JobkitError(
                    "sweep", f"sweep {sweep_id} runs exactly its --values; {flag} bounds only the probing (drop it)"
                )
            if value < params[name]:
                raise JobkitError(
                    "sweep",
                    f"{flag} {value} is below the sweep's {params[name]}: resume only raises it (the runs done stay)",
                )
        if value != params[name]:
            changed[name] = value
    return changed
