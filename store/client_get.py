"""The get path: read the record with a read quorum, fetch the k data fragments of each
needed segment (hedged, data ones first), fall back to parity on any error (degraded
read), decode, slice; with a disk cache, segments are shared between processes."""
from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Callable, TypeVar, overload

from placement.cluster_map import ClusterMap
from placement.nodes import Node, UnknownNodeError
from placement.policy import Policy
from store import codec
from store.auth import CHECKSUM_HEADER
from store.cache import SegmentCache
from store.client_base import FRAGMENT_TIMEOUT_S, ClientBase, ObjectInfo, _Slot, meta_path
from store.crc import crc32
from store.digest import matches as digest_matches
from store.errors import Corrupt, EcstoreError, NotFound, Unavailable, Unreachable
from store.names import SYSTEM_BUCKETS, check_bucket_name, check_key
from store.striping import Extent, extent_slices, fragment_id, plan_fetches, record_extents, resolve_range
from store.transport import operation, retrieved, traced_stream
from store.wire import FRAGMENT_CRC_HEADER, UNCACHED, UNCACHED_HEADER, pack

HEDGE_MIN_S = 0.05             # a fragment get slower than the hedge delay brings in one more
HEDGE_MAX_S = 1.0
HEDGE_DEFAULT_S = 0.25         # until latencies have been seen
CACHE_LOCK_WAIT_S = 60.0       # longest wait for another process's fetch of a segment
PREFETCH_SEGMENTS = 2          # a sequential reader with a cache gets this many more fetched
MAX_PREFETCHES = 8             # in flight per client
READS_FLUSH_S = 5.0            # read counts are sent to the control nodes this often
MAX_PENDING_READS = 50_000     # ... or at once when this many objects have been read
READS_PER_REQUEST = 5_000
DOWN_S = 3.0                   # one that refused a connection: its fragments are read last
READAHEAD_SEGMENTS = 2         # get stream read-ahead
T = TypeVar("T")


class GetPath(ClientBase):
    """Client's head, get, get_stream, read_segment, get_fragment and read counting."""

    @operation
    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return ObjectInfo.from_record(bucket, key, await self.live_record(bucket, key))

    @operation
    async def live_record(self, bucket: str, key: str, read_repair: bool = True
                          ) -> dict[str, Any]:
        check_bucket_name(bucket)
        check_key(key)
        record = await self.read_record(bucket, key, read_repair)
        if record is None or record["deleted"]:
            await self._require_bucket(bucket)      # NotFound naming the bucket, if it is that
            raise NotFound(f"no such object: {bucket}/{key}")
        return record

    @operation
    async def read_record(self, bucket: str, key: str, read_repair: bool = True
                          ) -> dict[str, Any] | None:
        """The newest record of bucket/key by read quorum (a tombstone too), or None; the
        replicas that answered with an older one (or none) are sent it, unless not
        `read_repair`.

        No name checks: also reads the internal namespaces (store.names.SYSTEM_BUCKETS)."""
        cmap = await self.cluster_map()
        # its owners, and where it was while a control ring change is being moved
        nodes, needed = cmap.metadata_read_plan(f"{bucket}/{key}")
        return await self.meta.read(nodes, meta_path(bucket, key), needed, read_repair,
                                    object_name=(bucket, key),
                                    owners=len(cmap.control_nodes_for(f"{bucket}/{key}")))

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
        decoded = codec.decode(k, m, record["ec_type"], chosen)
        return decoded if isinstance(decoded, bytes) else memoryview(decoded).toreadonly()

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


def expected_fragment_nodes(cmap: ClusterMap, record: dict[str, Any], seg: int,
                            extent: Extent | None = None) -> list[Node]:
    """The node a reader asks for each fragment index of one segment of `extent` (default:
    the record's first), handoffs applied - but for a handoff node no longer in the map
    (removed since), and one the map now places another fragment of the segment on (a
    ring change made the spare a primary): such a fragment is looked for where the map
    places it, moved there by the rebalance that follows the change (or rebuilt there by
    repair), and read degraded until then. A record naming a removed node made every read,
    repair, rebalance and gc of it fail (UnknownNodeError); one whose handoff node became
    another fragment's kept two fragments of the segment on one node - repair rebuilt
    onto it, and losing it and one more lost the object."""
    ext = extent or record_extents(record)[0]
    primaries = cmap.fragment_nodes(record_policy(cmap, record), ext.version_id, seg)
    nodes = list(primaries)
    for idx_key, node_id in ext.handoffs.items():
        s, i = idx_key.split(".")
        if int(s) != seg:
            continue
        with contextlib.suppress(UnknownNodeError):
            node = cmap.storage_node(node_id)
            if not any(n.id == node.id for j, n in enumerate(primaries) if j != int(i)):
                nodes[int(i)] = node
    return nodes


def record_policy(cmap: ClusterMap, record: dict[str, Any]) -> Policy:
    """The policy an object was written with (its record is the truth, not the map)."""
    return Policy(name=record["policy"], k=record["k"], m=record["m"],
                  ec_type=record["ec_type"], segment_size_bytes=record["segment_size"],
                  tier=cmap.policy(record["policy"]).tier)
