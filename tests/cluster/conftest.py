"""A real local cluster (node processes on 127.0.0.1) per test module."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster
from store.client import Client, SyncClient
from store.transport import Transport


@contextlib.contextmanager
def running_cluster(prefix: str, keep: bool = False, **sizes: Any) -> Iterator[LocalCluster]:
    """A local cluster of `sizes` (LocalCluster.create's) in a new temporary directory,
    started; stopped after as cluster.json lists its nodes (nodes added meanwhile too)
    and its directory removed unless `keep`."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    c = LocalCluster.create(tmp, **sizes)
    c.start()
    try:
        yield c
    finally:
        LocalCluster.load(tmp).stop()
        if keep:
            print(f"\nkept cluster directory {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with running_cluster("ecstore-test-", request.config.getoption("--keep-tmp"),
                         storage=6, control=3, k=4, m=2, gateway=False) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[SyncClient]:
    c = SyncClient(cluster.path)
    yield c
    c.close()


@pytest.fixture
def all_up(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """Restart any node a test killed, so the next test starts whole."""
    yield cluster
    down = [i for i in cluster.nodes if i not in cluster.running()]
    for i in down:
        cluster.start_node(i)
    if down:
        cluster.wait_healthy(down)


def wait_for(cond: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def replicas_hold(cluster: LocalCluster, bucket: str, keys: list[str]) -> bool:
    """Every running control node that the ring places a key on holds its record."""
    async def go() -> bool:
        t = Transport(cluster.secret)
        try:
            for node in ("c1", "c2", "c3"):
                if node not in cluster.running():
                    continue
                for key in keys:
                    r = await t.request("GET", cluster.nodes[node].url,
                                        f"/v1/objects/{bucket}/{key}", ok_404=True)
                    if r.status != 200:
                        return False
            return True
        finally:
            await t.close()
    return asyncio.run(go())


async def fill_bucket(c: Client, bucket: str, keys: list[str], parallel: int = 32) -> None:
    """Make `bucket` and put each key with its own name as its bytes, `parallel` at once."""
    await c.create_bucket(bucket)
    sem = asyncio.Semaphore(parallel)

    async def put(k: str) -> None:
        async with sem:
            await c.put(bucket, k, k.encode())
    await asyncio.gather(*(put(k) for k in keys))
