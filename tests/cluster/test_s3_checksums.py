"""Checksums of multipart uploads, as S3 keeps them: x-amz-checksum-algorithm (and -type)
at CreateMultipartUpload, each part's checksum, and the object's COMPOSITE ("<base64 of the
checksum of the parts' checksums>-<parts>") or FULL_OBJECT checksum in
CompleteMultipartUpload's answer and in HEAD and GET with x-amz-checksum-mode: ENABLED.
The expected values are computed here with zlib, hashlib and awscrt, not the gateway's code.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import hashlib
import zlib
from base64 import b64encode
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from awscrt import checksums as crt
from boto3.s3.transfer import TransferConfig
from botocore.client import BaseClient

from tests.cluster.s3_fixtures import (  # noqa: F401
    Gateway,
    MiB,
    blob,
    client_error,
    gateway,
    make_client,
    s3,
    s3_cluster,
)

BUCKET = "sums"
PART_SIZES = (5 * MiB, 5 * MiB, 1234)
DIGESTS: dict[str, Callable[[bytes], bytes]] = {
    "CRC32": lambda b: zlib.crc32(b).to_bytes(4, "big"),
    "CRC32C": lambda b: crt.crc32c(b).to_bytes(4, "big"),
    "CRC64NVME": lambda b: crt.crc64nvme(b).to_bytes(8, "big"),
    "SHA1": lambda b: hashlib.sha1(b).digest(),
    "SHA256": lambda b: hashlib.sha256(b).digest(),
}
KIND = {"CRC32": "COMPOSITE", "CRC32C": "COMPOSITE", "CRC64NVME": "FULL_OBJECT",
        "SHA1": "COMPOSITE", "SHA256": "COMPOSITE"}


def b64(algorithm: str, data: bytes) -> str:
    return b64encode(DIGESTS[algorithm](data)).decode()


def expected(algorithm: str, parts: list[bytes], kind: str) -> str:
    if kind == "FULL_OBJECT":
        return b64(algorithm, b"".join(parts))
    joined = b"".join(DIGESTS[algorithm](p) for p in parts)
    return f"{b64(algorithm, joined)}-{len(parts)}"


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def parts() -> list[bytes]:
    return [blob(size, 90 + i) for i, size in enumerate(PART_SIZES)]


def upload(s3: BaseClient, bucket: str, key: str, parts: list[bytes], algorithm: str,
           **create: Any) -> tuple[str, list[dict[str, Any]]]:
    """Create an upload with `algorithm` and upload `parts` (boto3 sends each part's
    checksum); (upload id, the Parts of a complete request, with their checksums)."""
    made = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=algorithm, **create)
    assert (made["ChecksumAlgorithm"], made["ChecksumType"]) == (
        algorithm, create.get("ChecksumType", KIND[algorithm]))
    done = []
    for n, data in enumerate(parts, 1):
        resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=made["UploadId"], PartNumber=n,
                              Body=data, ChecksumAlgorithm=algorithm)
        assert resp[f"Checksum{algorithm}"] == b64(algorithm, data)
        done.append({"PartNumber": n, "ETag": resp["ETag"],
                     f"Checksum{algorithm}": resp[f"Checksum{algorithm}"]})
    return made["UploadId"], done


@pytest.mark.parametrize("algorithm", list(DIGESTS))
def test_complete_head_and_get_answer_the_object_checksum_s3_makes(
        s3: BaseClient, bucket: str, parts: list[bytes], algorithm: str) -> None:
    key = f"mpu/{algorithm}"
    upload_id, done = upload(s3, bucket, key, parts, algorithm)
    want = expected(algorithm, parts, KIND[algorithm])
    resp = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                        MultipartUpload={"Parts": done})
    assert (resp[f"Checksum{algorithm}"], resp["ChecksumType"]) == (want, KIND[algorithm])
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert (head[f"Checksum{algorithm}"], head["ChecksumType"]) == (want, KIND[algorithm])
    assert f"Checksum{algorithm}" not in s3.head_object(Bucket=bucket, Key=key)
    got = s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")   # botocore checks
    assert got[f"Checksum{algorithm}"] == want                        # a FULL_OBJECT CRC
    assert got["Body"].read() == b"".join(parts)
    part2 = s3.get_object(Bucket=bucket, Key=key, PartNumber=2, ChecksumMode="ENABLED")
    assert part2[f"Checksum{algorithm}"] == b64(algorithm, parts[1])
    assert part2["Body"].read() == parts[1]


@pytest.mark.parametrize("algorithm", ["CRC32", "SHA256"])
def test_list_parts_lists_each_parts_checksum_and_the_uploads_algorithm(
        s3: BaseClient, bucket: str, parts: list[bytes], algorithm: str) -> None:
    """As S3's ListParts does: a tool resuming an upload checks its parts against them
    (they were not listed)."""
    key = f"mpu/listed-{algorithm}"
    upload_id, done = upload(s3, bucket, key, parts, algorithm)
    try:
        listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id)
        assert (listed["ChecksumAlgorithm"], listed["ChecksumType"]) == (algorithm, "COMPOSITE")
        assert [(p["PartNumber"], p[f"Checksum{algorithm}"]) for p in listed["Parts"]] == \
            [(n, b64(algorithm, data)) for n, data in enumerate(parts, 1)]
        page = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, MaxParts=1,
                             PartNumberMarker=1)
        assert [p[f"Checksum{algorithm}"] for p in page["Parts"]] == [b64(algorithm, parts[1])]
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA256"])
def test_boto3_upload_file_with_a_checksum_algorithm_works_end_to_end(
        s3: BaseClient, bucket: str, tmp_path: Path, algorithm: str) -> None:
    data = blob(11 * MiB + 5, 99)
    (tmp_path / "f").write_bytes(data)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    key = f"upload_file/{algorithm}"
    s3.upload_file(str(tmp_path / "f"), bucket, key, Config=config,
                   ExtraArgs={"ChecksumAlgorithm": algorithm})
    chunks = [data[i:i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == expected(algorithm, chunks, KIND[algorithm])
    s3.download_file(bucket, key, str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data


def test_boto3_upload_file_with_a_full_object_crc_makes_a_full_object_checksum(
        s3: BaseClient, bucket: str, tmp_path: Path) -> None:
    data = blob(11 * MiB, 98)
    (tmp_path / "f").write_bytes(data)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_file(str(tmp_path / "f"), bucket, "upload_file/full", Config=config,
                   ExtraArgs={"ChecksumCRC32": b64("CRC32", data)})
    head = s3.head_object(Bucket=bucket, Key="upload_file/full", ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (b64("CRC32", data), "FULL_OBJECT")


def test_a_full_object_checksum_named_at_complete_is_checked(s3: BaseClient, bucket: str,
                                                              parts: list[bytes]) -> None:
    upload_id, done = upload(s3, bucket, "mpu/full", parts, "CRC32C", ChecksumType="FULL_OBJECT")
    args = {"Bucket": bucket, "Key": "mpu/full", "UploadId": upload_id,
            "MultipartUpload": {"Parts": done}}
    assert client_error(lambda: make_client_once(s3).complete_multipart_upload(
        ChecksumCRC32C=b64("CRC32C", b"other"), ChecksumType="FULL_OBJECT", **args)) == ("BadDigest", 400)
    whole = b64("CRC32C", b"".join(parts))
    resp = s3.complete_multipart_upload(ChecksumCRC32C=whole, ChecksumType="FULL_OBJECT", **args)
    assert (resp["ChecksumCRC32C"], resp["ChecksumType"]) == (whole, "FULL_OBJECT")


def make_client_once(s3: BaseClient) -> BaseClient:
    """A client of the same gateway and key, without retries (BadDigest is retried)."""
    creds = s3._request_signer._credentials   # type: ignore[attr-defined]
    return make_client(Gateway(s3.meta.endpoint_url, creds.access_key, creds.secret_key,
                               s3.meta.region_name), retries=False)


def test_a_composite_upload_refuses_parts_without_or_with_another_checksum(
        gateway: Gateway, s3: BaseClient, bucket: str, parts: list[bytes]) -> None:
    upload_id, done = upload(s3, bucket, "mpu/strict", parts[:1], "SHA256")
    args = {"Bucket": bucket, "Key": "mpu/strict", "UploadId": upload_id}
    plain = make_client(gateway, request_checksum_calculation="when_required")
    try:
        assert client_error(lambda: plain.upload_part(PartNumber=2, Body=b"x", **args)) == (
            "InvalidRequest", 400)
        assert client_error(lambda: s3.upload_part(PartNumber=2, Body=b"x", ChecksumAlgorithm="CRC32",
                                                   **args)) == ("InvalidRequest", 400)
        assert [p["PartNumber"] for p in s3.list_parts(**args)["Parts"]] == [1]
        no_sum = [{"PartNumber": 1, "ETag": done[0]["ETag"]}]
        assert client_error(lambda: s3.complete_multipart_upload(
            MultipartUpload={"Parts": no_sum}, **args)) == ("InvalidRequest", 400)
        wrong = [{**done[0], "ChecksumSHA256": b64("SHA256", b"not the part")}]
        assert client_error(lambda: s3.complete_multipart_upload(
            MultipartUpload={"Parts": wrong}, **args)) == ("InvalidPart", 400)
        resp = s3.complete_multipart_upload(MultipartUpload={"Parts": done}, **args)
        assert resp["ChecksumSHA256"] == expected("SHA256", parts[:1], "COMPOSITE")
    except BaseException:
        s3.abort_multipart_upload(**args)
        raise


def test_an_upload_part_copy_keeps_the_checksum_of_the_bytes_it_copied(
        s3: BaseClient, bucket: str, parts: list[bytes]) -> None:
    s3.put_object(Bucket=bucket, Key="copy/src", Body=parts[0])
    made = s3.create_multipart_upload(Bucket=bucket, Key="copy/dst", ChecksumAlgorithm="CRC32")
    args = {"Bucket": bucket, "Key": "copy/dst", "UploadId": made["UploadId"]}
    copied = s3.upload_part_copy(PartNumber=1, CopySource=f"{bucket}/copy/src", **args)["CopyPartResult"]
    assert copied["ChecksumCRC32"] == b64("CRC32", parts[0])
    resp = s3.complete_multipart_upload(MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": copied["ETag"], "ChecksumCRC32": copied["ChecksumCRC32"]}]}, **args)
    assert resp["ChecksumCRC32"] == expected("CRC32", parts[:1], "COMPOSITE")
    s3.copy_object(Bucket=bucket, Key="copy/whole", CopySource=f"{bucket}/copy/dst")
    head = s3.head_object(Bucket=bucket, Key="copy/whole", ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32"], head["ChecksumType"]) == (b64("CRC32", parts[0]), "FULL_OBJECT")


def test_a_bad_checksum_algorithm_or_type_at_create_is_invalid_request(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    from tests.cluster.s3_fixtures import raw_request
    for headers in ({"x-amz-checksum-algorithm": "MD4"}, {"x-amz-checksum-type": "COMPOSITE"},
                    {"x-amz-checksum-algorithm": "SHA256", "x-amz-checksum-type": "FULL_OBJECT"},
                    {"x-amz-checksum-algorithm": "CRC64NVME", "x-amz-checksum-type": "COMPOSITE"}):
        resp = raw_request(gateway, "POST", f"/{bucket}/mpu/bad", "uploads=", headers=headers)
        assert (resp.status, resp.code) == (400, "InvalidRequest"), headers
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="mpu/bad").get("Uploads", []) == []


def test_a_put_with_a_checksum_answers_its_type(s3: BaseClient, bucket: str) -> None:
    """PutObject's answer names the checksum's type, as S3's does (boto3's ChecksumType
    was None)."""
    data = b"abc" * 1000
    resp = s3.put_object(Bucket=bucket, Key="typed", Body=data, ChecksumAlgorithm="SHA256")
    assert (resp["ChecksumSHA256"], resp["ChecksumType"]) == (b64("SHA256", data), "FULL_OBJECT")


def test_a_put_naming_an_algorithm_s3_does_not_have_is_invalid(s3: BaseClient,
                                                               bucket: str) -> None:
    """x-amz-checksum-algorithm MD5 on a PutObject: 400 InvalidRequest, nothing stored (it
    was stored, 200), as CreateMultipartUpload answers it."""
    def naming_md5(request: Any, **_: Any) -> None:
        request.headers["x-amz-checksum-algorithm"] = "MD5"
    s3.meta.events.register("before-sign.s3.PutObject", naming_md5)
    try:
        assert client_error(lambda: s3.put_object(Bucket=bucket, Key="md5-named", Body=b"x")) \
            == ("InvalidRequest", 400)
    finally:
        s3.meta.events.unregister("before-sign.s3.PutObject", naming_md5)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="md5-named")) == ("404", 404)
