"""Garbage collection: dead fragments and old tombstones go, live objects never lose a byte."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient
from store.errors import NotFound, Unavailable
from store.gc import prepare_gc
from store.transport import quote_key
from tests.cluster.conftest import wait_for
from tests.functional import harness

ROOT = Path(__file__).resolve().parents[2]


def run_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=120)


def gc_json(cluster: LocalCluster, *args: str) -> dict[str, object]:
    proc = run_cli(cluster, "gc", "--json", "--force", *args)   # graces under 60 s: no put runs
    assert proc.returncode == 0, proc.stderr.decode() + proc.stdout.decode()
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def fragments_on_disk(cluster: LocalCluster) -> set[str]:
    """Ids of the fragments stored on any storage node's disk (read from the volume
    files, not asked of the nodes)."""
    out: set[str] = set()
    for n in cluster.nodes.values():
        if n.role == "storage":
            out.update(harness.fragments_on_disk(n.data))
    return out


def of_version(cluster: LocalCluster, vid: str) -> set[str]:
    return {f for f in fragments_on_disk(cluster) if f.startswith(vid + ".")}


def control_records(cluster: LocalCluster, bucket: str, key: str) -> list[dict[str, object] | None]:
    """The record each control node holds, read directly (no quorum, no read repair)."""
    async def go() -> list[dict[str, object] | None]:
        from store.wire import unpack
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map()
            out = []
            for node in cmap.control_nodes_for(f"{bucket}/{key}"):
                r = await c.t.request("GET", node.address, f"/v1/objects/{bucket}/{quote_key(key)}",
                                      ok_404=True)
                out.append(None if r.status == 404 else unpack(r.body))
            return out
    return asyncio.run(go())


def test_overwritten_and_deleted_fragments_and_tombstones_go(cluster: LocalCluster,
                                                             client: SyncClient) -> None:
    client.create_bucket("gc-basic")
    client.put("gc-basic", "kept", b"k" * 200_000)
    client.put("gc-basic", "over", os.urandom(300_000))
    old = client.head("gc-basic", "over").version_id
    new_value = os.urandom(250_000)
    client.put("gc-basic", "over", new_value)
    new = client.head("gc-basic", "over").version_id
    client.put("gc-basic", "gone", os.urandom(150_000))
    gone = client.head("gc-basic", "gone").version_id
    client.delete("gc-basic", "gone")
    client.put("gc-basic", "tiny", b"inline")        # inline: only a tombstone to purge
    client.delete("gc-basic", "tiny")
    kept = client.head("gc-basic", "kept").version_id
    assert len(of_version(cluster, old)) == 6 and len(of_version(cluster, gone)) == 6

    dry = gc_json(cluster, "--dry-run")                 # default grace: everything is young
    assert dry["fragments_deleted"] == 0 and dry["kept_young"] >= 12
    dry0 = gc_json(cluster, "--dry-run", "--grace", "0")
    assert dry0["fragments_garbage"] >= 12 and dry0["fragments_deleted"] == 0
    assert dry0["tombstones_purged"] == 0
    assert len(of_version(cluster, old)) == 6           # a dry run deletes nothing

    # every replica written (a quorum of 2 acknowledged, the third is written after): a
    # replica still holding "over"'s old record keeps its fragments live for this gc
    def settled() -> bool:
        return (all(r is not None and r["version_id"] == new
                    for r in control_records(cluster, "gc-basic", "over"))
                and all(r is not None and r["deleted"] for key in ("gone", "tiny")
                        for r in control_records(cluster, "gc-basic", key)))
    wait_for(settled, what="every replica to hold the overwrite and the tombstones")
    refused = run_cli(cluster, "gc", "--json", "--grace", "0")
    assert refused.returncode == 2 and b"--force if no put runs" in b" ".join(refused.stderr.split())
    assert len(of_version(cluster, old)) == 6           # refused: nothing deleted
    warned = run_cli(cluster, "gc", "--json", "--grace", "0", "--force")
    said = b" ".join(warned.stderr.split())
    assert b"a grace of 0 s deletes the fragments of any put or tiering move still in " \
        b"progress" in said and b"acknowledged without them, and the object is lost" in said
    rep = json.loads(warned.stdout)
    assert rep["fragments_deleted"] >= 12
    # the bytes the deleted fragments held, as the storage nodes say (it read null): at
    # least the 6 fragments of each dead version, header and payload (k = 4)
    least = 6 * (80 + 300_000 // 4) + 6 * (80 + 150_000 // 4)
    assert least <= rep["bytes_deleted"], rep
    if rep["fragments_deleted"] == 12:      # those only: each record's own header on top
        assert rep["bytes_deleted"] <= least + 12 * 512, rep
    assert dry0["bytes_deleted"] is None                # a dry run deletes nothing
    assert of_version(cluster, old) == set() and of_version(cluster, gone) == set()
    assert len(of_version(cluster, new)) == 6 and len(of_version(cluster, kept)) == 6
    if rep["tombstones_repaired"]:                      # a replica lacked it: purged next run
        gc_json(cluster, "--grace", "0")
    for key in ("gone", "tiny"):
        assert control_records(cluster, "gc-basic", key) == [None, None, None]
    assert client.get("gc-basic", "over") == new_value
    assert client.get("gc-basic", "kept") == b"k" * 200_000
    with pytest.raises(NotFound):
        client.head("gc-basic", "gone")
    again = gc_json(cluster, "--grace", "0")
    assert again["fragments_deleted"] == 0 and again["tombstones_seen"] == 0


def test_young_tombstone_kept_and_lagging_replica_repaired_first(cluster: LocalCluster,
                                                                 client: SyncClient) -> None:
    client.create_bucket("gc-tomb")
    client.put("gc-tomb", "k", b"x")
    client.delete("gc-tomb", "k")
    # the third replica's tombstone is written after the quorum's answer
    wait_for(lambda: all(r is not None and r["deleted"]
                         for r in control_records(cluster, "gc-tomb", "k")),
             what="every replica to hold the tombstone")
    assert gc_json(cluster)["tombstones_young"] >= 1    # default grace: kept
    assert all(r is not None and r["deleted"] for r in control_records(cluster, "gc-tomb", "k"))

    async def drop_one() -> None:                       # a replica that missed the tombstone
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map()
            node = cmap.control_nodes_for("gc-tomb/k")[0]
            await c.t.request("DELETE", node.address, "/v1/objects/gc-tomb/k")
    asyncio.run(drop_one())
    rep = gc_json(cluster, "--grace", "0")
    assert rep["tombstones_repaired"] >= 1
    recs = control_records(cluster, "gc-tomb", "k")
    assert all(r is not None and r["deleted"] for r in recs)   # written back, not purged
    gc_json(cluster, "--grace", "0")
    assert control_records(cluster, "gc-tomb", "k") == [None, None, None]


WRITER = textwrap.dedent("""
    import asyncio, sys
    from store.client import Client
    async def slow():
        for i in range(400):
            yield bytes([i % 251]) * (1024 * 1024)
            if i == 6:
                print("streaming", flush=True)
            await asyncio.sleep(0.05)
    async def main():
        async with Client.connect(sys.argv[1]) as c:
            await c.put("gc-kill", sys.argv[2], slow())
    asyncio.run(main())
""")


def test_killed_put_fragments_removed_after_grace(cluster: LocalCluster,
                                                  client: SyncClient) -> None:
    client.create_bucket("gc-kill")
    before = fragments_on_disk(cluster)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(cluster.path), "big"],
                            stdout=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None
    assert proc.stdout.readline().decode().strip() == "streaming"
    wait_for(lambda: len(fragments_on_disk(cluster) - before) >= 6, what="fragments of the put")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    orphans = fragments_on_disk(cluster) - before
    assert orphans and len({f.split(".")[0] for f in orphans}) == 1
    proc = run_cli(cluster, "gc", "--json", "--grace", "60")   # younger than the grace: kept
    assert proc.returncode == 0, proc.stderr.decode()
    # from a grace of 60 s puts are safe (they tell gc they run): the warning names what a
    # short grace costs - the readers of old versions - not lost puts
    said = b" ".join(proc.stderr.split())
    assert b"a reader still reading it then" in said and b"object is lost" not in said, said
    rep = json.loads(proc.stdout)
    assert rep["kept_young"] >= len(orphans)
    assert orphans <= fragments_on_disk(cluster)
    time.sleep(1.1)
    rep = gc_json(cluster, "--grace", "1")
    assert rep["fragments_deleted"] >= len(orphans)
    assert not orphans & fragments_on_disk(cluster)


def test_gc_racing_overwrites_and_deletes_loses_nothing(cluster: LocalCluster,
                                                        client: SyncClient) -> None:
    """Writers overwrite and delete while gc runs again and again; every ack holds."""
    grace_s = 2.0          # longer than any put here: see store/gc.py on why it must be
    bucket = "gc-race"
    client.create_bucket(bucket)
    rng = random.Random(7)
    n_writers, keys_each, run_s, max_ops = 4, 3, 8.0, 60
    model: dict[str, bytes | None] = {}
    failures: list[str] = []
    stats = {"gc_runs": 0, "deleted": 0, "purged": 0, "ops": 0}

    def value() -> bytes:
        size = rng.choice([500, 70_000, 200_000, 600_000])
        return os.urandom(size)

    async def writer(c: Client, w: int, stop_at: float) -> None:
        keys = [f"w{w}-k{i}" for i in range(keys_each)]
        for _ in range(max_ops):
            if time.monotonic() > stop_at:
                return
            key = rng.choice(keys)
            if model.get(key) is not None and rng.random() < 0.3:
                await c.delete(bucket, key)
                model[key] = None
                try:
                    await c.head(bucket, key)
                    failures.append(f"{key} readable after its delete")
                except NotFound:
                    pass
            else:
                data = value()
                await c.put(bucket, key, data)
                model[key] = data
                if await c.get(bucket, key) != data:
                    failures.append(f"{key} read back wrong right after its put")
            stats["ops"] += 1

    async def collector(c: Client, stop_at: float) -> None:
        for _ in range(40):                 # bounded
            if time.monotonic() > stop_at:
                return
            worker = await prepare_gc(c, grace_s)
            rep = await worker.run()
            stats["gc_runs"] += 1
            stats["deleted"] += rep.fragments_deleted
            stats["purged"] += rep.tombstones_purged
            await asyncio.sleep(0.05)

    async def check_all(c: Client, when: str) -> None:
        for key, data in sorted(model.items()):
            if data is None:
                try:
                    await c.head(bucket, key)
                    failures.append(f"{when}: deleted {key} is back")
                except NotFound:
                    pass
            else:
                got = await c.get(bucket, key)
                if got != data:
                    failures.append(f"{when}: {key} has {len(got)} bytes, wrong content")

    async def main() -> None:
        async with Client.connect(cluster.path) as wc, Client.connect(cluster.path) as gcc:
            stop_at = time.monotonic() + run_s
            await asyncio.gather(collector(gcc, stop_at),
                                 *(writer(wc, w, stop_at) for w in range(n_writers)))
            await check_all(wc, "after the race")
            await (await prepare_gc(gcc, 0.0)).run()  # quiescent: even grace 0 is safe now
            await check_all(wc, "after a final gc with grace 0")
    started = time.monotonic()
    asyncio.run(main())
    assert failures == []
    assert stats["gc_runs"] >= 2 and stats["ops"] >= 20
    assert stats["deleted"] > 0                       # it did collect while racing
    assert time.monotonic() - started < 30


def plant_stray(cluster: LocalCluster, client: SyncClient, key: str,
                data: bytes) -> tuple[str, str]:
    """Put strays/key, then a copy of its fragment 0 on a node that is not its home:
    (that node's id, the version)."""
    if "strays" not in client.list_buckets():
        client.create_bucket("strays")
    client.put("strays", key, data)

    async def plant() -> tuple[str, str]:
        async with Client.connect(cluster.path) as c:
            rec = await c.live_record("strays", key)
            cmap = await c.cluster_map()
            from store.client import expected_fragment_nodes
            homes = {n.id for n in expected_fragment_nodes(cmap, rec, 0)}
            away = next(n for n in cmap.all_storage_nodes() if n.id not in homes) \
                if len(homes) < len(cmap.all_storage_nodes()) else None
            fid = f"{rec['version_id']}.0.0"
            home = expected_fragment_nodes(cmap, rec, 0)[0]
            body = await c.get_fragment(home, fid)
            # no node is free of this segment with 6 nodes and 4+2: put the copy of
            # fragment 0 on the node of fragment 1 instead (not its home either)
            target = away or expected_fragment_nodes(cmap, rec, 0)[1]
            await c.put_fragment(target, fid, body, {"bucket": "strays", "key": key})
            return target.id, rec["version_id"]
    return asyncio.run(plant())


def test_a_stray_copy_of_a_live_fragment_is_removed_and_nothing_else(
        cluster: LocalCluster, client: SyncClient) -> None:
    """A straggler's fragment that its stalled node wrote after the client had given it to
    a handoff node: a copy no reader looks at. gc removes it (older than the grace) and
    keeps every fragment the record points to."""
    data = os.urandom(5 * 1024 * 1024)
    target, version = plant_stray(cluster, client, "obj", data)
    before = of_version(cluster, version)
    rep = gc_json(cluster, "--grace", "0")
    assert rep["fragments_stray"] == 1, rep
    assert client.get("strays", "obj") == data
    node = cluster.nodes[target]
    assert f"{version}.0.0" not in harness.fragments_on_disk(node.data), \
        "the stray copy is still on disk"
    assert of_version(cluster, version) == before  # every fragment the record names stays
    proc = run_cli(cluster, "repair", "--dry-run", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["fragments_missing"] == 0
    rep = gc_json(cluster, "--grace", "0")
    assert rep["fragments_stray"] == 0


def test_strays_are_kept_when_the_map_changes_while_gc_runs(
        cluster: LocalCluster, client: SyncClient) -> None:
    """Where a fragment belongs depends on the map: gc planned with one map, the map
    changed (a ring change, then a rebalance moving fragments) before it deleted - so a
    copy it planned as stray may be where the fragment now belongs. It keeps every stray
    (counted, and said as an error), deletes nothing else it should not, and the next run
    on a settled map removes the stray."""
    data = os.urandom(5 * 1024 * 1024)
    target, version = plant_stray(cluster, client, "moved", data)

    async def gc_across_a_map_change() -> dict[str, Any]:
        async with Client.connect(cluster.path) as c:
            worker = await prepare_gc(c, 0.0)
            assert len(worker.strays) == 1
            cmap = await c.cluster_map(refresh=True)
            await c.publish_map(cmap.bump())        # a new epoch, as a ring change makes
            return (await worker.run()).to_dict()
    rep = asyncio.run(gc_across_a_map_change())
    assert rep["strays_kept"] == 1 and rep["fragments_deleted"] == 0, rep
    assert any("map changed" in e for e in rep["errors"])
    assert f"{version}.0.0" in harness.fragments_on_disk(cluster.nodes[target].data)
    assert client.get("strays", "moved") == data
    rep = gc_json(cluster, "--grace", "0")
    assert rep["fragments_stray"] == 1 and rep["strays_kept"] == 0, rep
    assert f"{version}.0.0" not in harness.fragments_on_disk(cluster.nodes[target].data)
    assert client.get("strays", "moved") == data


def test_a_put_whose_fragments_gc_took_fails_instead_of_committing(
        cluster: LocalCluster, client: SyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc takes the fragments of a version that is not committed and older than its grace
    for a dead put's. A put running longer than that grace (here: gc with grace 0 between
    its first segment and the rest) used to commit anyway - acknowledged, unreadable. A
    put that ran past VERIFY_AFTER_S checks its fragments first: it fails, nothing is
    committed, the key stays as it was."""
    import store.client_put as client_module  # where the put path reads them
    monkeypatch.setattr(client_module, "VERIFY_AFTER_S", 0.5)
    if "long-puts" not in client.list_buckets():
        client.create_bucket("long-puts")
    seg = 4 * 1024 * 1024

    async def put_across_a_gc() -> str:
        async with Client.connect(cluster.path) as c, Client.connect(cluster.path) as other:
            async def source() -> Any:
                yield os.urandom(seg)                 # segment 0: written meanwhile
                await asyncio.sleep(1.0)
                await (await prepare_gc(other, 0.0)).run()    # takes segment 0's fragments
                yield os.urandom(seg)
            try:
                await c.put("long-puts", "slow", source())
            except Unavailable as exc:
                return exc.message
            return "acknowledged"
    said = asyncio.run(put_across_a_gc())
    assert "were deleted while the put ran" in said, said
    with pytest.raises(NotFound):
        client.head("long-puts", "slow")


def test_a_put_that_told_gc_it_runs_keeps_its_fragments_whatever_the_grace(
        cluster: LocalCluster, client: SyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put running past INTENT_AFTER_S keeps a record in PUTS_BUCKET (refreshed while it
    runs) that gc reads before the object records: gc with grace 0 in the middle of the
    put keeps its fragments, the put commits and reads back whole. Once the record has
    expired, the next gc tombstones it."""
    import store.client_put as client_module  # where the put path reads them
    from store.names import PUTS_BUCKET
    monkeypatch.setattr(client_module, "INTENT_AFTER_S", 0.2)
    monkeypatch.setattr(client_module, "INTENT_REFRESH_S", 0.3)
    monkeypatch.setattr(client_module, "INTENT_TTL_S", 1.5)
    if "long-puts" not in client.list_buckets():
        client.create_bucket("long-puts")
    parts = [os.urandom(4 * 1024 * 1024) for _ in range(3)]

    async def put_across_a_gc() -> tuple[dict[str, Any], str]:
        async with Client.connect(cluster.path) as c, Client.connect(cluster.path) as other:
            async def source() -> Any:
                yield parts[0]
                await asyncio.sleep(1.0)             # told by now (after 0.2 s)
                report = await (await prepare_gc(other, 0.0)).run()
                yield parts[1]
                yield parts[2]
                seen.append(report.to_dict())
            seen: list[dict[str, Any]] = []
            info = await c.put("long-puts", "told", source())
            return seen[0], info.version_id
    report, version = asyncio.run(put_across_a_gc())
    assert report["puts_running"] == 1, report
    assert client.get("long-puts", "told") == b"".join(parts)

    async def intent() -> dict[str, Any] | None:
        async with Client.connect(cluster.path) as c:
            return await c.read_record(PUTS_BUCKET, version)
    told = asyncio.run(intent())
    assert told is not None and not told["deleted"] and told["put_version"] == version
    time.sleep(1.6)                                   # past INTENT_TTL_S: expired
    gc_json(cluster, "--grace", "3600")
    told = asyncio.run(intent())
    assert told is not None and told["deleted"]


def gc_clock(monkeypatch: pytest.MonkeyPatch, now_ns: int) -> None:
    """gc's clock set to now_ns (so a slow machine cannot age what a test looks at)."""
    from types import SimpleNamespace

    from store import gc as store_gc
    clock = SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    clock.time_ns = lambda: now_ns
    monkeypatch.setattr(store_gc, "time", clock)


async def replicas(c: Client, bucket: str, key: str) -> list[dict[str, Any] | None]:
    """The record each control node the ring places bucket/key on holds, read directly."""
    from store.wire import unpack
    out = []
    for node in (await c.cluster_map()).control_nodes_for(f"{bucket}/{key}"):
        r = await c.t.request("GET", node.address, f"/v1/objects/{bucket}/{key}", ok_404=True)
        out.append(None if r.status == 404 else unpack(r.body))
    return out


async def settled(c: Client, bucket: str, key: str) -> list[dict[str, Any]]:
    """Every replica's record once all hold the newest version (else the old one is live
    for gc anyway)."""
    for _ in range(200):
        held = await replicas(c, bucket, key)
        vids = {r["version_id"] if r else None for r in held}
        want = (await c.read_record(bucket, key))["version_id"]  # type: ignore[index]
        if vids == {want}:
            return held  # type: ignore[return-value]
        await asyncio.sleep(0.05)
    raise AssertionError(f"not every replica holds {bucket}/{key}")


async def noted(c: Client, bucket: str, key: str) -> list[list[str]]:
    """The versions each control node the ring places bucket/key on noted as read by its
    record's predecessors (node.metadb.replaced_names), asked as gc's scan asks."""
    from store.wire import unpack
    out = []
    for node in (await c.cluster_map()).control_nodes_for(f"{bucket}/{key}"):
        r = await c.t.request("GET", node.address, f"/v1/list/{bucket}",
                              query={"prefix": key, "limit": 1, "replaced": 1})
        out.append(sorted(v for v, _ in unpack(r.body)["replaced"].get(key, [])))
    return out


async def read_whole(c: Client, bucket: str, rec: dict[str, Any]) -> bytes:
    return b"".join([bytes(p) async for p in c.get_stream(bucket, rec["key"], record=rec)])


def test_an_overwritten_or_deleted_version_is_kept_for_the_grace_after(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version overwritten or deleted is kept for gc's grace after that, not only after
    its creation: a reader that opened it before - an fsspec file, a worker mid-shard -
    reads on. By creation time alone, gc took a version written more than a grace ago at
    once when it was overwritten, and every read of it in flight failed. A multipart
    object's fragments are its parts' versions: those are kept too."""
    from store import gc as store_gc
    from store import multipart
    grace_s = 0.5

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("gc-after")
            first, doomed, second, p1, p2 = (os.urandom(5 * 1024 * 1024 + i) for i in range(5))
            await c.put("gc-after", "over", first)
            await c.put("gc-after", "gone", doomed)
            for key in ("multi", "late"):
                up = await multipart.create_upload(c, "gc-after", key, content_type="", meta={})
                parts = [await multipart.put_part(c, "gc-after", up, n, body, lambda: "0" * 32)
                         for n, body in ((1, p1), (2, p2))]
                await multipart.complete(c, "gc-after", up, [(p.number, p.etag) for p in parts])
            old = {k: {**await c.live_record("gc-after", k), "key": k}
                   for k in ("over", "gone", "multi", "late")}
            part_vids = [p["version_id"] for p in old["multi"]["parts"]]
            await asyncio.sleep(10.5)       # every version older than the grace, and alive
            reader = c.get_stream("gc-after", "over")   # long enough to be noted (10 s)
            got = [bytes(await anext(reader))]
            await c.put("gc-after", "over", second)
            await c.put("gc-after", "multi", second)
            await c.delete("gc-after", "gone")
            new = {k: (await settled(c, "gc-after", k))[0] for k in ("over", "multi", "gone")}
            assert new["gone"]["deleted"] and "replaced" not in new["over"]   # not in records
            assert await noted(c, "gc-after", "over") == [[old["over"]["version_id"]]] * 3
            assert await noted(c, "gc-after", "gone") == [[old["gone"]["version_id"]]] * 3
            assert await noted(c, "gc-after", "multi") == [sorted(part_vids)] * 3

            first_ts = min(r["ts"] for r in new.values())   # the earliest replacement
            last = max(r["ts"] for r in new.values())
            gc_clock(monkeypatch, first_ts + 200_000_000)
            real_live_records = store_gc.live_records

            async def overwrite_first(*a: Any, **kw: Any) -> Any:
                # "late" overwritten after gc's scan of the control nodes, before its read
                # of the live records: the parts are in neither (the notes were read with
                # the scan, and these were taken)
                if not late:
                    late.append(await c.put("gc-after", "late", second))
                    await settled(c, "gc-after", "late")
                async for item in real_live_records(*a, **kw):
                    yield item
            late: list[Any] = []
            monkeypatch.setattr(store_gc, "live_records", overwrite_first)
            kept = await (await store_gc.prepare_gc(c, grace_s)).run()
            assert late
            fragments = 6 * sum(e["segments"] for e in old["multi"]["parts"]) + \
                sum(old[k]["segments"] * (old[k]["k"] + old[k]["m"]) for k in ("over", "gone"))
            assert kept.kept_young >= kept.kept_replaced >= fragments, kept
            got += [bytes(p) async for p in reader]
            assert b"".join(got) == first
            assert await read_whole(c, "gc-after", old["over"]) == first
            assert await read_whole(c, "gc-after", old["gone"]) == doomed
            assert await read_whole(c, "gc-after", old["multi"]) == p1 + p2
            assert await read_whole(c, "gc-after", old["late"]) == p1 + p2
            assert [len(of_version(cluster, p["version_id"])) for p in old["late"]["parts"]] \
                == [6 * p["segments"] for p in old["late"]["parts"]]

            gc_clock(monkeypatch, last + int((grace_s + 1.0) * 1e9))   # past the grace
            gone = await (await store_gc.prepare_gc(c, grace_s)).run()
            assert gone.fragments_deleted >= fragments, gone
            for vid in [old["over"]["version_id"], old["gone"]["version_id"], *part_vids]:
                assert not of_version(cluster, vid), vid
            assert await c.get("gc-after", "over") == second
    asyncio.run(go())


def test_replicas_that_noted_different_versions_are_all_heeded(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each control node notes what it held before: one that was down for a write notes an
    older version than the others. gc's scan takes every replica's notes (a quorum read's
    pick could lack the version just overwritten), and a read sends no replica anything
    (names kept in the record made replicas of one version differ, and each read sent the
    record to the others - refused, every time)."""
    from store.gc import replaced_notes
    grace_s = 0.5

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("gc-split")
            await c.put("gc-split", "k", os.urandom(300_000))
            v0 = (await settled(c, "gc-split", "k"))[0]["version_id"]
            [down, *_] = (await c.cluster_map()).control_nodes_for("gc-split/k")
            await asyncio.sleep(10.5)                # long enough to be noted (10 s)
            cluster.stop_node(down.id)
            await c.put("gc-split", "k", os.urandom(300_001))
            v1 = (await c.read_record("gc-split", "k"))["version_id"]  # type: ignore[index]
            cluster.start_node(down.id)
            cluster.wait_healthy([down.id])
            await asyncio.sleep(10.5)
            await c.put("gc-split", "k", os.urandom(300_002))
            held = await settled(c, "gc-split", "k")
            assert sorted(await noted(c, "gc-split", "k")) == [[v0], sorted([v0, v1]),
                                                               sorted([v0, v1])]
            merged = await replaced_notes(c, await c.cluster_map())
            assert {v0, v1} <= set(merged), merged

            writes = []
            real_write = c.meta.write

            async def spy(nodes: Any, path: str, *a: Any, **kw: Any) -> Any:
                writes.append(path)
                return await real_write(nodes, path, *a, **kw)
            monkeypatch.setattr(c.meta, "write", spy)
            for _ in range(10):
                await c.read_record("gc-split", "k")
            await asyncio.sleep(0.3)                 # read repairs run in the background
            monkeypatch.undo()
            assert writes == []

            gc_clock(monkeypatch, max(r["ts"] for r in held) + 200_000_000)
            from store import gc as store_gc
            kept = await (await store_gc.prepare_gc(c, grace_s)).run()
            assert kept.errors == [], kept
            assert len(of_version(cluster, v0)) == 6 and len(of_version(cluster, v1)) == 6
    asyncio.run(go())
