"""The checksum of a multipart object, from its parts' checksums (pure: no I/O).

S3 keeps one of two kinds (x-amz-checksum-type), chosen at CreateMultipartUpload with
x-amz-checksum-algorithm:

    COMPOSITE    the checksum of the parts' binary checksums laid end to end, in base64, then
                 "-" and the part count ("AAAAAA==-3"): CRC32, CRC32C, SHA1, SHA256; the
                 default for all but CRC64NVME
    FULL_OBJECT  the checksum of the whole object's bytes, made from the parts' CRCs and
                 sizes (CRC combination): CRC32, CRC32C, CRC64NVME; CRC64NVME's only kind

Errors are S3Error InvalidRequest, as S3 words them.
"""
from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from node.s3.body import DIGEST_BYTES, RunningChecksum
from node.s3.errors import S3Error

COMPOSITE, FULL_OBJECT = "COMPOSITE", "FULL_OBJECT"
TYPES = {"crc32": (COMPOSITE, FULL_OBJECT), "crc32c": (COMPOSITE, FULL_OBJECT),
         "crc64nvme": (FULL_OBJECT,), "sha1": (COMPOSITE,), "sha256": (COMPOSITE,)}
# reflected polynomials; every one of these CRCs starts from and ends xor all ones
_CRC_POLYNOMIALS = {"crc32": (0xEDB88320, 32), "crc32c": (0x82F63B78, 32),
                    "crc64nvme": (0x9A6C9329AC4BC9B5, 64)}
MAX_POWERS = 80   # x^(2^k) for k < 80: part sizes up to 2^76 bytes


@dataclass(frozen=True)
class UploadChecksum:
    """What a multipart upload keeps: `algorithm` (lower case, as DIGEST_BYTES) and `type`."""
    algorithm: str
    type: str

    def header_value(self) -> str:
        return self.algorithm.upper()


def upload_checksum(headers: Mapping[str, str]) -> UploadChecksum | None:
    """The checksum a CreateMultipartUpload asks for (x-amz-checksum-algorithm and
    x-amz-checksum-type), None for none. InvalidRequest for an algorithm we do not know, a
    type without an algorithm, or a type the algorithm does not have."""
    name = headers.get("x-amz-checksum-algorithm")
    kind = headers.get("x-amz-checksum-type")
    if name is None:
        if kind is not None:
            raise S3Error("InvalidRequest", "The x-amz-checksum-type header can only be used "
                          "with the x-amz-checksum-algorithm header.")
        return None
    algorithm = name.strip().lower()
    if algorithm not in TYPES:
        raise S3Error("InvalidRequest", "Checksum algorithm provided is unsupported. Please try "
                      "again with any of the valid types: [CRC32, CRC32C, CRC64NVME, SHA1, SHA256]")
    kind = (kind or TYPES[algorithm][0]).strip().upper()
    if kind not in (COMPOSITE, FULL_OBJECT):
        raise S3Error("InvalidRequest", "Value for x-amz-checksum-type header is invalid.")
    if kind not in TYPES[algorithm]:
        raise S3Error("InvalidRequest", f"The {kind} checksum type cannot be used with the "
                      f"{algorithm} checksum algorithm.")
    return UploadChecksum(algorithm, kind)


def composite(algorithm: str, part_values: Sequence[str]) -> str:
    """S3's COMPOSITE checksum of parts whose checksums (base64) are `part_values`, in order."""
    running = RunningChecksum(algorithm)
    for value in part_values:
        running.update(base64.b64decode(value))
    return f"{running.b64digest()}-{len(part_values)}"


def full_object(algorithm: str, parts: Sequence[tuple[str, int]]) -> str:
    """The CRC (base64) of the whole object from its parts' (CRC in base64, size in bytes),
    in order: what the CRC of the concatenated bytes would be."""
    width = DIGEST_BYTES[algorithm]
    crc = int.from_bytes(RunningChecksum(algorithm).digest(), "big")   # of no bytes
    for value, size in parts:
        crc = crc_combine(algorithm, crc, int.from_bytes(base64.b64decode(value), "big"), size)
    return base64.b64encode(crc.to_bytes(width, "big")).decode()


def crc_combine(algorithm: str, crc1: int, crc2: int, size2: int) -> int:
    """CRC of A + B from crc1 = CRC(A), crc2 = CRC(B) and len(B) = size2 bytes: crc1 times
    x^(8 size2) modulo the polynomial, plus crc2 (zlib's crc32_combine, for any reflected
    CRC that starts from and ends xor all ones). O(log size2)."""
    poly, width = _CRC_POLYNOMIALS[algorithm]
    return _multmodp(poly, width, _x8nmodp(algorithm, size2), crc1) ^ crc2


def _multmodp(poly: int, width: int, a: int, b: int) -> int:
    """a times b modulo the polynomial, both reflected (the top bit is x^0)."""
    m, p = 1 << (width - 1), 0
    while a:
        if a & m:
            p ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return p


@lru_cache(maxsize=None)
def _powers(algorithm: str) -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, k = 0 .. MAX_POWERS - 1."""
    poly, width = _CRC_POLYNOMIALS[algorithm]
    out = [1 << (width - 2)]   # x^1
    while len(out) < MAX_POWERS:
        out.append(_multmodp(poly, width, out[-1], out[-1]))
    return tuple(out)


def _x8nmodp(algorithm: str, n_bytes: int) -> int:
    """x^(8 n_bytes) modulo the polynomial."""
    poly, width = _CRC_POLYNOMIALS[algorithm]
    powers = _powers(algorithm)
    p, k = 1 << (width - 1), 3   # x^0; 8 = 2^3
    while n_bytes:
        assert k < MAX_POWERS, "part too large"
        if n_bytes & 1:
            p = _multmodp(poly, width, powers[k], p)
        n_bytes >>= 1
        k += 1
    return p


def of_upload(upload: Mapping[str, object]) -> UploadChecksum | None:
    """The checksum an upload's record keeps (store.multipart.create_upload's `checksum`)."""
    kept = upload.get("checksum")
    if not isinstance(kept, dict):
        return None
    return UploadChecksum(str(kept["algorithm"]), str(kept["type"]))


def check_part(upload: UploadChecksum | None, sent: str | None) -> None:
    """An UploadPart's checksum algorithm (`sent`, None for none) against its upload's, as
    S3 checks it: the upload's (or none for a FULL_OBJECT upload; we compute it) - or any
    for an upload created without one. InvalidRequest otherwise."""
    if upload is None or sent == upload.algorithm or (sent is None and upload.type == FULL_OBJECT):
        return
    raise S3Error("InvalidRequest", "Checksum Type mismatch occurred, expected checksum Type: "
                  f"{upload.algorithm}, actual checksum Type: {sent or 'null'}")


@dataclass(frozen=True)
class CompletedPart:
    number: int
    size: int
    kept: Mapping[str, str]     # the part's checksums, as UploadPart verified or computed them
    claimed: Mapping[str, str]  # the Checksum* the complete request names for it


def object_checksum(upload: UploadChecksum | None, parts: Sequence[CompletedPart],
                    claimed: Mapping[str, str], claimed_type: str | None) -> dict[str, object]:
    """The record fields ({"checksums": {algorithm: value}, "checksum_type"}) of the object
    a CompleteMultipartUpload makes, {} for an upload without a checksum. `claimed`: the
    request's x-amz-checksum-* headers (the object's checksum), `claimed_type` its
    x-amz-checksum-type. InvalidPart for a part checksum that is not the part's;
    InvalidRequest for a COMPOSITE upload's part named without its checksum, or a claimed
    algorithm or type that is not the upload's; BadDigest for a claimed value that is not
    the object's."""
    for part in parts:
        for algorithm, value in part.claimed.items():
            if part.kept.get(algorithm, value) != value:
                raise S3Error("InvalidPart", "One or more of the specified parts could not be "
                              "found. The part may not have been uploaded, or the specified "
                              f"entity tag may not match the part's entity tag. (part {part.number}: "
                              f"its {algorithm} is not {value})")
    if upload is None:
        if claimed or claimed_type:
            raise S3Error("InvalidRequest", "The upload was created without a checksum "
                          "algorithm: the complete request cannot name the object's checksum.")
        return {}
    alg = upload.algorithm
    if set(claimed) - {alg} or (claimed_type or upload.type).upper() != upload.type:
        raise S3Error("InvalidRequest", f"The upload was created using the {upload.type} "
                      f"{alg} checksum. The complete request must use the same checksum.")
    for part in parts:
        if alg not in part.kept:   # parts uploaded before the gateway kept checksums
            raise S3Error("InvalidPart", f"part {part.number} was uploaded without its {alg}")
        if upload.type == COMPOSITE and alg not in part.claimed:
            raise S3Error("InvalidRequest", f"The upload was created using a {alg} checksum. "
                          "The complete request must include the checksum for each part. It "
                          f"was missing for part {part.number} in the request.")
    value = (composite(alg, [p.kept[alg] for p in parts]) if upload.type == COMPOSITE
             else full_object(alg, [(p.kept[alg], p.size) for p in parts]))
    if alg in claimed and claimed[alg].strip() not in (value, value.split("-")[0]):
        raise S3Error("BadDigest", f"The {alg.upper()} you specified did not match the "
                      "calculated checksum.")
    return {"checksums": {alg: value}, "checksum_type": upload.type}
