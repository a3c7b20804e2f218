"""A ring change keeps the previous placement so readers can look in both places; the
client fetches the map from a majority every MAP_TTL_S and does not decode bytes it
decoded before (a map rarely changes, and decoding checks every ring)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.client import Client
from store.cluster import ClusterInfo
from store.transport import Reply


def nodes(prefix: str, count: int, tier: str = "hot") -> list[Node]:
    return [Node(id=f"{prefix}{i}", address=f"http://127.0.0.1:{9000 + i}", zone=f"{prefix}{i}",
                 tier=tier) for i in range(1, count + 1)]


def test_storage_ring_change_keeps_the_previous_rings_and_round_trips() -> None:
    cmap = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    grown = cmap.with_storage_ring(cmap.storage_ring("hot").add(nodes("s", 7)[-1])[0])
    assert grown.epoch == 2 and grown.previous_epoch == 1
    assert grown.previous_storage_rings == cmap.storage_rings
    back = ClusterMap.from_bytes(grown.to_bytes())
    assert back == grown
    pol = grown.policy()
    moved = 0
    for seg in range(500):
        now = grown.fragment_nodes(pol, "v" * 32, seg)
        for i in range(pol.n):
            before = grown.previous_fragment_node(pol, "v" * 32, seg, i)
            assert before == cmap.fragment_nodes(pol, "v" * 32, seg)[i]
            if before != now[i]:
                assert now[i].id == "s7"  # a placement only ever moves onto the new node
                moved += 1
    assert moved > 0


def test_control_ring_change_reads_ask_the_previous_owners_too() -> None:
    cmap = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    grown = cmap.with_control_ring(cmap.control.add(nodes("c", 4, "control")[-1])[0])
    back = ClusterMap.from_bytes(grown.to_bytes())
    assert back.previous_control == cmap.control
    some_moved = False
    for i in range(200):
        key = f"bucket/key-{i}"
        owners = grown.control_nodes_for(key)
        asked = grown.metadata_nodes_for(key)
        assert asked[:len(owners)] == owners
        assert {n.id for n in cmap.control_nodes_for(key)} <= {n.id for n in asked}
        some_moved |= len(asked) > len(owners)
    assert some_moved
    finished = grown.bump(previous_control=None)
    assert finished.metadata_nodes_for("bucket/key-1") == finished.control_nodes_for("bucket/key-1")


def test_the_same_map_bytes_are_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    served = {"map": first.to_bytes()}
    decoded: list[int] = []
    real = ClusterMap.from_bytes

    def counting(b: bytes | bytearray) -> ClusterMap:
        decoded.append(len(b))
        return real(b)
    monkeypatch.setattr(ClusterMap, "from_bytes", staticmethod(counting))

    async def go() -> list[int]:
        c = Client(ClusterInfo(control=tuple(n.address for n in first.control.nodes),
                               secret="x" * 32))

        async def request(method: str, url: str, path: str, **kw: Any) -> Reply:
            assert (method, path) == ("GET", "/v1/map")
            return Reply(200, {}, bytearray(served["map"]))
        c.t.request = request   # type: ignore[method-assign]
        epochs = []
        for round_ in range(3):
            epochs.append((await c.cluster_map(refresh=True)).epoch)
            if round_ == 1:   # a new map: decoded once more
                served["map"] = first.bump().to_bytes()
        await c.close()
        return epochs

    epochs = asyncio.run(go())
    assert epochs == [1, 1, 2]
    assert len(decoded) == 2   # three fetches of three nodes each: two distinct maps


def grow_control(cmap: ClusterMap, count: int) -> ClusterMap:
    """The map after a control ring change to `count` nodes c1..c{count}."""
    all_nodes = nodes("c", max(count, len(cmap.control.nodes)), "control")
    ring = cmap.control
    for n in all_nodes[len(ring.nodes):count]:
        ring = ring.add(n)[0]
    for n in all_nodes[count:]:
        ring = ring.remove(n.id)[0]
    return cmap.with_control_ring(ring)


def test_a_control_ring_grown_past_r_raises_r_and_its_quorums() -> None:
    """A cluster started with one control node keeps R = 1 no more once it has more: R, W
    and the read quorum follow the initial rule (2/2/1, then 3/2/2), and the map remembers
    the old R and W until the move is done (and only then: maps without a change of R
    keep the format earlier versions read)."""
    one = ClusterMap.initial(nodes("s", 6), nodes("c", 1, "control"))
    assert (one.replicas, one.write_quorum, one.read_quorum) == (1, 1, 1)
    two = grow_control(one, 2)
    assert (two.replicas, two.write_quorum, two.read_quorum) == (2, 2, 1)
    assert (two.previous_replicas, two.previous_write_quorum) == (1, 1)
    assert ClusterMap.from_bytes(two.to_bytes()) == two
    three = grow_control(two.settled_control(), 3)
    assert (three.replicas, three.write_quorum, three.read_quorum) == (3, 2, 2)
    assert (three.previous_replicas, three.previous_write_quorum) == (2, 2)
    settled = three.settled_control()
    assert settled.previous_control is None and settled.previous_replicas == 0
    assert "previous_replicas" not in settled.to_dict()
    four = grow_control(settled, 4)      # R is 3 already: only the ring changes
    assert (four.replicas, four.write_quorum, four.previous_replicas) == (3, 2, 0)
    assert "previous_replicas" not in four.to_dict()
    assert ClusterMap.from_bytes(four.to_bytes()) == four


@pytest.mark.parametrize("start,end", [(1, 2), (1, 3), (2, 3), (3, 4), (4, 3), (3, 5), (1, 5)])
def test_reads_and_listings_during_a_control_ring_change_meet_every_write(
        start: int, end: int) -> None:
    """Quorum intersection, checked by brute force over every subset: a record written
    before the change is on (at least) W_before of its owners before, one written after
    on W of its owners now. Whichever answers a read takes - any `needed` of the nodes it
    asks - and whichever nodes a listing asks - any all-but-misses of them - include one
    replica of each."""
    from itertools import combinations

    before = ClusterMap.initial(nodes("s", 6), nodes("c", start, "control"))
    after = grow_control(before, end)
    all_nodes = {n.id for n in after.control.nodes} | {n.id for n in before.control.nodes}
    misses = after.listing_misses_allowed()
    for i in range(40):
        key = f"bucket/key-{i}"
        old = [n.id for n in before.control_nodes_for(key)]
        new = [n.id for n in after.control_nodes_for(key)]
        writes = ({frozenset(s) for s in combinations(old, before.write_quorum)}
                  | {frozenset(s) for s in combinations(new, after.write_quorum)})
        asked, needed = after.metadata_read_plan(key)
        ids = [n.id for n in asked]
        assert set(old) | set(new) <= set(ids)
        for answered in combinations(ids, needed):
            assert all(w & set(answered) for w in writes), (key, answered)
        for listed in combinations(sorted(all_nodes), len(all_nodes) - misses):
            assert all(w & set(listed) for w in writes), (key, listed)


def test_reads_need_no_more_answers_than_before_when_r_does_not_change() -> None:
    """The usual case, three control nodes and a fourth added: a read asks the owners
    and the previous owners, and needs R + (extra nodes) - W + 1 as it always did."""
    three = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    assert three.metadata_read_plan("bucket/k")[1] == 2
    assert three.listing_misses_allowed() == 1
    four = grow_control(three, 4)
    for i in range(50):
        asked, needed = four.metadata_read_plan(f"bucket/key-{i}")
        assert needed == 2 + len(asked) - 3
    assert four.listing_misses_allowed() == 1
