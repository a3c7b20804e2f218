"""Garbage collection: remove fragments no live object needs, purge old tombstones.

A fragment is garbage iff its version is not the version of any live record AND the
version is older than the grace period (its creation time is in the version id). That
one rule covers the fragments of puts that never committed, of overwritten versions
and of deleted objects; a put still in flight is younger than the grace, so it is kept.
The versions a record replaced - an overwrite, a delete (`replaced_recently`: each control
node notes them beside the record it stores, node.metadb.new_notes) or a tiering move
(`replaced_by_move`) - count as live while the replacement is younger than the grace: a
reader that started on them reads on. The notes are read after the live records: a key
replaced before its record was read is noted by then, one replaced after had its old
version read as live.

Ordering matters (see `prepare_gc`): the fragment listings are gathered FIRST, then the
clock is read, then the records of running puts, then the live records. Any version
committed before its key's record is read is therefore seen as live, and a version that
is neither live nor young belongs to a put that has been running for longer than the
grace period - which says so: a put running over INTENT_AFTER_S (20 s) keeps a record
in PUTS_BUCKET, refreshed while it runs (store.client_put), and its version is kept. A put
that commits after the running puts were read was running then. The CLI takes graces of
60 s and more only (--force below), so every put older than the grace has told. Such a
record that has expired (its put ended, or its client died) is tombstoned here.

A fragment of a live version is a stray when it sits on a node where that version's record
does not put it: not the node the map names for it, not a recorded handoff, not where the
previous epoch's ring put it (a rebalance in progress). A fragment put handed to a handoff
node because its first node stalled can still land there once the node resumes; such a
copy is never read. Strays older than the grace are deleted too (`plan_stray_gc`), and only
while a copy sits where a reader looks (a home node's listing holds it): a stray is a
spare copy, never the last one. Only versions whose full record was read are checked: a
version live on a stale replica only, or a part of an upload in progress, keeps every copy.
Where a fragment's home is depends on the map, so strays are deleted only while the map is
the one they were planned with: a ring change (and the rebalance after it) while gc plans
or deletes makes it keep every stray for its next run - else a fragment the rebalance had
just moved looked stray where it now belongs, with its old copy already deleted.

A tombstone is purged only once it is older than the grace and every one of its R
control replicas holds exactly it (each replica is read directly); a replica that lacks
it, or holds an older record, is sent the tombstone instead and the purge happens on a
later run. The purge names the tombstone's version id, so a replica that received a newer
record meanwhile refuses it.

A part record whose upload record is gone is an orphan: an abort or complete cut short by
a version that tombstoned the upload before its parts (store.multipart now does it the
other way round), or a part recorded after its upload's abort had listed the parts. No
complete can name it any more (a complete reads the upload first), so once it is older
than the grace (its record, its version and its upload id all: the upload is recorded
before its parts, so a live upload is never younger than its part) its version counts as
not live - the one rule above then takes the fragments no object names, and keeps those of
an object its complete committed - and after the fragments its record is tombstoned
(`plan_orphan_parts`). The part records are read before the upload records: an upload
forgotten in between had tombstoned its parts first, and one recorded in between has no
part older than the grace. An upload any control node holds live (every replica is
scanned), or the listing shows (which reaches the nodes a control ring change leaves
records on), keeps its parts.

`plan_fragment_gc`, `plan_orphan_parts` and `plan_tombstone` are pure; `GcWorker.step()`
does one batch.
"""
from __future__ import annotations

import asyncio
import functools
import re
import time
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.client import Client, expected_fragment_nodes, new_version_id, record_policy
from store.client_base import settle_tasks
from store.errors import BadRequest, EcstoreError, NotFound, Unavailable
from store.metadata import META_TIMEOUT_S
from store.metamove import control_nodes_all
from store.multipart import RecordedPart, recorded_parts, upload_ids
from store.names import PARTS_BUCKET, PUTS_BUCKET, SYSTEM_BUCKETS, UPLOADS_BUCKET
from store.striping import fragment_id, record_extents
from store.transport import quote_key
from store.wire import FREED_HEADER, pack, unpack
from store.workers import WorkReport, all_listings, live_records, take

DEFAULT_GRACE_S = 3600.0
FRAGMENT_BATCH = 64
TOMBSTONE_BATCH = 32
SCAN_PAGE = 10_000
T = TypeVar("T")
NOTES_SCAN_PAGE = 2_000    # keys with notes of replaced versions (?replaced=1&notes=1)
_FID = re.compile(r"^([0-9a-f]{32})\.\d+\.\d+\Z")
_VID = re.compile(r"^[0-9a-f]{32}\Z")


# ---- pure decisions ---------------------------------------------------------------------
def version_time_ns(version_id: str) -> int:
    """The creation time (ns) a version id carries in its first 16 hex digits."""
    return int(version_id[:16], 16)


def fragment_version(fid: str) -> str | None:
    """The version id of a fragment id, or None if it is not one of ours (then kept)."""
    m = _FID.match(fid)
    return m.group(1) if m else None


def classify_fragment(fid: str, live_version_ids: set[str] | frozenset[str], cutoff_ns: int) -> str:
    """'live', 'young', 'foreign' (kept) or 'garbage'."""
    vid = fragment_version(fid)
    if vid is None:
        return "foreign"
    if vid in live_version_ids:
        return "live"
    if version_time_ns(vid) >= cutoff_ns:
        return "young"
    return "garbage"


def replaced_by_move(record: Mapping[str, Any], cutoff_ns: int) -> list[str]:
    """The versions a tiering move replaced with this live record (`tiered_from_versions`,
    else `tiered_from`) while the move is younger than the grace: kept as if live, so a
    reader that started on them reads to its end. A version's age is its creation time
    (its id), and a demoted version is as old as the object's last write - a week by
    default: the next gc after a pass collected it at once, and every read in flight on
    the old version failed (until the twenty-seventh session)."""
    if not record.get("tiered_from") or version_time_ns(record["version_id"]) < cutoff_ns:
        return []
    return list(record.get("tiered_from_versions") or [record["tiered_from"]])


def named_replaced(entries: Any) -> list[tuple[str, int]]:
    """The well-formed (version_id, replaced_at_ns) entries of a key's notes (node.metadb)."""
    return [(e[0], e[1]) for e in entries or ()
            if isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], str)
            and isinstance(e[1], int)]


def replaced_recently(replaced: Mapping[str, int], cutoff_ns: int) -> set[str]:
    """The versions replaced (overwritten, deleted) within the grace - the control nodes
    note them beside the records that replaced them (node.metadb.new_notes), gc gathers
    every replica's (`replaced_notes`): kept as if live, so a reader that opened one before reads to
    its end. By creation time alone, an overwritten version older than the grace went at
    the next gc (until the twenty-eighth session)."""
    return {vid for vid, at in replaced.items() if at >= cutoff_ns}


def cutoff(now_ns: int, grace_s: float) -> int:
    """Versions created strictly before this instant are older than the grace."""
    return now_ns - int(grace_s * 1e9)


def plan_fragment_gc(live_version_ids: set[str] | frozenset[str],
                     listings: Mapping[str, Sequence[str] | set[str]],
                     now_ns: int, grace_s: float) -> list[tuple[str, str]]:
    """Every (node_id, fid) that is garbage, sorted: not live and older than the grace."""
    limit = cutoff(now_ns, grace_s)
    return [(node_id, fid) for node_id in sorted(listings) for fid in sorted(listings[node_id])
            if classify_fragment(fid, live_version_ids, limit) == "garbage"]


def plan_stray_gc(homes: Mapping[str, set[str] | frozenset[str]],
                  listings: Mapping[str, Sequence[str] | set[str]],
                  now_ns: int, grace_s: float) -> list[tuple[str, str]]:
    """Every (node_id, fid) whose fragment is known (`homes`: fid -> the node ids where
    its record puts it) but sits on another node, is older than the grace, and has a copy
    on one of its homes (the listings say so): never the last copy (pure)."""
    limit = cutoff(now_ns, grace_s)
    out = []
    for node_id in sorted(listings):
        for fid in sorted(listings[node_id]):
            home = homes.get(fid)
            vid = fragment_version(fid)
            if home is not None and node_id not in home and vid is not None \
                    and version_time_ns(vid) < limit \
                    and any(fid in listings.get(h, ()) for h in home):
                out.append((node_id, fid))
    return out


def plan_orphan_parts(parts: Sequence[RecordedPart], uploads: set[str] | frozenset[str],
                      now_ns: int, grace_s: float
                      ) -> tuple[list[RecordedPart], list[RecordedPart]]:
    """The part records no upload in `uploads` (ids) names (pure): (those older than the
    grace, to forget; the younger ones, kept). A part is as old as the youngest of its
    record (`ts`), its version and its upload id; one whose ids are not ours is kept."""
    limit = cutoff(now_ns, grace_s)
    old, young = [], []
    for p in parts:
        if p.upload_id in uploads:
            continue
        if _VID.match(p.version_id) and _VID.match(p.upload_id) and max(
                p.ts, version_time_ns(p.version_id), version_time_ns(p.upload_id)) < limit:
            old.append(p)
        else:
            young.append(p)
    return old, young


def scanned_uploads(scan: Mapping[str, Mapping[tuple[str, str], Mapping[str, Any]]]) -> set[str]:
    """The ids of the uploads any control node holds live, from `control_scan`'s rows."""
    return {key.rsplit("/", 1)[-1] for rows in scan.values() for (bucket, key), r in rows.items()
            if bucket == UPLOADS_BUCKET and not r.get("deleted")}


def record_homes(cmap: ClusterMap, record: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """fid -> the node ids where a reader may look for it: the node the map names (a
    recorded handoff applied) and where the previous epoch's ring put it."""
    pol = record_policy(cmap, dict(record))
    out = {}
    for ext in record_extents(record):
        for seg in range(ext.segments):
            for i, node in enumerate(expected_fragment_nodes(cmap, dict(record), seg, ext)):
                prev = cmap.previous_fragment_node(pol, ext.version_id, seg, i)
                out[fragment_id(ext.version_id, seg, i)] = _homes(node.id, prev and prev.id)
    return out


@functools.lru_cache(maxsize=65536)
def _homes(node_id: str, previous_id: str | None) -> frozenset[str]:
    """One shared set per pair of nodes: gc holds one per live fragment (a one-item set
    per fragment was 216 of the 333 bytes a fragment cost it, bench.adminscale)."""
    return frozenset({node_id} if previous_id is None else {node_id, previous_id})


async def running_puts(c: Client, now_ns: int) -> tuple[set[str], list[str]]:
    """(the versions of the puts whose PUTS_BUCKET record is still good, the names of the
    records that have expired)."""
    running: set[str] = set()
    expired: list[str] = []
    after = ""
    for _ in range(100_000):
        try:
            page = await c.list_namespace(PUTS_BUCKET, start_after=after, max_keys=1000)
        except BadRequest:      # control nodes of an earlier version (an upgrade): none kept
            break
        for o in page.objects:
            rec = await c.read_record(PUTS_BUCKET, o.key)
            if rec is None or rec.get("deleted"):
                continue
            if int(rec.get("until_ns") or 0) > now_ns:
                running.add(str(rec.get("put_version")))
            else:
                expired.append(o.key)
        if not page.truncated or not page.objects:
            break
        after = page.next_start_after
    return running, expired


def _order(r: Mapping[str, Any]) -> tuple[int, str]:
    return int(r["ts"]), str(r["version_id"])


@dataclass(frozen=True)
class TombstoneAction:
    purge: tuple[str, ...] = ()      # replicas to drop the tombstone from (all of them)
    write: tuple[str, ...] = ()      # replicas to send the tombstone to (repair first)
    tombstone: dict[str, Any] | None = None
    reason: str = ""


def plan_tombstone(replicas: Sequence[str], answers: Mapping[str, dict[str, Any] | None],
                   now_ns: int, grace_s: float) -> TombstoneAction:
    """What to do with one key's tombstone, from what each replica holds (pure).

    `answers` maps a replica id to its record (None: it has none); an unreachable replica
    is absent. Purge only when every replica holds the same tombstone older than the grace.
    """
    present = [r for r in answers.values() if r is not None]
    if not present:
        return TombstoneAction(reason="gone")
    best = max(present, key=_order)
    if not best.get("deleted"):
        return TombstoneAction(reason="live")
    if int(best["ts"]) >= cutoff(now_ns, grace_s):
        return TombstoneAction(tombstone=best, reason="young")
    stale = tuple(n for n in replicas if n in answers
                  and (answers[n] is None or _order(answers[n] or {}) < _order(best)))
    if stale:
        return TombstoneAction(write=stale, tombstone=best, reason="repair")
    if any(n not in answers for n in replicas):
        return TombstoneAction(tombstone=best, reason="unreachable")
    return TombstoneAction(purge=tuple(replicas), tombstone=best, reason="purge")


# ---- gathering --------------------------------------------------------------------------
@dataclass
class GcReport(WorkReport):
    fragments_listed: int = 0
    fragments_garbage: int = 0
    fragments_deleted: int = 0
    fragments_stray: int = 0             # copies of live fragments where no reader looks
    strays_kept: int = 0                 # ... left for the next run: the map changed
    puts_running: int = 0                # puts that said they run: their fragments kept
    bytes_deleted: int | None = None     # as the storage nodes' DELETEs say (None: a dry run)
    kept_live: int = 0
    kept_young: int = 0
    kept_replaced: int = 0               # ... of them: old versions, overwritten or deleted
    kept_foreign: int = 0                # within the grace (their readers read on)
    tombstones_seen: int = 0
    tombstones_purgeable: int = 0
    tombstones_purged: int = 0
    tombstones_repaired: int = 0
    tombstones_young: int = 0
    tombstones_held_elsewhere: int = 0   # a non-owner control node holds a record of the key
    orphan_parts: int = 0                # part records no upload names, older than the grace
    orphan_parts_young: int = 0          # ... younger: kept
    orphan_parts_forgotten: int = 0      # ... tombstoned (after their fragments)
    orphan_part_fragments: int = 0       # their fragments no object names (in fragments_garbage)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "error_count": len(self.errors)}


async def control_scan(c: Client, cmap: ClusterMap, needed_by: str = "garbage collection"
                       ) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """Every object record every control node holds: {node_id: {(bucket, key): row}}.

    Raises Unavailable unless every control node answered completely: garbage collection
    decides from what is absent, so it must see everything.
    """
    nodes = cmap.control.nodes

    async def scan(node: Node, names: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for bucket in names:
            after = ""
            while True:
                try:
                    reply = await c.t.request("GET", node.address, f"/v1/list/{bucket}",
                                              query={"after": after, "limit": SCAN_PAGE},
                                              timeout_s=60)
                except BadRequest:
                    if bucket == PUTS_BUCKET:    # a node of an earlier version: holds none
                        break
                    raise
                page = unpack(reply.body, 64 * 1024 * 1024)
                for r in page["records"]:
                    rows[(bucket, r["key"])] = r
                if not page["truncated"] or not page["records"]:
                    break
                after = page["records"][-1]["key"]
        return rows

    names = await all_bucket_names(c, cmap, nodes, needed_by)
    scans = await asyncio.gather(*(asked(cmap, n, scan(n, names), needed_by) for n in nodes))
    return {n.id: s for n, s in zip(nodes, scans)}


async def asked(cmap: ClusterMap, node: Node, work: Awaitable[T], needed_by: str) -> T:
    """`work` with a control node, whose failure says which node did not answer - and, for
    one of the previous control ring only, what to do."""
    try:
        return await work
    except EcstoreError as exc:
        if any(n.id == node.id for n in cmap.control.nodes):
            raise Unavailable(f"{needed_by} needs every control node: {node.id} did not "
                              f"answer ({exc.message})") from None
        raise Unavailable(
            f"{needed_by} needs every control node, those of the previous control ring too "
            f"until a rebalance settles it: {node.id} did not answer ({exc.message}); start "
            f"it and run `ecstore rebalance`, or for a node gone for good `ecstore cluster "
            f"remove-node {node.id} --force`") from None


async def all_bucket_names(c: Client, cmap: ClusterMap, nodes: Sequence[Node],
                           needed_by: str) -> list[str]:
    """Every bucket any of `nodes` knows, and the system buckets."""
    async def buckets(node: Node) -> list[str]:
        reply = await c.t.request("GET", node.address, "/v1/buckets", timeout_s=META_TIMEOUT_S)
        return [b["name"] for b in unpack(reply.body)["buckets"]]
    names = await asyncio.gather(*(asked(cmap, n, buckets(n), needed_by) for n in nodes))
    return sorted(set().union(SYSTEM_BUCKETS, *names))


async def settle(c: Client, timeout_s: float = 2 * META_TIMEOUT_S) -> bool:
    """Wait (at most timeout_s in all) for the metadata work a client left running in the
    background - the read repairs of the records it read, which make a replica that held
    an older version note it, and the writes those start in turn - until none is left.
    False if some was still running at the deadline."""
    return await settle_tasks(lambda: c.meta.background, timeout_s)


async def replaced_notes(c: Client, cmap: ClusterMap, since_ns: int = 1) -> dict[str, int]:
    """Every version any control node noted as read by a record since replaced
    (node.metadb.new_notes) at or after `since_ns` (gc's cutoff: older ones it does not
    need), with the latest time it was: {version_id: replaced_at_ns}. Each notes what it
    held before, so replicas differ: every control node is read, those of the previous
    control ring too (records a metadata move has not moved yet are there, with their
    notes; a move brings the notes along). gc reads these after the live records (see
    prepare_gc).

    Raises Unavailable unless every control node answered completely.
    """
    nodes = list(control_nodes_all(cmap).values())
    since_ns = max(1, since_ns)
    out: dict[str, int] = {}

    async def scan(node: Node, names: list[str]) -> None:
        for bucket in names:
            if bucket in SYSTEM_BUCKETS:
                continue
            after = ""
            while True:
                # notes=1: only the keys with notes (a node of an earlier version lists the
                # records too, with their notes: read the same way, resumed after its last)
                reply = await c.t.request(
                    "GET", node.address, f"/v1/list/{bucket}", timeout_s=60,
                    query={"after": after, "limit": NOTES_SCAN_PAGE, "replaced": 1,
                           "replaced_since": since_ns, "notes": 1})
                page = unpack(reply.body, 64 * 1024 * 1024)
                if "replaced" not in page:    # a node of a version before the notes
                    break
                for entries in page["replaced"].values():
                    for vid, at in named_replaced(entries):
                        if at >= since_ns:
                            out[vid] = max(at, out.get(vid, at))
                last = page.get("last") or (page["records"][-1]["key"] if page["records"]
                                            else "")
                if not page["truncated"] or not last:
                    break
                after = last

    needed_by = "garbage collection"
    names = await all_bucket_names(c, cmap, nodes, needed_by)
    # twice while a control ring change is not settled: a metadata move running beside
    # this one may give a key's notes to a node read before and drop them from one read
    # after; the second read begins after the first has ended
    for _ in range(1 if cmap.previous_control is None else 2):
        await asyncio.gather(*(asked(cmap, n, scan(n, names), needed_by) for n in nodes))
    return out


def held_elsewhere(cmap: ClusterMap, scan: Mapping[str, Mapping[tuple[str, str], Any]],
                   keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of `keys` a control node that does not own it holds a record of (pure): a
    tombstone purged from the owners would leave that record to be listed, read or moved
    back as the newest - a deleted object back, with its old bytes."""
    out = set()
    for bucket, key in keys:
        owners = {n.id for n in cmap.control_nodes_for(f"{bucket}/{key}")}
        if any((bucket, key) in rows for nid, rows in scan.items() if nid not in owners):
            out.add((bucket, key))
    return out


class GcWorker:
    """Deletes one batch of garbage fragments (then of strays), then forgets one batch of
    orphan part records, then checks one batch of tombstones, per step()."""

    def __init__(self, c: Client, cmap: ClusterMap, garbage: list[tuple[str, str]],
                 tombstones: list[tuple[str, str]], now_ns: int, grace_s: float,
                 dry_run: bool = False, strays: Sequence[tuple[str, str]] = (),
                 orphan_parts: Sequence[RecordedPart] = ()) -> None:
        self.c, self.cmap = c, cmap
        # deques: a step takes a batch off the front (a list's slice copied the rest: a
        # quadratic pass over millions of fragments)
        self.garbage, self.tombstones = deque(garbage), deque(tombstones)
        self.held_elsewhere: set[tuple[str, str]] = set()   # tombstones not to purge
        self.strays = deque(strays)    # placed by `cmap`: deleted only while it is current
        self.orphan_parts = deque(orphan_parts)  # after the fragments: a run cut short finds them
        self.now_ns, self.grace_s, self.dry_run = now_ns, grace_s, dry_run
        self.total = self.remaining
        self.report = GcReport(bytes_deleted=None if dry_run else 0)   # a dry run deletes none
        self.started = time.monotonic()

    @property
    def remaining(self) -> int:
        return len(self.garbage) + len(self.strays) + len(self.orphan_parts) + len(self.tombstones)

    async def step(self) -> bool:
        """Do the next batch; False when there is nothing left."""
        if self.garbage:
            batch = take(self.garbage, FRAGMENT_BATCH)
            await asyncio.gather(*(self._delete_fragment(n, f) for n, f in batch))
        elif self.strays:
            if not await self.map_unchanged():
                self.keep_strays()
                return True
            batch = take(self.strays, FRAGMENT_BATCH)
            await asyncio.gather(*(self._delete_fragment(n, f) for n, f in batch))
        elif self.orphan_parts:
            parts = take(self.orphan_parts, TOMBSTONE_BATCH)
            await asyncio.gather(*(self._forget_part(p) for p in parts))
        elif self.tombstones:
            tombs = take(self.tombstones, TOMBSTONE_BATCH)
            await asyncio.gather(*(self._tombstone(b, k) for b, k in tombs))
        else:
            return False
        self.report.seconds = time.monotonic() - self.started
        return True

    async def map_unchanged(self) -> bool:
        """Whether the newest map is still the one the strays were planned with."""
        return (await self.c.cluster_map(refresh=True)).epoch == self.cmap.epoch

    def keep_strays(self) -> None:
        """The map changed: a stray may be where a fragment now belongs (and the copy
        it was planned against moved away): keep every one left, for the next run."""
        self.report.strays_kept += len(self.strays)
        self.report.errors.append(
            f"the cluster map changed while gc ran (a ring change): {len(self.strays)} stray "
            "fragments kept; run gc again once the rebalance has settled")
        self.strays.clear()

    async def run(self) -> GcReport:
        while await self.step():
            pass
        return self.report

    async def _delete_fragment(self, node_id: str, fid: str) -> None:
        if self.dry_run:
            return
        node = self.cmap.storage_node(node_id)
        try:
            reply = await self.c.t.request("DELETE", node.address, f"/v1/fragments/{fid}",
                                           timeout_s=10)
            self.report.fragments_deleted += 1
            freed = reply.headers.get(FREED_HEADER, "")
            if freed.isdigit():     # a node of an earlier version does not say
                self.report.bytes_deleted = (self.report.bytes_deleted or 0) + int(freed)
        except NotFound:
            pass  # gone meanwhile (a client cleaned up after a failed put)
        except EcstoreError as exc:
            self.report.errors.append(f"delete {fid} on {node_id}: {exc.message}")

    async def _forget_part(self, part: RecordedPart) -> None:
        """Tombstone an orphan part record (purged by a later run, as any tombstone). It
        names no version: a record written there since is an orphan too (a part is
        recorded only after its upload was read), and orders after `part.ts` whatever the
        clocks say."""
        if self.dry_run:
            return
        try:
            await self.c.commit(PARTS_BUCKET, part.key, {"ts": max(time.time_ns(), part.ts + 1),
                                                         "version_id": new_version_id(),
                                                         "deleted": True})
            self.report.orphan_parts_forgotten += 1
        except EcstoreError as exc:
            self.report.errors.append(f"forget part record {part.key}: {exc.message}")

    async def _tombstone(self, bucket: str, key: str) -> None:
        if (bucket, key) in self.held_elsewhere:
            self.report.tombstones_held_elsewhere += 1
            return
        nodes = self.cmap.control_nodes_for(f"{bucket}/{key}")
        path = f"/v1/objects/{bucket}/{quote_key(key)}"
        answers: dict[str, dict[str, Any] | None] = {}

        async def read(node: Node) -> None:
            try:
                reply = await self.c.t.request("GET", node.address, path, ok_404=True,
                                               timeout_s=META_TIMEOUT_S)
                answers[node.id] = None if reply.status == 404 else unpack(reply.body)
            except EcstoreError as exc:
                self.report.errors.append(f"read {bucket}/{key} on {node.id}: {exc.message}")

        await asyncio.gather(*(read(n) for n in nodes))
        act = plan_tombstone([n.id for n in nodes], answers, self.now_ns, self.grace_s)
        r = self.report
        if act.reason == "young":
            r.tombstones_young += 1
        if act.purge:
            r.tombstones_purgeable += 1
        if self.dry_run or act.tombstone is None:
            return
        by_id = {n.id: n for n in nodes}
        if act.write:
            body = pack(act.tombstone)
            for nid in act.write:
                try:
                    await self.c.t.request("PUT", by_id[nid].address, path, body=body,
                                           timeout_s=META_TIMEOUT_S)
                    r.tombstones_repaired += 1
                except EcstoreError as exc:
                    r.errors.append(f"repair tombstone {bucket}/{key} on {nid}: {exc.message}")
            return
        if act.purge:
            vid = act.tombstone["version_id"]
            purged = 0
            for nid in act.purge:
                try:
                    await self.c.t.request("DELETE", by_id[nid].address, path,
                                           query={"version_id": vid}, timeout_s=META_TIMEOUT_S)
                    purged += 1
                except NotFound:
                    purged += 1
                except EcstoreError as exc:  # 409: a newer record arrived; keep the rest
                    r.errors.append(f"purge {bucket}/{key} on {nid}: {exc.message}")
                    return
            if purged == len(act.purge):
                r.tombstones_purged += 1


async def prepare_gc(c: Client, grace_s: float = DEFAULT_GRACE_S,
                     dry_run: bool = False) -> GcWorker:
    """Gather listings, then the clock, then the live records; return a worker ready to step.

    The order is what makes it safe: see the module docstring.
    """
    if grace_s < 0:
        raise ValueError("grace must be >= 0")
    cmap = await c.cluster_map(refresh=True)
    listings, errors = await all_listings(c, cmap.all_storage_nodes())
    now_ns = time.time_ns()                           # after the listings, before the records
    running, expired = await running_puts(c, now_ns)  # before the records: see the docstring
    scan = await control_scan(c, cmap)
    parts = await recorded_parts(c)      # parts before objects: see store.multipart
    uploads = await upload_ids(c) | scanned_uploads(scan)   # after the parts: see the docstring
    orphans, young_orphans = plan_orphan_parts(parts, uploads, now_ns, grace_s)
    forgotten = {(p.key, p.version_id) for p in orphans}
    live: set[str] = {r["version_id"] for rows in scan.values() for (bucket, key), r in rows.items()
                      if not r.get("deleted")   # any replica's live record is kept, bar an orphan part's
                      and not (bucket == PARTS_BUCKET and (key, r["version_id"]) in forgotten)}
    live.update(p.version_id for p in parts if (p.key, p.version_id) not in forgotten)
    live.update(running)
    homes: dict[str, frozenset[str]] = {}
    limit = cutoff(now_ns, grace_s)
    replaced: set[str] = set()   # by a tiering move younger than the grace: kept (young)
    async for _, _, rec in live_records(c, inline_bytes=False):
        live.add(rec["version_id"])
        live.update(e.version_id for e in record_extents(rec))
        homes.update(record_homes(cmap, rec))
        replaced.update(replaced_by_move(rec, limit))
    # the notes after the records: a key overwritten or deleted after the scan above and
    # before its record was read here (a multipart object's parts are in neither the scan's
    # rows nor the record read) is noted by then
    settled = await settle(c)   # the read repairs it started: a replica given a newer
    replaced |= replaced_recently(await replaced_notes(c, cmap, limit), limit)   # record notes
    replaced -= live
    garbage = plan_fragment_gc(live | replaced, listings, now_ns, grace_s)
    strays = plan_stray_gc(homes, listings, now_ns, grace_s)
    tombstones = sorted({bk for rows in scan.values() for bk, r in rows.items() if r.get("deleted")})
    worker = GcWorker(c, cmap, garbage, tombstones, now_ns, grace_s, dry_run, strays, orphans)
    if cmap.previous_control is not None and tombstones:
        # a control ring change not settled: nodes that held a key before it may still
        # hold its older records (and are not all scanned): no tombstone is purged
        worker.held_elsewhere = set(tombstones)
        worker.report.errors.append(
            f"{len(tombstones)} tombstones kept: a control ring change is not settled yet "
            "(its metadata move has not finished) - the nodes that held a key before it may "
            "still hold older records of it; run `ecstore rebalance`, then gc again")
    else:
        worker.held_elsewhere = held_elsewhere(cmap, scan, tombstones)
    if worker.held_elsewhere and cmap.previous_control is None:
        worker.report.errors.append(
            f"{len(worker.held_elsewhere)} tombstones kept: a control node that does not own "
            "the key holds a record of it (a control ring change whose metadata move has not "
            "run since, or a write made with an old map) - purged, that record would bring "
            "the object back; run `ecstore rebalance` (its metadata move drops such records), "
            "then gc again")
    worker.report.puts_running = len(running)
    if not dry_run:
        for name in expired:     # its put ended long ago: the record goes, as a tombstone
            await c.commit(PUTS_BUCKET, name, {"ts": time.time_ns(),
                                               "version_id": new_version_id(), "deleted": True})
    if strays and not await worker.map_unchanged():   # changed while the listings were read
        worker.keep_strays()
    rep = worker.report
    for fids in listings.values():
        rep.fragments_listed += len(fids)
        for fid in fids:
            kind = classify_fragment(fid, live, limit)
            if kind == "garbage" and fragment_version(fid) in replaced:
                kind = "young"
                rep.kept_replaced += 1
            if kind == "live":
                rep.kept_live += 1
            elif kind == "young":
                rep.kept_young += 1
            elif kind == "foreign":
                rep.kept_foreign += 1
    rep.fragments_garbage = len(garbage) + len(strays)
    rep.fragments_stray = len(strays)
    rep.kept_live -= len(strays)
    rep.tombstones_seen = len(tombstones)
    rep.orphan_parts, rep.orphan_parts_young = len(orphans), len(young_orphans)
    orphan_versions = {p.version_id for p in orphans} - live   # not those an object names
    rep.orphan_part_fragments = sum(fragment_version(f) in orphan_versions for _, f in garbage)
    rep.errors += errors
    if not settled:
        rep.errors.append("read repairs of the records gc read were still running 10 s "
                          "on, when it read the notes of replaced versions (a slow control "
                          "node?): an old version one of them would have had noted was not "
                          "kept for readers")
    return worker
