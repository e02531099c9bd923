"""The backfill's fast reader: an event file's scalars as numpy columns, read a whole file at a time.

jobkit.observe.tb_events reads record by record (the live bridge's way: a few new records a poll); for the
backfill's hundreds of thousands of records its per-record Python costs ~3 us. Here a Python loop only finds
where each record starts; everything else is done on columns: the length CRCs (one per distinct length), the
Event bytes of every record of one length gathered into a matrix, its wall time, step varint and float read by
offset, and its tag learned from the bytes between step and float (the same "shape" rule as
ScalarReader.read_tuples: the first record of each shape is decoded with protobuf and must be a plain
simple_value summary). The record CRCs are checked one by one (the C CRC, ~0.3 us each).

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


def _record_starts(buf: bytes) -> tuple[list[int], list[int], int]:
    """(offset, data length) of every complete record of BUF, and where the rest (a record still being written,
    or nothing) starts."""
    unpack = _HEADER.unpack_from
    starts, lengths = [], []
    add_start, add_length = starts.append, lengths.append
    pos, size = 0, len(buf)
    while size - pos >= 12:
        length = unpack(buf, pos)[0]
        end = pos + 16 + length
        if end > size:
            break
        add_start(pos)
        add_length(length)
        pos = end
    return starts, lengths, pos


def _crcs_ok(buf: bytes, arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """True when every record's length CRC and data CRC match."""
    from jobkit.observe import tb_events

    windows = np.lib.stride_tricks.sliding_window_view(arr, 4)
    header_crc = windows[starts + 8].copy().view("<u4").ravel()
    for length in np.unique(lengths).tolist():
        expected = masked_crc32c(struct.pack("<Q", length))
        if np.any(header_crc[lengths == length] != expected):
            return False
    crc32c = tb_events._crc32c or tb_events._tensorboard_crc32c
    data_crc = windows[starts + 12 + lengths].copy().view("<u4")
    computed = np.fromiter(
        (crc32c(buf[a : a + n]) for a, n in zip((starts + 12).tolist(), lengths.tolist(), strict=True)),
        dtype=np.uint64,
        count=len(starts),
    )
    masked = (((computed >> np.uint64(15)) | (computed << np.uint64(17))) + np.uint64(0xA282EAD8)) & _MASK
    return bool(np.all(masked == data_crc.ravel().astype(np.uint64)))


def read_columns(path: str):
    """(tags, tag_index, step, wall_time, value) of every scalar of PATH in file order (numpy arrays; tags[i] is
    the tag of tag_index i), or None when the file needs the record-by-record reader (see the module docstring)."""
    with open(path, "rb") as f:
        buf = f.read()
    starts_list, lengths_list, rest = _record_starts(buf)
    if len(buf) - rest >= 12 and masked_crc32c(buf[rest : rest + 8]) != _HEADER.unpack_from(buf, rest)[1]:
        return None  # a damaged length: the slow reader says so
    empty = ([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    if not starts_list:
        return empty
    arr = np.frombuffer(buf, dtype=np.uint8)
    starts = np.array(starts_list, dtype=np.int64)
    lengths = np.array(lengths_list, dtype=np.int64)
    if not _crcs_ok(buf, arr, starts, lengths):
        return None
    reader = ScalarReader(path)
    tags: list[str] = []
    tag_ids: dict[str, int] = {}
    shape_tags: dict[bytes, int | None] = {}  # shape bytes -> tag index, or None: not a plain simple_value
    parts = []  # (record numbers, tag index, step, wall, value) per group of records
    for length in np.unique(lengths).tolist():
        rec = np.flatnonzero(lengths == length)
        if length <= 14:
            if not _no_scalars(reader, buf, starts[rec], length):
                return None
            continue
        # one row per record: a copy of each record's bytes out of a window view (no index matrix)
        rows = np.lib.stride_tricks.sliding_window_view(arr, length)[starts[rec] + 12]
        plain = rows[:, 0] == 0x09
        if not plain.all() and not _no_scalars(reader, buf, starts[rec[~plain]], length):
            return None
        rows, rec = rows[plain], rec[plain]
        has_step = rows[:, 9] == 0x10
        # where the step varint ends: the first byte < 0x80 from byte 10 on (no step: the shape starts at 9)
        cont = rows[:, 10 : min(length - 4, 20)] >= 0x80
        varint_len = np.where(cont.all(axis=1), cont.shape[1], cont.argmin(axis=1)) + 1
        after = np.where(has_step, 10 + varint_len, 9)
        for pos in np.unique(after).tolist():
            sel = after == pos
            group, nums = rows[sel], rec[sel]
            parts_of = _shapes(reader, buf, group, nums, pos, length, starts, shape_tags, tags, tag_ids)
            if parts_of is None:
                return None
            parts.extend(parts_of)
    if not parts:
        return empty
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
    return (tags, *(np.concatenate([p[i] for p in parts])[order] for i in range(1, 5)))


def _shapes(reader, buf, group, nums, pos, length, starts, shape_tags, tags, tag_ids):
    """The parts of GROUP (records of one length whose step ends at POS), split by shape; None when a shape is
    not a plain simple_value with a scalar."""
    shape_bytes = np.ascontiguousarray(group[:, pos : length - 4])
    keys = shape_bytes.view(np.dtype((np.void, shape_bytes.shape[1]))).ravel()
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    ids = np.empty(len(uniq), dtype=np.int64)
    for u, i in enumerate(first.tolist()):
        shape = uniq[u].tobytes()
        if shape not in shape_tags:
            data = _record(buf, starts, int(nums[i]))
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


def _record(buf, starts, number):
    start = int(starts[number])
    length = _HEADER.unpack_from(buf, start)[0]
    return buf[start + 12 : start + 12 + length]


def _no_scalars(reader, buf, record_starts, length) -> bool:
    """True when none of the records at RECORD_STARTS (all of LENGTH bytes) holds a scalar the slow reader would
    yield (a text summary, the file_version event); False also for an undecodable one."""
    for start in record_starts.tolist():
        data = buf[start + 12 : start + 12 + length]
        try:
            if any(True for _ in reader._decode(data)):
                return False
        except Exception:
            return False
    return True


__all__ = ["RecordReader", "read_columns"]
