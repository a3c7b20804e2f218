"""Multipart uploads in the client library: parts are extents that reads, repair and
garbage collection all follow; an upload in progress keeps its parts."""
from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
from typing import Any

from cli.localcluster import LocalCluster
from store import multipart as mp
from store.client import Client, SyncClient
from store.gc import prepare_gc
from store.repair import prepare_repair
from tests.cluster.test_gc import fragments_on_disk, of_version

MIB = 1024 * 1024


def run(cluster: LocalCluster, fn: Any) -> Any:
    async def go() -> Any:
        async with Client.connect(cluster.path) as c:
            return await fn(c)
    return asyncio.run(go())


async def upload(c: Client, bucket: str, key: str, parts: dict[int, bytes],
                 complete: bool = True) -> tuple[str, dict[str, Any] | None]:
    uid = await mp.create_upload(c, bucket, key, content_type="x/y", meta={"a": "b"})
    etags = {}
    for n, data in parts.items():
        info = await mp.put_part(c, bucket, uid, n, data, lambda d=data: hashlib.md5(d).hexdigest())
        etags[n] = info.etag
    if not complete:
        return uid, None
    return uid, await mp.complete(c, bucket, uid, sorted(etags.items()))


def test_parts_read_back_whole_and_across_boundaries(cluster: LocalCluster,
                                                     client: SyncClient) -> None:
    client.create_bucket("mp-read")
    rnd = random.Random(7)
    parts = {1: rnd.randbytes(5 * MIB + 3), 2: rnd.randbytes(5 * MIB), 3: rnd.randbytes(7)}
    whole = parts[1] + parts[2] + parts[3]
    _, rec = run(cluster, lambda c: upload(c, "mp-read", "obj", parts))
    assert rec is not None and rec["size"] == len(whole) and rec["etag"].endswith("-3")
    assert client.get("mp-read", "obj") == whole
    b1 = len(parts[1])
    for lo, hi in ((b1 - 10, b1 + 10), (0, 4 * MIB + 1), (len(whole) - 8, len(whole) - 1),
                   (4 * MIB - 1, 2 * b1)):
        assert client.get("mp-read", "obj", lo, hi) == whole[lo:hi + 1], (lo, hi)
    info = client.head("mp-read", "obj")
    assert info.content_type == "x/y" and info.meta == {"a": "b"}


def test_gc_keeps_live_and_in_progress_parts_and_drops_aborted_and_replaced(
        cluster: LocalCluster, client: SyncClient) -> None:
    client.create_bucket("mp-gc")
    data = os.urandom(5 * MIB)

    async def scenario(c: Client) -> dict[str, Any]:
        _, done = await upload(c, "mp-gc", "done", {1: data, 2: b"tail"})
        open_id, _ = await upload(c, "mp-gc", "open", {1: data[:MIB]}, complete=False)
        first = (await c.read_record("_parts", mp.part_key(open_id, 1)))["version_id"]
        await mp.put_part(c, "mp-gc", open_id, 1, b"newer", lambda: hashlib.md5(b"newer").hexdigest())
        aborted_id, _ = await upload(c, "mp-gc", "aborted", {1: data[:MIB]}, complete=False)
        aborted = (await c.read_record("_parts", mp.part_key(aborted_id, 1)))["version_id"]
        await mp.abort(c, "mp-gc", aborted_id)
        worker = await prepare_gc(c, grace_s=0.0)
        while await worker.step():
            pass
        return {"done": done, "open_id": open_id, "replaced": first, "aborted": aborted}
    r = run(cluster, scenario)
    for p in r["done"]["parts"]:
        assert len(of_version(cluster, p["version_id"])) == 6 * p["segments"]
    assert not of_version(cluster, r["replaced"]) and not of_version(cluster, r["aborted"])
    assert client.get("mp-gc", "done") == data + b"tail"
    parts, _ = run(cluster, lambda c: mp.list_parts(c, r["open_id"]))
    assert [(p.number, p.size) for p in parts] == [(1, 5)]
    ups = run(cluster, lambda c: mp.list_uploads(c, "mp-gc"))
    assert [u["key"] for u in ups] == ["open"]


def test_repair_rebuilds_fragments_of_every_part(cluster: LocalCluster, client: SyncClient) -> None:
    client.create_bucket("mp-repair")
    data = {1: os.urandom(5 * MIB), 2: os.urandom(2 * MIB)}
    _, rec = run(cluster, lambda c: upload(c, "mp-repair", "obj", data))
    vids = [p["version_id"] for p in rec["parts"]]
    before = {v: of_version(cluster, v) for v in vids}
    victim = next(n for n in cluster.nodes.values() if n.role == "storage")
    cluster.kill_node(victim.id)
    shutil.rmtree(victim.data)
    cluster.start_node(victim.id)
    cluster.wait_healthy([victim.id])
    assert any(of_version(cluster, v) != before[v] for v in vids)  # something was lost

    async def repair(c: Client) -> Any:
        worker = await prepare_repair(c)
        while await worker.step():
            pass
        return worker.report
    report = run(cluster, repair)
    assert report.fragments_rebuilt > 0 and not report.unrecoverable
    assert {v: of_version(cluster, v) for v in vids} == before
    assert client.get("mp-repair", "obj") == data[1] + data[2]
    assert fragments_on_disk(cluster)
