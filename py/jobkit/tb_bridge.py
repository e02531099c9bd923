"""TensorBoard -> Prometheus bridge: MaxText's scalar summaries as ``tb_*`` gauges, live and after the job.

  python -m jobkit.tb_bridge serve --logdir DIR --host H --out FILE [--interval S] [--parent-pid PID] [--since EPOCH]
  python -m jobkit.tb_bridge backfill --logdir DIR --tsdb TSDB [--label NAME=VALUE ...] [--host H]
                                      [--since EPOCH] [--promtool PATH] [--prometheus PATH] [--dry-run]

Every scalar summary becomes a gauge named ``tb_`` + the tag with each character outside ``[A-Za-z0-9_]``
replaced by ``_`` (``learning/loss`` -> ``tb_learning_loss``). Scalars are ``simple_value`` summaries and
rank-0 tensors of the ``scalars`` plugin; text summaries (MaxText writes its whole config as
``<key>/text_summary``) and everything else are skipped. A sample's timestamp is the wall time of its own event
in ms (``round(wall_time * 1000)``), the same number live and in the backfill, so that both copies of a sample
are one sample to Prometheus. ``tb_step`` is the training step; its sample time is the wall time of the first
scalar event of that step. Two tags that sanitize to the same name: the first one seen keeps it, the other is
skipped (logged).

serve (started by utils/plugins/tb_metrics_plugin.sh, one per job and host)
  Finds the newest ``events.out.tfevents.*`` under DIR (recursively; ``*.profile-empty`` files and files whose
  name-embedded creation time is before --since are ignored). While there is none it looks again every 2 s
  in the usual places (``DIR/*/tensorboard/**``, where MaxText writes: ``<base_output_directory>/<run_name>/
  tensorboard/<run_name>/``) and walks the whole tree every 30 s (every 10 s / 120 s after 5 minutes). Once
  found, the file is read incrementally (TensorBoard's Event protos, the file's offset kept): each poll costs
  one stat() of the file, and reads only the bytes written since the last poll, in one read. A record whose
  length CRC is wrong ends the reading of that file (logged once); record CRCs are checked by the backfill. Once a minute the usual places are looked
  at again: a newer event file (training restarted within the job) replaces the current one. After each poll
  that found new scalars, FILE is replaced atomically (write FILE.tmp.<pid>, rename) with exposition text:
  per tag the newest value with its event's timestamp, ``tb_step``, and ``tb_metrics_plugin_staleness_fill 0``
  (no timestamp; this bridge never repeats old values, the series exists for dashboards written against the
  reference). Every sample has ``host="H"``. The daemon writes its pid to FILE.pid, starts its own session (a
  plugin timeout kills the plugin's process group, not the daemon), and exits - removing FILE and FILE.pid -
  on SIGTERM/SIGINT/SIGHUP or when --parent-pid exits (watched with a pidfd: no cost per poll). Logs: stderr.

backfill (after the job's Prometheus has stopped)
  Reads every scalar event of every event file under DIR (or the one file DIR names) and adds them all to the
  TSDB as blocks (``promtool tsdb create-blocks-from openmetrics``), so the TSDB holds every step although the
  live scrapes only saw the newest step each time. Labels: the bridge's own ``host`` label (--host, default
  the value of ``--label host``, else this machine's short name) plus the --label ones, which stand for the
  labels Prometheus attached when scraping (job, instance and the file_sd entry's labels). The exporters'
  scrape job honours the samples' own labels, so the bridge's ``host`` wins over the file_sd one and the
  series are ``{host, instance, job}``, here as in the scraped data. Duplicates of scraped samples
  (same labels, same ms) are merged away by Prometheus at query time.

  Before it adds blocks, backfill persists the TSDB's WAL (the job's head data, every metric) as a block:
  Prometheus drops WAL samples older than the newest block's end when it next opens the TSDB, so adding a
  block that ends at the last training step would silently delete all other metrics recorded up to then. It
  does so with a temporary Prometheus on the TSDB (127.0.0.1, a free port, admin API, no targets) and its
  snapshot API: the head block of the snapshot is moved into the TSDB. That Prometheus also refuses to start
  while another one holds the TSDB, so a backfill into a live TSDB fails cleanly. --dry-run prints the
  OpenMetrics text instead of touching the TSDB.

Errors are one line on stderr (``tb_bridge: ...``), exit status 1; bad arguments exit 2.
TensorFlow is never imported: TensorBoard's compat layer is pinned to its stub (a TF import costs seconds and memory
on the training node).
"""

import argparse
import glob
import json
import math
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from collections import namedtuple

from jobkit.argtypes import positive_seconds

EVENT_PREFIX = "events.out.tfevents."
STEP_METRIC = "tb_step"
FILL_METRIC = "tb_metrics_plugin_staleness_fill"
RESERVED = frozenset((STEP_METRIC, FILL_METRIC))
# Where MaxText puts its event files: <base_output_directory>/<run_name>/tensorboard/<run_name>/.
QUICK_PATTERNS = ("*/tensorboard/*/" + EVENT_PREFIX + "*", "*/tensorboard/" + EVENT_PREFIX + "*", EVENT_PREFIX + "*")

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Scalar = namedtuple("Scalar", "tag step wall_time value")


class BridgeError(Exception):
    """A one-line, user-facing error."""


# ---- names, timestamps, values ----------------------------------------------------------------------------
def metric_name(tag):
    """``learning/loss`` -> ``tb_learning_loss``."""
    return "tb_" + _BAD_CHARS.sub("_", tag)


def to_ms(wall_time):
    """Sample timestamp in ms of an event's wall time; live exposition and backfill both use this."""
    return int(round(wall_time * 1000))


def ms_to_seconds_text(ms):
    """ms as the exact decimal seconds OpenMetrics wants ("1795412855.815"); parses back to the same ms."""
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    return f"{sign}{ms // 1000}.{ms % 1000:03d}"


def format_value(value):
    """Shortest text that parses back to the same float (Prometheus and OpenMetrics spelling of NaN/Inf)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _short_host():
    return socket.gethostname().split(".", 1)[0]


# ---- reading event files ----------------------------------------------------------------------------------
# The TFRecord framing of an event file: u64 length, masked CRC-32C of those 8 bytes, the record, its masked
# CRC-32C (little endian). TensorBoard's own TF-free loader reads each record with four buffered reads and a
# per-byte Python CRC (~30 us a record: 3% of a core for a model doing 125 steps/s with 18 scalars); reading the
# new bytes in one go costs a fraction of that. Records are still TensorBoard's Event protos, the CRCs its own.
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_CHUNK = 8 << 20
_PROTO = None


def _proto():
    """(Event class, masked_crc32c) from TensorBoard, TF-free."""
    global _PROTO
    if _PROTO is None:
        # tensorboard.compat resolves `tf` to its stub when this module can be imported.
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

        _PROTO = (Event, masked_crc32c)
    return _PROTO


class CorruptRecord(Exception):
    """A record's CRC does not match: the file is damaged from there on."""


class RecordReader:
    """The complete records of an event file not read yet, from where the last call stopped (a record still
    being written is left for the next call). check_data also verifies each record's CRC, not only its
    length's (a wrong length would misframe everything after it)."""

    def __init__(self, path, check_data=True):
        self.path = path
        self.offset = 0
        self.check_data = check_data
        self._length_crcs = {}

    def records(self):
        _event, crc = _proto()
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            buf = b""
            while chunk := f.read(_CHUNK):
                buf += chunk
                pos, size = 0, len(buf)
                while size - pos >= _HEADER.size:
                    length, length_crc = _HEADER.unpack_from(buf, pos)
                    expected = self._length_crcs.get(length)
                    if expected is None:  # events repeat a handful of sizes: one CRC per size, not per record
                        expected = self._length_crcs[length] = crc(buf[pos : pos + 8])
                    if expected != length_crc:
                        raise CorruptRecord(f"{self.path}: bad length CRC at byte {self.offset}")
                    end = pos + _HEADER.size + length + _CRC.size
                    if end > size:
                        break
                    data = buf[pos + _HEADER.size : end - _CRC.size]
                    if self.check_data and crc(data) != _CRC.unpack_from(buf, end - _CRC.size)[0]:
                        raise CorruptRecord(f"{self.path}: bad record CRC at byte {self.offset}")
                    self.offset += end - pos
                    pos = end
                    yield data
                buf = buf[pos:]


def _tensor_scalar(tensor):
    if tensor.tensor_shape.dim:  # rank 0 only
        return None
    try:
        from tensorboard.util import tensor_util

        value = tensor_util.make_ndarray(tensor).item()
    except Exception:  # an odd dtype: not a scalar we can export
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class FileReplaced(Exception):
    """The event file shrank: it was replaced or truncated."""


class ScalarReader:
    """Incremental reader of one event file: poll() returns the scalars written since the last poll."""

    def __init__(self, path, check_data=True):
        self.path = path
        self._records = RecordReader(path, check_data)
        self._plugin = {}  # tag -> plugin name of its first value that carried metadata
        self.size = 0  # file size at the last read
        self.records = 0  # records (events) consumed so far
        self.damaged = False  # a CorruptRecord was raised: nothing more comes from this file

    def poll(self):
        """New scalars; [] without reading when the file did not grow (one stat) or is damaged.
        Raises OSError, FileReplaced, CorruptRecord (once)."""
        if self.damaged:
            return []
        size = os.stat(self.path).st_size
        if size == self.size:
            return []
        if size < self.size:
            raise FileReplaced(self.path)
        self.size = size
        return list(self.read())

    def read(self):
        """Every scalar of the events not consumed yet (a record still being written is left for later)."""
        event_class = _proto()[0]
        records = self._records.records()
        while True:
            try:
                data = next(records)
            except StopIteration:
                return
            except CorruptRecord:
                self.damaged = True
                raise
            try:
                event = event_class.FromString(data)
            except Exception as e:  # protobuf's DecodeError: a damaged record the framing CRC let through
                self.damaged = True
                raise CorruptRecord(f"{self.path}: undecodable record {self.records + 1} ({e})") from None
            self.records += 1
            if event.WhichOneof("what") != "summary":
                continue
            for value in event.summary.value:
                number = self._scalar(value)
                if number is not None:
                    yield Scalar(value.tag, event.step, event.wall_time, number)

    def _scalar(self, value):
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            self._plugin.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return float(value.simple_value)
        if kind == "tensor" and self._plugin.get(value.tag) == "scalars":
            return _tensor_scalar(value.tensor)
        return None


def _name_epoch(path):
    """Creation time embedded in the name (events.out.tfevents.<epoch>.<host>...), else the mtime."""
    part = os.path.basename(path)[len(EVENT_PREFIX) :].split(".", 1)[0]
    if part.isdigit():
        return int(part)
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def _usable(path, since):
    name = os.path.basename(path)
    return name.startswith(EVENT_PREFIX) and not name.endswith(".profile-empty") and _name_epoch(path) >= since


def _order(path):
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
    return (_name_epoch(path), mtime, path)


def find_event_files(logdir, since=0, quick=False):
    """Event files under logdir (or logdir itself if it is one), oldest first. quick: the usual places only."""
    if os.path.isfile(logdir):
        return [logdir] if _usable(logdir, 0) else []
    if quick:
        root = glob.escape(logdir)
        found = {p for pattern in QUICK_PATTERNS for p in glob.glob(os.path.join(root, pattern))}
    else:
        found = set()
        for dirpath, _dirs, files in os.walk(logdir):
            found.update(os.path.join(dirpath, f) for f in files if f.startswith(EVENT_PREFIX))
    return sorted((p for p in found if os.path.isfile(p) and _usable(p, since)), key=_order)


# ---- from scalars to samples ------------------------------------------------------------------------------
class Fold:
    """Turns scalars, in file order, into samples (metric name, tag, ms, value), tb_step ones included.

    The same rules live and in the backfill: names are claimed first come first served; tb_step gets a
    sample when the step changes, at the wall time of the first scalar of the new step.
    """

    def __init__(self, log=None):
        self.names = {}  # tag -> metric name, or None when the name was taken by another tag
        self.owner = {}  # metric name -> tag
        self.step = None
        self.skipped = []  # tags left out (name clash)
        self._log = log

    def name(self, tag):
        if tag in self.names:
            return self.names[tag]
        name = metric_name(tag)
        if name in RESERVED or name in self.owner:
            other = self.owner.get(name, "the bridge itself")
            self.names[tag] = None
            self.skipped.append(tag)
            if self._log:
                self._log(f"tag {tag!r} is skipped: its metric name {name} is taken by {other!r}")
            return None
        self.names[tag] = name
        self.owner[name] = tag
        return name

    def samples(self, scalars):
        for s in scalars:
            name = self.name(s.tag)
            if name is None:
                continue
            ms = to_ms(s.wall_time)
            if s.step != self.step:
                self.step = s.step
                yield STEP_METRIC, None, ms, float(s.step)
            yield name, s.tag, ms, s.value


def _help(name, tag):
    if name == STEP_METRIC:
        return "Training step of the newest TensorBoard scalars (sample time: the step's first scalar event)"
    return _escape_help(f"TensorBoard scalar {tag} (sample time: the event's wall time)")


class Latest:
    """Newest sample per metric, for the live exposition."""

    def __init__(self, log=None):
        self.fold = Fold(log)
        self.values = {}  # name -> (tag, ms, value); insertion order = first seen

    def add(self, scalars):
        n = 0
        for name, tag, ms, value in self.fold.samples(scalars):
            self.values[name] = (tag, ms, value)
            n += 1
        return n

    def render(self, host):
        if not self.values:
            return ""
        lbl = f'{{host="{_escape_label(host)}"}}'
        out = []
        step = self.values.get(STEP_METRIC)
        if step:
            out.append(
                f"# HELP {STEP_METRIC} {_help(STEP_METRIC, None)}\n# TYPE {STEP_METRIC} gauge\n"
                f"{STEP_METRIC}{lbl} {int(step[2])} {step[1]}\n"
            )
        out.append(
            f"# HELP {FILL_METRIC} Always 0: the bridge exports real TensorBoard values only, never "
            f"repeated fills\n# TYPE {FILL_METRIC} gauge\n{FILL_METRIC}{lbl} 0\n"
        )
        for name, (tag, ms, value) in self.values.items():
            if name != STEP_METRIC:
                out.append(
                    f"# HELP {name} {_help(name, tag)}\n# TYPE {name} gauge\n{name}{lbl} {format_value(value)} {ms}\n"
                )
        return "".join(out)


# ---- serve ------------------------------------------------------------------------------------------------
def _write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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


def serve(args):
    host, out = args.host, args.out
    prefix = f"[tb_bridge {host}] "

    def log(msg):
        sys.stderr.write(time.strftime("%Y-%m-%d %H:%M:%S ") + prefix + msg + "\n")
        sys.stderr.flush()

    try:
        os.setsid()  # out of the plugin's process group: the exporter kills that group on a timeout
    except OSError:
        pass
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise BridgeError(f"directory of --out {out} does not exist")
    pidfile = out + ".pid"
    watch = _ParentWatch(args.parent_pid)
    if watch.gone():
        log(f"parent pid {args.parent_pid} is gone: not starting")
        return 0
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    signal.set_wakeup_fd(wake_w)
    _write_atomic(pidfile, f"{os.getpid()}\n")
    log(
        f"pid {os.getpid()}: looking for {EVENT_PREFIX}* under {args.logdir}"
        f"{f' created since {args.since}' if args.since else ''}, writing {out} every {args.interval:g}s"
        f"{f', until pid {args.parent_pid} exits' if args.parent_pid else ''}"
    )
    waits = [wake_r] + ([watch.fd] if watch.fd is not None and watch.fd >= 0 else [])
    reader, latest = None, Latest(log)
    started = time.monotonic()
    next_quick = next_full = started
    reason = "stopped"
    try:
        while not stopping:
            now = time.monotonic()
            if now >= next_quick:
                if reader is None:
                    full = now >= next_full
                    files = find_event_files(args.logdir, args.since, quick=not full)
                    late = now - started > 300
                    next_quick = now + (10 if late else 2)
                    if full:
                        next_full = now + (120 if late else 30)
                else:  # a newer file (training restarted within the job)? A cheap look once a minute.
                    files = find_event_files(args.logdir, args.since, quick=True)
                    next_quick = now + 60
                    if files and (files[-1] == reader.path or _order(files[-1]) < _order(reader.path)):
                        files = []
                if files:
                    # The data CRCs are left to the final backfill: the live gauge only needs the framing.
                    reader, latest = ScalarReader(files[-1], check_data=False), Latest(log)
                    log(f"reading {files[-1]}")
            if reader is not None:
                try:
                    scalars = reader.poll()
                except CorruptRecord as e:
                    log(f"{e}: no more steps from this file until a newer one appears")
                    scalars = []
                except (OSError, FileReplaced) as e:
                    log(f"lost {reader.path} ({e.__class__.__name__}): looking for an event file again")
                    reader, next_quick, next_full = None, now + args.interval, now + args.interval
                    scalars = []
                if scalars and latest.add(scalars):
                    _write_atomic(out, latest.render(host))
            readable, _, _ = select.select(waits, [], [], args.interval)
            if wake_r in readable:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            if watch.gone(readable):
                reason = f"parent pid {args.parent_pid} exited"
                break
        if stopping:
            reason = f"signal {signal.Signals(stopping[0]).name}"
    finally:
        _remove(out, pidfile, f"{out}.tmp.{os.getpid()}")
    log(f"exiting ({reason})")
    return 0


# ---- backfill ---------------------------------------------------------------------------------------------
def _find_tool(name, given, env=None):
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given
        raise BridgeError(f"{name} {given} is not an executable file")
    if env and os.environ.get(env):
        return _find_tool(name, os.environ[env])
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    return path


def parse_labels(pairs):
    labels = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise BridgeError(f"--label {pair!r}: expected NAME=VALUE with a Prometheus label name")
        labels[name] = value
    return labels


def scrape_labels(host, target_labels):
    """The labels a scraped bridge sample ends up with: the exporters' scrape job honours the samples' own
    labels (honor_labels, see utils/prometheus.sh), so our host label wins over the target's."""
    return {**target_labels, "host": host}


def _tsdb_in_use(tsdb):
    """True while a Prometheus process runs on this TSDB (2.42 keeps no lock file by default): its command line
    names the dir with --storage.tsdb.path."""
    want = os.path.realpath(tsdb)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != "prometheus":
            continue
        for i, arg in enumerate(argv):
            path = (
                arg.split("=", 1)[1]
                if arg.startswith("--storage.tsdb.path=")
                else (argv[i + 1] if arg == "--storage.tsdb.path" and i + 1 < len(argv) else None)
            )
            if path is not None and os.path.realpath(os.path.join(f"/proc/{pid}/cwd", path)) == want:
                return True
    return False


def collect_series(files, log=None):
    """{metric name: (tag, [(ms, value), ...] ascending, one per ms)} over the files, and the Fold used."""
    series, fold = {}, Fold(log)
    for path in files:
        fold.step = None  # a new file starts a new run
        try:
            for name, tag, ms, value in fold.samples(ScalarReader(path).read()):
                series.setdefault(name, (tag, {}))[1][ms] = value  # same ms twice: the later event wins
        except CorruptRecord as e:
            if log:
                log(f"{e}: using the steps before it")
    return {name: (tag, sorted(points.items())) for name, (tag, points) in series.items()}, fold


def openmetrics_text(series, labels):
    lbl = "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items())) + "}"
    out = []
    for name in sorted(series):
        tag, points = series[name]
        out.append(f"# HELP {name} {_help(name, tag)}\n# TYPE {name} gauge\n")
        out.extend(f"{name}{lbl} {format_value(v)} {ms_to_seconds_text(ms)}\n" for ms, v in points)
    out.append("# EOF\n")
    return "".join(out)


def _wal_has_data(tsdb):
    wal = os.path.join(tsdb, "wal")
    if not os.path.isdir(wal):
        return False
    for entry in os.scandir(wal):
        if entry.is_dir() or (entry.is_file() and entry.stat().st_size > 0):
            return True
    return False


def _http(url, method="GET", timeout=5):
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def persist_head(tsdb, prometheus, log, ready_timeout=300):
    """Writes the TSDB's head (its WAL) as a block, through a temporary Prometheus's snapshot API.

    Returns the number of blocks added to the TSDB.
    """
    work = tempfile.mkdtemp(prefix="tb_bridge.")
    try:
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "# tb_bridge backfill: no targets\nglobal:\n  scrape_interval: 999h\n"
                "  evaluation_interval: 999h\nscrape_configs: []\n"
            )
        logfile = os.path.join(work, "prometheus.log")
        for _attempt in range(3):
            port = _free_port()
            with open(logfile, "w") as logf:
                proc = subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={tsdb}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--web.enable-admin-api",
                        "--storage.tsdb.retention.time=10y",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                base = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + ready_timeout
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        if _http(base + "/-/ready", timeout=2)[0] == 200:
                            break
                    except (OSError, urllib.error.URLError):
                        pass
                    time.sleep(0.2)
                if proc.poll() is not None:
                    with open(logfile, errors="replace") as f:
                        text = f.read()
                    if "address already in use" in text:
                        continue
                    if "lock DB directory" in text:
                        raise BridgeError(f"{tsdb} is in use by a running Prometheus: stop it before the backfill")
                    last = [ln for ln in text.splitlines() if "level=error" in ln or "err=" in ln][-1:]
                    raise BridgeError(
                        f"a temporary Prometheus on {tsdb} exited at startup: "
                        f"{last[0] if last else text.strip()[-300:]}"
                    )
                if time.monotonic() >= deadline:
                    raise BridgeError(f"a temporary Prometheus on {tsdb} was not ready after {ready_timeout}s")
                _, body = _http(base + "/api/v1/admin/tsdb/snapshot?skip_head=false", method="POST", timeout=600)
                name = json.loads(body)["data"]["name"]
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            break
        else:
            raise BridgeError("no free port for a temporary Prometheus after 3 tries")
        snapdir = os.path.join(tsdb, "snapshots", name)
        moved = 0
        for entry in sorted(os.listdir(snapdir)):
            if not os.path.exists(os.path.join(tsdb, entry)):  # the others are hard links of existing blocks
                os.rename(os.path.join(snapdir, entry), os.path.join(tsdb, entry))
                moved += 1
        shutil.rmtree(snapdir)
        try:
            os.rmdir(os.path.join(tsdb, "snapshots"))
        except OSError:
            pass
        log(f"persisted the TSDB head (WAL) as {moved} block(s) first, so that the new blocks drop no WAL data")
        return moved
    finally:
        shutil.rmtree(work, ignore_errors=True)


def backfill(args):
    def log(msg):
        print(msg, flush=True)

    labels = parse_labels(args.label)
    host = args.host or labels.get("host") or _short_host()
    final = scrape_labels(host, labels)
    if not os.path.exists(args.logdir):
        raise BridgeError(f"no such log dir: {args.logdir}")
    files = find_event_files(args.logdir, args.since)
    if not files:
        raise BridgeError(f"no TensorBoard event file ({EVENT_PREFIX}*) under {args.logdir}")
    series, fold = collect_series(files, log=None if args.dry_run else log)
    samples = sum(len(points) for _, points in series.values())
    if args.dry_run:
        sys.stdout.write(openmetrics_text(series, final) if series else "# EOF\n")
        return 0
    if not os.path.isdir(args.tsdb):
        raise BridgeError(f"TSDB dir {args.tsdb} does not exist")
    if _tsdb_in_use(args.tsdb):
        raise BridgeError(f"{args.tsdb} is in use by a running Prometheus: stop it before the backfill")
    promtool = _find_tool("promtool", args.promtool)
    if not promtool:
        raise BridgeError("promtool not found (PATH, /usr/bin); install Prometheus's promtool or pass --promtool")
    if not series:
        log(f"no scalar events in {len(files)} event file(s) under {args.logdir}: nothing to backfill")
        return 0
    if _wal_has_data(args.tsdb):
        prometheus = _find_tool("prometheus", args.prometheus, env="PROMETHEUS_BIN")
        if not prometheus:
            raise BridgeError(
                "prometheus not found (PROMETHEUS_BIN, PATH, /usr/bin): it is needed to persist the "
                "TSDB's WAL before adding blocks (else Prometheus would drop WAL data); pass --prometheus"
            )
        persist_head(args.tsdb, prometheus, log)
    work = tempfile.mkdtemp(prefix="tb_bridge.")
    try:
        om = os.path.join(work, "tensorboard.om")
        with open(om, "w") as f:
            f.write(openmetrics_text(series, final))
        proc = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", om, args.tsdb], capture_output=True, text=True
        )
        if proc.returncode != 0:
            why = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise BridgeError(
                f"promtool create-blocks-from failed (exit {proc.returncode}): {why[-1] if why else 'no output'}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    steps = len(series.get(STEP_METRIC, ("", []))[1])
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(final.items()))
    log(
        f"backfilled {samples} samples in {len(series)} series ({steps} steps) from {len(files)} event file(s) "
        f"into {args.tsdb}, labels {{{label_text}}}"
    )
    return 0


# ---- command line -----------------------------------------------------------------------------------------
def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m jobkit.tb_bridge",
        description="TensorBoard scalars as Prometheus gauges: live (serve) and after the job (backfill).",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="daemon: keep FILE up to date with the newest value of every scalar")
    s.add_argument("--logdir", required=True, help="where to look for event files (recursively)")
    s.add_argument("--host", required=True, help='value of the host="..." label')
    s.add_argument("--out", required=True, help="exposition file, replaced atomically; pid in FILE.pid")
    s.add_argument("--interval", type=positive_seconds, default=1.0, help="seconds between polls (default 1)")
    s.add_argument("--parent-pid", type=int, default=0, help="exit when this process exits")
    s.add_argument("--since", type=int, default=0, help="ignore event files created before this epoch second")
    b = sub.add_parser("backfill", help="add every step of the event files to a stopped Prometheus's TSDB")
    b.add_argument("--logdir", required=True, help="dir searched recursively for event files, or one event file")
    b.add_argument("--tsdb", required=True, help="the TSDB dir (e.g. <job_dir>/prometheus); its Prometheus stopped")
    b.add_argument(
        "--label",
        action="append",
        metavar="NAME=VALUE",
        help="a label Prometheus attached when scraping (job, instance, file_sd labels); repeatable",
    )
    b.add_argument("--host", help="the bridge's own host label (default: --label host, else this host's name)")
    b.add_argument("--since", type=int, default=0, help="ignore event files created before this epoch second")
    b.add_argument("--promtool", help="promtool binary (default: PATH, then /usr/bin/promtool)")
    b.add_argument(
        "--prometheus",
        help="prometheus binary, to persist the WAL first (default: $PROMETHEUS_BIN, PATH, /usr/bin/prometheus)",
    )
    b.add_argument("--dry-run", action="store_true", help="print the OpenMetrics text, touch nothing")
    return ap


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        return serve(args) if args.command == "serve" else backfill(args)
    except BridgeError as e:
        sys.stderr.write(f"tb_bridge: {e}\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"tb_bridge: {e.strerror or e}{f': {e.filename}' if e.filename else ''}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
