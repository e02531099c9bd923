"""The backfill's fast reader: an event file's scalars as numpy columns, read a whole file at a time.

jobkit.observe.tb_events reads record by record (the live bridge's way: a few new records a poll); for the
backfill's hundreds of thousands of records its per-record Python costs ~3 us. Here a Python loop only finds
where each record starts; everything else is done on columns: the length CRCs (one per distinct length), the
Event bytes of every record of one length gathered into a matrix, its wall time, step varint and float read by
offset, and its tag learned from the bytes between step and float (the same "shape" rule as
ScalarReader.read_tuples: the first record of each shape must be a plain simple_value summary; it is decoded
with protobuf unless its bytes are the canonical form _plain_tag reads, where protobuf's answer is certain, so
that a usual file never imports protobuf, ~0.1 s). The record CRCs are checked by column where a length has many records (see _data_crcs).

read_columns returns None, and the caller reads the file the slow way, whenever the file is anything but a
clean run of such events (plus records that hold no scalar at all, like the file_version event and text
summaries): a bad CRC, an undecodable record, a tensor scalar, a summary with several values. So the results
(and the messages about a damaged file) are the slow reader's in every case it alone handles.
"""

from __future__ import annotations

import struct

import numpy as np

from jobkit.observe.tb_events import RecordReader, ScalarReader, masked_crc32c

_HEADER = struct.Struct("<QI")
_MASK = np.uint64(0xFFFFFFFF)
_CRC_BLOCK = 4096  # records per block of _data_crcs
_READ_BLOCK = 1 << 16  # records per block of read_columns
_HEAD_ROWS = 1024  # rows whose keys _distinct_rows matches over all rows at once


def _record_starts(buf: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """(offsets, data lengths) of every complete record of BUF (int64 arrays), and where the rest (a record still
    being written, or nothing) starts.

    Event files repeat a pattern (one record per tag, the same lengths step after step): every _MIN_RUN records
    the Python loop looks for a period in the last lengths it read, guesses that the rest of the file repeats it
    and checks that by column; the loop goes on from the first record that breaks the pattern."""
    unpack = _HEADER.unpack_from
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    starts: list[int] = []
    lengths: list[int] = []
    pos, size = 0, len(buf)
    while size - pos >= 12:
        length = unpack(buf, pos)[0]
        end = pos + 16 + length
        if end > size:
            break
        starts.append(pos)
        lengths.append(length)
        pos = end
        if len(starts) == _MIN_RUN:
            period = next((p for p in range(1, _MIN_RUN // 2 + 1) if lengths[-p:] == lengths[-2 * p : -p]), None)
            parts.append((np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)))
            if period:
                parts.append(_repeat(buf, pos, lengths[-period:]))
                if len(parts[-1][0]):
                    pos = int(parts[-1][0][-1] + 16 + parts[-1][1][-1])
            starts, lengths = [], []
    parts.append((np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64)))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), pos


_MIN_RUN = 64  # records read one by one before each guess


def _repeat(buf, pos, pattern_lengths):
    """(offsets, lengths) of the records from POS on while they repeat PATTERN_LENGTHS, in whole periods.

    Each place in the pattern is checked as one strided view of the buffer (no copy): the length fields of
    that place in every repetition."""
    pattern = np.array(pattern_lengths, dtype=np.int64) + 16
    span = int(pattern.sum())
    reps = (len(buf) - pos) // span
    offsets = np.concatenate([[0], np.cumsum(pattern)[:-1]])
    whole = reps  # repetitions before the first that breaks the pattern
    for offset, length in zip(offsets.tolist(), pattern_lengths, strict=True):
        if whole == 0:
            break
        column = np.ndarray((whole,), dtype="<u8", buffer=buf, offset=pos + offset, strides=(span,))
        bad = np.flatnonzero(column != length)
        if len(bad):
            whole = int(bad[0])
    guess = (pos + np.arange(whole, dtype=np.int64)[:, None] * span + offsets).ravel()
    return guess, np.tile(pattern - 16, whole)


def _distinct(values: np.ndarray) -> list[int]:
    """VALUES' distinct values, ascending, as ints: np.unique's answer without its first-call import of numpy.ma
    (~8 ms of every backfill's start)."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))].tolist() if len(ordered) else []


def _crcs_ok(buf: bytes, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """True when every record's length CRC and data CRC match."""
    windows = np.lib.stride_tricks.sliding_window_view(arr, 4)
    header_crc = windows[starts + 8].copy().view("<u4").ravel()
    data_crc = windows[starts + 12 + lengths].copy().view("<u4").ravel()
    for length in _distinct(lengths):
        of_length = lengths == length
        if np.any(header_crc[of_length] != masked_crc32c(struct.pack("<Q", length))):
            return False
        computed = _data_crcs(buf, arr, starts[of_length] + 12, length).astype(np.uint64)
        masked = (((computed >> np.uint64(15)) | (computed << np.uint64(17))) + np.uint64(0xA282EAD8)) & _MASK
        if not np.array_equal(masked, data_crc[of_length]):
            return False
    return True


def _data_crcs(buf: bytes, arr: np.ndarray, data_starts: np.ndarray, length: int) -> np.ndarray:
    """The CRC-32C of each LENGTH-byte record data at DATA_STARTS (uint32).

    Many records of one length are done as columns: for a fixed length the CRC is affine in the bits of the
    data (crc(x) = crc(0) xor the XOR of one constant per set bit), so a table per 2-byte position (65536
    entries, built from the 16 single-bit constants with the C CRC) gives each record's CRC as one gather and
    an XOR across its positions, ~2.5x cheaper than a C call per record. Few records: a C call each."""
    from jobkit.observe import tb_events

    crc32c = tb_events._crc32c or tb_events._tensorboard_crc32c
    pairs = length // 2
    if len(data_starts) < 64 * max(pairs, 1):  # building the tables would cost more than it saves
        return np.fromiter(
            (crc32c(buf[a : a + length]) for a in data_starts.tolist()), dtype=np.uint32, count=len(data_starts)
        )
    zero = crc32c(bytes(length))

    def bit(position, b):
        one = bytearray(length)
        one[position] = 1 << b
        return crc32c(bytes(one)) ^ zero

    tables = np.empty((pairs, 65536), np.uint32)
    for i in range(pairs):
        table = np.zeros(1, np.uint32)
        for b in range(16):  # bit b of the little-endian pair: byte 2i bits 0-7, then byte 2i+1
            table = np.concatenate([table, table ^ np.uint32(bit(2 * i + b // 8, b % 8))])
        tables[i] = table
    odd = np.zeros(1, np.uint32)
    if length % 2:  # the odd last byte, by the same rule with a 256-entry table
        for b in range(8):
            odd = np.concatenate([odd, odd ^ np.uint32(bit(length - 1, b))])
    flat = tables.ravel()
    base = (np.arange(pairs, dtype=np.int32) * 65536)[:, None]
    windows = np.lib.stride_tricks.sliding_window_view(arr, length)
    out = np.empty(len(data_starts), np.uint32)
    # a block of records at a time, so that its index and gathered matrices stay in the CPU's cache (all the
    # records at once are ~10 bytes of scratch per data byte, memory-bound: ~2x slower on a 5 M-record file)
    for first in range(0, len(data_starts), _CRC_BLOCK):
        rows = windows[data_starts[first : first + _CRC_BLOCK]]
        # one row per 2-byte position (the XOR then runs along whole rows, not across each short record)
        words = np.ascontiguousarray(rows[:, : 2 * pairs]).view("<u2").T.astype(np.int32)
        words += base
        block = np.bitwise_xor.reduce(flat[words], axis=0) ^ np.uint32(zero)
        if length % 2:
            block ^= odd[rows[:, length - 1]]
        out[first : first + len(block)] = block
    return out


def read_columns(path: str):
    """(tags, tag_index, step, wall_time, value) of every scalar of PATH in file order (numpy arrays; tags[i] is
    the tag of tag_index i), or None when the file needs the record-by-record reader (see the module docstring)."""
    with open(path, "rb") as f:
        buf = f.read()
    starts, lengths, rest = _record_starts(buf)
    if len(buf) - rest >= 12 and masked_crc32c(buf[rest : rest + 8]) != _HEADER.unpack_from(buf, rest)[1]:
        return None  # a damaged length: the slow reader says so
    empty = ([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    if not len(starts):
        return empty
    arr = np.frombuffer(buf, dtype=np.uint8)
    if not _crcs_ok(buf, arr, starts, lengths):
        return None
    reader = ScalarReader(path)
    tags: list[str] = []
    tag_ids: dict[str, int] = {}
    shape_tags: dict[bytes, int | None] = {}  # shape bytes -> tag index, or None: not a plain simple_value
    parts = []  # (record numbers, tag index, step, wall, value) per group of records
    # _READ_BLOCK records at a time: the row matrices and their copies then stay in the CPU's cache
    for block in range(0, len(starts), _READ_BLOCK):
        if not _read_block(reader, buf, arr, starts, lengths, block, shape_tags, tags, tag_ids, parts):
            return None
    if not parts:
        return empty
    # back to file order: each record number is in one part, so its rank among them is its place (no sort)
    nums = np.concatenate([p[0] for p in parts])
    taken = np.zeros(len(starts), dtype=bool)
    taken[nums] = True
    place = (np.cumsum(taken) - 1)[nums]
    columns = []
    for i in range(1, 5):
        column = np.concatenate([p[i] for p in parts])
        ordered = np.empty_like(column)
        ordered[place] = column
        columns.append(ordered)
    return (tags, *columns)


def _read_block(reader, buf, arr, starts, lengths, block, shape_tags, tags, tag_ids, parts) -> bool:
    """read_columns' work on the records BLOCK .. BLOCK + _READ_BLOCK: their parts added to PARTS; False when
    the file needs the record-by-record reader."""
    of_block = lengths[block : block + _READ_BLOCK]
    for length in _distinct(of_block):
        rec = block + np.flatnonzero(of_block == length)
        if length <= 14:
            if not _no_scalars(reader, buf, starts[rec], length):
                return False
            continue
        # one row per record: a copy of each record's bytes out of a window view (no index matrix)
        rows = np.lib.stride_tricks.sliding_window_view(arr, length)[starts[rec] + 12]
        plain = rows[:, 0] == 0x09
        if not plain.all() and not _no_scalars(reader, buf, starts[rec[~plain]], length):
            return False
        rows, rec = rows[plain], rec[plain]
        has_step = rows[:, 9] == 0x10
        # where the step varint ends: the first byte < 0x80 from byte 10 on (no step: the shape starts at 9)
        cont = rows[:, 10 : min(length - 4, 20)] >= 0x80
        varint_len = np.where(cont.all(axis=1), cont.shape[1], cont.argmin(axis=1)) + 1
        after = np.where(has_step, 10 + varint_len, 9)
        for pos in _distinct(after):
            sel = after == pos
            group, nums = rows[sel], rec[sel]
            parts_of = _shapes(reader, buf, group, nums, pos, length, starts, shape_tags, tags, tag_ids)
            if parts_of is None:
                return False
            parts.extend(parts_of)
    return True


def _shapes(reader, buf, group, nums, pos, length, starts, shape_tags, tags, tag_ids):
    """The parts of GROUP (records of one length whose step ends at POS), split by shape; None when a shape is
    not a plain simple_value with a scalar."""
    shape_bytes = np.ascontiguousarray(group[:, pos : length - 4])
    first, inverse = _distinct_rows(shape_bytes)
    ids = np.empty(len(first), dtype=np.int64)
    for u, i in enumerate(first.tolist()):
        shape = shape_bytes[i].tobytes()
        if shape not in shape_tags:
            data = _record(buf, starts, int(nums[i]))
            tag = _plain_tag(data)
            if tag is _UNSURE:
                tag = ScalarReader._plain_simple_value(data)
            shape_tags[shape] = None if tag is None else tag_ids.setdefault(tag, len(tag_ids))
            if tag is not None and len(tags) < len(tag_ids):
                tags.append(tag)
        if shape_tags[shape] is None:
            # not plain: fine only when none of these records holds a scalar (decoded as the slow reader does)
            members = nums[inverse == u]
            if not _no_scalars(reader, buf, starts[members], length):
                return None
            ids[u] = -1
        else:
            ids[u] = shape_tags[shape]
    tag_index = ids[inverse.ravel()]
    keep = tag_index >= 0
    group, nums, tag_index = group[keep], nums[keep], tag_index[keep]
    step = np.zeros(len(group), dtype=np.uint64)
    for i in range(10, pos):
        step |= (group[:, i].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * (i - 10))
    wall = np.ascontiguousarray(group[:, 1:9]).view("<f8").ravel()
    value = np.ascontiguousarray(group[:, length - 4 :]).view("<f4").ravel().astype(np.float64)
    return [(nums, tag_index, step.view(np.int64), wall, value)]


_UNSURE = object()
_FLOAT = struct.Struct("<f")


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, end) of the minimal varint at POS, below 2**63; None for anything else."""
    value = shift = 0
    for end in range(pos, min(pos + 9, len(data))):
        value |= (data[end] & 0x7F) << shift
        shift += 7
        if data[end] < 0x80:
            return (value, end + 1) if data[end] or end == pos else None
    return None


def _file_version_only(data: bytes) -> bool:
    """True when DATA is, byte for byte, an Event of a wall_time and a file_version (UTF-8) alone: no scalar."""
    if len(data) < 11 or data[0] != 0x09 or data[9] != 0x1A:
        return False
    length = _varint(data, 10)
    if length is None or length[1] + length[0] != len(data):
        return False
    try:
        data[length[1] :].decode()
    except UnicodeDecodeError:
        return False
    return True


def _plain_tag(data: bytes):
    """The tag of DATA when it is, byte for byte, the canonical Event of one simple_value (what tensorboardX and
    MaxText write): wall_time, a step (omitted when 0), a summary of one value with a tag and the float last.
    _UNSURE for anything else, which protobuf then decides (ScalarReader._plain_simple_value), so this only
    saves importing and running protobuf where its answer is certain."""
    if len(data) < 9 or data[0] != 0x09:
        return _UNSURE
    if _file_version_only(data):
        return None
    pos = 9
    if data[pos] == 0x10:
        step = _varint(data, pos + 1)
        if step is None or step[0] == 0:
            return _UNSURE
        pos = step[1]
    if pos >= len(data) or data[pos] != 0x2A:
        return _UNSURE
    fields = []  # summary length, value length, tag length, each followed by its field key check
    for key in (0x0A, 0x0A):
        length = _varint(data, pos + 1)
        if length is None or length[1] >= len(data) or data[length[1]] != key:
            return _UNSURE
        fields.append(length)
        pos = length[1]
    tag_length = _varint(data, pos + 1)
    if tag_length is None:
        return _UNSURE
    start = tag_length[1]
    end = start + tag_length[0]
    if (
        end + 5 != len(data)
        or data[end] != 0x15
        or fields[0][0] != len(data) - fields[0][1]
        or fields[1][0] != len(data) - fields[1][1]
        or _FLOAT.pack(_FLOAT.unpack_from(data, end + 1)[0]) != data[end + 1 :]
    ):
        return _UNSURE
    try:
        return data[start:end].decode()
    except UnicodeDecodeError:
        return _UNSURE


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first row number of each distinct row of the uint8 matrix ROWS, each row's distinct-row number).

    A row is hashed to one uint64; the few distinct hashes of an event file (one per tag and step varint width)
    are split off one at a time, and every row is then compared with its group's first row in full, so a hash
    collision only costs the sort it replaces."""
    width = rows.shape[1]
    if width == 0 or not len(rows):
        return np.zeros(min(len(rows), 1), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
    padded = np.zeros((len(rows), -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = rows
    words = padded.view("<u8")
    key = np.zeros(len(rows), dtype=np.uint64)
    for k in range(words.shape[1]):
        key = key * np.uint64(0x9E3779B97F4A7C15) + words[:, k]
    # the keys among the first rows (a file's tags repeat step after step) are matched over all rows by one
    # compare each; the rows left (a tag first seen later) go one key at a time
    seen: dict[int, int] = {}
    for i, k in enumerate(key[:_HEAD_ROWS].tolist()):
        seen.setdefault(k, i)
    first = list(seen.values())[:64]
    inverse = np.full(len(rows), -1, dtype=np.int64)
    for j, i in enumerate(first):
        inverse[key == key[i]] = j
    left = np.flatnonzero(inverse < 0)
    while len(left) and len(first) < 64:
        same = key[left] == key[left[0]]
        inverse[left[same]] = len(first)
        first.append(int(left[0]))
        left = left[~same]
    firsts = np.array(first, dtype=np.int64)
    if len(left) or not (rows == rows[firsts[inverse]]).all():  # many shapes, or a collision: sort them
        keys = np.ascontiguousarray(rows).view(np.dtype((np.void, width))).ravel()
        _, firsts, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return firsts, inverse


def _record(buf, starts, number):
    start = int(starts[number])
    length = _HEADER.unpack_from(buf, start)[0]
    return buf[start + 12 : start + 12 + length]


def _no_scalars(reader, buf, record_starts, length) -> bool:
    """True when none of the records at RECORD_STARTS (all of LENGTH bytes) holds a scalar the slow reader would
    yield (a text summary, the file_version event); False also for an undecodable one."""
    for start in record_starts.tolist():
        data = buf[start + 12 : start + 12 + length]
        if _file_version_only(data):  # no need to decode it (or to import protobuf for it)
            continue
        try:
            if any(True for _ in reader._decode(data)):
                return False
        except Exception:
            return False
    return True


__all__ = ["RecordReader", "read_columns"]
