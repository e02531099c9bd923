"""utils/prometheus.sh against a real Prometheus (installed by the script itself in a session fixture).

A tiny stdlib HTTP server plays the exporter: it serves a fixed exposition text and is listed as a file_sd
target. Every process a test starts is stopped by its PID.
"""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prom_query import View, api, free_port, pid_alive, wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "utils" / "prometheus.sh"
METRIC = "prom_test_widget_total"
EXPOSITION = f'# HELP {METRIC} A fixed test value.\n# TYPE {METRIC} counter\n{METRIC}{{kind="fixed"}} 42\n'


def sh(*args, env=None, timeout=60, check=True):
    proc = subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"prometheus.sh {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def prometheus_bin():
    t0 = time.monotonic()
    proc = sh("install", timeout=300)
    print(f"install: {time.monotonic() - t0:.1f}s: {proc.stdout.strip()}")
    assert "prometheus" in proc.stdout
    return proc.stdout.split()[0]


@pytest.fixture
def exporter():
    """Serves EXPOSITION on 127.0.0.1:<random port>; yields the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = EXPOSITION.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("JOB_WORKSPACE", str(ws))
    return ws


@pytest.fixture
def job(workspace, exporter, prometheus_bin):
    """A job dir whose file_sd target file lists the exporter; stops its Prometheus by PID afterwards."""
    job_dir = workspace / "local_20261122_101010_ab12-JAX-tiny"
    targets = job_dir / "prometheus" / "targets"
    targets.mkdir(parents=True)
    (targets / "exporter.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{exporter}"], "labels": {"job": "exporter"}}])
    )
    yield job_dir
    pidfile = job_dir / "prometheus" / "prometheus.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def start(job_dir, port):
    t0 = time.monotonic()
    proc = sh("start", job_dir, "--port", port, "--scrape-interval", "1")
    print(f"start-to-ready: {time.monotonic() - t0:.2f}s")
    return int(proc.stdout.strip()), proc.stderr, int((job_dir / "prometheus" / "prometheus.pid").read_text())


def wait_samples(port, n):
    """Waits until the scraped metric has n samples; returns their timestamps."""

    def enough():
        res = api(port, "/api/v1/query", query=f"{METRIC}[5m]")["result"]
        return res and len(res[0]["values"]) >= n and [float(t) for t, _ in res[0]["values"]]

    return wait_for(enough, 30, f"{n} samples of {METRIC}")


def test_start_scrape_stop_then_view(job):
    port, err, pid = start(job, free_port())
    assert f"[Prometheus] Started on port {port}" in err
    assert (job / "prometheus" / "prometheus.log").stat().st_size > 0
    t_start = time.time()
    wait_samples(port, 3)
    t_end = time.time()
    stop = sh("stop", job)
    assert not pid_alive(pid), stop.stderr
    assert not (job / "prometheus" / "prometheus.pid").exists()

    view = View(job.name[:12], free_port())  # a job id prefix, resolved in $JOB_WORKSPACE
    try:
        assert str(job / "prometheus") in "".join(view.header)
        assert any(f"ssh -L {view.port}:127.0.0.1:{view.port}" in line for line in view.header)
        data = api(view.port, "/api/v1/query_range", query=METRIC, start=t_start - 10, end=t_end, step=1)
        values = {v for series in data["result"] for _, v in series["values"]}
        assert data["result"] and values == {"42"}, data
        assert data["result"][0]["metric"]["kind"] == "fixed"
    finally:
        rc, err = view.stop()
    assert rc == 0, err
    child = int(re.search(r"\[Prometheus\] Stopped \(pid (\d+)\)", err).group(1))
    assert not pid_alive(child), err


def test_occupied_port_moves_to_next(job):
    base = 9190
    blocker = socket.socket()
    try:
        blocker.bind(("127.0.0.1", base))
        blocker.listen()
    except OSError:
        blocker.close()
        blocker = None  # already occupied by something else: the script must move on all the same
    try:
        port, err, pid = start(job, base)
        assert port > base
        assert f"[Prometheus] WARNING: port {base} was occupied; using {port} instead" in err
        assert pid_alive(pid)
    finally:
        sh("stop", job)
        if blocker:
            blocker.close()


def test_kill9_keeps_data_and_list(job, workspace):
    port, _, pid = start(job, free_port())
    t_start = time.time()
    wait_samples(port, 4)
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    wait_for(lambda: not pid_alive(pid), 10, "killed prometheus to exit")

    listed = sh("list", workspace).stdout
    line = next(line for line in listed.splitlines() if line.startswith(job.name))
    assert " .. " in line and "running" not in line, listed

    view = View(job, free_port())  # a job dir path
    try:
        data = api(
            view.port, "/api/v1/query_range", query=f"timestamp({METRIC})", start=t_start - 10, end=t_kill + 5, step=1
        )
        newest = max(float(v) for series in data["result"] for _, v in series["values"])
        assert newest >= t_kill - 2.5, (newest, t_kill)  # at most ~one 1 s scrape interval lost
    finally:
        rc, err = view.stop()
    assert rc == 0, err
    stop = sh("stop", job)  # the stale PID file is cleaned up, nothing is signalled
    assert "not running" in stop.stderr
    assert not (job / "prometheus" / "prometheus.pid").exists()


def test_view_refuses_non_tsdb(tmp_path, prometheus_bin):
    plain = tmp_path / "not-a-tsdb"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello\n")
    proc = sh("view", plain, "-p", free_port(), check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prometheus.sh: ") and "not a Prometheus TSDB" in lines[0]
    assert sorted(p.name for p in plain.iterdir()) == ["notes.txt"]


def test_help_and_sourcing():
    assert sh("--help").stdout.startswith("Usage: prometheus.sh install")
    out = subprocess.run(
        ["bash", "-c", f'source {SCRIPT}; echo "$-"; declare -F prometheus_view'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "e" not in out.splitlines()[0] and "prometheus_view" in out
