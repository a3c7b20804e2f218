"""Segment and range arithmetic against byte-by-byte reference; cutting a put's source
into segments."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.client import _segments
from store.errors import RangeNotSatisfiable
from store.striping import resolve_range, slices_for_range


@given(size=st.integers(1, 5000), seg=st.integers(1, 700), a=st.integers(0, 5000),
       b=st.integers(0, 5000))
def test_slices_cover_exactly_the_range(size: int, seg: int, a: int, b: int) -> None:
    data = bytes(i % 251 for i in range(size))
    lo, hi = sorted((a % size, b % size))
    lo, hi = resolve_range(size, lo, hi)
    segments = [data[i:i + seg] for i in range(0, size, seg)]
    got = b"".join(segments[s.index][s.start:s.stop] for s in slices_for_range(lo, hi, seg))
    assert got == data[lo:hi]


def test_suffix_and_open_ranges() -> None:
    assert resolve_range(100, None, 10) == (90, 100)
    assert resolve_range(100, None, 1000) == (0, 100)
    assert resolve_range(100, 95, None) == (95, 100)
    assert resolve_range(100, 0, 10**9) == (0, 100)
    for bad in ((100, None), (5, 4), (-1, 3)):
        with pytest.raises(RangeNotSatisfiable):
            resolve_range(100, *bad)
    with pytest.raises(RangeNotSatisfiable):
        resolve_range(100, None, 0)
    with pytest.raises(RangeNotSatisfiable, match=r"^range 200- of an object of 100 bytes$"):
        resolve_range(100, 200, None)   # as the user wrote it: it said "200-None"


def test_read_plan_prefers_data_then_replaces_each_failure_at_once() -> None:
    from store.striping import plan_fetches
    assert plan_fetches(4, 6, set(), set(), set()) == [0, 1, 2, 3]
    # fragment 1 failed while 0, 2, 3 are still in flight: ask parity 4 now
    assert plan_fetches(4, 6, set(), {1}, {0, 2, 3}) == [4]
    assert plan_fetches(4, 6, {0, 2, 3}, {1, 4}, set()) == [5]
    assert plan_fetches(4, 6, {0, 2, 3}, {1, 4, 5}, set()) == []      # nothing left: fail
    assert plan_fetches(4, 6, {0, 1, 2, 3}, set(), set()) == []       # done


@pytest.mark.parametrize("source, size, expect", [
    (b"", 4, []), (b"abc", 4, [b"abc"]), (b"abcd", 4, [b"abcd"]),
    (b"abcdefghij", 4, [b"abcd", b"efgh", b"ij"]), (bytearray(b"abcde"), 4, [b"abcd", b"e"]),
    (memoryview(b"abcde"), 4, [b"abcd", b"e"]),
])
def test_a_put_source_is_cut_into_segments(source: bytes | bytearray | memoryview, size: int,
                                           expect: list[bytes]) -> None:
    async def cut() -> list[bytes]:
        return [s async for s in _segments(source, size)]
    out = asyncio.run(cut())
    assert out == expect and all(type(s) is bytes for s in out)


def test_one_segment_of_bytes_is_not_copied() -> None:
    """A put of a bytes object that fits one segment encodes the object itself (a 1 MiB
    put copied it); a bytearray may change under the caller's hands, so it is copied."""
    body, mutable = b"x" * 1000, bytearray(b"x" * 1000)

    async def first(source: bytes | bytearray) -> bytes:
        return [s async for s in _segments(source, 4096)][0]
    assert asyncio.run(first(body)) is body
    assert asyncio.run(first(mutable)) is not mutable


def test_a_range_of_anything_but_whole_numbers_is_a_bad_request() -> None:
    """A float start read as fragments of "segment 0.0", none of which any node has: the
    get failed Unavailable (retried by loaders) after six pointless GETs."""
    import numpy as np

    from store.errors import BadRequest
    for start, end in ((0.0, 100), (0, 100.0), (True, 5), ("0", 5), (0, 1.5)):
        with pytest.raises(BadRequest, match="whole number"):
            resolve_range(1000, start, end)  # type: ignore[arg-type]
    assert resolve_range(1000, np.int64(10), np.int32(19)) == (10, 20)
    assert resolve_range(1000, None, 10) == (990, 1000)
