"""A storage node's fragment puts go through one writer thread in batches (PutQueue):
one storage node in-process over HTTP, its volumes on a real disk."""
from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from node import fragments, volumes
from node.fragments import FragmentStore
from node.storage import PUTS, STORE, PutQueue
from store.digest import digest
from store.errors import BadRequest, EcstoreError, NotFound
from store.transport import Transport
from tests.functional import harness


def serve(tmp_path: Path, body: Callable[[Transport, str, web.Application], Awaitable[None]]
          ) -> None:
    harness.serve(tmp_path, body, 20, scrub_rate_mb_s=0)


def blob(i: int) -> bytes:
    return os.urandom(1 + (i * 7919) % (300 * 1024))


def test_concurrent_puts_share_batches_and_all_survive_a_reopen(tmp_path: Path) -> None:
    bodies = {f"v{i:04d}.0.0": blob(i) for i in range(200)}

    async def body(t: Transport, url: str, app: web.Application) -> None:
        replies = await asyncio.gather(*(t.request("PUT", url, f"/v1/fragments/{fid}", body=b)
                                         for fid, b in bodies.items()))
        assert {r.status for r in replies} == {201}
        puts = app[PUTS]
        assert puts.puts == 200
        assert puts.batches < 200   # some went together (one sync, one wake-up each)
        again = await t.request("PUT", url, "/v1/fragments/v0000.0.0", body=b"replaced")
        assert again.status == 200
        bodies["v0000.0.0"] = b"replaced"
        for fid, b in bodies.items():
            assert (await t.request("GET", url, f"/v1/fragments/{fid}")).body == b
    serve(tmp_path, body)
    store = FragmentStore(tmp_path)   # what is on the disk, read again from scratch
    assert {fid: bytes(store.read(fid).body) for fid in bodies} == bodies


def test_a_bad_put_fails_alone_and_leaves_its_batch_whole(tmp_path: Path) -> None:
    async def body(t: Transport, url: str, app: web.Application) -> None:
        async def put(i: int) -> Any:
            data = f"body {i}".encode()
            bad = i % 5 == 0    # a body that does not match its checksum
            return await t.request("PUT", url, f"/v1/fragments/w{i}.0.0", body=data,
                                   checksum=digest(b"other") if bad else digest(data))
        got = await asyncio.gather(*(put(i) for i in range(60)), return_exceptions=True)
        for i, r in enumerate(got):
            if i % 5 == 0:
                assert isinstance(r, BadRequest), r
            else:
                assert not isinstance(r, BaseException) and r.status == 201, r
        for i in range(60):
            if i % 5 == 0:
                with pytest.raises(NotFound):
                    await t.request("GET", url, f"/v1/fragments/w{i}.0.0")
            else:
                r = await t.request("GET", url, f"/v1/fragments/w{i}.0.0")
                assert r.body == f"body {i}".encode()
    serve(tmp_path, body)


def test_a_failed_sync_fails_its_puts_and_refuses_writes_until_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fdatasync failing (EIO): no put of that batch is acknowledged or readable (503, the
    client goes to another node), and the node refuses every write after it - until a
    restart - even once fdatasync returns 0 again: the kernel reports a writeback error
    once and leaves the pages it could not write clean in the page cache, so a later
    sync "succeeds" over records that are not on the disk (fsyncgate; on a real failing
    disk the next acknowledged put read back as zeros). It went on writing before.
    Reads go on; status names the problem."""
    real_fdatasync = os.fdatasync
    failing = [False]

    def fdatasync(fd: int) -> None:
        if failing[0]:
            failing[0] = False      # as the kernel: the error is reported once
            raise OSError(errno.EIO, "I/O error (injected)")
        real_fdatasync(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        store = app[STORE]
        store.put("before.0.0", b"kept", digest(b"kept"), {})   # synced before the failure
        failing[0] = True
        got = await asyncio.gather(*(t.request("PUT", url, f"/v1/fragments/x{i}.0.0", body=b"x")
                                     for i in range(20)), return_exceptions=True)
        assert all(isinstance(r, EcstoreError) and r.status == 503 for r in got), got
        for i in range(20):
            with pytest.raises(NotFound):
                await t.request("GET", url, f"/v1/fragments/x{i}.0.0")
        assert not failing[0]       # fdatasync would succeed now: still refused
        for path in ("/v1/fragments/x0.0.0", "/v1/fragments/after.0.0"):
            with pytest.raises(EcstoreError) as refused:
                await t.request("PUT", url, path, body=b"now")
            assert refused.value.status == 503 and "refuses writes" in refused.value.message
            # what tells a client to send it no fragment for a while (REFUSED_BACKOFF_S)
            assert refused.value.details.get("refuses_writes") is True
        with pytest.raises(EcstoreError) as refused:
            await t.request("DELETE", url, "/v1/fragments/before.0.0")
        assert refused.value.status == 503
        assert (await t.request("GET", url, "/v1/fragments/before.0.0")).body == b"kept"
        status = json.loads((await t.request("GET", url, "/v1/status")).body)
        assert status["fragments"] == 1
        assert any("writes refused" in p and "restart" in p for p in status["problems"]), status
    serve(tmp_path, body)
    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)   # the restart
    assert again.write_failure is None and bytes(again.read("before.0.0").body) == b"kept"
    again.put("after.0.0", b"now", digest(b"now"), {})
    assert bytes(again.read("after.0.0").body) == b"now"


@pytest.mark.parametrize("where", ["sync", "commit"])
def test_a_bug_in_a_batch_fails_its_puts_and_the_writer_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """An exception no put expects (a bug: not a disk error) fails the puts of its batch
    with 500; the records it had appended are given up (a volume whose writers never
    finish could never be compacted) and the next batch is written as usual."""
    broken = [True]
    # after the record is appended: in the shared sync, or in the index step
    owner: Any = volumes.Volume if where == "sync" else fragments
    name = "sync" if where == "sync" else "make_loc"
    real = getattr(owner, name)

    def buggy(*args: Any) -> Any:
        if broken[0]:
            broken[0] = False
            raise RuntimeError("a bug (injected)")
        return real(*args)
    monkeypatch.setattr(owner, name, buggy)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        with pytest.raises(EcstoreError) as err:
            await t.request("PUT", url, "/v1/fragments/y0.0.0", body=b"y")
        assert err.value.status == 500
        with pytest.raises(NotFound):
            await t.request("GET", url, "/v1/fragments/y0.0.0")
        r = await t.request("PUT", url, "/v1/fragments/y1.0.0", body=b"still writing")
        assert r.status == 201
        assert (await t.request("GET", url, "/v1/fragments/y1.0.0")).body == b"still writing"
        # every write reserved in a volume was finished or given up
        assert [v.writers for v in app[STORE]._volumes.values()] == [0]
    serve(tmp_path, body)


def test_close_writes_what_is_queued(tmp_path: Path) -> None:
    store = FragmentStore(tmp_path)

    async def go() -> list[bool]:
        q = PutQueue(store)
        futs = [asyncio.ensure_future(q.put(f"z{i}.0.0", b"z" * i, digest(b"z" * i), {}))
                for i in range(50)]
        await asyncio.sleep(0)      # every put queued
        await asyncio.get_running_loop().run_in_executor(None, q.close)
        with pytest.raises(EcstoreError, match="shutting down"):
            await q.put("late.0.0", b"l", digest(b"l"), {})
        return await asyncio.wait_for(asyncio.gather(*futs), 20)
    assert asyncio.run(go()) == [False] * 50
    again = FragmentStore(tmp_path)
    assert [bytes(again.read(f"z{i}.0.0").body) for i in range(50)] == [b"z" * i for i in range(50)]
