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
    resp = raw_request(gateway, "GET", f"/{bucket}", "lifecycle=")
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
