"""A storage node that refuses connections is read around: after the first read that
finds it down, reads go straight to the other fragments for a few seconds instead of
asking it first every time (one wasted round trip per segment)."""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from cli.localcluster import LocalCluster
from store.client import Client, expected_fragment_nodes
from store.client_get import DOWN_S
from store.striping import record_extents


def test_reads_skip_a_node_that_refused_a_connection(cluster: LocalCluster,
                                                     all_up: LocalCluster) -> None:
    async def go() -> tuple[str, list[tuple[float, list[str], int, float]], list[bytes], list[bytes]]:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("downnode")
            bodies = [os.urandom(300_000 + i) for i in range(12)]
            for i, b in enumerate(bodies):
                await c.put("downnode", f"o{i}", b)
            # a node that holds a data fragment (index 0) of o0
            rec = await c.live_record("downnode", "o0")
            node = expected_fragment_nodes(await c.cluster_map(), rec, 0,
                                           record_extents(rec)[0])[0]
            # the nodes each read asks: a slow fragment get (a loaded machine) brings in
            # one more fragment from another node (the hedge), so the total varies
            asked: list[str] = []
            get_fragment = c.get_fragment

            async def spy(n: Any, *args: Any, **kw: Any) -> Any:
                asked.append(n.id)
                return await get_fragment(n, *args, **kw)
            c.get_fragment = spy  # type: ignore[method-assign]
            cluster.kill_node(node.id)
            reads, got = [], []
            for i in range(len(bodies)):
                before = c.read_stats["fragment_gets"]
                asked.clear()
                started = time.monotonic()
                got.append(await c.get("downnode", f"o{i}"))
                reads.append((started, list(asked), c.read_stats["fragment_gets"] - before,
                              time.monotonic()))
            return node.id, reads, got, bodies
    down, reads, got, bodies = asyncio.run(go())
    assert got == bodies
    k = 4
    first_started, first_asked, first_gets, _ = reads[0]
    # the first read finds the node down: it asked it once, and one more fragment
    assert first_asked.count(down) == 1 and first_gets >= k + 1, reads[0]
    # the rest never ask it while it is marked down (DOWN_S from the first read's refusal,
    # so at least for every read done within DOWN_S of the first's start: one that began
    # before and read its fragments after may ask it again, rightly)
    marked = [r for r in reads[1:] if r[3] < first_started + DOWN_S]
    assert marked, f"no read done within {DOWN_S} s of the first's start: {reads}"
    assert all(down not in r[1] and r[2] >= k for r in marked), (down, reads)
