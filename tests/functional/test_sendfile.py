"""A storage node sends a fragment whose record is in the page cache with sendfile(2),
and reads any other in a thread: one storage node in-process over real TCP, its volumes
on a real disk. Every read is checked byte for byte against what was put."""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from node import zerocopy
from node.storage import SENDFILE_MIN_BYTES, SENDS, STORE
from store.auth import CHECKSUM_HEADER, sign_headers
from store.digest import digest
from store.transport import Transport
from tests import scrape
from tests.functional import harness
from tests.functional.harness import SECRET


@pytest.fixture(params=["cachestat", "mincore"])
def residency(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the node tells whether a record is cached: cachestat(2), where the kernel has
    it and no seccomp filter refuses it, and mincore(2), which answers where it does not
    (a filter older than the syscall refuses it: Docker's default did before 26.0)."""
    if request.param == "cachestat" and not zerocopy.cachestat_supported():
        pytest.skip("this kernel has no cachestat(2) (Linux 6.5+) or a seccomp filter "
                    "refuses it: the mincore runs of these tests cover the node here")
    if request.param == "mincore":
        monkeypatch.setattr(zerocopy, "_cachestat", False)
    if not zerocopy.supported():
        pytest.skip("neither cachestat(2) nor mincore(2) answers on this system")
    return str(request.param)


def serve(tmp_path: Path, body: Callable[[Transport, str, web.Application], Awaitable[None]]
          ) -> None:
    harness.serve(tmp_path, body, 30, scrub_rate_mb_s=0)


def evict(app: web.Application) -> None:
    """Drop every volume file's pages from the page cache (they are synced: clean). The
    kernel skips pages still in another CPU's batch of new pages: asked again until no
    page is left (where the kernel cannot tell, once)."""
    for path in app[STORE].vdir.glob("*.vol"):
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(100):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if zerocopy.resident(fd, 0, os.fstat(fd).st_size) is not True \
                        and zerocopy.resident(fd, 0, 1) is not True:
                    break
                time.sleep(0.02)
        finally:
            os.close(fd)


async def get(t: Transport, url: str, fid: str) -> bytes:
    r = await t.request("GET", url, f"/v1/fragments/{fid}")
    assert r.headers[CHECKSUM_HEADER.lower()] == digest(bytes(r.body))
    return bytes(r.body)


SIZES = [1, SENDFILE_MIN_BYTES // 2, SENDFILE_MIN_BYTES, 300 * 1024 + 3, 1 << 20, (3 << 20) + 7]


@pytest.mark.usefixtures("residency")
def test_cached_fragments_go_by_sendfile_and_arrive_whole(tmp_path: Path) -> None:
    bodies = {f"f{i}.0.0": os.urandom(n) for i, n in enumerate(SIZES)}

    async def body(t: Transport, url: str, app: web.Application) -> None:
        for fid, b in bodies.items():
            assert (await t.request("PUT", url, f"/v1/fragments/{fid}", body=b)).status == 201
        for _ in range(2):    # twice: the connection stays usable after a sendfile answer
            for fid, b in bodies.items():
                assert await get(t, url, fid) == b
        big = [n for n in SIZES if n >= SENDFILE_MIN_BYTES]
        assert app[SENDS].gets == 2 * len(big)
        assert app[SENDS].bytes == 2 * sum(big)
        text = (await t.request("GET", url, "/metrics")).body.decode()
        samples = scrape.parse(text)
        assert samples[("ecstore_storage_sendfile_gets_total", ())] == 2 * len(big)
        assert samples[("ecstore_storage_sendfile_bytes_total", ())] == 2 * sum(big)
        # the bytes a node sent count what went by sendfile too: every body, and the heads
        assert scrape.value(samples, "ecstore_http_sent_bytes_total", op="get_fragment") \
            > 2 * sum(SIZES)
    serve(tmp_path, body)


@pytest.mark.usefixtures("residency")
def test_a_fragment_not_in_the_page_cache_is_read_in_a_thread(tmp_path: Path) -> None:
    data = os.urandom(2 << 20)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        await t.request("PUT", url, "/v1/fragments/cold.0.0", body=data)
        evict(app)
        assert app[STORE].cached_body("cold.0.0") is None
        assert await get(t, url, "cold.0.0") == data
        assert app[SENDS].gets == 0
        assert await get(t, url, "cold.0.0") == data    # cached by the first read now
        assert app[SENDS].gets == 1
    serve(tmp_path, body)


def test_where_the_kernel_cannot_tell_every_fragment_is_read_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zerocopy, "_cachestat", False)
    monkeypatch.setattr(zerocopy, "_mincore", False)
    bodies = {f"g{i}.0.0": os.urandom(n) for i, n in enumerate(SIZES)}

    async def body(t: Transport, url: str, app: web.Application) -> None:
        for fid, b in bodies.items():
            await t.request("PUT", url, f"/v1/fragments/{fid}", body=b)
        for fid, b in bodies.items():
            assert await get(t, url, fid) == b
        evict(app)
        for fid, b in bodies.items():
            assert await get(t, url, fid) == b
        assert app[SENDS].gets == 0
    serve(tmp_path, body)


async def raw_get(url: str, fid: str, rcvbuf: int) -> tuple[socket.socket, bytes]:
    """A GET sent on a plain socket with a small receive buffer, nothing read yet."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    path = f"/v1/fragments/{fid}"
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in sign_headers(SECRET, "GET", path).items()) + "\r\n"
    await loop.sock_sendall(sock, head.encode())
    return sock, b""


async def read_response(sock: socket.socket) -> tuple[int, bytes]:
    loop, got = asyncio.get_running_loop(), bytearray()
    while b"\r\n\r\n" not in got:
        chunk = await loop.sock_recv(sock, 65536)
        assert chunk, "connection closed before the head"
        got += chunk
    head, _, rest = bytes(got).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = await loop.sock_recv(sock, 1 << 20)
        assert chunk, f"connection closed after {len(body)} of {length} body bytes"
        body += chunk
    return int(lines[0].split()[1]), bytes(body)


@pytest.mark.usefixtures("residency")
def test_a_slow_reader_gets_what_sendfile_could_not_send_written_after_it(tmp_path: Path) -> None:
    data = os.urandom(8 << 20)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        await t.request("PUT", url, "/v1/fragments/slow.0.0", body=data)
        sock, _ = await raw_get(url, "slow.0.0", rcvbuf=4096)
        try:
            await asyncio.sleep(0.3)      # the node answers while nothing is read
            assert 0 < app[SENDS].bytes < len(data)   # the socket took only part of it
            status, got = await read_response(sock)
        finally:
            sock.close()
        assert status == 200 and got == data
        assert await get(t, url, "slow.0.0") == data
    serve(tmp_path, body)


@pytest.mark.usefixtures("residency")
def test_a_client_that_resets_mid_answer_leaves_the_node_serving(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = os.urandom(8 << 20)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        await t.request("PUT", url, "/v1/fragments/gone.0.0", body=data)
        for _ in range(5):
            sock, _ = await raw_get(url, "gone.0.0", rcvbuf=4096)
            await asyncio.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()                  # RST with the answer half sent
        await asyncio.sleep(0.2)
        assert await get(t, url, "gone.0.0") == data
    serve(tmp_path, body)
    assert "unhandled error" not in caplog.text


def test_sendfile_to_a_closed_connection_says_so_and_short_files_stop_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(256 * 1024))
    fd = os.open(path, os.O_RDONLY)
    try:
        ours, theirs = socket.socketpair()
        try:
            theirs.close()
            assert zerocopy.send(ours.fileno(), fd, 0, 1000) == -1   # EPIPE: the client is gone
        finally:
            ours.close()
        ours, theirs = socket.socketpair()
        try:
            ours.setblocking(False)
            end = os.fstat(fd).st_size
            assert zerocopy.send(ours.fileno(), fd, end - 100, 500) == 100   # the file ends
            assert theirs.recv(200) == os.pread(fd, 100, end - 100)
        finally:
            ours.close()
            theirs.close()
    finally:
        os.close(fd)


def test_cork_is_set_and_lifted_by_fd() -> None:
    a, b = socket.create_server(("127.0.0.1", 0)), socket.socket()
    try:
        b.connect(a.getsockname())
        c, _ = a.accept()
        try:
            zerocopy.cork(c.fileno(), True)
            assert c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 1
            c.send(b"head")        # held (under a full segment) until the cork is lifted
            zerocopy.cork(c.fileno(), False)
            assert c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
            b.settimeout(5)
            assert b.recv(100) == b"head"
        finally:
            c.close()
    finally:
        a.close()
        b.close()
