"""Client.close() with a control node that does not answer (stalled: SIGSTOP, or cut off
by a network blackhole): the record writes still on their way to it are cancelled by
close itself, so nothing of the client is left pending on the loop, and close does not
wait them out.

Found by the bad-network sweep: `ecstore repair --dry-run` (and any command that wrote a
record) with one control node blackholed ended with "Task was destroyed but it is
pending!" for a record batch sender, and at times a RuntimeError traceback ("There is no
current event loop") after its report: asyncio.run cancelled the pending writes at its
end, a cancelled sender's cleanup started the next batch of its queue as a new task,
which the loop's close destroyed pending, and the GC ran its cleanup again on no loop.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from cli.localcluster import LocalCluster
from store.client import Client

pytestmark = pytest.mark.cluster


def test_close_leaves_no_task_pending_behind_a_stalled_control_node(
        cluster: LocalCluster) -> None:
    async def prepare() -> None:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("closing")
    asyncio.run(prepare())

    pid = cluster.nodes["c1"].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        async def main() -> tuple[list[str], float]:
            c = Client.connect(cluster.path)
            await c.cluster_map()
            # concurrent puts: one record write goes to c1 alone and hangs, the others
            # queue behind it for c1's next batch; c2 and c3 make each put's quorum
            await asyncio.gather(*(c.put("closing", f"k{i}", b"v" * 3000) for i in range(8)))
            for i in range(8):       # read counts to send at close, to c1 among others
                assert await c.get("closing", f"k{i}") == b"v" * 3000
            t0 = time.monotonic()
            await c.close()
            took = time.monotonic() - t0
            me = asyncio.current_task()
            left = [repr(t.get_coro()) for t in asyncio.all_tasks() if t is not me]
            return left, took
        left, took = asyncio.run(main())
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not left, f"close() left {len(left)} tasks pending: {left[:3]}"
    # what waits on the stalled node is given up once nothing else is finishing (1 s),
    # not waited out: 5-6 s before (3 s for the read counts, 2 s for the writes), and
    # every CLI command took that much longer with a control node stalled or blackholed
    assert took < 3.0, f"close() took {took:.1f} s"
