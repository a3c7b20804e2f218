"""SyncClient: a Client for code that does not run an event loop."""
from __future__ import annotations

import asyncio
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


class SyncClient:
    """Blocking wrapper for scripts and notebooks: runs a Client on a private loop thread."""

    def __init__(self, cluster: str | os.PathLike[str] | ClusterInfo | None = None,
                 **cache: Any) -> None:
        """`cache`: cache_dir and cache_max_bytes, as for Client()."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.client = Client.connect(cluster, **cache)

    @property
    def read_stats(self) -> dict[str, int]:
        """The client's read counters (Client.read_stats): segments fetched, fragment GETs,
        coalesced reads, cache hits, segments read ahead."""
        return self.client.read_stats

    def _run(self, coro: Awaitable[T]) -> T:
        if self._loop.is_closed():
            if inspect.iscoroutine(coro):
                coro.close()    # never awaited: no "coroutine was never awaited" warning
            raise ClientClosed("this SyncClient is closed: make a new one")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the client and stop its loop thread; a second call does nothing."""
        if self._loop.is_closed():
            return
        try:
            self._run(self.client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> "SyncClient":
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
