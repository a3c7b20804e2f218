"""bench/bound.py and its null S3 endpoint (bench/nulls3.py), a real process on loopback:
boto3 puts and gets through it, the per-byte checks it owes a put refuse bodies that do
not match, what it does not handle gets a 501 (a measure cannot pass by skipping work),
and the benchmark's run against it writes verified figures."""
from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import bound
from bench import workloads as wl


@pytest.fixture(scope="module")
def endpoint() -> Iterator[wl.S3Target]:
    with bound.null_endpoint() as (target, roles):
        assert list(roles()) == ["null"]
        target.create_bucket()
        yield target


def send(target: wl.S3Target, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    url = target.s3.meta.endpoint_url + path
    req = urllib.request.Request(url, data=body if method == "PUT" else None, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_boto3_round_trip_through_the_null_endpoint(endpoint: wl.S3Target) -> None:
    data = bytes(range(256)) * 4096 + b"tail"
    put = endpoint.s3.put_object(Bucket=endpoint.bucket, Key="a/b", Body=data)
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = endpoint.s3.get_object(Bucket=endpoint.bucket, Key="a/b")
    assert got["Body"].read() == data
    assert got["ETag"] == put["ETag"]


def test_bodies_that_do_not_match_their_hashes_are_refused(endpoint: wl.S3Target) -> None:
    path = f"/{endpoint.bucket}/checked"
    body = b"x" * 1000
    wrong_sha = {"x-amz-content-sha256": hashlib.sha256(b"other").hexdigest()}
    assert send(endpoint, "PUT", path, body, wrong_sha)[0] == 400
    crc = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big")).decode()
    headers = {"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-checksum-crc32": crc}
    assert send(endpoint, "PUT", path, body, headers)[0] == 400
    assert send(endpoint, "GET", path)[0] == 404          # neither was stored
    good = {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    assert send(endpoint, "PUT", path, body, good)[0] == 200
    assert send(endpoint, "GET", path) == (200, body)


@pytest.mark.parametrize("headers", [
    {"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "Content-Encoding": "aws-chunked"},
    {"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-checksum-sha1": "AAAA"},
    {"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-sdk-checksum-algorithm": "CRC64NVME"},
])
def test_what_it_does_not_check_is_refused_not_skipped(endpoint: wl.S3Target,
                                                       headers: dict[str, str]) -> None:
    status, body = send(endpoint, "PUT", f"/{endpoint.bucket}/skipped", b"abc", headers)
    assert status == 501 and b"NotImplemented" in body
    assert send(endpoint, "GET", f"/{endpoint.bucket}/skipped")[0] == 404


def test_ranges_and_other_operations_are_refused(endpoint: wl.S3Target) -> None:
    endpoint.s3.put_object(Bucket=endpoint.bucket, Key="r", Body=b"0123456789")
    assert send(endpoint, "GET", f"/{endpoint.bucket}/r", headers={"Range": "bytes=0-1"})[0] == 501
    assert send(endpoint, "PUT", f"/{endpoint.bucket}/r?partNumber=1&uploadId=x", b"a",
                {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})[0] == 501
    assert send(endpoint, "PUT", "/no-such-bucket/k", b"a",
                {"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})[0] == 404


def test_bound_against_the_null_endpoint_writes_verified_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bound.json"
    assert bound.main(["--only", "null", "--count", "12", "--keys", "4", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["failures"] == [] and report["keys"] == 4 and report["count"] == 12
    assert [(r["target"], r["op"]) for r in report["rows"]] == [("null", "put"), ("null", "get")]
    for r in report["rows"]:
        assert r["errors"] == 0 and r["mb_s"] > 0
        assert set(r["cpu_ms_per_op"]) == {"null", "bench"}
        assert r["cpu_ms_per_op"]["bench"] > 0
    assert "null   put" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--only", "nope"], ["--only", ","], ["--keys", "0"],
                                  ["--keys", "100000"], ["--count", "0"]])
def test_bad_arguments_exit_with_a_message(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bound.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
