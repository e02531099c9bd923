"""`jobkit procs` (launch/procs.py): the layout's checks and ranks, what each process gets, the `[rank<G>]:`
prefix on whole lines, the first failure told once and the others stopped, and signals passed on.

The processes are small `python -c` programs (no MaxText); each waits for what it needs on files, never on a
guessed sleep.
"""

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main as jobkit_main
from jobkit.core.errors import EXIT_SETTINGS, EXIT_USAGE
from jobkit.launch import procs

REPO = Path(__file__).resolve().parents[2]
JOBKIT = [sys.executable, str(REPO / "py" / "bin" / "jobkit")]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 is not a process count per node"),
        ({"LOCAL_WORLD_SIZE": "65"}, "LOCAL_WORLD_SIZE=65 is not a process count per node"),
        ({"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE=x is not a whole number"),
        ({"LOCAL_WORLD_SIZE": "-1"}, "LOCAL_WORLD_SIZE=-1 is not a whole number"),
        ({"LOCAL_WORLD_SIZE": "1.5"}, "LOCAL_WORLD_SIZE=1.5 is not a whole number"),
        ({"LOCAL_WORLD_SIZE": "\u0662"}, "LOCAL_WORLD_SIZE=\u0662 is not a whole number"),  # an Arabic-Indic 2
        ({"LOCAL_WORLD_SIZE": " 2"}, "LOCAL_WORLD_SIZE=' 2' has spaces around it"),  # the header would show them
        ({"LOCAL_WORLD_SIZE": "2", "NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 is not below NNODES=2"),
        ({"LOCAL_WORLD_SIZE": "2", "NNODES": "0"}, "NODE_RANK=0 is not below NNODES=0"),
        ({"LOCAL_WORLD_SIZE": "2", "NNODES": "two"}, "NNODES=two is not a whole number"),
    ],
)
def test_a_bad_layout_is_one_line_naming_the_setting_and_the_fix(env, named):
    with pytest.raises(procs.LayoutError) as err:
        procs.Layout.from_env(env)
    message = str(err.value)
    assert message.startswith(named) and "\n" not in message
    assert re.search(r"; (set (a whole number )?1\.\.64|start training through submit\.sh)", message), message


def test_the_cli_check_refuses_a_bad_value_in_one_line_as_a_refused_setting():
    result = CliRunner().invoke(jobkit_main, ["procs", "--check"], env={"LOCAL_WORLD_SIZE": "abc"})
    assert result.exit_code == EXIT_SETTINGS
    assert result.output.count("\n") == 1 and "LOCAL_WORLD_SIZE=abc is not a whole number" in result.output


def test_the_cli_check_prints_the_layout_and_no_command_is_refused():
    env = {"LOCAL_WORLD_SIZE": "2", "NNODES": "2", "NODE_RANK": "1"}
    result = CliRunner().invoke(jobkit_main, ["procs", "--check"], env=env)
    assert result.exit_code == 0
    assert re.fullmatch(
        r"\[procs\] 2 processes on node 1 \(\S+\): global ranks 2-3 of NPROCS=4 \(LOCAL_WORLD_SIZE=2\)\n", result.output
    )
    result = CliRunner().invoke(jobkit_main, ["procs"], env=env)
    assert result.exit_code == EXIT_USAGE and "no command given" in result.output


def test_unset_is_one_process_per_node_and_the_ranks_come_from_the_tiers():
    assert procs.Layout.from_env({}) == procs.Layout(1, 1, 0)
    assert procs.Layout.from_env({"LOCAL_WORLD_SIZE": "4", "NNODES": "3", "NODE_RANK": "2"}) == procs.Layout(4, 3, 2)


def test_each_process_gets_its_ranks_the_count_and_everything_inherited():
    layout = procs.Layout.from_env({"LOCAL_WORLD_SIZE": "2", "NNODES": "2", "NODE_RANK": "1"})
    inherited = {
        "JOB_ID": "77",
        "NODE_RANK": "1",
        "NNODES": "2",
        "LOCAL_WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert [layout.child_env(inherited, local) for local in (0, 1)] == [
        {**inherited, "LOCAL_RANK": "0", "GLOBAL_RANK": "2", "NPROCS": "4"},
        {**inherited, "LOCAL_RANK": "1", "GLOBAL_RANK": "3", "NPROCS": "4"},
    ]
    assert inherited == {
        "JOB_ID": "77",
        "NODE_RANK": "1",
        "NNODES": "2",
        "LOCAL_WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }  # fmt: skip  (the caller's mapping is not changed)


def test_one_node_gets_a_loopback_coordinator_unless_one_is_set():
    env = {}
    where = procs.local_coordinator(env)
    assert where == f"127.0.0.1:{env['JAX_COORDINATOR_PORT']}"
    assert env["JAX_COORDINATOR_IP"] == "127.0.0.1" and env["JAX_COORDINATOR_BIND_ADDRESS"] == where
    given = {"JAX_COORDINATOR_IP": "10.0.0.1", "JAX_COORDINATOR_PORT": "1234"}
    assert procs.local_coordinator(given) is None and given == {"JAX_COORDINATOR_IP": "10.0.0.1",
                                                                "JAX_COORDINATOR_PORT": "1234"}  # fmt: skip


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (3, 3), (-signal.SIGTERM, 143), (-signal.SIGKILL, 137)])
def test_exit_status_is_a_shells(returncode, status):
    assert procs.exit_status(returncode) == status


def run_group(tmp_path, program: str, per_node: int = 2, node_rank: int = 0, nnodes: int = 1):
    """PROGRAM (python source; LOCAL_RANK, GLOBAL_RANK, DIR in its environment) as a Group: (status, output, group)."""
    layout = procs.Layout(per_node, nnodes, node_rank)
    out = io.BytesIO()
    env = {**os.environ, "DIR": str(tmp_path)}
    group = procs.Group(layout, [sys.executable, "-c", textwrap.dedent(program)], env, out=out)
    group.start()
    status = group.wait(poll=0.02)
    return status, out.getvalue().decode(), group


def test_every_line_of_every_process_is_whole_and_behind_its_global_rank(tmp_path):
    program = """
        import os, sys, time
        from pathlib import Path
        rank = os.environ["GLOBAL_RANK"]
        print(f"env {os.environ['LOCAL_RANK']} {rank} {os.environ['NPROCS']} {os.environ['LOCAL_WORLD_SIZE']}")
        for i in range(300):
            print(f"line {i} of rank {rank} " + "x" * 200)
        sys.stderr.write("to stderr\\n")
        sys.stdout.write("par")
        sys.stdout.flush()
        # The rest of the line comes once the other process has written its own first half.
        other = Path(os.environ["DIR"], "half." + str(1 - int(os.environ["LOCAL_RANK"])))
        Path(os.environ["DIR"], "half." + os.environ["LOCAL_RANK"]).touch()
        while not other.exists():
            time.sleep(0.01)
        sys.stdout.write("tial\\nno newline at the end")
    """
    status, output, group = run_group(tmp_path, program, node_rank=1, nnodes=2)
    assert status == 0
    lines = output.splitlines()
    assert output.endswith("\n")
    pids = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^\[procs\] rank (\d+) \(local \d\): pid (\d+)$",
                                                                   output, re.M)}  # fmt: skip
    assert pids == {2: group.procs[0].pid, 3: group.procs[1].pid}
    for rank, local in ((2, 0), (3, 1)):
        mine = [line.removeprefix(f"[rank{rank}]: ") for line in lines if line.startswith(f"[rank{rank}]: ")]
        assert mine[0] == f"env {local} {rank} 4 2"
        assert mine[1:301] == [f"line {i} of rank {rank} " + "x" * 200 for i in range(300)]
        assert mine[301:] == ["to stderr", "partial", "no newline at the end"]
    assert all(line.startswith(("[rank2]: ", "[rank3]: ", "[procs] ")) for line in lines), lines
    assert "PROC_EXIT" not in output


def test_the_first_failure_is_told_once_and_stops_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(procs, "KILL_GRACE", 0.5)
    # Local 0 ignores TERM (it must be KILLed after the grace), local 1 waits for TERM, local 2 fails with 3 once
    # both are ready.
    program = """
        import os, signal, sys, time
        from pathlib import Path
        local, d = int(os.environ["LOCAL_RANK"]), Path(os.environ["DIR"])
        if local == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if local < 2:
            (d / f"ready.{local}").touch()
            while True:
                time.sleep(1)
        while not ((d / "ready.0").exists() and (d / "ready.1").exists()):
            time.sleep(0.01)
        print("failing")
        sys.exit(3)
    """
    status, output, group = run_group(tmp_path, program, per_node=3, node_rank=1, nnodes=2)
    assert status == 3
    host = procs.host()
    assert re.findall(r"^PROC_EXIT .*$", output, re.M) == [f"PROC_EXIT host={host} rank=5 local=2 exit=3"]
    assert "[procs] rank 5 failed: stopping the other 2 process(es) on this node" in output
    assert "[rank5]: failing" in output
    assert [p.returncode for p in group.procs] == [-signal.SIGKILL, -signal.SIGTERM, 3]


def test_failures_seen_together_are_told_as_the_lowest_ranks(tmp_path):
    status, output, _ = run_group(tmp_path, "import os, sys; sys.exit(10 + int(os.environ['LOCAL_RANK']))")
    assert status in (10, 11)
    told = re.findall(r"^PROC_EXIT host=\S+ rank=(\d) local=\d exit=(\d+)$", output, re.M)
    assert len(told) == 1 and int(told[0][1]) == 10 + int(told[0][0])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_jobkit_procs_reaches_every_process(tmp_path, signum):
    program = textwrap.dedent("""
        import os, signal, sys, time
        from pathlib import Path
        def told(s, _frame):
            print(f"got {s}", flush=True)
            sys.exit(0 if os.environ["LOCAL_RANK"] == "0" else 7)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, told)
        Path(os.environ["DIR"], "ready." + os.environ["LOCAL_RANK"]).touch()
        while True:
            time.sleep(1)
    """)
    env = {**os.environ, "DIR": str(tmp_path), "LOCAL_WORLD_SIZE": "2", "NNODES": "1", "NODE_RANK": "0"}
    env.pop("JAX_COORDINATOR_IP", None)
    env["PYTHONPATH"] = str(REPO / "py")
    proc = subprocess.Popen(
        [*JOBKIT, "procs", "--", sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        ready = [tmp_path / "ready.0", tmp_path / "ready.1"]
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in ready) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # both processes have their handlers before the signal
        assert all(p.exists() for p in ready), proc.poll()
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"[rank0]: got {int(signum)}" in output and f"[rank1]: got {int(signum)}" in output, output
    assert proc.returncode == 7
    assert re.findall(r"^PROC_EXIT .*$", output, re.M) == [f"PROC_EXIT host={procs.host()} rank=1 local=1 exit=7"]


def test_a_signal_before_the_processes_start_starts_none_and_is_not_a_success(tmp_path):
    layout = procs.Layout(2, 1, 0)
    out = io.BytesIO()
    group = procs.Group(layout, [sys.executable, "-c", "pass"], dict(os.environ), out=out)
    group.cancel(signal.SIGTERM)
    group.start()
    assert group.procs == []
    assert group.wait(poll=0.02) == 143
    assert out.getvalue().decode() == "[procs] signal 15 before every process started: 0 of 2 ran\n"


def test_a_signal_while_a_process_is_being_started_reaches_it_too(tmp_path, monkeypatch):
    # The supervisor's handler runs between two bytecodes of start(): here, inside the first Popen.
    layout = procs.Layout(2, 1, 0)
    group = procs.Group(
        layout, [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), out=io.BytesIO()
    )
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        group.cancel(signal.SIGTERM)  # before start() has the new process in its list
        return proc

    monkeypatch.setattr(procs.subprocess, "Popen", popen_then_signal)
    group.start()
    assert len(group.procs) == 1
    assert group.wait(poll=0.02) == 143
    assert group.procs[0].returncode == -signal.SIGTERM
