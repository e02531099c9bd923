"""`jobkit sweep resume` after a sweep was killed without its clean-up (SIGKILL): re-attach to the jobs it left
queued or running, read those that ended meanwhile, submit only the rest; and the runners' own re-attach
(a local job by PID and start time or by its token; a Slurm job by id or by its comment), no Slurm."""

import json
import os
import signal
import subprocess
import sys

import pytest
from sweep_fakes import FakeCluster, FakeJob, Killed, invoke, passing

from jobkit.core import procfs
from jobkit.sweep.jobs import ENDED, RUNNING, TOKEN_ENV, LocalRunner, Point, SlurmRunner

TGS = {"n1": 1000.0, "n2": 990.0, "n3": 965.0}


def by_node(point, nodes, attempt):
    return passing(TGS[point.key])


def events(tmp_path, sweep_id):
    lines = (tmp_path / "ws" / "sweeps" / sweep_id / "points.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def killed_node_sweep(monkeypatch, tmp_path, cluster, script=by_node, kill_at=None):
    """`sweep nodes s1 -w n[1-3]` killed (no clean-up) while job 1002 is polled: all three are in flight."""
    kill_at = kill_at or (lambda moment, job_id: moment == "poll" and job_id == "1002")
    with pytest.raises(Killed):
        invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n[1-3]"], script, cluster=cluster,
               kill_at=kill_at)  # fmt: skip
    plan = json.loads((tmp_path / "ws" / "sweeps" / "s1" / "plan.json").read_text())
    assert plan["state"] == "running"  # nothing ran the clean-up


def test_resume_reattaches_to_jobs_still_running_and_submits_none_again(monkeypatch, tmp_path):
    cluster = FakeCluster()
    killed_node_sweep(monkeypatch, tmp_path, cluster)
    assert set(cluster.jobs) == {"1001", "1002", "1003"}
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node, cluster=cluster)
    assert result.exit_code == 0, result.output
    assert runner.submitted == []  # no sbatch at all: every point's job was still there
    assert sorted(runner.reattached) == ["1001", "1002", "1003"]
    for job_id in ("1001", "1002", "1003"):
        assert f"re-attached to job {job_id} of an earlier run" in result.output
    done = {e["key"]: e["outcome"]["job_id"] for e in events(tmp_path, "s1") if e["event"] == "done"}
    assert done == {"n1": "1001", "n2": "1002", "n3": "1003"}
    assert "Recommended nodelist (healthy)" in result.output


def test_a_job_that_ended_while_the_sweep_was_dead_is_read_from_its_log(monkeypatch, tmp_path):
    cluster = FakeCluster()
    killed_node_sweep(monkeypatch, tmp_path, cluster)
    cluster.end("1003")  # n3's job finished while nobody watched
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node, cluster=cluster)
    assert result.exit_code == 0, result.output
    assert runner.submitted == []
    assert "[n3] tiny 1N (job 1003): 965 TGS/device — PASS" in result.output


def test_only_a_job_that_vanished_without_a_log_is_submitted_again(monkeypatch, tmp_path):
    cluster = FakeCluster()

    def n3_dies(point, nodes, attempt):
        return FakeJob(None) if point.key == "n3" and attempt == 1 else by_node(point, nodes, attempt)

    killed_node_sweep(monkeypatch, tmp_path, cluster, script=n3_dies)
    cluster.end("1003")  # gone, and it never wrote a log
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node, cluster=cluster)
    assert result.exit_code == 0, result.output
    assert runner.keys == ["n3"]
    assert sorted(runner.reattached) == ["1001", "1002"]
    assert "[n3] job 1003 of an earlier run never started or vanished without a log; submitting" in result.output


def test_a_job_queued_before_the_kill_was_recorded_is_found_by_its_token(monkeypatch, tmp_path):
    cluster = FakeCluster()
    # killed after sbatch queued job 1002 and before the sweep learnt its id
    killed_node_sweep(
        monkeypatch, tmp_path, cluster, kill_at=lambda moment, job_id: (moment, job_id) == ("submit", "1002")
    )
    recorded = events(tmp_path, "s1")
    n2 = [e for e in recorded if e["key"] == "n2"]
    assert [e["event"] for e in n2] == ["submitting"] and n2[0]["token"] == cluster.jobs["1002"][4]
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node, cluster=cluster)
    assert result.exit_code == 0, result.output
    assert runner.keys == ["n3"]  # n3 was never submitted
    assert sorted(runner.reattached) == ["1001", "1002"]


def test_jobs_cancelled_by_a_clean_interrupt_run_afresh(monkeypatch, tmp_path):
    """Ctrl-C cancels the sweep's jobs and records it: resume submits those points, it does not wait for them."""

    def interrupt(moment, job_id):
        if moment == "poll" and job_id == "1002":
            os.kill(os.getpid(), signal.SIGINT)  # the engine's handler turns it into a clean interrupt
        return False

    result, _ = invoke(
        monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n[1-2]"], by_node, kill_at=interrupt
    )
    assert result.exit_code == 130, result.output
    assert {e["key"] for e in events(tmp_path, "s1") if e["event"] == "cancelled"} == {"n1", "n2"}
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1"], by_node)
    assert result.exit_code == 0, result.output
    assert sorted(runner.keys) == ["n1", "n2"] and runner.reattached == []


# --- the real runners' re-attach ---
def sleeper(tmp_path, token, seconds=60):
    """A stand-in for run_local.sh carrying TOKEN in its environment, as LocalRunner starts it."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        env={**os.environ, TOKEN_ENV: token},
        start_new_session=True,
    )


def test_local_reattach_follows_a_recorded_pid_only_while_its_start_time_matches(tmp_path):
    runner = LocalRunner(tmp_path / "console")
    process = sleeper(tmp_path, "s1.n1.a1.aaaa")
    try:
        start = procfs.stat(process.pid).start
        handle = runner.reattach({"token": "s1.n1.a1.aaaa", "job_id": "pid1", "pid": process.pid, "start": start})
        assert handle is not None and handle.pid == process.pid and runner.state(handle) == RUNNING
        # the same PID with another start time is another process: not the job, and no log to read
        assert runner.reattach({"token": "", "pid": process.pid, "start": start + 1}) is None
        runner.cancel(handle)  # by PID and start time: TERM
        assert process.wait(timeout=10) == -signal.SIGTERM
        assert runner.state(handle) == ENDED
    finally:
        process.kill()
        process.wait()


def test_local_reattach_finds_a_job_by_its_token_when_no_pid_was_recorded(tmp_path):
    runner = LocalRunner(tmp_path / "console")
    process = sleeper(tmp_path, "s1.n1.a1.bbbb")
    try:
        handle = runner.reattach({"token": "s1.n1.a1.bbbb"})  # killed between the start and its record
        assert handle is not None and handle.pid == process.pid and runner.state(handle) == RUNNING
        assert runner.reattach({"token": "s1.n1.a1.other"}) is None
    finally:
        process.kill()
        process.wait()


def test_local_reattach_reads_the_log_of_a_job_that_ended(tmp_path):
    runner = LocalRunner(tmp_path / "console")
    log = tmp_path / "local_1-JAX-tiny.log"
    console = tmp_path / "console" / "s1.n1.a1.cccc.out"
    console.parent.mkdir()
    console.write_text(f"[run_local] log: {log}\n")
    assert runner.reattach({"token": "s1.n1.a1.cccc"}) is None  # the log it names is not there: run again
    log.write_text("JOB_ID=local_1\n")
    handle = runner.reattach({"token": "s1.n1.a1.cccc"})
    assert handle is not None and handle.log == log and handle.job_id == "local_1" and runner.state(handle) == ENDED


@pytest.fixture
def fake_slurm(tmp_path):
    """squeue / submit.sh stand-ins: `squeue -j ID` prints $tmp/state.out (the job's state), any other squeue
    $tmp/queue.out (the user's queue: id and comment); submit.sh records its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(
        f'#!/bin/sh\ncase " $* " in *" -j "*) cat "{tmp_path}/state.out" ;; *) cat "{tmp_path}/queue.out" ;; esac\n'
    )
    (bin_dir / "squeue").chmod(0o755)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "submit.sh").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\necho "Submitted job 77 (JAX-tiny)"\n'
        f'echo "  log:      {tmp_path}/ws/77-JAX-tiny.log"\n'
    )
    (repo / "submit.sh").chmod(0o755)
    (tmp_path / "ws").mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "JOB_WORKSPACE": str(tmp_path / "ws")}
    return SlurmRunner(env=env), repo


def test_slurm_submit_marks_the_job_with_its_token(tmp_path, fake_slurm):
    runner, repo = fake_slurm
    handle = runner.submit(Point("n1", "tiny", nodes=("n1",), args=("steps=15",), repo=str(repo)), "tiny:s1", "T1")
    assert handle.job_id == "77"
    argv = (tmp_path / "argv").read_text().splitlines()
    assert "--comment=jobkit-sweep:T1" in argv and argv.index("--comment=jobkit-sweep:T1") < argv.index("--")


def test_slurm_reattach_by_comment_by_id_and_not_when_gone_without_a_log(tmp_path, fake_slurm):
    runner, _ = fake_slurm
    (tmp_path / "queue.out").write_text("4242 jobkit-sweep:T1\n4243 jobkit-sweep:T2\n")
    (tmp_path / "state.out").write_text("PENDING\n")
    log = tmp_path / "ws" / "4242-JAX-tiny-s1-n1.log"
    log.write_text("")
    handle = runner.reattach({"token": "T1"})  # queued before the sweep learnt its id
    assert handle is not None and handle.job_id == "4242" and handle.log == log
    assert runner.reattach({"token": "T9"}) is None  # not in the queue, id never learnt: submitted again
    (tmp_path / "state.out").write_text("RUNNING\n")
    assert runner.reattach({"token": "T2", "job_id": "4243"}).job_id == "4243"  # running, no log written yet
    (tmp_path / "queue.out").write_text("")  # the queue forgot both: they ended
    (tmp_path / "state.out").write_text("")
    assert runner.reattach({"token": "T1", "job_id": "4242", "log": str(log)}).log == log  # read its log
    assert runner.reattach({"token": "T2", "job_id": "4243"}) is None  # ended without a log: submitted again


# --- extending a sweep: resume with options ---
def unimodal(b):  # peaks at 20
    return 1000 + 100 * b - 2.5 * b * b


def by_batch(point, nodes, attempt):
    return passing(unimodal(float(point.key.split("=", 1)[1].split("#")[0])))  # "4#2": the value's 2nd run


def tried(runner):
    return [p.key.split("=", 1)[1] for p, _ in runner.submitted]


@pytest.fixture
def tiny_config(monkeypatch, tmp_path):
    """The batch driver reads a private copy of configs/tiny.yml (never the real one); no GPU on this host."""
    import shutil
    from pathlib import Path

    from jobkit.launch import gpu
    from jobkit.sweep import batch

    copy = tmp_path / "configs"
    copy.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "configs" / "tiny.yml", copy / "tiny.yml")
    monkeypatch.setattr(batch, "CONFIGS_DIR", copy)
    monkeypatch.setattr(gpu, "detect", lambda: None)


def finished_batch(monkeypatch, tmp_path, max_runs="2", sweep_id="b1"):
    args = ["batch", "--id", sweep_id, "--local", "tiny", "--start", "4", "--max-runs", max_runs]
    args += ["--device-memory", "1000"]  # on CPU the probe needs its bound; this one is far above tiny's needs
    result, runner = invoke(monkeypatch, tmp_path, args, by_batch)
    assert result.exit_code == 0, result.output
    assert f"--max-runs {max_runs} reached" in result.output
    return tried(runner)


def test_a_finished_sweep_stopped_by_max_runs_is_extended_and_runs_only_the_new_points(
    monkeypatch, tmp_path, tiny_config
):
    whole = finished_batch(monkeypatch, tmp_path, max_runs="4", sweep_id="fresh")  # what 4 runs probe at once
    first = finished_batch(monkeypatch, tmp_path)
    assert first == whole[: len(whole) // 2]  # 2 of 4 values, each with its --repeats runs
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1", "--max-runs", "4"], by_batch)
    assert result.exit_code == 0, result.output
    assert "[sweep] b1: --max-runs 2 -> 4" in result.output
    assert (
        tried(runner) == whole[len(first) :]
    )  # the probe goes on where it stopped; the first two answer from the record
    assert "[per_device_batch_size=4] (recorded)" in result.output
    assert "Runs: 4 value(s) of at most 4, 2 job(s) each." in result.output
    plan = json.loads((tmp_path / "ws" / "sweeps" / "b1" / "plan.json").read_text())
    assert plan["params"]["max_runs"] == 4 and plan["state"] == "finished"


def test_resume_refuses_to_shrink_a_budget_or_to_extend_a_finished_sweep_without_one(
    monkeypatch, tmp_path, tiny_config
):
    finished_batch(monkeypatch, tmp_path, max_runs="3")
    plan_before = (tmp_path / "ws" / "sweeps" / "b1" / "plan.json").read_text()
    cases = [
        (["--max-runs", "2"], "--max-runs 2 is below the sweep's 3: resume only raises it (the runs done stay)"),
        (["--max-runs", "0"], "jobkit sweep: --max-runs '0': 0 is not in the range"),
        (["--max-runs", "nan"], "jobkit sweep: --max-runs 'nan': 'nan' is not a valid"),
        (["--poll", "inf"], "jobkit sweep: --poll 'inf': "),
        (["--poll", "5"], "already finished (results in"),
        ([], "extend it with `jobkit sweep resume b1 --max-runs N` (N above 3)"),
    ]
    for extra, needle in cases:
        result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1", *extra], by_batch)
        assert result.exit_code == 1, (extra, result.output)
        assert needle in result.output and len(result.output.strip().splitlines()) == 1, (extra, result.output)
        assert runner.submitted == []
    assert (tmp_path / "ws" / "sweeps" / "b1" / "plan.json").read_text() == plan_before


def test_resume_refuses_an_option_the_driver_has_not(monkeypatch, tmp_path):
    result, _ = invoke(monkeypatch, tmp_path, ["nodes", "--id", "s1", "tiny", "-w", "n1"], by_node)
    assert result.exit_code == 0, result.output
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1", "--max-runs", "9"], by_node)
    assert result.exit_code == 1 and runner.submitted == []
    assert result.output.strip() == "jobkit sweep: sweep s1 (nodes) has no --max-runs; resume it without --max-runs"


def test_resume_takes_new_watch_settings_for_an_unfinished_sweep(monkeypatch, tmp_path):
    cluster = FakeCluster()
    killed_node_sweep(monkeypatch, tmp_path, cluster)
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "s1", "--max-retries", "0"], by_node, cluster=cluster)
    assert result.exit_code == 0, result.output
    assert "[sweep] s1: --max-retries 2 -> 0" in result.output and runner.submitted == []
    assert json.loads((tmp_path / "ws" / "sweeps" / "s1" / "plan.json").read_text())["params"]["max_retries"] == 0


def test_max_runs_is_refused_for_a_sweep_of_given_values(monkeypatch, tmp_path, tiny_config):
    args = ["batch", "--id", "v1", "--local", "tiny", "--values", "4,6"]
    result, _ = invoke(monkeypatch, tmp_path, args, by_batch)
    assert result.exit_code == 0, result.output
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "v1", "--max-runs", "9"], by_batch)
    assert result.exit_code == 1 and runner.submitted == []
    assert result.output.strip() == (
        "jobkit sweep: sweep v1 runs exactly its --values; --max-runs bounds only the probing (drop it)"
    )
    result, _ = invoke(monkeypatch, tmp_path, ["resume", "v1"], by_batch)
    assert result.exit_code == 1 and result.output.strip().endswith("; start a new one with another --id")


def test_a_batch_sweep_recorded_before_repeats_resumes_with_one_run_per_value(monkeypatch, tmp_path, tiny_config):
    """A plan.json written before --repeats existed ran each value once: resume must not add `#2` runs."""
    finished_batch(monkeypatch, tmp_path, max_runs="2")
    plan_file = tmp_path / "ws" / "sweeps" / "b1" / "plan.json"
    plan = json.loads(plan_file.read_text())
    del plan["params"]["repeats"]
    plan_file.write_text(json.dumps(plan))
    result, runner = invoke(monkeypatch, tmp_path, ["resume", "b1", "--max-runs", "3"], by_batch)
    assert result.exit_code == 0, result.output
    assert len(tried(runner)) == 1 and "#" not in tried(runner)[0], tried(runner)
