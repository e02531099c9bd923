"""The hang watchdog with a process per device (LOCAL_WORLD_SIZE > 1, issue 25): every process of the node is
watched by its `[rank<G>]: ` lines (the slowest is the node's progress), found by LOCAL_RANK without its
`jobkit procs` supervisor, its stacks taken into hang/<host>.proc<i>.txt, all of them stopped on a hang; the
watchdog ends as soon as they do, and `jobkit procs` waits for it (nothing left for `jobkit reap`)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_env import launcher_env

from jobkit.core.errors import EXIT_STOPPED
from jobkit.launch import procs
from jobkit.ops import hang_watchdog as hw

STEP = "I1126 metric_logger.py:265] completed step: {n}, seconds: {s}, loss: 8"
WAITING = "import time\ndef waiting_for_a_collective():\n    time.sleep({secs})\nwaiting_for_a_collective()\n"


def process(job_id: str, local: int, node_rank: str = "0", secs: float = 600) -> subprocess.Popen:
    """A stand-in for one of `jobkit procs`'s processes: `jobkit launch` in its command line, LOCAL_RANK and
    GLOBAL_RANK (with 2 per node) in its environment."""
    env = {**os.environ, "JOB_ID": job_id, "NODE_RANK": node_rank, "LOCAL_RANK": str(local)}
    env["GLOBAL_RANK"] = str(int(node_rank) * 2 + local)
    return subprocess.Popen([sys.executable, "-c", WAITING.format(secs=secs), "jobkit", "launch"], env=env)


def supervisor(job_id: str) -> subprocess.Popen:
    """A stand-in for `jobkit procs -- python jobkit launch ...`: training's command line, but not training."""
    env = {**os.environ, "JOB_ID": job_id, "NODE_RANK": "0"}
    argv = [sys.executable, "-c", "import time; time.sleep(600)", "jobkit", "procs", "--", "python", "jobkit", "launch"]
    return subprocess.Popen(argv, env=env)


def stop(*started: subprocess.Popen) -> None:
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def found_within(job_id: str, per_node: int, want: int, seconds: float = 30) -> dict[int, int]:
    """find_trainings once it sees WANT processes (a stand-in's exec may lag on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while True:
        found = hw.find_trainings(job_id, "0", per_node)
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_each_process_is_read_by_its_rank_prefix_with_or_without_the_node_prefix():
    node2_local1 = hw.Progress(None, changed_at=0, proc="3")
    node2_local1.feed("1: [rank2]: " + STEP.format(n=9, s=1.0), 1)  # the node's other process
    node2_local1.feed("0: " + STEP.format(n=9, s=1.0), 2)  # a line without a process prefix
    node2_local1.feed("[rank33]: " + STEP.format(n=9, s=1.0), 3)
    assert node2_local1.last_step is None
    node2_local1.feed("1: [rank3]: " + STEP.format(n=4, s=1.0), 4)  # Slurm: srun -l's node prefix first
    node2_local1.feed("[rank3]: " + STEP.format(n=5, s=1.0), 5)  # run_local.sh: no node prefix
    assert (node2_local1.last_step, node2_local1.changed_at) == (5, 5)


def test_the_slowest_running_process_is_the_nodes_progress(tmp_path):
    dog = hw.Watchdog(hw.Settings(floor=30), tmp_path / "log", tmp_path / "hang", "j", "1", 2, "node2", per_node=2)
    progress = dog.progresses(0)
    assert {local: p.proc for local, p in progress.items()} == {0: "2", 1: "3"}
    for n in range(2, 8):
        progress[0].feed("1: [rank2]: " + STEP.format(n=n, s=1.0), 10 + n)  # local 0 goes on until t=17
    for n in range(2, 5):
        progress[1].feed("1: [rank3]: " + STEP.format(n=n, s=1.0), 10 + n)  # local 1 stopped at t=14
    assert dog.slowest(progress, {0: 100, 1: 101}, 40) == (1, 26, False), "26 s < the 30 s floor"
    assert dog.slowest(progress, {0: 100, 1: 101}, 45) == (1, 31, True)
    # A process that has ended makes no more steps and is no hang: only running ones count.
    assert dog.slowest(progress, {0: 100}, 45) == (0, 28, False)
    assert dog.slowest(progress, {}, 45) == (0, 0.0, False)


def test_every_process_of_the_node_is_found_by_local_rank_and_the_supervisor_is_not(tmp_path):
    job_id = f"hwprocs-find-{os.getpid()}"
    started = [supervisor(job_id), process(job_id, 0), process(job_id, 1), process(job_id, 0, node_rank="1")]
    try:
        found = found_within(job_id, 2, 2)
        assert found == {0: started[1].pid, 1: started[2].pid}, "node 1's process and the supervisor are not ours"
        assert hw.find_training(job_id, "0") == started[1].pid, "one per node: the lowest pid is training"
    finally:
        stop(*started)


def test_a_hang_takes_every_process_stacks_into_its_own_file_and_stops_them_all(tmp_path):
    job_id = f"hwprocs-hang-{os.getpid()}"
    started = [process(job_id, 0), process(job_id, 1)]
    try:
        assert len(found_within(job_id, 2, 2)) == 2
        steps = [f"[rank{g}]: " + STEP.format(n=n, s=0.05) + "\n" for n in range(6) for g in (0, 1)]
        log = tmp_path / "job.log"
        log.write_text("".join(steps))
        (tmp_path / "job").mkdir()
        settings = hw.Settings(floor=1.0, compile_allowance=60, factor=5)
        dog = hw.Watchdog(settings, log, tmp_path / "job" / "hang", job_id, "0", 1, "hostA", 0.2, per_node=2)
        assert dog.run() == EXIT_STOPPED
        assert [p.wait(timeout=15) for p in started] == [-signal.SIGTERM, -signal.SIGTERM], "both stopped"
    finally:
        stop(*started)
    hang = tmp_path / "job" / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == ["hostA.proc0.txt", "hostA.proc1.txt"]
    for local, proc in enumerate(started):
        stacks = (hang / f"hostA.proc{local}.txt").read_text()
        assert stacks.startswith(f"HANG on hostA (rank 0, process {local}, global rank {local}): phase training")
        assert f"pid {proc.pid}, state S" in stacks and "waiting_for_a_collective" in stacks, stacks


def test_the_watchdog_ends_as_soon_as_every_process_of_the_node_has_ended(tmp_path):
    job_id = f"hwprocs-end-{os.getpid()}"
    started = [process(job_id, 0, secs=3), process(job_id, 1, secs=3)]
    try:
        assert len(found_within(job_id, 2, 2)) == 2
        (tmp_path / "job.log").write_text("")
        settings = hw.Settings(floor=3600, compile_allowance=3600, factor=10)
        # A look every 60 s: only waiting on the processes' exit can end it within seconds of theirs.
        dog = hw.Watchdog(settings, tmp_path / "job.log", tmp_path / "hang", job_id, "0", 1, "hostA", 60, per_node=2)
        assert dog.run() == 0
        ended = time.monotonic()
        assert all(p.poll() is not None for p in started)
        assert dog.training_pids == {0: started[0].pid, 1: started[1].pid}
    finally:
        stop(*started)
    assert time.monotonic() - ended < 1


def test_nap_returns_when_the_processes_end_and_sleeps_without_any():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    t0 = time.monotonic()
    hw.nap([proc.pid], 60)
    assert time.monotonic() - t0 < 30 and proc.wait() == 0
    t0 = time.monotonic()
    hw.nap([], 0.3)
    assert time.monotonic() - t0 >= 0.3


def inherits(child_secs: float, bound: float) -> tuple[float, bool]:
    """In a fresh interpreter (pytest's own children are not ours to reap): a child that lives CHILD_SECS, then
    procs.wait_inherited(BOUND); how long that took and whether the child was reaped (not left a zombie)."""
    code = (
        "import os, subprocess, sys, time\n"
        "from jobkit.launch import procs\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({child_secs})'])\n"
        "t0 = time.monotonic()\n"
        f"procs.wait_inherited({bound})\n"
        "took = time.monotonic() - t0\n"
        "gone = not os.path.exists(f'/proc/{child.pid}')\n"
        "child.kill() if not gone else None\n"
        "print(took, gone)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    took, gone = out.stdout.split()
    return float(took), gone == "True"


def test_procs_waits_for_the_child_it_inherited_and_only_so_long():
    took, reaped = inherits(0.5, 30)
    assert reaped and took < 25, (took, reaped)
    took, reaped = inherits(60, 0.5)
    assert not reaped and 0.5 <= took < 10, (took, reaped)


# ------------------------------------------------ py-spy's Ray shim: the LOCAL_RANK-th process, not its supervisor

SHIM = Path(__file__).resolve().parents[2] / "utils" / "shims" / "py-spy"
SPAWN = "import subprocess, sys, time\n{body}\ntime.sleep(600)\n"
# An absolute interpreter: under `exec -a ray::...` the worker's sys.executable is empty.
CHILDREN = (
    f"kids = [subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(600)', 'jobkit', 'launch'])"
    " for _ in range(2)]"
)


def actor_tree(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A Ray worker (`ray::...` as its argv[0]) whose command runs `jobkit procs -- ... jobkit launch` with two
    training processes below it, as RAY=1 with LOCAL_WORLD_SIZE=2 does; (the worker, the two trainings' pids)."""
    procs_code = SPAWN.format(body=CHILDREN)
    supervisor = (
        f"subprocess.Popen([{sys.executable!r}, '-c', {procs_code!r}, 'jobkit', 'procs', '--', 'python', 'jobkit',"
        " 'launch'])"
    )
    script = tmp_path / "actor.py"
    script.write_text(SPAWN.format(body=supervisor))
    worker = subprocess.Popen(["bash", "-c", f'exec -a "ray::RayTraining" {sys.executable} {script}'])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        below = _children_of(worker.pid)
        if below and len(_children_of(below[0])) == 2:
            return worker, sorted(_children_of(below[0]))
        time.sleep(0.1)
    worker.kill()
    raise AssertionError("the stand-in actor's processes did not start")


def _children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.parametrize(("rank", "index"), [(None, 0), ("1", 1), ("7", 0)])
def test_pyspy_shim_takes_the_local_rank_th_training_process_below_the_supervisor(tmp_path, rank, index):
    real = tmp_path / "real-py-spy"
    real.write_text('#!/bin/sh\necho "real $*"\n')
    real.chmod(0o755)
    worker, trainings = actor_tree(tmp_path)
    try:
        env = {**os.environ, "JOBKIT_PYSPY_REAL": str(real)}
        if rank is not None:
            env["PYSPY_LOCAL_RANK"] = rank
        out = subprocess.run(
            [str(SHIM), "dump", "-p", str(worker.pid)], capture_output=True, text=True, env=env, timeout=30
        )
    finally:
        for pid in [*trainings, *_children_of(worker.pid), worker.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.wait()
    target = trainings[index]  # PYSPY_LOCAL_RANK past the count: the first, as before
    assert out.stdout == f"real dump -p {target} --subprocesses\n", out.stderr
    assert f"Ray worker {worker.pid} -> its training process {target}" in out.stderr


# ------------------------------------------------------------------------------------------------ a real job


@pytest.mark.e2e  # runs ./run_local.sh tiny for real, as 2 processes
def test_run_local_with_two_processes_leaves_no_watchdog_behind(tmp_path):
    """The watchdog ends with the node's processes and `jobkit procs` waits for it: run_local.sh's `jobkit reap`,
    which stops whatever the run leaves behind the moment it ends, has nothing to stop (it stopped the watchdog
    when it outlived its training by up to a look)."""
    repo = Path(__file__).resolve().parents[2]
    env = launcher_env(tmp_path / "ws", LOCAL_WORLD_SIZE="2", HANG_TIMEOUT="30")
    run = subprocess.run(
        [str(repo / "run_local.sh"), "tiny", "--", "steps=6"], env=env, capture_output=True, text=True, timeout=600
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert re.search(r"^\[_train\] hang watchdog: pid \d+", out, re.M), out[-3000:]
    assert re.search(r"^\[rank1\]: .*completed step: 5,", out, re.M), out[-3000:]
    assert "left behind" not in out, out[-3000:]
    assert "Status: SUCCESS (exit 0)" in out
