"""Every node process SIGKILLed at once under write load, then the cluster restarted.

After the restart every acknowledged put reads back byte-exact (the newest acknowledged one
of an overwritten key), an acknowledged delete stays deleted unless a later put was
acknowledged, and a put that failed is absent, or whole and byte-exact only if its commit
had started when the nodes died. Never a partial or mixed object.
"""
from __future__ import annotations

import asyncio
import contextvars
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from cli.localcluster import LocalCluster, pid_alive
from placement.cluster_map import ClusterMap
from store.client import Client
from store.errors import EcstoreError, NotFound
from tests.cluster.conftest import wait_for

KiB, MiB = 1024, 1024 * 1024
BUCKET = "restart"
WRITERS = 4
KEYS_PER_WRITER = 3
OPS_PER_WRITER = 12
ROUNDS = 3                 # write, kill everything, restart, verify every round's keys so far
DELETE_EVERY = 5           # op i of a writer is a delete when i % DELETE_EVERY == DELETE_EVERY - 1
# inline, inline at its limit, just over (one short segment), one segment exactly, three segments
SIZES = (3 * KiB, 64 * KiB, 64 * KiB + 1, 1 * MiB, 4 * MiB, 9 * MiB + 7)
# per round, of WRITERS * OPS_PER_WRITER planned: the kill lands early, mid-run and late
KILL_AFTER_ACKS = (18, 6, 30)

# The op a writer task is running, so that RecordingClient can note its commit.
CURRENT_OP: contextvars.ContextVar["Op | None"] = contextvars.ContextVar("current_op", default=None)


def order(record: dict[str, Any]) -> tuple[int, str]:
    return int(record["ts"]), str(record["version_id"])


@dataclass
class Op:
    """One put (size set) or delete (size None) of one writer, and what became of it."""

    writer: int
    seq: int
    key: str
    size: int | None
    status: str = "planned"                # planned, running, acked, failed
    record: dict[str, Any] | None = None   # set when the commit (metadata write) started
    error: str = ""

    @property
    def tag(self) -> bytes:
        return f"w{self.writer}.s{self.seq}.{self.key}.{self.size}".encode()

    def payload(self) -> bytes:
        assert self.size is not None
        return payload(self.tag, self.size)

    def __str__(self) -> str:
        what = "delete" if self.size is None else f"put {self.size} B"
        return f"w{self.writer}#{self.seq} {what} {self.key} ({self.status}{' ' + self.error if self.error else ''})"


def payload(tag: bytes, size: int) -> bytes:
    """`<tag>` repeated to `size` bytes: every segment and fragment names its version, so a
    mix of two versions or a truncation never compares equal to either."""
    unit = b"<" + tag + b">"
    return (unit * (size // len(unit) + 1))[:size]


def tag_of(data: bytes) -> bytes:
    end = data.find(b">")
    return data[1:end] if data.startswith(b"<") and end > 0 else b"?"


class RecordingClient(Client):
    """A Client that notes, on the op its task runs, the record it starts to commit: from
    then on the record may be on a control node, so a failed op may still have taken effect."""

    async def _commit(self, cmap: ClusterMap, bucket: str, key: str, record: dict[str, Any]) -> None:
        op = CURRENT_OP.get()
        if op is not None:
            op.record = {f: record[f] for f in ("ts", "version_id", "deleted")}
        await super()._commit(cmap, bucket, key, record)


async def run_op(c: Client, bucket: str, op: Op) -> None:
    """Run one op with CURRENT_OP set; its status says how it ended (errors are kept)."""
    op.status = "running"
    token = CURRENT_OP.set(op)
    try:
        if op.size is None:
            await c.delete(bucket, op.key)
        else:
            await c.put(bucket, op.key, op.payload())
        assert op.record is not None, "no commit seen: has Client._commit been renamed?"
        op.status = "acked"
    except EcstoreError as exc:
        op.status, op.error = "failed", f"{type(exc).__name__}: {exc.message[:160]}"
    finally:
        CURRENT_OP.reset(token)


def plan(rnd: int) -> list[list[Op]]:
    """Per writer, its ops in order; a key belongs to one writer, so its ops are sequential."""
    out = []
    for w in range(WRITERS):
        ops = []
        for i in range(OPS_PER_WRITER):
            key = f"r{rnd}-w{w}-k{i % KEYS_PER_WRITER}"
            size = None if i % DELETE_EVERY == DELETE_EVERY - 1 else SIZES[(w + i + rnd) % len(SIZES)]
            ops.append(Op(w, i, key, size))
        out.append(ops)
    return out


@dataclass
class KillSwitch:
    pids: list[int]
    after_acks: int
    acks: int = 0
    killed: bool = False
    in_flight: int = 0

    def kill_all(self, ops: list[Op]) -> None:
        """SIGKILL every node process in one go: no await, so no request runs in between."""
        for pid in self.pids:
            os.kill(pid, signal.SIGKILL)
        self.killed = True
        self.in_flight = sum(1 for o in ops if o.status == "running")


async def write_until_killed(cluster: LocalCluster, writers: list[list[Op]], switch: KillSwitch) -> None:
    every = [o for ops in writers for o in ops]

    async def writer(c: Client, ops: list[Op]) -> None:
        for op in ops:
            if switch.killed:
                return
            await run_op(c, BUCKET, op)
            if op.status == "acked":
                switch.acks += 1
                if switch.acks >= switch.after_acks and not switch.killed:
                    switch.kill_all(every)

    clients = [RecordingClient.connect(cluster.path) for _ in writers]
    try:
        if BUCKET not in await clients[0].list_buckets():
            await clients[0].create_bucket(BUCKET)
        await asyncio.gather(*(writer(c, ops) for c, ops in zip(clients, writers)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))


@dataclass
class Outcome:
    verified: int = 0         # keys that read back as their newest acknowledged state
    failed_visible: int = 0   # keys showing a failed put whose commit had started (allowed)
    lost: list[str] = field(default_factory=list)   # newest acknowledged state not read back
    bad: list[str] = field(default_factory=list)    # partial, mixed, or a write that never committed
    seen: dict[str, bytes | None] = field(default_factory=dict)  # key -> tag read (None: NotFound)


def expected(ops: list[Op]) -> tuple[Op | None, list[Op]]:
    """(the key's newest acknowledged op or None, failed ops after it whose commit started)."""
    acked = [i for i, o in enumerate(ops) if o.status == "acked"]
    last = acked[-1] if acked else -1
    maybe = [o for o in ops[last + 1:] if o.status == "failed" and o.record is not None]
    return (ops[last] if last >= 0 else None), maybe


async def verify(cluster: LocalCluster, ops_by_key: dict[str, list[Op]]) -> Outcome:
    out = Outcome()
    async with Client.connect(cluster.path) as c:
        for key, ops in sorted(ops_by_key.items()):
            newest, maybe = expected(ops)
            want = None if newest is None or newest.size is None else newest
            try:
                got: bytes | None = await c.get(BUCKET, key)
            except NotFound:
                got = None
            except EcstoreError as exc:
                (out.lost if want is not None else out.bad).append(f"{key}: {exc!r}; want {want}")
                continue
            match = [o for o in ops if o.size is not None and got is not None
                     and tag_of(got) == o.tag and got == o.payload()]
            seen = "NotFound" if got is None else f"{len(got)} B tagged {tag_of(got)!r}"
            out.seen[key] = None if got is None else tag_of(got)
            if (got is None and want is None) or (want is not None and match == [want]):
                out.verified += 1
            elif (got is None and any(o.size is None for o in maybe)) or (match and match[0] in maybe):
                out.failed_visible += 1
            elif got is not None and not match:
                out.bad.append(f"{key}: read {seen}: not one whole version; ops {[str(o) for o in ops]}")
            elif want is not None:
                out.lost.append(f"{key}: read {seen}; want {want}")
            else:
                out.bad.append(f"{key}: read {seen}; want NotFound; ops {[str(o) for o in ops]}")
    return out


def kill_restart_round(cluster: LocalCluster, rnd: int) -> tuple[list[Op], KillSwitch]:
    """Write round `rnd`'s ops, SIGKILL every node mid-run, start them all again."""
    pids = [n.pid for n in cluster.nodes.values() if n.pid is not None and pid_alive(n.pid)]
    assert len(pids) == len(cluster.nodes) == 9
    writers = plan(rnd)
    switch = KillSwitch(pids, KILL_AFTER_ACKS[rnd])
    asyncio.run(write_until_killed(cluster, writers, switch))
    assert switch.killed, f"round {rnd}: every op was acknowledged before the kill"
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10.0, "the killed nodes to exit")
    cluster.start()
    return [o for w in writers for o in w if o.status != "planned"], switch


def test_acknowledged_writes_survive_sigkill_of_every_node(cluster: LocalCluster) -> None:
    ops: list[Op] = []
    before: dict[str, bytes | None] = {}
    for rnd in range(ROUNDS):
        new, switch = kill_restart_round(cluster, rnd)
        ops += new
        by_key: dict[str, list[Op]] = {}
        for o in ops:  # every round's keys so far: each must survive every later kill too
            by_key.setdefault(o.key, []).append(o)
        out = asyncio.run(verify(cluster, by_key))
        # an earlier round's key that reads differently now: a failed write, on too few control
        # nodes to be read at first, spread by read repair (allowed: its outcome was unknown)
        changed = sorted(k for k in before if out.seen[k] != before[k])
        before = out.seen
        acked = [o for o in new if o.status == "acked"]
        failed = [o for o in new if o.status == "failed"]
        print(f"\nround {rnd}: acknowledged={len(acked)} (puts {sum(o.size is not None for o in acked)}, "
              f"deletes {sum(o.size is None for o in acked)}) failed={len(failed)} "
              f"(commit started {sum(o.record is not None for o in failed)}) "
              f"in-flight-at-kill={switch.in_flight}; all rounds: keys={len(by_key)} "
              f"verified={out.verified} failed-visible-whole={out.failed_visible} "
              f"lost={len(out.lost)} bad={len(out.bad)} changed-since-last-round={changed}")
        for o in failed:
            print(f"  failed: {o}")
        assert switch.in_flight >= 1, "no op was in flight when the nodes died"
        assert not out.lost, f"acknowledged writes lost: {out.lost}"
        assert not out.bad, f"failed or partial writes visible: {out.bad}"
        assert out.verified + out.failed_visible == len(by_key)
