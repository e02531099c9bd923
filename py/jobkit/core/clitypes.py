"""Click parameter types that more than one `jobkit` command needs."""

import math

import click


class Seconds(click.ParamType):
    """A finite number of seconds > 0. click's FloatRange lets nan and inf through, which then reach
    select()/sleep() as a traceback."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            self.fail(f"must be a positive number of seconds, got {value}", param, ctx)
        return seconds


SECONDS = Seconds()
