"""Issue 22's proofs for heartbeats, on the local Slurm cluster (2 nodes, real MaxText `tiny` jobs): a rank killed
outright, and a JAX heartbeat that fires on a rank frozen past a short JAX_HEARTBEAT_TIMEOUT. Each waits on the
log's own lines (a step of rank 1, the job's end), never on a timer, then asks `jobkit why --json` what happened.
Run with -s to see each job's `jobkit why` and its coordination lines. Logs of a first run are the fixtures
tests/fixtures/failures/slurm-2node-rank1-*.log."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from job_observation import TRAINING_CMDLINE, live_processes_of
from slurm_cluster import job_env, local_cluster, read, submit_job, wait_for  # noqa: F401  (the session fixture)

REPO = Path(__file__).resolve().parents[2]
JOBKIT = str(REPO / ".venv" / "bin" / "jobkit")
pytestmark = pytest.mark.e2e


def training_pids(job_id: str, rank: int) -> list[int]:
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    return [p for p in pids if f"NODE_RANK={rank}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


def why(log: Path) -> dict:
    text = subprocess.run([JOBKIT, "why", str(log)], capture_output=True, text=True, timeout=60).stdout
    print(f"\n$ jobkit why {log.name}\n{text}")  # the proof's output, for the report (-s)
    result = subprocess.run([JOBKIT, "why", "--json", str(log)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_and_fault(cluster, tmp_path: Path, fault: int, **settings: str) -> tuple[str, str]:
    """A 2-node tiny job that trains until rank 1's training gets FAULT (a signal) after its step 3; returns
    (job id, the log once the job has ended)."""
    env = job_env(cluster, tmp_path / "ws", tmp_path / "jax_cache")
    env.update(settings)
    job_id, log = submit_job(env, "tiny:hq:", "-N", "2", "--", "steps=100000")
    try:
        wait_for(lambda: re.search(r"^1: .*completed step: 3,", read(log), re.M), 400, "rank 1's step 3")
        (pid,) = training_pids(job_id, 1)
        os.kill(pid, fault)
        cluster.wait_job(job_id, 300)
        wait_for(lambda: "==== JOB SUMMARY ====" in read(log), 60, "the job summary")
    finally:
        cluster.run(["scancel", job_id], check=False)
        for pid in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(pid, signal.SIGKILL)  # a stopped rank left behind
    text = log.read_text(errors="replace")
    shown = [
        line for line in text.splitlines() if re.search(r"heartbeat|coordination|srun: error|NODE_EXIT|Status:", line)
    ]
    print(f"\n--- {log.name}: coordination and end lines\n" + "\n".join(shown[:40]))
    return job_id, log


def test_a_rank_killed_outright_is_task_died_on_its_node_with_the_peer_a_follower(local_cluster, tmp_path):  # noqa: F811
    _, log = run_and_fault(local_cluster, tmp_path, signal.SIGKILL)
    text = log.read_text(errors="replace")
    # jobkit launch started the runtime with the default heartbeat (longer than the watchdog's allowances).
    assert re.search(
        r"^1: \[launch\] JAX distributed: process 1 of 2, .* heartbeat timeout 3730 s \(default", text, re.M
    )
    verdict = why(log)
    assert verdict["class"] == "task-died", verdict
    assert verdict["host"] == "node2", verdict
    assert verdict["followers"] == ["node1"], verdict
    assert verdict["retry"] == "retry-without-node", verdict
    assert "node2" in verdict["blamed_because"] or "task 1" in verdict["blamed_because"], verdict


def test_a_heartbeat_that_fires_on_a_frozen_rank_is_classified_and_blamed_on_it(local_cluster, tmp_path):  # noqa: F811
    # A 10 s heartbeat and a watchdog that would wait 10 minutes: JAX's coordination service fires first.
    _, log = run_and_fault(local_cluster, tmp_path, signal.SIGSTOP, JAX_HEARTBEAT_TIMEOUT="10", HANG_TIMEOUT="600")
    text = log.read_text(errors="replace")
    assert re.search(
        r"^0: \[launch\] JAX distributed: process 0 of 2, .* heartbeat timeout 10 s \(JAX_HEARTBEAT", text, re.M
    )
    assert "stopped sending heartbeats" in text, text[-4000:]
    assert "HANG detected" not in text
    verdict = why(log)
    assert verdict["class"] == "task-died", verdict
    assert verdict["signature"] == "jax-heartbeat-task-died", verdict
    assert verdict["host"] == "node2", verdict
    assert "node1" in verdict["followers"], verdict
    assert "heartbeat" in verdict["evidence"], verdict
