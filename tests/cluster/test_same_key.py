"""Many clients overwrite and delete the same few keys while others read them.

Every read returns exactly one whole version that a writer committed (never a mix of two,
never a truncation) and never one older than a write acknowledged before the read began;
afterwards every control node that owns a key holds the same record, the newest
acknowledged one (by (ts, version_id)), and a get returns it.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from cli.localcluster import LocalCluster, fetch_map, pid_alive, signed_request
from placement.cluster_map import ClusterMap
from store.client import Client, meta_path
from store.errors import EcstoreError, NotFound
from store.wire import unpack
from tests.cluster.conftest import wait_for
from tests.cluster.test_restart import Op, RecordingClient, order, run_op, tag_of

KiB, MiB = 1024, 1024 * 1024
KEYS = ("hot/a", "hot/b", "hot/c")
WRITERS = 8
ROUNDS = 12                # ops per writer
READERS = 3
MAX_READS_PER_READER = 300
# inline, inline at its limit, one short segment, two segments (the second 3 bytes)
SIZES = (200, 64 * KiB, 300 * KiB, 4 * MiB + 3)
SETTLE_S = 3.0             # replicas may still be taking the last writes' stragglers
OUTAGE_AFTER_ACKS = 30     # with an outage: one control node is SIGKILLed then, back at the end
REPAIR_S = 10.0            # after one quorum read, for read repair to reach every owner


def plan() -> list[list[Op]]:
    """Per writer its ops; about one in five a delete, a quarter of the puts two segments."""
    out = []
    for w in range(WRITERS):
        ops = []
        for r in range(ROUNDS):
            size = None if (w + 2 * r) % 5 == 4 else SIZES[(w + r) % len(SIZES)]
            ops.append(Op(w, r, KEYS[(w + r) % len(KEYS)], size))
        out.append(ops)
    return out


@dataclass
class History:
    bucket: str
    ops: list[Op]
    outage_pid: int | None = None   # the control node to SIGKILL after OUTAGE_AFTER_ACKS acks
    acks: int = 0
    floor: dict[str, tuple[int, str]] = field(default_factory=dict)  # newest acked order per key
    problems: list[str] = field(default_factory=list)
    reads: int = 0
    reads_absent: int = 0

    def committed(self, pred: Callable[[Op], bool]) -> list[Op]:
        return [o for o in self.ops if o.record is not None and pred(o)]

    def check_read(self, key: str, before: tuple[int, str] | None, data: bytes | None,
                   rec: dict[str, Any] | None, rec_known: bool) -> None:
        """Check one read of `key` that began when `before` was the newest acknowledged order.

        `rec` is the record the read used when `rec_known` (a plain get tells only bytes)."""
        self.reads += 1
        if data is None:
            self.reads_absent += 1
            dels = self.committed(lambda o: o.size is None and o.key == key)
            if rec_known:  # exactly the tombstone read, or no record at all
                dels = [o for o in dels if rec is not None and o.record and o.record["version_id"] == rec["version_id"]]
                if rec is not None and not dels:
                    self.problems.append(f"{key}: tombstone {rec} that no writer committed")
            if before is not None and not any(o.record and order(o.record) >= before for o in dels):
                self.problems.append(f"{key}: NotFound, but {before} was acknowledged before the "
                                     "read and no tombstone that new was read")
            return
        ops = self.committed(lambda o: o.size is not None and o.key == key and o.tag == tag_of(data))
        if len(ops) != 1 or data != ops[0].payload():
            self.problems.append(f"{key}: read {len(data)} B tagged {tag_of(data)!r}: not one whole "
                                 f"committed version (candidates {[str(o) for o in ops]})")
            return
        got = ops[0].record
        assert got is not None
        if rec is not None and rec["version_id"] != got["version_id"]:
            self.problems.append(f"{key}: record {rec['version_id']} returned the bytes of {ops[0]}")
        if before is not None and order(got) < before:
            self.problems.append(f"{key}: read {ops[0]}, older than {before} acknowledged before the read")


async def write(c: Client, ops: list[Op], h: History, start: asyncio.Event) -> None:
    await start.wait()
    for op in ops:
        await run_op(c, h.bucket, op)
        if op.status == "acked":
            assert op.record is not None
            h.floor[op.key] = max(h.floor.get(op.key, (0, "")), order(op.record))
            h.acks += 1
            if h.acks == OUTAGE_AFTER_ACKS and h.outage_pid is not None:
                os.kill(h.outage_pid, signal.SIGKILL)


async def read_checked(c: Client, h: History, key: str, with_record: bool) -> None:
    """A plain get, or a quorum record read then the stream of that record; checked."""
    before = h.floor.get(key)
    rec: dict[str, Any] | None = None
    try:
        if with_record:
            rec = await c.read_record(h.bucket, key)
            data = None if rec is None or rec["deleted"] else \
                b"".join([bytes(p) async for p in c.get_stream(h.bucket, key, record=rec)])
        else:
            data = await c.get(h.bucket, key)
    except NotFound:
        data = None
    except EcstoreError as exc:
        h.problems.append(f"{key}: read failed with at most one control node down: {exc!r}")
        return
    h.check_read(key, before, data, rec, with_record)


async def read(c: Client, n: int, h: History, start: asyncio.Event, stop: asyncio.Event) -> None:
    await start.wait()
    for i in range(MAX_READS_PER_READER):
        if stop.is_set():
            return
        await read_checked(c, h, KEYS[(i + n) % len(KEYS)], with_record=bool(i % 2))


async def contend(cluster: LocalCluster, writers: list[list[Op]], h: History) -> None:
    setup = Client.connect(cluster.path)
    await setup.create_bucket(h.bucket)
    await setup.close()
    wc = [RecordingClient.connect(cluster.path) for _ in writers]
    rc = [Client.connect(cluster.path) for _ in range(READERS)]
    try:
        await asyncio.gather(*(c.cluster_map() for c in wc + rc))
        start, stop = asyncio.Event(), asyncio.Event()
        readers = [asyncio.ensure_future(read(c, n, h, start, stop)) for n, c in enumerate(rc)]
        writing = asyncio.gather(*(write(c, ops, h, start) for c, ops in zip(wc, writers)))
        start.set()
        try:
            await writing
        finally:
            stop.set()
            await asyncio.gather(*readers)
    finally:  # close() lets each client's background metadata writes finish (bounded)
        await asyncio.gather(*(c.close() for c in wc + rc))


def replicas(cluster: LocalCluster, cmap: ClusterMap, bucket: str, key: str) -> dict[str, dict[str, Any] | None]:
    """The record each owning control node holds, asked directly (signed GET)."""
    out: dict[str, dict[str, Any] | None] = {}
    for node in cmap.control_nodes_for(f"{bucket}/{key}"):
        try:
            out[node.id] = unpack(signed_request(cluster.secret, "GET", node.address, meta_path(bucket, key)))
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            out[node.id] = None
    return out


def disagreeing(cluster: LocalCluster, cmap: ClusterMap, bucket: str, keys: list[str]) -> list[str]:
    """The keys whose owners do not all hold one and the same record."""
    bad = []
    for key in keys:
        recs = list(replicas(cluster, cmap, bucket, key).values())
        if recs[0] is None or any(r != recs[0] for r in recs):
            bad.append(key)
    return bad


def wait_converged(cluster: LocalCluster, cmap: ClusterMap, bucket: str, keys: list[str],
                   timeout_s: float) -> list[str]:
    """Poll until every key's owners agree or timeout_s passed; the keys still disagreeing."""
    deadline = time.monotonic() + timeout_s
    while True:
        bad = disagreeing(cluster, cmap, bucket, keys)
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(0.1)


async def quorum_reads(cluster: LocalCluster, h: History, keys: list[str]) -> None:
    """One checked quorum read of each key (it repairs stale replicas in the background)."""
    async with Client.connect(cluster.path) as c:
        for key in keys:
            await read_checked(c, h, key, with_record=True)


async def final_gets(cluster: LocalCluster, bucket: str) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    async with Client.connect(cluster.path) as c:
        for key in KEYS:
            try:
                out[key] = await c.get(bucket, key)
            except NotFound:
                out[key] = None
    return out


@pytest.mark.parametrize("outage", [False, True], ids=["all-up", "control-node-down"])
def test_concurrent_writers_on_one_key_read_whole_versions_and_converge(
        cluster: LocalCluster, all_up: LocalCluster, outage: bool) -> None:
    writers = plan()
    raw = fetch_map(cluster.secret, next(n.url for n in cluster.nodes.values() if n.role == "control"))
    assert raw is not None
    cmap = ClusterMap.from_bytes(raw)
    bucket = f"samekey-{'outage' if outage else 'up'}"
    victim = cmap.control_nodes_for(f"{bucket}/{KEYS[0]}")[1].id
    h = History(bucket, [o for ops in writers for o in ops],
                outage_pid=cluster.nodes[victim].pid if outage else None)
    t0 = time.monotonic()
    asyncio.run(contend(cluster, writers, h))
    contend_s = time.monotonic() - t0
    if outage:  # back with the records it missed: only read repair brings them
        assert h.acks >= OUTAGE_AFTER_ACKS
        wait_for(lambda: not pid_alive(cluster.nodes[victim].pid), 10.0, f"{victim} to exit")
        cluster.start_node(victim)
        cluster.wait_healthy([victim])
    assert not h.problems, f"{len(h.problems)} bad reads, first: {h.problems[:5]}"

    late = wait_converged(cluster, cmap, bucket, list(KEYS), 0.0 if outage else SETTLE_S)
    repaired = list(late)
    if late:  # one quorum read each: read repair must bring every owner to the newest
        asyncio.run(quorum_reads(cluster, h, late))
        assert not h.problems, f"{len(h.problems)} bad reads, first: {h.problems[:5]}"
        late = wait_converged(cluster, cmap, bucket, late, REPAIR_S)
    assert not late, f"owners of {late} disagree: {[replicas(cluster, cmap, bucket, k) for k in late]}"
    assert repaired or not outage, f"{victim} missed no write while down: the outage tested nothing"

    gets = asyncio.run(final_gets(cluster, bucket))
    acked = [o for o in h.ops if o.status == "acked"]
    failed = [o for o in h.ops if o.status == "failed"]
    for key in KEYS:
        mine = [o for o in acked if o.key == key]
        assert mine, f"no op on {key} was acknowledged"
        newest = max(mine, key=lambda o: order(o.record or {"ts": 0, "version_id": ""}))
        assert newest.record is not None
        newer_failed = [o for o in failed if o.key == key and o.record is not None
                        and order(o.record) > order(newest.record)]
        held = next(iter(replicas(cluster, cmap, bucket, key).values()))
        assert held is not None
        winner = [o for o in [newest, *newer_failed] if o.record and o.record["version_id"] == held["version_id"]]
        assert winner, (f"{key}: owners hold {held['version_id']}, not the newest acknowledged "
                        f"{newest} {newest.record} nor a newer failed write")
        want = None if winner[0].size is None else winner[0].payload()
        got = gets[key]
        assert got == want, (f"{key}: final get {None if got is None else (len(got), tag_of(got))}, "
                             f"want {winner[0]}")
    print(f"\nsame key ({'one control node down' if outage else 'all up'}): writers={WRITERS} "
          f"readers={READERS} ops={len(h.ops)} acknowledged={len(acked)} "
          f"(puts {sum(o.size is not None for o in acked)}, deletes {sum(o.size is None for o in acked)}) "
          f"failed={len(failed)} (delete of an absent key "
          f"{sum(o.size is None and o.record is None for o in failed)}) "
          f"reads={h.reads} (NotFound {h.reads_absent}) bad-reads={len(h.problems)} "
          f"keys needing read repair={len(repaired)} contention {contend_s:.1f}s")
    for o in failed:
        print(f"  failed: {o}")


def test_a_delete_from_a_slower_clock_still_deletes(cluster: LocalCluster) -> None:
    """A version written by a client whose clock runs 2 s ahead: a delete acknowledged by
    a client with a correct clock must remove it (its tombstone orders after the version
    it deletes), and so must a bucket update order after the bucket's record."""
    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("skew")
            ahead = time.time_ns() + 2_000_000_000
            record = {"ts": ahead, "version_id": f"{ahead:016x}{'0' * 16}", "deleted": False,
                      "inline": b"written by the fast clock", "size": 25, "segments": 0,
                      "content_type": "application/octet-stream", "meta": {}, "policy": "hot",
                      "k": 4, "m": 2, "ec_type": "isa_l_rs_vand", "segment_size": 4 * MiB,
                      "epoch": 1, "handoffs": {}}
            await c.commit("skew", "obj", record)
            assert await c.get("skew", "obj") == b"written by the fast clock"
            await c.delete("skew", "obj")
            with pytest.raises(NotFound):
                await c.get("skew", "obj")
            await c.update_bucket("skew", acl="public-read")
            assert (await c.bucket_record("skew"))["acl"] == "public-read"
    asyncio.run(go())
