"""The parts of a multipart upload in progress are acknowledged data (UploadPart answered
200; CompleteMultipartUpload names them later): repair rebuilds their lost fragments,
rebalance and a node's drain move them. Both worked only from committed objects' records:
a part whose fragments were on a replaced disk, or on a drained node, was lost, and the
complete that named it committed an object that could not be read (found by an
operator's runbook sweep: disks replaced one at a time, then a complete)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store import multipart as mp
from store.client import Client, expected_fragment_nodes
from store.striping import fragment_id
from tests.cluster.conftest import running_cluster
from tests.functional.harness import fragments_on_disk

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
BUCKET = "uploads"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster("ecstore-parts-", request.config.getoption("--keep-tmp"),
                         storage=7, control=3, k=4, m=2, gateway=False) as c:
        asyncio.run(_with(c, lambda lib: lib.create_bucket(BUCKET)))
        yield c


async def _with(cluster: LocalCluster, fn: Any) -> Any:
    async with Client.connect(cluster.path) as c:
        return await fn(c)


def run(cluster: LocalCluster, fn: Any) -> Any:
    return asyncio.run(_with(cluster, fn))


def cli(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args, "--json"], cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout.decode(), proc.stderr.decode())
    return json.loads(proc.stdout)   # type: ignore[no-any-return]


def open_upload(cluster: LocalCluster, key: str, parts: dict[int, bytes]) -> str:
    async def go(c: Client) -> str:
        uid = await mp.create_upload(c, BUCKET, key, content_type="x/y", meta={})
        for n, data in parts.items():
            await mp.put_part(c, BUCKET, uid, n, data, lambda d=data: hashlib.md5(d).hexdigest())
        return uid
    return run(cluster, go)   # type: ignore[no-any-return]


def part_homes(cluster: LocalCluster, uid: str) -> dict[str, str]:
    """{fragment id: the node a reader asks for it} of every part of upload `uid`."""
    async def go(c: Client) -> dict[str, str]:
        cmap = await c.cluster_map(refresh=True)
        out = {}
        for _, key, rec in await mp.part_extent_records(c):
            if key.startswith(uid + "/"):
                for seg in range(rec["segments"]):
                    for i, node in enumerate(expected_fragment_nodes(cmap, rec, seg)):
                        out[fragment_id(rec["version_id"], seg, i)] = node.id
        return out
    return run(cluster, go)   # type: ignore[no-any-return]


def complete_and_read(cluster: LocalCluster, key: str, uid: str,
                      parts: dict[int, bytes]) -> bytes:
    async def go(c: Client) -> bytes:
        await mp.complete(c, BUCKET, uid, [(n, hashlib.md5(d).hexdigest())
                                           for n, d in sorted(parts.items())])
        return bytes(await c.get(BUCKET, key))
    return run(cluster, go)   # type: ignore[no-any-return]


def test_repair_rebuilds_the_parts_of_an_upload_in_progress(cluster: LocalCluster) -> None:
    parts = {1: os.urandom(5 * MIB + 3), 2: os.urandom(MIB + 7)}
    uid = open_upload(cluster, "open-repair", parts)
    homes = part_homes(cluster, uid)
    assert len(homes) == 6 * 3      # part 1: 2 segments of 4 MiB, part 2: one
    victim = "s1" if "s1" in homes.values() else sorted(set(homes.values()))[0]
    lost = {f for f, n in homes.items() if n == victim}
    assert lost <= set(fragments_on_disk(cluster.dir / victim))
    cluster.kill_node(victim)
    shutil.rmtree(Path(cluster.nodes[victim].data))     # its disk replaced
    cluster.start_node(victim)
    cluster.wait_healthy([victim])

    dry = cli(cluster, "repair", "--dry-run")
    assert dry["fragments_missing"] == len(lost), dry
    done = cli(cluster, "repair")
    assert done["fragments_rebuilt"] == len(lost) and done["unrecoverable"] == [], done
    assert lost <= set(fragments_on_disk(cluster.dir / victim))

    # two more nodes lost: the parts must still read (they did not: 3 of 6 gone)
    down = sorted(set(homes.values()) - {victim})[:2]
    for node in down:
        cluster.kill_node(node)
    try:
        assert complete_and_read(cluster, "open-repair", uid, parts) == parts[1] + parts[2]
    finally:
        for node in down:
            cluster.start_node(node)
        cluster.wait_healthy(down)


def test_a_drained_node_takes_no_part_with_it(cluster: LocalCluster) -> None:
    parts = {1: os.urandom(5 * MIB + 11), 2: os.urandom(2 * MIB)}
    uid = open_upload(cluster, "open-drain", parts)
    homes = part_homes(cluster, uid)
    victim = max(set(homes.values()), key=lambda n: sum(1 for v in homes.values() if v == n))
    assert any(n == victim for n in homes.values())
    done = cli(cluster, "cluster", "remove-node", "--data", str(cluster.dir), victim)
    assert done["failed"] == 0 and done["moved"] >= sum(1 for n in homes.values() if n == victim)
    assert not set(homes) & set(fragments_on_disk(cluster.dir / victim))
    after = part_homes(cluster, uid)
    assert victim not in after.values() and set(after) == set(homes)
    for fid, node in after.items():      # every fragment where readers look for it
        assert fid in fragments_on_disk(cluster.dir / node), (fid, node)
    assert complete_and_read(cluster, "open-drain", uid, parts) == parts[1] + parts[2]
