"""Hot and cold tiers, as a user runs them: `ecstore cluster up --cold 11` (policy cold is
8+3 on the cold nodes), bucket default policies, `ecstore tier status` and
`ecstore tier run --once` demoting what is not read and promoting what is read often;
a move keeps the bytes, the ETag and the modification time, never interrupts a reader,
and loses to a concurrent overwrite."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from cli.localcluster import LocalCluster
from node.volumes import stored_fragments
from store import gc as store_gc
from store.client import Client, SyncClient, expected_fragment_nodes
from store.gc import prepare_gc
from store.tiering import TierEntry, TierRules, TierStatus, TierWorker, move_object
from store.wire import unpack
from tests.cluster.s3_fixtures import ecstore
from tests.cluster.uncached import node_counters
from tests.functional.harness import evict_volumes, fragments_on_disk, settle_uncached

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def tiered() -> Iterator[LocalCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-tier-"))
    data = tmp / "cluster"
    up = ecstore(None, "cluster", "up", "--data", str(data), "--cold", "11", "--detach",
                 "--no-fsync", timeout_s=120)
    assert "11 cold (policy cold 8+3)" in " ".join(up.stderr.split())  # rich wraps lines
    try:
        yield LocalCluster.load(data)
    finally:
        ecstore(None, "cluster", "down", "--data", str(data), ok=False)
        shutil.rmtree(tmp, ignore_errors=True)


def s3_of(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    gw = cluster.gateway
    assert gw is not None
    return boto3.session.Session().client(
        "s3", endpoint_url=gw["url"], region_name=gw["region"],
        aws_access_key_id=gw["access_key"], aws_secret_access_key=gw["secret_key"])


def record(c: SyncClient, bucket: str, key: str) -> dict:  # type: ignore[type-arg]
    return c._run(c.client.live_record(bucket, key))


def tiers_of(c: SyncClient, bucket: str, key: str) -> set[str]:
    async def go() -> set[str]:
        rec = await c.client.live_record(bucket, key)
        cmap = await c.client.cluster_map()
        return {n.tier for s in range(rec["segments"])
                for n in expected_fragment_nodes(cmap, rec, s)}
    return c._run(go())


def tier_json(cluster: LocalCluster, *args: str) -> dict:  # type: ignore[type-arg]
    return json.loads(ecstore(cluster.path, "tier", *args, "--json").stdout)


def test_idle_objects_go_cold_and_busy_ones_come_back(tiered: LocalCluster) -> None:
    s3 = s3_of(tiered)
    s3.create_bucket(Bucket="data")
    model = os.urandom(9 * MiB + 5)
    s3.put_object(Bucket="data", Key="model.bin", Body=model)
    head0 = s3.head_object(Bucket="data", Key="model.bin")
    objs = {"a.bin": os.urandom(5 * MiB), "b.bin": os.urandom(5 * MiB + 1), "small": b"s" * 1000}
    with SyncClient(tiered.path) as c:
        for k, v in objs.items():
            c.put("data", k, v)
    st = tier_json(tiered, "status", "--cold-after", "1000")
    assert st["tiers"]["hot"]["objects"] == 3 and st["tiers"]["inline"]["objects"] == 1
    replicas = min(3, sum(1 for n in tiered.nodes.values() if n.role == "control"))
    assert st["tiers"]["inline"]["stored_bytes"] == 1000 * replicas   # a copy per replica
    assert st["tiers"]["hot"]["bytes"] == len(model) + 10 * MiB + 1
    assert st["due"] == {}

    time.sleep(5.5)
    st = tier_json(tiered, "status", "--cold-after", "5")
    assert st["due"]["demote"] == {"objects": 3, "bytes": len(model) + 10 * MiB + 1}
    with SyncClient(tiered.path) as c:  # read b.bin just now: it stays hot
        assert c.get("data", "b.bin") == objs["b.bin"]
        going = [record(c, "data", key)["version_id"] for key in ("a.bin", "model.bin")]
    hot = [i for i, n in tiered.nodes.items() if n.role == "storage" and n.tier == "hot"]
    read_from = [loc for i in hot for fid, loc in stored_fragments(tiered.nodes[i].data).items()
                 if fid.split(".")[0] in going]
    for i in hot:       # nobody has read the objects to demote: out of the page cache
        evict_volumes(tiered.nodes[i].data)
    dry = tier_json(tiered, "run", "--once", "--cold-after", "5", "--dry-run")
    assert (dry["demoted"], dry["promoted"], dry["dry_run"]) == (2, 0, True), dry
    assert dry["moved_mb_s"] is None        # nothing moved: no rate to report
    rep = tier_json(tiered, "run", "--once", "--cold-after", "5")
    assert (rep["demoted"], rep["promoted"], rep["failed"]) == (2, 0, 0), rep
    assert rep["moved_mb_s"] > 0 and rep["dry_run"] is False

    with SyncClient(tiered.path) as c:
        for key in ("a.bin", "model.bin"):
            rec = record(c, "data", key)
            assert (rec["policy"], rec["k"], rec["m"]) == ("cold", 8, 3)
            assert tiers_of(c, "data", key) == {"cold"}
        assert record(c, "data", "b.bin")["policy"] == "hot"
        assert tiers_of(c, "data", "b.bin") == {"hot"}
    # a demotion writes uncached (nobody reads it now) where the kernel takes that: every
    # fragment the cold nodes hold is one of the two moves'
    cold = [i for i, n in tiered.nodes.items() if n.role == "storage" and n.tier == "cold"]
    held = sum(len(fragments_on_disk(tiered.nodes[i].data)) for i in cold)
    counted = [node_counters(tiered, i) for i in cold]
    assert held > 0
    assert sum(c["uncached_writes_total"] for c in counted) == \
        held * min(c["uncached_writes_supported"] for c in counted)
    # and reads the hot copies uncached: they are still out of the hot nodes' page cache
    assert len(read_from) >= 6 * 3
    assert settle_uncached(read_from) == [0] * len(read_from)
    with SyncClient(tiered.path) as c:
        assert c.get("data", "a.bin") == objs["a.bin"]
        assert c.get("data", "small") == objs["small"]
    head1 = s3.head_object(Bucket="data", Key="model.bin")
    assert head1["ETag"] == head0["ETag"]
    assert head1["LastModified"] == head0["LastModified"]
    assert s3.get_object(Bucket="data", Key="model.bin")["Body"].read() == model
    table = ecstore(tiered.path, "tier", "status").stdout
    assert "cold" in table and "8+3" in table

    with SyncClient(tiered.path) as c:  # three reads of a.bin in the window: promote it
        for _ in range(3):
            assert c.get("data", "a.bin", 0, 99) == objs["a.bin"][:100]
    rep = tier_json(tiered, "run", "--once", "--promote-reads", "3", "--window", "60")
    assert (rep["promoted"], rep["failed"]) == (1, 0), rep
    with SyncClient(tiered.path) as c:
        rec = record(c, "data", "a.bin")
        assert (rec["policy"], rec["k"], rec["m"]) == ("hot", 4, 2)
        assert c.get("data", "a.bin") == objs["a.bin"]
        assert record(c, "data", "model.bin")["policy"] == "cold"  # read once only


def test_a_move_never_interrupts_a_reader_and_loses_to_an_overwrite(
        tiered: LocalCluster) -> None:
    async def go() -> None:
        async with Client.connect(tiered.path) as c:
            await c.create_bucket("moving")
            data = os.urandom(13 * MiB)
            await c.put("moving", "big", data)
            rec = await c.live_record("moving", "big")
            stream = c.get_stream("moving", "big")
            got = [await anext(stream)]
            assert await move_object(c, "moving", "big", rec, "cold")
            got += [part async for part in stream]  # the old version, to its end
            assert hashlib.sha256(b"".join(got)).digest() == hashlib.sha256(data).digest()
            assert (await c.live_record("moving", "big"))["policy"] == "cold"
            assert await c.get("moving", "big") == data

            await c.put("moving", "raced", b"1" * (5 * MiB))
            old = await c.live_record("moving", "raced")
            await c.put("moving", "raced", b"2" * (5 * MiB))  # a newer write
            assert not await move_object(c, "moving", "raced", old, "cold")
            assert await c.get("moving", "raced") == b"2" * (5 * MiB)
            assert (await c.live_record("moving", "raced"))["policy"] == "hot"
    asyncio.run(go())


def test_bucket_default_policy(tiered: LocalCluster) -> None:
    ecstore(tiered.path, "mb", "archive", "--policy", "cold")
    with SyncClient(tiered.path) as c:
        c.put("archive", "x", os.urandom(2 * MiB))
        assert record(c, "archive", "x")["policy"] == "cold"
        c.put("archive", "y", os.urandom(2 * MiB), policy="hot")   # a put may choose
        assert record(c, "archive", "y")["policy"] == "hot"
    bad = ecstore(tiered.path, "mb", "nowhere", "--policy", "tepid", ok=False)
    assert bad.returncode == 2 and "no storage policy 'tepid'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_s3_archive_classes_are_written_cold_and_stay_there(tiered: LocalCluster) -> None:
    """GLACIER_IR, GLACIER and DEEP_ARCHIVE ask for capacity media: put, multipart and
    copy write them on the cold policy (infrequent access and STANDARD on the bucket's
    default); a pass moves one found on hot there at once, and never promotes one."""
    s3 = s3_of(tiered)
    s3.create_bucket(Bucket="classes")
    body = os.urandom(3 * MiB + 7)
    for key, cls in (("glacier", "GLACIER"), ("deep", "DEEP_ARCHIVE"), ("ia", "STANDARD_IA"),
                     ("std", None), ("moved", None)):
        s3.put_object(Bucket="classes", Key=key, Body=body,
                      **({"StorageClass": cls} if cls else {}))
    parts = [os.urandom(5 * MiB), os.urandom(MiB + 3)]
    up = s3.create_multipart_upload(Bucket="classes", Key="mp", StorageClass="GLACIER_IR")
    done = [{"PartNumber": n, "ETag": s3.upload_part(
        Bucket="classes", Key="mp", UploadId=up["UploadId"], PartNumber=n, Body=p)["ETag"]}
        for n, p in enumerate(parts, 1)]
    s3.complete_multipart_upload(Bucket="classes", Key="mp", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": done})
    s3.copy_object(Bucket="classes", Key="moved", StorageClass="DEEP_ARCHIVE",  # onto itself
                   CopySource={"Bucket": "classes", "Key": "moved"})
    want = {"glacier": "cold", "deep": "cold", "mp": "cold", "moved": "cold", "ia": "hot",
            "std": "hot"}
    with SyncClient(tiered.path) as c:
        for key, tier in want.items():
            rec = record(c, "classes", key)
            assert (rec["policy"], tiers_of(c, "classes", key)) == (tier, {tier}), key
    for key in want:
        expect = b"".join(parts) if key == "mp" else body
        assert s3.get_object(Bucket="classes", Key=key)["Body"].read() == expect, key
    assert s3.head_object(Bucket="classes", Key="mp")["StorageClass"] == "GLACIER_IR"
    assert s3.head_object(Bucket="classes", Key="moved")["StorageClass"] == "DEEP_ARCHIVE"

    with SyncClient(tiered.path) as c:
        for _ in range(4):          # read often: a cold object of another class would come back
            assert c.get("classes", "deep", 0, 99) == body[:100]
        # as if written before the map had a cold tier
        assert c._run(move_object(c.client, "classes", "glacier",
                                  record(c, "classes", "glacier"), "hot"))
        assert tiers_of(c, "classes", "glacier") == {"hot"}
    rep = tier_json(tiered, "run", "--once", "--promote-reads", "3", "--window", "60")
    assert rep["failed"] == 0, rep
    with SyncClient(tiered.path) as c:
        assert record(c, "classes", "glacier")["policy"] == "cold"   # at once, not in a week
        assert tiers_of(c, "classes", "glacier") == {"cold"}
        assert record(c, "classes", "deep")["policy"] == "cold"
        assert record(c, "classes", "std")["policy"] == "hot"
        assert c.get("classes", "glacier") == body


def test_s3_multipart_uploads_take_the_buckets_default_policy(tiered: LocalCluster) -> None:
    """A bucket made with `--policy cold` gets its multipart uploads' parts on the cold
    nodes too, as its plain puts (they went to the map's default before)."""
    ecstore(tiered.path, "mb", "cold-default", "--policy", "cold")
    s3 = s3_of(tiered)
    data = os.urandom(5 * MiB + 11)
    up = s3.create_multipart_upload(Bucket="cold-default", Key="m")
    etag = s3.upload_part(Bucket="cold-default", Key="m", UploadId=up["UploadId"],
                          PartNumber=1, Body=data)["ETag"]
    s3.complete_multipart_upload(Bucket="cold-default", Key="m", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    s3.put_object(Bucket="cold-default", Key="p", Body=data)
    with SyncClient(tiered.path) as c:
        for key in ("m", "p"):
            assert record(c, "cold-default", key)["policy"] == "cold", key
            assert tiers_of(c, "cold-default", key) == {"cold"}, key
    assert s3.get_object(Bucket="cold-default", Key="m")["Body"].read() == data


async def every_replica_holds(c: Client, bucket: str, key: str, version_id: str) -> None:
    """Wait (10 s at most) until each control node holds that version of the record: gc
    keeps any version one replica still holds as live."""
    cmap = await c.cluster_map()
    for _ in range(200):
        held = []
        for node in cmap.control.nodes:
            r = await c.t.request("GET", node.address, f"/v1/objects/{bucket}/{key}",
                                  ok_404=True)
            held.append(r.status == 200 and unpack(r.body)["version_id"] == version_id)
        if all(held):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not every replica holds {bucket}/{key} {version_id}")


def test_a_moved_version_outlives_gc_for_its_grace(
        tiered: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc keeps the version a move replaced for its grace after the move, so a reader that
    started on it reads to its end. A version's age is its creation time, and a demoted
    version is as old as the object's last write (a week by default): the next gc after a
    pass took its fragments at once and every read in flight on it failed. gc's clock is
    set (half a second after the move, then past its grace), so a slow machine cannot
    make the move older than the grace before gc looks."""
    grace_s = 2.0

    def gc_at(now_ns: int) -> None:
        clock = SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
        clock.time_ns = lambda: now_ns
        monkeypatch.setattr(store_gc, "time", clock)

    async def go() -> None:
        async with Client.connect(tiered.path) as c:
            await c.create_bucket("graced")
            data = os.urandom(13 * MiB)
            await c.put("graced", "obj", data)
            rec = await c.live_record("graced", "obj")
            await asyncio.sleep(grace_s + 1.0)     # the version is older than the grace
            stream = c.get_stream("graced", "obj")
            got = [await anext(stream)]
            assert await move_object(c, "graced", "obj", rec, "cold")
            new_vid = (await c.live_record("graced", "obj"))["version_id"]
            moved = store_gc.version_time_ns(new_vid)
            await every_replica_holds(c, "graced", "obj", new_vid)   # else the old is live
            gc_at(moved + 500_000_000)
            kept = await (await store_gc.prepare_gc(c, grace_s)).run()
            assert kept.kept_young >= rec["segments"] * (rec["k"] + rec["m"]), kept
            got += [part async for part in stream]
            assert hashlib.sha256(b"".join(got)).digest() == hashlib.sha256(data).digest()
            old = b"".join([p async for p in c.get_stream("graced", "obj", record=rec)])
            assert hashlib.sha256(old).digest() == hashlib.sha256(data).digest()

            gc_at(moved + int((grace_s + 1.0) * 1e9))   # the move older than the grace too
            report = (await store_gc.prepare_gc(c, grace_s)).report
            old_fragments = rec["segments"] * (rec["k"] + rec["m"])
            assert report.fragments_garbage >= old_fragments, report   # the old version's
            assert await c.get("graced", "obj") == data
    asyncio.run(go())


def test_a_move_keeps_the_parts_s3_sees_and_the_etag(tiered: LocalCluster) -> None:
    """A moved multipart object still has its parts for S3 (GET and HEAD ?partNumber,
    PartsCount, each part's checksum), and an object the client library wrote keeps its
    ETag (its first version id): both changed with the move before."""
    s3 = s3_of(tiered)
    s3.create_bucket(Bucket="layout")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB + 17), os.urandom(MiB + 3)]
    up = s3.create_multipart_upload(Bucket="layout", Key="mp", ChecksumAlgorithm="CRC32")
    done = [{"PartNumber": n, **{k: v for k, v in s3.upload_part(
        Bucket="layout", Key="mp", UploadId=up["UploadId"], PartNumber=n, Body=p,
        ChecksumAlgorithm="CRC32").items() if k in ("ETag", "ChecksumCRC32")}}
        for n, p in enumerate(parts, 1)]
    s3.complete_multipart_upload(Bucket="layout", Key="mp", UploadId=up["UploadId"],
                                 MultipartUpload={"Parts": done})
    lib = os.urandom(3 * MiB)
    with SyncClient(tiered.path) as c:
        c.put("layout", "lib", lib)

    def seen() -> dict[str, object]:
        out: dict[str, object] = {"etag": s3.head_object(Bucket="layout", Key="mp")["ETag"],
                                  "lib": s3.head_object(Bucket="layout", Key="lib")["ETag"]}
        for n, p in enumerate(parts, 1):
            h = s3.head_object(Bucket="layout", Key="mp", PartNumber=n, ChecksumMode="ENABLED")
            g = s3.get_object(Bucket="layout", Key="mp", PartNumber=n)
            assert g["Body"].read() == p, n
            out[f"part{n}"] = (h["ContentLength"], h["PartsCount"], h.get("ChecksumCRC32"),
                               g["PartsCount"])
        return out

    before = seen()
    assert before["part2"][0] == len(parts[1]) and before["part2"][1] == 3  # type: ignore[index]
    with SyncClient(tiered.path) as c:
        for key in ("mp", "lib"):
            assert c._run(move_object(c.client, "layout", key, record(c, "layout", key), "cold"))
            assert record(c, "layout", key)["policy"] == "cold"
    assert seen() == before
    got = s3.get_object(Bucket="layout", Key="lib", IfMatch=before["lib"])  # type: ignore[arg-type]
    assert got["Body"].read() == lib


def test_a_move_of_a_version_overwritten_and_collected_is_superseded(
        tiered: LocalCluster) -> None:
    """A pass that listed a version which was overwritten and collected before its turn
    reports the object superseded (nothing to move), not failed with exit 1 - the read
    of the old version's fragments fails then, and the object is fine."""
    async def go() -> None:
        async with Client.connect(tiered.path) as c:
            await c.create_bucket("gone")
            await c.put("gone", "k", os.urandom(2 * MiB))
            old = await c.live_record("gone", "k")
            await c.put("gone", "k", b"new" * MiB)
            await (await prepare_gc(c, 0.0)).run()   # the old version's fragments go
            status = TierStatus(due=[TierEntry("gone", "k", old, "demote")])
            worker = TierWorker(c, status, TierRules(cold_after_s=0.0))
            while await worker.step():
                pass
            r = worker.report
            assert (r.superseded, r.failed, r.demoted) == (1, 0, 0), r.errors
            assert await c.get("gone", "k") == b"new" * MiB
    asyncio.run(go())
