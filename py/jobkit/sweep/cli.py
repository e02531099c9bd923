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


@group.command("resume")
@click.argument("sweep_id")
@click.pass_context
def resume_command(ctx, sweep_id):
    """Run sweep SWEEP_ID again with its own settings; finished points are not run again."""
    try:
        sweep = state.open_sweep(sweep_id)
        plan = sweep.trusted_plan()
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    if plan.get("state") == state.FINISHED:
        raise JobkitError(
            "sweep",
            f"sweep {sweep_id} already finished (results in {sweep.summary_file}); start a new one with another --id",
        )
    driver = plan.get("driver", "")
    command = group.get_command(ctx, driver) if driver in DRIVERS else None
    if command is None:
        raise JobkitError("sweep", f"sweep {sweep_id}: plan.json names no known driver ({plan.get('driver')!r})")
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in plan["params"].items()}
    ctx.invoke(command, **params, sweep_id=sweep_id)
