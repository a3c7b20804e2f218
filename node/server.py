"""Plumbing shared by every server role: errors to statuses, authentication, metrics and
request logs (node.metrics, node.logs), running (with a cap on open connections per
process, see ConnectionCap)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import re
import resource
import signal
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.http import HttpProcessingError

from node.logs import configure_logging, lifecycle_log, log_event, log_format_from_env, request_log
from node.metrics import (
    CONTENT_TYPE,
    METRICS_PATH,
    OP,
    REQUEST_ID,
    STARTED,
    UNMATCHED_OP,
    ObservabilityConfig,
    Observer,
    access_log_class,
    add_observability_args,
    op_name,
)
from store.alloc import MMAP_THRESHOLD_BYTES, glibc, tune_allocator, unfilled
from store.auth import CHECKSUM_HEADER, DATE_HEADER, SIGNATURE_HEADER, verify
from store.digest import matches as digest_matches
from store.digest import well_formed as digest_well_formed
from store.errors import BadRequest, EcstoreError, Unauthorized, Unavailable
from store.transport import REQUEST_ID_HEADER, REQUEST_ID_RE, new_request_id, request_id

log = logging.getLogger("ecstore.node")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ProtocolFactory = Callable[[], asyncio.BaseProtocol]
SECRET_KEY = web.AppKey("secret", str)
MAX_BODY = web.AppKey("max_body_bytes", int)
OBSERVER = web.AppKey("observer", Observer)
# /metrics checks its own access (metrics_refusal): a bearer token or public mode too
UNAUTHENTICATED_PATHS = frozenset({"/v1/health", METRICS_PATH})
_HEX64 = re.compile(r"[0-9a-f]{64}")

MAX_CONNECTIONS_ENV = "ECSTORE_MAX_CONNECTIONS"
DEFAULT_MAX_CONNECTIONS = 1024     # open connections per process, idle keep-alive included
REFUSAL_LINGER_S = 1.0             # time a refused client gets to read its 503
MAX_LINGERING_REFUSALS = 256       # past this, a refused connection is closed at once
REFUSAL_LOG_INTERVAL_S = 10.0      # at most one warning per interval while refusing
FD_RESERVE = 256                   # descriptors kept for files, RocksDB and peers
SHUTDOWN_TIMEOUT_S = 60.0          # in-flight requests get this long after SIGTERM
DRAIN_POLL_S = 0.02                # how often a stopping node looks whether they are done
KEEPALIVE_TIMEOUT_S = 75.0         # an idle keep-alive connection is closed after this
LISTEN_BACKLOG = 128
# aiohttp's request parser limits, named here (docs/LIMITS.md); over them: 400 with a reason
MAX_REQUEST_LINE_BYTES = 8190      # method, path and query
MAX_HEADER_FIELD_BYTES = 8190      # one header line
MAX_HEADERS = 128                  # header lines per request
# ConnectionCap's bounds on a whole request head (request line, headers, blank line), which
# aiohttp's per-line limits above leave at ~1 MiB and untimed: past them 431 or 408
MAX_REQUEST_HEAD_BYTES = 64 * 1024  # S3 user metadata is 2 KiB, ours 4 KiB (store.wire)
REQUEST_HEAD_TIMEOUT_ENV = "ECSTORE_REQUEST_HEAD_TIMEOUT_S"
REQUEST_HEAD_TIMEOUT_S = 10.0       # from a head's first byte (a new connection's accept)
HEAD_SWEEP_EVERY_S = 1.0            # the heads' clock: a head times out within one more


def json_error(exc: EcstoreError) -> web.Response:
    return web.Response(status=exc.status, text=json.dumps(exc.to_body()),
                        content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place that turns errors into responses."""
    try:
        return await handler(request)
    except EcstoreError as exc:
        return json_error(exc)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return json_error(_http_to_error(exc))
        raise
    except HttpProcessingError as exc:  # a malformed body: bad chunking, bad encoding
        if _gone(request):
            return client_closed()
        return json_error(BadRequest(f"malformed request body: {exc.message}"))
    except web.RequestPayloadError as exc:  # the same, as aiohttp hands it to a handler
        if _gone(request):
            return client_closed()
        return json_error(BadRequest(f"malformed request body: {exc}"))
    except ConnectionResetError:
        # The client hung up before its request was read (a body cut short): nobody
        # will read an answer; aiohttp drops it quietly. Not a bug, so no traceback.
        log.debug("%s %s: client went away", request.method, request.path)
        return client_closed()
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug: log it whole, answer 500 without internals
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(EcstoreError("internal error"))


CLIENT_CLOSED = 499    # nginx's "client closed request": logged and counted, never seen


def client_closed() -> web.Response:
    """The answer to a request whose client hung up before it was read: nobody reads it,
    but the log line and the metrics say 499, not a 400 the client did not earn (a 4xx
    alert would fire on every client timeout or a gateway killed mid-request)."""
    return web.Response(status=CLIENT_CLOSED, text='{"error": "client_closed"}',
                        content_type="application/json")


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _http_to_error(exc: web.HTTPException) -> EcstoreError:
    # a 413's text says the limit and the size; other texts are "404: Not Found"
    err = EcstoreError((exc.text if exc.status == 413 else None) or exc.reason or "error")
    err.status = exc.status
    err.code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
        exc.status, "bad_request")
    return err


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request its id (a peer's x-ecstore-request-id, else a new one) and its
    operation name for the metrics and the log line (node.metrics.Observer.request_done).
    The id is set in this request's task context: the client library sends it onward."""
    request[STARTED] = time.perf_counter()
    obs = request.app[OBSERVER]
    rid = request.headers.get(REQUEST_ID_HEADER) if obs.trust_request_ids else None
    if rid is None or not REQUEST_ID_RE.fullmatch(rid):
        rid = new_request_id()
    request[REQUEST_ID] = rid
    request_id.set(rid)  # each request runs in a task of its own: nothing to reset
    info = request.match_info
    request[OP] = UNMATCHED_OP if info.http_exception is not None else op_name(
        info.handler, request.method)
    obs.in_flight += 1
    try:
        resp = await handler(request)
        if obs.stopping:   # draining: the client opens its next request elsewhere
            resp.force_close()
        return resp
    finally:
        obs.in_flight -= 1


def install_observer(app: web.Application, observer: Observer,
                     id_header: str | None = None) -> None:
    """Count and log `app`'s requests with `observer` (before any other middleware, so
    it sees the final status); with `id_header`, every response carries the request id
    in it (set as the headers go out: a streamed response sends them inside its handler).
    Serving /metrics is the caller's route (metrics())."""
    app[OBSERVER] = observer
    app.middlewares.insert(0, observe_middleware)
    if id_header is not None:
        async def stamp(request: web.Request, response: web.StreamResponse) -> None:
            rid = request.get(REQUEST_ID)
            if rid is not None:
                response.headers[id_header] = rid
        app.on_response_prepare.append(stamp)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus' text format, for a request signed with the cluster secret,
    one with the configured bearer token, or anyone in public mode; else 401 (answered
    here, not raised: the gateway has no error middleware)."""
    request[OP] = "metrics"
    obs = request.app[OBSERVER]
    reason = metrics_refusal(request, obs)
    if reason is not None:
        refused = json_error(Unauthorized(reason))
        refused.headers["WWW-Authenticate"] = 'Bearer realm="ecstore metrics"'
        return refused
    body = await asyncio.get_running_loop().run_in_executor(None, obs.exposition)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def metrics_refusal(request: web.Request, obs: Observer) -> str | None:
    """Why this request may not read /metrics, or None if it may."""
    if obs.config.metrics_public:
        return None
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        token = obs.config.metrics_token
        if not token:
            return "bearer tokens are not enabled here (ECSTORE_METRICS_TOKEN)"
        given = auth[7:].strip().encode("utf-8", "surrogatepass")
        return None if hmac.compare_digest(given, token.encode()) else "wrong bearer token"
    return malformed_signature(request) or verify(obs.secret, request.method, request.raw_path,
                                                  request.headers, time.time())


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse any request not signed with the cluster secret."""
    if request.path not in UNAUTHENTICATED_PATHS:
        reason = malformed_signature(request) or verify(
            request.app[SECRET_KEY], request.method, request.raw_path, request.headers,
            time.time())
        if reason is not None:
            raise Unauthorized(reason)
    return await handler(request)


def malformed_signature(request: web.Request) -> str | None:
    """Why the signing fields cannot be a signature of ours, else None: checked before
    verify() hashes them (a non-ASCII or non-UTF-8 header or path must be a 401, not a
    crash), and a date must be finite ("nan" would never go stale)."""
    return malformed_signature_fields(request.headers, request.raw_path)


def malformed_signature_fields(h: Mapping[str, str], raw_path: str) -> str | None:
    """malformed_signature of a request's headers (names lower-case, or a case-insensitive
    mapping) and its target."""
    sig, ts, checksum = h.get(SIGNATURE_HEADER), h.get(DATE_HEADER), h.get(CHECKSUM_HEADER)
    if not sig or not ts or not checksum:
        return "unsigned request"
    if not _HEX64.fullmatch(sig) or not digest_well_formed(checksum):
        return "malformed signature or checksum header"
    try:
        finite = math.isfinite(float(ts))
    except ValueError:
        finite = False
    if not finite:
        return "bad signature date"
    try:
        raw_path.encode()
    except UnicodeEncodeError:  # bytes that are not UTF-8 in the request target
        return "request target is not UTF-8"
    return None


DEMO_MARK = "CHANGE-ME"     # docker/ecstore.env's published demo values carry it
# {what: value} of the secrets a node runs with, checked for DEMO_MARK once it listens
PUBLISHED_SECRETS = web.AppKey("published_secrets", dict)


def warn_if_demo(what: str, value: str) -> None:
    """A warning, at every start, when a secret is one of the published demo values:
    whoever read the repository holds it (the cluster's keys, its S3 admin)."""
    if DEMO_MARK in value:
        log_event(lifecycle_log, logging.WARNING, "demo secret",
                  {"secret": what, "fix": "set your own in docker/ecstore.env (or the "
                   "environment) before the port is reachable by anyone else"})


def make_base_app(secret: str, max_body_bytes: int, node_id: str = "-", role: str = "node",
                  observability: ObservabilityConfig | None = None) -> web.Application:
    """An app with the observe, error and auth middlewares, GET /metrics, and a body limit
    (413 past it). Bodies are taken as sent, never decompressed: the signed checksum is
    over those bytes, and a small compressed body cannot grow past the limit in memory."""
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=max_body_bytes,
                          handler_args={"auto_decompress": False})
    app[SECRET_KEY] = secret
    app[PUBLISHED_SECRETS] = {"ECSTORE_SECRET": secret}
    app[MAX_BODY] = max_body_bytes
    install_observer(app, Observer(node_id, role, secret, observability))
    app.router.add_get(METRICS_PATH, metrics, allow_head=False)
    return app


def secret_from_env() -> str:
    secret = os.environ.get("ECSTORE_SECRET", "")
    if len(secret) < 16:
        raise SystemExit("ECSTORE_SECRET must be set to the cluster secret (16+ chars)")
    return secret


class Front(typing.Protocol):
    """What a role may put in front of aiohttp on each connection (the storage node's
    node.fastpath): `wrap` takes aiohttp's protocol factory and returns the one the
    listener uses; `close` runs at shutdown before aiohttp's own (the listener is closed:
    finish what is in flight, within `timeout_s`, and close the connections it holds)."""

    def wrap(self, factory: ProtocolFactory) -> ProtocolFactory: ...

    async def close(self, timeout_s: float) -> None: ...


def run(app: web.Application, host: str, port: int, reuse_port: bool = False,
        max_connections: int | None = None, front: Front | None = None,
        ready: Callable[[], None] | None = None) -> None:
    """Serve on uvloop until SIGTERM or SIGINT (reuse_port: several processes share it),
    with at most `max_connections` open connections (default $ECSTORE_MAX_CONNECTIONS,
    else DEFAULT_MAX_CONNECTIONS); past it a new connection gets a 503 (ConnectionCap);
    `front`, if given, sees each connection before aiohttp does; `ready`, if given, is
    called in the loop once the port listens (a gateway worker's heartbeat starts there).
    (uvloop cannot sendfile; asyncio's loop can, but serves small requests slower: measured,
    uvloop plus one unverified read per fragment GET was the better trade.)"""
    import uvloop

    obs = app.get(OBSERVER)
    # what a node writes (volumes, RocksDB files holding S3 secret keys, scrub state) is
    # for its own user only: files 0600, directories 0700 (see private_dir)
    os.umask(0o077)
    configure_logging(obs.node_id if obs else "-",
                      obs.config.log_format if obs else log_format_from_env())
    limit = max_connections_from_env() if max_connections is None else max_connections
    if limit < 1:
        raise ValueError(f"max_connections must be at least 1, got {limit}")
    head_timeout_s = env_number(REQUEST_HEAD_TIMEOUT_ENV, REQUEST_HEAD_TIMEOUT_S, "seconds")
    if head_timeout_s is None or not 0 < head_timeout_s <= KEEPALIVE_TIMEOUT_S:
        raise SystemExit(f"{REQUEST_HEAD_TIMEOUT_ENV} must be over 0 and at most "
                         f"{KEEPALIVE_TIMEOUT_S:g}, got {head_timeout_s}")
    _ensure_fd_limit(limit)
    uvloop.install()
    try:
        asyncio.run(_serve(app, host, port, reuse_port, limit, front, ready, head_timeout_s))
    finally:  # the log writes in batches; a forked gateway worker ends with os._exit
        for handler in logging.getLogger().handlers:
            handler.flush()


ARENA_MAX = 2
TRIM_EVERY_S = 1.0
TRIM_ABOVE_BYTES = 96 * 1024 * 1024   # RSS under which nothing is trimmed
TRIM_QUIET_CPU = 0.25                 # a tick with less CPU than this (of a core) is quiet
TRIM_BUSY_EVERY_S = 30.0              # a process busy all along is trimmed this often
# glibc's own trim of the heap's top on free(): higher than a library process's
# (TRIM_THRESHOLD_BYTES), as a node's quiet trim gives the rest back once a burst is over
NODE_TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


class Allocator:
    """glibc's malloc tuned for a process that churns 1-4 MiB buffers (segments,
    fragments, request bodies), with memory handed back once a burst is over.

    Buffers under 32 MiB come from malloc's heaps, reused warm: an mmap per buffer
    (what a low M_MMAP_THRESHOLD gives) page-faults and zeroes every byte of every
    buffer again, which halved the gateway's throughput (1 MiB puts 79 -> 51 MB/s,
    64 MiB gets 644-773 -> 345 MB/s). A fixed threshold also stops glibc's own raising
    of it. What a burst leaves free inside the heaps (a flood of 64 large puts left a
    gateway near 1 GiB) goes back by `malloc_trim(0)` once the burst is over: at a tick
    (once a second) when the RSS is above TRIM_ABOVE_BYTES and the process used under
    TRIM_QUIET_CPU of a core since the last tick - or, busy all along, TRIM_BUSY_EVERY_S
    since its last trim. Trimming mid-burst gave back pages the next second's buffers
    faulted in again, and so did glibc's own trim of the heap's top past 16 MiB free
    (now NODE_TRIM_THRESHOLD_BYTES): on this machine's VM, whose host takes freed memory
    back, a gateway faulted in 141-174 fresh pages per MiB of a checkpoint storm's puts
    (zeroing them was 9% of its CPU), 0-42 with both changes (README, Where the time goes).
    ECSTORE_MMAP_THRESHOLD overrides the threshold (0: glibc's defaults). No-op off glibc."""

    def __init__(self) -> None:
        self.libc: Any = None
        self.trims = 0
        self._last_tick = (time.monotonic(), time.process_time())
        self._last_trim = self._last_tick[0]
        libc = glibc()
        if libc is None:
            return
        threshold = int(os.environ.get("ECSTORE_MMAP_THRESHOLD", MMAP_THRESHOLD_BYTES))
        if threshold > 0:
            tune_allocator(threshold, NODE_TRIM_THRESHOLD_BYTES,
                           int(os.environ.get("ECSTORE_ARENA_MAX", ARENA_MAX)))
        self.libc = libc
        self._page = os.sysconf("SC_PAGE_SIZE")

    def rss_bytes(self) -> int:
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return 0

    def trim(self) -> bool:
        """Give free heap pages back when the process holds more than the floor."""
        if self.libc is None or self.rss_bytes() < TRIM_ABOVE_BYTES:
            return False
        self.libc.malloc_trim(0)
        self.trims += 1
        return True

    def tick(self, now: float, cpu_s: float) -> bool:
        """One tick of trim_loop at `now` (monotonic) with `cpu_s` of process CPU so far:
        trim if the process was quiet since the last tick, or has not been trimmed for
        TRIM_BUSY_EVERY_S. True if it trimmed."""
        last_now, last_cpu = self._last_tick
        self._last_tick = (now, cpu_s)
        quiet = cpu_s - last_cpu < TRIM_QUIET_CPU * max(now - last_now, 1e-3)
        if not quiet and now - self._last_trim < TRIM_BUSY_EVERY_S:
            return False
        if not self.trim():
            return False
        self._last_trim = now
        return True

    async def trim_loop(self) -> None:
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            self.tick(time.monotonic(), time.process_time())


async def _serve(app: web.Application, host: str, port: int, reuse_port: bool,
                 max_connections: int, front: Front | None = None,
                 ready: Callable[[], None] | None = None,
                 head_timeout_s: float = REQUEST_HEAD_TIMEOUT_S) -> None:
    """aiohttp's run_app, but listening through a ConnectionCap. Shutdown as run_app's:
    stop listening, close idle connections, give requests in flight SHUTDOWN_TIMEOUT_S."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stopped_by: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig.name)
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    obs = app.get(OBSERVER)
    # the access log hook counts and logs each request once its response is written
    runner = web.AppRunner(
        app, access_log=request_log if obs else None,
        access_log_class=access_log_class(obs) if obs else web.AccessLogger,
        logger=HttpLog(logging.getLogger("aiohttp.server")),
        shutdown_timeout=SHUTDOWN_TIMEOUT_S, keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        max_line_size=MAX_REQUEST_LINE_BYTES, max_field_size=MAX_HEADER_FIELD_BYTES,
        max_headers=MAX_HEADERS)
    await runner.setup()
    listener: asyncio.AbstractServer | None = None
    allocator = Allocator()
    trimmer = asyncio.ensure_future(allocator.trim_loop()) if allocator.libc is not None else None
    cap: ConnectionCap | None = None
    try:
        assert runner.server is not None
        factory: ProtocolFactory = runner.server
        cap = ConnectionCap(factory if front is None else front.wrap(factory), max_connections,
                            head_timeout_s)
        if obs is not None:
            obs.cap = cap
        try:
            listener = await loop.create_server(
                cap, host, port,
                backlog=LISTEN_BACKLOG, reuse_port=reuse_port or None)
        except OSError as exc:   # the port taken, an address not ours: one line, no traceback
            reason = (exc.strerror or str(exc)).split(": ")[-1]
            raise SystemExit(f"{obs.node_id if obs else 'node'}: cannot listen on "
                             f"{host}:{port}: {reason}") from None
        log_event(lifecycle_log, logging.INFO, "listening",
                  {"address": f"{host}:{port}", "pid": os.getpid()})
        for what, value in app.get(PUBLISHED_SECRETS, {}).items():
            warn_if_demo(what, value)
        if ready is not None:
            ready()
        await stop.wait()
        log_event(lifecycle_log, logging.INFO, "stopping",
                  {"signal": stopped_by[0] if stopped_by else "-",
                   "requests_grace_s": SHUTDOWN_TIMEOUT_S})
    finally:
        if trimmer is not None:
            trimmer.cancel()
        if cap is not None:
            cap.close()
        if listener is not None:
            listener.close()
        if front is not None:
            await front.close(SHUTDOWN_TIMEOUT_S)
        if obs is not None:
            await drain_requests(obs, SHUTDOWN_TIMEOUT_S)
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def drain_requests(obs: Any, timeout_s: float) -> None:
    """Wait until no request is in a handler (at most timeout_s), before aiohttp's own
    shutdown closes every connection: that close drops the bytes that arrive after it, so
    an upload still sending its body was never finished - it hung until the 60 s grace
    ran out and failed, the node stopped 60 s late with its port closed (a gateway
    stopped with SIGTERM under S3 load: uploads failed, 45-60 s without S3). Answers
    given meanwhile close their connection."""
    obs.stopping = True
    deadline = time.monotonic() + timeout_s
    while obs.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(DRAIN_POLL_S)


class HttpLog(logging.LoggerAdapter):
    """aiohttp's request-handler logger, but a request aiohttp could not parse (the
    client's mistake: answered 400 with the reason, or a body nobody read) is one debug
    line, not an ERROR with a traceback: garbage from the network must not fill the log."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, (HttpProcessingError, web.RequestPayloadError)):
            self.debug("%s: %s", str(msg) % args if args else msg, " ".join(str(exc).split()))
            return
        super().exception(msg, *args, **kwargs)


def max_connections_from_env() -> int:
    """$ECSTORE_MAX_CONNECTIONS, a positive integer, else DEFAULT_MAX_CONNECTIONS."""
    text = os.environ.get(MAX_CONNECTIONS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_CONNECTIONS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise SystemExit(f"{MAX_CONNECTIONS_ENV} must be a positive integer, got {text!r}")
    return value


def _ensure_fd_limit(max_connections: int, extra: int = 0) -> None:
    """Raise the soft open-files limit so the cap, not EMFILE, is what a flood meets;
    `extra` descriptors more for files the process keeps open (a storage node's volumes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + FD_RESERVE + extra
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < want:
        log.warning("open files limit %d is below %s=%d plus %d: connections may fail with "
                    "EMFILE before the cap", hard, MAX_CONNECTIONS_ENV, max_connections,
                    FD_RESERVE + extra)


def ensure_fd_limit_for_files(files: int) -> None:
    """Room for `files` descriptors held open beside the connection cap."""
    _ensure_fd_limit(max_connections_from_env(), files)


class ConnectionCap:
    """A protocol factory that lets at most `limit` connections be open at once, and
    bounds each request head's size and time.

    Past the limit, a new connection never reaches aiohttp or the app: it gets a fixed
    `503 Service Unavailable` (JSON `unavailable` body, `Retry-After: 1`,
    `Connection: close`), its request is read and dropped for up to REFUSAL_LINGER_S
    (closing with unread input would reset the connection before the client read the
    503), and it is closed. A slot is taken when the connection is accepted, not when
    its first byte arrives, so a burst of accepts cannot overshoot the limit.

    An admitted connection's request heads (see _Forward) must be whole within
    MAX_REQUEST_HEAD_BYTES (else `431`) and within `head_timeout_s` of their first byte,
    the first one of the accept (else `408`); refused the same way, whatever front the
    connection goes to. A clock of whole HEAD_SWEEP_EVERY_S ticks times them: a head
    costs no timer of its own.
    """

    def __init__(self, factory: ProtocolFactory, limit: int,
                 head_timeout_s: float = REQUEST_HEAD_TIMEOUT_S) -> None:
        self.factory, self.limit = factory, limit
        self.open = 0          # admitted connections not yet lost
        self.refusing = 0      # refused connections still lingering
        self.refused_total = 0
        self.reply = refusal_reply(limit)
        self._refused_since_log = 0
        self._last_log = -math.inf
        self.conns: set[_Forward] = set()
        self.tick = 0          # HEAD_SWEEP_EVERY_S ticks since the first connection
        self.head_timeout_ticks = max(1, math.ceil(head_timeout_s / HEAD_SWEEP_EVERY_S))
        self.heads_refused = {reason: 0 for reason in HEAD_REPLIES}
        self._sweeper: asyncio.Task[None] | None = None

    def __call__(self) -> asyncio.BaseProtocol:
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        if self.open >= self.limit:
            self._log_refusal()
            return _Refusal(self)
        self.open += 1
        inner = self.factory()
        if isinstance(inner, asyncio.BufferedProtocol):
            return _AdmittedBuffered(self, inner)
        return _Admitted(self, inner)

    async def _sweep(self) -> None:
        """Refuse, with 408, the heads begun more than head_timeout_ticks ago (a head
        started within a tick counts from its start: it has between the timeout and one
        tick more)."""
        while True:
            await asyncio.sleep(HEAD_SWEEP_EVERY_S)
            self.tick += 1
            oldest = self.tick - self.head_timeout_ticks - 1
            for conn in [c for c in self.conns if 0 <= c.head_tick <= oldest]:
                conn.refuse_head("timeout")

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    def _log_refusal(self) -> None:
        self.refused_total += 1
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= REFUSAL_LOG_INTERVAL_S:
            log.warning("refused %d connection(s) with 503: %d open, the limit (%s)",
                        self._refused_since_log, self.open, MAX_CONNECTIONS_ENV)
            self._refused_since_log, self._last_log = 0, now


def refusal_reply(limit: int) -> bytes:
    """The whole HTTP answer to a connection over the cap."""
    body = json.dumps(Unavailable(f"too many open connections (at most {limit})",
                                  max_connections=limit).to_body()).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def head_reply(status: str, message: str) -> bytes:
    """The whole HTTP answer to a request head over a bound (then the connection closes)."""
    body = json.dumps(BadRequest(message).to_body()).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


HEAD_REPLIES = {
    "size": head_reply("431 Request Header Fields Too Large",
                       f"request head over {MAX_REQUEST_HEAD_BYTES} bytes"),
    "timeout": head_reply("408 Request Timeout", "request head not received in time"),
}
HEAD_END = b"\r\n\r\n"
# the headers that say where a request's body ends (or that it has no end we can follow)
_FRAMING = re.compile(rb"\r\n(content-length|transfer-encoding|upgrade)[ \t]*:[ \t]*([^\r\n]*)",
                      re.IGNORECASE)
_UNTRACKED = 1 << 62       # `left` of a connection whose bodies cannot be followed
_DROP = bytearray(4096)    # where a refused connection's bytes go (buffered protocols)


class _Forward:
    """Passes every event to aiohttp's protocol (or the role's front); gives the slot
    back when the connection is lost (or, if it never connected, when this object is
    collected).

    On the way, it follows where request heads begin and end without parsing them
    twice: `left` counts down the bytes of the body (by its Content-Length) being
    received - the only work on a body's bytes, one comparison and one subtraction a
    read - and between bodies it looks for the blank line ending the head, across
    reads, counting the head's bytes and timing it (`head_tick`, -1: no head begun; the
    cap's sweep reads it). A head with Transfer-Encoding or Upgrade, or a
    Content-Length that is not plain digits, leaves the rest of the connection
    unfollowed (`left` = _UNTRACKED): bounded, as before, by aiohttp's per-line limits
    and its keep-alive timeout. aiohttp judges every head the same whatever this saw.
    """

    def __init__(self, cap: ConnectionCap, inner: Any) -> None:
        self.cap, self.inner = cap, inner
        self.held = True
        self.transport: Any = None
        self.left = 0                       # body bytes still to come
        self.head_tick = cap.tick           # a new connection's first head is timed
        self.head: bytearray | None = None  # a head received in several reads, so far
        self.refused = False

    def _release(self) -> None:
        if self.held:
            self.held = False
            self.cap.open -= 1
            self.cap.conns.discard(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.cap.conns.add(self)   # for the heads' sweep; one never made is collected
        self.inner.connection_made(transport)

    def eof_received(self) -> bool | None:
        if self.refused:
            return False
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self.inner.connection_lost(exc)

    def __del__(self) -> None:
        self._release()

    def follow(self, buf: Any, end: int) -> bool:
        """Follow the bodies and heads in buf[:end], a read more than `left` covers;
        False when the connection is refused (its bytes are dropped)."""
        if self.refused:
            return False
        if not isinstance(buf, (bytes, bytearray)):
            buf = bytes(buf[:end])          # a memoryview, only if a front and we disagree
        pos = 0
        while pos < end:
            if self.left:                   # a body (pipelined after a head in this read)
                if self.left >= end - pos:
                    self.left -= end - pos
                    return True
                pos, self.left = pos + self.left, 0
            if self.head_tick < 0:          # a head's first byte
                self.head_tick = self.cap.tick
            head = self.head
            if head is None:                # a head begins in this read
                found = buf.find(HEAD_END, pos, end)
                stop = found + 4 if found >= 0 else end
                if stop - pos > MAX_REQUEST_HEAD_BYTES:
                    return self.refuse_head("size")
                if found < 0:
                    self.head = bytearray(buf[pos:end])
                    return True
                self._head_done(buf, pos, stop)
                pos = stop
            else:                           # one begun in an earlier read goes on
                had = len(head)
                head += buf[pos:min(end, pos + MAX_REQUEST_HEAD_BYTES + 1 - had)]
                found = head.find(HEAD_END, max(0, had - 3))
                stop = found + 4 if found >= 0 else len(head)
                if stop > MAX_REQUEST_HEAD_BYTES:
                    return self.refuse_head("size")
                if found < 0:
                    return True
                self.head = None
                self._head_done(head, 0, stop)
                pos += stop - had
        return True

    def _head_done(self, buf: bytes | bytearray, start: int, stop: int) -> None:
        """A head is whole in buf[start:stop]: `left` is its body's length."""
        self.head_tick = -1
        length = 0
        for m in _FRAMING.finditer(buf, start, stop):
            value = m.group(2).rstrip(b" \t")
            if m.group(1).lower() != b"content-length" or not value.isdigit() or (
                    length and int(value) != length):
                self.left = _UNTRACKED
                return
            length = int(value)
        self.left = length

    def refuse_head(self, reason: str) -> bool:
        """Answer 431 or 408 and close, with the linger of a 503 (_Refusal); False."""
        if self.refused or self.transport is None:
            return False
        self.refused, self.head, self.head_tick = True, None, -1
        self.cap.heads_refused[reason] += 1
        transport = self.transport
        transport.write(HEAD_REPLIES[reason])
        if transport.can_write_eof():
            transport.write_eof()   # as _Refusal: read and drop until the client closes
            asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)
        else:
            transport.close()
        return False


class _Admitted(_Forward, asyncio.Protocol):
    """An admitted connection of a protocol that takes its bytes as they come."""

    def data_received(self, data: bytes) -> None:
        if self.left >= len(data):     # within a body: passed untouched
            self.left -= len(data)
            self.inner.data_received(data)
        elif self.follow(data, len(data)):
            self.inner.data_received(data)


class _AdmittedBuffered(_Forward, asyncio.BufferedProtocol):
    """An admitted connection of a protocol that receives into its own buffers (uvloop
    treats a protocol as one only if it is not also an asyncio.Protocol)."""

    buf: Any = None

    def get_buffer(self, sizehint: int) -> Any:
        if self.refused:
            return _DROP
        self.buf = self.inner.get_buffer(sizehint)
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        if self.left >= nbytes:        # within a body: passed untouched
            self.left -= nbytes
            self.inner.buffer_updated(nbytes)
        elif self.follow(self.buf, nbytes):
            self.inner.buffer_updated(nbytes)


class _Refusal(asyncio.Protocol):
    def __init__(self, cap: ConnectionCap) -> None:
        self.cap = cap
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)   # uvloop's are not asyncio subclasses
        self.cap.refusing += 1
        transport.write(self.cap.reply)
        if self.cap.refusing > MAX_LINGERING_REFUSALS or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()  # the answer is complete; keep reading until the client closes
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request of a refused connection is dropped unread

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self.cap.refusing -= 1
        if self.timer is not None:
            self.timer.cancel()


async def read_body(request: web.Request) -> bytes | bytearray:
    """The request body, copied once from the socket's chunks into a buffer of its
    Content-Length. aiohttp's request.read() gathers the chunks in a bytearray and then
    copies that into bytes: two copies of every fragment a storage node stores. A body
    without a Content-Length, or one over the app's limit (refused with aiohttp's 413),
    is left to request.read()."""
    size = request.content_length
    if not size or size > request.app[MAX_BODY]:
        return await request.read()
    buf = unfilled(size)   # every byte written below, or the request fails
    view = memoryview(buf)
    got = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        if got + len(chunk) > size:   # aiohttp's parser stops at Content-Length
            raise BadRequest("body longer than its Content-Length")
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    if got < size:
        raise BadRequest(f"body cut short: {got} of {size} bytes")
    return buf


async def verified_body(request: web.Request) -> bytes:
    """The request body, checked against the signed checksum header."""
    body = await request.read()
    if not digest_matches(body, request.headers.get(CHECKSUM_HEADER)):
        raise BadRequest("body does not match its signed checksum")
    return body


def query_int(request: web.Request, name: str, default: int, maximum: int) -> int:
    """An integer query parameter in 1..maximum; BadRequest otherwise."""
    return int_param(request.query.get(name), name, default, maximum)


def int_param(text: str | None, name: str, default: int, maximum: int) -> int:
    """query_int of a parameter's text (None: absent)."""
    try:
        value = int(default if text is None else text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None
    if not 1 <= value <= maximum:
        raise BadRequest(f"{name} must be between 1 and {maximum}")
    return value


def node_arg_parser(role: str) -> argparse.ArgumentParser:
    """The flags every node role takes: --id, --data, --host, --port, --no-fsync, and
    --metrics-public, --log-format (node.metrics.observability_config reads them)."""
    p = argparse.ArgumentParser(prog=f"python -m node.{role}")
    p.add_argument("--id", required=True)
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-fsync", action="store_true")
    add_observability_args(p)
    return p


def env_number(name: str, default: float | None, unit: str) -> float | None:
    """A node's setting from $`name` (a number of `unit`), else `default`; SystemExit
    saying so when it is not a number."""
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"{name} must be a number of {unit}, got {text!r}") from None

