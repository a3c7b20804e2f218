"""Repair: find segments with missing or corrupt fragments and rebuild them.

What must exist comes from the metadata (every live object's record); what does exist
comes from each storage node's fragment listing (one paginated listing per node, not one
request per fragment; a quarantined fragment is not listed, so it counts as missing).
`plan_object` is pure; `RepairWorker.step()` repairs one object per call.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store import codec
from store.client import Client, expected_fragment_nodes
from store.errors import EcstoreError, NotFound
from store.striping import fragment_id
from store.wire import unpack

LISTING_PAGE = 10_000
MAX_PARALLEL_HEADS = 32


@dataclass(frozen=True)
class SegmentRepair:
    """One segment's missing fragment indexes and where its present ones are."""

    segment: int
    missing: tuple[int, ...]
    present: Mapping[int, Node]
    targets: Mapping[int, Node]       # where each missing index must be written


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
    """Which fragments of this object are missing, from the nodes' listings (pure)."""
    out = []
    vid, n = record["version_id"], record["k"] + record["m"]
    for seg in range(record.get("segments") or 0):
        nodes = expected_nodes(cmap, record, seg)
        known = [i for i in range(n) if nodes[i].id in listings]  # skip unreachable nodes
        present = {i: nodes[i] for i in known
                   if fragment_id(vid, seg, i) in listings[nodes[i].id]}
        missing = tuple(i for i in known if i not in present)
        if missing:
            out.append(SegmentRepair(seg, missing, present, {i: nodes[i] for i in missing}))
    return ObjectPlan(bucket, key, record, tuple(out))


@dataclass
class RepairReport:
    objects_checked: int = 0
    segments_damaged: int = 0
    fragments_missing: int = 0
    fragments_rebuilt: int = 0
    bytes_rebuilt: int = 0
    failed: int = 0
    unrecoverable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["errors"] = self.errors[:20]
        d["rebuilt_mb_s"] = round(self.bytes_rebuilt / 1e6 / self.seconds, 2) if self.seconds else 0
        return d


async def live_records(c: Client) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """Every live object's full record, sorted by (bucket, key)."""
    for bucket in await c.list_buckets():
        async for page in c.list_all(bucket):
            sem = asyncio.Semaphore(MAX_PARALLEL_HEADS)

            async def head(key: str) -> dict[str, Any] | None:
                async with sem:
                    try:
                        return await c._live_record(bucket, key)
                    except NotFound:
                        return None
            records = await asyncio.gather(*(head(o.key) for o in page.objects))
            for o, r in zip(page.objects, records):
                if r is not None:
                    yield bucket, o.key, r


async def node_listing(c: Client, node: Node) -> set[str]:
    """Every fragment id one storage node holds (paginated)."""
    out: set[str] = set()
    after = ""
    while True:
        reply = await c.t.request("GET", node.address, "/v1/fragments",
                                  query={"after": after, "limit": LISTING_PAGE}, timeout_s=60)
        page = unpack(reply.body, 64 * 1024 * 1024)
        out.update(page["fragments"])
        if not page["truncated"] or not page["fragments"]:
            return out
        after = page["fragments"][-1]


class RateLimiter:
    """Keeps bytes per second under rate_mb_s (0 = unlimited)."""

    def __init__(self, rate_mb_s: float) -> None:
        self.rate_b_s = rate_mb_s * 1e6
        self.start = time.monotonic()
        self.bytes = 0

    async def spend(self, n: int) -> None:
        self.bytes += n
        if self.rate_b_s <= 0:
            return
        ahead_s = self.bytes / self.rate_b_s - (time.monotonic() - self.start)
        if ahead_s > 0:
            await asyncio.sleep(ahead_s)


class Checkpoint:
    """How far a resumable pass over sorted (bucket, key) got, in a small JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def load(self) -> tuple[str, str]:
        if self.path is None or not self.path.exists():
            return ("", "")
        try:
            data = json.loads(self.path.read_text())
            return (str(data["bucket"]), str(data["key"]))
        except (ValueError, KeyError):
            return ("", "")

    def save(self, bucket: str, key: str) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"bucket": bucket, "key": key}))
            tmp.replace(self.path)

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


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
        self.todo = [r for r in records if (r[0], r[1]) > done_upto]
        self.skipped = len(records) - len(self.todo)
        self.report = RepairReport()

    def finish(self) -> None:
        self.checkpoint.finish()

    @property
    def remaining(self) -> int:
        return len(self.todo)

    async def step(self) -> bool:
        """Check and repair the next object; False when there is nothing left."""
        if not self.todo:
            return False
        bucket, key, record = self.todo.pop(0)
        plan = plan_object(self.cmap, bucket, key, record, self.listings)
        r = self.report
        r.objects_checked += 1
        r.segments_damaged += len(plan.segments)
        r.fragments_missing += sum(len(s.missing) for s in plan.segments)
        if plan.unrecoverable:
            r.unrecoverable.append(f"{bucket}/{key}")
        if not self.dry_run:
            for seg in plan.segments:
                await self._repair_segment(plan, seg)
        self.checkpoint.save(bucket, key)
        return True

    async def _repair_segment(self, plan: ObjectPlan, seg: SegmentRepair) -> None:
        rec, r = plan.record, self.report
        k, m = rec["k"], rec["m"]
        vid = rec["version_id"]
        got: dict[int, bytes] = {}
        for i, node in sorted(seg.present.items()):
            if len(got) == k:
                break
            try:
                got[i] = await self.c._get_fragment(node, fragment_id(vid, seg.segment, i))
            except EcstoreError as exc:
                r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment} idx {i}: {exc.message}")
        if len(got) < k:
            name = f"{plan.bucket}/{plan.key}"
            if name not in r.unrecoverable:
                r.unrecoverable.append(name)
            r.failed += len(seg.missing)
            return
        try:
            rebuilt = codec.reconstruct(k, m, rec["ec_type"], list(got.values()), list(seg.missing))
        except EcstoreError as exc:
            r.failed += len(seg.missing)
            r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment}: {exc.message}")
            return
        meta = {"bucket": plan.bucket, "key": plan.key, "version_id": vid,
                "segment": seg.segment}
        for idx, body in zip(seg.missing, rebuilt):
            try:
                await self.c._put_fragment(seg.targets[idx], fragment_id(vid, seg.segment, idx),
                                           body, {**meta, "index": idx})
                r.fragments_rebuilt += 1
                r.bytes_rebuilt += len(body)
                await self.limiter.spend(len(body))
            except EcstoreError as exc:
                r.failed += 1
                r.errors.append(f"{plan.bucket}/{plan.key} seg {seg.segment} idx {idx} -> "
                                f"{seg.targets[idx].id}: {exc.message}")


async def prepare_repair(c: Client, dry_run: bool = False, rate_mb_s: float = 0.0,
                         state_path: Path | None = None) -> RepairWorker:
    """Gather the inputs (records, listings) and return a worker ready to step."""
    cmap = await c.cluster_map(refresh=True)
    records = [r async for r in live_records(c)]
    nodes = cmap.all_storage_nodes()
    results = await asyncio.gather(*(node_listing(c, n) for n in nodes), return_exceptions=True)
    listings: dict[str, set[str]] = {}
    down = []
    for node, res in zip(nodes, results):
        if isinstance(res, BaseException):
            down.append(node.id)
        else:
            listings[node.id] = res
    worker = RepairWorker(c, cmap, listings, records, dry_run, rate_mb_s, state_path)
    worker.report.errors += [f"storage node {n} did not answer its listing" for n in down]
    return worker
