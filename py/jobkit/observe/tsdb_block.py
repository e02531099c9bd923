"""A Prometheus TSDB block written straight from numpy columns, without promtool.

``write_block(tsdb, series)`` adds one block (``<ULID>/meta.json, index, chunks/000001.., tombstones``) to the
TSDB dir for SERIES, a list of (labels dict with ``__name__``, ms int64 array strictly ascending, float64 values).
It is the backfill's writer (jobkit.observe.tb_backfill): promtool's ``create-blocks-from openmetrics`` costs
~1.2 us a sample to render as text plus ~0.5 s of wall time even for a small file, this ~0.1 us a sample.

The format is Prometheus's own (tsdb/docs/format in its repository):
- chunks: XOR (Gorilla) chunks of at most 120 samples, as Prometheus cuts them. The values are written in the
  simplest valid form: an unchanged value is the one bit ``0``, any other the control bits ``11`` with its
  leading-zero count (5 bits) and significant-bit count (6 bits) spelled out, never the shorter ``10`` that
  reuses the previous widths. Timestamps use the usual delta-of-delta buckets. Every field of every sample is
  computed by column and the bit stream is packed with numpy (no Python loop per sample); each chunk carries
  its CRC-32C. Segment files are cut before 512 MiB.
- index v2: the symbol table, the series (16-byte aligned, sorted by label set, chunk metas), the label
  indices and their offset table, the postings (an all-series list under the empty name and value, then one per
  label pair), the postings offset table and the TOC, each with its CRC-32C.
- meta.json (level 1, its own ULID as the source) and an empty tombstones file.
A label whose value is empty is left out, as Prometheus does. NaN values are written as Go's math.NaN() (what promtool stores for "NaN"), so no payload can turn into
Prometheus's stale marker. The block is built under ``<ULID>.tmp-for-creation`` and renamed into place, the
name Prometheus removes at start-up, so an interrupted write leaves no half block.

One block spans all samples (promtool cuts them at 2-hour boundaries): Prometheus reads a block of any range
and leaves one longer than its largest compaction range as it is.
"""

import json
import os
import time

import numpy as np

CHUNK_SAMPLES = 120
_ENCODE_BLOCK = 1 << 15  # samples per block of encode_chunks (rounded to a chunk start)
SEGMENT_BYTES = 512 * 1024 * 1024
_GO_NAN = 0x7FF8000000000001  # math.NaN() in Go; Prometheus's stale marker is 0x7FF0000000000002
_CHUNKS_MAGIC = b"\x85\xbd\x40\xdd\x01\x00\x00\x00"
_INDEX_MAGIC = b"\xba\xaa\xd7\x00\x02"
_TOMBSTONES = b"\x01\x30\xba\x30\x01\x00\x00\x00\x00"  # magic, version 1, the CRC of no entries
_ULID_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_U64 = np.uint64
# per dod bucket: control bits placed above the payload (buckets 0-3: one field), the payload masks, the widths
_TIME_HEAD = np.array([0, 0b10 << 14, 0b110 << 17, 0b1110 << 20, 0b1111], _U64)
_TIME_MASK_A = np.array([0, (1 << 14) - 1, (1 << 17) - 1, (1 << 20) - 1, 0], _U64)
_TIME_WIDTH_A = np.array([1, 16, 20, 24, 4])
_TIME_MASK_B = np.array([0, 0, 0, 0, (1 << 64) - 1], _U64)
_TIME_WIDTH_B = np.array([0, 0, 0, 0, 64])


class Unsupported(Exception):
    """Data this writer does not write (the caller falls back to promtool)."""


def _crc32c(data):
    from jobkit.observe import tb_events

    data = bytes(data)  # google_crc32c takes bytes only
    return tb_events._crc32c(data) if tb_events._crc32c else tb_events._tensorboard_crc32c(data)


def _crc(data):
    return _crc32c(data).to_bytes(4, "big")


def _uvarint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint(n):
    return _uvarint((n << 1) ^ (n >> 63) if n < 0 else n << 1)


def _bit_length(x):
    """Bit lengths of uint64 X (0 for 0), exactly: each 32-bit half converts to float64 without rounding."""
    hi, lo = (x >> _U64(32)).astype(np.float64), (x & _U64(0xFFFFFFFF)).astype(np.float64)
    return np.where(hi > 0, 32 + np.frexp(hi)[1], np.frexp(lo)[1]).astype(np.int64)


def _varint_fields(u):
    """The (u)varint bytes of uint64 U as two big-endian bit fields: (hi, hi width, lo, lo width), the first
    up to 8 bytes, the rest (at most 2) in lo."""
    nbytes = np.maximum(1, (_bit_length(u) + 6) // 7)
    hi = np.zeros(len(u), _U64)
    lo = np.zeros(len(u), _U64)
    for k in range(10):
        byte = (u >> _U64(7 * k)) & _U64(0x7F)
        byte |= np.where(k < nbytes - 1, _U64(0x80), _U64(0))
        in_hi = k < np.minimum(nbytes, 8)
        in_lo = (k >= 8) & (k < nbytes)
        hi_shift = np.clip(8 * (np.minimum(nbytes, 8) - 1 - k), 0, 56).astype(_U64)
        lo_shift = np.clip(8 * (nbytes - 1 - k), 0, 8).astype(_U64)
        hi |= np.where(in_hi, byte << hi_shift, _U64(0))
        lo |= np.where(in_lo, byte << lo_shift, _U64(0))
    return hi, 8 * np.minimum(nbytes, 8), lo, 8 * np.maximum(nbytes - 8, 0)


def _pack(values, widths):
    """The bit stream of fields (VALUES uint64 right-aligned, WIDTHS 1..64 bits), in order, as bytes."""
    offsets = np.cumsum(widths) - widths
    total = int(offsets[-1] + widths[-1]) if len(widths) else 0
    word = offsets >> 6
    end = (offsets & 63) + widths
    # the part in the field's first word: shifted up to its place, or (crossing into the next) down
    first = (values << np.maximum(64 - end, 0).astype(_U64)) >> np.maximum(end - 64, 0).astype(_U64)
    out = np.zeros(total // 64 + 2, _U64)
    starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
    out[word[starts]] |= np.bitwise_or.reduceat(first, starts)
    spill = end > 64  # the low part of a field that crosses a word boundary starts the next word
    out[word[spill] + 1] |= values[spill] << (128 - end[spill]).astype(_U64)
    return out.astype(">u8").tobytes()[: (total + 7) // 8]


def encode_chunks(ms, values, series_starts):
    """The chunks of all series as one byte stream (file header not included).

    MS, VALUES: every series' samples, concatenated; SERIES_STARTS: where each series starts (ascending, the
    first 0). Returns (stream bytes, per chunk: series index, mint, maxt, byte offset in the stream, size).

    A chunk's bytes depend on its own samples only, so the samples are encoded _ENCODE_BLOCK at a time (cut at
    chunk starts): each block's dozens of scratch columns then stay in the CPU's cache (2-3x less CPU on 2.2 M
    samples than all at once, measured on this project's 2-core VM)."""
    n = len(ms)
    series_starts = np.asarray(series_starts, np.int64)
    lengths = np.diff(np.r_[series_starts, n])
    pairs = zip(series_starts.tolist(), lengths.tolist(), strict=True)
    chunk_starts = np.concatenate(
        [np.arange(a, a + k, CHUNK_SAMPLES, dtype=np.int64) for a, k in pairs] or [np.zeros(0, np.int64)]
    )
    # each block starts at the first chunk start at or past a multiple of _ENCODE_BLOCK (ascending; repeats
    # dropped by hand, as np.unique would import numpy.ma on the way)
    at = np.searchsorted(chunk_starts, np.arange(0, n, _ENCODE_BLOCK))
    cuts = chunk_starts[at[at < len(chunk_starts)]]
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]].tolist() if len(cuts) else []
    if len(cuts) <= 1:
        return _encode_run(ms, values, series_starts)
    parts = []
    base = 0
    for a, b in zip(cuts, [*cuts[1:], n], strict=True):
        inside = series_starts[(series_starts > a) & (series_starts < b)]
        local = np.r_[np.int64(0), inside - a]  # the block starts a series of its own (at a chunk start)
        stream, series_of, mint, maxt, offsets, sizes = _encode_run(ms[a:b], values[a:b], local)
        series_of = np.searchsorted(series_starts, a + local, side="right")[series_of] - 1
        parts.append((stream, series_of, mint, maxt, offsets + base, sizes))
        base += len(stream)
    return b"".join(p[0] for p in parts), *(np.concatenate([p[k] for p in parts]) for k in range(1, 6))


def _encode_run(ms, values, series_starts):  # noqa: PLR0915 (one column after another, best read in order)
    """encode_chunks of one run of samples, all at once."""
    n = len(ms)
    lengths = np.diff(np.r_[series_starts, n])
    series_of = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(n) - np.repeat(series_starts, lengths)  # position within the series
    i = pos % CHUNK_SAMPLES  # position within the chunk
    chunk_first = np.flatnonzero(i == 0)
    chunk_size = np.diff(np.r_[chunk_first, n])

    bits = values.astype(np.float64).view(_U64).copy()
    bits[np.isnan(values)] = _U64(_GO_NAN)
    t = ms.astype(np.int64)
    delta = np.r_[np.int64(0), np.diff(t)]
    dod = delta - np.r_[np.int64(0), delta[:-1]]  # wraps like Go's int64 does, and so does the reader

    fields = np.zeros((n, 6), _U64)  # chunk header, time a, time b, value a, value b, chunk tail
    widths = np.zeros((n, 6), np.int64)
    # Every column is computed for all samples first (no mask over all of them), then the few chunk starts are
    # overwritten. A field of 64 bits or less holds what can be merged (a dod bucket's control bits and
    # payload, a value's head and bits): fewer fields to pack.
    # time: delta-of-delta buckets (0: dod 0, then 14, 17, 20 bits, then 64), checked as x - 1 + 2^(n-1) being
    # an unsigned n-bit number, since bucket n holds -(2^(n-1) - 1) .. 2^(n-1)
    shifted = (dod - 1).view(_U64)
    bucket = (dod != 0) * (
        1
        + ((shifted + _U64(1 << 13)) >= _U64(1 << 14))
        + ((shifted + _U64(1 << 16)) >= _U64(1 << 17))
        + ((shifted + _U64(1 << 19)) >= _U64(1 << 20))
    )
    dod_bits = dod.view(_U64)
    fields[:, 1] = _TIME_HEAD[bucket] | (dod_bits & _TIME_MASK_A[bucket])
    widths[:, 1] = _TIME_WIDTH_A[bucket]
    fields[:, 2] = dod_bits & _TIME_MASK_B[bucket]
    widths[:, 2] = _TIME_WIDTH_B[bucket]
    # the first sample's zigzag varint, the second's delta as uvarint
    firsts, seconds = chunk_first, np.flatnonzero(i == 1)
    tf = t[firsts]
    zig = (tf.view(_U64) << _U64(1)) ^ (tf >> 63).view(_U64)
    fields[firsts, 1], widths[firsts, 1], fields[firsts, 2], widths[firsts, 2] = _varint_fields(zig)
    fields[seconds, 1], widths[seconds, 1], fields[seconds, 2], widths[seconds, 2] = _varint_fields(
        delta[seconds].view(_U64)
    )
    # value: XOR with the previous: 0, or 11 + leading (5 bits) + sig count (6 bits) + the sig bits
    xor = bits.copy()
    xor[1:] ^= bits[:-1]
    same = xor == 0
    leading = np.minimum(64 - _bit_length(xor), 31)
    trailing = np.maximum(_bit_length(xor & (~xor + _U64(1))) - 1, 0)
    sig = np.where(same, 0, 64 - leading - trailing)
    head = (_U64(0b11) << _U64(11)) | (leading.astype(_U64) << _U64(6)) | (sig & 63).astype(_U64)
    significant = xor >> trailing.astype(_U64)
    merge = sig <= 51  # head and bits in one field
    fields[:, 3] = np.where(same, _U64(0), np.where(merge, (head << sig.astype(_U64)) | significant, head))
    widths[:, 3] = np.where(same, 1, np.where(merge, 13 + sig, 13))
    fields[:, 4] = np.where(merge, _U64(0), significant)
    widths[:, 4] = np.where(merge, 0, sig)
    # the first sample's 64 bits as they are
    fields[firsts, 3], widths[firsts, 3] = bits[firsts], 64
    fields[firsts, 4], widths[firsts, 4] = 0, 0
    # per chunk: header (len uvarint, encoding 1 = XOR, sample count) and tail (padding, CRC placeholder)
    stream_bits = np.add.reduceat(widths[:, 1:5].sum(axis=1), chunk_first)
    data_len = 2 + (stream_bits + 7) // 8
    len_hi, len_width, _, _ = _varint_fields(data_len.astype(_U64))
    fields[chunk_first, 0] = (len_hi << _U64(24)) | _U64(1 << 16) | chunk_size.astype(_U64)
    widths[chunk_first, 0] = len_width + 24
    widths[chunk_first + chunk_size - 1, 5] = (8 - stream_bits % 8) % 8 + 32
    # a sample's time and value fields as one where they fit in 64 bits (most samples: a 1-bit dod of 0 and a
    # value of at most 63 bits): about half the fields for _pack, the costliest step here
    fits = (widths[:, 2] == 0) & (widths[:, 1] + widths[:, 3] <= 64)
    fields[:, 3] |= np.where(fits, fields[:, 1] << (widths[:, 3] & 63).astype(_U64), _U64(0))
    widths[:, 3] += np.where(fits, widths[:, 1], 0)
    widths[:, 1] *= ~fits
    flat_w = widths.ravel()
    keep = flat_w > 0
    packed = _pack(fields.ravel()[keep], flat_w[keep])
    stream = bytearray(packed)
    chunk_bytes = len_width // 8 + 1 + data_len + 4
    offsets = np.cumsum(chunk_bytes) - chunk_bytes
    for off, lw, dl in zip(offsets.tolist(), (len_width // 8).tolist(), data_len.tolist(), strict=True):
        start, end = off + lw, off + lw + 1 + dl
        stream[end : end + 4] = _crc(packed[start:end])  # the CRCs cover no CRC field: the packed copy will do
    mint = t[chunk_first]
    maxt = t[chunk_first + chunk_size - 1]
    return bytes(stream), series_of[chunk_first], mint, maxt, offsets, chunk_bytes


def _segments(stream, offsets, sizes):
    """Splits STREAM at chunk boundaries into segment files of at most SEGMENT_BYTES; returns (the segments'
    bytes, each chunk's ref: segment number << 32 | offset in its file)."""
    refs = np.empty(len(offsets), np.int64)
    segments, base, k = [], 0, 0
    room = SEGMENT_BYTES - len(_CHUNKS_MAGIC)
    while k < len(offsets):
        ends = offsets + sizes - base
        stop = max(int(np.searchsorted(ends, room, side="right")), k + 1)
        refs[k:stop] = (len(segments) << 32) + len(_CHUNKS_MAGIC) + offsets[k:stop] - base
        end = int(offsets[stop - 1] + sizes[stop - 1])
        segments.append(_CHUNKS_MAGIC + stream[base:end])
        base, k = end, stop
    return segments, refs


def _section(body):
    """len <4b>, BODY, CRC32C of BODY."""
    return len(body).to_bytes(4, "big") + body + _crc(body)


def _index(label_sets, chunk_metas):  # noqa: PLR0915 (the sections in file order)
    """The index file's bytes: LABEL_SETS sorted, each with [(mint, maxt, ref), ...]."""
    symbols = sorted({""} | {s for labels in label_sets for pair in labels for s in pair})
    number = {s: k for k, s in enumerate(symbols)}
    out = bytearray(_INDEX_MAGIC)
    toc = [len(out)]
    body = bytearray(len(symbols).to_bytes(4, "big"))
    for s in symbols:
        raw = s.encode()
        body += _uvarint(len(raw)) + raw
    out += _section(bytes(body))
    toc.append(len(out))
    postings = {}  # (name, value) -> series ids
    ids = []
    for labels, metas in zip(label_sets, chunk_metas, strict=True):
        out += b"\0" * (-len(out) % 16)
        sid = len(out) // 16
        ids.append(sid)
        entry = bytearray(_uvarint(len(labels)))
        for name, value in labels:
            entry += _uvarint(number[name]) + _uvarint(number[value])
            postings.setdefault((name, value), []).append(sid)
        entry += _uvarint(len(metas))
        prev_maxt = prev_ref = None
        for mint, maxt, ref in metas:
            if prev_maxt is None:
                entry += _varint(mint) + _uvarint(maxt - mint) + _uvarint(ref)
            else:
                entry += _uvarint(mint - prev_maxt) + _uvarint(maxt - mint) + _varint(ref - prev_ref)
            prev_maxt, prev_ref = maxt, ref
        out += _uvarint(len(entry)) + entry + _crc(entry)
    toc.append(len(out))
    values_of = {}
    for name, value in postings:
        values_of.setdefault(name, []).append(value)
    label_offsets = []
    for name in sorted(values_of):
        label_offsets.append((name, len(out)))
        values = sorted(values_of[name])
        out += _section(b"".join(x.to_bytes(4, "big") for x in [1, len(values)] + [number[v] for v in values]))
    toc.append(len(out))  # the label offset table comes after the postings; its place is filled in below
    toc.append(len(out))
    postings_offsets = []
    for key in [("", "")] + sorted(postings):
        postings_offsets.append((key, len(out)))
        refs = sorted(ids) if key == ("", "") else postings[key]
        out += _section(len(refs).to_bytes(4, "big") + np.asarray(refs, ">u4").tobytes())
    toc[3] = len(out)
    body = bytearray(len(label_offsets).to_bytes(4, "big"))
    for name, off in label_offsets:
        raw = name.encode()
        body += b"\x01" + _uvarint(len(raw)) + raw + _uvarint(off)
    out += _section(bytes(body))
    toc.append(len(out))
    body = bytearray(len(postings_offsets).to_bytes(4, "big"))
    for (name, value), off in postings_offsets:
        n, v = name.encode(), value.encode()
        body += b"\x02" + _uvarint(len(n)) + n + _uvarint(len(v)) + v + _uvarint(off)
    out += _section(bytes(body))
    toc_bytes = b"".join(x.to_bytes(8, "big") for x in toc)
    out += toc_bytes + _crc(toc_bytes)
    return bytes(out)


def new_ulid(ms=None):
    """A ULID: 48 bits of ms since the epoch, 80 random bits, in Crockford's base32."""
    ms = int(time.time() * 1000) if ms is None else ms
    n = (ms << 80) | int.from_bytes(os.urandom(10))  # secrets' source, without its ~6 ms import (hmac)
    return "".join(_ULID_DIGITS[(n >> (5 * (25 - k))) & 31] for k in range(26))


def write_block(tsdb, series):
    """Adds one block holding SERIES [(labels dict, ms array, values array), ...] to the TSDB dir; returns its
    path, or None when there is no sample. Raises Unsupported for data it does not write."""
    items = []
    for labels, ms, values in series:
        if len(ms) != len(values):
            raise Unsupported("a series has more times than values")
        if not len(ms):
            continue
        ms = np.asarray(ms, np.int64)
        if len(ms) > 1 and not (np.diff(ms) > 0).all():
            raise Unsupported("a series' times are not strictly ascending")
        pairs = sorted((name, value) for name, value in labels.items() if value)  # "" is no label at all
        for name, value in pairs:
            try:
                name.encode(), value.encode()
            except UnicodeEncodeError:
                raise Unsupported(f"label {name!r} is not valid UTF-8 text") from None
        items.append((pairs, ms, np.asarray(values, np.float64)))
    if not items:
        return None
    items.sort(key=lambda item: item[0])  # Prometheus's label set order: pair by pair, by Unicode code point
    if len({tuple(item[0]) for item in items}) != len(items):
        raise Unsupported("two series have the same labels")
    lengths = np.array([len(item[1]) for item in items])
    ms = np.concatenate([item[1] for item in items])
    values = np.concatenate([item[2] for item in items])
    starts = np.cumsum(lengths) - lengths
    stream, series_of, mint, maxt, offsets, sizes = encode_chunks(ms, values, starts)
    segments, refs = _segments(stream, offsets, sizes)
    metas = [[] for _ in items]
    for s, lo, hi, ref in zip(series_of.tolist(), mint.tolist(), maxt.tolist(), refs.tolist(), strict=True):
        metas[s].append((lo, hi, ref))
    index = _index([item[0] for item in items], metas)
    ulid = new_ulid()
    meta = {
        "ulid": ulid,
        "minTime": int(mint.min()),
        "maxTime": int(maxt.max()) + 1,
        "stats": {"numSamples": len(ms), "numSeries": len(items), "numChunks": len(refs)},
        "compaction": {"level": 1, "sources": [ulid]},
        "version": 1,
    }
    final = os.path.join(tsdb, ulid)
    tmp = final + ".tmp-for-creation"
    os.makedirs(os.path.join(tmp, "chunks"))
    try:
        for k, data in enumerate(segments):
            with open(os.path.join(tmp, "chunks", f"{k + 1:06d}"), "wb") as f:
                f.write(data)
        for name, data in (("index", index), ("tombstones", _TOMBSTONES)):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent="\t")
        os.rename(tmp, final)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
