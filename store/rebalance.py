"""Rebalance: move every fragment the current map places on another node.

For each fragment of each live object, the target is where the current map (with the
object's handoffs) says a reader looks; the source is any node whose listing holds it.
A move is GET (verified) from the source, PUT (fsynced) on the target, and only then
DELETE on the source. Readers that miss a fragment at its new place look where the
previous epoch put it (store.client_get), so reads keep working during the move.
`plan_moves` is pure; `RebalanceWorker.step()` moves a few objects' fragments per call,
several moves at a time.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.client import Client, expected_fragment_nodes
from store.codec import HEADER_BYTES, driver
from store.errors import EcstoreError
from store.multipart import part_extent_records
from store.striping import fragment_id, record_extents
from store.workers import (
    Checkpoint,
    InOrder,
    RateLimiter,
    WorkReport,
    all_listings,
    bounded_parallel,
    gather_or_cancel,
    live_records,
    take,
)

STEP_OBJECTS = 16       # objects a step takes
MOVE_PARALLEL = 8       # fragment moves at once (each holds one fragment in memory)
MOVE_BYTES = 128 * 1024 * 1024   # ... fewer when their fragments are large: about this much


def move_parallel(records: list[dict[str, Any]]) -> int:
    """Moves at once: MOVE_PARALLEL, fewer when the largest fragment of these records
    (segment_size / k) would hold more than MOVE_BYTES in all."""
    largest = max((int(r.get("segment_size") or 0) // max(1, int(r.get("k") or 1))
                   for r in records), default=0)
    return bounded_parallel(MOVE_PARALLEL, MOVE_BYTES, largest)


@dataclass(frozen=True)
class Move:
    fid: str
    source: Node
    target: Node
    size: int = 0       # the fragment's bytes as the record implies them (header included)


def fragment_bytes(record: Mapping[str, Any], extent_size: int, segment: int) -> int:
    """A fragment's size as its record implies it: what pyeclib makes of the segment's
    length with the record's code (its header, the payload its backend aligns) - what a
    dry run counts as bytes to move."""
    seg_size = int(record.get("segment_size") or 0) or extent_size
    seg_len = max(1, min(seg_size, extent_size - segment * seg_size))
    k, m = int(record["k"]), int(record["m"])
    try:
        return _fragment_size(k, m, str(record.get("ec_type") or "isa_l_rs_vand"), seg_len)
    except Exception:  # noqa: BLE001 - a code pyeclib cannot open here: ISA-L's sizes
        return HEADER_BYTES + -(-seg_len // max(1, k))


@lru_cache(maxsize=4096)
def _fragment_size(k: int, m: int, ec_type: str, seg_len: int) -> int:
    return int(driver(k, m, ec_type).get_segment_info(seg_len, seg_len)["fragment_size"])


def plan_moves(cmap: ClusterMap, record: dict[str, Any], listings: Mapping[str, set[str]],
               nodes: Mapping[str, Node]) -> tuple[list[Move], int]:
    """(moves, fragments found nowhere) for one object (pure).

    A fragment already at its target is left alone; one found on several other nodes is
    taken from the first in node id order.
    """
    moves, lost = [], 0
    n = record["k"] + record["m"]
    for ext, seg in ((e, s) for e in record_extents(record) for s in range(e.segments)):
        targets = expected_fragment_nodes(cmap, record, seg, ext)
        for i in range(n):
            fid = fragment_id(ext.version_id, seg, i)
            if fid in listings.get(targets[i].id, set()):
                continue
            holders = sorted(nid for nid, fids in listings.items() if fid in fids)
            if holders:
                moves.append(Move(fid, nodes[holders[0]], targets[i],
                                  fragment_bytes(record, ext.size, seg)))
            else:
                lost += 1
    return moves, lost


@dataclass
class RebalanceReport(WorkReport):
    objects_checked: int = 0
    moved: int = 0
    bytes_moved: int = 0
    skipped: int = 0          # fragments found on no node: repair's work
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unlisted: list[str] = field(default_factory=list)   # storage nodes that did not answer
    resumed_after: int = 0    # objects an earlier, killed run had done: this pass saw the rest

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "moved_mb_s": self.mb_s(self.bytes_moved)}

    @property
    def incomplete(self) -> bool:
        """Some fragments were found on no node while some node did not answer its
        listing: they may be on that node, at the previous placement - which the map
        must keep until they are moved (or rebuilt by repair), or readers lose them."""
        return bool(self.unlisted and self.skipped)


class RebalanceWorker:
    def __init__(self, c: Client, cmap: ClusterMap, listings: Mapping[str, set[str]],
                 nodes: Mapping[str, Node], records: list[tuple[str, str, dict[str, Any]]],
                 dry_run: bool = False, rate_mb_s: float = 0.0,
                 state_path: Path | None = None) -> None:
        self.c, self.cmap, self.listings, self.nodes = c, cmap, listings, nodes
        self.dry_run = dry_run
        self.limiter = RateLimiter(rate_mb_s)
        self.checkpoint = Checkpoint(None if dry_run else state_path)
        done_upto = self.checkpoint.load()
        self.todo = deque(r for r in records if (r[0], r[1]) > done_upto)
        self.resumed_after = len(records) - len(self.todo)
        self.report = RebalanceReport(resumed_after=self.resumed_after)
        self.planned_bytes = 0
        self.unlisted_targets: set[str] = set()

    @property
    def remaining(self) -> int:
        return len(self.todo)

    def finish(self) -> None:
        self.checkpoint.finish()

    async def step(self) -> bool:
        """Move the misplaced fragments of the next objects (up to STEP_OBJECTS, their
        moves MOVE_PARALLEL at a time); False when none is left. The checkpoint takes the
        objects in order, as if they were moved one by one."""
        if not self.todo:
            return False
        batch = take(self.todo, STEP_OBJECTS)
        order = InOrder(self.checkpoint, [(b, k) for b, k, _ in batch])
        sem = asyncio.Semaphore(move_parallel([r for _, _, r in batch]))

        async def move(bucket: str, key: str, mv: Move) -> bool:
            async with sem:
                try:
                    size = await self._move(mv)
                    self.report.moved += 1
                    self.report.bytes_moved += size
                    await self.limiter.spend(size)
                    return True
                except EcstoreError as exc:
                    self.report.failed += 1
                    self.report.errors.append(f"{bucket}/{key} {mv.fid} {mv.source.id}->"
                                              f"{mv.target.id}: {exc.message}")
                    return False

        async def rebalance(n: int, bucket: str, key: str, record: dict[str, Any]) -> None:
            moves, lost = plan_moves(self.cmap, record, self.listings, self.nodes)
            self.report.objects_checked += 1
            self.report.skipped += lost
            failed = False
            todo = []
            for mv in moves:
                if mv.target.id not in self.listings:
                    # a target that did not answer its listing (stalled, down) would take
                    # each copy's full timeout, and a pass sat silent for minutes; the move
                    # fails (the map is not settled) and the next run does it
                    self.report.failed += 1
                    failed = True
                    if mv.target.id not in self.unlisted_targets:
                        self.unlisted_targets.add(mv.target.id)
                        self.report.errors.append(
                            f"{mv.target.id} did not answer its listing: fragments the map "
                            f"places there not moved (counted in failed)")
                elif self.dry_run:
                    self.report.moved += 1
                    self.report.bytes_moved += mv.size    # would move, as the record implies
                else:
                    todo.append(move(bucket, key, mv))
            done = await gather_or_cancel(*todo)
            order.done(n, failed or not all(done))   # failed: a resumed pass comes back
        await gather_or_cancel(*(rebalance(n, *item) for n, item in enumerate(batch)))
        return True

    async def _move(self, mv: Move) -> int:
        size = await self.c.copy_fragment(mv.fid, mv.source, mv.target, cache=False,
                                          read_timeout_s=60)
        await self.c.t.request("DELETE", mv.source.address, f"/v1/fragments/{mv.fid}",
                               timeout_s=30)
        return size


async def prepare_rebalance(c: Client, dry_run: bool = False, rate_mb_s: float = 0.0,
                            state_path: Path | None = None) -> RebalanceWorker:
    """Gather the records, then listings of every storage node, current and previous."""
    cmap = await c.cluster_map(refresh=True)
    # first: what commits later is placed anew; a dry run writes nothing (no read repair:
    # it copied records onto a new control node)
    records = [r async for r in live_records(c, read_repair=not dry_run, inline_bytes=False)]
    # and the parts of uploads in progress: acknowledged, complete names them later
    records = sorted(records + await part_extent_records(c, read_repair=not dry_run),
                     key=lambda r: (r[0], r[1]))     # the checkpoint's order
    nodes: dict[str, Node] = {}
    for ring in (*cmap.previous_storage_rings, *cmap.storage_rings):
        nodes.update({n.id: n for n in ring.nodes})
    listings, errors = await all_listings(c, nodes.values())
    worker = RebalanceWorker(c, cmap, listings, nodes, records, dry_run, rate_mb_s, state_path)
    worker.report.errors += errors
    worker.report.unlisted = sorted(n for n in nodes if n not in listings)
    return worker
