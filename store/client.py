"""The async Client and its synchronous wrapper.

Put: cut the bytes into segments, encode each with pyeclib into k+m fragments, PUT them
in parallel to the nodes the map names for (version_id, segment) (a handoff node takes a
fragment whose node fails), then commit the metadata record with a write quorum.
Get: read the record with a read quorum, fetch the k data fragments of each needed
segment, fall back to parity on any error (degraded read), decode, slice.
"""
from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import json
import os
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Protocol, TypeVar, overload

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from placement.policy import Policy
from store import codec
from store.auth import CHECKSUM_HEADER
from store.cache import SegmentCache
from store.cluster import ClusterInfo
from store.crc import crc32
from store.digest import digest
from store.digest import matches as digest_matches
from store.errors import (
    BadRequest,
    Conflict,
    Corrupt,
    EcstoreError,
    NotFound,
    Unavailable,
    Unreachable,
)
from store.listing import ListResult, merge_listing
from store.metadata import MetaQuorum, effective_quorums, first_answers
from store.names import PUTS_BUCKET, SYSTEM_BUCKETS, check_bucket_name, check_key, check_new_key
from store.striping import Extent, extent_slices, fragment_id, plan_fetches, record_extents, resolve_range
from store.transport import LoopBound, Transport, operation, quote_key, retrieved, traced_stream
from store.wire import (
    FRAGMENT_CRC_HEADER,
    FRAGMENT_META_HEADER,
    UNCACHED,
    UNCACHED_HEADER,
    pack,
    pack_header,
    unpack,
)

if TYPE_CHECKING:
    from store.client_sync import SyncClient as SyncClient

FRAGMENT_TIMEOUT_S = 30.0
STRAGGLER_MIN_S = 2.0          # a fragment put this far behind its segment's k-th goes to a handoff
STRAGGLER_FACTOR = 3.0         # ... or this many times what the k-th took, if longer
HEDGE_MIN_S = 0.05             # a fragment get slower than the hedge delay brings in one more
HEDGE_MAX_S = 1.0
HEDGE_DEFAULT_S = 0.25         # until latencies have been seen
CACHE_LOCK_WAIT_S = 60.0       # longest wait for another process's fetch of a segment
DEFAULT_CACHE_MAX_MB = 10 * 1024
PREFETCH_SEGMENTS = 2          # a sequential reader with a cache gets this many more fetched
MAX_PREFETCHES = 8             # in flight per client
READS_FLUSH_S = 5.0            # read counts are sent to the control nodes this often
MAX_PENDING_READS = 50_000     # ... or at once when this many objects have been read
READS_PER_REQUEST = 5_000
SUSPECT_S = 10.0               # a node found stalled is passed over this long, then tried again
DOWN_S = 3.0                   # one that refused a connection: its fragments are read last
DEFAULT_SEGMENT_SLOTS = 32     # segments in memory across all of a client's puts and gets
MAX_INFLIGHT_SEGMENTS = 4      # put pipeline depth: memory ~ this x segment x (k+m)/k
VERIFY_AFTER_S = 30.0          # a put running longer checks its fragments before the commit
INTENT_AFTER_S = 20.0          # a put running this long tells gc so (PUTS_BUCKET) ...
INTENT_REFRESH_S = 40.0        # ... again this often while it runs ...
INTENT_TTL_S = 120.0           # ... each telling good for this long
VERIFY_PARALLEL = 32           # fragment HEADs in flight for that check
READAHEAD_SEGMENTS = 2         # get stream read-ahead
MAX_USER_META_BYTES = 2048
BUCKET_CACHE_TTL_S = 5.0
MAP_TTL_S = 2.0                # how long a client trusts its cluster map before asking again
T = TypeVar("T")
Source = (bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
          | AsyncIterator[bytes] | AsyncIterator[bytes | memoryview])


def new_version_id() -> str:
    """Unique and time ordered: 16 hex digits of ns time, 16 random hex digits."""
    return f"{time.time_ns():016x}{secrets.token_hex(8)}"


class _Slot(Protocol):
    """A segment's place in memory (Client.segment_slots), given back once."""

    def release(self) -> None: ...


class _NoBound:
    """The slot of a client whose segment_slots is None."""

    def release(self) -> None:
        pass


NO_BOUND = _NoBound()


@dataclass(frozen=True)
class ObjectInfo:
    bucket: str
    key: str
    size: int
    version_id: str
    ts: int
    content_type: str = "application/octet-stream"
    meta: dict[str, str] = field(default_factory=dict)
    policy: str = ""
    inline: bool = False

    @staticmethod
    def from_record(bucket: str, key: str, r: dict[str, Any]) -> "ObjectInfo":
        return ObjectInfo(bucket, key, r["size"], r["version_id"], r["ts"],
                          r.get("content_type") or "application/octet-stream",
                          dict(r.get("meta") or {}), r.get("policy", ""),
                          r.get("inline") is not None)


class Client(LoopBound):
    """Async client. Use `async with Client.connect(path) as c:` or call `close()`.

    It may be used from one event loop after another (asyncio.run twice): its
    connections and pending work belong to the loop that ran them, and are dropped when
    a new loop takes it over; not from two running loops at once (WrongEventLoop)."""

    def __init__(self, info: ClusterInfo, cache_dir: str | os.PathLike[str] | None = None,
                 cache_max_bytes: int | None = None) -> None:
        """`cache_dir`: keep decoded segments on local disk (see store/cache.py), shared
        with every process using the same directory, at most `cache_max_bytes`
        (default $ECSTORE_CACHE_MAX_MB MiB, else 10 GiB). Default: $ECSTORE_CACHE_DIR,
        else no disk cache."""
        self.info = info
        self.t = Transport(info.secret)
        self.background: set[asyncio.Future[Any]] = set()
        # failures that a reader or writer got past (or not), for the gateway's /metrics
        self.fault_stats = {"degraded_reads": 0, "checksum_failures": 0,
                            "metadata_quorum_failures": 0}
        self.meta: MetaQuorum = _CountedQuorum(self.t, self.background, self.fault_stats)
        self._map: ClusterMap | None = None
        self._map_at = 0.0
        self._decoded: tuple[bytes, ClusterMap] | None = None   # the last map bytes decoded
        self._map_fetch: asyncio.Future[ClusterMap] | None = None
        self._buckets_seen: dict[str, tuple[float, dict[str, Any]]] = {}  # when, its record
        # A bound on segments held in memory across every put and get of this client (the
        # gateway sets its own); None: each put or get is bounded on its own only.
        self.segment_slots: asyncio.Semaphore | None = asyncio.Semaphore(DEFAULT_SEGMENT_SLOTS)
        self._slots_total: int | None = DEFAULT_SEGMENT_SLOTS   # as set_segment_slots() set it
        self._fetch_times: deque[float] = deque(maxlen=200)  # recent fragment gets, seconds
        self._suspect: dict[str, float] = {}  # node id -> until when it is passed over
        cache_dir = cache_dir or os.environ.get("ECSTORE_CACHE_DIR") or None
        if cache_max_bytes is None:
            cache_max_bytes = int(float(os.environ.get("ECSTORE_CACHE_MAX_MB") or
                                        DEFAULT_CACHE_MAX_MB) * 2**20)
        self.cache = SegmentCache(cache_dir, cache_max_bytes) if cache_dir else None
        self._segment_fetches: dict[str, asyncio.Future[bytes | memoryview]] = {}  # coalescing
        self._last_segment: OrderedDict[str, int] = OrderedDict()  # version -> last read
        self._prefetches = 0
        # what reached the cluster and what did not, for tests and benchmarks
        self.read_stats = {"segments_fetched": 0, "fragment_gets": 0, "coalesced": 0,
                           "cache_hits": 0, "prefetched": 0}
        # reads per object, reported to the control nodes in batches (tiering uses them)
        self.track_reads = os.environ.get("ECSTORE_TRACK_READS", "1") != "0"
        self._reads: dict[tuple[str, str], list[float]] = {}   # -> [count, last unix s]
        self._reads_flush: asyncio.Future[None] | None = None

    @classmethod
    def connect(cls, cluster: str | os.PathLike[str] | ClusterInfo | None = None,
                **cache: Any) -> "Client":
        """`cache`: cache_dir and cache_max_bytes, as for Client()."""
        return cls(cluster if isinstance(cluster, ClusterInfo) else ClusterInfo.load(cluster),
                   **cache)

    async def __aenter__(self) -> "Client":
        await self.cluster_map()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_segment_slots(self, n: int | None) -> None:
        """At most `n` segments in memory across every put and get (None: no bound)."""
        self.segment_slots = None if n is None else asyncio.Semaphore(n)
        self._slots_total = n

    def rebind(self) -> None:
        """Its previous event loop has stopped: what was on its way there is gone with it
        (asyncio.run cancelled it), so start from fresh connections, queues and slots on
        the running one. The cluster map, caches and counters carry over."""
        self.t.forget()
        self.background.clear()
        self.meta.forget()
        self._map_fetch = None
        self._segment_fetches.clear()
        self._reads_flush = None      # the reads counted meanwhile go with the next flush
        self.set_segment_slots(self._slots_total)

    async def close(self) -> None:
        self.on_loop()
        if self._reads_flush is not None:
            self._reads_flush.cancel()
        if self._reads:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flush_reads(), 3.0)
        if self.background:
            await asyncio.wait(set(self.background), timeout=2.0)
        await self.t.close()

    # ---- cluster map -------------------------------------------------------------
    @operation
    async def cluster_map(self, refresh: bool = False) -> ClusterMap:
        """The newest map any control node holds, fetched again after MAP_TTL_S."""
        fresh = time.monotonic() - self._map_at < MAP_TTL_S
        if self._map is not None and fresh and not refresh:
            return self._map
        if self._map_fetch is None or self._map_fetch.done():
            self._map_fetch = asyncio.ensure_future(self._fetch_newest_map())
            self._map_fetch.add_done_callback(retrieved)
        if self._map is not None and not refresh:
            return self._map  # stale while revalidating: the fetch never delays a request
        try:
            return await asyncio.shield(self._map_fetch)
        except Unavailable:
            if self._map is not None and not refresh:
                return self._map  # keep working on the last map while control nodes are away
            raise

    async def _fetch_newest_map(self) -> ClusterMap:
        urls = {*self.info.control}
        if self._map is not None:
            urls |= {n.address for n in self._map.control.nodes}
        maps = await first_answers([self._fetch_map(url) for url in sorted(urls)],
                                   len(urls) // 2 + 1)
        good = [m for m in maps if isinstance(m, ClusterMap)]
        if not good:
            raise Unavailable("no control node answered with a cluster map",
                              tried=len(maps), failed=len(maps))
        best = max(good, key=lambda m: m.epoch)
        if self._map is None or best.epoch >= self._map.epoch:
            self._map = best
        self._map_at = time.monotonic()
        return self._map

    @property
    def map_epoch(self) -> int:
        """The epoch of the map this client holds now (0: none yet); never fetches."""
        return self._map.epoch if self._map is not None else 0

    @operation
    async def publish_map(self, new: ClusterMap) -> list[str]:
        """Give `new` to every control node (old and new); a majority of the new map's
        control nodes must accept it. Returns the ids of nodes that did not."""
        old = await self.cluster_map(refresh=True)
        if new.epoch <= old.epoch:
            raise Conflict(f"map epoch {new.epoch} is not newer than {old.epoch}")
        nodes = {n.id: n for n in (*old.control.nodes, *new.control.nodes)}
        body = new.to_bytes()
        results = await asyncio.gather(*(
            self.t.request("PUT", n.address, "/v1/map", body=body, timeout_s=10.0)
            for n in nodes.values()), return_exceptions=True)
        failed = [i for i, r in zip(nodes, results) if isinstance(r, BaseException)]
        accepted = sum(1 for n in new.control.nodes if n.id not in failed)
        if accepted < len(new.control.nodes) // 2 + 1:
            raise Unavailable(f"only {accepted} of {len(new.control.nodes)} control nodes took "
                              f"map epoch {new.epoch}", tried=len(nodes), failed=len(failed))
        self._map, self._map_at = new, time.monotonic()
        return failed

    async def _fetch_map(self, url: str) -> ClusterMap:
        """A control node's map; the same bytes as the last decoded are not decoded again
        (the map is fetched from a majority every MAP_TTL_S and rarely changes: decoding
        and checking the rings is ~2 ms per fetch)."""
        reply = await self.t.request("GET", url, "/v1/map", timeout_s=5.0)
        last = self._decoded
        if last is not None and reply.body == last[0]:
            return last[1]
        cmap = ClusterMap.from_bytes(reply.body)
        self._decoded = bytes(reply.body), cmap
        return cmap

    # ---- buckets -------------------------------------------------------------------
    @operation
    async def create_bucket(self, bucket: str, **fields: Any) -> None:
        """Create a bucket; `fields` (e.g. owner, acl) are kept in its record."""
        check_bucket_name(bucket)
        if fields.get("policy") is not None:  # the default policy of the bucket's objects
            self.policy_of(await self.cluster_map(), fields["policy"])
        if await self._bucket_record(bucket) is not None:
            raise Conflict(f"bucket {bucket} already exists")
        record = {**fields, "deleted": False, "created": time.time()}
        await self._write_bucket(bucket, record)
        self._buckets_seen[bucket] = (time.monotonic(), record)

    @operation
    async def bucket_record(self, bucket: str) -> dict[str, Any]:
        """The bucket's record (created, owner, acl ...). Raises NotFound."""
        check_bucket_name(bucket)
        rec = await self._bucket_record(bucket)
        if rec is None:
            raise NotFound(f"no such bucket: {bucket}")
        return rec

    @operation
    async def update_bucket(self, bucket: str, **fields: Any) -> None:
        """Change fields of an existing bucket's record (e.g. its acl)."""
        rec = await self.bucket_record(bucket)
        after = rec["ts"] + 1  # newer than the record it changes, whatever this clock says
        rec = {k: v for k, v in rec.items() if k not in ("ts", "version_id")}
        await self._write_bucket(bucket, {**rec, **fields, "deleted": False}, after)

    @operation
    async def list_bucket_records(self) -> builtins.list[dict[str, Any]]:
        """Every live bucket's record with its "name", sorted by name."""
        rows = await self._bucket_rows()
        return [r for _, r in sorted(rows.items()) if not r["deleted"]]

    @operation
    async def delete_bucket(self, bucket: str) -> None:
        rec = await self.bucket_record(bucket)
        if (await self.list(bucket, max_keys=1)).objects:
            raise Conflict(f"bucket {bucket} is not empty")
        await self._write_bucket(bucket, {"deleted": True}, rec["ts"] + 1)
        self._buckets_seen.pop(bucket, None)

    @operation
    async def list_buckets(self) -> builtins.list[str]:
        return sorted(name for name, r in (await self._bucket_rows()).items() if not r["deleted"])

    async def _bucket_rows(self) -> dict[str, dict[str, Any]]:
        cmap = await self.cluster_map()
        nodes = cmap.control.nodes
        replies = await first_answers(
            [self.t.request("GET", n.address, "/v1/buckets", timeout_s=5.0) for n in nodes],
            len(nodes) // 2 + 1)
        good = [unpack(r.body)["buckets"] for r in replies if not isinstance(r, BaseException)]
        if len(good) < len(nodes) // 2 + 1:
            raise Unavailable("too few control nodes answered the bucket listing",
                              tried=len(nodes), failed=len(nodes) - len(good))
        best: dict[str, dict[str, Any]] = {}
        for rows in good:
            for r in rows:
                cur = best.get(r["name"])
                if cur is None or (r["ts"], r["version_id"]) > (cur["ts"], cur["version_id"]):
                    best[r["name"]] = r
        return best

    async def _write_bucket(self, bucket: str, fields: dict[str, Any], after: int = 0) -> None:
        cmap = await self.cluster_map()
        nodes = cmap.control.nodes
        record = {"ts": max(time.time_ns(), after), "version_id": new_version_id(), **fields}
        await self.meta.write(nodes, f"/v1/buckets/{bucket}", record, len(nodes) // 2 + 1)

    async def _bucket_record(self, bucket: str) -> dict[str, Any] | None:
        cmap = await self.cluster_map()
        nodes = cmap.control.nodes
        rec = await self.meta.read(nodes, f"/v1/buckets/{bucket}", len(nodes) // 2 + 1)
        return None if rec is None or rec["deleted"] else rec

    async def _require_bucket(self, bucket: str, cached: bool = True) -> dict[str, Any]:
        """The bucket's record (cached for BUCKET_CACHE_TTL_S); NotFound."""
        check_bucket_name(bucket)
        seen = self._buckets_seen.get(bucket)
        if cached and seen is not None and time.monotonic() - seen[0] < BUCKET_CACHE_TTL_S:
            return seen[1]
        rec = await self._bucket_record(bucket)
        if rec is None:
            raise NotFound(f"no such bucket: {bucket}")
        self._buckets_seen[bucket] = (time.monotonic(), rec)
        return rec

    @staticmethod
    def policy_of(cmap: ClusterMap, name: str | None) -> Policy:
        """The map's policy `name` (None: the map's default); BadRequest naming the map's
        policies when it has none of that name."""
        try:
            return cmap.policy(name)
        except KeyError:
            raise BadRequest(f"no storage policy {name!r} (the map has "
                             f"{', '.join(p.name for p in cmap.policies)})") from None

    # ---- put -------------------------------------------------------------------------
    @operation
    async def put(self, bucket: str, key: str, source: Source, *,
                  content_type: str = "application/octet-stream",
                  meta: dict[str, str] | None = None, policy: str | None = None,
                  extra: Callable[[], dict[str, Any]] | None = None,
                  cache: bool = True) -> ObjectInfo:
        """Store an object from bytes, a file path, a binary file or an async iterator.

        Memory stays bounded by MAX_INFLIGHT_SEGMENTS segments whatever the size.
        `extra`, called once every byte is read and before the commit, gives more record
        fields (the gateway's ETag and headers); if it raises, nothing is committed.
        `cache=False`: the storage nodes write the fragments without keeping them in their
        page cache (a checkpoint nobody reads back soon must not push the data set out;
        Linux 6.14+, else as usual); as durable either way, and a read caches them.
        Raises NotFound (no bucket), BadRequest, Unavailable (too few nodes).
        """
        check_new_key(key)
        meta = dict(meta or {})
        if user_meta_bytes(meta) > MAX_USER_META_BYTES:
            raise BadRequest(f"user metadata larger than {MAX_USER_META_BYTES} bytes")
        brec = await self._require_bucket(bucket)
        cmap = await self.cluster_map()
        pol = self.policy_of(cmap, policy or brec.get("policy"))
        vid = new_version_id()
        record: dict[str, Any] = {
            "ts": time.time_ns(), "version_id": vid, "deleted": False,
            "content_type": content_type, "meta": meta, "policy": pol.name, "k": pol.k,
            "m": pol.m, "ec_type": pol.ec_type, "segment_size": pol.segment_size_bytes,
            "epoch": cmap.epoch, "inline": None, "handoffs": {},
        }
        segments = _segments(source, pol.segment_size_bytes)
        slot = await self._take_slot()  # before reading: waiting for a slot holds no bytes
        try:
            pre = [await anext(segments, b"")]
            if len(pre[0]) == pol.segment_size_bytes <= cmap.inline_max_bytes:
                pre += [s async for s in _take(segments, 1)]  # tiny segments: one more?
        except BaseException:
            slot.release()
            raise
        if len(pre) == 1 and len(pre[0]) <= cmap.inline_max_bytes:
            slot.release()
            record.update(size=len(pre[0]), inline=bytes(pre[0]), segments=0)
        else:
            size, count = await self._put_segments(cmap, pol, bucket, key, vid, record,
                                                   _chain(pre, segments), slot=slot,
                                                   cache=cache)
            record.update(size=size, segments=count)
        if extra is not None:
            fields = extra()
            assert not set(fields) & {"ts", "version_id", "deleted", "size", "segments"}
            record.update(fields)
        record["ts"] = max(record["ts"], time.time_ns())
        await self._commit(cmap, bucket, key, record)
        return ObjectInfo.from_record(bucket, key, record)

    @operation
    async def commit(self, bucket: str, key: str, record: dict[str, Any]) -> None:
        """Write a whole record for bucket/key with the write quorum (the commit point)."""
        await self._commit(await self.cluster_map(), bucket, key, record)

    @operation
    async def write_extent(self, pol: Policy, bucket: str, key: str,
                           source: Source, cache: bool = True) -> dict[str, Any]:
        """Encode and place `source` under a new version id without committing anything
        (a multipart part, a tier move). Returns {"version_id", "size", "segments",
        "handoffs"}. `cache`: as put's."""
        cmap = await self.cluster_map()
        vid = new_version_id()
        rec: dict[str, Any] = {"handoffs": {}}
        size, count = await self._put_segments(cmap, pol, bucket, key, vid, rec,
                                               _segments(source, pol.segment_size_bytes),
                                               cache=cache)
        return {"version_id": vid, "size": size, "segments": count, "handoffs": rec["handoffs"]}

    async def _commit(self, cmap: ClusterMap, bucket: str, key: str,
                      record: dict[str, Any]) -> None:
        nodes = cmap.control_nodes_for(f"{bucket}/{key}")
        w, _ = effective_quorums(cmap, len(nodes))
        try:
            await self.meta.write(nodes, meta_path(bucket, key), record, w, (bucket, key))
        except Unavailable as exc:  # some replica may hold it: a later read may repair it in
            raise Unavailable(f"{exc.message}; the outcome of this write is unknown (it may "
                              "still appear)", **exc.details, outcome="unknown") from None

    async def _put_segments(self, cmap: ClusterMap, pol: Policy, bucket: str, key: str,
                            vid: str, record: dict[str, Any], segments: AsyncIterator[bytes],
                            slot: _Slot | None = None, cache: bool = True) -> tuple[int, int]:
        """`slot`: the one the caller took for the first segment; `cache`: as put's."""
        size = count = 0
        inflight: set[asyncio.Future[None]] = set()
        written: list[tuple[str, Node]] = []
        started = time.monotonic()
        # a timer, not a task per put: most puts end long before INTENT_AFTER_S
        announcer: list[asyncio.Future[None]] = []
        timer = asyncio.get_running_loop().call_later(
            INTENT_AFTER_S,
            lambda: announcer.append(asyncio.ensure_future(self._announce(bucket, key, vid))))
        try:
            while True:
                if len(inflight) >= MAX_INFLIGHT_SEGMENTS:
                    done, inflight = await asyncio.wait(inflight,
                                                        return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
                if slot is None:
                    slot = await self._take_slot()  # before reading: it bounds the bytes read
                try:
                    seg = await anext(segments, None)
                except BaseException:
                    slot.release()
                    raise
                if seg is None:
                    slot.release()
                    break
                task = asyncio.ensure_future(self._put_segment(
                    cmap, pol, bucket, key, vid, count, seg, record["handoffs"], written,
                    cache))
                task.add_done_callback(functools.partial(_segment_done, slot))
                slot = None
                inflight.add(task)
                size += len(seg)
                count += 1
                del seg  # the task holds it until placed: waiting here must not
            for task in asyncio.as_completed(inflight):
                await task
            if time.monotonic() - started > VERIFY_AFTER_S:
                await self._check_written(vid, written)
        except BaseException:
            for task in inflight:
                task.cancel()
            self._spawn(self._delete_fragments(written))
            raise
        finally:    # the last telling stays good INTENT_TTL_S: past the caller's commit
            timer.cancel()
            for task in announcer:
                task.cancel()
        return size, count

    async def _announce(self, bucket: str, key: str, vid: str) -> None:
        """Tell gc that this put runs (started once it has run INTENT_AFTER_S), and again
        every INTENT_REFRESH_S: a record PUTS_BUCKET/vid good until INTENT_TTL_S later, which
        gc reads before the object records (store.gc) and whose version it keeps - a put
        longer than gc's grace keeps its fragments. Best effort: without it (control
        nodes unreachable) the put goes on, and checks its fragments before its commit."""
        while True:
            now = time.time_ns()
            with contextlib.suppress(EcstoreError):
                await self.commit(PUTS_BUCKET, vid, {
                    "ts": now, "version_id": new_version_id(), "deleted": False,
                    "bucket": bucket, "key": key, "put_version": vid,
                    "until_ns": now + int(INTENT_TTL_S * 1e9)})
            await asyncio.sleep(INTENT_REFRESH_S)

    async def _check_written(self, vid: str, written: list[tuple[str, Node]]) -> None:
        """Unavailable unless every fragment a long put wrote is still on its node: gc
        takes the fragments of a version that is not committed and older than its grace
        for a dead put's, so a put running longer than the grace would otherwise be
        committed without them - acknowledged and unreadable."""
        sem = asyncio.Semaphore(VERIFY_PARALLEL)

        async def there(fid: str, node: Node) -> bool:
            async with sem:
                reply = await self.t.request("HEAD", node.address, f"/v1/fragments/{fid}",
                                             ok_404=True, timeout_s=FRAGMENT_TIMEOUT_S)
                return reply.status != 404
        found = await asyncio.gather(*(there(f, n) for f, n in written))
        gone = found.count(False)
        if gone:
            raise Unavailable(f"{gone} of the {len(written)} fragments of version {vid} were "
                              "deleted while the put ran (a gc whose grace is shorter than "
                              "the put?): nothing is committed; put it again",
                              tried=len(written), failed=gone)

    async def _put_segment(self, cmap: ClusterMap, pol: Policy, bucket: str, key: str,
                           vid: str, seg: int, data: bytes, handoffs: dict[str, str],
                           written: list[tuple[str, Node]], cache: bool = True) -> None:
        """Place the k+m fragments of one segment on k+m distinct nodes.

        A fragment whose node fails, or lags far behind the others (a stalled node), goes
        to the next node of the row (a handoff, recorded in the record). If no node is
        left for a fragment the segment fails: a put is acknowledged only when every
        fragment is durable on its own node, so it survives the loss of any m nodes.
        """
        frags = codec.encode(pol.k, pol.m, pol.ec_type, data)
        del data  # only the fragments are needed from here on
        ring = cmap.storage_ring(pol.tier)
        row = ring.locate(f"{vid}/{seg}", len(ring.nodes))
        primaries, spares = list(row[:pol.n]), list(row[pol.n:])
        attempts: dict[asyncio.Future[None], tuple[int, Node]] = {}
        errors: list[str] = []
        lost: list[int] = []
        placed = 0
        start = time.monotonic()
        deadline: float | None = None   # set once k fragments are placed: for stragglers

        def attempt(i: int, node: Node) -> None:
            meta = {"bucket": bucket, "key": key, "version_id": vid, "segment": seg, "index": i}
            task = asyncio.ensure_future(
                self.put_fragment(node, fragment_id(vid, seg, i), frags[i], meta, cache))
            attempts[task] = (i, node)

        def next_node(i: int, why: str, node: Node) -> None:
            errors.append(f"{node.id}: {why}")
            if spares:
                attempt(i, spares.pop(0))
            else:
                lost.append(i)

        for i, node in enumerate(primaries):
            if self._is_suspect(node) and spares:  # stalled a moment ago: a handoff at once
                next_node(i, "stalled recently", node)
            else:
                attempt(i, node)
        try:
            while attempts and not lost:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait(attempts, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:  # stragglers: give their fragments to handoff nodes
                    late = list(attempts.items())
                    attempts.clear()
                    for task, (i, node) in late:
                        _drop(task)
                        self._mark_suspect(node)
                        next_node(i, "too slow", node)
                    deadline = time.monotonic() + self._straggler_grace(start)
                    continue
                for task in done:
                    i, node = attempts.pop(task)
                    exc = task.exception()
                    if exc is None:
                        written.append((fragment_id(vid, seg, i), node))
                        if node is not primaries[i]:
                            handoffs[f"{seg}.{i}"] = node.id
                        placed += 1
                    elif isinstance(exc, EcstoreError):
                        next_node(i, str(exc), node)
                    else:
                        raise exc
                if deadline is None and placed >= pol.k:
                    deadline = time.monotonic() + self._straggler_grace(start)
        finally:
            for task in attempts:
                _drop(task)
        if lost:
            raise Unavailable(f"segment {seg} of {vid}: fragment {lost[0]} could not be "
                              f"written to any node", tried=len(errors), failed=len(errors),
                              errors=errors[:4])

    def _is_suspect(self, node: Node) -> bool:
        until = self._suspect.get(node.id)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._suspect[node.id]
        return False

    def _mark_suspect(self, node: Node, for_s: float = SUSPECT_S) -> None:
        self._suspect[node.id] = max(self._suspect.get(node.id, 0.0), time.monotonic() + for_s)

    @staticmethod
    def _straggler_grace(start: float) -> float:
        """How long a fragment put may lag once k of its segment are placed."""
        return max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * (time.monotonic() - start))

    @operation
    async def put_fragment(self, node: Node, fid: str, body: bytes | bytearray | memoryview,
                           meta: dict[str, Any], cache: bool = True) -> None:
        """`cache=False`: the node writes it without keeping it in its page cache
        (UNCACHED_HEADER)."""
        checksum = digest(body)
        meta = {**meta, "crc32": crc32(body)}   # what readers check (FRAGMENT_CRC_HEADER)
        headers = {FRAGMENT_META_HEADER: pack_header(meta)}
        if not cache:
            headers[UNCACHED_HEADER] = UNCACHED
        await self.t.request("PUT", node.address, f"/v1/fragments/{fid}", body=body,
                             checksum=checksum, timeout_s=FRAGMENT_TIMEOUT_S, headers=headers)

    async def _delete_fragments(self, written: list[tuple[str, Node]]) -> None:
        """Best effort; garbage collection removes whatever this misses."""
        async def one(fid: str, node: Node) -> None:
            try:
                await self.t.request("DELETE", node.address, f"/v1/fragments/{fid}",
                                     timeout_s=5.0)
            except EcstoreError:
                pass
        await asyncio.gather(*(one(f, n) for f, n in list(written)))

    async def _take_slot(self) -> _Slot:
        """One of segment_slots, waited for; given back with its release(). (The slot
        itself, not the client's: a new event loop gets new slots, and work of the old one
        must not give its slots back to them.)"""
        sem = self.segment_slots
        if sem is None:
            return NO_BOUND
        await sem.acquire()
        return sem

    async def _try_slot(self, wait: bool) -> _Slot | None:
        """As _take_slot; with wait=False, None if none is free."""
        if not wait and self.segment_slots is not None and self.segment_slots.locked():
            return None
        return await self._take_slot()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ---- get -------------------------------------------------------------------------
    @operation
    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return ObjectInfo.from_record(bucket, key, await self.live_record(bucket, key))

    @operation
    async def live_record(self, bucket: str, key: str) -> dict[str, Any]:
        check_bucket_name(bucket)
        check_key(key)
        record = await self.read_record(bucket, key)
        if record is None or record["deleted"]:
            await self._require_bucket(bucket)      # NotFound naming the bucket, if it is that
            raise NotFound(f"no such object: {bucket}/{key}")
        return record

    @operation
    async def read_record(self, bucket: str, key: str) -> dict[str, Any] | None:
        """The newest record of bucket/key by read quorum (a tombstone too), or None.

        No name checks: also reads the internal namespaces (store.names.SYSTEM_BUCKETS)."""
        cmap = await self.cluster_map()
        # its owners, and where it was while a control ring change is being moved
        nodes, needed = cmap.metadata_read_plan(f"{bucket}/{key}")
        return await self.meta.read(nodes, meta_path(bucket, key), needed,
                                    object_name=(bucket, key))

    @operation
    async def get(self, bucket: str, key: str, start: int | None = None,
                  end: int | None = None) -> bytes:
        """The object's bytes, or bytes start..end inclusive (HTTP range rules)."""
        parts = [p async for p in self.get_stream(bucket, key, start, end)]
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def get_stream(self, bucket: str, key: str, start: int | None = None,
                   end: int | None = None, record: dict[str, Any] | None = None,
                   note_read: bool = True, cache: bool = True
                   ) -> AsyncGenerator[bytes | memoryview, None]:
        """Yield the object's bytes segment by segment, reading ahead a few segments.

        Pass `record` (from live_record) when the caller has read it already.
        `note_read=False`: not counted as a read (the tiering worker's own reads).
        `cache=False`: the storage nodes read the fragments that are not in their page
        cache without leaving them there (get_fragment's) - a one-pass read nobody
        follows, such as a tier demotion's."""
        return traced_stream(self._get_stream(bucket, key, start, end, record, note_read,
                                              node_cache=cache))

    async def _get_stream(self, bucket: str, key: str, start: int | None, end: int | None,
                          record: dict[str, Any] | None, note_read: bool,
                          node_cache: bool = True) -> AsyncGenerator[bytes | memoryview, None]:
        if record is None:
            record = await self.live_record(bucket, key)
        if note_read:
            self._note_read(bucket, key)
        lo, hi = resolve_range(record["size"], start, end)
        if record.get("inline") is not None:
            if hi > lo:
                yield record["inline"][lo:hi]
            return
        cmap = await self.cluster_map()
        pending: list[tuple[asyncio.Task[bytes | memoryview], _Slot]] = []
        wanted = extent_slices(record_extents(record), record["segment_size"], lo, hi)
        if self.cache is not None and wanted:
            self._prefetch_if_sequential(cmap, record, wanted, hi, node_cache)
        slices = iter(wanted)
        nxt = next(slices, None)
        try:
            while True:
                # read-ahead takes a slot only if one is free: a stream waiting for a second
                # slot while holding the first could otherwise stall every stream
                while nxt is not None and len(pending) < READAHEAD_SEGMENTS \
                        and (slot := await self._try_slot(wait=not pending)) is not None:
                    ext, s = nxt
                    task = asyncio.ensure_future(
                        self._read_slice(cmap, record, ext, s.index, s.start, s.stop,
                                         node_cache))
                    pending.append((task, slot))
                    nxt = next(slices, None)
                if not pending:
                    return
                task, slot = pending.pop(0)
                try:
                    data = await task
                finally:
                    slot.release()
                yield data
                del data  # its slot is given back: not held here while the next one loads
        finally:
            for task, slot in pending:
                task.cancel()
                slot.release()

    def _note_read(self, bucket: str, key: str) -> None:
        if not self.track_reads or bucket in SYSTEM_BUCKETS:
            return
        entry = self._reads.get((bucket, key))
        if entry is None:
            self._reads[(bucket, key)] = [1, time.time()]
        else:
            entry[0] += 1
            entry[1] = time.time()
        if self._reads_flush is None or self._reads_flush.done():
            delay = 0.0 if len(self._reads) >= MAX_PENDING_READS else READS_FLUSH_S
            self._reads_flush = asyncio.ensure_future(self._flush_reads_after(delay))
            self._reads_flush.add_done_callback(retrieved)

    async def _flush_reads_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.flush_reads()

    @operation
    async def flush_reads(self) -> None:
        """Send the reads counted since the last flush to each key's control nodes, one
        request per node (best effort: read counts only steer tiering)."""
        pending, self._reads = self._reads, {}
        if not pending:
            return
        cmap = await self.cluster_map()
        per_node: dict[str, tuple[Node, builtins.list[dict[str, Any]]]] = {}
        for (bucket, key), (count, last) in pending.items():
            entry = {"bucket": bucket, "key": key, "reads": int(count), "last": last}
            for node in cmap.control_nodes_for(f"{bucket}/{key}"):
                per_node.setdefault(node.id, (node, []))[1].append(entry)

        async def send(node: Node, entries: builtins.list[dict[str, Any]]) -> None:
            for i in range(0, len(entries), READS_PER_REQUEST):
                await self.t.request("POST", node.address, "/v1/access",
                                     body=pack({"entries": entries[i:i + READS_PER_REQUEST]}),
                                     timeout_s=5.0)
        await asyncio.gather(*(send(n, e) for n, e in per_node.values()), return_exceptions=True)

    async def _read_slice(self, cmap: ClusterMap, record: dict[str, Any], ext: Extent,
                          seg: int, lo: int, hi: int, node_cache: bool = True
                          ) -> bytes | memoryview:
        data = await self._segment(cmap, record, ext, seg, node_cache)
        # part of a segment is copied: a view would keep the whole segment in memory
        return data if lo == 0 and hi == len(data) else bytes(data[lo:hi])

    async def _segment(self, cmap: ClusterMap, record: dict[str, Any], ext: Extent,
                       seg: int, node_cache: bool = True) -> bytes | memoryview:
        """One decoded segment: from the disk cache, else joining a fetch of it already
        running in this process, else fetched (once across processes sharing the cache)."""
        key = SegmentCache.key(ext.version_id, seg)
        if self.cache is not None:
            data = await _in_thread(self.cache.get, key)
            if data is not None:
                self.read_stats["cache_hits"] += 1
                return data
        fut = self._segment_fetches.get(key)
        if fut is not None:
            self.read_stats["coalesced"] += 1
            return await asyncio.shield(fut)
        fut = asyncio.ensure_future(self._fetch_segment(cmap, record, ext, seg, key, node_cache))
        self._segment_fetches[key] = fut

        def done(f: asyncio.Future[bytes | memoryview]) -> None:
            if self._segment_fetches.get(key) is f:
                del self._segment_fetches[key]
            retrieved(f)
        fut.add_done_callback(done)
        return await asyncio.shield(fut)  # a cancelled reader leaves it to the others

    async def _fetch_segment(self, cmap: ClusterMap, record: dict[str, Any], ext: Extent,
                             seg: int, key: str, node_cache: bool = True) -> bytes | memoryview:
        if self.cache is None:
            self.read_stats["segments_fetched"] += 1
            return await self.read_segment(cmap, record, seg, ext, cache=node_cache)
        cache = self.cache
        fd = await self._cache_lock(key)
        try:
            cached = await _in_thread(cache.get, key)  # another process may have fetched it
            if cached is not None:
                self.read_stats["cache_hits"] += 1
                return cached
            self.read_stats["segments_fetched"] += 1
            data = await self.read_segment(cmap, record, seg, ext, cache=node_cache)
            await _in_thread(cache.put, key, data)
            return data
        finally:
            if fd is not None:
                cache.unlock(fd)

    async def _cache_lock(self, key: str) -> int | None:
        """The cross-process fetch lock of `key`, waited for (polling: no thread blocks on
        it); None after CACHE_LOCK_WAIT_S, and the caller fetches anyway."""
        assert self.cache is not None
        deadline = time.monotonic() + CACHE_LOCK_WAIT_S
        pause = 0.002
        while True:
            fd = self.cache.try_lock(key)
            if fd is not None or time.monotonic() > deadline:
                return fd
            await asyncio.sleep(pause)
            pause = min(0.05, pause * 2)

    def _prefetch_if_sequential(self, cmap: ClusterMap, record: dict[str, Any],
                                wanted: builtins.list[tuple[Extent, Any]], hi: int,
                                node_cache: bool = True) -> None:
        """A read that starts where the last read of this version ended is sequential:
        fetch the next PREFETCH_SEGMENTS segments into the cache in the background."""
        first_ext, first = wanted[0]
        last_ext, last = wanted[-1]
        sequential = self._last_segment.get(first_ext.version_id) == first.index - 1
        self._last_segment[last_ext.version_id] = last.index
        self._last_segment.move_to_end(last_ext.version_id)
        while len(self._last_segment) > 4096:
            self._last_segment.popitem(last=False)
        if not sequential:
            return
        ahead = extent_slices(record_extents(record), record["segment_size"], hi,
                              min(record["size"], hi + PREFETCH_SEGMENTS * record["segment_size"]))
        for ext, s in ahead:
            if s.start != 0 or self._prefetches >= MAX_PREFETCHES:
                continue
            self._prefetches += 1
            self.read_stats["prefetched"] += 1
            task = asyncio.ensure_future(self._segment(cmap, record, ext, s.index, node_cache))
            task.add_done_callback(self._prefetch_done)

    def _prefetch_done(self, task: asyncio.Future[bytes | memoryview]) -> None:
        self._prefetches -= 1
        retrieved(task)

    @operation
    async def read_segment(self, cmap: ClusterMap, record: dict[str, Any], seg: int,
                           extent: Extent | None = None, cache: bool = True) -> bytes | memoryview:
        """Decode one segment (of `extent`, default the record's first) from the first k
        good fragments (data ones first); `cache` as get_fragment's.

        A fragment that fails brings in the next one at once; one that is slower than the
        hedge delay (a stalled or overloaded node) brings in the next one too, and the
        first k to arrive win: a slow node never stalls a read."""
        k, m = record["k"], record["m"]
        ext = extent or record_extents(record)[0]
        nodes = expected_fragment_nodes(cmap, record, seg, ext)
        vid = ext.version_id
        good: dict[int, bytes | bytearray | None] = {}   # None: read into `placed`
        errors: list[str] = []
        placed = codec.SegmentBuffer(k)

        async def fetch(i: int) -> None:
            fid = fragment_id(vid, seg, i)
            into = placed if i < k else None
            try:
                good[i] = await self.get_fragment(nodes[i], fid, into, i, cache)
                return
            except EcstoreError as exc:
                errors.append(f"{nodes[i].id}/{i}: {exc.code}")
                if isinstance(exc, Unreachable):  # down: the next reads go around it
                    self._mark_suspect(nodes[i], DOWN_S)
            prev = self._previous_node(cmap, record, ext, seg, i)
            if prev is not None and prev.id != nodes[i].id:  # not moved yet by a rebalance
                try:
                    good[i] = await self.get_fragment(prev, fid, into, i, cache)
                except EcstoreError as exc:
                    errors.append(f"{prev.id}/{i}: {exc.code}")

        failed: set[int] = set()
        slow: set[int] = set()
        # fragments on nodes that stalled a moment ago: asked only if the others fall short
        deferred = {i for i, node in enumerate(nodes) if self._is_suspect(node)}
        inflight: dict[asyncio.Future[None], int] = {}
        started: dict[int, float] = {}
        hedge = self._hedge_delay()  # once per segment: it sorts the recent latencies
        try:
            while len(good) < k:
                for i in plan_fetches(k, k + m, set(good), failed | slow | deferred,
                                      set(inflight.values()) - slow):
                    inflight[asyncio.ensure_future(fetch(i))] = i
                    started[i] = time.monotonic()
                if not inflight:
                    if deferred:
                        deferred.clear()
                        continue
                    break
                now = time.monotonic()
                waiting = [started[i] + hedge - now for i in inflight.values() if i not in slow]
                timeout = max(0.0, min(waiting)) if waiting else None
                done, _ = await asyncio.wait(inflight, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = inflight.pop(task)
                    slow.discard(i)
                    if i in good:
                        self._fetch_times.append(time.monotonic() - started[i])
                    else:  # a failure: the plan brings in the next fragment
                        failed.add(i)
                now = time.monotonic()
                slow |= {i for i in inflight.values() if now - started[i] >= hedge}
        finally:
            now = time.monotonic()
            for task, i in inflight.items():  # hedged losers and stalled requests
                task.cancel()
                if now - started[i] > HEDGE_MAX_S:
                    self._mark_suspect(nodes[i])
        if len(good) < k:
            raise Unavailable(f"segment {seg} of {vid}: only {len(good)} of {k} needed "
                              "fragments readable", tried=k + m, failed=len(errors),
                              errors=errors[:6])
        picked = sorted(good)[:k]
        in_place = [i for i in picked if good[i] is None]
        # a data fragment still on its way (a hedged loser, cancelled above: its
        # connection closes only when its task runs) may yet write into its slot, so the
        # buffer is not handed out then: the fragments are copied now and decoded
        late = any(i < k for i in inflight.values())
        if picked[-1] >= k:  # a parity fragment stands in for a data one
            self.fault_stats["degraded_reads"] += 1
            apart = {i: f for i in picked if (f := good[i]) is not None}
            segment = None if late else placed.rebuild(m, record["ec_type"], in_place, apart)
        else:               # every data fragment read in place, if all went well
            segment = placed.segment() if len(in_place) == k else None
        if segment is not None:   # read-only: readers of one segment share it
            return memoryview(segment).toreadonly()
        chosen = [placed.fragment(i) if (f := good[i]) is None else f for i in picked]
        return codec.decode(k, m, record["ec_type"], chosen)

    def _hedge_delay(self) -> float:
        """Twice the 90th percentile of recent fragment gets, within bounds."""
        times = sorted(self._fetch_times)
        if len(times) < 20:
            return HEDGE_DEFAULT_S
        return min(HEDGE_MAX_S, max(HEDGE_MIN_S, 2 * times[int(len(times) * 0.9)]))

    def _previous_node(self, cmap: ClusterMap, record: dict[str, Any], ext: Extent, seg: int,
                       i: int) -> Node | None:
        if f"{seg}.{i}" in ext.handoffs:
            return None
        return cmap.previous_fragment_node(record_policy(cmap, record), ext.version_id, seg, i)

    @overload
    async def get_fragment(self, node: Node, fid: str, *, cache: bool = True) -> bytearray: ...

    @overload
    async def get_fragment(self, node: Node, fid: str, into: codec.SegmentBuffer | None,
                           index: int, cache: bool = True) -> bytearray | None: ...

    @operation
    async def get_fragment(self, node: Node, fid: str, into: codec.SegmentBuffer | None = None,
                           index: int = 0, cache: bool = True) -> bytearray | None:
        """One fragment, checked against its checksum (Corrupt, and the node is asked to
        verify its copy). With `into`, a data fragment whose length fits is read into the
        segment buffer as its fragment `index` and None is returned. `cache=False`: the
        node reads it, when it is not in its page cache, without leaving it there
        (UNCACHED_HEADER)."""
        self.read_stats["fragment_gets"] += 1
        reply = await self.t.get_into(node.address, f"/v1/fragments/{fid}", FRAGMENT_TIMEOUT_S,
                                      None if into is None else into.sink(index),
                                      None if cache else {UNCACHED_HEADER: UNCACHED})
        pieces = into.pieces(index) if reply.scattered and into is not None else (reply.body,)
        if not fragment_intact(pieces, reply.headers):
            self.fault_stats["checksum_failures"] += 1
            self._spawn(self._report_corrupt(node, fid))
            raise Corrupt(f"fragment {fid} from {node.id} failed its checksum")
        return None if reply.scattered else reply.body

    async def _report_corrupt(self, node: Node, fid: str) -> None:
        """Ask the node to verify the fragment now: it quarantines it if the disk copy is
        bad (a flip in transit leaves it be). Best effort; the scrubber finds it anyway."""
        try:
            await self.t.request("POST", node.address, f"/v1/fragments/{fid}/verify", timeout_s=30)
        except EcstoreError:
            pass

    # ---- delete and list -------------------------------------------------------------
    @operation
    async def delete(self, bucket: str, key: str) -> None:
        """Write a tombstone; NotFound if there is no live object."""
        live = await self.live_record(bucket, key)
        cmap = await self.cluster_map()
        # after the version it deletes even when this client's clock is behind its writer's:
        # newest-by-ts would otherwise keep that version and drop an acknowledged tombstone
        ts = max(time.time_ns(), live["ts"] + 1)
        record = {"ts": ts, "version_id": new_version_id(), "deleted": True}
        await self._commit(cmap, bucket, key, record)

    @operation
    async def list(self, bucket: str, prefix: str = "", delimiter: str = "",
                   start_after: str = "", max_keys: int = 1000) -> ListResult:
        """One page of keys sorted, merged over every control node, tombstones dropped."""
        if not 1 <= max_keys <= 10_000:
            raise BadRequest("max_keys must be between 1 and 10000")
        await self._require_bucket(bucket)
        return await self.list_namespace(bucket, prefix, delimiter, start_after, max_keys)

    @operation
    async def list_namespace(self, bucket: str, prefix: str = "", delimiter: str = "",
                             start_after: str = "", max_keys: int = 1000) -> ListResult:
        """`list` without the bucket check: also lists the internal namespaces."""
        cmap = await self.cluster_map()
        nodes = {n.id: n for n in cmap.control.nodes}
        if cmap.previous_control is not None:  # records not moved yet by a rebalance
            nodes.update({n.id: n for n in cmap.previous_control.nodes if n.id not in nodes})
        return await merge_listing(self.t, tuple(nodes.values()), bucket, prefix, delimiter,
                                   start_after, max_keys,
                                   allowed_failures=max(0, cmap.effective_replicas - 1),
                                   enough=len(nodes) - cmap.listing_misses_allowed())

    async def list_all(self, bucket: str, prefix: str = "",
                       delimiter: str = "") -> AsyncIterator[ListResult]:
        after = ""
        while True:
            page = await self.list(bucket, prefix, delimiter, after)
            yield page
            if not page.truncated:
                return
            after = page.next_start_after

    @operation
    async def node_status(self, timeout_s: float = 3.0) -> builtins.list[dict[str, Any]]:
        """Every node of the map (and of cluster.json) with its status, or 'down' when it
        does not answer within `timeout_s` (a stalled node answers never). Each row's
        "state": "up", "degraded" (it answers, but names problems: a full disk, a
        database that refuses writes) or "down"."""
        cmap = await self.cluster_map()
        nodes = list(cmap.control.nodes) + list(cmap.all_storage_nodes())

        async def one(node: Node, role: str) -> dict[str, Any]:
            base = {"id": node.id, "role": role, "url": node.address, "zone": node.zone,
                    "tier": node.tier}
            try:
                reply = await self.t.request("GET", node.address, "/v1/status",
                                             timeout_s=timeout_s)
            except EcstoreError as exc:
                return {**base, "up": False, "state": "down", "error": exc.message}
            answer = json.loads(reply.body)
            return {**base, "up": True,
                    "state": "degraded" if answer.get("problems") else "up", **answer}

        roles = ["control"] * len(cmap.control.nodes) + ["storage"] * (len(nodes) - len(cmap.control.nodes))
        rows: builtins.list[dict[str, Any]] = list(await asyncio.gather(*(one(n, r) for n, r in zip(nodes, roles))))
        gw = self.info.raw.get("gateway")
        if gw:  # not in the map: cluster.json names it
            rows.append(await self._gateway_status(gw["url"]))
        return rows

    async def _gateway_status(self, url: str) -> dict[str, Any]:
        row = {"id": "gateway", "role": "gateway", "url": url, "zone": "", "tier": ""}
        try:
            reply = await self.t.request("GET", url, "/_ecstore/health", timeout_s=3.0)
        except EcstoreError as exc:
            return {**row, "up": False, "state": "down", "error": exc.message}
        return {**row, "up": True, "state": "up", **json.loads(reply.body)}


class _CountedQuorum(MetaQuorum):
    """MetaQuorum that counts the reads and writes that missed their quorum."""

    def __init__(self, transport: Transport, background: set[asyncio.Future[Any]],
                 stats: dict[str, int]) -> None:
        super().__init__(transport, background)
        self.stats = stats

    async def write(self, nodes: tuple[Node, ...], path: str, record: dict[str, Any],
                    needed: int, object_name: tuple[str, str] | None = None) -> int:
        try:
            return await super().write(nodes, path, record, needed, object_name)
        except Unavailable:
            self.stats["metadata_quorum_failures"] += 1
            raise

    async def read(self, nodes: tuple[Node, ...], path: str, needed: int,
                   repair: bool = True, object_name: tuple[str, str] | None = None
                   ) -> dict[str, Any] | None:
        try:
            return await super().read(nodes, path, needed, repair, object_name)
        except Unavailable:
            self.stats["metadata_quorum_failures"] += 1
            raise


def fragment_intact(pieces: Sequence[bytes | bytearray | memoryview],
                    headers: Mapping[str, str]) -> bool:
    """The fragment body (`pieces` in order) matches what its node stored: its CRC-32 when
    the node sent one (fast), else - or when the CRC does not match - its digest
    (store.digest)."""
    crc = headers.get(FRAGMENT_CRC_HEADER)
    if crc is not None and len(crc) == 8:
        try:
            expect = int(crc, 16)
        except ValueError:
            expect = -1
        value = 0
        for piece in pieces:
            value = crc32(piece, value)
        if value == expect:
            return True
    body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return digest_matches(body, headers.get(CHECKSUM_HEADER))


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def user_meta_bytes(meta: Mapping[str, Any]) -> int:
    """The size of user metadata as S3 counts it against its 2 KB: the UTF-8 bytes of every
    name and value. BadRequest unless both are strings."""
    total = 0
    for k, v in meta.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise BadRequest("user metadata names and values must be strings")
        total += len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
    return total


def _drop(task: asyncio.Future[Any]) -> None:
    """Cancel a fragment put nobody waits for any more, and take its outcome when it ends:
    one that failed meanwhile (a node down, while another fragment had lost its last
    node) is an error already dealt with, not "Task exception was never retrieved"."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _segment_done(slot: _Slot, task: asyncio.Future[None]) -> None:
    slot.release()
    retrieved(task)  # a failed put re-raises its first failure; the others are seen here


def expected_fragment_nodes(cmap: ClusterMap, record: dict[str, Any], seg: int,
                            extent: Extent | None = None) -> list[Node]:
    """The node a reader asks for each fragment index of one segment of `extent` (default:
    the record's first), handoffs applied."""
    ext = extent or record_extents(record)[0]
    nodes = list(cmap.fragment_nodes(record_policy(cmap, record), ext.version_id, seg))
    for idx_key, node_id in ext.handoffs.items():
        s, i = idx_key.split(".")
        if int(s) == seg:
            nodes[int(i)] = cmap.storage_node(node_id)
    return nodes


def record_policy(cmap: ClusterMap, record: dict[str, Any]) -> Policy:
    """The policy an object was written with (its record is the truth, not the map)."""
    return Policy(name=record["policy"], k=record["k"], m=record["m"],
                  ec_type=record["ec_type"], segment_size_bytes=record["segment_size"],
                  tier=cmap.policy(record["policy"]).tier)


def meta_path(bucket: str, key: str) -> str:
    return f"/v1/objects/{bucket}/{quote_key(key)}"


async def _chain(pre: builtins.list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`pre`, emptied as it is yielded, then `rest` (no segment stays referenced here)."""
    while pre:
        yield pre.pop(0)
    while (s := await anext(rest, None)) is not None:
        yield s
        del s


async def _take(it: AsyncIterator[bytes], n: int) -> AsyncIterator[bytes]:
    for _ in range(n):
        s = await anext(it, None)
        if s is None:
            return
        yield s


async def _segments(source: Source, size: int) -> AsyncIterator[bytes]:
    """Cut any source into segments of exactly `size` bytes (the last may be short)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        # bytes are sliced as they are: an object that fits one segment is its own slice
        # (no copy); a bytearray or memoryview is copied, the caller may change it
        view = source if type(source) is bytes else memoryview(source)
        for off in range(0, len(view), size):
            yield bytes(view[off:off + size])
        return
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            async for s in _segments(f, size):
                yield s
        return
    if hasattr(source, "read"):
        loop = asyncio.get_running_loop()
        while True:
            block = await loop.run_in_executor(None, _read_exact, source, size)  # type: ignore[arg-type]
            if not block:
                return
            yield block
            if len(block) < size:
                return
    # chunks are kept as they come and joined once per segment: between segments (while a
    # put waits for a slot) only the tail of one chunk stays held. (A bytearray buffer kept
    # its whole capacity for the life of the put: 64 waiting puts held ~0.5 GiB.)
    # No local may still name a segment while this generator waits to be resumed.
    parts: builtins.list[bytes] = []
    have = 0
    async for chunk in source:  # type: ignore[union-attr]
        if chunk:
            parts.append(bytes(chunk))
            have += len(chunk)
        del chunk
        while have >= size:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            if len(data) == size:
                parts, have = [], 0
            else:
                parts = [data[size:]]
                have = len(parts[0])
                data = data[:size]
            yield data
            del data
    if parts:
        yield b"".join(parts)


def _read_exact(f: BinaryIO, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        b = f.read(size - got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def __getattr__(name: str) -> Any:
    """SyncClient, loaded when first asked for: store.client_sync imports Client from here."""
    if name == "SyncClient":
        from store.client_sync import SyncClient
        return SyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
