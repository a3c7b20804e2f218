"""One storage node in-process on port 0, and a signed transport to it."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from cli.localcluster import signed_request
from node.fragments import stored_fragments
from node.logs import request_log
from node.metrics import access_log_class
from node.server import OBSERVER
from node.storage import StorageConfig, make_app
from store.transport import Transport

SECRET = "s" * 32


def serve(tmp_path: Path, body: Callable[[Transport, str, web.Application], Awaitable[None]],
          timeout_s: float | None = None, **config: float) -> None:
    """Serve a storage node on tmp_path, run body(transport, url, app) within timeout_s,
    stop the node. Requests are counted and logged as the node process does (the
    request log and its metrics)."""
    async def go() -> None:
        app = make_app(StorageConfig("s1", tmp_path, SECRET, **config))  # type: ignore[arg-type]
        server = TestServer(app, host="127.0.0.1")
        await server.start_server(access_log=request_log,
                                  access_log_class=access_log_class(app[OBSERVER]))
        t = Transport(SECRET)
        try:
            await asyncio.wait_for(body(t, str(server.make_url("")).rstrip("/"), app),
                                   timeout_s)
        finally:
            await t.close()
            await server.close()
    asyncio.run(go())


def run(tmp_path: Path, body: Callable[[Transport, str], Awaitable[None]],
        **config: float) -> None:
    """Serve a storage node on tmp_path, run body(transport, url), stop the node."""
    serve(tmp_path, lambda t, url, _app: body(t, url), **config)


def flip_last_byte(data_dir: Path | str, fid: str) -> None:
    """Damage a stored fragment on disk: the last byte of its body, in its volume file,
    flipped (a running node reads it from the same file)."""
    path, off, size = stored_fragments(data_dir)[fid]
    with open(path, "r+b") as f:
        f.seek(off + size - 1)
        last = f.read(1)[0]
        f.seek(off + size - 1)
        f.write(bytes([last ^ 0xFF]))


def fragments_on_disk(data_dir: Path | str) -> dict[str, int]:
    """{fragment id: body bytes} of every fragment stored under a node's data directory,
    read from its volume files."""
    return {fid: size for fid, (_, _, size) in stored_fragments(data_dir).items()}


def lose_fragment(url: str, secret: str, fid: str) -> None:
    """A fragment lost from a running storage node's disk: deleted through the node,
    which is the only one that can forget it (its volume files are append-only)."""
    signed_request(secret, "DELETE", url, f"/v1/fragments/{fid}")
