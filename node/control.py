"""Control node: metadata records, buckets and the cluster map over HTTP (msgpack bodies).

Routes (all signed except /v1/health; /metrics also takes a bearer token), see
docs/PROTOCOL.md and the README (Observability: metrics and logs).
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web
from prometheus_client.core import CounterMetricFamily
from yarl import URL

from node.disk import disk_gauges, private_dir
from node.fastpath import FastConn, FastPath, Request, Routes
from node.fastpath import enabled_from_env as fast_path_enabled
from node.logs import log_event, log_step, request_log
from node.metadb import (
    CLOCK_AHEAD_NOTE_S,
    MAP_KEY,
    MAX_CARRIED_NOTES,
    MAX_NOTES_PER_PAGE,
    REPLACED_FOR_NS,
    SUMMARIES_KEY,
    GroupCommit,
    MetaDB,
    View,
    access_key,
    bucket_key,
    carried_notes,
    newest,
    object_key,
)
from node.metrics import REQUEST_ID, Families, ObservabilityConfig, counter, gauge, observability_config
from node.server import (
    OBSERVER,
    env_number,
    int_param,
    make_base_app,
    node_arg_parser,
    query_int,
    run,
    secret_from_env,
    verified_body,
)
from placement.cluster_map import ClusterMap
from store.auth import CHECKSUM_HEADER
from store.digest import matches as digest_matches
from store.errors import BadRequest, Conflict, EcstoreError, NotFound, Unavailable
from store.listing import MAX_ROLLED_DELIMITER_BYTES, ROW_FIELDS
from store.names import OPS_BUCKET, SYSTEM_BUCKETS, WORKER_OPS, check_bucket_name, check_key
from store.transport import REQUEST_ID_RE
from store.wire import MAX_RECORD_BYTES, pack, unpack

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_SCAN_LIMIT = 10_000
MAX_BATCH_ITEMS = 256          # records in one POST /v1/objects
REQUIRED_FIELDS = {"ts": int, "version_id": str, "deleted": bool}
DB_RECOVER_INTERVAL_S = 1.0    # how often a database that refuses writes is tried again
RESERVE_ENV = "ECSTORE_CONTROL_RESERVE_MB"   # --reserve-mb's default, for containers


@dataclass(frozen=True)
class ControlConfig:
    node_id: str
    data_dir: Path
    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True
    observability: ObservabilityConfig = ObservabilityConfig()
    reserve_bytes: int | None = None   # refuse writes below this much free; None: 1%, max 1 GiB
    recover_interval_s: float = DB_RECOVER_INTERVAL_S


DB = web.AppKey("db", MetaDB)
COMMIT = web.AppKey("commit", GroupCommit)   # every write goes through it
CONFIG = web.AppKey("config", ControlConfig)
FAST = web.AppKey("fast_path", FastPath)   # in front of aiohttp when the node runs (main)


MSGPACK = "application/msgpack"


def msgpack_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=pack(value), status=status, content_type=MSGPACK)


def put_answer(applied: bool, current: dict[str, Any]) -> dict[str, Any]:
    """What a record put answers: whether it was kept, and the record now current."""
    return {"applied": applied, "ts": current["ts"], "version_id": current["version_id"]}


def checked_record(raw: bytes, db: MetaDB) -> dict[str, Any]:
    """The record a put carries, checked; one dated ahead of this node's clock is noted
    (db.note_record_date: a writer's clock is off)."""
    record = unpack(raw, MAX_RECORD_BYTES)
    if not isinstance(record, dict):
        raise BadRequest("record must be a map")
    for field, typ in REQUIRED_FIELDS.items():
        if not isinstance(record.get(field), typ):
            raise BadRequest(f"record field {field!r} missing or not {typ.__name__}")
    db.note_record_date(record["ts"])
    return record


def _names(request: web.Request) -> tuple[str, str]:
    return checked_names(request.match_info["bucket"], request.match_info["key"])


def checked_names(bucket: str, key: str) -> tuple[str, str]:
    return check_bucket_name(bucket, system_ok=True), check_key(key)


async def put_object(request: web.Request) -> web.Response:
    bucket, key = _names(request)
    raw = await verified_body(request)
    applied, current = await request.app[COMMIT].apply(
        newest(object_key(bucket, key), checked_record(raw, request.app[DB]), raw))
    return msgpack_response(put_answer(applied, current))


async def put_objects(request: web.Request) -> web.Response:
    """POST /v1/objects: many object record puts in one request - a client sends the
    writes that queued up for this node while its previous one was on the way. Body: a
    list of [bucket, key, packed record, request id]; each is checked and applied as
    PUT /v1/objects/{bucket}/{key} would be, all in one group commit. Reply: [status,
    body] per item, in order (200 and {applied, ts, version_id}, or the error's status
    and body): a bad item fails alone. One log line names every item's request id."""
    items = await batch_items(request, 4)
    out, at, mutations = prepare_puts(items, request.app[DB])
    return msgpack_response(finish_puts(out, at, await request.app[COMMIT].apply_many(mutations)))


def prepare_puts(items: list[Any], db: MetaDB) -> tuple[list[list[Any]], list[int], list[Any]]:
    """A put batch's items checked: (the reply so far - bad items' errors -, the index
    of each good item, its mutation)."""
    out: list[list[Any]] = [[0, None]] * len(items)
    mutations, at = [], []
    for i, item in enumerate(items):
        try:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                    and isinstance(item[1], str) and isinstance(item[2], bytes)):
                raise BadRequest("an item must be [bucket, key, packed record, request id]")
            bucket, key, raw, _ = item
            k = object_key(check_bucket_name(bucket, system_ok=True), check_key(key))
            mutations.append(newest(k, checked_record(raw, db), raw))
            at.append(i)
        except EcstoreError as exc:
            out[i] = [exc.status, exc.to_body()]
    return out, at, mutations


def finish_puts(out: list[list[Any]], at: list[int], results: list[Any]) -> list[list[Any]]:
    """The batch's reply once its mutations are committed (`results`, in order)."""
    for i, result in zip(at, results):
        if isinstance(result, EcstoreError):
            out[i] = [result.status, result.to_body()]
        elif isinstance(result, BaseException):
            raise result
        else:
            applied, current = result
            out[i] = [200, put_answer(applied, current)]
    return out


async def batch_items(request: web.Request, width: int) -> list[Any]:
    """A batch's items (each should be a list of `width`, its last a request id), and
    the batch's log line naming every item's request id: grep finds an operation's
    record requests whether they went alone or in a batch."""
    return batch_items_of(await verified_body(request), width, request.get(REQUEST_ID, "-"))


def batch_items_of(body: bytes | bytearray, width: int, rid: str) -> list[Any]:
    """batch_items of a body already checked against its signed checksum."""
    items = unpack(body, MAX_BODY_BYTES)
    if not isinstance(items, list) or not 0 < len(items) <= MAX_BATCH_ITEMS:
        raise BadRequest(f"body must be a list of 1 to {MAX_BATCH_ITEMS} items")
    ids = [item[-1] for item in items if isinstance(item, list) and len(item) == width
           and isinstance(item[-1], str) and REQUEST_ID_RE.fullmatch(item[-1])]
    log_event(request_log, logging.INFO, "batch",
              {"request_id": rid, "items": len(items), "request_ids": ",".join(ids) or "-"})
    return items


async def get_objects(request: web.Request) -> web.Response:
    """POST /v1/objects/read: many object records in one request (a client's reads that
    queued up for this node). Body: a list of [bucket, key, request id]. Reply: [status,
    body] per item, in order: 200 and the packed record, 404 and an error body when
    there is none, 400 for a bad name."""
    return msgpack_response(read_records(request.app[DB], await batch_items(request, 3)))


def read_records(db: MetaDB, items: list[Any]) -> list[list[Any]]:
    """A read batch's reply."""
    out: list[list[Any]] = []
    for item in items:
        try:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and isinstance(item[1], str)):
                raise BadRequest("an item must be [bucket, key, request id]")
            bucket = check_bucket_name(item[0], system_ok=True)
            key = check_key(item[1])
            raw = db.get_raw(object_key(bucket, key))
            if raw is None:
                raise NotFound(f"no record for {bucket}/{key}")
            out.append([200, raw])      # the record as stored, packed
        except EcstoreError as exc:
            out.append([exc.status, exc.to_body()])
    return out


async def get_object(request: web.Request) -> web.Response:
    return web.Response(body=stored_record(request.app[DB], *_names(request)),
                        content_type=MSGPACK)


def stored_record(db: MetaDB, bucket: str, key: str) -> bytes:
    """An object's record as stored (packed: sent as it is, not unpacked and packed
    again); NotFound if there is none."""
    raw = db.get_raw(object_key(bucket, key))
    if raw is None:
        raise NotFound(f"no record for {bucket}/{key}")
    return raw


async def purge_object(request: web.Request) -> web.Response:
    """Drop a tombstone (garbage collection); refuses to drop a live record.

    With `?version_id=V` only that tombstone is dropped: 409 if the record is another one.
    """
    bucket, key = _names(request)
    k = object_key(bucket, key)
    want = request.query.get("version_id")

    def purge(view: View) -> None:
        record = view.get(k)
        if record is None:
            raise NotFound(f"no record for {bucket}/{key}")
        if not record.get("deleted"):
            raise Conflict("only tombstones can be purged")
        if want is not None and record.get("version_id") != want:
            raise Conflict(f"the record of {bucket}/{key} is not version {want}")
        view.delete(k)
    await request.app[COMMIT].apply(purge)
    return web.Response(status=204)


async def drop_record(request: web.Request) -> web.Response:
    """Drop a record this node no longer holds after a control ring change; only the
    version the mover copied elsewhere (409 if a newer one arrived meanwhile)."""
    bucket, key = _names(request)
    k = object_key(bucket, key)
    want = request.query.get("version_id")

    def drop(view: View) -> None:
        record = view.get(k)
        if record is None:
            raise NotFound(f"no record for {bucket}/{key}")
        if record.get("version_id") != want:
            raise Conflict(f"the record of {bucket}/{key} is another version")
        view.delete(k)
    await request.app[COMMIT].apply(drop)
    return web.Response(status=204)


async def carry_notes(request: web.Request) -> web.Response:
    """POST /v1/notes/{bucket}/{key}, body [[version_id, replaced_at_ns], ...]: notes of
    replaced versions another control node held for this key, brought along by a metadata
    move (store.metamove) before it drops the record there - else gc, which reads the
    notes of the nodes that hold the key now, would not keep them. {"added": N}."""
    bucket, key = _names(request)
    if bucket in SYSTEM_BUCKETS:
        raise BadRequest(f"{bucket} keeps no notes of replaced versions")
    body = unpack(await verified_body(request), MAX_BODY_BYTES)
    if not isinstance(body, list) or len(body) > MAX_CARRIED_NOTES or not all(
            type(e) is list and len(e) == 2 and type(e[0]) is str and type(e[1]) is int
            for e in body):
        raise BadRequest(f"notes must be a list of at most {MAX_CARRIED_NOTES} "
                         "[version_id, replaced_at_ns] pairs")
    added = await request.app[COMMIT].apply(carried_notes(
        object_key(bucket, key), [(v, at) for v, at in body], time.time_ns()))
    return msgpack_response({"added": added})


MAX_DELIMITER_BYTES = MAX_ROLLED_DELIMITER_BYTES   # what the client pushes down


def list_page(db: MetaDB, bucket: str, prefix: str, after: str, limit: int, delimiter: str,
              full: bool = False, rows: bool = False, replaced: bool = False,
              replaced_since: int = 1, notes_only: bool = False) -> dict[str, Any]:
    """A sorted page of object records (tombstones included: the client merge drops them).
    With a delimiter (and not `full`), each common prefix is cut short at its first live
    record (MetaDB.scan_listed) and the reply says where to resume. `full`: whole records,
    for moving metadata; else what a listing shows - as maps ("records"), or with `rows`
    as lists in ROW_FIELDS order ("rows": a third of the bytes, cheaper both ends).
    `replaced` (gc's scan, no delimiter): also "replaced", {key: the versions its
    predecessors read, [[version_id, replaced_at_ns], ...]} for the page's key range, those
    replaced at or after `replaced_since` (and within REPLACED_FOR_NS of this node's
    clock); the page ends early, at a key, rather than carry over MAX_NOTES_PER_PAGE.
    `notes_only` (with `replaced`; gc's scan of the notes after its read of the live
    records): no records, only the notes, of up to `limit` keys with notes (counted
    whether or not any is recent enough to send), and "last", the key to resume after."""
    if len(delimiter.encode()) > MAX_DELIMITER_BYTES:
        raise BadRequest(f"delimiter longer than {MAX_DELIMITER_BYTES} bytes")
    if replaced and (delimiter or full):
        raise BadRequest("replaced=1 lists notes beside records: not with a delimiter or full=1")
    if notes_only and not replaced:
        raise BadRequest("notes=1 lists the notes of replaced versions: it needs replaced=1")
    base = object_key(bucket, "")
    start, since = base + prefix.encode(), base + after.encode() if after else b""
    reply: dict[str, Any] = {}
    if notes_only:
        return notes_page(db, base, start, since, limit, replaced_since, rows)
    if full:
        records, truncated = db.scan(start, since, limit)
        reply["records"] = [{**r, "key": k[len(base):].decode()} for k, r in records]
    else:
        listed, truncated, resume = db.scan_listed(start, since, limit, len(start),
                                                   delimiter.encode())
        if delimiter and resume:
            reply["resume"] = resume[len(base):].decode()
        cut = len(base)
        for row in listed:
            row[0] = row[0][cut:].decode()
        if replaced:
            # what the records in this page's key range replaced (node.metadb.new_notes),
            # keyed like the rows: gc's scan
            end = None if not truncated or not listed else base + listed[-1][0].encode()
            floor = max(replaced_since, time.time_ns() - REPLACED_FOR_NS)
            notes, count = {}, 0
            for key, entries, read in db.replaced_in(start, since, end, floor):
                name = key[cut:].decode()
                if count >= MAX_NOTES_PER_PAGE and listed and name > listed[0][0]:
                    # enough read for one reply: the page ends before this key
                    listed = [r for r in listed if r[0] < name]
                    truncated = True
                    break
                if entries:
                    notes[name] = entries
                count += read     # what was decoded, sent or not: the loop's time
            reply["replaced"] = notes
        if rows:
            reply["rows"] = listed
        else:
            reply["records"] = [dict(zip(ROW_FIELDS, row)) for row in listed]
    reply["truncated"] = truncated
    return reply


def notes_page(db: MetaDB, base: bytes, start: bytes, since: bytes, limit: int,
               replaced_since: int, rows: bool) -> dict[str, Any]:
    """list_page's `notes_only` answer: the notes of the keys under `start` after `since`
    (object keys), up to `limit` keys with notes (counted whether or not any is at or
    after replaced_since: those before it are left out) and MAX_NOTES_PER_PAGE notes
    read. Shaped as a listing page with no records (a node of an earlier version, which
    does not know notes=1, answers the records and their notes: the client reads both)."""
    floor = max(replaced_since, time.time_ns() - REPLACED_FOR_NS)
    notes: dict[str, Any] = {}
    count, keys, last, truncated = 0, 0, "", False
    cut = len(base)
    for key, entries, read in db.replaced_in(start, since, None, floor):
        if keys >= limit or (keys and count >= MAX_NOTES_PER_PAGE):
            truncated = True            # another key is there: the next page starts at it
            break
        last = key[cut:].decode()
        if entries:
            notes[last] = entries
        count += read
        keys += 1
    return {"rows" if rows else "records": [], "replaced": notes, "truncated": truncated,
            "last": last}


async def list_objects(request: web.Request) -> web.Response:
    """GET /v1/list/{bucket}?prefix=&after=&limit=&delimiter=&full=1&rows=1&replaced=1
    &replaced_since=&notes=1: list_page."""
    return web.Response(body=list_reply(request.app[DB], request.match_info["bucket"],
                                         request.query), content_type=MSGPACK)


def list_reply(db: MetaDB, bucket: str, query: Mapping[str, str]) -> bytes:
    """list_objects' answer, packed (both paths): the bucket name checked first, then
    the limit, then the delimiter."""
    return pack(list_page(
        db, check_bucket_name(bucket, system_ok=True), query.get("prefix", ""),
        query.get("after", ""), int_param(query.get("limit"), "limit", 1000, MAX_SCAN_LIMIT),
        query.get("delimiter", ""), query.get("full") == "1", query.get("rows") == "1",
        query.get("replaced") == "1",
        int_param(query.get("replaced_since"), "replaced_since", 1, 2**63 - 1),
        query.get("notes") == "1"))


ACCESS_HISTORY_MINUTES = 24 * 60   # read counts are kept per minute for this long
MAX_ACCESS_ENTRIES = 10_000
MAX_READS_PER_ENTRY = 2**32        # reads of one key in one report
MAX_READS_PER_MINUTE = 2**62       # a minute's count stays a msgpack int whatever is reported


def merge_access(held: dict[str, Any] | None, reads: int, last: float,
                 minute: int) -> dict[str, Any]:
    """Add `reads` reads, the latest at `last` (unix s), to a key's read history: a count
    per minute (sparse) over the last day, and the time of the last read."""
    rec = held or {"last": 0.0, "minutes": {}}
    minutes = {m: int(n) for m, n in rec["minutes"].items()
               if int(m) > minute - ACCESS_HISTORY_MINUTES}   # keys: str(minute)
    minutes[str(minute)] = min(MAX_READS_PER_MINUTE, minutes.get(str(minute), 0) + reads)
    return {"last": max(float(rec["last"]), last), "minutes": minutes}


async def record_access(request: web.Request) -> web.Response:
    """Reads reported by clients, batched: {"entries": [{bucket, key, reads, last}]}.
    Advisory (for the tiering worker): not fsynced, last writer merges."""
    body = unpack(await verified_body(request), MAX_BODY_BYTES)
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_ACCESS_ENTRIES:
        raise BadRequest(f"entries must be a list of at most {MAX_ACCESS_ENTRIES}")
    checked = [access_entry(e) for e in entries]   # all of them before any is applied
    minute = int(time.time() // 60)

    def merge(view: View) -> None:
        for bucket, key, reads, last in checked:
            k = access_key(bucket, key)
            view.put(k, merge_access(view.get(k), reads, last, minute))
    await request.app[COMMIT].apply(merge, lazy=True)
    return msgpack_response({"recorded": len(entries)})


def access_entry(e: Any) -> tuple[str, str, int, float]:
    """(bucket, key, reads, last) of one reported entry; BadRequest if it is not one."""
    try:
        bucket = check_bucket_name(e["bucket"], system_ok=True)
        key = check_key(e["key"])
        reads, last = int(e["reads"]), float(e["last"])
    except (KeyError, TypeError, ValueError, OverflowError):  # inf reads, 1e400 last
        raise BadRequest("each entry needs bucket, key, reads and last") from None
    if not 1 <= reads <= MAX_READS_PER_ENTRY:
        raise BadRequest(f"reads must be between 1 and {MAX_READS_PER_ENTRY}")
    if not math.isfinite(last):
        raise BadRequest("last must be a finite unix time")
    return bucket, key, reads, last


async def list_access(request: web.Request) -> web.Response:
    """A sorted page of read histories of one bucket's keys."""
    bucket = check_bucket_name(request.match_info["bucket"], system_ok=True)
    after = request.query.get("after", "")
    limit = query_int(request, "limit", 1000, MAX_SCAN_LIMIT)
    base = access_key(bucket, "")
    rows, truncated = request.app[DB].scan(base, base + after.encode() if after else b"",
                                           limit)
    return msgpack_response({"records": [{"key": k[len(base):].decode(), **r} for k, r in rows],
                             "truncated": truncated})


async def put_bucket(request: web.Request) -> web.Response:
    bucket = check_bucket_name(request.match_info["bucket"], system_ok=True)
    raw = await verified_body(request)
    applied, current = await request.app[COMMIT].apply(
        newest(bucket_key(bucket), checked_record(raw, request.app[DB]), raw))
    return msgpack_response(put_answer(applied, current))


async def get_bucket(request: web.Request) -> web.Response:
    bucket = check_bucket_name(request.match_info["bucket"], system_ok=True)
    record = request.app[DB].get(bucket_key(bucket))
    if record is None:
        raise NotFound(f"no record for bucket {bucket}")
    return msgpack_response(record)


async def list_buckets(request: web.Request) -> web.Response:
    rows, _ = request.app[DB].scan(b"b", b"", MAX_SCAN_LIMIT)
    return msgpack_response({"buckets": [{"name": k[1:].decode(), **r} for k, r in rows]})


async def get_map(request: web.Request) -> web.Response:
    data = request.app[DB].get_map()
    if data is None:
        raise NotFound("this control node holds no cluster map yet")
    return web.Response(body=data, content_type="application/msgpack")


async def put_map(request: web.Request) -> web.Response:
    """Accept a cluster map only if its epoch is newer than the one held."""
    data = await verified_body(request)
    try:
        new = ClusterMap.from_bytes(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadRequest(f"invalid cluster map: {exc}") from None

    def install(view: View) -> None:
        held = view.get_raw(MAP_KEY)
        if held is not None:
            old = ClusterMap.from_bytes(held)
            if new.epoch < old.epoch or (new.epoch == old.epoch and data != held):
                raise Conflict(f"map epoch {new.epoch} is not newer than {old.epoch}",
                               epoch=old.epoch)
        view.put(MAP_KEY, data)
    await request.app[COMMIT].apply(install)
    return msgpack_response({"epoch": new.epoch})


async def status(request: web.Request) -> web.Response:
    db, cfg = request.app[DB], request.app[CONFIG]
    try:
        held = db.get_map() if db.is_open else None
    except Unavailable:     # a read that failed: db_health's problems say so
        held = None
    epoch = ClusterMap.from_bytes(held).epoch if held else 0
    return web.json_response({"node_id": cfg.node_id, "role": "control", "epoch": epoch,
                              "db_bytes": _dir_bytes(db.path),
                              "records": db.records_estimate(), **db_health(db)})


def db_health(db: MetaDB) -> dict[str, Any]:
    """What status and health say of the database and its disk: disk_total_bytes,
    disk_free_bytes, reserve_bytes, writable (False: writes refused now), db_error
    (RocksDB's error while it refuses writes) and problems (why the node is degraded,
    in an operator's words; empty while it is not)."""
    problems = db.problems()
    return {**db.disk(), "writable": not problems and db.is_open, "db_error": db.failed,
            "problems": problems + db.recent_problems()}


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def health(request: web.Request) -> web.Response:
    """Alive and answering (200, "ok") - also while its disk is full: a restart would not
    free it; `writable` and `problems` say so."""
    return web.json_response({"node_id": request.app[CONFIG].node_id, "role": "control",
                              "ok": True, "time": time.time(), "pid": os.getpid(),
                              **db_health(request.app[DB])})


class MapEpoch:
    """The epoch of the map a node holds, decoded again only when the map changed."""

    def __init__(self) -> None:
        self._held: bytes | None = None
        self._epoch = 0

    def of(self, held: bytes | None) -> int:
        if held is None:
            return 0
        if held != self._held:
            self._held, self._epoch = held, ClusterMap.from_bytes(held).epoch
        return self._epoch


# the record route as aiohttp matches it: on the path as yarl gives it with every escape
# but %2F and %25 undone ("path_safe"), a bucket of no "/", then the key
_OBJECT_PATH = re.compile(r"/v1/objects/(?P<bucket>[^{}/]+)/(?P<key>.+)")
# targets the fast path routes: no query, and only characters every HTTP parser takes as
# they are (unreserved, "/", whole %XX escapes); store.transport.quote_key writes these
_PLAIN_TARGET = re.compile(r"(?:[A-Za-z0-9._~/-]|%[0-9A-Fa-f]{2})+")


_LIST_PATH = re.compile(r"/v1/list/(?P<bucket>[^{}/]+)")
# queries the fast path routes: what urlencode writes (unreserved, "+", whole %XX escapes)
_PLAIN_QUERY = re.compile(r"(?:[A-Za-z0-9._~/+=&-]|%[0-9A-Fa-f]{2})*")


def _route_list(method: str, target: str) -> tuple[str, Any] | None:
    """GET /v1/list/{bucket}?query: (bucket, the query's parameters, the first of each
    name, decoded as aiohttp's yarl decodes them: "+" a space, %XX UTF-8)."""
    path, _, qs = target.partition("?")
    if method != "GET" or not _PLAIN_TARGET.fullmatch(path) or not _PLAIN_QUERY.fullmatch(qs):
        return None
    m = _LIST_PATH.fullmatch(URL.build(path=path, encoded=True).path_safe)
    if m is None:
        return None
    query: dict[str, str] = {}
    for name, value in parse_qsl(qs, keep_blank_values=True):
        if "\ufffd" in value or "\ufffd" in name:   # not UTF-8: aiohttp judges it
            return None
        query.setdefault(name, value)
    return "list_objects", (_unquote_safe(m["bucket"]), query)


def _unquote_safe(value: str) -> str:
    """What aiohttp's router does to a matched value after path_safe."""
    return value.replace("%2F", "/").replace("%25", "%") if "%" in value else value


class RecordRoutes(Routes):
    """A control node's fast requests (node.fastpath): the object record reads and
    writes that are nearly all of its traffic - GET and PUT /v1/objects/{bucket}/{key},
    POST /v1/objects and /v1/objects/read - and listings, GET /v1/list/{bucket}, answered as their aiohttp routes above
    answer them (the same checks in the same order, statuses, bodies, batch and request
    log lines). Names are unescaped as aiohttp's router unescapes them (yarl's
    path_safe, then %2F and %25); a target with a query (but a listing's) or a character
    an HTTP parser might refuse goes to aiohttp."""

    def __init__(self) -> None:
        self.db: MetaDB | None = None
        self.commit: GroupCommit | None = None

    def bind(self, app: web.Application) -> None:
        self.db, self.commit = app[DB], app[COMMIT]

    def route(self, method: str, target: str, headers: dict[str, str],
              length: int) -> tuple[str, Any] | None:
        if target.startswith("/v1/list/"):
            return _route_list(method, target)
        if target == "/v1/objects" or target == "/v1/objects/read":
            if method != "POST" or not length:
                return None
            return ("put_objects" if target == "/v1/objects" else "get_objects"), None
        if (method not in ("GET", "PUT") or not target.startswith("/v1/objects/")
                or not _PLAIN_TARGET.fullmatch(target)):
            return None
        m = _OBJECT_PATH.fullmatch(URL.build(path=target, encoded=True).path_safe)
        if m is None:
            return None
        if method == "PUT" and not length:
            return None
        names = _unquote_safe(m["bucket"]), _unquote_safe(m["key"])
        return ("get_object" if method == "GET" else "put_object"), names

    def answer(self, conn: FastConn, req: Request, body: bytearray | None) -> None:
        db, commit = self.db, self.commit
        assert db is not None and commit is not None
        op = req.op
        if op == "list_objects":
            conn.reply(req, 200, list_reply(db, *req.arg), MSGPACK)
            return
        if op == "get_object":
            conn.reply(req, 200, stored_record(db, *checked_names(*req.arg)), MSGPACK)
            return
        # a bad name is answered before the body is checked, as put_object answers it
        names = checked_names(*req.arg) if op == "put_object" else None
        raw = bytes(self._verified(req, body))
        if names is not None:
            fut = commit.submit(newest(object_key(*names), checked_record(raw, db), raw))
            conn.wait(fut, req, lambda r, f: conn.reply(r, 200, pack(put_answer(*f.result())),
                                                        MSGPACK))
        elif op == "get_objects":
            conn.reply(req, 200, pack(read_records(db, batch_items_of(raw, 3, req.rid))),
                       MSGPACK)
        else:
            out, at, mutations = prepare_puts(batch_items_of(raw, 4, req.rid), db)
            conn.wait(commit.submit_many(mutations), req,
                      lambda r, f: conn.reply(r, 200, pack(finish_puts(out, at, f.result())),
                                              MSGPACK))

    @staticmethod
    def _verified(req: Request, body: bytearray | None) -> bytearray:
        """node.server.verified_body's check."""
        if body is None or not digest_matches(body, req.headers.get(CHECKSUM_HEADER)):
            raise BadRequest("body does not match its signed checksum")
        return body


OP_GAUGES = (("done", "ecstore_op_done", "Items (objects; gc: fragments and tombstones) "
              "the last run of a CLI worker had done when it last reported."),
             ("remaining", "ecstore_op_remaining", "Items that run still had to do."),
             ("rate_per_s", "ecstore_op_rate_per_second", "Items per second over its last "
              "report interval."),
             ("updated", "ecstore_op_last_update_timestamp_seconds", "When it last reported "
              "(unix time)."),
             ("finished", "ecstore_op_finished", "1 once that run reported its end; 0 while "
              "it runs, after it failed, or when it was killed (its last update then stays "
              "old)."))


def control_metrics(app: web.Application, epoch: MapEpoch) -> Families:
    """The held map's epoch, the database's size, and the progress records of the CLI's
    workers (repair, rebalance, gc, tier) that this node holds a replica of."""
    db = app.get(DB)
    if db is None:  # not open yet
        return
    yield from disk_metrics(db)
    if not db.is_open:  # reopening after a failed write
        return
    yield gauge("ecstore_map_epoch", "Epoch of the cluster map this node holds (0: none).",
                epoch.of(db.get_map()))
    yield gauge("ecstore_control_db_bytes", "Bytes of this node's metadata database files.",
                _dir_bytes(app[CONFIG].data_dir / "db"))
    fast = app[FAST]
    yield counter("ecstore_control_fast_requests", "Object record reads and writes and "
                  "listings answered by the fast path (node.fastpath), without aiohttp.", fast.requests)
    yield counter("ecstore_control_fast_handovers", "Connections the fast path handed to "
                  "aiohttp (their first request not one it answers).", fast.handovers)
    listed = CounterMetricFamily("ecstore_control_listed_rows", "Rows listing requests "
                                 "sent, by what each was read from: its record's listing "
                                 "summary, or the whole record (none that matched).",
                                 labels=["source"])
    for source, n in db.listed.items():
        listed.add_metric([source], n)
    yield listed
    commit = app.get(COMMIT)
    if commit is not None:
        yield counter("ecstore_control_db_writes", "Metadata writes (record, bucket, map, "
                      "purge, read counts) committed.", commit.mutations)
        yield counter("ecstore_control_db_batches", "Synced RocksDB writes that committed "
                      "them: concurrent writes share one (group commit).", commit.batches)
    base = object_key(OPS_BUCKET, "")
    rows, _ = db.scan(base, b"", len(WORKER_OPS) + 16)
    records = {k[len(base):].decode(): r for k, r in rows if not r.get("deleted")}
    for field, name, doc in OP_GAUGES:
        fam = gauge(name, doc, None, {"op": ""})
        for op in WORKER_OPS:  # only these: the label set stays bounded
            value = records.get(op, {}).get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                fam.add_metric([op], value)
        yield fam


def disk_metrics(db: MetaDB) -> Families:
    """The database's disk and whether it takes writes."""
    yield from disk_gauges("control", db.disk(), db.reserve_bytes, "metadata database's disk")
    yield gauge("ecstore_control_db_writable", "1 while the node takes metadata writes; 0 "
                "while its disk is under the reserve or RocksDB refuses them after a failed "
                "write (until it is reopened).", int(db.is_open and not db.problems()))
    yield counter("ecstore_control_db_reopens", "Times the database was reopened in the "
                  "process after RocksDB refused writes (a full disk freed).", db.reopens)
    yield counter("ecstore_control_future_records", "Records put dated more than "
                  f"{CLOCK_AHEAD_NOTE_S:g} s ahead of this node's clock (a writer's clock, or "
                  "this node's, is off: records are ordered by their writers' clocks).",
                  db.future_records.count)


async def recover_loop(commit: GroupCommit, interval_s: float) -> None:
    """Every interval, reopen the database if RocksDB refuses writes and the disk takes
    them again (GroupCommit.recover): a full disk freed needs no restart."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await commit.recover()
        except Exception:  # a bug: logged, tried again next interval
            logging.getLogger("ecstore.control").exception("database recovery check failed")


def _fill_failed(task: asyncio.Future[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("ecstore.control").error(
            "filling listing summaries failed (listings stay right, slower): %r", task.exception())


SUMMARY_FILL_BATCH = 500   # records looked at per step of fill_summaries


def _summarize(keys: list[bytes]) -> Callable[[View], int]:
    def fn(view: View) -> int:
        return sum(view.summarize(k) for k in keys)
    return fn


def _mark_summarized(view: View) -> None:
    view.put(SUMMARIES_KEY, b"1")


async def fill_summaries(db: MetaDB, commit: GroupCommit, batch: int = SUMMARY_FILL_BATCH) -> int:
    """Write the listing summaries the object records lack - those a version without
    them wrote - a batch at a time through the group commit, in the background after the
    node starts (listings are right meanwhile: a record without a matching summary is
    read whole), then mark the database as summarized (SUMMARIES_KEY): later starts skip
    the pass (~2.3 us a record). Returns how many it wrote; logs a step line if any.
    Not while the database refuses writes (opened read-only: a full disk, a read-only
    filesystem): the next start fills them."""
    if db.failed is not None or db.get_raw(SUMMARIES_KEY) is not None:
        return 0
    started, after, filled = time.monotonic(), b"", 0
    while True:
        keys, last = db.unsummarized(after, batch)
        if keys:
            filled += await commit.apply(_summarize(keys), lazy=True)
        if last is None:
            break
        after = last
        await asyncio.sleep(0)   # let requests in between batches
    await commit.apply(_mark_summarized, lazy=True)
    if filled:
        log_step("summaries", started, filled=filled)
    return filled


def make_app(config: ControlConfig) -> web.Application:
    app = make_base_app(config.secret, MAX_BODY_BYTES, config.node_id, "control",
                        config.observability)
    app[CONFIG] = config
    app[FAST] = FastPath(app, RecordRoutes())
    epoch = MapEpoch()
    app[OBSERVER].add_collector(lambda: control_metrics(app, epoch))

    async def open_db(app: web.Application) -> AsyncIterator[None]:
        private_dir(config.data_dir)
        try:
            app[DB] = MetaDB(config.data_dir / "db", config.fsync, config.reserve_bytes)
        except Exception as exc:  # rocksdict raises Exception with RocksDB's status text
            # one line an operator can act on, not a traceback whose last line may not name
            # the database (rocksdict's own config file: "Input/output error (os error 5)")
            raise SystemExit(f"control node {config.node_id}: cannot open its metadata "
                             f"database {config.data_dir / 'db'}: {exc} - check its disk "
                             "(dmesg, a read-only or failing filesystem); the other control "
                             "nodes serve meanwhile") from None
        app[COMMIT] = GroupCommit(app[DB])
        filling = asyncio.ensure_future(fill_summaries(app[DB], app[COMMIT]))
        filling.add_done_callback(_fill_failed)
        recovering = asyncio.ensure_future(recover_loop(app[COMMIT], config.recover_interval_s))
        yield
        filling.cancel()
        recovering.cancel()
        await asyncio.gather(filling, recovering, return_exceptions=True)
        await app[COMMIT].drained()
        app[DB].close()

    app.cleanup_ctx.append(open_db)
    obj = r"/v1/objects/{bucket}/{key:[\s\S]+}"    # [\s\S]: a key may hold a newline
    app.add_routes([
        web.get("/v1/health", health),
        web.get("/v1/status", status),
        web.get("/v1/map", get_map),
        web.put("/v1/map", put_map),
        web.get("/v1/buckets", list_buckets),
        web.put("/v1/buckets/{bucket}", put_bucket),
        web.get("/v1/buckets/{bucket}", get_bucket),
        web.get("/v1/list/{bucket}", list_objects),
        web.post("/v1/access", record_access),
        web.get("/v1/access/{bucket}", list_access),
        web.put(obj, put_object),
        web.post("/v1/objects", put_objects),
        web.post("/v1/objects/read", get_objects),
        web.get(obj, get_object),
        web.delete(obj, purge_object),
        web.delete(r"/v1/records/{bucket}/{key:[\s\S]+}", drop_record),
        web.post(r"/v1/notes/{bucket}/{key:[\s\S]+}", carry_notes),
    ])
    return app


def main(argv: list[str] | None = None) -> None:
    p = node_arg_parser("control")
    p.add_argument("--reserve-mb", type=float, default=env_number(RESERVE_ENV, None, "MiB"),
                   help="free space kept on the disk: metadata writes while less is free are "
                   f"refused with 507 (default ${RESERVE_ENV}, else 1%% of the disk, at most "
                   "1024)")
    a = p.parse_args(argv)
    if a.reserve_mb is not None and a.reserve_mb < 0:
        p.error("--reserve-mb must not be negative")
    cfg = ControlConfig(a.id, a.data, secret_from_env(), a.host, a.port, not a.no_fsync,
                        observability_config(a),
                        None if a.reserve_mb is None else int(a.reserve_mb * 2**20))
    app = make_app(cfg)
    run(app, cfg.host, cfg.port, front=app[FAST] if fast_path_enabled() else None)


if __name__ == "__main__":
    main()
