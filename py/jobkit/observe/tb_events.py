"""Reading TensorBoard event files: records, scalars, where the files are, and their tags as metric names.

Every scalar summary becomes a gauge named ``tb_`` + the tag with each character outside ``[A-Za-z0-9_]``
replaced by ``_`` (``learning/loss`` -> ``tb_learning_loss``). Scalars are ``simple_value`` summaries and
rank-0 tensors of the ``scalars`` plugin; text summaries (MaxText writes its whole config as
``<key>/text_summary``) and everything else are skipped. A sample's timestamp is the wall time of its own event
in ms (``round(wall_time * 1000)``), the same number live and in the backfill, so that both copies of a sample
are one sample to Prometheus. ``tb_step`` is the training step; its sample time is the wall time of the first
scalar event of that step. Two tags that sanitize to the same name: the first one seen keeps it, the other is
skipped (logged).

TensorFlow is never imported: TensorBoard's compat layer is pinned to its stub (a TF import costs seconds and
memory on the training node). TensorBoard itself is imported on the first read; without it, reading raises
EventsError with one line saying so.
"""

import glob
import os
import re
import struct
import sys
import types
from collections import namedtuple

EVENT_PREFIX = "events.out.tfevents."
STEP_METRIC = "tb_step"
FILL_METRIC = "tb_metrics_plugin_staleness_fill"
RESERVED = frozenset((STEP_METRIC, FILL_METRIC))
# Where MaxText puts its event files: <base_output_directory>/<run_name>/tensorboard/<run_name>/.
QUICK_PATTERNS = ("*/tensorboard/*/" + EVENT_PREFIX + "*", "*/tensorboard/" + EVENT_PREFIX + "*", EVENT_PREFIX + "*")

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")

Scalar = namedtuple("Scalar", "tag step wall_time value")


class EventsError(Exception):
    """A one-line, user-facing error (e.g. TensorBoard is not importable)."""


class CorruptRecord(Exception):
    """A record's CRC does not match, or it does not decode: the file is damaged from there on."""


class FileReplaced(Exception):
    """The event file shrank: it was replaced or truncated."""


def metric_name(tag):
    """``learning/loss`` -> ``tb_learning_loss``."""
    return "tb_" + _BAD_CHARS.sub("_", tag)


def to_ms(wall_time):
    """Sample timestamp in ms of an event's wall time; live exposition and backfill both use this."""
    return int(round(wall_time * 1000))


# ---- CRC-32C -------------------------------------------------------------------------------------------------
# TensorBoard's own CRC is pure Python, one call per record: 60% of a backfill's time. google_crc32c is the C
# implementation (it falls back to its own pure-Python one where the extension is missing: slower, same result).
try:
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - the venv has it; TensorBoard's copy keeps a bare install working
    _crc32c = None


def masked_crc32c(data):
    """TFRecord's masked CRC-32C of DATA (bytes)."""
    crc = _crc32c(data) if _crc32c else _tensorboard_crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tensorboard_crc32c(data):
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    return crc32c(data)


_EVENT_CLASS = None


def event_class():
    """TensorBoard's Event proto class, TF-free; EventsError when TensorBoard cannot be imported."""
    global _EVENT_CLASS
    if _EVENT_CLASS is None:
        # tensorboard.compat resolves `tf` to its stub when this module can be imported.
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        try:
            from tensorboard.compat.proto.event_pb2 import Event
        except ImportError as e:
            raise EventsError(
                f"cannot import TensorBoard's event protos ({e}); install tensorboard into {sys.executable}'s "
                "environment (the project's .venv has it: run utils/setup_env.sh)"
            ) from None
        _EVENT_CLASS = Event
    return _EVENT_CLASS


# ---- records -------------------------------------------------------------------------------------------------
# The TFRecord framing of an event file: u64 length, masked CRC-32C of those 8 bytes, the record, its masked
# CRC-32C (little endian). TensorBoard's TF-free loader reads each record with four buffered reads and a
# per-byte Python CRC; reading the new bytes in one go and a C CRC cost a fraction of that.
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_CHUNK = 8 << 20


class RecordReader:
    """The complete records of an event file not read yet, from where the last call stopped (a record still
    being written is left for the next call). check_data also verifies each record's CRC, not only its
    length's (a wrong length would misframe everything after it)."""

    def __init__(self, path, check_data=True):
        self.path = path
        self.offset = 0
        self.check_data = check_data
        self._length_crcs = {}

    def records(self, limit=None):
        """The complete records from the offset on; with LIMIT, none more once LIMIT bytes were consumed (the
        rest is left for the next call)."""
        length_crcs, check_data = self._length_crcs, self.check_data
        stop = None if limit is None else self.offset + limit
        unpack_header, unpack_crc = _HEADER.unpack_from, _CRC.unpack_from
        crc32c = _crc32c or _tensorboard_crc32c
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            buf = b""
            while chunk := f.read(_CHUNK):
                buf = buf + chunk if buf else chunk
                pos, size = 0, len(buf)
                while size - pos >= 12:
                    length, length_crc = unpack_header(buf, pos)
                    expected = length_crcs.get(length)
                    if expected is None:  # events repeat a handful of sizes: one CRC per size, not per record
                        expected = length_crcs[length] = masked_crc32c(buf[pos : pos + 8])
                    if expected != length_crc:
                        raise CorruptRecord(f"{self.path}: bad length CRC at byte {self.offset}")
                    end = pos + 12 + length
                    if end + 4 > size:
                        break
                    data = buf[pos + 12 : end]
                    if check_data:
                        crc = crc32c(data)  # masked_crc32c, inlined: a call costs as much as the CRC itself
                        if (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF != unpack_crc(buf, end)[0]:
                            raise CorruptRecord(f"{self.path}: bad record CRC at byte {self.offset}")
                    self.offset += end + 4 - pos
                    pos = end + 4
                    yield data
                    if stop is not None and self.offset >= stop:
                        return
                buf = buf[pos:]


# ---- scalars -------------------------------------------------------------------------------------------------
# Nearly every record of a training run is an Event with a wall time, a step and one simple_value: protobuf
# decoding and attribute access cost ~9 us a record on the project's 2-core test machine (CPU time, on top of
# the framing's ~2 us), reading the bytes layout below ~2 us. The layout is learned from
# the records themselves: the bytes after the step, minus the trailing float, are the same for every value of a
# tag (field headers, lengths, tag). The first record of each such shape is decoded with protobuf; if it is a
# plain simple_value summary, later records of that shape are read by offset, else always with protobuf.
_WALL_TIME = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_WALL_TIME_KEY, _STEP_KEY, _SUMMARY_KEY, _FLOAT_KEY = 0x09, 0x10, 0x2A, 0x15


class ScalarReader:
    """Incremental reader of one event file: poll() returns the scalars written since the last poll."""

    def __init__(self, path, check_data=True):
        self.path = path
        self._records = RecordReader(path, check_data)
        self._plugin = {}  # tag -> plugin name of its first value that carried metadata
        self._shapes = {}  # bytes after the step (less the float) -> tag of a plain simple_value, or None
        self.size = 0  # file size at the last read
        self.records = 0  # records (events) consumed so far
        self.damaged = False  # a CorruptRecord was raised: nothing more comes from this file

    def poll(self, limit=None):
        """New scalars; [] without reading when the file did not grow (one stat) or is damaged. With LIMIT, at
        most about LIMIT bytes of records are read (a long backlog takes several polls).
        Raises OSError, FileReplaced, CorruptRecord (once)."""
        if self.damaged:
            return []
        size = os.stat(self.path).st_size
        if size == self.size:
            return []
        if size < self.size:
            raise FileReplaced(self.path)
        start = self._records.offset
        scalars = [Scalar(*s) for s in self.read_tuples(limit)]
        cut = limit is not None and self._records.offset - start >= limit
        # a poll cut short by LIMIT remembers where it stopped as the size: the next poll reads on
        self.size = self._records.offset if cut else size
        return scalars

    def read(self):
        """Every scalar of the events not consumed yet (a record still being written is left for later)."""
        return (Scalar(*s) for s in self.read_tuples())

    def read_tuples(self, limit=None):
        """As read(), as plain (tag, step, wall_time, value) tuples (the backfill's fast path); LIMIT as in
        RecordReader.records."""
        event_class()  # fail early, with one line, when TensorBoard is missing
        shapes = self._shapes
        unpack_wall_time, unpack_float = _WALL_TIME.unpack_from, _FLOAT.unpack_from
        try:
            for data in self._records.records(limit):
                self.records += 1
                # Event: 0x09 wall_time (8 bytes), 0x10 step (varint; absent when 0), 0x2a summary ... 0x15 float
                if data[0] == _WALL_TIME_KEY and len(data) > 14:
                    pos, step = 9, 0
                    if data[9] == _STEP_KEY:
                        pos, shift = 10, 0
                        while True:
                            byte = data[pos]
                            step |= (byte & 0x7F) << shift
                            pos += 1
                            if byte < 0x80 or shift > 56:
                                break
                            shift += 7
                    shape = data[pos:-4]
                    tag = shapes.get(shape, False)
                    if tag:
                        if step >= 1 << 63:
                            step -= 1 << 64
                        yield tag, step, unpack_wall_time(data, 1)[0], unpack_float(data, len(data) - 4)[0]
                        continue
                    if tag is False:
                        shapes[shape] = self._plain_simple_value(data)
                yield from self._decode(data)
        except CorruptRecord:
            self.damaged = True
            raise

    @staticmethod
    def _plain_simple_value(data):
        """The tag when DATA is an Event holding one simple_value (no metadata) stored last, else None."""
        try:
            event = event_class().FromString(data)
        except Exception:
            return None
        if event.WhichOneof("what") != "summary" or len(event.summary.value) != 1 or data[-5] != _FLOAT_KEY:
            return None
        value = event.summary.value[0]
        if value.WhichOneof("value") != "simple_value" or value.HasField("metadata"):
            return None
        # canonical bytes (fields in number order): the float is the record's last field, nothing follows it
        if _FLOAT.pack(value.simple_value) != data[-4:] or event.SerializeToString() != data:
            return None
        return value.tag

    def _decode(self, data):
        try:
            event = event_class().FromString(data)
        except Exception as e:  # protobuf's DecodeError: a damaged record the framing CRC let through
            self.damaged = True
            raise CorruptRecord(f"{self.path}: undecodable record {self.records} ({e})") from None
        if event.WhichOneof("what") != "summary":
            return
        for value in event.summary.value:
            number = self._scalar(value)
            if number is not None:
                yield value.tag, event.step, event.wall_time, number

    def _scalar(self, value):
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            self._plugin.setdefault(value.tag, value.metadata.plugin_data.plugin_name)
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return float(value.simple_value)
        if kind == "tensor" and self._plugin.get(value.tag) == "scalars":
            return _tensor_scalar(value.tensor)
        return None


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


# ---- finding event files -------------------------------------------------------------------------------------
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


def file_order(path):
    """Sort key of event files: name-embedded creation time, then mtime."""
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
    return sorted((p for p in found if os.path.isfile(p) and _usable(p, since)), key=file_order)


# ---- from scalars to samples ---------------------------------------------------------------------------------
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
        """(name, tag, ms, value) per scalar; scalars are (tag, step, wall_time, value) tuples or Scalars."""
        names = self.names
        for tag, step, wall_time, value in scalars:
            name = names[tag] if tag in names else self.name(tag)
            if name is None:
                continue
            ms = int(round(wall_time * 1000))
            if step != self.step:
                self.step = step
                yield STEP_METRIC, None, ms, float(step)
            yield name, tag, ms, value

    def collect(self, scalars, points):
        """samples(), stored instead of yielded: points[name][ms] = value (the later of two at one ms wins).
        The backfill's hot loop: a generator between reader and dict costs a third of its time."""
        names = self.names
        step_points = points.setdefault(STEP_METRIC, {})
        for tag, step, wall_time, value in scalars:
            name = names[tag] if tag in names else self.name(tag)
            if name is None:
                continue
            ms = int(round(wall_time * 1000))
            if step != self.step:
                self.step = step
                step_points[ms] = float(step)
            found = points.get(name)
            if found is None:
                found = points[name] = {}
            found[ms] = value
        if not step_points:
            del points[STEP_METRIC]
