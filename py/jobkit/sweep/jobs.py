"""What a sweep runs (Point), how a job is started and followed (Runner), and how it ended (Outcome).

Two real runners: SlurmRunner submits through `submit.sh` with a pinned nodelist; LocalRunner runs
`run_local.sh` as a child process, one job at a time. Both only start, look at and stop jobs; watching a
job's log and deciding what happened is the engine's business (jobkit.sweep.engine). Tests replace the
runner with one that replays recorded job outcomes.
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


class Runner:
    """Starts, follows and stops jobs. `parallel`: may several jobs be in flight at once."""

    parallel = False

    def submit(self, point: Point, spec: str) -> Handle:  # pragma: no cover - interface
        raise NotImplementedError

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

    def submit(self, point: Point, spec: str) -> Handle:
        repo = Path(point.repo) if point.repo else REPO_ROOT
        argv = [str(repo / "submit.sh"), spec, "-N", str(point.num_nodes)]
        if point.nodes:
            argv += ["-w", ",".join(point.nodes)]
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

    def submit(self, point: Point, spec: str) -> Handle:
        repo = Path(point.repo) if point.repo else REPO_ROOT
        self.console_dir.mkdir(parents=True, exist_ok=True)
        self._count += 1
        console = self.console_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{self._count}.out"
        with open(console, "wb") as out:
            # A session of its own: the terminal's Ctrl-C reaches the sweep, which cancels the job itself.
            process = subprocess.Popen(
                [str(repo / "run_local.sh"), spec, "--", *point.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(repo),
                start_new_session=True,
            )
        handle = Handle(job_id=f"pid{process.pid}", process=process, console=console)
        # run_local.sh validates before it starts training; a refusal ends it within a second or two.
        deadline = time.monotonic() + 5
        while process.poll() is None and self.find_log(handle) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if process.poll() not in (None, 0) and self.find_log(handle) is None:
            raise SubmitError(_last_line(console.read_text(errors="replace")))
        return handle

    def find_log(self, handle: Handle) -> Path | None:
        if handle.log is None and handle.console is not None and handle.console.exists():
            found = self._LOG_LINE.search(handle.console.read_text(errors="replace"))
            if found:
                handle.log = Path(found.group(1))
                handle.job_id = handle.log.name.split("-", 1)[0]
        return handle.log

    def state(self, handle: Handle) -> str:
        assert handle.process is not None
        return RUNNING if handle.process.poll() is None else ENDED

    def cancel(self, handle: Handle) -> None:
        process = handle.process
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)  # run_local.sh stops training and writes CANCELLED
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            procfs.stop([process.pid], grace=5)
            process.wait()
