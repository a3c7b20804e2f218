"""Request bodies for the S3 gateway: plain or aws-chunked, with every integrity check S3 makes.

A BodyReader streams the decoded payload in pieces of at most `chunk_bytes` and verifies, as the bytes go by
and at the end: Content-Length / x-amz-decoded-content-length, the size limit, the SHA-256 of
x-amz-content-sha256, Content-MD5, an x-amz-checksum-* header or trailer, and the chunk and trailer signatures of
signed aws-chunked bodies. Pieces are provisional: the payload is good only once iteration ends without an
error, so a caller streams them to storage and commits nothing until then. Errors are S3Error:

    EntityTooLarge 400             declared or actual size above max_bytes
    IncompleteBody 400             fewer (or, aws-chunked, more) bytes than declared; connection cut
    InvalidDigest 400              Content-MD5 not base64 of 16 bytes
    BadDigest 400                  Content-MD5 or x-amz-checksum-* does not match the payload
    XAmzContentSHA256Mismatch 400  payload SHA-256 differs from x-amz-content-sha256
    InvalidRequest 400             malformed checksum headers, aws-chunked framing, x-amz-trailer
    InvalidArgument 400            an unknown STREAMING- payload mode
    MalformedTrailerError 400      trailing headers missing, unexpected or malformed
    SignatureDoesNotMatch 403      a chunk or trailer signature is missing or wrong
    AccessDenied 403               a signed aws-chunked body on a request that has no header signature
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from node.s3.errors import S3Error, access_denied, bad_digest
from node.s3.sigv4 import (
    EMPTY_SHA256,
    STREAMING_PAYLOADS,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    AuthResult,
    chunk_signature,
    trailer_signature,
)
from store.crc import crc32

THREAD_HASH_MIN_BYTES = 256 * 1024   # bodies at least this large are hashed beside the loop
THREAD_HASH_AHEAD_BYTES = 8 << 20    # at most this much read but not hashed yet, per body
MAX_LINE_BYTES = 4096  # an aws-chunked size line or trailer line, CRLF included
MAX_TRAILER_LINES = 8
DIGEST_BYTES = {"crc32": 4, "crc32c": 4, "crc64nvme": 8, "sha1": 20, "sha256": 32}
CHECKSUM_HEADERS = {f"x-amz-checksum-{algorithm}": algorithm for algorithm in DIGEST_BYTES}
NOT_CHECKSUM_HEADERS = frozenset({"x-amz-checksum-algorithm", "x-amz-checksum-mode", "x-amz-checksum-type"})
TRAILER_SIGNATURE = "x-amz-trailer-signature"
_HEX_SHA256 = re.compile(rb"[0-9a-fA-F]{64}")
_HEX_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")


class StreamLike(Protocol):
    """What the reader needs of aiohttp's StreamReader (request.content)."""
    async def read(self, n: int = -1) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...
    async def readline(self) -> bytes: ...


def _reflected_table(polynomial: int) -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ polynomial if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _reflected_table(0x82F63B78)  # Castagnoli, reflected
_CRC64NVME_TABLE = _reflected_table(0x9A6C9329AC4BC9B5)  # CRC-64/NVME (0xAD93D23594C93659), reflected


def _table_crc(data: bytes, crc: int, table: tuple[int, ...], mask: int) -> int:
    crc ^= mask
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ mask


def crc32c_py(data: bytes, crc: int = 0) -> int:
    return _table_crc(data, crc, _CRC32C_TABLE, 0xFFFFFFFF)


def crc64nvme_py(data: bytes, crc: int = 0) -> int:
    return _table_crc(data, crc, _CRC64NVME_TABLE, 0xFFFFFFFFFFFFFFFF)


try:  # awscrt (botocore[crt]) when installed; else the tables above: correct, ~0.1 s per MB
    from awscrt import checksums as _crt_checksums
    crc32c: Callable[[bytes, int], int] = _crt_checksums.crc32c
    crc64nvme: Callable[[bytes, int], int] = _crt_checksums.crc64nvme
except ImportError:
    crc32c, crc64nvme = crc32c_py, crc64nvme_py
_CRCS: dict[str, Callable[[bytes, int], int]] = {"crc32": crc32, "crc32c": crc32c, "crc64nvme": crc64nvme}


class RunningChecksum:
    """One S3 checksum over a stream; `b64digest` is the big-endian digest in base64, as S3 sends it."""

    def __init__(self, algorithm: str) -> None:
        assert algorithm in DIGEST_BYTES, algorithm
        self.algorithm = algorithm
        self._hash = hashlib.new(algorithm) if algorithm in ("sha1", "sha256") else None
        self._crc = 0

    def update(self, data: bytes) -> None:
        if self._hash is not None:
            self._hash.update(data)
        else:
            self._crc = _CRCS[self.algorithm](data, self._crc)

    def digest(self) -> bytes:
        if self._hash is not None:
            return self._hash.digest()
        return self._crc.to_bytes(DIGEST_BYTES[self.algorithm], "big")

    def b64digest(self) -> str:
        return base64.b64encode(self.digest()).decode()


@dataclass(frozen=True)
class BodyPlan:
    """What the headers say about a body: how it is framed and what to verify."""
    streaming: str | None  # a STREAMING-* x-amz-content-sha256 (aws-chunked), None for a plain body
    declared_bytes: int | None  # Content-Length (plain) or x-amz-decoded-content-length (aws-chunked)
    payload_sha256: str | None  # lower-case hex to verify (plain bodies)
    content_md5: bytes | None
    checksum_algorithm: str | None  # from an x-amz-checksum-* header or x-amz-trailer
    checksum_expected: bytes | None  # the header's value; None when it comes in the trailer
    checksum_in_trailer: bool

    @property
    def signed_chunks(self) -> bool:
        return self.streaming in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER)

    @property
    def has_trailer(self) -> bool:
        return self.streaming in (STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER)


def plan_body(headers: Mapping[str, str], auth: AuthResult | None, max_bytes: int) -> BodyPlan:
    """Validate the body-related headers before any byte is read; raises S3Error."""
    lower = {name.lower(): value for name, value in headers.items()}
    payload = auth.payload_sha256 if auth is not None and not auth.presigned else lower.get("x-amz-content-sha256", "")
    streaming = payload if payload in STREAMING_PAYLOADS else None
    if streaming is None and payload.startswith("STREAMING-"):
        raise S3Error("InvalidArgument", f"Unsupported x-amz-content-sha256 value: {payload}")
    encodings = [e.strip().lower() for e in lower.get("content-encoding", "").split(",")]
    if streaming is None and "aws-chunked" in encodings:
        raise S3Error("InvalidRequest", "Content-Encoding aws-chunked needs a STREAMING- x-amz-content-sha256")
    if streaming in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER) and (auth is None or auth.presigned):
        raise access_denied(f"{streaming} needs a request signed with the Authorization header")
    declared = _declared_bytes(lower, streaming)
    if declared is not None and declared > max_bytes:
        raise _too_large()
    algorithm, expected = _checksum_header(lower)
    trailer = _trailer_algorithm(lower.get("x-amz-trailer"), streaming)
    if trailer is not None and algorithm is not None:
        raise _multiple_checksums()
    sha256 = payload.lower() if streaming is None and _HEX_SHA256.fullmatch(payload.encode()) else None
    return BodyPlan(streaming, declared, sha256, _content_md5(lower.get("content-md5")), algorithm or trailer,
                    expected, trailer is not None)


def _declared_bytes(lower: dict[str, str], streaming: str | None) -> int | None:
    name = "content-length" if streaming is None else "x-amz-decoded-content-length"
    text = lower.get(name)
    if text is None:
        if streaming is None:
            return None
        raise S3Error("InvalidRequest", "Missing required header for this request: x-amz-decoded-content-length")
    if not text.strip().isdigit():
        raise S3Error("InvalidArgument", f"Invalid {name}: {text}")
    return int(text)


def _content_md5(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != 16:
        raise S3Error("InvalidDigest", "The Content-MD5 you specified is not valid.")
    return digest


def _checksum_header(lower: dict[str, str]) -> tuple[str | None, bytes | None]:
    names = [name for name in lower if name.startswith("x-amz-checksum-") and name not in NOT_CHECKSUM_HEADERS]
    if not names:
        return None, None
    if len(names) > 1:
        raise _multiple_checksums()
    algorithm = CHECKSUM_HEADERS.get(names[0])
    if algorithm is None:
        raise S3Error("InvalidRequest", f"Unsupported checksum header: {names[0]}")
    return algorithm, _checksum_value(algorithm, lower[names[0]], "header")


def _checksum_value(algorithm: str, value: str, where: str) -> bytes:
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != DIGEST_BYTES[algorithm]:
        raise S3Error("InvalidRequest", f"Value for x-amz-checksum-{algorithm} {where} is invalid.")
    return digest


def _trailer_algorithm(value: str | None, streaming: str | None) -> str | None:
    if value is None:
        return None
    if streaming not in (STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER):
        raise S3Error("InvalidRequest", "x-amz-trailer needs a STREAMING-...-TRAILER x-amz-content-sha256")
    algorithm = CHECKSUM_HEADERS.get(value.strip().lower())
    if algorithm is None:
        raise S3Error("InvalidRequest", "The value specified in the x-amz-trailer header is not supported")
    return algorithm


def _multiple_checksums() -> S3Error:
    return S3Error("InvalidRequest", "Expecting a single x-amz-checksum- header. Multiple checksum Types are not "
                   "allowed.")


def _too_large() -> S3Error:
    return S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size.")


def _incomplete(detail: str = "") -> S3Error:
    return S3Error("IncompleteBody", "You did not provide the number of bytes specified by the Content-Length "
                   f"HTTP header.{detail}")


def _framing(detail: str) -> S3Error:
    return S3Error("InvalidRequest", f"Malformed aws-chunked body: {detail}")


def _bad_trailer(detail: str) -> S3Error:
    return S3Error("MalformedTrailerError", "The request contained trailing data that was not well-formed or did "
                   f"not conform to our published schema: {detail}")


def _bad_signature() -> S3Error:
    return S3Error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you "
                   "provided. Check your key and signing method.", 403)


_hasher: tuple[int, ThreadPoolExecutor] | None = None


def _hash_thread() -> ThreadPoolExecutor:
    """One thread per process that hashes large bodies (MD5, SHA-256, checksum) while the
    event loop goes on reading and encoding: hashlib lets go of the GIL (a CRC-32 is
    quick either way). One thread, so a body's pieces are hashed in the order they came."""
    global _hasher
    if _hasher is None or _hasher[0] != os.getpid():   # a forked gateway worker makes its own
        _hasher = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="s3-body-hash"))
    return _hasher[1]


class BodyReader:
    """Wraps a request's byte stream; yields decoded payload bytes; verifies everything it can.
    After iteration completes without error: .md5_hex (MD5 of the decoded payload, always computed: it is the ETag),
    .size (decoded bytes), .checksums (algorithm -> base64 value that was sent and verified, e.g. {"crc32": "..."};
    with `compute`, the value of that algorithm computed when the request sends no checksum).
    The constructor validates the headers (raises S3Error); iterate once."""

    def __init__(self, content: StreamLike, headers: Mapping[str, str], auth: AuthResult | None,
                 max_bytes: int, chunk_bytes: int = 1 << 20, compute: str | None = None) -> None:
        assert chunk_bytes > 0 and max_bytes >= 0
        self._content, self._auth = content, auth
        self._max_bytes, self._chunk_bytes = max_bytes, chunk_bytes
        self.plan = plan_body(headers, auth, max_bytes)
        self._md5 = hashlib.md5(usedforsecurity=False)  # the ETag, not a security check
        self._sha256 = hashlib.sha256() if self.plan.payload_sha256 else None
        algorithm = self.plan.checksum_algorithm or compute
        self._checksum = RunningChecksum(algorithm) if algorithm else None
        self._expected_checksum = self.plan.checksum_expected
        self._size_bytes = 0
        self._started = self._done = False
        self._threaded = (self.plan.declared_bytes or 0) >= THREAD_HASH_MIN_BYTES
        self._hashing: deque[tuple[asyncio.Future[None], int]] = deque()
        self._hashing_bytes = 0

    @property
    def md5_hex(self) -> str:
        assert self._done, "read the whole body first"
        return self._md5.hexdigest()

    @property
    def size(self) -> int:
        assert self._done, "read the whole body first"
        return self._size_bytes

    @property
    def checksums(self) -> dict[str, str]:
        assert self._done, "read the whole body first"
        return {self._checksum.algorithm: self._checksum.b64digest()} if self._checksum else {}

    def __aiter__(self) -> AsyncIterator[bytes]:
        assert not self._started, "a body is read once"
        self._started = True
        return self._pieces()

    async def read_all(self) -> bytes:
        """The whole payload (bounded by max_bytes), verified: for small bodies such as XML."""
        return b"".join([piece async for piece in self])

    async def _pieces(self) -> AsyncIterator[bytes]:
        source = self._plain() if self.plan.streaming is None else self._chunked()
        try:
            async for piece in source:
                yield piece
                await self._hash_backlog(THREAD_HASH_AHEAD_BYTES)
        except (asyncio.IncompleteReadError, ConnectionError, HttpProcessingError) as exc:
            raise _incomplete() from exc
        finally:
            await self._hash_backlog(0)
        self._finish()

    def _count(self, piece: bytes) -> None:
        self._size_bytes += len(piece)
        if self._size_bytes > self._max_bytes:
            raise _too_large()
        if self._threaded:
            fut = asyncio.get_running_loop().run_in_executor(_hash_thread(), self._hash, piece)
            self._hashing.append((fut, len(piece)))
            self._hashing_bytes += len(piece)
        else:
            self._hash(piece)

    async def _hash_backlog(self, keep_bytes: int) -> None:
        """Wait until at most `keep_bytes` read are still to be hashed."""
        while self._hashing and self._hashing_bytes > keep_bytes:
            fut, size = self._hashing[0]
            await asyncio.shield(fut)   # a cancelled request still lets the hash finish
            self._hashing.popleft()
            self._hashing_bytes -= size

    def _hash(self, piece: bytes) -> None:
        self._md5.update(piece)
        if self._sha256 is not None:
            self._sha256.update(piece)
        if self._checksum is not None:
            self._checksum.update(piece)

    async def _plain(self) -> AsyncIterator[bytes]:
        remaining = self.plan.declared_bytes
        while remaining is None or remaining > 0:
            piece = await self._content.read(self._chunk_bytes if remaining is None
                                             else min(self._chunk_bytes, remaining))
            if not piece:
                if remaining is None:
                    return
                raise _incomplete()
            if remaining is not None:
                remaining -= len(piece)
            self._count(piece)
            yield piece

    async def _chunked(self) -> AsyncIterator[bytes]:
        declared = self.plan.declared_bytes
        assert declared is not None
        previous = self._auth.seed_signature if self._auth is not None else ""
        while True:
            size, signature = await self._chunk_header()
            if size == 0:
                break
            if self._size_bytes + size > declared:
                raise _incomplete(" (aws-chunked data exceeds x-amz-decoded-content-length)")
            chunk_sha256 = hashlib.sha256()
            remaining = size
            while remaining:
                piece = await self._content.read(min(self._chunk_bytes, remaining))
                if not piece:
                    raise _incomplete()
                remaining -= len(piece)
                chunk_sha256.update(piece)
                self._count(piece)
                yield piece
            if await self._content.readexactly(2) != b"\r\n":
                raise _framing("chunk data not followed by CRLF")
            previous = self._verify_chunk(previous, signature, chunk_sha256.hexdigest())
        previous = self._verify_chunk(previous, signature, EMPTY_SHA256)
        await self._trailers(previous)
        if await self._content.read(1):
            raise _framing("data after the end of the aws-chunked body")

    async def _line(self) -> bytes:
        """One CRLF-terminated line without its CRLF, at most MAX_LINE_BYTES."""
        try:
            line = await self._content.readline()
        except (LineTooLong, ValueError):
            raise _framing(f"a line longer than {MAX_LINE_BYTES} bytes") from None
        if len(line) > MAX_LINE_BYTES:
            raise _framing(f"a line longer than {MAX_LINE_BYTES} bytes")
        if not line.endswith(b"\n"):
            raise _incomplete()
        if not line.endswith(b"\r\n"):
            raise _framing("a line not ended by CRLF")
        return line[:-2]

    async def _chunk_header(self) -> tuple[int, str | None]:
        """'hex-size[;chunk-signature=sig]' -> (size in bytes, signature or None)."""
        size_text, _, extension = (await self._line()).partition(b";")
        if not _HEX_SIZE.fullmatch(size_text):
            raise _framing(f"bad chunk size {size_text[:32]!r}")
        name, _, value = extension.partition(b"=")
        signature = value.strip().decode("ascii", "replace") if name.strip() == b"chunk-signature" else None
        return int(size_text, 16), signature

    def _verify_chunk(self, previous: str, signature: str | None, chunk_sha256_hex: str) -> str:
        if not self.plan.signed_chunks:
            return previous
        assert self._auth is not None
        expected = chunk_signature(self._auth, previous, chunk_sha256_hex)
        if signature is None or not hmac.compare_digest(expected, signature):
            raise _bad_signature()
        return expected

    async def _trailer_lines(self) -> list[tuple[str, str]]:
        lines: list[tuple[str, str]] = []
        while line := await self._line():
            if len(lines) >= MAX_TRAILER_LINES:
                raise _bad_trailer(f"more than {MAX_TRAILER_LINES} trailing headers")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name.strip():
                raise _bad_trailer(f"{line[:64]!r}")
            lines.append((name.strip().lower(), value.strip()))
        return lines

    async def _trailers(self, previous: str) -> None:
        lines = await self._trailer_lines()
        if not self.plan.has_trailer:
            if lines:
                raise _bad_trailer("trailing headers without a STREAMING-...-TRAILER x-amz-content-sha256")
            return
        algorithm = self.plan.checksum_algorithm if self.plan.checksum_in_trailer else None
        expected_name = f"x-amz-checksum-{algorithm}" if algorithm else None
        if len({name for name, _ in lines}) != len(lines):
            raise _bad_trailer("a repeated trailing header")
        fields = dict(line for line in lines if line[0] != TRAILER_SIGNATURE)
        if set(fields) != ({expected_name} if expected_name else set()):
            raise _bad_trailer(f"expected {expected_name or 'no trailing header'}, got {', '.join(fields) or 'none'}")
        if self.plan.streaming == STREAMING_SIGNED_TRAILER:
            self._verify_trailer(previous, fields, dict(lines).get(TRAILER_SIGNATURE))
        if algorithm is not None and expected_name is not None:
            self._expected_checksum = _checksum_value(algorithm, fields[expected_name], "trailing header")

    def _verify_trailer(self, previous: str, fields: dict[str, str], signature: str | None) -> None:
        assert self._auth is not None
        canonical = "".join(f"{name}:{value}\n" for name, value in sorted(fields.items()))
        expected = trailer_signature(self._auth, previous, hashlib.sha256(canonical.encode()).hexdigest())
        if signature is None or not hmac.compare_digest(expected, signature):
            raise _bad_signature()

    def _finish(self) -> None:
        if self.plan.declared_bytes is not None and self._size_bytes != self.plan.declared_bytes:
            raise _incomplete()
        if self.plan.content_md5 is not None and self._md5.digest() != self.plan.content_md5:
            raise bad_digest("The Content-MD5 you specified did not match what we received.")
        if self._sha256 is not None and self._sha256.hexdigest() != self.plan.payload_sha256:
            raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match "
                          "what was computed.")
        if self._checksum is not None and self.plan.checksum_algorithm is not None:
            if self._expected_checksum is None or self._checksum.digest() != self._expected_checksum:
                raise bad_digest(f"The {self._checksum.algorithm.upper()} you specified did not match the "
                                 "calculated checksum.")
        self._done = True
