"""Group commit on a real control node: concurrent record writes share synced RocksDB
writes, and batching never changes what newest-wins or purge decide."""
from __future__ import annotations

import asyncio
import random

from cli.localcluster import LocalCluster
from store.transport import Transport
from store.wire import pack, unpack
from tests import scrape


def counters(text: str) -> dict[str, float]:
    return scrape.counters(text, ("ecstore_control_db_writes_total",
                                  "ecstore_control_db_batches_total"))


async def metrics(t: Transport, url: str) -> dict[str, float]:
    return counters((await t.request("GET", url, "/metrics")).body.decode())


def record(ts: int, deleted: bool = False) -> bytes:
    return pack({"ts": ts, "version_id": f"v{ts:08d}", "deleted": deleted, "size": 0})


def test_concurrent_writes_share_batches_and_newest_wins(cluster: LocalCluster) -> None:
    c1 = cluster.nodes["c1"].url
    stamps = list(range(1_000, 1_200))
    random.Random(7).shuffle(stamps)

    async def go() -> tuple[list[dict], dict, dict[str, float], dict[str, float]]:
        t = Transport(cluster.secret)
        try:
            before = await metrics(t, c1)
            replies = await asyncio.gather(*(
                t.request("PUT", c1, "/v1/objects/gc-bucket/same", body=record(ts))
                for ts in stamps))
            after = await metrics(t, c1)
            final = unpack((await t.request("GET", c1, "/v1/objects/gc-bucket/same")).body)
            return [unpack(r.body) for r in replies], final, before, after
        finally:
            await t.close()
    replies, final, before, after = asyncio.run(go())
    assert final["ts"] == max(stamps)
    # a write is applied only if nothing newer was there: each reply names what is
    # current, never older than the write itself
    for ts, reply in zip(stamps, replies):
        assert reply["ts"] >= ts
        assert reply["applied"] == (reply["ts"] == ts)
    assert any(r["applied"] for r in replies)
    writes = after["ecstore_control_db_writes_total"] - before["ecstore_control_db_writes_total"]
    batches = after["ecstore_control_db_batches_total"] - before["ecstore_control_db_batches_total"]
    assert writes >= len(stamps)
    assert 1 <= batches < writes, (batches, writes)   # some syncs were shared


def test_purge_racing_a_newer_put_never_loses_the_put(cluster: LocalCluster) -> None:
    """A tombstone is purged while a newer live record arrives: whichever is decided
    first, the live record is what stays (a purge only drops tombstones)."""
    c1 = cluster.nodes["c1"].url

    async def go() -> list[tuple[int, dict]]:
        t = Transport(cluster.secret)
        out = []
        try:
            for i in range(30):
                path = f"/v1/objects/gc-bucket/race{i}"
                await t.request("PUT", c1, path, body=record(10, deleted=True))
                results = await asyncio.gather(
                    t.request("DELETE", c1, path),
                    t.request("PUT", c1, path, body=record(20)),
                    return_exceptions=True)
                assert not isinstance(results[1], BaseException), results[1]
                purge = results[0]
                status = purge.status if not isinstance(purge, BaseException) \
                    else getattr(purge, "status", 409)
                final = unpack((await t.request("GET", c1, path)).body)
                out.append((status, final))
        finally:
            await t.close()
        return out
    for status, final in asyncio.run(go()):
        assert final["ts"] == 20 and not final["deleted"]
        assert status in (204, 409)
