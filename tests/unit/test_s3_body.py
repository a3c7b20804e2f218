"""Request bodies: plain and aws-chunked, checked against AWS's documented examples and bodies botocore builds."""
from __future__ import annotations

import asyncio
import base64
import calendar
import hashlib
import hmac
import io
import time
import zlib
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from aiohttp import StreamReader
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import ContentLengthError
from botocore.config import Config
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum, Sha1Checksum, Sha256Checksum
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from node.s3 import body as body_module
from node.s3.body import MAX_LINE_BYTES, BodyReader, RunningChecksum, crc32c_py, crc64nvme_py
from node.s3.errors import S3Error
from node.s3.sigv4 import (
    EMPTY_SHA256,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    AuthResult,
    authenticate,
)

MAX_BYTES = 1 << 20
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_DATE, DOC_SCOPE = "20130524T000000Z", "20130524/us-east-1/s3/aws4_request"
DOC_PAYLOAD = b"a" * 66560  # the AWS examples: 64 KiB + 1 KiB of 'a'
DOC_SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
DOC_CHUNK_SIGNATURES = ["ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
                        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
                        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"]
TRAILER_DOC_SEED = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
TRAILER_DOC_CHUNK_SIGNATURES = ["b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
                                "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
                                "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992"]
TRAILER_DOC_SIGNATURE = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"


class MemoryStream:
    """An in-memory StreamLike that hands out at most `max_read_bytes` per read and, like aiohttp, raises
    `error` (if any) once its data is used up instead of reporting end of stream."""

    def __init__(self, data: bytes, max_read_bytes: int = 1 << 30, error: BaseException | None = None) -> None:
        self._data, self._offset, self._max_read_bytes, self._error = data, 0, max_read_bytes, error
        self.largest_read_bytes = 0

    def _take(self, n: int, whole: bool = False) -> bytes:
        if self._offset >= len(self._data) and self._error is not None:
            raise self._error
        piece = self._data[self._offset:self._offset + (n if whole else min(n, self._max_read_bytes))]
        self._offset += len(piece)
        return piece

    async def read(self, n: int = -1) -> bytes:
        self.largest_read_bytes = max(self.largest_read_bytes, n)
        return self._take(len(self._data) if n < 0 else n)

    async def readexactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            piece = self._take(n - len(out))
            if not piece:
                raise asyncio.IncompleteReadError(out, n)
            out += piece
        return out

    async def readline(self) -> bytes:
        end = self._data.find(b"\n", self._offset)
        return self._take((len(self._data) if end < 0 else end + 1) - self._offset, whole=True)


class _Protocol(BaseProtocol):
    """Flow control is a no-op here: no transport behind the StreamReader."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def aiohttp_stream() -> StreamReader:
    """aiohttp's own request-body reader, fed by the test (needs a running loop)."""
    loop = asyncio.get_running_loop()
    return StreamReader(_Protocol(loop), 2 ** 16, loop=loop)


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


async def pieces_of(reader: BodyReader) -> list[bytes]:
    return [piece async for piece in reader]


def read(data: bytes, headers: dict[str, str], auth: AuthResult | None = None, chunk_bytes: int = 1 << 20,
         max_read_bytes: int = 1 << 30, max_bytes: int = MAX_BYTES) -> tuple[bytes, BodyReader]:
    reader = BodyReader(MemoryStream(data, max_read_bytes), headers, auth, max_bytes, chunk_bytes)
    return b"".join(run(pieces_of(reader))), reader


def fails(code: str, status: int, data: bytes, headers: dict[str, str], auth: AuthResult | None = None,
          **kwargs: Any) -> S3Error:
    with pytest.raises(S3Error) as caught:
        read(data, headers, auth, **kwargs)
    assert (caught.value.code, caught.value.status) == (code, status), caught.value
    return caught.value


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def md5_b64(data: bytes) -> str:
    return b64(hashlib.md5(data).digest())


def plain(data: bytes, **extra: str) -> dict[str, str]:
    return {"Content-Length": str(len(data)), **extra}


# --- an aws-chunked signer written from the spec, checked against AWS's example ------------------------------------

def doc_key() -> bytes:
    key = ("AWS4" + DOC_SECRET).encode()
    for part in ("20130524", "us-east-1", "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def doc_auth(seed: str, payload_mode: str) -> AuthResult:
    return AuthResult("AKIAIOSFODNN7EXAMPLE", payload_mode, doc_key(), seed, DOC_DATE, DOC_SCOPE, False)


def _sign(key: bytes, *lines: str) -> str:
    return hmac.new(key, "\n".join(lines).encode(), hashlib.sha256).hexdigest()


def encode_signed(payload: bytes, sizes: list[int], auth: AuthResult,
                  trailer: tuple[str, str] | None = None) -> bytes:
    """aws-chunked body with chunk signatures (and a signed trailer) as the AWS pages describe."""
    out, previous, offset = [], auth.seed_signature, 0
    for size in [*sizes, 0]:
        data = payload[offset:offset + size]
        offset += size
        previous = _sign(auth.signing_key, "AWS4-HMAC-SHA256-PAYLOAD", auth.amz_date, auth.scope, previous,
                         EMPTY_SHA256, hashlib.sha256(data).hexdigest())
        out.append(b"%x;chunk-signature=%s\r\n" % (size, previous.encode()) + (data + b"\r\n" if size else b""))
    assert offset == len(payload)
    if trailer is not None:
        canonical = f"{trailer[0]}:{trailer[1]}\n".encode()
        signature = _sign(auth.signing_key, "AWS4-HMAC-SHA256-TRAILER", auth.amz_date, auth.scope, previous,
                          hashlib.sha256(canonical).hexdigest())
        out.append(f"{trailer[0]}:{trailer[1]}\r\nx-amz-trailer-signature:{signature}\r\n".encode())
    return b"".join(out) + b"\r\n"


def chunked_headers(mode: str, decoded_bytes: int, **extra: str) -> dict[str, str]:
    return {"x-amz-content-sha256": mode, "Content-Encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(decoded_bytes), **extra}


def sizes_for(total: int, chunk: int) -> list[int]:
    return [min(chunk, total - offset) for offset in range(0, total, chunk)]


def test_test_signer_reproduces_the_aws_chunked_example() -> None:
    encoded = encode_signed(DOC_PAYLOAD, [65536, 1024], doc_auth(DOC_SEED, STREAMING_SIGNED))
    for signature in DOC_CHUNK_SIGNATURES:
        assert f"chunk-signature={signature}\r\n".encode() in encoded
    assert len(encoded) == 66824  # the example's Content-Length


def test_aws_chunked_example_end_to_end_from_the_authorization_header() -> None:
    headers = {"Host": "s3.amazonaws.com", "x-amz-date": DOC_DATE, "x-amz-storage-class": "REDUCED_REDUNDANCY",
               "Content-Length": "66824", **chunked_headers(STREAMING_SIGNED, 66560), "Authorization": (
                   "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                   "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
                   f"x-amz-decoded-content-length;x-amz-storage-class,Signature={DOC_SEED}")}
    auth = authenticate("PUT", "/examplebucket/chunkObject.txt", [], headers, {"AKIAIOSFODNN7EXAMPLE": DOC_SECRET}.get,
                        calendar.timegm((2013, 5, 24, 0, 0, 0)))
    assert auth is not None
    body = (f"10000;chunk-signature={DOC_CHUNK_SIGNATURES[0]}\r\n".encode() + b"a" * 65536 + b"\r\n"
            + f"400;chunk-signature={DOC_CHUNK_SIGNATURES[1]}\r\n".encode() + b"a" * 1024 + b"\r\n"
            + f"0;chunk-signature={DOC_CHUNK_SIGNATURES[2]}\r\n\r\n".encode())
    payload, reader = read(body, headers, auth, chunk_bytes=4096)
    assert payload == DOC_PAYLOAD and reader.size == 66560
    assert reader.md5_hex == hashlib.md5(DOC_PAYLOAD).hexdigest() and reader.checksums == {}


def test_aws_signed_trailer_example() -> None:
    auth = doc_auth(TRAILER_DOC_SEED, STREAMING_SIGNED_TRAILER)
    body = (f"10000;chunk-signature={TRAILER_DOC_CHUNK_SIGNATURES[0]}\r\n".encode() + b"a" * 65536 + b"\r\n"
            + f"400;chunk-signature={TRAILER_DOC_CHUNK_SIGNATURES[1]}\r\n".encode() + b"a" * 1024 + b"\r\n"
            + f"0;chunk-signature={TRAILER_DOC_CHUNK_SIGNATURES[2]}\r\n".encode()
            + f"x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_DOC_SIGNATURE}\r\n\r\n".encode())
    assert body == encode_signed(DOC_PAYLOAD, [65536, 1024], auth, ("x-amz-checksum-crc32c", "sOO8/Q=="))
    headers = chunked_headers(STREAMING_SIGNED_TRAILER, 66560, **{"x-amz-trailer": "x-amz-checksum-crc32c"})
    payload, reader = read(body, headers, auth)
    assert payload == DOC_PAYLOAD and reader.checksums == {"crc32c": "sOO8/Q=="}
    fails("SignatureDoesNotMatch", 403, body.replace(TRAILER_DOC_SIGNATURE.encode(), b"0" * 64), headers, auth)


# --- checksum algorithms --------------------------------------------------------------------------------------------

def test_crc_check_values() -> None:
    assert crc32c_py(b"123456789") == 0xE3069283
    assert crc64nvme_py(b"123456789") == 0xAE8B14860A799888
    assert body_module.crc32c(b"123456789", 0) == 0xE3069283
    assert body_module.crc64nvme(b"123456789", 0) == 0xAE8B14860A799888
    assert crc32c_py(b"") == 0 and crc64nvme_py(b"") == 0


def test_pure_crcs_agree_with_awscrt_when_installed() -> None:
    checksums = pytest.importorskip("awscrt.checksums")
    for data in (b"", b"x", bytes(range(256)) * 37, DOC_PAYLOAD):
        assert crc32c_py(data) == checksums.crc32c(data)
        assert crc64nvme_py(data) == checksums.crc64nvme(data)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=600), cut=st.integers(0, 600),
       algorithm=st.sampled_from(sorted(body_module.DIGEST_BYTES)))
def test_running_checksum_is_independent_of_how_the_stream_is_cut(data: bytes, cut: int, algorithm: str) -> None:
    whole, parts = RunningChecksum(algorithm), RunningChecksum(algorithm)
    whole.update(data)
    parts.update(data[:cut])
    parts.update(data[cut:])
    assert whole.digest() == parts.digest()
    assert len(whole.digest()) == body_module.DIGEST_BYTES[algorithm]


def test_running_checksums_match_zlib_hashlib_and_botocore() -> None:
    data = b"The quick brown fox jumps over the lazy dog" * 100
    expected = {"crc32": zlib.crc32(data).to_bytes(4, "big"), "sha1": hashlib.sha1(data).digest(),
                "sha256": hashlib.sha256(data).digest(), "crc32c": crc32c_py(data).to_bytes(4, "big"),
                "crc64nvme": crc64nvme_py(data).to_bytes(8, "big")}
    for algorithm, digest in expected.items():
        checksum = RunningChecksum(algorithm)
        checksum.update(data)
        assert checksum.digest() == digest
    for algorithm, botocore_cls in (("crc32", Crc32Checksum), ("sha1", Sha1Checksum), ("sha256", Sha256Checksum)):
        theirs = botocore_cls()
        theirs.update(data)
        assert theirs.b64digest() == b64(expected[algorithm])


# --- plain bodies ---------------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), chunk_bytes=st.integers(1, 3000), max_read_bytes=st.integers(1, 5000))
def test_plain_body_streams_in_bounded_pieces(data: bytes, chunk_bytes: int, max_read_bytes: int) -> None:
    stream = MemoryStream(data, max_read_bytes)
    reader = BodyReader(stream, plain(data), None, MAX_BYTES, chunk_bytes)
    pieces = run(pieces_of(reader))
    assert b"".join(pieces) == data and all(0 < len(p) <= chunk_bytes for p in pieces)
    assert stream.largest_read_bytes <= chunk_bytes
    assert reader.size == len(data) and reader.md5_hex == hashlib.md5(data).hexdigest()


def test_plain_body_without_content_length_reads_to_the_end() -> None:
    payload, reader = read(b"x" * 3000, {}, chunk_bytes=1000)
    assert payload == b"x" * 3000 and reader.size == 3000


def test_read_all_returns_the_verified_body() -> None:
    data = b"<Delete><Object><Key>a</Key></Object></Delete>"
    reader = BodyReader(MemoryStream(data), plain(data, **{"Content-MD5": md5_b64(data)}), None, MAX_BYTES)
    assert run(reader.read_all()) == data
    bad = BodyReader(MemoryStream(data), plain(data, **{"Content-MD5": md5_b64(b"other")}), None, MAX_BYTES)
    with pytest.raises(S3Error, match="BadDigest"):
        run(bad.read_all())


def test_content_md5() -> None:
    data = b"hello world"
    assert read(data, plain(data, **{"Content-MD5": md5_b64(data)}))[0] == data
    fails("BadDigest", 400, data, plain(data, **{"Content-MD5": md5_b64(b"hello worle")}))
    for malformed in ("not base64!", b64(b"short"), b64(b"x" * 17), ""):
        fails("InvalidDigest", 400, data, plain(data, **{"Content-MD5": malformed}))


@pytest.mark.parametrize("algorithm", sorted(body_module.DIGEST_BYTES))
def test_checksum_headers_each_algorithm(algorithm: str) -> None:
    data = bytes(range(256)) * 20
    right, wrong = RunningChecksum(algorithm), RunningChecksum(algorithm)
    right.update(data)
    wrong.update(data + b"!")
    name = f"x-amz-checksum-{algorithm}"
    payload, reader = read(data, plain(data, **{name: right.b64digest()}), chunk_bytes=1000)
    assert payload == data and reader.checksums == {algorithm: right.b64digest()}
    error = fails("BadDigest", 400, data, plain(data, **{name: wrong.b64digest()}))
    assert algorithm.upper() in error.message
    fails("InvalidRequest", 400, data, plain(data, **{name: "***"}))
    fails("InvalidRequest", 400, data, plain(data, **{name: b64(b"\0" * (body_module.DIGEST_BYTES[algorithm] + 1))}))


def test_more_than_one_checksum_or_an_unknown_one_is_invalid_request() -> None:
    data = b"abc"
    crc = b64(zlib.crc32(data).to_bytes(4, "big"))
    sha1 = b64(hashlib.sha1(data).digest())
    fails("InvalidRequest", 400, data, plain(data, **{"x-amz-checksum-crc32": crc, "x-amz-checksum-sha1": sha1}))
    fails("InvalidRequest", 400, data, plain(data, **{"x-amz-checksum-md4": crc}))
    assert read(data, plain(data, **{"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-crc32": crc}))[0] == data


def test_payload_sha256() -> None:
    data = b"payload"
    ok = plain(data, **{"x-amz-content-sha256": hashlib.sha256(data).hexdigest().upper()})
    assert read(data, ok)[0] == data
    fails("XAmzContentSHA256Mismatch", 400, data,
          plain(data, **{"x-amz-content-sha256": hashlib.sha256(b"other").hexdigest()}))
    assert read(data, plain(data, **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}))[0] == data


def test_signed_payload_hash_comes_from_the_auth_result() -> None:
    data = b"payload"
    auth = doc_auth(DOC_SEED, hashlib.sha256(b"other").hexdigest())
    fails("XAmzContentSHA256Mismatch", 400, data, plain(data, **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}), auth)


def test_truncated_plain_body_is_incomplete_body() -> None:
    data = b"0123456789"
    fails("IncompleteBody", 400, data[:6], plain(data))
    fails("IncompleteBody", 400, b"", plain(data))


@pytest.mark.parametrize("error", [ContentLengthError("Not enough data to satisfy content length header."),
                                   ConnectionResetError("Connection lost"), asyncio.IncompleteReadError(b"", 4)])
def test_what_aiohttp_raises_on_a_cut_connection_is_incomplete_body(error: BaseException) -> None:
    data = b"0123456789"
    reader = BodyReader(MemoryStream(data[:4], error=error), plain(data), None, MAX_BYTES, 2)
    with pytest.raises(S3Error, match="IncompleteBody"):
        run(pieces_of(reader))


def test_aiohttp_stream_reader_with_exception_is_incomplete_body() -> None:
    async def go() -> None:
        stream = aiohttp_stream()
        stream.feed_data(b"01234")
        reader = BodyReader(stream, plain(b"0123456789"), None, MAX_BYTES, 1 << 20)
        pieces = reader.__aiter__()
        assert await pieces.__anext__() == b"01234"
        stream.set_exception(ContentLengthError("Not enough data to satisfy content length header."))
        with pytest.raises(S3Error, match="IncompleteBody"):
            await pieces.__anext__()
    run(go())


def test_body_larger_than_max_bytes_is_entity_too_large() -> None:
    data = b"x" * 101
    with pytest.raises(S3Error, match="EntityTooLarge"):
        BodyReader(MemoryStream(data), plain(data), None, 100)
    fails("EntityTooLarge", 400, data, {}, max_bytes=100)
    assert read(data[:100], {}, max_bytes=100)[0] == data[:100]


def test_a_body_is_read_once_and_results_wait_for_the_end() -> None:
    reader = BodyReader(MemoryStream(b"abc"), plain(b"abc"), None, MAX_BYTES)
    with pytest.raises(AssertionError):
        reader.md5_hex
    run(pieces_of(reader))
    with pytest.raises(AssertionError):
        reader.__aiter__()


# --- aws-chunked, signed ------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000), chunk=st.integers(1, 1000), chunk_bytes=st.integers(1, 700),
       max_read_bytes=st.integers(1, 4000))
def test_signed_chunked_round_trip(data: bytes, chunk: int, chunk_bytes: int, max_read_bytes: int) -> None:
    auth = doc_auth(DOC_SEED, STREAMING_SIGNED)
    encoded = encode_signed(data, sizes_for(len(data), chunk), auth)
    stream = MemoryStream(encoded, max_read_bytes)
    reader = BodyReader(stream, chunked_headers(STREAMING_SIGNED, len(data)), auth, MAX_BYTES, chunk_bytes)
    pieces = run(pieces_of(reader))
    assert b"".join(pieces) == data and all(len(p) <= chunk_bytes for p in pieces)
    assert reader.md5_hex == hashlib.md5(data).hexdigest() and reader.size == len(data)


def test_chunks_are_yielded_as_they_arrive() -> None:
    auth = doc_auth(DOC_SEED, STREAMING_SIGNED)
    encoded = encode_signed(b"a" * 300, [100, 100, 100], auth)

    async def go() -> None:
        stream = aiohttp_stream()
        stream.feed_data(encoded[:200])  # the first chunk (85 + 100 + 2 bytes) and a bit of the second
        reader = BodyReader(stream, chunked_headers(STREAMING_SIGNED, 300), auth, MAX_BYTES, 64)
        pieces = reader.__aiter__()
        assert await pieces.__anext__() == b"a" * 64
        assert await pieces.__anext__() == b"a" * 36
        stream.feed_data(encoded[200:])
        stream.feed_eof()
        assert b"".join([p async for p in pieces]) == b"a" * 200
    run(go())


def test_bad_chunk_signature_is_signature_does_not_match() -> None:
    auth = doc_auth(DOC_SEED, STREAMING_SIGNED)
    data = bytes(range(256)) * 4
    encoded = encode_signed(data, [256, 256, 512], auth)
    headers = chunked_headers(STREAMING_SIGNED, len(data))
    signatures = [line.split(b"=")[1] for line in encoded.split(b"\r\n") if b"chunk-signature=" in line]
    for signature in signatures:  # each of the four, the final empty chunk's included
        flipped = signature[:10] + (b"0" if signature[10:11] != b"0" else b"1") + signature[11:]
        fails("SignatureDoesNotMatch", 403, encoded.replace(signature, flipped), headers, auth)
    fails("SignatureDoesNotMatch", 403, encoded.replace(b";chunk-signature=" + signatures[1], b""), headers, auth)
    tampered = encoded.replace(bytes(range(256)), bytes(range(1, 256)) + b"\0", 1)
    fails("SignatureDoesNotMatch", 403, tampered, headers, auth)
    other_seed = doc_auth("0" * 64, STREAMING_SIGNED)
    fails("SignatureDoesNotMatch", 403, encoded, headers, other_seed)


def test_signed_chunks_need_a_header_signature() -> None:
    data = b"abc"
    encoded = encode_signed(data, [3], doc_auth(DOC_SEED, STREAMING_SIGNED))
    fails("AccessDenied", 403, encoded, chunked_headers(STREAMING_SIGNED, 3))
    presigned = AuthResult("AK", "UNSIGNED-PAYLOAD", doc_key(), DOC_SEED, DOC_DATE, DOC_SCOPE, True)
    fails("AccessDenied", 403, encoded, chunked_headers(STREAMING_SIGNED, 3), presigned)


def test_signed_trailer_checksum_and_signature() -> None:
    auth = doc_auth(TRAILER_DOC_SEED, STREAMING_SIGNED_TRAILER)
    data = b"trailing data " * 50
    crc = b64(zlib.crc32(data).to_bytes(4, "big"))
    headers = chunked_headers(STREAMING_SIGNED_TRAILER, len(data), **{"x-amz-trailer": "x-amz-checksum-crc32"})
    payload, reader = read(encode_signed(data, [300, 400], auth, ("x-amz-checksum-crc32", crc)), headers, auth)
    assert payload == data and reader.checksums == {"crc32": crc}
    wrong = b64((zlib.crc32(data) ^ 1).to_bytes(4, "big"))
    fails("BadDigest", 400, encode_signed(data, [300, 400], auth, ("x-amz-checksum-crc32", wrong)), headers, auth)
    good = encode_signed(data, [300, 400], auth, ("x-amz-checksum-crc32", crc))
    forged = good.replace(crc.encode(), wrong.encode())  # checksum changed, signature kept
    fails("SignatureDoesNotMatch", 403, forged, headers, auth)
    unsigned = good[:good.index(b"x-amz-trailer-signature")] + b"\r\n"
    fails("SignatureDoesNotMatch", 403, unsigned, headers, auth)


def test_missing_or_unexpected_trailer_is_malformed_trailer() -> None:
    auth = doc_auth(TRAILER_DOC_SEED, STREAMING_SIGNED_TRAILER)
    data = b"abc"
    crc = b64(zlib.crc32(data).to_bytes(4, "big"))
    with_crc32 = chunked_headers(STREAMING_SIGNED_TRAILER, 3, **{"x-amz-trailer": "x-amz-checksum-crc32"})
    fails("MalformedTrailerError", 400, encode_signed(data, [3], auth, ("x-amz-checksum-sha1", crc)), with_crc32, auth)
    plain_signed = encode_signed(data, [3], doc_auth(DOC_SEED, STREAMING_SIGNED))
    fails("MalformedTrailerError", 400, plain_signed[:-2] + b"x-amz-meta-a:1\r\n\r\n",
          chunked_headers(STREAMING_SIGNED, 3), doc_auth(DOC_SEED, STREAMING_SIGNED))
    fails("MalformedTrailerError", 400, plain_signed[:-2] + b"no colon here\r\n\r\n",
          chunked_headers(STREAMING_SIGNED, 3), doc_auth(DOC_SEED, STREAMING_SIGNED))
    too_many = plain_signed[:-2] + b"".join(b"x-amz-meta-%d:1\r\n" % i for i in range(20)) + b"\r\n"
    fails("MalformedTrailerError", 400, too_many, chunked_headers(STREAMING_SIGNED, 3),
          doc_auth(DOC_SEED, STREAMING_SIGNED))


@pytest.mark.parametrize("declared", [0, 299, 301, 10_000])
def test_wrong_decoded_length_is_incomplete_body(declared: int) -> None:
    auth = doc_auth(DOC_SEED, STREAMING_SIGNED)
    fails("IncompleteBody", 400, encode_signed(b"z" * 300, [100, 200], auth),
          chunked_headers(STREAMING_SIGNED, declared), auth)


def test_decoded_length_header_is_required_and_bounded() -> None:
    auth = doc_auth(DOC_SEED, STREAMING_SIGNED)
    headers = chunked_headers(STREAMING_SIGNED, 3)
    del headers["x-amz-decoded-content-length"]
    fails("InvalidRequest", 400, b"", headers, auth)
    fails("InvalidArgument", 400, b"", chunked_headers(STREAMING_SIGNED, 3) | {"x-amz-decoded-content-length": "x"},
          auth)
    fails("EntityTooLarge", 400, b"", chunked_headers(STREAMING_SIGNED, MAX_BYTES + 1), auth)


# --- aws-chunked framing --------------------------------------------------------------------------------------------

UNSIGNED = chunked_headers(STREAMING_UNSIGNED_TRAILER, 5)


@pytest.mark.parametrize("body", [
    b"zz\r\nhello\r\n0\r\n\r\n",  # size is not hex
    b"\r\nhello\r\n0\r\n\r\n",  # no size
    b"-5\r\nhello\r\n0\r\n\r\n",
    b"5\r\nhelloXX0\r\n\r\n",  # data not followed by CRLF
    b"5\nhello\r\n0\r\n\r\n",  # bare LF
    b"5\r\nhello\r\n0\r\n\r\ntrailing garbage",  # data after the end
    b"11111111111111111\r\nhello\r\n0\r\n\r\n",  # size longer than 16 hex digits
    b"5" * (MAX_LINE_BYTES + 10) + b"\r\nhello\r\n0\r\n\r\n",  # a line longer than the limit
    b"5;" + b"x" * (MAX_LINE_BYTES - 3) + b"\r\nhello\r\n0\r\n\r\n",  # one byte over, else well formed
], ids=["not-hex", "no-size", "negative", "no-crlf-after-data", "bare-lf", "data-after-end", "size-too-long",
        "line-too-long", "extension-too-long"])
def test_garbage_framing_is_invalid_request(body: bytes) -> None:
    fails("InvalidRequest", 400, body, UNSIGNED)


def test_a_line_of_exactly_the_limit_is_accepted() -> None:
    body = b"5;" + b"x" * (MAX_LINE_BYTES - 4) + b"\r\nhello\r\n0\r\n\r\n"
    assert read(body, UNSIGNED)[0] == b"hello"


@pytest.mark.parametrize("body", [
    b"", b"5\r\nhel", b"5\r\nhello", b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n", b"5\r\nhello\r\n0",
    b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:", b"5;chunk-signa",
])
def test_truncated_chunked_body_is_incomplete_body(body: bytes) -> None:
    fails("IncompleteBody", 400, body, UNSIGNED)


def test_a_huge_line_without_newline_on_aiohttp_does_not_hang() -> None:
    async def go() -> None:
        stream = aiohttp_stream()
        stream.feed_data(b"1" * (1 << 20))  # never a newline, never EOF: aiohttp's readline limit ends it
        reader = BodyReader(stream, UNSIGNED, None, MAX_BYTES)
        with pytest.raises(S3Error, match="InvalidRequest"):
            await asyncio.wait_for(pieces_of(reader), timeout=5)
    run(go())


def test_unknown_streaming_mode_and_stray_aws_chunked_are_rejected() -> None:
    fails("InvalidArgument", 400, b"", {"x-amz-content-sha256": "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"})
    fails("InvalidRequest", 400, b"", {"Content-Encoding": "gzip, aws-chunked", "Content-Length": "0"})
    fails("InvalidRequest", 400, b"", chunked_headers(STREAMING_SIGNED, 0, **{"x-amz-trailer": "x-amz-checksum-crc32"}),
          doc_auth(DOC_SEED, STREAMING_SIGNED))
    fails("InvalidRequest", 400, b"", chunked_headers(STREAMING_UNSIGNED_TRAILER, 0, **{"x-amz-trailer": "x-amz-meta"}))


# --- aws-chunked as botocore builds it (unsigned payload with a checksum trailer) -----------------------------------

@pytest.mark.parametrize("checksum_cls,algorithm", [(Crc32Checksum, "crc32"), (Sha1Checksum, "sha1"),
                                                    (Sha256Checksum, "sha256"), (None, None)])
def test_botocore_aws_chunked_wrapper_body(checksum_cls: Any, algorithm: str | None) -> None:
    data = bytes(range(256)) * 1000  # 256,000 bytes: several 64 KiB chunks
    name = f"x-amz-checksum-{algorithm}"
    wrapper = AwsChunkedWrapper(io.BytesIO(data), checksum_cls=checksum_cls, checksum_name=name,
                                chunk_size=64 * 1024)
    encoded = wrapper.read()
    headers = chunked_headers(STREAMING_UNSIGNED_TRAILER, len(data), **({"x-amz-trailer": name} if algorithm else {}))
    payload, reader = read(encoded, headers, chunk_bytes=10_000, max_read_bytes=7777)
    assert payload == data and reader.md5_hex == hashlib.md5(data).hexdigest()
    if algorithm is not None:
        expected = checksum_cls()
        expected.update(data)
        assert reader.checksums == {algorithm: expected.b64digest()}
        corrupted = encoded.replace(data[1000:1010], b"X" * 10, 1)
        fails("BadDigest", 400, corrupted, headers)
        fails("MalformedTrailerError", 400, encoded[:encoded.index(b"x-amz-checksum")] + b"\r\n", headers)


class Captured(Exception):
    pass


def _botocore_request(endpoint: str, **put: Any) -> tuple[Any, dict[str, str], bytes]:
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="AKID", aws_secret_access_key="SECRET",
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))

    def before_send(request: Any, **_: Any) -> None:
        raise Captured(request)
    client.meta.events.register("before-send.s3", before_send)
    with pytest.raises(Captured) as caught:
        client.put_object(Bucket="b", Key="k", **put)
    request = caught.value.args[0]
    headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
    headers.setdefault("host", urlsplit(request.url).netloc)
    raw = request.body.read() if hasattr(request.body, "read") else request.body or b""
    return request, headers, raw


def _authenticated(request: Any, headers: dict[str, str]) -> AuthResult:
    url = URL(request.url, encoded=True)
    auth = authenticate(request.method, url.raw_path, list(url.query.items()), headers, {"AKID": "SECRET"}.get,
                        time.time())
    assert auth is not None
    return auth


def test_boto3_put_object_over_https_end_to_end() -> None:
    data = b"hello world " * 20000  # 240,000 bytes
    request, headers, raw = _botocore_request("https://127.0.0.1:9443", Body=data)
    assert headers["content-encoding"] == "aws-chunked" and raw.endswith(b"\r\n\r\n")
    auth = _authenticated(request, headers)
    assert auth.payload_sha256 == STREAMING_UNSIGNED_TRAILER
    payload, reader = read(raw, headers, auth, chunk_bytes=65536)
    assert payload == data and reader.checksums == {"crc32": b64(zlib.crc32(data).to_bytes(4, "big"))}


def _has_awscrt() -> bool:
    try:
        import awscrt  # noqa: F401
    except ImportError:
        return False
    return True


NEEDS_CRT = pytest.mark.skipif(not _has_awscrt(), reason="botocore computes CRC32C and CRC64NVME only with awscrt")


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA1", "SHA256", None, pytest.param("CRC32C", marks=NEEDS_CRT),
                                       pytest.param("CRC64NVME", marks=NEEDS_CRT)])
def test_boto3_put_object_over_http_end_to_end(algorithm: str | None) -> None:
    data = b"payload bytes " * 1000
    request, headers, raw = _botocore_request("http://127.0.0.1:9000", Body=data,
                                              **({"ChecksumAlgorithm": algorithm} if algorithm else {}))
    auth = _authenticated(request, headers)
    payload, reader = read(raw, headers, auth, chunk_bytes=4096)
    assert payload == data and set(reader.checksums) == {(algorithm or "CRC32").lower()}
    fails("XAmzContentSHA256Mismatch", 400, raw[:-1] + b"!", {k: v for k, v in headers.items()
                                                               if not k.startswith("x-amz-checksum")}, auth)


@pytest.mark.parametrize("threshold", [0, 1 << 40], ids=["hashed-in-thread", "hashed-inline"])
def test_large_bodies_hashed_beside_the_loop_check_the_same(threshold: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies of 256 KiB or more are hashed in a thread, pieces in order, with a bounded
    backlog; every check S3 makes must give the same answer as hashing inline."""
    monkeypatch.setattr(body_module, "THREAD_HASH_MIN_BYTES", threshold)
    monkeypatch.setattr(body_module, "THREAD_HASH_AHEAD_BYTES", 50_000)   # the backlog bound bites
    data = bytes(range(256)) * 3000 + b"tail"                            # ~750 KiB
    crc = b64(zlib.crc32(data).to_bytes(4, "big"))
    got, reader = read(data, plain(data, **{"Content-MD5": md5_b64(data), "x-amz-checksum-crc32": crc}),
                       max_read_bytes=7_001)                             # many small pieces
    assert got == data
    assert reader.md5_hex == hashlib.md5(data).hexdigest()
    assert reader.checksums == {"crc32": crc}
    fails("BadDigest", 400, data, plain(data, **{"Content-MD5": md5_b64(data[:-1])}), max_read_bytes=7_001)
    fails("BadDigest", 400, data, plain(data, **{"x-amz-checksum-crc32": b64(b"\0\0\0\0")}))
    wrong = AuthResult("AKID", hashlib.sha256(data[:-1]).hexdigest(), b"k", "seed", "20261201T000000Z",
                       "20261201/us-east-1/s3/aws4_request", False)
    fails("XAmzContentSHA256Mismatch", 400, data, plain(data), wrong, max_read_bytes=7_001)
    right = AuthResult("AKID", hashlib.sha256(data).hexdigest(), b"k", "seed", "20261201T000000Z",
                       "20261201/us-east-1/s3/aws4_request", False)
    assert read(data, plain(data), right, max_read_bytes=7_001)[0] == data
