"""The nodes' fast path: the requests that make up nearly all of a storage or control
node's traffic answered straight from the connection's protocol, without aiohttp's
request, middleware and response objects.

Through aiohttp, its request, middleware and response objects were most of a small
request's CPU. Measured alone (one node, 256 KiB fragments, 8 in flight, A/B back to
back): a fragment PUT costs 425-525 us of node CPU here against 700-800 through aiohttp,
a cached GET 75-92 against 83-100; in a cluster, the storage nodes' CPU per S3 1 MiB
put fell by 28%, per get by 25%, the control nodes' by 11-21% and 31-34% (README,
bench.bound). Every connection starts here (`FastConn`, in front of aiohttp's protocol):
it reads request heads itself and answers, byte for byte as the aiohttp routes would
(the same headers, statuses, error bodies, counters and request log line), the requests
its role's `Routes` take:

- a storage node's (`FragmentRoutes`): `GET /v1/fragments/{fid}`, by sendfile when the
  record is cached and >= 64 KiB, from the page cache in the loop, else read in a
  thread; `PUT /v1/fragments/{fid}`, then the node's batch writer;
- a control node's (node.control.RecordRoutes): object record GETs and PUTs, the
  record batches, `POST /v1/objects` and `/v1/objects/read`, and listings,
  `GET /v1/list/{bucket}`.

A request body (with a Content-Length) is received straight into one buffer, no copy
out of the socket's chunks. Anything else - another route or method, a request not
signed correctly, a head this parser would have to judge (no Content-Length on a body,
Transfer-Encoding, Expect, a Connection header other than keep-alive, HTTP/1.0, a
duplicate header, a line past aiohttp's limits, a bad metadata header, bytes that are
not ASCII) - is handed to aiohttp with every byte not yet answered, and the connection
stays with aiohttp from then on: it gives every error, limit and odd case the answer it
gave before. So the fast path only ever answers requests whose answer it can give
exactly; `ECSTORE_FAST_PATH=0` turns it off (every connection aiohttp's from its first
byte). The client library keeps the requests a fast path takes on connections of their
own (store.fetch.data_lane), so a map fetch does not take a pooled connection to aiohttp
for good.
"""
from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from node import zerocopy
from node.metrics import Observer
from node.server import (
    CLIENT_CLOSED,
    DRAIN_POLL_S,
    KEEPALIVE_TIMEOUT_S,
    MAX_BODY,
    MAX_HEADER_FIELD_BYTES,
    MAX_HEADERS,
    MAX_REQUEST_LINE_BYTES,
    OBSERVER,
    SECRET_KEY,
    ProtocolFactory,
    malformed_signature_fields,
)
from node.volumes import FRAGMENT_ID_RE, Fragment, pread_padded
from store.alloc import unfilled
from store.auth import CHECKSUM_HEADER, verify
from store.errors import EcstoreError
from store.transport import REQUEST_ID_HEADER, REQUEST_ID_RE, new_request_id
from store.wire import FRAGMENT_META_HEADER as META_HEADER
from store.wire import uncached_requested, unpack_header

log = logging.getLogger("ecstore.node")

FAST_PATH_ENV = "ECSTORE_FAST_PATH"
PREFIX = "/v1/fragments/"
MAX_HEAD_BYTES = 16 * 1024        # no end of head within this: aiohttp judges it
SCRATCH_BYTES = 64 * 1024          # what a read takes when it is not a PUT body
SMALL_BODY_BYTES = 64 * 1024       # a body this small goes out in one write with its head
MAX_BUFFERED_BYTES = 1024 * 1024   # bytes read ahead while a request is answered: then pause
SWEEP_EVERY_S = 5.0                # how often idle connections are looked for
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")   # an HTTP header name (RFC 9110)


def enabled_from_env() -> bool:
    """$ECSTORE_FAST_PATH: 1 (default) or 0."""
    text = os.environ.get(FAST_PATH_ENV, "1").strip().lower()
    if text not in ("0", "1", "true", "false", "yes", "no", "on", "off", ""):
        raise SystemExit(f"{FAST_PATH_ENV} must be 1 or 0, got {text!r}")
    return text not in ("0", "false", "no", "off")


class Request:
    """One request head the fast path will answer: `op` names it in the metrics and the
    log line (the aiohttp route's name), `arg` is what the role's routes made of it."""
    __slots__ = ("method", "target", "headers", "length", "op", "arg", "rid", "started")

    def __init__(self, method: str, target: str, headers: dict[str, str], length: int,
                 op: str, arg: Any) -> None:
        self.method, self.target, self.headers, self.length = method, target, headers, length
        self.op, self.arg = op, arg
        self.started = time.perf_counter()
        rid = headers.get(REQUEST_ID_HEADER)
        self.rid = rid if rid is not None and REQUEST_ID_RE.fullmatch(rid) else new_request_id()


# what a role's routes make of a request line and its headers: (op, arg), or None when
# aiohttp should answer it
Route = Callable[[str, str, dict[str, str], int], "tuple[str, Any] | None"]


def route_fragment(method: str, target: str, headers: dict[str, str],
                   length: int) -> tuple[str, Any] | None:
    """A storage node's: GET /v1/fragments/{fid} (arg: (fid, {})) and PUT with its meta
    header (arg: (fid, meta))."""
    if method not in ("GET", "PUT") or not target.startswith(PREFIX):
        return None
    fid = target[len(PREFIX):]
    if not FRAGMENT_ID_RE.match(fid) or ".." in fid:
        return None    # a query, a sub-path, an id aiohttp's route would refuse
    if method == "GET":
        return "get_fragment", (fid, {})
    if "content-length" not in headers:
        return None
    try:
        meta = unpack_header(headers.get(META_HEADER))
    except EcstoreError:
        return None
    return "put_fragment", (fid, meta)


def parse_head(head: bytes, max_body: int, route: Route = route_fragment) -> Request | None:
    """The request in `head` (without its blank line) if it is one the fast path
    answers exactly as aiohttp's routes would (`route` says which of a role's requests
    those are); None for anything to hand to aiohttp."""
    if not head.isascii():
        return None
    lines = head.decode("ascii").split("\r\n")
    if len(lines[0]) > MAX_REQUEST_LINE_BYTES or len(lines) - 1 > MAX_HEADERS:
        return None
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1":
        return None
    method, target = parts[0], parts[1]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or len(line) > MAX_HEADER_FIELD_BYTES or not _TOKEN.fullmatch(name):
            return None   # aiohttp's parser refuses a name that is not a token
        value = value.strip(" \t")
        if not value.isprintable():
            return None   # a control character (aiohttp's parser refuses some)
        name = name.lower()
        if name in headers:
            return None
        headers[name] = value
    if "transfer-encoding" in headers or "expect" in headers or "upgrade" in headers:
        return None
    connection = headers.get("connection")
    if connection is not None and connection.lower() != "keep-alive":
        return None
    text = headers.get("content-length")
    if text is None:
        length = 0
    elif not text.isdigit() or len(text) > 12:
        return None
    else:
        length = int(text)
    if (method == "GET" and length) or length > max_body:
        return None
    if malformed_signature_fields(headers, target) is not None:
        return None
    routed = route(method, target, headers, length)
    if routed is None:
        return None
    return Request(method, target, headers, length, *routed)


_date: list[Any] = [0, ""]


def http_date() -> str:
    """The Date header's value, made once a second."""
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, email.utils.formatdate(now, usegmt=True)]
    return _date[1]


def response_head(status: int, length: int, content_type: str | None,
                  headers: dict[str, str] | None = None) -> bytes:
    """A response head as aiohttp writes one for web.Response (no Content-Type on a
    response without a body)."""
    phrase = http.HTTPStatus(status).phrase
    extra = "".join([f"{k}: {v}\r\n" for k, v in headers.items()]) if headers else ""
    ctype = f"Content-Type: {content_type}\r\n" if content_type else ""
    return (f"HTTP/1.1 {status} {phrase}\r\n{ctype}Content-Length: {length}\r\n{extra}"
            f"Date: {http_date()}\r\nServer: {SERVER_SOFTWARE}\r\n\r\n").encode("latin-1")


class Routes:
    """What a role answers on the fast path: `route` picks its requests out of the heads
    parse_head reads (anything else goes to aiohttp), `answer` answers one - through the
    connection's reply, wait, error and done, exactly as the role's aiohttp route
    would - once its body (if any: `body`, of its Content-Length) is in."""

    def route(self, method: str, target: str, headers: dict[str, str],
              length: int) -> tuple[str, Any] | None:
        raise NotImplementedError

    def bind(self, app: web.Application) -> None:
        """Called once the app has started (the role's stores are open)."""

    def answer(self, conn: FastConn, req: Request, body: bytearray | None) -> None:
        raise NotImplementedError


class FastPath:
    """The fast path of one node process (its app): the connections it holds and what it
    counted. Its `wrap` goes to node.server.run as the front."""

    def __init__(self, app: web.Application, routes: Routes) -> None:
        self.app, self.routes = app, routes
        self.conns: set[FastConn] = set()
        # what a read takes when it is not a request body, shared by every connection (one
        # event loop): buffer_updated copies what it got out of it before returning
        self.scratch = bytearray(SCRATCH_BYTES)
        self.requests = 0        # answered here
        self.handovers = 0       # connections handed to aiohttp
        self.closing = False
        self._bound = False
        self._sweeper: asyncio.Task[None] | None = None
        # set by bind(), once the app has started
        self.secret = ""
        self.observer: Observer | None = None
        self.max_body = 0

    def bind(self) -> None:
        app = self.app
        self.routes.bind(app)
        self.secret, self.observer, self.max_body = app[SECRET_KEY], app[OBSERVER], app[MAX_BODY]
        self._bound = True

    def wrap(self, factory: ProtocolFactory) -> ProtocolFactory:
        def make() -> FastConn:
            if not self._bound:
                self.bind()
                self._sweeper = asyncio.ensure_future(self._sweep())
            return FastConn(self, factory)
        return make

    async def _sweep(self) -> None:
        """Close connections idle for KEEPALIVE_TIMEOUT_S, as aiohttp does its own."""
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            now = time.monotonic()
            for conn in list(self.conns):
                if conn.idle() and now - conn.last_active > KEEPALIVE_TIMEOUT_S:
                    conn.close()

    async def close(self, timeout_s: float) -> None:
        """Stop: close idle connections now, the others once their answer is written
        (a PUT's once its batch is), all of them by `timeout_s`."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + timeout_s
        while True:
            for conn in list(self.conns):
                if conn.idle():
                    conn.close()
            if not self.conns or time.monotonic() >= deadline:
                break
            await asyncio.sleep(DRAIN_POLL_S)
        for conn in list(self.conns):
            conn.abort()


class FastConn(asyncio.BufferedProtocol):
    """One connection: the role's fast requests answered here until the first request
    that is not one of them; from then on, aiohttp's protocol (`inner`) has it."""

    def __init__(self, fp: FastPath, factory: ProtocolFactory) -> None:
        self.fp, self.factory = fp, factory
        self.inner: Any = None
        self.transport: Any = None
        self.fd = -1
        self.buf = bytearray()            # bytes received, not yet answered
        self.scratch = fp.scratch
        self.req: Request | None = None   # the request being read or answered
        self.body: bytearray | None = None
        self.body_view: memoryview | None = None
        self.got = 0                      # of the request body
        self.into_body = False            # the last get_buffer handed out the body
        self.busy = False                 # an answer is on its way (thread, batch)
        self.write_paused = False
        self.read_paused = False
        self.eof = False
        self.closed = False
        self.last_active = time.monotonic()

    # ---- asyncio callbacks -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1
        if sock is not None:   # as aiohttp's protocol does: dead peers found while idle
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.fp.conns.add(self)
        if self.fp.closing:
            self.close()

    def get_buffer(self, sizehint: int) -> Any:
        if self.inner is None and self.body_view is not None:
            self.into_body = True
            return self.body_view[self.got:]
        self.into_body = False
        return self.scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self.inner is not None:
            self.inner.data_received(bytes(self.scratch[:nbytes]))
            return
        self.last_active = time.monotonic()
        if self.into_body:
            self.got += nbytes
            if self.body is not None and self.got == len(self.body):
                self._body_done()
                self._next()
            return
        self.buf += memoryview(self.scratch)[:nbytes]
        if self.busy or self.write_paused:
            if len(self.buf) > MAX_BUFFERED_BYTES and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()
            return
        self._next()

    def eof_received(self) -> bool | None:
        if self.inner is not None:
            return self.inner.eof_received()
        self.eof = True
        self._next()        # what came before the end is answered
        if self.inner is not None or self.busy:
            return True     # our side stays open for the answer; closed after it
        return False        # idle, or a request cut short: close

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.inner is not None:
            self.inner.resume_writing()
        else:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.fp.conns.discard(self)
        req = self.req
        if self.inner is not None:
            self.inner.connection_lost(exc)
        elif req is not None and self.body is not None and self.got < req.length:
            # a body cut short: counted as aiohttp's route counts it (node.server's 499)
            self._account(req, CLIENT_CLOSED, self.got, 0)
        self.body = self.body_view = None

    # ---- state -----------------------------------------------------------------------
    def idle(self) -> bool:
        return self.inner is None and not self.busy and self.body is None

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def _next(self) -> None:
        """Answer the requests buffered, in order, while they are ours and nothing is
        waiting; hand the connection to aiohttp at the first that is not."""
        while (self.inner is None and not self.busy and not self.write_paused
               and not self.closed and self.body is None):
            if self.fp.closing and not self.buf:
                self.close()
                return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD_BYTES:
                    self._hand_over()
                elif self.eof:
                    self.close()
                return
            req = parse_head(bytes(self.buf[:end]), self.fp.max_body, self.fp.routes.route)
            if req is None or verify(self.fp.secret, req.method, req.target, req.headers,
                                     time.time()) is not None:
                self._hand_over()
                return
            del self.buf[:end + 4]
            self.req = req
            if req.length:
                self._start_body(req)
            else:
                self._answer(req, None)
        if self.read_paused and len(self.buf) <= MAX_BUFFERED_BYTES and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()

    def _hand_over(self) -> None:
        """aiohttp's from now on, with every byte not yet answered."""
        self.fp.handovers += 1
        self.fp.conns.discard(self)    # aiohttp's shutdown closes it now
        inner: Any = self.factory()
        self.inner = inner
        inner.connection_made(self.transport)
        if self.write_paused:
            inner.pause_writing()
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            inner.data_received(data)
        if self.eof:
            if not inner.eof_received():
                self.close()

    # ---- bodies ----------------------------------------------------------------------
    def _start_body(self, req: Request) -> None:
        """Receive the body straight into one buffer of its length (no copy out of the
        socket's chunks)."""
        n = req.length
        body = self.body = unfilled(n)   # every byte written below before it is used
        view = self.body_view = memoryview(body)
        take = min(n, len(self.buf))
        view[:take] = memoryview(self.buf)[:take]
        del self.buf[:take]
        self.got = take
        if take == n:
            self._body_done()

    def _body_done(self) -> None:
        req, body = self.req, self.body
        assert req is not None and body is not None
        self.body = self.body_view = None
        self.into_body = False
        self._answer(req, body)

    def _answer(self, req: Request, body: bytearray | None) -> None:
        try:
            self.fp.routes.answer(self, req, body)
        except Exception as exc:   # noqa: BLE001 - NotFound, BadRequest and the like
            self.error(req, exc)

    # ---- answers (for the routes) ----------------------------------------------------
    def reply(self, req: Request, status: int, body: bytes | bytearray | memoryview,
              content_type: str | None,
              headers: dict[str, str] | None = None) -> None:
        """A whole answer, as web.Response(body=..., content_type=...) would be."""
        head = response_head(status, len(body), content_type, headers)
        if len(body) <= SMALL_BODY_BYTES:
            self.transport.write(head + body)
        else:
            self.transport.write(head)
            self.transport.write(body)
        self.done(req, status, req.length, len(head) + len(body))

    def wait(self, fut: asyncio.Future[Any], req: Request,
             then: Callable[[Request, Any], None]) -> None:
        """Answer `req` with then(req, fut) once `fut` is done (its error: the error's
        answer); nothing more is read from the buffer meanwhile."""
        self.busy = True
        obs = self.fp.observer
        if obs is not None:
            obs.in_flight += 1

        def settled(f: asyncio.Future[Any]) -> None:
            self.busy = False
            if obs is not None:
                obs.in_flight -= 1
            if self.closed:     # nobody to answer; a write was made all the same
                self._account(req, _status_of(f), req.length, 0)
                return
            try:
                then(req, f)
            except Exception as exc:   # noqa: BLE001 - the error's answer
                self.error(req, exc)
            self._next()    # what else came (after an end from the client: then closed)
        fut.add_done_callback(settled)

    def error(self, req: Request, exc: BaseException) -> None:
        """The answer node.server.error_middleware gives `exc`."""
        if isinstance(exc, EcstoreError):
            err = exc
        else:
            log.error("unhandled error in %s %s", req.method, req.target, exc_info=exc)
            err = EcstoreError("internal error")
        body = json.dumps(err.to_body()).encode()
        head = response_head(err.status, len(body), "application/json; charset=utf-8")
        self.transport.write(head + body)
        self.done(req, err.status, req.length, len(head) + len(body))

    def done(self, req: Request, status: int, n_in: int, n_out: int) -> None:
        """`req` is answered: counted and logged."""
        self.req = None
        self._account(req, status, n_in, n_out)

    def _account(self, req: Request, status: int, n_in: int, n_out: int) -> None:
        self.fp.requests += 1
        obs = self.fp.observer
        if obs is not None:
            obs.record(req.op, req.method, status, time.perf_counter() - req.started,
                       n_in, n_out, req.rid)


class FragmentRoutes(Routes):
    """A storage node's fast requests: fragment GETs (by sendfile when the record is
    cached and large, from the page cache in the loop, else read in a thread) and PUTs
    (the node's batch writer), answered as node.storage's routes answer them."""

    def __init__(self, parts: Callable[[], tuple[Any, Any, Any]],
                 fragment_headers: Callable[[str, dict[str, Any]], dict[str, str]],
                 sendfile_min: int) -> None:
        """`parts()` gives the node's (FragmentStore, PutQueue, SendStats) once the app
        has started; the rest as node.storage's routes use them."""
        self.parts, self.fragment_headers, self.sendfile_min = parts, fragment_headers, sendfile_min
        self.store: Any = None
        self.puts: Any = None
        self.sends: Any = None

    def route(self, method: str, target: str, headers: dict[str, str],
              length: int) -> tuple[str, Any] | None:
        return route_fragment(method, target, headers, length)

    def bind(self, app: web.Application) -> None:
        self.store, self.puts, self.sends = self.parts()

    def answer(self, conn: FastConn, req: Request, body: bytearray | None) -> None:
        if req.method == "GET":
            self._get(conn, req)
            return
        fid, meta = req.arg
        fut = self.puts.submit(fid, body if body is not None else bytearray(),
                               req.headers.get(CHECKSUM_HEADER, ""), meta,
                               uncached_requested(req.headers))
        conn.wait(fut, req, lambda r, f: self._put_done(conn, r, f))

    def _get(self, conn: FastConn, req: Request) -> None:
        store, fid = self.store, req.arg[0]
        cached = store.cached_body(fid, self.sendfile_min)
        if cached is not None:
            self._send_cached(conn, req, cached)
            return
        uncached = uncached_requested(req.headers)
        frag = None if uncached else store.read_cached(fid)
        if frag is not None:
            self._send_fragment(conn, req, frag)
            return
        conn.wait(asyncio.get_running_loop().run_in_executor(None, store.read, fid, False,
                                                             uncached),
                  req, lambda r, f: self._send_fragment(conn, r, f.result()))

    def _send_fragment(self, conn: FastConn, req: Request, frag: Fragment) -> None:
        conn.reply(req, 200, frag.body, "application/octet-stream",
                   self.fragment_headers(frag.checksum, frag.meta))

    def _send_cached(self, conn: FastConn, req: Request, cached: Any) -> None:
        """node.storage._send_cached without aiohttp: the head, then the body by
        sendfile while the socket takes it (corked), the rest read and written."""
        head = response_head(200, cached.length, "application/octet-stream",
                             self.fragment_headers(cached.checksum, cached.meta))
        transport, fd, sent = conn.transport, conn.fd, 0
        if fd >= 0:
            zerocopy.cork(fd, True)
        try:
            transport.write(head)
            sent, rest = send_cached_body(transport, fd, cached, self.sends)
            if rest:
                transport.write(rest)
        except Exception as exc:   # noqa: BLE001 - the head is out: no other answer fits
            log.error("fragment %s: read failed while sending it", req.arg[0], exc_info=exc)
            sent = -2
        finally:
            if fd >= 0:
                zerocopy.cork(fd, False)
        if sent < 0:       # the client went away (-1), or the body could not be read
            conn.done(req, 200 if sent == -1 else 500, 0, len(head))
            transport.abort()
            return
        conn.done(req, 200, 0, len(head) + cached.length)

    def _put_done(self, conn: FastConn, req: Request, fut: asyncio.Future[bool]) -> None:
        status = 200 if fut.result() else 201
        head = response_head(status, 0, None)
        conn.transport.write(head)
        conn.done(req, status, req.length, len(head))


def send_cached_body(transport: Any, fd: int, cached: Any, sends: Any) -> tuple[int, bytes]:
    """A cached record's body (node.fragments.CachedBody) after its head, for both ways a
    storage node answers a GET: by sendfile(2) straight from the volume file to the socket
    `fd` (corked by the caller) as far as the socket takes it now, and only when nothing is
    queued ahead of it in `transport`; the rest read, for the caller to write. Returns
    (bytes sent by sendfile, counted in `sends`; -1 if the client went away: abort, the
    rest, b"" when none). A file shorter than its index says stops sendfile, and the rest
    is zeros (pread_padded: the reader's check fails)."""
    sent = 0
    if fd >= 0 and transport.get_write_buffer_size() == 0:
        sent = zerocopy.send(fd, cached.vol.fd, cached.offset, cached.length)
    if sent < 0:
        return sent, b""
    if sent:
        sends.gets += 1
        sends.bytes += sent
    if sent == cached.length:
        return sent, b""
    return sent, pread_padded(cached.vol.fd, cached.length - sent, cached.offset + sent)


def _status_of(fut: asyncio.Future[Any]) -> int:
    """The status a settled answer would have had (its error's, a put's 200 or 201)."""
    if fut.cancelled():
        return 500
    exc = fut.exception()
    if exc is None:
        return 200 if fut.result() is not False else 201
    return exc.status if isinstance(exc, EcstoreError) else 500


__all__ = ["FastPath", "FastConn", "FragmentRoutes", "Routes", "FAST_PATH_ENV", "enabled_from_env",
           "parse_head"]
