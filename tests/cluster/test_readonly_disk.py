"""A storage node whose filesystem is read-only - ext4 remounts itself so after an error
(errors=remount-ro), or an operator mounted it so to save what is on it: the node
starts, serves every fragment it holds, refuses writes (503, puts go to handoff nodes)
and says why in status. It did not start at all (its volumes were opened for writing):
every fragment on the disk was unavailable. The filesystem is a real tmpfs remounted
read-only."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient, expected_fragment_nodes
from store.striping import fragment_id
from store.transport import Transport
from tests.cluster.conftest import replicas_hold, wait_for
from tests.cluster.s3_fixtures import ecstore
from tests.cluster.tmpfs import cluster_on_tmpfs

MiB = 1024 * 1024


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True,
                   capture_output=True)


@pytest.fixture()
def cluster() -> Iterator[LocalCluster]:
    with cluster_on_tmpfs("ecstore-ro-", 64) as c:
        yield c


def _holders(c: SyncClient, key: str) -> list[tuple[str, str]]:
    """(node id, fragment id) of every fragment of bucket "rodisk"'s `key`."""
    async def go() -> list[tuple[str, str]]:
        rec = await c.client.live_record("rodisk", key)
        cmap = await c.client.cluster_map()
        return [(n.id, fragment_id(rec["version_id"], s, i))
                for s in range(rec["segments"])
                for i, n in enumerate(expected_fragment_nodes(cmap, rec, s))]
    return c._run(go())


def _status(c: SyncClient, node_id: str) -> dict[str, object]:
    async def go() -> dict[str, object]:
        cmap = await c.client.cluster_map()
        r = await c.client.t.request("GET", cmap.storage_node(node_id).address, "/v1/status")
        return json.loads(r.body)   # type: ignore[no-any-return]
    return c._run(go())


def _fragment(c: SyncClient, node_id: str, fid: str) -> bytes:
    async def go() -> bytes:
        cmap = await c.client.cluster_map()
        return bytes(await c.client.get_fragment(cmap.storage_node(node_id), fid))
    return c._run(go())


def test_a_node_on_a_read_only_filesystem_serves_what_it_holds(cluster: LocalCluster) -> None:
    disk = Path(cluster.nodes["s1"].data)
    with SyncClient(cluster.path) as c:
        c.create_bucket("rodisk")
        before = {f"b{i}": os.urandom(2 * MiB + i) for i in range(8)}
        for k, v in before.items():
            c.put("rodisk", k, v)
        on_s1 = [(k, fid) for k in before for n, fid in _holders(c, k) if n == "s1"]
        assert on_s1, "no fragment landed on s1"

        cluster.stop_node("s1")
        remount(disk, "ro")
        files = {p: p.stat().st_size for p in disk.rglob("*") if p.is_file()}
        cluster.start_node("s1")
        cluster.wait_healthy(["s1"])

        st = _status(c, "s1")
        said = [p for p in st["problems"] if "read-only" in p]   # type: ignore[union-attr]
        assert len(said) == 1 and "served" in said[0], st
        assert st["fragments"] > 0
        for k, fid in on_s1:    # served from the read-only disk, byte for byte
            assert len(_fragment(c, "s1", fid)) > 0, (k, fid)
        for k, v in before.items():
            assert c.get("rodisk", k) == v

        after = {f"a{i}": os.urandom(2 * MiB + i) for i in range(8)}
        for k, v in after.items():      # puts go on through handoff nodes
            c.put("rodisk", k, v)
        assert all(n != "s1" for k in after for n, _ in _holders(c, k))
        for k, v in after.items():
            assert c.get("rodisk", k) == v
        assert {p: p.stat().st_size for p in disk.rglob("*") if p.is_file()} == files

        # writable again and restarted: it takes fragments
        cluster.stop_node("s1")
        remount(disk, "rw")
        cluster.start_node("s1")
        cluster.wait_healthy(["s1"])
        assert not [p for p in _status(c, "s1")["problems"]   # type: ignore[attr-defined]
                    if "read-only" in p]
        time.sleep(2.0)     # the client's backoff after s1's refusals (REFUSED_BACKOFF_S)
        later = {f"l{i}": os.urandom(2 * MiB + i) for i in range(8)}
        for k, v in later.items():
            c.put("rodisk", k, v)
        assert any(n == "s1" for k in later for n, _ in _holders(c, k))
        for k, v in {**before, **after, **later}.items():
            assert c.get("rodisk", k) == v


def _on_c1(cluster: LocalCluster, method: str, path: str) -> tuple[int, bytes]:
    """(status, body) of a request signed for the cluster, sent to control node c1."""
    async def go() -> tuple[int, bytes]:
        t = Transport(cluster.secret)
        try:
            r = await t.request(method, cluster.nodes["c1"].url, path, ok_404=True)
            return r.status, bytes(r.body)
        finally:
            await t.close()
    return asyncio.run(go())


def _c1_status(cluster: LocalCluster) -> dict[str, Any]:
    return json.loads(_on_c1(cluster, "GET", "/v1/status")[1])  # type: ignore[no-any-return]


def test_a_control_node_on_a_read_only_filesystem_serves_its_records() -> None:
    """A control node's database on a read-only filesystem: the node did not start
    (rocksdict writes its config file beside the database at every open, read-only
    ones too), and its replica of every record was unavailable. It starts now, serves
    the records it holds, refuses writes (the other replicas take them), says so in
    status, takes writes again once the filesystem is read-write - without a restart -
    and repair puts back what it missed. Nothing on the disk is changed meanwhile."""
    with cluster_on_tmpfs("ecstore-ctro-", 64, node_id="c1") as cluster:
        disk = Path(cluster.nodes["c1"].data)
        with SyncClient(cluster.path) as c:
            c.create_bucket("rodisk")
            before = {f"b{i}": os.urandom(100 + i) for i in range(6)}   # inline
            before["big"] = os.urandom(2 * MiB)
            for k, v in before.items():
                c.put("rodisk", k, v)
            wait_for(lambda: replicas_hold(cluster, "rodisk", list(before)),
                     what="every replica holding every record")

            cluster.stop_node("c1")
            remount(disk, "ro")
            files = {p: p.stat().st_size for p in disk.rglob("*") if p.is_file()}
            # a shadow left by a control node killed while read-only (no such pid runs)
            dead = Path(tempfile.mkdtemp(prefix="ecstore-metadb-ro-4194305-"))
            cluster.start_node("c1")
            cluster.wait_healthy(["c1"])
            assert not dead.exists(), "a dead node's shadow directory was left"
            c1_pid = cluster.nodes["c1"].pid
            assert c1_pid and list(Path(tempfile.gettempdir()).glob(
                f"ecstore-metadb-ro-{c1_pid}-*")), "no shadow directory of c1's"

            st = _c1_status(cluster)
            said = [p for p in st["problems"] if "read-only filesystem" in p]
            assert len(said) == 1 and "ecstore repair" in said[0], st
            assert st["writable"] is False, st
            for k in before:        # served from the read-only disk
                assert _on_c1(cluster, "GET", f"/v1/objects/rodisk/{k}")[0] == 200, k

            during = {f"d{i}": os.urandom(3000 + i) for i in range(4)}
            for k, v in during.items():     # puts go on: the other two replicas
                c.put("rodisk", k, v)
            for k, v in {**before, **during}.items():
                assert c.get("rodisk", k) == v
            assert all(_on_c1(cluster, "GET", f"/v1/objects/rodisk/{k}")[0] == 404
                       for k in during)
            assert {p: p.stat().st_size for p in disk.rglob("*") if p.is_file()} == files

            remount(disk, "rw")     # no restart: it reopens for writing by itself
            wait_for(lambda: _c1_status(cluster)["writable"] is True, timeout_s=30,
                     what="c1 taking writes again")
            assert not [p for p in _c1_status(cluster)["problems"] if "read-only" in p]
            c.put("rodisk", "after", b"after")
            wait_for(lambda: _on_c1(cluster, "GET", "/v1/objects/rodisk/after")[0] == 200,
                     what="c1 holding a record put after the remount")

            report = json.loads(ecstore(cluster.path, "repair", "--json").stdout)
            assert report["metadata"]["copied"] >= len(during), report["metadata"]
            for k in during:
                assert _on_c1(cluster, "GET", f"/v1/objects/rodisk/{k}")[0] == 200, k
            for k, v in {**before, **during, "after": b"after"}.items():
                assert c.get("rodisk", k) == v
        assert not list(Path(tempfile.gettempdir()).glob(f"ecstore-metadb-ro-{c1_pid}-*")), \
            "the read-only shadow directory was left behind"
