"""One Client used from one event loop after another (a script calling asyncio.run more
than once, a notebook), and from two running loops at once: real nodes over HTTP."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import uvloop

from cli.localcluster import LocalCluster
from store.client import DEFAULT_SEGMENT_SLOTS, Client
from store.errors import WrongEventLoop
from tests.cluster.conftest import replicas_hold, wait_for

BIG = 300 * 1024      # above the inline limit: fragments on the storage nodes


def test_a_client_works_across_asyncio_runs(cluster: LocalCluster) -> None:
    c = Client.connect(cluster.path)

    async def first() -> None:
        await c.create_bucket("loops1")
        await c.put("loops1", "small", b"s" * 100)
        await c.put("loops1", "big", b"b" * BIG)

    async def second() -> tuple[bytes, bytes, list[str]]:
        await c.put("loops1", "later", b"l" * 10)
        return (await c.get("loops1", "small"), await c.get("loops1", "big"),
                [o.key for o in (await c.list("loops1")).objects])

    asyncio.run(first())
    small, big, keys = asyncio.run(second())           # a new loop: fresh connections
    assert (small, big) == (b"s" * 100, b"b" * BIG)
    assert keys == ["big", "later", "small"]
    # and a third, of another kind (uvloop), which also closes it
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(c.get("loops1", "later")) == b"l" * 10
        runner.run(c.close())


@pytest.mark.parametrize("how", ["cancelled", "abandoned"])
def test_work_cut_off_by_the_end_of_a_loop_does_not_stick(cluster: LocalCluster,
                                                          how: str) -> None:
    """What was still on its way when a loop stopped: record writes queued for a batch,
    fragment puts holding segment slots and connections. asyncio.run cancels it
    ("cancelled"); a loop run by hand and then left leaves it pending for ever
    ("abandoned"). Either way the next loop starts clean and nothing waits on the old."""
    c = Client.connect(cluster.path)
    bucket = f"loops-{how}"
    done: list[int] = []
    held: list[asyncio.Future[None]] = []   # the old loop's tasks, kept from the GC

    async def one(i: int) -> None:
        await c.put(bucket, f"cut/{i}", bytes([i]) * (BIG if i % 2 else 100))
        done.append(i)

    async def first() -> None:
        await c.create_bucket(bucket)
        tasks = [asyncio.ensure_future(one(i)) for i in range(80)]
        held.extend(tasks)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # and small ones, just far enough to be on their way or queued for a batch
        held.extend(asyncio.ensure_future(one(i)) for i in range(100, 140, 2))
        for _ in range(2000):
            if any(box.busy and box.queue for box in c.meta._outboxes.values()):
                break
            await asyncio.sleep(0)
        # return now: the other puts are wherever they are

    old = asyncio.new_event_loop() if how == "abandoned" else None
    try:
        if old is None:
            asyncio.run(first())
        else:
            old.run_until_complete(first())
        assert 1 <= len(done) < 80 + 20
        finished = list(done)

        async def second() -> list[bytes]:
            await asyncio.gather(*(c.put(bucket, f"again/{i}", bytes([i]) * BIG)
                                   for i in range(40)))
            await asyncio.gather(*(c.put(bucket, f"again/{i}", b"x" * 100)
                                   for i in range(40)))
            return await asyncio.gather(*(c.get(bucket, f"cut/{i}") for i in finished))

        got = asyncio.run(asyncio.wait_for(second(), 20))
        assert got == [bytes([i]) * (BIG if i % 2 else 100) for i in finished]
        # every record reached all three control nodes: none queued behind a batch that
        # was on its way when the old loop stopped (the quorum alone would hide that)
        wait_for(lambda: replicas_hold(cluster, bucket, [f"again/{i}" for i in range(40)]),
                 timeout_s=10, what="every replica written")
    finally:   # finish the old loop's tasks (never left to the GC at some later moment)
        for _ in range(10 if old is not None else 0):   # cancelled tasks may start others
            pending = asyncio.all_tasks(old)
            if not pending:
                break
            for t in pending:
                t.cancel()
            old.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        if old is not None:
            old.close()
    # the old loop's slots went back to the old semaphore, not to the new one's bound
    # (Semaphore has no public count: its _value is the number free)
    assert c.segment_slots is not None and c.segment_slots._value == DEFAULT_SEGMENT_SLOTS
    asyncio.run(c.close())


def test_two_running_loops_at_once_get_a_clear_error(cluster: LocalCluster) -> None:
    c = Client.connect(cluster.path)
    holding = threading.Event()
    release = threading.Event()

    async def hold() -> None:
        await c.create_bucket("loops3")
        holding.set()
        while not release.is_set():     # keep this loop running, bounded by the test
            await asyncio.sleep(0.01)

    t = threading.Thread(target=lambda: asyncio.run(hold()))
    t.start()
    try:
        assert holding.wait(30)
        with pytest.raises(WrongEventLoop, match="another event loop that is still running"):
            asyncio.run(c.get("loops3", "small"))
    finally:
        release.set()
        t.join(30)
    assert not t.is_alive()
    # its own loop has stopped now: this one takes it over
    asyncio.run(c.put("loops3", "after", b"a"))
    assert asyncio.run(c.get("loops3", "after")) == b"a"
    asyncio.run(c.close())


def test_a_closed_sync_client_says_so_instead_of_hanging(cluster: LocalCluster) -> None:
    """close() twice (or `with` around an explicit close) does nothing the second time, and
    a call after close raises ClientClosed at once - its loop thread is gone, and waiting
    on it hung forever. Run in a thread with a deadline, so a hang fails the test."""
    from store.client import SyncClient
    from store.errors import ClientClosed
    outcome: list[object] = []

    def script() -> None:
        with SyncClient(cluster.path) as c:
            c.create_bucket("closed1")
            c.put("closed1", "k", b"v" * 10)
            assert b"".join(c.get_stream("closed1", "k", 2, 4)) == b"vvv"
            c.close()
            c.close()
            try:
                c.get("closed1", "k")
            except ClientClosed as exc:
                outcome.append(exc)
        outcome.append("exited")

    t = threading.Thread(target=script, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "SyncClient hung after close"
    assert len(outcome) == 2 and isinstance(outcome[0], ClientClosed), outcome
    assert "closed" in str(outcome[0])


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_closing_a_sync_client_ends_the_calls_other_threads_are_making(
        cluster: LocalCluster) -> None:
    """close() while another thread is in a call (a data loader's worker reading): that
    call raises ClientClosed - close stopped the loop under it, and the thread waited for
    ever. A failed constructor leaves no loop thread; `with` on a closed client raises."""
    import os

    from store.client import SyncClient
    from store.errors import ClientClosed, EcstoreError
    c = SyncClient(cluster.path)
    c.create_bucket("closing")
    c.put("closing", "big", os.urandom(24 * 1024 * 1024))
    started, outcome = threading.Event(), []

    def reader() -> None:
        started.set()
        try:
            for _ in range(50):     # bounded: one of them is running when close() comes
                c.get("closing", "big")
            outcome.append("all read")
        except ClientClosed as exc:
            outcome.append(exc)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    started.wait(10)
    import time
    time.sleep(0.3)
    c.close()
    t.join(30)
    assert not t.is_alive(), "a call in another thread hung after close()"
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosed), outcome
    with pytest.raises(ClientClosed):
        with c:
            pass
    threads = threading.active_count()
    for _ in range(3):
        with pytest.raises((EcstoreError, OSError, TypeError)):
            SyncClient(cluster.dir / "no-such-cluster.json")
    assert threading.active_count() == threads     # no loop thread left per failed attempt
    # the cancelled call unwound on its loop before it stopped: nothing is left for the
    # garbage collector to close on this thread ("coroutine ... was never awaited", a
    # request id reset "in a different Context" - warnings a CI run showed)
    import gc
    gc.collect()


def test_put_takes_sync_iterators_and_says_what_it_cannot_take(cluster: LocalCluster,
                                                               tmp_path: Path) -> None:
    """A generator or a list of byte chunks streams (it failed: "'async for' requires an
    object with __aiter__"); a text-mode file, str chunks or another type is a TypeError
    saying so, and nothing is stored."""
    import os

    from store.client import SyncClient
    from store.errors import NotFound
    big = os.urandom(9 * 1024 * 1024 + 7)        # more than two 4 MiB segments
    with SyncClient(cluster.path) as c:
        c.create_bucket("sources")
        c.put("sources", "gen", (big[i:i + 1_000_000] for i in range(0, len(big), 1_000_000)))
        assert c.get("sources", "gen") == big
        c.put("sources", "list", [b"ab", b"", b"cd"])
        assert c.get("sources", "list") == b"abcd"
        text = tmp_path / "t.txt"
        text.write_text("hello")
        with open(text) as f, pytest.raises(TypeError, match="text mode"):
            c.put("sources", "text", f)
        with pytest.raises(TypeError, match="iterator of str"):
            c.put("sources", "strs", iter(["a", "b"]))
        with pytest.raises(TypeError, match="expected bytes, a path"):
            c.put("sources", "int", 42)
        for key in ("text", "strs", "int"):
            with pytest.raises(NotFound):
                c.head("sources", key)
