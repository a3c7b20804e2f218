"""Pure arithmetic of segments and byte ranges, and the read plan of a segment."""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from store.errors import BadRequest, RangeNotSatisfiable


@dataclass(frozen=True)
class SegmentSlice:
    """Bytes [start, stop) of segment `index` (offsets inside the segment)."""

    index: int
    start: int
    stop: int


def segment_count(size: int, segment_size: int) -> int:
    return (size + segment_size - 1) // segment_size


def resolve_range(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """Turn an inclusive byte range (either end optional, like HTTP) into [lo, hi).

    start=None, end=N means the last N bytes. Raises RangeNotSatisfiable; BadRequest for
    an end that is not a whole number (a float read as fragments of "segment 0.0" that no
    node holds: Unavailable, which a data loader retries).
    """
    for name, v in (("start", start), ("end", end)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise BadRequest(f"range {name} must be a whole number of bytes, got {v!r}")
    start = None if start is None else int(start)    # numpy's integers too
    end = None if end is None else int(end)
    if start is None and end is None:
        return 0, size
    if start is None:
        assert end is not None
        if end <= 0:
            raise RangeNotSatisfiable(f"suffix range of {end} bytes")
        return max(0, size - end), size
    if start < 0 or start >= size or (end is not None and end < start):
        raise RangeNotSatisfiable(f"range {start}-{'' if end is None else end} of an object of "
                                  f"{size} bytes")
    hi = size if end is None else min(end + 1, size)
    return start, hi


def slices_for_range(lo: int, hi: int, segment_size: int) -> list[SegmentSlice]:
    """The segments and the part of each that bytes [lo, hi) need."""
    out = []
    seg = lo // segment_size
    while seg * segment_size < hi:
        base = seg * segment_size
        out.append(SegmentSlice(seg, max(lo, base) - base, min(hi, base + segment_size) - base))
        seg += 1
    return out


@dataclass(frozen=True)
class Extent:
    """A run of an object's bytes stored under one version id: the whole object for a
    plain put, one part for a multipart upload. Its segments are numbered from 0."""

    version_id: str
    offset: int                  # where its bytes start in the object
    size: int
    segments: int
    handoffs: Mapping[str, str] = field(default_factory=dict)   # "seg.idx" -> node id


def record_extents(record: Mapping[str, Any]) -> list[Extent]:
    """The extents of an object record, in byte order (inline objects have none)."""
    if record.get("inline") is not None:
        return []
    parts = record.get("parts")
    if not parts:
        return [Extent(record["version_id"], 0, record["size"], record.get("segments") or 0,
                       record.get("handoffs") or {})]
    out, offset = [], 0
    for p in parts:
        out.append(Extent(p["version_id"], offset, p["size"], p["segments"],
                          p.get("handoffs") or {}))
        offset += p["size"]
    return out


def extent_slices(extents: list[Extent], segment_size: int, lo: int,
                  hi: int) -> list[tuple[Extent, SegmentSlice]]:
    """The (extent, segment slice) pairs that object bytes [lo, hi) need, in order."""
    out = []
    for e in extents:
        a, b = max(lo, e.offset), min(hi, e.offset + e.size)
        if a < b:
            out += [(e, s) for s in slices_for_range(a - e.offset, b - e.offset, segment_size)]
    return out


def fragment_id(version_id: str, segment: int, index: int) -> str:
    return f"{version_id}.{segment}.{index}"


def parse_fragment_id(fid: str) -> tuple[str, int, int]:
    vid, seg, idx = fid.split(".")
    return vid, int(seg), int(idx)


def plan_fetches(k: int, n: int, good: set[int], failed: set[int],
                 inflight: set[int]) -> list[int]:
    """Which fragment indexes to request now so that k may succeed (the read plan).

    Data fragments (0..k-1) come first because they decode with no arithmetic; each
    failure brings in the next untried index at once, without waiting for the others.
    Returns [] when enough are good or in flight, or when nothing is left to try.
    """
    want = k - len(good) - len(inflight)
    untried = [i for i in range(n) if i not in good and i not in failed and i not in inflight]
    return untried[:max(0, want)]
