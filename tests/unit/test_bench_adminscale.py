"""The admin-command scaling benchmark's pure helpers (bench/adminscale.py): the counts it
takes, the fit, the per-object figures, the deep size and the report check. No servers."""
from __future__ import annotations

import sys
from typing import Any

import pytest

from bench import adminscale as a


def _row(command: str, objects: int, rss: float, wall: float, code: int = 0) -> dict[str, Any]:
    return {"command": command, "objects": objects, "peak_rss_bytes": rss, "wall_s": wall,
            "exit_code": code}


def test_parse_objects_sorts_dedups_and_checks_bounds() -> None:
    assert a.parse_objects("20000, 5_000,5000,") == [5000, 20000]
    assert a.parse_objects("7") == [7]
    for bad in ("", " , ", "0", "-3", "x", f"{a.MAX_OBJECTS + 1}"):
        with pytest.raises(ValueError):
            a.parse_objects(bad)


def test_linear_fit_two_points_is_the_line_through_them() -> None:
    slope, intercept = a.linear_fit([(1000, 30e6), (4000, 36e6)]) or (0, 0)
    assert slope == pytest.approx(2000)
    assert intercept == pytest.approx(28e6)


def test_linear_fit_least_squares_and_degenerate_inputs() -> None:
    fit = a.linear_fit([(0, 1), (1, 3), (2, 5), (3, 7)])      # y = 2x + 1 exactly
    assert fit == pytest.approx((2.0, 1.0))
    fit = a.linear_fit([(0, 0), (1, 2), (2, 1)])              # a fit, not a line through all
    assert fit == pytest.approx((0.5, 0.5))
    assert a.linear_fit([]) is None
    assert a.linear_fit([(5, 1)]) is None
    assert a.linear_fit([(5, 1), (5, 2)]) is None             # no spread in x


def test_per_object_slopes_and_extrapolation() -> None:
    rows = [_row("gc", 5000, 50e6, 3.0), _row("gc", 20000, 80e6, 9.0),
            _row("repair", 5000, 1.0, 1.0)]                   # another command: not mixed in
    g = a.per_object(rows, "gc")
    assert g["counts"] == [5000, 20000]
    assert g["rss_bytes_per_object"] == pytest.approx(2000)
    assert g["rss_fixed_bytes"] == pytest.approx(40e6)
    assert g["s_per_object"] == pytest.approx(6 / 15000)
    assert g["fixed_s"] == pytest.approx(1.0)
    assert g["marginal_objects_s"] == pytest.approx(2500)
    assert g[f"rss_bytes_at_{a.EXTRAPOLATE_TO}"] == pytest.approx(40e6 + 2000 * a.EXTRAPOLATE_TO)


def test_per_object_leaves_failed_runs_out() -> None:
    rows = [_row("repair", 5000, 50e6, 3.0), _row("repair", 20000, 1e9, 99.0, code=1)]
    r = a.per_object(rows, "repair")
    assert r["counts"] == [5000]
    assert r["rss_bytes_per_object"] is None and r["marginal_objects_s"] is None
    assert r[f"rss_bytes_at_{a.EXTRAPOLATE_TO}"] is None


def test_per_object_time_that_did_not_grow_has_no_rate() -> None:
    r = a.per_object([_row("gc", 10, 1e6, 2.0), _row("gc", 20, 2e6, 2.0)], "gc")
    assert r["s_per_object"] == pytest.approx(0.0)
    assert r["marginal_objects_s"] is None


def test_deep_size_counts_contents_once() -> None:
    s = "x" * 100
    assert a.deep_size(s) == sys.getsizeof(s)
    d = {"k": s}
    assert a.deep_size(d) == sys.getsizeof(d) + sys.getsizeof("k") + sys.getsizeof(s)
    shared = [s, s]                                           # the same string twice
    assert a.deep_size(shared) == sys.getsizeof(shared) + sys.getsizeof(s)
    nested = ("b", "k", {"v": frozenset({1})})
    assert a.deep_size(nested) > sys.getsizeof(nested) + sys.getsizeof(frozenset({1}))


def test_check_report_wants_every_object_seen() -> None:
    assert a.check_report("repair", {"objects_checked": 100}, 100) is None
    assert a.check_report("rebalance", {"objects_checked": 101}, 100) is None   # + parts
    assert "objects_checked 99" in (a.check_report("repair", {"objects_checked": 99}, 100) or "")
    assert a.check_report("gc", {"fragments_listed": 600}, 100) is None
    assert "fragments_listed 599" in (a.check_report("gc", {"fragments_listed": 599}, 100) or "")
    assert "unavailable" in (a.check_report("gc", {"error": "unavailable", "message": "m"}, 1)
                             or "")
    assert a.check_report("gc", [1, 2], 1) is not None
    assert a.check_report("repair", {}, 1) is not None


def test_accounted_sums_what_each_command_holds_per_object() -> None:
    held = {"live_records": 1000, "all_listings": 6000, "control_scan": 9000, "gc_homes": 12000}
    breakdown: dict[str, Any] = {"objects": 10, **{k: {"held_bytes": v} for k, v in held.items()}}
    assert a.accounted(breakdown, "repair") == pytest.approx(700)
    assert a.accounted(breakdown, "rebalance") == pytest.approx(700)
    assert a.accounted(breakdown, "gc") == pytest.approx(2700)
    assert a.accounted(None, "gc") is None
    assert a.accounted({"objects": 0}, "gc") is None
    del breakdown["gc_homes"]
    assert a.accounted(breakdown, "gc") is None
