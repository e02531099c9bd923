"""`jobkit launch` (the training entry, hand-parsed), `jobkit procs` (a process per device) and `jobkit mfu` (the
detected accelerator's peak): click only."""

import os

import click

from jobkit.core.errors import EXIT_CANNOT_RUN, EXIT_OK, EXIT_SETTINGS, EXIT_USAGE, JobkitError, exit_with
from jobkit.launch import gpu
from jobkit.launch.mfu import ENV_PEAK
from jobkit.launch.peaks import PEAK_TFLOPS, format_row


@click.command(
    "launch",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch_command(args):
    """Run MaxText training: launch <config.yml> [key=value ...] (arguments reach MaxText untouched)."""
    # Imported here: the training entry wraps stdout for MFU, which no other command wants.
    from jobkit.launch import entry

    if not args or args[0] in ("-h", "--help"):
        click.echo(entry.USAGE.replace("python -m jobkit.launch", "jobkit launch"))
        click.echo(entry.__doc__.split("\n\n", 1)[1].rstrip())
        exit_with(EXIT_OK if args else EXIT_USAGE)
    entry.finish(entry.main(list(args)))


@click.command("mfu")
@click.option("--list", "show_all", is_flag=True, help="Print the whole peak table.")
def mfu_command(show_all):
    """Detected accelerator and its peak row, or the known-accelerator table."""
    override = os.environ.get(ENV_PEAK, "").strip()
    if override and override.lower() not in ("0", "auto"):
        click.echo(f"override: {ENV_PEAK}={override} (used instead of the table)")
    found = gpu.detect()
    if found and found.model:
        click.echo(f"detected: {found.raw} (via {found.tool}) -> {found.model}")
        click.echo(format_row(found.model) + "   dense TFLOP/s per device")
        if not show_all:
            return
    elif found:
        click.echo(f"unknown accelerator: {found.raw} (via {found.tool}); set {ENV_PEAK}=<dense peak per device>")
    else:
        click.echo(f"no known accelerator detected (rocminfo, amd-smi, nvidia-smi); set {ENV_PEAK} to report MFU")
    click.echo("known accelerators (dense TFLOP/s per device):")
    for model in PEAK_TFLOPS:
        click.echo("  " + format_row(model))


@click.command("procs", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--check", is_flag=True, help=f"Only check LOCAL_WORLD_SIZE (with NNODES, NODE_RANK); exit {EXIT_SETTINGS} if bad."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def procs_command(check, command):
    """Run COMMAND as LOCAL_WORLD_SIZE processes on this node, one per device (LOCAL_RANK, GLOBAL_RANK, NPROCS)."""
    from jobkit.launch import procs

    try:
        layout = procs.Layout.from_env(os.environ)
    except procs.LayoutError as exc:
        raise JobkitError("procs", str(exc), EXIT_SETTINGS) from exc
    if check:
        click.echo(layout.line())
        return
    if not command:
        raise JobkitError("procs", "no command given; usage: jobkit procs -- <command> [args...]", EXIT_USAGE)
    try:
        rc = procs.main(command)
    except OSError as exc:
        raise JobkitError("procs", f"cannot start {command[0]}: {exc.strerror}", EXIT_CANNOT_RUN) from exc
    exit_with(rc)  # the first failed process's status (procs.main), passed on
