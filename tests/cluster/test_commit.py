"""The metadata record is the commit point: a put killed midway is never visible."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.errors import NotFound
from tests.cluster.conftest import wait_for
from tests.functional.harness import fragments_on_disk

WRITER = textwrap.dedent("""
    import asyncio, sys, time
    from store.client import Client
    async def slow():
        for i in range(400):        # up to 400 MiB, far more than it gets to send
            yield bytes([i % 251]) * (1024 * 1024)
            if i == 6:
                print("streaming", flush=True)
            await asyncio.sleep(0.05)
    async def main():
        async with Client.connect(sys.argv[1]) as c:
            await c.put("commit", sys.argv[2], slow())
            print("committed", flush=True)
    asyncio.run(main())
""")


def fragment_count(cluster: LocalCluster) -> int:
    """Fragments stored on the storage nodes' disks (records in their volume files)."""
    return sum(len(fragments_on_disk(s.data)) for s in cluster.nodes.values()
               if s.role == "storage")


@pytest.mark.parametrize("earlier", [False, True])
def test_killed_client_leaves_no_visible_object(cluster: LocalCluster, client: SyncClient,
                                                earlier: bool) -> None:
    if "commit" not in client.list_buckets():
        client.create_bucket("commit")
    key = f"big-{earlier}"
    old = os.urandom(5 * 1024 * 1024) if earlier else None
    if old is not None:
        client.put("commit", key, old)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(cluster.path), key],
                            stdout=subprocess.PIPE, cwd=root)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.strip() == "streaming"
    before = fragment_count(cluster)
    wait_for(lambda: fragment_count(cluster) > before, what="fragments of the put")
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert fragment_count(cluster) > 0  # fragments were written, but nothing committed
    if old is None:
        with pytest.raises(NotFound):
            client.head("commit", key)
        assert key not in [o.key for o in client.list("commit").objects]
    else:
        assert client.get("commit", key) == old
