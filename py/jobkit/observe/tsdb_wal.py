"""Checks a Prometheus TSDB's write-ahead log without changing it.

Prometheus repairs a damaged WAL at start-up by truncating it at the damage: everything after it is gone, and
nothing says so on the terminal. `jobkit tsdb view` reads the WAL first and refuses instead, so the user decides
(view a copy, which Prometheus may repair, or keep the original for forensics).

The format (Prometheus tsdb/wlog, the same in 2.x): segment files named by number in wal/ and in
wal/checkpoint.N/, made of 32 KiB pages. A page holds record fragments, none crossing a page boundary; each has a
7-byte header: 1 type byte (low 3 bits: 0 = the rest of the page is zero padding, 1 full, 2 first, 3 middle,
4 last; the higher bits flag compression), a big-endian uint16 length, and a big-endian uint32 CRC-32C
(Castagnoli) of the fragment's data. A record is one full fragment or first, middle..., last; records never cross
segments. A segment may end at any fragment boundary (the page still being filled).
"""

import os
import struct
from dataclasses import dataclass

PAGE_SIZE = 32 * 1024
HEADER = struct.Struct(">BHI")
PAGE_PADDING, FULL, FIRST, MIDDLE, LAST = 0, 1, 2, 3, 4
TYPE_MASK = 0x07

try:
    from google_crc32c import value as crc32c
except ImportError:  # pragma: no cover - its pure-Python fallback is part of the same package

    def crc32c(data):
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as slow

        return slow(data)


@dataclass(frozen=True)
class Damage:
    segment: str  # path relative to the TSDB dir, e.g. wal/00000002
    offset: int  # byte offset of the bad fragment in that segment
    why: str


def segments(tsdb):
    """The WAL's segment files, checkpoint segments first, as paths relative to TSDB."""
    wal = os.path.join(tsdb, "wal")
    if not os.path.isdir(wal):
        return []
    found = []
    for entry in sorted(os.listdir(wal)):
        path = os.path.join(wal, entry)
        if entry.startswith("checkpoint.") and os.path.isdir(path):
            found = [os.path.join("wal", entry, s) for s in sorted(os.listdir(path)) if s.isdigit()] + found
    found += [os.path.join("wal", e) for e in sorted(os.listdir(wal)) if e.isdigit()]
    return found


def check_segment(data):
    """(offset, why) of the first damage in one segment's bytes, or None."""
    pos, size, in_record = 0, len(data), False
    while pos < size:
        kind = data[pos] & TYPE_MASK
        if kind == PAGE_PADDING:
            page_end = min((pos // PAGE_SIZE + 1) * PAGE_SIZE, size)
            if data[pos:page_end].count(0) != page_end - pos:
                return pos, "non-zero bytes in a page's padding"
            if page_end == size and size % PAGE_SIZE:
                return pos, "the segment ends inside a page's padding"
            pos = page_end
            continue
        if size - pos < HEADER.size:
            return pos, "a fragment header cut off by the end of the segment"
        if (pos % PAGE_SIZE) + HEADER.size > PAGE_SIZE:
            return pos, "a fragment header across a page boundary"
        _type, length, crc = HEADER.unpack_from(data, pos)
        start, end = pos + HEADER.size, pos + HEADER.size + length
        if kind > LAST:
            return pos, f"unknown fragment type {kind}"
        if (start % PAGE_SIZE) + length > PAGE_SIZE:
            return pos, f"a fragment of {length} bytes across a page boundary"
        if end > size:
            return pos, f"a fragment of {length} bytes cut off by the end of the segment"
        if crc32c(data[start:end]) != crc:
            return pos, "CRC mismatch"
        if (kind in (FULL, FIRST)) == in_record:
            return pos, "fragments out of order (a record's middle or last part without its first)"
        in_record = kind in (FIRST, MIDDLE)
        pos = end
    if in_record:
        return pos, "the segment ends inside a record"
    return None


def check(tsdb):
    """The first Damage in TSDB's WAL (checkpoint included), or None when it reads cleanly."""
    for rel in segments(tsdb):
        with open(os.path.join(tsdb, rel), "rb") as f:
            found = check_segment(f.read())
        if found:
            return Damage(rel, *found)
    return None
