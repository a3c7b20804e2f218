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
