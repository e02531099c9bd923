"""The Python host and GPU plugins against the bash plugins' recorded output (tests/fixtures/metrics/golden/), and
the engine's long-lived workers for ``*_metrics_plugin.py``: same page, failure isolation, timeouts."""

import os
import re
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
