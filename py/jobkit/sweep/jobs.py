"""What a sweep runs (Point), how a job is started and followed (Runner), and how it ended (Outcome).

Two real runners: SlurmRunner submits through `submit.sh` with a pinned nodelist; LocalRunner runs
`run_local.sh` as a child process, one job at a time. Both only start, look at and stop jobs; watching a
job's log and deciding what happened is the engine's business (jobkit.sweep.engine). Tests replace the
runner with one that replays recorded job outcomes.

Every submission carries a token the engine records before it submits (a Slurm job's comment, a local job's
JOBKIT_SWEEP_TOKEN environment variable), so that a sweep killed at any moment can find its jobs again:
`reattach` turns a recorded submission back into a Handle (the job still queued or running, or ended with a
log), or None when the job never started or vanished without a log (the engine then submits it again).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jobkit.core import procfs
from jobkit.core.paths import REPO_ROOT

# Runner.state() answers one of these.
PENDING, RUNNING, ENDED = "PENDING", "RUNNING", "ENDED"
# The environment variable that marks a local job (and everything it starts) with its submission's token.
TOKEN_ENV = "JOBKIT_SWEEP_TOKEN"
COMMENT_PREFIX = "jobkit-sweep:"  # a Slurm job's comment: this, then the token
_SQUEUE_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING"}


class SubmitError(Exception):
    """The entry point refused the job (bad arguments, sbatch said no); the message is its last line."""


@dataclass(frozen=True)
class Point:
    """One job of a sweep. `key` is unique within the sweep and is what resume matches on."""

    key: str
    model: str
    num_nodes: int = 1
    nodes: tuple[str, ...] = ()  # pinned nodelist (-w); empty: let the runner decide (local runs)
    args: tuple[str, ...] = ()  # after `--`: MaxText key=value and _env_KEY=VALUE
    repo: str | None = None  # submit from this tree instead of ours (a commit's worktree)
    label: str = ""  # what tables show; the key when empty

    @property
    def name(self) -> str:
        return self.label or self.key


@dataclass
class Outcome:
    """How a point's (last) job ended, as recorded in the sweep's points.jsonl."""

    key: str
    status: str  # PASS | FAIL | HANG | SKIPPED
    reason: str = ""  # failure class (oom, config-error, hang, ...); empty on PASS
    detail: str = ""  # one line: evidence, hang phase, why skipped
    job_id: str = ""
    log: str = ""
    nodes: list[str] = field(default_factory=list)
    tgs: float | None = None
    mfu: float | None = None
    step_time: float | None = None
    step_time_spread: float | None = None  # std / mean of the steady step times
    attempts: int = 1
    line: str = ""  # the progressive verdict line printed when it landed

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    @property
    def is_oom(self) -> bool:
        return self.reason == "oom"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Outcome:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Handle:
    """A started job: its id, its log once known, and what the runner needs to follow it."""

    job_id: str
    log: Path | None = None
    process: subprocess.Popen | None = None
    console: Path | None = None  # where a local job's stdout/stderr go
    # A local job this sweep did not start itself (re-attached after the sweep was killed): followed by its PID
    # and the start time that PID had when it was recorded (procfs.alive), never by the PID alone.
    pid: int | None = None
    start: int | None = None


class Runner:
    """Starts, follows and stops jobs. `parallel`: may several jobs be in flight at once."""

    parallel = False

    def submit(self, point: Point, spec: str, token: str = "") -> Handle:  # pragma: no cover - interface
        """Start POINT's job named after SPEC, marked with TOKEN (see the module doc)."""
        raise NotImplementedError

    def describe(self, handle: Handle) -> dict:
        """What the "submitted" record keeps of HANDLE besides its job id, for `reattach`."""
        return {"log": str(handle.log or "")}

    def reattach(self, record: dict) -> Handle | None:
        """The job a "submitting"/"submitted" RECORD of an earlier run names, when it is still queued or running
        or ended with a log; None when it never started or vanished without one (it is submitted again)."""
        return None

    def state(self, handle: Handle) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def find_log(self, handle: Handle) -> Path | None:
        return handle.log

    def cancel(self, handle: Handle) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def scheduler_state(self, handle: Handle) -> str | None:
        """The scheduler's last word on an ended job (FAILED, NODE_FAIL, ...), when it has one."""
        return None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


class SlurmRunner(Runner):
    """`submit.sh SPEC -N n -w NODES [sbatch args] -- ARGS`; state from squeue / scontrol; scancel by job id."""

    parallel = True

    def __init__(self, env: dict[str, str] | None = None, sbatch_args: tuple[str, ...] = ()):
        self.env = env if env is not None else dict(os.environ)
        self.sbatch_args = tuple(sbatch_args)

    def _run(self, argv: list[str], timeout: float = 60, cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=cwd, stdin=subprocess.DEVNULL
        )

    def submit(self, point: Point, spec: str, token: str = "") -> Handle:
        repo = Path(point.repo) if point.repo else REPO_ROOT
        argv = [str(repo / "submit.sh"), spec, "-N", str(point.num_nodes)]
        if point.nodes:
            argv += ["-w", ",".join(point.nodes)]
        if token:
            # The token is recorded before sbatch runs: a sweep killed before submit.sh answers finds the job by it.
            argv.append(f"--comment={COMMENT_PREFIX}{token}")
        argv += [*self.sbatch_args, "--", *point.args]
        try:
            result = self._run(argv, timeout=300, cwd=str(repo))
        except subprocess.TimeoutExpired as exc:
            raise SubmitError("submit.sh did not answer within 300 s (is slurmctld up? try `sinfo`)") from exc
        found = re.search(r"Submitted job (\d+)", result.stdout)
        if result.returncode != 0 or not found:
            raise SubmitError(_last_line(result.stderr or result.stdout))
        log = re.search(r"^  log: +(\S+)$", result.stdout, re.M)
        return Handle(job_id=found.group(1), log=Path(log.group(1)) if log else None)

    def state(self, handle: Handle) -> str:
        result = self._run(["squeue", "-h", "-j", handle.job_id, "-o", "%T"])
        state = result.stdout.strip()
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            return RUNNING  # the controller did not answer: assume nothing changed, ask again next poll
        if not state:
            return ENDED
        if state == "PENDING" or state == "REQUEUED":
            return PENDING
        return RUNNING if state in _SQUEUE_RUNNING else ENDED

    def reattach(self, record: dict) -> Handle | None:
        job_id = str(record.get("job_id") or "") or self._queued_with(str(record.get("token") or ""))
        if not job_id:
            return None  # never queued, or ended before this run looked (its id was never learnt): run it again
        log = Path(record["log"]) if record.get("log") else self._log_of(job_id)
        handle = Handle(job_id=job_id, log=log)
        if self.state(handle) == ENDED and (log is None or not log.exists()):
            return None  # gone without a log: nothing to read, so it runs again
        return handle

    def _queued_with(self, token: str) -> str:
        """The id of this user's queued or running job whose comment carries TOKEN, or ""."""
        if not token:
            return ""
        result = self._run(["squeue", "-h", "--me", "-o", "%i %k"])
        for line in result.stdout.splitlines():
            job_id, _, comment = line.strip().partition(" ")
            if comment.strip() == f"{COMMENT_PREFIX}{token}" and job_id.isdigit():
                return job_id
        return ""

    def _log_of(self, job_id: str) -> Path | None:
        """submit.sh's log of JOB_ID: $JOB_WORKSPACE/<job_id>-<JOB_NAME>.log."""
        workspace = Path(self.env.get("JOB_WORKSPACE") or REPO_ROOT / "outputs")
        found = sorted(workspace.glob(f"{job_id}-*.log")) if workspace.is_dir() else []
        return found[0] if found else None

    def scheduler_state(self, handle: Handle) -> str | None:
        result = self._run(["scontrol", "-o", "show", "job", handle.job_id])
        found = re.search(r"JobState=(\S+)", result.stdout)
        return found.group(1) if found else None

    def cancel(self, handle: Handle) -> None:
        self._run(["scancel", handle.job_id])


class LocalRunner(Runner):
    """`run_local.sh SPEC -- ARGS` as our child; cancelled with SIGTERM to its PID (it ends as CANCELLED)."""

    parallel = False
    _LOG_LINE = re.compile(r"^\[run_local\] log: (\S+)$", re.M)

    def __init__(self, console_dir: Path, env: dict[str, str] | None = None):
        self.console_dir = console_dir
        self.env = env if env is not None else dict(os.environ)
        self._count = 0

    def submit(self, point: Point, spec: str, token: str = "") -> Handle:
        repo = Path(point.repo) if point.repo else REPO_ROOT
        self.console_dir.mkdir(parents=True, exist_ok=True)
        self._count += 1
        console = self.console_dir / f"{token or time.strftime('%Y%m%d-%H%M%S') + f'-{self._count}'}.out"
        with open(console, "wb") as out:
            # A session of its own: the terminal's Ctrl-C reaches the sweep, which cancels the job itself.
            process = subprocess.Popen(
                [str(repo / "run_local.sh"), spec, "--", *point.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env, TOKEN_ENV: token} if token else self.env,
                cwd=str(repo),
                start_new_session=True,
            )
        found = procfs.stat(process.pid)
        handle = Handle(
            job_id=f"pid{process.pid}", process=process, console=console, pid=process.pid, start=found and found.start
        )
        # run_local.sh validates before it starts training; a refusal ends it within a second or two.
        deadline = time.monotonic() + 5
        while process.poll() is None and self.find_log(handle) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if process.poll() not in (None, 0) and self.find_log(handle) is None:
            raise SubmitError(_last_line(console.read_text(errors="replace")))
        return handle

    def describe(self, handle: Handle) -> dict:
        return {
            "log": str(handle.log or ""),
            "console": str(handle.console or ""),
            "pid": handle.pid,
            "start": handle.start,
        }

    def reattach(self, record: dict) -> Handle | None:
        token = str(record.get("token") or "")
        pid, start = record.get("pid"), record.get("start")
        if not (isinstance(pid, int) and isinstance(start, int) and procfs.alive(pid, start)):
            pid, start = self._running_with(token)
        console = record.get("console") or (str(self.console_dir / f"{token}.out") if token else "")
        handle = Handle(
            job_id=str(record.get("job_id") or (f"pid{pid}" if pid else "")),
            log=Path(record["log"]) if record.get("log") else None,
            console=Path(console) if console else None,
            pid=pid,
            start=start,
        )
        log = self.find_log(handle)
        if pid is None and (log is None or not log.exists()):
            return None  # not running and no log to read: it never started, or vanished; it runs again
        return handle

    def _running_with(self, token: str) -> tuple[int | None, int | None]:
        """(PID, start) of the run_local.sh whose environment carries TOKEN (its children inherit the token too:
        the one whose parent lacks it), or (None, None)."""
        if not token:
            return None, None
        for pid in procfs.pids():
            found = procfs.stat(pid)
            env = procfs.environ(pid) if found is not None and found.running else None
            if env is None or env.get(TOKEN_ENV) != token:
                continue
            parent = procfs.environ(found.ppid) or {}
            if parent.get(TOKEN_ENV) != token:
                return pid, found.start
        return None, None

    def find_log(self, handle: Handle) -> Path | None:
        if handle.log is None and handle.console is not None and handle.console.exists():
            found = self._LOG_LINE.search(handle.console.read_text(errors="replace"))
            if found:
                handle.log = Path(found.group(1))
                handle.job_id = handle.log.name.split("-", 1)[0]
        return handle.log

    def state(self, handle: Handle) -> str:
        if handle.process is not None:
            return RUNNING if handle.process.poll() is None else ENDED
        alive = handle.pid is not None and handle.start is not None and procfs.alive(handle.pid, handle.start)
        return RUNNING if alive else ENDED  # re-attached: not our child, followed by PID and start time

    def cancel(self, handle: Handle) -> None:
        process = handle.process
        if process is None:
            if handle.pid is not None and handle.start is not None and procfs.alive(handle.pid, handle.start):
                procfs.stop([handle.pid], grace=60)  # TERM: run_local.sh stops training and writes CANCELLED
            return
        if process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)  # run_local.sh stops training and writes CANCELLED
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            procfs.stop([process.pid], grace=5)
            process.wait()
