"""SyncClient: a Client for code that does not run an event loop."""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from store.client import Client, ObjectInfo
from store.cluster import ClusterInfo
from store.errors import ClientClosed
from store.listing import ListResult

T = TypeVar("T")
CLOSE_UNWIND_S = 5.0     # close(): at most this long for the calls it cancelled to unwind


class SyncClient:
    """Blocking wrapper for scripts and notebooks: runs a Client on a private loop thread."""

    def __init__(self, cluster: str | os.PathLike[str] | ClusterInfo | None = None,
                 **cache: Any) -> None:
        """`cache`: cache_dir and cache_max_bytes, as for Client()."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        # the calls running now (other threads'), as tasks on the loop: close() cancels
        # them, and each raises ClientClosed - stopping the loop under them left their
        # threads waiting for ever
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        try:
            self.client = Client.connect(cluster, **cache)
        except BaseException:     # a bad path or keyword: no loop thread left behind
            self._stop_loop()
            raise

    @property
    def read_stats(self) -> dict[str, int]:
        """The client's read counters (Client.read_stats): segments fetched, fragment GETs,
        coalesced reads, cache hits, segments read ahead."""
        return self.client.read_stats

    def _run(self, coro: Awaitable[T]) -> T:
        if self._loop.is_closed() or self._closing:
            if inspect.iscoroutine(coro):
                coro.close()    # never awaited: no "coroutine was never awaited" warning
            raise ClientClosed("this SyncClient is closed: make a new one")
        fut = asyncio.run_coroutine_threadsafe(self._tracked(coro), self._loop)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            if self._closing:
                raise ClientClosed("this SyncClient was closed while the call ran") from None
            raise

    async def _tracked(self, coro: Awaitable[T]) -> T:
        if self._closing:       # sent while close() ran: it runs before the loop stops
            if inspect.iscoroutine(coro):
                coro.close()
            raise ClientClosed("this SyncClient is closed: make a new one")
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            return await coro
        finally:
            self._tasks.discard(task)

    async def _shut_down(self) -> None:
        """On the loop: cancel the calls running and let them unwind (one left suspended
        when the loop stopped was closed later by the garbage collector, on another
        thread), then close the client."""
        running = set(self._tasks)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=CLOSE_UNWIND_S)
        await self.client.close()

    def close(self) -> None:
        """Close the client and stop its loop thread; a second call does nothing. Calls
        other threads are making meanwhile raise ClientClosed."""
        if self._loop.is_closed() or self._closing:
            return
        self._closing = True
        try:
            asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result()
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "SyncClient":
        if self._loop.is_closed() or self._closing:
            raise ClientClosed("this SyncClient is closed: make a new one")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_bucket(self, bucket: str) -> None:
        self._run(self.client.create_bucket(bucket))

    def delete_bucket(self, bucket: str) -> None:
        self._run(self.client.delete_bucket(bucket))

    def list_buckets(self) -> list[str]:
        return self._run(self.client.list_buckets())

    def put(self, bucket: str, key: str, source: Any, **kw: Any) -> ObjectInfo:
        return self._run(self.client.put(bucket, key, source, **kw))

    def get(self, bucket: str, key: str, start: int | None = None,
            end: int | None = None) -> bytes:
        return self._run(self.client.get(bucket, key, start, end))

    def get_stream(self, bucket: str, key: str, start: int | None = None,
                   end: int | None = None) -> Iterator[bytes | memoryview]:
        agen = self.client.get_stream(bucket, key, start, end)
        while True:
            try:
                yield self._run(anext(agen))  # type: ignore[arg-type]
            except StopAsyncIteration:
                return

    def head(self, bucket: str, key: str) -> ObjectInfo:
        return self._run(self.client.head(bucket, key))

    def delete(self, bucket: str, key: str) -> None:
        self._run(self.client.delete(bucket, key))

    def list(self, bucket: str, **kw: Any) -> ListResult:
        return self._run(self.client.list(bucket, **kw))
