"""S3 buckets and objects through the gateway with boto3 and raw SigV4 requests.

Expected codes and statuses are S3's documented ones (the API reference's error table and
the GetObject/HeadObject pages), not our implementation's.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import hashlib
import io
import random
import zlib
from base64 import b64encode
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from botocore.client import BaseClient
from botocore.compat import HAS_CRT
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import (  # noqa: F401
    AwsCli,
    Gateway,
    aws,
    client_error,
    create_key,
    gateway,
    http_request,
    make_client,
    md5_b64,
    poll,
    raw_request,
    s3,
    s3_cluster,
    s3_once,
    sign,
    user_client,
)

MiB = 1024 * 1024
SEG = 4 * MiB
BUCKET = "objects"


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def crc32_b64(data: bytes) -> str:
    return b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def status(resp: dict) -> int:
    return int(resp["ResponseMetadata"]["HTTPStatusCode"])


def record_headers(client: BaseClient, event: str) -> list[dict[str, str]]:
    """The headers of every request `client` sends for `event` (e.g. "PutObject", "*")."""
    sent: list[dict[str, str]] = []

    def record(request: Any, **_: object) -> None:
        sent.append({k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()})
    client.meta.events.register(f"before-send.s3.{event}", record)
    return sent


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def ragged(s3: BaseClient, bucket: str) -> bytes:
    """Two full 4 MiB segments and a ragged third, stored with one PutObject."""
    data = blob(2 * SEG + 12345, 1)
    s3.put_object(Bucket=bucket, Key="ragged", Body=data)
    return data


# ---- buckets -----------------------------------------------------------------------------
def test_bucket_create_head_list_delete(s3: BaseClient) -> None:
    s3.create_bucket(Bucket="life-cycle")
    assert status(s3.head_bucket(Bucket="life-cycle")) == 200
    assert "life-cycle" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert status(s3.delete_bucket(Bucket="life-cycle")) == 204
    assert client_error(lambda: s3.head_bucket(Bucket="life-cycle")) == ("404", 404)
    assert "life-cycle" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


@pytest.mark.parametrize("name", [
    "ab", "a" * 64, "UpperCase", "under_score", "-leading-hyphen", "trailing-hyphen-",
    "two..dots", ".leading-dot", "192.168.5.4", "xn--punycode", "sthree-reserved",
    "name-s3alias", "name--ol-s3",
])
def test_invalid_bucket_names_are_refused(s3: BaseClient, name: str) -> None:
    assert client_error(lambda: s3.create_bucket(Bucket=name)) == ("InvalidBucketName", 400)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


@pytest.mark.parametrize("name", ["abc", "a" * 63, "my.bucket-1", "0digit-first", "a.b.c"])
def test_bucket_names_at_the_edges_of_the_rules_are_accepted(s3: BaseClient, name: str) -> None:
    s3.create_bucket(Bucket=name)
    assert status(s3.head_bucket(Bucket=name)) == 200
    s3.delete_bucket(Bucket=name)


def test_creating_your_own_bucket_again_is_bucket_already_owned_by_you(s3: BaseClient,
                                                                       bucket: str) -> None:
    assert client_error(lambda: s3.create_bucket(Bucket=bucket)) == ("BucketAlreadyOwnedByYou", 409)


def test_creating_another_users_bucket_is_bucket_already_exists(s3_cluster: LocalCluster,
                                                                gateway: Gateway,
                                                                s3: BaseClient, bucket: str) -> None:
    other = user_client(gateway, create_key(s3_cluster, "objects-other"))
    assert client_error(lambda: other.create_bucket(Bucket=bucket)) == ("BucketAlreadyExists", 409)


def test_deleting_a_non_empty_bucket_is_bucket_not_empty(s3: BaseClient) -> None:
    s3.create_bucket(Bucket="not-empty")
    s3.put_object(Bucket="not-empty", Key="k", Body=b"still here")
    assert client_error(lambda: s3.delete_bucket(Bucket="not-empty")) == ("BucketNotEmpty", 409)
    assert s3.get_object(Bucket="not-empty", Key="k")["Body"].read() == b"still here"
    s3.delete_object(Bucket="not-empty", Key="k")
    assert status(s3.delete_bucket(Bucket="not-empty")) == 204


def test_a_missing_bucket_is_no_such_bucket(s3: BaseClient) -> None:
    b = "no-such-bucket"
    assert client_error(lambda: s3.get_object(Bucket=b, Key="k")) == ("NoSuchBucket", 404)
    assert client_error(lambda: s3.put_object(Bucket=b, Key="k", Body=b"x")) == ("NoSuchBucket", 404)
    assert client_error(lambda: s3.list_objects_v2(Bucket=b)) == ("NoSuchBucket", 404)
    assert client_error(lambda: s3.delete_bucket(Bucket=b)) == ("NoSuchBucket", 404)
    assert client_error(lambda: s3.head_bucket(Bucket=b)) == ("404", 404)


# ---- objects -----------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 64 * 1024, 64 * 1024 + 1, SEG + 1])
def test_put_get_head_delete_round_trip(s3: BaseClient, bucket: str, size: int) -> None:
    key, data = f"rt/{size}", blob(size, size)
    put = s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert put["ETag"] == md5_etag(data)
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == data
    assert got["ETag"] == md5_etag(data) and got["ContentLength"] == size
    head = s3.head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] == size and head["ETag"] == md5_etag(data)
    assert abs((head["LastModified"] - datetime.now(timezone.utc)).total_seconds()) < 120
    assert status(s3.delete_object(Bucket=bucket, Key=key)) == 204
    assert client_error(lambda: s3.get_object(Bucket=bucket, Key=key)) == ("NoSuchKey", 404)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key=key)) == ("404", 404)


def test_overwriting_a_key_replaces_the_object(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="overwrite", Body=blob(100_000, 2))
    s3.put_object(Bucket=bucket, Key="overwrite", Body=b"short")
    got = s3.get_object(Bucket=bucket, Key="overwrite")
    assert got["Body"].read() == b"short" and got["ETag"] == md5_etag(b"short")


def test_no_such_key_is_an_s3_xml_error(gateway: Gateway, bucket: str) -> None:
    resp = raw_request(gateway, "GET", f"/{bucket}/missing-key")
    assert resp.status == 404 and resp.code == "NoSuchKey"
    assert "xml" in resp.headers.get("content-type", "")


def test_deleting_a_missing_key_succeeds(s3: BaseClient, bucket: str) -> None:
    assert status(s3.delete_object(Bucket=bucket, Key="never-existed")) == 204


@pytest.mark.parametrize("key", [
    "a b", "a+b", "ünï/cødé ✓", "q?x=1&y=2", "percent%20literal", "semi;colon,comma",
    "dir//double-slash", "trailing/", "tilde~star*paren(1)", "#hash",
])
def test_keys_with_special_characters_round_trip(s3: BaseClient, bucket: str, key: str) -> None:
    full = f"special/{key}"
    s3.put_object(Bucket=bucket, Key=full, Body=full.encode())
    assert s3.get_object(Bucket=bucket, Key=full)["Body"].read() == full.encode()
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=full).get("Contents", [])]
    assert full in listed
    s3.delete_object(Bucket=bucket, Key=full)


def test_user_metadata_and_standard_headers_round_trip(s3: BaseClient, bucket: str) -> None:
    expires = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    s3.put_object(Bucket=bucket, Key="headers", Body=b"{}",
                  Metadata={"Color": "Blue Sky", "owner-id": "42"},
                  ContentType="application/x-ecstore-test", CacheControl="max-age=60",
                  ContentDisposition='attachment; filename="a.txt"', ContentEncoding="gzip",
                  ContentLanguage="en-GB", Expires=expires)
    for resp in (s3.head_object(Bucket=bucket, Key="headers"),
                 s3.get_object(Bucket=bucket, Key="headers")):
        assert resp["Metadata"] == {"color": "Blue Sky", "owner-id": "42"}  # S3 lower-cases names
        assert resp["ContentType"] == "application/x-ecstore-test"
        assert resp["CacheControl"] == "max-age=60"
        assert resp["ContentDisposition"] == 'attachment; filename="a.txt"'
        assert resp["ContentEncoding"] == "gzip"
        assert resp["ContentLanguage"] == "en-GB"
        assert parsedate_to_datetime(resp["ResponseMetadata"]["HTTPHeaders"]["expires"]) == expires


def test_content_type_defaults_to_binary_octet_stream(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="no-type", Body=b"x")
    assert s3.head_object(Bucket=bucket, Key="no-type")["ContentType"] == "binary/octet-stream"


def test_a_key_longer_than_1024_bytes_is_key_too_long(s3: BaseClient, bucket: str) -> None:
    longest = "k/" + "é" * 511                       # 2 + 1022 = 1024 bytes of UTF-8
    s3.put_object(Bucket=bucket, Key=longest, Body=b"long")
    assert s3.get_object(Bucket=bucket, Key=longest)["Body"].read() == b"long"
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key=longest + "x", Body=b"x")) == (
        "KeyTooLongError", 400)


def test_user_metadata_over_2_kib_is_metadata_too_large(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="meta/ok", Body=b"m", Metadata={"a": "v" * 1900})
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="meta/big", Body=b"m",
                                              Metadata={"a": "v" * 1500, "b": "w" * 1500})) == (
        "MetadataTooLarge", 400)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="meta/big")) == ("404", 404)


def test_delete_objects_removes_many_and_reports_each(s3: BaseClient, bucket: str) -> None:
    keys = [f"many/{i}" for i in range(5)]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    wanted = keys + ["many/never-existed"]  # S3 reports a missing key as deleted
    resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in wanted]})
    assert sorted(d["Key"] for d in resp["Deleted"]) == sorted(wanted)
    assert resp.get("Errors", []) == []
    assert s3.list_objects_v2(Bucket=bucket, Prefix="many/")["KeyCount"] == 0
    s3.put_object(Bucket=bucket, Key="many/quiet", Body=b"q")
    quiet = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "many/quiet"}], "Quiet": True})
    assert quiet.get("Deleted", []) == [] and quiet.get("Errors", []) == []
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="many/quiet")) == ("404", 404)


def test_delete_objects_of_more_than_1000_keys_is_malformed_xml(s3: BaseClient, bucket: str) -> None:
    too_many = {"Objects": [{"Key": f"many/{i}"} for i in range(1001)]}
    assert client_error(lambda: s3.delete_objects(Bucket=bucket, Delete=too_many)) == ("MalformedXML", 400)


# ---- copy --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def copy_source(s3: BaseClient, bucket: str) -> bytes:
    data = blob(300_000, 3)
    s3.put_object(Bucket=bucket, Key="copy/src", Body=data, Metadata={"origin": "source"},
                  ContentType="text/x-source", CacheControl="no-cache")
    return data


def test_copy_keeps_metadata_by_default_and_across_buckets(s3: BaseClient, bucket: str,
                                                           copy_source: bytes) -> None:
    s3.create_bucket(Bucket="copy-target")
    for dst_bucket, directive in ((bucket, {}), ("copy-target", {"MetadataDirective": "COPY"})):
        resp = s3.copy_object(Bucket=dst_bucket, Key="copy/dst",
                              CopySource={"Bucket": bucket, "Key": "copy/src"}, **directive)
        assert resp["CopyObjectResult"]["ETag"] == md5_etag(copy_source)
        got = s3.get_object(Bucket=dst_bucket, Key="copy/dst")
        assert got["Body"].read() == copy_source
        assert got["Metadata"] == {"origin": "source"} and got["ContentType"] == "text/x-source"
        assert got["CacheControl"] == "no-cache"


def test_copy_with_replace_takes_the_new_metadata(s3: BaseClient, bucket: str,
                                                  copy_source: bytes) -> None:
    s3.copy_object(Bucket=bucket, Key="copy/replaced", CopySource=f"{bucket}/copy/src",
                   MetadataDirective="REPLACE", Metadata={"fresh": "yes"}, ContentType="text/x-new")
    got = s3.get_object(Bucket=bucket, Key="copy/replaced")
    assert got["Body"].read() == copy_source
    assert got["Metadata"] == {"fresh": "yes"} and got["ContentType"] == "text/x-new"
    assert "CacheControl" not in got
    src = s3.head_object(Bucket=bucket, Key="copy/src")
    assert src["Metadata"] == {"origin": "source"} and src["ContentType"] == "text/x-source"


def test_copy_onto_itself_needs_the_replace_directive(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="copy/self", Body=b"me", Metadata={"v": "1"})
    same = {"Bucket": bucket, "Key": "copy/self", "CopySource": {"Bucket": bucket, "Key": "copy/self"}}
    assert client_error(lambda: s3.copy_object(**same)) == ("InvalidRequest", 400)
    s3.copy_object(**same, MetadataDirective="REPLACE", Metadata={"v": "2"})
    got = s3.get_object(Bucket=bucket, Key="copy/self")
    assert got["Body"].read() == b"me" and got["Metadata"] == {"v": "2"}


def test_copy_from_a_missing_source_is_no_such_key(s3: BaseClient, bucket: str) -> None:
    assert client_error(lambda: s3.copy_object(
        Bucket=bucket, Key="copy/none", CopySource={"Bucket": bucket, "Key": "copy/absent"})) == ("NoSuchKey", 404)


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


# ---- ranges ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec,lo,hi", [
    ("bytes=0-0", 0, 0),
    (f"bytes={SEG - 1}-{SEG}", SEG - 1, SEG),                  # across a segment edge
    (f"bytes=100-{2 * SEG + 100}", 100, 2 * SEG + 100),        # three segments
    (f"bytes={2 * SEG}-", 2 * SEG, 2 * SEG + 12344),           # open end, last segment
    ("bytes=-100", 2 * SEG + 12245, 2 * SEG + 12344),          # suffix
    ("bytes=-99999999", 0, 2 * SEG + 12344),                   # suffix longer than the object
    (f"bytes={2 * SEG + 12000}-99999999", 2 * SEG + 12000, 2 * SEG + 12344),  # end clamped
])
def test_range_get_returns_206_and_the_bytes(s3: BaseClient, bucket: str, ragged: bytes,
                                             spec: str, lo: int, hi: int) -> None:
    resp = s3.get_object(Bucket=bucket, Key="ragged", Range=spec)
    assert status(resp) == 206
    assert resp["ContentRange"] == f"bytes {lo}-{hi}/{len(ragged)}"
    assert resp["ContentLength"] == hi - lo + 1
    assert resp["Body"].read() == ragged[lo:hi + 1]


@pytest.mark.parametrize("spec", ["bytes={n}-", "bytes={n}-{m}", "bytes=99999999-"])
def test_unsatisfiable_range_is_invalid_range(s3: BaseClient, bucket: str, ragged: bytes,
                                              spec: str) -> None:
    rng = spec.format(n=len(ragged), m=len(ragged) + 100)
    assert client_error(lambda: s3.get_object(Bucket=bucket, Key="ragged", Range=rng)) == ("InvalidRange", 416)


def test_any_range_of_an_empty_object_is_invalid_range(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    for rng in ("bytes=0-0", "bytes=0-", "bytes=-1"):
        assert client_error(lambda: s3.get_object(Bucket=bucket, Key="empty", Range=rng)) == ("InvalidRange", 416)
    assert s3.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""


@pytest.mark.parametrize("spec", ["bytes=abc", "bytes=5-2", "items=0-5", "bytes=", "bytes=--1", "0-5"])
def test_a_malformed_range_is_ignored(s3: BaseClient, bucket: str, ragged: bytes, spec: str) -> None:
    resp = s3.get_object(Bucket=bucket, Key="ragged", Range=spec)
    assert status(resp) == 200 and "ContentRange" not in resp
    assert resp["Body"].read() == ragged


def test_a_multi_range_request_is_not_a_server_error(s3: BaseClient, bucket: str, ragged: bytes) -> None:
    resp = s3.get_object(Bucket=bucket, Key="ragged", Range="bytes=0-1,5-6")
    if status(resp) == 200:   # S3 serves the whole object: it does not do multipart/byteranges
        assert resp["Body"].read() == ragged
    else:
        assert status(resp) == 206 and resp["Body"].read() == ragged[0:2]


def fragment_files(cluster: LocalCluster) -> set[Path]:
    return set(cluster.dir.glob("s*/fragments/**/*.*.*"))


@pytest.fixture(scope="module")
def lost_segment(s3_cluster: LocalCluster, s3: BaseClient, bucket: str) -> bytes:
    """A three-segment object whose segment 2 is unreadable: m + 1 = 3 of its fragment files
    (named version.segment.index) removed, so fewer than k = 4 remain."""
    data = blob(2 * SEG + 100_000, 10)
    before = fragment_files(s3_cluster)
    s3.put_object(Bucket=bucket, Key="lost-segment", Body=data)
    new = fragment_files(s3_cluster) - before
    assert len({f.name.split(".")[0] for f in new}) == 1 and len(new) == 3 * 6, sorted(f.name for f in new)
    for f in sorted(f for f in new if f.name.split(".")[1] == "2")[:3]:
        f.unlink()
    return data


def test_a_range_get_reads_only_the_segments_it_needs(s3: BaseClient, s3_once: BaseClient, bucket: str,
                                                      lost_segment: bytes) -> None:
    data = lost_segment
    for lo, hi in ((0, 99), (SEG - 10, SEG + 10), (SEG, 2 * SEG - 1)):
        resp = s3.get_object(Bucket=bucket, Key="lost-segment", Range=f"bytes={lo}-{hi}")
        assert resp["Body"].read() == data[lo:hi + 1], (lo, hi)
    assert s3.head_object(Bucket=bucket, Key="lost-segment")["ContentLength"] == len(data)
    # and segment 2 really is unreadable: a range inside it fails before any byte is sent
    try:
        resp = s3_once.get_object(Bucket=bucket, Key="lost-segment", Range=f"bytes={2 * SEG}-{2 * SEG + 9}")
        body = resp["Body"].read()
    except ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503)
    else:
        pytest.fail(f"segment 2 is unreadable, yet the gateway answered {status(resp)} "
                    f"{resp.get('ContentRange')} with body {body[:40]!r}")


def test_a_get_that_fails_mid_stream_never_looks_complete(gateway: Gateway, bucket: str,
                                                          lost_segment: bytes) -> None:
    """Segments 0 and 1 may already be sent when segment 2 fails: the client must then see
    an error or a short body (connection closed), never Content-Length bytes that are not
    the object, and not a response left hanging until the client's read timeout."""
    client = make_client(gateway, retries=False, read_timeout=15)
    try:
        resp = client.get_object(Bucket=bucket, Key="lost-segment")
        body = resp["Body"].read()
    except ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] in (500, 503)
    except ReadTimeoutError:
        pytest.fail("the gateway neither finished nor closed the failed response: the client hung")
    except BotoCoreError:
        pass   # IncompleteReadError / ResponseStreamingError: the truncation is visible
    else:
        pytest.fail(f"a GET missing segment 2 returned {len(body)} bytes as if complete "
                    f"(equal to the object: {body == lost_segment})")


# ---- conditional GET and HEAD ------------------------------------------------------------
@pytest.fixture(scope="module")
def cond(s3: BaseClient, bucket: str) -> dict:
    s3.put_object(Bucket=bucket, Key="cond", Body=b"conditional")
    head = s3.head_object(Bucket=bucket, Key="cond")
    day = timedelta(days=1)
    return {"etag": head["ETag"], "other": '"0123456789abcdef0123456789abcdef"',
            "past": head["LastModified"] - day, "future": datetime.now(timezone.utc) + day}


# (conditions, GET outcome, HEAD outcome); an outcome is 200 or (code, status).
CONDITIONS = [
    ({"IfNoneMatch": "etag"}, ("304", 304), ("304", 304)),
    ({"IfNoneMatch": "other"}, 200, 200),
    ({"IfMatch": "etag"}, 200, 200),
    ({"IfMatch": "other"}, ("PreconditionFailed", 412), ("412", 412)),
    ({"IfModifiedSince": "future"}, ("304", 304), ("304", 304)),
    ({"IfModifiedSince": "past"}, 200, 200),
    ({"IfUnmodifiedSince": "past"}, ("PreconditionFailed", 412), ("412", 412)),
    ({"IfUnmodifiedSince": "future"}, 200, 200),
    # S3's documented pairs: If-Match true wins over If-Unmodified-Since false, and
    # If-None-Match false (the ETag matches) wins over If-Modified-Since true.
    ({"IfMatch": "etag", "IfUnmodifiedSince": "past"}, 200, 200),
    ({"IfNoneMatch": "etag", "IfModifiedSince": "past"}, ("304", 304), ("304", 304)),
]


@pytest.mark.parametrize("conds,get_outcome,head_outcome", CONDITIONS,
                         ids=["-".join(f"{k}={v}" for k, v in c[0].items()) for c in CONDITIONS])
def test_conditional_get_and_head_answer_as_s3(s3: BaseClient, bucket: str, cond: dict, conds: dict,
                                               get_outcome: object, head_outcome: object) -> None:
    params = {k: cond[v] for k, v in conds.items()}
    for call, outcome in ((s3.get_object, get_outcome), (s3.head_object, head_outcome)):
        if outcome == 200:
            resp = call(Bucket=bucket, Key="cond", **params)
            assert status(resp) == 200 and resp["ETag"] == cond["etag"]
        else:
            assert client_error(lambda: call(Bucket=bucket, Key="cond", **params)) == outcome


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

