"""Repair: a wiped disk and deleted fragments are rebuilt; the lost are named."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from node.volumes import stored_fragments
from store.client import Client, SyncClient
from store.errors import BadRequest
from store.repair import expected_nodes
from store.striping import fragment_id
from tests.cluster.conftest import wait_for
from tests.cluster.uncached import node_counters
from tests.functional.harness import flip_last_byte, fragments_on_disk, lose_fragment

ROOT = Path(__file__).resolve().parents[2]


def run_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def objects(client: SyncClient) -> dict[str, bytes]:
    client.create_bucket("heal")
    objs = {f"obj-{i:02d}": os.urandom(1024 * 1024 * (i % 4) + 70_000 + i) for i in range(16)}
    for k, v in objs.items():
        client.put("heal", k, v)
    return objs


def every_fragment_good(cluster: LocalCluster) -> list[str]:
    """Read every fragment every live object must have; return the ones that fail."""
    async def go() -> list[str]:
        bad = []
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map()
            async for page in c.list_all("heal"):
                for o in page.objects:
                    rec = await c.live_record("heal", o.key)
                    for seg in range(rec["segments"]):
                        nodes = expected_nodes(cmap, rec, seg)
                        for i, node in enumerate(nodes):
                            fid = fragment_id(rec["version_id"], seg, i)
                            try:
                                await c.get_fragment(node, fid)
                            except Exception as exc:  # noqa: BLE001 - collected for the assert
                                bad.append(f"{fid}@{node.id}: {exc}")
        return bad
    return asyncio.run(go())


def test_wiped_node_is_rebuilt_by_repair(cluster: LocalCluster, client: SyncClient,
                                         objects: dict[str, bytes]) -> None:
    cluster.kill_node("s3")
    shutil.rmtree(Path(cluster.nodes["s3"].data))  # the whole disk replaced
    cluster.start_node("s3")
    cluster.wait_healthy(["s3"])
    assert every_fragment_good(cluster)  # the wipe is visible
    # up, and said to be empty: a replaced disk showed as any other node (runbook sweep)
    st = run_cli(cluster, "status")
    assert st.returncode == 0, st.stderr.decode()
    # (a node slow to answer on a loaded machine may be noted too: not this test's)
    [note] = [ln for ln in st.stdout.decode().splitlines() if ln.startswith("note:")
              and " holds " in ln]
    assert note.startswith("note: s3 holds no fragments while ") and "ecstore repair" in note
    dry = run_cli(cluster, "repair", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr.decode()
    report = json.loads(dry.stdout)
    assert report["fragments_missing"] > 0 and report["fragments_rebuilt"] == 0
    real = run_cli(cluster, "repair", "--json", "--restart")
    assert real.returncode == 0, real.stderr.decode()
    done = json.loads(real.stdout)
    assert done["fragments_rebuilt"] == report["fragments_missing"]
    assert done["unrecoverable"] == []
    # rebuilt fragments are written uncached (nobody is about to read them): every one
    # on s3, restarted empty, where this kernel takes such writes
    s3 = node_counters(cluster, "s3")
    assert s3["uncached_writes_total"] == done["fragments_rebuilt"] * s3["uncached_writes_supported"]
    assert every_fragment_good(cluster) == []
    again = json.loads(run_cli(cluster, "repair", "--json").stdout)
    assert again["fragments_missing"] == 0
    assert [n for n in json.loads(run_cli(cluster, "status", "--json").stdout)["notes"]
            if " holds " in n] == []
    for k, v in objects.items():
        assert client.get("heal", k) == v


def test_interrupted_repair_resumes_and_finishes(cluster: LocalCluster, client: SyncClient,
                                                 objects: dict[str, bytes]) -> None:
    s5 = cluster.nodes["s5"]
    for fid in fragments_on_disk(s5.data):     # every fragment s5 held, lost
        lose_fragment(s5.url, cluster.secret, fid)

    state = cluster.dir / "repair.state.json"
    slow = subprocess.Popen([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                             "repair", "--rate", "0.3", "--json"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(state.exists, timeout_s=60, what="the repair's first saved position")
    finally:
        slow.kill()  # SIGKILL in the middle of the pass
        slow.wait(timeout=10)
    done_before = json.loads(state.read_text())
    assert done_before["key"] < max(objects)
    rest = run_cli(cluster, "repair", "--json")
    assert rest.returncode == 0, rest.stderr.decode()
    checked = json.loads(rest.stdout)["objects_checked"]
    assert 0 < checked < len(objects)  # it went on from where the killed run stopped
    assert not (cluster.dir / "repair.state.json").exists()
    assert every_fragment_good(cluster) == []


def test_corruption_on_two_nodes_is_scrubbed_and_repaired(cluster: LocalCluster,
                                                           client: SyncClient,
                                                           objects: dict[str, bytes]) -> None:
    flipped = []
    for node in ("s2", "s6"):
        data = cluster.nodes[node].data
        for fid in sorted(fragments_on_disk(data))[:3]:
            flip_last_byte(data, fid)
            flipped.append(fid)
    for k, v in objects.items():  # never served corrupt meanwhile
        assert client.get("heal", k) == v
    scrub = run_cli(cluster, "scrub", "--json")
    found = [f for n in json.loads(scrub.stdout)["nodes"] for f in n["corrupt"]]
    assert scrub.returncode == (1 if found else 0), scrub.stderr.decode()  # 1: found some
    # a GET above may have quarantined some already; scrub finds the rest
    assert set(found) <= set(flipped)
    rep = json.loads(run_cli(cluster, "repair", "--json", "--restart").stdout)
    assert rep["fragments_rebuilt"] >= len(flipped) and rep["unrecoverable"] == []
    assert every_fragment_good(cluster) == []
    for k, v in objects.items():
        assert client.get("heal", k) == v


def test_repair_counts_the_metadata_replicas_it_put_back(cluster: LocalCluster,
                                                         client: SyncClient,
                                                         objects: dict[str, bytes]) -> None:
    """A control node that missed writes while down: repair reports the records it put
    back on it. It reported 0 - its fragment pass had read every record first, and the
    read repair on the way put them back unseen (found by an operator sweep)."""
    control = sorted(i for i, n in cluster.nodes.items() if n.role == "control")
    cluster.kill_node(control[0])
    for i in range(5):
        client.put("heal", f"missed-{i}", os.urandom(200_000 + i))
    cluster.start_node(control[0])
    cluster.wait_healthy([control[0]])
    dry = json.loads(run_cli(cluster, "repair", "--json", "--dry-run", "--restart").stdout)
    assert dry["metadata"]["copied"] >= 5
    proc = run_cli(cluster, "repair", "--json", "--restart")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["metadata"]["copied"] >= 5
    again = json.loads(run_cli(cluster, "repair", "--json", "--restart").stdout)
    assert again["metadata"]["copied"] == 0


def node_status(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client.connect(cluster.path) as c:
            reply = await c.t.request("GET", cluster.nodes[node_id].url, "/v1/status")
            return json.loads(reply.body)  # type: ignore[no-any-return]
    return asyncio.run(go())


def damage_said(cluster: LocalCluster, node_id: str) -> list[str]:
    return [p for p in node_status(cluster, node_id)["problems"] if "damaged bytes" in p]


def test_damaged_bytes_are_said_until_a_repair_then_rewritten_away(
        cluster: LocalCluster, client: SyncClient, objects: dict[str, bytes]) -> None:
    """A record whose header fails its check when a node opens its volumes: its fragment
    is missing there, and status says so. After a repair that rebuilt it, status stops
    saying so and the volume is rewritten without the damage - before, nothing took it
    away: status named it after every repair and every restart (the scan at open found
    the same bytes again)."""
    node_id = "s3"
    data = cluster.nodes[node_id].data
    held = stored_fragments(data)
    victim = sorted(held)[len(held) // 2]
    path, body_off, _ = held[victim]
    with open(path, "r+b") as f:       # a bit flipped in the record's header
        f.seek(body_off - 5)
        b = f.read(1)
        f.seek(body_off - 5)
        f.write(bytes([b[0] ^ 0x40]))
    cluster.stop_node(node_id)
    cluster.start_node(node_id)
    cluster.wait_healthy([node_id])
    [said] = damage_said(cluster, node_id)
    assert os.path.basename(path) in said and "ecstore repair" in said
    assert victim not in fragments_on_disk(data)

    dry = run_cli(cluster, "repair", "--json", "--restart", "--dry-run")
    assert json.loads(dry.stdout)["damage_cleared"] == {}     # a dry run rebuilds nothing
    assert len(damage_said(cluster, node_id)) == 1

    async def tell(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        async with Client.connect(cluster.path) as c:
            r = await c.t.request("POST", cluster.nodes[node_id].url, "/v1/repaired",
                                  query=query, ok_404=True)
            return r.status, json.loads(r.body)
    # a listing from before the node's restart proves nothing about what it opened since
    status, said = asyncio.run(tell({"opened": "0123456789abcdef"}))
    assert status == 200 and said["cleared"] == [] and "restarted" in said["why"]
    with pytest.raises(BadRequest):
        asyncio.run(tell({}))
    assert len(damage_said(cluster, node_id)) == 1
    proc = run_cli(cluster, "repair", "--json", "--restart")
    assert proc.returncode == 0, proc.stderr.decode()
    rep = json.loads(proc.stdout)
    assert rep["fragments_rebuilt"] >= 1
    assert rep["damage_cleared"] == {node_id: [os.path.basename(path)]}, rep
    assert damage_said(cluster, node_id) == []
    wait_for(lambda: not os.path.exists(path), what="the damaged volume rewritten")
    assert victim in fragments_on_disk(data)

    cluster.stop_node(node_id)
    cluster.start_node(node_id)
    cluster.wait_healthy([node_id])
    assert damage_said(cluster, node_id) == []       # the damage is gone from the disk
    assert every_fragment_good(cluster) == []
    for k, v in objects.items():
        assert client.get("heal", k) == v


def test_the_admin_commands_hold_no_inline_bytes_and_write_none_back(
        cluster: LocalCluster, client: SyncClient) -> None:
    """repair, rebalance and gc read every record through live_records without an inline
    object's bytes (up to 64 KiB each, held for the whole pass); the records the nodes
    hold keep them - a control node that missed the put is given the record whole by the
    read repair of rebalance's and gc's reads, never the copy they hold."""
    from store.wire import unpack
    from store.workers import live_records
    client.create_bucket("inl")
    body = os.urandom(60_000)

    async def owners() -> list[str]:
        async with Client.connect(cluster.path) as c:
            return [n.id for n in (await c.cluster_map()).control_nodes_for("inl/small")]
    lagging = asyncio.run(owners())[0]
    cluster.stop_node(lagging)
    try:
        client.put("inl", "small", body)
    finally:
        cluster.start_node(lagging)
        cluster.wait_healthy([lagging])

    async def go() -> tuple[Any, Any, list[Any]]:
        async with Client.connect(cluster.path) as c:
            lean = [r async for b, _, r in live_records(c, inline_bytes=False) if b == "inl"]
            whole = [r async for b, _, r in live_records(c, read_repair=False) if b == "inl"]
            held = []
            for node in (await c.cluster_map()).control_nodes_for("inl/small"):
                r = await c.t.request("GET", node.address, "/v1/objects/inl/small", ok_404=True)
                held.append(None if r.status == 404 else unpack(r.body)["inline"])
            return lean, whole, held
    for cmd in (["rebalance", "--json"], ["gc", "--json", "--force", "--grace", "0"],
                ["repair", "--json", "--restart"]):
        proc = run_cli(cluster, *cmd)
        assert proc.returncode == 0, (cmd, proc.stdout.decode(), proc.stderr.decode())
    lean, whole, held = asyncio.run(go())
    assert [r["inline"] for r in lean] == [b""] and [r["inline"] for r in whole] == [body]
    assert held == [body, body, body]       # the lagging replica got it whole
    assert client.get("inl", "small") == body


def test_unrecoverable_objects_are_named(cluster: LocalCluster, client: SyncClient,
                                         objects: dict[str, bytes]) -> None:
    vid = client.head("heal", "obj-01").version_id
    held = sorted((n.id, fid) for n in cluster.nodes.values() if n.role == "storage"
                  for fid in fragments_on_disk(n.data) if fid.startswith(f"{vid}.0."))
    assert len(held) == 6
    for node_id, fid in held[:3]:  # m + 1 fragments of segment 0 gone
        lose_fragment(cluster.nodes[node_id].url, cluster.secret, fid)
    proc = run_cli(cluster, "repair", "--json", "--restart")
    assert proc.returncode == 1
    rep = json.loads(proc.stdout)
    assert rep["unrecoverable"] == ["heal/obj-01"]
    text = run_cli(cluster, "repair", "--restart")
    assert b"unrecoverable" in text.stdout and b"heal/obj-01" in text.stdout


def test_repair_and_rebalance_found_from_the_environment_keep_state_under_home(
        cluster: LocalCluster, objects: dict[str, bytes], tmp_path: Path) -> None:
    """Inside the containers the CLI finds the cluster from $ECSTORE_CONTROL and
    $ECSTORE_SECRET and runs where there is no .ecstore directory: repair and rebalance
    keep their position under ~/.ecstore (made if missing) instead of ending in a
    traceback at the first object they save."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ECSTORE_CLUSTER"}
    env.update(ECSTORE_CONTROL=",".join(n.url for n in cluster.nodes.values()
                                        if n.role == "control"),
               ECSTORE_SECRET=cluster.secret, HOME=str(home),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    for cmd in ("repair", "rebalance"):
        r = subprocess.run([sys.executable, "-m", "cli.main", cmd, "--json"], cwd=work,
                           env=env, capture_output=True, timeout=300)
        assert b"Traceback" not in r.stderr, r.stderr.decode()
        report = json.loads(r.stdout)   # the whole pass ran (its exit code and failures
        assert report["objects_checked"] >= len(objects)   # depend on what earlier tests lost)
    assert (home / ".ecstore").is_dir()     # where the position was kept
    assert not (work / ".ecstore").exists()


def test_a_position_that_cannot_be_saved_does_not_stop_the_pass(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    from store.workers import Checkpoint
    blocker = tmp_path / "file"
    blocker.write_text("a file where the state directory would go")
    cp = Checkpoint(blocker / "sub" / "repair.state.json")
    cp.save("b", "k1")                  # cannot make the directory: a warning, no raise
    assert cp.path is None and "cannot save progress" in caplog.text
    cp.save("b", "k2")
    cp.finish()
    assert cp.load() == ("", "")
    ok = Checkpoint(tmp_path / "new" / "dir" / "rebalance.state.json")
    ok.save("b", "k3")                  # a missing directory is made
    assert ok.load() == ("b", "k3")
