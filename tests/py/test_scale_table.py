"""bench/scale/table.py's model for analyze's TSDB part (no measuring)."""

import importlib.util

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("scale_table", REPO / "bench" / "scale" / "table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def _row(nodes, steps, samples, points, wall, rss, interval=5, series=97, budget=0):
    return {"op": table.TSDB_OP, "nodes": nodes, "steps": steps, "samples": samples, "points_out": points,
            "wall": wall, "rss": rss, "step_s": interval, "interval_s": interval, "series_out": series,
            "point_budget": budget}  # fmt: skip


def test_the_two_term_fit_recovers_a_known_model():
    def model(x1, x2):
        return 0.4 + 3e-6 * x1 + 8e-8 * x2

    rows = [(70e3, 1.8e6), (550e3, 14e6), (1.1e6, 28e6), (145e3, 42e6)]
    a, b, c = table._solve3([(x1, x2, model(x1, x2)) for x1, x2 in rows])
    assert (a, b, c) == pytest.approx((0.4, 3e-6, 8e-8), rel=1e-6)


def test_the_24h_prediction_counts_every_sample_at_the_jobs_15s_and_caps_the_lines():
    """Samples per node per scrape from the rows (at their own intervals), times 512 x 86,400 s / 15 s (the
    job's interval above 256 nodes); without a point budget every one of 512 x 12 lines has 1,500 points."""
    per = 312.0  # samples per node per scrape
    rows = [
        _row(8, 3600, 8 * 720 * per, 70e3, 0.0, 0.0),
        _row(64, 3600, 64 * 720 * per, 550e3, 0.0, 0.0),
        _row(128, 3600, 128 * 360 * per, 550e3, 0.0, 0.0, interval=10, series=12 * 128),
        _row(8, 86400, 8 * 17280 * per, 145e3, 0.0, 0.0, series=12 * 8),
    ]
    for r in rows:
        r["wall"] = 0.3 + 2e-6 * r["points_out"] + 1e-7 * r["samples"]
        r["rss"] = 50 + 2e-4 * r["points_out"]
    points, samples = table.tsdb_target(rows)
    assert samples == pytest.approx(per * 512 * 86400 / 15)
    assert points == pytest.approx(12 * 512 * 1500)
    wall, rss = table.tsdb_predict(rows)
    assert wall == pytest.approx(0.3 + 2e-6 * points + 1e-7 * samples, rel=1e-6)
    assert rss == pytest.approx(50 + 2e-4 * points, rel=1e-6)


def test_with_a_point_budget_the_24h_lines_share_it():
    rows = [_row(8, 86400, 4e7, 145e3, 1.0, 60.0, series=12 * 8, budget=1_000_000)]
    points, _ = table.tsdb_target(rows)
    assert points == 12 * 512 * (1_000_000 // (12 * 512)) <= 1_000_000
    floor = [_row(8, 86400, 4e7, 145e3, 1.0, 60.0, series=400 * 8, budget=1_000_000)]  # 204,800 lines
    assert table.tsdb_target(floor)[0] == 400 * 512 * table.MIN_POINTS
