"""The multipart checksum arithmetic (node.s3.checksums) against a naive reference: the
checksum of the concatenated bytes; and CreateBucket's LocationConstraint rule."""
from __future__ import annotations

import base64
import random

import pytest

from node.s3.body import RunningChecksum
from node.s3.buckets import check_location_constraint
from node.s3.checksums import (
    COMPOSITE,
    FULL_OBJECT,
    CompletedPart,
    UploadChecksum,
    full_object,
    object_checksum,
    upload_checksum,
)
from node.s3.errors import S3Error


def b64(algorithm: str, data: bytes) -> str:
    running = RunningChecksum(algorithm)
    running.update(data)
    return running.b64digest()


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "crc64nvme"])
def test_a_full_object_crc_from_the_parts_is_the_crc_of_their_bytes(algorithm: str) -> None:
    rng = random.Random(algorithm)
    for _ in range(20):
        parts = [rng.randbytes(rng.choice([0, 1, 7, 64, 1000, 4099])) for _ in range(rng.randint(1, 5))]
        got = full_object(algorithm, [(b64(algorithm, p), len(p)) for p in parts])
        assert got == b64(algorithm, b"".join(parts))


def test_a_composite_checksum_is_the_checksum_of_the_part_checksums_and_the_count() -> None:
    parts = [b"a" * 10, b"b" * 3]
    digests = b"".join(base64.b64decode(b64("sha256", p)) for p in parts)
    fields = object_checksum(UploadChecksum("sha256", COMPOSITE),
                             [CompletedPart(n, len(p), {"sha256": b64("sha256", p)}, {"sha256": b64("sha256", p)})
                              for n, p in enumerate(parts, 1)], {}, None)
    assert fields == {"checksums": {"sha256": f"{b64('sha256', digests)}-2"}, "checksum_type": COMPOSITE}


def test_the_checksum_an_upload_asks_for() -> None:
    assert upload_checksum({}) is None
    assert upload_checksum({"x-amz-checksum-algorithm": "CRC32"}) == UploadChecksum("crc32", COMPOSITE)
    assert upload_checksum({"x-amz-checksum-algorithm": "crc64nvme"}) == UploadChecksum("crc64nvme", FULL_OBJECT)
    assert upload_checksum({"x-amz-checksum-algorithm": "CRC32C", "x-amz-checksum-type": "FULL_OBJECT"}) \
        == UploadChecksum("crc32c", FULL_OBJECT)
    for bad in ({"x-amz-checksum-type": "COMPOSITE"}, {"x-amz-checksum-algorithm": "MD5"},
                {"x-amz-checksum-algorithm": "SHA1", "x-amz-checksum-type": "FULL_OBJECT"},
                {"x-amz-checksum-algorithm": "CRC32", "x-amz-checksum-type": "PARTIAL"}):
        with pytest.raises(S3Error) as exc:
            upload_checksum(bad)
        assert exc.value.code == "InvalidRequest", bad


def test_complete_refuses_a_missing_or_wrong_part_checksum_and_a_wrong_object_one() -> None:
    kept = {"crc32": b64("crc32", b"x")}
    up = UploadChecksum("crc32", COMPOSITE)
    cases = [([CompletedPart(1, 1, kept, {})], {}, "InvalidRequest"),
             ([CompletedPart(1, 1, kept, {"crc32": b64("crc32", b"y")})], {}, "InvalidPart"),
             ([CompletedPart(1, 1, kept, kept)], {"sha1": "x"}, "InvalidRequest"),
             ([CompletedPart(1, 1, kept, kept)], {"crc32": b64("crc32", b"y")}, "BadDigest")]
    for parts, claimed, code in cases:
        with pytest.raises(S3Error) as exc:
            object_checksum(up, parts, claimed, None)
        assert exc.value.code == code, (parts, claimed)
    assert object_checksum(None, [CompletedPart(1, 1, kept, kept)], {}, None) == {}


@pytest.mark.parametrize("constraint,region,code", [
    ("", "us-east-1", None), ("", "eu-west-1", None), ("eu-west-1", "eu-west-1", None),
    ("EU", "eu-west-1", None),
    ("us-east-1", "us-east-1", "InvalidLocationConstraint"),
    ("us-east-1", "eu-west-1", "InvalidLocationConstraint"),
    ("bogus", "us-east-1", "InvalidLocationConstraint"),
    ("eu-west-1", "us-east-1", "IllegalLocationConstraintException"),
    ("us-west-2", "eu-west-1", "IllegalLocationConstraintException"),
])
def test_a_location_constraint_as_the_endpoint_of_our_region_takes_it(
        constraint: str, region: str, code: str | None) -> None:
    if code is None:
        check_location_constraint(constraint, region)
        return
    with pytest.raises(S3Error) as exc:
        check_location_constraint(constraint, region)
    assert (exc.value.code, exc.value.status) == (code, 400)
