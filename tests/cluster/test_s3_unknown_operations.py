"""What an S3 client may send that the gateway does not do must be refused, never run as
another operation (found by a sweep with the latest boto3, the aws cli, s3fs and minio):
S3's newer subresources (?renameObject, ?annotation, ?metadataTable, ...) ran as the plain
put, delete or create - a rename emptied its target, an annotation's delete deleted the
object, a bucket's metadata-configuration delete deleted the bucket; If-Match on a delete
and an ETag in DeleteObjects were ignored (the object deleted whatever its ETag); an
append (x-amz-write-offset-bytes) replaced the object; If-Range was ignored (a resumed
download could glue a new version's tail to an old head); listings' LastModified had
milliseconds that HEAD has not (aws s3 sync --exact-timestamps fetched everything on
every run); a browser's form upload got AccessDenied."""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import base64
import hashlib
import re
from email.utils import formatdate

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from node.s3.objects import parse_range
from tests.cluster.s3_fixtures import (  # noqa: F401
    Gateway,
    gateway,
    raw_request,
    s3,
    s3_cluster,
)

BUCKET = "unknown-ops"
BODY = b"precious bytes, not to be lost"


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def empty_bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket="unknown-empty")
    return "unknown-empty"


def fresh(s3: BaseClient, bucket: str, key: str) -> str:
    """Put BODY at key; its ETag."""
    return str(s3.put_object(Bucket=bucket, Key=key, Body=BODY)["ETag"])


@pytest.mark.parametrize(("method", "query", "body", "headers"), [
    ("DELETE", "annotation=", b"", {}),
    ("PUT", "renameObject=", b"", {"x-amz-rename-source": f"{BUCKET}/other"}),
    ("PUT", "annotation=", b"<Annotation/>", {}),
    ("GET", "annotation=", b"", {}),
    ("POST", "restoreSomething=", b"", {}),
    ("DELETE", "someNewOption=yes", b"", {}),
])
def test_an_unknown_object_subresource_is_refused_and_changes_nothing(
        s3: BaseClient, gateway: Gateway, bucket: str, method: str, query: str, body: bytes,
        headers: dict[str, str]) -> None:
    fresh(s3, bucket, "kept")
    resp = raw_request(gateway, method, f"/{bucket}/kept", query, body, headers)
    assert (resp.status, resp.code) == (501, "NotImplemented"), resp.body
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == BODY


@pytest.mark.parametrize(("method", "query"), [
    ("DELETE", "metadataConfiguration="), ("DELETE", "metadataTable="), ("GET", "abac="),
    ("PUT", "abac="), ("GET", "metadataTable=")])
def test_an_unknown_bucket_subresource_is_refused_and_changes_nothing(
        s3: BaseClient, gateway: Gateway, empty_bucket: str, method: str, query: str) -> None:
    resp = raw_request(gateway, method, f"/{empty_bucket}", query)
    assert (resp.status, resp.code) == (501, "NotImplemented"), resp.body
    s3.head_bucket(Bucket=empty_bucket)      # still there


def test_a_read_with_an_unknown_valued_parameter_is_answered(
        s3: BaseClient, gateway: Gateway, bucket: str) -> None:
    """S3 ignores a query parameter it does not know on a read (a cache buster, x-id)."""
    fresh(s3, bucket, "read-me")
    for query in ("cachebust=123", "x-id=GetObject"):
        resp = raw_request(gateway, "GET", f"/{bucket}/read-me", query)
        assert resp.status == 200 and resp.body == BODY, (query, resp.body)


def test_delete_if_match(s3: BaseClient, gateway: Gateway, bucket: str) -> None:
    etag = fresh(s3, bucket, "cond")
    wrong = raw_request(gateway, "DELETE", f"/{bucket}/cond", headers={"If-Match": '"0" '})
    assert (wrong.status, wrong.code) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == BODY
    right = raw_request(gateway, "DELETE", f"/{bucket}/cond", headers={"If-Match": etag})
    assert right.status == 204
    assert s3.list_objects_v2(Bucket=bucket, Prefix="cond")["KeyCount"] == 0
    gone = raw_request(gateway, "DELETE", f"/{bucket}/cond", headers={"If-Match": "*"})
    assert (gone.status, gone.code) == (404, "NoSuchKey")
    plain = raw_request(gateway, "DELETE", f"/{bucket}/cond")     # S3: 204 for an absent key
    assert plain.status == 204
    fresh(s3, bucket, "cond")
    by_size = raw_request(gateway, "DELETE", f"/{bucket}/cond",
                          headers={"x-amz-if-match-size": "3"})
    assert (by_size.status, by_size.code) == (501, "NotImplemented")
    assert s3.get_object(Bucket=bucket, Key="cond")["Body"].read() == BODY


def test_delete_objects_with_etags(s3: BaseClient, bucket: str) -> None:
    etags = {k: fresh(s3, bucket, k) for k in ("d1", "d2", "d3")}
    got = s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": "d1", "ETag": '"00000000000000000000000000000000"'},
        {"Key": "d2", "ETag": etags["d2"]},
        {"Key": "d3"},
        {"Key": "never", "ETag": etags["d1"]}]})
    assert sorted(d["Key"] for d in got["Deleted"]) == ["d2", "d3"]
    assert {e["Key"]: e["Code"] for e in got["Errors"]} == {"d1": "PreconditionFailed",
                                                            "never": "NoSuchKey"}
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="d")["Contents"]]
    assert left == ["d1"]


def test_an_append_is_refused_not_an_overwrite(s3: BaseClient, gateway: Gateway,
                                               bucket: str) -> None:
    fresh(s3, bucket, "append")
    resp = raw_request(gateway, "PUT", f"/{bucket}/append", body=b"ABC",
                       headers={"x-amz-write-offset-bytes": str(len(BODY))})
    assert (resp.status, resp.code) == (501, "NotImplemented")
    assert s3.get_object(Bucket=bucket, Key="append")["Body"].read() == BODY


def test_if_range(s3: BaseClient, gateway: Gateway, bucket: str) -> None:
    etag = fresh(s3, bucket, "ranged")
    modified = s3.head_object(Bucket=bucket, Key="ranged")["ResponseMetadata"]["HTTPHeaders"][
        "last-modified"]
    for if_range, partial in [(etag, True), ('"nope"', False), (f"W/{etag}", False),
                              (modified, True), (formatdate(1e9, usegmt=True), False),
                              ("not a date", False)]:
        resp = raw_request(gateway, "GET", f"/{bucket}/ranged",
                           headers={"Range": "bytes=0-3", "If-Range": if_range})
        if partial:
            assert (resp.status, resp.body) == (206, BODY[:4]), if_range
        else:
            assert (resp.status, resp.body) == (200, BODY), if_range


def test_listing_dates_are_whole_seconds_as_head_has_them(
        s3: BaseClient, gateway: Gateway, bucket: str) -> None:
    fresh(s3, bucket, "dated")
    xml = raw_request(gateway, "GET", f"/{bucket}", "list-type=2&prefix=dated").body.decode()
    stamps = re.findall(r"<LastModified>([^<]+)</LastModified>", xml)
    assert stamps and all(t.endswith(".000Z") for t in stamps), stamps
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dated")["Contents"][0]["LastModified"]
    assert listed == s3.head_object(Bucket=bucket, Key="dated")["LastModified"]


def test_a_browser_form_upload_is_not_implemented(gateway: Gateway, bucket: str) -> None:
    body = (b"--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nform\r\n--b--\r\n")
    resp = raw_request(gateway, "POST", f"/{bucket}", body=body, anonymous=True,
                       headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert (resp.status, resp.code) == (501, "NotImplemented"), resp.body


def test_a_range_takes_ascii_digits_only() -> None:
    assert parse_range("bytes=\u0663-5", 10) is None and parse_range("bytes=3-5", 10) == (3, 6)


def test_a_copy_answers_the_checksum_it_was_asked_for(s3: BaseClient, bucket: str) -> None:
    fresh(s3, bucket, "copy-src")
    got = s3.copy_object(Bucket=bucket, Key="copy-dst", ChecksumAlgorithm="SHA256",
                         CopySource={"Bucket": bucket, "Key": "copy-src"})["CopyObjectResult"]
    want = base64.b64encode(hashlib.sha256(BODY).digest()).decode()
    assert got.get("ChecksumSHA256") == want, got
    head = s3.head_object(Bucket=bucket, Key="copy-dst", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == want


def test_a_continuation_token_of_another_bucket_is_refused(
        s3: BaseClient, bucket: str, empty_bucket: str) -> None:
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"page/{i}", Body=b"x")
    token = s3.list_objects_v2(Bucket=bucket, Prefix="page/", MaxKeys=1)["NextContinuationToken"]
    assert s3.list_objects_v2(Bucket=bucket, Prefix="page/", ContinuationToken=token)["KeyCount"] == 2
    with pytest.raises(ClientError) as err:
        s3.list_objects_v2(Bucket=empty_bucket, ContinuationToken=token)
    assert err.value.response["Error"]["Code"] == "InvalidArgument"


def test_complete_checks_the_object_size_it_is_given(s3: BaseClient, bucket: str) -> None:
    up = s3.create_multipart_upload(Bucket=bucket, Key="sized")
    etag = s3.upload_part(Bucket=bucket, Key="sized", UploadId=up["UploadId"], PartNumber=1,
                          Body=BODY)["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="sized", UploadId=up["UploadId"],
                                     MultipartUpload=parts, MpuObjectSize=999)
    assert err.value.response["Error"]["Code"] == "InvalidRequest"
    assert s3.list_objects_v2(Bucket=bucket, Prefix="sized")["KeyCount"] == 0   # nothing committed
    s3.complete_multipart_upload(Bucket=bucket, Key="sized", UploadId=up["UploadId"],
                                 MultipartUpload=parts, MpuObjectSize=len(BODY))
    assert s3.get_object(Bucket=bucket, Key="sized")["Body"].read() == BODY


def test_an_expected_bucket_owner_is_not_implemented(s3: BaseClient, bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="owned", Body=b"x", ExpectedBucketOwner="111122223333")
    assert err.value.response["Error"]["Code"] == "NotImplemented"
    assert s3.list_objects_v2(Bucket=bucket, Prefix="owned")["KeyCount"] == 0
