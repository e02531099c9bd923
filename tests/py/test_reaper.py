"""`jobkit reap` (py/jobkit/core/reaper.py): what a command leaves behind stays below the reaper and is stopped
when the command ends. Real processes: a command that detaches a daemon the way `ray start` does (setsid, then
the starter exits), which without a subreaper would be re-parented to init and outlive the job."""

import os
import subprocess
import sys
import time
from pathlib import Path

from jobkit.core import procfs

JOBKIT = Path(sys.executable).parent / "jobkit"


def _wait_for_file(path: Path, proc: subprocess.Popen) -> str:
    while not path.exists() or not path.read_text().endswith("\n"):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "reaper exited early"
        time.sleep(0.02)
    return path.read_text()


def test_a_detached_daemon_is_adopted_while_the_command_runs_and_stopped_when_it_ends(tmp_path):
    daemon_pid, release = tmp_path / "daemon.pid", tmp_path / "release"
    # The daemon writes its PID and sleeps; the starter exits at once (like `ray start`), and the command itself
    # (like _job.sbatch --task) goes on until the test releases it.
    script = (
        f"(setsid bash -c 'echo $$ > {daemon_pid}.tmp; mv {daemon_pid}.tmp {daemon_pid}; exec sleep 300' &) ; "
        f"while [ ! -e {release} ]; do sleep 0.05; done; exit 7"
    )
    proc = subprocess.Popen(
        [str(JOBKIT), "reap", "--grace", "2", "--", "bash", "-c", script], stderr=subprocess.PIPE, text=True
    )
    try:
        pid = int(_wait_for_file(daemon_pid, proc))
        # Re-parented to the reaper, not to init: still in the job's process tree.
        assert procfs.stat(pid).ppid == proc.pid
        release.touch()
        rc = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 7  # the command's own status
    assert not procfs.alive(pid)
    assert f"stopped 1 process(es) bash left behind: {pid} (sleep)" in err


def test_a_command_that_leaves_nothing_ends_quietly_with_its_status(tmp_path):
    proc = subprocess.run([str(JOBKIT), "reap", "--", "bash", "-c", "kill -TERM $$"], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (128 + 15, "")
    proc = subprocess.run([str(JOBKIT), "reap", "--", "true"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_command_that_cannot_run_is_one_line_and_127(tmp_path):
    missing = tmp_path / "no-such-command"
    proc = subprocess.run([str(JOBKIT), "reap", "--", str(missing)], capture_output=True, text=True)
    assert proc.returncode == 127
    assert proc.stderr.splitlines() == [f"jobkit reap: cannot run {missing}: No such file or directory"]


def test_term_to_the_reaper_alone_does_not_orphan_the_command(tmp_path):
    """Signals reach the whole tree from outside (slurmstepd, run_local.sh's group kill); one that reaches only
    the reaper must not end it before its command, or the command's tree would escape to init."""
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [str(JOBKIT), "reap", "--", "bash", "-c", f"echo go > {started}; sleep 1; exit 3"],
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_file(started, proc)
    os.kill(proc.pid, 15)
    assert proc.wait(timeout=60) == 3
