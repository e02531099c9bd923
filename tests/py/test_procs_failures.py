"""Issue 25's crash proof, on the local Slurm cluster: a 2-node x 2-process job (LOCAL_WORLD_SIZE=2, 4 JAX
processes of real MaxText `tiny`) whose global rank 2 (node2's first process) is killed after its step 3;
`jobkit why --json` must blame node2 and name the process. Waits on the log's lines, never on a timer. Run with
-s to see the job's `jobkit why` and its end lines; KEEP_LOG=<path> copies the log there (a fixture)."""

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from job_observation import TRAINING_CMDLINE, live_processes_of
from slurm_cluster import job_env, local_cluster, read, submit_job, wait_for  # noqa: F401  (the session fixture)

REPO = Path(__file__).resolve().parents[2]
JOBKIT = str(REPO / ".venv" / "bin" / "jobkit")
pytestmark = pytest.mark.e2e


def process_pids(job_id: str, global_rank: int) -> list[int]:
    """The training process of GLOBAL_RANK (its env says so; `jobkit procs`, the supervisor, has no GLOBAL_RANK)."""
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    want = f"GLOBAL_RANK={global_rank}".encode()
    return [p for p in pids if want in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]


def test_a_crashed_process_of_a_two_by_two_job_is_blamed_on_its_node(local_cluster, tmp_path):  # noqa: F811
    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    env["LOCAL_WORLD_SIZE"] = "2"
    job_id, log = submit_job(env, "tiny:hq:", "-N", "2", "--", "steps=100000")
    try:
        wait_for(lambda: re.search(r"^1: \[rank2\]: .*completed step: 3,", read(log), re.M), 500, "rank 2's step 3")
        (pid,) = process_pids(job_id, 2)
        os.kill(pid, signal.SIGKILL)
        local_cluster.wait_job(job_id, 300)
        wait_for(lambda: "==== JOB SUMMARY ====" in read(log), 60, "the job summary")
    finally:
        local_cluster.run(["scancel", job_id], check=False)
        for pid in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(pid, signal.SIGKILL)  # a process left behind
    if os.environ.get("KEEP_LOG"):
        shutil.copy(log, os.environ["KEEP_LOG"])
    text = log.read_text(errors="replace")
    shown = [
        line for line in text.splitlines() if re.search(r"PROC_EXIT|NODE_EXIT|\[procs\]|srun: error|Status:", line)
    ]
    print(f"\n--- {log.name}: process and end lines\n" + "\n".join(shown[:40]))
    assert re.search(r"^1: PROC_EXIT host=node2 rank=2 local=0 exit=137$", text, re.M), text[-4000:]
    human = subprocess.run([JOBKIT, "why", str(log)], capture_output=True, text=True, timeout=60).stdout
    print(f"\n$ jobkit why {log.name}\n{human}")
    result = subprocess.run([JOBKIT, "why", "--json", str(log)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["host"] == "node2", verdict
    assert verdict["rank"] == 2, verdict
    assert verdict["process"] == "node2, process 0 (global rank 2)", verdict
    assert "node2, process 0 (global rank 2)" in human, human
