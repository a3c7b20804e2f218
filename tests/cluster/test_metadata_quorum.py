"""Metadata quorum: a replica that missed a write is repaired by the next read."""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.transport import Transport
from store.wire import unpack
from tests.cluster.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


def replica_versions(cluster: LocalCluster, bucket: str, key: str) -> dict[str, str | None]:
    async def go() -> dict[str, str | None]:
        t = Transport(cluster.secret)
        out: dict[str, str | None] = {}
        try:
            for n in cluster.nodes.values():
                if n.role != "control":
                    continue
                r = await t.request("GET", n.url, f"/v1/objects/{bucket}/{key}", ok_404=True)
                out[n.id] = None if r.status == 404 else unpack(r.body)["version_id"]
        finally:
            await t.close()
        return out
    return asyncio.run(go())


def test_stale_replica_is_repaired_on_read(cluster: LocalCluster, client: SyncClient,
                                           all_up: LocalCluster) -> None:
    client.create_bucket("quorum")
    client.put("quorum", "k", b"first")
    cluster.kill_node("c1")
    new = client.put("quorum", "k", b"second" * 1000)
    cluster.start_node("c1")
    cluster.wait_healthy(["c1"])
    before = replica_versions(cluster, "quorum", "k")
    assert before["c1"] != new.version_id  # c1 missed the overwrite
    assert client.get("quorum", "k") == b"second" * 1000
    wait_for(lambda: set(replica_versions(cluster, "quorum", "k").values()) == {new.version_id},
             what="read repair of the stale replica")


def test_newest_wins_whatever_the_order_of_arrival() -> None:
    from store.metadata import newest
    a = {"ts": 5, "version_id": "b"}
    b = {"ts": 5, "version_id": "c"}
    c = {"ts": 4, "version_id": "z"}
    assert newest([a, None, b, c]) is b
    assert newest([None, None]) is None


def test_a_record_only_the_last_replica_holds_is_read(cluster: LocalCluster,
                                                      all_up: LocalCluster) -> None:
    """Two of three replicas answer "none" first - one missed the writes while down, the
    other's disk was wiped - and the third holds the record: the read waits briefly for
    the third instead of calling the object missing (it did, for whichever keys the third
    answered last; a repair would have put the records back, a get before it said 404)."""
    control = sorted(i for i, n in cluster.nodes.items() if n.role == "control")
    assert len(control) == 3
    keys = [f"k{i:02d}" for i in range(30)]
    with SyncClient(cluster.path) as c:
        c.create_bucket("lastcopy")
        cluster.kill_node(control[0])
        for k in keys:
            c.put("lastcopy", k, k.encode() * 3)
    cluster.stop_node(control[1])
    shutil.rmtree(cluster.nodes[control[1]].data)
    for i in control[:2]:
        cluster.start_node(i)
    cluster.wait_healthy(control[:2])
    for k in keys[:3]:
        held = replica_versions(cluster, "lastcopy", k)
        assert held[control[0]] is None and held[control[1]] is None and held[control[2]]
    with SyncClient(cluster.path) as c:
        assert {k: c.get("lastcopy", k) for k in keys} == {k: k.encode() * 3 for k in keys}
    wait_for(lambda: None not in replica_versions(cluster, "lastcopy", keys[-1]).values(),
             what="read repair of the replicas that had no record")


class SkewedClock:
    """The time module as a host whose clock runs `ahead_s` fast sees it (time_ns)."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_ns = int(ahead_s * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.ahead_ns

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_writer_whose_clock_runs_ahead_is_named_by_status(
        cluster: LocalCluster, all_up: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are ordered by their writers' clocks: a put from a host whose clock runs a
    minute fast outranks the puts after it from hosts with a right clock - acknowledged,
    and not seen - for that minute. Nothing said so; the control nodes now note a record
    dated ahead of their clock (status degraded for 5 minutes, the log, a counter)."""
    with SyncClient(cluster.path) as c:
        c.create_bucket("clock")
        c.put("clock", "k", b"from a right clock, before")
    for module in ("store.client_base", "store.client_put"):    # where records are dated
        monkeypatch.setattr(f"{module}.time", SkewedClock(60.0))
    with SyncClient(cluster.path) as fast:
        fast.put("clock", "k", b"from a clock a minute fast")
    monkeypatch.undo()
    with SyncClient(cluster.path) as c:
        c.put("clock", "k", b"from a right clock, after")    # acknowledged ...
        assert c.get("clock", "k") == b"from a clock a minute fast"   # ... and outranked
        # but a put after a read of that record is dated after it (Client.record_ts): the
        # order the writers saw is kept (it was outranked too)
        c.put("clock", "k", b"from a right clock, having read it")
        assert c.get("clock", "k") == b"from a right clock, having read it"
    with SyncClient(cluster.path) as other:     # another process: it reads, then writes
        assert other.get("clock", "k") == b"from a right clock, having read it"
        other.put("clock", "k", b"from another right clock, having read it")
        assert other.get("clock", "k") == b"from another right clock, having read it"
    st = subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                         "status", "--json"], cwd=ROOT, capture_output=True, timeout=60)
    assert st.returncode == 3, st.stderr.decode()
    rows = {r["id"]: r for r in json.loads(st.stdout)["nodes"]}
    control = sorted(i for i, n in cluster.nodes.items() if n.role == "control")
    named = [i for i in control if any("dated" in p and "ahead of this node's clock" in p
                                       and "NTP" in p for p in rows[i]["problems"])]
    assert len(named) >= 2, {i: rows[i]["problems"] for i in control}   # the write quorum
    assert all(rows[i]["state"] == "degraded" for i in named)
    [problem] = [p for p in rows[named[0]]["problems"] if "dated" in p]
    assert re.search(r"dated (59|60)\.\d s ahead", problem), problem
    # nothing else is called a problem: storage nodes are up
    assert {r["state"] for r in rows.values() if r["role"] == "storage"} == {"up"}
