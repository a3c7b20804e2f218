"""Unit tests of placement.cluster_map and placement.policy."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import ClusterMap, Node, Policy, Ring

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def storage(n: int, tier: str = "hot", zones: int = 3, prefix: str = "s") -> list[Node]:
    return [
        Node(f"{prefix}{i}", f"http://127.0.0.1:{9100 + i}", zone=f"z{i % zones + 1}", tier=tier) for i in range(n)
    ]


def control(n: int) -> list[Node]:
    return [Node(f"c{i}", f"http://127.0.0.1:{9000 + i}") for i in range(n)]


@pytest.fixture(scope="module")
def cmap() -> ClusterMap:
    return ClusterMap.initial(storage(9), control(3), k=4, m=2, part_power=6)


# ---------------------------------------------------------------- initial
def test_initial_map(cmap: ClusterMap) -> None:
    assert cmap.epoch == 1
    assert (cmap.replicas, cmap.write_quorum, cmap.read_quorum) == (3, 2, 2)
    assert cmap.policy() == Policy("hot", 4, 2, "isa_l_rs_vand", 4 * 1024 * 1024, "hot")
    assert cmap.policy("hot").n == 6
    assert cmap.storage_ring("hot").tier == "hot"
    assert cmap.control.tier == "control"
    assert [n.id for n in cmap.all_storage_nodes()] == sorted(f"s{i}" for i in range(9))
    assert cmap.storage_node("s3").address == "http://127.0.0.1:9103"


def test_initial_one_control_node_is_valid() -> None:
    m = ClusterMap.initial(storage(6), control(1), part_power=4)
    assert (m.replicas, m.write_quorum, m.read_quorum) == (1, 1, 1)
    assert m.control_nodes_for("k") == m.control.nodes
    m2 = ClusterMap.initial(storage(6), control(2), part_power=4)
    assert (m2.replicas, m2.write_quorum, m2.read_quorum) == (2, 2, 1)


def test_replicas_above_control_nodes_uses_effective_r() -> None:
    m = ClusterMap.initial(storage(6), control(1), part_power=4)
    wide = dataclasses.replace(m, replicas=3)
    wide.check()
    assert wide.effective_replicas == 1
    assert len(wide.control_nodes_for(b"x")) == 1
    with pytest.raises(ValueError):
        dataclasses.replace(m, replicas=3, write_quorum=2).check()


def test_initial_with_two_tiers() -> None:
    m = ClusterMap.initial(storage(6) + storage(3, tier="cold", prefix="c"), control(3),
                           part_power=4, cold_k=2, cold_m=1)
    assert sorted(r.tier for r in m.storage_rings) == ["cold", "hot"]
    assert (m.policy("cold").k, m.policy("cold").m, m.policy("cold").tier) == (2, 1, "cold")
    assert m.policy().name == "hot"
    with pytest.raises(ValueError, match="policy cold: needs k\\+m=11"):  # default cold 8+3
        ClusterMap.initial(storage(6) + storage(3, tier="cold", prefix="c"), control(3),
                           part_power=4)
    assert m.storage_node("c1").tier == "cold"
    assert len(m.all_storage_nodes()) == 9
    with pytest.raises(KeyError):
        m.storage_node("nope")
    with pytest.raises(KeyError):
        m.storage_ring("warm")


def test_initial_rejects_too_few_nodes_for_policy() -> None:
    with pytest.raises(ValueError):
        ClusterMap.initial(storage(5), control(3), k=4, m=2, part_power=4)


# ---------------------------------------------------------------- lookups
def test_control_nodes_for(cmap: ClusterMap) -> None:
    for key in ("a", b"b", "bucket/obj"):
        got = cmap.control_nodes_for(key)
        assert len(got) == 3 and len(set(got)) == 3
        assert got == cmap.control.locate(key, 3)


def test_fragment_nodes(cmap: ClusterMap) -> None:
    p = cmap.policy()
    got = cmap.fragment_nodes(p, "v123", 7)
    assert got == cmap.storage_ring("hot").locate("v123/7", 6)
    assert len({n.id for n in got}) == 6
    assert len({n.zone for n in got[:3]}) == 3


def test_policy_lookup(cmap: ClusterMap) -> None:
    assert cmap.policy(None).name == "hot"
    with pytest.raises(KeyError):
        cmap.policy("nope")


# ------------------------------------------------------------------- bump
def test_bump(cmap: ClusterMap) -> None:
    ring, _ = cmap.storage_ring("hot").add(Node("s9", "http://h:1", zone="z1"))
    bumped = cmap.bump(storage_rings=(ring,))
    assert bumped.epoch == 2 and cmap.epoch == 1
    assert bumped.storage_node("s9").id == "s9"
    with pytest.raises(ValueError):
        cmap.bump(write_quorum=4)
    with pytest.raises(ValueError):
        cmap.bump(epoch=7)


# --------------------------------------------------------------- check()
def _bad_maps(m: ClusterMap) -> list[ClusterMap]:
    hot = m.storage_ring("hot")
    other_tier = Ring.build(storage(6, tier="cold", prefix="x"), 4, tier="hot")
    dup_node = Ring.build(storage(6, tier="cold"), 4, tier="cold")
    r = dataclasses.replace
    return [
        r(m, epoch=0),
        r(m, epoch=True),
        r(m, default_policy="nope"),
        r(m, policies=m.policies * 2),
        r(m, policies=()),
        r(m, policies=(Policy(k=8, m=4),)),
        r(m, policies=(Policy(tier="cold"),)),
        r(m, write_quorum=0),
        r(m, write_quorum=4),
        r(m, read_quorum=0),
        r(m, read_quorum=4),
        r(m, replicas=0),
        r(m, inline_max_bytes=-1),
        r(m, control=r(m.control, tier="hot")),
        r(m, storage_rings=()),
        r(m, storage_rings=(hot, hot)),
        r(m, storage_rings=(other_tier,)),
        r(m, storage_rings=(hot, dup_node)),
        r(m, storage_rings=(r(hot, tier="control"),)),
        r(m, storage_rings=(r(hot, table=hot.table[:-2]),)),
    ]


def test_check_rejections() -> None:
    m = ClusterMap.initial(storage(6), control(3), part_power=4)
    m.check()
    for bad in _bad_maps(m):
        with pytest.raises(ValueError):
            bad.check()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0},
        {"k": True},
        {"m": -1},
        {"k": 30, "m": 3},
        {"ec_type": "jerasure_rs_vand"},
        {"segment_size_bytes": 1024},
        {"segment_size_bytes": 128 * 1024 * 1024},
        {"name": ""},
        {"tier": "a b"},
    ],
)
def test_policy_check_rejections(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Policy(**kwargs).check()


def test_policy_round_trip() -> None:
    p = Policy("cold", 8, 4, "liberasurecode_rs_vand", 64 * 1024, "cold")
    p.check()
    assert Policy.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError):
        Policy.from_dict({**p.to_dict(), "x": 1})


# ---------------------------------------------------------- serialization
def test_round_trip(cmap: ClusterMap) -> None:
    data = cmap.to_bytes()
    back = ClusterMap.from_bytes(data)
    assert back == cmap
    assert back.to_bytes() == data
    assert back.fragment_nodes(back.policy(), "v", 0) == cmap.fragment_nodes(cmap.policy(), "v", 0)


@FAST
@given(
    epoch=st.integers(1, 2**40),
    k=st.integers(1, 4),
    m=st.integers(1, 2),   # no codec takes m=0 (Policy.check refuses it)
    n_control=st.integers(1, 4),
    inline=st.integers(0, 1 << 20),
    weight=st.floats(0.25, 8.0),
)
def test_round_trip_property(epoch: int, k: int, m: int, n_control: int, inline: int, weight: float) -> None:
    nodes = storage(6)
    nodes[0] = dataclasses.replace(nodes[0], weight=weight)
    base = ClusterMap.initial(nodes, control(n_control), k=k, m=m, part_power=3)
    cm = dataclasses.replace(base, epoch=epoch, inline_max_bytes=inline)
    cm.check()
    assert ClusterMap.from_bytes(cm.to_bytes()) == cm


@FAST
@given(blob=st.binary(max_size=200))
def test_garbage_bytes_raise_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):
        ClusterMap.from_bytes(blob)


@FAST
@given(data=st.data())
def test_corrupted_map_is_rejected_or_valid(data) -> None:
    good = bytearray(ClusterMap.initial(storage(6), control(3), part_power=2).to_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(good) - 1))
        good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(good)))
    try:
        got = ClusterMap.from_bytes(bytes(good[:cut]))
    except ValueError:
        return
    got.check()


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({1: 2}),
        msgpack.packb({"epoch": 1}),
        msgpack.packb("text"),
    ],
)
def test_wrong_shapes_raise_value_error(blob: bytes) -> None:
    with pytest.raises(ValueError):
        ClusterMap.from_bytes(blob)


def test_from_bytes_rejects_non_bytes_extra_fields_and_trailing_data(cmap: ClusterMap) -> None:
    with pytest.raises(ValueError):
        ClusterMap.from_bytes("not bytes")  # type: ignore[arg-type]
    d = cmap.to_dict()
    for bad in ({**d, "extra": 1}, {**d, "format": 2}, {**d, "epoch": "1"}, {**d, "storage_rings": {}}):
        with pytest.raises(ValueError):
            ClusterMap.from_bytes(msgpack.packb(bad, use_bin_type=True))
    with pytest.raises(ValueError):
        ClusterMap.from_bytes(cmap.to_bytes() + b"\x00")
