"""Plumbing shared by the background workers (repair, rebalance, garbage collection):
what exists (live records, fragment listings), pacing, resumable position, reports."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from placement.nodes import Node
from store.client import Client
from store.errors import Conflict, EcstoreError, NotFound, Unavailable, Unreachable
from store.wire import unpack

T = TypeVar("T")
log = logging.getLogger("ecstore.workers")

LISTING_PAGE = 10_000
LISTING_HEALTH_S = 5.0     # a node asked for its listing answers its health check first
MAX_PARALLEL_HEADS = 32
MAX_REPORTED_ERRORS = 20


class WorkReport:
    """Mixin of the workers' report dataclasses: JSON-ready, errors capped."""

    errors: list[str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "errors": self.errors[:MAX_REPORTED_ERRORS]}

    def mb_s(self, n_bytes: int) -> float:
        return round(n_bytes / 1e6 / self.seconds, 2) if self.seconds else 0


async def live_records(c: Client, read_repair: bool = True, inline_bytes: bool = True
                       ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """Every live object's full record, sorted by (bucket, key); `read_repair` False: a
    replica found stale is left as it is (repair puts replicas back itself, and counts).
    `inline_bytes` False: an inline object's bytes are left out of the record given (b""
    instead: still inline) - repair, rebalance and gc hold every record, and an inline one
    carries up to 64 KiB. The record is a copy then: never write it back."""
    for bucket in await c.list_buckets():
        async for page in c.list_all(bucket):
            sem = asyncio.Semaphore(MAX_PARALLEL_HEADS)

            async def head(key: str) -> dict[str, Any] | None:
                async with sem:
                    try:
                        return await c.live_record(bucket, key, read_repair)
                    except NotFound:
                        return None
            records = await asyncio.gather(*(head(o.key) for o in page.objects))
            for o, r in zip(page.objects, records):
                if r is not None:
                    if not inline_bytes and r.get("inline"):
                        r = {**r, "inline": b""}   # a copy: read repair may hold the original
                    yield bucket, o.key, r


async def node_listing(c: Client, node: Node, opened: dict[str, str] | None = None) -> set[str]:
    """Every fragment id one storage node holds (paginated). `opened` gets the node's
    open id (which run of the node process listed: a restart makes a new one; "" when
    the pages came from two, or from a node that has none)."""
    out: set[str] = set()
    after = ""
    while True:
        reply = await c.t.request("GET", node.address, "/v1/fragments",
                                  query={"after": after, "limit": LISTING_PAGE}, timeout_s=60)
        page = unpack(reply.body, 64 * 1024 * 1024)
        if opened is not None:
            run = str(page.get("opened") or "")
            opened[node.id] = run if opened.setdefault(node.id, run) == run else ""
        out.update(page["fragments"])
        if not page["truncated"] or not page["fragments"]:
            return out
        after = page["fragments"][-1]


async def all_listings(c: Client, nodes: Iterable[Node], opened: dict[str, str] | None = None
                       ) -> tuple[dict[str, set[str]], list[str]]:
    """Every node's fragment ids, asked in parallel: ({node_id: ids}, [errors]); `opened`
    as node_listing's."""
    nodes = list(nodes)

    async def listed(node: Node) -> set[str]:
        # a stalled node (SIGSTOP, a hung process, a blackholed host) answers nothing: its
        # health check says so in seconds, where its listing page waited out 60 s (a page
        # of a big node's listing may take that long, a health check does not)
        for attempt in (1, 2):
            try:
                await c.t.request("GET", node.address, "/v1/health",
                                  timeout_s=LISTING_HEALTH_S, unqueued=True)
                break
            except EcstoreError as exc:
                # a 503 (the node's connection cap: it asks for a retry after 1 s) gets
                # one more try; a timeout is what a stalled node gives, at once
                if attempt == 1 and not isinstance(exc, Unreachable) and exc.status == 503 \
                        and not exc.details.get("problem"):
                    await asyncio.sleep(1.0)
                    continue
                raise Unavailable("its health check: "
                                  + str(exc.details.get("problem") or exc.message)) from None
        return await node_listing(c, node, opened)
    results = await asyncio.gather(*(listed(n) for n in nodes), return_exceptions=True)
    listings = {n.id: r for n, r in zip(nodes, results) if not isinstance(r, BaseException)}
    errors = [f"storage node {n.id} did not answer its listing"
              + (f" ({r.message})" if isinstance(r, EcstoreError) else "")
              for n, r in zip(nodes, results) if n.id not in listings]
    return listings, errors


class RateLimiter:
    """Keeps bytes per second under rate_mb_s (0 = unlimited)."""

    def __init__(self, rate_mb_s: float) -> None:
        self.rate_b_s = rate_mb_s * 1e6
        self.start = time.monotonic()
        self.bytes = 0

    async def spend(self, n: int) -> None:
        self.bytes += n
        if self.rate_b_s <= 0:
            return
        ahead_s = self.bytes / self.rate_b_s - (time.monotonic() - self.start)
        if ahead_s > 0:
            await asyncio.sleep(ahead_s)


@contextlib.contextmanager
def only_one(state: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock beside a resumable command's state file for its run: a second
    run of the same command from this machine is refused (Conflict) instead of racing the
    first over the same fragments and the same state file. Where no lock file can be made
    (a read-only place), the run goes on unlocked, as it goes on unsaved."""
    lock = state.with_suffix(".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise Conflict(f"another {what} is running (pid {holder}, lock {lock}): wait for "
                           "it to finish, or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


class Checkpoint:
    """How far a resumable pass over sorted (bucket, key) got, in a small JSON file.
    hold(): an object failed - the place stays before it from then on, so a run resumed
    after a kill goes back to it (past it, the failure was never looked at again)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.held = False

    def hold(self) -> None:
        self.held = True

    def load(self) -> tuple[str, str]:
        if self.path is None or not self.path.exists():
            return ("", "")
        try:
            data = json.loads(self.path.read_text())
            return (str(data["bucket"]), str(data["key"]))
        except (ValueError, KeyError):
            return ("", "")

    def save(self, bucket: str, key: str) -> None:
        """Record the position; a place it cannot be written (a read-only or missing
        directory that cannot be made) turns saving off with one warning: the pass goes
        on, it just cannot be resumed."""
        if self.path is None or self.held:
            return
        tmp = self.path.with_suffix(".tmp")
        text = json.dumps({"bucket": bucket, "key": key})
        try:
            try:
                tmp.write_text(text)
            except FileNotFoundError:   # the directory: made once, not before every save
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(text)
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("cannot save progress to %s (%s): this run goes on but cannot be "
                        "resumed", self.path, exc.strerror or exc)
            self.path = None

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def take(items: deque[T], n: int) -> list[T]:
    """The first n of `items`, taken off it (a list's pop(0) or slice copies the rest:
    quadratic over a pass of millions)."""
    return [items.popleft() for _ in range(min(n, len(items)))]


def bounded_parallel(cap: int, budget_bytes: int, each_bytes: int) -> int:
    """How many at once: `cap`, fewer when `each_bytes` apiece would pass budget_bytes."""
    return max(1, min(cap, budget_bytes // max(1, each_bytes)))


async def gather_or_cancel(*aws: Awaitable[T]) -> list[T]:
    """asyncio.gather, but the first exception cancels the others (and waits for them to
    end) before it is raised: a step that fails leaves no copy or delete running behind
    it after its command has reported the failure."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class InOrder:
    """A step's objects, worked on at once, taken into the checkpoint in their order:
    each is saved once it and every one before it are done (a failed one holds the
    checkpoint before it, as one by one), so a run killed mid-step resumes at the first
    object not done - as far along as the objects done in order allow."""

    def __init__(self, checkpoint: Checkpoint, names: list[tuple[str, str]]) -> None:
        self.checkpoint, self.names = checkpoint, names
        self.outcome: dict[int, bool] = {}     # index -> failed
        self.next = 0

    def done(self, n: int, failed: bool) -> None:
        self.outcome[n] = failed
        while self.next in self.outcome:
            if self.outcome[self.next]:
                self.checkpoint.hold()
            self.checkpoint.save(*self.names[self.next])
            self.next += 1


