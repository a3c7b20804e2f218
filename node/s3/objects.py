"""S3 object operations: PUT (and copy), GET and HEAD (ranges, conditions), DELETE,
DeleteObjects, object ACLs. Each handler decodes the request, calls the client library,
encodes the answer."""
from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple, TypeVar
from urllib.parse import unquote

from aiohttp import web

from node.metrics import CUT_SHORT
from node.s3.body import DIGEST_BYTES, BodyReader
from node.s3.context import Md5Stream, S3Ctx, access_denied, bucket_owner, canned_acl
from node.s3.errors import S3Error, not_implemented, require_length, to_s3_error
from node.s3.xml import child_text, doc, el, escape, http_date, iso8601, owner_xml, parse
from store.client import MAX_USER_META_BYTES, Client, user_meta_bytes
from store.errors import EcstoreError, NotFound, RangeNotSatisfiable
from store.multipart import MAX_PART_NUMBER
from store.names import MAX_KEY_BYTES
from store.striping import resolve_range
from store.tiering import ARCHIVE_CLASSES, COLD_POLICY, has_policy

log = logging.getLogger("ecstore.gateway")
T = TypeVar("T")
STORED_HEADERS = ("Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
                  "Expires")
RESPONSE_OVERRIDES = {"response-content-type": "Content-Type",
                      "response-content-language": "Content-Language",
                      "response-expires": "Expires", "response-cache-control": "Cache-Control",
                      "response-content-disposition": "Content-Disposition",
                      "response-content-encoding": "Content-Encoding"}
MAX_DELETE_KEYS = 1000
RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)\Z")    # ASCII digits: \d took an Arabic-Indic 3 for 3
PART_NUMBER_RE = re.compile(r"[0-9]{1,5}")
META_PREFIX = "x-amz-meta-"
COPY_CONDITION_PREFIX = "x-amz-copy-source-if-"
STORAGE_CLASS_HEADER = "x-amz-storage-class"
# S3's storage classes (x-amz-storage-class): each is taken and kept with the object;
# the infrequent-access and archive ones are written uncached - the storage nodes do not
# keep their fragments in the page cache (Client.put's cache=False) - as nobody reads
# them soon, and the archive ones (store.tiering.ARCHIVE_CLASSES) on the cold policy
# where the map has one (capacity media). The others (and none, STANDARD) are written as
# any object, on the bucket's default policy.
STORAGE_CLASSES = ("STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA",
                   "INTELLIGENT_TIERING", "GLACIER", "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR",
                   "SNOW", "EXPRESS_ONEZONE")
UNCACHED_CLASSES = frozenset({"STANDARD_IA", "ONEZONE_IA"}) | ARCHIVE_CLASSES


# ---- records to headers ------------------------------------------------------------------
def etag_of(rec: Mapping[str, Any]) -> str:
    """The object's ETag without quotes (objects written by the client library have no
    MD5: their version id stands in, which is unique per version)."""
    return str(rec.get("etag") or rec["version_id"])


def object_headers(rec: Mapping[str, Any]) -> dict[str, str]:
    h = {"ETag": f'"{etag_of(rec)}"', "Last-Modified": http_date(rec["ts"]),
         "Content-Type": rec.get("content_type") or "binary/octet-stream",
         "Accept-Ranges": "bytes"}
    h.update(rec.get("headers") or {})
    h.update({META_PREFIX + k: v for k, v in (rec.get("meta") or {}).items()})
    if rec.get("storage_class"):      # S3 names the class only when it is not STANDARD
        h[STORAGE_CLASS_HEADER] = rec["storage_class"]
    return h


def storage_class(headers: Mapping[str, str]) -> str | None:
    """The request's x-amz-storage-class: None for STANDARD or none; InvalidStorageClass
    for a name S3 does not have."""
    name = headers.get(STORAGE_CLASS_HEADER)
    if name is None or name == "STANDARD":
        return None
    if name not in STORAGE_CLASSES:
        raise S3Error("InvalidStorageClass", "The storage class you specified is not valid")
    return name


def class_field(cls: str | None) -> dict[str, str]:
    """The record's field for storage class `cls` (none for STANDARD)."""
    return {"storage_class": cls} if cls else {}


async def class_writes(client: Client, cls: str | None) -> dict[str, Any]:
    """How objects of storage class `cls` are written - Client.put's (and a multipart
    upload's) `cache` and `policy`: uncached for the infrequent-access and archive
    classes, on the cold policy for an archive class where the map has one, else the
    bucket's default (None)."""
    cold = cls in ARCHIVE_CLASSES and has_policy(await client.cluster_map(), COLD_POLICY)
    return {"cache": cls not in UNCACHED_CLASSES, "policy": COLD_POLICY if cold else None}


def checksum_headers(rec: Mapping[str, Any]) -> dict[str, str]:
    """The checksums of an object - as sent at PUT, or a multipart upload's COMPOSITE or
    FULL_OBJECT one - or of one part of it (`rec` a part of a record's "parts"), with their
    x-amz-checksum-type. S3 returns them only when asked with x-amz-checksum-mode: ENABLED,
    and never for a range."""
    sums = rec.get("checksums") or {}
    h = {f"x-amz-checksum-{alg}": v for alg, v in sums.items()}
    if sums:
        h["x-amz-checksum-type"] = rec.get("checksum_type") or "FULL_OBJECT"
    return h


def checksum_elements(checksums: Mapping[str, object]) -> list[str]:
    """<ChecksumCRC32>...</ChecksumCRC32> and so on, in S3's order."""
    return [el(f"Checksum{alg.upper()}", checksums[alg]) for alg in DIGEST_BYTES if alg in checksums]


def checksum_mode(headers: Mapping[str, str]) -> bool:
    return headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"


def user_meta(headers: Mapping[str, str]) -> dict[str, str]:
    meta = {k.lower()[len(META_PREFIX):]: v for k, v in headers.items()
            if k.lower().startswith(META_PREFIX)}
    if user_meta_bytes(meta) > MAX_USER_META_BYTES:     # UTF-8 bytes, as S3 counts
        raise S3Error("MetadataTooLarge", "Your metadata headers exceed the maximum allowed "
                      f"metadata size ({MAX_USER_META_BYTES} bytes)")
    return meta


def stored_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {h: headers[h] for h in STORED_HEADERS if h in headers}
    enc = [e.strip() for e in out.get("Content-Encoding", "").split(",")
           if e.strip() and e.strip() != "aws-chunked"]
    if enc:
        out["Content-Encoding"] = ", ".join(enc)
    else:
        out.pop("Content-Encoding", None)
    return out


# ---- reading -----------------------------------------------------------------------------
async def readable_record(ctx: S3Ctx) -> dict[str, Any]:
    """The object's record if the caller may read it: the bucket's owner, or anyone (any
    user, or anonymous) when the bucket or the object is public-read.
    NoSuchBucket / NoSuchKey / AccessDenied."""
    brec = await ctx.gw.bucket(ctx.bucket)
    owner = ctx.user is not None and ctx.user == bucket_owner(brec)
    try:
        rec = await ctx.client.live_record(ctx.bucket, ctx.key)
    except NotFound:
        if not owner and brec.get("acl") != "public-read":
            raise access_denied() from None
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404) from None
    if not owner and "public-read" not in (brec.get("acl"), rec.get("acl")):
        raise access_denied()
    return rec


def etag_matches(value: str, etag: str) -> bool:
    """Whether an If-Match / If-None-Match value ("*" or ETags, quoted or not) names `etag`."""
    tags = [t.strip().removeprefix("W/").strip('"') for t in value.split(",")]
    return "*" in tags or etag in tags


def precondition_failed() -> S3Error:
    return S3Error("PreconditionFailed", "At least one of the pre-conditions you specified "
                   "did not hold", 412)


async def check_write_conditions(ctx: S3Ctx) -> None:
    """S3's conditional writes (PutObject, CopyObject, CompleteMultipartUpload):
    If-None-Match: * refuses a key that exists, If-Match a key whose ETag differs
    (PreconditionFailed, 412) or that does not exist (NoSuchKey). Checked here, not by
    the commit: a write that commits between this check and ours is not seen (the
    metadata layer has no conditional commit), so this is not a lock."""
    none_match, match = ctx.headers.get("If-None-Match"), ctx.headers.get("If-Match")
    if none_match is None and match is None:
        return
    if none_match is not None and none_match.strip() != "*":
        raise not_implemented("If-None-Match on a write takes only *", "If-None-Match")
    try:
        rec: dict[str, Any] | None = await ctx.client.live_record(ctx.bucket, ctx.key)
    except NotFound:
        rec = None
    if none_match is not None and rec is not None:
        raise precondition_failed()
    if match is not None:
        if rec is None:
            raise S3Error("NoSuchKey", "The specified key does not exist.", 404)
        if not etag_matches(match, etag_of(rec)):
            raise precondition_failed()


async def checked_at_end(source: AsyncIterator[T], ctx: S3Ctx) -> AsyncIterator[T]:
    """`source`, then check_write_conditions again once its last byte is read, before the
    commit: a conditional PUT's check then misses only writes of the last moment, not
    those made while its body was streaming in."""
    async for piece in source:
        yield piece
    await check_write_conditions(ctx)


def check_conditions(headers: Mapping[str, str], rec: Mapping[str, Any]) -> int | None:
    """304 or 412 as S3 answers If-Match, If-None-Match, If-(Un)Modified-Since; None: go on."""
    etag = etag_of(rec)
    modified_s = rec["ts"] // 1_000_000_000

    def matches(value: str) -> bool:
        return etag_matches(value, etag)

    def since(value: str) -> int | None:
        try:
            return int(parsedate_to_datetime(value).timestamp())
        except (TypeError, ValueError, IndexError, OverflowError):
            return None  # an unparsable date is ignored, as HTTP says

    if "If-Match" in headers:
        if not matches(headers["If-Match"]):
            return 412
    elif "If-Unmodified-Since" in headers:
        t = since(headers["If-Unmodified-Since"])
        if t is not None and modified_s > t:
            return 412
    if "If-None-Match" in headers:
        if matches(headers["If-None-Match"]):
            return 304
    elif "If-Modified-Since" in headers:
        t = since(headers["If-Modified-Since"])
        if t is not None and modified_s <= t:
            return 304
    return None


def if_range_holds(value: str, rec: Mapping[str, Any]) -> bool:
    """Whether If-Range lets a Range apply (RFC 9110): its ETag is the object's (a strong
    comparison: a weak one never holds), or its date is exactly the object's Last-Modified.
    Otherwise the whole object is sent (200): a client resuming a download of a version
    that has since been replaced gets the new one whole, not its tail glued to the old
    one's head (the header was ignored until the twenty-fourth session)."""
    v = value.strip()
    if v.startswith('"') or v.startswith("W/"):
        return v.startswith('"') and v.strip('"') == etag_of(rec)
    try:
        return int(parsedate_to_datetime(v).timestamp()) == rec["ts"] // 1_000_000_000
    except (TypeError, ValueError, IndexError, OverflowError):
        return False


def parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """[lo, hi) of a single `bytes=` range, None to send the whole object (no header, or
    one S3 ignores: malformed or several ranges). Raises InvalidRange (416)."""
    if not value:
        return None
    m = RANGE_RE.match(value.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None
    start = int(m.group(1)) if m.group(1) else None
    end = int(m.group(2)) if m.group(2) else None
    if start is not None and end is not None and end < start:
        return None  # syntactically invalid: ignored (RFC 9110)
    try:
        return resolve_range(size, start, end)
    except RangeNotSatisfiable:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", 416,
                      {"Content-Range": f"bytes */{size}"}) from None


def part_number(query: Mapping[str, str], headers: Mapping[str, str]) -> int | None:
    """The ?partNumber=N of a GET or HEAD, None without one. InvalidArgument unless 1 to
    MAX_PART_NUMBER; InvalidRequest beside a Range header (S3's answers)."""
    raw = query.get("partNumber")
    if raw is None:
        return None
    if "Range" in headers:
        raise S3Error("InvalidRequest", "Cannot specify both Range header and partNumber "
                      "query parameter")
    n = int(raw) if PART_NUMBER_RE.fullmatch(raw) else 0
    if not 1 <= n <= MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{MAX_PART_NUMBER}, inclusive")
    return n


def s3_parts(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The parts a completed multipart upload made the object of (each with its size and
    checksums), in order; empty for any other object. A tiering move re-encodes the data
    as one extent and keeps them as "part_layout" (store.tiering.move_object)."""
    return list(rec.get("parts") or rec.get("part_layout") or [])


def part_bounds(rec: Mapping[str, Any], number: int) -> tuple[int, int, int]:
    """(lo, hi, parts): bytes [lo, hi) of part `number` of the object and its part count.
    A completed multipart upload's record lists its parts (sizes in bytes, in order); any
    other object is one part, all of it, as S3 has it. InvalidPartNumber (416) past the
    last part."""
    sizes = [int(p["size"]) for p in s3_parts(rec)] or [int(rec["size"])]
    if number > len(sizes):
        raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", 416)
    lo = sum(sizes[:number - 1])
    return lo, lo + sizes[number - 1], len(sizes)


def byte_range(ctx: S3Ctx, rec: Mapping[str, Any], headers: dict[str, str]) -> tuple[int, int, bool]:
    """(lo, hi, partial): the bytes [lo, hi) a GET sends - one part (?partNumber) or the
    Range, else all - and whether that is 206 Partial Content. Sets Content-Range,
    x-amz-mp-parts-count or the checksums in `headers`."""
    size = rec["size"]
    number = part_number(ctx.query, ctx.headers)
    if number is not None:
        lo, hi, count = part_bounds(rec, number)
        parts = s3_parts(rec)
        if parts:
            headers["x-amz-mp-parts-count"] = str(count)
        if checksum_mode(ctx.headers):   # the part's own, as S3 answers (all: one part)
            headers.update(checksum_headers(parts[number - 1] if parts else rec))
        if hi == lo:   # an empty part (an empty object): no Content-Range can say it
            return lo, hi, False
    else:
        asked = ctx.headers.get("Range")
        if asked and "If-Range" in ctx.headers and not if_range_holds(ctx.headers["If-Range"], rec):
            asked = None    # the object changed since the client's first piece: all of it
        if size == 0 and asked and RANGE_RE.match(asked.strip()):
            raise S3Error("InvalidRange", "The requested range is not satisfiable", 416,
                          {"Content-Range": "bytes */0"})
        rng = parse_range(asked, size)
        if rng is None:
            if checksum_mode(ctx.headers):
                headers.update(checksum_headers(rec))
            return 0, size, False
        lo, hi = rng
    headers["Content-Range"] = f"bytes {lo}-{hi - 1}/{size}"
    return lo, hi, True


# An object served to a browser is a document of its own origin, the gateway's: a user's
# HTML in a public bucket (or any text with ?response-content-type=text/html) ran script
# that read the admin's status page with the admin's cookie (a security review). In a
# sandbox it has an opaque origin: no script, no cookie, nothing of the gateway's.
BROWSER_HEADERS = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}


def response_overrides(ctx: S3Ctx) -> dict[str, str]:
    """The headers a GET's response-* parameters set: signed requests only, as S3 has it
    (InvalidRequest for an anonymous one), printable values only (InvalidArgument)."""
    asked = {h: ctx.query[q] for q, h in RESPONSE_OVERRIDES.items() if q in ctx.query}
    if asked and ctx.user is None:
        raise S3Error("InvalidRequest", "Request specific response headers cannot be used for "
                      "anonymous GET requests.")
    for h, v in asked.items():
        if not v.isprintable():
            raise S3Error("InvalidArgument", f"the value of {h} holds a control character")
    return asked


async def get_object(ctx: S3Ctx, head: bool = False) -> web.StreamResponse:
    if ctx.query.get("versionId", "null") != "null":
        raise S3Error("InvalidArgument", "Invalid version id specified")
    rec = await readable_record(ctx)
    headers = object_headers(rec)
    status = check_conditions(ctx.headers, rec)
    if status == 304:
        return web.Response(status=304, headers={k: headers[k] for k in ("ETag", "Last-Modified")})
    if status == 412:
        raise precondition_failed()
    headers.update(response_overrides(ctx))
    headers.update(BROWSER_HEADERS)
    lo, hi, partial = byte_range(ctx, rec, headers)
    resp = web.StreamResponse(status=206 if partial else 200, headers=headers)
    resp.content_length = hi - lo
    if head or hi == lo:
        await resp.prepare(ctx.request)
        await resp.write_eof()
        return resp
    await send_body(ctx, resp, rec, lo, hi)
    return resp


async def send_body(ctx: S3Ctx, resp: web.StreamResponse, rec: dict[str, Any], lo: int,
                    hi: int) -> None:
    """Stream bytes [lo, hi) of the object as `resp`'s body (hi > lo)."""
    stream = ctx.client.get_stream(ctx.bucket, ctx.key, lo, hi - 1, record=rec)
    first = await anext(stream)  # before the status line: a failure here is a clean 5xx
    await resp.prepare(ctx.request)
    sent = 0
    try:
        await resp.write(first)
        sent += len(first)
        async for chunk in stream:
            await resp.write(chunk)
            sent += len(chunk)
    except ConnectionError:
        # the client closed its connection mid-body (gave up, or read what it wanted):
        # nothing is wrong here, so one line - not a traceback at ERROR, which is what
        # raising from the handler gave. aiohttp's own write_eof after us fails the same
        # way, quietly. A ConnectionError while the client's connection is open is not
        # this: it goes on up
        transport = ctx.request.transport
        if transport is not None and not transport.is_closing():
            raise
        log.info("GET %s/%s: the client closed the connection after %d of %d bytes",
                 ctx.bucket, ctx.key, sent, hi - lo)
        await stream.aclose()
        return
    except EcstoreError as exc:
        # the status line is gone: cut the connection so that the client sees a short
        # body, never one that looks complete
        # (returned, not raised: raised after the status line, aiohttp logged a
        # traceback at ERROR and wrote no request line - the request log is where an
        # operator looks for a failed GET)
        log.warning("GET %s/%s failed after %s: %s", ctx.bucket, ctx.key,
                    resp.headers.get("Content-Range", "the headers"), exc.message)
        ctx.request[CUT_SHORT] = f"{exc.code} after {sent} of {hi - lo} bytes: {exc.message}"
        if ctx.request.transport is not None:
            ctx.request.transport.abort()
        await stream.aclose()
        return
    await resp.write_eof()


# ---- writing -----------------------------------------------------------------------------
async def put_object(ctx: S3Ctx) -> web.StreamResponse:
    if "x-amz-copy-source" in ctx.headers:
        return await copy_object(ctx)
    await ctx.owned_bucket()
    named = ctx.headers.get("x-amz-checksum-algorithm")
    if named is not None and named.strip().lower() not in DIGEST_BYTES:
        # as CreateMultipartUpload answers it (a PutObject naming MD5 was stored, 200)
        raise S3Error("InvalidRequest", "Checksum algorithm provided is unsupported. Please "
                      "try again with any of the valid types: [CRC32, CRC32C, CRC64NVME, "
                      "SHA1, SHA256]")
    acl = canned_acl(ctx.headers)
    meta = user_meta(ctx.headers)
    keep = stored_headers(ctx.headers)
    cls = storage_class(ctx.headers)
    require_length(ctx.headers)
    await check_write_conditions(ctx)   # before the body is read: fail fast
    body = BodyReader(ctx.content, ctx.headers, ctx.auth, ctx.gw.config.max_object_bytes)
    conditional = "If-None-Match" in ctx.headers or "If-Match" in ctx.headers

    def extra() -> dict[str, Any]:
        return {"etag": body.md5_hex, "headers": keep, "acl": acl, "checksums": body.checksums,
                **class_field(cls)}
    source = checked_at_end(aiter(body), ctx) if conditional else aiter(body)
    info = await ctx.client.put(ctx.bucket, ctx.key, source,
                                content_type=ctx.headers.get("Content-Type", "binary/octet-stream"),
                                meta=meta, extra=extra, **await class_writes(ctx.client, cls))
    del info
    out = {"ETag": f'"{body.md5_hex}"'}
    out.update({f"x-amz-checksum-{a}": v for a, v in body.checksums.items()})
    if body.checksums:     # a single put's checksum is of the whole object (S3 says so too)
        out["x-amz-checksum-type"] = "FULL_OBJECT"
    return web.Response(status=200, headers=out)


def copy_source(value: str) -> tuple[str, str]:
    """(bucket, key) of an x-amz-copy-source header ("/bucket/key" URL-encoded)."""
    path, _, query = value.partition("?")
    if query and query not in ("versionId=null",):
        raise S3Error("InvalidArgument", "copying a specific version is not supported")
    bucket, _, key = unquote(path).lstrip("/").partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: "
                      "sourcebucket/sourcekey")
    return bucket, key


def copy_conditions(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy's x-amz-copy-source-if-* headers as the If-* ones check_conditions reads."""
    return {k[len("x-amz-copy-source-"):].title(): v for k, v in headers.items()
            if k.lower().startswith(COPY_CONDITION_PREFIX)}


async def copy_source_record(ctx: S3Ctx) -> tuple[S3Ctx, dict[str, Any]]:
    """The source of a CopyObject or UploadPartCopy (x-amz-copy-source) and the record of
    its live version, if the caller may read it (NoSuchBucket, NoSuchKey, AccessDenied) and
    its x-amz-copy-source-if-* conditions hold: PreconditionFailed (412) otherwise, where
    a GET would answer 304 too, as S3 does for copies."""
    src_bucket, src_key = copy_source(ctx.headers["x-amz-copy-source"])
    src = S3Ctx(ctx.request, ctx.gw, src_bucket, src_key, ctx.user, ctx.auth)
    rec = await readable_record(src)
    if check_conditions(copy_conditions(ctx.headers), rec) is not None:
        raise precondition_failed()
    return src, rec


async def copied_bytes(src: S3Ctx, rec: dict[str, Any], lo: int = 0,
                       hi: int | None = None) -> AsyncIterator[bytes | memoryview]:
    """Bytes [lo, hi) of the very version `rec` of a copy's source (not of whatever is live
    by then). For a conditional copy, once the last byte is read and before the caller
    commits, `rec` must still be the source's live version: a source overwritten or
    deleted meanwhile is PreconditionFailed, so a copy never commits after its source
    changed under the conditions it was checked with (but for the moment between this
    check and the commit: the metadata layer has no conditional commit)."""
    hi = rec["size"] if hi is None else hi
    if hi > lo:
        async for piece in src.client.get_stream(src.bucket, src.key, lo, hi - 1, record=rec):
            yield piece
    if copy_conditions(src.headers):
        try:
            live = await src.client.live_record(src.bucket, src.key)
        except NotFound:
            raise precondition_failed() from None
        if live["version_id"] != rec["version_id"]:
            raise precondition_failed()


def copy_checksum(headers: Mapping[str, str], rec: Mapping[str, Any]) -> str | None:
    """The checksum algorithm of a copy: its x-amz-checksum-algorithm, else the source's
    (a multipart source's COMPOSITE one becomes the FULL_OBJECT checksum of the copy, which
    is one part). InvalidRequest for an algorithm we do not know."""
    name = headers.get("x-amz-checksum-algorithm")
    if name is None:
        return next(iter(rec.get("checksums") or {}), None)
    if name.strip().lower() not in DIGEST_BYTES:
        raise S3Error("InvalidRequest", "Checksum algorithm provided is unsupported. Please try "
                      "again with any of the valid types: [CRC32, CRC32C, CRC64NVME, SHA1, SHA256]")
    return name.strip().lower()


async def copy_object(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    src, rec = await copy_source_record(ctx)
    src_bucket, src_key = src.bucket, src.key
    directive = ctx.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise S3Error("InvalidArgument", "Unknown metadata directive.")
    cls = storage_class(ctx.headers)   # as S3: the copy's own, STANDARD unless named
    if directive == "COPY" and (src_bucket, src_key) == (ctx.bucket, ctx.key) \
            and cls == rec.get("storage_class"):
        raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to "
                      "copy an object to itself without changing the object's metadata, "
                      "storage class, website redirect location or encryption attributes.")
    if directive == "COPY":
        content_type = rec.get("content_type") or "binary/octet-stream"
        meta, keep = dict(rec.get("meta") or {}), dict(rec.get("headers") or {})
    else:
        content_type = ctx.headers.get("Content-Type", "binary/octet-stream")
        meta, keep = user_meta(ctx.headers), stored_headers(ctx.headers)
    acl = canned_acl(ctx.headers)
    await check_write_conditions(ctx)
    stream = Md5Stream(copied_bytes(src, rec), copy_checksum(ctx.headers, rec))
    conditional = "If-None-Match" in ctx.headers or "If-Match" in ctx.headers
    source = checked_at_end(aiter(stream), ctx) if conditional else aiter(stream)
    info = await ctx.client.put(ctx.bucket, ctx.key, source, content_type=content_type,
                                meta=meta, extra=lambda: {"etag": stream.md5_hex(),
                                                          "headers": keep, "acl": acl,
                                                          # of the copy's bytes, whole
                                                          "checksums": stream.checksums(),
                                                          **class_field(cls)},
                                **await class_writes(ctx.client, cls))
    copied = stream.checksums()     # the copy's own, as S3's CopyObjectResult has them
    body = doc("CopyObjectResult", el("LastModified", iso8601(info.ts)),
               el("ETag", f'"{stream.md5_hex()}"'), *checksum_elements(copied),
               *([el("ChecksumType", "FULL_OBJECT")] if copied else []))
    return web.Response(body=body, content_type="application/xml")


async def delete_object(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    if ctx.query.get("versionId", "null") != "null":
        raise S3Error("InvalidArgument", "Invalid version id specified")
    match = ctx.headers.get("If-Match")
    if match is not None:       # S3's conditional delete; checked, as writes are, not locked
        await check_delete_condition(ctx.client, ctx.bucket, ctx.key, match)
    try:
        await ctx.client.delete(ctx.bucket, ctx.key)
    except NotFound:
        pass  # S3 answers 204 for a key that is not there
    return web.Response(status=204)


async def check_delete_condition(client: Client, bucket: str, key: str, match: str) -> None:
    """If-Match on DeleteObject, an ETag in DeleteObjects: NoSuchKey (404) if the key is
    not there, PreconditionFailed (412) if its ETag differs. Until the twenty-fourth
    session both were ignored and the object deleted whatever its ETag."""
    try:
        rec = await client.live_record(bucket, key)
    except NotFound:
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404) from None
    if not etag_matches(match, etag_of(rec)):
        raise precondition_failed()


class DeleteEntry(NamedTuple):
    key: str
    version_id: str | None
    etag: str | None            # delete only if the object's ETag is this
    unsupported: str | None     # a condition we do not check: that entry is refused


def delete_request(body: bytes) -> tuple[bool, list[DeleteEntry]]:
    """(quiet, entries) of a DeleteObjects body, checked whole before anything is deleted:
    MalformedXML if it names no object, more than MAX_DELETE_KEYS, or an Object without
    a Key."""
    root = parse(body, "Delete")
    quiet = (child_text(root, "Quiet") or "").strip().lower() == "true"
    objs = root.findall("Object")
    if not objs or len(objs) > MAX_DELETE_KEYS:
        raise S3Error("MalformedXML", f"a Delete request names 1 to {MAX_DELETE_KEYS} objects")
    entries = [DeleteEntry(str(child_text(o, "Key") or ""), child_text(o, "VersionId"),
                           child_text(o, "ETag"),
                           next((t for t in ("LastModifiedTime", "Size")
                                 if o.find(t) is not None), None))
               for o in objs]
    if not all(e.key for e in entries):
        raise S3Error("MalformedXML", "every Object needs a Key")
    return quiet, entries


async def delete_one(client: Client, bucket: str, entry: DeleteEntry) -> S3Error | None:
    """Delete one key of a DeleteObjects; the error to report for it, None if deleted
    (or absent, as S3 has it)."""
    key = entry.key
    if entry.version_id not in (None, "null"):
        return S3Error("NoSuchVersion", "The specified version does not exist.")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return S3Error("KeyTooLongError", "Your key is too long")
    if entry.unsupported is not None:
        return S3Error("NotImplemented", f"a delete on the condition of {entry.unsupported} "
                       "is not supported", 501)
    try:
        if entry.etag is not None:
            await check_delete_condition(client, bucket, key, entry.etag)
        await client.delete(bucket, key)
    except NotFound:
        pass
    except S3Error as exc:
        return exc
    except EcstoreError as exc:  # one key's failure is reported, the others go on
        return to_s3_error(exc, key)
    return None


async def delete_objects(ctx: S3Ctx) -> web.StreamResponse:
    """POST /bucket?delete: up to MAX_DELETE_KEYS keys; Deleted for absent keys too."""
    await ctx.owned_bucket()
    body = BodyReader(ctx.content, ctx.headers, ctx.auth, 4 * 1024 * 1024)
    quiet, entries = delete_request(await body.read_all())
    done, errors = [], []
    for entry in entries:
        item = el("Key", entry.key) + (el("VersionId", entry.version_id) if entry.version_id else "")
        err = await delete_one(ctx.client, ctx.bucket, entry)
        if err is not None:   # el() escapes the message: once
            errors.append(el("Error", [item, el("Code", err.code), el("Message", err.message[:200])]))
        elif not quiet:
            done.append(el("Deleted", [item]))
    return web.Response(body=doc("DeleteResult", *done, *errors), content_type="application/xml")


# ---- object ACLs -------------------------------------------------------------------------
def acl_xml(owner: str, acl: str) -> bytes:
    grant = ('<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
             f'xsi:type="CanonicalUser"><ID>{escape(owner)}</ID><DisplayName>{escape(owner)}'
             '</DisplayName></Grantee><Permission>FULL_CONTROL</Permission></Grant>')
    if acl == "public-read":
        grant += ('<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
                  'xsi:type="Group"><URI>http://acs.amazonaws.com/groups/global/AllUsers</URI>'
                  '</Grantee><Permission>READ</Permission></Grant>')
    return doc("AccessControlPolicy", owner_xml(owner), el("AccessControlList", [grant]))


async def get_object_tagging(ctx: S3Ctx) -> web.StreamResponse:
    """No object has tags here (setting them is NotImplemented): S3's answer for an object
    without any, an empty TagSet - it was 501, and s3fs's get_tags raised."""
    await ctx.owned_bucket()
    try:
        await ctx.client.live_record(ctx.bucket, ctx.key)
    except NotFound:
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404) from None
    return web.Response(body=doc("Tagging", el("TagSet", [])), content_type="application/xml")


async def get_object_acl(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    try:
        rec = await ctx.client.live_record(ctx.bucket, ctx.key)
    except NotFound:
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404) from None
    return web.Response(body=acl_xml(bucket_owner(brec), rec.get("acl") or "private"),
                        content_type="application/xml")


async def read_acl_request(ctx: S3Ctx) -> str:
    """The canned ACL a PUT ?acl asks for; an AccessControlPolicy body is NotImplemented."""
    body = BodyReader(ctx.content, ctx.headers, ctx.auth, 64 * 1024)
    if await body.read_all():
        raise S3Error("NotImplemented", "ACL documents are not supported; use the x-amz-acl "
                      "header with private or public-read", 501)
    acl = canned_acl(ctx.headers)  # grant headers: NotImplemented
    if "x-amz-acl" not in ctx.headers:
        raise S3Error("MissingSecurityHeader", "Your request was missing a required header: "
                      "x-amz-acl")
    return acl


async def put_object_acl(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    acl = await read_acl_request(ctx)
    try:
        rec = await ctx.client.live_record(ctx.bucket, ctx.key)
    except NotFound:
        raise S3Error("NoSuchKey", "The specified key does not exist.", 404) from None
    # the same version, a newer stamp: replicas converge on the record with the new acl
    await ctx.client.commit(ctx.bucket, ctx.key, {**rec, "acl": acl, "ts": rec["ts"] + 1})
    return web.Response(status=200)

