"""The Python host, GPU and TensorBoard plugins against the bash plugins' recorded output
(tests/fixtures/metrics/golden/), and the engine's long-lived workers for ``*_metrics_plugin.py``: same page, failure
isolation, timeouts."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO
from test_exporter import HOST, _alive, exporter  # noqa: F401  (exporter is a fixture)

from jobkit.observe import exporter as engine

FIX = REPO / "tests" / "fixtures" / "metrics"
GOLDEN = FIX / "golden"
PLUGINS = REPO / "utils" / "plugins"


def _run(plugin, env, *args):
    return subprocess.run(
        [sys.executable, str(PLUGINS / f"{plugin}_metrics_plugin.py"), *args],
        capture_output=True,
        timeout=30,
        env=dict(os.environ, **env),
    )


@pytest.mark.parametrize(
    "plugin, env, golden",
    [
        ("host", {"HOST_METRICS_ROOT": str(FIX / "host")}, "host.host.prom"),
        ("gpu", {"GPU_METRICS_ROOT": str(FIX / "mi300x")}, "mi300x.gpu.prom"),
    ],
)
def test_plugin_output_is_the_bash_plugins_byte_for_byte(plugin, env, golden):
    done = _run(plugin, env, "n1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (GOLDEN / golden).read_bytes()


def test_gpu_plugin_nvidia_output_is_the_bash_plugins_byte_for_byte(tmp_path):
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/bash\ncat {FIX / 'nvidia-smi-query-gpu-h100x8.csv'}\n")
    stub.chmod(0o755)
    env = {"GPU_METRICS_ROOT": str(tmp_path / "empty"), "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    done = _run("gpu", env, "n1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (GOLDEN / "h100x8.gpu.prom").read_bytes()


def test_usage_errors_exit_2():
    assert _run("host", {}).returncode == 2
    assert _run("gpu", {}, "").returncode == 2


def test_a_full_cycle_on_the_8_gpu_tree_serves_the_recorded_page(monkeypatch):
    """The engine with the repo's plugins on node8 (8 MI300X, 8 RDMA devices): the plugins' part of /metrics is the
    page the bash plugins made (golden/node8.page.prom), on the first cycle (worker started) and the next ones
    (the same worker asked again)."""
    monkeypatch.setenv("HOST_METRICS_ROOT", str(FIX / "node8"))
    monkeypatch.setenv("GPU_METRICS_ROOT", str(FIX / "node8"))
    monkeypatch.delenv("OUTPUT_PATH", raising=False)
    e = engine.Exporter("127.0.0.1", 0, 10.0, 5.0, str(engine.DEFAULT_PLUGINS_DIR))
    e.host = "n1"
    golden = (GOLDEN / "node8.page.prom").read_bytes()
    try:
        e.run_cycle()
        workers = {p.name: p.worker.pid for p in e.plugins.values() if p.worker}
        assert set(workers) == {"gpu", "host"}
        for _ in range(2):
            assert e.page == golden
            e.run_cycle()
        assert {p.name: p.worker.pid for p in e.plugins.values() if p.worker} == workers  # no new process per cycle
        assert {p.name: p.up for p in e.plugins.values() if not p.disabled} == {"gpu": 1, "host": 1}
        page = e.render_page().decode()
        assert 'hw_plugin_up{host="n1",plugin="gpu"} 1.0' in page
        assert page.startswith(golden.decode())
    finally:
        e.cleanup()
    assert not any(_alive(pid) for pid in workers.values())


def _pyplugin(directory, name, body):
    path = directory / f"{name}_metrics_plugin.py"
    path.write_text(body)
    return path


def test_python_plugins_are_isolated_timed_out_and_restarted(exporter, tmp_path):  # noqa: F811
    """A hanging .py plugin is timed out (its worker's process group killed, a new worker next cycle), one that
    raises is replayed, one that prints cannot break the answer, and a good one keeps its single worker."""
    pids = tmp_path / "pids"
    e = exporter()
    _pyplugin(
        e.plugins,
        "good",
        "import os\nN = [0]\ndef collect(host, state):\n    N[0] += 1\n"
        "    return f'good_m{{host=\"{host}\"}} {N[0]}\\n# STATE {os.getpid()}\\n'\n",
    )
    _pyplugin(
        e.plugins,
        "hang",
        f"import os, time\ndef collect(host, state):\n    if state is None:\n        return 'hang_m 7\\n# STATE hung\\n'\n"
        f"    open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n    time.sleep(100)\n",
    )
    _pyplugin(
        e.plugins,
        "noisy",
        "def collect(host, state):\n    print('not exposition')\n"
        "    if state == 'x':\n        raise RuntimeError('boom')\n    return 'noisy_m 1\\n# STATE x\\n'\n",
    )
    e.start()
    e.wait_page(r"^good_m\{[^}]*\} [5-9]$", timeout=20)
    page = e.page()
    assert "hang_m 7\n" in page and "noisy_m 1\n" in page
    assert f'hw_plugin_up{{host="{HOST}",plugin="hang"}} 0' in page
    assert f'hw_plugin_up{{host="{HOST}",plugin="noisy"}} 0' in page
    assert f'hw_plugin_up{{host="{HOST}",plugin="good"}} 1' in page
    log = e.text()
    assert "plugin hang timed out after 0.5s (process group killed); replaying its last good output" in log
    assert "RuntimeError: boom" in log and "not exposition" in log
    hung = [int(p) for p in pids.read_text().split()]
    assert len(hung) >= 2 and len(set(hung)) == len(hung)  # a fresh worker after each kill
    assert not any(_alive(p) for p in hung[:-1])
    assert e.stop() == 0
    assert not _alive(hung[-1])


def test_python_plugin_exit_99_retires_it_and_a_changed_file_is_reloaded(exporter, tmp_path):  # noqa: F811
    e = exporter()
    _pyplugin(e.plugins, "retire", "def collect(host, state):\n    raise SystemExit(99)\n")
    live = _pyplugin(e.plugins, "live", "def collect(host, state):\n    return 'live_m 1\\n'\n")
    e.start()
    e.wait_page(r"^live_m 1$")
    e.wait_page(r'hw_exporter_cycles_total\{host="[^"]*"\} [3-9]')
    assert "plugin retire exited 99: it will not be called again" in e.text()
    assert 'plugin="retire"' not in e.page()
    time.sleep(0.01)  # a later mtime than the first write, on filesystems with coarse stamps
    live.write_text("def collect(host, state):\n    return 'live_m 2\\n'\n")
    os.utime(live, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    e.wait_page(r"^live_m 2$")
    assert e.stop() == 0


def test_a_py_plugin_shadows_the_sh_plugin_of_the_same_name(tmp_path):
    (tmp_path / "same_metrics_plugin.sh").write_text("#!/bin/bash\necho sh_m 1\n")
    (tmp_path / "same_metrics_plugin.py").write_text("def collect(host, state):\n    return 'py_m 1\\n'\n")
    (tmp_path / "other_metrics_plugin.sh").write_text("#!/bin/bash\necho other_m 1\n")
    e = engine.Exporter("127.0.0.1", 0, 10.0, 5.0, str(tmp_path))
    assert sorted(os.path.basename(p.path) for p in e._discover()) == [
        "other_metrics_plugin.sh",
        "same_metrics_plugin.py",
    ]
    assert re.fullmatch(r"same", e.plugins[str(tmp_path / "same_metrics_plugin.py")].name)


# ---- the TensorBoard plugin ----------------------------------------------------------------------------------
TB_TINY = REPO / "tests" / "fixtures" / "tensorboard" / "tiny"
MAKE_EVENTS = REPO / "bench" / "make_event_file.py"
TB_EVENT = "run/tensorboard/run/events.out.tfevents.1700000000.n1"


def _tb_job(tmp_path, monkeypatch):
    """A job's own OUTPUT_PATH (JOB_WORKSPACE/JOB_DIR) on rank 0."""
    out = tmp_path / "ws" / "job"
    out.mkdir(parents=True)
    for name, value in (("JOB_WORKSPACE", tmp_path / "ws"), ("JOB_DIR", "job"), ("OUTPUT_PATH", out)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("NODE_RANK", "0")
    return out


def _events(path, steps):
    """bench/make_event_file.py's file of STEPS steps x 6 scalars (one of fewer steps is a byte prefix of it)."""
    subprocess.run([sys.executable, str(MAKE_EVENTS), str(path), str(steps), "6"], check=True, timeout=60)
    return path.read_bytes()


def _tb_module():
    """A fresh copy of the plugin module, as a new worker loads it."""
    spec = importlib.util.spec_from_file_location("tb_plugin_under_test", PLUGINS / "tb_metrics_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _body_and_state(text):
    body, _, state = text.rpartition("# STATE ")
    return body, state


def test_tb_plugin_output_is_the_bash_plugins_byte_for_byte(tmp_path, monkeypatch):
    """A trimmed real MaxText event file: the exposition is what the bash plugin printed (golden/tb.tiny.prom)."""
    out = _tb_job(tmp_path, monkeypatch)
    shutil.copytree(TB_TINY, out / "tiny")
    done = _run("tb", {}, "n1")
    assert done.returncode == 0, done.stderr
    body, state = _body_and_state(done.stdout.decode())
    assert body.encode() == (GOLDEN / "tb.tiny.prom").read_bytes()
    assert state == "tb2 0\n"
    assert b"reading " + str(out / "tiny").encode() in done.stderr


def test_tb_plugin_exits_99_off_rank_0_or_without_output_path_and_2_on_usage_errors(tmp_path):
    assert _run("tb", {"NODE_RANK": "1", "OUTPUT_PATH": str(tmp_path)}, "n1").returncode == 99
    assert _run("tb", {"NODE_RANK": "0", "OUTPUT_PATH": ""}, "n1").returncode == 99
    assert _run("tb", {}).returncode == 2
    assert _run("tb", {}, "--help").stdout == b"Usage: tb_metrics_plugin.py <short hostname>\n"


def test_tb_plugin_worker_reads_only_what_the_file_gained_each_cycle(tmp_path, monkeypatch):
    """One module (one worker) across cycles: the file grows from 20 to 40 steps, the second cycle reads only the
    new records (the reader's offset moved on, 120 more events), and each cycle prints the bash plugin's bytes.
    A record still being written changes nothing until it is whole."""
    out = _tb_job(tmp_path, monkeypatch)
    whole = _events(tmp_path / "e40", 40)
    first = _events(tmp_path / "e20", 20)
    assert whole.startswith(first)
    event = out / TB_EVENT
    event.parent.mkdir(parents=True)
    event.write_bytes(first)
    tb = _tb_module()
    body, state = _body_and_state(tb.collect("n1", None))
    assert body.encode() == (GOLDEN / "tb.bench20.prom").read_bytes()
    reader = tb._reader.reader
    assert (reader._records.offset, reader.records) == (len(first), 1 + 20 * 6)
    with open(event, "ab") as f:
        f.write(whole[len(first) : len(first) + 10])  # part of the next record only
    assert tb.collect("n1", state) == tb.collect("n1", state) == f"{body}# STATE {state}"
    assert reader._records.offset == len(first)
    with open(event, "ab") as f:
        f.write(whole[len(first) + 10 :])
    body, _ = _body_and_state(tb.collect("n1", state))
    assert tb._reader.reader is reader and reader.records == 1 + 40 * 6
    assert body.encode() == (GOLDEN / "tb.bench40.prom").read_bytes()


def test_tb_plugin_reads_a_backlog_over_several_cycles_within_its_limit(tmp_path, monkeypatch):
    """READ_LIMIT bytes a cycle at most: a long file is read over cycles, each cycle's tb_step further on, ending
    on the same bytes as one whole read."""
    out = _tb_job(tmp_path, monkeypatch)
    whole = _events(tmp_path / "e40", 40)
    (out / TB_EVENT).parent.mkdir(parents=True)
    (out / TB_EVENT).write_bytes(whole)
    tb = _tb_module()
    monkeypatch.setattr(tb, "READ_LIMIT", len(whole) // 4)
    steps, state = [], None
    for _ in range(8):
        body, state = _body_and_state(tb.collect("n1", state))
        steps.append(int(float(re.search(r'^tb_step\{host="n1"\} (\S+) ', body, re.M).group(1))))
    assert 3 <= steps.index(39) <= 5 and steps == sorted(steps)  # several cycles, never backwards
    assert body.encode() == (GOLDEN / "tb.bench40.prom").read_bytes()


def test_tb_plugin_outside_the_job_dir_ignores_older_files_and_keeps_since_in_its_state(tmp_path, monkeypatch):
    """A shared OUTPUT_PATH: event files created before the first cycle minus 60 s are older runs', ignored; a
    worker started anew (after a timeout) gets that since back from the STATE and does not move it."""
    out = _tb_job(tmp_path, monkeypatch)
    monkeypatch.setenv("OUTPUT_PATH", str(out / "shared"))
    shutil.copytree(TB_TINY, out / "shared" / "tiny")  # named 1795412855: long before now
    before = int(time.time()) - 60
    text = _tb_module().collect("n1", None)
    since = int(text.removeprefix("# STATE tb2 "))
    assert before <= since <= int(time.time()) - 60 and text == f"# STATE tb2 {since}\n"
    assert _tb_module().collect("n1", "tb2 1795412855").startswith("# HELP tb_step ")
    assert _tb_module().collect("n1", "tb2 1795412856") == "# STATE tb2 1795412856\n"


def test_the_engine_runs_the_tb_plugin_in_one_worker_and_retires_it_off_rank_0(tmp_path, monkeypatch):
    """The repo's plugins dir: on rank 0 the tb plugin is found (.py, no .sh beside it), runs in one worker for
    every cycle and its part of the page is the golden; on rank 1 it is retired after its first request."""
    out = _tb_job(tmp_path, monkeypatch)
    shutil.copytree(TB_TINY, out / "tiny")
    monkeypatch.setenv("HOST_METRICS_ROOT", str(FIX / "node8"))
    monkeypatch.setenv("GPU_METRICS_ROOT", str(FIX / "node8"))
    assert sorted(p.name for p in PLUGINS.glob("tb_metrics_plugin.*")) == ["tb_metrics_plugin.py"]
    golden = (GOLDEN / "tb.tiny.prom").read_bytes()
    e = engine.Exporter("127.0.0.1", 0, 10.0, 5.0, str(PLUGINS))
    e.host = "n1"
    try:
        e.run_cycle()
        tb = next(p for p in e.plugins.values() if p.name == "tb")
        worker = tb.worker.pid
        for _ in range(2):
            assert golden in e.page and (tb.up, tb.state) == (1, "tb2 0")
            e.run_cycle()
        assert tb.worker.pid == worker
    finally:
        e.cleanup()
    assert not _alive(worker)
    monkeypatch.setenv("NODE_RANK", "1")
    e = engine.Exporter("127.0.0.1", 0, 10.0, 5.0, str(PLUGINS))
    try:
        e.run_cycle()
        tb = next(p for p in e.plugins.values() if p.name == "tb")
        assert tb.disabled and tb.worker is None and b"tb_step" not in e.page
    finally:
        e.cleanup()
