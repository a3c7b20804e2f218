"""S3 authentication and request bodies through the gateway: SigV4 and SigV2 (headers and
presigned URLs), Content-MD5, x-amz-checksum-*, aws-chunked bodies with trailers, and
malformed requests. Expected codes are S3's documented ones.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import hashlib
import io
import socket
from base64 import b64encode
from urllib.parse import quote, urlsplit

import pytest
from botocore.client import BaseClient
from botocore.compat import HAS_CRT
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum

from tests.cluster.s3_fixtures import (  # noqa: F401
    AwsCli,
    Gateway,
    MiB,
    aws,
    blob,
    bucket,
    client_error,
    crc32_b64,
    gateway,
    http_request,
    make_client,
    md5_b64,
    md5_etag,
    poll,
    ragged,
    raw_request,
    record_headers,
    s3,
    s3_cluster,
    s3_once,
    sign,
    status,
)


# ---- Content-MD5 and checksums -----------------------------------------------------------
def test_content_md5_is_checked(s3: BaseClient, s3_once: BaseClient, bucket: str) -> None:
    data = b"checked by md5"
    s3.put_object(Bucket=bucket, Key="md5/ok", Body=data, ContentMD5=md5_b64(data))
    assert s3.get_object(Bucket=bucket, Key="md5/ok")["Body"].read() == data
    assert client_error(lambda: s3_once.put_object(Bucket=bucket, Key="md5/bad", Body=data,
                                                   ContentMD5=md5_b64(b"other"))) == ("BadDigest", 400)
    assert client_error(lambda: s3_once.put_object(Bucket=bucket, Key="md5/bad", Body=data,
                                                   ContentMD5="not-an-md5")) == ("InvalidDigest", 400)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="md5/bad")) == ("404", 404)


def test_default_boto3_put_sends_a_crc32_that_the_gateway_accepts(gateway: Gateway, bucket: str) -> None:
    # Over plain HTTP botocore puts the CRC32 in a header; over TLS it sends it as an
    # aws-chunked trailer (tls_style_client below).
    client = make_client(gateway)
    sent = record_headers(client, "PutObject")
    data = blob(200_000, 4)
    client.put_object(Bucket=bucket, Key="crc/default", Body=data)
    assert sent and sent[0]["x-amz-checksum-crc32"] == crc32_b64(data)
    assert client.get_object(Bucket=bucket, Key="crc/default")["Body"].read() == data


NEEDS_CRT = pytest.mark.skipif(not HAS_CRT, reason="botocore computes this checksum only with awscrt")


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA1", "SHA256", pytest.param("CRC32C", marks=NEEDS_CRT),
                                       pytest.param("CRC64NVME", marks=NEEDS_CRT)])
def test_explicit_checksum_algorithms_are_accepted(s3: BaseClient, bucket: str, algorithm: str) -> None:
    data = blob(150_000, 5)
    s3.put_object(Bucket=bucket, Key=f"crc/{algorithm}", Body=data, ChecksumAlgorithm=algorithm)
    assert s3.get_object(Bucket=bucket, Key=f"crc/{algorithm}")["Body"].read() == data


@pytest.mark.parametrize("param,value", [
    ("ChecksumCRC32", crc32_b64(b"something else")),
    ("ChecksumSHA256", b64encode(hashlib.sha256(b"something else").digest()).decode()),
])
def test_a_wrong_checksum_is_bad_digest(s3: BaseClient, s3_once: BaseClient, bucket: str,
                                       param: str, value: str) -> None:
    key = f"crc/wrong-{param}"
    assert client_error(lambda: s3_once.put_object(Bucket=bucket, Key=key, Body=b"payload",
                                                   **{param: value})) == ("BadDigest", 400)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key=key)) == ("404", 404)
    s3.put_object(Bucket=bucket, Key=key, Body=b"old")      # a refused overwrite keeps the old object
    assert client_error(lambda: s3_once.put_object(Bucket=bucket, Key=key, Body=b"payload",
                                                   **{param: value})) == ("BadDigest", 400)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"old"


def test_a_hand_signed_wrong_crc32_header_is_bad_digest(gateway: Gateway, s3: BaseClient,
                                                        bucket: str) -> None:
    resp = raw_request(gateway, "PUT", f"/{bucket}/crc/raw-wrong", body=b"payload",
                       headers={"x-amz-checksum-crc32": crc32_b64(b"payload!"),
                                "x-amz-sdk-checksum-algorithm": "CRC32"})
    assert (resp.status, resp.code) == (400, "BadDigest")
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="crc/raw-wrong")) == ("404", 404)


def aws_chunked(data: bytes, chunk_size: int = 64 * 1024) -> list[bytes]:
    """The body boto3 sends over TLS: botocore's aws-chunked encoder, CRC32 trailer."""
    wrapper = AwsChunkedWrapper(io.BytesIO(data), checksum_cls=Crc32Checksum,
                                checksum_name="x-amz-checksum-crc32", chunk_size=chunk_size)
    return list(wrapper)


def chunked_put(gw: Gateway, path: str, data: bytes, wire: list[bytes],
                content_encoding: str = "aws-chunked") -> tuple[int, str | None, str]:
    headers = {"Content-Encoding": content_encoding, "Transfer-Encoding": "chunked",
               "X-Amz-Trailer": "x-amz-checksum-crc32",
               "X-Amz-Decoded-Content-Length": str(len(data))}
    resp = raw_request(gw, "PUT", path, headers=headers, trailer="x-amz-checksum-crc32", wire_body=wire)
    return resp.status, resp.code, resp.headers.get("etag", "")


def test_aws_chunked_body_with_a_crc32_trailer_is_accepted(gateway: Gateway, s3: BaseClient,
                                                           bucket: str) -> None:
    data = blob(300_001, 6)  # 5 chunks and a short one
    st, code, etag = chunked_put(gateway, f"/{bucket}/chunked/ok", data, aws_chunked(data))
    assert (st, code) == (200, None)
    assert etag == md5_etag(data)
    assert s3.get_object(Bucket=bucket, Key="chunked/ok")["Body"].read() == data


def test_aws_chunked_body_with_a_wrong_trailer_is_bad_digest(gateway: Gateway, s3: BaseClient,
                                                             bucket: str) -> None:
    data = blob(100_000, 7)
    wire = aws_chunked(data)
    good = f"x-amz-checksum-crc32:{crc32_b64(data)}".encode()
    assert good in wire[-1]
    wire[-1] = wire[-1].replace(good, f"x-amz-checksum-crc32:{crc32_b64(data + b'!')}".encode())
    st, code, _ = chunked_put(gateway, f"/{bucket}/chunked/bad", data, wire)
    assert (st, code) == (400, "BadDigest")
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="chunked/bad")) == ("404", 404)


def test_aws_chunked_keeps_the_other_content_encoding(gateway: Gateway, s3: BaseClient,
                                                      bucket: str) -> None:
    # boto3 with ContentEncoding="gzip" over TLS sends "gzip,aws-chunked"; S3 stores "gzip"
    data = blob(1000, 8)
    st, code, _ = chunked_put(gateway, f"/{bucket}/chunked/gz", data, aws_chunked(data),
                              content_encoding="gzip,aws-chunked")
    assert (st, code) == (200, None)
    assert s3.head_object(Bucket=bucket, Key="chunked/gz")["ContentEncoding"] == "gzip"


def tls_style_client(gw: Gateway) -> tuple[BaseClient, list[dict[str, str]]]:
    """boto3 as it behaves over TLS: botocore picks the checksum's location ("trailer" when
    the URL is https) and we flip only that decision, so the body is botocore's own
    aws-chunked stream with a trailing checksum, signed STREAMING-UNSIGNED-PAYLOAD-TRAILER.
    Returns the client and the headers of the PutObject/UploadPart requests it sends."""
    client = make_client(gw)

    def as_over_tls(params: dict, **_: object) -> None:
        algorithm = params["context"].get("checksum", {}).get("request_algorithm")
        if isinstance(algorithm, dict):
            algorithm["in"] = "trailer"
    for op in ("PutObject", "UploadPart"):
        client.meta.events.register(f"before-call.s3.{op}", as_over_tls)
    return client, record_headers(client, "*")


@pytest.mark.parametrize("size,algorithm", [(300_001, None), (3 * MiB + 5, None), (100_000, "SHA256"),
                                            (0, None)])
def test_boto3_aws_chunked_uploads_with_trailing_checksums_are_accepted(
        gateway: Gateway, bucket: str, size: int, algorithm: str | None) -> None:
    client, sent = tls_style_client(gateway)
    data, key = blob(size, size), f"trailer/{size}-{algorithm}"
    extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
    put = client.put_object(Bucket=bucket, Key=key, Body=data, **extra)
    trailer = f"x-amz-checksum-{(algorithm or 'crc32').lower()}"
    assert sent[-1]["content-encoding"] == "aws-chunked" and sent[-1]["x-amz-trailer"] == trailer
    assert sent[-1]["x-amz-content-sha256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    assert put["ETag"] == md5_etag(data)
    got = client.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == data and got["ContentLength"] == size
    assert "aws-chunked" not in got.get("ContentEncoding", "")


def test_boto3_aws_chunked_keeps_the_callers_content_encoding(gateway: Gateway, bucket: str) -> None:
    client, sent = tls_style_client(gateway)
    client.put_object(Bucket=bucket, Key="trailer/gz", Body=b"\x1f\x8b pretend", ContentEncoding="gzip")
    assert sent[-1]["content-encoding"] == "gzip,aws-chunked"
    assert client.head_object(Bucket=bucket, Key="trailer/gz")["ContentEncoding"] == "gzip"


def test_boto3_aws_chunked_upload_part(gateway: Gateway, bucket: str) -> None:
    client, sent = tls_style_client(gateway)
    parts = [blob(5 * MiB, 21), blob(1000, 22)]
    upload_id = client.create_multipart_upload(Bucket=bucket, Key="trailer/mpu")["UploadId"]
    done = [client.upload_part(Bucket=bucket, Key="trailer/mpu", UploadId=upload_id, PartNumber=n, Body=p)
            for n, p in enumerate(parts, 1)]
    assert all(h["content-encoding"] == "aws-chunked" for h in sent[-2:])
    client.complete_multipart_upload(Bucket=bucket, Key="trailer/mpu", UploadId=upload_id, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": d["ETag"], **({"ChecksumCRC32": d["ChecksumCRC32"]}
                                                          if "ChecksumCRC32" in d else {})}
                  for n, d in enumerate(done, 1)]})
    assert client.get_object(Bucket=bucket, Key="trailer/mpu")["Body"].read() == b"".join(parts)


def test_an_unsigned_payload_is_accepted(gateway: Gateway, bucket: str) -> None:
    # Over TLS botocore signs bodies that carry a checksum as UNSIGNED-PAYLOAD (DeleteObjects,
    # CompleteMultipartUpload, ...); payload_signing_enabled=False makes it do so here too.
    client = make_client(gateway, s3={"payload_signing_enabled": False})
    sent = record_headers(client, "*")
    data = blob(123_456, 11)
    client.put_object(Bucket=bucket, Key="unsigned-payload", Body=data)
    resp = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "unsigned-payload-gone"}]})
    assert [d["Key"] for d in resp["Deleted"]] == ["unsigned-payload-gone"]
    assert [h["x-amz-content-sha256"] for h in sent] == ["UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD"]
    assert client.get_object(Bucket=bucket, Key="unsigned-payload")["Body"].read() == data


def test_a_body_that_is_not_the_signed_one_is_refused(gateway: Gateway, s3: BaseClient,
                                                      bucket: str) -> None:
    url = f"{gateway.url}/{bucket}/sha-mismatch"
    headers = sign(gateway, "PUT", url, b"signed body")
    resp = http_request("PUT", url, b"sent body!!", headers)
    assert (resp.status, resp.code) == (400, "XAmzContentSHA256Mismatch")
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="sha-mismatch")) == ("404", 404)


# ---- authentication ----------------------------------------------------------------------
def test_unsigned_requests_are_access_denied(gateway: Gateway, bucket: str, ragged: bytes) -> None:
    for method, path, body in (("GET", f"/{bucket}/ragged", b""), ("PUT", f"/{bucket}/anon", b"x"),
                               ("GET", f"/{bucket}", b""), ("GET", "/", b""),
                               ("DELETE", f"/{bucket}/ragged", b"")):
        resp = raw_request(gateway, method, path, body=body, anonymous=True)
        assert (resp.status, resp.code) == (403, "AccessDenied"), (method, path)


def test_a_wrong_secret_is_signature_does_not_match(gateway: Gateway, bucket: str, ragged: bytes) -> None:
    bad = make_client(gateway, gateway.access_key, gateway.secret_key[::-1])
    assert client_error(lambda: bad.get_object(Bucket=bucket, Key="ragged")) == ("SignatureDoesNotMatch", 403)
    assert client_error(lambda: bad.put_object(Bucket=bucket, Key="forged", Body=b"x")) == (
        "SignatureDoesNotMatch", 403)
    assert client_error(lambda: bad.list_buckets()) == ("SignatureDoesNotMatch", 403)


def test_an_unknown_access_key_is_invalid_access_key_id(gateway: Gateway) -> None:
    stranger = make_client(gateway, "AKIDNOSUCHKEY0000000", "x" * 40)
    assert client_error(lambda: stranger.list_buckets()) == ("InvalidAccessKeyId", 403)


def test_an_x_amz_header_added_after_signing_is_refused(gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    url = f"{gateway.url}/{bucket}/unsigned-meta"
    headers = sign(gateway, "PUT", url, b"body")
    resp = http_request("PUT", url, b"body", {**headers, "x-amz-meta-injected": "yes"})
    assert (resp.status, resp.code) == (403, "AccessDenied")
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="unsigned-meta")) == ("404", 404)


def test_a_request_signed_with_a_skewed_clock_is_refused(gateway: Gateway, bucket: str,
                                                         ragged: bytes) -> None:
    resp = raw_request(gateway, "GET", f"/{bucket}/ragged", skew_s=-20 * 60)  # S3 allows 15 min
    assert (resp.status, resp.code) == (403, "RequestTimeTooSkewed")


# boto3 and the aws cli presign S3 URLs with SigV2 query parameters unless the client is
# configured with signature_version="s3v4"; both must work.
SIGNATURE_PARAM = {"default": "Signature=", "s3v4": "X-Amz-Signature="}


def presigner(gw: Gateway, flavour: str) -> BaseClient:
    return make_client(gw) if flavour == "default" else make_client(gw, signature_version=flavour)


@pytest.mark.parametrize("flavour", list(SIGNATURE_PARAM))
def test_presigned_get_and_head_work_and_tampering_fails(gateway: Gateway, bucket: str, ragged: bytes,
                                                         flavour: str) -> None:
    signer = presigner(gateway, flavour)
    url = signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "ragged"}, ExpiresIn=300)
    if flavour == "s3v4":
        assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
    resp = http_request("GET", url)
    assert resp.status == 200 and resp.body == ragged
    head = signer.generate_presigned_url("head_object", Params={"Bucket": bucket, "Key": "ragged"}, ExpiresIn=300)
    assert http_request("HEAD", head).status == 200
    sig_at = url.index(SIGNATURE_PARAM[flavour]) + len(SIGNATURE_PARAM[flavour])
    flipped = url[:sig_at] + ("A" if url[sig_at] != "A" else "B") + url[sig_at + 1:]
    resp = http_request("GET", flipped)
    assert (resp.status, resp.code) == (403, "SignatureDoesNotMatch")
    other_key = url.replace(f"/{bucket}/ragged?", f"/{bucket}/cond?")
    resp = http_request("GET", other_key)
    assert (resp.status, resp.code) == (403, "SignatureDoesNotMatch")


@pytest.mark.parametrize("flavour", list(SIGNATURE_PARAM))
def test_a_presigned_url_expires(gateway: Gateway, bucket: str, ragged: bytes, flavour: str) -> None:
    signer = presigner(gateway, flavour)
    url = signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "ragged"}, ExpiresIn=1)
    resp = poll(lambda: http_request("GET", url), lambda r: r.status != 200, 15.0, "the URL to expire")
    assert (resp.status, resp.code) == (403, "AccessDenied")


def test_a_sigv4_presigned_url_valid_longer_than_a_week_is_refused(gateway: Gateway, bucket: str,
                                                                   ragged: bytes) -> None:
    url = presigner(gateway, "s3v4").generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "ragged"}, ExpiresIn=7 * 24 * 3600 + 1)
    resp = http_request("GET", url)
    assert (resp.status, resp.code) == (400, "AuthorizationQueryParametersError")


def test_a_sigv2_presigned_url_valid_longer_than_a_week_is_refused(gateway: Gateway, bucket: str,
                                                                   ragged: bytes) -> None:
    # SigV2 (boto3's default presign here) had no bound: a link signed for 2100 worked
    signer = presigner(gateway, "default")
    week = signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "ragged"},
                                         ExpiresIn=7 * 24 * 3600 - 60)
    assert http_request("GET", week).status == 200
    url = signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "ragged"},
                                        ExpiresIn=8 * 24 * 3600)
    assert "Signature=" in url
    resp = http_request("GET", url)
    assert (resp.status, resp.code) == (403, "AccessDenied")


@pytest.mark.parametrize("flavour", list(SIGNATURE_PARAM))
def test_presigned_put_works(gateway: Gateway, s3: BaseClient, bucket: str, flavour: str) -> None:
    key = f"presigned-put-{flavour}"
    url = presigner(gateway, flavour).generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    data = blob(70_000, 9)
    resp = http_request("PUT", url, data)
    assert resp.status == 200 and resp.headers["etag"] == md5_etag(data)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_aws_s3_presign_makes_a_working_url(aws: AwsCli, bucket: str, ragged: bytes) -> None:
    url = aws("s3", "presign", f"s3://{bucket}/ragged", "--expires-in", "300").stdout.strip()
    resp = http_request("GET", url)
    assert resp.status == 200 and resp.body == ragged


# ---- malformed requests ------------------------------------------------------------------
def test_malformed_xml_to_delete_objects_is_malformed_xml(gateway: Gateway, s3: BaseClient,
                                                          bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="survivor", Body=b"s")
    for body in (b"<Delete><Object><Key>survivor</Key>", b"not xml at all", b"<Wrong/>"):
        resp = raw_request(gateway, "POST", f"/{bucket}", "delete", body,
                           {"Content-MD5": md5_b64(body), "Content-Type": "application/xml"})
        assert (resp.status, resp.code) == (400, "MalformedXML"), body
    assert s3.get_object(Bucket=bucket, Key="survivor")["Body"].read() == b"s"


def test_malformed_xml_to_complete_multipart_upload_is_malformed_xml(gateway: Gateway, s3: BaseClient,
                                                                     bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="mpu-xml")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="mpu-xml", UploadId=upload_id, PartNumber=1, Body=b"p")
    try:
        for body in (b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>",
                     b"<CompleteMultipartUpload><Part><PartNumber>one</PartNumber>"
                     b"<ETag>" + part["ETag"].encode() + b"</ETag></Part></CompleteMultipartUpload>",
                     b"\x00\xff garbage"):
            resp = raw_request(gateway, "POST", f"/{bucket}/mpu-xml", f"uploadId={quote(upload_id)}", body)
            assert (resp.status, resp.code) == (400, "MalformedXML"), body
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="mpu-xml", UploadId=upload_id)


def test_malformed_headers_are_400_not_500(gateway: Gateway, bucket: str, ragged: bytes) -> None:
    resp = http_request("GET", f"{gateway.url}/{bucket}/ragged",
                        headers={"Authorization": "AWS4-HMAC-SHA256 garbage"})
    assert (resp.status, resp.code) == (400, "AuthorizationHeaderMalformed")
    resp = raw_request(gateway, "PUT", f"/{bucket}/bad-md5", body=b"x", headers={"Content-MD5": "%%%"})
    assert (resp.status, resp.code) == (400, "InvalidDigest")
    resp = raw_request(gateway, "GET", f"/{bucket}", "list-type=2&max-keys=abc")
    assert (resp.status, resp.code) == (400, "InvalidArgument")
    resp = raw_request(gateway, "GET", f"/{bucket}/ragged",
                       headers={"If-Modified-Since": "not a date", "If-Unmodified-Since": "yesterday"})
    assert resp.status == 200 and resp.body == ragged   # an invalid date is ignored (RFC 7232)



def test_a_copy_keeps_the_checksum_of_the_bytes_it_copies(s3: BaseClient, bucket: str) -> None:
    """The same bytes, the same sums: a GET of the copy with ChecksumMode answers the
    source's SHA-256 (a copy dropped it)."""
    data = blob(120_000, 9)
    sent = s3.put_object(Bucket=bucket, Key="crc/src", Body=data, ChecksumAlgorithm="SHA256")
    s3.copy_object(Bucket=bucket, Key="crc/copy", CopySource={"Bucket": bucket, "Key": "crc/src"})
    got = s3.get_object(Bucket=bucket, Key="crc/copy", ChecksumMode="ENABLED")
    assert got["Body"].read() == data
    assert got["ChecksumSHA256"] == sent["ChecksumSHA256"] == \
        b64encode(hashlib.sha256(data).digest()).decode()


# ---- Expect: 100-continue ------------------------------------------------------------------
def _expect_continue(gw: Gateway, path: str, body: bytes, *, secret_key: str | None = None
                     ) -> tuple[bytes, bytes | None]:
    """Send a PUT's head with Expect: 100-continue and wait for the first answer; send the
    body only if it was "100 Continue", then read the final answer. (first status line,
    final status line or None when the first was final)."""
    url = gw.url + path
    headers = sign(gw, "PUT", url, body, {"Expect": "100-continue"}, secret_key=secret_key)
    headers.update({"Host": f"{gw.host}:{urlsplit(url).port}", "Content-Length": str(len(body))})
    head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((gw.host, int(urlsplit(url).port or 80)), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n")
        stream = sock.makefile("rb")
        first = stream.readline().strip()
        if not first.startswith(b"HTTP/1.1 100"):
            # "Connection: close": the body it was declared with never comes, so a next
            # request on the connection would be read as this one's body
            answer = b"".join(iter(stream.readline, b"\r\n")).lower()
            assert b"connection: close" in answer, answer
            return first, None
        assert stream.readline() == b"\r\n"
        sock.sendall(body)
        return first, stream.readline().strip()


def test_expect_100_continue_is_answered_only_after_the_request_is_checked(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    """A PUT refused for its signature or its bucket is answered at once, without "100
    Continue", and the connection closed: the client never sends its body (it was told to
    continue, sent it all, then was refused - an unauthenticated client could make the
    gateway read whatever it sent). A good one is told to continue and is stored."""
    body = blob(256 * 1024, 7)
    first, final = _expect_continue(gateway, f"/{bucket}/continue/bad-sig", body,
                                    secret_key="not-the-secret")
    assert first.startswith(b"HTTP/1.1 403") and final is None
    first, final = _expect_continue(gateway, "/no-such-bucket-here/k", body)
    assert first.startswith(b"HTTP/1.1 404") and final is None
    first, final = _expect_continue(gateway, f"/{bucket}/continue/good", body)
    assert first.startswith(b"HTTP/1.1 100") and final is not None and final.startswith(b"HTTP/1.1 200")
    assert s3.get_object(Bucket=bucket, Key="continue/good")["Body"].read() == body
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="continue/bad-sig")) == ("404", 404)
