"""S3 storage classes through the gateway with boto3: x-amz-storage-class is taken on
PutObject, CopyObject and CreateMultipartUpload, kept with the object and given back as
S3 does (HEAD, GET, listings, ListParts, ListMultipartUploads; no header for STANDARD);
a name S3 does not have is InvalidStorageClass. The infrequent-access and archive classes
are written uncached - every fragment of them counted by the storage nodes' uncached
writes - and the others as any object."""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import pytest
from botocore.client import BaseClient

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import (  # noqa: F401
    blob,
    bucket,
    client_error,
    s3,
    s3_cluster,
)
from tests.cluster.uncached import uncached_writes

MIB = 1024 * 1024
FRAGMENTS = 6          # k + m of the cluster's policy: one segment of a 1 MiB object


def stored_class(s3: BaseClient, bucket: str, key: str) -> tuple[str | None, str | None]:
    """The storage class HEAD and GET report (None: no header, S3's STANDARD)."""
    head = s3.head_object(Bucket=bucket, Key=key)
    got = s3.get_object(Bucket=bucket, Key=key)
    got["Body"].read()
    return head.get("StorageClass"), got.get("StorageClass")


def listed_class(s3: BaseClient, bucket: str, key: str) -> str:
    page = s3.list_objects_v2(Bucket=bucket, Prefix=key)
    (obj,) = [o for o in page["Contents"] if o["Key"] == key]
    return str(obj["StorageClass"])


@pytest.mark.parametrize("cls, uncached", [("STANDARD_IA", True), ("GLACIER_IR", True),
                                            ("REDUCED_REDUNDANCY", False),
                                            ("INTELLIGENT_TIERING", False)])
def test_put_keeps_the_class_and_writes_infrequent_access_uncached(
        s3: BaseClient, s3_cluster: LocalCluster, bucket: str, cls: str, uncached: bool) -> None:
    data = blob(MIB, 41)
    before = uncached_writes(s3_cluster)
    s3.put_object(Bucket=bucket, Key=f"put/{cls}", Body=data, StorageClass=cls)
    assert uncached_writes(s3_cluster) - before == (FRAGMENTS if uncached else 0)
    assert stored_class(s3, bucket, f"put/{cls}") == (cls, cls)
    assert listed_class(s3, bucket, f"put/{cls}") == cls
    assert s3.get_object(Bucket=bucket, Key=f"put/{cls}")["Body"].read() == data


def test_standard_is_written_cached_and_named_by_no_header(
        s3: BaseClient, s3_cluster: LocalCluster, bucket: str) -> None:
    before = uncached_writes(s3_cluster)
    s3.put_object(Bucket=bucket, Key="std/plain", Body=blob(MIB, 42))
    s3.put_object(Bucket=bucket, Key="std/named", Body=blob(MIB, 43), StorageClass="STANDARD")
    assert uncached_writes(s3_cluster) == before
    for key in ("std/plain", "std/named"):
        assert stored_class(s3, bucket, key) == (None, None)
        assert listed_class(s3, bucket, key) == "STANDARD"


def test_an_unknown_class_is_refused_and_nothing_is_stored(s3: BaseClient, bucket: str) -> None:
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="bad/put", Body=b"x" * 100,
                                              StorageClass="FAST")) == ("InvalidStorageClass", 400)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="bad/put"))[1] == 404
    assert client_error(lambda: s3.create_multipart_upload(
        Bucket=bucket, Key="bad/mp", StorageClass="standard")) == ("InvalidStorageClass", 400)
    assert not s3.list_multipart_uploads(Bucket=bucket, Prefix="bad/").get("Uploads")


def test_a_copy_takes_the_class_it_names(
        s3: BaseClient, s3_cluster: LocalCluster, bucket: str) -> None:
    data = blob(MIB, 44)
    s3.put_object(Bucket=bucket, Key="copy/src", Body=data, StorageClass="ONEZONE_IA")
    before = uncached_writes(s3_cluster)
    # as S3: a copy is STANDARD unless it names a class, whatever its source's
    s3.copy_object(Bucket=bucket, Key="copy/std", CopySource={"Bucket": bucket, "Key": "copy/src"})
    assert uncached_writes(s3_cluster) == before
    assert stored_class(s3, bucket, "copy/std") == (None, None)
    s3.copy_object(Bucket=bucket, Key="copy/ia", StorageClass="DEEP_ARCHIVE",
                   CopySource={"Bucket": bucket, "Key": "copy/std"})
    assert uncached_writes(s3_cluster) - before == FRAGMENTS
    assert stored_class(s3, bucket, "copy/ia") == ("DEEP_ARCHIVE", "DEEP_ARCHIVE")
    # an object copied onto itself only to change its class (S3 allows that alone)
    s3.copy_object(Bucket=bucket, Key="copy/src", StorageClass="STANDARD",
                   CopySource={"Bucket": bucket, "Key": "copy/src"})
    assert stored_class(s3, bucket, "copy/src") == (None, None)
    assert client_error(lambda: s3.copy_object(
        Bucket=bucket, Key="copy/src", CopySource={"Bucket": bucket, "Key": "copy/src"})) \
        == ("InvalidRequest", 400)
    for key in ("copy/src", "copy/std", "copy/ia"):
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


def test_a_multipart_upload_keeps_its_class_for_every_part(
        s3: BaseClient, s3_cluster: LocalCluster, bucket: str) -> None:
    parts = [blob(5 * MIB, 45), blob(MIB, 46)]   # 4 MiB segments: 2 + 1 of them
    before = uncached_writes(s3_cluster)
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/ia", StorageClass="STANDARD_IA")
    uid = up["UploadId"]
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="mp/")["Uploads"]
    assert [(u["Key"], u["StorageClass"]) for u in listed] == [("mp/ia", "STANDARD_IA")]
    etags = [s3.upload_part(Bucket=bucket, Key="mp/ia", UploadId=uid, PartNumber=n + 1,
                            Body=p)["ETag"] for n, p in enumerate(parts)]
    assert s3.list_parts(Bucket=bucket, Key="mp/ia", UploadId=uid)["StorageClass"] == "STANDARD_IA"
    s3.complete_multipart_upload(Bucket=bucket, Key="mp/ia", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]})
    assert uncached_writes(s3_cluster) - before == 3 * FRAGMENTS
    assert stored_class(s3, bucket, "mp/ia") == ("STANDARD_IA", "STANDARD_IA")
    assert listed_class(s3, bucket, "mp/ia") == "STANDARD_IA"
    assert s3.get_object(Bucket=bucket, Key="mp/ia")["Body"].read() == b"".join(parts)
