"""PyTorch Distributed Checkpoint (torch.distributed.checkpoint) storage on ecstore.

    writer = EcstoreWriter(".ecstore/cluster.json", "ckpt", "run-7", f"step-{step}")
    dcp.save(state, storage_writer=writer)           # every rank, its own writer
    reader = EcstoreReader(".ecstore/cluster.json", "ckpt", "run-7")   # the latest generation
    dcp.load(state, storage_reader=reader)

Layout under BUCKET/PREFIX/: one directory per checkpoint generation, with each rank's
shard objects `GEN/__<rank>_<save>_<n>.distcp` (`save`: a token of this save, so two
saves of one generation never write into each other's objects; every item torch.save'd back to back, as
FileSystemWriter writes them) and `GEN/.metadata` (the pickled DCP Metadata), plus the
`latest` object naming the newest complete generation. The coordinator writes `.metadata`
in finish(), which DCP calls only after every rank's shard objects are committed, and then
`latest`: a save cut short anywhere leaves no `.metadata`, so it is invisible and `latest`
still names the previous generation. A generation's objects are byte for byte what
FileSystemWriter writes: copied to a directory, FileSystemReader loads them.

Pure planning (splitting a rank's items over its objects, coalescing ranged reads,
grouping a listing into generations, choosing what to prune) is separate from the I/O.
Needs the `torch` extra; importing this module without PyTorch raises ImportError.
"""
from __future__ import annotations

import asyncio
import atexit
import bisect
import concurrent.futures
import contextlib
import dataclasses
import inspect
import io
import itertools
import json
import os
import pickle
import secrets
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

try:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
    from torch.distributed.checkpoint.planner import (
        LoadItemType,
        LoadPlan,
        LoadPlanner,
        ReadItem,
        SavePlan,
        SavePlanner,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    from torch.futures import Future
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("store.dcp needs PyTorch: pip install 'ecstore[torch]'") from exc

from store.client import Client
from store.cluster import ClusterInfo
from store.errors import BadRequest, ClientClosed, Conflict, NotFound
from store.listing import ListEntry
from store.names import check_key
from store.transport import retrieved

METADATA_NAME = ".metadata"
LATEST_NAME = "latest"
SHARD_SUFFIX = ".distcp"
DCP_VERSION = "1.0.0"                 # the Metadata.version FileSystemWriter writes
OBJECTS_PER_RANK = 4                  # shard objects a rank writes at once
MAX_OBJECTS_PER_RANK = 64
QUEUED_CHUNKS = 2                     # per object: segments serialization may run ahead of the put
READS_IN_FLIGHT = 4                   # ranged gets a rank runs at once
MAX_RANGE_BYTES = 64 << 20            # coalesced reads stop growing here (an item may be larger)
MAX_GAP_BYTES = 1 << 20               # needed items this close in one object are read as one range
DELETES_IN_FLIGHT = 16
FAILED_SAVE_AFTER_S = 3600.0           # prune: an incomplete generation this old (and older than
                                      # the newest commit) is a failed save, not one in flight
T = TypeVar("T")
Cluster = str | os.PathLike[str] | ClusterInfo | None


# ---- pure planning ------------------------------------------------------------------------
def check_generation(name: str) -> str:
    """Return `name` if it can name a generation: one path component, not `latest`."""
    if not name or "/" in name or name in (".", "..", LATEST_NAME) or name.startswith("__"):
        raise BadRequest(f"bad checkpoint generation name {name!r}: one path component, "
                         f"not {LATEST_NAME!r}, '.' or '..', not starting with '__'")
    check_key(name)
    return name


def new_generation_name(now_ns: int, token: str) -> str:
    """A name that sorts by time: 20261201T120000.123456Z-<token>."""
    secs, ns = divmod(now_ns, 1_000_000_000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs)) + f".{ns // 1000:06d}Z-{token}"


def join_key(prefix: str, *parts: str) -> str:
    return "/".join(p for p in (prefix.strip("/"), *parts) if p)


def split_by_size(sizes: Sequence[int], bins: int) -> list[list[int]]:
    """Indices of `sizes` dealt into at most `bins` non-empty groups, largest first into the
    lightest group (greedy), each group in ascending index order."""
    assert bins >= 1
    groups: list[list[int]] = [[] for _ in range(min(bins, len(sizes)))]
    load = [0] * len(groups)
    for i in sorted(range(len(sizes)), key=lambda j: (-sizes[j], j)):
        g = min(range(len(groups)), key=lambda b: (load[b], len(groups[b]), b))  # 0-byte items spread
        groups[g].append(i)
        load[g] += sizes[i]
    return [sorted(g) for g in groups]


@dataclass(frozen=True)
class RangeRead:
    """One ranged get: bytes start..stop (exclusive) of `name`, and for each needed item
    (its index in the request list) where it lies inside the range."""

    name: str
    start: int
    stop: int
    members: tuple[tuple[int, int, int], ...]  # (request index, offset in range, length)


def plan_range_reads(requests: Sequence[tuple[str, int, int]], max_gap_bytes: int = MAX_GAP_BYTES,
                     max_range_bytes: int = MAX_RANGE_BYTES) -> list[RangeRead]:
    """Coalesce (object name, offset, length) requests into ranged gets.

    Requests in the same object are sorted by offset; the next joins the current range if
    the hole before it is at most max_gap_bytes and the range stays within max_range_bytes
    (a single larger request is one range of its own). Overlapping requests share bytes.
    """
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], requests[i][1], i))
    out: list[RangeRead] = []
    cur: list[int] = []
    start = stop = 0
    for i in order:
        name, off, length = requests[i]
        if cur and requests[cur[0]][0] == name and off - stop <= max_gap_bytes \
                and max(stop, off + length) - start <= max_range_bytes:
            cur.append(i)
            stop = max(stop, off + length)
            continue
        if cur:
            out.append(_range(requests, cur, start, stop))
        cur, start, stop = [i], off, off + length
    if cur:
        out.append(_range(requests, cur, start, stop))
    return out


def _range(requests: Sequence[tuple[str, int, int]], members: list[int], start: int,
           stop: int) -> RangeRead:
    return RangeRead(requests[members[0]][0], start, stop,
                     tuple((i, requests[i][1] - start, requests[i][2]) for i in members))


@dataclass(frozen=True)
class Generation:
    """One checkpoint generation as a listing shows it."""

    name: str
    complete: bool              # its .metadata exists
    committed_ns: int | None    # when .metadata was written
    newest_ns: int              # the newest object under it
    objects: int
    size_bytes: int
    shards_only: bool = True    # nothing under it but shard objects (what a save writes)


def group_generations(entries: Sequence[ListEntry], prefix: str) -> list[Generation]:
    """Group a recursive listing of PREFIX/ into generations, oldest first (by commit time,
    else by newest object). Objects directly under PREFIX (the latest pointer) are skipped."""
    base = join_key(prefix) + "/" if prefix.strip("/") else ""
    acc: dict[str, list[ListEntry]] = {}
    for e in entries:
        rest = e.key[len(base):]
        if e.key.startswith(base) and "/" in rest:
            acc.setdefault(rest.split("/", 1)[0], []).append(e)
    gens = []
    for name, items in acc.items():
        meta = next((e for e in items if e.key == f"{base}{name}/{METADATA_NAME}"), None)
        inner = [e.key[len(base) + len(name) + 1:] for e in items]
        shards = all("/" not in r and r.startswith("__") and r.endswith(SHARD_SUFFIX)
                     for r in inner if r != METADATA_NAME)
        gens.append(Generation(name, meta is not None, meta.ts if meta else None,
                               max(e.ts for e in items), len(items), sum(e.size for e in items),
                               shards))
    return sorted(gens, key=lambda g: (g.committed_ns or g.newest_ns, g.name))


def choose_prune(gens: Sequence[Generation], latest: str | None, keep: int,
                 now_ns: int | None = None,
                 failed_after_s: float = FAILED_SAVE_AFTER_S) -> list[str]:
    """Generations to delete so that the `keep` newest complete ones remain (always
    including the one `latest` names), plus incomplete ones whose every object is older
    than the newest commit and than `failed_after_s`: saves that failed. An incomplete
    generation written since either may be a save in flight and is left alone (another
    save committing - an evaluation snapshot with update_latest=False - while one rank was
    still writing made a save in flight look failed: prune deleted its finished ranks'
    shards); so is anything under PREFIX/NAME/ that is
    not only shard objects - another job's checkpoints under a longer prefix (their own
    generations and `latest`), or objects of anyone's: prune deletes only what saves made."""
    assert keep >= 1
    complete = sorted((g for g in gens if g.complete), key=lambda g: (g.committed_ns or 0, g.name))
    kept = {g.name for g in complete[-keep:]} | ({latest} if latest else set())
    newest_commit = max((g.committed_ns or 0 for g in complete), default=0)
    doomed = [g.name for g in complete if g.name not in kept and g.shards_only]
    before = min(newest_commit, (time.time_ns() if now_ns is None else now_ns)
                 - int(failed_after_s * 1e9))
    doomed += [g.name for g in gens if not g.complete and g.shards_only
               and g.newest_ns < before and g.name != latest]
    return doomed


# ---- a private event loop for DCP's synchronous hooks ---------------------------------------
class _Loop:
    """The async Client on an event loop of its own thread: DCP calls storage hooks
    synchronously, from the training script's thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.loop: asyncio.AbstractEventLoop
        try:
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=_run_loop, args=(self.loop,), name="ecstore-dcp",
                                       daemon=True)
        self.thread.start()
        _LOOP_THREADS.add(self.thread)
        self.client = Client.connect(cluster)
        # a writer or reader dropped without close() (`dcp.save(..., storage_writer=
        # EcstoreWriter(...))`, the natural call) kept its loop's thread for ever, and its
        # sockets until the nodes' idle timeout: one of each per checkpoint
        weakref.finalize(self, _shut_down, self.loop, self.client)

    def submit(self, aw: Awaitable[T]) -> concurrent.futures.Future[T]:
        if self.loop.is_closed() or not self.thread.is_alive():
            if inspect.iscoroutine(aw):
                aw.close()      # never awaited: no "coroutine was never awaited" warning
            # it raised RuntimeError('Event loop is closed') from inside DCP
            raise ClientClosed("this ecstore checkpoint writer, reader or Checkpoints is "
                               "closed: make a new one")
        return asyncio.run_coroutine_threadsafe(_await(aw), self.loop)

    def run(self, aw: Awaitable[T]) -> T:
        return self.submit(aw).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _await(aw: Awaitable[T]) -> T:
    return await aw


LOOP_SHUTDOWN_S = 5.0   # a dropped _Loop's client is given this long to close


_LOOP_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A _Loop's thread: the loop until stopped, then closed (its selector's descriptors
    with it), whoever stopped it."""
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            loop.close()


@atexit.register
def _join_loops() -> None:
    """At exit, after the finalizers of the _Loops still alive asked them to stop: wait
    for their threads (daemon threads left running into the interpreter's teardown)."""
    for thread in list(_LOOP_THREADS):
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(LOOP_SHUTDOWN_S + 1)


def _shut_down(loop: asyncio.AbstractEventLoop, client: Client) -> None:
    """A _Loop collected (or the interpreter exiting) without close(): close its client on
    its loop and stop it; the thread closes the loop. It never waits: collection may run
    on any thread, another loop's too (at exit, _join_loops waits)."""
    if loop.is_closed() or not loop.is_running():
        return

    async def close_then_stop() -> None:
        try:
            await asyncio.wait_for(client.close(), LOOP_SHUTDOWN_S)
        except Exception:  # noqa: BLE001 - shutting down: nothing to report it to
            pass
        finally:
            loop.stop()
    with contextlib.suppress(RuntimeError):     # the loop closed meanwhile
        asyncio.run_coroutine_threadsafe(close_then_stop(), loop)


class _Connected:
    """What the writer and the reader share: a bucket, a prefix and a connection."""

    def __init__(self, cluster: Cluster, bucket: str, prefix: str) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._io = _Loop(cluster)
        self.client = self._io.client

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._io.close()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def key(self, generation: str, name: str) -> str:
        return join_key(self.prefix, generation, name)

    def url(self, generation: str | None) -> str:
        return f"ecstore://{self.bucket}/{join_key(self.prefix, generation or '')}"

    def _parse_id(self, checkpoint_id: str | os.PathLike[str]) -> str:
        """A checkpoint id is a generation name, or ecstore://BUCKET/PREFIX/GENERATION of
        this writer's or reader's bucket and prefix."""
        text = str(checkpoint_id)
        if text.startswith("ecstore://"):
            head, _, gen = text.rstrip("/").rpartition("/")
            if head != self.url(None).rstrip("/"):
                raise BadRequest(f"checkpoint id {text} is not under {self.url(None)}")
            text = gen
        return check_generation(text)


# ---- writing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _RankPlan:
    generation: str | None      # what this rank was told (None: the coordinator chooses)


@dataclass(frozen=True)
class _ShardPlan:
    generation: str
    object_prefix: str          # "__<rank>_<save>_": this save's, of this rank


class _Storage(_Connected):
    """What the writer and the reader share: the checkpoint id is the generation's URL."""

    generation: str | None

    @property
    def checkpoint_id(self) -> str:
        return self.url(self.generation)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return str(checkpoint_id).startswith("ecstore://")


class EcstoreWriter(_Storage, StorageWriter):
    """A DCP StorageWriter that saves to BUCKET/PREFIX/GENERATION/ on ecstore.

    Every rank builds its own (its own connection); generation=None lets the coordinator
    name it (time ordered; `writer.generation` after the save). Each rank splits its items
    over `objects_per_rank` shard objects and streams them all at once. A generation that
    already has `.metadata` is refused unless overwrite=True (which deletes that
    `.metadata` before any rank writes: the old generation is gone from then on).
    update_latest=False leaves the `latest` pointer alone (e.g. evaluation snapshots).
    The shards are written uncached (Client.put's cache=False: the storage nodes do not
    keep them in their page cache, so a save does not push out the data set the training
    reads; Linux 6.14+); cache_writes=True writes them as any object (a save that is read
    back at once, say). `.metadata` and `latest` are written as usual.
    Raises (through DCP's CheckpointException) ecstore errors: Conflict, Unavailable, ...
    """

    def __init__(self, cluster: Cluster, bucket: str, prefix: str, generation: str | None = None, *,
                 objects_per_rank: int = OBJECTS_PER_RANK, overwrite: bool = False,
                 update_latest: bool = True, cache_writes: bool = False) -> None:
        if not 1 <= objects_per_rank <= MAX_OBJECTS_PER_RANK:
            raise BadRequest(f"objects_per_rank must be 1..{MAX_OBJECTS_PER_RANK}")
        self._fixed = None if generation is None else check_generation(generation)
        super().__init__(cluster, bucket, prefix)
        self.generation = self._fixed
        self.objects_per_rank, self.overwrite, self.update_latest = objects_per_rank, overwrite, update_latest
        self.cache_writes = cache_writes
        self.save_id = str(uuid.uuid4())
        self.rank: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(objects_per_rank, thread_name_prefix="ecstore-dcp")

    def close(self) -> None:
        super().close()
        self._pool.shutdown()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self._fixed = self._parse_id(checkpoint_id)
        self.generation = self._fixed
        self.save_id = str(uuid.uuid4())

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise BadRequest("EcstoreWriter needs use_collectives=True: the coordinator commits")
        self.rank = kwargs.get("rank")
        self.generation = self._fixed  # a reused writer without a fixed name gets a new one

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return dataclasses.replace(plan, storage_data=_RankPlan(self._fixed))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Coordinator: agree on the generation, check it is new, name every rank's objects."""
        named = {p.storage_data.generation for p in plans if isinstance(p.storage_data, _RankPlan)}
        if len(named) > 1:
            raise BadRequest(f"ranks were given different checkpoint generations: {sorted(map(str, named))}")
        gen = named.pop() if named else None
        gen = gen or new_generation_name(time.time_ns(), secrets.token_hex(3))
        self._io.run(self._claim(gen))
        self.generation = gen
        # each save's shard names are its own: a second save of the same generation (a
        # restarted job while the old one still runs) writes other objects, never into
        # the ones the first save's .metadata names - so no load mixes the two
        save = secrets.token_hex(4)
        return [dataclasses.replace(p, storage_data=_ShardPlan(gen, f"__{i}_{save}_"))
                for i, p in enumerate(plans)]

    async def _claim(self, gen: str) -> None:
        key = self.key(gen, METADATA_NAME)
        try:
            await self.client.head(self.bucket, key)
        except NotFound:
            return
        if not self.overwrite:
            raise Conflict(f"checkpoint generation {self.url(gen)} exists (pass overwrite=True "
                           "or save under a new generation)")
        await self.client.delete(self.bucket, key)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        sp = plan.storage_data
        assert isinstance(sp, _ShardPlan), "prepare_global_plan did not run"
        self.generation = sp.generation
        groups = split_by_size([_item_bytes(i) for i in plan.items], self.objects_per_rank)
        jobs = [(f"{sp.object_prefix}{n}{SHARD_SUFFIX}", [plan.items[i] for i in g])
                for n, g in enumerate(groups)]
        results = self._io.run(_gather(*(self._write_object(sp.generation, name, items, planner)
                                         for name, items in jobs)))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result([r for rs in results for r in rs])
        return fut

    async def _write_object(self, gen: str, name: str, items: list[WriteItem],
                            planner: SavePlanner) -> list[WriteResult]:
        """Serialize items in a worker thread into a bounded queue that a streamed put
        drains: memory per object is QUEUED_CHUNKS chunks plus the put's segments."""
        loop = asyncio.get_running_loop()
        cmap = await self.client.cluster_map()
        sink = _ChunkSink(loop, cmap.policy(None).segment_size_bytes)  # chunks the put takes as is
        produce = loop.run_in_executor(self._pool, _serialize_items, items, planner, sink, name)
        try:
            await self.client.put(self.bucket, self.key(gen, name), sink.chunks(),
                                  cache=self.cache_writes)
        except BaseException:
            sink.aborted = True  # a failed put must not leave the producer blocked
            await asyncio.gather(produce, return_exceptions=True)
            raise
        return await produce

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator, once every rank's objects are committed: commit `.metadata`, then
        point `latest` at this generation."""
        assert self.generation is not None
        metadata.version = DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        shards = [info.relative_path for info in metadata.storage_data.values()]
        self._io.run(self._commit(self.generation, pickle.dumps(metadata), shards))

    async def _commit(self, gen: str, blob: bytes, shards: Sequence[str] = ()) -> None:
        # every shard object the metadata names must still be there: a prune run while a
        # slow rank still wrote took this generation for a failed save and deleted the
        # finished ranks' shards, and this commit made it `latest`, unloadable
        sem = asyncio.Semaphore(32)

        async def there(name: str) -> str | None:
            async with sem:
                try:
                    await self.client.head(self.bucket, self.key(gen, name))
                    return None
                except NotFound:
                    return name
        gone = [n for n in await _gather(*(there(n) for n in sorted(set(shards)))) if n]
        if gone:
            raise NotFound(f"{len(gone)} shard objects of {gen} are gone ({', '.join(gone[:3])}"
                           f"{', ...' if len(gone) > 3 else ''}): deleted while the save ran "
                           "(a prune took it for a failed one?) - not committed; save again "
                           "under a new name")
        await self.client.put(self.bucket, self.key(gen, METADATA_NAME), blob)
        if self.update_latest:
            pointer = {"generation": gen, "save_id": self.save_id, "committed_ns": time.time_ns()}
            await self.client.put(self.bucket, join_key(self.prefix, LATEST_NAME),
                                  json.dumps(pointer).encode(), content_type="application/json")


def _item_bytes(item: WriteItem) -> int:
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return 0
    n = item.tensor_data.properties.dtype.itemsize
    for s in item.tensor_data.size:
        n *= s
    return n


class _Aborted(Exception):
    pass


class _ChunkSink:
    """A write-only file for torch.save in a worker thread, feeding an async iterator on
    the loop through a queue of QUEUED_CHUNKS chunks of chunk_bytes (backpressure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, chunk_bytes: int) -> None:
        self.loop, self.chunk_bytes = loop, chunk_bytes
        self.queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(QUEUED_CHUNKS)
        self.buf = bytearray()
        self.written = 0
        self.aborted = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        step = self.chunk_bytes
        for off in range(0, len(view), step):
            piece = view[off:off + step]
            if not self.buf and len(piece) == step:
                self._send(bytes(piece))  # one copy, not two
                continue
            room = step - len(self.buf)
            self.buf += piece[:room]
            if len(self.buf) == step:
                self._send(bytes(self.buf))
                self.buf[:] = piece[room:]
        self.written += len(view)
        return len(view)

    def flush(self) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        if error is None and self.buf:
            self._send(bytes(self.buf))
        self._send(error)

    def _send(self, item: bytes | BaseException | None) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.queue.put(item), self.loop)
        while True:
            try:
                fut.result(timeout=0.2)
                return
            except concurrent.futures.TimeoutError:
                if self.aborted:
                    fut.cancel()
                    raise _Aborted() from None

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item  # the put fails: nothing is committed
            yield item


def _serialize_items(items: list[WriteItem], planner: SavePlanner, sink: _ChunkSink,
                     name: str) -> list[WriteResult]:
    """Worker thread: what FileSystemWriter writes into one file, into `sink`."""
    results = []
    try:
        for item in sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO):
            offset = sink.written
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                sink.write(data.getbuffer())
            else:
                assert isinstance(data, torch.Tensor)
                tensor = data.detach().cpu()
                if tensor.untyped_storage().size() != tensor.nbytes:
                    tensor = tensor.clone()  # a view: save only its own bytes
                torch.save(tensor, sink)  # type: ignore[arg-type]
            length = sink.written - offset
            results.append(WriteResult(index=item.index, size_in_bytes=length,
                                       storage_data=_StorageInfo(name, offset, length)))
    except _Aborted:
        return []
    except BaseException as exc:
        sink.end(exc)
        raise
    sink.end()
    return results


async def _gather(*aws: Awaitable[T]) -> list[T]:
    """All results, or the first error once every task has ended (none left running)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- reading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LoadPlanData:
    generation: str


@dataclass
class ReadStats:
    """What a reader fetched: ranged gets and the bytes they asked for."""

    range_gets: int = 0
    bytes_requested: int = 0
    bytes_needed: int = 0


class EcstoreReader(_Storage, StorageReader):
    """A DCP StorageReader for BUCKET/PREFIX/GENERATION/ (generation=None: the one `latest`
    names, read again at every load). Each rank reads only the byte ranges of the items its
    plan needs, coalescing neighbours (max_gap_bytes apart, up to max_range_bytes), with
    reads_in_flight ranged gets at once. `stats` counts what the last load fetched.
    Raises NotFound (no such generation), BadRequest (ranks resolved `latest` differently:
    a save committed meanwhile; pass the generation), ecstore errors."""

    def __init__(self, cluster: Cluster, bucket: str, prefix: str, generation: str | None = None, *,
                 reads_in_flight: int = READS_IN_FLIGHT, max_gap_bytes: int = MAX_GAP_BYTES,
                 max_range_bytes: int = MAX_RANGE_BYTES) -> None:
        self._fixed = None if generation is None else check_generation(generation)
        super().__init__(cluster, bucket, prefix)
        self.generation = self._fixed
        self.reads_in_flight, self.max_gap_bytes = max(1, reads_in_flight), max_gap_bytes
        self.max_range_bytes = max_range_bytes
        self.storage_data: dict[Any, Any] = {}
        self.load_id = str(uuid.uuid4())
        self.stats = ReadStats()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self._fixed = self._parse_id(checkpoint_id)
        self.generation = self._fixed
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any) -> Metadata:
        # no **kwargs: torch then tries no per-rank metadata after a failed read (there is
        # none here), which logged a second traceback per rank and buried this error
        self.generation = self._fixed or self._io.run(read_latest(self.client, self.bucket, self.prefix))
        if self.generation is None:
            raise NotFound(f"no complete checkpoint under {self.url(None)} (no {LATEST_NAME})")
        try:
            blob = self._io.run(self.client.get(self.bucket, self.key(self.generation, METADATA_NAME)))
        except NotFound:
            raise NotFound(f"checkpoint generation {self.url(self.generation)} is not complete "
                           f"(no {METADATA_NAME})") from None
        metadata = pickle.loads(blob)  # the bucket's owner wrote it: trusted, as FileSystemReader
        assert isinstance(metadata, Metadata)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data
        assert isinstance(self.storage_data, dict), "metadata without storage_data"

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        assert self.generation is not None
        return dataclasses.replace(plan, storage_data=_LoadPlanData(self.generation))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        gens = {p.storage_data.generation for p in plans if isinstance(p.storage_data, _LoadPlanData)}
        if len(gens) > 1:
            raise BadRequest(f"ranks are loading different generations {sorted(gens)}: a save "
                             f"committed while they read {LATEST_NAME}; pass the generation")
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.generation is not None
        self.stats = ReadStats()
        infos = [self.storage_data[item.storage_index] for item in plan.items]
        for info in infos:
            if getattr(info, "transform_descriptors", None):
                raise BadRequest(f"{info.relative_path}: stream transforms are not supported")
        reads = plan_range_reads([(i.relative_path, i.offset, i.length) for i in infos],
                                 self.max_gap_bytes, self.max_range_bytes)
        self.stats.bytes_needed = sum(i.length for i in infos)
        records: dict[str, asyncio.Future[dict[str, Any]]] = {}
        pending: set[concurrent.futures.Future[tuple[RangeRead, _Parts]]] = set()
        todo = iter(reads)
        try:
            while True:
                while len(pending) < self.reads_in_flight and (r := next(todo, None)) is not None:
                    pending.add(self._io.submit(self._fetch(r, records)))
                if not pending:
                    break
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    rng, parts = f.result()
                    for idx, off, length in rng.members:
                        _apply(plan.items[idx], _PartsFile(parts, off, length), planner)
        finally:
            for f in pending:
                f.cancel()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    async def _fetch(self, r: RangeRead, records: dict[str, asyncio.Future[dict[str, Any]]]
                     ) -> tuple[RangeRead, _Parts]:
        """One ranged get, kept as the parts it arrived in (joining them would cost a copy
        and fresh pages: torch.load reads straight out of them). Every range of an object
        is read from the same version: its record is read once per load."""
        assert self.generation is not None
        key = self.key(self.generation, r.name)
        if key not in records:
            records[key] = asyncio.ensure_future(self.client.live_record(self.bucket, key))
            # a lookup whose readers were cancelled after another read failed logged "Task
            # exception was never retrieved" at collection: its error is the load's anyway
            records[key].add_done_callback(retrieved)
        record = await asyncio.shield(records[key])
        self.stats.range_gets += 1
        self.stats.bytes_requested += r.stop - r.start
        parts = _Parts([bytes(p) async for p in self.client.get_stream(
            self.bucket, key, r.start, r.stop - 1, record=record)])
        if parts.size != r.stop - r.start:
            raise NotFound(f"{key} is shorter than its checkpoint metadata says")
        return r, parts


class _Parts:
    """Byte strings read back to back, addressed as one buffer."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.starts = list(itertools.accumulate((len(c) for c in chunks), initial=0))
        self.size = self.starts[-1]

    def copy_into(self, pos: int, out: memoryview) -> None:
        i = bisect.bisect_right(self.starts, pos) - 1
        done = 0
        while done < len(out):
            chunk = memoryview(self.chunks[i])[pos + done - self.starts[i]:]
            n = min(len(chunk), len(out) - done)
            out[done:done + n] = chunk[:n]
            done += n
            i += 1


class _PartsFile(io.RawIOBase):
    """A read-only, seekable file over bytes start..start+length of _Parts, for torch.load."""

    def __init__(self, parts: _Parts, start: int, length: int) -> None:
        super().__init__()
        self.parts, self.start, self.length, self.pos = parts, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self.length - self.pos))
        self.parts.copy_into(self.start + self.pos, out[:n])
        self.pos += n
        return n


def _apply(item: ReadItem, data: _PartsFile, planner: LoadPlanner) -> None:
    """Hand one item's bytes to the planner, as FileSystemReader does."""
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data.read()))
        return
    tensor = torch.load(data, map_location="cpu", weights_only=True)  # type: ignore[arg-type]
    for dim, (off, length) in enumerate(zip(item.storage_offsets, item.lengths)):
        if off != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, off, length)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise BadRequest(f"{item.storage_index}: stored {tuple(tensor.size())}, "
                         f"wanted {tuple(target.size())}")
    target.copy_(tensor)
    planner.commit_tensor(item, target)


# ---- generations -----------------------------------------------------------------------------
async def read_latest(client: Client, bucket: str, prefix: str) -> str | None:
    """The generation PREFIX/latest names, or None if there is none yet; NotFound if the
    bucket does not exist (a misspelled one read as a run never saved: a restart script
    `if latest() is None: start over` started over)."""
    try:
        blob = await client.get(bucket, join_key(prefix, LATEST_NAME))
    except NotFound:
        await client.bucket_record(bucket)      # NotFound: no such bucket
        return None
    return check_generation(str(json.loads(blob)["generation"]))


async def list_generations(client: Client, bucket: str, prefix: str) -> list[Generation]:
    """Every generation under PREFIX (complete or not), oldest first. One listing."""
    base = join_key(prefix) + "/" if prefix.strip("/") else ""
    entries = [e async for page in client.list_all(bucket, base) for e in page.objects]
    return group_generations(entries, prefix)


async def delete_prefix(client: Client, bucket: str, prefix: str,
                        deletes_in_flight: int = DELETES_IN_FLIGHT) -> int:
    """Delete every object whose key starts with `prefix` (not empty), listing page by page
    with at most `deletes_in_flight` deletes at once. Returns how many were deleted; an
    object deleted meanwhile by someone else is not counted."""
    if not prefix:
        raise BadRequest("delete_prefix needs a non-empty prefix")
    sem = asyncio.Semaphore(max(1, deletes_in_flight))

    async def one(key: str) -> int:
        async with sem:
            try:
                await client.delete(bucket, key)
                return 1
            except NotFound:
                return 0
    counts = []
    async for page in client.list_all(bucket, prefix):
        counts += await _gather(*(one(e.key) for e in page.objects))
    return sum(counts)


async def delete_generation(client: Client, bucket: str, prefix: str, generation: str) -> int:
    """Delete one generation: its `.metadata` first (so nobody loads it half deleted), then
    everything under it in bulk. Raises Conflict if `latest` names it. Returns objects deleted."""
    check_generation(generation)
    if await read_latest(client, bucket, prefix) == generation:
        raise Conflict(f"{generation} is the latest checkpoint; save a newer one first")
    deleted = 0
    try:
        await client.delete(bucket, join_key(prefix, generation, METADATA_NAME))
        deleted = 1
    except NotFound:
        pass
    return deleted + await delete_prefix(client, bucket, join_key(prefix, generation) + "/")


async def prune_generations(client: Client, bucket: str, prefix: str, keep: int,
                            failed_after_s: float = FAILED_SAVE_AFTER_S) -> list[str]:
    """Delete all but the `keep` newest complete generations (and failed saves older than
    the newest commit and than `failed_after_s`; see choose_prune). Returns the names
    deleted."""
    if keep < 1:
        raise BadRequest("keep must be at least 1")
    if not failed_after_s >= 0:
        raise BadRequest("failed_after_s must be a number of seconds, 0 or more")
    latest = await read_latest(client, bucket, prefix)
    doomed = choose_prune(await list_generations(client, bucket, prefix), latest, keep,
                          failed_after_s=failed_after_s)
    for gen in doomed:  # one at a time: each is already a bulk delete
        await delete_generation(client, bucket, prefix, gen)
    return doomed


class Checkpoints(_Connected):
    """Blocking helpers over one BUCKET/PREFIX for scripts: list, latest, delete, prune."""

    def generations(self) -> list[Generation]:
        return self._io.run(list_generations(self.client, self.bucket, self.prefix))

    def latest(self) -> str | None:
        return self._io.run(read_latest(self.client, self.bucket, self.prefix))

    def delete(self, generation: str) -> int:
        return self._io.run(delete_generation(self.client, self.bucket, self.prefix, generation))

    def prune(self, keep: int, failed_after_s: float = FAILED_SAVE_AFTER_S) -> list[str]:
        return self._io.run(prune_generations(self.client, self.bucket, self.prefix, keep,
                                              failed_after_s))


__all__ = ["EcstoreWriter", "EcstoreReader", "Checkpoints", "Generation", "ReadStats",
           "delete_prefix", "delete_generation", "list_generations", "prune_generations", "read_latest"]
