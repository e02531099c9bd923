"""Reading one job's log while it runs and after it ends: progress, phase, hang, and the final outcome.

Progress is the training step (`completed step` lines), not the log's size or mtime: a job that prints
warnings in a loop is not making progress. The phase a job was in when it stalled decides what a hang
means (the seeds' rule): before the model is initialised it is usually a transient collective/network
setup problem (retry once); after initialisation and before step 0 it is XLA compiling into a silent
out-of-memory (do not retry, treat as OOM); after a step it is a mid-training collective failure (retry
once). The TGS / MFU numbers come from jobkit.core.tgs, the code that prints every job's end-of-run verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from jobkit.core import failures, logparse, tgs

STARTUP, COMPILE, TRAINING = "startup", "compile", "training"
# MaxText prints this once the parameters exist; the first step follows after XLA compiles the train step.
_INIT_MARKER = "After params initialized"


@dataclass
class Progress:
    steps: int  # distinct steps seen
    last_step: int | None
    phase: str


def read(log: Path) -> logparse.JobLog | None:
    try:
        return logparse.parse_file(str(log))
    except (OSError, logparse.LogError):
        return None


def progress(log: Path | None) -> Progress:
    parsed = read(log) if log is not None and log.exists() else None
    if parsed is None:
        return Progress(0, None, STARTUP)
    steps = sorted(parsed.steps)
    if steps:
        return Progress(len(steps), steps[-1], TRAINING)
    try:
        text = failures.read_tail(str(log))
    except OSError:
        text = ""
    return Progress(0, None, COMPILE if _INIT_MARKER in text else STARTUP)


def finished(log: Path | None) -> bool:
    """True once the job log has its JOB SUMMARY status line."""
    parsed = read(log) if log is not None and log.exists() else None
    return parsed is not None and parsed.footer_status is not None


@dataclass
class Verdict:
    status: str  # PASS | FAIL
    reason: str
    detail: str
    nodes: list[str]
    tgs: float | None
    mfu: float | None
    step_time: float | None
    step_time_spread: float | None
    line: str


def _who(parsed: logparse.JobLog | None, fallback_model: str, job_id: str) -> str:
    header = parsed.header if parsed else {}
    model = header.get("MODEL_NAME") or fallback_model
    nodes = parsed.nnodes if parsed and parsed.nnodes is not None else "?"
    return f"{model} {nodes}N (job {header.get('JOB_ID') or job_id})"


def blamed_node(evidence: str, nodelist: list[str]) -> str | None:
    """The node an evidence line blames (see failures.host_in_line), when the job ran on several nodes."""
    return failures.host_in_line(evidence, nodelist) if len(nodelist) > 1 else None


def verdict(log: Path | None, model: str, job_id: str, scheduler_state: str | None = None) -> Verdict:
    """How the job whose log is LOG ended (the log may be missing when the job died before writing it)."""
    parsed = read(log) if log is not None and log.exists() else None
    who = _who(parsed, model, job_id)
    if parsed is None:
        state = scheduler_state or "no log"
        line = f"{who}: ended without a job log ({state}) — FAIL"
        return Verdict("FAIL", "no-log", state, [], None, None, None, None, line)
    nodes, _ = logparse.header_nodes(parsed.header)
    summary = tgs.summarize(parsed)
    steady = summary.windows["steady"].stats("seconds")
    step_time = steady.mean if steady else None
    spread = steady.std / steady.mean if steady and steady.mean else None
    status = parsed.footer_status
    if status == "SUCCESS":
        line = tgs.format_line(summary, "PASS")
        tgs_value = summary.tgs if summary.tgs is not None and math.isfinite(summary.tgs) else None
        return Verdict("PASS", "", "", nodes, tgs_value, summary.mfu, step_time, spread, line)
    if status == "STOPPED":
        # Training exited 0 before its last step (preemption checkpoint, data ran out): not a result.
        line = f"{who}: STOPPED early (exit 0 before the last step) — FAIL"
        return Verdict("FAIL", "stopped-early", "training stopped early", nodes, None, None, None, None, line)
    found = failures.classify(failures.read_tail(str(log)), status, parsed.footer_exit, has_steps=parsed.has_steps)
    if status is None and scheduler_state:
        detail = f"scheduler state {scheduler_state}, no JOB SUMMARY in the log"
        found = failures.Failure("node-fail" if "NODE_FAIL" in scheduler_state else found.reason, "", detail)
    if found.reason == "hang":
        # The job's own hang watchdog stopped it: the same outcome as the sweep noticing the hang itself.
        line = f"{who}: HANG during {found.detail} (the job's watchdog: {found.evidence.strip('= ')}) — FAIL"
        return Verdict("HANG", "hang", found.detail, nodes, None, None, None, None, line)
    line = f"{who}: {found.reason.upper() if found.reason == 'oom' else found.label} — FAIL"
    return Verdict("FAIL", found.reason, found.evidence or found.detail, nodes, None, None, None, None, line)
