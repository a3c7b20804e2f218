"""Multipart uploads (S3's model) on the client library.

Each part is an extent: encoded and placed under its own version id, with no commit of
its own (`Client.write_extent`), so a part streams into segments and is never held
whole. Completing writes ONE object record whose `parts` list names the extents in byte
order; readers, repair and rebalance walk it with `striping.record_extents`.

Upload records live at UPLOADS_BUCKET/"{bucket}/{upload_id}", part records at
PARTS_BUCKET/"{upload_id}/{part:05d}" (a newer upload of the same part number wins by
(ts, version_id) like any record). Completing or aborting tombstones both, the parts
first; the fragments of parts no object names become garbage for `store.gc` (which reads
the part records before the object records, so a part is live at every instant of a
completion). A part record whose upload record is gone (an abort or complete cut short by
a version that tombstoned the upload first, or a part recorded after its upload's abort
had listed the parts) is forgotten by `store.gc` once older than its grace: an upload is
recorded before any of its parts, so a part's upload is never younger than the part.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from store.client import Client, Source, new_version_id
from store.errors import BadRequest, NotFound
from store.names import PARTS_BUCKET, UPLOADS_BUCKET, check_bucket_name, check_new_key

MIN_PART_BYTES = 5 * 1024 * 1024      # every part but the last (S3's rule)
MAX_PART_NUMBER = 10_000
MAX_PARALLEL_READS = 32
MAX_UPLOADS_LISTED = 10_000


class NoSuchUpload(NotFound):
    code = "no_such_upload"


class PartError(BadRequest):
    """A complete request whose part list is wrong; `s3_code` says how (S3's names)."""

    def __init__(self, s3_code: str, message: str) -> None:
        super().__init__(message)
        self.s3_code = s3_code


@dataclass(frozen=True)
class PartInfo:
    number: int
    size: int
    etag: str          # hex MD5 of the part's bytes, no quotes
    ts: int
    checksums: dict[str, str] = field(default_factory=dict)   # with_checksums: S3's, by algorithm


def upload_key(bucket: str, upload_id: str) -> str:
    return f"{bucket}/{upload_id}"


def part_key(upload_id: str, number: int) -> str:
    return f"{upload_id}/{number:05d}"


def multipart_etag(part_md5s: list[str]) -> str:
    """S3's multipart ETag: MD5 of the parts' binary MD5s, then "-" and the part count."""
    digest = hashlib.md5(b"".join(bytes.fromhex(m) for m in part_md5s)).hexdigest()
    return f"{digest}-{len(part_md5s)}"


def check_complete(requested: list[tuple[int, str]], parts: dict[int, dict[str, Any]]) -> None:
    """Raise PartError unless `requested` [(number, etag)] can complete the upload (pure).

    Order strictly ascending (InvalidPartOrder), each part uploaded with that ETag
    (InvalidPart), every part but the last at least MIN_PART_BYTES (EntityTooSmall)."""
    if not requested:
        raise PartError("MalformedXML", "a complete request must name at least one part")
    numbers = [n for n, _ in requested]
    if any(b <= a for a, b in zip(numbers, numbers[1:])):
        raise PartError("InvalidPartOrder", "parts must be listed in ascending order")
    for n, etag in requested:
        rec = parts.get(n)
        if rec is None or rec["etag"] != etag.strip().strip('"').lower():
            raise PartError("InvalidPart", f"part {n} was not uploaded with ETag {etag}")
    for n, _ in requested[:-1]:
        if parts[n]["size"] < MIN_PART_BYTES:
            raise PartError("EntityTooSmall", f"part {n} is {parts[n]['size']} bytes; every "
                            f"part but the last must be at least {MIN_PART_BYTES} bytes")


async def create_upload(c: Client, bucket: str, key: str, *, content_type: str,
                        meta: dict[str, str], fields: dict[str, Any] | None = None,
                        policy: str | None = None, cache: bool = True,
                        checksum: dict[str, str] | None = None) -> str:
    """Start an upload; `fields` (owner, acl, headers, storage_class) go into the final
    record; `policy` (else the bucket's default, as Client.put) is its parts'; `cache=False`
    has its parts written uncached (Client.put's); `checksum` ({"algorithm", "type"}, S3's)
    is kept in the upload's record for its parts and completion. Returns its id."""
    check_new_key(key)
    brec = await c.bucket_record(bucket)
    cmap = await c.cluster_map()
    pol = c.policy_of(cmap, policy or brec.get("policy"))
    upload_id = new_version_id()
    record = {"ts": time.time_ns(), "version_id": upload_id, "deleted": False,
              "bucket": bucket, "key": key, "content_type": content_type, "meta": meta,
              "fields": fields or {}, "policy": pol.name, "k": pol.k, "m": pol.m,
              "ec_type": pol.ec_type, "segment_size": pol.segment_size_bytes,
              "initiated": time.time(), "cache": cache, "checksum": checksum}
    await c.commit(UPLOADS_BUCKET, upload_key(bucket, upload_id), record)
    return upload_id


async def get_upload(c: Client, bucket: str, upload_id: str) -> dict[str, Any]:
    """The upload's record; NoSuchUpload if it never existed, completed or was aborted."""
    check_bucket_name(bucket)
    if len(upload_id) != 32 or not all(ch in "0123456789abcdef" for ch in upload_id):
        raise NoSuchUpload(f"no such upload: {upload_id[:80]}")
    rec = await c.read_record(UPLOADS_BUCKET, upload_key(bucket, upload_id))
    if rec is None or rec["deleted"]:
        raise NoSuchUpload(f"no such upload: {upload_id}")
    return rec


async def put_part(c: Client, bucket: str, upload_id: str, number: int, source: Source,
                   md5_hex: Callable[[], str],
                   checksums: Callable[[], dict[str, str]] | None = None) -> PartInfo:
    """Encode and place one part, then record it. `md5_hex` is asked once every byte is
    read (the body reader computes it while streaming, and raises if a checksum failed);
    `checksums` then too: {algorithm: base64 value} of the part, kept in its record."""
    if not 1 <= number <= MAX_PART_NUMBER:
        raise BadRequest(f"part number must be between 1 and {MAX_PART_NUMBER}")
    up = await get_upload(c, bucket, upload_id)
    pol = (await c.cluster_map()).policy(up["policy"])
    ext = await c.write_extent(pol, bucket, up["key"], source,
                               cache=up.get("cache", True))
    etag = md5_hex()
    record = {**ext, "ts": time.time_ns(), "deleted": False, "etag": etag,
              "upload_id": upload_id, "part": number,
              "checksums": checksums() if checksums is not None else {}}
    await c.commit(PARTS_BUCKET, part_key(upload_id, number), record)
    return PartInfo(number, ext["size"], etag, record["ts"])


async def list_parts(c: Client, upload_id: str, after: int = 0, max_parts: int = 1000,
                     with_checksums: bool = False) -> tuple[list[PartInfo], bool]:
    """Parts numbered above `after`, ascending: (parts, truncated). `with_checksums`: each
    part's checksums too (S3's ListParts), read from its record - a listing carries none."""
    page = await c.list_namespace(PARTS_BUCKET, prefix=f"{upload_id}/",
                                  start_after=part_key(upload_id, after) if after else "",
                                  max_keys=max_parts)
    parts = [PartInfo(int(o.key.rsplit("/", 1)[1]), o.size, o.etag or "", o.ts)
             for o in page.objects]
    if with_checksums and parts:
        sem = asyncio.Semaphore(MAX_PARALLEL_READS)

        async def read(p: PartInfo) -> PartInfo:
            async with sem:
                rec = await c.read_record(PARTS_BUCKET, part_key(upload_id, p.number))
            kept = rec.get("checksums") if rec is not None and not rec["deleted"] else None
            return PartInfo(p.number, p.size, p.etag, p.ts, dict(kept)) if kept else p
        parts = list(await asyncio.gather(*(read(p) for p in parts)))
    return parts, page.truncated


async def _all_parts(c: Client, upload_id: str) -> list[PartInfo]:
    out: list[PartInfo] = []
    while True:
        parts, truncated = await list_parts(c, upload_id, out[-1].number if out else 0, 1000)
        out += parts
        if not truncated or not parts:
            return out


async def complete(c: Client, bucket: str, upload_id: str, requested: list[tuple[int, str]],
                   more_fields: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None
                   ) -> dict[str, Any]:
    """Commit the object the named parts make, in order; return its record.
    `more_fields`, given the chosen parts' records in order, returns more fields of the
    object's record (the S3 gateway's checksums); if it raises, nothing is committed.

    Raises NoSuchUpload, PartError. The part and upload records are tombstoned after."""
    up = await get_upload(c, bucket, upload_id)
    sem = asyncio.Semaphore(MAX_PARALLEL_READS)

    async def read(n: int) -> tuple[int, dict[str, Any] | None]:
        async with sem:
            rec = await c.read_record(PARTS_BUCKET, part_key(upload_id, n))
            return n, None if rec is None or rec["deleted"] else rec
    numbers = sorted({n for n, _ in requested if 1 <= n <= MAX_PART_NUMBER})
    found = {n: r for n, r in await asyncio.gather(*(read(n) for n in numbers)) if r}
    check_complete(requested, found)
    chosen = [found[n] for n, _ in requested]
    cmap = await c.cluster_map()
    record: dict[str, Any] = {
        **up["fields"], "ts": c.record_ts(), "version_id": new_version_id(), "deleted": False,
        "content_type": up["content_type"], "meta": up["meta"], "policy": up["policy"],
        "k": up["k"], "m": up["m"], "ec_type": up["ec_type"], "segment_size": up["segment_size"],
        "epoch": cmap.epoch, "inline": None, "handoffs": {}, "upload_id": upload_id,
        "parts": [{**{f: p[f] for f in ("version_id", "size", "segments", "handoffs", "etag")},
                   **({"checksums": p["checksums"]} if p.get("checksums") else {})}
                  for p in chosen],
        "size": sum(p["size"] for p in chosen), "segments": sum(p["segments"] for p in chosen),
        "etag": multipart_etag([p["etag"] for p in chosen]),
        **(more_fields(chosen) if more_fields is not None else {}),
    }
    await c.commit(bucket, up["key"], record)
    await forget(c, bucket, upload_id)
    return record


async def abort(c: Client, bucket: str, upload_id: str) -> None:
    """Drop an upload and its parts (their fragments become garbage). Raises NoSuchUpload."""
    await get_upload(c, bucket, upload_id)
    await forget(c, bucket, upload_id)


async def forget(c: Client, bucket: str, upload_id: str) -> None:
    """Tombstone an upload's part records, then its record (after its complete, or an
    abort; again by the retry of a complete cut short before it was done)."""
    parts = await _all_parts(c, upload_id)
    sem = asyncio.Semaphore(MAX_PARALLEL_READS)

    async def tombstone(ns: str, key: str) -> None:
        async with sem:
            await c.commit(ns, key, {"ts": time.time_ns(), "version_id": new_version_id(),
                                     "deleted": True})
    # the parts first, the upload last: a process killed in between leaves the upload
    # listed, so an abort (or a retried complete) forgets the rest - the other way round
    # it left part records no upload named, whose fragments gc kept for ever
    await asyncio.gather(*(tombstone(PARTS_BUCKET, part_key(upload_id, p.number))
                           for p in parts))
    await tombstone(UPLOADS_BUCKET, upload_key(bucket, upload_id))



async def list_uploads(c: Client, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
    """Uploads in progress in `bucket` whose key starts with prefix, sorted by (key, id);
    each {"key", "upload_id", "initiated", "owner", "storage_class"}. At most
    MAX_UPLOADS_LISTED."""
    await c.bucket_record(bucket)
    page = await c.list_namespace(UPLOADS_BUCKET, prefix=f"{bucket}/",
                                  max_keys=MAX_UPLOADS_LISTED)
    sem = asyncio.Semaphore(MAX_PARALLEL_READS)

    async def read(key: str) -> dict[str, Any] | None:
        async with sem:
            return await c.read_record(UPLOADS_BUCKET, key)
    records = await asyncio.gather(*(read(o.key) for o in page.objects))
    out = [{"key": r["key"], "upload_id": r["version_id"], "initiated": r["initiated"],
            "owner": r["fields"].get("owner", ""),
            "storage_class": r["fields"].get("storage_class")}
           for r in records if r is not None and not r["deleted"] and r["key"].startswith(prefix)]
    return sorted(out, key=lambda u: (u["key"], u["upload_id"]))


@dataclass(frozen=True)
class RecordedPart:
    """A part record as a listing shows it (for GC)."""
    upload_id: str
    key: str           # in PARTS_BUCKET: part_key(upload_id, number)
    version_id: str    # its extent's
    ts: int            # when it was recorded (ns)


async def recorded_parts(c: Client) -> list[RecordedPart]:
    """Every live part record, of any upload (for GC; its upload may be gone: an abort or
    complete of a version that forgot the upload first, cut short)."""
    out: list[RecordedPart] = []
    after = ""
    while True:
        page = await c.list_namespace(PARTS_BUCKET, start_after=after, max_keys=10_000)
        out += [RecordedPart(o.key.rsplit("/", 1)[0], o.key, o.version_id, o.ts)
                for o in page.objects]
        if not page.truncated or not page.objects:
            return out
        after = page.next_start_after


async def upload_ids(c: Client) -> set[str]:
    """The ids of every upload in progress, in any bucket (for GC)."""
    return set(await upload_keys(c))


async def upload_keys(c: Client) -> dict[str, str]:
    """{upload id: its record's key in UPLOADS_BUCKET} of every upload in progress."""
    out: dict[str, str] = {}
    after = ""
    while True:
        page = await c.list_namespace(UPLOADS_BUCKET, start_after=after, max_keys=10_000)
        out.update({o.key.rsplit("/", 1)[1]: o.key for o in page.objects})
        if not page.truncated or not page.objects:
            return out
        after = page.next_start_after


async def part_extent_records(c: Client, read_repair: bool = True
                              ) -> list[tuple[str, str, dict[str, Any]]]:
    """(PARTS_BUCKET, part key, record) of every part of every upload in progress, the
    record as repair and rebalance read an object's: the part's extent (version, size,
    segments, handoffs) with its upload's policy. An uploaded part is acknowledged data
    (CompleteMultipartUpload names it later): losing a node must not lose it, a ring
    change must move it. Parts of an upload no longer recorded are left out (gc forgets
    them). Sorted by key."""
    parts = await recorded_parts(c)
    sem = asyncio.Semaphore(MAX_PARALLEL_READS)

    async def read(bucket: str, key: str) -> dict[str, Any] | None:
        async with sem:
            rec = await c.read_record(bucket, key, read_repair)
        return None if rec is None or rec["deleted"] else rec

    keys = await upload_keys(c) if parts else {}
    got = await asyncio.gather(*(read(UPLOADS_BUCKET, keys[u])
                                 for u in sorted({p.upload_id for p in parts}) if u in keys))
    uploads = {r["version_id"]: r for r in got if r is not None}
    out = []
    records = await asyncio.gather(*(read(PARTS_BUCKET, p.key) for p in parts
                                     if p.upload_id in uploads))
    for rec in records:
        up = uploads.get(rec["upload_id"]) if rec is not None else None
        if rec is None or up is None:
            continue
        out.append((PARTS_BUCKET, part_key(rec["upload_id"], rec["part"]), {
            "policy": up["policy"], "k": up["k"], "m": up["m"], "ec_type": up["ec_type"],
            "segment_size": up["segment_size"], "inline": None, "ts": rec["ts"],
            "deleted": False, **{f: rec[f] for f in ("version_id", "size", "segments")},
            "handoffs": rec.get("handoffs") or {}}))
    return sorted(out, key=lambda r: r[1])
