"""`jobkit monitor`: follow jobs from a login node and turn what happens to them into events and notifications.

Each poll looks at every followed job through the scheduler (squeue, then sacct once it has left the queue)
and through its log and job dir on the shared filesystem, and emits what is new:

    state        PENDING -> RUNNING -> COMPLETED / FAILED / CANCELLED / TIMEOUT / NODE_FAIL / PREEMPTED ...
    first-step   the first training step is in the log
    hang         the watchdog's marker (<job dir>/hang/HANG), with where the stacks are
    stalled      no new step for --stall seconds while the job runs and no watchdog marker (the watchdog
                 could not run, or is off): the monitor's own hang check
    tgs-drop     the median TGS of the last steps fell more than --tgs-drop % below the attempt's own steady
                 state (`jobkit tgs`'s window: after this attempt's warm-up and restore) and stayed there over
                 two polls and two separate windows of steps: a burst of load on a shared host is not news
    verdict      the end-of-run line (`... — PASS` / `— FAIL (class)` / `— STOPPED early`)
    failure      the failure class, its evidence line, the host it blames and how it was found, the retry
                 decision and the catalogue's advice where the line fits (as `jobkit why`)
    requeued     the job was submitted again (its `== REQUEUED as job N` line); the new job is followed too
    requeue-failed / not-requeued   with --requeue, for a job whose batch host died (see below)
    metrics-off  a RAY=1 job has no TSDB: its metrics are off, and the reason its log gives (not a failure)

Which jobs: the given ids (or names), a sweep's jobs (--sweep), else all of the user's jobs in the queue
plus the workspace's logs written since the monitor first started. Events go to stdout, one line each,
and to the notification targets (`jobkit notify`'s) at --level all or failures.

With --requeue (opt-in), a job that Slurm ended as NODE_FAIL or FAILED with no JOB SUMMARY in its log (its
batch host died, so its batch script could not requeue it) is requeued by the monitor with `jobkit requeue`'s
own rules (requeue.requeue(lost=STATE)): MAX_RETRIES and the attempt from the log, the same at-most-once
claim, and the batch host added to the exclude list.

The state file (default <workspace>/.monitor/state.json) holds every event already emitted, and it is saved
before an event is printed or sent: a restarted monitor (or the next --once from cron) never repeats an
alert; one lost in a crash is the price of that. A target that fails is reported once per poll, never
retried, so an unreachable webhook cannot stall the monitor or flood its log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from jobkit.core import clitypes, failures, files, logparse, metrics_state, procfs, slurm, tgs
from jobkit.core.errors import EXIT_OK, EXIT_SETTINGS, EXIT_USAGE, JobkitError
from jobkit.core.paths import workspace
from jobkit.ops import hang_watchdog, notify, requeue

ENDED = slurm.ENDED
BAD_STATES = ENDED - {"COMPLETED"}
FAILURE_EVENTS = {"hang", "stalled", "failure", "requeued", "requeue-failed", "backfill-failed"}
# Worth a notification at --level failures, typed "warning": the job trains on and may still pass.
WARNING_EVENTS = {"tgs-drop", "metrics-off"}
# The log footer's status, for a job the scheduler has forgotten (and for run_local.sh jobs).
STATUS_TO_STATE = {
    "SUCCESS": "COMPLETED",
    "STOPPED": "COMPLETED",
    "FAILED": "FAILED",
    "HANG": "FAILED",
    "CANCELLED": "CANCELLED",
}
_VERDICT = re.compile(r"^\S.* — (PASS|FAIL \([^)]*\)|STOPPED early.*|status unknown)$", re.M)
_REQUEUE_END = re.compile(r"^== (?:not requeued|REQUEUE FAILED): (.*) ==$", re.M)
# Seconds after a job's JOB SUMMARY during which its requeue line may still come.
REQUEUE_WAIT = 120
# A log changed this recently counts as a current job even before the monitor's first start.
RECENT = 600


class MonitorError(Exception):
    """One line that names the problem and the fix."""


@dataclass
class Event:
    job_id: str
    kind: str
    text: str

    def line(self) -> str:
        return f"{time.strftime('%Y-%m-%dT%H:%M:%S')} job {self.job_id} {self.kind}: {self.text}"


# ------------------------------------------------------------------------------------------- the scheduler

SLURM_MAX_JOB_ID = 2**32 - 1  # slurmctld's job_id is a uint32_t


def queue_states() -> dict[str, str] | None:
    """Job id -> state of the user's jobs Slurm holds, those that just ended included; None when squeue
    cannot be asked (nothing is news then)."""
    try:
        return slurm.queue(user=os.environ.get("USER") or str(os.getuid()), include_ended=True)
    except slurm.SlurmError:
        return None


def final_state(job_id: str) -> str | None:
    """The state sacct keeps for an ended job, or None when there is no accounting."""
    return slurm.accounted([job_id]).get(job_id)


# ----------------------------------------------------------------------------------------------- the log


def find_log(ws: Path, job_id: str) -> Path | None:
    found = sorted(ws.glob(f"{job_id}-*.log"))
    return found[0] if found else None


# Rank 0's TGS values the monitor keeps per job (each attempt is a job of its own): the steps of its steady
# window's horizon (`tgs.settle`'s, for the reference) and the latest WINDOW steps. The window is `jobkit tgs`'s.
STEADY_FROM, WINDOW = tgs.DEFAULT_STEADY[0], tgs.DEFAULT_STEADY[1] - tgs.DEFAULT_STEADY[0] + 1
# Most bytes of new log read in one poll: a job that printed more catches up over the next polls.
READ_LIMIT = 64 << 20


def follow_log(record: dict, path: Path) -> logparse.JobLog:
    """Read what LOG gained since the last poll (the byte offset is kept in RECORD, so a poll costs the new
    lines, not the whole log of a week-long job) and fold it into RECORD: header, first and last step,
    TGS values, JOB SUMMARY. Returns a JobLog view of the job with this poll's new rank-0 entries."""
    offset = record.get("offset", 0)
    size = path.stat().st_size
    if size < offset:  # the log was replaced (rewritten by hand): start over, its steady state too
        offset = 0
        for key in ("header", "first_step", "tgs_horizon", "tgs_ref", "tgs_last", "low_from", "tgs_low"):
            record.pop(key, None)
    with path.open("rb") as fh:
        fh.seek(offset)
        chunk = fh.read(min(size - offset, READ_LIMIT))
    end = chunk.rfind(b"\n") + 1  # complete lines only: the rest is read once it is whole
    lines = chunk[:end].decode("utf-8", errors="replace").splitlines()
    record["offset"] = offset + end
    new = logparse.parse_lines(lines, str(path), keep_lines=True)
    if "header" not in record:
        record["header"] = new.header  # only the log's first lines are its header
    if new.footer_status is not None:
        record["footer"] = [new.footer_status, new.footer_exit]
    entries = [e for e in new.entries if e.first_process]  # rank 0's: one line per step, whatever the layout
    if entries:
        record.setdefault("first_step", entries[0].step)
        horizon_end = record["first_step"] + STEADY_FROM + 2 * WINDOW
        horizon = record.setdefault("tgs_horizon", [])
        last = record.setdefault("tgs_last", [])
        for e in entries:
            if not (tgs.finite(e.tgs) and e.tgs > 0):  # inf, nan and 0 say nothing of the rate
                continue
            if e.step < horizon_end and "tgs_ref" not in record:
                horizon.append([e.step, e.tgs])
            last.append([e.step, e.tgs])
        del last[:-WINDOW]
    log = logparse.JobLog(str(path))
    log.header = dict(record.get("header", {}))
    log.entries = entries
    log.footer_status, log.footer_exit = record.get("footer", [None, None])
    return log


def steady_reference(record: dict) -> list | None:
    """[median TGS, first step, last step] of this attempt's steady window (rank 0's), or None before it is known.

    The window is `jobkit tgs`'s: STEADY_FROM steps past the attempt's first step, and for a resumed attempt
    (first step not 0) moved past the steps still slow after the restore (`tgs.settle`, which needs its whole
    horizon of 2*WINDOW steps first). Fixed once known, kept in RECORD."""
    if record.get("tgs_ref"):
        return record["tgs_ref"]
    if "first_step" not in record:
        return None
    first = record["first_step"]
    horizon = [(step, value) for step, value in record.get("tgs_horizon", [])]
    start = first + STEADY_FROM
    if not horizon or horizon[-1][0] < start + (2 * WINDOW if first else WINDOW) - 1:
        return None
    if first:
        start = tgs.settle(horizon, start, WINDOW)[0]
    values = [value for step, value in horizon if start <= step < start + WINDOW]
    if not values:
        return None
    record["tgs_ref"] = [statistics.median(values), start, start + WINDOW - 1]
    record.pop("tgs_horizon", None)  # its work is done
    return record["tgs_ref"]


def recent_tgs(record: dict, after: int) -> float | None:
    """Median TGS of the last WINDOW steps, when all of them came after step AFTER (the reference's end)."""
    values = record.get("tgs_last", [])
    if len(values) < WINDOW or values[0][0] <= after:
        return None
    return statistics.median(value for _, value in values)


# -------------------------------------------------------------------------------------------- the monitor


_RECORD_NUMBERS = ("offset", "first_step", "last_step", "last_step_at", "summary_at", "drops", "low_from")


def _state_problem(state) -> str | None:
    """What makes STATE (a state file's JSON) not one the monitor wrote; None when it is its shape."""
    number = (int, float)
    if not isinstance(state, dict):
        return "not a JSON object"
    if not isinstance(state.get("started"), number) or isinstance(state.get("started"), bool):
        return "no start time"
    if not isinstance(state.get("follow", []), list) or not all(isinstance(j, str) for j in state.get("follow", [])):
        return "'follow' is not a list of job ids"
    if not isinstance(state.get("jobs"), dict):
        return "'jobs' is not an object"
    for job_id, record in state["jobs"].items():
        if not (
            isinstance(record, dict)
            and isinstance(record.get("seen"), list)
            and isinstance(record.get("state"), str | None)
            and isinstance(record.get("header", {}), dict)
            and all(isinstance(record.get(k, []), list) for k in ("tgs_horizon", "tgs_last", "tgs_ref"))
            and all(_is_pairs(record.get(k, [])) for k in ("tgs_horizon", "tgs_last"))
            and all(isinstance(record.get(k, 0), number) for k in _RECORD_NUMBERS)
        ):
            return f"job {job_id}'s record is not one the monitor wrote"
    state.setdefault("follow", [])
    return None


def _is_pairs(values: list) -> bool:
    """[[step, TGS], ...] as the monitor writes them (a state file from before issue 23 held bare numbers)."""
    return all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, int | float) for x in v) for v in values)


class Monitor:
    def __init__(
        self,
        ws: Path,
        state_file: Path,
        job_ids: list[str],
        sweep: str | None,
        stall: float,
        tgs_drop: float,
        requeue_lost: bool = False,
    ):
        self.requeue_lost = requeue_lost
        self.ws = ws
        self.state_file = state_file
        self.given = list(job_ids)
        self.sweep = sweep
        self.stall = stall
        self.tgs_drop = tgs_drop
        self.state = self._load()
        self.unknown: list[str] = []  # given jobs with no log that the scheduler (when it answered) does not know

    def _load(self) -> dict:
        if os.path.lexists(self.state_file) and not self.state_file.is_file():
            raise MonitorError(f"state file {self.state_file} is not a file; move it away, or pass --state FILE")
        if not self.state_file.is_file():
            return {"started": time.time(), "jobs": {}, "follow": []}
        try:
            state = json.loads(self.state_file.read_text())
        except OSError as exc:
            problem = exc.strerror or str(exc)
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except ValueError as exc:  # json.JSONDecodeError, and a number too large to be read
            problem = str(exc)
        else:
            problem = _state_problem(state)
        if problem:
            raise MonitorError(
                f"state file {self.state_file} cannot be read ({problem}); move it away to start afresh"
            ) from None
        return state

    def save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        # A crash leaves the old state or the new one; a link planted at any name beside it is never followed.
        files.write_atomic(self.state_file, json.dumps(self.state, indent=1) + "\n")

    def _sweep_jobs(self) -> list[str]:
        from jobkit.sweep import state as sweep_state

        try:
            found = sweep_state.open_sweep(self.sweep)
        except sweep_state.SweepError as exc:
            raise MonitorError(str(exc)) from None
        return [str(e["job_id"]) for e in found.events() if e.get("event") == "submitted" and e.get("job_id")]

    def candidates(self, queue: dict[str, str] | None) -> list[str]:
        """The jobs to look at this poll (ended ones are kept in the state, not looked at again)."""
        ids = [*self.given, *self.state.get("follow", [])]
        if self.sweep:
            ids += self._sweep_jobs()
        if not self.given and not self.sweep:
            ids += list(queue or {})
            # Logs written since the monitor first started, or in the last minutes (a run_local.sh job, or a
            # job that ended just before): older ones are history, not news.
            since = min(self.state["started"], time.time() - RECENT)
            if self.ws.is_dir():
                for log in self.ws.glob("*.log"):
                    m = re.match(r"^(\d+|local_\d{8}_\d{6}_[0-9a-f]{4})-", log.name)
                    if m and log.stat().st_mtime >= since:
                        ids.append(m.group(1))
        jobs = self.state["jobs"]
        return [j for j in dict.fromkeys(ids) if not jobs.get(j, {}).get("done")]

    def poll(self) -> list[Event]:
        queue = queue_states()
        ids = self.candidates(queue)
        events: list[Event] = []
        looked: set[str] = set()
        while ids:
            for job_id in ids:
                looked.add(job_id)
                events += self._look(job_id, (queue or {}).get(job_id), queue is not None)
            # A job requeued during this poll: look at its next attempt now, not a poll later.
            ids = [j for j in self.state["follow"] if j not in looked and not self.state["jobs"].get(j, {}).get("done")]
            if ids:
                queue = queue_states()  # asked again: the new attempt was submitted after the last answer
        return events

    def _emit(self, record: dict, job_id: str, key: str, kind: str, text: str) -> list[Event]:
        if key in record["seen"]:
            return []
        record["seen"].append(key)
        return [Event(job_id, kind, text)]

    def _look(self, job_id: str, queued: str | None, scheduler_answered: bool) -> list[Event]:
        record = self.state["jobs"].setdefault(job_id, {"seen": [], "state": None})
        log_path = find_log(self.ws, job_id)
        log = follow_log(record, log_path) if log_path else None
        name = (log.header.get("MODEL_NAME", "") + f" {log.nnodes}N") if log and log.nnodes else ""
        who = f"({name}) " if name else ""

        # 1. Scheduler state: squeue while it lists the job, then sacct, then the log's JOB SUMMARY.
        state, events = self._look_at_state(job_id, record, log, queued, scheduler_answered, who)
        if log is None and state is None and job_id in self.given and job_id not in self.unknown:
            if scheduler_answered or job_id.startswith("local_"):
                self.unknown.append(job_id)
        if log is None:
            if state in ENDED:
                record["done"] = True
            return events
        # 2. Progress: first step, the watchdog's hang marker, the monitor's own stall check, TGS drop.
        events += self._look_at_progress(job_id, record, log, log_path, state, who)
        # 3. The end: verdict, failure class, requeue (read from the log's tail, once it has a JOB SUMMARY).
        events += self._look_at_end(job_id, record, log, log_path, state, who)
        events += self._look_at_metrics(job_id, record, log, log_path, who)
        return events

    def _look_at_state(
        self,
        job_id: str,
        record: dict,
        log: logparse.JobLog | None,
        queued: str | None,
        scheduler_answered: bool,
        who: str,
    ) -> tuple[str | None, list[Event]]:
        """The job's state now, and the state event when it changed."""
        state = queued
        if state is None and not job_id.startswith("local_"):
            if not scheduler_answered and log and log.footer_status is None:
                state = record["state"]  # squeue could not be asked: no news
            else:
                state = final_state(job_id)
        if state is None and log is not None:
            state = STATUS_TO_STATE.get(log.footer_status or "", "RUNNING")
        events: list[Event] = []
        if state and state != record["state"]:
            was = record["state"]
            record["state"] = state
            events += self._emit(
                record, job_id, f"state:{state}", "state", f"{who}{state}" + (f" (was {was})" if was else "")
            )
        return state, events

    def _look_at_progress(
        self, job_id: str, record: dict, log: logparse.JobLog, log_path: Path, state: str | None, who: str
    ) -> list[Event]:
        events: list[Event] = []
        entries = log.entries  # this poll's new rank-0 steps
        if "first_step" in record:
            events += self._emit(
                record, job_id, "first-step", "first-step", f"{who}first step (step {record['first_step']})"
            )
        if entries and entries[-1].step != record.get("last_step"):
            record["last_step"], record["last_step_at"] = entries[-1].step, time.time()
        # Only this job's own watchdog's marker counts (one planted in a shared workspace is not): else the
        # monitor's own stall check below still tells a real hang.
        try:
            hang = hang_watchdog.read_marker(log_path.with_suffix(""), log.header.get("JOB_ID", job_id))
        except files.Untrusted:
            hang = None
        if hang is not None:
            where = log_path.with_suffix("") / "hang"
            events += self._emit(record, job_id, "hang", "hang", f"{who}HANG detected — {hang}; stacks in {where}/")
        elif (
            state == "RUNNING"
            and record.get("last_step_at")
            and log.footer_status is None
            and time.time() - record["last_step_at"] > self.stall
        ):
            since = time.time() - record["last_step_at"]
            events += self._emit(
                record,
                job_id,
                f"stalled:{record['last_step']}",
                "stalled",
                f"{who}no new step for {since:.0f} s since step {record['last_step']} (and no watchdog report)",
            )
        if log.footer_status is None:
            events += self._look_at_tgs(job_id, record, who)
        return events

    def _look_at_tgs(self, job_id: str, record: dict, who: str) -> list[Event]:
        """tgs-drop, once per drop: only against this attempt's own steady state (none before it has one), and
        only when the drop held at two polls over two separate windows of steps. A poll that first sees the
        median of the last WINDOW steps low only notes the step (`low_from`); a later poll whose last WINDOW steps
        all came after that step, and are low too, alerts. Steps, not seconds: it does not matter how often the
        monitor polls, and a burst that one poll's read caught whole is never more than a suspicion."""
        ref = steady_reference(record)
        now = recent_tgs(record, ref[2]) if ref else None
        if ref is None or now is None:
            return []
        level, first, last = ref
        if now >= level * (1 - self.tgs_drop / 100):
            record.pop("low_from", None)
            record["tgs_low"] = False  # recovered: the next drop is news again
            return []
        step = record["tgs_last"][-1][0]
        if "low_from" not in record:
            record["low_from"] = step  # suspected: news only if the next poll's own steps say so too
            return []
        if record.get("tgs_low") or record["tgs_last"][0][0] <= record["low_from"]:
            return []
        record["tgs_low"] = True
        record["drops"] = record.get("drops", 0) + 1
        return self._emit(
            record,
            job_id,
            f"tgs-drop:{record['drops']}",
            "tgs-drop",
            f"{who}TGS {now:,.0f}/device over steps {record['tgs_last'][0][0]}-{step}, "
            f"{100 * (1 - now / level):.0f}% below its steady state {level:,.0f} (steps {first}-{last}); "
            f"low since step {record['low_from']}",
        )

    def _look_at_end(
        self, job_id: str, record: dict, log: logparse.JobLog, log_path: Path, state: str | None, who: str
    ) -> list[Event]:
        """Also marks the job done once nothing more can come (its requeue decided or waited for), and then
        completes its TSDB's TensorBoard backfill if that is still pending."""
        events: list[Event] = []
        if log.footer_status is not None:
            text = failures.read_tail(str(log_path))
            if record.get("first_step") is not None and not log.has_steps:
                log.entries = [
                    logparse.StepEntry(record.get("last_step", 0), 0, None, None, None, None, None)
                ]  # it had steps
            verdict = _VERDICT.search(text)
            if verdict:
                events += self._emit(record, job_id, "verdict", "verdict", verdict.group(0))
            found = requeue.outcome(log, text, log_path.with_suffix(""))
            if found is not None:
                events += self._emit(record, job_id, "failure", "failure", failure_text(who, found))
            requeued = requeue.REQUEUED_LINE.search(text)
            ended = _REQUEUE_END.search(text)
            if requeued:
                new = requeued.group(1)
                events += self._emit(record, job_id, "requeued", "requeued", requeued.group(0).strip("= "))
                if new not in self.state["follow"]:
                    self.state["follow"].append(new)
            elif ended and ended.group(0).startswith("== REQUEUE FAILED"):
                events += self._emit(record, job_id, "requeue-failed", "requeue-failed", ended.group(1))
            record.setdefault("summary_at", time.time())
            no_requeue = log.header.get("MAX_RETRIES", "0") in ("", "0") or job_id.startswith("local_")
            waited = time.time() - record["summary_at"] > REQUEUE_WAIT
            if (state in ENDED or job_id.startswith("local_")) and (requeued or ended or no_requeue or waited):
                record["done"] = True
        elif state in ENDED and state != "COMPLETED" and not job_id.startswith("local_"):
            # Slurm ended it and nothing wrote a JOB SUMMARY (the batch host died, a hard kill): say why.
            events += self._emit(
                record, job_id, "failure", "failure", f"{who}{state.lower()} (the log has no JOB SUMMARY)"
            )
            events += self._requeue_lost(job_id, record, log_path, state)
            record["done"] = True
        if record.get("done") and (state in ENDED or job_id.startswith("local_")):
            events += self._complete_backfill(record, job_id, log_path.with_suffix("") / "prometheus")
        return events

    def _requeue_lost(self, job_id: str, record: dict, log_path: Path, state: str) -> list[Event]:
        """--requeue: requeue a job whose batch host died, as its batch script would have (requeue's rules,
        its claim, the batch host excluded); the new job is followed like one the batch script requeued."""
        if not self.requeue_lost:
            return []
        try:
            decision, new = requeue.requeue(log_path, dict(os.environ), lost=state)
        except (requeue.RequeueError, logparse.LogError) as exc:
            return self._emit(record, job_id, "requeued", "requeue-failed", str(exc))
        if new is None:
            return self._emit(record, job_id, "requeued", "not-requeued", decision.why)
        if new not in self.state["follow"]:
            self.state["follow"].append(new)
        also = f"; excluding {','.join(decision.exclude)}" if decision.exclude else ""
        total = 1 + decision.max_retries
        text = f"REQUEUED as job {new} (attempt {decision.next_attempt} of {total}): {decision.why}{also}"
        return self._emit(record, job_id, "requeued", "requeued", text)

    def _look_at_metrics(
        self, job_id: str, record: dict, log: logparse.JobLog, log_path: Path, who: str
    ) -> list[Event]:
        """A RAY=1 job without a TSDB: one `metrics-off` event, with the reason its log gives (a warning: the
        job trains on). Looked at once its first step or its JOB SUMMARY is in (rank 0 starts Prometheus, or says
        why not, before training), with one read of the log; without a TSDB and a reason then, once more at the
        end. record["metrics"] is core.metrics_state's word once decided."""
        if record.get("metrics") in ("on", "off", "-") or not ("first_step" in record or log.footer_status):
            return []
        if not metrics_state.ray_asked(log.header):
            record["metrics"] = "-"
            return []
        why = None
        if record.get("metrics") is None:
            try:
                why = logparse.parse_file(str(log_path)).metrics_off
            except OSError:
                return []  # looked at again next poll
        elif log.footer_status is None:
            return []  # "?": no TSDB yet and no reason; the end decides
        job_dir = metrics_state.job_dir_of(str(log_path))
        found = metrics_state.state(log.header, why, job_dir, ended=log.footer_status is not None)
        record["metrics"] = found.word
        if not found.off:
            return []
        text = f"{who}RAY=1 but metrics are off: {found.reason} (no TSDB in {job_dir}/prometheus)"
        return self._emit(record, job_id, "metrics-off", "metrics-off", text)

    def _complete_backfill(self, record: dict, job_id: str, tsdb: Path) -> list[Event]:
        """A RAY=1 job ended before its teardown backfilled every TensorBoard step into its TSDB (a time
        limit, a scancel past KillWait): do it now, as every reader of the TSDB would."""
        from jobkit.observe import tb_backfill

        if not tsdb.is_dir() or tb_backfill.pending(str(tsdb)) is None:
            return []
        said: list[str] = []
        try:
            tb_backfill.complete_pending(str(tsdb), out=lambda *a, **_: said.append(" ".join(map(str, a))))
        except (tb_backfill.BackfillError, OSError) as exc:
            return self._emit(record, job_id, "backfill", "backfill-failed", f"{tsdb}: {exc}")
        last = said[-1] if said else "done"
        return self._emit(record, job_id, "backfill", "backfill", f"completed the TSDB's TensorBoard backfill: {last}")


# A `failure` event is one line; the catalogue's advice is added only where the line stays within this.
FAILURE_LINE_MAX = 300


def failure_text(who: str, found: failures.Failure) -> str:
    """The `failure` event's line: the class, its evidence, the blamed host and how it was found, the retry
    decision, and the catalogue's advice where the line still fits in FAILURE_LINE_MAX characters."""
    host = f"; host: {found.host}" + (f" ({found.blame_how})" if found.blame_how else "") if found.host else ""
    text = "".join(
        [
            who,
            found.label,
            f"; evidence: {found.evidence}" if found.evidence else "",
            f"; noticed: {found.noticed}" if found.noticed else "",  # a hang: where, apart from whom it blames
            host,
            # a hang nobody is blamed for, that its metrics read as a collective deadlock: say so, job-wide
            f"; {found.blame_how.partition(' (')[0]}"
            if not found.host and found.blame_how.startswith("metrics:")
            else "",
            f"; retry: {found.retry_decision}",
        ]
    )
    advice = f"; advice: {found.advice}" if found.advice else ""
    return text + advice if len(text + advice) <= FAILURE_LINE_MAX else text


def is_failure(event: Event) -> bool:
    if event.kind in FAILURE_EVENTS:
        return True
    if event.kind == "state":
        return event.text.split("(")[-1].split()[0] in BAD_STATES or any(f" {s}" in event.text for s in BAD_STATES)
    return event.kind == "verdict" and " — PASS" not in event.text


def severity(event: Event) -> str:
    """The notification type: failure, warning (the job trains on: tgs-drop, metrics-off) or info."""
    if is_failure(event):
        return "failure"
    return "warning" if event.kind in WARNING_EVENTS else "info"


def deliver(events: list[Event], targets: notify.Targets | None, level: str) -> list[str]:
    """Notify what LEVEL selects; returns the failed targets' lines (each once per poll, never retried)."""
    chosen = [e for e in events if level == "all" or severity(e) != "info"]
    if not chosen or targets is None:
        return []
    problems: list[str] = []
    for event in chosen:
        for problem in notify.send(f"job {event.job_id}: {event.kind}", event.text, targets, severity(event)):
            if problem not in problems:
                problems.append(problem)
        if problems and all("not a URL" in p for p in problems):
            break  # a malformed URL fails every event the same way
    return problems


# ---------------------------------------------------------------------------------------------- the daemon


def _pid_alive(pid_file: Path, state_path: Path) -> int | None:
    """The PID of the monitor that runs on STATE_PATH, as its PID_FILE says; None unless every check holds.

    The pid file ("PID START STATE_PATH", written by that monitor) may sit in a workspace others can write to,
    so it is believed only when it is ours, and the process is ours, is still the one that wrote it (its start
    time), runs `jobkit monitor` and follows this very state file: a planted pid file must not make --stop signal
    anything else."""
    try:
        if pid_file.stat().st_uid != os.getuid():
            return None
        pid_text, start_text, recorded = pid_file.read_text().rstrip("\n").split(" ", 2)
        pid, start = int(pid_text), int(start_text)
        owner = Path(f"/proc/{pid}").stat().st_uid
    except (OSError, ValueError):
        return None
    same = owner == os.getuid() and procfs.alive(pid, start) and recorded == str(state_path.resolve())
    # ... and is a jobkit monitor by its command line (argv `... monitor --daemon ...`), the second half of the
    # rule: a file that names another live process's pid and start time must not get that process signalled.
    return pid if same and "monitor" in procfs.cmdline(pid) else None


def daemonize(pid_file: Path, log_fd: int, state_path: Path) -> None:
    """Detach (double fork, new session), stdout/stderr to LOG_FD (the log, opened by the caller, which can
    still say why it cannot be), "PID START STATE_PATH" in PID_FILE."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    me = procfs.stat(os.getpid())
    # Written whole (a reader sees no half-written pid file) and never through a planted link.
    files.write_atomic(pid_file, f"{me.pid} {me.start} {state_path.resolve()}\n", mode=0o600)


def start_daemon(pid_file: Path, state_path: Path) -> None:
    """Refuses a second monitor of STATE_PATH and a log that cannot be opened (one line), then daemonizes."""
    running = _pid_alive(pid_file, state_path)
    if running:
        raise JobkitError("monitor", f"already running as pid {running} ({pid_file}); stop it with --stop")
    state_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = state_path.with_name(state_path.stem + ".log")
    try:
        log_fd = files.open_append(log_file)  # a planted link is refused, not followed
    except OSError as exc:
        raise JobkitError(
            "monitor", f"cannot append to {log_file} ({exc.strerror}); remove it if it is a link"
        ) from None
    click.echo(f"monitor started in the background; log {log_file}, pid file {pid_file}")
    daemonize(pid_file, log_fd, state_path)


@click.command("monitor")
@click.argument("jobs", nargs=-1)
@click.option("--workspace", "ws", help="Where the job logs are (default $JOB_WORKSPACE, else <repo>/outputs).")
@click.option("--sweep", help="Follow this sweep's jobs (its id, as `jobkit sweep` names it).")
@click.option(
    "--interval",
    type=clitypes.Seconds(min=0.1, min_open=False),
    default=30,
    show_default=True,
    help="Seconds between polls.",
)
@click.option("--once", is_flag=True, help="Poll once and exit (for cron: the state file carries over).")
@click.option("--daemon", is_flag=True, help="Run in the background; pid file and log beside the state file.")
@click.option("--stop", "stop_daemon", is_flag=True, help="Stop the background monitor of this state file.")
@click.option(
    "--state",
    "state_file",
    type=click.Path(dir_okay=False),
    help="State file (default <workspace>/.monitor/state.json).",
)
@click.option(
    "--level",
    type=click.Choice(["all", "failures"]),
    default="failures",
    show_default=True,
    help="Which events to notify.",
)
@click.option("--no-notify", is_flag=True, help="Only print events.")
@click.option(
    "--stall",
    type=clitypes.Seconds(min=1, min_open=False),
    default=1800,
    show_default=True,
    help="Seconds without a new step that count as stalled.",
)
@click.option(
    "--tgs-drop",
    type=clitypes.Percent(1, 99, min_open=False),
    default=20,
    show_default=True,
    help="Percent below the steady TGS that counts as a drop.",
)
@click.option(
    "--requeue",
    "requeue_lost",
    is_flag=True,
    help="Requeue a job whose batch host died (Slurm: NODE_FAIL or FAILED, no JOB SUMMARY) by `jobkit requeue`'s "
    "rules: MAX_RETRIES, at most once, the batch host excluded.",
)
def command(
    jobs, ws, sweep, interval, once, daemon, stop_daemon, state_file, level, no_notify, stall, tgs_drop, requeue_lost
):
    """Follow jobs (JOBS ids, a --sweep, else all of yours) and report what happens to them."""
    ws_path = workspace(ws)
    state_path = Path(state_file) if state_file else ws_path / ".monitor" / "state.json"
    pid_file = state_path.with_name(state_path.stem + ".pid")
    if once and daemon:
        raise JobkitError(
            "monitor",
            "--once polls once in the foreground (for cron), --daemon keeps polling in the background; "
            "give one of them",
            EXIT_USAGE,
        )
    if stop_daemon:
        pid = _pid_alive(pid_file, state_path)
        if pid is None:
            raise JobkitError("monitor", f"no monitor running for {state_path}")
        os.kill(pid, signal.SIGTERM)
        click.echo(f"stopped monitor {pid}")
        return
    # Slurm's job ids are 32-bit (a federation's included): a longer number can be no job, only a typo.
    bad = [
        j
        for j in jobs
        if not re.fullmatch(r"\d+(?:_\d+)?|local_\d{8}_\d{6}_[0-9a-f]{4}", j)
        or (j[0].isdigit() and int(j.split("_")[0]) > SLURM_MAX_JOB_ID)
    ]
    if bad:
        raise JobkitError("monitor", f"'{bad[0]}' is not a job id; give Slurm job ids (see 'jobkit jobs')", EXIT_USAGE)
    targets = None
    if not no_notify:
        try:
            targets = notify.find_targets()
        except (notify.NotifyError, OSError) as exc:
            raise JobkitError("monitor", str(exc), EXIT_SETTINGS) from None
    try:
        monitor = Monitor(ws_path, state_path, list(jobs), sweep, stall, tgs_drop, requeue_lost=requeue_lost)
    except MonitorError as exc:
        raise JobkitError("monitor", str(exc)) from None
    if daemon:
        start_daemon(pid_file, state_path)
    # --stop's TERM: a clean end. SystemExit, not click's Exit (a RuntimeError): no `except Exception` of a poll
    # in progress may swallow it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_OK))
    where = (
        f"notifying {len(targets.urls)} target(s) from {targets.source} ({level})" if targets else "no notifications"
    )
    click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} monitor: following jobs in {ws_path}; {where}")
    warned: set[str] = set()
    try:
        while True:
            try:
                events = monitor.poll()
            except MonitorError as exc:
                raise JobkitError("monitor", str(exc)) from None
            monitor.save()  # before printing or sending: a restart never repeats an alert
            for job_id in (j for j in monitor.unknown if j not in warned):
                warned.add(job_id)  # a warning, not a refusal: the id may be a job of another workspace's log
                click.echo(
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')} monitor: WARNING: job {job_id} has no log in {ws_path} "
                    "and the scheduler does not know it; check the id (and --workspace)",
                    err=True,
                )
            for event in events:
                click.echo(event.line())
            for problem in deliver(events, targets, level):
                click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} monitor: notification failed: {problem}", err=True)
            if once:
                return
            time.sleep(interval)
    finally:
        if daemon and _pid_alive(pid_file, state_path) == os.getpid():
            pid_file.unlink(missing_ok=True)
