"""A job runner for sweep tests that replays recorded real job logs instead of running jobs.

The logs under fixtures/sweep/ were written by real run_local.sh / submit.sh jobs (tiny on CPU); a fake
job's log is one of them with its identity (JOB_ID, NNODES, JOB_NODELIST) and its steps' Tokens/s/device
rescaled to the TGS a test wants, so the sweep code reads exactly the shapes real jobs write.

    runner = FakeRunner(tmp_path, lambda point, nodes, attempt: passing(tgs=1000))
    common.RUNNER_FACTORY = lambda sweep, params: runner      (see the `fake_runner` fixture)

A FakeCluster is the scheduler's queue: each FakeRunner has its own unless one is shared between the runs of a
sweep, so that a resumed sweep finds the jobs a killed one left (its `sbatch` count is the runner's `submitted`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.sweep.jobs import ENDED, PENDING, RUNNING, Handle, Point, Runner, SubmitError

FIXTURES = Path(__file__).parent / "fixtures" / "sweep"
_TGS = re.compile(r"Tokens/s/device: [\d.]+")
_STEP = re.compile(r"completed step: (\d+),")
_RUNNERS = itertools.count(1)


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def _identity(text: str, job_id: str, nodes: tuple[str, ...]) -> str:
    text = re.sub(r"^JOB_ID=.*$", f"JOB_ID={job_id}", text, count=1, flags=re.M)
    text = re.sub(r"^NNODES=.*$", f"NNODES={max(1, len(nodes))}", text, count=1, flags=re.M)
    return re.sub(r"^JOB_NODELIST=.*$", f"JOB_NODELIST={','.join(nodes) or 'vm'}", text, count=1, flags=re.M)


def with_tgs(text: str, tgs: float) -> str:
    """TEXT with every step's Tokens/s/device set to TGS (steps 0-4 slower, as warm-up is)."""

    def fix(line: str) -> str:
        step = _STEP.search(line)
        if not step:
            return line
        value = tgs * (0.3 if int(step.group(1)) < 5 else 1.0)
        return _TGS.sub(f"Tokens/s/device: {value:.3f}", line)

    return "\n".join(fix(line) for line in text.split("\n"))


def cut_before_steps(text: str) -> str:
    """The log as it looks while the job is still compiling (everything up to the first step)."""
    first = text.find("completed step:")
    head = text[: text.rfind("\n", 0, first) + 1] if first >= 0 else text
    return head.split("==== JOB SUMMARY")[0]


@dataclass
class FakeJob:
    final_log: str | None  # None: the job never writes a log (died before starting)
    running_polls: int = 1  # polls it stays RUNNING before it ends
    pending_polls: int = 0
    hang_log: str | None = None  # set: the job never ends by itself; its log stays at this text
    scheduler_state: str | None = None


def passing(tgs: float) -> FakeJob:
    return FakeJob(with_tgs(recorded("tiny-pass.log"), tgs))


def failing(log_name: str) -> FakeJob:
    return FakeJob(recorded(log_name))


def oom() -> FakeJob:
    return FakeJob(recorded("tiny-oom.log"))


def hanging(phase: str) -> FakeJob:
    """A job stuck in PHASE: "startup" (no model yet), "compile" (params initialised), "training"."""
    text = recorded("tiny-pass.log")
    if phase == "startup":
        head = text.split("Memstats")[0]
        head = head[: head.rfind("\n") + 1]
    elif phase == "compile":
        head = cut_before_steps(text)
    else:
        head = text[: text.find("completed step: 3,")]
        head = head[: head.rfind("\n") + 1]
    return FakeJob(None, hang_log=head.split("==== JOB SUMMARY")[0])


class Killed(BaseException):
    """What a test raises to stand for SIGKILL: no clean-up of the sweep's runs (only `finally` blocks)."""


@dataclass
class FakeCluster:
    """The queue the fake runners share: job id -> (job, log, [polls], nodes, token)."""

    jobs: dict = field(default_factory=dict)
    count: int = 0

    def end(self, job_id: str) -> None:
        """JOB_ID ends now, as if it had run out its polls while nobody looked (its log is written)."""
        job, log, polls, nodes, _ = self.jobs[job_id]
        polls[0] = job.pending_polls + job.running_polls
        if job.final_log is not None:
            log.write_text(_identity(job.final_log, job_id, nodes))


class FakeRunner(Runner):
    parallel = True

    def __init__(
        self,
        tmp: Path,
        script: Callable[[Point, tuple[str, ...], int], FakeJob | Exception],
        cluster: FakeCluster | None = None,
        kill_at: Callable[[str, str], bool] | None = None,
    ):
        self.tmp = tmp
        self.script = script
        self.submitted: list[tuple[Point, str]] = []
        self.cancelled: list[str] = []
        self.reattached: list[str] = []
        self.cluster = cluster or FakeCluster()
        self._jobs = self.cluster.jobs
        self._attempts: dict[str, int] = {}
        self.serial = next(_RUNNERS)
        # kill_at(moment, job_id) -> True raises Killed there: "submit" (sbatch queued it, nothing recorded yet)
        # or "poll" (the engine asks the job's state)
        self.kill_at = kill_at or (lambda moment, job_id: False)

    def submit(self, point: Point, spec: str, token: str = "") -> Handle:
        self._attempts[point.key] = self._attempts.get(point.key, 0) + 1
        job = self.script(point, point.nodes, self._attempts[point.key])
        if isinstance(job, Exception):
            raise SubmitError(str(job))
        self.submitted.append((point, spec))
        self.cluster.count += 1
        job_id = str(1000 + self.cluster.count)
        # unique per cluster: a resumed sweep with a cluster of its own numbers its jobs from 1001 again
        log = self.tmp / f"r{self.serial}-{job_id}-{spec.replace(':', '-')}.log"
        self._jobs[job_id] = (job, log, [0], point.nodes, token)
        if self.kill_at("submit", job_id):
            raise Killed(f"killed while job {job_id} was being submitted")
        return Handle(job_id=job_id, log=log)

    def reattach(self, record: dict) -> Handle | None:
        job_id = record.get("job_id") or next(
            (jid for jid, entry in self._jobs.items() if record.get("token") and entry[4] == record["token"]), None
        )
        if job_id not in self._jobs:
            return None
        job, log, polls, _, _ = self._jobs[job_id]
        if polls[0] >= job.pending_polls + job.running_polls and job.hang_log is None and job.final_log is None:
            return None  # ended (or ends at the next look) without a log
        self.reattached.append(job_id)
        return Handle(job_id=job_id, log=log)

    def state(self, handle: Handle) -> str:
        if self.kill_at("poll", handle.job_id):
            raise Killed(f"killed while job {handle.job_id} ran")
        job, log, polls, _, _ = self._jobs[handle.job_id]
        polls[0] += 1
        if handle.job_id in self.cancelled:
            return ENDED
        if polls[0] <= job.pending_polls:
            return PENDING
        if job.hang_log is not None:
            log.write_text(_identity(job.hang_log, handle.job_id, self._nodes(handle)))
            return RUNNING
        if polls[0] <= job.pending_polls + job.running_polls:
            return RUNNING
        if job.final_log is not None and not log.exists():
            log.write_text(_identity(job.final_log, handle.job_id, self._nodes(handle)))
        return ENDED

    def _nodes(self, handle: Handle) -> tuple[str, ...]:
        return self._jobs[handle.job_id][3]

    def scheduler_state(self, handle: Handle) -> str | None:
        return self._jobs[handle.job_id][0].scheduler_state

    def cancel(self, handle: Handle) -> None:
        self.cancelled.append(handle.job_id)

    @property
    def keys(self) -> list[str]:
        return [p.key for p, _ in self.submitted]


def invoke(monkeypatch, tmp_path: Path, args: list[str], script, workspace: Path | None = None, **runner_args):
    """`jobkit sweep ARGS` with FakeRunner(SCRIPT, **RUNNER_ARGS) in place of Slurm; returns (click result, runner)."""
    from click.testing import CliRunner

    from jobkit import cli
    from jobkit.sweep import common

    monkeypatch.setenv("JOB_WORKSPACE", str(workspace or tmp_path / "ws"))
    runner = FakeRunner(tmp_path, script, **runner_args)
    monkeypatch.setattr(common, "RUNNER_FACTORY", lambda sweep, params: runner)
    monkeypatch.setattr(common, "FOOTER_GRACE", 0.01)
    driver, *rest = args
    argv = (
        ["sweep", driver, "--poll", "0.001", "--hang-after", "0.05", *rest]
        if driver not in ("list", "resume")
        else ["sweep", *args]
    )
    result = CliRunner().invoke(cli.main, argv, catch_exceptions=False)
    return result, runner
