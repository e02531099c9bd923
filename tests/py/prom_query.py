"""Talking to a real Prometheus from tests: the HTTP API, `prometheus.sh view` in the background, waiting."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from jobkit.core import procfs

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "utils" / "prometheus.sh"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port, path, **params):
    url = f"http://127.0.0.1:{port}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid):
    """True while PID runs; a zombie counts as gone."""
    return procfs.alive(pid)


class View:
    """`prometheus.sh view` in the background; stop() sends TERM to it by PID (it stops its child)."""

    def __init__(self, target, port, env=None):
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(SCRIPT), "view", str(target), "-p", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.header = []
        for line in self.proc.stdout:
            self.header.append(line)
            if line.startswith("Ctrl-C"):
                break
        else:
            raise AssertionError(f"view ended early: {''.join(self.header)}{self.proc.stderr.read()}")
        url = next(line.split()[-1] for line in self.header if "URL:" in line)
        self.port = int(url.rsplit(":", 1)[1])
        wait_for(lambda: api(self.port, "/api/v1/query", query="1") is not None, 10, "view ready")
        print(f"view startup: {time.monotonic() - t0:.2f}s")

    def query(self, promql, at=None):
        params = {"query": promql}
        if at is not None:
            params["time"] = at
        return api(self.port, "/api/v1/query", **params)["result"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=20)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
