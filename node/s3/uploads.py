"""S3 multipart upload operations over store.multipart: create, upload part (and part
copy), complete, abort, list parts, list uploads. A part streams from the request body
into segments (never held whole)."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web

from node.s3 import checksums as sums
from node.s3.body import CHECKSUM_HEADERS, DIGEST_BYTES, BodyReader
from node.s3.buckets import xml_response
from node.s3.context import Md5Stream, S3Ctx, bucket_owner, canned_acl
from node.s3.errors import S3Error, require_length
from node.s3.objects import (
    check_write_conditions,
    checksum_elements,
    class_field,
    class_writes,
    copied_bytes,
    copy_source_record,
    storage_class,
    stored_headers,
    user_meta,
)
from node.s3.xml import doc, el, iso8601, owner_xml, parse
from store import multipart as mp
from store.errors import EcstoreError

MAX_LISTED = 1000
COPY_RANGE_RE = re.compile(r"bytes=([0-9]+)-([0-9]+)")


def _no_such_upload() -> S3Error:
    return S3Error("NoSuchUpload", "The specified multipart upload does not exist. The upload "
                   "ID might be invalid, or the multipart upload might have been aborted or "
                   "completed.", 404)


async def _upload(ctx: S3Ctx) -> dict[str, Any]:
    try:
        up = await mp.get_upload(ctx.client, ctx.bucket, ctx.query["uploadId"])
    except mp.NoSuchUpload:
        raise _no_such_upload() from None
    if up["key"] != ctx.key:
        raise _no_such_upload()
    return up


async def create_upload(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    cls = storage_class(ctx.headers)
    fields = {"headers": stored_headers(ctx.headers), "acl": canned_acl(ctx.headers),
              "owner": brec.get("owner", ""), **class_field(cls)}
    checksum = sums.upload_checksum(ctx.headers)
    upload_id = await mp.create_upload(
        ctx.client, ctx.bucket, ctx.key, meta=user_meta(ctx.headers), fields=fields,
        content_type=ctx.headers.get("Content-Type", "binary/octet-stream"),
        checksum={"algorithm": checksum.algorithm, "type": checksum.type} if checksum else None,
        **await class_writes(ctx.client, cls))
    resp = xml_response(doc("InitiateMultipartUploadResult", el("Bucket", ctx.bucket),
                            el("Key", ctx.key), el("UploadId", upload_id)))
    if checksum is not None:
        resp.headers.update({"x-amz-checksum-algorithm": checksum.header_value(),
                             "x-amz-checksum-type": checksum.type})
    return resp


def _part_number(ctx: S3Ctx) -> int:
    try:
        n = int(ctx.query["partNumber"])
    except ValueError:
        n = 0
    if not 1 <= n <= mp.MAX_PART_NUMBER:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{mp.MAX_PART_NUMBER}, inclusive")
    return n


async def upload_part(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    number = _part_number(ctx)
    checksum = sums.of_upload(await _upload(ctx))
    if "x-amz-copy-source" in ctx.headers:
        return await _upload_part_copy(ctx, number, checksum)
    require_length(ctx.headers)
    body = BodyReader(ctx.content, ctx.headers, ctx.auth, ctx.gw.config.max_object_bytes,
                      compute=checksum.algorithm if checksum else None)
    sums.check_part(checksum, body.plan.checksum_algorithm)
    try:
        part = await mp.put_part(ctx.client, ctx.bucket, ctx.query["uploadId"], number,
                                 aiter(body), lambda: body.md5_hex, lambda: body.checksums)
    except mp.NoSuchUpload:
        raise _no_such_upload() from None
    headers = {"ETag": f'"{part.etag}"'}
    headers.update({f"x-amz-checksum-{a}": v for a, v in body.checksums.items()})
    return web.Response(status=200, headers=headers)


def copy_source_range(value: str | None, size: int) -> tuple[int, int] | None:
    """[lo, hi) of an x-amz-copy-source-range, None without one. Unlike a GET's Range
    (where S3 ignores what it cannot parse and sends everything), S3 takes only
    bytes=first-last here, first <= last < size: anything else is InvalidArgument, never
    the whole source."""
    if value is None:
        return None
    m = COPY_RANGE_RE.fullmatch(value)
    if m is None or int(m.group(1)) > int(m.group(2)):
        raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the "
                      "form bytes=first-last where first and last are the zero-based offsets "
                      "of the first and last bytes to copy")
    first, last = int(m.group(1)), int(m.group(2))
    if last >= size:   # what S3 answers (400), not a GET's InvalidRange
        raise S3Error("InvalidArgument", f"Range specified is not valid for source object "
                      f"of size: {size}")
    return first, last + 1


async def _upload_part_copy(ctx: S3Ctx, number: int,
                            checksum: sums.UploadChecksum | None) -> web.StreamResponse:
    src, rec = await copy_source_record(ctx)   # x-amz-copy-source-if-*: as CopyObject's
    rng = copy_source_range(ctx.headers.get("x-amz-copy-source-range"), rec["size"])
    lo, hi = rng if rng is not None else (0, rec["size"])
    stream = Md5Stream(copied_bytes(src, rec, lo, hi), checksum.algorithm if checksum else None)
    part = await mp.put_part(ctx.client, ctx.bucket, ctx.query["uploadId"], number,
                             aiter(stream), stream.md5_hex, stream.checksums)
    return xml_response(doc("CopyPartResult", el("LastModified", iso8601(part.ts)),
                            el("ETag", f'"{part.etag}"'), *checksum_elements(stream.checksums())))


def complete_request(body: bytes) -> tuple[list[tuple[int, str]], dict[int, dict[str, str]]]:
    """([(part number, ETag)], {part number: {algorithm: checksum}}) of a
    CompleteMultipartUpload body; MalformedXML for a PartNumber that is no integer."""
    root = parse(body, "CompleteMultipartUpload")
    requested, claimed = [], {}
    for p in root.findall("Part"):
        try:
            number = int(p.findtext("PartNumber") or "")
        except ValueError:
            raise S3Error("MalformedXML", "PartNumber must be an integer") from None
        requested.append((number, p.findtext("ETag") or ""))
        claimed[number] = {alg: (p.findtext(f"Checksum{alg.upper()}") or "").strip()
                           for alg in DIGEST_BYTES if p.find(f"Checksum{alg.upper()}") is not None}
    return requested, claimed


async def complete_upload(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    try:
        up = await _upload(ctx)
    except S3Error:
        done = await _completed_from(ctx)
        if done is None:
            raise
        # A retry of a complete that committed (its answer lost: a timeout, a cut
        # connection): S3 answers it as the first, and SDKs retry exactly this way.
        return _completed(ctx, done)
    done = await _completed_from(ctx)
    if done is not None:   # committed, then cut short before its records were forgotten
        await mp.forget(ctx.client, ctx.bucket, ctx.query["uploadId"])
        return _completed(ctx, done)
    checksum = sums.of_upload(up)
    # x-amz-checksum-<algorithm> here is the object's checksum, not the XML body's
    claimed = {CHECKSUM_HEADERS[h.lower()]: v.strip() for h, v in ctx.headers.items()
               if h.lower() in CHECKSUM_HEADERS}
    body_headers = {h: v for h, v in ctx.headers.items() if h.lower() not in CHECKSUM_HEADERS}
    body = BodyReader(ctx.content, body_headers, ctx.auth, 4 * 1024 * 1024)
    requested, part_claims = complete_request(await body.read_all())
    await check_write_conditions(ctx)   # If-None-Match: * / If-Match, as a PutObject's

    size_header = ctx.headers.get("x-amz-mp-object-size")
    if size_header is not None and not re.fullmatch(r"[0-9]{1,20}", size_header.strip()):
        raise S3Error("InvalidArgument", "x-amz-mp-object-size must be a byte count")

    def checksum_fields(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        if size_header is not None and int(size_header) != sum(p["size"] for p in chosen):
            # S3's MpuObjectSize: the object the client expects; checked before the commit
            raise S3Error("InvalidRequest", f"the parts make an object of "
                          f"{sum(p['size'] for p in chosen)} bytes, not the "
                          f"{int(size_header)} of x-amz-mp-object-size")
        return sums.object_checksum(
            checksum, [sums.CompletedPart(n, p["size"], p.get("checksums") or {}, part_claims[n])
                       for (n, _), p in zip(requested, chosen)],
            claimed, ctx.headers.get("x-amz-checksum-type"))
    try:
        record = await mp.complete(ctx.client, ctx.bucket, ctx.query["uploadId"], requested,
                                   checksum_fields)
    except mp.NoSuchUpload:
        raise _no_such_upload() from None
    except mp.PartError as exc:
        raise S3Error(exc.s3_code, exc.message) from None
    return _completed(ctx, record)


async def _completed_from(ctx: S3Ctx) -> dict[str, Any] | None:
    """The live record of the request's key when this very upload made it (a complete
    that committed), else None."""
    try:
        rec = await ctx.client.live_record(ctx.bucket, ctx.key)
    except EcstoreError:
        return None
    return rec if rec.get("upload_id") == ctx.query["uploadId"] else None


def _completed(ctx: S3Ctx, record: Mapping[str, Any]) -> web.StreamResponse:
    # the Host header (request.host without one asks socket.getfqdn(): DNS, blocking); a
    # virtual-hosted request's names the bucket, so the path is the key alone
    host = ctx.request.headers.get("Host") or f"{ctx.gw.config.host}:{ctx.gw.config.port}"
    path = quote(ctx.key) if ctx.virtual else f"{ctx.bucket}/{quote(ctx.key)}"
    location = f"{ctx.request.scheme}://{host}/{path}"
    kept = record.get("checksums") or {}
    return xml_response(doc("CompleteMultipartUploadResult", el("Location", location),
                            el("Bucket", ctx.bucket), el("Key", ctx.key),
                            el("ETag", f'"{record["etag"]}"'), *checksum_elements(kept),
                            *([el("ChecksumType", record["checksum_type"])] if kept else [])))


async def abort_upload(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    await _upload(ctx)
    await mp.abort(ctx.client, ctx.bucket, ctx.query["uploadId"])
    return web.Response(status=204)


def _int_query(ctx: S3Ctx, name: str, default: int) -> int:
    try:
        n = int(ctx.query.get(name, default))
    except ValueError:
        raise S3Error("InvalidArgument", f"{name} must be an integer") from None
    if n < 0:
        raise S3Error("InvalidArgument", f"{name} must not be negative")
    return n


async def list_parts(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    up = await _upload(ctx)
    marker = _int_query(ctx, "part-number-marker", 0)
    max_parts = min(_int_query(ctx, "max-parts", MAX_LISTED), MAX_LISTED)
    parts, truncated = (await mp.list_parts(ctx.client, ctx.query["uploadId"], marker, max_parts,
                                            with_checksums=True)
                        if max_parts else ([], False))
    owner = bucket_owner(brec)
    items = [el("Part", [el("PartNumber", p.number), el("LastModified", iso8601(p.ts)),
                         el("ETag", f'"{p.etag}"'), el("Size", p.size),
                         *checksum_elements(p.checksums)]) for p in parts]
    checksum = sums.of_upload(up)
    head = [el("Bucket", ctx.bucket), el("Key", ctx.key), el("UploadId", ctx.query["uploadId"]),
            owner_xml(owner, "Initiator"), owner_xml(owner),
            el("StorageClass", up["fields"].get("storage_class") or "STANDARD"),
            *([el("ChecksumAlgorithm", checksum.header_value()),
               el("ChecksumType", checksum.type)] if checksum else []),
            el("PartNumberMarker", marker),
            el("MaxParts", max_parts), el("IsTruncated", truncated)]
    if truncated:
        head.append(el("NextPartNumberMarker", parts[-1].number))
    return xml_response(doc("ListPartsResult", *head, *items))


async def list_uploads(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    prefix = ctx.query.get("prefix", "")
    key_marker = ctx.query.get("key-marker", "")
    id_marker = ctx.query.get("upload-id-marker", "")
    max_uploads = min(_int_query(ctx, "max-uploads", MAX_LISTED), MAX_LISTED)
    ups = [u for u in await mp.list_uploads(ctx.client, ctx.bucket, prefix)
           if (u["key"], u["upload_id"]) > (key_marker, id_marker if id_marker else "\U0010ffff")
           or (not key_marker)]
    delimiter = ctx.query.get("delimiter", "")
    entries = rolled_uploads(ups, prefix, delimiter, key_marker)
    page, truncated = entries[:max_uploads], len(entries) > max_uploads
    owner = bucket_owner(brec)
    head = [el("Bucket", ctx.bucket), el("KeyMarker", key_marker),
            el("UploadIdMarker", id_marker), el("Prefix", prefix),
            *([el("Delimiter", delimiter)] if delimiter else []),
            el("MaxUploads", max_uploads), el("IsTruncated", truncated)]
    if truncated and page:
        last = page[-1]
        head += ([el("NextKeyMarker", last), el("NextUploadIdMarker", "")] if isinstance(last, str)
                 else [el("NextKeyMarker", last["key"]),
                       el("NextUploadIdMarker", last["upload_id"])])
    items = [el("Upload", [el("Key", u["key"]), el("UploadId", u["upload_id"]),
                           owner_xml(owner, "Initiator"), owner_xml(owner),
                           el("StorageClass", u["storage_class"] or "STANDARD"),
                           el("Initiated", iso8601(int(u["initiated"] * 1e9)))])
             for u in page if not isinstance(u, str)]
    prefixes = [el("CommonPrefixes", [el("Prefix", p)]) for p in page if isinstance(p, str)]
    return xml_response(doc("ListMultipartUploadsResult", *head, *items, *prefixes))


def rolled_uploads(ups: list[dict[str, Any]], prefix: str, delimiter: str,
                   key_marker: str) -> list[dict[str, Any] | str]:
    """Uploads in key order, those whose key holds `delimiter` after the prefix rolled up
    into their common prefix (a str, listed once, counted as one entry, as S3 does); a
    key marker that is such a prefix (a NextKeyMarker) skips every upload under it."""
    out: list[dict[str, Any] | str] = []
    for u in ups:
        cut = u["key"].find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            out.append(u)
            continue
        common = u["key"][:cut + len(delimiter)]
        if common != key_marker and (not out or out[-1] != common):
            out.append(common)
    return out
