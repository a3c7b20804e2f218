"""What the client's put and get paths share: its state, the cluster map, the bucket check,
segment slots and the nodes found slow (store.client puts the paths together as Client)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from placement.policy import Policy
from store.cache import SegmentCache
from store.cache import log as cache_log
from store.cluster import ClusterInfo
from store.errors import (
    BadRequest,
    Conflict,
    EcstoreError,
    InsufficientStorage,
    NotFound,
    Unauthorized,
    Unavailable,
)
from store.metadata import MetaQuorum, first_answers
from store.names import check_bucket_name
from store.transport import LoopBound, Transport, operation, quote_key, retrieved

FRAGMENT_TIMEOUT_S = 30.0
DEFAULT_CACHE_MAX_MB = 10 * 1024
SUSPECT_S = 10.0               # a node found stalled is passed over this long, then tried again
REFUSED_BACKOFF_S = 2.0        # a storage node that refused a fragment (full, failed disk) is
                               # sent none this long: each would be refused after its body
DEFAULT_SEGMENT_SLOTS = 32     # segments in memory across all of a client's puts and gets
BUCKET_CACHE_TTL_S = 5.0
MAP_TTL_S = 2.0                # how long a client trusts its cluster map before asking again


async def settle_tasks(current: Callable[[], Iterable[asyncio.Future[Any]]], timeout_s: float,
                       idle_s: float | None = None) -> bool:
    """Wait for the tasks `current()` names - asked again each round: tasks start others
    (a read repair its writes) - until none is left (True), for timeout_s at most, and with
    `idle_s` no longer once none has finished for that long (what is left then waits on a
    node that does not answer). False when some were left."""
    deadline = time.monotonic() + timeout_s
    while pending := {t for t in current() if not t.done()}:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        done, _ = await asyncio.wait(pending, timeout=left if idle_s is None
                                     else min(left, idle_s),
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done and idle_s is not None:
            return False
    return True


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


class ClientBase(LoopBound):
    """The state of a Client and what both its put and get paths use."""

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
        # node id -> (when asked, whether it answers): one health probe per node a second,
        # shared by every lagging fragment put (client_put._answering)
        self._health_probes: dict[str, tuple[float, asyncio.Future[bool]]] = {}
        # node id -> (until when it is sent no fragment, why): it refused writes
        self._refusing: dict[str, tuple[float, EcstoreError]] = {}
        cache_dir = cache_dir or os.environ.get("ECSTORE_CACHE_DIR") or None
        if cache_max_bytes is None:
            raw = os.environ.get("ECSTORE_CACHE_MAX_MB") or str(DEFAULT_CACHE_MAX_MB)
            try:
                cache_max_bytes = int(float(raw) * 2**20)
                if not cache_max_bytes > 0:
                    raise ValueError
            except (ValueError, OverflowError):   # it said "could not convert string to float"
                raise BadRequest(f"ECSTORE_CACHE_MAX_MB={raw[:40]!r}: expected a positive "
                                 "number of MiB") from None
        self.cache = None
        if cache_dir:
            try:
                self.cache = SegmentCache(cache_dir, cache_max_bytes)
            except OSError as exc:
                # as the README says: a cache directory this process may not write (another
                # user's, a read-only or full disk) makes misses, never errors - it raised
                # from the constructor, and every CLI command failed as "internal error"
                cache_log.warning("segment cache %s cannot be used (%s): reading from the cluster "
                            "instead", cache_dir, exc.strerror or exc)
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
        except (Unavailable, Unauthorized):   # (a wrong secret says so: _fetch_newest_map)
            if self._map is not None and not refresh:
                return self._map  # keep working on the last map while control nodes are away
            raise

    async def current_map(self) -> ClusterMap:
        """The map as cluster_map() gives it, but one older than MAP_TTL_S is fetched
        again and waited for (not served stale while it is): a put's last look before its
        commit (client_put._follow_leavers). A fetch at most every MAP_TTL_S per client."""
        cmap = await self.cluster_map()
        if time.monotonic() - self._map_at < MAP_TTL_S or self._map_fetch is None:
            return cmap
        with contextlib.suppress(Unavailable, Unauthorized):   # control nodes away: the last map
            cmap = await asyncio.shield(self._map_fetch)
        return cmap

    async def _fetch_newest_map(self) -> ClusterMap:
        urls = {*self.info.control}
        if self._map is not None:
            urls |= {n.address for n in self._map.control.nodes}
        maps = await first_answers([self._fetch_map(url) for url in sorted(urls)],
                                   len(urls) // 2 + 1)
        good = [m for m in maps if isinstance(m, ClusterMap)]
        if not good:
            refused = [m for m in maps if isinstance(m, EcstoreError) and m.status in (401, 403)]
            if len(refused) > len(maps) // 2:    # most refused: not one node's clock
                # a wrong or missing secret read as "every control node is down"
                raise Unauthorized(
                    f"the control nodes refused this client's signed requests "
                    f"({refused[0].message}): the cluster secret given here "
                    "($ECSTORE_SECRET, or cluster.json's) is not the one the nodes were "
                    "started with, or this host's clock is off from theirs by over 300 s")
            first = next((m for m in maps if isinstance(m, EcstoreError)), None)
            raise Unavailable("no control node answered with a cluster map"
                              + (f" ({first.message})" if first is not None else ""),
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
            raise Conflict(f"another change of the cluster map was published meanwhile (map "
                           f"epoch {new.epoch} is not newer than {old.epoch}): run the "
                           "command again")
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

    # ---- the bucket check and policies ----------------------------------------------
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

    def record_ts(self) -> int:
        """The ts of a record this client writes now: its clock, or just after the newest
        record it has read if that is later (a writer whose clock runs ahead wrote it).
        Records are ordered by ts, so a put that follows a read of such a record - the
        same key or another, this process or one it heard from through the store - is
        ordered after it, not silently outranked (a hybrid logical clock, as CockroachDB's)."""
        return max(time.time_ns(), self.meta.seen_ts + 1)

    # ---- nodes passed over, segment slots, background work ---------------------------
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

    def _refused_lately(self, node: Node) -> EcstoreError | None:
        """The error a storage node refused a fragment with less than REFUSED_BACKOFF_S
        ago (its disk full, or failed: it refuses every write until restarted), as an
        error of the same kind naming it; None once that is longer ago."""
        got = self._refusing.get(node.id)
        if got is None:
            return None
        until, exc = got
        if time.monotonic() >= until:
            del self._refusing[node.id]
            return None
        return type(exc)(f"{node.id} refused a fragment less than {REFUSED_BACKOFF_S:g} s ago: "
                         f"{exc.message}", **exc.details)

    def _note_refusal(self, node: Node, exc: EcstoreError) -> None:
        """Remember a refusal that the next fragments would meet too: a full disk (507), or
        a node that refuses writes since its disk failed a write or sync (503 with
        refuses_writes) - not a busy node's 503, which the next put may not get."""
        if isinstance(exc, InsufficientStorage) or (isinstance(exc, Unavailable)
                                                    and exc.details.get("refuses_writes")):
            self._refusing[node.id] = (time.monotonic() + REFUSED_BACKOFF_S, exc)

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
                   repair: bool = True, object_name: tuple[str, str] | None = None,
                   owners: int | None = None) -> dict[str, Any] | None:
        try:
            return await super().read(nodes, path, needed, repair, object_name, owners)
        except Unavailable:
            self.stats["metadata_quorum_failures"] += 1
            raise


def meta_path(bucket: str, key: str) -> str:
    return f"/v1/objects/{bucket}/{quote_key(key)}"
