"""S3 buckets and objects through the gateway with boto3 and raw SigV4 requests.

Expected codes and statuses are S3's documented ones (the API reference's error table and
the GetObject/HeadObject pages), not our implementation's.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

import pytest
from botocore.client import BaseClient
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import (  # noqa: F401
    SEG,
    Gateway,
    blob,
    bucket,
    client_error,
    create_key,
    gateway,
    make_client,
    md5_etag,
    ragged,
    raw_request,
    s3,
    s3_cluster,
    s3_once,
    status,
    user_client,
)
from tests.functional.harness import fragments_on_disk, lose_fragment


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


@pytest.mark.parametrize("method,path,query", [
    ("GET", "/Bad_Bucket/k", ""), ("HEAD", "/Bad_Bucket/k", ""), ("PUT", "/Bad_Bucket/k", ""),
    ("DELETE", "/Bad_Bucket/k", ""), ("GET", "/Bad_Bucket", "list-type=2"),
    ("GET", "/_ops/k", ""),   # an internal namespace of ours is not an S3 bucket name either
])
def test_object_operations_on_an_invalid_bucket_name_are_invalid_bucket_name(
        gateway: Gateway, method: str, path: str, query: str) -> None:
    """As S3 answers them (they were InvalidArgument, the client library's refusal)."""
    resp = raw_request(gateway, method, path, query, b"x" if method == "PUT" else b"")
    assert resp.status == 400
    if method != "HEAD":
        assert resp.code == "InvalidBucketName", resp.body


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
    # S3 counts the UTF-8 bytes of names and values: 2,048 exactly is taken, one more is
    # MetadataTooLarge (not the client library's InvalidArgument)
    s3.put_object(Bucket=bucket, Key="meta/edge", Body=b"m", Metadata={"a": "v" * 2047})
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="meta/edge", Body=b"m",
                                              Metadata={"a": "v" * 2048})) == ("MetadataTooLarge", 400)


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


def fragments_held(cluster: LocalCluster) -> set[tuple[str, str]]:
    """(storage node, fragment id) of every fragment on the storage nodes' disks."""
    return {(n.id, fid) for n in cluster.nodes.values() if n.role == "storage"
            for fid in fragments_on_disk(n.data)}


@pytest.fixture(scope="module")
def lost_segment(s3_cluster: LocalCluster, s3: BaseClient, bucket: str) -> bytes:
    """A three-segment object whose segment 2 is unreadable: m + 1 = 3 of its fragments
    (with ids version.segment.index) lost, so fewer than k = 4 remain."""
    data = blob(2 * SEG + 100_000, 10)
    before = fragments_held(s3_cluster)
    s3.put_object(Bucket=bucket, Key="lost-segment", Body=data)
    new = fragments_held(s3_cluster) - before
    assert len({fid.split(".")[0] for _, fid in new}) == 1 and len(new) == 3 * 6, sorted(new)
    for node, fid in sorted(f for f in new if f[1].split(".")[1] == "2")[:3]:
        lose_fragment(s3_cluster.nodes[node].url, s3_cluster.secret, fid)
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


def test_a_get_that_fails_mid_stream_never_looks_complete(s3_cluster: LocalCluster,
                                                          gateway: Gateway, bucket: str,
                                                          lost_segment: bytes) -> None:
    """Segments 0 and 1 may already be sent when segment 2 fails: the client must then see
    an error or a short body (connection closed), never Content-Length bytes that are not
    the object, and not a response left hanging until the client's read timeout. The
    gateway's request log has the GET, counted as a 500 with why it was cut, and no
    traceback (it logged aiohttp's ERROR traceback and no request line until the
    thirtieth session)."""
    log = s3_cluster.dir / "logs" / "gw1.log"
    before = log.stat().st_size
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
    text = ""
    for _ in range(300):     # the request line is written once the handler is done
        text = log.read_bytes()[before:].decode(errors="replace")
        if "op=get_object" in text and "cut_short=" in text:
            break
        time.sleep(0.05)
    lines = [ln for ln in text.splitlines() if "op=get_object" in ln and "cut_short=" in ln]
    assert lines and "status=500" in lines[0] and "sent_status=200" in lines[0], text[-3000:]
    assert "Error handling request" not in text and "Traceback" not in text, text[-3000:]


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

