"""Issue 25 (one process per device, LOCAL_WORLD_SIZE=N), log side: step lines behind `[rank<G>]: ` (after srun's
`N: ` under Slurm, alone under run_local.sh) are read with the process's global rank; a step's N x NNODES lines
are averaged, not counted as more steps; the end line says the layout and the device count; `jobkit why` blames
the node of the failing process (PROC_EXIT, a `[rank<G>]: ` traceback, a JAX task G) and names the process. Logs
are synthetic: the values are drawn per line so every expectation is computed here from the lines written."""

import json
import os
import random
import re
import statistics

import pytest
from click.testing import CliRunner

from jobkit.cli import main
from jobkit.core import failures, logparse, tgs
from jobkit.observe import log_steps
from jobkit.observe.tb_events import STEP_METRIC

STEP = (
    "I1126 03:{m:02d}:{s:02d}.{us:06d} 140 metric_logger.py:196] completed step: {step}, seconds: {sec:.3f}, "
    "TFLOP/s/device: 0.010, Tokens/s/device: {tgs:.3f}, total_weights: 2048, loss: {loss:.3f}"
)


def header(nnodes: int, procs: int | None, nodelist: str = "node[1-2]") -> str:
    lines = ["JOB_ID=77", "JOB_NAME=JAX-tiny", f"NNODES={nnodes}", "MODEL_NAME=tiny"]
    lines.append(f"NODELIST_EXPANDED={','.join(logparse.expand_nodelist(nodelist)[:nnodes])}")
    if procs is not None:
        lines.append(f"LOCAL_WORLD_SIZE={procs}")
    return "\n".join(lines) + "\n"


def step_lines(nnodes: int, procs: int, steps: int, srun: bool, seed: int = 1, skip_rank: int | None = None):
    """(lines, {step: [tgs of each process]}) for STEPS steps of NNODES x PROCS processes, each line behind
    `<node>: [rank<G>]: ` (srun) or `[rank<G>]: `, with one process per node no `[rank]` part."""
    rng = random.Random(seed)
    lines, values = [], {}
    for step in range(steps):
        for node in range(nnodes):
            for local in range(procs):
                g = node * procs + local
                if g == skip_rank:
                    continue
                value = rng.uniform(990, 1010)  # within the 95% the noise warning allows
                values.setdefault(step, []).append(value)
                prefix = (f"{node}: " if srun else "") + (f"[rank{g}]: " if procs > 1 else "")
                line = STEP.format(m=step // 60, s=step % 60, us=g, step=step, sec=1.0, tgs=value, loss=5 - step / 10)
                lines.append(prefix + line)
    return lines, values


@pytest.mark.parametrize(
    "line, node, rank",
    [
        ("I1 completed step: 5, seconds: 1.0, Tokens/s/device: 10.0", None, None),
        ("1: I1 completed step: 5, seconds: 1.0, Tokens/s/device: 10.0", 1, None),
        ("[rank3]: I1 completed step: 5, seconds: 1.0, Tokens/s/device: 10.0", None, 3),
        (" 1: [rank3]: I1 completed step: 5, seconds: 1.0, Tokens/s/device: 10.0", 1, 3),
    ],
)
def test_a_step_line_carries_its_node_and_process(line, node, rank):
    e = logparse.parse_step_line(line)
    assert (e.step, e.node, e.rank, e.tgs, e.seconds) == (5, node, rank, 10.0, 1.0)
    assert e.first_process == (node in (None, 0) and rank in (None, 0))


@pytest.mark.parametrize("nnodes, procs, srun", [(2, 2, True), (1, 2, False), (2, 1, True), (1, 1, False)])
def test_each_step_is_averaged_over_every_process_once(nnodes, procs, srun):
    lines, values = step_lines(nnodes, procs, 20, srun)
    log = logparse.parse_text(header(nnodes, procs if procs > 1 else None) + "\n".join(lines))
    assert log.local_world_size == procs and log.devices == nnodes * procs
    s = tgs.summarize(log)
    assert s.entries_per_step == nnodes * procs
    assert [p.step for p in s.points] == list(range(20))  # no step counted twice
    want = statistics.fmean(statistics.fmean(values[step]) for step in range(5, 15))
    assert s.tgs == pytest.approx(want)
    assert not s.warnings
    d = tgs.to_dict(s)
    assert (d["local_world_size"], d["devices"]) == (procs, nnodes * procs)


def test_the_end_line_says_the_layout_and_the_devices_only_with_several_processes_per_node():
    lines, values = step_lines(2, 2, 20, True)
    two = tgs.summarize(logparse.parse_text(header(2, 2) + "\n".join(lines)))
    mean = tgs.fmt_tgs(statistics.fmean(statistics.fmean(values[s]) for s in range(5, 15)))
    assert tgs.format_line(two, "PASS") == f"tiny 2N×2 (job 77): {mean} TGS/device over 4 devices — PASS"
    lines, values = step_lines(2, 1, 20, True)
    one = tgs.summarize(logparse.parse_text(header(2, 1) + "\n".join(lines)))
    mean = tgs.fmt_tgs(statistics.fmean(statistics.fmean(values[s]) for s in range(5, 15)))
    assert tgs.format_line(one, "PASS") == f"tiny 2N (job 77): {mean} TGS/device — PASS"  # as before issue 25
    assert "4 devices" in tgs.format_table(two) and "devices" not in tgs.format_table(one)


def test_a_process_that_logged_no_step_is_a_warning():
    lines, _ = step_lines(2, 2, 20, True, skip_rank=3)
    s = tgs.summarize(logparse.parse_text(header(2, 2) + "\n".join(lines)))
    assert any("= 4 processes but step lines came from 3 process prefix(es)" in w for w in s.warnings), s.warnings


@pytest.mark.parametrize("srun", [True, False])
def test_a_big_log_s_ends_keep_every_process_of_each_step_they_keep(tmp_path, monkeypatch, srun):
    lines, _ = step_lines(2 if srun else 1, 2, 400, srun)
    path = tmp_path / "big.log"
    path.write_text(header(2 if srun else 1, 2) + "\n".join(lines) + "\n")
    monkeypatch.setattr(logparse, "BIG_LOG", 1000)
    monkeypatch.setattr(logparse, "END_BYTES", path.stat().st_size // 10)
    whole, ends = logparse.parse_file(str(path)), logparse.parse_ends(str(path), tgs.steps_needed())
    assert ends.partial
    per = 4 if srun else 2
    kept = {step: f.lines for step, f in ends.steps.items()}
    assert set(kept.values()) == {per}  # whole steps only, each with all its processes
    assert max(kept) == 399 and 0 in kept and len(kept) < 400
    assert tgs.summarize(ends).tgs == pytest.approx(tgs.summarize(whole).tgs)


def test_the_tsdb_backfill_reads_rank_0_s_lines_only(tmp_path):
    lines, _ = step_lines(2, 2, 6, True)
    path = tmp_path / "job.log"
    path.write_text(header(2, 2) + "\n".join(lines) + "\n")
    got = log_steps.series_after(str(path), 2)
    assert [int(v) for _, v in got[STEP_METRIC][1]] == [3, 4, 5]
    rank0_us = {int(line.split()[3].split(".")[1]) for line in lines if line.startswith("0: [rank0]: ")}
    assert {ms % 1000 for ms, _ in got[STEP_METRIC][1]} == {u // 1000 for u in rank0_us}  # rank 0's stamps


# ------------------------------------------------------------------------------------------- jobkit why

PROC_CRASH = """\
0: [rank0]: I1126 03:00:10.000000 140 metric_logger.py:196] completed step: 3, seconds: 1.0, loss: 5.0
1: [rank2]: I1126 03:00:10.000000 140 metric_logger.py:196] completed step: 3, seconds: 1.0, loss: 5.0
1: PROC_EXIT host=node2 rank=2 local=0 exit=137
1: [procs] rank 2 failed: stopping the other 1 process(es) on this node
1: NODE_EXIT host=node2 exit=137
srun: error: node2: task 1: Exited with exit code 137
0: NODE_EXIT host=node1 exit=143
srun: error: node1: task 0: Terminated
"""


def why_json(tmp_path, body: str, nnodes: int = 2, procs: int | None = 2, *args: str) -> dict:
    log = tmp_path / "job.log"
    log.write_text(header(nnodes, procs) + body)
    result = CliRunner().invoke(main, ["why", "--json", str(log), "--status", "FAILED", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_killed_process_is_blamed_on_its_node_and_named(tmp_path):
    verdict = why_json(tmp_path, PROC_CRASH, 2, 2, "--exit-code", "137")
    assert (verdict["class"], verdict["host"], verdict["rank"]) == ("task-died", "node2", 2), verdict
    assert verdict["process"] == "node2, process 0 (global rank 2)"
    assert "PROC_EXIT host=node2 rank=2" in verdict["blamed_because"]
    assert verdict["followers"] == ["node1"]
    log = tmp_path / "job.log"
    out = CliRunner().invoke(main, ["why", str(log), "--status", "FAILED", "--exit-code", "137"]).output
    assert "  process: node2, process 0 (global rank 2)" in out.splitlines()


def test_a_recorded_two_by_two_job_blames_the_killed_process_not_the_peer_that_failed_first_in_the_log():
    from conftest import FIXTURES

    text = (FIXTURES / "failures" / "slurm-2x2-rank2-sigkilled.log").read_text()
    first = [line for line in text.splitlines() if re.match(r"\d+: PROC_EXIT", line)][0]
    assert first.startswith("0: PROC_EXIT host=node1 rank=1 local=1 exit=1")  # the peer, told first
    found = failures.classify(text, "FAILED", 137, nodes=["node1", "node2"], procs=2)
    assert (found.reason, found.host, found.rank) == ("task-died", "node2", 2), found
    assert found.process == "node2, process 0 (global rank 2)"
    assert found.followers == ("node1",)


TRACEBACK = """\
{p}I1126 03:00:10.000000 140 metric_logger.py:196] completed step: 3, seconds: 1.0, loss: 5.0
{p}Traceback (most recent call last):
{p}  File "train.py", line 10, in <module>
{p}RuntimeError: boom
"""


@pytest.mark.parametrize(
    "prefix, nnodes, host, process",
    [
        ("1: [rank2]: ", 2, "node2", "node2, process 0 (global rank 2)"),  # Slurm: both prefixes
        ("[rank1]: ", 1, "node1", "node1, process 1 (global rank 1)"),  # run_local.sh: the process's only
    ],
)
def test_a_traceback_behind_a_process_prefix_is_blamed_on_its_node(tmp_path, prefix, nnodes, host, process):
    verdict = why_json(tmp_path, TRACEBACK.format(p=prefix), nnodes, 2, "--exit-code", "1")
    assert verdict["class"] == "python-exception" and verdict["detail"] == "RuntimeError", verdict
    assert (verdict["host"], verdict["process"]) == (host, process), verdict
    assert verdict["evidence"].startswith(prefix.strip() + " Traceback"), verdict
    # one process per node (no LOCAL_WORLD_SIZE header): the same prefix-less traceback blames no process
    plain = why_json(tmp_path, TRACEBACK.format(p=prefix.split("[")[0]), nnodes, None, "--exit-code", "1")
    assert plain["process"] is None and plain["rank"] is None, plain


@pytest.mark.parametrize("procs, task, host", [(2, 2, "node2"), (2, 1, "node1"), (1, 1, "node2")])
def test_a_jax_task_is_a_global_rank_with_several_processes_per_node(procs, task, host):
    line = f"E1126 coordination_service.cc] Barrier timed out. Some timed out task names: /job:jax_worker/replica:0/task:{task}"
    found = failures.classify(line + "\n", "FAILED", 1, nodes=["node1", "node2"], procs=procs)
    assert found.reason == "distributed-timeout", found
    assert found.host == host, found
    if procs > 1:
        assert found.process == failures.process_words(task, procs, ["node1", "node2"])
        assert found.rank == task
    else:
        assert found.rank is None and found.process == ""  # one process per node: as before


# ------------------------------------------------------------------------------------------- core dumps


def test_the_supervisor_names_the_failed_process_s_pid_for_its_core(tmp_path):
    """COREDUMP=1: the core is named with the pid of the process that died (%p), not of `jobkit procs`; the
    supervisor writes that pid to PROCS_EXIT_FILE for _train.sh's coredump_after."""
    import io
    import sys

    from jobkit.launch import procs

    out = io.BytesIO()
    exit_file = tmp_path / "exit"
    crash = (
        "import os, signal, time\n"
        "if os.environ['GLOBAL_RANK'] == '3': os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PROCS_EXIT_FILE": str(exit_file)}
    group = procs.Group(procs.Layout(2, 2, 1), [sys.executable, "-c", crash], env, out=out)
    group.start()
    assert group.wait(poll=0.05) == 137
    said = out.getvalue().decode()
    started = dict(re.findall(r"^\[procs\] rank (\d+) \(local \d+\): pid (\d+)$", said, re.M))
    assert exit_file.read_text() == f"{started['3']} 3 1 137\n", said
    assert f"PROC_EXIT host={procs.host()} rank=3 local=1 exit=137" in said
