"""Metadata quorum: a replica that missed a write is repaired by the next read."""
from __future__ import annotations

import asyncio

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.transport import Transport
from store.wire import unpack
from tests.cluster.conftest import wait_for


def replica_versions(cluster: LocalCluster, bucket: str, key: str) -> dict[str, str | None]:
    async def go() -> dict[str, str | None]:
        t = Transport(cluster.secret)
        out: dict[str, str | None] = {}
        try:
            for n in cluster.nodes.values():
                if n.role != "control":
                    continue
                r = await t.request("GET", n.url, f"/v1/objects/{bucket}/{key}", ok_404=True)
                out[n.id] = None if r.status == 404 else unpack(r.body)["version_id"]
        finally:
            await t.close()
        return out
    return asyncio.run(go())


def test_stale_replica_is_repaired_on_read(cluster: LocalCluster, client: SyncClient,
                                           all_up: LocalCluster) -> None:
    client.create_bucket("quorum")
    client.put("quorum", "k", b"first")
    cluster.kill_node("c1")
    new = client.put("quorum", "k", b"second" * 1000)
    cluster.start_node("c1")
    cluster.wait_healthy(["c1"])
    before = replica_versions(cluster, "quorum", "k")
    assert before["c1"] != new.version_id  # c1 missed the overwrite
    assert client.get("quorum", "k") == b"second" * 1000
    wait_for(lambda: set(replica_versions(cluster, "quorum", "k").values()) == {new.version_id},
             what="read repair of the stale replica")


def test_newest_wins_whatever_the_order_of_arrival() -> None:
    from store.metadata import newest
    a = {"ts": 5, "version_id": "b"}
    b = {"ts": 5, "version_id": "c"}
    c = {"ts": 4, "version_id": "z"}
    assert newest([a, None, b, c]) is b
    assert newest([None, None]) is None
