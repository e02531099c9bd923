"""A hang's per-host metrics during the stall (issue 22 item 5): core.hang_metrics's rules on numbers, the
reader observe.hang_tsdb on synthetic TSDBs made by promtool (the exporter plugins' own metric names), and
`jobkit why` / requeue on a job whose hang/ holds recorded stacks (tests/fixtures/hang/) and whose TSDB says
a collective deadlock, a host unlike the others, or a GPU fault."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main
from jobkit.core import failures, logparse
from jobkit.core.hang_metrics import HostWindow, Window, judge
from jobkit.observe import hang_tsdb
from jobkit.ops import hang_watchdog, monitor, requeue

REPO = Path(__file__).resolve().parents[2]
WCHAN = REPO / "tests" / "fixtures" / "hang" / "slurm-2node-frozen-wchan"  # node1 waits, node2 is stopped (T)
STALL_S = 120
MARKER = f"phase training, last step 6, {STALL_S} s since, noticed on node1 (rank 0)"
needs_promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed")

SPIN = {"busy": (97, 100), "power": (900, 300), "net": (800e6, 2e3)}  # (training, stall): the blog's RCCL hang


def host(name, busy=100.0, power=300.0, train=900.0, net=1e3, net_train=8e8, faults=()):
    return HostWindow(name, busy, power, train, net, net_train, 5.0, tuple(faults))


# ------------------------------------------------------------------------------------------------ the rules


def test_every_host_busy_at_standby_power_with_no_network_is_a_collective_deadlock_blaming_nobody():
    said = judge(Window(0, 120, (host("node1"), host("node2"))))
    assert (said.verdict, said.host, said.node_local) == ("collective-deadlock", "", False)
    assert said.line == (
        "120 s from the last progress to the HANG: node1 GPU 100% busy at 300 W (900 W training), net 0.0 MB/s "
        "(800.0 MB/s training), CPU 5%; node2 GPU 100% busy at 300 W (900 W training), net 0.0 MB/s (800.0 MB/s "
        "training), CPU 5%: GPUs busy at standby power, no network: a collective deadlock"
    )
    # At training power the GPUs compute: not a deadlock; with traffic on the wire: not a deadlock either.
    assert judge(Window(0, 120, (host("node1"), host("node2", power=880.0)))).verdict == "none"
    assert judge(Window(0, 120, (host("node1"), host("node2", net=5e8)))).verdict == "none"
    # No training level to compare with: standby cannot be said, so neither can the deadlock.
    assert judge(Window(0, 120, (host("node1", train=None), host("node2", train=None)))).verdict == "none"


def test_one_host_whose_gpus_went_idle_while_the_others_spin_is_blamed_and_left_out():
    said = judge(Window(0, 120, (host("node1"), host("node2", busy=0.0, power=80.0), host("node3"))))
    assert (said.verdict, said.host, said.node_local) == ("odd-host", "node2", True)
    assert said.because.startswith("metrics: node2's GPUs were idle (0% busy) while every other host's were busy")
    assert said.line.endswith("node2 unlike the others") and said.line.index("node2") < said.line.index("node1")
    # Two idle hosts of three: not one host unlike the others.
    two = judge(Window(0, 120, (host("node1"), host("node2", busy=0.0), host("node3", busy=0.0))))
    assert two.verdict == "none"


def test_on_a_cpu_job_one_host_whose_cpu_went_idle_while_the_others_spin_is_blamed():
    cpu_only = [HostWindow("node1", cpu=99.0), HostWindow("node2", cpu=0.0), HostWindow("node3", cpu=98.0)]
    said = judge(Window(940, 1000, tuple(cpu_only)))
    assert (said.verdict, said.host, said.node_local) == ("odd-host", "node2", True)
    assert said.because.startswith("metrics: node2's CPU was idle (0%) while every other host's was busy")
    # Another host barely running too: not one host unlike the others.
    slow = [*cpu_only[:2], HostWindow("node3", cpu=2.0)]
    assert judge(Window(940, 1000, tuple(slow))).verdict == "none"
    # Where GPUs are measured, they decide: the CPU alone does not blame.
    gpus = [
        dataclasses.replace(host(name), cpu=cpu) for name, cpu in (("node1", 99.0), ("node2", 0.0), ("node3", 98.0))
    ]
    assert judge(Window(940, 1000, tuple(gpus))).verdict != "odd-host"


def test_a_gpu_fault_counter_or_a_log_line_on_one_host_blames_that_host():
    said = judge(Window(0, 120, (host("node1"), host("node2", faults=["hw_gpu_ecc_uncorrected_total rose by 2"]))))
    assert (said.verdict, said.host, said.node_local) == ("gpu-fault", "node2", True)
    assert said.because == "metrics: a GPU fault on node2 during the stall: hw_gpu_ecc_uncorrected_total rose by 2"
    # The log alone (no TSDB: RAY=0) is enough: the fault line names its host.
    alone = judge(None, {"node1": ["0: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus"]})
    assert (alone.verdict, alone.host) == ("gpu-fault", "node1")
    assert judge(None, {}) is None
    assert judge(Window(0, 60, (), "metrics not read: promtool is not installed"), {}).line == (
        "60 s from the last progress to the HANG: metrics not read: promtool is not installed"
    )
    # A fault on every host of several: nothing single to blame.
    both = [host("node1", faults=["x"]), host("node2", faults=["y"])]
    assert judge(Window(0, 120, tuple(both))).verdict == "none"


def test_the_line_stays_short_on_a_large_job():
    said = judge(Window(0, 120, tuple(host(f"node{i}") for i in range(512))))
    assert said.verdict == "collective-deadlock"
    assert "and 508 more hosts" in said.line and len(said.line) < 700


# ------------------------------------------------------------------------------------- a synthetic job's TSDB


def write_tsdb(tsdb: Path, start: float, end: float, hosts: dict[str, dict]) -> None:
    """A TSDB by promtool (OpenMetrics backfill) with each host's GPUs (2 each), NIC and Ray CPU every 5 s from
    TRAIN minutes before START (the last progress) to END (the HANG) plus a scrape: HOSTS {host: {"busy"|"power"|
    "net": (training, stall) value, "ecc": uncorrectable errors that appear in the stall}}."""
    times = [start - 200 + 5 * k for k in range(int((end + 10 - (start - 200)) / 5) + 1)]
    fams = {"hw_gpu_busy_percent": "gauge", "hw_gpu_power_watts": "gauge", "ray_node_cpu_utilization": "gauge",
            "hw_net_rx_bytes_total": "counter", "hw_gpu_ecc_uncorrected_total": "counter"}  # fmt: skip
    out = []
    for fam, kind in fams.items():
        out.append(f"# TYPE {fam.removesuffix('_total')} {kind}")  # OpenMetrics: a counter's family lacks _total
        for name, spec in hosts.items():
            for gpu in ("0", "1") if fam.startswith("hw_gpu") else ("",):
                labels = f'host="{name}",job="exporters"' + (f',gpu="{gpu}"' if gpu else "")
                if fam == "hw_net_rx_bytes_total":
                    labels += ',device="eth0"'
                total = 0.0
                for t in times:
                    phase = 0 if t <= start else 1
                    if fam == "hw_gpu_busy_percent":
                        value = spec["busy"][phase]
                    elif fam == "hw_gpu_power_watts":
                        value = spec["power"][phase]
                    elif fam == "ray_node_cpu_utilization":
                        value = 40.0 if phase == 0 else 3.0
                    elif fam == "hw_net_rx_bytes_total":
                        total += spec["net"][phase] * 5
                        value = total
                    else:
                        value = float(spec.get("ecc", 0) if phase and gpu == "1" else 0)
                    out.append(f"{fam}{{{labels}}} {value} {t:.3f}")
    om = tsdb.parent / "synthetic.om"
    om.write_text("\n".join(out) + "\n# EOF\n")
    tsdb.mkdir(parents=True)
    made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om), str(tsdb)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    om.unlink()
    (tsdb / "wal").mkdir(exist_ok=True)  # as a clean shutdown leaves it (promtool 2.42 wants one)


def hang_job(tmp_path: Path, hosts: dict[str, dict] | None, node2_state: str = "S (sleeping)") -> Path:
    """A finished 2-node HANG job: its log, hang/ with the HANG marker (mtime = the HANG) and recorded stacks
    (slurm-2node-frozen-wchan: node1 waiting in BlockUntilReadyWithCancel; node2 as node1's copy, waiting too,
    unless NODE2_STATE says otherwise), and a TSDB of HOSTS. The stall ends in the middle of an epoch 2-hour
    block (promtool cuts blocks there)."""
    log = tmp_path / "500-tiny.log"
    job_dir = log.with_suffix("")
    hang = job_dir / "hang"
    hang.mkdir(parents=True, mode=0o755)
    end = float(int(time.time()) // 7200 * 7200 - 3600)
    start = end - STALL_S
    waiting = (WCHAN / "node1.txt").read_text()
    node2 = re.sub(r"^HANG on node1 \(rank 0\)", "HANG on node2 (rank 1)", waiting)
    node2 = re.sub(r"^pid (\d+), state S \(sleeping\)", rf"pid \1, state {node2_state}", node2, count=1, flags=re.M)
    (hang / "node1.txt").write_text(waiting)
    (hang / "node2.txt").write_text(node2)
    (hang / "HANG").write_text(hang_watchdog.marker_body(MARKER, "500"))
    os.utime(hang / "HANG", (end, end))
    if hosts is not None:
        write_tsdb(job_dir / "prometheus", start, end, hosts)
    step = "0: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.1, loss: 5.9\n"
    body = "".join(step.format(n=n) for n in range(7))
    body += f"0: == HANG detected (phase training, last step 6, {STALL_S} s since) ==\n"
    log.write_text(
        "JOB_ID=500\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node1,node2\nMODEL_NAME=tiny\n"
        + body
        + "==== JOB SUMMARY ====\n  Status: HANG (exit 143)\n=====================\n"
    )
    return log


def why(log: Path) -> list[str]:
    result = CliRunner().invoke(main, ["why", str(log)])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


@needs_promtool
def test_the_reader_gives_each_host_its_stall_and_its_training_level(tmp_path):
    log = hang_job(tmp_path, {"node1": SPIN, "node2": {**SPIN, "busy": (97, 0), "power": (900, 60), "ecc": 3}})
    job_dir = log.with_suffix("")
    before = sorted(str(p) for p in job_dir.rglob("*"))
    window = hang_tsdb.read_window(job_dir)
    assert window.end - window.start == STALL_S and window.note == ""
    node1, node2 = window.hosts
    assert (node1.host, node1.gpu_busy, node1.gpu_power, node1.gpu_power_train) == ("node1", 100.0, 300.0, 900.0)
    assert node1.net == pytest.approx(2e3) and node1.net_train == pytest.approx(800e6)
    assert node1.cpu == 3.0 and node1.faults == ()
    assert (node2.gpu_busy, node2.gpu_power) == (0.0, 60.0)
    assert node2.faults == ("hw_gpu_ecc_uncorrected_total rose by 3 on GPU 1",)
    assert sorted(str(p) for p in job_dir.rglob("*")) == before  # read-only: promtool reads a view of links
    assert hang_tsdb.read_window(tmp_path / "nothing") is None  # no marker, no TSDB: nothing to place


@needs_promtool
def test_why_reads_gpus_busy_at_standby_power_and_no_traffic_as_a_collective_deadlock(tmp_path):
    log = hang_job(tmp_path, {"node1": SPIN, "node2": SPIN})
    lines = why(log)
    assert "  noticed: on node1 (rank 0), phase training, last step 6, 120 s since" in lines
    assert not any(line.startswith("  host:") for line in lines)  # job-wide: nobody blamed, nobody excluded
    blamed = next(line for line in lines if line.startswith("  blamed: "))
    assert blamed.startswith("  blamed: metrics: every host's GPUs busy at standby power with no network traffic")
    assert "; stacks: every rank is in" in blamed  # the stacks agree, and say so after
    metrics = next(line for line in lines if line.startswith("  metrics: "))
    assert metrics.startswith("  metrics: 120 s from the last progress to the HANG: node1 GPU 100% busy at 300 W")
    assert metrics.endswith("a collective deadlock")
    assert "  retry: retry" in lines
    data = json.loads(CliRunner().invoke(main, ["why", "--json", str(log)]).output)
    assert (data["host"], data["retry"], data["metrics"]) == ("", "retry", metrics.split(": ", 1)[1])
    text = log.read_text()
    found = requeue.outcome(logparse.parse_text(text), text, log.with_suffix(""))  # the requeue excludes nobody
    assert (found.host, found.retry_decision) == ("", "retry")
    event = monitor.failure_text("job 500: ", found)  # the monitor's `failure` event says the deadlock
    assert "; metrics: every host's GPUs busy at standby power with no network traffic: a collective deadlock" in event
    assert "; noticed: on node1 (rank 0)" in event and len(event) <= monitor.FAILURE_LINE_MAX


@needs_promtool
def test_a_host_whose_gpus_went_idle_is_blamed_and_the_requeue_leaves_it_out(tmp_path):
    log = hang_job(tmp_path, {"node1": SPIN, "node2": {**SPIN, "busy": (97, 0), "power": (900, 60)}})
    lines = why(log)
    assert "  host: node2" in lines and "  retry: retry-without-node" in lines
    because = next(line for line in lines if line.startswith("  blamed because: "))
    assert because.startswith("  blamed because: metrics: node2's GPUs were idle (0% busy)")
    assert "  noticed: on node1 (rank 0), phase training, last step 6, 120 s since" in lines  # kept apart
    text = log.read_text()
    found = requeue.outcome(logparse.parse_text(text), text, log.with_suffix(""))  # what the monitor reports too
    assert (found.host, found.retry) == ("node2", "retry-without-node")
    listed = CliRunner().invoke(main, ["jobs", "--json", "--workspace", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines()]
    assert [(r["why"], r["failure"]["retry"]) for r in rows] == [("hang@node2", "retry-without-node")]  # WHY agrees


@needs_promtool
def test_idle_gpus_on_a_rank_the_stacks_already_blamed_as_gone_do_not_exclude_its_node(tmp_path):
    """Training that ended on node2 (no process: `none`) leaves its GPUs idle: the stacks' reading (not
    node-local, retry with the node) stands, and the metrics are said beside it."""
    log = hang_job(tmp_path, {"node1": SPIN, "node2": {**SPIN, "busy": (97, 0), "power": (900, 60)}})
    hang = log.with_suffix("") / "hang"
    (hang / "node2.txt").write_text("HANG on node2 (rank 1): " + MARKER + "\nno training process found\n")
    lines = why(log)
    assert "  host: node2" in lines and "  retry: retry" in lines
    assert next(line for line in lines if line.startswith("  blamed because: ")).startswith(
        "  blamed because: stacks: "
    )
    assert any(line.startswith("  metrics: ") and line.endswith("node2 unlike the others") for line in lines)


@needs_promtool
def test_a_gpu_fault_counter_during_the_hang_blames_its_host(tmp_path):
    log = hang_job(tmp_path, {"node1": SPIN, "node2": {**SPIN, "ecc": 2}})
    lines = why(log)
    assert "  host: node2" in lines and "  retry: retry-without-node" in lines
    assert any(
        line.startswith("  blamed because: metrics: a GPU fault on node2 during the stall: "
                        "hw_gpu_ecc_uncorrected_total rose by 2 on GPU 1") for line in lines
    )  # fmt: skip


@needs_promtool
def test_a_node_local_cause_in_the_stacks_stands_and_the_metrics_are_said_beside_it(tmp_path):
    log = hang_job(tmp_path, {"node1": SPIN, "node2": SPIN}, node2_state="T (stopped)")
    lines = why(log)
    assert "  host: node2" in lines and "  retry: retry-without-node" in lines
    assert next(line for line in lines if line.startswith("  blamed because: ")).startswith(
        "  blamed because: stacks: node2's training (rank 1, pid "
    )
    assert any(line.startswith("  metrics: 120 s from the last progress to the HANG:") for line in lines)


def test_a_gpu_fault_line_in_the_log_during_a_hang_blames_its_host_without_a_tsdb(tmp_path):
    """RAY=0 (no TSDB): the catalogue's hang entry wins the class, but an Xid line node2 printed after the last
    step is a GPU fault there, so node2 is blamed and left out, not "nobody"."""
    log = hang_job(tmp_path, None)
    text = log.read_text().replace(
        "0: == HANG", "1: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n0: == HANG"
    )
    log.write_text(text)
    found = failures.classify(text, "HANG", 143, True, ["node1", "node2"], job_dir=log.with_suffix(""))
    assert (found.reason, found.host, found.retry) == ("hang", "node2", "retry-without-node")
    assert found.blame_how.startswith("metrics: a GPU fault on node2 during the stall: 1: NVRM: Xid")
    assert found.metrics.endswith("a GPU fault on node2")
    # The same line before the last step is not "around the hang".
    early = text.replace("1: NVRM: Xid", "").replace("0: I1124", "1: NVRM: Xid (PCI:0000:3b:00): 79\n0: I1124", 1)
    assert failures.classify(early, "HANG", 143, True, ["node1", "node2"], job_dir=log.with_suffix("")).host == ""
