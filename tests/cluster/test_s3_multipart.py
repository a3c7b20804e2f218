"""Multipart uploads through the gateway: the API with boto3, a 110 MiB upload_file read back
byte-exact, a part streamed with bounded gateway memory, the aws cli and s3fs."""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import s3fs
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import (  # noqa: F401
    AwsCli,
    Gateway,
    aws,
    aws_env,
    client_error,
    gateway,
    raw_request,
    s3,
    s3_cluster,
    s3_once,
)

MiB = 1024 * 1024
MIN_PART = 5 * MiB                  # S3's smallest part but the last
TRANSFER_CHUNK = 8 * MiB            # boto3's and the aws cli's default multipart_chunksize
BIG_SIZE = 110 * MiB + 12345
BUCKET = "multipart"


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def multipart_etag(part_md5s: list[bytes]) -> str:
    """S3's ETag of a multipart object: MD5 of the parts' binary MD5s, then -N."""
    return f'"{hashlib.md5(b"".join(part_md5s)).hexdigest()}-{len(part_md5s)}"'


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


def upload_parts(s3: BaseClient, key: str, parts: list[bytes], **create: Any) -> str:
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key=key, **create)["UploadId"]
    for n, data in enumerate(parts, 1):
        etag = s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=n, Body=data)["ETag"]
        assert etag == f'"{md5_hex(data)}"'
    return upload_id


def complete(s3: BaseClient, key: str, upload_id: str, parts: list[tuple[int, str]]) -> dict:
    return s3.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]})


def abort_quietly(s3: BaseClient, key: str, upload_id: str) -> None:
    """Abort if still open (a completed or aborted upload answers NoSuchUpload)."""
    try:
        s3.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchUpload"


def etags(parts: list[bytes]) -> list[tuple[int, str]]:
    return [(n, f'"{md5_hex(p)}"') for n, p in enumerate(parts, 1)]


# ---- the API -----------------------------------------------------------------------------
def test_create_upload_list_complete(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 1), blob(MIN_PART + 7, 2), blob(MiB + 3, 3)]
    upload_id = upload_parts(s3, "mp/obj", parts, ContentType="application/x-mp",
                             Metadata={"kind": "multipart"})
    listed = s3.list_parts(Bucket=BUCKET, Key="mp/obj", UploadId=upload_id)
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed["Parts"]] == \
        [(n, e, len(parts[n - 1])) for n, e in etags(parts)]
    uploads = s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
    assert ("mp/obj", upload_id) in [(u["Key"], u["UploadId"]) for u in uploads]

    done = complete(s3, "mp/obj", upload_id, etags(parts))
    want = multipart_etag([hashlib.md5(p).digest() for p in parts])
    assert done["ETag"] == want and done["Key"] == "mp/obj" and done["Bucket"] == BUCKET
    got = s3.get_object(Bucket=BUCKET, Key="mp/obj")
    assert got["Body"].read() == b"".join(parts)
    assert got["ETag"] == want and got["ContentType"] == "application/x-mp"
    assert got["Metadata"] == {"kind": "multipart"}
    assert s3.head_object(Bucket=BUCKET, Key="mp/obj")["ContentLength"] == sum(map(len, parts))
    assert upload_id not in [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]
    assert client_error(lambda: s3.list_parts(Bucket=BUCKET, Key="mp/obj", UploadId=upload_id)) == \
        ("NoSuchUpload", 404)


def test_a_single_small_part_completes(s3: BaseClient, bucket: str) -> None:
    parts = [b"x"]
    upload_id = upload_parts(s3, "mp/one", parts)
    assert complete(s3, "mp/one", upload_id, etags(parts))["ETag"] == multipart_etag([hashlib.md5(b"x").digest()])
    assert s3.get_object(Bucket=BUCKET, Key="mp/one")["Body"].read() == b"x"


def test_a_complete_sent_again_answers_as_the_first(s3: BaseClient, bucket: str) -> None:
    """An SDK whose complete timed out sends it again: S3 answers the retry with the same
    result once the upload has made the object (it answered NoSuchUpload here, and the
    upload was reported failed although the object was there). Once the key is written
    again, the old upload's id is NoSuchUpload, as any id that made nothing."""
    parts = [blob(MIN_PART, 30), b"tail"]
    upload_id = upload_parts(s3, "mp/retried", parts)
    first = complete(s3, "mp/retried", upload_id, etags(parts))
    again = complete(s3, "mp/retried", upload_id, etags(parts))
    assert (again["ETag"], again["Key"], again["Bucket"]) == (first["ETag"], "mp/retried", BUCKET)
    assert s3.get_object(Bucket=BUCKET, Key="mp/retried")["Body"].read() == b"".join(parts)
    assert client_error(lambda: complete(s3, "mp/other-key", upload_id, etags(parts))) == \
        ("NoSuchUpload", 404)
    s3.put_object(Bucket=BUCKET, Key="mp/retried", Body=b"overwritten")
    assert client_error(lambda: complete(s3, "mp/retried", upload_id, etags(parts))) == \
        ("NoSuchUpload", 404)


def test_uploading_a_part_number_again_replaces_the_part(s3: BaseClient, bucket: str) -> None:
    first, second, last = blob(MIN_PART, 4), blob(MIN_PART, 5), b"tail"
    upload_id = upload_parts(s3, "mp/again", [first, last])
    s3.upload_part(Bucket=BUCKET, Key="mp/again", UploadId=upload_id, PartNumber=1, Body=second)
    complete(s3, "mp/again", upload_id, etags([second, last]))
    assert s3.get_object(Bucket=BUCKET, Key="mp/again")["Body"].read() == second + last


def test_a_completed_subset_of_parts_is_the_object(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 6), blob(MIN_PART, 7), b"third"]
    upload_id = upload_parts(s3, "mp/subset", parts)
    chosen = [etags(parts)[0], etags(parts)[2]]         # part 2 left out: S3 allows gaps
    done = complete(s3, "mp/subset", upload_id, chosen)
    assert done["ETag"] == multipart_etag([hashlib.md5(parts[0]).digest(), hashlib.md5(parts[2]).digest()])
    assert s3.get_object(Bucket=BUCKET, Key="mp/subset")["Body"].read() == parts[0] + parts[2]


def test_complete_accepts_etags_without_quotes(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 15), b"tail"]
    upload_id = upload_parts(s3, "mp/unquoted", parts)
    done = complete(s3, "mp/unquoted", upload_id, [(n, e.strip('"')) for n, e in etags(parts)])
    assert done["ETag"] == multipart_etag([hashlib.md5(p).digest() for p in parts])


def test_a_small_part_before_the_last_is_entity_too_small(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MiB, 8), blob(MiB, 9)]
    upload_id = upload_parts(s3, "mp/small", parts)
    try:
        assert client_error(lambda: complete(s3, "mp/small", upload_id, etags(parts))) == ("EntityTooSmall", 400)
        assert client_error(lambda: s3.head_object(Bucket=BUCKET, Key="mp/small")) == ("404", 404)
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/small", UploadId=upload_id)


def test_a_wrong_or_missing_part_is_invalid_part(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 10), b"end"]
    upload_id = upload_parts(s3, "mp/wrong", parts)
    try:
        wrong_etag = [(1, f'"{md5_hex(b"not the part")}"'), etags(parts)[1]]
        assert client_error(lambda: complete(s3, "mp/wrong", upload_id, wrong_etag)) == ("InvalidPart", 400)
        never_uploaded = etags(parts) + [(3, f'"{md5_hex(b"ghost")}"')]
        assert client_error(lambda: complete(s3, "mp/wrong", upload_id, never_uploaded)) == ("InvalidPart", 400)
        assert client_error(lambda: s3.head_object(Bucket=BUCKET, Key="mp/wrong")) == ("404", 404)
        # a failed complete leaves the upload open: it can still be completed right
        complete(s3, "mp/wrong", upload_id, etags(parts))
        assert s3.get_object(Bucket=BUCKET, Key="mp/wrong")["Body"].read() == b"".join(parts)
    finally:
        abort_quietly(s3, "mp/wrong", upload_id)


def test_parts_out_of_order_are_invalid_part_order(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 11), b"end"]
    upload_id = upload_parts(s3, "mp/order", parts)
    try:
        backwards = list(reversed(etags(parts)))
        assert client_error(lambda: complete(s3, "mp/order", upload_id, backwards)) == ("InvalidPartOrder", 400)
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/order", UploadId=upload_id)


def test_abort_then_every_call_is_no_such_upload(s3: BaseClient, bucket: str) -> None:
    parts = [blob(MIN_PART, 12)]
    upload_id = upload_parts(s3, "mp/aborted", parts)
    assert s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/aborted",
                                     UploadId=upload_id)["ResponseMetadata"]["HTTPStatusCode"] == 204
    ref = {"Bucket": BUCKET, "Key": "mp/aborted", "UploadId": upload_id}
    assert client_error(lambda: s3.list_parts(**ref)) == ("NoSuchUpload", 404)
    assert client_error(lambda: s3.upload_part(**ref, PartNumber=2, Body=b"late")) == ("NoSuchUpload", 404)
    assert client_error(lambda: complete(s3, "mp/aborted", upload_id, etags(parts))) == ("NoSuchUpload", 404)
    assert client_error(lambda: s3.abort_multipart_upload(**ref)) == ("NoSuchUpload", 404)
    assert upload_id not in [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]
    assert client_error(lambda: s3.head_object(Bucket=BUCKET, Key="mp/aborted")) == ("404", 404)


def test_an_unknown_upload_id_is_no_such_upload(s3: BaseClient, bucket: str) -> None:
    ref = {"Bucket": BUCKET, "Key": "mp/unknown", "UploadId": "no-such-upload-id"}
    assert client_error(lambda: s3.upload_part(**ref, PartNumber=1, Body=b"x")) == ("NoSuchUpload", 404)
    assert client_error(lambda: s3.list_parts(**ref)) == ("NoSuchUpload", 404)


def test_list_parts_pages_with_part_number_marker(s3: BaseClient, bucket: str) -> None:
    parts = [b"p1", b"p2", b"p3"]
    upload_id = upload_parts(s3, "mp/pages", parts)
    try:
        first = s3.list_parts(Bucket=BUCKET, Key="mp/pages", UploadId=upload_id, MaxParts=2)
        assert [p["PartNumber"] for p in first["Parts"]] == [1, 2]
        assert first["IsTruncated"] and first["NextPartNumberMarker"] == 2
        rest = s3.list_parts(Bucket=BUCKET, Key="mp/pages", UploadId=upload_id, PartNumberMarker=2)
        assert [p["PartNumber"] for p in rest["Parts"]] == [3] and not rest["IsTruncated"]
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/pages", UploadId=upload_id)


def test_list_uploads_by_prefix_with_several_uploads_of_one_key(s3: BaseClient, bucket: str) -> None:
    ids = [(k, s3.create_multipart_upload(Bucket=BUCKET, Key=k)["UploadId"])
           for k in ("lu/a", "lu/a", "lu/b", "other/c")]
    try:
        listed = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="lu/")["Uploads"]
        assert sorted((u["Key"], u["UploadId"]) for u in listed) == sorted(ids[:3])
        assert [u["Key"] for u in listed] == ["lu/a", "lu/a", "lu/b"]   # sorted by key
        assert len({u["UploadId"] for u in listed}) == 3
    finally:
        for k, uid in ids:
            s3.abort_multipart_upload(Bucket=BUCKET, Key=k, UploadId=uid)


def test_list_uploads_with_a_delimiter_rolls_keys_up_into_common_prefixes(
        s3: BaseClient, bucket: str) -> None:
    """As ListObjects: uploads whose key holds the delimiter after the prefix are one
    CommonPrefix each, counted as one entry, and paging resumes after the prefix."""
    ids = [(k, s3.create_multipart_upload(Bucket=BUCKET, Key=k)["UploadId"])
           for k in ("ld/a", "ld/d1/x", "ld/d1/y", "ld/d2/z", "ld/e")]
    try:
        whole = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="ld/", Delimiter="/")
        assert [u["Key"] for u in whole["Uploads"]] == ["ld/a", "ld/e"]
        assert [p["Prefix"] for p in whole["CommonPrefixes"]] == ["ld/d1/", "ld/d2/"]
        seen: list[str] = []
        marker = {}
        for _ in range(10):                  # pages of two entries
            page = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="ld/", Delimiter="/",
                                             MaxUploads=2, **marker)
            seen += [u["Key"] for u in page.get("Uploads", [])]
            seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            if not page["IsTruncated"]:
                break
            marker = {"KeyMarker": page["NextKeyMarker"],
                      "UploadIdMarker": page["NextUploadIdMarker"]}
        assert sorted(seen) == ["ld/a", "ld/d1/", "ld/d2/", "ld/e"]
    finally:
        for k, uid in ids:
            s3.abort_multipart_upload(Bucket=BUCKET, Key=k, UploadId=uid)


@pytest.mark.parametrize("number", [0, 10001])
def test_a_part_number_outside_1_to_10000_is_invalid_argument(gateway: Gateway, s3: BaseClient,
                                                              bucket: str, number: int) -> None:
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/range")["UploadId"]
    try:
        resp = raw_request(gateway, "PUT", f"/{BUCKET}/mp/range",
                           f"partNumber={number}&uploadId={upload_id}", b"data")
        assert (resp.status, resp.code) == (400, "InvalidArgument")
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/range", UploadId=upload_id)


def test_a_wrong_part_md5_is_bad_digest(s3: BaseClient, s3_once: BaseClient, bucket: str) -> None:
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/crc")["UploadId"]
    try:
        assert client_error(lambda: s3_once.upload_part(
            Bucket=BUCKET, Key="mp/crc", UploadId=upload_id, PartNumber=1, Body=b"part",
            ContentMD5="1B2M2Y8AsgTpgAmY7PhCfg==")) == ("BadDigest", 400)   # MD5 of b""
        assert s3.list_parts(Bucket=BUCKET, Key="mp/crc", UploadId=upload_id).get("Parts", []) == []
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/crc", UploadId=upload_id)


# ---- a 110 MiB file ----------------------------------------------------------------------
@dataclass(frozen=True)
class BigFile:
    path: Path
    size: int
    sha256: str
    md5: str           # hex, the ETag of the whole file as one part
    etag: str          # the multipart ETag of an upload in TRANSFER_CHUNK parts


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigFile]:
    """Written once per module in 1 MiB blocks; only the digests stay in memory."""
    path = tmp_path_factory.mktemp("s3-big") / "big.bin"
    rnd = random.Random(2026)
    whole, whole_md5, part, part_md5s, in_part = hashlib.sha256(), hashlib.md5(), hashlib.md5(), [], 0
    with open(path, "wb") as f:
        left = BIG_SIZE
        while left:
            block = rnd.randbytes(min(MiB, left))
            f.write(block)
            whole.update(block)
            whole_md5.update(block)
            part.update(block)
            in_part += len(block)
            left -= len(block)
            if in_part == TRANSFER_CHUNK or not left:
                part_md5s.append(part.digest())
                part, in_part = hashlib.md5(), 0
    yield BigFile(path, BIG_SIZE, whole.hexdigest(), whole_md5.hexdigest(), multipart_etag(part_md5s))
    path.unlink()


def read_slice(path: Path, lo: int, hi: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(lo)
        return f.read(hi - lo + 1)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_110_mib_part_is_streamed_not_buffered(s3_cluster: LocalCluster, s3: BaseClient, bucket: str,
                                                 big_file: BigFile) -> None:
    """One UploadPart of the whole file: the gateway's RSS must not grow by the part's size.
    Peak RSS is sampled every 20 ms; a gateway that held the part would grow by >= 110 MiB.
    Runs before the other big uploads so that memory they leave behind cannot hide growth."""
    gw_pid = next(n.pid for n in s3_cluster.nodes.values() if n.role == "gateway")
    assert gw_pid
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/streamed")["UploadId"]
    base, peak, done = rss_kib(gw_pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(gw_pid))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with open(big_file.path, "rb") as f:
            part = s3.upload_part(Bucket=BUCKET, Key="mp/streamed", UploadId=upload_id, PartNumber=1, Body=f)
    finally:
        done.set()
        sampler.join(timeout=5)
        s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/streamed", UploadId=upload_id)
    assert part["ETag"] == f'"{big_file.md5}"'
    growth_mib = (peak[0] - base) / 1024
    # a streaming gateway holds a few segments and their fragments (~56 MiB measured on
    # 2026-12-01); one that copies the part whole grows by at least the part's 110 MiB
    assert growth_mib < 0.8 * big_file.size / MiB, f"gateway RSS grew {growth_mib:.0f} MiB for one part"


@pytest.fixture(scope="module")
def big_object(s3: BaseClient, bucket: str, big_file: BigFile) -> str:
    s3.upload_file(str(big_file.path), BUCKET, "big.bin")   # default TransferConfig: multipart
    return "big.bin"


def test_upload_file_makes_a_multipart_object(s3: BaseClient, big_file: BigFile, big_object: str) -> None:
    head = s3.head_object(Bucket=BUCKET, Key=big_object)
    assert head["ContentLength"] == big_file.size
    assert head["ETag"] == big_file.etag      # 14 parts of 8 MiB


def test_the_big_object_reads_back_whole_byte_exact(s3: BaseClient, big_file: BigFile, big_object: str) -> None:
    digest = hashlib.sha256()
    for chunk in s3.get_object(Bucket=BUCKET, Key=big_object)["Body"].iter_chunks(MiB):
        digest.update(chunk)
    assert digest.hexdigest() == big_file.sha256


def test_a_range_of_the_whole_object_reads_back_byte_exact(s3: BaseClient, big_file: BigFile,
                                                          big_object: str) -> None:
    resp = s3.get_object(Bucket=BUCKET, Key=big_object, Range=f"bytes=0-{big_file.size - 1}")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 206
    digest = hashlib.sha256()
    for chunk in resp["Body"].iter_chunks(MiB):
        digest.update(chunk)
    assert digest.hexdigest() == big_file.sha256


def test_download_file_reads_it_back_byte_exact(s3: BaseClient, big_file: BigFile, big_object: str,
                                                tmp_path: Path) -> None:
    out = tmp_path / "down.bin"
    s3.download_file(BUCKET, big_object, str(out))     # concurrent ranged GETs
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            digest.update(block)
    out.unlink()
    assert digest.hexdigest() == big_file.sha256


@pytest.mark.parametrize("lo,hi", [
    (0, 0),
    (TRANSFER_CHUNK - 5, TRANSFER_CHUNK + 5),                 # across a part boundary
    (4 * MiB - 1, 4 * MiB),                                   # across a segment boundary
    (2 * TRANSFER_CHUNK - 100, 5 * TRANSFER_CHUNK + 100),     # five parts, 24 MiB
    (13 * TRANSFER_CHUNK - 1, BIG_SIZE - 1),                  # into the short last part, to the end
])
def test_ranged_gets_across_parts_are_byte_exact(s3: BaseClient, big_file: BigFile, big_object: str,
                                                 lo: int, hi: int) -> None:
    resp = s3.get_object(Bucket=BUCKET, Key=big_object, Range=f"bytes={lo}-{hi}")
    assert resp["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert resp["ContentRange"] == f"bytes {lo}-{hi}/{big_file.size}"
    assert resp["Body"].read() == read_slice(big_file.path, lo, hi)


def test_a_suffix_range_of_the_big_object(s3: BaseClient, big_file: BigFile, big_object: str) -> None:
    resp = s3.get_object(Bucket=BUCKET, Key=big_object, Range="bytes=-70000")
    assert resp["Body"].read() == read_slice(big_file.path, big_file.size - 70000, big_file.size - 1)


# ---- the aws cli and s3fs ----------------------------------------------------------------
def test_aws_s3_cp_up_and_down(aws: AwsCli, s3: BaseClient, bucket: str, tmp_path: Path) -> None:
    data = blob(20 * MiB + 3, 13)
    src, dst = tmp_path / "up.bin", tmp_path / "down.bin"
    src.write_bytes(data)
    aws("s3", "cp", str(src), f"s3://{BUCKET}/cli/twenty.bin")
    head = s3.head_object(Bucket=BUCKET, Key="cli/twenty.bin")
    assert head["ContentLength"] == len(data)
    chunks = [data[i:i + TRANSFER_CHUNK] for i in range(0, len(data), TRANSFER_CHUNK)]
    assert head["ETag"] == multipart_etag([hashlib.md5(c).digest() for c in chunks])   # 3 parts
    aws("s3", "cp", f"s3://{BUCKET}/cli/twenty.bin", str(dst))
    assert dst.read_bytes() == data


def test_aws_s3_cp_from_stdin_streams_a_multipart_upload(gateway: Gateway, s3: BaseClient, bucket: str,
                                                         s3_cluster: LocalCluster) -> None:
    data = blob(17 * MiB + 11, 16)     # unknown size to the cli: it uploads 8 MiB parts as they come
    proc = subprocess.run([sys.executable, "-m", "awscli", "--endpoint-url", gateway.url, "s3", "cp", "-",
                           f"s3://{BUCKET}/cli/stdin.bin"], input=data, capture_output=True, timeout=120,
                          env=aws_env(s3_cluster, gateway))
    assert proc.returncode == 0, proc.stderr.decode()
    head = s3.head_object(Bucket=BUCKET, Key="cli/stdin.bin")
    assert head["ContentLength"] == len(data) and head["ETag"].endswith('-3"')
    assert s3.get_object(Bucket=BUCKET, Key="cli/stdin.bin")["Body"].read() == data


@pytest.fixture(scope="module")
def fs(gateway: Gateway) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(key=gateway.access_key, secret=gateway.secret_key, endpoint_url=gateway.url,
                             client_kwargs={"region_name": gateway.region}, skip_instance_cache=True)


def test_s3fs_lists_stats_and_reads_with_seeks(fs: s3fs.S3FileSystem, s3: BaseClient, bucket: str) -> None:
    data = blob(9 * MiB + 5, 14)
    s3.put_object(Bucket=BUCKET, Key="fs/data.bin", Body=data)
    s3.put_object(Bucket=BUCKET, Key="fs/sub/x", Body=b"x")
    assert sorted(fs.ls(f"{BUCKET}/fs", refresh=True)) == [f"{BUCKET}/fs/data.bin", f"{BUCKET}/fs/sub"]
    assert fs.info(f"{BUCKET}/fs/data.bin")["size"] == len(data)
    assert fs.isdir(f"{BUCKET}/fs/sub") and fs.exists(f"{BUCKET}/fs/sub/x")
    with fs.open(f"{BUCKET}/fs/data.bin", "rb") as f:
        assert f.read(10) == data[:10]
        f.seek(5 * MiB - 10)
        assert f.read(20) == data[5 * MiB - 10:5 * MiB + 10]
        f.seek(-100, 2)
        assert f.read() == data[-100:]
        f.seek(123)
        assert f.read(1000) == data[123:1123]
    assert fs.cat_file(f"{BUCKET}/fs/data.bin", start=4 * MiB, end=4 * MiB + 64) == data[4 * MiB:4 * MiB + 64]


def test_s3fs_writes_a_small_file(fs: s3fs.S3FileSystem, s3: BaseClient, bucket: str) -> None:
    with fs.open(f"{BUCKET}/fs/written.txt", "wb") as f:
        f.write(b"written by s3fs\n")
    assert s3.get_object(Bucket=BUCKET, Key="fs/written.txt")["Body"].read() == b"written by s3fs\n"
    fs.rm(f"{BUCKET}/fs/written.txt")
    assert client_error(lambda: s3.head_object(Bucket=BUCKET, Key="fs/written.txt")) == ("404", 404)


def test_a_complete_cut_short_before_its_records_were_forgotten_is_finished_by_its_retry(
        s3: BaseClient, s3_cluster: LocalCluster, bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway killed after CompleteMultipartUpload committed the object but before it
    tombstoned the upload's records: the parts stayed (gc kept their fragments for ever,
    even after the object was deleted) and no upload named them. The records are now
    forgotten parts first, upload last, and the SDK's retry of the complete answers as
    the first did and forgets what was left."""
    from store import multipart as mp
    from store.client import SyncClient
    key = "mp/cut-short"
    parts = [random.Random(i).randbytes(5 * 1024 * 1024 if i == 0 else 1000) for i in range(2)]
    upload_id = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    done = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                                     PartNumber=n, Body=b)["ETag"]}
            for n, b in enumerate(parts, 1)]

    with SyncClient(s3_cluster.path) as lib:
        real, stages = lib.client.commit, []

        async def commit(ns: str, k: str, rec: dict[str, Any]) -> None:
            """Killed once the first kind of record (upload or parts) is tombstoned."""
            if rec.get("deleted") and ns in (mp.PARTS_BUCKET, mp.UPLOADS_BUCKET):
                if stages and ns != stages[0]:
                    raise RuntimeError("the gateway was killed here")
                stages.append(ns)
            await real(ns, k, rec)
        monkeypatch.setattr(lib.client, "commit", commit)
        with pytest.raises(RuntimeError):
            lib._run(mp.complete(lib.client, BUCKET, upload_id,
                                 [(p["PartNumber"], p["ETag"]) for p in done]))
        monkeypatch.undo()
        resp = s3.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id,
                                            MultipartUpload={"Parts": done})
        assert resp["ETag"] == s3.head_object(Bucket=BUCKET, Key=key)["ETag"]
        assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"".join(parts)
        assert lib._run(mp.list_parts(lib.client, upload_id)) == ([], False)
    assert client_error(lambda: s3.list_parts(Bucket=BUCKET, Key=key, UploadId=upload_id)) == \
        ("NoSuchUpload", 404)
    listed = s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
    assert upload_id not in [u["UploadId"] for u in listed]
