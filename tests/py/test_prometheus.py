"""utils/prometheus.sh (install, list, view) and utils/lib/prometheus.sh (the job's Prometheus: start, stop)
against a real Prometheus (installed by the script itself in a session fixture).

A tiny stdlib HTTP server plays the exporter: it serves a fixed exposition text and is listed as a file_sd
target. Every process a test starts is stopped by its PID.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prom_query import View, api, free_port, pid_alive, wait_for

from jobkit.core.errors import EXIT_ANSWER_NO

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "utils" / "prometheus.sh"
LIB = REPO / "utils" / "lib" / "prometheus.sh"
METRIC = "prom_test_widget_total"
EXPOSITION = f'# HELP {METRIC} A fixed test value.\n# TYPE {METRIC} counter\n{METRIC}{{kind="fixed"}} 42\n'


def sh(*args, env=None, timeout=60, check=True):
    proc = subprocess.run(
        [str(SCRIPT), *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"prometheus.sh {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def lib(function, *args, timeout=60, check=True):
    """One function of utils/lib/prometheus.sh, sourced into a fresh bash."""
    proc = subprocess.run(
        ["bash", "-c", f'source {LIB} && "$@"', "lib", function, *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{function} {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
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
    proc = lib("prometheus_start", job_dir, "--port", port, "--scrape-interval", "1")
    print(f"start-to-ready: {time.monotonic() - t0:.2f}s")
    return (
        int(proc.stdout.strip()),
        proc.stderr,
        int((job_dir / "prometheus" / "prometheus.pid").read_text()),
    )


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
    stop = lib("prometheus_stop", job)
    assert not pid_alive(pid), stop.stderr
    assert not (job / "prometheus" / "prometheus.pid").exists()

    view = View(job.name[:12], free_port())  # a job id prefix, resolved in $JOB_WORKSPACE
    try:
        assert str(job / "prometheus") in "".join(view.header)
        assert any(f"ssh -N -L {view.port}:127.0.0.1:{view.port}" in line for line in view.header)
        data = api(
            view.port,
            "/api/v1/query_range",
            query=METRIC,
            start=t_start - 10,
            end=t_end,
            step=1,
        )
        values = {v for series in data["result"] for _, v in series["values"]}
        assert data["result"] and values == {"42"}, data
        assert data["result"][0]["metric"]["kind"] == "fixed"
    finally:
        rc, err = view.stop()
    assert rc == 0, err
    child = int(re.search(r"\[Prometheus\] Stopped \(pid (\d+)\)", err).group(1))
    assert not pid_alive(child), err


def test_view_refuses_a_running_jobs_prometheus_and_stops_an_ended_jobs_orphan(job):
    """A job's teardown cut short by Slurm's KillWait leaves its Prometheus running after the JOB SUMMARY: view
    stops that orphan (nothing else will) and serves the TSDB. A job still running keeps its Prometheus."""
    port, _, pid = start(job, free_port())
    log = job.parent / f"{job.name}.log"
    log.write_text("NNODES=1\n")
    refused = sh("view", job, "-p", free_port(), check=False)
    assert refused.returncode == 1 and f"the job's own Prometheus (pid {pid}) still serves" in refused.stderr
    assert pid_alive(pid)
    log.write_text("NNODES=1\n==== JOB SUMMARY ====\n  Status: CANCELLED (exit 143)\n=====================\n")
    view = View(job, free_port())
    try:
        assert not pid_alive(pid)
        assert (
            f"the job has ended but its Prometheus (pid {pid}) outlived it: stopping it" in view.proc.stderr.readline()
        )
    finally:
        rc, err = view.stop()
    assert rc == 0, err


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
        lib("prometheus_stop", job)
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
            view.port,
            "/api/v1/query_range",
            query=f"timestamp({METRIC})",
            start=t_start - 10,
            end=t_kill + 5,
            step=1,
        )
        newest = max(float(v) for series in data["result"] for _, v in series["values"])
        assert newest >= t_kill - 2.5, (
            newest,
            t_kill,
        )  # at most ~one 1 s scrape interval lost
    finally:
        rc, err = view.stop()
    assert rc == 0, err
    stop = lib("prometheus_stop", job)  # the stale PID file is cleaned up, nothing is signalled
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


def test_help_and_the_library_sources_cleanly():
    help_text = sh("--help").stdout
    assert help_text.startswith("Usage: prometheus.sh install") and "Summary: " in help_text
    assert "start" not in help_text.split("Summary:")[0]  # the job's Prometheus is the library's, not a command
    assert (
        sh("start", "x", check=False).stderr == "prometheus.sh: unknown command 'start'; run 'prometheus.sh --help'\n"
    )
    for sourced in (LIB,):  # the command is only a command; its functions live in the library
        out = subprocess.run(
            [
                "bash",
                "-c",
                f'source {sourced}; echo "$-"; declare -F | grep -c " prometheus_"',
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert "e" not in out[0] and int(out[1]) >= 6, out


def tree(root):
    """{relative path: bytes or 'dir'} of everything under root."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        out[str(path.relative_to(root))] = "dir" if path.is_dir() else path.read_bytes()
    return out


@pytest.fixture
def stopped_tsdb(job):
    """A job's TSDB written by a real Prometheus (a few scrapes in its WAL), that Prometheus stopped."""
    port, _, _ = start(job, free_port())
    wait_samples(port, 3)
    lib("prometheus_stop", job)
    return job / "prometheus"


def test_view_refuses_a_damaged_wal_and_changes_nothing(stopped_tsdb):
    segment = stopped_tsdb / "wal" / "00000000"
    data = bytearray(segment.read_bytes())
    assert len(data) > 100 and data[0] & 7 in (
        1,
        2,
    )  # a record fragment first: header, then data
    data[40] ^= 0xFF  # inside the first fragment's data: its CRC no longer matches
    segment.write_bytes(bytes(data))
    before = tree(stopped_tsdb)

    proc = sh("view", stopped_tsdb, "-p", free_port(), check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"jobkit tsdb view: the WAL of {stopped_tsdb} is damaged at wal/00000000 byte 0 (CRC")
    assert f"cp -a {stopped_tsdb} /tmp/tsdb-copy && utils/prometheus.sh view /tmp/tsdb-copy" in line
    assert tree(stopped_tsdb) == before  # refused before Prometheus could repair (truncate) it


def test_a_failed_view_start_leaves_the_tsdb_as_it_was(stopped_tsdb):
    # Prometheus creates its lock, queries.active, chunks_head/ ... and then fails on a head chunk dir it cannot
    # open: here a plain file where chunks_head/ belongs.
    shutil.rmtree(stopped_tsdb / "chunks_head", ignore_errors=True)
    (stopped_tsdb / "chunks_head").write_text("not a dir\n")
    before = tree(stopped_tsdb)
    proc = sh("view", stopped_tsdb, "-p", free_port(), check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"jobkit tsdb view: Prometheus exited at start-up on {stopped_tsdb}: "), line
    assert "chunks_head" in line, line  # Prometheus's own words
    assert tree(stopped_tsdb) == before


def test_view_moves_past_a_taken_port(stopped_tsdb):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    try:
        view = View(stopped_tsdb, taken)
        try:
            assert view.port != taken
            assert view.query(f"count_over_time({METRIC}[1h])", time.time())[0]["value"][1] != "0"
        finally:
            rc, err = view.stop()
    finally:
        blocker.close()
    assert rc == 0 and f"[Prometheus] WARNING: port {taken} was occupied; using {view.port} instead" in err, err


def test_the_backfills_admin_api_refuses_requests_without_its_password(stopped_tsdb, prometheus_bin):
    """Loopback is shared by every user of the node: the throwaway Prometheus that the backfill starts with the
    admin API (which deletes series) answers only the random password it was started with."""
    import base64
    import urllib.error
    import urllib.request

    from jobkit.observe import promserver

    server = promserver.start(str(stopped_tsdb), str(prometheus_bin), admin_api=True)
    try:
        assert server.auth and server.auth.startswith("Basic ")
        for path, method in (("/api/v1/admin/tsdb/delete_series?match[]=up", "POST"), ("/api/v1/status/flags", "GET")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(server.url + path, method=method), timeout=10)
            assert refused.value.code == 401, path
        with urllib.request.urlopen(server.request("/api/v1/status/flags"), timeout=10) as resp:
            flags = json.loads(resp.read())["data"]
        assert flags["web.enable-admin-api"] == "true"
        web_config = Path(flags["web.config.file"])
        assert web_config.stat().st_mode & 0o077 == 0 and web_config.parent.stat().st_mode & 0o077 == 0
        password = base64.b64decode(server.auth.split()[1]).decode().split(":", 1)[1]
        assert password not in web_config.read_text()  # only its bcrypt hash is on disk
    finally:
        server.stop()
    assert not web_config.exists()


def test_analyzes_private_prometheus_answers_only_its_password_and_has_no_admin_api(stopped_tsdb, prometheus_bin):
    """`jobkit analyze` queries a throwaway Prometheus over a view of a job's TSDB (private=True): another user
    of the node may not read the job's metrics through it, and it has no admin API at all."""
    import urllib.error
    import urllib.request

    from jobkit.observe import promserver

    server = promserver.start(str(stopped_tsdb), str(prometheus_bin), private=True)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/api/v1/query?query=up", timeout=10)
        assert refused.value.code == 401
        with urllib.request.urlopen(server.request("/api/v1/status/flags"), timeout=10) as resp:
            flags = json.loads(resp.read())["data"]
        assert flags["web.enable-admin-api"] == "false" and flags["web.config.file"]
        web_config = Path(flags["web.config.file"])
    finally:
        server.stop()
    assert not web_config.exists()


def test_analyzes_prometheus_replays_a_real_wal_through_its_view_and_leaves_every_byte(stopped_tsdb, prometheus_bin):
    """jobkit.analysis.tsdb_query starts Prometheus over a view of links to a TSDB whose WAL a real Prometheus
    wrote (a new WAL segment, chunks_head/ and its shutdown land in the view): every file and dir of the TSDB
    is as it was, byte for byte, and no Prometheus or scratch dir is left. Its WAL holds no resource gauge, so
    the read ends in QueryError (analyze then dumps it), after Prometheus replayed the WAL and answered."""
    import hashlib
    import tempfile

    from jobkit.analysis import tsdb_query

    def state(root):
        out = {"": root.stat().st_mtime_ns}
        for p in sorted(root.rglob("*")):
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[str(p.relative_to(root))] = (digest, st.st_size, st.st_mtime_ns, st.st_mode)
        return out

    def scratch():
        tmp = Path(tempfile.gettempdir())
        return {p.name for p in tmp.iterdir() if p.name.startswith(("jobkit-promql-", "promserver."))}

    assert any((stopped_tsdb / "wal").iterdir())
    before, left = state(stopped_tsdb), scratch()
    with pytest.raises(tsdb_query.QueryError, match="no host series sampled twice"):
        tsdb_query.read(str(stopped_tsdb), str(prometheus_bin))
    assert state(stopped_tsdb) == before
    assert scratch() <= left


# ---- bad input to list and view, on TSDB dirs made by hand (no Prometheus runs)

META = '{"ulid": "%s", "minTime": 1795000000000, "maxTime": 1795000600000, "version": 1}'


def _block(tsdb: Path, ulid: str, text: bytes) -> None:
    (tsdb / ulid).mkdir(parents=True)
    (tsdb / ulid / "meta.json").write_bytes(text)


def _as_plain_root(*args, env=None):
    """prometheus.sh as root with no capabilities: a mode-000 dir is then as closed to it as to any user."""
    return subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_a_file_given_as_the_workspace_or_the_job_is_called_a_file(workspace):
    log = workspace / "781-x.log"
    log.write_text("a log\n")
    listed = sh("list", log, check=False)
    assert listed.returncode == 1
    assert listed.stderr == (
        f"prometheus.sh: list: workspace {log} is a file, not a directory; pass the directory that holds the job "
        "dirs or set JOB_WORKSPACE\n"
    )
    viewed = sh("view", log, check=False)
    assert viewed.returncode == 1
    assert viewed.stderr == (
        f"prometheus.sh: view: {log} is a file, not a directory; pass a job dir, its prometheus/ dir, or a job id\n"
    )


def test_list_says_damaged_for_a_damaged_meta_json_without_a_bash_warning(workspace):
    ulid = "01JD2X3Y4Z5A6B7C8D9E0F1G2H"
    _block(workspace / "777-ok" / "prometheus", ulid, (META % ulid).encode())
    _block(workspace / "778-nul" / "prometheus", ulid, b"\x00\x01garbage\x00" * 4)
    _block(workspace / "779-cut" / "prometheus", ulid, b'{"ulid": "x", "minTi')
    proc = sh("list")
    assert proc.stderr == "", "no bash warning (ignored null byte) and nothing else"
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert lines["777-ok"].endswith(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(1795000600))}")
    assert lines["778-nul"].endswith("damaged: 1 block meta.json cannot be read")
    assert lines["779-cut"].endswith("damaged: 1 block meta.json cannot be read")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_an_unreadable_tsdb_is_listed_as_such_and_view_says_permission_denied(workspace):
    ulid = "01JD2X3Y4Z5A6B7C8D9E0F1G2H"
    tsdb = workspace / "781-closed" / "prometheus"
    _block(tsdb, ulid, (META % ulid).encode())
    tsdb.chmod(0)
    try:
        listed = _as_plain_root("list")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout == f"781-closed  ?  cannot read {tsdb}: permission denied\n"
        viewed = _as_plain_root("view", "781")
        assert viewed.returncode == 1
        assert viewed.stderr == (
            f"prometheus.sh: view: cannot read {tsdb}: permission denied; ask its owner, or view it as a user who "
            "may read it\n"
        )
    finally:
        tsdb.chmod(0o755)


def test_view_names_a_damaged_block_with_its_fix_and_still_serves_the_rest(stopped_tsdb):
    """pr10: a block whose meta.json is random bytes is skipped by Prometheus; view said only "prometheus reports
    a problem" and "data: no data yet". It names the block and the fix before it starts, and what the WAL holds
    is still served."""
    ulid = "01JD2X3Y4Z5A6B7C8D9E0F1G2H"
    _block(stopped_tsdb, ulid, bytes(range(256)) * 2)
    view = View(stopped_tsdb, free_port())
    try:
        assert view.query(f"count_over_time({METRIC}[1h])", time.time())[0]["value"][1] != "0"
    finally:
        rc, err = view.stop()
    (data,) = [line for line in view.header if "data:" in line]
    assert "(and 1 damaged block(s)" in data and "no data" not in data, data
    assert rc == 0, err
    warning = f"[Prometheus] WARNING: block {ulid} of {stopped_tsdb} is damaged (meta.json is not JSON): "
    assert err.count(warning) == 1, err
    assert "prometheus reports a problem" not in err  # Prometheus's own line about it is not repeated


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no meta.json"),
        (b"", "meta.json is empty"),
        (b"\x00\x01garbage\x00", "meta.json is not JSON"),
        (b'{"ulid": "x", "minTime": 1, "maxTi', "meta.json is not JSON"),
        (b"[1, 2]", "meta.json is not a JSON object"),
        (b'{"minTime": 1.5, "maxTime": 2, "version": 1}', "meta.json has no whole-number minTime"),
        (b'{"minTime": 1, "maxTime": 2, "version": 2}', "meta.json has version 2, not 1"),
        (b'{"minTime": 1000, "maxTime": 2000, "version": 1}', None),
    ],
    ids=["missing", "empty", "nul", "cut", "list", "float", "version", "ok"],
)
def test_one_check_says_which_blocks_prometheus_would_skip(workspace, text, why):
    """`jobkit tsdb blocks` is what list's range text, view and `jobkit analyze` ask (jobkit.observe.tsdb_blocks):
    a ULID-named dir whose meta.json Prometheus cannot use is damaged; other dirs are not blocks."""
    ulid = "01JD2X3Y4Z5A6B7C8D9E0F1G2H"
    tsdb = workspace / "777-x" / "prometheus"
    (tsdb / "wal").mkdir(parents=True)
    (tsdb / "not-a-block").mkdir()
    (tsdb / ulid).mkdir()
    if text is not None:
        (tsdb / ulid / "meta.json").write_bytes(text)
    proc = subprocess.run(["jobkit", "tsdb", "blocks", str(tsdb)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == (f"{ulid} damaged {why}\n" if why else f"{ulid} ok 1000 2000\n")
    listed = sh("list").stdout
    assert listed.endswith("damaged: 1 block meta.json cannot be read\n" if why else "\n"), listed


def test_list_names_a_ray_job_without_a_tsdb_and_why(workspace):
    ulid = "01JD2X3Y4Z5A6B7C8D9E0F1G2H"
    _block(workspace / "790-with" / "prometheus", ulid, (META % ulid).encode())
    (workspace / "790-with.log").write_text("JOB_ID=790\nNNODES=1\nRAY=1\n")
    (workspace / "791-off.log").write_text(
        "JOB_ID=791\nNNODES=2\nRAY=1\n0: [observability] metrics are off: prometheus.sh: apt-get install "
        "prometheus failed (training goes on)\n==== JOB SUMMARY ====\n  Status: SUCCESS (exit 0)\n====\n"
    )
    (workspace / "791-off" / "prometheus" / "targets").mkdir(parents=True)  # the exporter's, no TSDB
    (workspace / "792-noray.log").write_text(
        "JOB_ID=792\nNNODES=1\n==== JOB SUMMARY ====\n  Status: SUCCESS (exit 0)\n"
    )
    proc = sh("list")
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert set(lines) == {"790-with", "791-off"}, proc.stdout
    assert lines["791-off"] == "791-off  off  no TSDB: prometheus.sh: apt-get install prometheus failed"
    assert proc.stderr == ""


def test_list_of_a_workspace_whose_only_ray_job_has_no_tsdb_says_so_with_the_reason(workspace):
    (workspace / "793-off.log").write_text(
        "JOB_ID=793\nNNODES=1\nRAY=1\n[observability] no cluster-private address (no route): training without "
        "observability\n==== JOB SUMMARY ====\n  Status: FAILED (exit 1)\n====\n"
    )
    proc = sh("list")
    assert proc.stdout == (
        "793-off  off  no TSDB: no cluster-private address (no route): training without observability\n"
    )
    assert "no job with a Prometheus TSDB" in proc.stderr


def await_scrape(port, after, timeout):
    jobkit = REPO / ".venv" / "bin" / "jobkit"
    args = ["tsdb", "await-scrape", "--port", str(port), "--after", repr(after), "--timeout", str(timeout)]
    return subprocess.run([str(jobkit), *args], capture_output=True, text=True, timeout=120)


def test_await_scrape_returns_once_every_target_was_scraped_after_the_given_time(job, exporter):
    from jobkit.observe import final_scrape

    port, _err, _pid = start(job, free_port())
    url = f"http://127.0.0.1:{exporter}/metrics"
    wait_for(lambda: url in [t["scrapeUrl"] for t in final_scrape.active_targets(port)], 30, "the file_sd target")
    after = time.time()
    done = await_scrape(port, after, 60)
    assert done.returncode == 0, done.stderr
    # What the job's teardown waits for: each target (the exporter, Prometheus itself) scraped after training ended.
    targets = final_scrape.active_targets(port)
    assert url in [t["scrapeUrl"] for t in targets]
    assert all(t["lastScrape"] > after for t in targets), targets

    # A moment no scrape can follow within the timeout: one line naming the target, and the answer is no.
    late = await_scrape(port, time.time() + 3600, 0.3)
    assert late.returncode == EXIT_ANSWER_NO
    assert "no scrape after training ended within 0.3 s: " in late.stderr
    assert url in late.stderr
    lib("prometheus_stop", job)
    gone = await_scrape(port, after, 5)
    assert gone.returncode == EXIT_ANSWER_NO and f"the Prometheus on 127.0.0.1:{port} did not answer" in gone.stderr


def test_prometheus_times_parse_to_epoch_seconds():
    from jobkit.observe.final_scrape import parse_time

    assert parse_time("0001-01-01T00:00:00Z") == 0.0
    assert parse_time("2026-11-26T11:22:32.123456789Z") == pytest.approx(1795692152.123456)
    assert parse_time("2026-11-26T12:22:32.5+01:00") == pytest.approx(1795692152.5)
    assert parse_time("2026-11-26T11:22:32Z") == 1795692152.0
