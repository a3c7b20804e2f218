"""Rebalance and drain with a storage node down: neither may settle (drop the previous
placement) while fragments it could not see may sit on the node that did not answer -
readers would stop looking there, and m more lost nodes would lose acknowledged objects."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient, expected_fragment_nodes
from store.striping import fragment_id
from tests.cluster.conftest import running_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # stopped as cluster.json lists its nodes: the CLI adds and removes some
    with running_cluster("ecstore-rebalance-down-", storage=6, control=3, gateway=False) as c:
        yield c


def run(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], cwd=ROOT, capture_output=True, timeout=300)


def ok(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    proc = run(cluster, *args)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc


def said(proc: subprocess.CompletedProcess[bytes]) -> str:
    return " ".join(proc.stderr.decode().split())      # rich wraps at 80 columns


def pending(cluster: LocalCluster) -> list[str]:
    return json.loads(ok(cluster, "ring", "show", "--json").stdout)["rebalance_pending"]


def op_state(cluster: LocalCluster, op: str) -> str:
    """The state of the op record the status page and ecstore_op_* show."""
    from store.names import OPS_BUCKET

    async def go() -> str:
        async with Client.connect(cluster.path) as c:
            rec = await c.read_record(OPS_BUCKET, op)
            return str(rec["state"]) if rec else "none"
    return asyncio.run(go())


def check_all(cluster: LocalCluster, objs: dict[str, bytes]) -> None:
    with SyncClient(cluster.path) as c:
        for k, v in objs.items():
            assert c.get("down", k) == v, k


def bring_back(cluster: LocalCluster, *ids: str) -> None:
    lc = LocalCluster.load(cluster.dir)
    for i in ids:
        lc.start_node(i)
    lc.wait_healthy(list(ids))


def check_all_without(cluster: LocalCluster, objs: dict[str, bytes], *victims: str) -> None:
    """Every object reads back with `victims` (m storage nodes) killed; then restarted."""
    lc = LocalCluster.load(cluster.dir)
    for victim in victims:
        lc.kill_node(victim)
    try:
        check_all(cluster, objs)
    finally:
        bring_back(cluster, *victims)


@pytest.fixture(scope="module")
def objects(cluster: LocalCluster) -> dict[str, bytes]:
    objs = {f"o{i:02d}": os.urandom(200_000 + 1000 * i) for i in range(30)}
    with SyncClient(cluster.path) as c:
        c.create_bucket("down")
        for k, v in objs.items():
            c.put("down", k, v)
    return objs


def test_rebalance_with_a_node_down_does_not_settle(cluster: LocalCluster,
                                                    objects: dict[str, bytes]) -> None:
    """s7 added, s3 killed, rebalance: the fragments bound for s7 that sit on s3 are found
    nowhere, so the pass is incomplete - exit 1 naming s3, the map keeps the previous
    placement. s3 back, rebalance moves them and settles; then any two nodes may be lost."""
    ok(cluster, "cluster", "add-node", "--data", str(cluster.dir))
    LocalCluster.load(cluster.dir).kill_node("s3")
    proc = run(cluster, "rebalance", "--json")
    assert proc.returncode == 1, proc.stderr.decode()
    rep = json.loads(proc.stdout)
    assert rep["unlisted"] == ["s3"] and rep["skipped"] > 0 and rep["settled"] is False
    assert "not settled: storage node s3 did not answer its listing" in said(proc)
    assert pending(cluster) == ["storage"]
    # the status page and ecstore_op_finished say it failed (they said finished)
    assert op_state(cluster, "rebalance") == "failed"
    dry = run(cluster, "rebalance", "--dry-run", "--json")   # as repair --dry-run: exit 1
    assert dry.returncode == 1 and json.loads(dry.stdout)["unlisted"] == ["s3"], said(dry)
    assert "incomplete: storage node s3 did not answer its listing" in said(dry)
    # the fragments found nowhere are counted once, not once a pass (a dead node's 516
    # read 1,032 after two passes): the one pass of the dry run finds as many
    assert rep["skipped"] == json.loads(dry.stdout)["skipped"] > 0, (rep, dry.stdout)
    assert rep["passes"] >= 2, rep     # (what makes the count above tell)
    check_all(cluster, objects)          # readers still look where the old map put them
    bring_back(cluster, "s3")
    rep = json.loads(ok(cluster, "rebalance", "--json").stdout)
    assert rep["settled"] is True and rep["unlisted"] == [] and rep["moved"] > 0
    assert op_state(cluster, "rebalance") == "finished"
    assert pending(cluster) == []
    check_all_without(cluster, objects, "s1", "s2")


def test_rebalance_with_a_node_down_and_no_ring_change_says_what_it_could_not_check(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """No ring change pending (the map has no previous placement) and s2 killed: exit 1,
    `settled` true (nothing waits for a rebalance) and s2 named as not checked - it said
    "not settled ... the map keeps the previous placement", of a map that had none."""
    assert pending(cluster) == []
    LocalCluster.load(cluster.dir).kill_node("s2")
    try:
        proc = run(cluster, "rebalance", "--json")
        assert proc.returncode == 1, proc.stderr.decode()
        rep = json.loads(proc.stdout)
        assert rep["unlisted"] == ["s2"] and rep["settled"] is True
        assert "incomplete: storage node s2 did not answer its listing" in said(proc)
        assert "not settled" not in said(proc) and "previous placement" in said(proc)
        assert pending(cluster) == []
    finally:
        bring_back(cluster, "s2")


def test_draining_a_dead_node_fails_until_repair_rebuilt_what_it_held(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """remove-node of a node that is down cannot move its fragments off it: exit 1 with
    why (and the JSON, drained false), the node kept in cluster.json. After `repair`
    rebuilt its fragments on the others, the same command drains it."""
    lc = LocalCluster.load(cluster.dir)
    assert "s7" in lc.nodes
    lc.kill_node("s7")
    proc = run(cluster, "cluster", "remove-node", "--data", str(cluster.dir), "s7", "--json")
    assert proc.returncode == 1, proc.stderr.decode()
    assert json.loads(proc.stdout)["drained"] is False
    assert "storage node s7 did not answer its listing" in said(proc)
    assert "\r" not in proc.stderr.decode()     # no progress line when not on a terminal
    assert "s7" in LocalCluster.load(cluster.dir).nodes
    check_all(cluster, objects)
    rep = json.loads(ok(cluster, "repair", "--json").stdout)
    assert rep["fragments_rebuilt"] > 0
    done = json.loads(ok(cluster, "cluster", "remove-node", "--data", str(cluster.dir), "s7",
                         "--json").stdout)
    assert done["drained"] is True
    assert "s7" not in LocalCluster.load(cluster.dir).nodes and pending(cluster) == []
    check_all_without(cluster, objects, "s4", "s5")


def test_repair_with_a_node_down_says_it_is_incomplete(cluster: LocalCluster,
                                                       objects: dict[str, bytes]) -> None:
    """The fragments the map places on a node that does not answer are neither checked nor
    rebuilt: repair said nothing was missing and exited 0. It says which node, exits 1."""
    LocalCluster.load(cluster.dir).kill_node("s6")
    try:
        proc = run(cluster, "repair", "--dry-run", "--json")
        assert proc.returncode == 1, proc.stderr.decode()
        assert json.loads(proc.stdout)["unlisted"] == ["s6"]
        assert "incomplete: storage node s6 did not answer" in said(proc)
    finally:
        bring_back(cluster, "s6")
    assert json.loads(ok(cluster, "repair", "--dry-run", "--json").stdout)["unlisted"] == []
    # an object two of whose fragments are gone (deleted) and whose third is on a node
    # that does not answer: it cannot be rebuilt now - the table says so, not
    # "unrecoverable" as if lost for good (it is not: that node back, repair rebuilds it)
    async def drop_two() -> str:
        async with Client.connect(cluster.path) as c:
            rec = await c.live_record("down", "o07")
            nodes = expected_fragment_nodes(await c.cluster_map(refresh=True), rec, 0)
            for i in (0, 1):
                await c.t.request("DELETE", nodes[i].address,
                                  f"/v1/fragments/{fragment_id(rec['version_id'], 0, i)}")
            return nodes[2].id
    third = asyncio.run(drop_two())
    LocalCluster.load(cluster.dir).kill_node(third)
    try:
        proc = run(cluster, "repair", "--dry-run")
        text = " ".join((proc.stdout + proc.stderr).decode().split())
        assert proc.returncode == 1, text
        assert "unrecoverable objects while nodes are unlisted 1" in text
        assert "unrecoverable now: down/o07" in text and "unrecoverable:" not in text, text
    finally:
        bring_back(cluster, third)
    rep = json.loads(ok(cluster, "repair", "--json").stdout)
    assert rep["unrecoverable"] == [] and rep["fragments_rebuilt"] == 2, rep
    check_all(cluster, objects)


def test_a_second_rebalance_or_repair_is_refused_while_one_runs(cluster: LocalCluster) -> None:
    """Two rebalances at once raced over the same fragments ("not found" failures) and the
    same state file; now the second is refused, naming the first's pid, until it ends."""
    from store.cluster import state_path
    from store.workers import only_one
    for what in ("rebalance", "repair"):
        with only_one(state_path(str(cluster.path), f"{what}.state.json"), what):
            proc = run(cluster, what)
            assert proc.returncode == 2, proc.stderr.decode()
            assert f"another {what} is running (pid {os.getpid()}" in said(proc)
            assert run(cluster, what, "--dry-run").returncode == 0   # reads only: allowed
        ok(cluster, what)


def test_a_stalled_storage_node_is_named_in_seconds_not_waited_out(
        cluster: LocalCluster) -> None:
    """repair, gc and rebalance list every storage node's fragments; one that is stalled
    (SIGSTOP here; a hung process or a blackholed host alike) answered nothing, and each
    command sat silent for the listing page's 60 s timeout. Each node now answers a
    health check (5 s) before it is asked for its listing."""
    import signal
    with SyncClient(cluster.path) as c:
        c.create_bucket("stalled")
        c.put("stalled", "x", os.urandom(300_000))
    lc = LocalCluster.load(cluster.dir)
    victim = sorted(n for n, spec in lc.nodes.items() if spec.role == "storage")[0]
    pid = lc.nodes[victim].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        for cmd in (["repair", "--dry-run"], ["gc", "--dry-run"]):
            # 40 s: every one of them waited 60 s before
            proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster",
                                   str(cluster.path), *cmd, "--json"], cwd=ROOT,
                                  capture_output=True, timeout=40)
            assert proc.returncode == 1, proc.stderr.decode()
            rep = json.loads(proc.stdout)
            assert rep.get("unlisted", [victim]) == [victim], rep
            assert any(f"storage node {victim} did not answer its listing (its health check"
                       in e for e in rep["errors"]), rep["errors"]
        # status names why: it said "unreachable: TimeoutError " and nothing after it
        proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster",
                               str(cluster.path), "status", "--json"], cwd=ROOT,
                              capture_output=True, timeout=40)
        row = next(n for n in json.loads(proc.stdout)["nodes"] if n["id"] == victim)
        assert row["state"] == "down" and "no answer within 3 s" in row["error"], row
    finally:
        os.kill(pid, signal.SIGCONT)


def test_rebalance_onto_a_stalled_new_node_fails_fast_and_does_not_settle(
        cluster: LocalCluster, objects: dict[str, bytes]) -> None:
    """A node added, then stalled before the rebalance: every move onto it waited out the
    copy's timeout, and the pass sat silent for many minutes (it was killed at 300 s).
    Moves onto a node that did not answer its listing are not tried: counted failed, the
    map not settled; the node back, the next run moves them and settles."""
    import signal
    added = json.loads(ok(cluster, "cluster", "add-node", "--data", str(cluster.dir),
                          "--json").stdout)["id"]
    pid = LocalCluster.load(cluster.dir).nodes[added].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster",
                               str(cluster.path), "rebalance", "--json"], cwd=ROOT,
                              capture_output=True, timeout=120)
        assert proc.returncode == 1, proc.stderr.decode()
        rep = json.loads(proc.stdout)
        assert rep["unlisted"] == [added] and rep["failed"] > 0 and rep["settled"] is False
        assert any(f"{added} did not answer its listing: fragments the map places there not "
                   "moved" in e for e in rep["errors"]), rep["errors"]
        assert pending(cluster) == ["storage"]
    finally:
        os.kill(pid, signal.SIGCONT)
    check_all(cluster, objects)
    rep = json.loads(ok(cluster, "rebalance", "--json").stdout)
    assert rep["settled"] is True and rep["moved"] > 0 and rep["failed"] == 0
    assert pending(cluster) == []
    check_all(cluster, objects)
