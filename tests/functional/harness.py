"""One storage node in-process on port 0, and a signed transport to it."""
from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.pagecache import evict
from cli.localcluster import signed_request
from node import fragments, zerocopy
from node.logs import request_log
from node.metrics import access_log_class
from node.server import OBSERVER
from node.storage import StorageConfig, make_app
from node.volumes import stored_fragments
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


PAGE = os.sysconf("SC_PAGE_SIZE")
UNCACHED_SETTLE_S = 10.0   # the kernel drops an uncached write's pages as their writeback completes


def dontcache_refusal(directory: Path) -> str | None:
    """Why this kernel and filesystem do not take an uncached write (RWF_DONTCACHE), or
    None if they do: a test skips with it (outside our control)."""
    if fragments.RWF_DONTCACHE is None or not zerocopy.available():
        return "not Linux, or the page cache cannot be asked (neither cachestat nor mincore)"
    path = directory / "probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwritev(fd, [b"x" * PAGE], 0, fragments.RWF_DONTCACHE)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return f"this kernel or filesystem has no RWF_DONTCACHE (Linux 6.14+): {exc}"
        raise
    finally:
        os.close(fd)
        path.unlink()
    return None


def cached_pages(path: str, off: int, size: int) -> int:
    """How many of the whole pages inside off..off+size of a file are in the page cache
    (the pages it shares with the records beside it left out)."""
    first, last = -(-off // PAGE), (off + size) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        return sum(1 for p in range(first, last) if zerocopy.resident(fd, p * PAGE, PAGE))
    finally:
        os.close(fd)


def evict_volumes(data_dir: Path | str) -> None:
    """A storage node's volume files out of the page cache: synced first (a node may run
    with fsync off, and dirty pages are not dropped), then POSIX_FADV_DONTNEED."""
    evict([Path(data_dir) / "volumes"], sync=True)


def refuse_dontcache(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """This process's preadv and pwritev as a kernel without RWF_DONTCACHE's (EOPNOTSUPP
    for the flag); the flags refused are listed."""
    refused: list[int] = []

    def older(real: Callable[..., int]) -> Callable[..., int]:
        def call(fd: int, buffers: list[Any], offset: int, flags: int = 0) -> int:
            if flags & 0x80:
                refused.append(flags)
                raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
            return real(fd, buffers, offset, flags)
        return call

    monkeypatch.setattr(os, "preadv", older(os.preadv))
    monkeypatch.setattr(os, "pwritev", older(os.pwritev))
    monkeypatch.setattr(fragments, "RWF_DONTCACHE", 0x80)
    return refused


def whole_pages(off: int, size: int) -> int:
    return (off + size) // PAGE - -(-off // PAGE)


def settle_uncached(where: list[tuple[str, int, int]]) -> list[int]:
    """cached_pages of each (file, offset, length), once none is left or
    UNCACHED_SETTLE_S has passed."""
    deadline = time.monotonic() + UNCACHED_SETTLE_S
    while True:
        left = [cached_pages(*w) for w in where]
        if not any(left) or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
