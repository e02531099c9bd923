"""jobkit.observe.tsdb_block: the TSDB blocks the backfill writes without promtool.

The proof is promtool itself: for the same samples, `promtool tsdb dump` of our block and of the block promtool
makes from OpenMetrics text must be the same lines, and `promtool tsdb analyze` must read ours. One test has a
real Prometheus load our block and answer a query with the samples.
"""

import json
import math
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from prom_query import api
from test_tb_bridge import bridge, new_writer, write_steps

from jobkit.observe import promserver, tb_backfill, tsdb_block

REPO = Path(__file__).resolve().parents[2]
# These run in the fast tier where Prometheus's Debian package is there (utils/prometheus.sh install; the
# e2e tests install it), and say so where it is not.
PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if os.access("/usr/bin/promtool", os.X_OK) else None)
NEEDS_PROMTOOL = pytest.mark.skipif(not PROMTOOL, reason="promtool is not installed: utils/prometheus.sh install")
NEEDS_PROMETHEUS = pytest.mark.skipif(
    not PROMTOOL or not promserver.find_binary(), reason="Prometheus is not installed: utils/prometheus.sh install"
)
# dod bucket edges (14, 17, 20 bits), gaps past all of them up to ~4 months, and plain steps. (Far-future
# times are left out: promtool reads OpenMetrics seconds as a float, and past ~1e13 ms that can be 1 ms off.)
GAPS = [1, 2, 1000, 1000, 1000, 7, 8192, 8193, 65536, 65537, 524288, 524289, 10**6, 123_456_789, 10**10]
SPECIAL = [0.0, -0.0, 1.0, 1.0, 1.0, math.nan, math.inf, -math.inf, 1e300, -5e-324, 2.0**63, 0.1, 3.0]


def varied_series(seed=7, now_ms=None, before_1970=False):
    """[(labels, ms, values)]: lengths 1, 2, 3, 120, 121, 700, ...; gaps of every dod bucket; NaN, +-Inf, -0,
    runs of one value, random doubles; label values that need escaping; with BEFORE_1970 one series starts with
    negative times (promtool drops those, and a few after them)."""
    rng = np.random.default_rng(seed)
    out = []
    base = now_ms if now_ms is not None else 1_600_000_000_000
    for k, n in enumerate([1, 2, 3, 120, 121, 700, 250, 5]):
        gaps = rng.choice(GAPS if now_ms is None else GAPS[:-1], n)
        ms = base + np.cumsum(gaps) - (0 if now_ms is None else int(gaps.sum()) + 60_000)
        if k == 6 and before_1970:
            ms -= 2_000_000_000_000  # before 1970
        values = rng.choice(SPECIAL, n)
        values = np.where(rng.random(n) < 0.5, rng.normal(size=n) * 10.0 ** rng.integers(-8, 8, n), values)
        if k == 5:
            values[100:300] = 42.0  # a long run of one value
        labels = {"__name__": f"tb_m{k}", "job": 'a"b\\c\nd', "host": f"h\u00e9{k % 3}", "zz": "x" * k}
        if k % 2:
            labels["instance"] = f'quote"{k}'
        out.append((labels, ms, values))
    return out


def _escape(text):
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value_text(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def promtool_block(series, tsdb):
    """The block(s) promtool makes of SERIES, from OpenMetrics text."""
    lines = []
    for labels, ms, values in series:
        name = labels["__name__"]
        lines.append(f"# TYPE {name} gauge")
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
        lines.extend(
            f"{name}{{{text}}} {_value_text(v)} {tb_backfill.ms_to_seconds_text(t)}"
            for t, v in zip(ms.tolist(), values.tolist(), strict=True)
        )
    lines.append("# EOF")
    om = Path(tsdb).parent / "input.om"
    om.write_text("\n".join(lines) + "\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om), str(tsdb)], check=True)


def dump(tsdb):
    """`promtool tsdb dump` of TSDB's blocks (it wants a wal/ dir; it gets one in a copy)."""
    view = Path(str(tsdb) + ".dumpview")
    shutil.copytree(tsdb, view)
    (view / "wal").mkdir(exist_ok=True)
    proc = subprocess.run([PROMTOOL, "tsdb", "dump", str(view)], capture_output=True, text=True, check=False)
    shutil.rmtree(view)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def analyze(block_dir):
    proc = subprocess.run(
        [PROMTOOL, "tsdb", "analyze", str(block_dir.parent), block_dir.name], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@NEEDS_PROMTOOL
@pytest.mark.parametrize("block", [None, 100])
def test_our_block_dumps_as_promtools_block(tmp_path, monkeypatch, block):
    if block:  # encode_chunks cuts its work at chunk starts, mid-series and at series starts alike
        monkeypatch.setattr(tsdb_block, "_ENCODE_BLOCK", block)
    series = varied_series()
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    block = Path(tsdb_block.write_block(ours, series))
    promtool_block(series, theirs)
    got, want = dump(ours), dump(theirs)
    assert len(want) == sum(len(ms) for _, ms, _ in series)
    assert got == want
    text = analyze(block)
    assert f"Series: {len(series)}" in text
    meta = json.loads((block / "meta.json").read_text())
    chunks = sum(-(-len(ms) // tsdb_block.CHUNK_SAMPLES) for _, ms, _ in series)
    assert chunks > len(series)  # some series span several chunks
    assert meta["stats"] == {"numSamples": len(want), "numSeries": len(series), "numChunks": chunks}
    assert meta["minTime"] == min(int(ms[0]) for _, ms, _ in series)
    assert meta["maxTime"] == max(int(ms[-1]) for _, ms, _ in series) + 1
    assert sorted(os.listdir(ours)) == [block.name]  # nothing left from the build dir


@pytest.mark.parametrize("block", [1, 100, 121, 1000])
def test_chunks_encoded_a_block_at_a_time_are_the_chunks_encoded_at_once(monkeypatch, block):
    series = varied_series()
    ms = np.concatenate([m for _, m, _ in series])
    values = np.concatenate([v for _, _, v in series])
    starts = np.cumsum([0] + [len(m) for _, m, _ in series[:-1]])
    whole = tsdb_block._encode_run(ms, values, starts)
    monkeypatch.setattr(tsdb_block, "_ENCODE_BLOCK", block)
    got = tsdb_block.encode_chunks(ms, values, starts)
    assert got[0] == whole[0]
    for mine, theirs in zip(got[1:], whole[1:], strict=True):  # series, mint, maxt, offsets, sizes per chunk
        assert mine.tolist() == theirs.tolist()
    assert got[1].tolist() == sorted(got[1].tolist())  # chunks stay in series order, each series named right
    assert len(set(got[1].tolist())) == len(series)


@NEEDS_PROMTOOL
def test_times_before_1970_are_kept(tmp_path):
    series = varied_series(before_1970=True)
    assert (series[6][1] < 0).sum() > 10
    tsdb_block.write_block(tmp_path, series)
    lines = dump(tmp_path)
    for labels, ms, _ in series:
        prefix = '{__name__="' + labels["__name__"] + '"'
        assert [int(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix)] == ms.tolist()


@NEEDS_PROMTOOL
def test_many_series_and_segment_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    series = [
        (
            {"__name__": f"m_{k % 7}", "rank": f"r{k}\\\n", "job": "j"},
            1_700_000_000_000 + np.cumsum(rng.integers(1, 5000, 130)),
            rng.normal(size=130),
        )
        for k in range(60)
    ]
    monkeypatch.setattr(tsdb_block, "SEGMENT_BYTES", 4096)  # a few hundred bytes a chunk: many segment files
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    block = Path(tsdb_block.write_block(ours, series))
    assert len(os.listdir(block / "chunks")) > 5
    assert all((block / "chunks" / f).stat().st_size <= 4096 for f in os.listdir(block / "chunks"))
    promtool_block(series, theirs)
    assert dump(ours) == dump(theirs)
    analyze(block)


def test_nan_is_gos_nan_never_the_stale_marker(tmp_path):
    stale_bits = 0x7FF0000000000002
    odd_nan = struct.unpack(">d", struct.pack(">Q", stale_bits))[0]
    block = Path(tsdb_block.write_block(tmp_path, [({"__name__": "m"}, np.array([1000]), np.array([odd_nan]))]))
    data = (block / "chunks" / "000001").read_bytes()
    # header 8, len 1, encoding 1, count 2, the time varint (2000 zigzag: 2 bytes), then the value's 64 bits
    assert data[8 + 1 + 1 + 2 + 2 :][:8] == struct.pack(">Q", tsdb_block._GO_NAN)


def test_unwritable_data_is_refused_and_nothing_is_left(tmp_path):
    with pytest.raises(tsdb_block.Unsupported, match="not strictly ascending"):
        tsdb_block.write_block(tmp_path, [({"__name__": "m"}, np.array([5, 5]), np.array([1.0, 2.0]))])
    with pytest.raises(tsdb_block.Unsupported, match="same labels"):
        one = ({"__name__": "m"}, np.array([5]), np.array([1.0]))
        tsdb_block.write_block(tmp_path, [one, one])
    assert tsdb_block.write_block(tmp_path, [({"__name__": "m"}, np.array([]), np.array([]))]) is None
    assert os.listdir(tmp_path) == []


@NEEDS_PROMETHEUS
def test_prometheus_loads_our_block_and_answers_a_query(tmp_path):
    now_ms = int(promserver.time.time() * 1000)
    series = varied_series(seed=11, now_ms=now_ms)  # recent, so that no retention drops the block
    tsdb = tmp_path / "tsdb"
    tsdb.mkdir()
    tsdb_block.write_block(tsdb, series)
    server = promserver.start(str(tsdb), promserver.find_binary())
    try:
        for labels, ms, values in series[3:6]:
            selector = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"
            span = int((ms[-1] - ms[0]) / 1000) + 2
            result = api(server.port, "/api/v1/query", query=f"{selector}[{span}s]", time=f"{ms[-1] / 1000:.3f}")
            assert len(result["result"]) == 1, result
            got = result["result"][0]["values"]
            assert [round(float(t) * 1000) for t, _ in got] == ms.tolist()
            assert [float(v) for _, v in got] == pytest.approx(values.tolist(), nan_ok=True, rel=1e-15)
    finally:
        server.stop()


def _event_dir(tmp_path):
    logdir = tmp_path / "logs"
    logdir.mkdir()
    writer = new_writer(logdir)
    write_steps(writer, range(300), 1_700_000_000.0, loss=lambda s: math.nan if s % 50 == 7 else 10.0 / (s + 1))
    writer.close()
    return logdir


def _run_backfill(logdir, tsdb, **env):
    tsdb.mkdir()
    return bridge("backfill", "--logdir", logdir, "--tsdb", tsdb, "--label", 'job=a"\\b', env=env)


@NEEDS_PROMTOOL
def test_backfill_blocks_equal_promtools_and_the_switch_forces_promtool(tmp_path):
    logdir = _event_dir(tmp_path)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert _run_backfill(logdir, ours).returncode == 0
    assert _run_backfill(logdir, theirs, TB_BACKFILL_WRITER="promtool").returncode == 0
    got, want = dump(ours), dump(theirs)
    assert len(got) > 300 * 2
    assert got == want
    blocks = [d for d in ours.iterdir() if d.is_dir()]
    assert len(blocks) == 1
    assert json.loads((blocks[0] / "meta.json").read_text())["stats"]["numSamples"] == len(want)


def test_bad_writer_setting_is_one_line_and_changes_nothing(tmp_path):
    logdir = _event_dir(tmp_path)
    proc = _run_backfill(logdir, tmp_path / "tsdb", TB_BACKFILL_WRITER="fast")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "jobkit tb-bridge backfill: TB_BACKFILL_WRITER=fast: expected numpy or promtool; fix or unset it"
    ]
    assert os.listdir(tmp_path / "tsdb") == []


@NEEDS_PROMTOOL
def test_data_the_writer_refuses_goes_to_promtool(tmp_path, monkeypatch):
    def refuse(tsdb, series):
        raise tsdb_block.Unsupported("no, thanks")

    monkeypatch.setattr(tsdb_block, "write_block", refuse)
    logdir = _event_dir(tmp_path)
    said = []
    tsdb = tmp_path / "tsdb"
    tsdb.mkdir()
    tb_backfill.backfill(str(logdir), str(tsdb), ["job=j"], out=lambda msg, **_: said.append(msg))
    assert "no, thanks: the blocks are written by promtool instead" in said
    assert len(dump(tsdb)) > 300 * 2
