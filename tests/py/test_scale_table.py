"""bench/scale/table.py's model for analyze's TSDB part (no measuring)."""

import importlib.util

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("scale_table", REPO / "bench" / "scale" / "table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def _row(nodes, steps, samples, points, wall, rss):
    return {"op": table.TSDB_OP, "nodes": nodes, "steps": steps, "samples": samples, "points_out": points,
            "wall": wall, "rss": rss, "step_s": 5}  # fmt: skip


def test_the_two_term_fit_recovers_a_known_model():
    def model(x1, x2):
        return 0.4 + 3e-6 * x1 + 8e-8 * x2

    rows = [(70e3, 1.8e6), (550e3, 14e6), (1.1e6, 28e6), (145e3, 42e6)]
    a, b, c = table._solve3([(x1, x2, model(x1, x2)) for x1, x2 in rows])
    assert (a, b, c) == pytest.approx((0.4, 3e-6, 8e-8), rel=1e-6)


def test_the_24h_prediction_caps_the_lines_but_counts_every_sample():
    """Samples per node-second from the rows; points per node from the longest run, so 512 x 24 h hands
    Python 64x the 8-node day's points while Prometheus decodes 512 x 86,400 node-seconds of samples."""
    per = 1.8e6 / (8 * 3600)  # samples per node-second
    rows = [
        _row(8, 3600, 8 * 3600 * per, 70e3, 0.0, 0.0),
        _row(64, 3600, 64 * 3600 * per, 550e3, 0.0, 0.0),
        _row(8, 86400, 8 * 86400 * per, 145e3, 0.0, 0.0),
    ]
    for r in rows:
        r["wall"] = 0.3 + 2e-6 * r["points_out"] + 1e-7 * r["samples"]
        r["rss"] = 50 + 2e-4 * r["points_out"]
    wall, rss = table.tsdb_predict(rows)
    points, samples = 145e3 / 8 * 512, per * 512 * 86400
    assert wall == pytest.approx(0.3 + 2e-6 * points + 1e-7 * samples, rel=1e-6)
    assert rss == pytest.approx(50 + 2e-4 * points, rel=1e-6)
