"""One storage node in-process on port 0, and a signed transport to it."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp.test_utils import TestServer

from node.storage import StorageConfig, make_app
from store.transport import Transport

SECRET = "s" * 32


def run(tmp_path: Path, body: Callable[[Transport, str], Awaitable[None]],
        **config: float) -> None:
    """Serve a storage node on tmp_path, run body(transport, url), stop the node."""
    async def go() -> None:
        app = make_app(StorageConfig("s1", tmp_path, SECRET, **config))  # type: ignore[arg-type]
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        t = Transport(SECRET)
        try:
            await body(t, str(server.make_url("")).rstrip("/"))
        finally:
            await t.close()
            await server.close()
    asyncio.run(go())


def flip_last_byte(data_dir: Path, fid: str) -> None:
    """Damage a stored fragment on disk: its file's last byte flipped."""
    [path] = (data_dir / "fragments").glob(f"*/{fid}")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
