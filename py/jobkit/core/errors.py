"""Every exit code jobkit's commands use, and the one error type that becomes a message and an exit code.

A command anywhere in the package raises `JobkitError(command, message, code)`; click's own top-level handler
(the CLI's edge) prints it as one line, `jobkit <command>: <message>`, on stderr and exits with `code`. No
module prints-and-exits by itself, so a message's shape and a code's meaning are decided here alone.

The codes: 0 success, 1 bad input (the default), 2 usage (click's own), and then a few that one command
gives a meaning of its own, named for it below so that a reader of `--help` and a reader of this file agree.
"""

import click

EXIT_OK = 0
EXIT_BAD_INPUT = 1  # a missing, unreadable or unusable input; the message names it and the fix
EXIT_USAGE = 2  # click's own code for a bad option or argument

# tgs
EXIT_NO_STEPS = 2  # the log has no step lines
EXIT_NO_NNODES = 3  # the log has no usable NNODES= header
# launch, procs
EXIT_SETUP = 2  # no MaxText train module, no config given
# hang-watchdog
EXIT_SETTINGS = 2  # a HANG_* setting is not a number
# notify
EXIT_NOTIFY_FAILED = 1  # a destination did not take the message
EXIT_NOTIFY_CONFIG = 2  # no destination, or one that is not a URL
# requeue
EXIT_NOT_RETRIED = 3  # the job ended in a way that is not retried
# image-info
EXIT_ENGINE = 3  # the container engine is missing or did not answer
# sweep
EXIT_STOPPED = 3  # the sweep stopped itself (a policy said so)
# ray-launch
EXIT_UNREACHABLE = 75  # EX_TEMPFAIL: no command was started (Ray missing, cluster unreachable)
# reap, procs
EXIT_CANNOT_RUN = 127  # the shell's code: the command does not exist or cannot be executed


class JobkitError(click.ClickException):
    """One line for the user: what is wrong and what to do; shown as `jobkit <command>: <message>`."""

    def __init__(self, command: str, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.command = command
        self.exit_code = code

    def show(self, file=None) -> None:
        click.echo(f"jobkit {self.command}: {self.format_message()}", file=file, err=file is None)
