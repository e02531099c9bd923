"""jobkit dashboard, and the headless-Chromium harness (browser.py) its page is checked with."""

import datetime as dt
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser import BrowserError, artifact_path, load, open_tab
from click.testing import CliRunner
from conftest import FIXTURES, JOBKIT_LOGS, NEEDS_ROOT, jobkit_without_root_powers
from test_hang_cause import real_two_node_job
from test_hang_metrics import SPIN, hang_job, needs_promtool
from test_jobs_why import EXPECTED, SOME, corpus_workspace, why_json, whys_word

from jobkit.analysis import dashboard, dashboard_serve
from jobkit.analysis.dashboard import COLUMNS
from jobkit.cli import main
from jobkit.core import failures

# ---------------------------------------------------------------------------------------------------------
# The harness itself: it must catch a broken page, or a clean result from it means nothing.


@pytest.mark.e2e  # headless Chromium (browser.py)
def test_browser_reports_uncaught_errors_console_errors_and_network(tmp_path, request):
    page_file = tmp_path / "bad.html"
    page_file.write_text(
        "<html><body><p id=p>bad</p>"
        '<script>throw new Error("boom")</script>'
        '<script>console.error("oops")</script>'
        '<img src="https://cdn.example.com/x.png">'
        '<script>setTimeout(() => { throw new Error("late boom") }, 10)</script>'
        "</body></html>"
    )
    page = load(page_file, artifact_path(request))
    assert any("Error: boom" in e for e in page.errors), page.errors
    assert any("late boom" in e for e in page.errors), page.errors
    assert any("console.error: oops" in e for e in page.errors), page.errors
    # Only loopback is reachable: the CDN image is asked for and fails.
    assert "https://cdn.example.com/x.png" in page.requests
    assert any("cdn.example.com" in e for e in page.errors), page.errors
    assert page.screenshot.stat().st_size > 1000 and page.screenshot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e  # headless Chromium (browser.py)
def test_browser_dom_after_scripts_and_driving(tmp_path, request):
    page_file = tmp_path / "ok.html"
    page_file.write_text(
        "<html><body><input id=f><table id=t><tr><th>n</th></tr>"
        '<tr data-k="a"><td>alpha</td><td>1</td></tr><tr data-k="b"><td>beta</td><td>2</td></tr></table>'
        "<button id=b>add</button><script>"
        "document.getElementById('b').onclick = () => document.body.insertAdjacentHTML('beforeend', '<p class=added>x</p>');"
        "document.getElementById('f').oninput = e => document.querySelectorAll('tr[data-k]').forEach("
        "  r => r.style.display = r.textContent.includes(e.target.value) ? '' : 'none');"
        "console.log('ready');</script></body></html>"
    )
    page = load(page_file)
    assert page.errors == [] and "log: ready" in page.console
    assert page.rows("t") == [["alpha", "1"], ["beta", "2"]]
    assert page.count("tr", data_k=None) == 2 and page.count("tr", data_k="b") == 1
    with open_tab(page_file) as tab:
        tab.click("#b")
        tab.click("#b")
        tab.type("#f", "bet")
        assert [r["data-k"] for r in tab.visible("tr[data-k]")] == ["b"]
        page = tab.snapshot(artifact_path(request))
        with pytest.raises(BrowserError, match="no element"):
            tab.click("#missing")
    assert page.count("p", "added") == 2 and page.errors == []
    assert artifact_path(request).exists()


# ---------------------------------------------------------------------------------------------------------
# jobkit dashboard on a workspace of real job logs

SUMMARY = "==== JOB SUMMARY ====\n  Job:    {id}\n  Wall:   {wall}\n  Status: {status}\n=====================\n"
# (log name, recorded log, wall, JOB SUMMARY status, model). The recorded runs are all configs/tiny.yml; the
# header (hand-written in the fixtures too) names a second model for two of them, so the history has two.
JOBS = [
    ("local_20261122_054800_ab12-JAX-tiny.log", JOBKIT_LOGS / "launch-tiny-20steps-mfu.log", "15s", "SUCCESS (exit 0)", "tiny"),
    ("31-JAX-tiny-pre1.log", FIXTURES / "joblog" / "preempted-2node-sigterm.log", "29s", "STOPPED (exit 0)", "tiny"),
    ("local_20261122_055000_ef56-JAX-tiny-no_such_key_1.log", JOBKIT_LOGS / "launch-config-error-no_such_key.log", "9s", "FAILED (exit 1)", "tiny"),
    ("local_20261123_101500_0a0b-JAX-llama2-7b-tgs21989.log", JOBKIT_LOGS / "maxtext-profiler-xplane-s5-p3.log", "20s", "SUCCESS (exit 0)", "llama2-7b"),
    ("local_20261123_120000_3e4f-JAX-llama2-7b.log", JOBKIT_LOGS / "maxtext-rank0-deadline-exceeded.log", "30s", "FAILED (exit 134)", "llama2-7b"),
]  # fmt: skip
IDS = [name.split("-")[0] for name, *_ in JOBS]


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, source, wall, status, model in JOBS:
        job_id = name.split("-")[0]
        text = re.sub(r"^JOB_ID=.*$", f"JOB_ID={job_id}", source.read_text(), count=1, flags=re.M)
        text = re.sub(r"^MODEL_NAME=.*$", f"MODEL_NAME={model}", text, count=1, flags=re.M)
        path = ws / name
        path.write_text(text + SUMMARY.format(id=job_id, wall=wall, status=status))
        # mtime = the end of the run: a minute after a local id's start; the Slurm job (its id has no date) at noon.
        m = re.match(r"local_(\d{8}_\d{6})", job_id)
        start = dt.datetime.strptime(m.group(1) if m else "20261122_120000", "%Y%m%d_%H%M%S").timestamp()
        os.utime(path, (start + 60, start + 60))
    (ws / "notes.log").write_text("not a job\n")
    return ws


def add_analysis(ws, stem, doc, report=True):
    d = ws / stem / "analysis"
    d.mkdir(parents=True)
    (d / "analysis.json").write_text(json.dumps(doc))
    if report:
        (d / "report.html").write_text(f"<html><body><h1 id=report>{stem}</h1></body></html>")


def run(*args):
    return CliRunner().invoke(main, ["dashboard", *args])


def by_id(page):
    rows = page.find_all("tr", data_job_id=None)
    cells = {r.attrs["data-job-id"]: [td.all_text() for td in r.children if td.tag == "td"] for r in rows}
    return {k: dict(zip([c[0] for c in COLUMNS], v, strict=True)) for k, v in cells.items()}


@pytest.mark.e2e  # headless Chromium (browser.py)
def test_page_in_chromium_rows_plot_links_no_errors(workspace, request):
    stem = JOBS[0][0].removesuffix(".log")
    # analysis.json's numbers win over the log's, a null section is tolerated, and the report is linked.
    add_analysis(
        workspace, stem, {"throughput": {"tgs": {"mean": 12345.0}, "mfu_pct": {"mean": 12.5}}, "failure": None}
    )
    add_analysis(workspace, JOBS[2][0].removesuffix(".log"), {"throughput": None}, report=False)
    result = run("--workspace", str(workspace))
    assert result.exit_code == 0, result.output
    page_file = workspace / ".dashboard" / "index.html"
    assert result.output.strip() == f"5 jobs: {page_file}"
    # Nothing else is written in the workspace.
    assert sorted(p.name for p in workspace.iterdir()) == sorted(
        [*(n for n, *_ in JOBS), "notes.log", ".dashboard", stem, JOBS[2][0][:-4]]
    )
    assert [p.name for p in (workspace / ".dashboard").iterdir()] == ["index.html"]

    page = load(page_file, artifact_path(request))
    assert page.errors == []
    assert all(u.startswith("file://") for u in page.requests), page.requests  # self-contained: no CDN
    rows = by_id(page)
    assert list(rows) == [IDS[4], IDS[3], IDS[1], IDS[2], IDS[0]]  # newest first
    assert rows[IDS[1]]["date"] == "2026-11-22 12:01"  # a Slurm id: the log's mtime
    assert [(rows[i]["model"], rows[i]["status"], rows[i]["failure"]) for i in IDS] == [
        ("tiny", "SUCCESS", "-"),
        ("tiny", "STOPPED", "-"),
        ("tiny", "FAILED", "config-error"),
        ("llama2-7b", "SUCCESS", "-"),
        ("llama2-7b", "FAILED", "distributed-timeout"),
    ]
    assert rows[IDS[0]]["tgs"] == "12,345" and rows[IDS[0]]["mfu"] == "12.5%"  # from analysis.json
    assert rows[IDS[0]]["date"] == "2026-11-22 05:48" and rows[IDS[0]]["report"] == "report"
    assert rows[IDS[3]]["tag"] == "tgs21989" and rows[IDS[3]]["tgs"] == "21,989"  # jobkit jobs' number
    assert rows[IDS[1]]["nodes"] == "2" and rows[IDS[1]]["tgs"] == "4,882"
    assert rows[IDS[2]]["report"] == f"no report — jobkit analyze {IDS[2]}"
    links = [a.attrs["href"] for a in page.find_all("a", "report")]
    assert links == [f"../{stem}/analysis/report.html"]
    assert (page_file.parent / links[0]).resolve() == (workspace / stem / "analysis" / "report.html").resolve()
    # The TGS history: one series per model, drawn (an svg with lines, not the "no data" note).
    plot = page.find_all("svg", "plot")
    assert len(plot) == 1 and plot[0].attrs["data-series"] == "llama2-7b,tiny"
    assert len(plot[0].find_all("path")) > 5 and page.count("p", "no-data") == 0


@pytest.mark.e2e  # headless Chromium (browser.py)
def test_sort_and_filter_in_the_browser(workspace, request):
    assert run("--workspace", str(workspace)).exit_code == 0
    page_file = workspace / ".dashboard" / "index.html"
    with open_tab(page_file) as tab:
        assert [r["data-job-id"] for r in tab.visible("tr[data-job-id]")][0] == IDS[4]  # newest first
        tab.click("th[data-key=tgs]")
        order = [r["data-job-id"] for r in tab.visible("tr[data-job-id]")]
        assert order[:3] == [IDS[1], IDS[3], IDS[0]]  # 4,882 < 21,989 < 24,719; no TGS last
        tab.click("th[data-key=tgs]")
        assert [r["data-job-id"] for r in tab.visible("tr[data-job-id]")][:3] == [IDS[0], IDS[3], IDS[1]]
        tab.type("#filter", "llama2 failed")
        assert [r["data-job-id"] for r in tab.visible("tr[data-job-id]")] == [IDS[4]]
        assert tab.eval("document.getElementById('shown').textContent") == "1 of 5 jobs"
        assert tab.eval("location.hash") == "#filter=llama2+failed&sort=tgs&dir=desc"
        page = tab.snapshot(artifact_path(request))
        assert page.errors == []
    # The view is in the URL: a bookmarked hash opens filtered and sorted.
    with open_tab(page_file.as_uri() + "#filter=tiny&sort=nodes&dir=desc") as tab:
        visible = [r["data-job-id"] for r in tab.visible("tr[data-job-id]")]
        assert visible[0] == IDS[1] and sorted(visible) == sorted(IDS[:3])
        assert tab.eval("document.getElementById('filter').value") == "tiny"
        assert tab.errors == []


@pytest.mark.e2e  # headless Chromium (browser.py)
def test_unreadable_log_is_a_row_the_rest_render(workspace, monkeypatch, request):
    bad = workspace / JOBS[3][0]
    bad.chmod(0)
    if os.geteuid() == 0:  # root reads a mode-000 file anyway: make the read fail as it would for a user
        from jobkit.core import logparse

        real = logparse.parse_file

        def parse_file(path):
            if os.path.samefile(path, bad):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(logparse, "parse_file", parse_file)
    result = run("--workspace", str(workspace))
    assert result.exit_code == 0, result.output
    assert "(1 unreadable)" in result.output
    page = load(workspace / ".dashboard" / "index.html", artifact_path(request))
    rows = by_id(page)
    assert rows[IDS[3]]["status"] == "unreadable" and len(rows) == 5
    assert rows[IDS[0]]["status"] == "SUCCESS" and page.errors == []


@NEEDS_ROOT
def test_a_job_dir_it_may_not_read_is_marked_on_its_row_and_the_rest_render(workspace):
    stem = JOBS[0][0].removesuffix(".log")
    add_analysis(workspace, stem, {"throughput": {"tgs": {"mean": 1.0}}})
    os.chown(workspace / stem, 65534, 65534)  # a teammate's job dir, mode 700: its log is readable, it is not
    (workspace / stem).chmod(0o700)
    result = jobkit_without_root_powers("dashboard", "--workspace", str(workspace))
    assert result.returncode == 0, result.stderr
    page = workspace / ".dashboard" / "index.html"
    assert result.stdout == f"5 jobs (1 job dir(s) unreadable): {page}\n" and "Traceback" not in result.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r'<tr data-job-id="([^"]+)"(.*?)</tr>', page.read_text(), re.S)}
    assert len(rows) == 5
    assert f'title="{stem}/: permission denied">job dir unreadable</span>' in rows[IDS[0]]
    assert ">SUCCESS<" in rows[IDS[0]]  # what its log says is still shown
    assert all("job dir unreadable" not in row for job_id, row in rows.items() if job_id != IDS[0])


# ---------------------------------------------------------------------------------------------------------
# The failure cell is `jobkit jobs`' WHY (issue 22): `jobkit why`'s class@host, a hang's stacks included

_FAILURE_CELL = re.compile(
    r'<tr data-job-id="([^"]+)".*?<td data-sort="([^"]*)" class="failure" title="([^"]*)">([^<]*)</td>'
)


def failure_cells(ws: Path) -> dict[str, tuple[str, str]]:
    """`jobkit dashboard`'s page for WS: job id -> (the failure cell's text, its tooltip)."""
    result = run("--workspace", str(ws))
    assert result.exit_code == 0, result.output
    page = (ws / dashboard.PAGE_DIR / dashboard.PAGE_NAME).read_text()
    return {m.group(1): (m.group(4), html.unescape(m.group(3))) for m in _FAILURE_CELL.finditer(page)}


def test_a_hang_row_blames_the_node_why_blames_from_its_recorded_stacks(tmp_path):
    """The default-settings proof's recording (node2's rank stopped, node1 noticed and waits): the row says
    hang@node2 with why's reason, as `jobkit why` and `jobkit jobs` do; without the stacks nobody is blamed."""
    log = real_two_node_job(tmp_path, "slurm-2node-frozen-default", "590")
    got = why_json(log)
    assert (got["class"], got["host"]) == ("hang", "node2")
    text, title = failure_cells(tmp_path)["590"]
    assert text == whys_word(got) == "hang@node2"
    assert title.startswith("hang: training; host node2 (stacks: node2's training (rank 1, pid 7265) is stopped (T)")
    assert "retry: retry-without-node; advice: " in title
    # --serve's cache: the stacks arriving in the job dir (the log untouched) change the row.
    aside = tmp_path / "aside"
    log.with_suffix("").rename(aside)
    cache: dict = {}
    page_dir = tmp_path / dashboard.PAGE_DIR
    assert [r.failure for r in dashboard.collect(tmp_path, page_dir, cache)] == ["hang"] == [whys_word(why_json(log))]
    aside.rename(log.with_suffix(""))
    assert [r.failure for r in dashboard.collect(tmp_path, page_dir, cache)] == ["hang@node2"]


@needs_promtool
def test_a_ray_hang_row_blames_the_host_the_tsdb_blames_as_why_does(tmp_path):
    """Both ranks' stacks wait alike; only the TSDB's window tells that node2's GPUs went idle: the row says so."""
    log = hang_job(tmp_path, {"node1": SPIN, "node2": {**SPIN, "busy": (97, 0), "power": (900, 60)}})
    text, title = failure_cells(tmp_path)["500"]
    assert text == whys_word(why_json(log)) == "hang@node2"
    assert "host node2 (metrics: node2's GPUs were idle (0% busy)" in title and "retry: retry-without-node" in title
    shutil.rmtree(log.with_suffix("") / "prometheus")  # the same job without its TSDB: nobody is to blame
    assert failure_cells(tmp_path)["500"][0] == whys_word(why_json(log)) == "hang"


def test_every_corpus_log_gets_the_class_and_host_jobkit_why_gives(tmp_path):
    logs = corpus_workspace(tmp_path, sorted(EXPECTED))
    rows = {r.stem: r for r in dashboard.collect(tmp_path, tmp_path / dashboard.PAGE_DIR)}
    assert len(rows) == len(EXPECTED)
    for case, log in logs.items():
        row, got = rows[log.stem], why_json(log)
        assert (row.failure or "-") == whys_word(got), case
        if row.failure:
            expected = EXPECTED[case]
            assert row.failure == (f"{expected['class']}@{expected['host']}" if expected["host"] else expected["class"])
            assert row.failure_detail.startswith(got["class"]) and f"retry: {got['retry']}" in row.failure_detail
        else:
            assert row.status in ("SUCCESS", "STOPPED"), case


def test_analysis_json_keeps_its_numbers_but_not_an_older_verdict(tmp_path):
    """analysis.json is a snapshot: its TGS wins, its failure section does not (it may predate the stacks)."""
    logs = corpus_workspace(tmp_path, ["hang-watchdog"])
    stem = logs["hang-watchdog"].stem
    add_analysis(tmp_path, stem, {"throughput": {"tgs": {"mean": 777.0}}, "failure": {"class": "oom"}})
    (row,) = dashboard.collect(tmp_path, tmp_path / dashboard.PAGE_DIR)
    assert row.tgs == 777.0 and row.failure == whys_word(why_json(logs["hang-watchdog"])) != "oom"


def test_a_bad_catalogue_is_one_line_and_the_page_still_renders(tmp_path, monkeypatch):
    corpus_workspace(tmp_path, SOME)
    local = tmp_path / "site.yaml"
    local.write_text("signatures: [\n")
    monkeypatch.setenv(failures.LOCAL_SETTING, str(local))
    result = run("--workspace", str(tmp_path))
    assert result.exit_code == 0, result.output
    problems = result.stderr.splitlines()
    assert len(problems) == 1 and problems[0].startswith(f"jobkit dashboard: {local}: ")
    assert problems[0].endswith("; its failure says ?")
    rows = {r.stem: r for r in dashboard.collect(tmp_path, tmp_path / dashboard.PAGE_DIR)}
    assert {r.failure for r in rows.values() if r.status not in ("SUCCESS", "STOPPED")} == {"?"}
    assert {r.failure for r in rows.values() if r.status in ("SUCCESS", "STOPPED")} == {""}


def test_bad_input_one_line_nothing_written(tmp_path, monkeypatch):
    monkeypatch.delenv("JOB_WORKSPACE", raising=False)
    result = run("--workspace", str(tmp_path / "missing"))
    assert result.exit_code == 1
    assert (
        result.output
        == f"jobkit dashboard: workspace {tmp_path / 'missing'} does not exist; pass --workspace or set JOB_WORKSPACE\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.log").write_text("not a job\n")
    monkeypatch.setenv("JOB_WORKSPACE", str(empty))
    result = run()
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output == f"jobkit dashboard: no job logs in {empty}; run a job first, or pass --workspace\n"
    assert sorted(p.name for p in empty.iterdir()) == ["notes.log"]
    # --port means the port --serve listens on: alone it was silently ignored (audit dash6).
    result = run("--workspace", str(empty), "-p", "8390")
    assert result.exit_code == 2 and "--port is the port --serve listens on; add --serve" in result.output
    assert sorted(p.name for p in empty.iterdir()) == ["notes.log"]


def test_output_option_and_unwritable_target(workspace, tmp_path):
    out = tmp_path / "elsewhere" / "jobs.html"
    result = run("--workspace", str(workspace), "--output", str(out))
    assert result.exit_code == 0 and out.is_file() and not (workspace / ".dashboard").exists()
    assert f'href="{os.path.relpath(workspace, out.parent)}/{JOBS[0][0]}"' in out.read_text()
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run("--workspace", str(workspace), "--output", str(blocker / "x.html"))
    assert result.exit_code == 1 and result.output.startswith("jobkit dashboard: cannot write ")
    assert result.output.rstrip().endswith("pass --output FILE") and result.output.count("\n") == 1


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_on(port):
    """The local addresses (kernel hex) of the sockets listening on PORT, from /proc/net/tcp{,6}."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(addr)
    return found


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


@pytest.mark.e2e  # headless Chromium (browser.py)
def serve(workspace, first_port):
    """`jobkit dashboard --serve` of WORKSPACE from FIRST_PORT on, in the background (stdout and stderr piped)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobkit",
            "dashboard",
            "--serve",
            "--workspace",
            str(workspace),
            "--port",
            str(first_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_loopback_next_free_port_tunnel_rebuild_and_stop(workspace, request):
    stem = JOBS[0][0].removesuffix(".log")
    add_analysis(workspace, stem, {"failure": {"class": "oom", "detail": None}})
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = taken.getsockname()[1]
    proc = serve(workspace, first)
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("Ctrl-C" in ln for ln in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        text = "".join(lines)
        m = re.search(r"URL:\s+http://127\.0\.0\.1:(\d+)/", text)
        assert m, text + proc.stderr.read() if proc.poll() is not None else text
        port = int(m.group(1))
        assert port != first  # the taken port was skipped
        assert re.search(rf"^\s*from your laptop:\s+ssh -N -L {port}:127\.0\.0\.1:{port} \S+@\S+", text, re.M), text
        assert _listening_on(port) == ["0100007F"]  # 127.0.0.1 only, not 0.0.0.0 or ::
        status, body = _get(f"http://127.0.0.1:{port}/")
        assert status == 200 and body.count("data-job-id=") == 5 and ">config-error<" in body
        assert _get(f"http://127.0.0.1:{port}/{stem}/analysis/report.html")[1].startswith("<html>")
        assert "MODEL_NAME=tiny" in _get(f"http://127.0.0.1:{port}/{JOBS[0][0]}")[1]
        for path in ("/../../etc/passwd", "/.dashboard/index.html", f"/{stem}/analysis/analysis.json", "/notes.log"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                _get(f"http://127.0.0.1:{port}{path}")
        # A new job shows on the next load (the page is rebuilt at most every REBUILD_EVERY_S).
        new = workspace / "local_20261124_090000_beef-JAX-tiny.log"
        new.write_text((JOBKIT_LOGS / "launch-tiny-3steps-mfu.log").read_text())
        time.sleep(dashboard_serve.REBUILD_EVERY_S + 0.2)
        assert _get(f"http://127.0.0.1:{port}/index.html")[1].count("data-job-id=") == 6
        page = load(f"http://127.0.0.1:{port}/", artifact_path(request))
        assert page.errors == [] and len(by_id(page)) == 6
    finally:
        taken.close()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    assert rc == 0, proc.stderr.read()
    assert "stopped" in proc.stderr.read()


def test_serve_hands_out_no_file_a_planted_link_points_at(workspace, tmp_path):
    """A teammate who can write to a shared workspace plants `<id>-<name>.log` as a link to a file of yours
    elsewhere (a key): the server must not hand it out. A link inside the workspace (an old name left by
    `jobkit tag`) still works."""
    secret = tmp_path / "home" / "id_fake"
    secret.parent.mkdir()
    secret.write_text("FAKE KEY 0000SECRET\n")
    (workspace / "99-JAX-tiny.log").symlink_to(secret)
    (workspace / "98-JAX-tiny.log").symlink_to(workspace / JOBS[0][0])
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    first = probe.getsockname()[1]  # a first port to try; the server moves on if someone took it since
    probe.close()
    proc = serve(workspace, first)
    try:
        port = None
        for line in proc.stdout:  # the URL line comes before "Ctrl-C stops it."
            m = re.search(r"URL:\s+http://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
                break
        assert port, proc.stderr.read() if proc.poll() is not None else "no URL line"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            _get(f"http://127.0.0.1:{port}/99-JAX-tiny.log")
        assert "MODEL_NAME=tiny" in _get(f"http://127.0.0.1:{port}/98-JAX-tiny.log")[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


@pytest.mark.parametrize(
    ("first", "message"),
    [
        (65535, "port 65535 on 127.0.0.1 is taken; pass --port PORT"),
        (65530, "ports 65530-65535 on 127.0.0.1 are all taken; pass --port PORT"),
        (8000, f"ports 8000-{8000 + dashboard_serve.PORT_TRIES - 1} on 127.0.0.1 are all taken; pass --port PORT"),
    ],
)
def test_taken_ports_name_only_ports_that_exist_and_were_tried(monkeypatch, first, message):
    """-p 65535 with it taken said 'ports 65535-65554' (audit dash9): ports stop at 65535."""
    tried = []

    def taken(address, handler):
        tried.append(address[1])
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(dashboard_serve.http.server, "ThreadingHTTPServer", taken)
    with pytest.raises(dashboard_serve.JobkitError) as exc:
        dashboard_serve._bind(first, None)
    assert exc.value.message == message
    assert tried == list(range(first, min(first + dashboard_serve.PORT_TRIES, 65536)))
