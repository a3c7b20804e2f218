"""A record on a control node that does not own its key (a ring change's move not run
since, a write made with an old map) must not outlive the key's tombstone: gc purged the
tombstone from the owners, and that record - live, older - was then listed again and
moved back by the next metadata move, a deleted object back with its old bytes (found by
a walk-through, through read repair onto a node a move had left). gc now keeps such a
tombstone and says to run rebalance, whose metadata move drops the record; then gc
purges it and the object stays deleted."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient
from store.errors import NotFound
from store.wire import pack, unpack
from tests.cluster.conftest import running_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster("ecstore-gcstale-", storage=3, control=4, k=2, m=1,
                         gateway=False) as c:
        yield c


def run(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=300)


def test_a_tombstone_is_kept_while_a_non_owner_holds_the_key(cluster: LocalCluster) -> None:
    async def plant() -> str:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("stale")
            await c.put("stale", "obj", b"the old bytes")
            cmap = await c.cluster_map(refresh=True)
            owners = cmap.control_nodes_for("stale/obj")
            other = next(n for n in cmap.control.nodes if n.id not in {o.id for o in owners})
            rec = unpack((await c.t.request("GET", owners[0].address,
                                            "/v1/objects/stale/obj")).body)
            await c.t.request("PUT", other.address, "/v1/objects/stale/obj", body=pack(rec))
            await c.delete("stale", "obj")
            return other.id
    other = asyncio.run(plant())
    time.sleep(1.5)                     # the tombstone older than the grace below
    first = run(cluster, "gc", "--grace", "1", "--force", "--json")
    rep = json.loads(first.stdout)
    assert rep["tombstones_purged"] == 0 and rep.get("tombstones_held_elsewhere") == 1, rep
    assert first.returncode == 1 and any("run `ecstore rebalance`" in e for e in rep["errors"])
    with SyncClient(cluster.path) as c:
        with pytest.raises(NotFound):
            c.get("stale", "obj")
        assert [o.key for o in c.list("stale").objects] == []
    moved = run(cluster, "rebalance", "--json")
    assert moved.returncode == 0, moved.stderr.decode()
    assert json.loads(moved.stdout)["metadata"]["dropped"] >= 1      # off `other`
    second = json.loads(run(cluster, "gc", "--grace", "1", "--force", "--json").stdout)
    assert second["tombstones_purged"] == 1 and second["tombstones_held_elsewhere"] == 0, second
    again = json.loads(run(cluster, "rebalance", "--json").stdout)   # nothing to bring back
    assert again["metadata"]["copied"] == 0, (other, again)
    with SyncClient(cluster.path) as c:
        with pytest.raises(NotFound):
            c.get("stale", "obj")
        assert [o.key for o in c.list("stale").objects] == []


def test_no_tombstone_is_purged_while_a_control_ring_change_is_unsettled(
        cluster: LocalCluster) -> None:
    """The nodes a key's records were on before the change may still hold older ones (a
    node leaving the ring is not even scanned): gc keeps every tombstone until a
    rebalance has moved the metadata and settled the ring, then purges."""
    with SyncClient(cluster.path) as c:
        c.put("stale", "obj2", b"to be deleted")
        c.delete("stale", "obj2")
    added = subprocess.run([sys.executable, "-m", "cli.main", "cluster", "add-node", "--data",
                            str(cluster.dir), "--role", "control", "--json"], cwd=ROOT,
                           capture_output=True, timeout=120)
    assert added.returncode == 0, added.stderr.decode()
    time.sleep(1.5)
    first = run(cluster, "gc", "--grace", "1", "--force", "--json")
    rep = json.loads(first.stdout)
    assert rep["tombstones_purged"] == 0 and rep.get("tombstones_held_elsewhere", 0) >= 1, rep
    assert first.returncode == 1 and any("not settled" in e for e in rep["errors"]), rep
    assert run(cluster, "rebalance").returncode == 0
    second = json.loads(run(cluster, "gc", "--grace", "1", "--force", "--json").stdout)
    assert second["tombstones_purged"] >= 1 and second["tombstones_held_elsewhere"] == 0, second
    with SyncClient(cluster.path) as c:
        with pytest.raises(NotFound):
            c.get("stale", "obj2")
        assert [o.key for o in c.list("stale").objects] == []
