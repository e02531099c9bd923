"""Requeue: what is retried, which hosts are excluded, how the next attempt is submitted (units), and real
attempts on the local Slurm cluster (a time limit, a hang)."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit import logparse, requeue
from jobkit.cli import main

HEADER = "JOB_ID=500\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\n"
STEP = "0: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, Tokens/s/device: 1000.0, loss: 5.9\n"


def job_log(body: str, status: str, rc: int, header: str = HEADER, steps: int = 3) -> str:
    text = header + "".join(STEP.format(n=n) for n in range(steps)) + body
    return text + f"==== JOB SUMMARY ====\n  Status: {status} (exit {rc})\n=====================\n"


def decide(text: str, **env):
    return requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "2", **env})


@pytest.mark.parametrize(
    ("body", "status", "rc", "why"),
    [
        ("0: == HANG detected (phase training, last step 41, 312 s since) ==\n", "HANG", 143, "hang: training"),
        (
            "== TIME LIMIT near (Slurm's warning, 300s ahead): ... ==\nTraining stopped: Job received termination signal (SIGTERM).\n",
            "STOPPED",
            0,
            "time-limit",
        ),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO TIME LIMIT ***\n",
            "CANCELLED",
            143,
            "time-limit",
        ),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO PREEMPTION ***\n",
            "CANCELLED",
            143,
            "preempted",
        ),
        ("1: jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out\n", "FAILED", 1, "distributed-timeout"),
    ],
)
def test_retryable_outcomes_are_retried(body, status, rc, why):
    decision = decide(job_log(body, status, rc))
    assert decision.retry, decision
    assert decision.why.startswith(why)
    assert decision.exclude == []


@pytest.mark.parametrize(
    ("body", "status", "rc", "why"),
    [
        ("", "SUCCESS", 0, "succeeded"),
        ("Training stopped: Job received termination signal (SIGTERM).\n", "STOPPED", 0, "stopped-early: Job received"),
        (
            "slurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 ***\n",
            "CANCELLED",
            143,
            "cancelled",
        ),
        ("0: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory\n", "FAILED", 1, "oom"),
        ("0: MAXTEXT CONFIG ERROR: bad key\n", "FAILED", 1, "config-error"),
        ("0: Traceback (most recent call last):\n0: KeyError: 'x'\n", "FAILED", 1, "python-exception"),
    ],
)
def test_other_outcomes_are_not_retried(body, status, rc, why):
    decision = decide(job_log(body, status, rc))
    assert not decision.retry
    assert decision.why.startswith(why), decision.why


def test_node_failure_excludes_the_node_slurm_names_and_keeps_earlier_exclusions():
    body = "srun: error: Node failure on node2\nslurmstepd: error: *** JOB 500 ON node1 CANCELLED AT 2026-11-24T07:29:24 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    decision = decide(job_log(body, "CANCELLED", 143), REQUEUE_EXCLUDE="node7")
    assert decision.retry
    assert decision.exclude == ["node7", "node2"]


def test_gpu_fault_on_a_rank_excludes_that_ranks_host():
    body = "1: :0:rocdevice.cpp            :3020: 1234567 us: Callback: Queue 0x7f aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION\n"
    decision = decide(job_log(body, "FAILED", 134))
    assert decision.retry and decision.exclude == ["node2"]


def test_a_hang_blames_nobody():
    decision = decide(job_log("1: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    assert decision.retry and decision.exclude == []


def test_retries_are_counted_by_attempt():
    text = job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143)
    assert decide(text, ATTEMPT="2").retry
    last = decide(text, ATTEMPT="3")
    assert not last.retry
    assert "retries used up (2 allowed, this was attempt 3)" in last.why
    assert not decide(text, MAX_RETRIES="0").retry


def test_a_log_without_summary_is_never_requeued():
    text = HEADER + STEP.format(n=1)
    decision = requeue.decide(logparse.parse_text(text), text, {"MAX_RETRIES": "3"})
    assert not decision.retry and "no JOB SUMMARY" in decision.why


@pytest.mark.parametrize(
    ("args", "hosts", "expected"),
    [
        (["-N", "2"], ["node2"], ["-N", "2", "--exclude=node2"]),
        (["-N", "2", "--exclude=node5"], ["node2"], ["-N", "2", "--exclude=node5,node2"]),
        (["-x", "node5,node6", "-N2"], ["node6", "node2"], ["-N2", "--exclude=node5,node6,node2"]),
        (["-xnode5", "--time=10"], [], ["-xnode5", "--time=10"]),
        (["--exclude", "node5", "-p", "gpu"], ["node2"], ["-p", "gpu", "--exclude=node5,node2"]),
    ],
)
def test_exclusions_are_merged_into_one_option(args, hosts, expected):
    assert requeue.with_exclude(args, hosts) == expected


def test_submit_argv_splits_at_the_first_double_dash():
    assert requeue.split_submit_argv(["tiny:a:", "-N", "2", "--", "steps=5", "--", "x"]) == (
        "tiny:a:",
        ["-N", "2"],
        ["steps=5", "--", "x"],
    )
    assert requeue.split_submit_argv(["tiny"]) == ("tiny", [], [])
    with pytest.raises(requeue.RequeueError, match="only jobs submitted with submit.sh"):
        requeue.split_submit_argv([])


def fake_snapshot(tmp_path: Path, answer: str, rc: int = 0) -> Path:
    """A snapshot whose submit.sh records its arguments and environment and answers like submit.sh."""
    snap = tmp_path / "artifact"
    snap.mkdir()
    script = snap / "submit.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$@" > {tmp_path}/argv\n'
        f"env > {tmp_path}/env\n"
        f"printf '%b' '{answer}'\n"
        f"exit {rc}\n"
    )
    script.chmod(0o755)
    return snap


def test_requeue_submits_the_same_arguments_from_the_snapshot_once(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    log = ws / "500-tiny.log"
    log.write_text(job_log("srun: error: Node failure on node2\n", "CANCELLED", 143))
    new_dir = ws / "501-tiny"
    snap = fake_snapshot(tmp_path, f"Submitted job 501 (tiny)\\n  job dir:  {new_dir}\\n")
    env = {
        "MAX_RETRIES": "1",
        "MAXTEXT_LAUNCHER_DIR": str(snap),
        "SUBMIT_ARGV": "tiny:a: -N 2 --exclude=node9 -- steps=50 'run_name=a b'",
        "PATH": "/usr/bin:/bin",
    }
    decision, job_id = requeue.requeue(log, env)
    assert job_id == "501"
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == ["tiny:a:", "-N", "2", "--exclude=node9,node2", "--", "steps=50", "run_name=a b"]
    child = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert child["ATTEMPT"] == "2" and child["RETRY_OF"] == "500"
    assert child["REQUEUE_ARTIFACT"] == str(snap) and child["REQUEUE_PREVIOUS_DIR"] == "500-tiny"
    assert child["REQUEUE_EXCLUDE"] == "node2"
    job_dir = ws / "500-tiny"
    assert (job_dir / "next").readlink() == Path("../501-tiny")
    record = json.loads((job_dir / "requeue.json").read_text())
    assert record["job_id"] == "501" and record["decision"]["exclude"] == ["node2"]
    # A second call (a monitor, a rerun) finds the claim and submits nothing.
    (tmp_path / "argv").unlink()
    again, second = requeue.requeue(log, env)
    assert second is None and "already requeued" in again.why
    assert not (tmp_path / "argv").exists()


def test_a_failed_submission_is_one_line_and_recorded(tmp_path):
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    snap = fake_snapshot(tmp_path, "submit.sh: sbatch refused the job: bad partition\\n", rc=1)
    env = {"MAX_RETRIES": "1", "MAXTEXT_LAUNCHER_DIR": str(snap), "SUBMIT_ARGV": "tiny -N 2", "PATH": "/usr/bin:/bin"}
    result = CliRunner(env=env).invoke(main, ["requeue", str(log)], env=env)
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == "== REQUEUE FAILED: submit.sh failed (exit 1): submit.sh: sbatch refused the job: bad partition =="
    )
    assert "bad partition" in json.loads((tmp_path / "500-tiny" / "requeue.json").read_text())["error"]


def test_dry_run_and_not_retried_exit_codes(tmp_path):
    log = tmp_path / "500-tiny.log"
    log.write_text(job_log("0: == HANG detected (phase training, last step 4, 9 s since) ==\n", "HANG", 143))
    dry = CliRunner().invoke(main, ["requeue", "--dry-run", str(log)], env={"MAX_RETRIES": "1"})
    assert dry.exit_code == 0 and dry.output.strip() == "== would requeue: hang: training =="
    assert not (tmp_path / "500-tiny").exists()
    off = CliRunner().invoke(main, ["requeue", str(log)], env={"MAX_RETRIES": "0"})
    assert off.exit_code == 3
    assert "retries used up (0 allowed, this was attempt 1)" in off.output
