"""store.fetch: fragment GETs into one buffer, against raw TCP servers that misbehave on
purpose (a real storage node is exercised by every cluster test's reads). Every failure to
get a reply is Unreachable (an Unavailable), so readers mark the node down briefly."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from store.errors import NotFound, Unreachable
from store.fetch import FragmentFetcher

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
        f = FragmentFetcher("secret")
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
        f = FragmentFetcher("secret")
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
        f = FragmentFetcher("secret")
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
        f = FragmentFetcher("secret")
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
        f = FragmentFetcher("secret")
        with pytest.raises(Unreachable):
            await f.get("http://127.0.0.1:9", "/v1/fragments/x", 2.0)   # discard port: closed
    asyncio.run(go())


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
        f = FragmentFetcher("secret")
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
