"""Tiering: move objects between the hot and the cold policy by how they are read.

Clients count reads per object and send the counts to the key's control nodes in batches
(`Client.flush_reads`; one request per node every few seconds, never a write per read).
A pass lists every live object with its read history and decides (pure, `decide`):
- an object on the hot policy not read for `cold_after_s` (never read: since it was
  written) is re-encoded into the cold policy (8+3 by default: 1.375x stored instead of
  1.5x, on capacity media);
- an object on the cold policy read at least `promote_reads` times within the last
  `window_s` is re-encoded into the hot policy.

A move (`move_object`) reads the object's bytes from its current fragments, writes them
as a new version under the target policy, and commits a record that keeps every field
of the old one (ETag, metadata, content type, modification time `ts`) but the version id
and the policy. The commit keeps the old `ts` and carries a later version id, so it
orders after the version it replaces and before any write that came later: a concurrent
overwrite or delete always wins and the move's fragments become garbage. The old
fragments stay until `ecstore gc` collects them (older than its grace), so a reader that
started on the old version reads to its end undisturbed.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from placement.cluster_map import ClusterMap
from store.client import Client
from store.errors import EcstoreError, Unavailable
from store.gc import version_time_ns
from store.striping import record_extents
from store.wire import unpack
from store.workers import RateLimiter, WorkReport, live_records

COLD_POLICY = "cold"
# S3's archive storage classes (a record's "storage_class"): capacity media by their
# name. Such an object is written to the cold policy where the map has one (the
# gateway, node.s3.objects), and a pass moves one that is not there (written before
# the map had a cold tier) at once and never brings it back, however often it is read.
ARCHIVE_CLASSES = frozenset({"GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"})
DEFAULT_COLD_AFTER_S = 7 * 86400.0
DEFAULT_PROMOTE_READS = 3
DEFAULT_WINDOW_S = 3600.0
ACCESS_PAGE = 1000
# what a moved multipart object keeps of each part ("part_layout"): S3's view of it
PART_LAYOUT_FIELDS = ("size", "etag", "checksums")


@dataclass(frozen=True)
class TierRules:
    cold_after_s: float = DEFAULT_COLD_AFTER_S
    promote_reads: int = DEFAULT_PROMOTE_READS
    window_s: float = DEFAULT_WINDOW_S
    hot: str = "hot"
    cold: str = COLD_POLICY


@dataclass(frozen=True)
class Usage:
    last_read: float          # unix seconds; 0 if never read
    minutes: Mapping[str, int]  # reads per minute (str(unix minute) -> count)

    def reads_since(self, since: float) -> int:
        first = int(since // 60)
        return sum(n for m, n in self.minutes.items() if int(m) >= first)


NEVER_READ = Usage(0.0, {})


def merge_usage(a: Usage, b: Usage) -> Usage:
    """Two replicas' histories of one key: each saw the same reports, or fewer."""
    minutes = dict(a.minutes)
    for m, n in b.minutes.items():
        minutes[m] = max(minutes.get(m, 0), n)
    return Usage(max(a.last_read, b.last_read), minutes)


def decide(record: Mapping[str, Any], usage: Usage, rules: TierRules, now: float) -> str | None:
    """"demote", "promote" or None for one live record (pure)."""
    if record.get("inline") is not None or record.get("deleted"):
        return None
    if record.get("storage_class") in ARCHIVE_CLASSES:   # pinned to the cold policy
        return "demote" if record.get("policy") == rules.hot else None
    last = max(usage.last_read, record["ts"] / 1e9)
    if record.get("policy") == rules.hot and now - last >= rules.cold_after_s:
        return "demote"
    if record.get("policy") == rules.cold and \
            usage.reads_since(max(now - rules.window_s, moved_at(record))) >= rules.promote_reads:
        return "promote"
    return None


def moved_at(record: Mapping[str, Any]) -> float:
    """When a pass moved the object to its policy (unix s; its version id's time), 0 for
    one written there. Reads from before a demotion do not promote it back: with
    `cold_after_s` under `window_s` an object read a few times and then left alone was
    demoted and promoted by turns, rewritten at every pass."""
    if not record.get("tiered_from"):
        return 0.0
    return version_time_ns(record["version_id"]) / 1e9


def stored_bytes(record: Mapping[str, Any], replicas: int) -> int:
    """Bytes on disk for the object's data: size x (k+m)/k; inline, size x `replicas` (a
    copy in each of the record's control nodes: the map's effective_replicas)."""
    if record.get("inline") is not None:
        return int(record["size"]) * replicas
    return int(record["size"] * (record["k"] + record["m"]) / record["k"])


async def bucket_usage(c: Client, bucket: str) -> dict[str, Usage]:
    """Every key's read history in one bucket, merged over the control nodes."""
    cmap = await c.cluster_map()
    nodes = {n.id: n for n in cmap.control.nodes}
    if cmap.previous_control is not None:
        nodes.update({n.id: n for n in cmap.previous_control.nodes})
    out: dict[str, Usage] = {}

    async def one(node: Any) -> None:
        after = ""
        while True:
            reply = await c.t.request("GET", node.address, f"/v1/access/{bucket}",
                                      query={"after": after, "limit": ACCESS_PAGE},
                                      timeout_s=30)
            body = unpack(reply.body)
            for r in body["records"]:
                u = Usage(float(r["last"]), {str(m): int(n) for m, n in r["minutes"].items()})
                out[r["key"]] = merge_usage(out[r["key"]], u) if r["key"] in out else u
            if not body["truncated"] or not body["records"]:
                return
            after = body["records"][-1]["key"]

    results = await asyncio.gather(*(one(n) for n in nodes.values()), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if len(failed) == len(results):
        raise Unavailable(f"no control node answered the read history of {bucket}",
                          tried=len(results), failed=len(failed))
    return out


@dataclass
class TierEntry:
    bucket: str
    key: str
    record: dict[str, Any]
    action: str                      # "demote" or "promote"


@dataclass
class TierStatus:
    """Objects and bytes per policy, and what a pass would move now."""

    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    due: list[TierEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        due: dict[str, dict[str, int]] = {}
        for e in self.due:
            d = due.setdefault(e.action, {"objects": 0, "bytes": 0})
            d["objects"] += 1
            d["bytes"] += int(e.record["size"])
        return {"tiers": self.tiers, "due": due}


async def tier_status(c: Client, rules: TierRules, now: float | None = None) -> TierStatus:
    now = time.time() if now is None else now
    cmap = await c.cluster_map()
    status = TierStatus()
    usage: dict[str, dict[str, Usage]] = {}
    async for bucket, key, record in live_records(c):
        if bucket not in usage:
            usage[bucket] = await bucket_usage(c, bucket)
        name = "inline" if record.get("inline") is not None else str(record.get("policy"))
        row = status.tiers.setdefault(name, {"objects": 0, "bytes": 0, "stored_bytes": 0})
        row["objects"] += 1
        row["bytes"] += int(record["size"])
        row["stored_bytes"] += stored_bytes(record, cmap.effective_replicas)
        action = decide(record, usage[bucket].get(key, NEVER_READ), rules, now)
        if action is not None and has_policy(cmap, rules.cold if action == "demote" else rules.hot):
            status.due.append(TierEntry(bucket, key, record, action))
    return status


def has_policy(cmap: ClusterMap, name: str) -> bool:
    """Whether the map has a policy of that name (a cold one only where cold nodes are)."""
    return any(p.name == name for p in cmap.policies)


async def move_object(c: Client, bucket: str, key: str, record: dict[str, Any],
                      policy: str, cache: bool = True) -> bool:
    """Re-encode one object's current version into `policy` and commit it. True if the
    move is now the object's record; False if a newer write won meanwhile. `cache=False`
    (a demotion: nobody is reading it) reads and writes it uncached (Client.get_stream's
    and Client.put's)."""
    cmap = await c.cluster_map()
    pol = cmap.policy(policy)
    source = c.get_stream(bucket, key, record=record, note_read=False, cache=cache)
    ext = await c.write_extent(pol, bucket, key, source, cache=cache)
    if ext["size"] != record["size"]:
        raise EcstoreError(f"{bucket}/{key}: read {ext['size']} bytes of {record['size']}")
    new = {k: v for k, v in record.items() if k != "parts"}
    if record.get("parts"):
        # the data is one extent now, but S3 still sees the parts the object was
        # completed from (GET and HEAD ?partNumber, x-amz-mp-parts-count, each part's
        # checksums): until the twenty-seventh session they went with "parts", and a
        # part number past 1 answered 416, part 1 the whole object
        new["part_layout"] = [{f: p[f] for f in PART_LAYOUT_FIELDS if f in p}
                              for p in record["parts"]]
    # an object the client library wrote has no MD5 ETag: its version id stands in (S3,
    # fsspec), and the move changes the version id - so it is kept as the ETag, which a
    # move keeps (If-Match, If-Range and caches went on seeing a new object)
    new.setdefault("etag", record["version_id"])
    new.update(version_id=ext["version_id"], policy=pol.name, k=pol.k, m=pol.m,
               ec_type=pol.ec_type, segment_size=pol.segment_size_bytes,
               segments=ext["segments"], handoffs=ext["handoffs"], epoch=cmap.epoch,
               tiered_from=record["version_id"],
               # the versions whose fragments held the data until now: gc keeps them for
               # its grace after the move (a reader that started on them reads on)
               tiered_from_versions=sorted({e.version_id for e in record_extents(record)}))
    await c.commit(bucket, key, new)   # same ts, later version id: see the module doc
    now = await c.read_record(bucket, key)
    return now is not None and now.get("version_id") == ext["version_id"]


@dataclass
class TierReport(WorkReport):
    demoted: int = 0
    promoted: int = 0
    bytes_moved: int = 0
    superseded: int = 0              # a newer write won the race: nothing to do
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False            # then the counts are what a pass would do; no rate

    def to_dict(self) -> dict[str, Any]:
        rate = None if self.dry_run else self.mb_s(self.bytes_moved)
        return {**super().to_dict(), "moved_mb_s": rate}


class TierWorker:
    """Moves one object per step()."""

    def __init__(self, c: Client, status: TierStatus, rules: TierRules,
                 dry_run: bool = False, rate_mb_s: float = 0.0) -> None:
        self.c, self.rules, self.dry_run = c, rules, dry_run
        self.todo = deque(status.due)     # popleft: a list's pop(0) is O(n) a step
        self.limiter = RateLimiter(rate_mb_s)
        self.report = TierReport(dry_run=dry_run)
        self.started = time.monotonic()

    @property
    def remaining(self) -> int:
        return len(self.todo)

    async def _superseded(self, e: TierEntry) -> bool:
        """Whether the object is no longer the version the pass listed."""
        try:
            now = await self.c.read_record(e.bucket, e.key)
        except EcstoreError:
            return False
        if now is not None and now.get("tiered_from") == e.record["version_id"]:
            return False    # the move's own commit, which said it failed: not a newer write
        return now is None or bool(now.get("deleted")) or \
            now.get("version_id") != e.record["version_id"]

    async def step(self) -> bool:
        if not self.todo:
            return False
        e = self.todo.popleft()
        r = self.report
        target = self.rules.cold if e.action == "demote" else self.rules.hot
        try:
            if not self.dry_run:
                await self.limiter.spend(int(e.record["size"]))
                if not await move_object(self.c, e.bucket, e.key, e.record, target,
                                         cache=e.action != "demote"):
                    r.superseded += 1
                    return True
            r.bytes_moved += int(e.record["size"])
            if e.action == "demote":
                r.demoted += 1
            else:
                r.promoted += 1
        except EcstoreError as exc:
            if await self._superseded(e):   # overwritten or deleted meanwhile (and its
                r.superseded += 1           # old version collected): nothing to move
                return True
            r.failed += 1
            said = str(exc)
            r.errors.append(said if said.startswith(f"{e.bucket}/{e.key}") else
                            f"{e.bucket}/{e.key}: {said}")
        finally:
            r.seconds = time.monotonic() - self.started
        return True
