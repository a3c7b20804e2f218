"""Add and remove a control node: metadata moves, every key resolves with its quorum."""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient
from store.transport import quote_key
from store.wire import unpack
from tests.cluster.conftest import fill_bucket, running_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # stopped as cluster.json lists its nodes: the CLI adds and removes some
    with running_cluster("ecstore-control-", storage=6, control=3, gateway=False) as c:
        yield c


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc


@pytest.fixture(scope="module")
def objects(cluster: LocalCluster) -> dict[str, bytes]:
    objs = {f"k{i:03d}": os.urandom(100 + i) for i in range(150)}
    objs.update({f"big{i}": os.urandom(300_000 + i) for i in range(5)})
    with SyncClient(cluster.path) as c:
        c.create_bucket("meta")
        for k, v in objs.items():
            c.put("meta", k, v)
    return objs


@pytest.fixture(scope="module")
def many(cluster: LocalCluster) -> list[str]:
    """Keys of one bucket with more records than a page of a control node's listing
    (1,000): a metadata move pages through them."""
    keys = [f"m{i:04d}" for i in range(1_050)]

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            await fill_bucket(c, "many", keys)
    asyncio.run(go())
    return keys


@pytest.fixture(scope="module")
def noted(cluster: LocalCluster) -> dict[str, str]:
    """Keys of bucket "noted" whose records replaced a version every replica noted (gc
    keeps it for its grace after): {key: that version}. The version replaced is a record
    committed with an id dated a minute back, so that it counts as long-lived (a version
    replaced within 10 s of its creation is not noted) without a wait."""
    keys = [f"n{i:02d}" for i in range(24)]

    async def go() -> dict[str, str]:
        out = {}
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("noted")
            for key in keys:
                await c.put("noted", key, os.urandom(100_000))   # erasure-coded: noted
                rec = await c.live_record("noted", key)
                old = f"{time.time_ns() - 60 * 10**9:016x}{secrets.token_hex(8)}"
                await c.commit("noted", key, {**rec, "version_id": old, "ts": rec["ts"] + 1})
                await c.put("noted", key, os.urandom(100_001))
                out[key] = old
        return out
    got = asyncio.run(go())
    for _ in range(100):        # the third replica's write may land after the quorum's
        if all(notes_held(cluster, k, owners(cluster, k, "noted")) == {old}
               for k, old in got.items()):
            return got
        time.sleep(0.05)
    raise AssertionError("not every replica noted the versions replaced")


def notes_held(cluster: LocalCluster, key: str, nodes: set[str]) -> set[str]:
    """The versions replaced that each of `nodes` noted for noted/key - only those all
    noted (asked as gc asks)."""
    async def go() -> set[str]:
        held: list[set[str]] = []
        async with Client.connect(cluster.path) as c:
            urls = LocalCluster.load(cluster.dir).nodes
            for n in sorted(nodes):
                r = await c.t.request("GET", urls[n].url, "/v1/list/noted", query={
                    "prefix": key, "limit": 1, "replaced": 1, "notes": 1})
                held.append({v for v, _ in unpack(r.body)["replaced"].get(key, [])})
        return set.intersection(*held) if held else set()
    return asyncio.run(go())


def holders(cluster: LocalCluster, key: str, bucket: str = "meta") -> set[str]:
    """Which running control nodes hold a record for bucket/key (asked directly)."""
    async def go() -> set[str]:
        out = set()
        async with Client.connect(cluster.path) as c:
            for n in LocalCluster.load(cluster.dir).nodes.values():
                if n.role != "control" or n.id not in LocalCluster.load(cluster.dir).running():
                    continue
                r = await c.t.request("GET", n.url, f"/v1/objects/{bucket}/{quote_key(key)}",
                                      ok_404=True)
                if r.status == 200:
                    out.add(n.id)
        return out
    return asyncio.run(go())


def owners(cluster: LocalCluster, key: str, bucket: str = "meta") -> set[str]:
    async def go() -> set[str]:
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map(refresh=True)
            return {n.id for n in cmap.control_nodes_for(f"{bucket}/{key}")}
    return asyncio.run(go())


def check_all(cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    with SyncClient(cluster.path) as c:
        for k, v in objects.items():
            assert c.get("meta", k) == v, k
        listed = []
        after = ""
        for _ in range(100):
            page = c.list("meta", start_after=after)
            listed += [o.key for o in page.objects]
            if not page.truncated:
                break
            after = page.next_start_after
        assert listed == sorted(objects)


def test_add_a_control_node_moves_metadata(cluster: LocalCluster, objects: dict[str, bytes],
                                           many: list[str], noted: dict[str, str]) -> None:
    """... and the notes of the versions each key's records replaced go along (gc reads
    them where the key is now: they went with the record they were beside)."""
    before = {k: owners(cluster, k, "noted") for k in noted}
    added = json.loads(cli(cluster, "cluster", "add-node", "--data", str(cluster.dir),
                           "--role", "control", "--json").stdout)
    assert (added["id"], added["role"], added["tier"]) == ("c4", "control", "")
    assert added["url"] == LocalCluster.load(cluster.dir).nodes["c4"].url
    # tiers are the storage rings': no control node shows one (the first ones said hot,
    # an added one control)
    rows = json.loads(cli(cluster, "status", "--json").stdout)["nodes"]
    assert {(n["role"], n["tier"]) for n in rows} == {("control", ""), ("storage", "hot")}
    assert "c4" in {n["id"] for n in rows if n["role"] == "control"}
    check_all(cluster, objects)  # before the move: readers also ask the previous owners
    table = cli(cluster, "rebalance").stdout.decode()
    # what moved, though the reads before it (rebalance's own) put records on c4 already
    row = [line for line in table.splitlines() if "metadata records moved off old nodes" in line]
    assert row and int(row[0].split()[-1]) > 0, table
    check_all(cluster, objects)
    moved_to_c4 = 0
    for k in list(objects)[:60]:
        assert holders(cluster, k) == owners(cluster, k), k
        moved_to_c4 += "c4" in owners(cluster, k)
    assert moved_to_c4 > 0
    # past the first page of a bucket's listing too (rebalance ended in a KeyError there)
    for k in many[-30:]:
        assert holders(cluster, k, "many") == owners(cluster, k, "many"), k
    moved = [k for k in noted if "c4" in owners(cluster, k, "noted") - before[k]]
    assert moved
    for k, old in noted.items():
        assert notes_held(cluster, k, owners(cluster, k, "noted")) == {old}, k


def test_remove_a_control_node_moves_metadata_off_it(cluster: LocalCluster,
                                                     objects: dict[str, bytes],
                                                     noted: dict[str, str]) -> None:
    proc = cli(cluster, "cluster", "remove-node", "--data", str(cluster.dir), "c1", "--json")
    done = json.loads(proc.stdout)
    assert (done["id"], done["role"]) == ("c1", "control")
    assert done["metadata"]["failed"] == 0 and done["metadata"]["copied"] > 0
    assert done["metadata"]["dropped"] > 0
    assert f"moved {done['metadata']['dropped']} metadata records while draining c1" \
        in proc.stderr.decode()
    assert "c1" not in LocalCluster.load(cluster.dir).nodes
    check_all(cluster, objects)
    for k in list(objects)[:60]:
        assert holders(cluster, k) == owners(cluster, k), k
    for k, old in noted.items():     # those that were on c1 too
        assert notes_held(cluster, k, owners(cluster, k, "noted")) == {old}, k
    with SyncClient(cluster.path) as c:
        c.put("meta", "after-removal", b"still writable")
        assert c.get("meta", "after-removal") == b"still writable"


def test_reads_while_a_move_is_unsettled_put_no_record_back_on_a_node_it_left(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """A control node added, the metadata moved but the ring not settled yet: reads then
    ask the previous owners too, and their read repair wrote each record back onto a
    previous owner the move had dropped it from - where it outlived the move, and later
    brought a deleted object back once gc had purged its tombstone from the owners (a
    walk-through found it). Read repair now writes to the owners only."""
    from store.metamove import move_metadata
    added = json.loads(cli(cluster, "cluster", "add-node", "--data", str(cluster.dir),
                           "--role", "control", "--json").stdout)["id"]
    cli(cluster, "rebalance", "--dry-run")      # writes nothing: the new node still empty
    assert not any(added in holders(cluster, k) for k in objects)   # (its reads repaired)

    async def move_then_read() -> int:
        async with Client.connect(cluster.path) as c:
            report = await move_metadata(c)          # moved; the ring is left unsettled
            assert report.failed == 0, report.errors
            assert (await c.cluster_map(refresh=True)).previous_control is not None
            for k, v in objects.items():
                assert await c.get("meta", k) == v
            return report.dropped
    assert asyncio.run(move_then_read()) > 0        # close() waited for the repairs
    for k in objects:
        assert holders(cluster, k) == owners(cluster, k), k
    cli(cluster, "rebalance")                         # settles it
    cli(cluster, "cluster", "remove-node", "--data", str(cluster.dir), added)   # as it was
    with SyncClient(cluster.path) as c:
        for k, v in objects.items():
            assert c.get("meta", k) == v, k
    for k in list(objects)[:40]:
        assert holders(cluster, k) == owners(cluster, k), k


def test_a_metadata_move_carries_more_notes_than_one_request_takes(
        cluster: LocalCluster) -> None:
    """A key overwritten by big multipart objects holds tens of thousands of young notes;
    a control node takes at most 20,000 a request (node.metadb.MAX_CARRIED_NOTES), so the
    move sends them in parts - in one, it was refused, and that record never moved."""
    from store.metamove import MetaMoveReport, _carry_notes, _page_notes
    from store.wire import pack
    now = time.time_ns()
    notes = [[f"{now - 600 * 10**9 + i:016x}{i:016x}", now - i] for i in range(25_000)]

    async def go() -> tuple[MetaMoveReport, int]:
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map(refresh=True)
            src, dst = cmap.control.nodes[0], cmap.control.nodes[1]
            for at in range(0, len(notes), 12_500):
                await c.t.request("POST", src.address, "/v1/notes/noted/bulk",
                                  body=pack(notes[at:at + 12_500]))
            report = MetaMoveReport()
            read = await _page_notes(c, src, "noted", "bulk-", "bulk", report)
            assert read == {}                                   # none in that range
            read = await _page_notes(c, src, "noted", "", "bulk", report)
            assert read is not None and len(read["bulk"]) == len(notes)
            assert await _carry_notes(c, (dst,), "noted", "bulk", read["bulk"], report)
            r = await c.t.request("GET", dst.address, "/v1/list/noted", query={
                "prefix": "bulk", "limit": 1, "replaced": 1, "notes": 1})
            return report, len(unpack(r.body)["replaced"]["bulk"])
    report, held = asyncio.run(go())
    assert report.failed == 0 and report.errors == [], report.errors
    assert held == len(notes)


def test_a_metadata_move_reads_a_page_of_records_notes_in_as_many_pages_as_it_takes(
        cluster: LocalCluster, noted: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A metadata move reads the notes of a page of records through the notes-only
    listing, resumed page after page up to the page's last key (3 keys a page here): it
    gets exactly what each key's own notes read gives, and nothing past that key."""
    from store import metamove
    monkeypatch.setattr(metamove, "NOTES_PAGE", 3)
    keys = sorted(noted)
    last = keys[len(keys) * 2 // 3]

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map(refresh=True)
            for node in cmap.control.nodes:
                want = {}
                for key in keys:
                    r = await c.t.request("GET", node.address, "/v1/list/noted", query={
                        "prefix": key, "limit": 1, "replaced": 1, "notes": 1})
                    entries = unpack(r.body)["replaced"].get(key)
                    if entries and keys[0] < key <= last:
                        want[key] = entries
                report = metamove.MetaMoveReport()
                got = await metamove._page_notes(c, node, "noted", keys[0], last, report)
                assert got == want and report.failed == 0, (node.id, report.errors)
                assert len(want) > 3, node.id      # more than one page of them
    asyncio.run(go())


def test_notes_of_another_shape_are_refused_with_a_reason(cluster: LocalCluster) -> None:
    from store.errors import BadRequest
    from store.names import PARTS_BUCKET
    from store.wire import pack

    async def go() -> list[str]:
        out = []
        async with Client.connect(cluster.path) as c:
            node = (await c.cluster_map()).control.nodes[0]
            for bucket, body in (("noted", pack({"v": 1})), ("noted", pack([["v", "late"]])),
                                 ("noted", pack([["v", 1, 2]])), ("noted", b"\xc1"),
                                 (PARTS_BUCKET, pack([["v", 1]]))):
                with pytest.raises(BadRequest) as exc:
                    await c.t.request("POST", node.address, f"/v1/notes/{bucket}/k", body=body)
                out.append(exc.value.message)
        return out
    reasons = asyncio.run(go())
    assert all(reasons), reasons
    assert "keeps no notes" in reasons[-1]


def cli_raw(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=300)


def test_a_control_node_removal_cut_short_finishes_when_run_again(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """`cluster remove-node` of a control node killed after its ring change (the node out
    of the map, its records not moved, the control ring not settled), then run again: it
    took the storage drain path, stopped the node and left the ring unsettled for good -
    every later ring change refused, `rebalance` failing on the stopped node with no word
    of why. Now the rerun takes the control path: for a node dead for good it fails
    saying to use --force, which settles the ring without it (repair makes the replicas
    anew); rebalance names the metadata errors; two add/remove-node at once are refused
    (one lost a node from cluster.json); a new node never takes a removed one's data
    directory."""
    data = str(cluster.dir)
    objects = {**objects, "after-removal": b"still writable"}   # the test before put it
    added = json.loads(cli(cluster, "cluster", "add-node", "--data", data, "--role",
                           "control", "--json").stdout)["id"]
    cli(cluster, "rebalance")
    cli(cluster, "ring", "remove", added)          # where the killed run stopped
    LocalCluster.load(cluster.dir).stop_node(added)   # and the node died
    r = cli_raw(cluster, "rebalance")
    said = b" ".join(r.stderr.split()).decode()
    assert r.returncode == 1 and f"metadata: {added}" in said, said
    assert "control ring stays unsettled" in said, said
    # gc reads the notes of replaced versions on the previous control ring's nodes too
    # (records not moved yet are there): it stops, naming the node and what to do
    r = cli_raw(cluster, "gc", "--dry-run")
    said = b" ".join(r.stderr.split()).decode()
    assert r.returncode == 1 and f"{added} did not answer" in said, said
    assert "previous control ring" in said and f"remove-node {added} --force" in said, said

    with open(cluster.dir / "cluster-change.lock", "a+") as held:   # another one runs
        fcntl.flock(held, fcntl.LOCK_EX)
        r = cli_raw(cluster, "cluster", "remove-node", "--data", data, added)
        assert r.returncode == 2, r.stderr
        assert b"another cluster add-node or remove-node is running" in r.stderr

    r = cli_raw(cluster, "cluster", "remove-node", "--data", data, added)
    said = b" ".join(r.stderr.split()).decode()
    assert r.returncode == 1 and f"remove-node {added} --force" in said, said
    done = json.loads(cli(cluster, "cluster", "remove-node", "--data", data, added, "--force",
                          "--json").stdout)
    assert done["role"] == "control" and done["settled_without"] >= 1, done
    assert json.loads(cli(cluster, "ring", "show", "--json").stdout)["rebalance_pending"] == []
    assert added not in LocalCluster.load(cluster.dir).nodes
    cli(cluster, "repair")
    check_all(cluster, objects)
    for k in list(objects)[:40]:
        assert holders(cluster, k) == owners(cluster, k), k
    # its directory is left, and the next node is not given it
    nxt = LocalCluster.load(cluster.dir).add_node_spec("control")
    assert nxt.id != added and (cluster.dir / added).is_dir()


def test_a_cluster_grown_from_one_control_node_keeps_three_replicas() -> None:
    """Started with one control node (R = 1) and grown to three with `cluster add-node`:
    the map raises R to 3 (W 2, read 2), every record reaches three nodes, and any one
    control node can then be killed without losing a read, a listing or a write. Every
    object reads back before each move too (readers count with the old R meanwhile).
    Removing a control node would now leave fewer nodes than R: refused, with the way out."""
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-control-grow-"))
    cluster = LocalCluster.create(tmp, storage=6, control=1, gateway=False)
    cluster.start()
    try:
        objs = {f"k{i:03d}": os.urandom(50 + i) for i in range(40)}
        objs["big"] = os.urandom(300_000)
        with SyncClient(cluster.path) as c:
            c.create_bucket("meta")
            for k, v in objs.items():
                c.put("meta", k, v)
        for expect in ("c2", "c3"):
            added = json.loads(cli(cluster, "cluster", "add-node", "--data", str(tmp),
                                   "--role", "control", "--json").stdout)
            assert added["id"] == expect
            check_all(cluster, objs)     # not moved yet: reads ask where records were
            cli(cluster, "rebalance")
            check_all(cluster, objs)
        shown = json.loads(cli(cluster, "ring", "show", "--json").stdout)
        assert shown["metadata"] == {"replicas": 3, "write_quorum": 2, "read_quorum": 2}
        assert shown["rebalance_pending"] == []
        for k in list(objs)[:20]:
            assert holders(cluster, k) == {"c1", "c2", "c3"}, k
        refused = cli_raw(cluster, "cluster", "remove-node", "--data", str(tmp), "c2")
        assert refused.returncode == 2
        said = " ".join(refused.stderr.decode().split())
        assert "keeps 2 nodes for 3 replicas" in said and "Add a control node first" in said
        assert "c2" in LocalCluster.load(tmp).running()
        for victim in ("c1", "c3"):      # one down at a time
            LocalCluster.load(tmp).kill_node(victim)
            check_all(cluster, objs)
            with SyncClient(cluster.path) as c:
                c.put("meta", f"while-{victim}-down", b"written")
            objs[f"while-{victim}-down"] = b"written"
            LocalCluster.load(tmp).start_node(victim)
            LocalCluster.load(tmp).wait_healthy([victim])
        check_all(cluster, objs)
    finally:
        LocalCluster.load(tmp).stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_ring_add_refuses_a_node_that_does_not_answer_as_itself(cluster: LocalCluster) -> None:
    """A typo in --url, a node not started yet, or the URL of another node: `ring add`
    asks the node (a request signed with the cluster secret) and refuses - exit 2, the
    map unchanged - instead of giving placements to a node every write would fail on."""
    before = json.loads(cli(cluster, "ring", "show", "--json").stdout)["epoch"]
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]     # nothing listens there once closed
    nowhere = cli_raw(cluster, "ring", "add", "s9", "--url", f"http://127.0.0.1:{closed}")
    assert nowhere.returncode == 2
    said = " ".join(nowhere.stderr.decode().split())
    assert "storage node s9 at" in said and "does not answer" in said
    control = next(n for n in LocalCluster.load(cluster.dir).nodes.values() if n.role == "control")
    other = cli_raw(cluster, "ring", "add", "s9", "--url", control.url)
    assert other.returncode == 2
    said = " ".join(other.stderr.decode().split())     # rich wraps at 80 columns
    assert f"answers as control node {control.id}, not as storage node s9" in said
    assert json.loads(cli(cluster, "ring", "show", "--json").stdout)["epoch"] == before


def held_by(cluster: LocalCluster, node_id: str, bucket: str, key: str) -> dict | None:
    """The record of bucket/key on one control node (asked directly), or None."""
    async def go() -> dict | None:
        from store.wire import unpack
        async with Client.connect(cluster.path) as c:
            url = LocalCluster.load(cluster.dir).nodes[node_id].url
            r = await c.t.request("GET", url, f"/v1/objects/{bucket}/{quote_key(key)}",
                                  ok_404=True)
            return None if r.status == 404 else unpack(r.body)
    return asyncio.run(go())


def test_repair_gives_a_wiped_control_node_its_records_back(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """A control node whose disk was replaced (its data directory wiped) comes back empty.
    Reads put back only the records they read - an object's, when a repair or a get reads
    it - never an S3 key's, a tombstone or an upload's, so a second node's disk lost later
    took the only other copy of those (found by a sweep). `repair` now puts every record
    back onto each of its replicas: two disks wiped one after the other, with a repair
    between, lose nothing."""
    key = json.loads(cli(cluster, "key", "create", "--user", "wiped", "--json").stdout)
    with SyncClient(cluster.path) as c:
        c.put("meta", "deleted-later", b"x")
        c.delete("meta", "deleted-later")
    control = sorted(n for n, spec in LocalCluster.load(cluster.dir).nodes.items()
                     if spec.role == "control")
    assert len(control) == 3
    for victim in control[:2]:
        lc = LocalCluster.load(cluster.dir)
        lc.stop_node(victim)
        shutil.rmtree(lc.nodes[victim].data)
        cli(cluster, "cluster", "up", "--data", str(cluster.dir), "--detach")
        assert held_by(cluster, victim, "_keys", key["access_key"]) is None
        # `up` like the others, and said to be (nearly) empty: it looked like any other node
        notes = [n for n in json.loads(cli(cluster, "status", "--json").stdout)["notes"]
                 if " holds " in n]     # not a node slow to answer on a loaded machine
        assert [n.split()[0] for n in notes] == [victim], notes
        assert "ecstore repair" in notes[0]
        rep = json.loads(cli(cluster, "repair", "--json").stdout)
        assert rep["metadata"]["failed"] == 0 and rep["metadata"]["copied"] > 0, rep["metadata"]
        assert [n for n in json.loads(cli(cluster, "status", "--json").stdout)["notes"]
                if " holds " in n] == []
        assert held_by(cluster, victim, "_keys", key["access_key"]) is not None
        tomb = held_by(cluster, victim, "meta", "deleted-later")
        assert tomb is not None and tomb["deleted"]
        for k in list(objects)[:20]:
            assert victim in holders(cluster, k), (victim, k)
    with SyncClient(cluster.path) as c:     # and the objects the tests before wrote
        written = {o.key: c.get("meta", o.key) for o in c.list("meta", max_keys=1000).objects
                   if o.key not in objects}
    assert set(written) <= {"after-removal"}
    check_all(cluster, {**objects, **written})
    keys = json.loads(cli(cluster, "key", "list", "--json").stdout)
    assert key["access_key"] in [k["access_key"] for k in keys]
