"""Repair: find segments with missing or corrupt fragments and rebuild them.

What must exist comes from the metadata (every live object's record); what does exist
comes from each storage node's fragment listing (one paginated listing per node, not one
request per fragment; a quarantined fragment is not listed, so it counts as missing).
`plan_object` is pure; `RepairWorker.step()` repairs a few objects per call, their
damaged segments several at a time.
"""
from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store import codec
from store.client import Client, expected_fragment_nodes, record_policy
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
REPAIR_PARALLEL = 8     # segments rebuilt at once (each holds k fragments and its rebuilt ones)
REPAIR_BYTES = 256 * 1024 * 1024   # ... fewer when their segments are large: about this much


def repair_parallel(records: list[dict[str, Any]]) -> int:
    """Segments to rebuild at once: REPAIR_PARALLEL, fewer when the largest segment of
    these records would hold more than REPAIR_BYTES in all (each rebuild holds about two
    segments' worth: the k fragments read and the ones rebuilt) - 64 MiB segments: 2."""
    largest = max((int(r.get("segment_size") or 0) for r in records), default=0)
    return bounded_parallel(REPAIR_PARALLEL, REPAIR_BYTES, 2 * largest)


@dataclass(frozen=True)
class SegmentRepair:
    """One segment's missing fragment indexes and where its present ones are."""

    segment: int
    missing: tuple[int, ...]
    present: Mapping[int, Node]
    targets: Mapping[int, Node]       # where each missing index must be written
    version_id: str = ""              # of the extent (the object, or one multipart part)


@dataclass(frozen=True)
class ObjectPlan:
    bucket: str
    key: str
    record: dict[str, Any]
    segments: tuple[SegmentRepair, ...]

    @property
    def unrecoverable(self) -> bool:
        k = self.record["k"]
        return any(len(s.present) < k for s in self.segments)


def expected_nodes(cmap: ClusterMap, record: dict[str, Any], seg: int) -> list[Node]:
    """The node a reader looks at for each fragment index of one segment."""
    return expected_fragment_nodes(cmap, record, seg)


def plan_object(cmap: ClusterMap, bucket: str, key: str, record: dict[str, Any],
                listings: Mapping[str, set[str]]) -> ObjectPlan:
    """Which fragments of this object are missing, from the nodes' listings (pure). A
    fragment not yet moved by a rebalance - still where the previous epoch's ring put it,
    where readers look too - is present (read from there), not missing."""
    out = []
    n = record["k"] + record["m"]
    pol = record_policy(cmap, record)
    for ext, seg in ((e, s) for e in record_extents(record) for s in range(e.segments)):
        nodes = expected_fragment_nodes(cmap, record, seg, ext)
        known = [i for i in range(n) if nodes[i].id in listings]  # skip unreachable nodes
        present = {i: nodes[i] for i in known
                   if fragment_id(ext.version_id, seg, i) in listings[nodes[i].id]}
        for i in known:
            prev = cmap.previous_fragment_node(pol, ext.version_id, seg, i)
            if i not in present and prev is not None \
                    and fragment_id(ext.version_id, seg, i) in listings.get(prev.id, ()):
                present[i] = prev
        missing = tuple(i for i in known if i not in present)
        if missing:
            out.append(SegmentRepair(seg, missing, present, {i: nodes[i] for i in missing},
                                     ext.version_id))
    return ObjectPlan(bucket, key, record, tuple(out))


@dataclass
class RepairReport(WorkReport):
    objects_checked: int = 0
    segments_damaged: int = 0
    fragments_missing: int = 0
    fragments_rebuilt: int = 0
    bytes_rebuilt: int = 0
    failed: int = 0
    unrecoverable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    unlisted: list[str] = field(default_factory=list)   # storage nodes not checked: down
    # volume files each storage node rewrites without their damaged bytes (tell_repaired)
    damage_cleared: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "rebuilt_mb_s": self.mb_s(self.bytes_rebuilt)}


class RepairWorker:
    """Repairs one object per step(); resumable through a state file."""

    def __init__(self, c: Client, cmap: ClusterMap, listings: Mapping[str, set[str]],
                 records: list[tuple[str, str, dict[str, Any]]], dry_run: bool = False,
                 rate_mb_s: float = 0.0, state_path: Path | None = None) -> None:
        self.c, self.cmap, self.listings = c, cmap, listings
        self.dry_run = dry_run
        self.limiter = RateLimiter(rate_mb_s)
        self.checkpoint = Checkpoint(None if dry_run else state_path)
        done_upto = self.checkpoint.load()
        self.todo = deque(r for r in records if (r[0], r[1]) > done_upto)
        self.skipped = len(records) - len(self.todo)
        self.report = RepairReport()
        self.opened: dict[str, str] = {}   # node id -> the open id its listing came with

    def finish(self) -> None:
        self.checkpoint.finish()

    @property
    def remaining(self) -> int:
        return len(self.todo)

    async def step(self) -> bool:
        """Check and repair the next objects (up to STEP_OBJECTS, their damaged segments
        REPAIR_PARALLEL at a time); False when there is nothing left. The report and the
        checkpoint take each object in order, as if they were repaired one by one."""
        if not self.todo:
            return False
        batch = take(self.todo, STEP_OBJECTS)
        plans = [plan_object(self.cmap, bucket, key, record, self.listings)
                 for bucket, key, record in batch]
        r = self.report
        for plan in plans:
            r.objects_checked += 1
            r.segments_damaged += len(plan.segments)
            r.fragments_missing += sum(len(s.missing) for s in plan.segments)
            if plan.unrecoverable:
                r.unrecoverable.append(f"{plan.bucket}/{plan.key}")
        order = InOrder(self.checkpoint, [(p.bucket, p.key) for p in plans])
        sem = asyncio.Semaphore(repair_parallel([p.record for p in plans if p.segments]))

        async def segment(plan: ObjectPlan, seg: SegmentRepair) -> int:
            async with sem:
                return await self._repair_segment(plan, seg)

        async def repair(n: int, plan: ObjectPlan) -> None:
            failed = 0
            if not self.dry_run:
                failed = sum(await gather_or_cancel(*(segment(plan, seg)
                                                      for seg in plan.segments)))
            order.done(n, failed > 0)   # a failed one: a resumed run comes back to it
        await gather_or_cancel(*(repair(n, plan) for n, plan in enumerate(plans)))
        return True

    async def _repair_segment(self, plan: ObjectPlan, seg: SegmentRepair) -> int:
        """Rebuild one segment's missing fragments: k present ones read at once (the next
        present one asked for each that fails), the rebuilt ones written at once.
        Returns how many of them failed (also counted in the report)."""
        rec, r = plan.record, self.report
        k, m = rec["k"], rec["m"]
        vid = seg.version_id or rec["version_id"]
        got: dict[int, bytes | bytearray] = {}
        waiting = sorted(seg.present.items())

        async def fetch(i: int, node: Node) -> None:
            try:
                got[i] = await self.c.get_fragment(node, fragment_id(vid, seg.segment, i),
                                                   cache=False)
            except EcstoreError as exc:
                r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment} idx {i}: {exc.message}")
        while len(got) < k and waiting:
            wave, waiting = waiting[:k - len(got)], waiting[k - len(got):]
            await gather_or_cancel(*(fetch(i, node) for i, node in wave))
        if len(got) < k:
            name = f"{plan.bucket}/{plan.key}"
            if name not in r.unrecoverable:
                r.unrecoverable.append(name)
            r.failed += len(seg.missing)
            return len(seg.missing)
        try:
            rebuilt = codec.reconstruct(k, m, rec["ec_type"], list(got.values()), list(seg.missing))
        except EcstoreError as exc:
            r.failed += len(seg.missing)
            r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment}: {exc.message}")
            return len(seg.missing)
        got.clear()         # not held while the rebuilt ones are written
        meta = {"bucket": plan.bucket, "key": plan.key, "version_id": vid,
                "segment": seg.segment}

        async def put(idx: int, body: bytes) -> int:
            try:
                await self.limiter.spend(len(body))
                await self.c.put_fragment(seg.targets[idx], fragment_id(vid, seg.segment, idx),
                                          body, {**meta, "index": idx}, cache=False)
                r.fragments_rebuilt += 1
                r.bytes_rebuilt += len(body)
                return 0
            except EcstoreError as exc:
                r.failed += 1
                r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment} idx {idx} -> "
                                f"{seg.targets[idx].id}: {exc.message}")
                return 1
        return sum(await gather_or_cancel(*(put(idx, body)
                                            for idx, body in zip(seg.missing, rebuilt))))


async def prepare_repair(c: Client, dry_run: bool = False, rate_mb_s: float = 0.0,
                         state_path: Path | None = None) -> RepairWorker:
    """Gather the inputs (records, listings) and return a worker ready to step."""
    cmap = await c.cluster_map(refresh=True)
    # no read repair: repair_replicas puts replicas back (and counts them), and a dry run
    # writes nothing
    records = [r async for r in live_records(c, read_repair=False, inline_bytes=False)]
    # and the parts of uploads in progress: acknowledged, complete names them later
    records = sorted(records + await part_extent_records(c, read_repair=False),
                     key=lambda r: (r[0], r[1]))     # the checkpoint's order
    opened: dict[str, str] = {}
    listings, errors = await all_listings(c, cmap.all_storage_nodes(), opened)
    worker = RepairWorker(c, cmap, listings, records, dry_run, rate_mb_s, state_path)
    worker.opened = opened
    worker.report.errors += errors
    worker.report.unlisted = sorted(n.id for n in cmap.all_storage_nodes() if n.id not in listings)
    return worker


async def tell_repaired(c: Client, worker: RepairWorker) -> None:
    """After a whole pass (not resumed, not a dry run) without a failure: tell each storage
    node listed that every fragment missing from its listing was rebuilt, so one that
    passed over damaged bytes when it opened its volumes stops naming them in its status
    and rewrites the volumes without them (POST /v1/repaired). A node that does not answer
    is noted in the report's errors and keeps saying so until the next repair."""
    r = worker.report
    if (worker.dry_run or worker.skipped or r.failed or r.unrecoverable or r.unlisted
            or not worker.listings):
        return
    for node in worker.cmap.all_storage_nodes():
        if node.id not in worker.listings or not worker.opened.get(node.id):
            continue
        try:
            reply = await c.t.request("POST", node.address, "/v1/repaired", timeout_s=30,
                                      query={"opened": worker.opened[node.id]})
        except EcstoreError as exc:
            r.errors.append(f"{node.id}: not told the repair finished: {exc.message}")
            continue
        cleared = json.loads(reply.body).get("cleared") or []
        if cleared:
            r.damage_cleared[node.id] = cleared
