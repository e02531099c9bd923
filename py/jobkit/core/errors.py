"""Every exit code jobkit's commands use, each with one meaning in every command, and the error type that becomes
a message and a code at the CLI's edge.

A command anywhere in the package raises `JobkitError(command, message, code)`; click's own top-level handler
prints it as one line, `jobkit <command>: <message>`, on stderr and exits with `code`. A command that has
already said what it had to say (an answer such as "not requeued" on stdout) ends with `exit_with(code)`.
No module prints-and-exits by itself, except to pass on a child's status (PASSES_THROUGH), so a message's
shape and a code's meaning are decided here alone. Anything else that escapes a command is a bug:
`internal_error` turns it into one line and EXIT_INTERNAL, its traceback into a private file (jobkit/cli.py).

The codes are few on purpose, as pip's cli/status_codes.py: a script that calls jobkit tests a code and knows
what happened, whichever command it called. MEANINGS is the table docs/architecture.md#exit-codes shows;
tests/py/test_errors.py holds the two to each other and every EXIT_* here to a value of its own.
"""

import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NoReturn

import click

EXIT_OK = 0  # success; for a yes/no question, yes
EXIT_BAD_INPUT = 1  # an input (a file, a job, a value) is missing, unreadable or unusable: the message names it
EXIT_USAGE = 2  # the command line is wrong: click's own usage errors, or arguments a command refuses unread
EXIT_NO_STEPS = 3  # the job log has no step lines (the job never trained)
EXIT_NOT_A_LOG = 4  # the file is not a job log: no JOB_ID/NNODES header, or an NNODES that is not a number
EXIT_SETTINGS = 5  # a setting (an environment variable, a config file) is refused or missing
EXIT_SETUP = 6  # something this machine must have is missing or does not work (MaxText, a container engine)
EXIT_ACTION_FAILED = 7  # the inputs were good and the action was tried, but it did not happen
EXIT_ANSWER_NO = 8  # not an error: the command's question has the answer no (the output says why)
EXIT_STOPPED = 9  # jobkit stopped what it ran or watched, on purpose: a rule said so
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in jobkit; one line, the traceback in a private file
EXIT_UNREACHABLE = 75  # EX_TEMPFAIL: nothing was started (Ray missing, cluster unreachable); run it another way
EXIT_CANNOT_RUN = 127  # the shell's code: the command to run does not exist or cannot be executed
EXIT_INTERRUPTED = 130  # 128 + SIGINT: stopped by Ctrl-C

SIGNAL_BASE = 128  # 128 + N: stopped by signal N (143: SIGTERM), as a shell reports it

# Commands whose code, once their child started, is the child's own (training's, the command's under Ray or
# the subreaper, Ray's CLI's): the table's codes are theirs only before the child starts.
PASSES_THROUGH = ("launch", "procs", "reap", "ray-launch", "ray-start")

# code -> (meaning, who gives it). The docs page's table is these rows; keep the two in step (a test does).
MEANINGS: dict[int, tuple[str, str]] = {
    EXIT_OK: ("success; for a yes/no question, yes", "every command"),
    EXIT_BAD_INPUT: (
        "an input (a file, a job, a value) is missing, unreadable or unusable; the message names it and the fix",
        "every command",
    ),
    EXIT_USAGE: (
        "the command line is wrong: an unknown option, a bad option value, a missing argument (click's own "
        "code), or arguments a command refuses before reading anything (options that exclude each other)",
        "every command",
    ),
    EXIT_NO_STEPS: ("the job log has no step lines: the job never trained", "`tgs`"),
    EXIT_NOT_A_LOG: (
        "the file is not a job log: no `JOB_ID` and `NNODES` header, or an `NNODES` that is not a number",
        "`tgs`",
    ),
    EXIT_SETTINGS: (
        "a setting is refused or missing: `HANG_*`, `JAX_HEARTBEAT_TIMEOUT`, `LOCAL_WORLD_SIZE`, `NNODES`, "
        "`NODE_RANK`, the distributed settings, the notification targets",
        "`hang-watchdog`, `procs`, `launch`, `notify`, `monitor`",
    ),
    EXIT_SETUP: (
        "something this machine must have is missing or does not work: MaxText's train module, a container "
        "engine that answers, jobkit's own libraries (click)",
        "`launch`, `image-info`, `py/bin/jobkit`",
    ),
    EXIT_ACTION_FAILED: (
        "the inputs were good and the action was tried, but it did not happen: a notification target did not "
        "take the message, the requeue's submit failed (or would fail)",
        "`notify`, `requeue`",
    ),
    EXIT_ANSWER_NO: (
        "not an error: the command's question has the answer no, and its output says why: not requeued, no "
        "hang marker of this job, no bridge server, the policy refuses the line, no scrape in time",
        "`requeue`, `hang-watchdog --marker`, `bridge status`, `bridge policy --check`, `tsdb await-scrape`",
    ),
    EXIT_STOPPED: (
        "jobkit stopped what it ran or watched, on purpose: a sweep's rule, the hang watchdog's `HANG_ACTION=cancel`",
        "`sweep`, `hang-watchdog`",
    ),
    EXIT_INTERNAL: (
        "a bug in jobkit (EX_SOFTWARE): one line naming the exception and the private file with its traceback",
        "every command",
    ),
    EXIT_UNREACHABLE: (
        "nothing was started (EX_TEMPFAIL): Ray is missing or the cluster did not answer; run it another way",
        "`ray-launch`",
    ),
    EXIT_CANNOT_RUN: ("the command to run does not exist or cannot be executed (the shell's code)", "`reap`, `procs`"),
    EXIT_INTERRUPTED: ("stopped by Ctrl-C (128 + SIGINT)", "every command"),
}


def table() -> list[tuple[str, str, str, str]]:
    """The rows of docs/architecture.md#exit-codes: code, name, meaning, who gives it; MEANINGS in code order,
    then the codes that are not jobkit's own (a signal's, a child's)."""
    names = {value: name for name, value in globals().items() if name.startswith("EXIT_")}
    rows = [(str(code), f"`{names[code]}`", *MEANINGS[code]) for code in sorted(MEANINGS)]
    rows.append(
        (
            f"{SIGNAL_BASE}+N",
            "`SIGNAL_BASE` + N",
            "stopped by signal N, as a shell reports it: 143 SIGTERM (scancel), 141 SIGPIPE (the reader of its "
            "output went away; nothing is printed)",
            "every command",
        )
    )
    rows.append(
        (
            "the child's",
            "-",
            "once its child started: the child's own status (training's, the command's), passed on unchanged",
            ", ".join(f"`{name}`" for name in PASSES_THROUGH),
        )
    )
    return rows


class JobkitError(click.ClickException):
    """One line for the user: what is wrong and what to do; shown as `jobkit <command>: <message>`."""

    def __init__(self, command: str, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.command = command
        self.exit_code = code

    def show(self, file=None) -> None:
        click.echo(f"jobkit {self.command}: {self.format_message()}", file=file, err=file is None)


def exit_with(code: int) -> NoReturn:
    """End the running command with CODE (one of the table's) once it has said what it had to say itself;
    click's edge exits with it (what `sys.exit` in a command would do behind the edge's back)."""
    raise click.exceptions.Exit(code)


def traceback_dir(env=None) -> Path:
    """Where an internal error's traceback goes: $XDG_STATE_HOME/jobkit/tracebacks, by default
    ~/.local/state/jobkit/tracebacks (a state file of this user's, as the XDG base directories have it)."""
    env = os.environ if env is None else env
    state = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "jobkit" / "tracebacks"


def save_traceback(command: str, exc: BaseException) -> str:
    """EXC's traceback in a new file only this user may read (0600, in a 0700 dir; the temp dir when the state
    dir cannot be written); returns its path."""
    text = (
        f"jobkit {command}: internal error at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, pid {os.getpid()}, "
        f"Python {sys.version.split()[0]} ({sys.executable})\n\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    )
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{re.sub(r'[^A-Za-z0-9_-]+', '-', command)}-{os.getpid()}"
    try:
        where = traceback_dir()
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(where / f"{name}.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        path = str(where / f"{name}.txt")
    except OSError:
        fd, path = tempfile.mkstemp(prefix=f"jobkit-{name}-", suffix=".txt")  # 0600, a name nobody planted
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)
    return path


def internal_error(command: str, exc: BaseException) -> JobkitError:
    """The one line an unexpected exception becomes: `internal error: <type>: <message> (traceback in <file>)`,
    exit EXIT_INTERNAL. Where no file can be written at all, the traceback goes to stderr instead."""
    said = " ".join(str(exc).split())
    said = f"{type(exc).__name__}: {said[:300]}" if said else type(exc).__name__
    try:
        where = f"traceback in {save_traceback(command, exc)}"
    except OSError as why:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        where = f"traceback above: it could not be saved ({why.strerror or why})"
    return JobkitError(command, f"internal error: {said} ({where})", EXIT_INTERNAL)
