"""A dead storage node replaced by a new one, the new one added first: its rebalance
cannot finish while the dead node is in the map, and a ring change waits for the last
one's rebalance - `cluster remove-node --force` takes the dead node out anyway (it
ignored --force for storage nodes, and the procedure dead-ended), repair rebuilds what it
held, and the same command drops it. Every object reads back byte-exact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from tests.cluster.conftest import running_cluster

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster("ecstore-replace-", request.config.getoption("--keep-tmp"),
                         storage=6, control=3, k=4, m=2, gateway=False) as c:
        yield c


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_dead_node_replaced_new_one_first(cluster: LocalCluster) -> None:
    objs = {f"o{i}": os.urandom(MIB + i * 9973) for i in range(12)}
    with SyncClient(cluster.path) as c:
        c.create_bucket("swap")
        for k, v in objs.items():
            c.put("swap", k, v)
    cluster.kill_node("s2")
    shutil.rmtree(Path(cluster.nodes["s2"].data))      # gone for good
    data = str(cluster.dir)
    # with exactly k+m storage nodes the removal is refused, saying what to do first (it
    # gave no next step: the runbook's first step ended there)
    first = cli(cluster, "cluster", "remove-node", "--data", data, "s2")
    assert first.returncode == 2 and "add a storage node to that tier first" in first.stderr \
        and "Traceback" not in first.stderr, first.stderr
    added = cli(cluster, "cluster", "add-node", "--data", data, "--json")
    assert added.returncode == 0, added.stderr
    new = json.loads(added.stdout)["id"]
    reb = cli(cluster, "rebalance", "--json")
    assert reb.returncode == 1 and "remove-node ID --force" in reb.stderr, reb.stderr
    refused = cli(cluster, "cluster", "remove-node", "--data", data, "s2")
    assert refused.returncode == 2 and "--force" in refused.stderr, refused.stderr
    forced = cli(cluster, "cluster", "remove-node", "--data", data, "s2", "--force", "--json")
    assert forced.returncode == 1, forced.stderr      # out of the map; some found nowhere else
    assert json.loads(forced.stdout)["drained"] is False and "repair" in forced.stderr
    rep = cli(cluster, "repair", "--json")
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["fragments_rebuilt"] > 0
    done = cli(cluster, "cluster", "remove-node", "--data", data, "s2", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["drained"] is True, done.stderr
    # a dead node is not said to be drained and stopped
    assert "removed s2, which did not answer" in " ".join(done.stderr.split()), done.stderr
    assert "s2" not in LocalCluster.load(cluster.dir).nodes
    with SyncClient(cluster.path) as c:
        for k, v in objs.items():
            assert c.get("swap", k) == v, k
    shown = json.loads(cli(cluster, "ring", "show", "--json").stdout)
    ids = [n["id"] for n in shown["nodes"]]
    assert new in ids and "s2" not in ids and not shown["rebalance_pending"]


def test_a_control_node_added_while_another_is_down(cluster: LocalCluster) -> None:
    """The dead control node's replacement is added first (what `remove-node` says to do):
    the add succeeds and says which node the map did not reach (it ended in a urllib
    traceback, the node added all the same); the dead one then goes with --force and
    repair gives every record its replicas again."""
    objs = {f"m{i}": os.urandom(1000 + i) for i in range(20)}
    with SyncClient(cluster.path) as c:
        c.create_bucket("ctl")
        for k, v in objs.items():
            c.put("ctl", k, v)
    cluster.kill_node("c2")
    data = str(cluster.dir)
    added = cli(cluster, "cluster", "add-node", "--data", data, "--role", "control", "--json")
    assert added.returncode == 0 and "Traceback" not in added.stderr, added.stderr
    assert "not reached: c2" in added.stderr
    new = json.loads(added.stdout)["id"]
    assert new in [n["id"] for n in json.loads(cli(cluster, "ring", "show", "--json").stdout)
                   ["nodes"]]
    reb = cli(cluster, "rebalance")
    assert reb.returncode == 1 and "remove-node ID --force" in reb.stderr, reb.stderr
    gone = cli(cluster, "cluster", "remove-node", "--data", data, "c2", "--force")
    assert gone.returncode == 0, gone.stderr
    assert cli(cluster, "repair").returncode == 0
    with SyncClient(cluster.path) as c:
        for k, v in objs.items():
            assert c.get("ctl", k) == v, k


def test_a_node_of_a_mistyped_tier_can_be_removed(cluster: LocalCluster) -> None:
    """A storage node added with a tier no policy uses (a typo) is the only node of its
    ring; removing it drops the ring (it was refused: "cannot remove the last node of a
    ring", with --force too, and the node stayed in the map for good)."""
    data = str(cluster.dir)
    added = cli(cluster, "cluster", "add-node", "--data", data, "--tier", "nosuch", "--json")
    assert added.returncode == 0 and "no policy places fragments on tier" in added.stderr
    nid = json.loads(added.stdout)["id"]
    # no rebalance first (the add left one pending): the removal's drain settles it
    assert json.loads(cli(cluster, "ring", "show", "--json").stdout)["rebalance_pending"] \
        == ["storage"]
    gone = cli(cluster, "cluster", "remove-node", "--data", data, nid, "--json")
    assert gone.returncode == 0 and json.loads(gone.stdout)["drained"] is True, gone.stderr
    shown = json.loads(cli(cluster, "ring", "show", "--json").stdout)
    assert nid not in [n["id"] for n in shown["nodes"]]
    assert {n["ring"] for n in shown["nodes"]} == {"hot", "control"}
    assert nid not in LocalCluster.load(cluster.dir).nodes
    assert shown["rebalance_pending"] == []
    assert cli(cluster, "rebalance").returncode == 0


def test_a_new_control_node_without_a_map_is_given_it() -> None:
    """cluster add-node --role control checks the new node holds the map publish_map sent
    (a majority taking it is enough for publish_map): one that holds none (its PUT failed)
    is sent it - it answered 404 and the command failed with exit 2."""
    import asyncio

    from cli.ops import _give_new_map
    from store.client import Client

    with running_cluster("ecstore-givemap-", storage=6, control=3, gateway=False) as lc:
        spec = lc.add_node_spec("control")
        lc.start_node(spec.id)
        lc.wait_healthy([spec.id])

        async def go() -> int:
            async with Client.connect(lc.path) as c:
                none = await c.t.request("GET", spec.url, "/v1/map", ok_404=True)
                assert none.status == 404                  # started: it holds no map
                await _give_new_map(c, spec.id, spec.url)
                from placement.cluster_map import ClusterMap
                held = await c.t.request("GET", spec.url, "/v1/map")
                assert ClusterMap.from_bytes(held.body).epoch == (await c.cluster_map()).epoch
                return 0
        try:
            assert asyncio.run(go()) == 0
        finally:
            lc.stop_node(spec.id)
            lc.forget_node(spec.id)
