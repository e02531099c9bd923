"""LazyGroup: a click group over a table of commands that are imported when they run, never when listed.

The table maps a command's name to ("module:attribute", one-line summary), as pip's command table does: the
listing that `--help` prints comes from the summaries, so it imports none of the commands. `jobkit` itself
(jobkit/cli.py) and `jobkit sweep` (jobkit/sweep/cli.py) are both built on it.
"""

import importlib

import click

CommandTable = dict[str, tuple[str, str]]


class LazyGroup(click.Group):
    """A click group whose `table` commands are imported on first use (run or `--help` of that command)."""

    def __init__(self, *args, table: CommandTable, **kwargs):
        super().__init__(*args, **kwargs)
        self.table = table

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.table])

    def get_command(self, ctx, name):
        if name in self.table:
            return load(self.table[name][0])
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        """The listing from the table's summaries (click's own would import every command to ask it)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in self.table:
                rows.append((name, _short_help(self.table[name][1], limit)))
            else:
                rows.append((name, super().get_command(ctx, name).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def load(target: str) -> click.Command:
    """The click command a "module:attribute" target names (imports that module)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def _short_help(summary: str, limit: int) -> str:
    """SUMMARY cut to LIMIT as click cuts a command's own help (a stand-in command, so no import is needed)."""
    return click.Command(None, help=summary).get_short_help_str(limit)
