"""The hang watchdog's settings (HANG_*) and JAX's heartbeat timeout (JAX_HEARTBEAT_TIMEOUT), which follows them.

Two things can end a job whose rank stopped: the hang watchdog (ops/hang_watchdog.py: it takes every node's
stacks, then stops training) and JAX's coordination service, which declares a task dead when it has sent no
heartbeat for `heartbeat_timeout_seconds` and aborts every rank (JAX's default: 100 s). A heartbeat kill
leaves no stacks, and it also fires on a healthy rank that is only slow to answer (a long checkpoint save
on a busy network). So the heartbeat must outlast the watchdog: its default is

    max(HANG_TIMEOUT, HANG_COMPILE_TIMEOUT) + STACK_WAIT + STOP_GRACE + HEARTBEAT_MARGIN

(3600 + 60 + 10 + 60 = 3730 s with the defaults): the longest the watchdog waits without a step (the compile
allowance before step 0, the floor after it; max(floor, compile/4) in between is below both), plus its wait
for every node's stacks and its TERM-to-KILL grace, plus a margin for its polling and py-spy. Only a median
step above compile_allowance / HANG_STEP_FACTOR (6 minutes at the defaults) gives the watchdog a longer
limit than that; such a job sets JAX_HEARTBEAT_TIMEOUT above HANG_STEP_FACTOR x its step time.

Here, not in ops, because the training entry (launch, below ops) reads both. Bad values are SettingsError,
one line naming the variable and the fix (`jobkit hang-watchdog --check` turns them into EXIT_SETTINGS, 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STACK_WAIT = 60  # seconds the first watchdog waits for every node's stacks before it stops training
STOP_GRACE = 10  # seconds between TERM and KILL
HEARTBEAT_SETTING = "JAX_HEARTBEAT_TIMEOUT"
HEARTBEAT_MARGIN = 60  # seconds for the watchdog's polling (2 s a look on every node) and py-spy's dumps
HEARTBEAT_MAX = 1_000_000  # about 11.5 days: longer than any job here; keeps the value a sane C++ duration


class SettingsError(ValueError):
    """A HANG_* variable that does not parse; the message names it and the fix."""


@dataclass(frozen=True)
class Settings:
    floor: float = 300.0  # HANG_TIMEOUT: least seconds without a step once training has started
    compile_allowance: float = 3600.0  # HANG_COMPILE_TIMEOUT: seconds allowed before the first step
    factor: float = 10.0  # HANG_STEP_FACTOR: allowed multiple of the median step time
    action: str = "cancel"  # HANG_ACTION: cancel | report
    enabled: bool = True

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        def number(name: str, default: float, allow_off: bool = False, unit: str = " of seconds") -> tuple[float, bool]:
            raw = env.get(name, "").strip()
            if not raw:
                return default, True
            if allow_off and raw.lower() in ("off", "0", "false", "no"):
                return default, False
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not (math.isfinite(value) and value > 0):  # nan passes `value <= 0`; inf would make no limit
                hint = ", or off to turn the watchdog off" if allow_off else ""
                raise SettingsError(f"{name}={raw} is not a positive number{unit}; e.g. {name}={default:g}{hint}")
            return value, True

        floor, enabled = number("HANG_TIMEOUT", cls.floor, allow_off=True)
        allowance, _ = number("HANG_COMPILE_TIMEOUT", cls.compile_allowance)
        factor, _ = number("HANG_STEP_FACTOR", cls.factor, unit="")
        action = env.get("HANG_ACTION", "").strip().lower() or cls.action
        if action not in ("cancel", "report"):
            raise SettingsError(f"HANG_ACTION={env['HANG_ACTION']} is not cancel or report; e.g. HANG_ACTION=cancel")
        return cls(floor, allowance, factor, action, enabled)


def watchdog_allowance(settings: Settings) -> int:
    """Seconds the watchdog may take from a rank's last step to having stopped training (see the module doc),
    its step-factor limit aside. The same with the watchdog off: the settings' values are still the rule."""
    return math.ceil(max(settings.floor, settings.compile_allowance) + STACK_WAIT + STOP_GRACE)


def default_heartbeat(settings: Settings) -> int:
    return min(HEARTBEAT_MAX, watchdog_allowance(settings) + HEARTBEAT_MARGIN)


def heartbeat_timeout(env: dict[str, str]) -> tuple[int, bool]:
    """(seconds, whether JAX_HEARTBEAT_TIMEOUT set it): the setting's whole number of seconds, else the default
    from the HANG_* settings. SettingsError for a bad value (or a bad HANG_* one)."""
    settings = Settings.from_env(env)
    raw = env.get(HEARTBEAT_SETTING, "").strip()
    if not raw:
        return default_heartbeat(settings), False
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= HEARTBEAT_MAX):
        raise SettingsError(
            f"{HEARTBEAT_SETTING}={raw} is not a whole number of seconds from 1 to {HEARTBEAT_MAX}; e.g."
            f" {HEARTBEAT_SETTING}={default_heartbeat(settings)}, or unset it for the default (longer than the"
            " hang watchdog's allowances)"
        )
    return int(raw), True
