"""Running a Plan: each program with its argv (never a shell), a clean environment, one process group per
pipeline (killed whole when the deadline passes, and after the pipeline ends, so nothing is left behind),
and stdout / stderr kept up to a bound, with the number of bytes cut."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from jobkit.bridge.policy import Plan, Step

KILL_GRACE_S = 2.0


@dataclass
class Outcome:
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_cut: int = 0
    stderr_cut: int = 0
    timed_out: bool = False
    started: float = field(default_factory=time.time)
    ended: float = 0.0


class _Sink(threading.Thread):
    """Drains a pipe: the first LIMIT bytes are kept, the rest counted (the writer never blocks on us)."""

    def __init__(self, fd: int, limit: int):
        super().__init__(daemon=True)
        self.fd, self.limit, self.data, self.cut = fd, limit, bytearray(), 0

    def run(self) -> None:
        while chunk := os.read(self.fd, 65536):
            room = self.limit - len(self.data)
            self.data += chunk[: max(room, 0)]
            self.cut += max(len(chunk) - max(room, 0), 0)
        os.close(self.fd)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(plan: Plan, cwd: str, env: dict[str, str], timeout: float, limit: int) -> Outcome:
    """Runs PLAN's pipelines in order (`;`, `&&`, `||` as a shell would); the exit code is the last pipeline's
    last program's (128+N for a signal). Past TIMEOUT the running pipeline's group is killed (TERM, then KILL)."""
    outcome = Outcome()
    deadline = time.monotonic() + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sinks = [_Sink(out_r, limit), _Sink(err_r, limit)]
    for sink in sinks:
        sink.start()
    rc = 0
    try:
        for sep, steps in plan.pipelines:
            if (sep == "&&" and rc != 0) or (sep == "||" and rc == 0):
                continue
            rc, timed_out = _pipeline(steps, cwd, env, deadline, out_w, err_w)
            if timed_out:
                outcome.timed_out = True
                break
    finally:
        os.close(out_w)
        os.close(err_w)
        for sink in sinks:
            sink.join(KILL_GRACE_S)
    outcome.exit_code = rc
    outcome.stdout, outcome.stdout_cut = sinks[0].data.decode("utf-8", "replace"), sinks[0].cut
    outcome.stderr, outcome.stderr_cut = sinks[1].data.decode("utf-8", "replace"), sinks[1].cut
    outcome.ended = time.time()
    return outcome


def _start(steps: list[Step], cwd: str, env: dict, out_w: int, err_w: int, procs: list) -> int:
    """Starts STEPS as one pipeline in one new process group (appended to PROCS); returns 0 or the shell's
    126/127 when a program cannot be started (then the ones started are stopped by the caller)."""
    pgid = 0
    prev: int | None = None  # the read end of the pipe into the next program
    try:
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            stdin = open(step.stdin, "rb") if step.stdin else (prev if prev is not None else subprocess.DEVNULL)  # noqa: SIM115
            nxt = ours = None
            if step.stdout_null:
                stdout = subprocess.DEVNULL
            elif last:
                stdout = out_w
            else:
                nxt, ours = os.pipe()
                stdout = ours
            stderr = {"pipe": err_w, "null": subprocess.DEVNULL, "stdout": stdout}[step.stderr]
            try:
                proc = subprocess.Popen(step.argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                                        close_fds=True, process_group=pgid)  # fmt: skip
            except OSError as exc:
                os.write(err_w, f"bridge: cannot run {step.argv[0]}: {exc.strerror}\n".encode())
                if nxt is not None:
                    os.close(nxt)
                return 127 if isinstance(exc, FileNotFoundError) else 126
            finally:  # the children hold their ends now
                if step.stdin:
                    stdin.close()
                if prev is not None:
                    os.close(prev)
                    prev = None
                if ours is not None:
                    os.close(ours)
            prev = nxt
            procs.append(proc)
            pgid = pgid or proc.pid
        return 0
    finally:
        if prev is not None:
            os.close(prev)


def _pipeline(steps: list[Step], cwd: str, env: dict, deadline: float, out_w: int, err_w: int) -> tuple[int, bool]:
    procs: list[subprocess.Popen] = []
    try:
        failed = _start(steps, cwd, env, out_w, err_w, procs)
        if failed:
            return failed, False
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.001))
            except subprocess.TimeoutExpired:
                _stop(procs)
                return 124, True
        rc = procs[-1].returncode
        return (128 - rc if rc < 0 else rc), False
    finally:
        if procs:
            _killpg(procs[0].pid, signal.SIGKILL)  # whatever the pipeline left running in its group
        for p in procs:
            if p.returncode is None:
                p.wait()


def _stop(procs: list[subprocess.Popen]) -> None:
    """The deadline passed: TERM to the pipeline's group, KILL after a grace."""
    _killpg(procs[0].pid, signal.SIGTERM)
    end = time.monotonic() + KILL_GRACE_S
    for p in procs:
        try:
            p.wait(max(end - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            pass
