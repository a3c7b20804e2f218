"""The admin commands' concurrency, in process: how many rebuilds and moves at once for a
segment size, a failure that cancels the rest of a step, and the metadata move's notes
read by range from a node of each version (a fake node: the replies each version gives,
as node.control.list_page shapes them)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from placement.nodes import Node
from store import metamove
from store.errors import EcstoreError
from store.rebalance import move_parallel
from store.repair import repair_parallel
from store.wire import pack
from store.workers import gather_or_cancel

MiB = 1024 * 1024


def test_fewer_at_once_when_segments_are_large() -> None:
    assert repair_parallel([{"segment_size": 4 * MiB}]) == 8
    assert repair_parallel([{"segment_size": 4 * MiB}, {"segment_size": 64 * MiB}]) == 2
    assert repair_parallel([]) == 8
    assert move_parallel([{"segment_size": 4 * MiB, "k": 4}]) == 8
    assert move_parallel([{"segment_size": 64 * MiB, "k": 2}]) == 4
    assert move_parallel([{"segment_size": 1024 * MiB, "k": 1}]) == 1


def test_the_first_failure_cancels_the_rest() -> None:
    ended: list[str] = []

    async def slow(name: str) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            ended.append(f"{name} cancelled")
            raise

    async def bad() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("not an EcstoreError")

    async def go() -> None:
        with pytest.raises(ValueError):
            await gather_or_cancel(slow("a"), bad(), slow("b"))
        assert sorted(ended) == ["a cancelled", "b cancelled"]   # ended before the raise
        assert await gather_or_cancel(asyncio.sleep(0, "x"), asyncio.sleep(0, "y")) == ["x", "y"]
    asyncio.run(go())


class FakeNode:
    """A control node's notes listing: `pages` are the replies in order, each checked
    against the `after` it was asked with."""

    def __init__(self, pages: list[tuple[str, dict[str, Any]]]) -> None:
        self.pages = pages
        self.asked: list[str] = []

    async def request(self, method: str, base: str, path: str, **kw: Any) -> Any:
        after = kw["query"]["after"]
        self.asked.append(after)
        want, reply = self.pages.pop(0)
        assert after == want, (after, want)
        return SimpleNamespace(body=pack(reply), status=200)


def page_notes(fake: FakeNode, after: str, last: str) -> tuple[Any, metamove.MetaMoveReport]:
    report = metamove.MetaMoveReport()
    c: Any = SimpleNamespace(t=fake)
    node = Node(id="c1", address="http://127.0.0.1:1")
    return asyncio.run(metamove._page_notes(c, node, "bkt", after, last, report)), report


def test_notes_read_by_range_from_a_current_node() -> None:
    fake = FakeNode([
        ("a", {"records": [], "replaced": {"b": [["v1", 1]], "c": [["v2", 2]]},
               "truncated": True, "last": "c"}),
        ("c", {"records": [], "replaced": {"d": [["v3", 3]], "z": [["v9", 9]]},
               "truncated": True, "last": "z"}),
    ])
    got, report = page_notes(fake, "a", "e")
    assert got == {"b": [["v1", 1]], "c": [["v2", 2]], "d": [["v3", 3]]}   # not z: past e
    assert report.failed == 0 and fake.asked == ["a", "c"]


def test_notes_read_from_a_node_before_notes_only_listings() -> None:
    """It answers records with their notes, cut at a record, and no "last": the next page
    starts after that record - the keys past the cut are read too (they were dropped
    with no notes carried when the read stopped at the first page)."""
    fake = FakeNode([
        ("", {"records": [{"key": "k0"}, {"key": "k1"}], "replaced": {"k1": [["v1", 1]]},
              "truncated": True}),
        ("k1", {"records": [{"key": "k2"}, {"key": "k4"}], "replaced": {"k4": [["v4", 4]]},
                "truncated": True}),
    ])
    got, report = page_notes(fake, "", "k4")
    assert got == {"k1": [["v1", 1]], "k4": [["v4", 4]]} and report.failed == 0


def test_a_truncated_page_with_nowhere_to_resume_reads_as_failed() -> None:
    fake = FakeNode([("", {"records": [], "replaced": {}, "truncated": True})])
    got, report = page_notes(fake, "", "k4")
    assert got is None and report.failed == 1 and "nowhere to resume" in report.errors[0]


def test_a_node_that_does_not_answer_reads_as_failed() -> None:
    class Down(FakeNode):
        async def request(self, method: str, base: str, path: str, **kw: Any) -> Any:
            raise EcstoreError("unreachable")
    got, report = page_notes(Down([]), "", "k4")
    assert got is None and report.failed == 1
