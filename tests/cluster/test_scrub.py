"""`ecstore scrub` against real storage nodes: corrupt fragments found, quarantined, reads whole."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from tests.functional.harness import flip_last_byte, fragments_on_disk

ROOT = Path(__file__).resolve().parents[2]
SEG = 4 * 1024 * 1024


def blob(size: int, seed: int) -> bytes:
    out = bytearray()
    block = hashlib.sha256(f"scrub{seed}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 128
    return bytes(out[:size])


def ecstore(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           *args], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def fragment_ids(cluster: LocalCluster, node: str, vid: str) -> list[str]:
    """The fragments of version `vid` stored on `node`'s disk (its volume files)."""
    return sorted(f for f in fragments_on_disk(cluster.dir / node) if f.startswith(f"{vid}."))


@pytest.fixture(scope="module")
def stored(client: SyncClient) -> dict[str, bytes]:
    client.create_bucket("scrubbed")
    objs = {"big": blob(2 * SEG + 999, 1), "small": blob(300_000, 2)}
    for name, data in objs.items():
        client.put("scrubbed", name, data)
    return objs


def test_scrub_finds_quarantines_and_reads_stay_whole(cluster: LocalCluster,
                                                      client: SyncClient,
                                                      stored: dict[str, bytes]) -> None:
    big = client.head("scrubbed", "big").version_id
    small = client.head("scrubbed", "small").version_id
    # s2: one fragment of each object; s5: one fragment of the big one
    bad = {"s2": [fragment_ids(cluster, "s2", big)[0], fragment_ids(cluster, "s2", small)[0]],
           "s5": [fragment_ids(cluster, "s5", big)[-1]]}
    for node, fids in bad.items():
        for fid in fids:
            flip_last_byte(cluster.dir / node, fid)

    proc = ecstore(cluster, "scrub", "--node", "s2", "--json")
    assert proc.returncode == 1, proc.stderr.decode()     # corrupt found: repair's work
    [r] = json.loads(proc.stdout)["nodes"]
    assert r["node"] == "s2" and r["checked"] >= 4
    assert sorted(r["corrupt"]) == sorted(bad["s2"])
    on_s2 = fragments_on_disk(cluster.dir / "s2")
    for fid in bad["s2"]:
        assert fid not in on_s2 and (cluster.dir / "s2" / "quarantine" / fid).exists()

    # every node in turn, readable output: s5's is found, s2 is clean now
    proc = ecstore(cluster, "scrub")
    assert proc.returncode == 1, proc.stderr.decode()     # s5's
    text = proc.stdout.decode()
    for i in range(1, 7):
        assert f"scrubbing s{i}" in proc.stderr.decode()
    assert f"quarantined {bad['s5'][0]}" in text
    s2_line = next(line for line in text.splitlines() if line.startswith("s2: checked"))
    assert s2_line.endswith(", 0 corrupt")
    assert (cluster.dir / "s5" / "quarantine" / bad["s5"][0]).exists()
    assert bad["s5"][0] not in fragments_on_disk(cluster.dir / "s5")

    status = ecstore(cluster, "status", "--json")
    rows = {r["id"]: r for r in json.loads(status.stdout)["nodes"]}
    assert rows["s2"]["quarantined"] == 2 and rows["s5"]["quarantined"] == 1
    assert rows["s2"]["scrub"]["corrupt_found_total"] == 2
    assert rows["s1"]["quarantined"] == 0 and rows["s1"]["scrub"]["last_pass_completed_at"]

    for name, data in stored.items():
        assert client.get("scrubbed", name) == data, name


def test_scrub_of_an_unknown_node_is_a_clear_error(cluster: LocalCluster) -> None:
    proc = ecstore(cluster, "scrub", "--node", "s99")
    assert proc.returncode == 2
    assert b"no storage node 's99'" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_stalled_node_does_not_hold_the_scrub_of_the_others(cluster: LocalCluster) -> None:
    """scrub asked each node in turn with an hour's timeout: a node stopped (SIGSTOP)
    held the whole command up. Each is asked first whether it answers at all (5 s)."""
    node = cluster.nodes["s6"]
    assert node.pid is not None
    os.kill(node.pid, signal.SIGSTOP)
    try:
        proc = ecstore(cluster, "scrub", "--json")
    finally:
        os.kill(node.pid, signal.SIGCONT)
    assert proc.returncode == 1, proc.stderr.decode()
    rows = {r["node"]: r for r in json.loads(proc.stdout)["nodes"]}
    assert "error" in rows["s6"] and all("checked" in rows[f"s{i}"] for i in range(1, 6))
