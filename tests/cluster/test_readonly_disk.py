"""A storage node whose filesystem is read-only - ext4 remounts itself so after an error
(errors=remount-ro), or an operator mounted it so to save what is on it: the node
starts, serves every fragment it holds, refuses writes (503, puts go to handoff nodes)
and says why in status. It did not start at all (its volumes were opened for writing):
every fragment on the disk was unavailable. The filesystem is a real tmpfs remounted
read-only."""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient, expected_fragment_nodes
from store.striping import fragment_id
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
