"""`jobkit tb-bridge` (py/jobkit/observe/tb_bridge.py, tb_events.py, tb_serve.py, tb_backfill.py): TensorBoard event
files -> Prometheus, live (serve) and after the job (backfill).

Event files are written with tensorboardX (MaxText's writer), or are a trimmed copy of a real MaxText run
(tests/fixtures/tensorboard/tiny/tensorboard/tiny/: its scalars and two of its text summaries, records
byte-identical). The last test runs the whole chain for real: exporter + TensorBoard plugin (its worker), the job's
Prometheus, stop, backfill, `prometheus.sh view`. Every process a test starts is stopped by its PID.
"""

import json
import math
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prom_query import View, api, free_port, pid_alive, wait_for
from tensorboardX import SummaryWriter
from tensorboardX.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from jobkit.observe import exporter, tb_backfill, tb_columns, tb_events, tb_serve

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DIR = REPO / "tests" / "fixtures" / "tensorboard"
FIXTURE = FIXTURE_DIR / "tiny" / "tensorboard" / "tiny" / "events.out.tfevents.1795412855.vm"
PROM_LIB = REPO / "utils" / "lib" / "prometheus.sh"
JOBKIT = Path(sys.executable).parent / "jobkit"  # the venv's console script, as a user runs it
MAXTEXT_TAGS = {
    "learning/current_learning_rate",
    "learning/grad_norm",
    "learning/indexer_loss",
    "learning/lm_loss",
    "learning/loss",
    "learning/moe_lb_loss",
    "learning/mtp_loss",
    "learning/param_norm",
    "learning/perplexity",
    "learning/raw_grad_norm",
    "learning/total_weights",
    "learning/z_loss",
    "perf/per_device_tflops",
    "perf/per_device_tflops_per_sec",
    "perf/per_device_tokens",
    "perf/per_device_tokens_per_sec",
    "perf/step_time_seconds",
}


def event_file(logdir):
    (path,) = Path(logdir).glob("events.out.tfevents.*")
    return path


def new_writer(logdir):
    """tensorboardX's writer, as MaxText uses it; it writes from a thread, flushing every 0.1 s here."""
    return SummaryWriter(str(logdir), flush_secs=0.1)


def write_steps(writer, steps, t0, loss=lambda s: 10.0 / (s + 1), wait=True):
    """MaxText-like scalars for each step, at wall time t0 + step/10 (+ 1 ms per tag); waits until on disk."""
    for s in steps:
        w = t0 + s / 10
        writer.add_scalar("learning/loss", loss(s), s, walltime=w)
        writer.add_scalar("perf/step_time_seconds", 0.5 + s / 1000, s, walltime=w + 0.001)
    if not wait:
        return
    last = max(steps)
    path = event_file(writer.logdir)
    wait_for(
        lambda: any(
            s.step == last and s.tag == "perf/step_time_seconds" for s in tb_events.ScalarReader(str(path)).read()
        ),
        5,
        f"step {last} on disk",
    )


def scalars_by_tag(path):
    out = {}
    for s in tb_events.ScalarReader(str(path)).read():
        out.setdefault(s.tag, []).append(s)
    return out


def test_metric_names():
    assert tb_events.metric_name("learning/loss") == "tb_learning_loss"
    assert tb_events.metric_name("perf/step_time_seconds") == "tb_perf_step_time_seconds"
    assert tb_events.metric_name("eval/acc@1 (top-1)") == "tb_eval_acc_1__top_1_"
    assert tb_events.metric_name("über.x-y") == "tb__ber_x_y"


def test_real_maxtext_event_file():
    tags = scalars_by_tag(FIXTURE)
    assert set(tags) == MAXTEXT_TAGS  # the text summaries (config) are skipped
    loss = tags["learning/loss"]
    assert [s.step for s in loss] == [0, 1, 2, 3, 4, 5]
    assert loss[0].value == pytest.approx(6.044634819030762)
    assert loss[0].wall_time == pytest.approx(1795412855.8153195)


def test_incremental_read_reads_only_new_bytes(tmp_path):
    writer = new_writer(tmp_path)
    t0 = time.time()
    write_steps(writer, range(3), t0)
    path = event_file(tmp_path)
    reader = tb_events.ScalarReader(str(path))
    first = reader.poll()
    assert [(s.tag, s.step) for s in first][:2] == [("learning/loss", 0), ("perf/step_time_seconds", 0)]
    assert len(first) == 6 and reader.records == 7  # + the file_version record
    assert reader.poll() == [] and reader.records == 7  # unchanged file: one stat, no read

    # Spoil every byte read so far: a reader that read them again would stop at a CRC error.
    old_size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(b"\xff" * old_size)
    write_steps(writer, range(3, 5), t0, wait=False)
    new = []
    wait_for(lambda: new.extend(reader.poll()) or len(new) >= 4, 5, "steps 3 and 4")
    assert [(s.tag, s.step) for s in new] == [
        ("learning/loss", 3),
        ("perf/step_time_seconds", 3),
        ("learning/loss", 4),
        ("perf/step_time_seconds", 4),
    ]
    assert reader.records == 11
    assert new[0].value == pytest.approx(10.0 / 4) and new[0].wall_time == pytest.approx(t0 + 0.3)
    writer.close()


def test_record_written_in_two_pieces(tmp_path):
    writer = new_writer(tmp_path / "src")
    write_steps(writer, [7], 1700000000.0)
    writer.close()
    data = event_file(tmp_path / "src").read_bytes()
    dst = tmp_path / "events.out.tfevents.1700000000.h"
    half = len(data) - 20  # the last record is incomplete
    dst.write_bytes(data[:half])
    reader = tb_events.ScalarReader(str(dst))
    assert [s.tag for s in reader.poll()] == ["learning/loss"]
    with open(dst, "ab") as f:
        f.write(data[half:])
    assert [(s.tag, s.step) for s in reader.poll()] == [("perf/step_time_seconds", 7)]


def test_tensor_scalars_and_text_summaries(tmp_path):
    writer = new_writer(tmp_path)
    fw = writer._get_file_writer()
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    for step, x in enumerate([1.5, 2.5]):
        value = summary_pb2.Summary.Value(
            tag="eval/acc", tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[x])
        )
        if step == 0:  # TensorBoard writers send the metadata with the first value only
            value.metadata.CopyFrom(meta)
        fw.add_summary(summary_pb2.Summary(value=[value]), step, walltime=1700000000.0 + step)
    writer.add_text("config", "hello", 0)
    vec = summary_pb2.Summary.Value(
        tag="eval/vec",
        tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT,
            float_val=[1.0, 2.0],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2)]),
        ),
        metadata=meta,
    )
    fw.add_summary(summary_pb2.Summary(value=[vec]), 0, walltime=1700000000.0)
    writer.close()  # waits for the writer thread
    tags = scalars_by_tag(event_file(tmp_path))
    assert set(tags) == {"eval/acc"}
    assert [(s.step, s.value) for s in tags["eval/acc"]] == [(0, 1.5), (1, 2.5)]


def test_latest_exposition_exact_timestamps():
    latest = tb_serve.Latest()
    S = tb_events.Scalar
    latest.add(
        [S("learning/loss", 0, 1795412855.8153195, 6.5), S("perf/step_time_seconds", 0, 1795412855.8163257, 0.25)]
    )
    latest.add(
        [
            S("learning/loss", 1, 1795412856.0004999, float("nan")),
            S("step", 1, 1795412856.001, 1.0),
            S("learning_loss", 1, 1795412856.002, 3.0),
        ]
    )  # both clash with a name already taken
    text = latest.render("n1")
    lines = text.splitlines()
    samples = [ln for ln in lines if not ln.startswith("#")]
    assert samples == [
        'tb_step{host="n1"} 1.0 1795412856000',
        'tb_metrics_plugin_staleness_fill{host="n1"} 0.0',
        'tb_learning_loss{host="n1"} NaN 1795412856000',
        'tb_perf_step_time_seconds{host="n1"} 0.25 1795412855816',
    ]
    assert "# TYPE tb_learning_loss gauge" in lines and "# TYPE tb_step gauge" in lines
    assert latest.fold.skipped == ["step", "learning_loss"]
    kept, state, dropped = exporter.parse_output(text)  # the exporter keeps every line
    assert dropped == [] and state is None and len(kept) == len(lines)
    assert tb_serve.Latest().render("n1") == ""


def test_seconds_text_parses_back_to_the_same_ms():
    for ms in [1795412855815, 1700000000001, 1600000000999, 1795412856000]:
        text = tb_backfill.ms_to_seconds_text(ms)
        assert int(float(text) * 1000) == ms and round(float(text) * 1000) == ms
    assert tb_backfill.ms_to_seconds_text(1795412855005) == "1795412855.005"


def test_scrape_labels():
    assert tb_backfill.scrape_labels("h", {"host": "sd", "job": "exporters", "instance": "a:1"}) == {
        "host": "h",
        "job": "exporters",
        "instance": "a:1",
    }
    assert tb_backfill.scrape_labels("h", {"job": "j"}) == {"host": "h", "job": "j"}


def test_find_event_files(tmp_path):
    tb = tmp_path / "run" / "tensorboard" / "run"
    deep = tmp_path / "a" / "b" / "c"
    for d in (tb, deep):
        d.mkdir(parents=True)
    (tb / "events.out.tfevents.1700000000.h").write_bytes(b"")
    (tb / "events.out.tfevents.1700000500.h.profile-empty").write_bytes(b"")
    (deep / "events.out.tfevents.1700000100.h").write_bytes(b"")
    (tmp_path / "events.out.tfevents.1699999000.h").write_bytes(b"")

    def names(paths):
        return [Path(p).name for p in paths]

    assert names(tb_events.find_event_files(str(tmp_path))) == [
        "events.out.tfevents.1699999000.h",
        "events.out.tfevents.1700000000.h",
        "events.out.tfevents.1700000100.h",
    ]
    assert names(tb_events.find_event_files(str(tmp_path), quick=True)) == [
        "events.out.tfevents.1699999000.h",
        "events.out.tfevents.1700000000.h",
    ]
    assert names(tb_events.find_event_files(str(tmp_path), since=1700000050)) == ["events.out.tfevents.1700000100.h"]


def bridge(*args, env=None, timeout=60):
    return subprocess.run(
        [str(JOBKIT), "tb-bridge", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def test_backfill_errors(tmp_path):
    proc = bridge("backfill", "--logdir", tmp_path, "--tsdb", tmp_path, "--label", "job=x")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("jobkit tb-bridge backfill: no TensorBoard event file")
    proc = bridge("backfill", "--logdir", FIXTURE_DIR, "--tsdb", tmp_path / "nope")
    assert (
        proc.returncode == 1
        and proc.stderr == f"jobkit tb-bridge backfill: TSDB dir {tmp_path / 'nope'} does not exist\n"
    )
    proc = bridge("backfill", "--logdir", FIXTURE_DIR, "--tsdb", tmp_path, "--promtool", tmp_path / "promtool")
    assert (
        proc.returncode == 1
        and proc.stderr
        == f"jobkit tb-bridge backfill: promtool {tmp_path / 'promtool'} is not an executable file; pass a promtool binary\n"
    )
    proc = bridge("backfill", "--logdir", FIXTURE_DIR, "--tsdb", tmp_path, "--label", "bad-name=1")
    assert proc.returncode == 1 and "expected NAME=VALUE" in proc.stderr


def test_backfill_dry_run_is_openmetrics():
    proc = bridge(
        "backfill",
        "--logdir",
        FIXTURE_DIR,
        "--tsdb",
        "/nonexistent",
        "--dry-run",
        "--label",
        "host=vm",
        "--label",
        "job=exporters",
        "--label",
        "instance=10.0.0.1:9500",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "# EOF"
    loss = [ln for ln in lines if ln.startswith("tb_learning_loss{")]
    assert loss[0] == (
        'tb_learning_loss{host="vm",instance="10.0.0.1:9500",job="exporters"} 6.044634819030762 1795412855.815'
    )
    assert len(loss) == 6 and len([ln for ln in lines if ln.startswith("tb_step{")]) == 6
    assert not any(ln.startswith(tb_events.FILL_METRIC) for ln in lines)


# ---- the serve daemon -------------------------------------------------------------------------------------
def start_serve(logdir, out, parent, interval=0.1, since=0):
    log = open(f"{out}.log", "w")
    proc = subprocess.Popen(
        [
            str(JOBKIT),
            "tb-bridge",
            "serve",
            "--logdir",
            str(logdir),
            "--host",
            "n1",
            "--out",
            str(out),
            "--interval",
            str(interval),
            "--parent-pid",
            str(parent),
            "--since",
            str(since),
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


def f32(x):
    """x as stored in a simple_value (float32)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def sample_line(text, name):
    return next((ln for ln in text.splitlines() if ln.startswith(name + "{")), None)


def read_or_empty(path):
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""


def test_serve_follows_the_file_and_exits_with_its_parent(tmp_path):
    logdir = tmp_path / "job" / "run" / "tensorboard" / "run"
    out = tmp_path / "tb.prom"
    parent = subprocess.Popen(["sleep", "60"])
    daemon = start_serve(tmp_path / "job", out, parent.pid)
    try:
        wait_for(lambda: (tmp_path / "tb.prom.pid").exists(), 10, "daemon pid file")
        time.sleep(0.5)
        assert not out.exists()  # no event file yet: nothing to say
        assert int((tmp_path / "tb.prom.pid").read_text()) == daemon.pid
        writer = new_writer(logdir)
        t0 = time.time()
        write_steps(writer, range(3), t0)  # found by the 2 s re-glob
        wall = t0 + 0.2
        line = wait_for(lambda: sample_line(read_or_empty(out), "tb_learning_loss"), 10, "first exposition")
        assert line == f'tb_learning_loss{{host="n1"}} {f32(10.0 / 3)!r} {round(wall * 1000)}'
        write_steps(writer, [3], t0)
        want = f'tb_learning_loss{{host="n1"}} 2.5 {round((t0 + 0.3) * 1000)}'
        wait_for(lambda: sample_line(read_or_empty(out), "tb_learning_loss") == want, 5, "step 3")
        assert sample_line(out.read_text(), "tb_step") == f'tb_step{{host="n1"}} 3.0 {round((t0 + 0.3) * 1000)}'
        writer.close()
        parent.kill()
        parent.wait()
        assert daemon.wait(5) == 0
        assert not out.exists() and not (tmp_path / "tb.prom.pid").exists()
        assert f"exiting (parent pid {parent.pid} exited)" in (tmp_path / "tb.prom.log").read_text()
    finally:
        for p in (daemon, parent):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_serve_moves_to_a_newer_event_file(tmp_path, monkeypatch):
    """A second training run in the same job dir: the daemon notices the newer file at its next look."""
    old = tmp_path / "job" / "run" / "tensorboard" / "tiny"  # the fixture run: left as it was
    shutil.copytree(FIXTURE_DIR / "tiny", tmp_path / "job" / "run", dirs_exist_ok=True)
    out = tmp_path / "tb.prom"
    clock = [1000.0]
    monkeypatch.setattr(tb_serve.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(tb_serve.os, "setsid", lambda: None)
    polls = []

    def fake_select(r, w, x, timeout):
        polls.append(out.read_text() if out.exists() else "")
        if len(polls) == 2:  # a newer run starts writing; a minute passes
            newer = tmp_path / "job" / "run" / "tensorboard" / "run2"
            writer = new_writer(newer)
            write_steps(writer, [0], 1795412999.0, wait=False)  # time.monotonic is frozen here
            writer.close()  # flushes to disk
            clock[0] += 61
        if len(polls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return [], [], []

    monkeypatch.setattr(tb_serve.select, "select", fake_select)
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        assert tb_serve.serve(str(tmp_path / "job"), "n1", str(out), interval=0.05) == 0
    finally:
        signal.set_wakeup_fd(-1)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    assert 'tb_step{host="n1"} 5.0 1795412855889' in polls[0]
    assert 'tb_step{host="n1"} 0.0 1795412999000' in polls[2] and "tb_learning_lm_loss" not in polls[2]
    assert old.exists()


def test_serve_stops_on_sigterm_and_honours_since(tmp_path):
    shutil.copytree(FIXTURE_DIR, tmp_path / "job")
    out = tmp_path / "tb.prom"
    daemon = start_serve(tmp_path / "job", out, os.getpid(), since=1795412856)  # the fixture is 1 s older
    try:
        wait_for(lambda: (tmp_path / "tb.prom.pid").exists(), 10, "daemon pid file")
        time.sleep(0.5)
        assert not out.exists()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(5) == 0
        assert "exiting (signal SIGTERM)" in (tmp_path / "tb.prom.log").read_text()
        assert not (tmp_path / "tb.prom.pid").exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


# ---- live scrape, stop, backfill, view: against a real Prometheus --------------------------------------------
def stop_pid(pid, sig=signal.SIGTERM, timeout=10):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    wait_for(lambda: not pid_alive(pid), timeout, f"pid {pid} to exit")


def test_live_scrape_then_backfill_holds_every_step_once(tmp_path, prometheus_installed):
    host = socket.gethostname().split(".", 1)[0]
    ws = tmp_path / "ws"
    job = ws / "local_20261123_000000_beef-JAX-tiny"
    tbdir = job / "tiny" / "tensorboard" / "tiny"
    tbdir.mkdir(parents=True)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "tb_metrics_plugin.py").symlink_to(REPO / "utils" / "plugins" / "tb_metrics_plugin.py")
    env = dict(
        os.environ,
        OUTPUT_PATH=str(job),
        NODE_RANK="0",
        JOB_WORKSPACE=str(ws),
        JOB_DIR=job.name,
        JOB_ID="local_20261123_000000_beef",
        TMPDIR=str(tmp_path),
        VENV_DIR=str(Path(sys.executable).parents[1]),
    )
    targets = job / "prometheus" / "targets"
    exp = subprocess.Popen(
        [
            str(REPO / "utils" / "metrics_exporter.sh"),
            "--address",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--interval",
            "1",
            "--sd-dir",
            str(targets),
            "--plugins-dir",
            str(plugins),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "exporter.log", "w"),
    )
    prom_pid = view = None
    try:
        sd = wait_for(
            lambda: (targets / f"{host}.json").exists() and json.loads((targets / f"{host}.json").read_text()),
            15,
            "exporter's file_sd entry",
        )
        instance = sd[0]["targets"][0]
        start = subprocess.run(
            [
                "bash",
                "-c",
                f'source {PROM_LIB} && prometheus_start "$1" --port "$2" --scrape-interval 1s',
                "start",
                job,
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert start.returncode == 0, start.stderr
        prom_port = int(start.stdout.strip())
        prom_pid = int((job / "prometheus" / "prometheus.pid").read_text())

        # Prometheus sends its first scrape a few seconds after start (discovery updates are batched)
        wait_for(
            lambda: api(prom_port, "/api/v1/query", query='up{job="exporters"} == 1')["result"],
            20,
            "the first scrape of the exporter",
        )
        steps = 16
        writer = new_writer(tbdir)
        for s in range(steps):  # ~0.3 s a step: the 1 s scrapes see only some steps
            writer.add_scalar("learning/loss", 10.0 / (s + 1), s)
            writer.add_scalar("perf/step_time_seconds", 0.3 + s / 1000, s)
            writer.add_text("config", "tiny", s)
            writer.flush()
            time.sleep(0.3)
        writer.close()
        events = scalars_by_tag(event_file(tbdir))
        loss_events = [(tb_events.to_ms(e.wall_time), e.value) for e in events["learning/loss"]]
        assert len(loss_events) == steps

        def scraped_last_step():
            res = api(prom_port, "/api/v1/query", query="tb_step")["result"]
            return res and res[0]["value"][1] == str(steps - 1) and res

        wait_for(scraped_last_step, 20, "the last step to be scraped")
        t_live = time.time()
        live = api(prom_port, "/api/v1/query", query="tb_learning_loss[1h]", time=t_live)["result"]
        assert len(live) == 1
        live_labels = live[0]["metric"]
        live_ms = [round(float(t) * 1000) for t, _ in live[0]["values"]]
        assert set(live_ms) <= {ms for ms, _ in loss_events}  # the scraped sample times are the events' own
        assert 2 <= len(live_ms) < steps  # some steps were scraped live (to be merged), most were not
        cycles_live = api(
            prom_port, "/api/v1/query", query="count_over_time(hw_exporter_cycles_total[1h])", time=t_live
        )["result"][0]["value"][1]
        print(f"live scrape saw {len(live_ms)} of {steps} steps; labels {live_labels}")

        labels = ["--label", f"host={host}", "--label", "job=exporters", "--label", f"instance={instance}"]
        busy = bridge("backfill", "--logdir", job, "--tsdb", job / "prometheus", *labels, timeout=120)
        assert busy.returncode == 1 and busy.stderr == (
            f"jobkit tb-bridge backfill: {job / 'prometheus'} is in use by a running Prometheus (pid {prom_pid}): "
            "stop it before the backfill\n"
        ), busy.stderr
        stop = subprocess.run(
            ["bash", "-c", f"source {PROM_LIB} && prometheus_stop {job}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert stop.returncode == 0 and not pid_alive(prom_pid), stop.stderr
        t0 = time.monotonic()
        fill = bridge("backfill", "--logdir", job, "--tsdb", job / "prometheus", *labels, timeout=120)
        print(f"backfill: {time.monotonic() - t0:.1f}s: {fill.stdout}{fill.stderr}")
        assert fill.returncode == 0, fill.stderr
        assert f"({steps} steps)" in fill.stdout and "backfilled 48 samples in 3 series" in fill.stdout

        view = View(job, free_port(), env=env)
        at = time.time()
        counts = view.query("count_over_time(tb_learning_loss[1h])", at)
        assert [c["value"][1] for c in counts] == [str(steps)]  # one series, every step exactly once
        assert counts[0]["metric"] == {k: v for k, v in live_labels.items() if k != "__name__"}
        assert view.query("count_over_time(tb_step[1h])", at)[0]["value"][1] == str(steps)
        (series,) = view.query("tb_learning_loss[1h]", at)
        got = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        assert got == [(ms, pytest.approx(v)) for ms, v in loss_events]
        # the other metrics recorded before the backfill are all still there (the WAL was persisted first)
        cycles = view.query("count_over_time(hw_exporter_cycles_total[1h])", t_live)[0]["value"][1]
        assert cycles == cycles_live
    finally:
        if view:
            view.stop()
        if prom_pid and pid_alive(prom_pid):
            os.kill(prom_pid, signal.SIGKILL)
        stop_pid(exp.pid)  # the TensorBoard plugin's worker ends with it (end of its input)
        exp.wait()


def _record_offsets(data):
    """Byte offset of each TFRecord in an event file's bytes."""
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 12 + int.from_bytes(data[pos : pos + 8], "little") + 4
    return offsets


def test_damaged_record_keeps_the_steps_before_it_and_stops_there(tmp_path):
    writer = new_writer(tmp_path / "src")
    write_steps(writer, range(3), 1700000000.0)
    writer.close()
    data = bytearray(event_file(tmp_path / "src").read_bytes())
    # Records: file_version, then loss and step time per step. Damage step 1's loss record (record 3).
    third = _record_offsets(bytes(data))[3]
    data[third + 14] ^= 0xFF
    path = tmp_path / "events.out.tfevents.1700000000.h"
    path.write_bytes(bytes(data))

    reader = tb_events.ScalarReader(str(path))
    got = []
    with pytest.raises(tb_events.CorruptRecord, match="bad record CRC"):
        got.extend(reader.read())
    assert [(s.tag, s.step) for s in got] == [("learning/loss", 0), ("perf/step_time_seconds", 0)]
    assert reader.damaged and reader.poll() == [], "a damaged file yields nothing more"

    # Backfill's reading: the steps before the damage, and the damage logged.
    logged = []
    series, _fold = tb_backfill.collect_series([str(path)], log=logged.append)
    assert {name: [v for _ms, v in points] for name, (_tag, points) in series.items()} == {
        "tb_learning_loss": [10.0],
        "tb_perf_step_time_seconds": [pytest.approx(0.5)],
        "tb_step": [0.0],
    }
    assert len(logged) == 1 and "bad record CRC" in logged[0] and "using the steps before it" in logged[0]


def test_usage_errors_exit_2():
    proc = bridge("serve", "--logdir", "x", "--host", "h", "--out", "y", "--interval", "0")
    assert proc.returncode == 2 and "Invalid value for '--interval'" in proc.stderr
    proc = bridge("backfill", "--tsdb", "x")
    assert proc.returncode == 2 and "Missing option '--logdir'" in proc.stderr


def test_without_tensorboard_one_line(tmp_path):
    """An interpreter where `import tensorboard` fails (a sitecustomize blocks it) gets one line, no traceback."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    env = {"PYTHONPATH": str(tmp_path)}  # only to load the blocker into the venv's interpreter
    proc = bridge("backfill", "--logdir", FIXTURE_DIR, "--tsdb", tmp_path, "--dry-run", env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("jobkit tb-bridge backfill: cannot import TensorBoard's event protos (")
    assert "install tensorboard into" in line
    # help still works: nothing imports TensorBoard before a command reads an event file
    assert bridge("serve", "--help", env=env).returncode == 0


def test_learned_record_layout_reads_what_protobuf_reads(tmp_path):
    """The offset-based reading of plain simple_value events gives exactly what decoding every record does."""
    writer = SummaryWriter(str(tmp_path))
    steps = [0, 1, 127, 128, 16383, 16384, 2**31 + 5]  # varint steps of 0 (absent) to 5 bytes
    for i, step in enumerate(steps):
        writer.add_scalar("learning/loss", 1.0 / (i + 1), step, walltime=1700000000.0 + i)
        writer.add_scalar("a/much/longer/tag/name", float("nan") if i == 3 else -i * 1e9, step, walltime=1.7e9 + i)
        writer.add_text("config", "x", step)
    writer.close()
    path = str(event_file(tmp_path))
    fast = list(tb_events.ScalarReader(path).read_tuples())
    Event = tb_events.event_class()
    slow = []
    for data in tb_events.RecordReader(path).records():
        event = Event.FromString(data)
        for v in event.summary.value:
            if v.WhichOneof("value") == "simple_value":
                slow.append((v.tag, event.step, event.wall_time, v.simple_value))
    assert len(fast) == 2 * len(steps) and [s[:3] for s in fast] == [s[:3] for s in slow]
    assert all(a[3] == b[3] or (math.isnan(a[3]) and math.isnan(b[3])) for a, b in zip(fast, slow, strict=True))

    # the backfill's fold stores what the live fold yields
    points = {}
    tb_events.Fold().collect(fast, points)
    expected = {}
    for name, _tag, ms, value in tb_events.Fold().samples(fast):
        expected.setdefault(name, {})[ms] = value
    assert points.keys() == expected.keys() and points["tb_step"] == expected["tb_step"]
    assert points["tb_learning_loss"] == expected["tb_learning_loss"]


def _series_record_by_record(files):
    """What collect_series gave before the column reader: Fold.collect over every file, then sorted."""
    points, fold = {}, tb_events.Fold()
    for path in files:
        fold.step = None
        fold.collect(tb_events.ScalarReader(path).read_tuples(), points)
    tags = {name: tag for tag, name in fold.names.items() if name}
    return {name: (tags.get(name), sorted(by_ms.items())) for name, by_ms in points.items() if by_ms}


@pytest.mark.parametrize("block", [1 << 16, 5])  # 5: the records read a few at a time, cut mid-step
def test_column_reader_gives_what_the_record_reader_gives(tmp_path, monkeypatch, block):
    """The backfill's numpy reader and fold (tb_columns) against the record-by-record ones: varint steps of 0 to 5
    bytes, a NaN, text summaries between scalars, two tags with one metric name, a step repeated at one ms, a
    second file that restarts the steps and rewrites an earlier ms (the later file wins)."""
    monkeypatch.setattr(tb_columns, "_READ_BLOCK", block)
    files = []
    for run, base in ((0, 1700000000.0), (1, 1700000000.0)):
        writer = SummaryWriter(str(tmp_path / f"run{run}"))
        for i, step in enumerate([0, 1, 127, 128, 16383, 16384, 2**31 + 5]):
            writer.add_scalar("learning/loss", 1.0 / (i + 1) + run, step, walltime=base + i)
            writer.add_scalar("learning-loss", 7.0, step, walltime=base + i)  # tb_learning_loss is taken
            writer.add_scalar("x/y", float("nan") if i == 3 else -i * 1e9, step, walltime=base + i + 0.0004)
            writer.add_text("config", "x", step)
        writer.add_scalar("x/y", 5.0, 9, walltime=base + 0.0004)  # the same ms as step 0's x/y: the later wins
        writer.close()
        files.append(str(event_file(tmp_path / f"run{run}")))
    assert tb_columns.read_columns(files[0]) is not None, "a clean file is read as columns"
    got, _fold = tb_backfill.collect_series(files)
    expected = _series_record_by_record(files)
    assert got.keys() == expected.keys() == {"tb_learning_loss", "tb_x_y", "tb_step"}
    for name, (tag, points) in expected.items():
        assert got[name][0] == tag
        assert [ms for ms, _ in got[name][1]] == [ms for ms, _ in points]
        assert all(
            a == b or (math.isnan(a) and math.isnan(b)) for (_, a), (_, b) in zip(got[name][1], points, strict=True)
        )


def test_record_starts_guessed_by_pattern_are_the_ones_a_record_loop_finds():
    """tb_columns guesses that record lengths repeat; every way the guess can break must give the plain loop's
    answer: a period of 3, a run of another length, a period of 1, a shorter pattern, a half-written record."""
    lengths = [20, 31, 5] * 90 + [7] * 5 + [20, 31, 5] * 40 + [9] * 200 + [1, 2] * 70 + [300]
    buf = b"".join(struct.pack("<QI", n, 0) + bytes(n) + b"\0\0\0\0" for n in lengths)
    for cut in (len(buf), len(buf) - 3, len(buf) - 316, 15, 16, 0):
        part = buf[:cut]
        want_starts, want_lengths, pos = [], [], 0
        while len(part) - pos >= 12 and pos + 16 + struct.unpack_from("<Q", part, pos)[0] <= len(part):
            want_starts.append(pos)
            want_lengths.append(struct.unpack_from("<Q", part, pos)[0])
            pos += 16 + want_lengths[-1]
        starts, got_lengths, rest = tb_columns._record_starts(part)
        assert (starts.tolist(), got_lengths.tolist(), rest) == (want_starts, want_lengths, pos), cut


@pytest.mark.parametrize("block", [7, 4096])
@pytest.mark.parametrize("length", [15, 38])
def test_record_crcs_by_column_are_the_c_crcs_and_catch_one_flipped_bit(length, block, monkeypatch):
    import numpy as np

    monkeypatch.setattr(tb_columns, "_CRC_BLOCK", block)  # blocks that end mid-file and a last short one

    rng = np.random.default_rng(length)
    data = [rng.bytes(length) for _ in range(64 * length)]  # enough records of one length for the table path
    buf = b"".join(
        struct.pack("<Q", length)
        + struct.pack("<I", tb_events.masked_crc32c(struct.pack("<Q", length)))
        + d
        + struct.pack("<I", tb_events.masked_crc32c(d))
        for d in data
    )
    arr = np.frombuffer(buf, dtype=np.uint8)
    starts = np.arange(len(data), dtype=np.int64) * (length + 16)
    got = tb_columns._data_crcs(buf, arr, starts + 12, length)
    crc32c = tb_events._crc32c or tb_events._tensorboard_crc32c
    assert got.tolist() == [crc32c(d) for d in data]
    lengths = np.full(len(data), length, dtype=np.int64)
    assert tb_columns._crcs_ok(buf, arr, starts, lengths)
    flipped = bytearray(buf)
    flipped[int(starts[777]) + 12 + length - 1] ^= 0x10
    assert not tb_columns._crcs_ok(bytes(flipped), np.frombuffer(bytes(flipped), dtype=np.uint8), starts, lengths)


@pytest.mark.parametrize("head", [1024, 3])  # 3: most groups are first seen past the rows matched at once
@pytest.mark.parametrize(("distinct", "width"), [(1, 3), (5, 20), (64, 9), (200, 17), (3, 0)])
def test_distinct_rows_group_as_a_sort_does(distinct, width, head, monkeypatch):
    import numpy as np

    monkeypatch.setattr(tb_columns, "_HEAD_ROWS", head)

    rng = np.random.default_rng(distinct)
    table = rng.integers(0, 256, (distinct, width), dtype=np.uint8)
    if distinct > 1 and width:
        table[1] = table[0]
        table[1, -1] ^= 1  # two rows one bit apart
    rows = table[rng.integers(0, distinct, 5000)]
    first, inverse = tb_columns._distinct_rows(rows)
    assert (rows == rows[first[inverse]]).all()  # every row is its group's first row
    assert len({rows[i].tobytes() for i in first.tolist()}) == len(first)  # no two groups alike
    assert len(first) == len({r.tobytes() for r in rows})


def test_the_protobuf_free_shape_check_only_answers_where_protobuf_agrees():
    """tb_columns reads the first record of a shape without protobuf when its bytes are the canonical form;
    wherever it answers (a tag, or None for a file_version event), protobuf must answer the same."""
    import random

    rnd = random.Random(5)
    event = tb_events.event_class()
    answered = 0
    for _ in range(1500):
        ev = event(wall_time=rnd.random() * 2e9, step=rnd.choice([0, 1, 127, 128, 2**31, 2**62, -1]))
        if rnd.random() < 0.2:
            ev.file_version = rnd.choice(["brain.Event:2", "\u00e9" * rnd.randint(1, 200)])
        else:
            tag = rnd.choice(["a", "learning/loss", "x" * rnd.randint(0, 300), "\u00e9/\u00df", ""])
            ev.summary.value.add(tag=tag, simple_value=rnd.choice([0.0, -0.0, 1.5, math.nan, math.inf, 3.4e38]))
        data = ev.SerializeToString()
        flipped = bytearray(data)
        flipped[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
        for d in (data, bytes(flipped), data[:-1], data + b"\0", data[:-4] + struct.pack("<I", 0x7FA00001)):
            fast = tb_columns._plain_tag(d)
            if fast is not tb_columns._UNSURE:
                answered += 1
                assert fast == tb_events.ScalarReader._plain_simple_value(d), d
    assert answered > 1000  # it does answer the usual records


def test_column_reader_leaves_a_tensor_scalar_file_to_the_record_reader(tmp_path):
    """A scalars-plugin tensor (not a plain simple_value) makes the column reader decline the file."""
    writer = SummaryWriter(str(tmp_path))
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    value = summary_pb2.Summary.Value(
        tag="t", tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[2.5]), metadata=meta
    )
    writer._get_file_writer().add_summary(summary_pb2.Summary(value=[value]), 3, walltime=1700000000.0)
    writer.add_scalar("learning/loss", 1.0, 3, walltime=1700000000.0)
    writer.close()
    path = str(event_file(tmp_path))
    assert tb_columns.read_columns(path) is None
    got, _fold = tb_backfill.collect_series([path])
    assert got == _series_record_by_record([path]) and got["tb_t"][1] == [(1700000000000, 2.5)]


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "-1", "abc"])
def test_serve_refuses_an_interval_that_is_not_a_positive_finite_number(interval, tmp_path):
    from click.testing import CliRunner

    from jobkit.observe.tb_bridge import group

    args = ["serve", "--logdir", str(tmp_path), "--host", "h", "--out", str(tmp_path / "o"), "--interval", interval]
    result = CliRunner().invoke(group, args)
    assert result.exit_code == 2
    assert "Invalid value for '--interval'" in result.output
    assert "not a finite number of seconds" in result.output or "is not in the range 0.0<x<=" in result.output
    assert not (tmp_path / "o").exists()
