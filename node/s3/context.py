"""What every S3 handler works with: the gateway's shared state (client library, key and
bucket caches) and one request's context (bucket, key, user), plus the permission rules."""
from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import HttpVersion11, web

from node.s3.body import RunningChecksum
from node.s3.errors import S3Error, access_denied, not_implemented
from node.s3.sigv4 import AuthResult
from store.client import Client
from store.errors import BadRequest, NotFound
from store.keys import lookup_key
from store.names import check_bucket_name

KEY_CACHE_TTL_S = 5.0          # a new or deleted key takes effect within this
BUCKET_CACHE_TTL_S = 2.0       # bucket records (owner, acl) are trusted this long
MAX_CACHED = 10_000
DEFAULT_OWNER = "admin"        # owner of buckets made without one (CLI, client library)
CANNED_ACLS = frozenset({"private", "public-read"})
MAX_OBJECT_BYTES = 5 * 1024 ** 3       # single PUT and single part, as S3
DEFAULT_SEGMENT_SLOTS = 16


@dataclass(frozen=True)
class GatewayConfig:
    node_id: str
    control: tuple[str, ...]
    secret: str
    admin_access_key: str
    admin_secret_key: str
    host: str = "127.0.0.1"
    port: int = 9000
    region: str = "us-east-1"
    max_object_bytes: int = MAX_OBJECT_BYTES
    # segments in memory across all requests (each ~ segment x (1 + (k+m)/k) bytes): the
    # gateway's memory bound whatever clients send; a request waits for a slot (backpressure)
    segment_slots: int = DEFAULT_SEGMENT_SLOTS      # per worker process
    workers: int = 1
    # host names whose subdomains name a bucket (virtual-hosted style: bucket.DOMAIN/key),
    # lower case; none: path style only
    domains: tuple[str, ...] = ()

    def check(self) -> "GatewayConfig":
        if not self.control:
            raise ValueError("the gateway needs at least one control node URL (--control)")
        if len(self.secret) < 16:
            raise ValueError("ECSTORE_SECRET must be set to the cluster secret (16+ chars)")
        if not 1 <= self.workers <= 64:
            raise ValueError("workers must be between 1 and 64")
        if self.segment_slots < 1:
            raise ValueError("segment slots must be at least 1")
        if not self.admin_access_key or len(self.admin_secret_key) < 16:
            raise ValueError("ECSTORE_S3_ACCESS_KEY and ECSTORE_S3_SECRET_KEY (16+ chars) "
                             "must be set")
        return self


class Gateway:
    """Shared by every request: the embedded client and short-lived caches."""

    def __init__(self, config: GatewayConfig, client: Client) -> None:
        self.config = config
        self.client = client
        self._keys: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._buckets: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def key_record(self, access_key: str) -> dict[str, Any] | None:
        """{"secret_key", "user"} of a live access key, or None (cached KEY_CACHE_TTL_S)."""
        if access_key == self.config.admin_access_key:
            return {"secret_key": self.config.admin_secret_key, "user": DEFAULT_OWNER}
        hit = self._keys.get(access_key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        rec = await lookup_key(self.client, access_key)
        if rec is not None:  # an unknown key is asked again: it may have just been made
            _put_bounded(self._keys, access_key, (time.monotonic() + KEY_CACHE_TTL_S, rec))
        return rec

    async def bucket(self, name: str) -> dict[str, Any]:
        """The bucket's record (cached BUCKET_CACHE_TTL_S); NoSuchBucket if absent."""
        hit = self._buckets.get(name)
        if hit is not None and hit[0] > time.monotonic():
            rec = hit[1]
        else:
            check_s3_bucket_name(name)
            try:
                rec = await self.client.bucket_record(name)
            except NotFound:
                rec = None
            if rec is not None:  # absent buckets are asked again: another worker may make one
                _put_bounded(self._buckets, name, (time.monotonic() + BUCKET_CACHE_TTL_S, rec))
        if rec is None:
            raise S3Error("NoSuchBucket", "The specified bucket does not exist", 404)
        return rec

    def forget_bucket(self, name: str) -> None:
        self._buckets.pop(name, None)


def check_s3_bucket_name(name: str) -> None:
    """InvalidBucketName for a name S3 would not take, as S3 answers any operation on it."""
    try:
        check_bucket_name(name)
    except BadRequest:
        raise S3Error("InvalidBucketName", "The specified bucket is not valid.") from None


def _put_bounded(cache: dict[str, Any], key: str, value: Any) -> None:
    if len(cache) >= MAX_CACHED:
        cache.clear()  # crude but bounded; entries are cheap to fetch again
    cache[key] = value


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def defer_continue(request: web.Request) -> None:
    """The S3 route's expect handler: an unknown expectation is refused (417) as aiohttp
    refuses it, but "100 Continue" is not sent here, before anything was checked - the
    body's first read sends it (ContinuedContent), so a request refused before that (a bad
    signature, a missing bucket, a failed precondition) is answered without the client
    sending its body, as S3 does."""
    if request.version == HttpVersion11 and not expects_continue(request):
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers['Expect']}")


def expects_continue(request: web.Request) -> bool:
    return (request.version == HttpVersion11
            and request.headers.get("Expect", "").lower() == "100-continue")


class ContinuedContent:
    """request.content that sends "100 Continue" before its first read when the client
    asked for it (HTTP/1.1, Expect: 100-continue) - never twice, never after a response."""

    def __init__(self, request: web.Request) -> None:
        self._request, self._content = request, request.content
        self._pending = expects_continue(request)

    @property
    def pending(self) -> bool:
        """The client waits for "100 Continue", which was not sent: it has not sent its body."""
        return self._pending

    async def _continue(self) -> None:
        if self._pending:
            self._pending = False
            writer = self._request.writer
            await writer.write(CONTINUE)
            writer.output_size = 0   # as aiohttp's own handler: the response is still to come

    async def read(self, n: int = -1) -> bytes:
        await self._continue()
        return await self._content.read(n)

    async def readexactly(self, n: int) -> bytes:
        await self._continue()
        return await self._content.readexactly(n)

    async def readline(self) -> bytes:
        await self._continue()
        return await self._content.readline()


@dataclass
class S3Ctx:
    """One request: where it goes and who sends it (user None = anonymous)."""

    request: web.Request
    gw: Gateway
    bucket: str
    key: str
    user: str | None
    auth: AuthResult | None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16].upper())
    virtual: bool = False     # the bucket came from the Host header (bucket.DOMAIN)
    _content: ContinuedContent | None = field(default=None, repr=False)

    @property
    def client(self) -> Client:
        return self.gw.client

    @property
    def query(self) -> Mapping[str, str]:
        return self.request.query

    @property
    def headers(self) -> Mapping[str, str]:
        return self.request.headers

    def body_declined(self) -> bool:
        """The client asked to be told to send its body and never was: the answer must
        close the connection, else the client's next request on it would be read as this
        one's body."""
        return self.content.pending

    @property
    def content(self) -> ContinuedContent:
        """The request's body stream, which answers an `Expect: 100-continue` on its first
        read (see ContinuedContent)."""
        if self._content is None:
            self._content = ContinuedContent(self.request)
        return self._content

    async def owned_bucket(self) -> dict[str, Any]:
        """The bucket's record if the caller owns it; AccessDenied (anonymous or another
        user's) or NoSuchBucket otherwise."""
        rec = await self.gw.bucket(self.bucket)
        if self.user is None or self.user != bucket_owner(rec):
            raise access_denied()
        return rec


def bucket_owner(rec: Mapping[str, Any]) -> str:
    return str(rec.get("owner") or DEFAULT_OWNER)


def canned_acl(headers: Mapping[str, str]) -> str:
    """The x-amz-acl of a request ("private" if absent); NotImplemented for any other
    canned ACL or for grant headers: never a silent success."""
    grant = next((h for h in headers if h.lower().startswith("x-amz-grant-")), None)
    if grant is not None:
        raise not_implemented("grant headers are not supported; use the canned ACLs private "
                              "or public-read", grant.lower())
    acl = headers.get("x-amz-acl", "private")
    if acl not in CANNED_ACLS:
        raise not_implemented(f"canned ACL {acl[:40]!r} is not supported; use private or "
                              "public-read", "x-amz-acl")
    return acl


class Md5Stream:
    """Passes an async byte stream through, computing its MD5 (the ETag of a copy) and,
    given an algorithm, its S3 checksum (a copy's)."""

    def __init__(self, source: AsyncIterator[bytes] | AsyncIterator[bytes | memoryview],
                 checksum: str | None = None) -> None:
        self.source = source
        self.md5 = hashlib.md5()
        self.checksum = RunningChecksum(checksum) if checksum else None

    async def __aiter__(self) -> AsyncIterator[bytes | memoryview]:
        async for chunk in self.source:
            self.md5.update(chunk)
            if self.checksum is not None:
                self.checksum.update(bytes(chunk))
            yield chunk

    def md5_hex(self) -> str:
        return self.md5.hexdigest()

    def checksums(self) -> dict[str, str]:
        """{algorithm: base64 value} of the bytes passed, {} without an algorithm."""
        return {self.checksum.algorithm: self.checksum.b64digest()} if self.checksum else {}
