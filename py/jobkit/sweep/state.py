"""A sweep's state on disk: `$JOB_WORKSPACE/sweeps/<id>/`.

    plan.json      driver, its options (what `resume` replays), created, state, stop reason
    points.jsonl   one JSON object per event: {"event": "submitting"|"submitted"|"done"|..., "key": ..., ...};
                   append-only, so a crash loses at most the line being written and never corrupts earlier points
    summary.md     the driver's final table (rewritten whenever a point lands)
    console/       stdout of local jobs

Drivers are deterministic given the outcomes of their points, so resuming is replaying the driver with
the recorded outcomes: a point whose "done" record exists is answered from it and never run again.
A point's job is recorded twice: "submitting" (with the token the job will carry) before the runner is asked
to start it, "submitted" (job id, log, PID) once it has; each line is one write(2) to the file, which a SIGKILL
of the sweep cannot cut short. So a sweep killed at any moment leaves every job it may have started on record,
and `resume` re-attaches to those still queued or running (`in_flight`) instead of submitting them again.
plan.json is replaced by rename (atomic), so a reader never sees half of it. `resume` replays it as command
options (sbatch arguments included), so it replays only a plan.json of the caller's that nobody else can
write (`trusted_plan`): in a shared workspace a teammate's edit would decide what the owner submits.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from jobkit.core import files, paths
from jobkit.sweep.jobs import Outcome

RUNNING, INTERRUPTED, STOPPED, FINISHED = "running", "interrupted", "stopped", "finished"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class SweepError(Exception):
    """Bad sweep input or state: one line for the user, exit 1."""


def workspace() -> Path:
    """JOB_WORKSPACE as the launch scripts resolve it (default <repo>/outputs)."""
    return paths.workspace().resolve()


def sweeps_dir() -> Path:
    return workspace() / "sweeps"


def check_id(sweep_id: str) -> str:
    if not _ID.match(sweep_id):
        raise SweepError(
            f"sweep id {sweep_id!r} is not usable as a directory name; use letters, digits, '.', '_' and '-'"
        )
    return sweep_id


class Sweep:
    def __init__(self, path: Path):
        self.path = path
        self.id = path.name

    # --- plan ---
    @property
    def plan_file(self) -> Path:
        return self.path / "plan.json"

    def plan(self) -> dict:
        try:
            return self._checked(json.loads(self.plan_file.read_text()))
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8 (UnicodeDecodeError) or not JSON
            raise SweepError(f"sweep {self.id}: cannot read {self.plan_file} ({exc}); it is not a sweep dir") from exc

    def _checked(self, plan) -> dict:
        if not isinstance(plan, dict):
            raise ValueError("not a JSON object")
        return plan

    def trusted_plan(self) -> dict:
        """The plan, when it is the caller's own file that nobody else can write (what resume may replay)."""
        try:
            return self._checked(json.loads(files.read_own(self.plan_file, private=True)))
        except files.Untrusted as exc:
            raise SweepError(
                f"sweep {self.id}: not replaying {exc}; a plan others can change decides what resume submits:"
                " start the sweep again under a new --id"
            ) from None
        except (OSError, ValueError) as exc:
            raise SweepError(f"sweep {self.id}: cannot read {self.plan_file} ({exc}); it is not a sweep dir") from exc

    def write_plan(self, plan: dict) -> None:
        files.write_atomic(self.plan_file, json.dumps(plan, indent=2) + "\n")  # whole, never through a link

    def set_state(self, state: str, reason: str = "") -> None:
        plan = self.plan()
        plan.update(state=state, reason=reason, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
        self.write_plan(plan)

    # --- points ---
    @property
    def points_file(self) -> Path:
        return self.path / "points.jsonl"

    def record(self, event: str, key: str, **data) -> None:
        line = json.dumps({"event": event, "key": key, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **data})
        with os.fdopen(files.open_append(self.points_file, 0o666), "a") as fh:  # never through a planted link
            fh.write(line + "\n")

    def events(self) -> list[dict]:
        if not self.points_file.exists():
            return []
        out = []
        # A damaged byte spoils only its own line, which is skipped like a line cut short.
        for line in self.points_file.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a crash: that point simply runs again
        return out

    def done(self) -> dict[str, Outcome]:
        """The recorded outcome of every finished point, by key (the last record wins)."""
        return {e["key"]: Outcome.from_dict(e["outcome"]) for e in self.events() if e.get("event") == "done"}

    def in_flight(self) -> dict[str, dict]:
        """By key, the last submission of every point with no outcome that no clean-up cancelled: its
        "submitting" record merged with the "submitted" one of the same token (when that was written).
        These are the jobs a sweep killed without its clean-up (SIGKILL, a lost login node) left behind."""
        found: dict[str, dict] = {}
        for event in self.events():
            key, kind = event.get("key"), event.get("event")
            if not isinstance(key, str):
                continue
            if kind == "submitting":
                found[key] = dict(event)
            elif kind == "submitted":
                same = key in found and found[key].get("token") == event.get("token")
                found[key] = {**found[key], **event} if same else dict(event)
            elif kind in ("done", "cancelled", "refused"):
                found.pop(key, None)
        return found

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.md"

    def write_summary(self, text: str) -> None:
        files.write_atomic(self.summary_file, text)


def open_sweep(sweep_id: str) -> Sweep:
    path = sweeps_dir() / check_id(sweep_id)
    if not (path / "plan.json").exists():
        known = ", ".join([s.id for s in list_sweeps() if _created(s) is not None][-5:]) or "none yet"
        raise SweepError(f"no sweep {sweep_id!r} in {sweeps_dir()} (recent: {known}); `jobkit sweep list` shows them")
    return Sweep(path)


def start(sweep_id: str, driver: str, params: dict) -> tuple[Sweep, bool]:
    """The sweep SWEEP_ID, created for DRIVER with PARAMS (its command's options) or reopened to resume it;
    returns (sweep, resumed)."""
    path = sweeps_dir() / check_id(sweep_id)
    sweep = Sweep(path)
    if sweep.plan_file.exists():
        plan = sweep.plan()
        if plan.get("driver") != driver or plan.get("params") != params:
            raise SweepError(
                f"sweep {sweep_id} was started by `jobkit sweep {plan.get('driver')}` with other settings;"
                f" resume it as it was with `jobkit sweep resume {sweep_id}`, or choose another --id"
            )
        if plan.get("state") == FINISHED:
            raise SweepError(
                f"sweep {sweep_id} already finished (results in {sweep.summary_file}); start a new one with another --id"
            )
        sweep.set_state(RUNNING)
        return sweep, True
    if path.exists():
        raise SweepError(f"{path} exists but is not a sweep (no plan.json); choose another --id")
    path.mkdir(parents=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    sweep.write_plan(
        {"id": sweep_id, "driver": driver, "params": params, "created": now, "updated": now, "state": RUNNING}
    )
    return sweep, False


def list_sweeps() -> list[Sweep]:
    base = sweeps_dir()
    if not base.is_dir():
        return []
    found = [Sweep(p) for p in base.iterdir() if (p / "plan.json").is_file()]
    return sorted(found, key=lambda s: (_created(s) or "", s.id))


def _created(sweep: Sweep) -> str | None:
    """When SWEEP was created (for ordering), None when its plan cannot be read: a damaged sweep dir sorts
    first and must neither hide the others nor stand in for the one a command asked about."""
    try:
        return str(sweep.plan().get("created", ""))
    except SweepError:
        return None
