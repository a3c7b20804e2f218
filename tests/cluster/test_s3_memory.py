"""The gateway's memory stays bounded whatever clients send: a large multipart upload with
many parts in flight at once, then a streamed read, with its peak RSS checked."""
from __future__ import annotations

import hashlib
import io
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig

from cli.localcluster import LocalCluster

MIB = 1024 * 1024
SIZE = 384 * MIB
PEAK_RSS_LIMIT_MIB = 300     # issue: gateway under 300 MiB during a checkpoint storm


class PatternReader(io.RawIOBase):
    """SIZE deterministic pseudo-random bytes, generated as read: never held whole."""

    def __init__(self, size: int, seed: int) -> None:
        self.left, self.rnd, self.sha = size, random.Random(seed), hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.rnd.randbytes(n)
        self.left -= n
        self.sha.update(data)
        return data


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def gw_cluster() -> Iterator[LocalCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-s3mem-"))
    c = LocalCluster.create(tmp, storage=6, control=3, k=4, m=2, fsync=False, gateway=True)
    c.start()
    yield c
    c.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_big_multipart_upload_and_read_keep_gateway_memory_bounded(gw_cluster: LocalCluster) -> None:
    gw = gw_cluster.gateway
    assert gw is not None
    s3 = boto3.client("s3", endpoint_url=gw["url"], aws_access_key_id=gw["access_key"],
                      aws_secret_access_key=gw["secret_key"], region_name="us-east-1")
    s3.create_bucket(Bucket="mem")
    src = PatternReader(SIZE, seed=5)
    s3.upload_fileobj(src, "mem", "big", Config=TransferConfig(
        multipart_threshold=8 * MIB, multipart_chunksize=16 * MIB, max_concurrency=12))
    head = s3.head_object(Bucket="mem", Key="big")
    assert head["ContentLength"] == SIZE and head["ETag"].endswith(f'-{SIZE // (16 * MIB)}"')
    body = s3.get_object(Bucket="mem", Key="big")["Body"]
    sha = hashlib.sha256()
    for chunk in iter(lambda: body.read(4 * MIB), b""):
        sha.update(chunk)
    assert sha.hexdigest() == src.sha.hexdigest()
    gw_pid = gw_cluster.nodes["gw1"].pid
    assert gw_pid is not None
    peak = peak_rss_mib(gw_pid)
    print(f"gateway peak RSS {peak:.0f} MiB for a {SIZE // MIB} MiB object, 12 parts in flight")
    assert peak < PEAK_RSS_LIMIT_MIB
