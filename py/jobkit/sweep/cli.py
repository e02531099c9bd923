"""`jobkit sweep`: the click group. Drivers register themselves in their own modules (imported below)."""

from __future__ import annotations

import click

from jobkit.sweep import state
from jobkit.sweep.common import fail


@click.group("sweep")
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
    for sweep in sweeps:
        plan = sweep.plan()
        done = len(sweep.done())
        click.echo(
            f"{sweep.id:40} {plan.get('driver', '?'):8} {plan.get('state', '?'):12} {done:>5}  {plan.get('created', '')}"
        )


@group.command("resume")
@click.argument("sweep_id")
@click.pass_context
def resume_command(ctx, sweep_id):
    """Run sweep SWEEP_ID again with its own settings; finished points are not run again."""
    try:
        sweep = state.open_sweep(sweep_id)
        plan = sweep.plan()
    except state.SweepError as exc:
        fail(str(exc))
    if plan.get("state") == state.FINISHED:
        fail(f"sweep {sweep_id} already finished (results in {sweep.summary_file}); start a new one with another --id")
    command = group.commands.get(plan.get("driver", ""))
    if command is None:
        fail(f"sweep {sweep_id}: plan.json names no known driver ({plan.get('driver')!r})")
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in plan["params"].items()}
    ctx.invoke(command, **params, sweep_id=sweep_id)


# The drivers add their commands to `group` when imported.
from jobkit.sweep import batch, models, network, nodes, xla  # noqa: E402,F401
