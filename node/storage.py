"""Storage node: fragment put, get, head, delete, listing, status and scrub over HTTP.

Routes (all signed with the cluster secret except /v1/health; /metrics also takes a
bearer token), see docs/PROTOCOL.md and the README (Observability).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web

from node import zerocopy
from node.disk import (
    RECENT_DISK_ERROR_S,
    disk_full_problem,
    disk_gauges,
    iso_utc,
    private_dir,
)
from node.fastpath import FastPath, FragmentRoutes, send_cached_body
from node.fastpath import enabled_from_env as fast_path_enabled
from node.fragments import (
    DEFAULT_VOLUME_BYTES,
    CachedBody,
    FragmentStore,
    Written,
)
from node.metrics import Families, ObservabilityConfig, counter, gauge, observability_config
from node.scrub import (
    DEFAULT_SCRUB_PASS_INTERVAL_S,
    DEFAULT_SCRUB_RATE_MB_S,
    DEFAULT_SCRUB_START_DELAY_S,
    SCRUB_STATE_FILE,
    Scrubber,
    ScrubStats,
    pacing_pause_s,
    scrub_loop,
    scrub_now,
)
from node.server import (
    OBSERVER,
    ensure_fd_limit_for_files,
    env_number,
    make_base_app,
    node_arg_parser,
    query_int,
    read_body,
    run,
    secret_from_env,
)
from store.auth import CHECKSUM_HEADER
from store.errors import BadRequest, Unavailable
from store.transport import retrieved
from store.wire import FRAGMENT_CRC_HEADER as CRC_HEADER
from store.wire import FRAGMENT_META_HEADER as META_HEADER
from store.wire import FREED_HEADER, pack, pack_header, uncached_requested, unpack_header

log = logging.getLogger("ecstore.storage")
MAX_FRAGMENT_BYTES = 80 * 1024 * 1024
DEFAULT_COMPACT_RATE_MB_S = 64.0
MAX_LIST_LIMIT = 10_000
DISK_STALL_S = 20.0          # a disk operation running this long: the disk is not answering
STATUS_DISK_TIMEOUT_S = 5.0  # status waits this long for the disk's statistics
READ_ERROR_SHOWN_S = RECENT_DISK_ERROR_S   # status names fragments the disk could not read
FULL_REFUSAL_SHOWN_S = 60.0   # status names fragments refused for the reserve this long after


@dataclass(frozen=True)
class StorageConfig:
    node_id: str
    data_dir: Path
    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True
    scrub_rate_mb_s: float = DEFAULT_SCRUB_RATE_MB_S  # background scrub; 0 = off
    scrub_pass_interval_s: float = DEFAULT_SCRUB_PASS_INTERVAL_S
    scrub_start_delay_s: float = DEFAULT_SCRUB_START_DELAY_S
    reserve_bytes: int | None = None  # refuse fragments below this much free; None: 1%, max 1 GiB
    volume_bytes: int = DEFAULT_VOLUME_BYTES    # a volume file takes no records past this
    compact_interval_s: float = 10.0            # how often to look for volumes to compact
    compact_rate_mb_s: float = DEFAULT_COMPACT_RATE_MB_S    # copying live records, at most
    observability: ObservabilityConfig = ObservabilityConfig()


SCRUB_RATE_ENV = "ECSTORE_SCRUB_RATE_MB_S"
STORE = web.AppKey("store", FragmentStore)
CONFIG = web.AppKey("config", StorageConfig)
SCRUB_STATS = web.AppKey("scrub_stats", ScrubStats)
SCRUB_NOW_LOCK = web.AppKey("scrub_now_lock", asyncio.Lock)
COMPACTIONS = web.AppKey("compactions", list)   # [volumes compacted since start]
COMPACT_NOW = web.AppKey("compact_now", asyncio.Event)   # set: look for volumes to compact now
SENDFILE_MIN_BYTES = 64 * 1024   # smaller records: one read and one write cost less


@dataclass
class SendStats:
    """Fragment GETs whose body went by sendfile (all of it or its start), and its bytes."""
    gets: int = 0
    bytes: int = 0


SENDS = web.AppKey("sends", SendStats)
FAST = web.AppKey("fast_path", FastPath)   # in front of aiohttp when the node runs (main)


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class _Put(NamedTuple):
    """One fragment put waiting in PutQueue for the writer thread."""
    fid: str
    body: Any
    checksum: str
    meta: dict[str, Any]
    uncached: bool
    fut: asyncio.Future[bool]


class PutQueue:
    """Fragment puts, written by one thread in batches: the puts that arrive while a
    batch is written go together in the next - each record appended, one fdatasync per
    volume the batch touched, then the index and every answer at once. One hand-off to
    the thread and one wake-up of the event loop per batch, not per put: with a pool
    thread per put, `perf` put 60% of a storage node's CPU on small puts in the kernel,
    switching between the loop, the pool's threads and the shared sync."""

    def __init__(self, store: FragmentStore) -> None:
        self.store = store
        self._cv = threading.Condition()
        self._queue: list[_Put] = []
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="fragment-writer", daemon=True)
        self._thread.start()
        self.batches = self.puts = 0     # for tests and the curious

    async def put(self, fid: str, body: Any, checksum: str, meta: dict[str, Any],
                  uncached: bool = False) -> bool:
        """FragmentStore.put, in the next batch: True if it replaced a fragment."""
        return await asyncio.shield(self.submit(fid, body, checksum, meta, uncached))

    def submit(self, fid: str, body: Any, checksum: str, meta: dict[str, Any],
               uncached: bool = False) -> asyncio.Future[bool]:
        """put's future, settled when the batch is written (the caller may go away: the
        put is written all the same, its error marked as seen). `uncached`: the
        UNCACHED_HEADER's request (FragmentStore.write_record)."""
        fut: asyncio.Future[bool] = self._loop.create_future()
        with self._cv:
            if self._closed:
                raise Unavailable("storage node shutting down")
            self._queue.append(_Put(fid, body, checksum, meta, uncached, fut))
            self._cv.notify()
        # a caller that goes away (its client hung up) leaves the put to finish, as a
        # pool thread would have: the answer is dropped (and an error seen here)
        fut.add_done_callback(retrieved)
        return fut

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            results: list[tuple[asyncio.Future[bool], bool | BaseException]] = []
            written: list[tuple[Written, asyncio.Future[bool]]] = []
            try:
                self._write(batch, results, written)
            except BaseException as exc:   # noqa: BLE001 - a bug must fail the batch, not hang it
                log.exception("fragment batch failed")
                for w, _ in written:    # appended, neither committed nor given up yet
                    with contextlib.suppress(Exception):
                        self.store.abandon(w)
                err = exc if isinstance(exc, Exception) else RuntimeError("write interrupted")
                done = {id(f) for f, _ in results}
                results += [(p.fut, err) for p in batch if id(p.fut) not in done]
            self.batches += 1
            self.puts += len(batch)
            with contextlib.suppress(RuntimeError):   # the loop closed: nobody is waiting
                self._loop.call_soon_threadsafe(_settle, results)

    def _write(self, batch: list[_Put],
               results: list[tuple[asyncio.Future[bool], bool | BaseException]],
               written: list[tuple[Written, asyncio.Future[bool]]]) -> None:
        """Append every record, sync each volume once, then commit or give up each one:
        `results` gets every put's answer, `written` holds the records appended and not
        yet committed or given up (taken off one at a time)."""
        store = self.store
        for p in batch:
            try:
                written.append((store.write_record(p.fid, p.body, p.checksum, p.meta,
                                                   uncached=p.uncached), p.fut))
            except Exception as exc:  # noqa: BLE001 - this put's answer
                results.append((p.fut, _disk_error(exc)))
        failed: dict[int, Exception] = {}
        if store.fsync:
            for vol in {id(w.vol): w.vol for w, _ in written}.values():
                try:
                    store.sync_volume(vol)
                except OSError as exc:
                    failed[id(vol)] = _disk_error(exc)
        while written:
            w, fut = written.pop(0)
            sync_error = failed.get(id(w.vol))
            if sync_error is not None:
                store.abandon(w)
                results.append((fut, sync_error))
            else:
                results.append((fut, store.commit_record(w)))


PUTS = web.AppKey("puts", PutQueue)
# status asks the disk's statistics (statvfs) in a thread of its own: in the default pool
# it waited behind the requests' reads and writes, and a busy node whose disk answers
# was called "not answering" once they took STATUS_DISK_TIMEOUT_S
DISK_STATS = web.AppKey("disk_stats", ThreadPoolExecutor)


def _disk_error(exc: Exception) -> Exception:
    """A put's OSError (the disk failed a write or a sync) as Unavailable: a 503 that
    sends the client to another node, not a 500 logged as a bug."""
    if isinstance(exc, OSError) and exc.errno != errno.ENOSPC:   # full: its own answer, 507
        return Unavailable(f"the disk failed this write: {exc.strerror or exc} "
                           f"(errno {exc.errno})")
    return exc


def _settle(results: list[tuple[asyncio.Future[bool], bool | BaseException]]) -> None:
    for fut, result in results:
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


async def put_fragment(request: web.Request) -> web.Response:
    checksum = request.headers.get(CHECKSUM_HEADER, "")
    meta = unpack_header(request.headers.get(META_HEADER))
    body = await read_body(request)
    replaced = await request.app[PUTS].put(request.match_info["fid"], body, checksum, meta,
                                           uncached_requested(request.headers))
    return web.Response(status=200 if replaced else 201)


async def get_fragment(request: web.Request) -> web.StreamResponse:
    """The fragment's body and its stored checksum, NOT verified here: every reader
    (client, repair, rebalance) verifies it end to end, which also covers the network,
    and reports a mismatch with POST .../verify. One SHA-256 per read instead of two.
    A fragment whose record is all in the page cache is sent from the event loop, a
    large one with sendfile(2) (no copy through this process); others are read in a
    thread. With x-ecstore-uncached, one that is not cached is read in the thread without
    staying there (read_cached's RWF_NOWAIT read would start a readahead into the cache)."""
    store, fid = request.app[STORE], request.match_info["fid"]
    cached = store.cached_body(fid, SENDFILE_MIN_BYTES)
    if cached is not None:
        return await _send_cached(request, cached)
    uncached = uncached_requested(request.headers)
    frag = None if uncached else store.read_cached(fid)
    if frag is None:
        frag = await _in_thread(store.read, fid, False, uncached)
    return web.Response(body=frag.body, headers=fragment_headers(frag.checksum, frag.meta))


def fragment_headers(checksum: str, meta: dict[str, Any]) -> dict[str, str]:
    headers = {CHECKSUM_HEADER: checksum, META_HEADER: pack_header(meta)}
    crc = meta.get("crc32")
    if isinstance(crc, int) and 0 <= crc < 1 << 32:
        headers[CRC_HEADER] = f"{crc:08x}"
    return headers


class _SentFile(web.StreamResponse):
    """A response whose body went (partly) by sendfile, past aiohttp's writer: its
    body_length (the metrics' bytes out) counts those bytes too."""
    sent = 0

    @property
    def body_length(self) -> int:
        return super().body_length + self.sent


async def _send_cached(request: web.Request, cached: CachedBody) -> web.StreamResponse:
    """The head through aiohttp, the body by sendfile straight from the volume file to the
    socket while the socket takes it (corked: head and body leave as one stream of full
    segments); what the socket does not take at once is read and written as usual."""
    resp = _SentFile(headers=fragment_headers(cached.checksum, cached.meta))
    resp.content_length = cached.length
    await resp.prepare(request)
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    fd = sock.fileno() if sock is not None else -1
    if fd >= 0:
        zerocopy.cork(fd, True)
    try:
        await resp.write(b"")          # the head, held by the cork
        sent, rest = send_cached_body(transport, fd, cached, request.app[SENDS])
        if sent < 0 and transport is not None:   # the client went away
            zerocopy.cork(fd, False)   # (before the abort closes the fd)
            fd = -1
            transport.abort()
            return resp
        resp.sent = sent
        if rest:
            await resp.write(rest)
    finally:
        if fd >= 0:
            zerocopy.cork(fd, False)
    await resp.write_eof()
    return resp


async def verify_fragment(request: web.Request) -> web.Response:
    """Re-read and verify one fragment now (a reader saw a bad checksum): 200 if good,
    500 corrupt after moving it to quarantine, 404 if absent."""
    await _in_thread(request.app[STORE].read, request.match_info["fid"])
    return web.Response(status=200)


async def head_fragment(request: web.Request) -> web.Response:
    frag = await _in_thread(request.app[STORE].read, request.match_info["fid"])
    return web.Response(headers={CHECKSUM_HEADER: frag.checksum,
                                 META_HEADER: pack_header(frag.meta),
                                 "x-ecstore-size": str(len(frag.body))})


async def delete_fragment(request: web.Request) -> web.Response:
    freed = await _in_thread(request.app[STORE].delete, request.match_info["fid"])
    return web.Response(status=204, headers={FREED_HEADER: str(freed)})   # for gc's report


async def list_fragments(request: web.Request) -> web.Response:
    after = request.query.get("after", "")
    limit = query_int(request, "limit", 1000, MAX_LIST_LIMIT)
    names = await _in_thread(request.app[STORE].list, after, limit + 1)
    return web.Response(body=pack({"fragments": names[:limit],
                                   "truncated": len(names) > limit,
                                   "opened": request.app[STORE].open_id}),
                        content_type="application/msgpack")


def stalled_problem(store: FragmentStore) -> str | None:
    """What to say when a disk operation has been running for DISK_STALL_S or more."""
    oldest = store.ops.oldest_s()
    if oldest < DISK_STALL_S:
        return None
    return (f"the disk is not answering: a disk operation has been running for "
            f"{oldest:.0f} s ({store.ops.in_flight()} in flight); check the device "
            "(dmesg) - requests that need it wait")


async def status(request: web.Request) -> web.Response:
    store, cfg = request.app[STORE], request.app[CONFIG]
    stalled = stalled_problem(store)
    disk: dict[str, int | None] = {"disk_total_bytes": None, "disk_free_bytes": None,
                                   "volumes": None, "volume_bytes": None, "dead_bytes": None}
    if stalled is None:     # else the disk's statistics would wait behind the rest
        try:
            disk = dict(await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                request.app[DISK_STATS], store.disk), STATUS_DISK_TIMEOUT_S))
        except asyncio.TimeoutError:
            stalled = (f"the disk is not answering: its statistics took over "
                       f"{STATUS_DISK_TIMEOUT_S:g} s ({store.ops.in_flight()} disk operations "
                       "in flight); check the device (dmesg)")
    free = disk["disk_free_bytes"]
    full = None if free is None else disk_full_problem(free, store.reserve_bytes)
    unreadable = dict(store.unreadable)
    eio = store.eio_reads
    problems = [p for p in (stalled, full, store.write_failure and
                            f"writes refused: {store.write_failure}; check the disk, then "
                            "restart the node",
                            unreadable and
                            f"the disk could not read {sum(unreadable.values())} bytes of "
                            f"{len(unreadable)} volume(s) ({', '.join(sorted(unreadable))}): "
                            "their fragments there are missing here - `ecstore repair` "
                            "rebuilds them - and this is said until the node restarts on a "
                            "disk that reads them; replace the disk",
                            eio.recent(READ_ERROR_SHOWN_S) and
                            f"the disk could not read {eio.count} fragment(s) since start "
                            f"(EIO), the last at {iso_utc(eio.last_at)} ({eio.last}): "
                            "quarantined, `ecstore repair` rebuilds them; check the disk "
                            "(dmesg)",
                            full is None and store.full_refusals.recent(FULL_REFUSAL_SHOWN_S)
                            and f"fragments refused: the disk is nearly full (under "
                            f"{store.reserve_bytes} bytes, the reserve, would stay free after "
                            f"them; {store.full_refusals.summary()}) - puts go to other nodes",
                            store.damaged_bytes and
                            f"the node passed over {sum(store.damaged_bytes.values())} damaged "
                            f"bytes of {len(store.damaged_bytes)} volume(s) when it opened them "
                            f"({', '.join(sorted(os.path.basename(v) for v in store.damaged_bytes))}"
                            "): records whose checks fail, their fragments missing here - run "
                            "`ecstore repair`, which rebuilds them; said until a repair without "
                            "failures has run (the volumes are then rewritten without them)",
                            store.compaction_blocked,
                            store.compaction_errors.recent() and
                            f"volume compaction failed ({store.compaction_errors.summary()}): "
                            "the dead bytes of deleted fragments stay on the disk until it "
                            "runs; check the disk's free space and the node's log") if p]
    return web.json_response({"node_id": cfg.node_id, "role": "storage",
                              "fragments": store.count, "bytes": store.bytes, **disk,
                              "reserve_bytes": store.reserve_bytes,
                              "problems": problems,
                              "quarantined": store.quarantined,
                              "scrub": {**request.app[SCRUB_STATS].to_json(),
                                        "rate_mb_s": cfg.scrub_rate_mb_s}})


async def list_quarantine(request: web.Request) -> web.Response:
    fids = await _in_thread(request.app[STORE].quarantined_ids)
    return web.Response(body=pack({"fragments": fids}), content_type="application/msgpack")


async def scrub(request: web.Request) -> web.Response:
    """One whole pass now, at full speed; one at a time per node."""
    async with request.app[SCRUB_NOW_LOCK]:
        r = await _in_thread(scrub_now, request.app[STORE], request.app[SCRUB_STATS])
    return web.json_response({"checked": r.checked, "bytes_checked": r.bytes_checked,
                              "corrupt": r.corrupt})


async def repaired(request: web.Request) -> web.Response:
    """POST /v1/repaired?opened=ID: `ecstore repair` finished a whole pass without a
    failure, with a listing of this node that came with open id ID (FragmentStore.open_id:
    one per run of the process). If that is this run's, the listing was taken after the
    volumes were opened, so the pass rebuilt every fragment their damaged bytes held: status
    stops naming that damage and the volumes are rewritten without it
    (FragmentStore.damage_repaired). Answers the volume files cleared."""
    store = request.app[STORE]
    opened = request.query.get("opened", "")
    if not opened:
        raise BadRequest("opened (the open id the node's listing came with) is required")
    if opened != store.open_id:
        return web.json_response({"cleared": [], "why": "the listing came from an earlier "
                                  "run of the node: it restarted since"})
    cleared = await _in_thread(store.damage_repaired)
    if cleared:
        request.app[COMPACT_NOW].set()
    return web.json_response({"cleared": [os.path.basename(p) for p in cleared]})


async def health(request: web.Request) -> web.Response:
    """200 while the node can do its work; 503 once its disk has stopped answering
    (a process that answers HTTP over a hung disk is not healthy: an orchestrator's
    health check, docker's, should see it)."""
    cfg = request.app[CONFIG]
    store = request.app.get(STORE)
    stalled = None if store is None else stalled_problem(store)
    return web.json_response({"node_id": cfg.node_id, "role": "storage", "ok": stalled is None,
                              "time": time.time(), "pid": os.getpid(),
                              **({"problem": stalled} if stalled else {})},
                             status=200 if stalled is None else 503)


def storage_metrics(app: web.Application) -> Families:
    """The node's fragments, disk and scrub, read when scraped."""
    store = app.get(STORE)
    if store is None:  # not open yet
        return
    # the scrape runs on the event loop: not a statvfs that may hang with the disk
    disk = None if stalled_problem(store) else store.disk()
    yield gauge("ecstore_storage_disk_oldest_op_seconds", "How long the oldest disk operation "
                f"in flight has been running (0: none; {DISK_STALL_S:g} or more: the disk is "
                "not answering, health answers 503, and the disk's gauges are left out).",
                store.ops.oldest_s())
    yield gauge("ecstore_storage_fragments", "Fragments stored (quarantined ones not "
                "included).", store.count)
    yield gauge("ecstore_storage_fragment_bytes", "Bytes of fragment records stored (live "
                "ones).", store.bytes)
    if disk is not None:
        yield gauge("ecstore_storage_volumes", "Volume files (append-only fragment records).",
                    disk["volumes"])
        yield gauge("ecstore_storage_volume_bytes", "Bytes of all volume files.",
                    disk["volume_bytes"])
        yield gauge("ecstore_storage_dead_bytes", "Bytes of overwritten or deleted fragment "
                    "records and tombstones not yet compacted away.", disk["dead_bytes"])
    yield counter("ecstore_storage_compactions", "Volumes compacted (live records copied "
                  "to the newest volume, the file deleted).", app[COMPACTIONS][0])
    puts = app.get(PUTS)
    if puts is not None:
        yield counter("ecstore_storage_fragment_puts", "Fragment puts the writer thread "
                      "took (stored or refused).", puts.puts)
        yield counter("ecstore_storage_uncached_writes", "Fragments written without "
                      "staying in the page cache (asked for by the writer, x-ecstore-uncached: "
                      "checkpoints, repair, rebalance).", store.uncached_writes)
        yield gauge("ecstore_storage_uncached_writes_supported", "1 while this kernel and "
                    "filesystem take uncached writes (RWF_DONTCACHE, Linux 6.14+); 0: those "
                    "fragments are written through the page cache and dropped from it "
                    "once synced.", 1 if store.uncached_flag else 0)
        yield counter("ecstore_storage_uncached_reads", "Fragment records read without "
                      "staying in the page cache (the scrubber, compaction, and GETs with "
                      "x-ecstore-uncached: repair, rebalance, tier demotion); with no "
                      "RWF_DONTCACHE, those dropped from it after the read.",
                      store.uncached_reads)
        yield counter("ecstore_storage_put_batches", "Batches the writer thread wrote, one "
                      "sync each: puts per batch = how much they share a sync.", puts.batches)
    sends = app[SENDS]
    yield counter("ecstore_storage_sendfile_gets", "Fragment GETs whose body went by "
                  "sendfile from the page cache (no copy through the process).", sends.gets)
    yield counter("ecstore_storage_sendfile_bytes", "Fragment bytes sent by sendfile.",
                  sends.bytes)
    fast = app[FAST]
    yield counter("ecstore_storage_fast_requests", "Fragment GETs and PUTs answered by the "
                  "fast path (node.fastpath), without aiohttp.", fast.requests)
    yield counter("ecstore_storage_fast_handovers", "Connections the fast path handed to "
                  "aiohttp (their first request not a fragment GET or PUT it answers).",
                  fast.handovers)
    yield gauge("ecstore_storage_quarantined_fragments", "Fragment files in quarantine "
                "(found corrupt by a reader or the scrubber).", store.quarantined)
    if disk is not None:
        yield from disk_gauges("storage", disk, store.reserve_bytes, "data disk")
    yield from scrub_metrics(app[SCRUB_STATS])


def scrub_metrics(stats: ScrubStats) -> Families:
    s = stats.to_json()
    yield counter("ecstore_scrub_fragments_checked", "Fragments re-read and verified by "
                  "the scrubber.", s["fragments_checked_total"])
    yield counter("ecstore_scrub_checked_bytes", "Bytes re-read by the scrubber.",
                  stats.bytes_checked_total)
    yield counter("ecstore_scrub_corrupt_fragments", "Corrupt fragments the scrubber "
                  "found and quarantined.", s["corrupt_found_total"])
    yield gauge("ecstore_scrub_running", "1 while a scrub pass is under way.", int(s["running"]))
    yield gauge("ecstore_scrub_last_pass_completed_timestamp_seconds", "When the last whole "
                "pass ended (unix time; 0 before the first, kept across restarts).",
                s["last_pass_completed_at"] or 0)


def paced(rate_mb_s: float) -> Callable[[int], None]:
    """A compaction's pace(n): sleeps so that the bytes copied so far stay at or under
    the rate (scrub's pacing rule)."""
    start, total = time.monotonic(), 0

    def pace(n: int) -> None:
        nonlocal total
        total += n
        time.sleep(pacing_pause_s(total, time.monotonic() - start, rate_mb_s * 1e6))
    return pace


async def compact_loop(app: web.Application) -> None:
    """Compact volumes that are less than half live, one at a time, every interval, at
    no more than the configured rate."""
    store, cfg, now = app[STORE], app[CONFIG], app[COMPACT_NOW]
    while True:
        with contextlib.suppress(TimeoutError):   # or at once: volumes to rewrite (repaired)
            await asyncio.wait_for(now.wait(), cfg.compact_interval_s)
        now.clear()
        if not store.compactable():
            store.compaction_blocked = None   # what blocked it is gone (or became live)
            continue
        try:
            r = await _in_thread(store.compact, 1, paced(cfg.compact_rate_mb_s))
        except Exception as exc:   # a full disk, an I/O error: logged, tried again later
            log.exception("volume compaction failed")
            store.compaction_errors.note(str(exc) or type(exc).__name__)
            continue
        app[COMPACTIONS][0] += r.volumes


def make_app(config: StorageConfig) -> web.Application:
    app = make_base_app(config.secret, MAX_FRAGMENT_BYTES, config.node_id, "storage",
                        config.observability)
    app[CONFIG] = config
    app[OBSERVER].add_collector(lambda: storage_metrics(app))

    app[SCRUB_STATS] = ScrubStats(Path(config.data_dir) / SCRUB_STATE_FILE)

    async def open_store(app: web.Application) -> AsyncIterator[None]:
        private_dir(Path(config.data_dir))
        app[STORE] = await _in_thread(FragmentStore, config.data_dir, config.fsync,
                                      config.reserve_bytes, config.volume_bytes)
        # every volume is an open file: room for 1,024 more (a TiB of 1 GiB volumes) or
        # twice today's, beside the connections
        volumes = app[STORE].disk()["volumes"]
        ensure_fd_limit_for_files(max(2 * volumes, volumes + 1024))
        app[SCRUB_NOW_LOCK] = asyncio.Lock()
        app[PUTS] = PutQueue(app[STORE])
        app[DISK_STATS] = ThreadPoolExecutor(1, thread_name_prefix="ecstore-disk-stats")
        yield
        app[DISK_STATS].shutdown(wait=False, cancel_futures=True)   # it may hang with the disk
        await _in_thread(app[PUTS].close)

    async def background_scrub(app: web.Application) -> AsyncIterator[None]:
        if config.scrub_rate_mb_s <= 0:
            yield
            return
        task = asyncio.create_task(scrub_loop(
            Scrubber(app[STORE], app[SCRUB_STATS], resume=True), config.scrub_rate_mb_s,
            config.scrub_pass_interval_s, config.scrub_start_delay_s))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def background_compaction(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(compact_loop(app))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app[COMPACTIONS] = [0]
    app[COMPACT_NOW] = asyncio.Event()
    app[SENDS] = SendStats()
    app[FAST] = FastPath(app, FragmentRoutes(lambda: (app[STORE], app[PUTS], app[SENDS]),
                                             fragment_headers, SENDFILE_MIN_BYTES))
    app.cleanup_ctx.append(open_store)
    app.cleanup_ctx.append(background_scrub)
    app.cleanup_ctx.append(background_compaction)
    fid = "/v1/fragments/{fid}"
    app.add_routes([
        web.get("/v1/health", health),
        web.get("/v1/status", status),
        web.get("/v1/fragments", list_fragments),
        web.get("/v1/quarantine", list_quarantine),
        web.post("/v1/scrub", scrub),
        web.post("/v1/repaired", repaired),
        web.put(fid, put_fragment),
        web.get(fid, get_fragment, allow_head=False),
        web.head(fid, head_fragment),
        web.delete(fid, delete_fragment),
        web.post(fid + "/verify", verify_fragment),
    ])
    return app


def main(argv: list[str] | None = None) -> None:
    p = node_arg_parser("storage")
    p.add_argument("--scrub-rate-mb-s", type=float,
                   default=env_number(SCRUB_RATE_ENV, DEFAULT_SCRUB_RATE_MB_S, "MB/s"),
                   help=f"background scrub read rate, 0 = off (default ${SCRUB_RATE_ENV}, "
                   f"else {DEFAULT_SCRUB_RATE_MB_S})")
    p.add_argument("--scrub-interval-s", type=float, default=DEFAULT_SCRUB_PASS_INTERVAL_S,
                   help="rest between background scrub passes, seconds")
    p.add_argument("--reserve-mb", type=float, default=None,
                   help="free space kept on the disk: fragments that would leave less are "
                   "refused with 507 (default 1%% of the disk, at most 1024)")
    p.add_argument("--compact-rate-mb-s", type=float, default=DEFAULT_COMPACT_RATE_MB_S,
                   help="how fast volume compaction may copy live records (default "
                   "%(default)g)")
    p.add_argument("--volume-mb", type=float, default=DEFAULT_VOLUME_BYTES / 2**20,
                   help="size at which a volume file stops taking fragments and a new one "
                   "is started (default %(default)g)")
    a = p.parse_args(argv)
    if a.scrub_rate_mb_s < 0 or a.scrub_interval_s < 0:
        p.error("--scrub-rate-mb-s and --scrub-interval-s must not be negative")
    if a.reserve_mb is not None and a.reserve_mb < 0:
        p.error("--reserve-mb must not be negative")
    if a.compact_rate_mb_s <= 0:
        p.error("--compact-rate-mb-s must be positive")
    if not 1 <= a.volume_mb <= 1024 * 1024:
        p.error("--volume-mb must be between 1 and 1048576")
    cfg = StorageConfig(a.id, a.data, secret_from_env(), a.host, a.port, not a.no_fsync,
                        scrub_rate_mb_s=a.scrub_rate_mb_s,
                        scrub_pass_interval_s=a.scrub_interval_s,
                        reserve_bytes=None if a.reserve_mb is None else int(a.reserve_mb * 2**20),
                        volume_bytes=int(a.volume_mb * 2**20),
                        compact_rate_mb_s=a.compact_rate_mb_s,
                        observability=observability_config(a))
    app = make_app(cfg)
    run(app, cfg.host, cfg.port, front=app[FAST] if fast_path_enabled() else None)


if __name__ == "__main__":
    main()
