"""py/jobkit/observe/tsdb_wal.py: the WAL check that `jobkit tsdb view` runs before Prometheus may repair a WAL.

Segments here are built fragment by fragment in Prometheus's format (tsdb/wlog); test_prometheus.py checks a
segment written by a real Prometheus, damaged by one flipped byte.
"""

import struct

from google_crc32c import value as crc32c

from jobkit.observe import tsdb_wal

PAGE = tsdb_wal.PAGE_SIZE


def fragment(kind, data):
    return struct.pack(">BHI", kind, len(data), crc32c(data)) + data


def pad_page(segment):
    """Zero padding (a type-0 byte and zeros) to the end of the current page."""
    return segment + b"\0" * (-len(segment) % PAGE)


def test_a_healthy_segment_reads_cleanly():
    seg = fragment(tsdb_wal.FULL, b"series record")
    # a record split over two pages: first fragment fills page 1, last one starts page 2
    room = PAGE - len(seg) - 7
    seg += fragment(tsdb_wal.FIRST, b"a" * room)
    assert len(seg) == PAGE
    seg += fragment(tsdb_wal.MIDDLE, b"b" * 100) + fragment(tsdb_wal.LAST, b"c" * 10)
    seg = pad_page(seg) + fragment(tsdb_wal.FULL | 0x08, b"snappy-flagged")  # a page closed by padding
    assert tsdb_wal.check_segment(seg) is None
    assert tsdb_wal.check_segment(b"") is None


def test_damage_is_found_with_its_offset():
    good = fragment(tsdb_wal.FULL, b"one") + fragment(tsdb_wal.FULL, b"two")
    second = len(fragment(tsdb_wal.FULL, b"one"))
    bad = bytearray(good)
    bad[second + 8] ^= 0x01
    assert tsdb_wal.check_segment(bytes(bad)) == (second, "CRC mismatch")
    assert tsdb_wal.check_segment(good[:-1])[0] == second  # cut short
    assert tsdb_wal.check_segment(fragment(tsdb_wal.LAST, b"x"))[1].startswith("fragments out of order")
    assert tsdb_wal.check_segment(fragment(tsdb_wal.FIRST, b"x")) == (8, "the segment ends inside a record")
    padded = bytearray(pad_page(good))
    padded[-5] = 1
    assert tsdb_wal.check_segment(bytes(padded)) == (len(good), "non-zero bytes in a page's padding")
    assert tsdb_wal.check_segment(fragment(5, b"x")) == (0, "unknown fragment type 5")


def test_check_names_the_segment_checkpoints_first(tmp_path):
    wal = tmp_path / "wal"
    (wal / "checkpoint.00000001").mkdir(parents=True)
    (wal / "checkpoint.00000001" / "00000000").write_bytes(fragment(tsdb_wal.FULL, b"cp"))
    (wal / "00000002").write_bytes(fragment(tsdb_wal.FULL, b"ok"))
    (wal / "00000003").write_bytes(fragment(tsdb_wal.FULL, b"ok") + b"\x01\x00")
    assert tsdb_wal.segments(tmp_path) == ["wal/checkpoint.00000001/00000000", "wal/00000002", "wal/00000003"]
    assert tsdb_wal.check(tmp_path) == tsdb_wal.Damage(
        "wal/00000003", 9, "a fragment header cut off by the end of the segment"
    )
    assert tsdb_wal.check(tmp_path / "nope") is None
