"""S3 bucket operations: create, head, delete, list buckets, ListObjects V1/V2,
ListObjectVersions, bucket ACLs, location and versioning (always unversioned)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Any
from urllib.parse import quote

from aiohttp import web

from node.s3.body import BodyReader
from node.s3.context import S3Ctx, access_denied, bucket_owner, canned_acl, check_s3_bucket_name
from node.s3.errors import S3Error
from node.s3.objects import acl_xml, read_acl_request
from node.s3.xml import doc, el, escape, iso8601, owner_xml, parse
from store.errors import Conflict
from store.listing import PAST_PREFIX, ListResult

MAX_LIST_KEYS = 1000
MAX_LIST_BUCKETS = 10000   # ListBuckets max-buckets, and its page when a page is asked for
TOKEN_MAC_BYTES = 12   # 96 bits: a token nobody made is refused
# a region's name (us-west-2, eu-central-1, us-gov-west-1, ...) or S3's old "EU"
REGION_RE = re.compile(r"EU|[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
TOKEN_CONTEXT = b"ecstore s3 continuation token\0"   # this MAC is for nothing else


def xml_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/xml")


async def list_buckets(ctx: S3Ctx) -> web.StreamResponse:
    if ctx.user is None:
        raise access_denied()
    q = ctx.query
    prefix = q.get("prefix", "")
    region = ctx.gw.config.region
    after = token_decode(q["continuation-token"], ctx.gw.config.secret, "") \
        if q.get("continuation-token") else ""
    paged = any(n in q for n in ("max-buckets", "continuation-token", "prefix", "bucket-region"))
    limit = _max_buckets(q.get("max-buckets")) if paged else None
    rows = sorted((r for r in await ctx.client.list_bucket_records()
                   if bucket_owner(r) == ctx.user and r["name"].startswith(prefix)
                   and r["name"] > after and q.get("bucket-region", region) == region),
                  key=lambda r: r["name"])
    more = limit is not None and len(rows) > limit
    rows = rows[:limit]
    items = [el("Bucket", [el("Name", r["name"]),
                           el("CreationDate", iso8601(int(r.get("created", 0) * 1e9))),
                           el("BucketRegion", region)])
             for r in rows]
    parts = [owner_xml(ctx.user), el("Buckets", items)]
    if more:
        parts.append(el("ContinuationToken", token_encode(rows[-1]["name"],
                                                          ctx.gw.config.secret, "")))
    if "prefix" in q:
        parts.append(el("Prefix", prefix))
    return xml_response(doc("ListAllMyBucketsResult", *parts))


def _max_buckets(raw: str | None) -> int:
    """ListBuckets' max-buckets: 1 to 10,000 as on S3, its page size when not given."""
    if raw is None:
        return MAX_LIST_BUCKETS
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 1 <= int(raw) <= MAX_LIST_BUCKETS:
        raise S3Error("InvalidArgument", "Argument max-buckets must be an integer between 1 "
                      f"and {MAX_LIST_BUCKETS}")
    return int(raw)


async def create_bucket(ctx: S3Ctx) -> web.StreamResponse:
    if ctx.user is None:
        raise access_denied()
    check_s3_bucket_name(ctx.bucket)
    acl = canned_acl(ctx.headers)
    body = await BodyReader(ctx.content, ctx.headers, ctx.auth, 64 * 1024).read_all()
    if body.strip():  # CreateBucketConfiguration: only our one region is accepted
        root = parse(body, "CreateBucketConfiguration")
        check_location_constraint((root.findtext("LocationConstraint") or "").strip(),
                                  ctx.gw.config.region)
    ctx.gw.forget_bucket(ctx.bucket)
    try:
        existing = await ctx.gw.bucket(ctx.bucket)
    except S3Error:
        existing = None
    if existing is not None:
        if bucket_owner(existing) == ctx.user:
            raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the "
                          "named bucket succeeded and you already own it.", 409)
        raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409)
    try:
        await ctx.client.create_bucket(ctx.bucket, owner=ctx.user, acl=acl)
    except Conflict:
        raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.",
                      409) from None
    ctx.gw.forget_bucket(ctx.bucket)
    return web.Response(status=200, headers={"Location": f"/{ctx.bucket}"})


def check_location_constraint(constraint: str, region: str) -> None:
    """Refuse a CreateBucket's LocationConstraint as S3's endpoint for `region` does:
    us-east-1 (never a constraint: its buckets have none) or a name that is no region is
    InvalidLocationConstraint; another region than ours IllegalLocationConstraintException
    (we cannot make a bucket elsewhere, as S3's us-east-1 endpoint can). None, or our
    region when it is not us-east-1, is taken - none in any region too, unlike S3's
    regional endpoints, so that s3fs and boto3 without a region keep working."""
    if constraint in ("", region) and constraint != "us-east-1" \
            or (constraint, region) == ("EU", "eu-west-1"):   # S3's old name of eu-west-1
        return
    if constraint == "us-east-1" or not REGION_RE.fullmatch(constraint):
        raise S3Error("InvalidLocationConstraint", "The specified location-constraint is not "
                      "valid")
    raise S3Error("IllegalLocationConstraintException", f"The {constraint} location "
                  "constraint is incompatible for the region specific endpoint this request "
                  "was sent to.")


async def head_bucket(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    return web.Response(status=200, headers={"x-amz-bucket-region": ctx.gw.config.region})


async def delete_bucket(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    if (await ctx.client.list(ctx.bucket, max_keys=1)).objects:
        raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", 409)
    from store.multipart import list_uploads
    if await list_uploads(ctx.client, ctx.bucket):
        raise S3Error("BucketNotEmpty", "The bucket you tried to delete has multipart "
                      "uploads in progress", 409)
    await ctx.client.delete_bucket(ctx.bucket)
    ctx.gw.forget_bucket(ctx.bucket)
    return web.Response(status=204)


async def get_location(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    region = "" if ctx.gw.config.region == "us-east-1" else ctx.gw.config.region
    return xml_response(doc("LocationConstraint", escape(region)))


async def get_versioning(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    return xml_response(doc("VersioningConfiguration"))


# GETs of bucket configurations we do not have: S3's answer for a bucket with none set
# (tools probe them - s3fs, terraform, backup tools - and a 501 NotImplemented failed
# them where S3 says "nothing set"); setting one stays NotImplemented (gateway.UNSUPPORTED)
NOT_CONFIGURED = {
    "policy": ("NoSuchBucketPolicy", "The bucket policy does not exist"),
    "lifecycle": ("NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist"),
    "cors": ("NoSuchCORSConfiguration", "The CORS configuration does not exist"),
    "encryption": ("ServerSideEncryptionConfigurationNotFoundError",
                   "The server side encryption configuration was not found"),
    "tagging": ("NoSuchTagSet", "The TagSet does not exist"),
    "website": ("NoSuchWebsiteConfiguration", "The specified bucket does not have a website "
                "configuration"),
}


def not_configured(sub: str) -> Any:
    """The handler of GET ?{sub} on a bucket: its S3 404 once the bucket is known."""
    code, message = NOT_CONFIGURED[sub]

    async def handler(ctx: S3Ctx) -> web.StreamResponse:
        await ctx.owned_bucket()
        raise S3Error(code, message, 404)
    return handler


async def get_bucket_acl(ctx: S3Ctx) -> web.StreamResponse:
    rec = await ctx.owned_bucket()
    return xml_response(acl_xml(bucket_owner(rec), rec.get("acl") or "private"))


async def put_bucket_acl(ctx: S3Ctx) -> web.StreamResponse:
    await ctx.owned_bucket()
    acl = await read_acl_request(ctx)
    await ctx.client.update_bucket(ctx.bucket, acl=acl)
    ctx.gw.forget_bucket(ctx.bucket)
    return web.Response(status=200)


# ---- listing -----------------------------------------------------------------------------
def _max_keys(ctx: S3Ctx) -> int:
    raw = ctx.query.get("max-keys", str(MAX_LIST_KEYS))
    try:
        n = int(raw)
    except ValueError:
        raise S3Error("InvalidArgument", "Provided max-keys not an integer or within integer "
                      "range") from None
    if n < 0:
        raise S3Error("InvalidArgument", "Argument maxKeys must be an integer between 0 and "
                      "2147483647")
    return min(n, MAX_LIST_KEYS)


def _encoder(ctx: S3Ctx) -> Any:
    enc = ctx.query.get("encoding-type")
    if enc not in (None, "url"):
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request")
    return url_encode if enc == "url" else (lambda s: s)


_URL_PLAIN = re.compile(r"[A-Za-z0-9_.~/-]*")   # what quote(s, safe="/") leaves as it is


def url_encode(s: str) -> str:
    """A listed name for encoding-type=url: quote(s, safe="/"), which most keys pass
    through unchanged (checked first: a third of quote's cost)."""
    return s if _URL_PLAIN.fullmatch(s) else quote(s, safe="/")


def resume_after(marker: str, prefix: str, delimiter: str) -> str:
    """Where a listing resumes after `marker`: past every key under it when the marker is
    a common prefix (as a V1 NextMarker or a key-marker can be), else right after it."""
    if delimiter and marker.startswith(prefix) and marker.endswith(delimiter):
        rest = marker[len(prefix):]
        # a common prefix when the first delimiter after the prefix is the one it ends
        # with; a marker with none there (find() == -1) is a key, such as a "folder
        # marker" "dir/" listed under prefix "dir/" (rest "") or "x--" under prefix "x-"
        # with delimiter "--" (rest "-"): -1 equals len(rest) - len(delimiter) for them
        cut = rest.find(delimiter)
        if cut >= 0 and cut == len(rest) - len(delimiter):
            return marker + PAST_PREFIX
    return marker


async def _page(ctx: S3Ctx, after: str, max_keys: int) -> ListResult:
    if max_keys == 0:
        return ListResult([], [], False, "")
    prefix, delimiter = ctx.query.get("prefix", ""), ctx.query.get("delimiter", "")
    return await ctx.client.list(ctx.bucket, prefix, delimiter,
                                 resume_after(after, prefix, delimiter), max_keys)


def _contents(ctx: S3Ctx, page: ListResult, enc: Any, owner: str | None) -> list[str]:
    items = []
    who = owner_xml(owner) if owner is not None else ""
    tail = f"<StorageClass>STANDARD</StorageClass>{who}"
    for o in page.objects:   # one f-string per entry (what el() would build): up to 1,000
        etag = f"&quot;{escape(o.etag or o.version_id)}&quot;"   # escape('"x"'), faster
        end = tail if o.storage_class is None else \
            f"<StorageClass>{escape(o.storage_class)}</StorageClass>{who}"
        items.append(f"<Contents><Key>{escape(enc(o.key))}</Key><LastModified>"
                     f"{iso8601(o.ts)}</LastModified><ETag>{etag}</ETag>"
                     f"<Size>{int(o.size)}</Size>{end}</Contents>")
    items += [el("CommonPrefixes", [el("Prefix", enc(p))]) for p in page.common_prefixes]
    return items


def _common(ctx: S3Ctx, enc: Any, max_keys: int, page: ListResult) -> list[str]:
    out = [el("Name", ctx.bucket), el("Prefix", enc(ctx.query.get("prefix", ""))),
           el("MaxKeys", max_keys), el("IsTruncated", page.truncated)]
    if ctx.query.get("delimiter"):
        out.append(el("Delimiter", enc(ctx.query["delimiter"])))
    if "encoding-type" in ctx.query:
        out.append(el("EncodingType", "url"))
    return out


def last_name(page: ListResult) -> str:
    """The page's last key or common prefix: a V1 NextMarker or a NextKeyMarker (a prefix
    marker resumes past every key under it, see resume_after)."""
    return max([o.key for o in page.objects] + page.common_prefixes)


def _token_mac(after: bytes, secret: str, scope: str) -> bytes:
    return hmac.new(secret.encode(), TOKEN_CONTEXT + scope.encode() + b"\0" + after,
                    hashlib.sha256).digest()[:TOKEN_MAC_BYTES]


def token_encode(after: str, secret: str, scope: str) -> str:
    """A V2 continuation token for resuming after `after` in the listing of `scope` (a
    bucket's name, "" for ListBuckets): the position and a MAC of both under the cluster
    secret, so any worker (or a restarted gateway) takes it back, and a token that is not
    ours - or that another bucket's listing gave (it listed this one from there) - is
    refused instead of read as a position."""
    raw = after.encode()
    return base64.urlsafe_b64encode(_token_mac(raw, secret, scope) + raw).decode()


def token_decode(token: str, secret: str, scope: str) -> str:
    """The position a token of token_encode names; InvalidArgument for any other."""
    try:
        raw = base64.b64decode(token.encode(), altchars=b"-_", validate=True)
        mac, after = raw[:TOKEN_MAC_BYTES], raw[TOKEN_MAC_BYTES:]
        if len(mac) == TOKEN_MAC_BYTES and hmac.compare_digest(mac, _token_mac(after, secret,
                                                                                 scope)):
            return after.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise S3Error("InvalidArgument", "The continuation token provided is incorrect")


async def list_objects_v2(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    enc, max_keys = _encoder(ctx), _max_keys(ctx)
    token = ctx.query.get("continuation-token")
    start_after = ctx.query.get("start-after", "")
    after = token_decode(token, ctx.gw.config.secret, ctx.bucket) if token is not None \
        else start_after
    page = await _page(ctx, after, max_keys)
    owner = bucket_owner(brec) if ctx.query.get("fetch-owner") == "true" else None
    parts = _common(ctx, enc, max_keys, page)
    parts.append(el("KeyCount", len(page.objects) + len(page.common_prefixes)))
    if token is not None:
        parts.append(el("ContinuationToken", token))
    if start_after:
        parts.append(el("StartAfter", enc(start_after)))
    if page.truncated:
        parts.append(el("NextContinuationToken", token_encode(page.next_start_after,
                                                                   ctx.gw.config.secret,
                                                                   ctx.bucket)))
    return xml_response(doc("ListBucketResult", *parts, *_contents(ctx, page, enc, owner)))


async def list_objects_v1(ctx: S3Ctx) -> web.StreamResponse:
    brec = await ctx.owned_bucket()
    enc, max_keys = _encoder(ctx), _max_keys(ctx)
    marker = ctx.query.get("marker", "")
    page = await _page(ctx, marker, max_keys)
    parts = _common(ctx, enc, max_keys, page) + [el("Marker", enc(marker))]
    if page.truncated:
        parts.append(el("NextMarker", enc(last_name(page))))
    return xml_response(doc("ListBucketResult", *parts,
                            *_contents(ctx, page, enc, bucket_owner(brec))))


async def list_object_versions(ctx: S3Ctx) -> web.StreamResponse:
    """Unversioned buckets: every object is its only version, id "null"."""
    brec = await ctx.owned_bucket()
    enc, max_keys = _encoder(ctx), _max_keys(ctx)
    key_marker = ctx.query.get("key-marker", "")
    page = await _page(ctx, key_marker, max_keys)
    owner = bucket_owner(brec)
    parts = _common(ctx, enc, max_keys, page)
    parts += [el("KeyMarker", enc(key_marker)), el("VersionIdMarker", ctx.query.get(
        "version-id-marker", ""))]
    if page.truncated:
        parts += [el("NextKeyMarker", enc(last_name(page))), el("NextVersionIdMarker", "null")]
    items = [el("Version", [el("Key", enc(o.key)), el("VersionId", "null"),
                            el("IsLatest", True), el("LastModified", iso8601(o.ts)),
                            el("ETag", f'"{o.etag or o.version_id}"'), el("Size", o.size),
                            el("StorageClass", o.storage_class or "STANDARD"), owner_xml(owner)])
             for o in page.objects]
    items += [el("CommonPrefixes", [el("Prefix", enc(p))]) for p in page.common_prefixes]
    return xml_response(doc("ListVersionsResult", *parts, *items))
