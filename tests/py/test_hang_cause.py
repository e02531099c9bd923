"""A hang's root cause from the watchdog's stacks (core.hang_stacks): units on recorded stack files
(tests/fixtures/hang/), `jobkit why` and requeue on them, and a real 2-node job whose rank 1 is frozen."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.analysis import hosts
from jobkit.cli import main
from jobkit.core import failures, hang_stacks, logparse
from jobkit.ops import hang_watchdog, requeue

REPO = Path(__file__).resolve().parents[2]
JOBKIT = str(REPO / ".venv" / "bin" / "jobkit")
FIXTURES = REPO / "tests" / "fixtures" / "hang"
LOCAL = FIXTURES / "local-allgather"  # two real JAX processes, rank 1 SIGSTOPped (README there)
MARKER = "phase training, last step 40, 31 s since, noticed on n0 (rank 0)"
HEADER = "JOB_ID=500\nJOB_NAME=tiny\nNNODES={n}\nJOB_NODELIST={nodes}\nMODEL_NAME=tiny\n"
STEP = "0: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, Tokens/s/device: 1000.0, loss: 5.9\n"


def hang_job(tmp_path: Path, stacks: dict[str, str], nodes: list[str], marker: str = MARKER) -> Path:
    """A finished HANG job in TMP_PATH: its log (rank 0 noticed) and <job dir>/hang/ with the HANG marker and
    STACKS (host -> file text), as the watchdog leaves them (this user's files in a dir only it can write)."""
    log = tmp_path / "500-tiny.log"
    hang = log.with_suffix("") / "hang"
    hang.mkdir(parents=True, mode=0o755)
    (hang / "HANG").write_text(hang_watchdog.marker_body(marker, "500"))
    for host, text in stacks.items():
        (hang / f"{host}.txt").write_text(text)
    header = HEADER.format(n=len(nodes), nodes=",".join(nodes))
    body = "".join(STEP.format(n=n) for n in range(3))
    body += "0: == HANG detected (phase training, last step 40, 31 s since) ==\n"
    log.write_text(header + body + "==== JOB SUMMARY ====\n  Status: HANG (exit 143)\n=====================\n")
    return log


def recorded(name: str, host: str | None = None, state: str | None = None, rank: int | None = None) -> str:
    """A recorded stacks file, optionally as another host / rank, or with its process in another STATE line."""
    text = (LOCAL / name).read_text()
    if host is not None:
        text = re.sub(r"^HANG on \S+ \(rank \d+\)", f"HANG on {host} (rank {rank})", text)
    if state is not None:
        text = re.sub(r"^pid (\d+), state .*$", rf"pid \1, state {state}", text, count=1, flags=re.M)
    return text


def classify(log: Path) -> failures.Failure:
    text = log.read_text()
    parsed = logparse.parse_text(text)
    nodes, _ = logparse.header_nodes(parsed.header)
    return failures.classify(text, "HANG", 143, True, nodes, job_dir=log.with_suffix(""))


# ------------------------------------------------------------------------------------------ reading stacks


def test_a_recorded_stacks_file_gives_each_rank_its_state_and_innermost_frames():
    waiting = hang_stacks.parse((LOCAL / "n0.txt").read_text(), "n0")
    assert (waiting.host, waiting.rank, waiting.state, waiting.state_word) == ("n0", 0, "S", "sleeping")
    assert waiting.how == "py-spy --nonblocking"  # --native failed there, as the file says
    assert waiting.frames[0] == "_handle_array_process_allgather (jax/experimental/multihost_utils.py:134)"
    assert len(waiting.frames) == 7  # every frame of the main thread (up to hang_stacks.FRAMES)
    assert waiting.waits_in == waiting.frames[0]
    stopped = hang_stacks.parse((LOCAL / "n1.txt").read_text(), "n1")
    assert (stopped.rank, stopped.state, stopped.state_text, stopped.frames) == (
        1, "T", "stopped (T)", ("<module> (two.py:17)",)
    )  # fmt: skip
    assert stopped.pid == int(re.search(r"^pid (\d+)", (LOCAL / "n1.txt").read_text(), re.M).group(1))


def real_two_node_job(tmp_path: Path, name: str = "slurm-2node-frozen-rank1", job_id: str = "306") -> Path:
    """A recorded 2-node job (tests/fixtures/hang/NAME): its log and hang/ dir, as the job left them (this user's
    files, a hang dir only it can write)."""
    src = FIXTURES / name
    log = tmp_path / f"{job_id}-tiny.log"
    log.write_text((src / "job.log").read_text())
    hang = log.with_suffix("") / "hang"
    hang.mkdir(parents=True, mode=0o755)
    for name in ("HANG", "node1.txt", "node2.txt"):
        (hang / name).write_text((src / name).read_text())
    return log


def test_a_real_two_node_job_with_rank_1_frozen_is_blamed_on_node2_from_its_stacks(tmp_path):
    log = real_two_node_job(tmp_path)
    node1 = hang_stacks.parse((log.with_suffix("") / "hang" / "node1.txt").read_text(), "node1")
    assert (node1.state, node1.how, node1.waits_in) == (
        "S", "py-spy --native", "jax::BlockUntilReadyWithCancel (jaxlib/libjax_common.so)"
    )  # fmt: skip
    result = CliRunner().invoke(main, ["why", str(log)])
    lines = result.output.splitlines()
    assert lines[0] == "hang: training", result.output
    assert "  noticed: on node1 (rank 0), phase training, last step 17, 6 s since" in lines
    assert "  host: node2" in lines
    blamed = next(line for line in lines if line.startswith("  blamed because: "))
    assert blamed.startswith("  blamed because: stacks: node2's training (rank 1, pid 3476) is stopped (T): ")
    assert "innermost: ArrayImpl._value (jax/_src/array.py:696)" in blamed
    assert blamed.endswith("the others wait for it (jax::BlockUntilReadyWithCancel)")
    assert "  waiting: node1 (rank 0) in jax::BlockUntilReadyWithCancel" in lines
    assert "  retry: retry-without-node" in lines


def test_the_default_settings_proofs_recording_is_a_watchdog_hang_blamed_on_node2(tmp_path):
    """The slow proof's own run (tests/fixtures/hang/slurm-2node-frozen-default: the 300 s floor, the 3730 s
    heartbeat): JAX's heartbeat never fired, the watchdog noticed on node1 after 301 s, node2 is blamed."""
    log = real_two_node_job(tmp_path, "slurm-2node-frozen-default", "590")
    text = log.read_text()
    assert text.count("heartbeat timeout 3730 s (default: the hang watchdog's 3670 s + 60 s)") == 2
    assert "stopped sending heartbeats" not in text
    before = text[: text.index("0: == HANG detected (phase training, last step 8, 301 s since) ==")]
    assert not re.search(r"UNAVAILABLE|DEADLINE_EXCEEDED|srun: error:|NODE_EXIT", before)
    lines = CliRunner().invoke(main, ["why", str(log)]).output.splitlines()
    assert lines[:4] == [
        "hang: training",
        "  evidence: 0: == HANG detected (phase training, last step 8, 301 s since) ==",
        "  noticed: on node1 (rank 0), phase training, last step 8, 301 s since",
        "  host: node2",
    ], lines
    assert lines[4].startswith("  blamed because: stacks: node2's training (rank 1, pid 7265) is stopped (T): ")
    assert "(kernel: do_signal_stop)" in lines[4]
    assert lines[5:7] == ["  waiting: node1 (rank 0) in jax::BlockUntilReadyWithCancel", "  retry: retry-without-node"]


def test_the_e2e_proofs_own_recording_with_wchan_blames_node2_stopped_in_do_signal_stop(tmp_path):
    """This branch's e2e run (HANG_TIMEOUT=30): the watchdog's process line now carries the wchan."""
    src = FIXTURES / "slurm-2node-frozen-wchan"
    stacks = {h: (src / f"{h}.txt").read_text() for h in ("node1", "node2")}
    marker = (src / "HANG").read_text().partition("\n")[0]
    cause = hang_stacks.read(
        hang_job(tmp_path, stacks, ["node1", "node2"], marker).with_suffix("") / "hang", ["node1", "node2"]
    )
    node1, node2 = cause.ranks
    assert (node1.state, node1.wchan, node2.state, node2.wchan) == ("S", "futex_do_wait", "T", "do_signal_stop")
    assert cause.host == "node2" and cause.node_local
    assert (
        "is stopped (T): stopped by a signal (SIGSTOP, Ctrl-Z) or a debugger: someone or something outside the job froze it (kernel: do_signal_stop)"
        in cause.because
    )
    assert cause.waiting == ("node1 (rank 0) in jax::BlockUntilReadyWithCancel",)
    assert cause.noticed == "on node1 (rank 0), phase training, last step 6, 30 s since"


def test_a_real_maxtext_training_stopped_by_sigstop_is_read_and_blamed_alone(tmp_path):
    """run_local.sh tiny frozen mid-run (test_hang_watchdog's e2e, recorded): one node, stopped, Python frames."""
    text = (FIXTURES / "run-local-frozen" / "vm.txt").read_text()
    rank = hang_stacks.parse(text, "vm")
    assert (rank.rank, rank.state, rank.how) == (0, "T", "py-spy --nonblocking")
    assert rank.frames[:2] == (
        "Queue.put (multiprocessing/queues.py:89)",
        "EventFileWriter.add_event (tensorboardX/event_file_writer.py:136)",
    )
    assert "training_loop_iteration (pre_train/train.py:957)" in rank.frames  # the main thread, not Thread-1
    log = hang_job(
        tmp_path, {"vm": text}, ["vm"], marker="phase training, last step 5, 4 s since, noticed on vm (rank 0)"
    )
    found = classify(log)
    assert (found.host, found.retry) == ("vm", "retry-without-node")
    assert found.blame_how.startswith("stacks: vm's training (rank 0, pid ")
    assert "innermost: Queue.put (multiprocessing/queues.py:89) < EventFileWriter.add_event" in found.blame_how


def test_the_stopped_rank_is_blamed_on_its_node_and_the_other_is_named_as_waiting(tmp_path):
    log = hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"])
    cause = hang_stacks.read(log.with_suffix("") / "hang", ["n0", "n1"])
    assert cause.host == "n1" and cause.node_local
    assert cause.noticed == "on n0 (rank 0), phase training, last step 40, 31 s since"
    assert cause.because.startswith("stacks: n1's training (rank 1, pid ")
    assert "is stopped (T): stopped by a signal (SIGSTOP, Ctrl-Z) or a debugger" in cause.because
    assert "the others wait for it (_handle_array_process_allgather" in cause.because
    assert cause.waiting == (
        "n0 (rank 0) in _handle_array_process_allgather (jax/experimental/multihost_utils.py:134)",
    )


def test_a_rank_in_uninterruptible_sleep_is_blamed_with_what_the_kernel_waits_in(tmp_path):
    stacks = {"n0": recorded("n0.txt"), "n1": recorded("n1.txt", state="D (disk sleep), wchan nfs_wait_bit_killable")}
    cause = hang_stacks.read(hang_job(tmp_path, stacks, ["n0", "n1"]).with_suffix("") / "hang", ["n0", "n1"])
    assert cause.host == "n1" and cause.node_local
    assert "is disk sleep (D): in uninterruptible sleep: waiting on I/O" in cause.because
    assert "(kernel: nfs_wait_bit_killable)" in cause.because


def test_a_node_that_wrote_no_stacks_is_blamed_as_not_answering(tmp_path):
    stacks = {"n0": recorded("n0.txt"), "n1": recorded("n0.txt", host="n1", rank=1)}
    cause = hang_stacks.read(
        hang_job(tmp_path, stacks, ["n0", "n1", "n2"]).with_suffix("") / "hang", ["n0", "n1", "n2"]
    )
    assert cause.host == "n2" and cause.node_local
    assert "its watchdog wrote no stacks" in cause.because
    assert [r.state for r in cause.ranks] == ["S", "S", "missing"]


def test_a_rank_whose_training_is_gone_is_blamed_but_its_node_is_not_excluded(tmp_path):
    gone = "HANG on n1 (rank 1): " + MARKER + "\nno training process found\n"
    cause = hang_stacks.read(
        hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": gone}, ["n0", "n1"]).with_suffix("") / "hang", ["n0", "n1"]
    )
    assert cause.host == "n1" and not cause.node_local
    assert "no training process was found: training had already ended on this node" in cause.because


def test_every_rank_waiting_in_the_same_place_blames_nobody(tmp_path):
    stacks = {"n0": recorded("n0.txt"), "n1": recorded("n0.txt", host="n1", rank=1)}
    cause = hang_stacks.read(hang_job(tmp_path, stacks, ["n0", "n1"]).with_suffix("") / "hang", ["n0", "n1"])
    assert cause.blamed is None and cause.host == "" and not cause.node_local
    assert "every rank is in _handle_array_process_allgather" in cause.because
    assert "collective deadlock or a stall outside the job" in cause.because
    assert len(cause.waiting) == 2


def test_the_one_rank_not_waiting_while_the_others_wait_is_blamed_without_excluding_its_node(tmp_path):
    busy = recorded("n0.txt", host="n2", rank=2, state="R (running)")
    busy = (
        busy[: busy.index('"MainThread"\n') + 13]
        + "    next_batch (MaxText/input_pipeline.py:88)\n    train_loop (MaxText/train.py:901)\n"
    )
    stacks = {"n0": recorded("n0.txt"), "n1": recorded("n0.txt", host="n1", rank=1), "n2": busy}
    cause = hang_stacks.read(
        hang_job(tmp_path, stacks, ["n0", "n1", "n2"]).with_suffix("") / "hang", ["n0", "n1", "n2"]
    )
    assert cause.host == "n2" and not cause.node_local
    assert "n2's training (rank 2, pid " in cause.because and "is running (R): busy on the CPU" in cause.because
    assert "innermost: next_batch (MaxText/input_pipeline.py:88)" in cause.because
    assert "the only rank not waiting" in cause.because


def test_every_rank_stopped_blames_no_single_node_and_files_named_unlike_the_nodelist_are_not_missing(tmp_path):
    stacks = {"n0": recorded("n1.txt", host="n0", rank=0), "n1": recorded("n1.txt")}
    cause = hang_stacks.read(hang_job(tmp_path, stacks, ["n0", "n1"]).with_suffix("") / "hang", ["n0", "n1"])
    assert cause.blamed is None and not cause.node_local
    assert cause.because.startswith("stacks: every rank is stopped (T): stopped by a signal")
    # Files named by another host name than Slurm's (node1.example.com): no node counts as missing.
    cause = hang_stacks.read(tmp_path / "500-tiny" / "hang", ["node1", "node2", "node3"])
    assert [r.state for r in cause.ranks] == ["T", "T"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_stacks_file_someone_else_wrote_is_ignored_not_believed(tmp_path):
    log = hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"])
    planted = log.with_suffix("") / "hang" / "n1.txt"
    os.chown(planted, 65534, 65534)
    cause = hang_stacks.read(planted.parent, ["n0", "n1"])
    n1 = next(r for r in cause.ranks if r.host == "n1")
    assert n1.note.startswith(f"ignored: {planted} belongs to uid 65534")
    assert cause.host != "n1"


# --------------------------------------------------------------------------- classify, why, requeue, monitor


def test_classify_blames_the_stacks_host_and_retries_without_it(tmp_path):
    found = classify(hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"]))
    assert (found.reason, found.detail, found.host, found.retry) == ("hang", "training", "n1", "retry-without-node")
    assert found.noticed == "on n0 (rank 0), phase training, last step 40, 31 s since"
    assert "the cause is on n1 itself" in found.advice


def test_without_stacks_a_hang_blames_nobody_and_says_so(tmp_path):
    log = hang_job(tmp_path, {}, ["n0", "n1"])
    found = classify(log)
    assert (found.host, found.retry) == ("", "retry")
    assert found.noticed == "on n0 (rank 0), phase training, last step 40, 31 s since"  # from the HANG line
    assert found.blame_how.startswith("nobody: no hang/<host>.txt stacks to read")


def test_why_keeps_where_the_hang_was_noticed_apart_from_what_is_blamed(tmp_path):
    log = hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"])
    result = CliRunner().invoke(main, ["why", str(log)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:3] == [
        "hang: training",
        "  evidence: 0: == HANG detected (phase training, last step 40, 31 s since) ==",
        "  noticed: on n0 (rank 0), phase training, last step 40, 31 s since",
    ]
    assert lines[3] == "  host: n1"
    assert lines[4].startswith("  blamed because: stacks: n1's training (rank 1, pid ")
    assert (
        lines[5]
        == "  waiting: n0 (rank 0) in _handle_array_process_allgather (jax/experimental/multihost_utils.py:134)"
    )
    assert lines[6] == "  retry: retry-without-node"
    data = json.loads(CliRunner().invoke(main, ["why", "--json", str(log)]).output)
    assert (data["host"], data["retry"], data["noticed"]) == ("n1", "retry-without-node", lines[2].split(": ", 1)[1])
    assert data["waiting"] == [lines[5].split(": ", 1)[1]]
    assert not any(line.startswith("  metrics:") for line in lines)  # no TSDB: nothing to point at
    (log.with_suffix("") / "prometheus" / "wal").mkdir(parents=True)  # RAY=1's TSDB
    again = CliRunner().invoke(main, ["why", str(log)]).output.splitlines()
    assert "  metrics: 31 s from the last progress to the HANG: the TSDB holds no host sample in it" in again
    assert f"  more: every host's resources over the whole job: jobkit analyze {log}" in again


def test_requeue_and_the_monitor_read_the_same_blame(tmp_path):
    log = hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"])
    text = log.read_text()
    found = requeue.outcome(logparse.parse_text(text), text, log.with_suffix(""))  # what the monitor reports
    assert (found.host, found.retry, found.noticed) == ("n1", "retry-without-node", classify(log).noticed)


def test_the_analysis_report_reads_the_same_blame(tmp_path):
    log = hang_job(tmp_path, {"n0": recorded("n0.txt"), "n1": recorded("n1.txt")}, ["n0", "n1"])
    result = CliRunner().invoke(main, ["analyze", str(log)])
    assert result.exit_code == 0, result.output
    doc = json.loads((log.with_suffix("") / "analysis" / "analysis.json").read_text())
    found = classify(log)
    assert doc["failure"]["host"] == "n1" and doc["failure"]["retry"] == "retry-without-node"
    assert (doc["failure"]["noticed"], doc["failure"]["blamed_because"]) == (found.noticed, found.blame_how)
    assert f"    noticed: {found.noticed}" in result.output.splitlines()
    assert f"    blamed because: {found.blame_how}" in result.output.splitlines()
    assert "blamed because stacks: n1&#x27;s training" in (log.with_suffix("") / "analysis" / "report.html").read_text()


# ----------------------------------------------------------- a process per device (LOCAL_WORLD_SIZE, issue 25)


def per_process(name: str, host: str, rank: int, local: int, state: str | None = None) -> str:
    """A recorded stacks file as the watchdog writes it for process LOCAL of node RANK (2 per node)."""
    text = recorded(name, state=state)
    return re.sub(
        r"^HANG on \S+ \(rank \d+\)",
        f"HANG on {host} (rank {rank}, process {local}, global rank {rank * 2 + local})",
        text,
    )


def two_by_two(tmp_path: Path, frozen: str = "node2.proc1") -> Path:
    """A 2-node x 2-process HANG job: four per-process stacks files, FROZEN stopped (T), the others waiting."""
    stacks = {
        f"{host}.proc{local}": per_process("n1.txt" if f"{host}.proc{local}" == frozen else "n0.txt", host, rank, local)
        for rank, host in enumerate(("node1", "node2"))
        for local in (0, 1)
    }
    return hang_job(tmp_path, stacks, ["node1", "node2"])


def test_per_process_stacks_files_are_read_as_node_and_process():
    entry = hang_stacks.parse(per_process("n1.txt", "node2", 1, 1), "node2", 1)
    assert (entry.host, entry.rank, entry.process, entry.global_rank, entry.state) == ("node2", 1, 1, 3, "T")
    assert entry.name == "node2 process 1 (global rank 3)"
    assert entry.describe().startswith(f"node2 process 1 (global rank 3, pid {entry.pid}) is stopped (T): ")


def test_the_stopped_process_is_blamed_on_its_node_and_process_and_the_node_is_excluded(tmp_path):
    log = two_by_two(tmp_path)
    cause = hang_stacks.read(log.with_suffix("") / "hang", ["node1", "node2"])
    assert [r.name for r in cause.ranks] == [
        "node1 process 0 (global rank 0)", "node1 process 1 (global rank 1)",
        "node2 process 0 (global rank 2)", "node2 process 1 (global rank 3)",
    ]  # fmt: skip
    assert cause.host == "node2" and cause.node_local and cause.blamed.process == 1
    assert cause.because.startswith("stacks: node2 process 1 (global rank 3, pid ")
    assert "is stopped (T): stopped by a signal (SIGSTOP" in cause.because
    assert len(cause.waiting) == 3 and cause.waiting[2].startswith("node2 process 0 (global rank 2) in ")
    found = classify(log)
    assert (found.reason, found.host, found.retry) == ("hang", "node2", "retry-without-node")
    data = json.loads(CliRunner().invoke(main, ["why", "--json", str(log)]).output)
    assert (data["class"], data["host"], data["retry"]) == ("hang", "node2", "retry-without-node")
    assert "node2 process 1 (global rank 3" in data["blamed_because"]
    text = log.read_text()
    assert requeue.outcome(logparse.parse_text(text), text, log.with_suffix("")).host == "node2"  # excluded: the node


def test_the_2x2_e2e_recording_blames_node2_process_1_and_names_the_three_waiting(tmp_path):
    """Issue 25's e2e run (tests/fixtures/hang/slurm-2x2-frozen-rank3): four per-process files, unedited."""
    src = FIXTURES / "slurm-2x2-frozen-rank3"
    stacks = {path.stem: path.read_text() for path in sorted(src.glob("*.txt"))}
    marker = (src / "HANG").read_text().partition("\n")[0]
    log = hang_job(tmp_path, stacks, ["node1", "node2"], marker)
    cause = hang_stacks.read(log.with_suffix("") / "hang", ["node1", "node2"])
    assert [(r.host, r.process, r.global_rank, r.state, r.wchan) for r in cause.ranks] == [
        ("node1", 0, 0, "S", "futex_do_wait"), ("node1", 1, 1, "S", "futex_do_wait"),
        ("node2", 0, 2, "S", "futex_do_wait"), ("node2", 1, 3, "T", "do_signal_stop"),
    ]  # fmt: skip
    assert cause.host == "node2" and cause.node_local
    assert re.match(r"stacks: node2 process 1 \(global rank 3, pid \d+\) is stopped \(T\)", cause.because)
    assert cause.because.endswith("the others wait for it (jax::BlockUntilReadyWithCancel)")
    assert cause.waiting == tuple(
        f"{name} in jax::BlockUntilReadyWithCancel"
        for name in (
            "node1 process 0 (global rank 0)",
            "node1 process 1 (global rank 1)",
            "node2 process 0 (global rank 2)",
        )
    )
    assert cause.noticed == "on node1 (rank 0), phase training, last step 5, 30 s since"


def test_a_node_whose_processes_wrote_no_stacks_is_missing_and_one_present_process_is_enough(tmp_path):
    stacks = {f"node1.proc{i}": per_process("n0.txt", "node1", 0, i) for i in (0, 1)}
    stacks["node2.proc0"] = per_process("n0.txt", "node2", 1, 0)
    cause = hang_stacks.read(hang_job(tmp_path, stacks, ["node1", "node2", "node3"]).with_suffix("") / "hang",
                             ["node1", "node2", "node3"])  # fmt: skip
    assert cause.host == "node3" and cause.node_local, cause.because
    assert [r.state for r in cause.ranks] == ["S", "S", "S", "missing"]


def series(before: float, during: float, t_hang: float = 1000.0) -> list[tuple[float, float]]:
    """One host's line: BEFORE every 5 s until the stall began (t_hang - 60), DURING after it."""
    return [(float(t), before if t < t_hang - 60 else during) for t in range(int(t_hang) - 300, int(t_hang) + 1, 5)]


def test_gpus_busy_at_standby_power_with_no_network_traffic_reads_as_a_collective_deadlock():
    lines = {
        "cpu": {"node1": series(40, 30), "node2": series(40, 30)},
        "gpu_util": {"node1": series(95, 100), "node2": series(95, 100)},
        "gpu_power": {"node1": series(2800, 700), "node2": series(2800, 690)},
        "net": {"node1": series(900, 0.0), "node2": series(900, 0.0)},
    }
    per_host = hosts.around(lines, 940.0, 1000.0)
    assert per_host["node2"] == {
        "cpu": 30.0, "cpu_job_max": 40.0, "gpu_util": 100.0, "gpu_util_job_max": 100.0, "gpu_power": 690.0,
        "gpu_power_job_max": 2800.0, "net": 0.0, "net_job_max": 900.0,
    }  # fmt: skip
    assert (
        hosts.hang_host_text(per_host["node1"])
        == "CPU 30%, GPU busy 100% at 700 W (job max 2800 W), network 0.00 MB/s (job max 900.00)"
    )


def test_a_window_without_a_sample_gives_no_per_host_row():
    lines = {"cpu": {"node1": series(60, 99), "node2": series(60, 0.0)}}
    assert set(hosts.around(lines, 940.0, 1000.0)) == {"node1", "node2"}
    assert hosts.around(lines, 2000.0, 2100.0) == {}  # no sample in the window: nothing said


# --------------------------------------------------------------------------------- real jobs on the cluster
# (imports here, after the unit tests, keep the units runnable without the cluster helpers' set-up cost)
from job_observation import TRAINING_CMDLINE, live_processes_of  # noqa: E402
from slurm_cluster import job_env, local_cluster, read, submit_job, wait_for  # noqa: E402, F401  (the session fixture)


def training_pid(job_id: str, rank: int) -> int:
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    mine = [p for p in pids if f"NODE_RANK={rank}".encode() in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
    assert len(mine) == 1, (pids, mine)
    return mine[0]


def test_two_node_job_with_rank_1_frozen_is_blamed_on_node2_from_its_stacks(local_cluster, tmp_path):  # noqa: F811
    """The issue's proof: rank 1's training is stopped (SIGSTOP); the watchdog (HANG_TIMEOUT=30) takes both
    nodes' stacks and stops the job; `jobkit why` says where the hang was noticed and blames node2 from the
    stacks (stopped, T), node1 named as waiting; the retry is without node2."""
    ws = tmp_path / "ws"
    env = job_env(local_cluster, ws, tmp_path / "jax_cache")
    env.update(HANG_TIMEOUT="30", HANG_STEP_FACTOR="5", MAX_RETRIES="0")
    job_id, log = submit_job(env, "tiny:frozen:", "-N", "2", "--", "steps=100000")
    try:
        wait_for(lambda: re.search(r"^0: .*completed step: 5,", read(log), re.M), 400, "rank 0 at step 5")
        pid = training_pid(job_id, 1)
        os.kill(pid, signal.SIGSTOP)
        record = local_cluster.wait_job(job_id, 300)
    finally:
        local_cluster.run(["scancel", job_id], check=False)
        for left in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(left, signal.SIGKILL)
    text = log.read_text()
    assert record["JobState"] != "COMPLETED", record
    assert re.search(r"Status: HANG \(exit \d+\)", text), text[-3000:]
    assert "stopped sending heartbeats" not in text  # the watchdog, not JAX's heartbeat, ended it
    assert re.search(r"^\d: == HANG detected \(phase training, last step \d+, \d+ s since\) ==$", text, re.M), text[
        -4000:
    ]
    hang = log.with_suffix("") / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == ["node1.txt", "node2.txt"]
    why = subprocess.run([JOBKIT, "why", str(log)], capture_output=True, text=True, timeout=60)
    for name in ("node1.txt", "node2.txt"):  # for the record (pytest -s)
        print("\n".join((hang / name).read_text().splitlines()[:12]))
    print(why.stdout)
    lines = why.stdout.splitlines()
    assert lines[0] == "hang: training", why.stdout + why.stderr
    assert re.search(r"^  noticed: on node[12] \(rank [01]\), ", why.stdout, re.M), why.stdout
    assert "  host: node2" in lines, why.stdout
    assert re.search(
        r"^  blamed because: stacks: node2's training \(rank 1, pid \d+\) is stopped \(T\)", why.stdout, re.M
    )
    assert re.search(r"^  waiting: node1 \(rank 0\)", why.stdout, re.M), why.stdout
    assert "  retry: retry-without-node" in lines, why.stdout


def process_pid(job_id: str, global_rank: int) -> int:
    """The training process of GLOBAL_RANK (LOCAL_WORLD_SIZE > 1): `jobkit launch` with GLOBAL_RANK in its
    environment (jobkit procs, its supervisor, has none)."""
    pids = live_processes_of(job_id, TRAINING_CMDLINE)
    needle = f"GLOBAL_RANK={global_rank}".encode()
    mine = [p for p in pids if needle in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
    assert len(mine) == 1, (pids, mine)
    return mine[0]


def test_two_by_two_job_with_global_rank_3_frozen_is_blamed_on_node2_process_1(local_cluster, tmp_path):  # noqa: F811
    """Issue 25's proof: 2 nodes x 2 processes (LOCAL_WORLD_SIZE=2); global rank 3 (node2's process 1) is stopped
    (SIGSTOP); the watchdogs (HANG_TIMEOUT=30: a 5 s floor sees a loaded machine's healthy step gap as a hang)
    take the stacks of all four processes, hang/<host>.proc<i>.txt, and stop the job; `jobkit why` blames node2
    process 1 (global rank 3) and retries without node2."""
    ws = tmp_path / "ws"
    env = job_env(local_cluster, ws, tmp_path / "jax_cache")
    env.update(HANG_TIMEOUT="30", HANG_STEP_FACTOR="5", MAX_RETRIES="0", LOCAL_WORLD_SIZE="2")
    job_id, log = submit_job(env, "tiny:frozen2x2:", "-N", "2", "--", "steps=100000")
    try:
        wait_for(lambda: re.search(r"^1: \[rank3\]: .*completed step: 5,", read(log), re.M), 500, "rank 3 at step 5")
        os.kill(process_pid(job_id, 3), signal.SIGSTOP)
        record = local_cluster.wait_job(job_id, 300)
    finally:
        local_cluster.run(["scancel", job_id], check=False)
        for left in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(left, signal.SIGKILL)
    text = log.read_text()
    assert record["JobState"] != "COMPLETED", record
    assert re.search(r"Status: HANG \(exit \d+\)", text), text[-3000:]
    assert "stopped sending heartbeats" not in text  # the watchdog, not JAX's heartbeat, ended it
    hang = log.with_suffix("") / "hang"
    names = ["node1.proc0.txt", "node1.proc1.txt", "node2.proc0.txt", "node2.proc1.txt"]
    assert sorted(p.name for p in hang.glob("*.txt")) == names, text[-4000:]
    for name in names:  # for the record (pytest -s)
        print("\n".join((hang / name).read_text().splitlines()[:12]))
    assert (hang / "node2.proc1.txt").read_text().startswith("HANG on node2 (rank 1, process 1, global rank 3): ")
    assert re.search(r"^pid \d+, state T", (hang / "node2.proc1.txt").read_text(), re.M)
    why = subprocess.run([JOBKIT, "why", "--json", str(log)], capture_output=True, text=True, timeout=60)
    found = json.loads(why.stdout)
    print(why.stdout)
    assert (found["class"], found["host"], found["retry"]) == ("hang", "node2", "retry-without-node"), why.stdout
    assert re.match(r"stacks: node2 process 1 \(global rank 3, pid \d+\) is stopped \(T\)", found["blamed_because"])
    assert any(w.startswith("node1 process 0 (global rank 0)") for w in found["waiting"]), found["waiting"]


# The settings the default proof must not inherit from the caller's shell: the watchdog's and the heartbeat's.
WATCHDOG_SETTINGS = ("HANG_TIMEOUT", "HANG_COMPILE_TIMEOUT", "HANG_STEP_FACTOR", "HANG_ACTION", "JAX_HEARTBEAT_TIMEOUT")


def stacks_state(text: str) -> str:
    """The `pid N, state X (...)` line of a stacks file, as written."""
    return re.search(r"^pid \d+, state .*$", text, re.M).group(0)


@pytest.mark.slow
def test_with_default_settings_a_frozen_rank_1_is_found_by_the_watchdog_not_killed_by_jax(local_cluster, tmp_path):  # noqa: F811
    """The issue's proof with the defaults (tests/run.sh slow; ~8-10 minutes): no HANG_* setting and no
    JAX_HEARTBEAT_TIMEOUT, so the watchdog's floor is 300 s and JAX's heartbeat timeout is the launcher's default
    (3730 s), not JAX's own 100 s. Rank 1's training is stopped (SIGSTOP) after step 5: the watchdog, not JAX,
    ends the job, as HANG, after at least 300 s without a step, with both nodes' stacks; `jobkit why` blames
    node2 from its stacks (stopped, T) and names node1 as waiting. The 30 s version above is the quick one."""
    env = job_env(local_cluster, tmp_path / "ws", tmp_path / "jax_cache")
    for name in WATCHDOG_SETTINGS:
        env.pop(name, None)
    env.update(MAX_RETRIES="0")
    job_id, log = submit_job(env, "tiny:frozen300:", "-N", "2", "--", "steps=100000")
    try:
        wait_for(lambda: re.search(r"^0: .*completed step: 5,", read(log), re.M), 400, "rank 0 at step 5")
        pid = training_pid(job_id, 1)
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        # 300 s floor + up to 60 s for every node's stacks + 10 s TERM-to-KILL; the rest is margin for a loaded machine
        record = local_cluster.wait_job(job_id, 600)
        ended_after = time.monotonic() - frozen_at
    finally:
        local_cluster.run(["scancel", job_id], check=False)
        for left in live_processes_of(job_id, TRAINING_CMDLINE):
            os.kill(left, signal.SIGKILL)
    text = log.read_text()
    launch = re.findall(r"^\d: \[launch\] JAX distributed: .*$", text, re.M)
    print("\n".join(launch))  # for the record (pytest -s)
    assert len(launch) == 2 and all(
        "heartbeat timeout 3730 s (default: the hang watchdog's 3670 s + 60 s)" in line for line in launch
    ), launch
    assert record["JobState"] != "COMPLETED", record
    hang_line = re.search(r"^\d: == HANG detected \(phase training, last step \d+, (\d+) s since\) ==$", text, re.M)
    assert hang_line, text[-4000:]
    print(hang_line.group(0), f"(job ended {ended_after:.0f} s after the freeze)")
    assert int(hang_line.group(1)) >= 300, hang_line.group(0)  # the default floor held
    assert re.search(r"Status: HANG \(exit \d+\)", text), text[-3000:]
    # Nothing else killed it first: before the HANG line, no heartbeat abort, no coordination error, no task
    # death. (After it, once the watchdog has stopped rank 0, the woken rank 1 loses its peer and says so.)
    before = text[: hang_line.start()]
    for other in ("stopped sending heartbeats", "DEADLINE_EXCEEDED", "UNAVAILABLE", "srun: error:", "NODE_EXIT"):
        assert other not in before, f"{other!r} before the HANG line:\n{before[-4000:]}"
    assert "stopped sending heartbeats" not in text  # JAX's heartbeat never fired, not even during the teardown
    hang = log.with_suffix("") / "hang"
    assert sorted(p.name for p in hang.glob("*.txt")) == ["node1.txt", "node2.txt"], text[-4000:]
    node1, node2 = ((hang / f"node{i}.txt").read_text() for i in (1, 2))
    for name, stacks in (("node1.txt", node1), ("node2.txt", node2)):
        print(f"{name}: {stacks.splitlines()[0]} | {stacks_state(stacks)}")
    assert stacks_state(node2).startswith(f"pid {pid}, state T (stopped)"), node2[:2000]
    assert ", state T " not in stacks_state(node1), node1[:2000]  # node1's training was not stopped: it waits
    why = subprocess.run([JOBKIT, "why", str(log)], capture_output=True, text=True, timeout=60)
    print(why.stdout)
    lines = why.stdout.splitlines()
    assert lines[0] == "hang: training", why.stdout + why.stderr
    assert re.search(
        r"^  noticed: on node[12] \(rank [01]\), phase training, last step \d+, \d+ s since$", why.stdout, re.M
    )
    assert "  host: node2" in lines, why.stdout
    assert re.search(
        rf"^  blamed because: stacks: node2's training \(rank 1, pid {pid}\) is stopped \(T\)", why.stdout, re.M
    )
    assert re.search(r"^  waiting: node1 \(rank 0\) in ", why.stdout, re.M), why.stdout
    assert "  retry: retry-without-node" in lines, why.stdout
