"""S3 behaviours of copies and errors, each checked against what S3 answers:
UploadPartCopy's x-amz-copy-source-if-* conditions (as CopyObject's), a conditional copy
whose source changes while it is copied, the <Header> of a header-caused NotImplemented,
and CreateBucket's LocationConstraint.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import threading
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from tests.cluster.s3_fixtures import (  # noqa: F401
    AwsCli,
    Gateway,
    MiB,
    aws,
    blob,
    client_error,
    gateway,
    make_client,
    raw_request,
    s3,
    s3_cluster,
)

BUCKET = "copycond"
PAST = datetime(2001, 1, 1, tzinfo=timezone.utc)
FUTURE = datetime.now(timezone.utc) + timedelta(days=3650)


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def source(s3: BaseClient, bucket: str) -> str:
    """The ETag (quoted) of a small source object, upc/src."""
    return str(s3.put_object(Bucket=bucket, Key="upc/src", Body=b"0123456789")["ETag"])


# ---- UploadPartCopy's conditions ---------------------------------------------------------
def failing_conditions(etag: str) -> list[dict[str, Any]]:
    """x-amz-copy-source-if-* sets S3 answers 412 to (for a source with this ETag)."""
    return [{"CopySourceIfMatch": '"0123"'},
            {"CopySourceIfNoneMatch": etag},
            {"CopySourceIfModifiedSince": FUTURE},
            {"CopySourceIfUnmodifiedSince": PAST},
            {"CopySourceIfNoneMatch": etag, "CopySourceIfModifiedSince": PAST}]


def holding_conditions(etag: str) -> list[dict[str, Any]]:
    """Sets under which S3 copies (if-match true wins over if-unmodified-since false)."""
    return [{"CopySourceIfMatch": etag},
            {"CopySourceIfNoneMatch": '"0123"'},
            {"CopySourceIfModifiedSince": PAST},
            {"CopySourceIfUnmodifiedSince": FUTURE},
            {"CopySourceIfMatch": etag, "CopySourceIfUnmodifiedSince": PAST}]


def test_upload_part_copy_honours_the_copy_source_conditions(s3: BaseClient, bucket: str,
                                                              source: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="upc/dst")["UploadId"]
    args = {"Bucket": bucket, "Key": "upc/dst", "UploadId": upload_id,
            "CopySource": f"{bucket}/upc/src"}
    try:
        for n, conditions in enumerate(failing_conditions(source), 1):
            assert client_error(lambda: s3.upload_part_copy(
                PartNumber=n, **args, **conditions)) == ("PreconditionFailed", 412), conditions
        assert s3.list_parts(Bucket=bucket, Key="upc/dst", UploadId=upload_id).get("Parts", []) == []
        for n, conditions in enumerate(holding_conditions(source), 1):
            etag = s3.upload_part_copy(PartNumber=n, **args, **conditions)["CopyPartResult"]["ETag"]
            assert etag == source, conditions
        parts = s3.list_parts(Bucket=bucket, Key="upc/dst", UploadId=upload_id)["Parts"]
        assert [p["PartNumber"] for p in parts] == [1, 2, 3, 4, 5]
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="upc/dst", UploadId=upload_id)


def test_copy_object_answers_the_same_conditions_the_same_way(s3: BaseClient, bucket: str,
                                                               source: str) -> None:
    for conditions in failing_conditions(source):
        assert client_error(lambda: s3.copy_object(
            Bucket=bucket, Key="upc/copy", CopySource=f"{bucket}/upc/src",
            **conditions)) == ("PreconditionFailed", 412), conditions
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="upc/copy")) == ("404", 404)
    for conditions in holding_conditions(source):
        s3.copy_object(Bucket=bucket, Key="upc/copy", CopySource=f"{bucket}/upc/src", **conditions)
    assert s3.get_object(Bucket=bucket, Key="upc/copy")["Body"].read() == b"0123456789"


# ---- a conditional copy whose source changes while it is copied ----------------------------
COPY_SOURCE_BYTES = 96 * MiB   # long enough to copy that an overwrite lands meanwhile
OVERWRITE_AFTER_S = 0.3        # the copy has checked its conditions by then
RACE_ATTEMPTS = 3              # a loaded machine may finish the copy before the overwrite
RACE_LOST = f"the copy ended before the overwrite {RACE_ATTEMPTS} times: make the source larger"


def copy_while_overwriting(s3: BaseClient, bucket: str, copy: Any) -> tuple[Any, float, float]:
    """Run copy() in a thread, overwrite the source (race/src) meanwhile; (the copy's result
    or ClientError, when the overwrite ended, when the copy ended) in monotonic seconds."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = copy()
        except ClientError as exc:
            out["result"] = exc
        out["ended"] = time.monotonic()
    t = threading.Thread(target=run)
    t.start()
    time.sleep(OVERWRITE_AFTER_S)
    s3.put_object(Bucket=bucket, Key="race/src", Body=b"the source, overwritten")
    overwritten = time.monotonic()
    t.join(120)
    assert not t.is_alive()
    return out["result"], overwritten, out["ended"]


@pytest.mark.parametrize("operation", ["copy_object", "upload_part_copy"])
def test_a_conditional_copy_does_not_commit_once_its_source_changed(
        s3: BaseClient, bucket: str, operation: str) -> None:
    etag = s3.put_object(Bucket=bucket, Key="race/src", Body=blob(COPY_SOURCE_BYTES, 7))["ETag"]
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="race/dst")["UploadId"]
    try:
        if operation == "copy_object":
            def copy() -> Any:
                return s3.copy_object(Bucket=bucket, Key="race/dst", CopySource=f"{bucket}/race/src",
                                      CopySourceIfMatch=etag)
        else:
            def copy() -> Any:
                return s3.upload_part_copy(Bucket=bucket, Key="race/dst", UploadId=upload_id,
                                           PartNumber=1, CopySource=f"{bucket}/race/src",
                                           CopySourceIfMatch=etag)
        for _ in range(RACE_ATTEMPTS):
            result, overwritten, ended = copy_while_overwriting(s3, bucket, copy)
            if overwritten < ended:    # the overwrite landed while the copy ran
                break
            # a loaded machine ran the whole copy first (it committed, rightly): again,
            # from nothing copied
            s3.delete_object(Bucket=bucket, Key="race/dst")
            s3.abort_multipart_upload(Bucket=bucket, Key="race/dst", UploadId=upload_id)
            upload_id = s3.create_multipart_upload(Bucket=bucket, Key="race/dst")["UploadId"]
            etag = s3.put_object(Bucket=bucket, Key="race/src",
                                 Body=blob(COPY_SOURCE_BYTES, 7))["ETag"]
        assert overwritten < ended, RACE_LOST
        assert isinstance(result, ClientError), result
        assert (result.response["Error"]["Code"],
                result.response["ResponseMetadata"]["HTTPStatusCode"]) == ("PreconditionFailed", 412)
        assert client_error(lambda: s3.head_object(Bucket=bucket, Key="race/dst")) == ("404", 404)
        assert s3.list_parts(Bucket=bucket, Key="race/dst", UploadId=upload_id).get("Parts", []) == []
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="race/dst", UploadId=upload_id)


def test_an_unconditional_copy_copies_the_version_it_read(s3: BaseClient, bucket: str) -> None:
    data = blob(COPY_SOURCE_BYTES, 8)
    for _ in range(RACE_ATTEMPTS):
        s3.put_object(Bucket=bucket, Key="race/src", Body=data)
        result, overwritten, ended = copy_while_overwriting(s3, bucket, lambda: s3.copy_object(
            Bucket=bucket, Key="race/whole", CopySource=f"{bucket}/race/src"))
        if overwritten < ended:    # the overwrite landed while the copy ran: what is tested
            break
    assert overwritten < ended, RACE_LOST
    assert not isinstance(result, ClientError), result
    assert s3.get_object(Bucket=bucket, Key="race/whole")["Body"].read() == data


# ---- NotImplemented names the header -------------------------------------------------------
@pytest.mark.parametrize("kwargs,header", [
    ({"Tagging": "a=b"}, "x-amz-tagging"),
    ({"GrantRead": 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'}, "x-amz-grant-read"),
    ({"ACL": "authenticated-read"}, "x-amz-acl"),
    ({"ServerSideEncryption": "AES256"}, "x-amz-server-side-encryption"),
    ({"IfNoneMatch": '"abc"'}, "If-None-Match"),
])
def test_a_header_caused_not_implemented_names_the_header(gateway: Gateway, bucket: str,
                                                           kwargs: dict[str, str], header: str) -> None:
    s3 = make_client(gateway, retries=False)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="unsup/k", Body=b"x", **kwargs)
    err = exc.value.response["Error"]
    assert (err["Code"], err.get("Header")) == ("NotImplemented", header), err


def test_a_subresource_not_implemented_names_no_header(gateway: Gateway, bucket: str) -> None:
    resp = raw_request(gateway, "GET", f"/{bucket}", "replication=")
    assert (resp.status, resp.code) == (501, "NotImplemented")
    assert ET.fromstring(resp.body).find("Header") is None


# ---- CreateBucket's LocationConstraint -----------------------------------------------------
@pytest.mark.parametrize("constraint,code", [
    ("us-east-1", "InvalidLocationConstraint"),        # S3: never a constraint
    ("not a region", "InvalidLocationConstraint"),
    ("eu-west-1", "IllegalLocationConstraintException"),  # a region, not ours
    ("EU", "IllegalLocationConstraintException"),
])
def test_a_location_constraint_s3_refuses_in_our_region_is_refused(
        gateway: Gateway, s3: BaseClient, constraint: str, code: str) -> None:
    assert gateway.region == "us-east-1"
    with pytest.raises(ClientError) as exc:
        s3.create_bucket(Bucket="loc-refused", CreateBucketConfiguration={
            "LocationConstraint": constraint})
    err = exc.value.response
    assert (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]) == (code, 400)
    if constraint == "us-east-1":
        assert err["Error"]["Message"] == "The specified location-constraint is not valid"
    assert client_error(lambda: s3.head_bucket(Bucket="loc-refused")) == ("404", 404)


def test_create_bucket_as_boto3_and_the_aws_cli_send_it_works(gateway: Gateway, s3: BaseClient,
                                                              aws: AwsCli) -> None:
    s3.create_bucket(Bucket="loc-boto3")
    make_client(gateway).create_bucket(Bucket="loc-empty-config", CreateBucketConfiguration={})
    aws("s3", "mb", "s3://loc-cli")
    for name in ("loc-boto3", "loc-empty-config", "loc-cli"):
        assert s3.get_bucket_location(Bucket=name).get("LocationConstraint") is None, name
