"""`jobkit analyze` and `jobkit compare` on real tiny jobs: one RAY=1 (TSDB, exporter, Ray metrics), one plain,
one that fails. Each job runs once per module; every test reads or copies it. The 2-node Slurm case is in
test_slurm.py (its RAY=1 job is analysed there).

What is checked is what the job really did: the steps its log shows (counted here by regex), the steady TGS
that `jobkit tgs` prints, the host it ran on, the class `jobkit why` gives; and that analysing changes
nothing in the job dir but analysis/.
"""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import NEEDS_ROOT, REPO, jobkit_without_root_powers
from launch_env import launcher_env

from jobkit.analysis import compare
from jobkit.cli import main as jobkit_main

STEP_LINE = re.compile(r"completed step: (\d+), seconds: [\d.]+.*?loss: ([\d.]+)")
HOST = socket.gethostname().split(".", 1)[0]


def _run_job(workspace, jax_cache, *args, **extra):
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", *args],
        env=launcher_env(workspace, jax_cache, **extra),
        capture_output=True,
        text=True,
        timeout=420,
    )
    logs = sorted(workspace.glob("local_*.log"))
    assert len(logs) == 1, (logs, result.stdout[-3000:], result.stderr[-3000:])
    return logs[0], result


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="module")
def ray_job(tmp_path_factory, jax_cache, prometheus_installed):
    """RAY=1 with its Prometheus: a fresh machine has none until utils/prometheus.sh install, and without one the
    job still passes, with metrics off, so every TSDB check below would fail for the wrong reason."""
    ws = tmp_path_factory.mktemp("ws_ray")
    log, result = _run_job(
        ws,
        jax_cache,
        "steps=40",
        RAY="1",
        TENSORBOARD="0",
        # A scrape every second: the job, ~10 s with warm caches, keeps enough samples for its rates.
        EXPORTER_INTERVAL="1",
        PROMETHEUS_SCRAPE_INTERVAL="1",
        RAY_REPORTER_INTERVAL_MS="2000",
    )
    assert result.returncode == 0, result.stdout[-4000:]
    return ws, log


@pytest.fixture(scope="module")
def plain_job(tmp_path_factory, jax_cache):
    ws = tmp_path_factory.mktemp("ws_plain")
    log, result = _run_job(ws, jax_cache, "steps=30", "per_device_batch_size=2")
    assert result.returncode == 0, result.stdout[-4000:]
    return ws, log


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory, jax_cache):
    ws = tmp_path_factory.mktemp("ws_failed")
    log, result = _run_job(ws, jax_cache, "steps=5", "no_such_maxtext_key=1")
    assert result.returncode != 0
    return ws, log


def analyze(ws, job="latest", *extra):
    result = CliRunner().invoke(jobkit_main, ["analyze", job, "--workspace", str(ws), *extra])
    return result


def analysis_of(log):
    return json.loads((log.with_suffix("") / "analysis" / "analysis.json").read_text())


def logged_steps(log):
    """{step: loss} of rank 0's step lines, read here independently of jobkit."""
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(log.read_text())}


def tree(path):
    """Every file under PATH but analysis/, with size and mtime: what analysing must not change."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if rel.parts[0] == "analysis":
            continue
        st = p.lstat()
        out[str(rel)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


# ---- a RAY=1 job -------------------------------------------------------------------------------------------
def test_a_ray_job_analysis_holds_its_steps_steady_tgs_and_host(ray_job):
    ws, log = ray_job
    result = analyze(ws)
    assert result.exit_code == 0, result.output
    doc = analysis_of(log)
    steps = logged_steps(log)
    assert doc["steps"]["logged"] == len(steps) == 40
    assert [p["step"] for p in doc["steps"]["per_step"]] == sorted(steps)
    assert [p["loss"] for p in doc["steps"]["per_step"]] == [steps[s] for s in sorted(steps)]
    tgs = CliRunner().invoke(jobkit_main, ["tgs", "--json", str(log)])
    assert tgs.exit_code == 0, tgs.output
    assert doc["throughput"]["tgs"]["mean"] == pytest.approx(json.loads(tgs.output)["tgs"], rel=1e-6)
    assert doc["throughput"]["window"] == [5, 14]
    assert doc["job"]["status"] == "SUCCESS" and doc["failure"] is None and doc["partial"] is None
    assert doc["hosts"]["available"] and doc["hosts"]["names"] == [HOST]
    for key in ("cpu", "memory", "net"):
        assert list(doc["hosts"]["resources"][key]["per_host"]) == [HOST], key
    assert doc["hosts"]["resources"]["net"]["per_host"][HOST]["samples"] >= 2  # a rate needs two scrapes
    # learning rate from the event files, for the steps MaxText wrote there
    assert sum(p.get("learning_rate") is not None for p in doc["steps"]["per_step"]) >= 30
    assert any(s["name"].startswith("startup to first step") and s["seconds"] > 0 for s in doc["stages"])
    missing = {m["panel"]: m["why"] for m in doc["missing"]}
    assert "hw_gpu_busy_percent" in missing["GPU busy (mean over GPUs)"]  # a CPU node has no GPU plugin output
    assert f"report: {log.with_suffix('')}/analysis/report.html" in result.output


def test_analysing_changes_nothing_in_the_job_dir_but_analysis(ray_job):
    ws, log = ray_job
    job_dir = log.with_suffix("")
    before, log_before = tree(job_dir), log.stat().st_mtime_ns
    assert analyze(ws).exit_code == 0
    assert tree(job_dir) == before  # the TSDB included: promtool reads it read-only
    assert log.stat().st_mtime_ns == log_before
    assert sorted(p.name for p in (job_dir / "analysis").iterdir()) == ["analysis.json", "report.html"]


def test_the_report_renders_in_a_real_browser(ray_job, request):
    from browser import artifact_path, load

    ws, log = ray_job
    assert analyze(ws).exit_code == 0
    page = load(log.with_suffix("") / "analysis" / "report.html", artifact_path(request))
    assert page.errors == []
    assert page.requests == [page.url]  # self-contained: the page asked for nothing else
    doc = analysis_of(log)
    plots = page.find_all("svg", "plot")
    # loss, lr, grad norm, step time, TGS per step; one per host resource with data
    assert len(plots) == 5 + len(doc["hosts"]["resources"])
    for svg in plots:
        assert svg.find_all("path"), svg.attrs  # drawn lines, not an empty frame
    assert page.by_id("status").all_text() == "SUCCESS"
    assert plots[-1].attrs["data-series"] == HOST
    print(f"report screenshot: {page.screenshot}")


# ---- a plain job, a failed job ---------------------------------------------------------------------------
def test_a_job_without_ray_says_which_panels_are_missing_and_why(plain_job):
    ws, log = plain_job
    result = analyze(ws)
    assert result.exit_code == 0, result.output
    doc = analysis_of(log)
    assert doc["hosts"]["available"] is False
    assert "without RAY=1" in doc["hosts"]["why_not"]
    assert "missing per-host resources: the job ran without RAY=1" in result.output
    assert doc["steps"]["logged"] == len(logged_steps(log)) == 30
    html = (log.with_suffix("") / "analysis" / "report.html").read_text()
    assert "id='no-hosts'" in html and "without RAY=1" in html
    # self-contained: nothing to fetch (xmlns names are not fetched)
    assert not re.search(r"(?:src|href)=[\"']?(?:https?:)?//", html) and "<link" not in html and "<script" not in html


def test_a_failed_job_carries_the_class_and_evidence_that_jobkit_why_gives(failed_job):
    ws, log = failed_job
    result = analyze(ws)
    assert result.exit_code == 0, result.output
    doc = analysis_of(log)
    why = CliRunner().invoke(jobkit_main, ["why", str(log)])
    assert doc["failure"]["class"] == why.output.split()[0].split("(")[0] == "config-error"
    assert doc["failure"]["evidence"] and doc["failure"]["evidence"] in why.output
    assert doc["job"]["status"] == "FAILED"
    assert {"panel": "loss, step time, TGS", "why": "the log has no 'completed step' lines"} in doc["missing"]
    assert "failure: config-error" in result.output


def test_an_injected_loss_spike_is_found_with_its_evidence(plain_job, tmp_path):
    ws, log = plain_job
    assert not [a for a in (analyze(ws).exit_code == 0 and analysis_of(log))["anomalies"] if a["kind"] == "loss-spike"]
    steps = logged_steps(log)
    spiked = 20
    copy = tmp_path / log.name
    text = log.read_text()
    line = re.search(rf"^.*completed step: {spiked},.*$", text, re.M).group(0)
    copy.write_text(text.replace(line, re.sub(r"\bloss: [\d.]+", f"loss: {steps[spiked] * 3:.3f}", line)))
    result = analyze(tmp_path, "latest", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    spikes = [a for a in doc["anomalies"] if a["kind"] == "loss-spike"]
    assert [a["step"] for a in spikes] == [spiked]
    assert f"step {spiked}: loss {steps[spiked] * 3:.6g}" in spikes[0]["evidence"]
    assert f"anomaly loss-spike: loss spiked to {steps[spiked] * 3:.4g} at step {spiked}" in result.output


def test_a_job_still_running_is_analysed_as_partial(plain_job, tmp_path):
    ws, log = plain_job
    running = tmp_path / log.name
    running.write_text(log.read_text().split("==== JOB SUMMARY ====")[0])
    result = analyze(tmp_path, "latest", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert doc["partial"].startswith("the log has no JOB SUMMARY")
    assert doc["job"]["status"] == "RUNNING" and doc["steps"]["logged"] == 30
    assert "PARTIAL:" in result.output
    assert "id='partial'" in (tmp_path / "out" / "report.html").read_text()


# ---- bad input ---------------------------------------------------------------------------------------------
def _copy_job(ws_from_log, dest):
    """The job's log and dir (without its TSDB) in a fresh workspace DEST."""
    log = ws_from_log
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(log, dest / log.name)
    shutil.copytree(
        log.with_suffix(""),
        dest / log.with_suffix("").name,
        symlinks=True,
        ignore=shutil.ignore_patterns("prometheus", "analysis"),
    )
    return dest / log.name


@pytest.mark.parametrize("damage", ["empty", "corrupt"])
def test_an_empty_or_corrupt_tsdb_is_reported_not_a_traceback(ray_job, tmp_path, damage):
    _, log = ray_job
    copy = _copy_job(log, tmp_path / "ws")
    prom = copy.with_suffix("") / "prometheus"
    prom.mkdir()
    if damage == "corrupt":
        (prom / "wal").mkdir()
        (prom / "wal" / "00000000").write_bytes(b"\x01garbage-not-a-wal-record" * 100)
        (prom / "01ZZZZZZZZZZZZZZZZZZZZZZZZ").mkdir()
        (prom / "01ZZZZZZZZZZZZZZZZZZZZZZZZ" / "meta.json").write_text("{not json")
    result = analyze(tmp_path / "ws")
    assert result.exit_code == 0, result.output
    assert result.exception is None
    doc = analysis_of(copy)
    assert doc["hosts"]["available"] is False
    if damage == "empty":
        assert doc["hosts"]["why_not"] == "the job's prometheus/ dir holds no TSDB data (no WAL, no block)"
    else:
        assert doc["hosts"]["why_not"].startswith("promtool could not read"), doc["hosts"]["why_not"]
        assert "also, block 01ZZZZZZZZZZZZZZZZZZZZZZZZ of " in doc["hosts"]["why_not"]  # its meta.json is no JSON
    assert doc["steps"]["logged"] == 40  # the rest of the analysis is still there


def test_a_tsdb_of_blocks_without_a_wal_is_read(ray_job, tmp_path):
    """A TSDB made by backfill alone has no wal/; promtool 2.42 refuses one, so the reader links its blocks
    beside an empty WAL elsewhere, and adds nothing to the job dir."""
    _, log = ray_job
    copy = _copy_job(log, tmp_path / "ws")
    prom = copy.with_suffix("") / "prometheus"
    prom.mkdir()
    blocks = [d for d in (log.with_suffix("") / "prometheus").iterdir() if (d / "meta.json").is_file()]
    assert blocks  # the backfill wrote at least one
    for block in blocks:
        shutil.copytree(block, prom / block.name)
    before = tree(prom)
    assert analyze(tmp_path / "ws").exit_code == 0
    doc = analysis_of(copy)
    assert doc["hosts"]["available"] and doc["hosts"]["names"] == [HOST], doc["hosts"]["why_not"]
    assert tree(prom) == before


def test_an_unknown_job_is_one_line_and_exit_1(plain_job):
    ws, _ = plain_job
    result = analyze(ws, "no-such-job")
    assert result.exit_code == 1
    assert result.output.strip() == f"jobkit analyze: no job matching 'no-such-job' in {ws}; see 'jobkit jobs'"


@NEEDS_ROOT
def test_a_job_dir_without_permission_is_refused_and_left_alone(plain_job, tmp_path):
    _, log = plain_job
    copy = _copy_job(log, tmp_path / "ws")
    job_dir = copy.with_suffix("")
    for p in [job_dir, *job_dir.rglob("*")]:
        os.lchown(p, 65534, 65534)
        if not p.is_symlink():  # a teammate's job dir shared on purpose (JOB_UMASK=022): readable, not writable
            p.chmod(p.stat().st_mode | (0o055 if p.is_dir() else 0o044))
    before = tree(job_dir)
    result = jobkit_without_root_powers("analyze", "latest", "--workspace", str(tmp_path / "ws"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"jobkit analyze: cannot create {job_dir}/analysis: permission denied; pass --output DIR to write it elsewhere"
    )
    assert tree(job_dir) == before and not (job_dir / "analysis").exists()
    os.chown(copy, 65534, 65534)
    copy.chmod(0o600)  # and a log it may not read
    result = jobkit_without_root_powers(
        "analyze", "latest", "--workspace", str(tmp_path / "ws"), "--output", str(tmp_path / "out")
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("jobkit analyze: ") and len(result.stderr.strip().splitlines()) == 1, (
        result.stderr
    )
    assert "ermission denied" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# ---- compare -----------------------------------------------------------------------------------------------
def test_compare_puts_two_jobs_side_by_side_with_what_differs(ray_job, plain_job, tmp_path):
    (_, log_a), (_, log_b) = ray_job, plain_job
    ws = tmp_path / "ws"
    ws.mkdir()
    for log in (log_a, log_b):
        (ws / log.name).symlink_to(log)
        (ws / log.with_suffix("").name).symlink_to(log.with_suffix(""))
    id_a, id_b = (log.name.split("-JAX-")[0] for log in (log_a, log_b))
    page_path = tmp_path / "compare.html"
    result = CliRunner().invoke(jobkit_main, ["compare", id_a, id_b, "--workspace", str(ws), "--html", str(page_path)])
    assert result.exit_code == 0, result.output
    tgs = [
        json.loads(CliRunner().invoke(jobkit_main, ["tgs", "--json", str(log)]).output)["tgs"] for log in (log_a, log_b)
    ]
    row = next(line for line in result.output.splitlines() if line.startswith("TGS (steady mean)"))
    assert f"{tgs[0]:,.1f}" in row and f"{tgs[1]:,.1f} ({(tgs[1] - tgs[0]) / tgs[0] * 100:+.1f}%)" in row
    common = max(set(logged_steps(log_a)) & set(logged_steps(log_b)))
    loss_row = next(line for line in result.output.splitlines() if line.startswith(f"loss at step {common}"))
    assert f"{logged_steps(log_a)[common]:.5g}" in loss_row and f"{logged_steps(log_b)[common]:.5g}" in loss_row
    assert "  RAY: 1 | (unset)" in result.output
    assert "  arg:per_device_batch_size: (unset) | 2" in result.output
    assert "  arg:steps: 40 | 30" in result.output

    from browser import artifact_path, load

    page = load(page_path, artifact_path("compare-two-jobs"))
    assert page.errors == []
    curves = page.find_all("svg", "plot")
    assert len(curves) == 3
    for svg in curves:
        assert svg.attrs["data-series"] == f"{id_a},{id_b}"


def test_compare_needs_two_jobs_or_a_sweep(plain_job):
    ws, log = plain_job
    one = CliRunner().invoke(jobkit_main, ["compare", "latest", "--workspace", str(ws)])
    assert one.exit_code == 1 and one.output.strip() == "jobkit compare: only 1 job to compare; give at least two"
    neither = CliRunner().invoke(jobkit_main, ["compare", "--workspace", str(ws)])
    assert neither.exit_code == 1 and "give two or more jobs, or --sweep ID" in neither.output


def test_compare_a_sweep_takes_the_last_job_of_each_point(ray_job, plain_job, failed_job, tmp_path):
    """A sweep's points.jsonl as the drivers write it: the point retried once is compared by its last job."""
    ws = tmp_path / "ws"
    sweep = ws / "sweeps" / "bs1"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text(json.dumps({"driver": "batch", "params": {}, "state": "finished"}))
    (_, ray_log), (_, plain_log), (_, failed_log) = ray_job, plain_job, failed_job
    events = [
        {"event": "submitted", "key": "bs=1", "job_id": "x"},
        {"event": "done", "key": "bs=1", "log": str(failed_log), "status": "FAIL"},
        {"event": "done", "key": "bs=1", "log": str(ray_log), "status": "PASS"},  # its retry
        {"event": "done", "key": "bs=2", "log": str(plain_log), "status": "PASS"},
    ]
    (sweep / "points.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = CliRunner().invoke(jobkit_main, ["compare", "--sweep", "bs1", "--workspace", str(ws)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0].split()
    assert first == ["job", ray_log.name.split("-JAX-")[0], plain_log.name.split("-JAX-")[0]]
    assert (ws / ".compare").is_dir() and result.output.rstrip().endswith(".html")
    missing = CliRunner().invoke(jobkit_main, ["compare", "--sweep", "nope", "--workspace", str(ws)])
    assert missing.exit_code == 1
    assert (
        missing.output.strip() == f"jobkit compare: no sweep 'nope' in {ws / 'sweeps'}; `jobkit sweep list` shows them"
    )


# ---- bad input (round 2) -------------------------------------------------------------------------------------
NOT_A_LOG = (
    "not a job log (no KEY=VALUE header with JOB_ID and NNODES); give a log written by submit.sh or run_local.sh"
)


def test_a_synthetic_tsdb_without_head_chunks_is_read_and_the_job_dir_stays_byte_identical(
    prometheus_installed, tmp_path
):
    """promtool opens a TSDB read-only yet creates chunks_head/ in the dir it is given: a TSDB made by backfill
    (bench/make_synthetic_job.py: blocks and an empty wal/, as a clean shutdown leaves) has none, and analysing
    it added one to the job dir. promtool is given a private view of links now."""
    ws = tmp_path / "ws"
    made = subprocess.run(
        [os.sys.executable, str(REPO / "bench" / "make_synthetic_job.py"), str(ws), "--nodes", "2", "--steps", "40",
         "--hours", "0.05", "--id", "777"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    job_dir = next(p for p in ws.iterdir() if p.is_dir())
    assert not (job_dir / "prometheus" / "chunks_head").exists()
    before = {**tree(job_dir), "": (job_dir.stat().st_mtime_ns,)}
    result = analyze(ws, "777", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert doc["hosts"]["available"] and doc["hosts"]["names"] == ["node1", "node2"], doc["hosts"]["why_not"]
    assert {**tree(job_dir), "": (job_dir.stat().st_mtime_ns,)} == before


@pytest.mark.parametrize("data", [bytes(range(256)) * 16, b""], ids=["random", "empty"])
def test_analyze_and_compare_refuse_a_file_that_is_not_a_job_log_and_write_nothing(tmp_path, data):
    from conftest import JOBKIT_LOGS

    ws = tmp_path / "ws"
    ws.mkdir()
    bad = ws / "garbage.log"
    bad.write_bytes(data)
    good = ws / "local_20261122_054900_cd34-JAX-tiny.log"
    shutil.copy(JOBKIT_LOGS / "launch-tiny-3steps-mfu.log", good)
    for extra in ([], ["--output", str(tmp_path / "out")], ["--json", "--output", str(tmp_path / "out")]):
        result = analyze(ws, str(bad), *extra)
        assert result.exit_code == 1, result.output
        assert result.stdout == "" and result.stderr == f"jobkit analyze: {bad}: {NOT_A_LOG}\n"
    result = CliRunner().invoke(jobkit_main, ["compare", str(good), str(bad), "--workspace", str(ws)])
    assert result.exit_code == 1, result.output
    assert result.stdout == "" and result.stderr == f"jobkit compare: {bad}: {NOT_A_LOG}\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        [good.name, "garbage.log", "ws"]
    )  # no out/, no .compare/


def test_a_nodelist_that_cannot_be_expanded_costs_only_the_host(tmp_path):
    from conftest import JOBKIT_LOGS

    log = tmp_path / "local_20261122_054900_cd34-JAX-tiny.log"
    text = (JOBKIT_LOGS / "launch-tiny-3steps-mfu.log").read_text()
    log.write_text(text.replace("NNODES=1\n", "NNODES=1\nJOB_NODELIST=node[a-b]\n", 1))
    result = analyze(tmp_path, str(log), "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "analysis.json").read_text())["steps"]["logged"] == 3


# --------------------------------------------------------------------------------- units (no job)
def test_nan_samples_of_a_dump_are_no_values_so_host_means_stay_finite():
    """A node that leaves (a 2-node job's end) gets Prometheus staleness markers, which `promtool tsdb dump`
    prints as NaN: they are not samples, and averaging them made a host's mean NaN (analysis.json unwritable)."""
    from jobkit.analysis import hosts
    from jobkit.observe import tsdb_dump

    dump = "\n".join(
        [
            '{__name__="ray_node_cpu_utilization", host="node1"} 40 1000',
            '{__name__="ray_node_cpu_utilization", host="node1"} NaN 2000',
            '{__name__="ray_node_cpu_utilization", host="node1"} 60 3000',
            '{__name__="ray_node_cpu_utilization", host="node2"} +Inf 1000',
            '{__name__="ray_node_cpu_utilization", host="node2"} 10 2000',
        ]
    )
    data = tsdb_dump.parse(dump)
    cpu = next(r for r in hosts.RESOURCES if r.key == "cpu")
    summary = hosts.summarize(hosts.host_lines(data, cpu))
    assert summary["node1"]["mean"] == 50.0 and summary["node1"]["samples"] == 2
    assert summary["node2"]["mean"] == 10.0 and summary["node2"]["samples"] == 1


def test_analysis_json_turns_any_non_finite_number_into_null():
    from jobkit.analysis.command import json_safe

    doc = {
        "hosts": {"cpu": {"node1": {"mean": float("nan"), "max": float("inf"), "min": 1.5}}},
        "x": [float("-inf"), 2],
    }
    text = json.dumps(json_safe(doc), allow_nan=False)
    assert json.loads(text) == {"hosts": {"cpu": {"node1": {"mean": None, "max": None, "min": 1.5}}}, "x": [None, 2]}


def test_compare_keeps_a_value_that_merely_contains_the_job_id_digits(tmp_path):
    """Job 5's CLOUD_SDK_VERSION=528.0.0 was dropped as "naming the job" (the id as a substring), so compare
    reported `env:CLOUD_SDK_VERSION: (unset) | 528.0.0` for two jobs with the same value."""
    job_dir = tmp_path / "5-JAX-tiny"
    job_dir.mkdir()
    (job_dir / "environment.node0.txt").write_text(
        "CLOUD_SDK_VERSION=528.0.0\nRUN_DIR=/ws/5-JAX-tiny/out\nSTEP_TAG=run-5\nPORT_BASE=15000\n"
    )
    env = compare._environment(job_dir, ("5", "JAX-tiny", str(job_dir)))
    assert env["env:CLOUD_SDK_VERSION"] == "528.0.0" and env["env:PORT_BASE"] == "15000"
    assert "env:RUN_DIR" not in env and "env:STEP_TAG" not in env  # these do name job 5


def _synthetic_job(ws, job_id, seed="1", *, hours="0.05", interval="5"):
    """bench/make_synthetic_job.py's finished 2-node RAY=1 job (node1, node2): its job dir, whose TSDB holds one
    block made by promtool and an empty wal/. Its 3 minutes end in the middle of the last whole 2-hour block of the
    epoch: promtool cuts blocks at those boundaries, so a run ending "10 minutes ago" made two blocks at 10-13
    minutes past an even hour."""
    end = int(time.time()) // 7200 * 7200 - 3600
    made = subprocess.run(
        [os.sys.executable, str(REPO / "bench" / "make_synthetic_job.py"), str(ws), "--nodes", "2", "--steps", "40",
         "--hours", hours, "--interval", interval, "--id", job_id, "--seed", seed, "--end", str(end)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return next(p for p in ws.iterdir() if p.is_dir() and p.name.startswith(f"{job_id}-"))


@pytest.mark.parametrize("healthy_blocks", [0, 1])
def test_a_block_with_a_damaged_meta_json_is_named_with_its_fix_not_called_no_data(
    prometheus_installed, tmp_path, healthy_blocks
):
    """an11: promtool skips a block whose meta.json is damaged (here random bytes, as the report did), and the
    analysis said "the TSDB holds none of the exporter's or Ray's host series". It names the block and the fix
    now; what the healthy blocks hold is still analysed. The job dir stays byte-identical."""
    ws = tmp_path / "ws"
    job_dir = _synthetic_job(ws, "778")
    tsdb = job_dir / "prometheus"
    (damaged,) = [d for d in tsdb.iterdir() if (d / "meta.json").is_file()]
    if healthy_blocks:  # a second block with the same hosts: another synthetic job's
        other = _synthetic_job(tmp_path / "other", "779", seed="2")
        (block,) = [d for d in (other / "prometheus").iterdir() if (d / "meta.json").is_file()]
        shutil.copytree(block, tsdb / block.name)
    (damaged / "meta.json").write_bytes(bytes(range(256)) * 2)
    before = {**tree(job_dir), "": (job_dir.stat().st_mtime_ns,)}

    result = analyze(ws, "778", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0 and result.exception is None, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    said = (
        f"block {damaged.name} of {tsdb} is damaged (meta.json is not JSON): Prometheus and promtool skip it, so "
        "its samples are missing"
    )
    fix = f'cp -a {tsdb} /tmp/tsdb-copy; the job dir is evidence) write {{"ulid": "<block>", "minTime"'
    if healthy_blocks:
        assert doc["hosts"]["available"] and doc["hosts"]["names"] == ["node1", "node2"], doc["hosts"]["why_not"]
        (part,) = [m for m in doc["missing"] if m["panel"] == "per-host resources (part)"]
        assert part["why"].startswith(said) and fix in part["why"], part
    else:
        assert doc["hosts"]["available"] is False
        assert doc["hosts"]["why_not"].startswith(said) and fix in doc["hosts"]["why_not"], doc["hosts"]["why_not"]
        assert "holds none" not in result.output
    assert f"missing per-host resources{' (part)' if healthy_blocks else ''}: {said}" in result.output
    assert doc["steps"]["logged"] == 40  # the log's part is all there
    assert {**tree(job_dir), "": (job_dir.stat().st_mtime_ns,)} == before


def test_a_ray_job_whose_metrics_were_off_says_why_in_its_analysis(tmp_path):
    """The exporter's prometheus/targets/ is there but no TSDB: the reason the job's log gives, not "no data"."""
    from jobkit.analysis import build
    from jobkit.analysis.job import JobFacts
    from jobkit.core import logparse

    (tmp_path / "31-x" / "prometheus" / "targets").mkdir(parents=True)
    text = "JOB_ID=31\nNNODES=1\nRAY=true\n0: [observability] metrics are off: prometheus.sh: no binary (training goes on)\n"
    facts = JobFacts(tmp_path / "31-x.log", tmp_path / "31-x", logparse.parse_text(text), text, None, {}, {}, None)
    assert build._read_tsdb(facts) == ({}, None, "RAY=1 but metrics were off: prometheus.sh: no binary", None, None)
    assert build._job_section(facts)["ray"] is True, "RAY=true asks for it, as _train.sh reads it"


@pytest.mark.parametrize("first_absl", ["a step line", "another line"])
def test_the_text_analyze_keeps_finds_what_the_whole_text_does(tmp_path, first_absl):
    """job.read_text leaves out the step lines past the first TEXT_HEAD characters (issue 24: they are every
    rank's, ~10 GB at 512 nodes x 24 h): stages, provenance, the MFU note and the first absl time stay the same."""
    from jobkit.analysis import job

    def step(n: int, rank: int, absl: bool = False) -> str:
        prefix = f"0: [rank{rank}]: " if not absl else "0: "
        return f"{prefix}I1124 16:18:{n % 60:02d}.000001 1 metric_logger.py:265] completed step: {n}, seconds: 1.0"

    lines = ["JOB_ID=31", "JOB_NAME=x", "NNODES=1", "== SOURCE ==", "/src", "== BRANCH ==", "## main"]
    lines += ["== COMMIT ==", "abc123", "the subject", "== Preflight END (3s) =="]
    lines += [step(n, r) for n in range(600) for r in range(4)]  # `[rank<G>]: ` lines carry no absl time
    lines.append(step(600, 0, absl=True) if first_absl == "a step line" else "0: I1124 16:20:00.000002 1 x.py:1] up")
    lines += [step(n, r) for n in range(601, 1200) for r in range(4)]
    lines += ["0: [MFU] peak unknown for this device", "== Training END (1200s) ==", "  Status: SUCCESS (exit 0)"]
    path = tmp_path / "31-x.log"
    path.write_text("\n".join(lines) + "\n")
    whole, kept = path.read_text(), job.read_text(path)
    assert len(whole) > 2 * job.TEXT_HEAD and len(kept) < len(whole) / 2
    assert "completed step: 601," not in kept and "completed step: 1199," not in kept  # past the first absl time
    assert kept[: job.TEXT_HEAD] == whole[: job.TEXT_HEAD]
    assert job._stages(kept, {}) == job._stages(whole, {}) and len(job._stages(whole, {})) == 2
    assert job.provenance(kept) == job.provenance(whole) and job.provenance(whole)["commit"] == "abc123"
    assert job.mfu_note(kept) == job.mfu_note(whole) == "peak unknown for this device"
    assert job._first_absl_time(kept) == job._first_absl_time(whole) is not None


def _contents(path):
    """Every file under PATH with its bytes' hash, size, mtime and mode, and every dir's mtime."""
    import hashlib

    out = {"": path.stat().st_mtime_ns}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(path))] = (digest, st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _scratch_left():
    import tempfile

    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.iterdir() if p.name.startswith(("jobkit-promql-", "promserver.", "jobkit-tsdb-"))}


def _prometheus_pids():
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == b"prometheus":
                pids.add(int(entry.name))
    return pids


def test_promql_reads_a_downsampled_tsdb_leaves_the_job_byte_identical_and_nothing_behind(
    prometheus_installed, tmp_path
):
    """Issue 24 item 4: analyze asks a throwaway Prometheus over a view of the blocks for per-host lines, at a
    step that keeps each line to MAX_POINTS points (36 min of 1 s scrapes: 2,160 -> step 2 s). The job's TSDB
    is byte-identical after, no Prometheus or scratch dir is left, and the numbers agree with the full dump
    within the downsampling: means to 1 %, min/max inside the dump's, the error counter's rise exactly."""
    from jobkit.analysis import hosts, tsdb_query
    from jobkit.observe import tsdb_dump

    ws = tmp_path / "ws"
    job_dir = _synthetic_job(ws, "780", hours="0.6", interval="1")
    before, scratch, pids = _contents(job_dir), _scratch_left(), _prometheus_pids()
    result = analyze(ws, "780", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert doc["hosts"]["read"] == {"via": "promql", "step_s": 2}, doc["hosts"]["read"]
    assert doc["hosts"]["names"] == ["node1", "node2"]
    assert _contents(job_dir) == before
    assert _scratch_left() <= scratch and _prometheus_pids() <= pids

    full = tsdb_dump.read(str(job_dir / "prometheus"), hosts.hosts_families())
    for res in hosts.RESOURCES:
        exact = hosts.summarize(hosts.host_lines(full, res))
        got = doc["hosts"]["resources"][res.key]["per_host"]
        assert set(got) == set(exact) == {"node1", "node2"}, res.key
        for host, row in got.items():
            assert row["mean"] == pytest.approx(exact[host]["mean"], rel=0.01), (res.key, host)
            assert exact[host]["min"] - 1e-6 <= row["min"] <= row["max"] <= exact[host]["max"] + 1e-6, (res.key, host)
            assert row["samples"] <= tsdb_query.MAX_POINTS
    (rise,) = doc["hosts"]["error_counters"]
    (want,) = hosts.error_increases(full)
    assert (rise["host"], rise["device"], rise["increase"]) == (want["host"], want["device"], want["increase"])
    assert 0 <= rise["first_rise"] - want["first_rise"] <= 2  # to within one step


def test_without_a_prometheus_that_starts_the_dump_reads_the_tsdb_and_says_why(
    prometheus_installed, tmp_path, monkeypatch
):
    ws = tmp_path / "ws"
    job_dir = _synthetic_job(ws, "781")
    fake = tmp_path / "prometheus"
    fake.write_text("#!/bin/sh\necho 'level=error err=\"broken on purpose\"' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PROMETHEUS_BIN", str(fake))
    before = _contents(job_dir)
    result = analyze(ws, "781", "--output", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert doc["hosts"]["available"] and doc["hosts"]["names"] == ["node1", "node2"]
    read = doc["hosts"]["read"]
    assert read["via"] == "promtool tsdb dump" and "broken on purpose" in read["why"], read
    assert _contents(job_dir) == before


def test_the_promql_step_keeps_a_line_to_max_points_and_never_below_the_scrape_interval():
    from jobkit.analysis import tsdb_query

    assert tsdb_query.step_for(3600, 5.0) == 5  # 720 scrapes: every one
    assert tsdb_query.step_for(86_400, 5.0) == 58  # 17,280 scrapes -> 1,490 points
    assert tsdb_query.step_for(86_400, 0.98) == 58
    assert tsdb_query.step_for(600, 15.2) == 16  # whole seconds, never finer than a scrape
    assert 86_400 / tsdb_query.step_for(86_400, 1.0) <= tsdb_query.MAX_POINTS


def test_the_point_budget_shares_its_points_between_every_host_line_and_keeps_a_floor():
    """Issue 24 item 4: what Python holds is bounded whatever the node count: each of hosts x queries lines gets
    an equal share of POINT_BUDGET, at most MAX_POINTS and never under MIN_POINTS."""
    from jobkit.analysis import hosts, tsdb_query

    queries = sum(len(r.metrics) + len(r.ratio_of or ()) for r in hosts.RESOURCES)
    assert tsdb_query.points_per_line(8 * queries) == tsdb_query.MAX_POINTS  # small jobs keep full lines
    at_512 = tsdb_query.points_per_line(512 * queries)
    assert tsdb_query.MIN_POINTS < at_512 < tsdb_query.MAX_POINTS
    assert 512 * queries * at_512 <= tsdb_query.POINT_BUDGET
    assert tsdb_query.points_per_line(100_000) == tsdb_query.MIN_POINTS  # the floor wins over the budget
    step = tsdb_query.step_for(86_400, 15.0, at_512)  # 512 nodes x 24 h at the job's 15 s
    assert 86_400 / step <= at_512 and step >= 15


def test_a_small_point_budget_coarsens_the_step_and_bounds_every_line(prometheus_installed, tmp_path, monkeypatch):
    """The budget drives the step on a real read: 2 hosts x 36 min of 1 s scrapes with a budget of 300 points
    per line get lines of at most 300 points (step 8 s), and the means stay those of the full dump."""
    from jobkit.analysis import hosts, tsdb_query
    from jobkit.observe import tsdb_dump

    job_dir = _synthetic_job(tmp_path / "ws", "782", hours="0.6", interval="1")
    queries = sum(len(r.metrics) + len(r.ratio_of or ()) for r in hosts.RESOURCES)
    monkeypatch.setattr(tsdb_query, "POINT_BUDGET", 2 * queries * 300)
    before = _contents(job_dir)
    data, step = tsdb_query.read(str(job_dir / "prometheus"))
    assert step == math.ceil(0.6 * 3600 / 300) == 8
    host_series = [s for name, group in data.items() if not hosts.ERROR_COUNTERS.match(name) for s in group]
    assert len(host_series) == 2 * queries
    assert all(len(s.points) <= 301 for s in host_series)  # the grid's two ends
    assert _contents(job_dir) == before
    full = tsdb_dump.read(str(job_dir / "prometheus"), hosts.hosts_families())
    for res in hosts.RESOURCES:
        exact, got = hosts.summarize(hosts.host_lines(full, res)), hosts.summarize(hosts.host_lines(data, res))
        for host in ("node1", "node2"):
            assert got[host]["mean"] == pytest.approx(exact[host]["mean"], rel=0.02), (res.key, host)


def test_a_rebuilt_counter_gives_the_analysis_its_rates_back():
    """Counters come back from Prometheus as per-host rates; rebuilt as a counter, hosts' own rate() (the one
    the dump path uses) turns them into those same rates, gaps included."""
    from jobkit.analysis import tsdb_query
    from jobkit.observe import tsdb_dump

    rates = [(100.0, 7.0), (110.0, 2.0), (120.0, 4.5), (150.0, 1.0)]
    assert tsdb_dump.rate(tsdb_query._rebuilt_counter(rates)) == rates[1:]
