"""Quorum reads that ask only as many replicas as they need (store.metadata.staged_answers)
and listings built on them: spares come in for a failure or a stall, the page is right."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from placement.nodes import Node
from store.errors import Unavailable
from store.listing import merge_listing
from store.metadata import staged_answers
from store.transport import Reply, Transport
from store.wire import pack


def test_only_enough_calls_start_when_they_all_succeed() -> None:
    started: list[int] = []

    def maker(i: int) -> Any:
        async def call() -> int:
            started.append(i)
            await asyncio.sleep(0.01)
            return i
        return call

    out = asyncio.run(staged_answers([maker(i) for i in range(3)], 2))
    assert out == [0, 1] and started == [0, 1]      # the spare was never started


def test_a_failure_brings_in_a_spare_at_once() -> None:
    def maker(i: int) -> Any:
        async def call() -> int:
            if i == 0:
                raise Unavailable("down")
            await asyncio.sleep(0.01)
            return i
        return call

    async def go() -> tuple[list[Any], float]:
        t0 = asyncio.get_running_loop().time()
        out = await staged_answers([maker(i) for i in range(3)], 2, grace_s=5.0)
        return out, asyncio.get_running_loop().time() - t0
    out, took = asyncio.run(go())
    assert isinstance(out[0], Unavailable) and out[1:] == [1, 2]
    assert took < 1.0          # not the grace: a failure is known at once


def test_a_stall_brings_in_a_spare_after_the_grace_and_is_cancelled() -> None:
    cancelled: list[int] = []

    def maker(i: int) -> Any:
        async def call() -> int:
            try:
                await asyncio.sleep(30 if i == 1 else 0.01)
            except asyncio.CancelledError:
                cancelled.append(i)
                raise
            return i
        return call

    async def go() -> tuple[list[Any], float]:
        t0 = asyncio.get_running_loop().time()
        out = await staged_answers([maker(i) for i in range(3)], 2, grace_s=0.1)
        return out, asyncio.get_running_loop().time() - t0
    out, took = asyncio.run(go())
    assert out[0] == 0 and isinstance(out[1], Unavailable) and out[2] == 2
    assert took < 2.0 and cancelled == [1]


def test_not_enough_answers_when_every_call_fails() -> None:
    def maker(i: int) -> Any:
        async def call() -> int:
            raise Unavailable(f"down {i}")
        return call
    out = asyncio.run(staged_answers([maker(i) for i in range(3)], 2))
    assert all(isinstance(r, Unavailable) for r in out)


class ListTransport(Transport):
    """Control nodes' list route from memory: every node holds every key (3 replicas on
    3 nodes), node `down` fails, node `stalled` never answers."""

    def __init__(self, rows: dict[str, list[dict[str, Any]]], down: str = "",
                 stalled: str = "") -> None:
        super().__init__(secret="unused")
        self.rows, self.down, self.stalled = rows, down, stalled
        self.asked: dict[str, int] = {}

    async def request(self, method: str, base_url: str, path: str, *,
                      body: bytes | bytearray | memoryview = b"", checksum: str | None = None,
                      query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0, ok_404: bool = False) -> Reply:
        assert query is not None
        self.asked[base_url] = self.asked.get(base_url, 0) + 1
        if base_url == self.down:
            raise Unavailable(f"{base_url} down")
        if base_url == self.stalled:
            await asyncio.sleep(30)
        rows = [r for r in self.rows[base_url]
                if r["key"] > query["after"] and r["key"].startswith(query["prefix"])]
        limit = int(query["limit"])
        return Reply(200, {}, bytearray(pack({"records": rows[:limit],
                                              "truncated": len(rows) > limit})))


def record(key: str, ts: int, deleted: bool = False) -> dict[str, Any]:
    return {"key": key, "ts": ts, "version_id": f"v{ts}", "deleted": deleted, "size": 1,
            "etag": None, "content_type": ""}


NODES = tuple(Node(f"c{i}", f"http://c{i}", zone=f"c{i}", tier="control") for i in range(3))
KEYS = [f"k{i:03d}" for i in range(50)]


def replicas() -> dict[str, list[dict[str, Any]]]:
    """Acknowledged writes on 2 of 3 nodes: the newest of k007 (a delete) and of k011 (an
    overwrite) are missing on one node each, as a write quorum of 2 allows."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for n, node in enumerate(NODES):
        mine = []
        for k in KEYS:
            if k == "k007":
                mine.append(record(k, 2 if n != 0 else 1, deleted=n != 0))
            elif k == "k011":
                mine.append(record(k, 2 if n != 1 else 1))
            else:
                mine.append(record(k, 1))
        rows[node.address] = mine
    return rows


def expected() -> list[tuple[str, int]]:
    return [(k, 2 if k == "k011" else 1) for k in KEYS if k != "k007"]


@pytest.mark.parametrize("down,stalled", [("", ""), ("http://c0", ""), ("", "http://c2"),
                                          ("http://c1", "")])
def test_listing_asks_two_of_three_and_stays_right(down: str, stalled: str) -> None:
    for _ in range(12):   # the first node asked is random: every pair gets its turn
        t = ListTransport(replicas(), down, stalled)

        async def go() -> Any:
            return await asyncio.wait_for(
                merge_listing(t, NODES, "b", "", "", "", 1000, allowed_failures=2, enough=2),
                5.0)
        page = asyncio.run(go())
        assert [(o.key, o.ts) for o in page.objects] == expected()
        if not down and not stalled:
            assert len(t.asked) == 2, t.asked            # the third node is never asked
        else:
            assert len(t.asked) in (2, 3)                # the spare only when needed


def test_listing_with_enough_left_out_asks_every_node() -> None:
    t = ListTransport(replicas())
    page = asyncio.run(merge_listing(t, NODES, "b", "", "", "", 1000, allowed_failures=0))
    assert len(t.asked) == 3 and [(o.key, o.ts) for o in page.objects] == expected()
