"""The async Client and its synchronous wrapper.

Put: cut the bytes into segments, encode each with pyeclib into k+m fragments, PUT them
in parallel to the nodes the map names for (version_id, segment) (a handoff node takes a
fragment whose node fails), then commit the metadata record with a write quorum.
Get: read the record with a read quorum, fetch the k data fragments of each needed
segment, fall back to parity on any error (degraded read), decode, slice.

Client is put together here from its parts: the put path (store.client_put), the get path
(store.client_get) and what both share (store.client_base); this module adds buckets,
delete, listing and node status. SyncClient is in store.client_sync. Every name of those
modules that callers import from store.client is re-exported here.
"""
from __future__ import annotations

import asyncio
import builtins
import json
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from placement.nodes import Node
from store.client_base import (
    BUCKET_CACHE_TTL_S,
    DEFAULT_CACHE_MAX_MB,
    DEFAULT_SEGMENT_SLOTS,
    FRAGMENT_TIMEOUT_S,
    MAP_TTL_S,
    NO_BOUND,
    SUSPECT_S,
    ObjectInfo,
    meta_path,
    new_version_id,
    settle_tasks,
)
from store.client_base import _CountedQuorum as _CountedQuorum
from store.client_base import _NoBound as _NoBound
from store.client_base import _Slot as _Slot
from store.client_get import (
    CACHE_LOCK_WAIT_S,
    DOWN_S,
    HEDGE_DEFAULT_S,
    HEDGE_MAX_S,
    HEDGE_MIN_S,
    MAX_PENDING_READS,
    MAX_PREFETCHES,
    PREFETCH_SEGMENTS,
    READAHEAD_SEGMENTS,
    READS_FLUSH_S,
    READS_PER_REQUEST,
    GetPath,
    T,
    expected_fragment_nodes,
    fragment_intact,
    record_policy,
)
from store.client_get import _in_thread as _in_thread
from store.client_put import (
    INTENT_AFTER_S,
    INTENT_REFRESH_S,
    INTENT_TTL_S,
    MAX_INFLIGHT_SEGMENTS,
    MAX_USER_META_BYTES,
    STRAGGLER_FACTOR,
    STRAGGLER_MIN_S,
    VERIFY_AFTER_S,
    VERIFY_PARALLEL,
    PutPath,
    Source,
    user_meta_bytes,
)
from store.client_put import _chain as _chain
from store.client_put import _drop as _drop
from store.client_put import _read_exact as _read_exact
from store.client_put import _segment_done as _segment_done
from store.client_put import _segments as _segments
from store.client_put import _take as _take
from store.cluster import ClusterInfo
from store.errors import BadRequest, Conflict, EcstoreError, NotFound, Unavailable
from store.listing import ListResult, merge_listing
from store.metadata import first_answers
from store.names import check_bucket_name
from store.transport import operation, retrieved
from store.wire import unpack

if TYPE_CHECKING:
    from store.client_sync import SyncClient

CLOSE_CANCEL_ROUNDS = 8   # close(): rounds of cancelling background work still pending
CLOSE_WAIT_S = 3.0        # close(): at most this long for background work to finish ...
CLOSE_IDLE_S = 1.0        # ... and no longer once none of it has finished for this long

# the public names; the private helpers above are imported "as" themselves to stay
# importable from here too (tests use some)
__all__ = [
    "BUCKET_CACHE_TTL_S", "CACHE_LOCK_WAIT_S", "DEFAULT_CACHE_MAX_MB", "DEFAULT_SEGMENT_SLOTS",
    "DOWN_S", "FRAGMENT_TIMEOUT_S", "HEDGE_DEFAULT_S", "HEDGE_MAX_S", "HEDGE_MIN_S",
    "INTENT_AFTER_S", "INTENT_REFRESH_S", "INTENT_TTL_S", "MAP_TTL_S", "MAX_INFLIGHT_SEGMENTS",
    "MAX_PENDING_READS", "MAX_PREFETCHES", "MAX_USER_META_BYTES", "NO_BOUND", "PREFETCH_SEGMENTS",
    "READAHEAD_SEGMENTS", "READS_FLUSH_S", "READS_PER_REQUEST", "STRAGGLER_FACTOR",
    "STRAGGLER_MIN_S", "SUSPECT_S", "VERIFY_AFTER_S", "VERIFY_PARALLEL",
    "Client", "ObjectInfo", "Source", "SyncClient", "T",
    "expected_fragment_nodes", "fragment_intact", "meta_path", "new_version_id",
    "record_policy", "user_meta_bytes",
]


class Client(GetPath, PutPath):
    """Async client. Use `async with Client.connect(path) as c:` or call `close()`.

    It may be used from one event loop after another (asyncio.run twice): its
    connections and pending work belong to the loop that ran them, and are dropped when
    a new loop takes it over; not from two running loops at once (WrongEventLoop)."""

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

    async def close(self) -> None:
        self.on_loop()
        if self._reads_flush is not None:
            self._reads_flush.cancel()
        extra: set[asyncio.Future[Any]] = set()
        if self._reads:      # the read counts not sent yet (best effort: tiering hints)
            flush = asyncio.ensure_future(self.flush_reads())
            flush.add_done_callback(retrieved)
            extra.add(flush)
        # What is on its way - a commit's third replica, read repairs, the read counts -
        # gets CLOSE_WAIT_S, but only while some of it still finishes: what is left once
        # nothing has for CLOSE_IDLE_S waits on a node that does not answer (stalled,
        # blackholed), and a CLI command with one control node stalled took 2.5-5.5 s
        # (waits of 3 s and 2 s) instead of 0.3 to end. A record write cancelled on its
        # way is applied all the same; one still queued behind a slow batch is not sent
        # (the replica gets it from read repair or `ecstore repair`)
        await settle_tasks(lambda: self.background | extra, CLOSE_WAIT_S, CLOSE_IDLE_S)
        # What is still on its way (a write to a control node that does not answer) is
        # cancelled here, on the running loop: left pending, asyncio.run destroyed it at
        # its end ("Task was destroyed but it is pending!"), and a record batch sender's
        # cleanup, run then by the GC, started the next batch on no loop (a RuntimeError
        # traceback after the command's output). A cancelled sender may start the next
        # batch of its queue: each round cancels those too.
        for _ in range(CLOSE_CANCEL_ROUNDS):
            stuck = [t for t in self.background | extra if not t.done()]
            if not stuck:
                break
            for task in stuck:
                task.cancel()
            await asyncio.wait(stuck, timeout=1.0)
        await self.t.close()

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
            # tiers are the storage rings': a control node's (hot for the first ones, control
            # for those `ring add` made) means nothing - "" as for the gateway and `ring show`
            base = {"id": node.id, "role": role, "url": node.address, "zone": node.zone,
                    "tier": node.tier if role == "storage" else ""}
            started = time.monotonic()
            try:
                reply = await self.t.request("GET", node.address, "/v1/status",
                                             timeout_s=timeout_s)
            except EcstoreError as exc:
                return {**base, "up": False, "state": "down", "error": exc.message}
            answer = json.loads(reply.body)
            return {**base, "up": True,
                    "state": "degraded" if answer.get("problems") else "up", **answer,
                    "answered_ms": round((time.monotonic() - started) * 1000, 1)}

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


def __getattr__(name: str) -> Any:
    """SyncClient, loaded when first asked for: store.client_sync imports Client from here."""
    if name == "SyncClient":
        from store.client_sync import SyncClient
        return SyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

