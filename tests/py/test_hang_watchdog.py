"""The hang watchdog: its settings and limits, the watchdog itself against a real stand-in process and real
py-spy, and real jobs (run_local.sh, and a 2-node Slurm job) whose training the test freezes with SIGSTOP."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from job_observation import TRAINING_CMDLINE, header, live_processes_of
from launch_env import launcher_env
from slurm_cluster import job_env, local_cluster, submit_job  # noqa: F401  (local_cluster: the session fixture)

from jobkit.core.errors import EXIT_ANSWER_NO, EXIT_SETTINGS, EXIT_STOPPED
from jobkit.ops import hang_watchdog as hw

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname().split(".")[0]


# ------------------------------------------------------------------------------------------- settings, limits


def test_settings_defaults_and_overrides():
    assert hw.Settings.from_env({}) == hw.Settings(300.0, 3600.0, 10.0, "cancel", True)
    got = hw.Settings.from_env(
        {"HANG_TIMEOUT": "60", "HANG_COMPILE_TIMEOUT": "900", "HANG_STEP_FACTOR": "4", "HANG_ACTION": "Report"}
    )
    assert got == hw.Settings(60.0, 900.0, 4.0, "report", True)
    for off in ("off", "0", "OFF"):
        assert hw.Settings.from_env({"HANG_TIMEOUT": off}).enabled is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"HANG_TIMEOUT": "abc"},
            "HANG_TIMEOUT=abc is not a positive number of seconds; e.g. HANG_TIMEOUT=300, or off",
        ),
        ({"HANG_COMPILE_TIMEOUT": "-5"}, "HANG_COMPILE_TIMEOUT=-5 is not a positive number of seconds"),
        ({"HANG_STEP_FACTOR": "0"}, "HANG_STEP_FACTOR=0 is not a positive number"),
        ({"HANG_ACTION": "kill"}, "HANG_ACTION=kill is not cancel or report; e.g. HANG_ACTION=cancel"),
    ],
)
def test_bad_settings_are_one_line_errors(env, message):
    with pytest.raises(hw.SettingsError, match=re.escape(message)):
        hw.Settings.from_env(env)


@pytest.mark.parametrize("name", ["HANG_TIMEOUT", "HANG_COMPILE_TIMEOUT", "HANG_STEP_FACTOR"])
@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf"])
def test_nan_and_inf_settings_are_refused_by_the_check(name, raw):
    """nan passed `value <= 0`: HANG_STEP_FACTOR=nan made every limit the floor, silently (audit rl4)."""
    result = CliRunner().invoke(hw.command, ["--check"], env={name: raw})
    assert result.exit_code == EXIT_SETTINGS, result.output
    assert f"{name}={raw} is not a positive number" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "1e300"])
def test_interval_must_be_finite_seconds(interval):
    result = CliRunner().invoke(hw.command, ["--check", "--interval", interval])
    assert result.exit_code == 2
    assert "Invalid value for '--interval'" in result.output


def test_limit_is_the_compile_allowance_first_then_a_multiple_of_the_median_step_with_a_floor():
    settings = hw.Settings(floor=30, compile_allowance=1200, factor=10)
    progress = hw.Progress(None, changed_at=0)
    assert hw.limit(settings, progress) == 1200
    progress.feed("completed step: 0, seconds: 95.0, loss: 9.1", 1)
    progress.feed("completed step: 1, seconds: 40.0, loss: 9.0", 2)
    assert hw.limit(settings, progress) == 300, "steps 0-1 (compile) are not a step time: a quarter of the allowance"
    for step, secs in ((2, 1.0), (3, 9.0), (4, 2.0)):
        progress.feed(f"completed step: {step}, seconds: {secs}, loss: 8", 3)
    assert hw.limit(settings, progress) == 30, "10 x median 2.0 s is below the floor"
    for step in range(5, 12):
        progress.feed(f"completed step: {step}, seconds: 6.5, loss: 8", 4)
    assert hw.limit(settings, progress) == 65
    assert (progress.last_step, progress.changed_at, progress.phase) == (11, 4, "training")


def test_progress_reads_only_its_own_rank_and_only_new_steps():
    progress = hw.Progress("1", changed_at=0)
    progress.feed("0: I1124 metric_logger.py:265] completed step: 7, seconds: 1.0, loss: 8", 5)
    progress.feed("10: I1124 metric_logger.py:265] completed step: 9, seconds: 1.0, loss: 8", 6)
    assert progress.last_step is None and progress.phase == "startup"
    progress.feed("1: Memstats: After params initialized:", 7)
    assert progress.phase == "compile"
    progress.feed("1: I1124 metric_logger.py:265] completed step: 3, seconds: 1.0, loss: 8", 8)
    progress.feed("1: I1124 metric_logger.py:265] completed step: 3, seconds: 1.0, loss: 8", 9)
    assert (progress.last_step, progress.changed_at) == (3, 8), "a repeated step is not progress"


def test_log_follower_keeps_a_partial_line_for_later(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("a\nb")
    follower = hw.LogFollower(log)
    assert follower.new_lines() == ["a"]
    with log.open("a") as fh:
        fh.write("c\nd\n")
    assert follower.new_lines() == ["bc", "d"]
    assert follower.new_lines() == []


# ------------------------------------------------------------------- the watchdog against a real stand-in process


def stand_in_training(job_id, rank="0"):
    """A Python process that looks like training to the watchdog (`... jobkit launch` in its command line,
    JOB_ID and NODE_RANK in its environment) and sits in a function the stacks must show."""
    code = "import time\ndef waiting_for_a_collective():\n    time.sleep(600)\nwaiting_for_a_collective()\n"
    env = {**os.environ, "JOB_ID": job_id, "NODE_RANK": rank}
    return subprocess.Popen([sys.executable, "-c", code, "jobkit", "launch"], env=env)


def run_watchdog(tmp_path, job_id, settings, lines, nnodes=1):
    log = tmp_path / "job.log"
    log.write_text("".join(lines))
    (tmp_path / "job").mkdir(exist_ok=True)
    dog = hw.Watchdog(settings, log, tmp_path / "job" / "hang", job_id, "0", nnodes, "hostA", interval=0.2)
    return dog, dog.run()


def test_a_silent_training_process_is_declared_hung_its_stacks_captured_and_it_is_stopped(tmp_path):
    job_id = f"hwtest-{os.getpid()}"
    proc = stand_in_training(job_id)
    try:
        steps = [f"completed step: {s}, seconds: 0.05, loss: 8.0\n" for s in range(6)]
        t0 = time.monotonic()
        dog, rc = run_watchdog(tmp_path, job_id, hw.Settings(floor=1.0, compile_allowance=60, factor=5), steps)
        took = time.monotonic() - t0
        assert rc == EXIT_STOPPED
        assert proc.wait(timeout=15) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert dog.declared
    hang = tmp_path / "job" / "hang"
    marker = (hang / "HANG").read_text()
    assert re.fullmatch(
        rf"phase training, last step 5, \d+ s since, noticed on hostA \(rank 0\)\njob={job_id}\n", marker
    )
    assert hw.read_marker(tmp_path / "job", job_id).startswith("phase training, last step 5"), "its own: trusted"
    stacks = (hang / "hostA.txt").read_text()
    assert stacks.startswith("HANG on hostA (rank 0): phase training, last step 5")
    assert f"pid {proc.pid}, state S" in stacks
    assert "[py-spy --native]" in stacks and "waiting_for_a_collective" in stacks, stacks
    assert 1.0 < took < 30, took


def test_report_action_records_but_leaves_training_running(tmp_path):
    job_id = f"hwtest-report-{os.getpid()}"
    proc = stand_in_training(job_id)
    result = {}
    try:
        settings = hw.Settings(floor=1.0, compile_allowance=60, factor=5, action="report")
        lines = [f"completed step: {s}, seconds: 0.05, loss: 8.0\n" for s in range(4)]
        thread = threading.Thread(target=lambda: result.update(rc=run_watchdog(tmp_path, job_id, settings, lines)[1]))
        thread.start()
        hang = tmp_path / "job" / "hang"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (hang / "hostA.txt").exists():
            time.sleep(0.2)
        assert (hang / "hostA.txt").exists()
        time.sleep(1)
        assert proc.poll() is None, "report leaves training alone"
    finally:
        proc.kill()
        proc.wait()
    thread.join(timeout=10)
    assert result == {"rc": 0}, "the watchdog ends with training"


def test_a_marker_from_another_node_makes_this_node_capture_its_stacks_at_once(tmp_path):
    job_id = f"hwtest-peer-{os.getpid()}"
    proc = stand_in_training(job_id)
    hang = tmp_path / "job" / "hang"
    hang.mkdir(parents=True)
    (hang / "HANG").write_text(f"phase training, last step 40, 300 s since, noticed on hostB (rank 1)\njob={job_id}\n")
    (hang / "hostB.txt").write_text("stacks of hostB\n")
    try:
        # Found even if it has not exec'd yet (a loaded machine): the watchdog waits for this node's training.
        # This node's own limit is far away (an hour): only the peer's marker can make it act.
        settings = hw.Settings(floor=3600, compile_allowance=3600, factor=10)
        dog, rc = run_watchdog(tmp_path, job_id, settings, ["completed step: 3, seconds: 0.1, loss: 8\n"], nnodes=2)
        assert rc == EXIT_STOPPED and not dog.declared
        assert proc.wait(timeout=15) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "HANG on hostA (rank 0): phase training, last step 40" in (hang / "hostA.txt").read_text()


# --------------------------------------------------------------------- markers planted in a shared workspace

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting a teammate's file needs root (chown)")
TEAMMATE = 65534  # nobody: the teammate with write access to the shared workspace


def planted(path, text, uid=TEAMMATE):
    path.write_text(text)
    os.lchown(path, uid, uid)
    return path


def plant(kind, job, job_id):
    """Plants KIND in the job dir JOB (a team workspace's: anyone may write); returns the file the watchdog
    must name when it ignores it."""
    hang = job / "hang"
    marker = f"phase training, last step 9, 300 s since, noticed on hostB (rank 1)\njob={job_id}\n"
    if kind == "teammate's hang dir":
        hang.mkdir(mode=0o777)
        os.lchown(hang, TEAMMATE, TEAMMATE)
        planted(hang / "HANG", marker)
        return hang
    if kind == "group-writable hang dir":
        hang.mkdir()
        hang.chmod(0o775)  # ours, but a teammate could have put HANG there
        planted(hang / "HANG", marker)
        return hang
    if kind == "an older job's marker":  # our own dir and file, moved here from an earlier job dir
        hang.mkdir()
        (hang / "HANG").write_text(marker.replace(f"job={job_id}", "job=1"))
        return hang / "HANG"
    stop = job / hw.TIME_LIMIT_MARKER
    body = hw.marker_body("time limit near: save and stop", job_id)
    if kind == "teammate's time-limit marker":
        planted(stop, body)
    elif kind == "time-limit marker as a link":
        (job / "ours.txt").write_text(body)
        stop.symlink_to(job / "ours.txt")
    elif kind == "time-limit marker as a hard link":
        (job / "ours.txt").write_text(body)
        os.link(job / "ours.txt", stop)
    return stop


@needs_root
@pytest.mark.parametrize(
    "kind",
    [
        "teammate's hang dir",
        "group-writable hang dir",
        "an older job's marker",
        "teammate's time-limit marker",
        "time-limit marker as a link",
        "time-limit marker as a hard link",
    ],
)
def test_a_planted_marker_is_ignored_and_said_in_the_log(tmp_path, capsys, kind):
    job_id = f"hwtest-planted-{os.getpid()}"
    job = tmp_path / "job"
    job.mkdir()
    job.chmod(0o777)
    named = plant(kind, job, job_id)
    go = tmp_path / "training-may-end"
    # Training that ends by itself (exit 0) once the test has seen the watchdog ignore the plant.
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "jobkit", "launch"], env={**os.environ, "JOB_ID": job_id, "NODE_RANK": "0"}
    )
    result, said = {}, ""
    try:
        settings = hw.Settings(floor=3600, compile_allowance=3600, factor=10)  # this node's own limit is far away
        lines = ["completed step: 3, seconds: 0.1, loss: 8\n"]
        (tmp_path / "job.log").write_text("".join(lines))
        dog = hw.Watchdog(settings, tmp_path / "job.log", job / "hang", job_id, "0", 1, "hostA", interval=0.2)
        thread = threading.Thread(target=lambda: result.update(rc=dog.run()))
        thread.start()
        # Training may end only once the watchdog has said what it ignored and is watching training: ended
        # before the watchdog found it, it would be waited for until start_wait (a race under load).
        deadline = time.monotonic() + 120
        while not ("ignored" in said and dog.training_pid == proc.pid) and thread.is_alive():
            assert time.monotonic() < deadline, f"the watchdog never watched training: {said}"
            said += capsys.readouterr().out
            time.sleep(0.1)
        go.touch()
        thread.join(timeout=30)
        assert proc.wait(timeout=15) == 0, "training was not stopped"
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    said += capsys.readouterr().out
    assert result == {"rc": 0}, said
    assert re.search(rf"^\[hang\] hostA: ignored {re.escape(str(named))} ", said, re.M), said
    assert "HANG detected" not in said and "TERM to training" not in said, said


@needs_root
def test_marker_cli_prints_only_this_jobs_own_marker(tmp_path, monkeypatch):
    job_id = "77"
    monkeypatch.setenv("JOB_ID", job_id)
    job = tmp_path / "job"
    job.mkdir()
    run = CliRunner().invoke
    assert run(hw.command, ["--marker", "--job-dir", str(job)]).exit_code == EXIT_ANSWER_NO, "no marker: no hang"
    plant("teammate's hang dir", job, job_id)
    got = run(hw.command, ["--marker", "--job-dir", str(job)])
    assert got.exit_code == EXIT_ANSWER_NO and got.stdout == ""
    assert f"[hang] ignored {job / 'hang'} belongs to uid {TEAMMATE}" in got.stderr
    shutil.rmtree(job / "hang")
    (job / "hang").mkdir()
    (job / "hang" / "HANG").write_text(hw.marker_body("phase training, last step 9, 300 s since", job_id))
    got = run(hw.command, ["--marker", "--job-dir", str(job)])
    assert (got.exit_code, got.stdout) == (0, "phase training, last step 9, 300 s since\n")


def test_time_limit_marker_is_written_whole_through_no_link(tmp_path, monkeypatch):
    monkeypatch.setenv("JOB_ID", "78")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (tmp_path / hw.TIME_LIMIT_MARKER).symlink_to(victim)  # planted
    assert CliRunner().invoke(hw.command, ["--time-limit", "--job-dir", str(tmp_path)]).exit_code == 0
    assert victim.read_text() == "mine\n"
    assert not (tmp_path / hw.TIME_LIMIT_MARKER).is_symlink()
    assert hw.time_limit_requested(tmp_path, "78") and not hw.time_limit_requested(tmp_path / "none", "78")


def test_stacks_are_written_whole_through_no_link(tmp_path):
    hang = tmp_path / "hang"
    hang.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    for name in ("hostA.txt", "hostA.tmp"):  # the final name and the old fixed temp name
        (hang / name).unlink(missing_ok=True)
        (hang / name).symlink_to(victim)
    hw.capture_stacks(None, hang / "hostA.txt", "HANG on hostA (rank 0): test")
    assert victim.read_text() == "mine\n"
    assert (hang / "hostA.txt").read_text().startswith("HANG on hostA (rank 0): test\n")


# ------------------------------------------------------------------------------------------------ real jobs


def training_pids(job_id, rank=None):
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    if rank is None:
        return pids
    return [p for p in pids if f"NODE_RANK={rank}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


@pytest.mark.e2e  # runs ./run_local.sh tiny for real
def test_run_local_training_frozen_mid_run_ends_as_hang_with_stacks(tmp_path):
    workspace = tmp_path / "ws"
    env = launcher_env(workspace, HANG_TIMEOUT="4", HANG_STEP_FACTOR="5")
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        job_id = proc.stdout.readline().strip().split("=", 1)[1]
        for line in proc.stdout:
            if "completed step: 5," in line:
                break
        (pid,) = training_pids(job_id)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        rest, _ = proc.communicate(timeout=120)
        took = time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, rest[-3000:]
    hang_line = re.search(r"^== HANG detected \(phase training, last step (\d+), (\d+) s since\) ==$", rest, re.M)
    assert hang_line, rest[-3000:]
    assert int(hang_line.group(1)) >= 5
    assert re.search(r"Status: HANG \(exit 143\) — phase training, last step \d+", rest)
    assert re.search(r"— FAIL \(hang\)$", rest, re.M)
    assert 4 < took < 60, took
    log = next(workspace.glob("local_*.log"))
    job_dir = log.with_suffix("")
    stacks = (job_dir / "hang" / f"{HOST}.txt").read_text()
    assert f"pid {pid}, state T (stopped)" in stacks
    assert "[py-spy --nonblocking]" in stacks and "jobkit launch" in stacks and "Thread " in stacks, stacks
    why = subprocess.run([str(REPO / ".venv" / "bin" / "jobkit"), "why", str(log)], capture_output=True, text=True)
    assert why.stdout.splitlines()[0] == "hang: training"
    assert live_processes_of(job_id) == []
    assert header(log.read_text())["JOB_ID"] == job_id


# The 2-node frozen-rank case (both hosts' stacks, HANG, the monitor, a requeued attempt that resumes) is
# tests/py/test_requeue.py::test_two_node_hang_is_told_by_the_monitor_and_the_requeued_attempt_resumes.
