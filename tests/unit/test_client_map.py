"""The client fetches the cluster map from a majority every MAP_TTL_S; bytes it decoded
before are not decoded again (a map rarely changes, and decoding checks every ring)."""
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
