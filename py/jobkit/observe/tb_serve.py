"""The live half of the TensorBoard bridge: a daemon that keeps an exposition file of the newest scalars.

Run as ``jobkit tb-bridge serve`` (a standalone exposition file for any textfile reader). Its Follower is also what the
exporter's TensorBoard plugin (utils/plugins/tb_metrics_plugin.py) keeps in its worker and drives once per cycle.

It finds the newest ``events.out.tfevents.*`` under LOGDIR (recursively; ``*.profile-empty`` files and files
whose name-embedded creation time is before --since are ignored). While there is none it looks again every 2 s
in the usual places (``LOGDIR/*/tensorboard/**``, where MaxText writes: ``<base_output_directory>/<run_name>/
tensorboard/<run_name>/``) and walks the whole tree every 30 s (every 10 s / 120 s after 5 minutes). Once found,
the file is read incrementally (see jobkit.observe.tb_events): each poll costs one stat() of the file, and reads only the
bytes written since the last poll, in one read. A record whose length CRC is wrong ends the reading of that file
(logged once); record CRCs are left to the backfill. Once a minute the usual places are looked at again: a newer
event file (training restarted within the job) replaces the current one.

After each poll that found new scalars, OUT is replaced atomically (core.files.write_atomic: a fresh temp name beside it, renamed: a
rename is atomic, so the plugin never reads half a file) with prometheus_client's text format: per tag the
newest value with its event's timestamp, ``tb_step``, and ``tb_metrics_plugin_staleness_fill 0`` (no timestamp;
this bridge never repeats old values, the series exists for dashboards written against the reference). Every
sample has ``host="H"``. The daemon writes its pid to OUT.pid, starts its own session (a plugin timeout kills
the plugin's process group, not the daemon), and exits - removing OUT and OUT.pid - on SIGTERM/SIGINT/SIGHUP
or when --parent-pid exits (watched with a pidfd: no cost per poll). Logs: stderr.
"""

import os
import select
import signal
import sys
import time

from jobkit.core.files import write_atomic
from jobkit.observe.tb_events import (
    EVENT_PREFIX,
    FILL_METRIC,
    STEP_METRIC,
    CorruptRecord,
    EventsError,
    FileReplaced,
    Fold,
    ScalarReader,
    file_order,
    find_event_files,
)

STEP_HELP = "Training step of the newest TensorBoard scalars (sample time: the step's first scalar event)"
FILL_HELP = "Always 0: the bridge exports real TensorBoard values only, never repeated fills"


def scalar_help(tag):
    return f"TensorBoard scalar {tag} (sample time: the event's wall time)"


class _TextTimestamp(float):
    """A sample time prometheus_client's text format prints as exactly MS: it writes int(float(t) * 1000), and
    ms / 1000 * 1000 can land just below ms; half a millisecond more truncates to ms for any epoch time."""

    def __new__(cls, ms):
        return super().__new__(cls, (ms + 0.5) / 1000)


class Latest:
    """Newest sample per metric, for the live exposition."""

    def __init__(self, log=None):
        self.fold = Fold(log)
        self.values = {}  # name -> (tag, ms, value); insertion order = first seen
        self._host = ""  # the host label of the render in progress (collect() is called back by the library)

    def add(self, scalars):
        n = 0
        for name, tag, ms, value in self.fold.samples(scalars):
            self.values[name] = (tag, ms, value)
            n += 1
        return n

    def collect(self):
        """prometheus_client's collector protocol: tb_step, the fill gauge, then every tag first seen first."""
        from prometheus_client.core import GaugeMetricFamily

        step = self.values.get(STEP_METRIC)
        if step:
            family = GaugeMetricFamily(STEP_METRIC, STEP_HELP, labels=["host"])
            family.add_metric([self._host], step[2], timestamp=_TextTimestamp(step[1]))
            yield family
        family = GaugeMetricFamily(FILL_METRIC, FILL_HELP, labels=["host"])
        family.add_metric([self._host], 0)
        yield family
        for name, (tag, ms, value) in self.values.items():
            if name != STEP_METRIC:
                family = GaugeMetricFamily(name, scalar_help(tag), labels=["host"])
                family.add_metric([self._host], value, timestamp=_TextTimestamp(ms))
                yield family

    def render(self, host):
        """The exposition text ("" before the first scalar)."""
        if not self.values:
            return ""
        from prometheus_client import generate_latest

        self._host = host
        return generate_latest(self).decode()


def _remove(*paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


class _ParentWatch:
    """Is PID still there? With a pidfd its exit wakes the poll loop; else kill(pid, 0) per poll."""

    def __init__(self, pid):
        self.pid, self.fd = pid, None
        if pid and hasattr(os, "pidfd_open"):
            try:
                self.fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.fd = -1  # already gone
            except OSError:
                self.fd = None

    def gone(self, readable=()):
        if not self.pid:
            return False
        if self.fd == -1 or (self.fd is not None and self.fd in readable):
            return True
        if self.fd is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        return False


def serve(logdir, host, out, interval=1.0, parent_pid=0, since=0):
    """Runs the daemon until a signal or the parent's exit; returns 0."""
    log = stderr_log(f"[tb_bridge {host}] ")
    # 1. Setup: a session of its own, --out's dir there, the parent still alive, signals caught, the pid file.
    _own_session()
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise EventsError(f"directory of --out {out} does not exist")
    pidfile = out + ".pid"
    watch = _ParentWatch(parent_pid)
    if watch.gone():
        log(f"parent pid {parent_pid} is gone: not starting")
        return 0
    wake_r, stopping = _catch_stop_signals()
    write_atomic(pidfile, f"{os.getpid()}\n")
    log(
        f"pid {os.getpid()}: looking for {EVENT_PREFIX}* under {logdir}"
        f"{f' created since {since}' if since else ''}, writing {out} every {interval:g}s"
        f"{f', until pid {parent_pid} exits' if parent_pid else ''}"
    )
    waits = [wake_r] + ([watch.fd] if watch.fd is not None and watch.fd >= 0 else [])
    follower = Follower(logdir, since, interval, log)
    reason = "stopped"
    try:
        # 2. One cycle per --interval (sooner after a signal or the parent's exit): the newest scalars into OUT.
        while not stopping:
            if follower.cycle():
                write_atomic(out, follower.latest.render(host))
            readable = _wait(waits, wake_r, interval)
            if watch.gone(readable):
                reason = f"parent pid {parent_pid} exited"
                break
        if stopping:
            reason = f"signal {signal.Signals(stopping[0]).name}"
    finally:
        # 3. Teardown, however the loop ended: OUT and OUT.pid go (write_atomic leaves no temp file behind).
        _remove(out, pidfile)
    log(f"exiting ({reason})")
    return 0


def stderr_log(prefix):
    def log(msg):
        sys.stderr.write(time.strftime("%Y-%m-%d %H:%M:%S ") + prefix + msg + "\n")
        sys.stderr.flush()

    return log


def _own_session():
    try:
        os.setsid()  # out of the plugin's process group: the exporter kills that group on a timeout
    except OSError:
        pass


def _catch_stop_signals():
    """(the read end of the wakeup pipe, the list of caught signals): SIGTERM/SIGINT/SIGHUP are appended to that
    list, and their wakeup byte on the pipe ends the loop's select() at once."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    signal.set_wakeup_fd(wake_w)
    return wake_r, stopping


def _wait(waits, wake_r, interval):
    """Up to INTERVAL in select() on WAITS; the readable ones (a signal's wakeup bytes read off the pipe)."""
    readable, _, _ = select.select(waits, [], [], interval)
    if wake_r in readable:
        try:
            os.read(wake_r, 512)
        except BlockingIOError:
            pass
    return readable


class Follower:
    """What one cycle hands to the next: the event file being read, its newest scalars, and when to look for an
    event file (again). Driven by serve() every --interval and by the exporter's TensorBoard plugin
    (utils/plugins/tb_metrics_plugin.py) every exporter cycle. LIMIT: bytes of records read per cycle at most
    (None: all new ones), so that a long backlog is read over several cycles within a plugin's timeout."""

    def __init__(self, logdir, since, interval, log, limit=None):
        self.logdir, self.since, self.interval, self.log, self.limit = logdir, since, interval, log, limit
        self.reader, self.latest = None, Latest(log)
        self.started = time.monotonic()
        self.next_quick = self.next_full = self.started

    def cycle(self):
        """True when latest gained scalars this cycle (a newer file alone changes nothing until it has some)."""
        now = time.monotonic()
        if now >= self.next_quick:
            self._look_for_file(now)
        return self.reader is not None and self._read_new_scalars(now)

    def _look_for_file(self, now):
        """Until there is a file: the usual places every 2 s, the whole tree every 30 s (10 s / 120 s after 5
        minutes). Then the usual places once a minute, for a newer file."""
        if self.reader is None:
            full = now >= self.next_full
            files = find_event_files(self.logdir, self.since, quick=not full)
            late = now - self.started > 300
            self.next_quick = now + (10 if late else 2)
            if full:
                self.next_full = now + (120 if late else 30)
        else:  # a newer file (training restarted within the job)? A cheap look once a minute.
            files = find_event_files(self.logdir, self.since, quick=True)
            self.next_quick = now + 60
            if files and (files[-1] == self.reader.path or file_order(files[-1]) < file_order(self.reader.path)):
                files = []
        if files:
            # The data CRCs are left to the final backfill: the live gauge only needs the framing.
            self.reader, self.latest = ScalarReader(files[-1], check_data=False), Latest(self.log)
            self.log(f"reading {files[-1]}")

    def _read_new_scalars(self, now):
        """What the file gained since the last cycle; True when that holds new scalars."""
        try:
            scalars = self.reader.poll(self.limit)
        except CorruptRecord as e:
            self.log(f"{e}: no more steps from this file until a newer one appears")
            scalars = []
        except (OSError, FileReplaced) as e:
            self.log(f"lost {self.reader.path} ({e.__class__.__name__}): looking for an event file again")
            self.reader, self.next_quick, self.next_full = None, now + self.interval, now + self.interval
            scalars = []
        return bool(scalars) and self.latest.add(scalars) > 0
