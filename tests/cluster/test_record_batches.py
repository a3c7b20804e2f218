"""Object records in batches (POST /v1/objects on a real control node): each item is
decided as its own PUT would be, a bad item fails alone, and a client's concurrent
writes to one node travel together without one being lost or misanswered."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from cli.localcluster import LocalCluster
from store import metadata
from store.client import Client
from store.errors import NotFound, Unavailable
from store.transport import Transport
from store.wire import pack, unpack
from tests.cluster.conftest import replicas_hold, wait_for


def record(ts: int, **extra: object) -> dict[str, object]:
    return {"ts": ts, "version_id": f"v{ts:08d}", "deleted": False, "size": 0, **extra}


async def post(t: Transport, url: str, items: object,
               path: str = "/v1/objects") -> tuple[int, object]:
    try:
        reply = await t.request("POST", url, path, body=pack(items))
    except Exception as exc:  # noqa: BLE001 - the status is what the test looks at
        return getattr(exc, "status", 0), str(exc)
    return reply.status, unpack(reply.body)


def test_each_item_of_a_batch_is_decided_as_its_own_put(cluster: LocalCluster) -> None:
    c1 = cluster.nodes["c1"].url

    async def go() -> tuple[object, dict, object, int]:
        t = Transport(cluster.secret)
        try:
            await t.request("PUT", c1, "/v1/objects/bkt/old", body=pack(record(500)))
            status, replies = await post(t, c1, [
                ["bkt", "new", pack(record(100)), "A1"],
                ["bkt", "old", pack(record(400)), "A2"],        # older than what is there
                ["Bad_Bucket!", "k", pack(record(100)), None],  # not a bucket name
                ["bkt", "nofields", pack({"ts": 1}), "A4"],     # a record without fields
                ["bkt", "notbytes", record(100), "A5"],         # the record not packed
                ["bkt", "new2", pack(record(101)), "A6"],
            ])
            assert status == 200
            new = unpack((await t.request("GET", c1, "/v1/objects/bkt/new")).body)
            old = unpack((await t.request("GET", c1, "/v1/objects/bkt/old")).body)
            missing = await t.request("GET", c1, "/v1/objects/bkt/nofields", ok_404=True)
            return replies, {"new": new, "old": old}, missing.status, status
        finally:
            await t.close()

    replies, got, missing, _ = asyncio.run(go())
    assert isinstance(replies, list) and [r[0] for r in replies] == [200, 200, 400, 400, 400, 200]
    assert replies[0][1] == {"applied": True, "ts": 100, "version_id": "v00000100"}
    assert replies[1][1] == {"applied": False, "ts": 500, "version_id": "v00000500"}
    assert replies[2][1]["error"] == "bad_request" and "bucket" in replies[2][1]["message"]
    assert "version_id" in replies[3][1]["message"] or "missing" in replies[3][1]["message"]
    assert "packed record" in replies[4][1]["message"]
    assert got["new"]["ts"] == 100 and got["old"]["ts"] == 500
    assert missing == 404
    log = cluster.path.parent / "logs" / "c1.log"
    wait_for(lambda: "batch request_id=" in log.read_text() and
             "items=6 request_ids=A1,A2,A4,A5,A6" in log.read_text(),
             what="the batch's log line")


def test_put_to_gives_each_record_the_nodes_answer_in_a_batch_or_alone(
        cluster: LocalCluster) -> None:
    """MetaQuorum.put_to (the metadata move's and replica repair's copies): many at once
    to one node go in batches, and each caller gets that node's answer - applied or not
    - whether its record went alone or in a batch (the copied count relies on it)."""
    async def go() -> tuple[list[dict], list[dict], int]:
        async with Client.connect(cluster.path) as c:
            node = (await c.cluster_map()).control.nodes[0]
            before = c.meta.batch_stats["put"]

            async def put(i: int, ts: int) -> dict:
                return await c.meta.put_to(node, "putto", f"k{i:02d}", f"/v1/objects/putto/k{i:02d}",
                                           record(ts))
            first = await asyncio.gather(*(put(i, 1000) for i in range(20)))
            again = await asyncio.gather(*(put(i, 900) for i in range(20)))   # older: kept
            return list(first), list(again), c.meta.batch_stats["put"] - before
    first, again, batches = asyncio.run(go())
    assert batches >= 1                                  # some went in a batch
    assert [a.get("applied") for a in first] == [True] * 20, first
    assert [a.get("applied") for a in again] == [False] * 20, again
    assert all(a.get("ts") == 1000 for a in again)


def test_a_batch_read_answers_each_item(cluster: LocalCluster) -> None:
    c3 = cluster.nodes["c3"].url

    async def go() -> tuple[int, object]:
        t = Transport(cluster.secret)
        try:
            await t.request("PUT", c3, "/v1/objects/rbkt/there", body=pack(record(700)))
            try:
                reply = await t.request("POST", c3, "/v1/objects/read", body=pack([
                    ["rbkt", "there", "R1"], ["rbkt", "absent", "R2"], ["No!", "k", "R3"],
                    ["rbkt"], ["rbkt", "there", None]]))
            except Exception as exc:  # noqa: BLE001
                return getattr(exc, "status", 0), str(exc)
            return reply.status, unpack(reply.body)
        finally:
            await t.close()
    status, replies = asyncio.run(go())
    assert status == 200 and isinstance(replies, list)
    assert [r[0] for r in replies] == [200, 404, 400, 400, 200]
    assert unpack(replies[0][1]) == record(700) == unpack(replies[4][1])
    assert replies[1][1]["error"] == "not_found"


@pytest.mark.parametrize("path", ["/v1/objects", "/v1/objects/read"])
@pytest.mark.parametrize("body, why", [
    ({"bkt": "x"}, "list"), ([], "list"), ([["b", "k", b"", "r"]] * 257, "list"),
])
def test_a_batch_that_is_not_a_list_of_items_is_refused(cluster: LocalCluster, body: object,
                                                         why: str, path: str) -> None:
    async def go() -> tuple[int, object]:
        t = Transport(cluster.secret)
        try:
            return await post(t, cluster.nodes["c2"].url, body, path)
        finally:
            await t.close()
    status, reply = asyncio.run(go())
    assert status == 400 and why in str(reply)


def test_an_unsigned_batch_is_refused(cluster: LocalCluster) -> None:
    async def go() -> int:
        async with aiohttp.ClientSession() as s:
            async with s.post(cluster.nodes["c1"].url + "/v1/objects",
                              data=pack([["bkt", "k", pack(record(1)), "x"]])) as r:
                return r.status
    assert asyncio.run(go()) == 401


async def many_puts(cluster: LocalCluster, bucket: str, n: int) -> tuple[dict[str, int], bool]:
    return await asyncio.wait_for(_many_puts(cluster, bucket, n), 120)


async def _many_puts(cluster: LocalCluster, bucket: str, n: int) -> tuple[dict[str, int], bool]:
    async with Client.connect(cluster.path) as c:
        await c.create_bucket(bucket)
        await asyncio.gather(*(c.put(bucket, f"k{i}", f"body {i}".encode()) for i in range(n)))
        got = await asyncio.gather(*(c.get(bucket, f"k{i}") for i in range(n)))
        assert [bytes(g) for g in got] == [f"body {i}".encode() for i in range(n)]
        heads = await asyncio.gather(*(c.head(bucket, f"k{i}") for i in range(n)),
                                     *(c.head(bucket, f"none{i}") for i in range(20)),
                                     return_exceptions=True)
        assert [h.size for h in heads[:n]] == [len(f"body {i}") for i in range(n)]
        assert all(isinstance(h, NotFound) for h in heads[n:])
        single_only = any(b.single_only for b in c.meta._outboxes.values())
        return dict(c.meta.batch_stats), single_only


def test_concurrent_puts_travel_in_batches_and_every_one_lands(cluster: LocalCluster) -> None:
    stats, single_only = asyncio.run(many_puts(cluster, "batched", 300))
    assert not single_only
    assert 0 < stats["put"] < stats["put_records"]     # requests shared by records
    assert 0 < stats["get"] < stats["get_records"]
    # three control nodes, replication 3: every node holds every record
    wait_for(lambda: replicas_hold(cluster, "batched", [f"k{i}" for i in range(300)]),
             what="every replica written")


def test_a_node_without_the_batch_route_gets_the_records_one_by_one(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older control node answers 404 to the batch: the client sends those records
    one by one from then on, and nothing is lost."""
    monkeypatch.setattr(metadata, "BATCH_PATHS", {"put": "/v1/no-such-route",
                                                  "get": "/v1/no-such-route-either"})
    stats, single_only = asyncio.run(many_puts(cluster, "unbatched", 200))
    assert single_only and stats["put"] == stats["get"] == 0
    wait_for(lambda: replicas_hold(cluster, "unbatched", [f"k{i}" for i in range(200)]),
             what="every replica written")


def test_batched_puts_go_on_with_a_control_node_down(cluster: LocalCluster,
                                                     all_up: LocalCluster) -> None:
    cluster.kill_node("c3")
    stats, _ = asyncio.run(many_puts(cluster, "degraded", 200))
    assert stats["put"] > 0 and stats["get"] > 0
    assert replicas_hold(cluster, "degraded", [f"k{i}" for i in range(200)])


def test_puts_fail_clearly_when_no_quorum_is_left(cluster: LocalCluster,
                                                  all_up: LocalCluster) -> None:
    async def go() -> list[BaseException | None]:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("quorumless")
            await c.cluster_map()
            cluster.kill_node("c2")
            cluster.kill_node("c3")
            return await asyncio.gather(*(c.put("quorumless", f"q{i}", b"x")
                                          for i in range(20)), return_exceptions=True)
    results = asyncio.run(asyncio.wait_for(go(), 120))
    assert results and all(isinstance(r, Unavailable) for r in results)


def test_a_stalled_node_does_not_gather_a_queue_without_bound(cluster: LocalCluster) -> None:
    """A control node that stops answering (SIGSTOP) gets one request that hangs; what
    queues behind it fails once it has waited a request's timeout (5 s) instead of
    going out 64 at a time, each batch waiting its own 5 s. The puts themselves
    succeed on the other two replicas all along."""
    c3 = cluster.nodes["c3"]
    assert c3.pid is not None

    async def go() -> tuple[int, float]:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("stalled")
            os.kill(c3.pid, signal.SIGSTOP)
            try:
                for wave in range(30):          # 300 puts, all acknowledged by c1 and c2
                    await asyncio.gather(*(c.put("stalled", f"k{wave}-{i}", b"x")
                                           for i in range(10)))
                box = c.meta._outboxes[("put", c3.url)]
                peak = len(box.queue)
                t0 = time.monotonic()
                for _ in range(150):            # at most 15 s
                    if not box.queue and not box.busy:
                        break
                    await asyncio.sleep(0.1)
                return peak, time.monotonic() - t0
            finally:
                os.kill(c3.pid, signal.SIGCONT)
    peak, drained_s = asyncio.run(asyncio.wait_for(go(), 120))
    assert peak > 64        # more than one batch waited behind the hung request
    assert drained_s < 11   # two timeouts at most, not one per batch of 64
