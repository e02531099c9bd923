"""Node metrics exporter engine (started by utils/metrics_exporter.sh).

One long-lived process. Every interval it globs ``<plugins-dir>/*_metrics_plugin.{sh,py}`` and runs every plugin
at once, each in its own process group, with ``POLL_INTERVAL`` and ``_PLUGIN_STATE`` (the value of the plugin's
last ``# STATE <value>`` line, when it printed one) in the environment:
  ``*_metrics_plugin.sh``  (any executable) started anew every cycle: ``<plugin> <short host>``
  ``*_metrics_plugin.py``  loaded once into a long-lived worker (plugin_worker.py, this interpreter) that calls its
                           ``collect(host, state)`` once per cycle on a request line: no process start per cycle,
                           which is most of a small plugin's cost. A timed-out or dead worker is killed (process
                           group) and started anew next cycle, as is one whose file changed. A ``.py`` plugin
                           shadows a ``.sh`` one of the same name.
The valid exposition lines of each plugin are cached; ``GET /metrics`` answers from that cache and never runs a
plugin.

Plugin outcomes:
  exit 0              its valid lines replace its cached output (invalid lines are dropped and logged);
                      output that is only a ``# STATE`` line keeps (replays) the cached output, unless the
                      state starts with ``__NONE__``; empty output clears the cache
  exit 99             never called again; its metrics are withdrawn
  other exit, signal,
  or timeout          the cached output is replayed, ``hw_plugin_up`` is 0, the state is kept; on a
                      timeout the plugin's whole process group is killed

Added per plugin: ``hw_scrape_duration_seconds{host,plugin}`` (wall seconds of its last run) and
``hw_plugin_up{host,plugin}`` (1 = last run succeeded); once per page: ``hw_exporter_cycles_total{host}``.
These are rendered by prometheus_client (its label escaping and number format); plugin output is served as the
plugin wrote it, once its lines passed the checks in parse_output. Everything is imported at start-up.

Run as ``jobkit exporter`` (utils/metrics_exporter.sh adds the detected address and a watchdog).
"""

import errno
import glob
import ipaddress
import json
import os
import re
import selectors
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jobkit.core.clitypes import SECONDS
from jobkit.core.errors import EXIT_BAD_INPUT, exit_with
from jobkit.core.files import write_atomic
from jobkit.core.paths import UTILS_DIR

PLUGIN_SUFFIX = "_metrics_plugin.sh"
PY_PLUGIN_SUFFIX = "_metrics_plugin.py"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_worker.py")
DEFAULT_PORT = 9500  # 9400 belongs to NVIDIA's DCGM exporter
PORT_TRIES = 20
DISABLE_RC = 99
MAX_OUTPUT = 8 << 20  # bytes of stdout kept from one plugin run
LINGER_POLL_S = 0.01  # how often a run whose stdout closed is checked for its exit
DEFAULT_PLUGINS_DIR = UTILS_DIR / "plugins"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Plugin output is checked line by line with these regexes, not with prometheus_client.parser: on the host
# plugin's 115 lines the regexes take 0.28 ms, text_string_to_metric_families 2.2 ms (2.7 ms line by line, which
# dropping single bad lines would need), i.e. ~2 ms more CPU per cycle on a ~18 ms budget (engine + plugins).
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
_VALUE = r"[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[Ii]nf|NaN|nan)"
SAMPLE_RE = re.compile(rf"{_NAME}(?:\{{(?:{_LABEL}(?:,{_LABEL})*,?)?\}})? +{_VALUE}(?: +-?[0-9]+)? *")
META_RE = re.compile(rf"# (?:HELP {_NAME}(?: .*)?|TYPE {_NAME} (?:counter|gauge|histogram|summary|untyped) *)")


def parse_output(text):
    """Split plugin stdout into (kept lines, state or None, dropped lines).

    Kept: ``# HELP``/``# TYPE`` lines and samples ``name{labels} value [timestamp]``. Blank lines and other
    comments are ignored silently; anything else is dropped.
    """
    kept, dropped, state = [], [], None
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# STATE"):
                state = line[8:].replace("\0", "")
            elif META_RE.fullmatch(line):
                kept.append(line)
            elif line.startswith(("# HELP", "# TYPE")):
                dropped.append(line)
        elif SAMPLE_RE.fullmatch(line):
            kept.append(line)
        else:
            dropped.append(line)
    return kept, state, dropped


class Plugin:
    __slots__ = (
        "name",
        "path",
        "argv",
        "state",
        "body",
        "up",
        "duration",
        "disabled",
        "dropped_note",
        "python",
        "worker",
        "mtime",
    )

    def __init__(self, path):
        self.path = path
        self.python = path.endswith(PY_PLUGIN_SUFFIX)
        self.name = os.path.basename(path)[: -len(PY_PLUGIN_SUFFIX if self.python else PLUGIN_SUFFIX)] or "unnamed"
        if self.python:
            self.argv = [sys.executable, WORKER, path]
        else:
            # Direct exec through the shebang; a plugin without the executable bit is handed to bash.
            self.argv = [path] if os.access(path, os.X_OK) else ["/bin/bash", path]
        self.worker = None  # a .py plugin's live worker (Popen)
        self.mtime = None  # of the file the worker loaded
        self.state = None
        self.body = ""
        self.up = None  # no run finished yet: the plugin is left off the page until one has
        self.duration = 0.0
        self.disabled = False
        self.dropped_note = None


class _Run:
    __slots__ = ("plugin", "proc", "chunks", "size", "started", "eof")

    def __init__(self, plugin, proc, started):
        self.plugin, self.proc, self.started = plugin, proc, started
        self.chunks, self.size, self.eof = [], 0, False

    def answer(self):
        """(rc, output) once a worker's whole answer (``<rc> <length>\n`` + output) is in, else None."""
        data = b"".join(self.chunks)
        head, sep, rest = data.partition(b"\n")
        if not sep:
            return None
        rc, length = (int(x) for x in head.split())
        if len(rest) < length:
            return None
        self.chunks = [rest[:length]]
        return rc, rest[:length]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self):
        # Skip HTTPServer's getfqdn(): a reverse lookup could send a DNS query off the node.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class _Handler(BaseHTTPRequestHandler):
    timeout = 10
    exporter = None  # set on a per-server subclass

    def _answer(self, with_body):
        if self.path.split("?", 1)[0] == "/metrics":
            code, ctype, body = 200, CONTENT_TYPE, self.exporter.render_page()
        else:
            code, ctype, body = 404, "text/plain; charset=utf-8", b"not found: this exporter serves /metrics only\n"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)

    def log_message(self, format, *args):  # no access log
        pass


class _SelfMetrics:
    """The exporter's own families, collected by prometheus_client from the exporter's current state."""

    def __init__(self, exporter):
        self.exporter = exporter

    def collect(self):
        e = self.exporter
        # A plugin whose first run is still going has no result: reporting it up before its samples are on the
        # page would tell a scraper (and the tests) that its output is there.
        plugins = [p for p in e.plugins.values() if not p.disabled and p.up is not None]
        if plugins:
            duration = GaugeMetricFamily(
                "hw_scrape_duration_seconds", "Wall seconds of the plugin's last run", labels=("host", "plugin")
            )
            up = GaugeMetricFamily(
                "hw_plugin_up",
                "1 when the plugin's last run succeeded, 0 when its last good output is being replayed",
                labels=("host", "plugin"),
            )
            for p in plugins:
                duration.add_metric((e.host, p.name), round(p.duration, 6))
                up.add_metric((e.host, p.name), p.up)
            yield duration
            yield up
        cycles = CounterMetricFamily(
            "hw_exporter_cycles_total", "Collection cycles completed by the exporter", labels=("host",)
        )
        cycles.add_metric((e.host,), e.cycles)
        yield cycles


class Exporter:
    def __init__(self, address, port, interval, timeout, plugins_dir, sd_dir=None):
        self.address = address
        self.port = port
        self.interval = interval
        self.timeout = min(timeout, interval)
        self.plugins_dir = plugins_dir
        self.sd_dir = sd_dir
        self.host = socket.gethostname().split(".", 1)[0]
        self.prefix = f"[exporter {self.host}] "
        self.env = dict(os.environ, POLL_INTERVAL=f"{self.interval:g}")
        self.env.pop("_PLUGIN_STATE", None)
        self.plugins = {}
        self.running = {}  # fd -> _Run
        self.cycles = 0
        self.page = b"# exporter initializing\n"  # the plugins' part of the page
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SelfMetrics(self))
        self.self_page, self.self_page_cycle = b"", None
        self.render_lock = threading.Lock()
        self.stopping = False
        self.sd_file = None
        self.server = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.wake_r, selectors.EVENT_READ)

    def log(self, msg):
        sys.stderr.write(self.prefix + msg + "\n")
        sys.stderr.flush()

    # ---- start and stop -------------------------------------------------------------------------------
    def bind(self):
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        handler = type("Handler", (_Handler,), {"exporter": self})
        server_cls = type("Server", (_Server,), {"address_family": family})
        first = self.port
        for port in range(first, min(first + PORT_TRIES, 65536)):
            try:
                self.server = server_cls((self.address, port), handler)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                self.log(f"port {port} on {self.address} is in use, trying {port + 1}")
                continue
            self.port = port
            if port != first:
                self.log(f"port {first} was taken: serving on port {port} instead")
            return
        raise OSError(errno.EADDRINUSE, f"ports {first}-{first + PORT_TRIES - 1} on {self.address} are all in use")

    def write_sd_file(self):
        os.makedirs(self.sd_dir, exist_ok=True)
        host_port = f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"
        doc = [{"targets": [host_port], "labels": {"host": self.host}}]
        path = os.path.join(self.sd_dir, f"{self.host}.json")
        write_atomic(path, json.dumps(doc) + "\n")  # whole, and never through a planted link
        self.sd_file = path
        self.log(f"service discovery file {path} -> {host_port}")

    def _on_signal(self, signum, _frame):
        self.stopping = True
        try:
            os.write(self.wake_w, b"\0")
        except OSError:
            pass

    def cleanup(self):
        for run in list(self.running.values()):
            self._kill(run)
        self.running.clear()
        for plugin in self.plugins.values():
            self._stop_worker(plugin)
        if self.sd_file:
            try:
                os.unlink(self.sd_file)
            except FileNotFoundError:
                pass
        if self.server:
            self.server.server_close()

    # ---- one cycle ------------------------------------------------------------------------------------
    def _discover(self):
        pattern = os.path.join(glob.escape(self.plugins_dir), "*_metrics_plugin.")
        paths = glob.glob(pattern + "sh") + glob.glob(pattern + "py")
        # a .py plugin shadows the .sh plugin of the same name (one family set, one hw_plugin_up per name)
        paths = sorted(p for p in paths if not (p.endswith(".sh") and p[:-2] + "py" in paths))
        known = self.plugins
        if set(paths) != set(known):
            self.plugins = {p: known.get(p) or Plugin(p) for p in paths}
            for path, plugin in known.items():
                if path not in self.plugins:
                    self._stop_worker(plugin)
        return [p for p in self.plugins.values() if not p.disabled]

    def _stop_worker(self, plugin):
        proc, plugin.worker = plugin.worker, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()

    def _ask(self, plugin, host):
        """Send a .py plugin's worker this cycle's request (starting the worker when there is none)."""
        try:
            mtime = os.stat(plugin.path).st_mtime_ns
        except OSError:
            mtime = None
        if plugin.worker is not None and (mtime != plugin.mtime or plugin.worker.poll() is not None):
            self._stop_worker(plugin)  # changed on disk, or died between cycles
        started = time.monotonic()
        try:
            if plugin.worker is None:
                plugin.worker = subprocess.Popen(
                    plugin.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=self.env,
                    start_new_session=True,
                )
                plugin.mtime = mtime
            plugin.worker.stdin.write(json.dumps({"host": host, "state": plugin.state}).encode() + b"\n")
            plugin.worker.stdin.flush()
        except OSError as e:
            plugin.duration = time.monotonic() - started
            self._stop_worker(plugin)
            self._failed(plugin, f"could not be started ({e.strerror or e})")
            return
        fd = plugin.worker.stdout.fileno()
        os.set_blocking(fd, False)
        self.running[fd] = _Run(plugin, plugin.worker, started)
        self.selector.register(fd, selectors.EVENT_READ)

    def _start(self, plugin, host):
        if plugin.python:
            self._ask(plugin, host)
            return
        env = self.env if plugin.state is None else dict(self.env, _PLUGIN_STATE=plugin.state)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                plugin.argv + [host], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, start_new_session=True
            )
        except OSError as e:
            plugin.duration = time.monotonic() - started
            self._failed(plugin, f"could not be started ({e.strerror})")
            return
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        self.running[fd] = _Run(plugin, proc, started)
        self.selector.register(fd, selectors.EVENT_READ)

    def _kill(self, run):
        if run.plugin.python:
            self._stop_worker(run.plugin)
            return
        try:
            os.killpg(run.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run.proc.wait()
        run.proc.stdout.close()

    def _failed(self, plugin, why):
        plugin.up = 0
        self.log(f"plugin {plugin.name} {why}; replaying its last good output")

    def _finish(self, run, rc, timed_out=False):
        p = run.plugin
        p.duration = time.monotonic() - run.started
        if timed_out:
            self._failed(p, f"timed out after {self.timeout:g}s (process group killed)")
            return
        if rc == DISABLE_RC:
            p.disabled, p.body = True, ""
            self._stop_worker(p)
            self.log(f"plugin {p.name} exited {DISABLE_RC}: it will not be called again")
            return
        if rc != 0:
            self._failed(p, f"failed ({f'signal {-rc}' if rc < 0 else f'exit {rc}'})")
            return
        kept, state, dropped = parse_output(b"".join(run.chunks).decode("utf-8", "replace"))
        note = f"{len(dropped)}:{dropped[0]}" if dropped else None
        if note != p.dropped_note:
            p.dropped_note = note
            if dropped:
                self.log(
                    f"plugin {p.name}: dropped {len(dropped)} invalid exposition line(s), first: {dropped[0][:160]!r}"
                )
        p.up = 1
        if state is not None:
            p.state = state
        if kept:
            p.body = "\n".join(kept) + "\n"
        elif state is None or state.startswith("__NONE__"):
            p.body = ""
        # else: STATE-only output, the cached body is replayed

    def _settle(self, run, rc, timed_out=False):
        """Record a finished run and publish its output in one step, under the render lock: a scrape between
        the two would see the plugin up with its old body (or none, in the first cycle)."""
        with self.render_lock:
            self._finish(run, rc, timed_out)
            self.publish()

    def publish(self):
        """Rebuild the plugins' part of the page (after every plugin that finished, so scrapes see it early)."""
        self.page = "".join(p.body for p in self.plugins.values() if not p.disabled).encode()

    def render_page(self):
        """The /metrics page: the plugins' part and the exporter's own families as of the last complete cycle.

        prometheus_client renders those at scrape time, like any collector, and at most once per cycle: a render
        costs ~0.25 ms, more than the rest of the engine's work in a cycle with three plugins."""
        with self.render_lock:
            if self.self_page_cycle != self.cycles:
                self.self_page, self.self_page_cycle = generate_latest(self.registry), self.cycles
            return self.page + self.self_page

    def run_cycle(self):
        for plugin in self._discover():
            self._start(plugin, self.host)
        deadline = time.monotonic() + self.timeout
        lingering = []  # runs whose stdout closed before their process was reaped
        while (self.running or lingering) and not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # A run is settled (its page published) as soon as its process is reaped, not when the cycle
            # ends: a plugin that printed and exited must not wait for a slow one. `echo` then exit often
            # closes stdout a moment before the process can be reaped, so such runs are polled briefly.
            lingering = [run for run in lingering if not self._settled_if_reaped(run)]
            for key, _ in self.selector.select(min(left, LINGER_POLL_S) if lingering else left):
                run = self.running.get(key.fd)
                if run is not None:  # else the wake-up pipe: stopping is set
                    self._read(key.fd, run, lingering)
        for run in lingering:
            try:
                rc = run.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(run)
                self._settle(run, None, timed_out=True)
            else:
                self._settle(run, rc)
        for fd, run in list(self.running.items()):
            self._done(fd)
            self._kill(run)
            if not self.stopping:
                self._settle(run, None, timed_out=True)
        if not self.stopping:
            with self.render_lock:
                self.cycles += 1
                self.publish()

    def _read(self, fd, run, lingering):
        """Take what a run's stdout has; settle the run when it is complete (a worker's answer, or EOF)."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if data and run.size < MAX_OUTPUT:
            run.chunks.append(data)
            run.size += len(data)
            if run.plugin.python:
                try:
                    answer = run.answer()
                except ValueError:
                    self.log(f"plugin {run.plugin.name}: its worker answered garbage: stopped")
                    self._done(fd)
                    self._kill(run)
                    self._settle(run, 1)
                    return
                if answer is not None:  # the worker stays, its stdout is read again next cycle
                    self._done(fd)
                    self._settle(run, answer[0])
            return
        if data:
            self.log(f"plugin {run.plugin.name} wrote more than {MAX_OUTPUT} bytes: stopped")
            self._done(fd)
            self._kill(run)
            self._settle(run, -signal.SIGKILL)
            return
        self._done(fd)
        if run.plugin.python:  # the worker ended without a whole answer (a load error, exit 99 at import)
            try:
                rc = run.proc.wait(1)
            except subprocess.TimeoutExpired:
                rc = None
            self._stop_worker(run.plugin)
            self._settle(run, rc or 1)
            return
        run.proc.stdout.close()
        rc = run.proc.poll()
        if rc is None:
            lingering.append(run)
        else:
            self._settle(run, rc)

    def _settled_if_reaped(self, run) -> bool:
        rc = run.proc.poll()
        if rc is None:
            return False
        self._settle(run, rc)
        return True

    def _done(self, fd):
        self.selector.unregister(fd)
        del self.running[fd]

    def _drain_wake(self):
        try:
            os.read(self.wake_r, 512)
        except BlockingIOError:
            pass

    def serve(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        os.set_blocking(self.wake_r, False)
        try:
            # Huge poll interval: the serving thread never wakes up on its own (shutdown is by exit).
            threading.Thread(target=self.server.serve_forever, args=(3600,), daemon=True).start()
            self.log(
                f"serving http://{self.address}:{self.port}/metrics (pid {os.getpid()}), plugins "
                f"{self.plugins_dir}/*{PLUGIN_SUFFIX} every {self.interval:g}s, timeout {self.timeout:g}s"
            )
            if self.sd_dir:
                self.write_sd_file()
            next_start = time.monotonic()
            while not self.stopping:
                self.run_cycle()
                next_start = max(next_start + self.interval, time.monotonic())
                while not self.stopping:
                    left = next_start - time.monotonic()
                    if left <= 0:
                        break
                    if self.selector.select(left):
                        self._drain_wake()
        finally:
            self.cleanup()
        self.log("stopped")
        return 0


def _check_address(ctx, param, value):
    if value is None:
        raise click.UsageError(
            "no address to listen on (none given, none detected): pass --address (e.g. 127.0.0.1) or set CLUSTER_IP",
            ctx,
        )
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    from_env = ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT
    raise click.BadParameter(
        f"{value} is not an IP address: pass one of this node's addresses, e.g. 127.0.0.1",
        ctx,
        param,
        # click names the env var on every error of an option that has one; name it only when it was used
        param_hint=None if from_env else "'--address'",
    )


def _check_plugins_dir(ctx, param, value):
    if not os.path.isdir(value):
        raise click.BadParameter(
            f"{value} is not a directory: pass the directory that holds the *{PLUGIN_SUFFIX} plugins "
            f"(default {DEFAULT_PLUGINS_DIR})",
            ctx,
            param,
        )
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--address",
    envvar="CLUSTER_IP",
    show_envvar=True,
    callback=_check_address,
    help="IP address to listen on: loopback or this node's cluster-private address (metrics_exporter.sh detects it).",
)
@click.option(
    "--port",
    "-p",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help=f"First port to try; a taken one moves on to the next (up to {PORT_TRIES} ports).",
)
@click.option("--interval", "-i", type=SECONDS, default=10.0, show_default=True, help="Seconds between cycles.")
@click.option(
    "--timeout", type=SECONDS, default=5.0, show_default=True, help="Seconds a plugin may run (at most --interval)."
)
@click.option(
    "--plugins-dir",
    default=str(DEFAULT_PLUGINS_DIR),
    callback=_check_plugins_dir,
    help="Directory of the *_metrics_plugin.sh/.py plugins.  [default: utils/plugins]",
)
@click.option("--sd-dir", help="Write <host>.json here for Prometheus file-based service discovery.")
@click.pass_context
def command(ctx, address, port, interval, timeout, plugins_dir, sd_dir):
    """Serve this node's plugin metrics on http://ADDRESS:PORT/metrics, collected every --interval seconds."""
    exporter = Exporter(address, port, interval, timeout, plugins_dir, sd_dir)
    try:
        exporter.bind()
    except OSError as e:
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            raise click.BadParameter(
                f"cannot listen on {address} ({e.strerror}): pass an address of this node, e.g. 127.0.0.1",
                ctx,
                param_hint="'--address'",
            ) from None
        if e.errno == errno.EACCES:
            raise click.BadParameter(
                f"not allowed to listen on port {port}: pass a port of 1024 or above", ctx, param_hint="'--port'"
            ) from None
        exporter.log(f"error: {e.strerror or e}; pass a free --port or stop what holds these ports")
        exit_with(EXIT_BAD_INPUT)
    try:
        exporter.serve()
    except OSError as e:
        exporter.log(f"error: {e}")
        exit_with(EXIT_BAD_INPUT)
