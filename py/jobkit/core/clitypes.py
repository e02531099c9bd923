"""Click parameter types and environment readers that more than one `jobkit` command needs.

One type per kind of number, used by every option of that kind: click's FloatRange lets nan through every
bound (nan compares false both ways) and inf through an open upper one, which then reach sleep()/select() or
arithmetic as a traceback or a plan built from garbage. Every type here is finite and range-checked, and
fails with click's usual "Invalid value for '--x': ..." usage error. Counts need no type of their own:
int() never yields nan or inf, so click's IntRange is already finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import click

WEEK = 7 * 24 * 3600.0  # the longest wait any option means; sleep() overflows long before "huge"


class Finite(click.FloatRange):
    """A finite float within [MIN, MAX] (each bound optional, open when asked), naming WHAT it measures."""

    def __init__(self, what="number", min=None, max=None, min_open=False, max_open=False, name="float"):  # noqa: A002
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)
        self.what = what
        self.name = name  # --help's metavar (SECONDS, FLOAT)

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite {self.what}{self._range_text()}", param, ctx)
        return super().convert(number, param, ctx)

    def _range_text(self) -> str:
        return f" ({self._describe_range()})" if self.min is not None or self.max is not None else ""


def Seconds(min: float = 0.0, max: float = WEEK, min_open: bool = True) -> Finite:  # noqa: A002, N802
    """Seconds in (MIN, MAX] by default: > 0 and at most a week."""
    return Finite("number of seconds", min=min, max=max, min_open=min_open, name="seconds")


def Positive(what: str, max: float | None = None) -> Finite:  # noqa: A002, N802
    """A finite WHAT > 0 (GB per device, TGS per device), at most MAX when given."""
    return Finite(what, min=0, max=max, min_open=True)


def Percent(min: float = 0.0, max: float = 100.0, min_open: bool = True) -> Finite:  # noqa: A002, N802
    return Finite("percent", min=min, max=max, min_open=min_open, name="percent")


SECONDS = Seconds()


class SettingError(ValueError):
    """An environment setting that does not parse; str() is the one line to show."""


def env_uint(env: Mapping[str, str], name: str, default: int) -> int:
    """NAME from ENV as a whole number (DEFAULT when unset or empty), read as utils/lib/settings.sh's
    setting_uint reads it (1 to 9 digits, decimal); SettingError naming the setting and the fix otherwise."""
    raw = env.get(name) or ""
    if not raw:
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw):
        raise SettingError(
            f"{name}={raw!r} is not a whole number of 1 to 9 digits; set it to one (e.g. {name}={default}) or unset it"
        )
    return int(raw, 10)
