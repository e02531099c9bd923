"""`jobkit`: the one command line of the Python side. This module is the group and its command table, nothing more.

Each command lives in the subpackage of its concern and is imported only when it runs (pip's command table):
listing the commands (`jobkit --help`) reads their one-line summaries from COMMANDS and imports none of them,
so a login node pays for Ray's, TensorBoard's or matplotlib's import only in the command that needs it.

Errors reach the user through `jobkit.core.errors.JobkitError`, which click's own top-level handler turns into
one line on stderr and the error's exit code (the table of codes: jobkit.core.errors). The group is also the
edge for what no command expected (_Edge): an exception becomes one line and EXIT_INTERNAL, its traceback a
private file; Ctrl-C is EXIT_INTERRUPTED; a reader that closed the pipe (`jobkit jobs | head`) ends it quietly.
"""

import errno
import os
import sys

import click

from jobkit.core import errors
from jobkit.core.lazy_group import CommandTable, LazyGroup

# name -> ("module:attribute" of a click command or group, its one-line summary for the listing).
# tests/py/test_cli.py checks every summary against its command's own help, so the two cannot drift apart.
COMMANDS: CommandTable = {
    "tgs": ("jobkit.core.commands:tgs_command", "Throughput report for LOGFILE: windows table, --json, or --line."),
    "why": (
        "jobkit.ops.why:why_command",
        "Classify why the run in LOGFILE failed; after a crash, where its core dump is and how to open it.",
    ),
    "mfu": (
        "jobkit.launch.commands:mfu_command",
        "Detected accelerator and its peak row, or the known-accelerator table.",
    ),
    "launch": (
        "jobkit.launch.commands:launch_command",
        "Run MaxText training: launch <config.yml> [key=value ...] (arguments reach MaxText untouched).",
    ),
    "procs": (
        "jobkit.launch.commands:procs_command",
        "Run COMMAND as LOCAL_WORLD_SIZE processes on this node, one per device (LOCAL_RANK, GLOBAL_RANK, NPROCS).",
    ),
    "jobs": (
        "jobkit.ops.jobs:jobs_command",
        "The workspace's jobs, oldest first: id, name, nodes, status, wall time, steady-state TGS/device, attempt, "
        "metrics, why (a failed job's class@host).",
    ),
    "tail": (
        "jobkit.ops.jobs:tail_command",
        "Follow JOB's log: `latest`, a job id, a unique part of its name, or its log / job dir path.",
    ),
    "tag": (
        "jobkit.ops.jobtag:command",
        "Add the steady-state TGS/device to JOB's log and job dir names (JOB: latest, id, name part or path).",
    ),
    "artifacts": (
        "jobkit.ops.artifacts:group",
        "The code snapshots submit.sh makes for each job ($JOB_WORKSPACE/.artifacts/).",
    ),
    "monitor": (
        "jobkit.ops.monitor:command",
        "Follow jobs (JOBS ids, a --sweep, else all of yours) and report what happens to them.",
    ),
    "notify": (
        "jobkit.ops.notify:command",
        "Send TEXT to your notification targets (apprise URLs: --url, $JOBKIT_NOTIFY_URLS or the config file).",
    ),
    "requeue": (
        "jobkit.ops.requeue:command",
        "Submit the job of LOG again when its outcome is worth another attempt, at most MAX_RETRIES times.",
    ),
    "hang-watchdog": (
        "jobkit.ops.hang_watchdog:command",
        "Watch this node's training for a hang (settings: HANG_TIMEOUT, HANG_COMPILE_TIMEOUT, HANG_STEP_FACTOR, HANG_ACTION; JAX_HEARTBEAT_TIMEOUT is checked with them; identity: JOB_ID, NODE_RANK, NNODES from the environment).",
    ),
    "exporter": (
        "jobkit.observe.exporter:command",
        "Serve this node's plugin metrics on http://ADDRESS:PORT/metrics, collected every --interval seconds.",
    ),
    "tb-bridge": (
        "jobkit.observe.tb_bridge:group",
        "TensorBoard scalars as Prometheus gauges: live (serve) and after the job (backfill).",
    ),
    "tsdb": ("jobkit.observe.tsdb:group", "Browse a job's Prometheus TSDB after the job."),
    "ray-launch": ("jobkit.observe.ray_driver:command", "Run a command on every node of a Ray cluster."),
    "reap": (
        "jobkit.core.commands:reap_command",
        "Run ARGV... as a child subreaper: what it leaves behind (a daemon that detached, like Ray's GCS) stays in the job's process tree and is stopped when it ends.",
    ),
    "metrics-state": (
        "jobkit.core.commands:metrics_state_command",
        "Whether each RAY=1 job's metrics were on: its TSDB, or off and the reason its log gives.",
    ),
    "ray-start": (
        "jobkit.observe.ray_start:command",
        "Run `ray start ARGS...` with Ray's CLI minus its serve/job/state groups (faster to import).",
    ),
    "bridge": (
        "jobkit.bridge.commands:group",
        "Serve cluster commands to agents in containers, under a policy (serve, stop, status, log, policy).",
    ),
    "analyze": (
        "jobkit.analysis.command:command",
        "Analyse JOB (a job id, part of its name, its log or dir, or `latest`): writes analysis.json and a self-contained report.html under <job dir>/analysis/ and prints a summary.",
    ),
    "compare": (
        "jobkit.analysis.compare:command",
        "Compare jobs side by side: TGS, MFU and step time with spread, loss at the last common step, and the header and environment differences that could explain a gap.",
    ),
    "dashboard": (
        "jobkit.analysis.dashboard_command:command",
        "A static page over every job in the workspace: a sortable, filterable table and TGS per model over time, linking each job's `jobkit analyze` report.",
    ),
    "profile": (
        "jobkit.analysis.profile:command",
        "Summarise JOB's captured profile: step-time composition, op time per category, the top ops.",
    ),
    "hlo": (
        "jobkit.analysis.hlo:command",
        "Collectives (count / bytes of the result) and fusions per HLO module of JOB's XLA dump.",
    ),
    "sweep": (
        "jobkit.sweep.cli:group",
        "Run a family of real jobs and rank them: batch size, nodes, network, models, XLA flags.",
    ),
    "image-info": (
        "jobkit.image.info:command",
        "What IMAGE (a name, or an image tarball) holds for a run: Python, JAX, MaxText, ROCm/CUDA, RCCL/NCCL.",
    ),
}


_ASKED = "jobkit.command"  # ctx.meta key: the command name the user typed


class _Edge(LazyGroup):
    """The root group: click's own handling of usage errors (2), JobkitError and explicit exits is kept; what
    else leaves a command is turned into a code of the table here, once for every command."""

    def resolve_command(self, ctx, args):
        ctx.meta[_ASKED] = args[0] if args else None  # named by an error while loading it (a failed import)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo(err=True)  # closes the terminal's ^C echo, as click does
            errors.exit_with(errors.EXIT_INTERRUPTED)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise errors.internal_error(_command_of(ctx, exc), exc) from None
            _quiet_stdout()
            errors.exit_with(errors.SIGNAL_BASE + 13)  # as if SIGPIPE had stopped it, which Python ignores
        except Exception as exc:
            raise errors.internal_error(_command_of(ctx, exc), exc) from None


def _command_of(ctx: click.Context, exc: BaseException) -> str:
    """The command path EXC left ('tsdb view'): the innermost click context in its traceback, below the root."""
    inner = ctx
    tb = exc.__traceback__
    while tb is not None:
        found = tb.tb_frame.f_locals.get("ctx")
        if isinstance(found, click.Context):
            inner = found
        tb = tb.tb_next
    names = []
    while inner is not None and inner.parent is not None:
        names.append(inner.info_name or "")
        inner = inner.parent
    return " ".join(reversed(names)) or ctx.invoked_subcommand or ctx.meta.get(_ASKED) or "?"


def _quiet_stdout() -> None:
    """stdout onto /dev/null: the interpreter's last flush into the closed pipe then says nothing."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


@click.group(cls=_Edge, table=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Launch, observe and read MaxText jobs: logs, MFU, metrics, Ray, TSDBs."""
