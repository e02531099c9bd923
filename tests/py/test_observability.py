"""End to end: RAY=1 ./run_local.sh with real Ray, a real Prometheus, the real exporter and real MaxText training.

What a user checks after a RAY=1 job: `prometheus.sh view` of the job dir shows every training step's loss
(equal to the TensorBoard event file's), host metrics labelled with this host, Ray's node metrics; the logs
of the exporter and of Ray are in the job dir; and nothing the job started is still running.
"""

import math
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from job_observation import header, live_processes_of
from launch_env import launcher_env
from prom_query import View, api, free_port, pid_alive, wait_for

# Every test here runs RAY=1 ./run_local.sh for real (in its own body): all of them are e2e.
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STEP_RE = re.compile(r"completed step: (\d+), seconds: [\d.]+.*?loss: ([\d.]+)")
HOST = socket.gethostname().split(".")[0]


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("obs_jax_cache")


def ray_env(workspace, jax_cache, **extra):
    settings = dict(
        RAY="1",
        # A scrape every second: the job, ~10 s with warm caches, keeps enough samples for a rate.
        EXPORTER_INTERVAL="1",
        PROMETHEUS_SCRAPE_INTERVAL="1",
        PROMETHEUS_PORT=str(free_port()),
        RAY_DASHBOARD_PORT=str(free_port()),
        TENSORBOARD_PORT=str(free_port()),
    )
    return launcher_env(workspace, jax_cache, **{**settings, **extra})


def only_job(workspace):
    logs = sorted(workspace.glob("local_*.log"))
    assert len(logs) == 1, f"expected one job log in {workspace}, found {logs}"
    return logs[0], workspace / logs[0].name.removesuffix(".log")


def event_losses(job_dir):
    """step -> loss from the run's TensorBoard event file(s), read with tensorboard's own loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    losses = {}
    files = sorted(job_dir.rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {job_dir}"
    for path in files:
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "learning/loss":
                    if value.HasField("simple_value"):
                        losses[event.step] = value.simple_value
                    else:
                        from tensorboard.util import tensor_util

                        losses[event.step] = float(tensor_util.make_ndarray(value.tensor))
    return losses


def leftovers(job_id):
    """PIDs of anything the job started that still runs (a zombie is gone)."""
    deadline = time.monotonic() + 10
    while True:
        alive = [pid for pid in live_processes_of(job_id) if pid_alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def describe(pids):
    out = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
            out.append(f"{pid}: {cmdline!r}")
        except OSError:
            pass
    return "\n".join(out)


def test_ray_job_lands_every_step_host_and_ray_metrics_in_its_tsdb(tmp_path, jax_cache):
    steps = 12
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [str(REPO / "run_local.sh"), "tiny", "--", f"steps={steps}"],
        # The job takes ~20 s: Ray's node metrics (default refresh 10 s) must be there for Prometheus to scrape.
        env=ray_env(workspace, jax_cache, RAY_REPORTER_INTERVAL_MS="2000"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    log, job_dir = only_job(workspace)
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    job_id = header(text)["JOB_ID"]
    assert header(text)["RAY"] == "1"

    # Training's own lines reach the job log unchanged, through the Ray actor.
    logged = {int(s): float(v) for s, v in STEP_RE.findall(text)}
    assert sorted(logged) == list(range(steps)), text[-3000:]
    assert re.search(r"^\s*ssh -N .*-L \d+:127\.0\.0\.1:\d+ .*" + re.escape(HOST), text, re.M), text[:3000]
    assert f"utils/prometheus.sh view {job_dir}" in text

    losses = event_losses(job_dir)
    assert sorted(losses) == list(range(steps)), sorted(losses)
    assert all(math.isclose(losses[s], logged[s], abs_tol=1e-3) for s in range(steps)), (losses, logged)

    # Logs of the pieces, in the job dir.
    assert (job_dir / "metrics_exporter" / f"{HOST}.log").stat().st_size > 0
    ray_logs = job_dir / "ray_logs" / HOST
    assert any(ray_logs.rglob("raylet.out")), sorted(p.name for p in ray_logs.rglob("*"))[:20]

    # Nothing of the job is left running; Prometheus stopped cleanly.
    alive = leftovers(job_id)
    assert not alive, describe(alive)
    assert not (job_dir / "prometheus" / "prometheus.pid").exists()

    with View(job_dir, free_port()) as view:
        end = log.stat().st_mtime + 60
        series = view.query("tb_learning_loss[2h]", at=end)
        assert len(series) == 1, series
        assert series[0]["metric"]["host"] == HOST
        samples = series[0]["values"]
        assert len(samples) == len(losses), (len(samples), len(losses))
        # TensorBoard stores float32; Prometheus returns what the event held, formatted as float64.
        got = sorted(float(v) for _, v in samples)
        want = sorted(losses.values())
        assert all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want, strict=False)), (got, want)

        procs = view.query("hw_procs_running[2h]", at=end)
        assert [s["metric"]["host"] for s in procs] == [HOST], procs
        ray_series = view.query("count by (host) (count_over_time(ray_node_cpu_count[2h]))", at=end)
        assert ray_series and all(s["metric"]["host"] == HOST for s in ray_series), ray_series


def test_ray_that_cannot_start_still_trains(tmp_path, jax_cache):
    workspace = tmp_path / "ws"
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", 0))
    blocker.listen()
    try:
        busy = blocker.getsockname()[1]
        result = subprocess.run(
            [str(REPO / "run_local.sh"), "tiny", "--", "steps=3"],
            env=ray_env(workspace, jax_cache, RAY_PORT=str(busy)),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        blocker.close()
    log, job_dir = only_job(workspace)
    text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    assert "Ray cluster failed to start" in text and "training without Ray" in text, text[-4000:]
    # What did start is still reachable: the tunnel names Prometheus and TensorBoard, not the dashboard.
    prom = re.search(r"Prometheus on 127\.0\.0\.1:(\d+)", text)
    board = re.search(r"TensorBoard on 127\.0\.0\.1:(\d+)", text)
    assert prom and board, text[-4000:]
    tunnel = re.search(r"^\s*ssh -N (.*)$", text, re.M)
    assert tunnel, text[:4000]
    for port in (prom[1], board[1]):
        assert f"-L {port}:127.0.0.1:{port}" in tunnel[1], tunnel[0]
    assert "Ray dashboard" not in text and f"utils/prometheus.sh view {job_dir}" in text
    assert sorted(int(s) for s, _ in STEP_RE.findall(text)) == [0, 1, 2]
    alive = leftovers(header(text)["JOB_ID"])
    assert not alive, describe(alive)


def test_kill9_of_the_whole_job_keeps_a_viewable_tsdb(tmp_path, jax_cache):
    workspace = tmp_path / "ws"
    env = ray_env(workspace, jax_cache)
    proc = subprocess.Popen(
        [str(REPO / "run_local.sh"), "tiny", "--", "steps=100000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        log = wait_for(lambda: next(iter(workspace.glob("local_*.log")), None), 60, "the job log")
        port = int(
            wait_for(
                lambda: re.search(r"Prometheus on 127\.0\.0\.1:(\d+)", log.read_text()), 120, "the job's Prometheus"
            )[1]
        )
        # kill once the live Prometheus has scraped a training step: the TSDB must still hold it afterwards
        live = wait_for(lambda: api(port, "/api/v1/query", query="tb_step")["result"], 300, "a scraped tb_step")
        job_id = header(log.read_text())["JOB_ID"]
        killed_at = time.time()
        for pid in live_processes_of(job_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    job_dir = workspace / log.name.removesuffix(".log")
    for pid in live_processes_of(job_id):  # e.g. a process forked during the sweep above
        os.kill(pid, signal.SIGKILL)
    # The teardown never ran, so its TensorBoard backfill is still pending; the first reader completes it.
    assert (job_dir / "prometheus" / "tb_backfill.pending.json").exists()
    assert not (job_dir / "prometheus" / "tb_backfill.done.json").exists()
    losses = event_losses(job_dir)
    view = View(job_dir, free_port())
    try:
        # Every step is in the TSDB, not only those the live bridge had scraped: the event file's, and the ones
        # the log shows after the event file's last flush.
        logged = {int(s) for s, _ in STEP_RE.findall(log.read_text())}
        want = len(set(losses) | logged)
        counted = view.query("count_over_time(tb_learning_loss[2h])", at=killed_at + 60)
        assert [float(s["value"][1]) for s in counted] == [want], (counted, want, len(losses), len(logged))
    finally:
        _, err = view.stop()
    assert "completing the TensorBoard backfill the job's teardown did not finish" in err, err
    assert (job_dir / "prometheus" / "tb_backfill.done.json").exists()
    with View(job_dir, free_port()) as view:
        up = view.query('timestamp(up{job="exporters"})', at=killed_at + 1)
        assert up and up[0]["metric"]["host"] == HOST, up
        newest = float(up[0]["value"][1])
        # scrape interval 5 s: the last scrape before the kill is at most one interval (plus slack) old
        assert killed_at - newest <= 5 + 2.5, (killed_at, newest)
        steps = view.query("max_over_time(tb_step[10m])", at=killed_at + 1)
        assert steps and float(steps[0]["value"][1]) >= float(live[0]["value"][1]), (steps, live)
        loss = view.query("tb_learning_loss[10m]", at=killed_at + 1)
        assert loss and loss[0]["metric"]["host"] == HOST, loss
