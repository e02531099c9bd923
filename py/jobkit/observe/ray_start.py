"""`jobkit ray-start [ray start args...]`: Ray's own `ray start`, without the CLI groups it never needs.

Ray's CLI module imports the command groups of `ray serve`, `ray job` and `ray list/get/logs/summary` only to
offer them; each import sits inside try/except ImportError. Marking those modules as absent (None in
sys.modules) makes the CLI skip them: 0.7 s instead of 2 s of imports on the critical path of every node's start.
utils/lib/ray_cluster.sh runs this with the interpreter of the `ray` console script it found, so it is the same
Ray; a `ray` that is not Ray's Python console script is run as it is there.
"""

import sys

import click

# The CLI groups `ray start` does not need, by the module that defines each.
UNNEEDED_CLI_MODULES = ("ray.serve.scripts", "ray.dashboard.modules.job.cli", "ray.util.state.state_cli")


def slim_ray_cli() -> click.Group:
    """Ray's top-level click group, imported without the unneeded groups."""
    for name in UNNEEDED_CLI_MODULES:
        sys.modules.setdefault(name, None)  # an import already done (by whoever) stays usable
    from ray.scripts.scripts import cli

    return cli


@click.command(
    "ray-start",
    add_help_option=False,  # --help is `ray start --help`
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args):
    """Run `ray start ARGS...` with Ray's CLI minus its serve/job/state groups (faster to import)."""
    sys.exit(slim_ray_cli().main(["start", *args], prog_name="ray"))
