"""A storage node whose disk fills up: it refuses fragments with 507, puts go on through
handoff nodes, nothing is left half-written in its volume files, it keeps serving reads,
and it takes fragments again once space is freed. The full disk is a real small filesystem
(tmpfs with a size limit) mounted on the node's data directory."""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from node.fragments import FragmentStore
from store.client import SyncClient, expected_fragment_nodes
from store.client_base import REFUSED_BACKOFF_S
from store.errors import InsufficientStorage
from store.striping import fragment_id
from tests.cluster.tmpfs import cluster_on_tmpfs, tmpfs_disk
from tests.scrape import parse, value

MiB = 1024 * 1024
DISK_MIB = 20


@pytest.fixture(scope="module")
def small_disk() -> Iterator[LocalCluster]:
    with cluster_on_tmpfs("ecstore-full-", DISK_MIB) as c:
        yield c


def _holders(c: SyncClient, bucket: str, key: str) -> list[list[str]]:
    """Per segment, the node id of each fragment index (handoffs applied)."""
    async def go() -> list[list[str]]:
        rec = await c.client.live_record(bucket, key)
        cmap = await c.client.cluster_map()
        return [[n.id for n in expected_fragment_nodes(cmap, rec, s)]
                for s in range(rec["segments"])]
    return c._run(go())


def _homes(c: SyncClient, bucket: str, key: str) -> list[list[str]]:
    """Per segment, the node ids the map places its fragments on (handoffs not applied)."""
    async def go() -> list[list[str]]:
        rec = await c.client.live_record(bucket, key)
        cmap = await c.client.cluster_map()
        pol = cmap.policy(rec.get("policy"))
        ring = cmap.storage_ring(pol.tier)
        return [[n.id for n in ring.locate(f"{rec['version_id']}/{s}", pol.n)]
                for s in range(rec["segments"])]
    return c._run(go())


def _refused(c: SyncClient) -> float:
    """How many requests node s1 answered 507, from its /metrics page."""
    async def go() -> float:
        cmap = await c.client.cluster_map()
        r = await c.client.t.request("GET", cmap.storage_node("s1").address, "/metrics")
        return value(parse(r.body.decode()), "ecstore_http_requests_total", status="507")
    return c._run(go())


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _volume_sizes(data_dir: Path) -> dict[str, int]:
    """{volume file name: bytes} of a storage node's volume files."""
    return {p.name: p.stat().st_size for p in (data_dir / "volumes").glob("*.vol")}


def _damage_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What opening a FragmentStore said about records it cut off or skipped."""
    return [r.getMessage() for r in caplog.records
            if r.name == "ecstore.fragments" and r.levelno >= logging.WARNING]


def test_a_node_refusing_fragments_for_its_reserve_says_so(small_disk: LocalCluster) -> None:
    """Free space above the reserve, but not by a fragment: the node refuses each fragment
    (507) and its status said `up` with no problem, so nothing told why puts went
    elsewhere. It names the refusals now, for a minute after the last."""
    disk = Path(small_disk.nodes["s1"].data)
    with SyncClient(small_disk.path) as c:
        async def go() -> list[str]:
            cmap = await c.client.cluster_map()
            node = cmap.storage_node("s1")
            st = json.loads((await c.client.t.request("GET", node.address, "/v1/status")).body)
            reserve = st["reserve_bytes"]
            with open(disk / "filler", "wb") as f:
                f.write(b"\0" * max(0, _free(disk) - reserve - 512 * 1024))
            try:
                with pytest.raises(InsufficientStorage):
                    await c.client.put_fragment(node, "near.0.0", os.urandom(MiB),
                                                {"bucket": "full", "key": "near"})
                r = await c.client.t.request("GET", node.address, "/v1/status")
                return json.loads(r.body)["problems"]  # type: ignore[no-any-return]
            finally:
                (disk / "filler").unlink()
        problems = c._run(go())
    said = [p for p in problems if "fragments refused" in p]
    assert len(said) == 1 and "the disk is nearly full" in said[0], problems


def test_a_full_node_refuses_cleanly_and_recovers(small_disk: LocalCluster,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    disk = Path(small_disk.nodes["s1"].data)
    with SyncClient(small_disk.path) as c:
        c.create_bucket("full")
        # fill the node with a plain file, leaving less than its reserve (1% = 200 KiB)
        filler = disk / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, _free(disk) - 100 * 1024))
        assert _free(disk) < DISK_MIB * MiB // 100
        volumes = _volume_sizes(disk)
        assert volumes     # the node made its first volume when it started

        # a fragment PUT straight to the node: 507 with a reason, nothing half-written
        async def direct() -> None:
            cmap = await c.client.cluster_map()
            await c.client.put_fragment(cmap.storage_node("s1"), "direct.0.0", os.urandom(MiB),
                                        {"bucket": "full", "key": "direct"})
        with pytest.raises(InsufficientStorage):
            c._run(direct())

        objs = {f"o{i}": os.urandom(4 * MiB + i) for i in range(12)}
        time.sleep(REFUSED_BACKOFF_S)   # the direct put's refusal forgotten
        refused_before = _refused(c)
        started = time.monotonic()
        for k, v in objs.items():  # go on through handoff nodes
            c.put("full", k, v)
        took = time.monotonic() - started
        placed = [n for k in objs for seg in _holders(c, "full", k) for n in seg]
        assert "s1" not in placed, "a full node took fragments"
        # after a refusal the client sends the node no fragment for REFUSED_BACKOFF_S:
        # each segment it was a primary of sent it one (24 refused here) - its body
        # read and refused, the segment waiting on that before its handoff
        homes = sum(1 for k in objs for seg in _homes(c, "full", k) if "s1" in seg)
        refused = _refused(c) - refused_before
        windows = 1 + math.ceil(took / REFUSED_BACKOFF_S)
        assert 1 <= refused <= min(2 * windows, homes - 1), (refused, homes, took)
        for k, v in objs.items():
            assert c.get("full", k) == v
        # no half-written record left behind: a refused fragment appended nothing
        assert _volume_sizes(disk) == volumes

        # the full node still serves what it holds
        early = os.urandom(MiB)
        filler.unlink()
        c.put("full", "early", early)
        segs = _holders(c, "full", "early")
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, _free(disk) - 100 * 1024))
        i = segs[0].index("s1") if "s1" in segs[0] else None
        if i is not None:
            async def read_back() -> bytes:
                rec = await c.client.live_record("full", "early")
                cmap = await c.client.cluster_map()
                return await c.client.get_fragment(cmap.storage_node("s1"),
                                                   fragment_id(rec["version_id"], 0, i))
            assert len(c._run(read_back())) > 0
        assert c.get("full", "early") == early

        # space freed: the node takes fragments again (once the client's backoff is over)
        filler.unlink()
        time.sleep(REFUSED_BACKOFF_S)
        later = {f"n{i}": os.urandom(4 * MiB + i) for i in range(6)}
        for k, v in later.items():
            c.put("full", k, v)
        placed = [n for k in later for seg in _holders(c, "full", k) for n in seg]
        assert "s1" in placed, "the node took no fragment after space was freed"
        for k, v in {**objs, **later}.items():
            assert c.get("full", k) == v

    # every fragment record on the node is whole and verifies (the node stopped first:
    # one store at a time opens a data directory)
    small_disk.stop_node("s1")
    with caplog.at_level(logging.WARNING, logger="ecstore.fragments"):
        store = FragmentStore(disk, fsync=False, reserve_bytes=0)
    try:
        assert _damage_logged(caplog) == []  # nothing cut short or skipped when it opened
        ids = store.list("", 100_000)
        assert ids
        for fid in ids:
            store.read(fid)  # raises Corrupt on a half-written or damaged record
    finally:
        del store   # its volume files closed, so the disk can be unmounted


def test_enospc_mid_write_leaves_no_half_fragment(tmp_path: Path) -> None:
    """With no reserve, the disk really fills in the middle of a fragment write: the put
    fails with InsufficientStorage, the half-written record is never listed or read (not
    even once the store is opened again), every stored fragment still verifies, and a put
    fits again once one is deleted and its space compacted away. Volumes of 1 MiB: each
    fragment gets one of its own, which compaction can delete."""
    store: FragmentStore | None = None
    with tmpfs_disk(tmp_path / "disk", 4) as disk:
        store = FragmentStore(disk, fsync=True, reserve_bytes=0, volume_bytes=MiB)
        body = os.urandom(700 * 1024)
        checksum = hashlib.sha256(body).hexdigest()
        stored = []
        with pytest.raises(InsufficientStorage):
            for i in range(20):  # 4 MiB holds 5 of them, not 20
                store.put(f"f{i}.0.0", body, checksum, {"i": i})
                stored.append(f"f{i}.0.0")
        assert 3 <= len(stored) < 20
        assert store.list("", 100) == sorted(stored)
        for fid in stored:
            assert bytes(store.read(fid).body) == body
        store.delete(stored[0])
        assert store.compact().volumes >= 1     # the deleted fragment's volume freed
        store.put("again.0.0", body, checksum, {})
        assert bytes(store.read("again.0.0").body) == body
        kept = sorted([*stored[1:], "again.0.0"])
        assert store.list("", 100) == kept
        store = None
        gc.collect()
        store = FragmentStore(disk, fsync=True, reserve_bytes=0, volume_bytes=MiB)
        assert store.list("", 100) == kept      # the half-written one did not come back
        for fid in kept:
            assert bytes(store.read(fid).body) == body
        store = None    # its volume files closed, so the disk can be unmounted


def test_a_disk_smaller_than_a_quarter_volume_gets_deleted_space_back(tmp_path: Path) -> None:
    """The volume still appended to was compacted only once it held a quarter of a
    volume (256 MiB by default): on a smaller disk deletions never freed space and the
    node stayed full for good. Now an eighth of the disk is enough."""
    with tmpfs_disk(tmp_path / "disk", 8) as disk:
        store = FragmentStore(disk, fsync=False, reserve_bytes=MiB)   # 1 GiB volumes
        body = os.urandom(512 * 1024)
        checksum = hashlib.sha256(body).hexdigest()
        stored = []
        with pytest.raises(InsufficientStorage):
            for i in range(40):     # 8 MiB holds about 15
                store.put(f"f{i}.0.0", body, checksum, {"i": i})
                stored.append(f"f{i}.0.0")
        for fid in stored[1:]:
            store.delete(fid)
        assert store.compact().volumes == 1
        for i in range(5):          # room again
            store.put(f"g{i}.0.0", body, checksum, {})
        assert bytes(store.read(stored[0]).body) == body
        del store       # its volume files closed, so the disk can be unmounted
