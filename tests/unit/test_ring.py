"""Unit tests of placement.ring: determinism, balance, weights, movement, zones."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.hashing import hash64
from placement.nodes import Node, UnknownNodeError
from placement.ring import MoveReport, Ring

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"bucket/object-{i}".encode() for i in range(100_000)]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_nodes(n: int, zones: int = 1, weights: list[float] | None = None, prefix: str = "s") -> list[Node]:
    """n nodes s00.., zone z{i % zones + 1}, weight weights[i] (default 1)."""
    return [
        Node(
            id=f"{prefix}{i:02d}",
            address=f"http://127.0.0.1:{9000 + i}",
            weight=weights[i] if weights else 1.0,
            zone=f"z{i % zones + 1}",
        )
        for i in range(n)
    ]


def id_rows(ring: Ring, n: int | None = None) -> list[list[str]]:
    return [[nd.id for nd in ring.row(p, n)] for p in range(ring.partitions)]


def zone_count(ring: Ring) -> int:
    return len({nd.zone for nd in ring.nodes})


def assert_zone_spread(ring: Ring) -> None:
    zc = zone_count(ring)
    for p in range(ring.partitions):
        for n in range(1, len(ring.nodes) + 1):
            first = ring.row(p, min(n, zc))
            assert len({nd.zone for nd in first}) == len(first), (p, n, first)


def key_counts(ring: Ring, n: int) -> Counter[str]:
    counts: Counter[str] = Counter()
    for key in KEYS:
        counts.update(nd.id for nd in ring.locate(key, n))
    return counts


ring_configs = st.tuples(
    st.integers(1, 10),  # nodes
    st.integers(1, 4),  # zones
    st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=10, max_size=10),
    st.integers(0, 7),  # part_power
)


def ring_from(cfg: tuple[int, int, list[float], int]) -> Ring:
    n, zones, weights, pp = cfg
    return Ring.build(make_nodes(n, zones, weights), part_power=pp)


# ------------------------------------------------------------------ hashing
def test_hash64_is_blake2b_64_big_endian() -> None:
    data = b"hello"
    expected = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    assert hash64(data) == expected
    assert 0 <= hash64(b"") < 2**64


def test_partition_is_top_bits_of_hash() -> None:
    ring = Ring.build(make_nodes(3), part_power=10)
    for key in (b"a", b"b", "caf\u00e9"):
        raw = key.encode() if isinstance(key, str) else key
        assert ring.partition(key) == hash64(raw) >> 54
    assert Ring.build(make_nodes(2), part_power=0).partition(b"x") == 0


# -------------------------------------------------------- 1. determinism
_CHILD = """
import json, sys
from placement.nodes import Node
from placement.ring import Ring
nodes = [Node(f"s{i:02d}", f"http://127.0.0.1:{9000 + i}", zone=f"z{i % 3 + 1}") for i in range(12)]
ring = Ring.build(reversed(nodes), part_power=8)
keys = [f"k{i}" for i in range(300)]
print(json.dumps([[n.id for n in ring.locate(k, 6)] for k in keys]))
"""


def test_same_key_same_nodes_in_another_process() -> None:
    nodes = make_nodes(12, zones=3)
    ring = Ring.build(nodes, part_power=8)
    mine = [[n.id for n in ring.locate(f"k{i}", 6)] for i in range(300)]
    for seed in ("1", "987"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == mine


def test_build_is_deterministic_and_input_order_independent() -> None:
    nodes = make_nodes(9, zones=3, weights=[1, 2, 3] * 3)
    a = Ring.build(nodes, part_power=8, tier="hot")
    b = Ring.build(list(reversed(nodes)), part_power=8, tier="hot")
    assert a == b
    assert a.table == b.table
    assert [n.id for n in a.nodes] == sorted(n.id for n in nodes)


# ---------------------------------------------------------- 2. distinct
@FAST
@given(cfg=ring_configs, keys=st.lists(st.binary(max_size=20), min_size=1, max_size=20), data=st.data())
def test_locate_returns_distinct_nodes(cfg, keys, data) -> None:
    ring = ring_from(cfg)
    n = data.draw(st.integers(1, len(ring.nodes)))
    for key in keys:
        got = ring.locate(key, n)
        assert len(got) == n
        assert len({nd.id for nd in got}) == n
        assert got == ring.locate(key, len(ring.nodes))[:n]


def test_locate_rejects_bad_n() -> None:
    ring = Ring.build(make_nodes(4), part_power=4)
    for n in (0, -1, 5):
        with pytest.raises(ValueError):
            ring.locate(b"k", n)
    with pytest.raises(ValueError):
        ring.share(5)


# ------------------------------------------------------------ 3. balance
@pytest.mark.parametrize("n_nodes,zones", [(9, 3), (12, 1), (12, 4)])
@pytest.mark.parametrize("n", [1, 6])
def test_equal_weights_balanced_over_100k_keys(n_nodes: int, zones: int, n: int) -> None:
    ring = Ring.build(make_nodes(n_nodes, zones))
    counts = key_counts(ring, n)
    mean = len(KEYS) * n / n_nodes
    assert len(counts) == n_nodes
    assert max(counts.values()) <= 1.10 * mean, counts
    assert min(counts.values()) >= 0.90 * mean, counts


def test_share_sums_to_one_and_is_balanced() -> None:
    ring = Ring.build(make_nodes(12, 3))
    for n in range(1, 13):
        share = ring.share(n)
        assert abs(sum(share.values()) - 1) < 1e-9
        assert max(share.values()) <= 1.02 / 12


# ------------------------------------------------------------ 4. weights
@pytest.mark.parametrize("n", [1, 2, 3])
def test_weights_honoured_within_10_percent(n: int) -> None:
    weights = [float(w) for w in range(1, 9)]
    ring = Ring.build(make_nodes(8, 1, weights))
    counts = key_counts(ring, n)
    total = len(KEYS) * n
    for nd in ring.nodes:
        expected = total * nd.weight / sum(weights)
        assert abs(counts[nd.id] - expected) <= 0.10 * expected, (nd.id, counts[nd.id], expected)


def test_heavy_node_is_capped_at_once_per_row() -> None:
    ring = Ring.build(make_nodes(5, 1, [1, 1, 1, 1, 10]), part_power=8)
    share = ring.share(2)
    assert share["s04"] == pytest.approx(0.5)
    for i in range(4):
        assert share[f"s0{i}"] == pytest.approx(0.125, rel=0.05)


@FAST
@given(weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 4.0]), min_size=6, max_size=12))
def test_weighted_first_position_share(weights: list[float]) -> None:
    ring = Ring.build(make_nodes(len(weights), 1, weights), part_power=8)
    share = ring.share(1)
    for nd in ring.nodes:
        expected = nd.weight / sum(weights)
        assert abs(share[nd.id] - expected) <= 1.5 / ring.partitions


# ----------------------------------------------------------- 5. movement
def changed_placements(old: Ring, new: Ring, n: int) -> list[tuple[str, str]]:
    """(old node, new node) for every changed placement at positions < n, all partitions."""
    out = []
    for a, b in zip(id_rows(old, n), id_rows(new, n)):
        out.extend((x, y) for x, y in zip(a, b) if x != y)
    return out


@pytest.mark.parametrize("n_nodes", [4, 8, 12])
def test_add_moves_minimum_and_only_onto_new_node(n_nodes: int) -> None:
    old = Ring.build(make_nodes(n_nodes), part_power=10)
    new, report = old.add(Node("new", "http://127.0.0.1:9999"))
    new.check()
    for n in sorted({1, 2, n_nodes // 2, n_nodes - 1, n_nodes} - {0}):
        moved = changed_placements(old, new, n)
        assert all(dst == "new" for _, dst in moved)
        assert len(moved) <= 1.2 * n * old.partitions / (n_nodes + 1), (n, len(moved))
        assert report.moved_fraction(n) == len(moved) / (n * old.partitions)
    # the same, measured over keys
    moved_keys = sum(
        1 for key in KEYS[:20_000] for a, b in zip(old.locate(key, n_nodes), new.locate(key, n_nodes)) if a != b
    )
    assert moved_keys <= 1.2 * 20_000 * n_nodes / (n_nodes + 1)
    assert report.added == ("new",) and report.removed == ()


@pytest.mark.parametrize("n_nodes", [3, 6, 12])
def test_remove_changes_only_placements_on_removed_node(n_nodes: int) -> None:
    old = Ring.build(make_nodes(n_nodes), part_power=10)
    for victim in ("s00", f"s{n_nodes // 2:02d}", f"s{n_nodes - 1:02d}"):
        new, report = old.remove(victim)
        new.check()
        for n in sorted({1, n_nodes // 2, n_nodes - 1} - {0}):
            moved = changed_placements(old, new, n)
            assert all(src == victim for src, _ in moved)
            on_victim = sum(row.count(victim) for row in id_rows(old, n))
            assert len(moved) == on_victim
        assert report.removed == (victim,)


@FAST
@given(cfg=ring_configs, zone=st.integers(1, 5), weight=st.sampled_from([1.0, 2.0, 3.0]))
def test_add_property_changes_only_onto_new_node(cfg, zone: int, weight: float) -> None:
    old = ring_from(cfg)
    new, report = old.add(Node("zz", "http://h:1", weight=weight, zone=f"z{zone}"))
    width = len(old.nodes)
    moved = changed_placements(old, new, width)
    assert all(dst == "zz" for _, dst in moved)
    assert report.moved_positions == len(moved)
    assert [nd.id for nd in new.nodes] == sorted([nd.id for nd in old.nodes] + ["zz"])


@FAST
@given(cfg=ring_configs, data=st.data())
def test_remove_property_changes_only_removed_placements(cfg, data) -> None:
    old = ring_from(cfg)
    if len(old.nodes) < 2:
        with pytest.raises(ValueError):
            old.remove(old.nodes[0].id)
        return
    victim = data.draw(st.sampled_from([nd.id for nd in old.nodes]))
    new, _ = old.remove(victim)
    # with one zone: every position; with zones: positions below the zone count
    limit = len(new.nodes) if zone_count(old) == 1 else min(len(new.nodes), zone_count(new))
    moved = changed_placements(old, new, limit)
    assert all(src == victim for src, _ in moved)


def test_add_then_remove_restores_placement_of_old_nodes() -> None:
    old = Ring.build(make_nodes(6), part_power=8)
    added, _ = old.add(Node("new", "http://h:1"))
    back, report = added.remove("new")
    assert [nd.id for nd in back.nodes] == [nd.id for nd in old.nodes]
    # every changed placement of the round trip was one that moved onto "new"
    assert report.moved_positions == MoveReport.compare(old, added).moved_positions


# --------------------------------------------------------------- 6. zones
@pytest.mark.parametrize("n_nodes,zones", [(9, 3), (12, 4), (8, 2), (7, 3)])
def test_zone_spread_after_build(n_nodes: int, zones: int) -> None:
    assert_zone_spread(Ring.build(make_nodes(n_nodes, zones), part_power=8))


def test_zone_spread_after_round_robin_adds() -> None:
    ring = Ring.build(make_nodes(9, 3), part_power=10)
    for i in range(6):
        node = Node(f"n{i}", f"http://h:{i + 1}", zone=f"z{i % 3 + 1}")
        new, _ = ring.add(node)
        assert_zone_spread(new)
        assert all(dst == node.id for _, dst in changed_placements(ring, new, len(ring.nodes)))
        ring = new
    share = ring.share(6)
    assert max(share.values()) <= 1.10 / 15


@FAST
@given(zone_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_zone_spread_property_after_build(zone_sizes: list[int]) -> None:
    nodes = [
        Node(f"n{z}x{i}", f"http://h:{10 * z + i + 1}", zone=f"zone{z}")
        for z, size in enumerate(zone_sizes)
        for i in range(size)
    ]
    assert_zone_spread(Ring.build(nodes, part_power=6))


def test_set_zone_restores_zone_spread() -> None:
    ring = Ring.build(make_nodes(9, 3), part_power=8)
    new, report = ring.set_zone("s00", "z9")
    assert new.node("s00").zone == "z9"
    assert_zone_spread(new)
    assert report.moved_positions > 0 and report.added == report.removed == ()


# ------------------------------------------------------- reweight & co
def test_reweight_moves_share_towards_new_weight() -> None:
    ring = Ring.build(make_nodes(8), part_power=10)
    new, report = ring.reweight("s03", 2.0)
    assert new.node("s03").weight == 2.0
    assert new.share(2)["s03"] == pytest.approx(2 / 9, rel=0.05)
    assert report == MoveReport.compare(ring, new)
    assert 0 < report.changed_rows <= report.total_rows == 1024
    with pytest.raises(ValueError):
        ring.reweight("s03", 0)
    with pytest.raises(KeyError):
        ring.reweight("nope", 1.0)


def test_with_node_keeps_table() -> None:
    ring = Ring.build(make_nodes(4), part_power=6)
    moved = ring.with_node(Node("s01", "http://10.0.0.1:7000"))
    assert moved.table == ring.table
    assert moved.node("s01").address == "http://10.0.0.1:7000"
    with pytest.raises(ValueError):
        ring.with_node(Node("s01", "http://10.0.0.1:7000", weight=2.0))
    with pytest.raises(KeyError):
        ring.with_node(Node("zz", "http://10.0.0.1:7000"))


def test_node_lookup_and_errors() -> None:
    ring = Ring.build(make_nodes(3), part_power=4)
    assert ring.node("s02").id == "s02"
    with pytest.raises(KeyError):
        ring.node("nope")
    with pytest.raises(UnknownNodeError):
        ring.remove("nope")
    with pytest.raises(ValueError):
        ring.add(Node("s01", "http://h:1"))
    with pytest.raises(ValueError):
        Ring.build([Node("a", "http://h:1")], part_power=0).remove("a")


# ---------------------------------------------------------- check & dict
def test_check_rejects_invalid_rings() -> None:
    ring = Ring.build(make_nodes(3), part_power=2)
    bad_row = bytes([0, 0, 0, 0, 1, 0]) + ring.table[6:]  # row 0 = [0, 0, 1]
    cases = [
        Ring(ring.nodes, 2, bad_row),
        Ring(ring.nodes, 2, ring.table[:-2]),
        Ring(tuple(reversed(ring.nodes)), 2, ring.table),
        Ring((ring.nodes[0],) * 3, 2, ring.table),
        Ring(ring.nodes, 3, ring.table),
        Ring(ring.nodes, 2, ring.table, tier="bad tier"),
        Ring((), 2, b""),
    ]
    for bad in cases:
        with pytest.raises(ValueError):
            bad.check()
    with pytest.raises(ValueError):
        Ring.build([])
    with pytest.raises(ValueError):
        Ring.build(make_nodes(2), part_power=17)
    with pytest.raises(ValueError):
        Ring.build(make_nodes(2) + make_nodes(1))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"id": "bad id"},
        {"id": ""},
        {"id": "x" * 65},
        {"address": "127.0.0.1:9000"},
        {"address": "ftp://h:1"},
        {"weight": 0},
        {"weight": -1.0},
        {"weight": float("nan")},
        {"weight": True},
        {"zone": ""},
        {"tier": "a/b"},
    ],
)
def test_node_check_rejections(kwargs: dict) -> None:
    base = {"id": "s1", "address": "http://127.0.0.1:9001"}
    with pytest.raises(ValueError):
        Node(**{**base, **kwargs}).check()


def test_node_dict_round_trip() -> None:
    node = Node("s1", "https://host:443/base", weight=2, zone="za", tier="cold")
    back = Node.from_dict(node.to_dict())
    assert back == node and isinstance(back.weight, float)
    for bad in ({"id": "s1"}, {"id": "s1", "address": "http://h:1", "extra": 1}, [], {"id": 1, "address": "http://h:1"}):
        with pytest.raises(ValueError):
            Node.from_dict(bad)


def test_ring_dict_round_trip_through_msgpack() -> None:
    ring = Ring.build(make_nodes(5, 2, [1, 2, 1, 2, 3]), part_power=6, tier="hot")
    packed = msgpack.packb(ring.to_dict(), use_bin_type=True)
    back = Ring.from_dict(msgpack.unpackb(packed, raw=False))
    assert back == ring
    assert back.locate(b"k", 5) == ring.locate(b"k", 5)
    with pytest.raises(ValueError):
        Ring.from_dict({**ring.to_dict(), "table": ring.table[::-1][:-2]})
    with pytest.raises(ValueError):
        Ring.from_dict({**ring.to_dict(), "part_power": "6"})


# ---------------------------------------------------------------- speed
def test_build_and_add_are_fast() -> None:
    t0 = time.perf_counter()
    ring = Ring.build(make_nodes(12, 3), part_power=10)
    t1 = time.perf_counter()
    ring.add(Node("new", "http://h:1", zone="z2"))
    t2 = time.perf_counter()
    assert t1 - t0 < 3.0 and t2 - t1 < 1.0, (t1 - t0, t2 - t1)
