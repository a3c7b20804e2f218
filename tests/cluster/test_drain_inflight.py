"""Draining a node while a put that took its map before the node left is still on its
way: the put places a fragment on the leaving node and commits after the drain's pass
that would have moved it. `cluster remove-node` stopped the node anyway, and that object
was one fragment short for good (a fresh-clone CI run of test_rebalance's drain under
load left one on the drained node). The drain now waits for the fragments on the node
that a put may still commit (young versions, running puts) and moves them once committed.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient, expected_fragment_nodes
from store.striping import fragment_id
from tests.cluster.conftest import running_cluster
from tests.functional.harness import fragments_on_disk

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
LATE_COMMIT_S = 12.0    # after the drain began: past the passes of a drain that waits for nothing


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # stopped as cluster.json lists its nodes: the CLI adds and removes some
    with running_cluster("ecstore-drain-inflight-", storage=8, control=3, gateway=False) as c:
        yield c


def cli_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args, "--json"], cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_a_put_running_while_a_node_leaves_the_map_moves_its_fragments_off_it(
        cluster: LocalCluster) -> None:
    """A put takes its map once: a node taken out of the map meanwhile (a drain begins)
    kept getting its fragments, and those it had were left there - a drain that had
    already passed (its passes see committed objects only) stopped the node with them.
    Before its commit the put now copies them to where the current map places them."""
    s5 = cluster.dir / "s5"
    before = set(fragments_on_disk(s5))
    seg_bytes = 4 * MIB
    go_on = asyncio.Event()
    sent: list[bytes] = []

    async def source() -> Any:
        for i in range(9):
            if i == 8:
                await go_on.wait()          # the rest once the map has changed
            piece = os.urandom(seg_bytes)
            sent.append(piece)
            yield piece

    async def go() -> tuple[str, list[str]]:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("leaving")
            put = asyncio.ensure_future(c.put("leaving", "big", source()))
            deadline = time.monotonic() + 30
            while not set(fragments_on_disk(s5)) - before:    # 8 segments: s5 in most rows
                assert time.monotonic() < deadline, "no fragment reached s5"
                await asyncio.sleep(0.2)
            removed = await asyncio.get_running_loop().run_in_executor(
                None, lambda: subprocess.run(
                    [sys.executable, "-m", "cli.main", "--cluster", str(cluster.path), "ring",
                     "remove", "s5"], cwd=ROOT, capture_output=True, timeout=120))
            assert removed.returncode == 0, removed.stderr.decode()
            await asyncio.sleep(3.0)        # past the client's map cache (MAP_TTL_S)
            go_on.set()
            info = await put
            for _ in range(50):     # the copies' originals are deleted in the background
                on_s5 = [f for f in fragments_on_disk(s5) if f.startswith(info.version_id)]
                if not on_s5:
                    break
                await asyncio.sleep(0.2)
            assert await c.get("leaving", "big") == b"".join(sent)
            return info.version_id, on_s5
    vid, on_s5 = asyncio.run(go())
    assert on_s5 == []      # copied off before the commit (left there before)
    # the ring change's rebalance (before the drain below: a change waits for the last),
    # then every fragment of the put is where readers look
    assert cli_json(cluster, "rebalance")["failed"] == 0

    async def placed() -> list[str]:
        async with Client.connect(cluster.path) as c:
            rec = await c.live_record("leaving", "big")
            cmap = await c.cluster_map(refresh=True)
            nodes = []
            for seg in range(rec["segments"]):
                for i, node in enumerate(expected_fragment_nodes(cmap, rec, seg)):
                    await c.get_fragment(node, fragment_id(vid, seg, i))
                    nodes.append(node.id)
            return nodes
    assert "s5" not in asyncio.run(placed())


def test_a_put_committed_after_the_drains_passes_is_not_left_on_the_drained_node(
        cluster: LocalCluster) -> None:
    objects = {f"o{i}": os.urandom(MIB + i) for i in range(8)}
    with SyncClient(cluster.path) as c:
        c.create_bucket("drain")
        for k, v in objects.items():
            c.put("drain", k, v)
    late = os.urandom(MIB + 77)
    s4 = cluster.dir / "s4"

    async def go() -> tuple[subprocess.CompletedProcess[bytes], float]:
        async with Client.connect(cluster.path) as c:
            cmap = await c.cluster_map()
            pol = c.policy_of(cmap, None)
            for _ in range(8):      # the leaving node is in 6 of 7 rows
                ext = await c.write_extent(pol, "drain", "late", late)
                if any(f.startswith(ext["version_id"]) for f in fragments_on_disk(s4)):
                    break
            else:
                raise AssertionError("no extent placed a fragment on s4 in 8 tries")
            record = {"ts": 0, "version_id": ext["version_id"], "deleted": False,
                      "content_type": "application/octet-stream", "meta": {},
                      "policy": pol.name, "k": pol.k, "m": pol.m, "ec_type": pol.ec_type,
                      "segment_size": pol.segment_size_bytes, "epoch": cmap.epoch,
                      "inline": None, "handoffs": ext["handoffs"], "size": ext["size"],
                      "segments": ext["segments"]}
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "--cluster", str(cluster.path), "cluster",
                 "remove-node", "--data", str(cluster.dir), "s4", "--json"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            started = time.monotonic()
            # the put commits late: once the drain has finished (before the fix it did,
            # without the fragment), or LATE_COMMIT_S into it
            while proc.poll() is None and time.monotonic() - started < LATE_COMMIT_S:
                await asyncio.sleep(0.2)
            record["ts"] = time.time_ns()
            await c.commit("drain", "late", record)
            committed_at = time.monotonic() - started
            out, errs = await asyncio.get_running_loop().run_in_executor(
                None, lambda: proc.communicate(timeout=DRAIN_TIMEOUT_S))
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, errs), committed_at

    done, committed_at = asyncio.run(go())
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["drained"] and report["failed"] == 0, report
    assert committed_at >= LATE_COMMIT_S - 1, "the drain ended before the put committed"
    assert fragments_on_disk(s4) == {}
    assert "s4" not in LocalCluster.load(cluster.dir).nodes
    with SyncClient(cluster.path) as c:
        assert c.get("drain", "late") == late
        for k, v in objects.items():
            assert c.get("drain", k) == v
    # every fragment of every object where readers look: nothing for repair to rebuild
    assert cli_json(cluster, "repair", "--dry-run")["fragments_missing"] == 0


DRAIN_TIMEOUT_S = 240.0
