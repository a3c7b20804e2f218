"""Signed HTTP requests to storage and control nodes, each carrying the request id of
the operation it belongs to (REQUEST_ID_HEADER), so that one operation can be traced
across every node it touched (`grep ID logs/*.log`)."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar
from urllib.parse import quote, urlencode

from store.auth import EMPTY_SHA256
from store.digest import digest
from store.errors import EcstoreError, WrongEventLoop, error_from_body
from store.fetch import NodeClient, Sink

REQUEST_ID_HEADER = "x-ecstore-request-id"
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")   # what a node accepts from a peer
P = ParamSpec("P")
T = TypeVar("T")

# The id of the operation the running code serves: set by a Client operation (unless one
# is set already: the gateway sets its S3 request's id first) and by the nodes' request
# middleware; tasks started inside inherit it, so background work carries it too.
request_id: ContextVar[str | None] = ContextVar("ecstore_request_id", default=None)


def new_request_id() -> str:
    """16 upper-case hex digits, the shape of the gateway's x-amz-request-id. From
    `random` (reseeded in a forked child), not `secrets`: an id is a name, not a secret,
    and os.urandom cost a node ~20 us per request."""
    return f"{random.getrandbits(64):016X}"


def retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (a done callback for one nobody may await: its
    error is raised to any awaiter anyway, and asyncio would log it as never retrieved)."""
    if not fut.cancelled():
        fut.exception()


class LoopBound:
    """State that belongs to one asyncio event loop (connections, futures, semaphores),
    moved to the running loop when the object is used from a new one: a script may call
    asyncio.run twice with the same client. `operation` calls on_loop() for its self."""

    _loop: asyncio.AbstractEventLoop | None = None

    def on_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:
            if self._loop.is_running():
                raise WrongEventLoop(
                    f"this {type(self).__name__} is in use on another event loop that is "
                    "still running (another thread?): make one per event loop, or share a "
                    "SyncClient between threads")
            self.rebind()   # its loop has stopped: nothing of the old state can finish
        self._loop = loop

    def rebind(self) -> None:
        """Drop what belonged to the previous loop."""


def operation(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Run `fn` under a request id: the caller's if one is set, else a new one (and,
    for a LoopBound method, on state that belongs to the running loop)."""
    @functools.wraps(fn)
    async def traced(*args: P.args, **kwargs: P.kwargs) -> T:
        if args and isinstance(args[0], LoopBound):
            args[0].on_loop()
        if request_id.get() is not None:
            return await fn(*args, **kwargs)
        token = request_id.set(new_request_id())
        try:
            return await fn(*args, **kwargs)
        finally:
            # a coroutine closed by the garbage collector (its loop gone) runs this in
            # another context: the reset raised ValueError ("Exception ignored in ...")
            with contextlib.suppress(ValueError):
                request_id.reset(token)
    return traced


async def traced_stream(stream: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """`stream` under one request id (the caller's or a new one), set only while it runs:
    a generator must not leave it set in its consumer's context between items."""
    rid = request_id.get() or new_request_id()
    try:
        while True:
            token = request_id.set(rid)
            try:
                item = await anext(stream)
            except StopAsyncIteration:
                return
            finally:
                request_id.reset(token)
            yield item
            del item  # not held while the next one is fetched (a segment each)
    finally:  # closed early (or done): close `stream` now, as closing it directly would
        token = request_id.set(rid)
        try:
            await stream.aclose()
        finally:
            request_id.reset(token)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]     # names lower-case
    body: bytearray             # empty when it went into the request's sink
    scattered: bool = False


class Transport:
    """Signed requests to the cluster's nodes (store/fetch.py's keep-alive client)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._client: NodeClient | None = None

    @property
    def client(self) -> NodeClient:
        if self._client is None:
            self._client = NodeClient(self.secret)
        return self._client

    async def get_into(self, base_url: str, path: str, timeout_s: float,
                       sink: Sink | None = None, headers: dict[str, str] | None = None) -> Reply:
        """A signed GET of a fragment: the node's error raised, the body a bytearray -
        or, when `sink` (store.fetch.Sink) gives views for it, read into those."""
        return await self.request("GET", base_url, path, timeout_s=timeout_s, sink=sink,
                                  headers=headers)

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def forget(self) -> None:
        """Drop the connections of an event loop that has stopped (its sockets close with
        it; new ones are made on the running loop)."""
        self._client = None

    async def request(self, method: str, base_url: str, path: str, *,
                      body: bytes | bytearray | memoryview = b"", checksum: str | None = None,
                      query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0, ok_404: bool = False,
                      sink: Sink | None = None, unqueued: bool = False) -> Reply:
        """Send one signed request; raise the server's error, or Unavailable (Unreachable)
        if no reply came within `timeout_s`.

        `path` must already be quoted. With ok_404, a 404 is returned, not raised. The
        reply's header names are lower-case, its body a bytearray. `unqueued`: not behind
        this client's other requests to the node (NodeClient.request's).
        """
        path_qs = path + ("?" + urlencode(query) if query else "")
        if checksum is None:
            checksum = digest(body) if body else EMPTY_SHA256
        rid = request_id.get()
        extra = dict(headers) if headers else {}
        if rid is not None:
            extra[REQUEST_ID_HEADER] = rid
        resp = await self.client.request(method, base_url, path_qs, timeout_s, body, checksum,
                                         extra, sink, unqueued)
        if resp.status >= 400 and not (ok_404 and resp.status == 404):
            raise error_from_body(resp.status, resp.body)
        return Reply(resp.status, resp.headers, resp.body, resp.scattered)


def quote_key(key: str) -> str:
    return quote(key, safe="")


__all__ = ["Transport", "Reply", "quote_key", "EcstoreError", "REQUEST_ID_HEADER", "request_id",
           "new_request_id", "operation", "traced_stream"]
