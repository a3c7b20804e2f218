"""bench/training.py without servers: the epoch deal, a phase's row from its readers'
reports, the storage-side delta and the expectations (which must be able to fail)."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from bench import training as tr


def reader(nbytes: int, fetched: int, gets: int, hits: int = 0, end: float = 2.0,
           wrong: tuple[str, ...] = (), errors: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"began": 100.01, "end": 100.0 + end, "bytes": nbytes, "wrong": list(wrong),
            "errors": list(errors), "cpu_s": 0.5, "cache": None,
            "read_stats": {"segments_fetched": fetched, "fragment_gets": gets, "cache_hits": hits,
                           "coalesced": 0, "prefetched": 0}}


def row(name: str, results: list[dict[str, Any]], expected_bytes: int, fetches: int) -> dict[str, Any]:
    plan = {"expected_bytes": expected_bytes, "segments_read": 8, "expected_fetches": fetches}
    server = tr.server_delta({"s1": {"rchar": 0, "cpu_s": 1.0}}, {"s1": {"rchar": 4e6, "cpu_s": 1.5}}, 1e6)
    return tr.summarize(name, 100.0, results, plan, server)


def good_report() -> dict[str, Any]:
    """Two epochs with the cache (the second all hits) and a herd of two on one 4-segment
    object with the cache (each segment fetched once)."""
    epochs = [row("epoch 1, cache", [reader(100, 4, 16), reader(100, 4, 17)], 200, 8),
              row("epoch 2, cache", [reader(100, 0, 0, hits=4), reader(100, 0, 0, hits=4)], 200, 0)]
    herd = [row("herd, cache", [reader(50, 3, 12, hits=1), reader(50, 1, 4, hits=3, end=3.0)], 100, 4)]
    return {"meta": {"planned_phases": 3}, "epochs": epochs, "herd": herd}


def failed(report: dict[str, Any]) -> list[str]:
    return [c["name"] for c in tr.evaluate(report) if not c["ok"]]


# ---- the deal ----------------------------------------------------------------------------------
def test_each_epoch_deals_every_shard_once_in_a_seeded_order_of_its_own() -> None:
    one, two = tr.epoch_assignment(64, 16, 1), tr.epoch_assignment(64, 16, 2)
    for deal in (one, two):
        assert sorted(s for r in deal for s in r) == list(range(64))
        assert [len(r) for r in deal] == [4] * 16
    assert one != two and one == tr.epoch_assignment(64, 16, 1)


def test_an_uneven_deal_differs_by_at_most_one_shard_per_reader() -> None:
    deal = tr.epoch_assignment(10, 4, 1)
    assert sorted(len(r) for r in deal) == [2, 2, 3, 3]


# ---- a phase's row -----------------------------------------------------------------------------
def test_a_row_sums_the_readers_and_times_from_the_common_start() -> None:
    r = good_report()["herd"][0]
    assert (r["segments_fetched"], r["fragment_gets"], r["cache_hits"]) == (4, 16, 4)
    assert r["wall_s"] == pytest.approx(3.0) and r["mb_s"] == pytest.approx(100 / 1e6 / 3.0)
    assert r["reader_p50_s"] == pytest.approx(2.0) and r["fragment_gets_per_segment"] == 4
    assert r["fetchers"] == 2 and good_report()["epochs"][1]["fetchers"] == 0
    assert r["server"] == {"nodes": 1, "read_mb": 4.0, "fragment_reads_est": 4, "cpu_s": 0.5}


def test_the_storage_side_counts_only_nodes_seen_at_both_ends() -> None:
    d = tr.server_delta({"s1": {"rchar": 10, "cpu_s": 0}}, {"s1": {"rchar": 10, "cpu_s": 0},
                                                             "s2": {"rchar": 9e9, "cpu_s": 9}}, None)
    assert d == {"nodes": 1, "read_mb": 0.0, "fragment_reads_est": None, "cpu_s": 0}


# ---- the expectations --------------------------------------------------------------------------
def test_a_good_report_passes_every_check() -> None:
    checks = tr.evaluate(good_report())
    assert checks and all(c["ok"] for c in checks), checks
    assert "epoch 2, cache: no fragment GET" in [c["name"] for c in checks]


def test_a_herd_segment_fetched_twice_fails() -> None:
    report = good_report()
    report["herd"][0]["segments_fetched"] += 1
    assert failed(report) == ["herd, cache: segments fetched as planned"]


def test_a_fragment_get_in_a_later_epoch_with_the_cache_fails() -> None:
    report = good_report()
    report["epochs"][1]["fragment_gets"] = 3
    assert failed(report) == ["epoch 2, cache: no fragment GET"]


@pytest.mark.parametrize("change", ["wrong", "error", "short"])
def test_wrong_missing_or_failed_reads_fail(change: str) -> None:
    report = good_report()
    bad = {"wrong": reader(100, 0, 0, hits=4, wrong=("shards/00003",)),
           "error": reader(0, 0, 0, errors=("shards/00003: Unavailable",)),
           "short": reader(60, 0, 0, hits=4)}[change]
    report["epochs"][1] = row("epoch 2, cache", [reader(100, 0, 0, hits=4), bad], 200, 0)
    assert failed(report) == ["epoch 2, cache: every byte right"]


def test_a_missing_phase_fails() -> None:
    report = copy.deepcopy(good_report())
    report["herd"] = []
    assert failed(report) == ["every planned phase ran"]
