"""Running a sweep's points: submit, watch every job, retry by the rules, record, report as results land.

The monitoring policy, as code (the batch-sweep seed's rules):
  1. Submit a point's job through the runner (points run together only on a runner that allows it and
     with `serial` off). Record "submitting" with the job's token before, "submitted" with its id after.
  2. Poll each job: state from the scheduler, progress from the log's step lines. A RUNNING job with no
     new step for `hang_after` seconds is a hang: cancel it by job id and note the phase.
  3. When it ends, read the verdict (jobkit.sweep.watch) and decide:
       PASS                                  -> done
       oom                                   -> done, never retried (same value, same OOM)
       hang while compiling                  -> done as a hang treated like OOM (silent compile OOM)
       hang before init / mid-training       -> retry once
       error blamed on one node (rank line)  -> exclude that node for the rest of the sweep, retry
       transient classes (collectives, coordination timeouts, signals, node failure, preemption) -> retry
       config classes                        -> done; two of them with no pass at all stop the sweep
     A point runs at most 1 + max_retries times. A third excluded node stops the sweep.
  4. Record "done" with the outcome, print its verdict line, and let the driver go on.
Ctrl-C / SIGTERM: the engine cancels its own running jobs (by job id), records them "cancelled", marks the
sweep interrupted and re-raises; the next run with the same id replays finished points from points.jsonl.
A sweep killed without that clean-up (SIGKILL) leaves its jobs running: the next run re-attaches to every
recorded job still queued or running and waits for it, reads the log of one that ended meanwhile, and submits
again only points never submitted or whose job vanished without a log.
"""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from jobkit.sweep import watch
from jobkit.sweep.jobs import ENDED, PENDING, Handle, Outcome, Point, Runner, SubmitError
from jobkit.sweep.state import INTERRUPTED, Sweep

TRANSIENT = {
    "distributed-timeout", "task-died", "heartbeat-false-positive", "collective-error", "killed-by-signal", "node-fail",
    "preempted", "no-log", "time-limit", "stopped-early",
}  # fmt: skip
CONFIG = {"config-error", "unknown-xla-flag", "python-exception"}


class SweepStopped(Exception):
    """A bail-out rule fired; the message says which and what to do."""


class SweepInterrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Policy:
    hang_after: float = 900.0  # seconds without a new step while RUNNING
    max_retries: int = 2
    max_exclusions: int = 2
    poll: float = 10.0
    footer_grace: float = 30.0  # wait this long for the log's JOB SUMMARY after the scheduler lets go
    serial: bool = False


@dataclass
class _Live:
    point: Point
    handle: Handle
    attempt: int
    nodes: tuple[str, ...]
    running_since: float | None = None
    last_steps: int = 0
    last_progress: float | None = None
    ended_at: float | None = None
    hang_phase: str | None = None


@dataclass
class Engine:
    sweep: Sweep
    runner: Runner
    policy: Policy = field(default_factory=Policy)
    echo: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    excluded: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    # Called with each outcome as it lands in this run (not for replayed ones); a driver's own stop rule
    # raises SweepStopped from here, after the outcome is recorded.
    on_outcome: Callable[[Point, Outcome], None] | None = None

    def __post_init__(self):
        self._recorded = self.sweep.done()
        self._in_flight = self.sweep.in_flight()
        self._config_failures = 0
        self._live: list[_Live] = []

    # --- public ---
    def run(self, points: Iterable[Point]) -> list[Outcome]:
        """Run POINTS (recorded ones are answered from the record); their outcomes, in the same order."""
        points = list(points)
        queue = []
        for point in points:
            if point.key in self._recorded:
                outcome = self._recorded[point.key]
                self.outcomes[point.key] = outcome
                self.echo(f"[{point.name}] (recorded) {outcome.line}")
            elif not self._reattach(point):
                queue.append((point, 1, point.nodes))
        while queue or self._live:
            while queue and (not self._live or (self.runner.parallel and not self.policy.serial)):
                point, attempt, nodes = queue.pop(0)
                self._submit(point, attempt, nodes)
            self.sleep(self.policy.poll)
            for live in list(self._live):
                outcome = self._check(live)
                if outcome is None:
                    continue
                self._live.remove(live)
                retry = self._decide(live, outcome)
                if retry is not None:
                    queue.insert(0, (live.point, live.attempt + 1, retry))
                else:
                    self._finish(live.point, outcome)
        return [self.outcomes[p.key] for p in points]

    def cancel_all(self) -> None:
        """Cancel every job this engine has in flight (by job id / PID); used on interrupt and stop. Each is
        recorded "cancelled", so that the next run submits its point afresh instead of re-attaching to it."""
        for live in self._live:
            self.runner.cancel(live.handle)
            self.sweep.record("cancelled", live.point.key, job_id=live.handle.job_id)
        self._live.clear()

    def guard_signals(self) -> Callable[[], None]:
        """Turn SIGINT / SIGTERM into SweepInterrupted so `run` unwinds through the caller's clean-up;
        returns the function that puts the previous handlers back."""

        def handler(signum, _frame):
            raise SweepInterrupted(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return lambda: [signal.signal(sig, old) for sig, old in previous.items()] and None

    def interrupted(self, exc: SweepInterrupted) -> None:
        self.cancel_all()
        self.sweep.set_state(INTERRUPTED, f"{exc} received")

    # --- steps ---
    def _usable(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in nodes if n not in self.excluded)

    def _reattach(self, point: Point) -> bool:
        """Follow the job an earlier run of this sweep left behind for POINT (killed before it recorded an
        outcome), when the runner still finds it; False when there is none (the point is submitted)."""
        record = self._in_flight.pop(point.key, None)  # once: a later run() of the same point submits it
        if record is None:
            return False
        handle = self.runner.reattach(record)
        what = f"job {record.get('job_id') or record.get('token', '?')}"
        if handle is None:
            self.echo(f"[{point.name}] {what} of an earlier run never started or vanished without a log; submitting")
            return False
        attempt = record.get("attempt") if isinstance(record.get("attempt"), int) else 1
        nodes = tuple(record.get("nodes") or point.nodes)
        self._live.append(_Live(point, handle, attempt, nodes))
        self.echo(f"[{point.name}] re-attached to job {handle.job_id} of an earlier run (not submitted again)")
        return True

    def _submit(self, point: Point, attempt: int, nodes: tuple[str, ...]) -> None:
        nodes = self._usable(nodes)
        if point.nodes and len(nodes) < point.num_nodes:
            self._finish(
                point,
                Outcome(
                    point.key,
                    "SKIPPED",
                    "not-enough-nodes",
                    f"needs {point.num_nodes} nodes; left after exclusions: {','.join(nodes) or 'none'}",
                    attempts=attempt - 1,
                    line=f"{point.model} {point.num_nodes}N: not enough healthy nodes "
                    f"(excluded {','.join(self.excluded)}) — SKIPPED",
                ),
            )
            return
        pinned = Point(**{**point.__dict__, "nodes": nodes[: point.num_nodes] if point.nodes else ()})
        # The job name already carries the passthrough args; the key is added only when they do not name it.
        named = _slug(point.key) in {_slug(arg) for arg in point.args}
        spec = f"{point.model}:{self.sweep.id}" + ("" if named else f"-{_slug(point.key)}")
        # Recorded before the runner is asked: a sweep killed while submit.sh runs still knows what to look for.
        token = f"{self.sweep.id}.{_slug(point.key)}.a{attempt}.{secrets.token_hex(4)}"
        self.sweep.record("submitting", point.key, token=token, attempt=attempt, nodes=list(pinned.nodes))
        try:
            handle = self.runner.submit(pinned, spec, token)
        except SubmitError as exc:
            self.sweep.record("refused", point.key, message=str(exc))
            raise SweepStopped(f"the scheduler refused point {point.name}: {exc}") from exc
        self.sweep.record(
            "submitted",
            point.key,
            token=token,
            job_id=handle.job_id,
            attempt=attempt,
            nodes=list(pinned.nodes),
            **self.runner.describe(handle),
        )
        self._live.append(_Live(point, handle, attempt, pinned.nodes))

    def _check(self, live: _Live) -> Outcome | None:
        """The outcome once the job is over (after a hang: once it is cancelled); None while it runs."""
        now = self.clock()
        state = self.runner.state(live.handle)
        log = self.runner.find_log(live.handle)
        if state != ENDED:
            if state == PENDING:
                return None
            if live.running_since is None:
                live.running_since = live.last_progress = now
            seen = watch.progress(log)
            if seen.steps > live.last_steps:
                live.last_steps, live.last_progress = seen.steps, now
            if live.hang_phase is None and now - live.last_progress >= self.policy.hang_after:
                live.hang_phase = seen.phase
                self.runner.cancel(live.handle)
            return None
        if live.hang_phase is not None:
            return self._hang_outcome(live, log)
        if live.ended_at is None:
            live.ended_at = now
        if not watch.finished(log) and now - live.ended_at < self.policy.footer_grace:
            return None  # the scheduler let go; the log's JOB SUMMARY may still be on its way
        found = watch.verdict(log, live.point.model, live.handle.job_id, self.runner.scheduler_state(live.handle))
        return Outcome(
            live.point.key,
            found.status,
            found.reason,
            found.detail,
            job_id=live.handle.job_id,
            log=str(log or ""),
            nodes=found.nodes or list(live.nodes),
            tgs=found.tgs,
            mfu=found.mfu,
            step_time=found.step_time,
            step_time_spread=found.step_time_spread,
            attempts=live.attempt,
            line=found.line,
        )

    def _hang_outcome(self, live: _Live, log) -> Outcome:
        minutes = self.policy.hang_after / 60
        parsed = watch.read(log) if log is not None else None
        nnodes = parsed.nnodes if parsed and parsed.nnodes else live.point.num_nodes
        line = (
            f"{live.point.model} {nnodes}N (job {live.handle.job_id}): HANG during {live.hang_phase} "
            f"(no new step for {minutes:g} min) — FAIL"
        )
        return Outcome(
            live.point.key,
            "HANG",
            "hang",
            live.hang_phase or "",
            job_id=live.handle.job_id,
            log=str(log or ""),
            nodes=list(live.nodes),
            attempts=live.attempt,
            line=line,
        )

    def _decide(self, live: _Live, outcome: Outcome) -> tuple[str, ...] | None:
        """The nodelist to retry the point on, or None when the outcome is final."""
        self.echo(f"[{live.point.name}] {outcome.line}" + (f" (attempt {live.attempt})" if live.attempt > 1 else ""))
        if outcome.passed or outcome.is_oom or live.attempt > self.policy.max_retries:
            return None
        if outcome.status == "HANG":
            if outcome.detail == watch.COMPILE or live.attempt > 1:
                return None  # compiling into a hang is a silent OOM; a hang twice is a result
            return live.nodes + self._spares(live)
        if outcome.reason in CONFIG:
            self._config_failures += 1
            if self._config_failures >= 2 and not any(o.passed for o in self.outcomes.values()):
                self.sweep.record("done", live.point.key, outcome=outcome.to_dict())
                raise SweepStopped(
                    f"{self._config_failures} points failed with a configuration error and none passed "
                    f"(last: {outcome.reason}: {outcome.detail}); fix the config or the overrides, then resume"
                )
            return None
        blamed = watch.blamed_node(outcome.detail, outcome.nodes)
        if blamed and blamed not in self.excluded:
            self.excluded.append(blamed)
            self.sweep.record("excluded", live.point.key, node=blamed, evidence=outcome.detail)
            self.echo(f"[sweep] excluding {blamed} for the rest of the sweep: {outcome.detail}")
            if len(self.excluded) > self.policy.max_exclusions:
                self.sweep.record("done", live.point.key, outcome=outcome.to_dict())
                raise SweepStopped(
                    f"{len(self.excluded)} nodes excluded ({', '.join(self.excluded)}): the cluster looks unhealthy; "
                    "check them with `utils/preflight.sh` / `utils/ecc_check.sh` before resuming"
                )
        if outcome.reason in TRANSIENT or blamed:
            return live.nodes + self._spares(live)
        return None

    def _spares(self, live: _Live) -> tuple[str, ...]:
        """Nodes of the point's own list not in use by this attempt (a retry may need a replacement)."""
        return tuple(n for n in live.point.nodes if n not in live.nodes)

    def _finish(self, point: Point, outcome: Outcome) -> None:
        if outcome.status == "SKIPPED":
            self.echo(f"[{point.name}] {outcome.line}")
        self.outcomes[point.key] = outcome
        self.sweep.record("done", point.key, outcome=outcome.to_dict())
        if self.on_outcome is not None:
            self.on_outcome(point, outcome)


def _slug(key: str) -> str:
    """A point key as a job tag word: letters, digits, '.', '_' and '-' only."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)[:60]
