"""Metadata quorum: records on R control nodes, W acks to write, read quorum to read."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.errors import (
    EcstoreError,
    InsufficientStorage,
    Unavailable,
    Unreachable,
    error_from_response,
)
from store.transport import Transport, request_id
from store.wire import pack, unpack

META_TIMEOUT_S = 5.0
MISS_WAIT_S = 0.1       # a read whose quorum found nothing waits this long for the others
FULL_BACKOFF_S = 2.0    # a control node that answered a write 507 is not sent writes this long
BATCH_PATHS = {"put": "/v1/objects", "get": "/v1/objects/read"}   # POST, node/control.py
MAX_BATCH_ITEMS = 64
MAX_BATCH_BYTES = 1024 * 1024
# a record read dated further ahead of this client's clock is not followed (Client.record_ts):
# the signature check refuses writers whose clock is off by more than this (store.auth)
MAX_SEEN_AHEAD_NS = 300 * 10**9
SLOW_GRACE_S = 0.2   # how long to wait for the rest once enough nodes have answered
T = TypeVar("T")


async def first_answers(aws: Sequence[Awaitable[T]], enough: int,
                        grace_s: float = SLOW_GRACE_S) -> list[T | BaseException]:
    """Run every awaitable; return once all are done, or once `enough` succeeded and
    `grace_s` more has passed. Each result is the value, the exception, or Unavailable
    for one still running then (cancelled): a stalled node never stalls the caller."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    pending = set(tasks)
    ok = 0
    while pending and ok < enough:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        ok += sum(1 for t in done if not t.cancelled() and t.exception() is None)
    return await _outcomes(tasks, pending, grace_s)


async def staged_answers(makers: Sequence[Callable[[], Awaitable[T]]], enough: int,
                         grace_s: float = SLOW_GRACE_S) -> list[T | BaseException]:
    """Like first_answers, but only `enough` of the calls are started at first: the others
    are spares, started one for each call that fails, and one more every `grace_s` that
    passes without `enough` successes once any call has answered (a stalled node is
    worked around, not waited for). The results are those of the calls started, in
    order: a spare never started has none (the list is shorter).
    Saves the work of asking every replica when a quorum of them is all that is needed."""
    tasks: list[asyncio.Future[T] | None] = [None] * len(makers)
    started = 0

    def start_next() -> bool:
        nonlocal started
        if started == len(makers):
            return False
        tasks[started] = asyncio.ensure_future(makers[started]())
        started += 1
        return True

    while started < min(enough, len(makers)):
        start_next()
    pending = {t for t in tasks if t is not None}
    ok = answered = 0
    while pending and ok < enough:
        done, pending = await asyncio.wait(
            pending, timeout=grace_s if answered else None, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            answered += 1
            if not t.cancelled() and t.exception() is None:
                ok += 1
            elif start_next():   # a failure: the next spare at once
                pending.add(tasks[started - 1])  # type: ignore[arg-type]
        if not done and start_next():   # slow: bring in a spare, keep waiting for all
            pending.add(tasks[started - 1])  # type: ignore[arg-type]
    return await _outcomes([t for t in tasks if t is not None], pending, grace_s)


async def _outcomes(tasks: Sequence[asyncio.Future[T]], pending: Collection[asyncio.Future[T]],
                    grace_s: float) -> list[T | BaseException]:
    """Give the `pending` tasks `grace_s` more, cancel those still running, and return
    each task's value, exception, or Unavailable for one cancelled."""
    if pending:
        await asyncio.wait(pending, timeout=grace_s)
    out: list[T | BaseException] = []
    for task in tasks:
        if not task.done():
            task.cancel()
            out.append(Unavailable(f"no answer within {grace_s} s of a quorum"))
        elif task.cancelled():
            out.append(Unavailable("cancelled"))
        else:
            exc = task.exception()
            out.append(exc if exc is not None else task.result())
    return out


def newest(records: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The newest record by (ts, version_id), or None if there is none."""
    present = [r for r in records if r is not None]
    return max(present, key=lambda r: (r["ts"], r["version_id"])) if present else None


class _Queued:
    """A record write or read waiting for the next batch to its node."""
    __slots__ = ("item", "alone", "rid", "fut", "since")

    def __init__(self, item: list[Any], alone: Callable[[], Awaitable[Any]],
                 fut: asyncio.Future[Any]) -> None:
        self.item, self.alone, self.fut = item, alone, fut   # alone: sends it by itself
        self.rid = request_id.get()
        self.since = time.monotonic()


class _Outbox:
    """Object record writes (or reads) to one control node: one request on its way at a
    time; the ones that arrive meanwhile wait and go together in the next (POST
    /v1/objects, /v1/objects/read), so N concurrent callers cost the node and this
    client one request, not N."""
    __slots__ = ("busy", "queue", "single_only")

    def __init__(self) -> None:
        self.busy = False
        self.queue: list[_Queued] = []
        self.single_only = False     # the node has no batch route (an older version)


class MetaQuorum:
    def __init__(self, transport: Transport, background: set[asyncio.Future[Any]]) -> None:
        self.t = transport
        self.background = background
        self._outboxes: dict[tuple[str, str], _Outbox] = {}   # (kind, node address)
        # batch requests sent and the records in them, by kind ("put", "get")
        self.batch_stats = {"put": 0, "put_records": 0, "get": 0, "get_records": 0}
        # a control node whose disk is full (507) is not sent writes for FULL_BACKOFF_S:
        # each would be refused, and fill its log (reads still go to it)
        self._full_until: dict[str, float] = {}
        # the newest record ts this client has read (at most MAX_SEEN_AHEAD_S past its own
        # clock): its puts are dated after it (Client.record_ts), so a put that follows a
        # read of a record written by a host whose clock runs ahead is not outranked by it
        self.seen_ts = 0

    def saw(self, record: dict[str, Any] | None) -> None:
        if record is None:
            return
        ts = record.get("ts")
        if isinstance(ts, int) and self.seen_ts < ts <= time.time_ns() + MAX_SEEN_AHEAD_NS:
            self.seen_ts = ts

    def forget(self) -> None:
        """Drop the queues of an event loop that has stopped (their callers are gone)."""
        self._outboxes.clear()

    async def write(self, nodes: tuple[Node, ...], path: str, record: dict[str, Any],
                    needed: int, object_name: tuple[str, str] | None = None) -> int:
        """PUT record to every node; return once `needed` acked (the rest go on).
        `object_name` (bucket, key): an object's record, which may travel in a batch."""
        body = pack(record)

        async def one(node: Node) -> None:
            async def alone() -> None:
                await self.t.request("PUT", node.address, path, body=body,
                                     timeout_s=META_TIMEOUT_S)
            full = self._full_until.get(node.address)
            if full is not None and full > time.monotonic():
                raise InsufficientStorage(f"{node.id}: disk full (it answered 507 less than "
                                          f"{FULL_BACKOFF_S:g} s ago)")
            try:
                if object_name is None:
                    await alone()
                else:
                    await self._batched("put", node, [*object_name, body], alone)
            except InsufficientStorage:
                self._full_until[node.address] = time.monotonic() + FULL_BACKOFF_S
                raise

        tasks = [asyncio.ensure_future(one(n)) for n in nodes]
        return await self._quorum(tasks, needed, "write", path, nodes)

    async def put_to(self, node: Node, bucket: str, key: str, path: str,
                     record: dict[str, Any]) -> dict[str, Any]:
        """One object record to one control node - in a batch with the others on their way
        to it, if any - and its answer ({"applied": ..., ...}; {} if it gave none).
        For the admin commands' copies (a metadata move, a replica repair)."""
        body = pack(record)

        async def alone() -> dict[str, Any]:
            reply = await self.t.request("PUT", node.address, path, body=body,
                                         timeout_s=META_TIMEOUT_S)
            answer = unpack(reply.body)
            return answer if isinstance(answer, dict) else {}
        answer = await self._batched("put", node, [bucket, key, body], alone)
        return answer if isinstance(answer, dict) else {}

    async def _batched(self, kind: str, node: Node, item: list[Any],
                       alone: Callable[[], Awaitable[Any]]) -> Any:
        """`alone()` at once if nothing of this kind is on its way to the node, else
        `item` queued for the next batch; the result either way."""
        box = self._outboxes.get((kind, node.address))
        if box is None:
            box = self._outboxes[(kind, node.address)] = _Outbox()
        if box.busy:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            box.queue.append(_Queued(item, alone, fut))
            return await fut
        box.busy = True
        try:
            return await alone()
        finally:
            self._next_batch(kind, node, box)

    def _next_batch(self, kind: str, node: Node, box: _Outbox) -> None:
        """Send what queued for this node (up to a batch's size), or mark it idle. What
        waited longer than a request's timeout fails now: a node that stalls must not
        gather a queue without bound (before batches, each request timed out)."""
        now = time.monotonic()
        if box.queue and now - box.queue[0].since > META_TIMEOUT_S:
            late = [q for q in box.queue if now - q.since > META_TIMEOUT_S]
            box.queue = [q for q in box.queue if now - q.since <= META_TIMEOUT_S]
            for q in late:
                if not q.fut.done():
                    q.fut.set_exception(Unreachable(
                        f"control node {node.id}: no answer within {META_TIMEOUT_S} s"))
        # items whose caller is gone (cancelled: Client.close with a node not answering)
        # are not sent: a batch of them only loaded the node, and kept close() busy
        box.queue = [q for q in box.queue if not q.fut.done()]
        if not box.queue:
            box.busy = False
            return
        size, n = 0, 0
        while n < min(len(box.queue), MAX_BATCH_ITEMS) and (n == 0 or size < MAX_BATCH_BYTES):
            size += sum(len(x) for x in box.queue[n].item if isinstance(x, (str, bytes)))
            n += 1
        items, box.queue = box.queue[:n], box.queue[n:]
        self._spawn(self._send_batch(kind, node, box, items))

    async def _send_batch(self, kind: str, node: Node, box: _Outbox,
                          items: list[_Queued]) -> None:
        try:
            if len(items) > 1 and not box.single_only:
                if await self._post_batch(kind, node, items):
                    return
                box.single_only = True      # an older node, without the route: one by one
            await asyncio.gather(*(self._send_alone(q) for q in items))
        finally:
            for q in items:     # whatever went wrong (a reply of the wrong shape, a
                if not q.fut.done():    # cancellation), no caller waits for ever
                    q.fut.set_exception(Unavailable(f"control node {node.id}: no answer"))
            self._next_batch(kind, node, box)

    async def _post_batch(self, kind: str, node: Node, items: list[_Queued]) -> bool:
        """Send items as one batch and settle each one's future; False (nothing settled)
        if the node has no batch route."""
        body = pack([q.item + [q.rid] for q in items])
        try:
            reply = await self.t.request("POST", node.address, BATCH_PATHS[kind], body=body,
                                         timeout_s=META_TIMEOUT_S)
            results = unpack(reply.body)
            if not isinstance(results, list) or len(results) != len(items):
                raise Unavailable(f"control node {node.id}: a batch reply of the wrong shape")
        except EcstoreError as exc:
            if exc.status == 404:   # no such route: a node older than batches
                return False
            for q in items:
                if not q.fut.done():
                    q.fut.set_exception(exc)
            return True
        self.batch_stats[kind] += 1
        self.batch_stats[kind + "_records"] += len(items)
        for q, (status, answer) in zip(items, results):
            if q.fut.done():
                continue
            if kind == "get" and status == 200 and isinstance(answer, bytes):
                q.fut.set_result(unpack(answer))
            elif status < 400 and kind == "put":    # the node's answer: {applied, ...}
                q.fut.set_result(answer if isinstance(answer, dict) else None)
            elif status == 404 and kind == "get":
                q.fut.set_result(None)
            else:
                q.fut.set_exception(error_from_response(
                    status, answer if isinstance(answer, dict) else None))
        return True

    async def _send_alone(self, q: _Queued) -> None:
        # gather runs each in a task of its own, in a copy of the context: the id is set in
        # that copy only, nothing to reset (a reset in `finally` raised ValueError when the
        # GC closed the coroutine in another context after its loop had ended)
        request_id.set(q.rid)
        try:
            result = await q.alone()
        except Exception as exc:  # noqa: BLE001 - the caller's, as if it had sent it
            if not q.fut.done():
                q.fut.set_exception(exc)
        else:
            if not q.fut.done():
                q.fut.set_result(result)

    async def read(self, nodes: tuple[Node, ...], path: str, needed: int,
                   repair: bool = True, object_name: tuple[str, str] | None = None,
                   owners: int | None = None) -> dict[str, Any] | None:
        """Ask every node, take the newest of the first `needed` answers.

        The answers that arrive later are still compared, in the background, and every
        replica that answered with an older record (or none) is sent the newest.
        `object_name` (bucket, key): an object's record, which may be asked in a batch.
        """
        answers: dict[str, dict[str, Any] | None] = {}

        async def one(node: Node) -> None:
            async def alone() -> dict[str, Any] | None:
                reply = await self.t.request("GET", node.address, path, ok_404=True,
                                             timeout_s=META_TIMEOUT_S)
                return None if reply.status == 404 else unpack(reply.body)
            if object_name is None:
                answers[node.id] = await alone()
            else:
                answers[node.id] = await self._batched("get", node, [*object_name], alone)

        tasks = [asyncio.ensure_future(one(n)) for n in nodes]
        await self._quorum(tasks, needed, "read", path, nodes)
        best = newest(list(answers.values()))
        late = [t for t in tasks if not t.done()]
        if best is None and late:
            # The quorum says "none". Replicas that lost the record (a wiped disk, before
            # repair) can be the first to say so while the last holds it: the others were
            # asked at the same time, so their answers are due - wait for them briefly.
            await asyncio.wait(late, timeout=MISS_WAIT_S)
            best = newest(list(answers.values()))
        self.saw(best)
        if repair and best is not None:
            # only the record's owners are repaired: while a control ring change is being
            # moved, `nodes` also has the ones it leaves (its first `owners` are those that
            # hold it now) - a record read back onto a node the move dropped it from
            # outlived the move there, and brought a deleted object back after gc purged
            # its tombstone from the owners
            self._spawn(self._repair(nodes[:owners], tasks, answers, path))
        return best

    async def _repair(self, nodes: tuple[Node, ...], tasks: Sequence[asyncio.Future[None]],
                      answers: dict[str, dict[str, Any] | None], path: str) -> None:
        await asyncio.wait(tasks, timeout=META_TIMEOUT_S)
        best = newest(list(answers.values()))
        # older by (ts, version_id), or none: not merely different - replicas of one
        # version differ in what each control node noted it replaced (node.metadb.
        # REPLACED), and such a replica was sent the record at every read, refused as
        # not newer every time
        stale = tuple(n for n in nodes if n.id in answers and best is not None
                      and ((r := answers[n.id]) is None
                           or (r["ts"], r["version_id"]) < (best["ts"], best["version_id"])))
        if best is not None and stale:
            await self.write(stale, path, best, 0)

    async def _quorum(self, tasks: Sequence[asyncio.Future[None]], needed: int,
                      what: str, path: str, nodes: Sequence[Node]) -> int:
        """Wait until `needed` tasks succeeded (one per node, in order); the others go on
        in the background. Unavailable names each node that failed and its reason (a
        control node whose disk is full: its 507's)."""
        ok, failures = 0, []
        pending = set(tasks)
        try:
            while pending and ok < needed:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        ok += 1
                    else:
                        failures.append(f"{nodes[tasks.index(task)].id}: {exc}")
        finally:
            for task in pending:  # let stragglers finish in the background
                self.background.add(task)
                task.add_done_callback(self._forget)
        if ok < needed:
            raise Unavailable(f"metadata {what} of {path}: {ok} of {len(tasks)} control "
                              f"nodes answered, {needed} needed"
                              + (f" ({'; '.join(failures[:3])})" if failures else ""),
                              tried=len(tasks), failed=len(failures), errors=failures[:3])
        return ok

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None and not isinstance(exc, EcstoreError):
                pass  # background repair is best effort; quorum already decided


def effective_quorums(cmap: ClusterMap, n_nodes: int) -> tuple[int, int]:
    """(write, read) quorums when fewer than R control nodes exist."""
    return min(cmap.write_quorum, n_nodes), min(cmap.read_quorum, n_nodes)
