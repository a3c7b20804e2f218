"""store.fetch: requests between components (bodies read into one buffer), against raw
TCP servers that misbehave on purpose, and against a real storage node. Every failure to
get a reply is Unreachable (an Unavailable), so readers mark the node down briefly."""
from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from store.digest import digest
from store.errors import BadRequest, NotFound, Unauthorized, Unreachable
from store.fetch import MAX_IN_FLIGHT_PER_NODE, NodeClient
from store.transport import Transport
from tests.functional.harness import SECRET
from tests.functional.harness import run as run_storage_node

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def reply(status: int, body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def serve(handler: Handler, fn: Callable[[str, list[int]], Awaitable[None]]) -> None:
    """Run `fn(base_url, connections)` against a server running `handler` per connection."""
    connections: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await fn(f"http://127.0.0.1:{port}", connections)
    finally:
        server.close()


def run(handler: Handler, fn: Callable[[str, list[int]], Awaitable[None]]) -> None:
    asyncio.run(serve(handler, fn))


def test_body_read_whole_and_connection_kept_alive() -> None:
    body = bytes(range(256)) * 5000          # larger than one socket read

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            req = await read_request(r)
            assert req.startswith(b"GET /v1/fragments/") and b"x-ecstore-signature" in req
            # the head and the body in pieces, to split them across reads
            data = reply(200, body, "X-Ecstore-Crc32: 0000abcd\r\n")
            for i in range(0, len(data), 70_001):
                w.write(data[i:i + 70_001])
                await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for _ in range(5):
            resp = await f.get(url, "/v1/fragments/x", 5.0)
            assert resp.status == 200 and bytes(resp.body) == body
            assert resp.headers["x-ecstore-crc32"] == "0000abcd"   # names lower-cased
        assert len(connections) == 1                                # one connection, reused
        f.close()
    run(handler, fn)


def test_errors_are_the_nodes_errors() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(reply(404, b'{"error": "not_found", "message": "fragment x not found"}'))

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for _ in range(2):
            with pytest.raises(NotFound, match="fragment x not found"):
                await f.get(url, "/v1/fragments/x", 5.0)
        assert len(connections) == 1
        f.close()
    run(handler, fn)


def test_idle_connection_closed_by_the_node_is_retried_once() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(reply(200, b"abc"))       # then close: keep-alive not honoured
        await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for _ in range(3):
            assert bytes((await f.get(url, "/v1/fragments/x", 5.0)).body) == b"abc"
            await asyncio.sleep(0.05)     # the close arrives while the connection is idle
        f.close()
    run(handler, fn)


@pytest.mark.parametrize("misbehaviour", ["cut_body", "no_length", "garbage", "chunked",
                                          "too_many_bytes", "silent"])
def test_a_misbehaving_node_is_unavailable_not_a_hang(misbehaviour: str) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        if misbehaviour == "cut_body":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        elif misbehaviour == "no_length":
            w.write(b"HTTP/1.1 200 OK\r\n\r\nxyz")
        elif misbehaviour == "garbage":
            w.write(b"\x00\x01 not http at all\r\n\r\n")
        elif misbehaviour == "chunked":
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        elif misbehaviour == "too_many_bytes":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabcdef")
        else:
            await asyncio.sleep(30)       # never answers
        await w.drain()
        await asyncio.sleep(0.2)

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Unreachable):
            await f.get(url, "/v1/fragments/x", 1.0)
        assert loop.time() - t0 < 2.0
        assert not any(f._idle.values())   # nothing half-read goes back to the pool
        f.close()
    run(handler, fn)


def test_unreachable_node_is_unavailable() -> None:
    async def go() -> None:
        f = NodeClient("secret")
        with pytest.raises(Unreachable):
            await f.get("http://127.0.0.1:9", "/v1/fragments/x", 2.0)   # discard port: closed
    asyncio.run(go())


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_connection_reset_before_its_first_request_is_unreachable(loop_kind: str) -> None:
    """A node SIGKILLed with connections in its accept queue resets them. When the reset
    is processed before the request is written (a busy loop: the connection's
    connection_lost ran between create_connection and the write), the write met a dead
    transport: on uvloop (the DCP writer's and reader's loop, the gateway's) it raised a
    bare RuntimeError ("the handler is closed"), which escaped put_segment's handoff and
    read_segment's hedging - a DCP save with a spare storage node failed when one node
    was killed mid-save (found by the ML sweep); on asyncio's loop the write was dropped
    silently and the request waited out its whole timeout. Both are Unreachable at once."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def reset_every_connection() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            time.sleep(0.02)   # once the client has the connection
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()    # RST
    threading.Thread(target=reset_every_connection, daemon=True).start()

    class BusyLoop(NodeClient):
        async def _connection(self, addr: tuple[str, int], lane: bool,
                              reuse: bool) -> tuple[Any, bool]:
            conn, reused = await super()._connection(addr, lane, reuse)
            await asyncio.sleep(0.2)   # other work on the loop: the reset arrives meanwhile
            return conn, reused

    async def go() -> list[tuple[str, float]]:
        f = BusyLoop("secret")
        seen = []
        for _ in range(3):
            t0 = time.monotonic()
            try:
                await f.request("PUT", url, "/v1/fragments/x", 5.0, body=b"x" * 1000)
                seen.append(("answered", time.monotonic() - t0))
            except Exception as exc:   # noqa: BLE001 - which kind is the point
                seen.append((type(exc).__name__, time.monotonic() - t0))
        f.close()
        return seen
    try:
        if loop_kind == "uvloop":
            seen = pytest.importorskip("uvloop").run(go())
        else:
            seen = asyncio.run(go())
    finally:
        listener.close()
    assert {kind for kind, _ in seen} == {"Unreachable"}, seen
    assert max(s for _, s in seen) < 2.0, seen   # at once, not after the 5 s timeout


def test_cancelled_request_drops_its_connection() -> None:
    """A hedging loser is cancelled mid-response: its connection must not be reused."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"a" * 50)
            await w.drain()
            await asyncio.sleep(0.3)
            w.write(b"b" * 50)
            await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        task = asyncio.ensure_future(f.get(url, "/v1/fragments/x", 5.0))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        resp = await f.get(url, "/v1/fragments/x", 5.0)   # a new connection, whole body
        assert bytes(resp.body) == b"a" * 50 + b"b" * 50
        assert len(connections) == 2
        f.close()
    run(handler, fn)


def test_request_left_when_its_loop_closed_finalises_quietly() -> None:
    """A request still waiting when its event loop is closed (a metadata write's third
    replica at the end of a test or script) is finalised later by the garbage collector:
    dropping its connection must not raise "Event loop is closed"."""
    listener = socket.create_server(("127.0.0.1", 0))    # accepts (backlog), never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    f = NodeClient("secret")
    coro = f.get(url, "/v1/fragments/x", 30.0)
    task = loop.create_task(coro)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert not task.done()
    loop.close()
    try:
        coro.close()        # what the GC does: GeneratorExit at the await
    finally:
        listener.close()


async def read_body(r: asyncio.StreamReader, head: bytes) -> bytes:
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await r.readexactly(length)


@pytest.mark.parametrize("size", [0, 1000, 3 * 1024 * 1024])
def test_request_body_sent_whole_and_connection_reused(size: int) -> None:
    """Small bodies go with the head, large ones apart; either way the node reads exactly
    Content-Length bytes and the connection serves the next request."""
    sent = os.urandom(size)
    got: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(r)
            assert head.startswith(b"PUT /v1/fragments/x HTTP/1.1\r\n")
            got.append(await read_body(r, head))
            w.write(reply(201, b""))

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for _ in range(3):
            resp = await f.request("PUT", url, "/v1/fragments/x", 5.0, sent,
                                   hashlib.sha256(sent).hexdigest())
            assert resp.status == 201 and bytes(resp.body) == b""
        assert got == [sent] * 3 and len(connections) == 1
        f.close()
    run(handler, fn)


def test_no_body_statuses_and_head_need_no_content_length() -> None:
    """204 carries no Content-Length from aiohttp, and a HEAD reply's Content-Length is
    the size of a body that is not sent: neither may hang waiting for body bytes."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(r)
            if head.startswith(b"DELETE"):
                w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            else:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n")

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for method, status in (("DELETE", 204), ("HEAD", 200), ("DELETE", 204)):
            resp = await f.request(method, url, "/v1/fragments/x", 2.0)
            assert resp.status == status and resp.body == bytearray()
        assert len(connections) == 1
        f.close()
    run(handler, fn)


def test_a_refused_body_drops_the_connection() -> None:
    """A node that answers 4xx to a request with a body may not have read the body: the
    connection is not reused (its unread bytes would be read as the next request)."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(r)                 # the body is left unread
            w.write(reply(401, b'{"error": "unauthorized", "message": "no"}'))
            await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        for _ in range(2):
            resp = await f.request("PUT", url, "/v1/fragments/x", 5.0, b"z" * 100)
            assert resp.status == 401
        assert len(connections) == 2 and not any(f._idle.values())
        f.close()
    run(handler, fn)


def test_requests_in_flight_per_node_are_bounded() -> None:
    """More concurrent requests than MAX_IN_FLIGHT_PER_NODE wait for a slot instead of
    opening a connection each (a gateway under load would otherwise hit the node's
    connection cap); all of them complete."""
    active, peak = 0, 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal active, peak
        while True:
            await read_request(r)
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1
            w.write(reply(200, b"ok"))
            await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        n = MAX_IN_FLIGHT_PER_NODE * 3
        replies = await asyncio.gather(*(f.get(url, "/v1/fragments/x", 10.0) for _ in range(n)))
        assert [bytes(x.body) for x in replies] == [b"ok"] * n
        assert peak == MAX_IN_FLIGHT_PER_NODE and len(connections) <= MAX_IN_FLIGHT_PER_NODE
        f.close()
    run(handler, fn)


def test_an_unqueued_request_is_not_behind_the_nodes_busy_slots() -> None:
    """A node that holds every slot this client has for it (slow fragment puts): a health
    probe queued behind them timed out, and the put judged the node stalled (a review
    found it); `unqueued` sends it at once, while a queued request still waits."""
    release = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(r)
            if b"/v1/health" not in head:
                await release.wait()       # a slow fragment write
            w.write(reply(200, b"ok"))
            await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        t = Transport("secret")
        busy = [asyncio.ensure_future(t.request("GET", url, "/v1/fragments/x", timeout_s=30.0))
                for _ in range(MAX_IN_FLIGHT_PER_NODE)]
        await asyncio.sleep(0.2)
        with pytest.raises(Unreachable):        # queued: behind the busy ones
            await t.request("GET", url, "/v1/health", timeout_s=0.5)
        t0 = time.monotonic()
        got = await t.request("GET", url, "/v1/health", timeout_s=2.0, unqueued=True)
        assert bytes(got.body) == b"ok" and time.monotonic() - t0 < 1.5
        release.set()
        assert [bytes(x.body) for x in await asyncio.gather(*busy)] == [b"ok"] * len(busy)
        await t.close()
    run(handler, fn)


def test_transport_against_a_real_storage_node(tmp_path: Path) -> None:
    """Every route shape a component uses, through Transport, against a storage node:
    PUT (201 then 200), GET with the body and lower-case headers, HEAD, 404 raised or
    returned, a body that does not match its signed checksum (400, then the connection
    is not reused but the next request works), a bad signature (401), DELETE (204)."""
    async def go(t: Transport, url: str) -> None:
        other = Transport(SECRET + "x")
        try:
            body = os.urandom(300_000)
            path = "/v1/fragments/obj.s0.f1"
            meta = {"x-ecstore-meta": ""}
            assert (await t.request("PUT", url, path, body=body, headers=meta)).status == 201
            assert (await t.request("PUT", url, path, body=body, headers=meta)).status == 200
            got = await t.get_into(url, path, 5.0)
            assert bytes(got.body) == body
            assert got.headers["x-ecstore-checksum"] == digest(body)
            assert (await t.request("HEAD", url, path)).headers["x-ecstore-size"] == str(len(body))
            with pytest.raises(BadRequest):
                await t.request("PUT", url, path, body=body[:-1], headers=meta,
                                checksum=digest(body))
            with pytest.raises(Unauthorized):
                await other.request("GET", url, path)
            assert (await t.request("DELETE", url, path)).status == 204
            with pytest.raises(NotFound):
                await t.get_into(url, path, 5.0)
            assert (await t.request("GET", url, path, ok_404=True)).status == 404
        finally:
            await other.close()

    run_storage_node(tmp_path, go)


@pytest.mark.parametrize("cut", [1, 79, 80, 81, 4096, 70_001])
def test_a_body_read_into_a_sinks_views_in_pieces_of_any_size(cut: int) -> None:
    """The head, the views' boundaries and the socket's reads fall anywhere: the bytes
    land in order, nothing is allocated for a body that had views, and one without (an
    error, an unwanted length, views of the wrong total) is read as usual."""
    body = os.urandom(300_000)
    error = b'{"error": {"code": "not_found", "message": "no such fragment"}}'

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            req = await read_request(r)
            data = reply(404, error) if b"/missing" in req else reply(200, body)
            for i in range(0, len(data), cut):
                w.write(data[i:i + cut])
                if cut < 100:
                    await w.drain()

    async def fn(url: str, connections: list[int]) -> None:
        f = NodeClient("secret")
        head, rest = bytearray(80), bytearray(len(body) - 80)
        asked: list[tuple[int, int]] = []

        def sink(status: int, length: int) -> list[memoryview] | None:
            asked.append((status, length))
            return [memoryview(head), memoryview(rest)]
        resp = await f.request("GET", url, "/v1/fragments/x", 5.0, sink=sink)
        assert resp.status == 200 and resp.scattered and resp.body == bytearray()
        assert asked == [(200, len(body))] and bytes(head + rest) == body
        missing = await f.request("GET", url, "/v1/fragments/missing", 5.0, sink=sink)
        assert not missing.scattered and bytes(missing.body) == error   # not 200: no sink
        head[:], rest[:] = bytes(80), bytes(len(rest))

        def short(status: int, length: int) -> list[memoryview] | None:
            return [memoryview(head)]       # not the whole length: ignored
        def empty(status: int, length: int) -> list[memoryview] | None:
            return [memoryview(head), memoryview(bytearray()), memoryview(rest)]
        for wrong in (short, empty):
            again = await f.request("GET", url, "/v1/fragments/x", 5.0, sink=wrong)
            assert not again.scattered and bytes(again.body) == body and head == bytes(80)
        assert len(connections) == 1       # every answer read whole: the connection kept
        f.close()
    run(handler, fn)
