"""The put path: cut a source into segments, encode each into k+m fragments, put them in
parallel on the nodes the map names for (version_id, segment) (a handoff node takes a
fragment whose node fails or lags), then commit the metadata record with a write quorum."""
from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, BinaryIO, Callable

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from placement.policy import Policy
from store import codec
from store.auth import CHECKSUM_HEADER
from store.client_base import (
    FRAGMENT_TIMEOUT_S,
    ClientBase,
    ObjectInfo,
    _Slot,
    meta_path,
    new_version_id,
)
from store.crc import crc32
from store.digest import digest
from store.digest import matches as digest_matches
from store.errors import BadRequest, Corrupt, EcstoreError, Unavailable
from store.metadata import effective_quorums
from store.names import PUTS_BUCKET, check_new_key
from store.striping import fragment_id, parse_fragment_id
from store.transport import operation, retrieved
from store.wire import FRAGMENT_META_HEADER, UNCACHED, UNCACHED_HEADER, pack_header, unpack_header

STRAGGLER_MIN_S = 2.0          # a fragment put this far behind its segment's k-th goes to a handoff
STRAGGLER_FACTOR = 3.0         # ... or this many times what the k-th took, if longer
# ... and one no node is left to take is waited for while its node answers a health check
# in STRAGGLER_PROBE_S (asked again every STRAGGLER_RECHECK_S), up to its request's timeout
STRAGGLER_PROBE_S = 3.0
STRAGGLER_RECHECK_S = 5.0
PROBE_REUSE_S = 1.0            # a node's health probe answers every lagging put this long
MAX_INFLIGHT_SEGMENTS = 4      # put pipeline depth: memory ~ this x segment x (k+m)/k
VERIFY_AFTER_S = 30.0          # a put running longer checks its fragments before the commit
INTENT_AFTER_S = 20.0          # a put running this long tells gc so (PUTS_BUCKET) ...
INTENT_REFRESH_S = 40.0        # ... again this often while it runs ...
INTENT_TTL_S = 120.0           # ... each telling good for this long
VERIFY_PARALLEL = 32           # fragment HEADs in flight for that check
MAX_USER_META_BYTES = 2048
Source = (bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO
          | AsyncIterator[bytes] | AsyncIterator[bytes | memoryview]
          | Iterable[bytes] | Iterable[bytes | memoryview])


class PutPath(ClientBase):
    """Client's put, write_extent, commit and put_fragment."""

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
            "ts": self.record_ts(), "version_id": vid, "deleted": False,
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
        record["ts"] = max(record["ts"], self.record_ts())
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
                              "still appear)", **{**exc.details, "outcome": "unknown"}) from None

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
            await self._follow_leavers(cmap, pol, vid, written, record["handoffs"], cache)
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

    async def _follow_leavers(self, cmap: ClusterMap, pol: Policy, vid: str,
                              written: list[tuple[str, Node]], handoffs: dict[str, str],
                              cache: bool) -> None:
        """Before the commit: a fragment this put wrote on a node the map has taken out
        since the put took its map (`cluster remove-node` draining it) is copied to where
        the current map places it - else the drain, whose passes see only committed
        objects, could stop that node with it and the object was one fragment short. The
        copy is read back verified from the leaving node (still up while it drains); if it
        cannot be, the put fails (503), nothing committed."""
        fresh = await self.current_map()
        if fresh.epoch == cmap.epoch:
            return
        ring = fresh.storage_ring(pol.tier)
        current = {n.id for n in ring.nodes}
        holding: dict[int, set[str]] = {}     # segment -> the nodes holding its fragments
        for fid, node in written:
            holding.setdefault(parse_fragment_id(fid)[1], set()).add(node.id)
        for at, (fid, node) in enumerate(list(written)):
            if node.id in current:
                continue
            _, seg, i = parse_fragment_id(fid)
            # where the current map places it, unless that node holds another fragment of
            # the segment (the change moved positions): then a spare of the row, recorded
            # as a handoff (readers follow a handoff to a node that is not a primary)
            row = ring.locate(f"{vid}/{seg}", len(ring.nodes))
            target = row[i]
            if target.id in holding[seg]:
                spare = next((n for n in row[pol.n:] if n.id not in holding[seg]), None)
                if spare is None:
                    raise Unavailable(f"version {vid}: storage node {node.id} left the map "
                                      f"during the put and no node is free for fragment "
                                      f"{fid}: nothing committed; put it again")
                target = spare
                handoffs[f"{seg}.{i}"] = target.id
            else:
                handoffs.pop(f"{seg}.{i}", None)
            try:
                await self.copy_fragment(fid, node, target, cache)
            except Corrupt:
                raise Unavailable(f"fragment {fid} read back from {node.id}, which left the "
                                  "map during the put, failed its checksum: nothing "
                                  "committed") from None
            written[at] = (fid, target)
            holding[seg].add(target.id)
            self._spawn(self._delete_fragments([(fid, node)]))

    async def copy_fragment(self, fid: str, source: Node, target: Node, cache: bool = True,
                            read_timeout_s: float = FRAGMENT_TIMEOUT_S) -> int:
        """Copy one fragment from `source` to `target` (read back verified, written as a
        put writes it); its size. Corrupt when the copy read fails its checksum. `cache`:
        as put's, for both the read and the write (rebalance moves uncached)."""
        path = f"/v1/fragments/{fid}"
        reply = await self.t.request("GET", source.address, path, timeout_s=read_timeout_s,
                                     headers=None if cache else {UNCACHED_HEADER: UNCACHED})
        if not digest_matches(reply.body, reply.headers.get(CHECKSUM_HEADER)):
            raise Corrupt(f"{fid} from {source.id} failed its checksum (damaged on that node, "
                          "or in transit): not moved; the node quarantines it when it reads "
                          "it, and repair rebuilds it")
        meta = unpack_header(reply.headers.get(FRAGMENT_META_HEADER))
        await self.put_fragment(target, fid, reply.body, meta, cache)
        return len(reply.body)

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
                    handed = False
                    kept: list[tuple[asyncio.Future[None], int, Node]] = []
                    for task, (i, node) in list(attempts.items()):
                        if not spares:
                            kept.append((task, i, node))
                            continue
                        del attempts[task]
                        _drop(task)
                        self._mark_suspect(node)
                        handed = True
                        next_node(i, "too slow", node)
                    # no node to hand these to: cancelling one fails the segment, so a
                    # node that answers its health check (slow - a loaded host, a long
                    # sync, a thin or lossy link - not stalled) is waited for, until its
                    # request's own timeout; one that does not is given up
                    answering = await self._answering({n.id: n for _, _, n in kept})
                    waiting = False
                    for task, i, node in kept:
                        if task.done() or node.id in answering:
                            waiting = waiting or not task.done()
                            continue
                        del attempts[task]
                        _drop(task)
                        self._mark_suspect(node)
                        next_node(i, f"too slow (no answer in {time.monotonic() - start:.1f} "
                                  "s, its health check unanswered, and no other node to hand "
                                  "its fragment to)", node)
                    now = time.monotonic()
                    ends = [now + self._straggler_grace(start)] if handed else []
                    if waiting:
                        ends.append(now + STRAGGLER_RECHECK_S)
                    deadline = min(ends, default=now)
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
            spare = len(row) - pol.n
            raise Unavailable(f"{bucket}/{key}: segment {seg} of version {vid}: fragment "
                              f"{lost[0]} could not be written to any node ({pol.n} storage "
                              f"nodes needed, one per fragment, {spare} to spare; "
                              f"{len(errors)} refused or did not answer"
                              + ("" if spare else ": with none to spare, one node down fails "
                                 "every put") + "): " + "; ".join(e[:200] for e in errors[:2])
                              + (f"; and {len(errors) - 2} more" if len(errors) > 2 else ""),
                              tried=len(errors), failed=len(errors), errors=errors[:4])

    async def _answering(self, nodes: dict[str, Node]) -> set[str]:
        """Ids of the nodes that answer their health check (200) within
        STRAGGLER_PROBE_S: slow, not stalled. The check is not queued behind this
        client's own requests to the node (a slow node may hold all its slots: every
        check would time out), and one a second per node serves every lagging put."""
        async def probe(node: Node) -> bool:
            try:
                reply = await self.t.request("GET", node.address, "/v1/health",
                                             timeout_s=STRAGGLER_PROBE_S, unqueued=True)
            except EcstoreError:
                return False
            return reply.status == 200

        def asked(node: Node) -> asyncio.Future[bool]:
            now = time.monotonic()
            held = self._health_probes.get(node.id)
            if held is not None and now - held[0] < PROBE_REUSE_S \
                    and held[1].get_loop() is asyncio.get_running_loop():
                return held[1]
            fut = asyncio.ensure_future(probe(node))
            self._health_probes[node.id] = (now, fut)
            return fut
        futures = {i: asked(n) for i, n in nodes.items()}
        return {i for i, f in futures.items() if await asyncio.shield(f)}

    @staticmethod
    def _straggler_grace(start: float) -> float:
        """How long a fragment put may lag once k of its segment are placed."""
        return max(STRAGGLER_MIN_S, STRAGGLER_FACTOR * (time.monotonic() - start))

    @operation
    async def put_fragment(self, node: Node, fid: str, body: bytes | bytearray | memoryview,
                           meta: dict[str, Any], cache: bool = True) -> None:
        """`cache=False`: the node writes it without keeping it in its page cache
        (UNCACHED_HEADER)."""
        refused = self._refused_lately(node)
        if refused is not None:     # its next answer would be the same: the caller goes on
            raise refused
        checksum = digest(body)
        meta = {**meta, "crc32": crc32(body)}   # what readers check (FRAGMENT_CRC_HEADER)
        headers = {FRAGMENT_META_HEADER: pack_header(meta)}
        if not cache:
            headers[UNCACHED_HEADER] = UNCACHED
        try:
            await self.t.request("PUT", node.address, f"/v1/fragments/{fid}", body=body,
                                 checksum=checksum, timeout_s=FRAGMENT_TIMEOUT_S,
                                 headers=headers)
        except EcstoreError as exc:
            self._note_refusal(node, exc)
            raise

    async def _delete_fragments(self, written: list[tuple[str, Node]]) -> None:
        """Best effort; garbage collection removes whatever this misses."""
        async def one(fid: str, node: Node) -> None:
            try:
                await self.t.request("DELETE", node.address, f"/v1/fragments/{fid}",
                                     timeout_s=5.0)
            except EcstoreError:
                pass
        await asyncio.gather(*(one(f, n) for f, n in list(written)))


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
    if not hasattr(source, "__aiter__"):
        if not hasattr(source, "__iter__"):
            raise TypeError(f"put source: expected bytes, a path, a binary file or an "
                            f"(async) iterator of bytes, got {type(source).__name__}")
        # a sync iterator of bytes (a generator, a list of chunks): each item taken in a
        # thread, as a file's blocks are - it said "'async for' requires an object with
        # __aiter__ method", and a SyncClient user had no way to stream one
        source = _from_sync(source)
    # chunks are kept as they come and joined once per segment: between segments (while a
    # put waits for a slot) only the tail of one chunk stays held. (A bytearray buffer kept
    # its whole capacity for the life of the put: 64 waiting puts held ~0.5 GiB.)
    # No local may still name a segment while this generator waits to be resumed.
    parts: builtins.list[bytes] = []
    have = 0
    async for chunk in source:  # type: ignore[union-attr]
        if isinstance(chunk, str):
            raise TypeError("put source: an iterator of str, not bytes (encode it, or open "
                            "the file in binary mode)")
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


async def _from_sync(items: Any) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    it, end = iter(items), object()
    while (chunk := await loop.run_in_executor(None, next, it, end)) is not end:
        yield chunk  # type: ignore[misc]


def _read_exact(f: BinaryIO, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        b = f.read(size - got)
        if isinstance(b, str):   # it failed in join: "sequence item 0: expected a bytes-like"
            raise TypeError("put source: a file opened in text mode; open it with 'rb'")
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)
