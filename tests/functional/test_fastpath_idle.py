"""The storage node's fast path in-process, over real TCP, behind the same ConnectionCap
as node.server.run: a keep-alive connection left idle is closed after the keep-alive
timeout (as aiohttp closes its own), one with a request under way is not, and a
connection handed to aiohttp is aiohttp's to time out."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from node import fastpath
from node.server import ConnectionCap
from node.storage import FAST, StorageConfig, make_app
from tests.cluster.rawhttp import signed_request

SECRET = "s" * 32


def request(method: str, target: str, body: bytes = b"") -> bytes:
    return signed_request(SECRET, method, target, body)


async def answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return int(head.split(b" ")[1])


async def closed(reader: asyncio.StreamReader, within_s: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within_s) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_after_the_keepalive_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "KEEPALIVE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(fastpath, "SWEEP_EVERY_S", 0.1)

    async def go() -> None:
        app = make_app(StorageConfig("s1", tmp_path, SECRET, fsync=False, scrub_rate_mb_s=0))
        runner = web.AppRunner(app)
        await runner.setup()
        assert runner.server is not None
        front = app[FAST]
        server = await asyncio.get_running_loop().create_server(
            ConnectionCap(front.wrap(runner.server), 16), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
            busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
            idle_w.write(request("PUT", "/v1/fragments/x.1", b"abc"))
            assert await answer(idle_r) == 201
            put = request("PUT", "/v1/fragments/x.2", b"0123456789")
            busy_w.write(put[:-5])           # a body under way: not idle
            assert await closed(idle_r, 3.0)
            assert not await closed(busy_r, 1.0)
            busy_w.write(put[-5:])
            assert await answer(busy_r) == 201
            assert await closed(busy_r, 3.0)  # idle in its turn
            assert front.requests == 2 and front.handovers == 0
            # shutdown: an idle one closed at once
            last_r, last_w = await asyncio.open_connection("127.0.0.1", port)
            last_w.write(request("GET", "/v1/fragments/x.1"))
            assert await answer(last_r) == 200
            await front.close(5.0)
            assert await closed(last_r, 1.0) and not front.conns
            for w in (idle_w, busy_w, last_w):
                w.close()
        finally:
            server.close()
            await runner.cleanup()

    asyncio.run(go())
