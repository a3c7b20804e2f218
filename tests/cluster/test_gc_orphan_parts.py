"""Garbage collection of part records whose upload record is gone (orphan parts): what a
gateway killed mid-way through a complete or abort left under the order of forgetting
before 2f8eaa8 (the upload first, the parts after). gc takes their fragments, then their
records, once older than its grace, and never a byte of a live upload or object.

Real node processes (`running_cluster`); the leaked state is built through the client
library and the control nodes' HTTP API, as the old code's crash left it."""
from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store import multipart as mp
from store.client import Client, new_version_id
from store.names import PARTS_BUCKET, UPLOADS_BUCKET
from store.transport import quote_key
from store.wire import unpack
from tests.cluster.conftest import running_cluster, wait_for
from tests.cluster.test_gc import gc_json, of_version

pytestmark = pytest.mark.cluster

MIB = 1024 * 1024
BUCKET = "orphans"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster("ecstore-orphans-", request.config.getoption("--keep-tmp"),
                         storage=6, control=3, k=4, m=2, gateway=False) as c:
        asyncio.run(_on(c, lambda lib: lib.create_bucket(BUCKET)))
        yield c


async def _on(cluster: LocalCluster, fn: Callable[[Client], Awaitable[Any]]) -> Any:
    async with Client.connect(cluster.path) as c:
        return await fn(c)


def run(cluster: LocalCluster, fn: Callable[[Client], Awaitable[Any]]) -> Any:
    return asyncio.run(_on(cluster, fn))


async def start_upload(c: Client, key: str, parts: dict[int, bytes]) -> tuple[str, dict[int, str]]:
    """An upload with `parts` put (not completed): (its id, {part number: version id})."""
    uid = await mp.create_upload(c, BUCKET, key, content_type="x/y", meta={})
    for n, data in parts.items():
        await mp.put_part(c, BUCKET, uid, n, data, lambda d=data: hashlib.md5(d).hexdigest())
    versions = {}
    for n in parts:
        rec = await c.read_record(PARTS_BUCKET, mp.part_key(uid, n))
        assert rec is not None and not rec["deleted"]
        versions[n] = rec["version_id"]
    return uid, versions


def requested(parts: dict[int, bytes]) -> list[tuple[int, str]]:
    return [(n, hashlib.md5(d).hexdigest()) for n, d in sorted(parts.items())]


async def old_forget_cut_short(c: Client, upload_id: str) -> None:
    """What the old forgetting did first - the upload's record tombstoned - and then the
    gateway was killed: its part records stay, no upload names them."""
    await c.commit(UPLOADS_BUCKET, mp.upload_key(BUCKET, upload_id),
                   {"ts": time.time_ns(), "version_id": new_version_id(), "deleted": True})


async def purge_upload_record(c: Client, upload_id: str) -> None:
    """The upload's tombstone purged from every control replica (an earlier gc did it):
    no record of the upload at all, only its parts'."""
    key = mp.upload_key(BUCKET, upload_id)
    path = f"/v1/objects/{UPLOADS_BUCKET}/{quote_key(key)}"
    nodes = (await c.cluster_map()).control_nodes_for(f"{UPLOADS_BUCKET}/{key}")
    deadline = time.monotonic() + 20
    for node in nodes:
        while True:            # the third replica's copy of the tombstone may lag the ack
            reply = await c.t.request("GET", node.address, path, ok_404=True)
            if reply.status == 200 and unpack(reply.body)["deleted"]:
                vid = unpack(reply.body)["version_id"]
                await c.t.request("DELETE", node.address, path, query={"version_id": vid})
                break
            assert time.monotonic() < deadline, f"{node.id} never got the tombstone"
            await asyncio.sleep(0.05)
    for node in nodes:
        assert (await c.t.request("GET", node.address, path, ok_404=True)).status == 404


def part_numbers(cluster: LocalCluster, upload_id: str) -> list[int]:
    parts, _ = run(cluster, lambda c: mp.list_parts(c, upload_id))
    return [p.number for p in parts]


def test_gc_takes_the_parts_no_upload_names_and_keeps_every_live_byte(
        cluster: LocalCluster) -> None:
    rnd = random.Random(11)
    done_data = {1: rnd.randbytes(5 * MIB), 2: rnd.randbytes(1000)}
    cut_data = {1: rnd.randbytes(5 * MIB), 2: rnd.randbytes(3000)}
    aborted_data = {1: rnd.randbytes(200_000), 2: rnd.randbytes(100_000)}
    purged_data = {1: rnd.randbytes(150_000)}
    open_data = {1: rnd.randbytes(5 * MIB), 2: rnd.randbytes(2000)}

    async def build(c: Client) -> dict[str, Any]:
        done_id, _ = await start_upload(c, "done", done_data)           # completed, whole
        await mp.complete(c, BUCKET, done_id, requested(done_data))
        # a complete cut short by the old order: the object committed, the upload
        # tombstoned, the gateway killed before the parts: their records as they were
        cut_id, cut_versions = await start_upload(c, "cut", cut_data)
        saved = [await c.read_record(PARTS_BUCKET, mp.part_key(cut_id, n)) for n in cut_data]
        await mp.complete(c, BUCKET, cut_id, requested(cut_data))
        for rec in saved:      # past the tombstones the complete wrote
            assert rec is not None
            await c.commit(PARTS_BUCKET, mp.part_key(cut_id, rec["part"]),
                           {**rec, "ts": time.time_ns()})
        # an abort cut short by the old order: the upload tombstoned, the parts left
        aborted_id, aborted_versions = await start_upload(c, "aborted", aborted_data)
        await old_forget_cut_short(c, aborted_id)
        # the same, and a gc since purged the upload's tombstone: no upload record at all
        purged_id, purged_versions = await start_upload(c, "purged", purged_data)
        await old_forget_cut_short(c, purged_id)
        await purge_upload_record(c, purged_id)
        open_id, open_versions = await start_upload(c, "open", open_data)   # in progress
        return {"cut": (cut_id, cut_versions), "aborted": (aborted_id, aborted_versions),
                "purged": (purged_id, purged_versions), "open": (open_id, open_versions)}
    ids = run(cluster, build)
    cut_id, aborted_id, purged_id, open_id = (ids[k][0] for k in ("cut", "aborted", "purged", "open"))
    assert part_numbers(cluster, cut_id) == [1, 2]
    assert part_numbers(cluster, aborted_id) == [1, 2] and part_numbers(cluster, purged_id) == [1]
    collected = [*ids["aborted"][1].values(), *ids["purged"][1].values()]   # one segment each
    kept = [*ids["cut"][1].values(), *ids["open"][1].values()]
    on_disk = {v: of_version(cluster, v) for v in collected + kept}
    assert all(len(on_disk[v]) == 6 for v in collected)

    dry = gc_json(cluster, "--dry-run", "--grace", "0")
    assert (dry["orphan_parts"], dry["orphan_parts_young"]) == (5, 0)
    assert dry["orphan_part_fragments"] == 6 * len(collected)     # the cut parts' are live
    assert dry["orphan_parts_forgotten"] == 0 and dry["fragments_deleted"] == 0
    assert {v: of_version(cluster, v) for v in on_disk} == on_disk   # a dry run deletes nothing
    assert part_numbers(cluster, aborted_id) == [1, 2] and part_numbers(cluster, cut_id) == [1, 2]

    rep = gc_json(cluster, "--grace", "0")
    assert all(of_version(cluster, v) == set() for v in collected)
    assert all(of_version(cluster, v) == on_disk[v] for v in kept)
    for uid in (cut_id, aborted_id, purged_id):
        assert part_numbers(cluster, uid) == []
    assert part_numbers(cluster, open_id) == [1, 2]
    assert (rep["orphan_parts"], rep["orphan_parts_forgotten"]) == (5, 5)
    assert rep["orphan_part_fragments"] == 6 * len(collected)
    assert rep["fragments_deleted"] >= 6 * len(collected) and rep["error_count"] == 0

    again = gc_json(cluster, "--grace", "0")
    assert (again["orphan_parts"], again["orphan_parts_young"]) == (0, 0)
    assert again["error_count"] == 0

    async def read_back(c: Client) -> dict[str, bytes]:
        await mp.complete(c, BUCKET, open_id, requested(open_data))
        return {k: await c.get(BUCKET, k) for k in ("done", "cut", "open")}
    got = run(cluster, read_back)
    assert got["done"] == done_data[1] + done_data[2]
    assert got["cut"] == cut_data[1] + cut_data[2]
    assert got["open"] == open_data[1] + open_data[2]


def test_gc_keeps_a_part_no_upload_names_while_younger_than_the_grace(
        cluster: LocalCluster) -> None:
    data = random.Random(12).randbytes(300_000)

    async def build(c: Client) -> tuple[str, str]:
        uid, versions = await start_upload(c, "young", {1: data})
        await old_forget_cut_short(c, uid)
        return uid, versions[1]
    uid, vid = run(cluster, build)
    assert len(of_version(cluster, vid)) == 6
    started = time.monotonic()

    rep = gc_json(cluster, "--grace", "60")
    assert (rep["orphan_parts"], rep["orphan_parts_young"]) == (0, 1)
    assert rep["orphan_parts_forgotten"] == 0 and rep["orphan_part_fragments"] == 0
    assert len(of_version(cluster, vid)) == 6 and part_numbers(cluster, uid) == [1]

    wait_for(lambda: time.monotonic() - started > 2.5, what="the part to age")
    rep = gc_json(cluster, "--grace", "2")                   # older than this grace now
    assert of_version(cluster, vid) == set() and part_numbers(cluster, uid) == []
    assert (rep["orphan_parts"], rep["orphan_parts_forgotten"]) == (1, 1)


def test_an_orphan_part_is_as_old_as_its_youngest_time() -> None:
    """plan_orphan_parts (pure): the record's ts, its version and its upload id all count;
    an upload that is listed keeps its parts whatever their age; ids not ours are kept."""
    from store.gc import plan_orphan_parts  # here: the cluster tests run on any version
    s = 1_000_000_000
    now = 10_000 * s

    def vid(t_ns: int) -> str:
        return f"{t_ns:016x}" + "0" * 16
    old_upload, young_upload = vid(now - 100 * s), vid(now - 5 * s)

    def part(upload_id: str, version_t: int, ts: int) -> mp.RecordedPart:
        return mp.RecordedPart(upload_id, mp.part_key(upload_id, 1), vid(version_t), ts)
    old = part(old_upload, now - 90 * s, now - 80 * s)
    young_record = part(old_upload, now - 90 * s, now - 5 * s)
    young_version = part(vid(now - 99 * s), now - 5 * s, now - 80 * s)
    young_id = part(young_upload, now - 90 * s, now - 80 * s)
    not_ours = mp.RecordedPart("x", "x/00001", "y", 0)
    listed = part(vid(now - 98 * s), now - 90 * s, now - 80 * s)
    parts = [old, young_record, young_version, young_id, not_ours, listed]
    collect, keep = plan_orphan_parts(parts, {listed.upload_id}, now, 60.0)
    assert collect == [old] and keep == [young_record, young_version, young_id, not_ours]
    assert plan_orphan_parts(parts, set(), now, 1.0) == ([p for p in parts if p is not not_ours],
                                                         [not_ours])
