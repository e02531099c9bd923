"""`jobkit ray-launch` (py/jobkit/observe/ray_driver.py, ray_actor.py, ray_watchdog.py) and utils/lib/ray_cluster.sh
against a real one-node Ray cluster.

One Ray head for the whole module (started and stopped through utils/lib/ray_cluster.sh, on 127.0.0.1 with its own
short --temp-dir, token authentication on: a token from ray_make_token); every test runs the launcher as a separate
driver process against it, with the token. The head's
environment carries a marker variable, which the launched commands must see (the node's environment is theirs),
while no RAY_* variable may reach them. Nothing here uses `ray stop` or kills by name: the head is stopped by
its temp dir, test processes by their PIDs.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main as jobkit_main
from jobkit.core import procfs
from jobkit.observe import ray_actor, ray_driver

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "utils" / "lib" / "ray_cluster.sh"
SHIM = REPO / "utils" / "shims" / "py-spy"
VENV_BIN = Path(sys.executable).parent
RAY_CLI = VENV_BIN / "ray"
JOBKIT = VENV_BIN / "jobkit"
MARKER = ("JOBKIT_NODE_MARKER", "node env reaches the command")

pytestmark = pytest.mark.skipif(not RAY_CLI.exists(), reason=f"no ray CLI next to {sys.executable}")

# A child script with a function name nothing else has, for the py-spy check; writes its PID, then loops.
LOOPER = """
import os, sys, time
def jobkit_unique_training_loop():
    while True:
        time.sleep(0.02)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("looping", flush=True)
jobkit_unique_training_loop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lib(call: str, env: dict | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    """Runs `source utils/lib/ray_cluster.sh; <call>` in bash."""
    return subprocess.run(
        ["bash", "-c", f'source "{LIB}"; {call}'], capture_output=True, text=True, env=env, timeout=timeout
    )


def node_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "OMP_NUM_THREADS"}
    env.update({"RAY_BIN": str(RAY_CLI), "RAY_USAGE_STATS_ENABLED": "0", MARKER[0]: MARKER[1]})
    return env


def procs_naming(path: str) -> list[int]:
    """Live (non-zombie) processes whose command line mentions path."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if path.encode() in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    temp = tempfile.mkdtemp(prefix="mxr-t", dir="/tmp")
    auth = tempfile.mkdtemp(prefix="mxr-a", dir="/tmp")
    token = f"{auth}/job/token"
    assert lib(f"ray_make_token {token}").returncode == 0
    ports = [free_port() for _ in range(3)]
    t0 = time.monotonic()
    proc = lib(
        f"ray_start_head {temp} 127.0.0.1 {ports[0]} {ports[1]} {ports[2]}",
        env=dict(node_env(), RAY_AUTH_TOKEN_PATH=token),
    )
    started = time.monotonic() - t0
    try:
        assert proc.returncode == 0, proc.stderr
        print(f"ray_start_head: {started:.1f} s")
        # The dashboard comes up behind ray_start_head (RAY_DASHBOARD_ORDER): the tests that ask it something
        # start once `ray start` has ended, which it does only with the dashboard up.
        rc = wait_for(lambda: Path(temp, "ray_start.rc").exists() and Path(temp, "ray_start.rc"), 150, "ray start")
        assert rc.read_text().strip() == "0", Path(temp, "ray_start.err").read_text()
        yield {"address": f"127.0.0.1:{ports[0]}", "temp": temp, "dashboard": ports[1], "token": token}
    finally:
        t0 = time.monotonic()
        stop = lib(f"ray_stop_node {temp}", timeout=60)
        print(f"ray_stop_node: {time.monotonic() - t0:.2f} s")
        left = procs_naming(temp)
        subprocess.run(["rm", "-rf", temp, auth], check=False)
        assert stop.returncode == 0, stop.stderr
        assert left == [], f"processes of the Ray node survived ray_stop_node: {left}"


def with_token(cluster) -> dict:
    """This process's environment without RAY_*, plus the two variables that make a driver use the token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=cluster["token"])


def launch(cluster, *cmd, opts=(), **kwargs) -> subprocess.Popen:
    env = with_token(cluster)
    return subprocess.Popen(
        [str(JOBKIT), "ray-launch", "--address", cluster["address"], *opts, "--", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        **kwargs,
    )


def run(cluster, *cmd, opts=(), timeout=60, **kwargs) -> tuple[int, bytes, str]:
    proc = launch(cluster, *cmd, opts=opts, **kwargs)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err.decode()


def test_exit_code_of_the_command_is_the_drivers(cluster):
    rc, out, err = run(cluster, "bash", "-c", "echo before; exit 3")
    assert rc == 3, err
    assert out == b"before\n"
    assert "[ray_launch] node 127.0.0.1 rank 0: exited with code 3" in err


def test_success_is_zero_and_says_so(cluster):
    rc, out, err = run(cluster, "true")
    assert (rc, out) == (0, b""), err
    assert "exited with code 0" in err


def test_killed_command_reports_the_signal(cluster):
    rc, _out, err = run(cluster, "bash", "-c", "kill -KILL $$")
    assert rc == 137, err
    assert "killed by SIGKILL" in err


def test_command_gets_the_node_env_without_ray_variables(cluster, tmp_path):
    rc, out, err = run(cluster, "env", "-0", cwd=tmp_path)
    assert rc == 0, err
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    assert env.get(MARKER[0]) == MARKER[1], "the node's `ray start` environment must reach the command"
    assert [k for k in env if k.startswith("RAY_")] == []
    for injected in ("OMP_NUM_THREADS", "PYTHONBREAKPOINT", "SPT_NOENV", "JOBKIT_PYSPY_SHIM_DIR", "LD_PRELOAD"):
        assert injected not in env, f"{injected}={env[injected]} comes from Ray, not from the node"
    assert "utils/shims" not in env["PATH"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PWD"] == str(tmp_path)


def test_output_reaches_stdout_unchanged_and_in_order(cluster, tmp_path):
    script = tmp_path / "talk.py"
    script.write_text(
        "import sys\n"
        "out = sys.stdout.buffer\n"
        "for i in range(3000):\n"
        "    out.write(b'completed step: %d, \\t  caf\\xc3\\xa9 \\x1b[1mbold\\x1b[0m %s\\r\\n' % (i, b'x' * (i % 97)))\n"
        "    if i % 500 == 0:\n"
        "        out.flush(); sys.stderr.buffer.write(b'stderr line %d\\n' % i); sys.stderr.flush()\n"
        "out.write(b'no newline at the end')\n"
    )
    expected = subprocess.run([sys.executable, str(script)], capture_output=True, check=True)
    rc, out, err = run(cluster, sys.executable, str(script))
    assert rc == 0, err
    lines = out.split(b"\n")
    assert [line for line in lines if not line.startswith(b"stderr line")] == expected.stdout.split(b"\n")
    assert [line for line in lines if line.startswith(b"stderr line")] == expected.stderr.splitlines()
    assert out.endswith(b"no newline at the end")


def test_sigterm_stops_the_command_tree_and_exits_143(cluster, tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "loop.py").write_text(LOOPER)
    # The training process is a grandchild (a launcher shell in between), as with _train.sh.
    proc = launch(cluster, "bash", "-c", f"{sys.executable} {tmp_path / 'loop.py'} {pid_file}; echo after")
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the command to start"))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
        assert proc.returncode == 143, err.decode()
        assert "got SIGTERM: stopping the command" in err.decode()
        wait_for(lambda: not alive(child), 5, "the training process to end")
        print(f"SIGTERM -> driver exit: {took:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_driver_killed_hard_takes_the_command_along(cluster, tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "loop.py").write_text(LOOPER)
    proc = launch(cluster, "bash", "-c", f"{sys.executable} {tmp_path / 'loop.py'} {pid_file}")
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the command to start"))
    proc.kill()
    proc.wait()
    # Ray ends the driver's actors; the watchdog then kills the command's process group (grandchild included).
    wait_for(lambda: not alive(child), 30, "the training process to end after its driver was killed")


def test_pyspy_shim_dumps_the_training_process_of_an_actor(cluster, tmp_path):
    if os.geteuid() != 0 and Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() != "0":
        pytest.skip("py-spy cannot attach to a non-child here (not root and yama ptrace_scope != 0)")
    pid_file = tmp_path / "child.pid"
    (tmp_path / "loop.py").write_text(LOOPER)
    proc = launch(cluster, "bash", "-c", f"{sys.executable} {tmp_path / 'loop.py'} {pid_file}")
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the command to start"))
        # The driver's stderr names the actor's worker PID, as the dashboard would pass it to py-spy.
        line = proc.stderr.readline().decode()
        assert "Ray worker pid" in line, line
        worker = int(line.split("Ray worker pid ")[1].split(",")[0])
        assert worker != child
        env = dict(os.environ, PATH=f"{SHIM.parent}:{VENV_BIN}:{os.environ['PATH']}")
        dump = subprocess.run(
            ["py-spy", "dump", "-p", str(worker)], capture_output=True, text=True, env=env, timeout=30
        )
        assert dump.returncode == 0, dump.stderr
        assert "jobkit_unique_training_loop" in dump.stdout
        assert f"Process {child}:" in dump.stdout
        assert f"Ray worker {worker} -> its training process {child}" in dump.stderr
        # The same through the dashboard's own "Stack Trace" endpoint (its agent finds the shim on PATH).
        url = f"http://127.0.0.1:{cluster['dashboard']}/worker/traceback?ip=127.0.0.1&pid={worker}"
        token = Path(cluster["token"]).read_text()
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            text = reply.read().decode()
        assert "jobkit_unique_training_loop" in text and f"Process {child}:" in text, text
        # Any other PID goes to the real py-spy unchanged.
        other = subprocess.run(
            ["py-spy", "dump", "-p", str(child)], capture_output=True, text=True, env=env, timeout=30
        )
        assert other.returncode == 0 and "jobkit_unique_training_loop" in other.stdout
        assert "jobkit wrapper" not in other.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_unreachable_cluster_is_one_line_and_its_own_exit_code(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    closed = free_port()
    proc = subprocess.run(
        [
            str(JOBKIT),
            "ray-launch",
            "--address",
            f"127.0.0.1:{closed}",
            "--",
            "touch",
            str(tmp_path / "ran"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == ray_driver.EXIT_UNREACHABLE == 75
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[ray_launch] cannot reach the Ray cluster at 127.0.0.1:{closed}: ")
    assert not (tmp_path / "ran").exists()


def test_too_few_nodes_is_unreachable(cluster, tmp_path):
    rc, _out, err = run(cluster, "touch", str(tmp_path / "ran"), opts=("--nodes", "2", "--nodes-timeout", "1"))
    assert rc == 75, err
    assert "only 1 of 2 node(s) joined within 1 s" in err
    assert not (tmp_path / "ran").exists()


def test_missing_command_is_127(cluster):
    rc, _out, err = run(cluster, "/nonexistent/jobkit-cmd")
    assert rc == 127, err
    assert "cannot start '/nonexistent/jobkit-cmd'" in err


def test_usage_errors_are_2():
    runner = CliRunner()
    for args in (["--nodes", "1"], ["--nodes", "0", "--", "true"], ["--grace", "x", "--", "true"]):
        result = runner.invoke(jobkit_main, ["ray-launch", *args])
        assert result.exit_code == 2, (args, result.output)
    assert "put it after '--'" in runner.invoke(jobkit_main, ["ray-launch"]).output


def test_status_helpers():
    assert ray_driver.describe_status(0) == "exited with code 0"
    assert ray_driver.describe_status(-9) == "killed by SIGKILL"
    assert ray_driver.shell_status(-15) == 143
    assert ray_driver.first_failure([((1, 1), 2), ((0, 0), 0), ((2, 2), 5)]) == 2
    assert ray_driver.first_failure([((0, 0), 0), ((1, 1), 0)]) == 0


def test_child_env_restores_the_node_values():
    worker = {
        "PATH": "/shim:/usr/bin",
        "OMP_NUM_THREADS": "1",
        "RAY_JOB_ID": "01",
        "KEEP": "x",
        "CUDA_VISIBLE_DEVICES": "",
        "JOBKIT_PYSPY_SHIM_DIR": "/shim",
    }
    raylet = {
        "PATH": "/shim:/usr/bin",
        "KEEP": "x",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "LD_PRELOAD": "jemalloc.so",
        "JOBKIT_PYSPY_SHIM_DIR": "/shim",
    }
    env = ray_actor.child_env(worker, raylet, "/work")
    assert env == {
        "PATH": "/usr/bin",
        "KEEP": "x",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONUNBUFFERED": "1",
        "PWD": "/work",
    }
    # Without the raylet's environment: the known worker additions go.
    env = ray_actor.child_env(worker, None)
    assert "OMP_NUM_THREADS" not in env and "RAY_JOB_ID" not in env and env["KEEP"] == "x"


def test_start_head_on_a_taken_port_fails_in_one_line_and_leaves_nothing():
    temp = tempfile.mkdtemp(prefix="mxr-p", dir="/tmp")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gcs = taken.getsockname()[1]
        t0 = time.monotonic()
        proc = lib(f"ray_start_head {temp} 127.0.0.1 {gcs} {free_port()} {free_port()}", env=node_env())
        took = time.monotonic() - t0
    try:
        assert proc.returncode != 0
        lines = proc.stderr.splitlines()
        assert len(lines) == 1, proc.stderr
        assert f"port {gcs} (GCS_PORT={gcs}) is already in use" in lines[0]
        assert took < 10
        assert procs_naming(temp) == []
        assert lib(f"ray_node_pids {temp}").stdout == ""
    finally:
        subprocess.run(["rm", "-rf", temp], check=False)


def test_library_rejects_bad_arguments():
    proc = lib("ray_start_head /tmp/x 127.0.0.1 notaport 1 2")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "GCS_PORT" in proc.stderr
    proc = lib("ray_start_head /tmp/" + "d" * 80 + " 127.0.0.1 1 2 3")
    assert proc.returncode == 2 and "too long for Ray's unix sockets" in proc.stderr
    proc = lib("ray_join_cluster /tmp/x 127.0.0.1 nohostport 1")
    assert proc.returncode == 2 and "HEAD_ADDR" in proc.stderr
    proc = lib("ray_save_logs /tmp/jobkit-no-such-dir /tmp/jobkit-no-dest")
    assert proc.returncode == 1 and "no Ray session logs" in proc.stderr
    temp = tempfile.mkdtemp(prefix="mxr-o", dir="/tmp")
    try:
        ports = " ".join(str(free_port()) for _ in range(3))
        proc = lib(f"ray_start_head {temp} 127.0.0.1 {ports}", env=dict(node_env(), RAY_DASHBOARD_ORDER="sideways"))
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "RAY_DASHBOARD_ORDER='sideways' must be first, beside or last" in proc.stderr
        assert procs_naming(temp) == [] and os.listdir(temp) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_save_logs_copies_the_session_logs(cluster, tmp_path):
    dest = tmp_path / "ray_logs" / "host"
    proc = lib(f"ray_save_logs {cluster['temp']} {dest}")
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in dest.iterdir()}
    assert {"raylet.out", "gcs_server.out"} <= names, sorted(names)


def test_output_sink_takes_the_commands_output_directly(monkeypatch, tmp_path):
    sink = tmp_path / "job.log"
    sink.write_text("before\n")
    node = {**os.environ, ray_actor.OUTPUT_SINK_VAR: str(sink), MARKER[0]: MARKER[1]}
    monkeypatch.delenv("RAY_RAYLET_PID", raising=False)
    monkeypatch.setenv(*MARKER)
    monkeypatch.setattr(procfs, "environ", lambda pid: node)
    runner = ray_actor.NodeRunner(0)
    started = runner.start(
        [
            "bash",
            "-c",
            f'echo "out ${{{MARKER[0]}}}"; echo "sink=${{{ray_actor.OUTPUT_SINK_VAR}:-}}"; echo err >&2; exit 4',
        ],
        str(tmp_path),
    )
    assert started["error"] is None
    events = list(runner.stream())
    assert events == [{"code": 4}], "with a sink nothing is streamed, only the exit status comes back"
    # Appended after what was there, stderr merged, and the variable does not reach the command.
    assert sink.read_text() == f"before\nout {MARKER[1]}\nsink=\nerr\n"


def test_unusable_output_sink_falls_back_to_streaming(monkeypatch, tmp_path):
    node = {**os.environ, ray_actor.OUTPUT_SINK_VAR: str(tmp_path / "missing" / "log")}
    monkeypatch.delenv("RAY_RAYLET_PID", raising=False)
    monkeypatch.setattr(procfs, "environ", lambda pid: node)
    runner = ray_actor.NodeRunner(0)
    assert runner.start(["echo", "streamed"], str(tmp_path))["error"] is None
    events = list(runner.stream())
    assert events[-1]["code"] == 0
    assert b"".join(events[:-1]) == b"streamed\n", "a sink that cannot be opened must not lose the output"


def test_ready_file_with_a_failed_head_status_never_starts_the_command(cluster, tmp_path):
    ready = tmp_path / "head.rc"
    ready.write_text("1\n")
    rc, out, err = run(cluster, "touch", str(tmp_path / "ran"), opts=("--ready-file", str(ready)))
    assert (rc, out) == (75, b""), err
    assert "the Ray head did not start (status 1 in" in err
    assert not (tmp_path / "ran").exists()


def test_ready_file_written_later_lets_the_command_run(cluster, tmp_path):
    ready = tmp_path / "head.rc"
    proc = launch(cluster, "touch", str(tmp_path / "ran"), opts=("--ready-file", str(ready)))
    time.sleep(1.5)
    assert proc.poll() is None, "the driver must wait for the head's status"
    ready.write_text("0\n")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "ran").exists()


def test_the_first_actor_runs_in_the_worker_the_raylet_prestarted(cluster):
    # jobkit ray-start: the raylet starts a worker with itself (no job yet) and keeps it for the first actor.
    logs = Path(cluster["temp"], "session_latest", "logs")
    first = re.search(r"Started worker process with pid (\d+) worker_id=(\w+)", (logs / "raylet.out").read_text())
    assert first, "the raylet started no worker"
    pid, worker = first.groups()
    assert list(logs.glob(f"worker-{worker}-ffffffff-{pid}.out")), "the first worker was started for a job"
    rc, _out, err = run(cluster, "true")  # the first job (whichever test ran it) took that worker
    assert rc == 0, err
    wait_for(
        lambda: f"KillLocalActor RPC worker_id={worker}" in (logs / "raylet.out").read_text(),
        30,
        "an actor to have run in the prestarted worker",
    )


def test_node_registered_answers_from_the_real_gcs(cluster, monkeypatch):
    # What the driver polls before ray.init (instead of ray.init's 1 s sleeps): Ray's own GCS client, with the token.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", cluster["token"])
    from jobkit.observe.ray_driver import node_registered

    assert node_registered(cluster["address"]) is True
    assert node_registered(cluster["address"], host="192.0.2.1") is False  # the same GCS, no node on that host
    assert node_registered(f"127.0.0.1:{free_port()}") is None  # no GCS there: Ray's client cannot say


def _niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _program_pids(temp: str) -> dict[str, list[int]]:
    """The node's processes by a short name of what they run."""
    found: dict[str, list[int]] = {}
    for pid in lib(f"ray_node_pids {temp}").stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = (
            "gcs"
            if cmd[0].endswith(b"/gcs_server")
            else "raylet"
            if cmd[0].endswith(b"/raylet")
            else "dashboard"
            if len(cmd) > 1 and cmd[1].endswith(b"dashboard/dashboard.py")
            else "agent"
            if cmd[0].startswith(b"ray::DashboardAgent")
            else "other"
        )
        found.setdefault(name, []).append(int(pid))
    return found


def test_renice_services_spares_the_raylet_and_training(cluster, tmp_path):
    # Last in this module: the shared head's services stay reniced.
    pid_file = tmp_path / "child.pid"
    (tmp_path / "loop.py").write_text(LOOPER)
    proc = launch(cluster, sys.executable, str(tmp_path / "loop.py"), str(pid_file))
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the command to start"))
        renice = lib(f"ray_renice_services {cluster['temp']} 7")
        assert renice.returncode == 0, renice.stderr
        pids = _program_pids(cluster["temp"])
        for service in ("gcs", "dashboard", "agent"):
            assert pids.get(service), f"no {service} process found: {pids}"
            assert {_niceness(p) for p in pids[service]} == {7}, service
        assert [_niceness(p) for p in pids["raylet"]] == [0], "workers fork from the raylet: it keeps 0"
        assert _niceness(child) == 0, "training must keep its priority"
        # Workers forked after the renice (a new actor) still start at 0: their command too.
        rc, out, err = run(cluster, "bash", "-c", "cut -d' ' -f19 /proc/$$/stat")
        assert (rc, out) == (0, b"0\n"), err
        assert lib(f"ray_renice_services {cluster['temp']} x").returncode == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


@pytest.mark.parametrize("said", [b"", b"done\n"])
def test_watchdog_kills_the_group_only_when_its_pipe_closes_without_done(said):
    group = subprocess.Popen(["sleep", "60"], process_group=0)
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", ray_actor.WATCHDOG, str(group.pid)], stdin=subprocess.PIPE, process_group=0
        )
        assert watchdog.wait(timeout=10) == 0, "the starter exits at once, leaving the watcher detached"
        watchdog.stdin.write(said)
        watchdog.stdin.close()  # as when the actor dies (b"") or releases it after its command ended ("done")
        if said:
            time.sleep(1)
            assert group.poll() is None, "a released watchdog must leave the group alone"
        else:
            assert group.wait(timeout=10) == -signal.SIGKILL
    finally:
        group.kill()
        group.wait()


def _agent_http_port(temp: str) -> int:
    """The HTTP port of the node's dashboard agent (it serves the job-agent API): the raylet starts the agent
    with --listen-port=PORT, inside one word of its own command line."""
    for pid in procs_naming(temp):
        found = re.search(r"--listen-port=(\d+)", " ".join(procfs.cmdline(pid)))
        if found:
            return int(found.group(1))
    raise AssertionError("no --listen-port for the dashboard agent among the node's processes")


def test_without_the_token_no_job_is_submitted_and_no_driver_connects(cluster, tmp_path):
    """What any user of the node (or, for the agent, of the cluster network) tried in the security audit: a job
    POSTed to Ray's job API ran a shell command as the job's owner. With the job's token required, nothing runs."""
    canary = tmp_path / "ran_as_owner"
    body = json.dumps({"entrypoint": f"touch {canary}", "entrypoint_num_cpus": 0}).encode()
    for url in (
        f"http://127.0.0.1:{cluster['dashboard']}/api/jobs/",
        f"http://127.0.0.1:{_agent_http_port(cluster['temp'])}/api/job_agent/jobs/",
    ):
        request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code in (401, 403), url
    # A driver without the token (GCS, where actors are listed and killed, is behind the same check).
    no_token = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    probe = (
        "import ray, sys\n"
        f"try:\n    ray.init(address='{cluster['address']}', logging_level='ERROR')\n"
        "except Exception as exc:\n    sys.exit(f'refused: {type(exc).__name__}')\n"
        "print('connected', len(ray.nodes()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env=dict(no_token, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode != 0 and "connected" not in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert not canary.exists()
    # The same driver with the token connects: the refusal above is the token's doing.
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env=dict(with_token(cluster), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.stdout.startswith("connected 1"), proc.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_another_user_cannot_read_the_token(cluster):
    token = Path(cluster["token"])
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = subprocess.run([*as_nobody, "cat", str(token)], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "Permission denied" in proc.stderr and proc.stdout == ""


def _started_at(pid: int) -> float:
    """When process PID started, on the wall clock (its start in clock ticks since boot, /proc/PID/stat)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")


@pytest.mark.e2e
def test_dashboard_last_starts_niced_once_the_head_is_up_and_answers_http():
    """RAY_DASHBOARD_ORDER=last (the default): the raylet and its agents start right after the GCS, the dashboard only once
    the raylet has registered (both agents' port files written), at RAY_SERVICES_NICE; it still comes up."""
    temp = tempfile.mkdtemp(prefix="mxr-l", dir="/tmp")
    auth = tempfile.mkdtemp(prefix="mxr-a", dir="/tmp")
    token = f"{auth}/job/token"
    ports = [free_port() for _ in range(3)]
    env = dict(node_env(), RAY_AUTH_TOKEN_PATH=token, RAY_SERVICES_NICE="7")  # the default order
    try:
        assert lib(f"ray_make_token {token}").returncode == 0
        proc = lib(f"ray_start_head {temp} 127.0.0.1 {ports[0]} {ports[1]} {ports[2]}", env=env)
        assert proc.returncode == 0, proc.stderr
        session = Path(temp, "session_latest")
        rc = wait_for(lambda: Path(temp, "ray_start.rc").exists() and Path(temp, "ray_start.rc"), 150, "ray start")
        assert rc.read_text().strip() == "0", Path(temp, "ray_start.err").read_text()
        # The dashboard started after both agents had written their port files.
        ports_written = max(p.stat().st_mtime for p in session.glob("*_agent_port_*"))
        assert len(list(session.glob("*_agent_port_*"))) >= 2, sorted(p.name for p in session.iterdir())
        dashboard = _program_pids(temp)["dashboard"][0]
        assert _started_at(dashboard) > ports_written
        assert _niceness(dashboard) >= 7  # (niced at its spawn: test_ray_start.py; reniced once `ray start` ended)
        # Its HTTP server answers (with the job's token required, a refusal is an answer too).
        url = f"http://127.0.0.1:{ports[1]}/api/gcs_healthz"
        try:
            status = urllib.request.urlopen(url, timeout=30).status
        except urllib.error.HTTPError as refused:
            status = refused.code
        assert status in (200, 401, 403), status
    finally:
        stop = lib(f"ray_stop_node {temp}", timeout=60)
        subprocess.run(["rm", "-rf", temp, auth], check=False)
    assert stop.returncode == 0, stop.stderr
