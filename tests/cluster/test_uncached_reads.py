"""Uncached reads end to end, on real node processes: a fragment GET with
x-ecstore-uncached: 1 reads a fragment that is not in the storage node's page cache
without leaving it there (and sends one that is from the cache as before), on the fast
path and on aiohttp's route alike; a repair and a rebalance read their sources that way,
so the survivors' page caches hold after them what they held before. (The store's side -
scrubber, compaction, a kernel without RWF_DONTCACHE - is
tests/functional/test_uncached_reads.py.) Scrubbers are off here: their reads count too."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from node.fastpath import FAST_PATH_ENV
from node.storage import SCRUB_RATE_ENV
from node.volumes import stored_fragments
from store.client import SyncClient
from store.striping import fragment_id
from store.wire import FRAGMENT_META_HEADER, UNCACHED_HEADER, pack_header
from tests.cluster.rawhttp import exchange
from tests.cluster.rawhttp import signed_request as raw_request
from tests.cluster.s3_fixtures import ecstore
from tests.cluster.storagenode import SECRET, storage_node
from tests.cluster.uncached import counters, node_counters, skip_unless_uncached_writes
from tests.functional.harness import (
    cached_pages,
    evict_volumes,
    lose_fragment,
    settle_uncached,
    whole_pages,
)

MIB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def kernel_takes_uncached_io() -> None:
    skip_unless_uncached_writes()


@pytest.mark.parametrize("fast", ["1", "0"], ids=["fast-path", "aiohttp"])
def test_an_uncached_get_leaves_the_nodes_page_cache_as_it_was(fast: str) -> None:
    data = Path(tempfile.mkdtemp(prefix="ecstore-uncached-get-"))
    cold, warm = os.urandom(MIB), os.urandom(MIB)
    meta = {FRAGMENT_META_HEADER: pack_header({"crc32": 0})}
    try:
        with storage_node(64, {FAST_PATH_ENV: fast}, data) as node:
            def request(method: str, fid: str, body: bytes = b"",
                        headers: dict[str, str] | None = None) -> tuple[int | None, bytes]:
                a = exchange(node.port, method, raw_request(
                    SECRET, method, f"/v1/fragments/{fid}", body, headers or {}))
                return a.status, a.body

            def reads() -> float:
                a = exchange(node.port, "GET", raw_request(SECRET, "GET", "/metrics"))
                assert a.status == 200
                return counters(a.body.decode())["uncached_reads_total"]

            assert request("PUT", "f.cold", cold, meta)[0] == 201
            assert request("PUT", "f.warm", warm, meta)[0] == 201
            at = stored_fragments(data)
            evict_volumes(data)
            assert request("GET", "f.warm") == (200, warm)     # a reader caches it
            assert cached_pages(*at["f.cold"]) == 0
            assert cached_pages(*at["f.warm"]) == whole_pages(*at["f.warm"][1:])

            assert request("GET", "f.cold", headers={UNCACHED_HEADER: "1"}) == (200, cold)
            assert settle_uncached([at["f.cold"]]) == [0]
            assert request("GET", "f.warm", headers={UNCACHED_HEADER: "1"}) == (200, warm)
            assert cached_pages(*at["f.warm"]) == whole_pages(*at["f.warm"][1:])
            assert reads() == 1        # the cold one; the warm one went from the cache

            assert request("GET", "f.cold") == (200, cold)     # without it: cached
            assert cached_pages(*at["f.cold"]) == whole_pages(*at["f.cold"][1:])
            assert reads() == 1
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-uncached-reads-"))
    old = os.environ.get(SCRUB_RATE_ENV)
    os.environ[SCRUB_RATE_ENV] = "0"     # the nodes inherit it (and those the CLI starts)
    try:
        c = LocalCluster.create(tmp, storage=6, control=3, k=4, m=2, gateway=False)
        c.start()
        yield c
        LocalCluster.load(tmp).stop()    # the CLI may have added a node
    finally:
        if old is None:
            os.environ.pop(SCRUB_RATE_ENV, None)
        else:
            os.environ[SCRUB_RATE_ENV] = old
        shutil.rmtree(tmp, ignore_errors=True)


def storage_ids(cluster: LocalCluster) -> list[str]:
    return [i for i, n in LocalCluster.load(cluster.dir).nodes.items() if n.role == "storage"]


def uncached_reads(cluster: LocalCluster, ids: list[str]) -> int:
    return sum(int(node_counters(cluster, i)["uncached_reads_total"]) for i in ids)


def test_a_repair_reads_the_survivors_without_filling_their_page_cache(
        cluster: LocalCluster) -> None:
    with SyncClient(cluster.path) as client:
        client.create_bucket("heal")
        body = os.urandom(3 * MIB)                 # one segment: six fragments
        info = client.put("heal", "obj", body)
        fids = {fragment_id(info.version_id, 0, i) for i in range(6)}
        where = {(i, fid): loc for i in storage_ids(cluster)
                 for fid, loc in stored_fragments(cluster.nodes[i].data).items() if fid in fids}
        assert len(where) == 6
        (lost_on, lost), *_ = sorted(where)
        lose_fragment(cluster.nodes[lost_on].url, cluster.secret, lost)
        for i in storage_ids(cluster):
            evict_volumes(cluster.nodes[i].data)
        survivors = [loc for (i, fid), loc in where.items() if fid != lost]
        assert [cached_pages(*loc) for loc in survivors] == [0] * 5
        before = uncached_reads(cluster, storage_ids(cluster))

        done = json.loads(ecstore(cluster.path, "repair", "--json").stdout)
        assert done["fragments_rebuilt"] == 1 and done["unrecoverable"] == []
        assert uncached_reads(cluster, storage_ids(cluster)) - before == 4   # k of them
        assert settle_uncached(survivors) == [0] * 5
        assert client.get("heal", "obj") == body


def test_a_rebalance_reads_what_it_moves_without_filling_the_page_cache(
        cluster: LocalCluster) -> None:
    with SyncClient(cluster.path) as client:
        client.create_bucket("grow")
        objects = {f"o{i}": os.urandom(MIB + i) for i in range(12)}
        for key, body in objects.items():
            client.put("grow", key, body)
    old = storage_ids(cluster)
    for i in old:
        evict_volumes(cluster.nodes[i].data)
    before = uncached_reads(cluster, old)
    ecstore(cluster.path, "cluster", "add-node", "--data", str(cluster.dir), "--role", "storage")
    moved = json.loads(ecstore(cluster.path, "rebalance", "--json").stdout)
    assert moved["moved"] > 0 and moved["failed"] == 0
    # every fragment moved was read uncached on the node it left (none was cached)
    assert uncached_reads(cluster, old) - before == moved["moved"]
    with SyncClient(cluster.path) as client:
        for key, body in objects.items():
            assert client.get("grow", key) == body
