"""Run one command as a child subreaper, and stop whatever it leaves behind when it ends.

Why: a daemon that detaches (Ray's `ray start` starts GCS, raylet and dashboard, then exits) is re-parented to
init, out of reach of Slurm's proctrack/linuxproc, which finds a job's processes by their parents. When a job's
own teardown is cut short (srun --kill-on-bad-exit, KillWait), such a daemon outlives the job, keeps serving
under the job owner's uid and holds its ports. Linux re-parents an orphan to its nearest *subreaper* ancestor
instead of init (prctl PR_SET_CHILD_SUBREAPER): this process is one, so every orphan of the command's tree stays
below it, inside the job, where Slurm's final KILL finds it; and when the command ends, whatever is left below is
stopped here (TERM, GRACE seconds, KILL) and named on stderr.

Signals from outside reach the whole tree already (slurmstepd signals every process of the step; run_local.sh
its process group), so nothing is forwarded: TERM and INT only stop this process from dying before its child.

Steps of `run`:
  1. become a subreaper (else: run the command plainly and say so; nothing to keep)
  2. start the command; wait for it, reaping adopted orphans that end meanwhile
  3. stop what is left below us; reap it
  4. exit with the command's status (128+N when a signal N ended it)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from jobkit.core import procfs

PR_SET_CHILD_SUBREAPER = 36


class ReaperError(Exception):
    """The command could not be started (its message names why)."""


def become_subreaper() -> bool:
    """Step 1: True when this process now adopts the orphans of its descendants."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _status(raw: int) -> int:
    return 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _wait_for(child: int) -> int:
    """Step 2: waits for CHILD, reaping any adopted orphan that ends first; the child's exit status."""
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:  # pragma: no cover - the child is ours until we reap it
            return 1
        if pid == child:
            return _status(raw)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_leftovers(grace: float) -> list[str]:
    """Step 3: stops every process still below this one; returns them as "PID (name)" for the log."""
    left = [pid for pid in procfs.descendants(os.getpid()) if procfs.alive(pid)]
    named = []
    for pid in left:
        argv = procfs.cmdline(pid)
        named.append(f"{pid} ({os.path.basename(argv[0]) if argv else '?'})")
    if left:
        procfs.stop(left, grace)
    _reap_all()
    return named


def run(argv: list[str], grace: float) -> int:
    """Runs ARGV under this process as subreaper; its exit status. Raises ReaperError when it cannot start."""
    keeping = become_subreaper()
    if not keeping:
        print("jobkit reap: this kernel refused PR_SET_CHILD_SUBREAPER: running without it", file=sys.stderr)
    # A handler, not SIG_IGN: the child must get the default dispositions back on exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(argv, restore_signals=True)  # noqa: S603 - argv given by our own scripts
    except OSError as exc:
        raise ReaperError(f"cannot run {argv[0]}: {exc.strerror}") from None
    rc = _wait_for(child.pid)
    child.returncode = rc  # already reaped above; keeps Popen from waiting again
    if keeping:
        named = stop_leftovers(grace)
        if named:
            print(
                f"jobkit reap: stopped {len(named)} process(es) {argv[0].rsplit('/', 1)[-1]} left behind: "
                + ", ".join(named[:10])
                + (" ..." if len(named) > 10 else ""),
                file=sys.stderr,
                flush=True,
            )
    return rc
