"""Uncached writes end to end, on real node processes: a fragment PUT with
x-ecstore-uncached: 1 is written by the storage node without staying in its page cache
(RWF_DONTCACHE) on the fast path and on aiohttp's route alike, a PUT without it as
before; Client.put(cache=False) asks it of every node of the object and the object reads
back whole. (The store's side - pages, reopen, a kernel that refuses - is
tests/functional/test_uncached_writes.py.)"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from node.fastpath import FAST_PATH_ENV
from node.volumes import stored_fragments
from store.client import SyncClient
from store.striping import fragment_id
from store.wire import FRAGMENT_META_HEADER, UNCACHED_HEADER, pack_header
from tests.cluster.rawhttp import exchange
from tests.cluster.rawhttp import signed_request as raw_request
from tests.cluster.storagenode import SECRET, storage_node
from tests.cluster.uncached import counters, skip_unless_uncached_writes, uncached_writes
from tests.functional.harness import cached_pages, settle_uncached, whole_pages

MIB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def kernel_takes_uncached_writes() -> None:
    skip_unless_uncached_writes()


@pytest.mark.parametrize("fast", ["1", "0"], ids=["fast-path", "aiohttp"])
def test_the_node_writes_a_fragment_uncached_only_when_asked(fast: str) -> None:
    data = Path(tempfile.mkdtemp(prefix="ecstore-uncached-"))
    body = os.urandom(MIB)
    meta = {FRAGMENT_META_HEADER: pack_header({"crc32": 0})}
    try:
        with storage_node(64, {FAST_PATH_ENV: fast}, data) as node:
            def put(fid: str, headers: dict[str, str]) -> int | None:
                return exchange(node.port, "PUT", raw_request(
                    SECRET, "PUT", f"/v1/fragments/{fid}", body, {**meta, **headers})).status

            def scrape() -> dict[str, float]:
                a = exchange(node.port, "GET", raw_request(SECRET, "GET", "/metrics"))
                assert a.status == 200
                return counters(a.body.decode())

            assert scrape() == {"uncached_writes_total": 0, "uncached_writes_supported": 1,
                                "uncached_reads_total": 0}
            assert put("f.cold", {UNCACHED_HEADER: "1"}) == 201
            assert put("f.warm", {}) == 201
            assert put("f.other", {UNCACHED_HEADER: "yes"}) == 201   # only "1" asks it
            assert scrape()["uncached_writes_total"] == 1
            found = stored_fragments(data)
            assert settle_uncached([found["f.cold"]]) == [0]
            assert cached_pages(*found["f.warm"]) == whole_pages(*found["f.warm"][1:])
            got = exchange(node.port, "GET", raw_request(SECRET, "GET", "/v1/fragments/f.cold"))
            assert got.status == 200 and got.body == body
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def uncached_cluster() -> Iterator[tuple[LocalCluster, SyncClient]]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-uncached-cluster-"))
    c = LocalCluster.create(tmp, storage=6, control=3, k=4, m=2, gateway=False)
    c.start()
    client = SyncClient(c.path)
    try:
        client.create_bucket("uncached")
        yield c, client
    finally:
        client.close()
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def bodies_on_disk(cluster: LocalCluster, version_id: str) -> list[tuple[str, int, int]]:
    """(volume file, offset, length) of every fragment of the object's first segment."""
    want = {fragment_id(version_id, 0, i) for i in range(6)}
    out = []
    for n in cluster.nodes.values():
        if n.role == "storage":
            out += [loc for fid, loc in stored_fragments(n.data).items() if fid in want]
    return out


def test_a_put_with_cache_false_is_written_uncached_on_every_node(
        uncached_cluster: tuple[LocalCluster, SyncClient]) -> None:
    cluster, client = uncached_cluster
    cold, warm = os.urandom(3 * MIB), os.urandom(3 * MIB)
    before = uncached_writes(cluster)
    info_cold = client.put("uncached", "cold", cold, cache=False)
    assert uncached_writes(cluster) - before == 6          # k + m fragments, one segment
    info_warm = client.put("uncached", "warm", warm)
    assert uncached_writes(cluster) - before == 6

    cold_bodies = bodies_on_disk(cluster, info_cold.version_id)
    warm_bodies = bodies_on_disk(cluster, info_warm.version_id)
    assert len(cold_bodies) == len(warm_bodies) == 6
    assert settle_uncached(cold_bodies) == [0] * 6
    assert all(cached_pages(*w) > 0 for w in warm_bodies)
    assert client.get("uncached", "cold") == cold and client.get("uncached", "warm") == warm
