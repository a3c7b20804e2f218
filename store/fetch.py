"""Signed requests to our own nodes over keep-alive connections, each response body read
straight into one buffer.

aiohttp's client hands a response body over as a list of chunks that it copies out of the
socket buffer and then joins (two copies of every byte), and spends ~75-350 us of Python
per request around that (measured: a 404 GET 144 us of client CPU with aiohttp, 70 here;
a 256 KiB fragment GET 508 vs 138). Every request between ecstore components goes here
instead: a keep-alive connection is an asyncio BufferedProtocol; the kernel copies a body
once, into a bytearray sized from Content-Length, and nothing else touches it until the
caller reads it. Request bodies are written as they are (no copy for large ones).

Only for our own nodes (aiohttp web servers), whose replies always carry Content-Length
(or are 204/304, or answer a HEAD). Anything unexpected - no Content-Length, a chunked or
malformed head, a connection that dies - is an Unreachable error (an Unavailable), and the
connection is dropped; the client's retry, hedging and handoff logic does the rest. A
connection is reused only after a complete response that did not ask to close (and, for
a request with a body, only after a success: a node that refused a body may not have read
it). One that a request gave up on (timeout, hedging loser) is aborted. At most
MAX_IN_FLIGHT_PER_NODE requests run per node at once (the rest wait, within their timeout).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from store.alloc import unfilled
from store.auth import EMPTY_SHA256, sign_headers
from store.errors import EcstoreError, Unreachable, error_from_body

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 128 * 1024 * 1024
MAX_IDLE_PER_NODE = 32
MAX_IN_FLIGHT_PER_NODE = 32
SMALL_BODY_BYTES = 64 * 1024   # sent in one write with the head (copied); larger ones apart
NO_BODY_STATUSES = frozenset({204, 304})
CONNECT_TIMEOUT_S = 3.0
SCRATCH_BYTES = 64 * 1024


# Where a response body goes instead of a buffer of its own: called with the status and
# Content-Length once the head is read, it returns writable views, none empty, whose
# lengths add up to the Content-Length (the body is read into them in order), or None for
# the usual buffer.
Sink = Callable[[int, int], "list[memoryview] | None"]


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]       # names lower-cased
    body: bytearray               # empty when the body went into a sink's views
    scattered: bool = False       # it did


class _Conn(asyncio.BufferedProtocol):
    """One HTTP/1.1 keep-alive connection; one request at a time.

    `scratch` receives a response head and is shared by every connection of a NodeClient
    (one event loop): buffer_updated copies what it needs out of it before returning, so
    64 idle connections do not hold 64 buffers."""

    def __init__(self, scratch: bytearray) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._scratch = scratch
        self._head = bytearray()
        self._body: bytearray | None = None
        self._views: list[memoryview] | None = None   # the body's destination
        self._vi = 0                   # the view being filled
        self._got = 0                  # bytes in it so far
        self._sink: Sink | None = None
        self._fut: asyncio.Future[Response] | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep = False
        self._no_body = False          # a HEAD request: no body whatever Content-Length says
        self.reusable = False

    # -- asyncio callbacks --
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(f"connection lost: {exc or 'closed by the node'}")

    def eof_received(self) -> bool:
        return False   # close our side too

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self._views is not None:
            return self._views[self._vi][self._got:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._views is not None:
            self._got += nbytes
            if self._got == len(self._views[self._vi]):
                self._next_view()
            return
        if self._fut is None:            # bytes nobody asked for
            self._abort("unexpected bytes on an idle connection")
            return
        self._head += self._scratch[:nbytes]
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD_BYTES:
                self._abort("response head too large")
            return
        try:
            length = self._parse_head(bytes(self._head[:end]))
        except ValueError as exc:
            self._abort(f"malformed response: {exc}")
            return
        rest = memoryview(self._head)[end + 4:]
        if len(rest) > length:
            rest.release()
            self._abort("more bytes than Content-Length")
            return
        views = self._sink(self._status, length) if self._sink is not None and length else None
        if views is not None and (sum(len(v) for v in views) != length
                                  or not all(len(v) for v in views)):
            views = None                 # not what it is for: the usual buffer
        if views is None:
            self._body = unfilled(length)
            views = [memoryview(self._body)]
        else:
            self._body = None
        self._views, self._vi, self._got = views, 0, 0
        if not length:
            self._complete()
        while len(rest):                 # what came with the head, into the first views
            n = min(len(rest), len(views[self._vi]) - self._got)
            views[self._vi][self._got:self._got + n] = rest[:n]
            rest = rest[n:]
            self._got += n
            if self._got == len(views[self._vi]):
                self._next_view()
        rest.release()
        self._head = bytearray()

    def _next_view(self) -> None:
        assert self._views is not None
        self._vi += 1
        self._got = 0
        if self._vi == len(self._views):
            self._complete()

    # -- our side --
    def start(self, head: bytes, body: bytes | bytearray | memoryview = b"",
              no_body: bool = False, sink: Sink | None = None) -> asyncio.Future[Response]:
        assert self.transport is not None and self._fut is None
        if self.closed or self.transport.is_closing():
            # reset by the node (killed) after connect and before this first write - its
            # connection_lost has run: a write would be dropped silently by asyncio's loop
            # (the request then waited out its timeout) or raise RuntimeError on uvloop's
            raise ConnectionError("connection closed by the node")
        self._fut = asyncio.get_running_loop().create_future()
        self.reusable = False
        self._no_body = no_body
        self._sink = sink
        try:
            if len(body) <= SMALL_BODY_BYTES:
                self.transport.write(head + body if body else head)
            else:
                self.transport.write(head)
                self.transport.write(body)
        except RuntimeError as exc:
            # uvloop: the transport's handle is closed ("the handler is closed"): a
            # connection that died, like any other - Unreachable for the caller
            self._fut = None
            self.closed = True
            raise ConnectionError(f"connection lost: {exc}") from None
        return self._fut

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            try:
                self.transport.abort()
            except RuntimeError:   # its loop is closed: a request finalised by the GC
                pass

    def _parse_head(self, head: bytes) -> int:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError("no status line")
        self._status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError("header line without a colon")
            headers[name.strip().lower()] = value.strip()
        self._headers = headers
        self._keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if self._no_body or self._status in NO_BODY_STATUSES:
            return 0
        if self._status < 200:
            raise ValueError(f"unexpected interim response {self._status}")
        if "transfer-encoding" in headers:
            raise ValueError("chunked body")
        length = int(headers.get("content-length", "-1"))
        if not 0 <= length <= MAX_BODY_BYTES:
            raise ValueError(f"Content-Length {length}")
        return length

    def _complete(self) -> None:
        fut, body = self._fut, self._body
        self._fut, self._body, self._views, self._sink, self._got = None, None, None, None, 0
        self.reusable = self._keep
        if fut is not None and not fut.done():
            fut.set_result(Response(self._status, self._headers,
                                    bytearray() if body is None else body, body is None))

    def _fail(self, why: str) -> None:
        fut = self._fut
        self._fut, self._body, self._views, self._sink = None, None, None, None
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(why))

    def _abort(self, why: str) -> None:
        self._fail(why)
        self.abort()


def data_lane(method: str, path_qs: str) -> bool:
    """True for the requests a node answers on its fast path (node.fastpath): fragment
    GETs and PUTs, object record GETs and PUTs, record batches, listings. A node hands a
    connection to aiohttp for good at its first other request, so those others (the
    map, buckets, read reports, deletes, health) go over connections of their own: a
    pooled connection that carried a map fetch would carry every record after it
    through aiohttp."""
    if path_qs.startswith("/v1/list/"):
        return method == "GET"
    if "?" in path_qs:
        return False
    if path_qs.startswith("/v1/fragments/"):
        return method == "GET" or method == "PUT"
    if path_qs.startswith("/v1/objects"):
        return method == "GET" or method == "PUT" or method == "POST"
    return False


class NodeClient:
    """Keep-alive connections per node (two lanes: data_lane requests and the rest) and
    signed requests over them."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._idle: dict[tuple[str, int, bool], list[_Conn]] = {}
        self._addr: dict[str, tuple[str, int]] = {}
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._scratch = bytearray(SCRATCH_BYTES)

    def _address(self, base_url: str) -> tuple[str, int]:
        addr = self._addr.get(base_url)
        if addr is None:
            u = urlsplit(base_url)
            if u.scheme != "http" or not u.hostname:
                raise ValueError(f"not an http URL: {base_url}")
            addr = self._addr[base_url] = (u.hostname, u.port or 80)
        return addr

    async def _connection(self, addr: tuple[str, int], lane: bool,
                          reuse: bool) -> tuple[_Conn, bool]:
        """An idle connection of `lane` (reused: True) or a new one."""
        idle = self._idle.get((*addr, lane))
        while reuse and idle:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(self._scratch), addr[0], addr[1]),
            CONNECT_TIMEOUT_S)
        return conn, False

    def _release(self, addr: tuple[str, int], lane: bool, conn: _Conn) -> None:
        idle = self._idle.setdefault((*addr, lane), [])
        if conn.reusable and not conn.closed and len(idle) < MAX_IDLE_PER_NODE:
            idle.append(conn)
        else:
            conn.abort()

    async def request(self, method: str, base_url: str, path_qs: str, timeout_s: float,
                      body: bytes | bytearray | memoryview = b"",
                      checksum: str = EMPTY_SHA256,
                      extra_headers: dict[str, str] | None = None,
                      sink: Sink | None = None, unqueued: bool = False) -> Response:
        """One request signed with `checksum` (the body's SHA-256 hex); the response
        whatever its status, or Unreachable if none could be had in `timeout_s`.

        `path_qs` must already be quoted. A reused connection that the node closed while
        idle is retried once on a new one: the request most likely never arrived, and the
        requests we send are idempotent but for read-count reports (advisory: one counted
        twice, at worst)."""
        addr = self._address(base_url)
        hdrs = sign_headers(self.secret, method, path_qs, checksum, headers=extra_headers)
        if extra_headers:
            hdrs.update(extra_headers)
        fields = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        head = (f"{method} {path_qs} HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\n{fields}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        lane = data_lane(method, path_qs)
        slots: asyncio.Semaphore | contextlib.nullcontext[None] | None = self._slots.get(addr)
        if slots is None:
            slots = self._slots[addr] = asyncio.Semaphore(MAX_IN_FLIGHT_PER_NODE)
        if unqueued:   # a health probe of a node our own requests keep busy: not behind them
            slots = contextlib.nullcontext()
        try:
            async with asyncio.timeout(timeout_s), slots:
                for attempt in (0, 1):
                    conn, reused = await self._connection(addr, lane, reuse=attempt == 0)
                    try:
                        resp = await conn.start(head, body, no_body=method == "HEAD",
                                                sink=sink)
                    except ConnectionError:
                        conn.abort()
                        if reused:
                            continue   # most likely an idle connection the node closed
                        raise
                    except BaseException:   # cancelled (timeout, hedging): mid-response
                        conn.abort()
                        raise
                    if body and resp.status >= 400:
                        conn.abort()   # refused early, our body may be unread
                    else:
                        self._release(addr, lane, conn)
                    return resp
        except TimeoutError:    # its str() is empty: "unreachable: TimeoutError " said nothing
            raise Unreachable(f"{base_url} unreachable: no answer within {timeout_s:g} s "
                              "(stalled, overloaded or a lossy link)") from None
        except (ConnectionError, OSError, ValueError) as exc:
            raise Unreachable(f"{base_url} unreachable: {type(exc).__name__} {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def get(self, base_url: str, path: str, timeout_s: float,
                  extra_headers: dict[str, str] | None = None) -> Response:
        """One signed GET; raises the node's error (4xx/5xx), or Unreachable."""
        resp = await self.request("GET", base_url, path, timeout_s, extra_headers=extra_headers)
        if resp.status >= 400:
            raise error_from_body(resp.status, resp.body)
        return resp

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


__all__ = ["NodeClient", "Response", "Sink", "EcstoreError", "data_lane"]
