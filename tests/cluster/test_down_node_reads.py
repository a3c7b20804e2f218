"""A storage node that refuses connections is read around: after the first read that
finds it down, reads go straight to the other fragments for a few seconds instead of
asking it first every time (one wasted round trip per segment)."""
from __future__ import annotations

import asyncio
import os

from cli.localcluster import LocalCluster
from store.client import Client, expected_fragment_nodes
from store.striping import record_extents


def test_reads_skip_a_node_that_refused_a_connection(cluster: LocalCluster,
                                                     all_up: LocalCluster) -> None:
    async def go() -> tuple[list[int], list[bytes], list[bytes]]:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("downnode")
            bodies = [os.urandom(300_000 + i) for i in range(12)]
            for i, b in enumerate(bodies):
                await c.put("downnode", f"o{i}", b)
            # a node that holds a data fragment (index 0) of o0
            rec = await c.live_record("downnode", "o0")
            node = expected_fragment_nodes(await c.cluster_map(), rec, 0,
                                           record_extents(rec)[0])[0]
            cluster.kill_node(node.id)
            gets, got = [], []
            for i in range(len(bodies)):
                before = c.read_stats["fragment_gets"]
                got.append(await c.get("downnode", f"o{i}"))
                gets.append(c.read_stats["fragment_gets"] - before)
            return gets, got, bodies
    gets, got, bodies = asyncio.run(go())
    assert got == bodies
    k = 4
    assert gets[0] == k + 1          # the first read finds the node down: one more fragment
    # the rest never ask it while it is marked down (each is one segment: k fragments)
    assert gets[1:] == [k] * (len(bodies) - 1), gets
