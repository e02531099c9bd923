"""utils/metrics_exporter.sh + `jobkit exporter`: real processes on loopback, each stopped by PID."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO
from prometheus_client.parser import text_string_to_metric_families

from jobkit.cli import main as jobkit_main
from jobkit.observe import exporter as engine
from jobkit.observe.exporter import parse_output

EXPORTER = REPO / "utils" / "metrics_exporter.sh"
JOBKIT = Path(sys.executable).parent / "jobkit"  # the venv's console script
HOST = socket.gethostname().split(".", 1)[0]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _port_pair():
    """A port P such that P and P+1 are both free on loopback right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no pair of free loopback ports")


def _get(port, path="/metrics"):
    """(status, body) of an HTTP GET on 127.0.0.1:port; (None, '') when nothing answers."""
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""


def _wait(pred, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _plugin(directory, name, body):
    path = directory / f"{name}_metrics_plugin.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Exporter:
    def __init__(self, tmp_path, *extra, port=None, watchdog=False):
        self.port = port or _port_pair()
        self.log = tmp_path / f"exporter-{self.port}.log"
        self.plugins = tmp_path / "plugins"
        self.plugins.mkdir(exist_ok=True)
        argv = [str(EXPORTER)] + (["--watchdog"] if watchdog else [])
        argv += [
            "--address",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--interval",
            "0.5",
            "--timeout",
            "1",
            "--plugins-dir",
            str(self.plugins),
            *extra,
        ]
        self._argv = argv
        self.proc = None

    def start(self):
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        return self

    def text(self):
        return self.log.read_text()

    def page(self, port=None):
        return _get(port or self.port)[1]

    def wait_page(self, pattern, port=None, timeout=10.0):
        return _wait(lambda: re.search(pattern, self.page(port), re.M), timeout, f"/metrics to match {pattern!r}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None


@pytest.fixture
def exporter(tmp_path):
    started = []

    def make(*extra, **kw):
        e = Exporter(tmp_path, *extra, **kw)
        started.append(e)
        return e

    yield make
    for e in started:
        e.stop()


def test_parse_output_keeps_exposition_and_state():
    kept, state, dropped = parse_output(
        '# HELP m A metric\n# TYPE m gauge\nm{host="h",gpu="0"} 1.5\nm2 -3e-2 1700000000000\n'
        'm3{a="x\\"y"} NaN\n# just a comment\n\n# STATE a|b|1\n'
        '9bad 1\nm{host="h"} twelve\nm 1_000\nm{host=h} 1\nno value\n# TYPE m sometype\n'
    )
    assert kept == [
        "# HELP m A metric",
        "# TYPE m gauge",
        'm{host="h",gpu="0"} 1.5',
        "m2 -3e-2 1700000000000",
        'm3{a="x\\"y"} NaN',
    ]
    assert state == "a|b|1"
    assert len(dropped) == 6


def test_serves_two_plugins_and_404_elsewhere(exporter):
    e = exporter()
    _plugin(e.plugins, "alpha", 'echo "# TYPE fake_alpha gauge"; echo "fake_alpha{host=\\"$1\\"} 11"\n')
    _plugin(e.plugins, "beta", 'echo "fake_beta_total{host=\\"$1\\",dev=\\"x\\"} 22"\n')
    e.start()
    e.wait_page(r"hw_plugin_up\{.*plugin=\"beta\"\} 1")
    page = e.page()
    assert f'fake_alpha{{host="{HOST}"}} 11' in page
    assert f'fake_beta_total{{host="{HOST}",dev="x"}} 22' in page
    for name in ("alpha", "beta"):
        assert re.search(rf'hw_scrape_duration_seconds\{{host="{HOST}",plugin="{name}"\}} [0-9.]+\n', page)
    assert _get(e.port, "/")[0] == 404
    assert _get(e.port, "/metrics/extra")[0] == 404
    assert _get(e.port, "/metrics?x=1")[0] == 200
    assert e.stop() == 0


def test_a_plugin_still_on_its_first_run_is_not_reported_up(exporter, tmp_path):
    """Until a plugin's first run ends there is no result: no hw_plugin_up 1 on a page without its samples.
    The slow plugin's first run ends when the test says so (a file appears), not after a sleep the test would
    have to outpace on a loaded machine."""
    go = tmp_path / "go"
    e = exporter("--interval", "5", "--timeout", "120")
    _plugin(e.plugins, "fast", 'echo "fake_fast 1"\n')
    _plugin(e.plugins, "slow", f'while [ ! -e {go} ]; do sleep 0.05; done; echo "fake_slow 2"\n')
    e.start()
    page = e.wait_page(r"^fake_fast 1$") and e.page()
    assert "fake_slow" not in page
    assert not re.search(r'hw_plugin_up\{[^}]*plugin="slow"', page), page
    go.touch()
    page = e.wait_page(r"^fake_slow 2$")
    assert e.stop() == 0


def test_state_round_trip_and_plugin_environment(exporter, tmp_path):
    calls = tmp_path / "calls"
    e = exporter()
    _plugin(
        e.plugins,
        "count",
        f'n=${{_PLUGIN_STATE:-0}}\necho "${{_PLUGIN_STATE-unset}} $1 $POLL_INTERVAL" >>{calls}\n'
        'echo "fake_count $n"\necho "# STATE $((n + 1))"\n',
    )
    e.start()
    e.wait_page(r"^fake_count [3-9]$")
    lines = calls.read_text().splitlines()
    assert lines[:3] == [f"unset {HOST} 0.5", f"1 {HOST} 0.5", f"2 {HOST} 0.5"]


def test_state_only_output_replays_cache(exporter):
    e = exporter()
    _plugin(
        e.plugins,
        "tb",
        'if [[ -z ${_PLUGIN_STATE:-} ]]; then echo "tb_step 42"; echo "# STATE 1"\n'
        'else echo "# STATE $((_PLUGIN_STATE + 1))"; fi\n',
    )
    e.start()
    e.wait_page(r'hw_exporter_cycles_total\{host="[^"]*"\} [4-9]')
    page = e.page()
    assert "tb_step 42\n" in page and 'plugin="tb"} 1' in page


def test_exit_99_plugin_is_called_once(exporter, tmp_path):
    calls = tmp_path / "calls"
    e = exporter()
    _plugin(e.plugins, "retire", f'echo called >>{calls}\necho "gone 1"\nexit 99\n')
    _plugin(e.plugins, "stay", 'echo "stay 1"\n')
    e.start()
    e.wait_page(r'hw_exporter_cycles_total\{host="[^"]*"\} [4-9]')
    assert calls.read_text() == "called\n"
    page = e.page()
    assert "stay 1" in page and "gone" not in page and 'plugin="retire"' not in page
    assert "plugin retire exited 99" in e.text()


def test_hung_plugin_does_not_block_others_and_is_replayed(exporter, tmp_path):
    pids = tmp_path / "pids"
    e = exporter()
    # Good on the first call, hangs (in a child, so only a process-group kill ends it) on every later one.
    _plugin(
        e.plugins,
        "hang",
        f'if [[ -z ${{_PLUGIN_STATE:-}} ]]; then echo "hang_m 7"; echo "# STATE hung"; exit 0; fi\n'
        f"sleep 100 &\necho $! >>{pids}\nwait\n",
    )
    _plugin(e.plugins, "fast", 'n=${_PLUGIN_STATE:-0}; echo "fast_m $n"; echo "# STATE $((n + 1))"\n')
    e.start()
    e.wait_page(r"^fast_m [4-9]$", timeout=15)
    page = e.page()
    assert "hang_m 7\n" in page
    assert f'hw_plugin_up{{host="{HOST}",plugin="hang"}} 0' in page
    assert f'hw_plugin_up{{host="{HOST}",plugin="fast"}} 1' in page
    # --timeout 1 is capped at --interval 0.5
    assert "plugin hang timed out after 0.5s (process group killed); replaying its last good output" in e.text()
    sleepers = [int(p) for p in pids.read_text().split()]
    assert len(sleepers) >= 2
    assert not any(_alive(p) for p in sleepers[:-1])
    assert e.stop() == 0
    assert not _alive(sleepers[-1])


def test_invalid_lines_are_dropped_and_logged(exporter):
    e = exporter()
    _plugin(
        e.plugins,
        "messy",
        'echo "good_one{host=\\"$1\\"} 1"\necho "Traceback (most recent call last):"\n'
        'echo "bad-name 3"\necho "good_two 2.5 1700000000000"\necho "no_value{a=\\"b\\"}"\n',
    )
    e.start()
    e.wait_page(r"^good_two ")
    page = e.page()
    assert f'good_one{{host="{HOST}"}} 1' in page and "good_two 2.5 1700000000000" in page
    assert "Traceback" not in page and "bad-name" not in page and "no_value" not in page
    log = _wait(lambda: "dropped" in e.text() and e.text(), what="the drop log line")
    assert "plugin messy: dropped 3 invalid exposition line(s), first: 'Traceback (most recent call last):'" in log
    assert log.count("plugin messy: dropped") == 1  # logged when it changes, not every cycle


def test_port_in_use_moves_to_next_port(exporter):
    e = exporter()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", e.port))
        busy.listen()
        e.start()
        e.wait_page(r"hw_exporter_cycles_total", port=e.port + 1)
    log = e.text()
    assert f"port {e.port} on 127.0.0.1 is in use" in log
    assert f"serving on port {e.port + 1} instead" in log


def test_sd_file_written_and_removed_on_sigterm(exporter, tmp_path):
    sd = tmp_path / "sd"
    e = exporter("--sd-dir", str(sd))
    e.start()
    sd_file = sd / f"{HOST}.json"
    _wait(sd_file.exists, what="the sd file")
    assert json.loads(sd_file.read_text()) == [{"targets": [f"127.0.0.1:{e.port}"], "labels": {"host": HOST}}]
    assert [p.name for p in sd.iterdir()] == [f"{HOST}.json"]  # no temp file left behind
    assert e.stop() == 0
    assert not sd_file.exists()
    assert "stopped" in e.text()


def test_watchdog_restarts_a_killed_engine(exporter, tmp_path):
    sd = tmp_path / "sd"
    e = exporter("--sd-dir", str(sd), watchdog=True)
    e.start()
    started = re.compile(r"engine started, pid (\d+)")
    first = int(_wait(lambda: started.search(e.text()), what="engine start")[1])
    e.wait_page(r"hw_exporter_cycles_total")
    os.kill(first, signal.SIGKILL)
    second = int(
        _wait(lambda: len(started.findall(e.text())) >= 2 and started.findall(e.text())[1], what="a restarted engine")
    )
    assert second != first
    e.wait_page(r"hw_exporter_cycles_total")
    assert "engine died (status 137), restarting in 1s" in e.text()
    assert e.stop() == 0
    assert not _alive(second)
    assert not (sd / f"{HOST}.json").exists()
    assert "watchdog: stopped" in e.text()


# ---- argument checks: one error naming the option, exit 2, nothing started ----------------------------------


def _run_wrapper(*argv, env=None, timeout=30):
    return subprocess.run(
        [str(EXPORTER), *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


@pytest.mark.parametrize("watchdog", [False, True])
def test_missing_plugins_dir_is_refused_before_anything_starts(tmp_path, watchdog):
    port = _port_pair()
    sd = tmp_path / "sd"
    argv = ["--watchdog"] if watchdog else []
    argv += ["--address", "127.0.0.1", "--port", str(port), "--sd-dir", str(sd)]
    done = _run_wrapper(*argv, "--plugins-dir", str(tmp_path / "nonexistent"))
    assert done.returncode == 2
    error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "'--plugins-dir'" in error[0] and "pass the directory that holds" in error[0]
    assert "serving http" not in done.stderr and "restarting in" not in done.stderr
    assert not sd.exists() and _get(port)[0] is None


def test_an_address_that_is_no_ip_names_the_address_option():
    done = _run_wrapper("--address", "999.1.1.1")
    assert done.returncode == 2
    assert "Invalid value for '--address': 999.1.1.1 is not an IP address" in done.stderr


def test_an_address_of_another_node_names_the_address_option_and_the_watchdog_gives_up():
    # 192.0.2.0/24 is TEST-NET-1: never configured on a real node
    done = _run_wrapper("--watchdog", "--address", "192.0.2.1", "--port", str(_port_pair()))
    assert done.returncode == 2
    assert "Invalid value for '--address': cannot listen on 192.0.2.1" in done.stderr
    assert "not restarting" in done.stderr and "restarting in" not in done.stderr


def test_an_unknown_flag_is_reported_as_such_even_when_no_address_can_be_detected():
    done = _run_wrapper("--bogus", env={"CLUSTER_IP": "not-an-address"})
    assert done.returncode == 2
    assert "No such option '--bogus'" in done.stderr
    assert "address" not in done.stderr.lower()


def test_no_address_given_or_detected_tells_how_to_pass_one(tmp_path):
    done = _run_wrapper("--plugins-dir", str(tmp_path), env={"CLUSTER_IP": "not-an-address"})
    assert done.returncode == 2
    assert "Invalid value for '--address' (env var: 'CLUSTER_IP'): not-an-address is not an IP address" in done.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--interval", "0"], "'--interval' / '-i': 0.0 is not in the range 0.0<x<=604800.0"),
        (["--timeout", "-2"], "'--timeout': -2.0 is not in the range 0.0<x<=604800.0"),
        (["--interval", "ten"], "'ten' is not a finite number of seconds"),
        (["--interval", "nan"], "'nan' is not a finite number of seconds"),
        (["--port", "70000"], "'--port' / '-p': 70000 is not in the range 1<=x<=65535"),
    ],
)
def test_bad_numbers_are_usage_errors(argv, message):
    result = CliRunner().invoke(jobkit_main, ["exporter", "--address", "127.0.0.1", *argv])
    assert result.exit_code == 2
    assert message in result.output


def test_help_names_the_default_plugins_dir():
    done = subprocess.run([str(JOBKIT), "exporter", "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "[default: utils/plugins]" in done.stdout
    assert engine.DEFAULT_PLUGINS_DIR == REPO / "utils" / "plugins"
    wrapper_help = _run_wrapper("--help").stdout
    assert "default utils/plugins" in wrapper_help and "jobkit exporter" in wrapper_help


# ---- self-metrics: rendered by prometheus_client ---------------------------------------------------------


def test_self_metrics_escape_label_values_and_parse_back(tmp_path):
    e = engine.Exporter("127.0.0.1", 1, 1.0, 1.0, str(tmp_path))
    e.host = 'odd"host\\name\nx'
    plugin = engine.Plugin(str(tmp_path / 'we"ird_metrics_plugin.sh'))
    plugin.body, plugin.duration, plugin.up = "fake_m 1\n", 0.0123456789, 0
    e.plugins = {plugin.path: plugin}
    e.cycles = 7
    e.publish()
    page = e.render_page().decode()
    assert page.startswith("fake_m 1\n")
    samples = {
        (s.name, s.labels.get("plugin")): (s.labels["host"], s.value)
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name.startswith("hw_")
    }
    assert samples == {
        ("hw_scrape_duration_seconds", 'we"ird'): (e.host, 0.012346),
        ("hw_plugin_up", 'we"ird'): (e.host, 0.0),
        ("hw_exporter_cycles_total", None): (e.host, 7.0),
    }
    plugin.up, plugin.body = 1, "fake_m 2\n"
    e.publish()
    assert e.render_page().decode().startswith("fake_m 2\n")  # plugin output at once,
    assert 'plugin="we\\"ird"} 0.0' in e.render_page().decode()  # own families as of the last complete cycle
    e.cycles = 8
    assert 'plugin="we\\"ird"} 1.0' in e.render_page().decode()


@pytest.mark.parametrize(
    "plugin, env",
    [
        ("host", {"HOST_METRICS_ROOT": str(REPO / "tests" / "fixtures" / "metrics" / "host")}),
        ("host", {}),  # this machine's /proc and /sys
        ("gpu", {"GPU_METRICS_ROOT": str(REPO / "tests" / "fixtures" / "metrics" / "mi300x")}),
    ],
)
def test_the_repo_plugins_output_passes_the_engine_checks_whole(plugin, env):
    path = engine.DEFAULT_PLUGINS_DIR / f"{plugin}{engine.PY_PLUGIN_SUFFIX}"
    done = subprocess.run(
        [sys.executable, str(path), "n1"],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, **env),
        check=True,
    )
    kept, _state, dropped = parse_output(done.stdout)
    assert dropped == [] and len(kept) > 10
