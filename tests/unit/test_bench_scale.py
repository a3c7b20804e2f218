"""The scale simulation's counting functions (bench/scale.py) on tiny inputs with known answers."""
from __future__ import annotations

import sys
from array import array

import pytest

from bench import scale
from placement.nodes import Node
from placement.ring import Ring


def _ring(rows: list[list[int]], nodes: list[Node], part_power: int) -> Ring:
    flat = array("H", [i for row in rows for i in row])
    if sys.byteorder == "big":
        flat.byteswap()
    ring = Ring(tuple(nodes), part_power, flat.tobytes())
    ring.check()
    return ring


def _records(keys: list[str]) -> list[scale.Record]:
    return [scale.record(k, i) for i, k in enumerate(keys)]


def test_unchanged_ring_moves_nothing() -> None:
    ring = Ring.build(scale.make_nodes(8), part_power=6)
    assert scale.moved_fraction(ring, ring, 6) == 0.0
    assert scale.touched_fraction(ring, ring, 6) == 0.0
    assert scale.sampled_moved_fraction(ring, ring, scale.placement_keys(200), 6) == 0.0


def test_moved_fraction_counts_each_changed_position() -> None:
    nodes = scale.make_nodes(3)
    old = _ring([[0, 1, 2], [0, 1, 2]], nodes, part_power=1)
    new = _ring([[1, 0, 2], [0, 1, 2]], nodes, part_power=1)  # partition 0: positions 0 and 1 swap
    assert scale.moved_fraction(old, new, 2) == 2 / 4
    assert scale.moved_fraction(old, new, 3) == 2 / 6
    assert scale.touched_fraction(old, new, 2) == 1 / 2


def test_moved_fraction_agrees_with_the_rings_own_report() -> None:
    old = Ring.build(scale.make_nodes(12), part_power=8)
    new, report = old.add(scale.make_nodes(1, first=12)[0])
    assert scale.moved_fraction(old, new, 6) == pytest.approx(report.moved_fraction(6))
    assert scale.moved_fraction(old, new, 6) > 0


def test_optimal_fraction_is_the_added_or_removed_weight_share() -> None:
    nodes = scale.make_nodes(3)
    old = Ring.build(nodes, part_power=4)
    grown, _ = old.add(Node("s00099", "http://10.0.0.9:6000", weight=3.0, zone="z09"))
    assert scale.optimal_fraction(old, grown) == pytest.approx(3 / 6)
    shrunk, _ = old.remove(nodes[0].id)
    assert scale.optimal_fraction(old, shrunk) == pytest.approx(1 / 3)


def test_one_node_listing_requests_equal_rounds() -> None:
    keys = [f"k{i:05d}" for i in range(2500)]
    fan, page = scale.simulate_listing([_records(keys)], max_keys=1000, page_limit=1000)
    # round 1 ends exactly at 1000 keys, which cannot prove the page is truncated: a 2nd round
    assert (fan.rounds, fan.requests, fan.records_sent, fan.records_merged) == (2, 2, 2000, 2000)
    assert fan.requests == fan.rounds
    assert page.truncated and [o.key for o in page.objects] == keys[:1000]


def test_listing_asks_one_record_more_than_the_page_and_needs_one_round() -> None:
    keys = [f"k{i:05d}" for i in range(2500)]
    fan, page = scale.simulate_listing([_records(keys)], max_keys=1000)   # merge_listing's limit
    assert (fan.rounds, fan.requests, fan.records_sent, fan.records_merged) == (1, 1, 1001, 1001)
    assert page.truncated and [o.key for o in page.objects] == keys[:1000]
    fan, page = scale.simulate_listing([_records(keys)] * 3, max_keys=100)
    assert (fan.rounds, fan.requests, fan.records_sent) == (1, 3, 303)
    assert page.truncated and [o.key for o in page.objects] == keys[:100]
    nodes = scale.make_nodes(3, "c", "control")      # the real merge_listing, the same counts
    requests, sent, real = scale.count_with_merge_listing(nodes, [_records(keys)] * 3, 1000)
    assert (requests, sent) == (3, 3003) and real.truncated and len(real.objects) == 1000


def test_small_bucket_listing_takes_one_request_per_node() -> None:
    keys = [f"k{i:03d}" for i in range(300)]
    fan, page = scale.simulate_listing([_records(keys)] * 3, max_keys=1000, page_limit=1000)
    assert (fan.rounds, fan.requests, fan.records_sent) == (1, 3, 900)
    assert not page.truncated and len(page.objects) == 300


def test_spread_keys_puts_each_key_on_r_nodes_in_order() -> None:
    ring = scale.stand_in_ring(scale.make_nodes(5, "c", "control"), 4, "control")
    keys = [f"k{i:03d}" for i in range(200)]
    scans = scale.spread_keys(keys, ring, replicas=3)
    assert sum(map(len, scans)) == 3 * 200
    for scan in scans:
        assert [r[0] for r in scan] == sorted(r[0] for r in scan)
    held = {k: sum(any(r[0] == k for r in s) for s in scans) for k in keys[:20]}
    assert set(held.values()) == {3}


def test_simulation_counts_match_merge_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("store.listing.PAGE_LIMIT", 7)  # many rounds on a tiny bucket
    ring = scale.stand_in_ring(scale.make_nodes(4, "c", "control"), 4, "control")
    keys = [f"k{i:03d}" for i in range(120)]
    scans = scale.spread_keys(keys, ring, replicas=2)
    fan, page = scale.simulate_listing(scans, max_keys=25)   # asks for 8 a request
    requests, sent, real = scale.count_with_merge_listing(ring.nodes, scans, max_keys=25)
    assert fan.rounds > 1
    assert (fan.requests, fan.records_sent) == (requests, sent)
    assert page.objects == real.objects and [o.key for o in page.objects] == keys[:25]
    assert scale.replay_merge(fan.batches or [], 25).objects == page.objects


def test_stand_in_ring_is_valid_and_spreads_zones() -> None:
    ring = scale.stand_in_ring(scale.make_nodes(30), 5, "hot")
    for part in range(ring.partitions):
        assert len({nd.zone for nd in ring.row(part, scale.ZONES)}) == scale.ZONES
    firsts = {ring.row(part, 1)[0].id for part in range(ring.partitions)}
    assert len(firsts) == 30  # rows are rotated: every node leads some partition


def test_growth_factors_between_neighbours() -> None:
    assert scale.growth([1, 10, 100]) == [10, 10]
    assert scale.growth([2, None, 8, "x"]) == [None, None, None]
