"""Issue 25 proofs: a process per device (LOCAL_WORLD_SIZE=2) of real MaxText, end to end on the CPU.

- run_local.sh: one node, 2 JAX processes (a loopback coordinator), each with one CPU device.
- submit.sh on the local Slurm cluster: 2 nodes x 2 processes = 4 JAX processes, natively and with RAY=1 (one
  Ray actor per node runs `jobkit procs`, which runs the node's two processes; the TensorBoard events MaxText
  writes from process 0 reach rank 0's TSDB as with one process per node).

What each asserts is what a user reads: the verdict line, every process's `[rank<G>]:` step lines behind its
node's `N: ` prefix, the `[procs]` and `[launch] JAX distributed` lines, and (RAY=1) the TSDB.
"""

import re
import subprocess
import time
from pathlib import Path

import pytest
from job_observation import header, live_processes_of
from launch_env import launcher_env
from prom_query import View, free_port
from slurm_cluster import job_env, local_cluster, read, submit_job, wait_for  # noqa: F401  (local_cluster: fixture)

from jobkit.core import step_summary

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e  # every test here trains MaxText for real

STEPS = 8
# A training line of global rank G: `[rankG]: ... completed step: S, ...`, behind srun's `N: ` under Slurm.
RANK_STEP_RE = re.compile(r"^(?:(\d+): )?\[rank(\d+)\]: .*completed step: (\d+), ", re.M)
JAX_LINE_RE = re.compile(r"\[rank(\d+)\]: \[launch\] JAX distributed: process (\d+) of (\d+) \(local device (\d+)\)")


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("procs_jax_cache")


def steps_by_rank(text: str) -> dict[int, list[int]]:
    """{global rank: sorted steps it logged}; checks that each rank's lines sit behind its own node's prefix."""
    found: dict[int, set[int]] = {}
    for m in RANK_STEP_RE.finditer(text):
        node, rank, step = m.group(1), int(m.group(2)), int(m.group(3))
        if node is not None:
            assert int(node) == rank // 2, m.group(0)  # 2 processes per node: rank G runs on node G // 2
        found.setdefault(rank, set()).add(step)
    return {rank: sorted(steps) for rank, steps in found.items()}


def assert_passed(text: str, nodes: int, job_id: str) -> None:
    """The verdict line says PASS; where it counts devices (`2N×2 ... over 4 devices`), it counts every process."""
    m = re.search(
        rf"^tiny {nodes}N(×2)? \(job {re.escape(job_id)}\): [\d,]+ TGS/device(?: over (\d+) devices)? .*— PASS$",
        text,
        re.M,
    )
    assert m, text[-2000:]
    if m.group(2) is not None:
        assert m.group(1) == "×2" and int(m.group(2)) == 2 * nodes, m.group(0)


def jax_processes(text: str) -> dict[int, tuple[int, int, int]]:
    """{global rank: (process id, process count, local device)} from the `[launch] JAX distributed` lines."""
    return {int(m.group(1)): tuple(int(g) for g in m.groups()[1:]) for m in JAX_LINE_RE.finditer(text)}


def test_run_local_with_two_processes_trains_both_with_their_own_device(tmp_path, jax_cache):
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=6"],
        env=launcher_env(workspace, jax_cache, LOCAL_WORLD_SIZE="2"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    (log,) = workspace.glob("local_*.log")
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    assert header(text)["LOCAL_WORLD_SIZE"] == "2"
    assert re.search(r"^\[procs\] one node: JAX coordinator on 127\.0\.0\.1:\d+ \(loopback only\)$", text, re.M)
    assert re.search(r"^\[procs\] 2 processes on node 0 \(\S+\): global ranks 0-1 of NPROCS=2", text, re.M)
    assert steps_by_rank(text) == {0: list(range(6)), 1: list(range(6))}, text[-3000:]
    assert jax_processes(text) == {0: (0, 2, 0), 1: (1, 2, 1)}
    assert not re.search(r"^PROC_EXIT ", text, re.M)
    job_id = header(text)["JOB_ID"]
    assert_passed(text, 1, job_id)
    assert live_processes_of(job_id) == []
    assert_step_summary(log, text)


def assert_step_summary(log: Path, text: str) -> None:
    """The job dir's steps.tsv holds one line per step, global rank 0's alone (rank 1's lines are not in it),
    with the fields its log line has, in a file only the owner can read (the default JOB_UMASK, 077)."""
    summary = log.with_suffix("") / step_summary.NAME
    lines = summary.read_text().splitlines()
    assert lines[0] + "\n" == step_summary.FIRST_LINE
    rows = [line.split("\t") for line in lines[1:]]
    assert [int(r[0]) for r in rows] == list(range(6)), lines
    rank0 = [m for m in re.finditer(r"^\[rank0\]: (.*completed step: \d+, .*)$", text, re.M)]
    for row, m in zip(rows, rank0, strict=True):
        assert step_summary.summary_line(m.group(1)).rstrip("\n").split("\t")[2:] == row[2:], (row, m.group(0))
        assert row[1] != "-" and row[2:] != ["-"] * 5
    assert summary.stat().st_mode & 0o777 == 0o600


def ended(text: str) -> str:
    """TEXT once the job log holds its summary and verdict line, else ''."""
    return text if "JOB SUMMARY" in text and re.search(r" — (PASS|FAIL)", text) else ""


def run_two_by_two(cluster, tmp_path, jax_cache, **extra):
    """A 2-node x 2-process job of the tiny model run to its verdict: (job id, log, its text, job dir)."""
    env = job_env(cluster, tmp_path / "ws", jax_cache)
    env.update(LOCAL_WORLD_SIZE="2", **extra)
    job_id, log = submit_job(env, "tiny", "-N", "2", "--", f"steps={STEPS}")
    text = wait_for(lambda: ended(read(log)), 600, f"the verdict of job {job_id}", poll=2)
    deadline = time.monotonic() + 60
    while live_processes_of(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    return job_id, log, text, log.with_suffix("")


def assert_four_processes_passed(job_id: str, text: str) -> None:
    assert "Status: SUCCESS (exit 0)" in text, text[-4000:]
    assert header(text)["LOCAL_WORLD_SIZE"] == "2"
    for node, host, ranks in ((0, "node1", "0-1"), (1, "node2", "2-3")):
        line = rf"^{node}: \[procs\] 2 processes on node {node} \({host}\): global ranks {ranks} of NPROCS=4 "
        assert re.search(line, text, re.M), text[-3000:]
    assert steps_by_rank(text) == {rank: list(range(STEPS)) for rank in range(4)}, text[-3000:]
    assert jax_processes(text) == {rank: (rank, 4, rank % 2) for rank in range(4)}
    assert not re.search(r"^(\d+: )?(PROC_EXIT|NODE_EXIT) ", text, re.M), text[-3000:]
    assert_passed(text, 2, job_id)
    assert live_processes_of(job_id) == []


def test_two_nodes_by_two_processes_natively(local_cluster, tmp_path, jax_cache):  # noqa: F811
    job_id, _, text, _ = run_two_by_two(local_cluster, tmp_path, jax_cache)
    assert_four_processes_passed(job_id, text)


def test_two_nodes_by_two_processes_under_ray_land_every_step_in_the_tsdb(local_cluster, tmp_path, jax_cache):  # noqa: F811
    job_id, log, text, job_dir = run_two_by_two(
        local_cluster, tmp_path, jax_cache, RAY="1", EXPORTER_INTERVAL="2", TENSORBOARD="0"
    )
    assert_four_processes_passed(job_id, text)
    assert header(text)["RAY"] == "1"
    assert "training without Ray" not in text
    # One actor per node, each running that node's `jobkit procs` (which starts its two processes).
    for rank in (0, 1):
        assert re.search(rf"\[ray_launch\] node \S+ rank {rank}: started pid", text), text[-4000:]
    # MaxText writes TensorBoard from process 0 only: one event stream, every step in rank 0's TSDB.
    assert len(list(job_dir.rglob("events.out.tfevents.*"))) == 1, sorted(job_dir.rglob("events.out.tfevents.*"))
    with View(job_dir, free_port()) as view:
        at = log.stat().st_mtime + 30
        loss = view.query("count_over_time(tb_learning_loss[1h])", at)
        assert [(s["metric"]["host"], s["value"][1]) for s in loss] == [("node1", str(STEPS))], loss
        up = view.query('max_over_time(up{job="exporters"}[1h])', at)
        assert {s["metric"]["host"]: s["value"][1] for s in up} == {"node1": "1", "node2": "1"}, up
