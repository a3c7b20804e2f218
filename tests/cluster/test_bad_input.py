"""Bad input gets a clear 4xx and changes nothing; buckets follow S3's rules."""
from __future__ import annotations

import hashlib

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.errors import BadRequest, Conflict, NotFound
from store.transport import Transport
from store.wire import pack


@pytest.fixture(scope="module")
def bucket(client: SyncClient) -> str:
    client.create_bucket("inputs")
    client.put("inputs", "keep", b"kept bytes")
    return "inputs"


@pytest.mark.parametrize("name", ["ab", "A-upper", "under_score", "-dash", "dash-", "a..b",
                                  "x" * 64, "192.168.1.1", "sp ace", ""])
def test_invalid_bucket_names_are_refused(client: SyncClient, name: str) -> None:
    with pytest.raises(BadRequest):
        client.create_bucket(name)


def test_bucket_lifecycle(client: SyncClient, bucket: str) -> None:
    with pytest.raises(Conflict):
        client.create_bucket(bucket)
    with pytest.raises(Conflict):
        client.delete_bucket(bucket)
    with pytest.raises(NotFound):
        client.put("no-such-bucket", "k", b"x")
    client.create_bucket("short-lived")
    assert "short-lived" in client.list_buckets()
    client.delete_bucket("short-lived")
    assert "short-lived" not in client.list_buckets()


@pytest.mark.parametrize("key", ["", "k" * 1025, "nul\0byte"])
def test_bad_keys_are_refused(client: SyncClient, bucket: str, key: str) -> None:
    with pytest.raises(BadRequest):
        client.put(bucket, key, b"x")


def test_oversized_user_metadata_is_refused(client: SyncClient, bucket: str) -> None:
    with pytest.raises(BadRequest):
        client.put(bucket, "meta", b"x", meta={"big": "v" * 5000})
    with pytest.raises(NotFound):
        client.head(bucket, "meta")


def test_garbage_bodies_to_a_control_node_change_nothing(cluster: LocalCluster,
                                                         client: SyncClient, bucket: str) -> None:
    import asyncio

    async def go() -> None:
        t = Transport(cluster.secret)
        url = cluster.nodes["c1"].url
        try:
            for body in (b"\xc1\xc1garbage", pack([1, 2, 3]), pack({"ts": "soon"}),
                         pack({"ts": 1, "version_id": "v", "deleted": "no"})):
                with pytest.raises(BadRequest):
                    await t.request("PUT", url, f"/v1/objects/{bucket}/keep", body=body)
            with pytest.raises(BadRequest):
                await t.request("PUT", url, "/v1/map", body=b"not a map")
            # a body that does not match its signed checksum (cut short in transit)
            full = pack({"ts": 2**62, "version_id": "z", "deleted": True})
            with pytest.raises(BadRequest):
                await t.request("PUT", url, f"/v1/objects/{bucket}/keep", body=full[:-3],
                                checksum=hashlib.sha256(full).hexdigest())
        finally:
            await t.close()
    asyncio.run(go())
    assert client.get(bucket, "keep") == b"kept bytes"
