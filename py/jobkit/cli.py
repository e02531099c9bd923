"""`jobkit`: the one command line of the Python side; every tool is a subcommand of `main`.

tgs (throughput report), mfu (peak table) and why (failure reason) live here. The others live in their own
modules and are imported only when run (see SUBCOMMANDS), so `jobkit tgs` on a login node does not pay for
Ray's or TensorBoard's imports.

Errors are one line on stderr with a non-zero exit: 1 = bad input (log file
missing or unreadable, bad --steady), 2 = usage error or no step lines, 3 = no NNODES header.
"""

import importlib
import json
import os
import sys
from pathlib import Path

import click

from jobkit import failures, gpu, logparse, tgs
from jobkit.mfu import ENV_PEAK
from jobkit.nodelist import expand_nodelist
from jobkit.peaks import PEAK_TFLOPS, format_row

EXIT_BAD_INPUT, EXIT_NO_STEPS, EXIT_NO_NNODES = 1, 2, 3
REPO_ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("SUCCESS", "FAILED", "CANCELLED", "HANG", "STOPPED")


def _fail(command: str, message: str, code: int):
    click.echo(f"jobkit {command}: {message}", err=True)
    sys.exit(code)


def _load(command: str, path: str) -> logparse.JobLog:
    try:
        return logparse.load(path)
    except logparse.LogError as exc:
        _fail(command, str(exc), EXIT_BAD_INPUT)


def default_yml(log: logparse.JobLog) -> str | None:
    # The launcher's model configs live in <repo>/configs/<MODEL_NAME>.yml.
    model = log.header.get("MODEL_NAME")
    if not model:
        return None
    for name in (f"{model}.yml", f"{model}.gpu.yml"):
        candidate = REPO_ROOT / "configs" / name
        if candidate.is_file():
            return str(candidate)
    return None


def resolve_status(status: str | None, exit_code: int | None, log: logparse.JobLog) -> str | None:
    """--status, else the log's JOB SUMMARY, else the exit code; None if unknown."""
    if status:
        return status.upper()
    if log.footer_status:
        return log.footer_status
    if exit_code is not None:
        return "SUCCESS" if exit_code == 0 else "FAILED"
    return None


def verdict(log: logparse.JobLog, status: str | None, exit_code: int | None) -> str:
    """`PASS`, `STOPPED early ...`, `FAIL (<reason class>)` or `status unknown`."""
    status = resolve_status(status, exit_code, log)
    if status is None:
        return "status unknown"
    if status == "SUCCESS":
        return "PASS"
    if status == "STOPPED":
        return "STOPPED early (not a full run; see the JOB SUMMARY)"
    if exit_code is None:
        exit_code = log.footer_exit
    found = failures.classify(failures.read_tail(log.path), status, exit_code, has_steps=bool(log.entries))
    return f"FAIL ({found.reason})"  # the class only; `jobkit why` gives detail and evidence


# name -> "module:attribute" of a click command or group, imported on first use.
SUBCOMMANDS = {
    "exporter": "jobkit.exporter:command",
    "tb-bridge": "jobkit.tb_bridge:group",
    "tsdb": "jobkit.tsdb:group",
    "ray-launch": "jobkit.ray_driver:command",
    "ray-start": "jobkit.ray_start:command",
    "sweep": "jobkit.sweep.cli:group",
    "image-info": "jobkit.image_info:command",
    "hang-watchdog": "jobkit.hang_watchdog:command",
    "jobs": "jobkit.jobs:jobs_command",
    "tail": "jobkit.jobs:tail_command",
    "notify": "jobkit.notify:command",
    "requeue": "jobkit.requeue:command",
    "analyze": "jobkit.analysis.command:command",
    "compare": "jobkit.analysis.compare:command",
    "monitor": "jobkit.monitor:command",
    "tag": "jobkit.jobtag:command",
    "artifacts": "jobkit.artifacts:group",
    "dashboard": "jobkit.dashboard:command",
    "profile": "jobkit.profile:command",
    "hlo": "jobkit.hlo:command",
}


class LazyGroup(click.Group):
    """A click group whose SUBCOMMANDS are imported when they are run or listed, not at start-up."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *SUBCOMMANDS])

    def get_command(self, ctx, name):
        if name in SUBCOMMANDS:
            module, attr = SUBCOMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Launch, observe and read MaxText jobs: logs, MFU, metrics, Ray, TSDBs."""


@main.command(
    "launch",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch_command(args):
    """Run MaxText training: launch <config.yml> [key=value ...] (arguments reach MaxText untouched)."""
    # Imported here: the training entry wraps stdout for MFU, which no other command wants.
    from jobkit import launch

    if not args or args[0] in ("-h", "--help"):
        click.echo(launch.USAGE.replace("python -m jobkit.launch", "jobkit launch"))
        click.echo(launch.__doc__.split("\n\n", 1)[1].rstrip())
        sys.exit(0 if args else launch.EXIT_SETUP)
    launch.finish(launch.main(list(args)))


@main.command("tgs")
@click.argument("logfile")
@click.option("--steady", default="5:14", show_default=True, help="Steady window FIRST:LAST (inclusive steps).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--line", "as_line", is_flag=True, help="Print the one-line end-of-run summary.")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False), help="How the run ended (for --line).")
@click.option("--exit-code", type=int, help="The run's exit code (for --line).")
@click.option("--config", "yml", help="MaxText yml of the run (profiler window); default configs/<MODEL_NAME>.yml.")
def tgs_command(logfile, steady, as_json, as_line, status, exit_code, yml):
    """Throughput report for LOGFILE: windows table, --json, or --line."""
    try:
        window = tgs.parse_steady(steady)
    except ValueError as exc:
        _fail("tgs", str(exc), EXIT_BAD_INPUT)
    log = _load("tgs", logfile)
    if log.nnodes is None:
        found = log.nnodes_header
        if found is None:
            _fail("tgs", f"{logfile}: no NNODES= header line (not a job log?)", EXIT_NO_NNODES)
        _fail(
            "tgs",
            f"{logfile}: header line {found[0]}={found[1]!r} is not a number of nodes; "
            "fix that line of the header (the job's node count) and rerun",
            EXIT_NO_NNODES,
        )
    summary = tgs.summarize(log, window, yml or default_yml(log))
    if as_line:
        click.echo(tgs.format_line(summary, verdict(log, status, exit_code)))
        return
    if not log.entries:
        _fail(
            "tgs",
            f"{logfile}: no 'completed step' lines (runs need steps>={window[1] + 1} for a steady TGS)",
            EXIT_NO_STEPS,
        )
    if as_json:
        click.echo(json.dumps(tgs.to_dict(summary), indent=2))
    else:
        click.echo(tgs.format_table(summary))


@main.command("mfu")
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


@main.command("why")
@click.argument("logfile")
@click.option("--status", type=click.Choice(STATUSES, case_sensitive=False))
@click.option("--exit-code", type=int)
def why_command(logfile, status, exit_code):
    """Classify why the run in LOGFILE failed; after a crash, where its core dump is and how to open it."""
    from jobkit import coredump

    log = _load("why", logfile)
    nodes = expand_nodelist(log.header.get("JOB_NODELIST", ""))
    if exit_code is None:
        exit_code = log.footer_exit  # the JOB SUMMARY's: a signal's exit code names the signal
    text = failures.read_tail(logfile)
    found = failures.classify(text, status, exit_code, has_steps=bool(log.entries), nodes=nodes)
    click.echo(found.label)
    if found.evidence:
        click.echo(f"  evidence: {found.evidence}")
    if found.host:
        click.echo(f"  host: {found.host}")
    signal_name = found.detail if found.reason == "killed-by-signal" else None
    for line in coredump.report(text, logfile, signal_name):
        click.echo(line)
