"""The client's segment cache, read-ahead and request coalescing, against real nodes.

The counts asserted are of what reached the cluster (the client counts every segment it
fetched and every fragment GET it sent), not timings.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from store.cache import SegmentCache
from store.client import Client, SyncClient

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
SEG = 4 * MiB


@pytest.fixture(scope="module")
def data(client: SyncClient) -> dict[str, bytes]:
    client.create_bucket("cache")
    objs = {"three": os.urandom(3 * SEG - 1000), "five": os.urandom(5 * SEG)}
    for k, v in objs.items():
        client.put("cache", k, v)
    return objs


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_second_read_comes_from_the_cache_and_survives_a_restart(
        cluster: LocalCluster, data: dict[str, bytes], tmp_path: Path) -> None:
    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path) as c:
            assert await c.get("cache", "three") == data["three"]
            assert c.read_stats["segments_fetched"] == 3
            gets = c.read_stats["fragment_gets"]
            assert await c.get("cache", "three") == data["three"]
            assert c.read_stats["fragment_gets"] == gets  # nothing reached the cluster
            assert c.read_stats["cache_hits"] == 3
        async with Client.connect(cluster.path, cache_dir=tmp_path) as again:  # a restart
            assert await again.get("cache", "three", 5, SEG + 7) == data["three"][5:SEG + 8]
            assert again.read_stats["fragment_gets"] == 0
    run(go())


def test_a_sync_client_has_the_read_stats_the_readme_shows(cluster: LocalCluster,
                                                          data: dict[str, bytes],
                                                          tmp_path: Path) -> None:
    """README's local-cache example makes a SyncClient and reads `client.read_stats`."""
    with SyncClient(cluster.path, cache_dir=tmp_path) as c:
        assert c.get("cache", "three") == data["three"]
        assert c.get("cache", "three") == data["three"]
        assert c.read_stats["segments_fetched"] == 3 and c.read_stats["cache_hits"] == 3


def test_a_segment_read_in_place_is_shared_read_only(cluster: LocalCluster,
                                                     data: dict[str, bytes], tmp_path: Path) -> None:
    """A segment read in place (its data fragments straight into one buffer) is handed to
    every reader that joined its fetch, and to the disk cache: read-only, so no reader
    can change what the others and the cache get."""
    obj = data["three"]

    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path) as c:
            rec = await c.live_record("cache", "three")

            async def first() -> bytes | memoryview:
                return await anext(c.get_stream("cache", "three", 0, SEG - 1, record=rec))
            parts = await asyncio.gather(*(first() for _ in range(4)))
            assert c.read_stats["segments_fetched"] == 1 and c.read_stats["coalesced"] == 3
            for part in parts:
                assert isinstance(part, memoryview) and part.readonly
                assert part.obj is parts[0].obj          # one buffer, shared
                with pytest.raises(TypeError):
                    part[0] = part[0] ^ 0xFF             # type: ignore[index]
                assert part == obj[:SEG]
            whole = await c.get("cache", "three")
            assert type(whole) is bytes and whole == obj  # get gives bytes, as always
        async with Client.connect(cluster.path, cache_dir=tmp_path) as again:
            assert await again.get("cache", "three", 0, SEG - 1) == obj[:SEG]
            assert again.read_stats["fragment_gets"] == 0   # from the cache, intact
    run(go())


def test_an_overwritten_object_is_never_served_stale(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path) as c:
            old, new = os.urandom(SEG + 10), os.urandom(SEG + 10)
            await c.put("cache", "changing", old)
            assert await c.get("cache", "changing") == old
            await c.put("cache", "changing", new)
            assert await c.get("cache", "changing") == new
    run(go())


def test_a_damaged_cache_file_is_refetched(cluster: LocalCluster, data: dict[str, bytes],
                                           tmp_path: Path) -> None:
    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path) as c:
            await c.get("cache", "three")
            files = sorted((tmp_path / "segments").iterdir())
            assert len(files) == 3
            raw = bytearray(files[1].read_bytes())
            raw[len(raw) // 2] ^= 0x40
            files[1].write_bytes(bytes(raw))
            fetched = c.read_stats["segments_fetched"]
            assert await c.get("cache", "three") == data["three"]
            assert c.read_stats["segments_fetched"] == fetched + 1
            assert c.cache is not None and c.cache.corrupt == 1
    run(go())


def test_least_recently_used_segments_are_evicted(cluster: LocalCluster,
                                                  data: dict[str, bytes],
                                                  tmp_path: Path) -> None:
    limit = 3 * SEG + 3 * 64

    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path, cache_max_bytes=limit) as c:
            three = (await c.head("cache", "three")).version_id
            five = (await c.head("cache", "five")).version_id
            await c.get("cache", "three", 0, 10)                  # segment 0 of three
            await asyncio.sleep(0.05)
            assert await c.get("cache", "five") == data["five"]   # five more segments
            files = list((tmp_path / "segments").iterdir())
            assert sum(f.stat().st_size for f in files) <= limit
            names = {f.name for f in files}
            assert f"{three}.0" not in names                      # the oldest went first
            # the newest stayed (which of five's segments are newest depends on the order
            # the read-ahead finished them: the LRU order itself is tested below)
            assert len(names) >= 2 and all(n.startswith(five) for n in names)
    run(go())


def test_concurrent_reads_of_one_segment_are_one_fetch(cluster: LocalCluster,
                                                       data: dict[str, bytes]) -> None:
    """16 tasks of one process read the same segment at once, no disk cache: it is
    fetched once and shared. (Whole-object streams are not used here: a stream asks for its
    third segment only once it has passed its first, and by then the fastest stream's fetch
    of it may be over - that read then fetches again, correctly: coalescing joins fetches
    in flight, a cache keeps what is done.)"""
    obj = data["three"]

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            # the record read first: each read's first wait is then its segment
            rec = await c.live_record("cache", "three")

            async def read(lo: int | None = None, hi: int | None = None) -> bytes:
                return b"".join([bytes(p) async for p in
                                 c.get_stream("cache", "three", lo, hi, record=rec)])
            for seg in range(3):
                lo, hi = seg * SEG, min(len(obj), (seg + 1) * SEG) - 1
                outs = await asyncio.gather(*(read(lo, hi) for _ in range(16)))
                assert all(o == obj[lo:hi + 1] for o in outs)
            assert c.read_stats["segments_fetched"] == 3
            assert c.read_stats["coalesced"] == 15 * 3
            assert c.read_stats["fragment_gets"] <= 3 * 6
            # whole-object streams at once: every read of a segment either fetches it or
            # joins a fetch in flight; all 16 start on segment 0 together (each stream's
            # first segment waits for a slot, 32 of them), so at least its 15 joins
            c.read_stats.update(segments_fetched=0, coalesced=0)
            outs = await asyncio.gather(*(read() for _ in range(16)))
            assert all(o == obj for o in outs)
            stats = c.read_stats
            assert stats["segments_fetched"] + stats["coalesced"] == 16 * 3, stats
            assert stats["coalesced"] >= 15, stats
    run(go())


READER = textwrap.dedent("""
    import asyncio, hashlib, json, sys, time
    from store.client import Client
    async def main():
        async with Client.connect(sys.argv[1], cache_dir=sys.argv[2]) as c:
            await c.cluster_map()
            while time.time() < float(sys.argv[3]):
                await asyncio.sleep(0.005)
            data = await c.get("cache", "five")
            print(json.dumps({"sha": hashlib.sha256(data).hexdigest(), **c.read_stats}))
    asyncio.run(main())
""")


def test_processes_sharing_a_cache_fetch_each_segment_once(cluster: LocalCluster,
                                                           data: dict[str, bytes],
                                                           tmp_path: Path) -> None:
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", READER, str(cluster.path), str(tmp_path),
                               str(start)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    want = hashlib.sha256(data["five"]).hexdigest()
    assert all(o["sha"] == want for o in outs)
    fetched = sum(o["segments_fetched"] for o in outs)
    print(f"\n4 processes, 5 segments: fetched {fetched}, "
          f"from the cache {sum(o['cache_hits'] for o in outs)}")
    assert fetched == 5


def test_sequential_block_reads_prefetch_ahead(cluster: LocalCluster, data: dict[str, bytes],
                                               tmp_path: Path) -> None:
    """fsspec-style reads of one block at a time: from the second on, the next segments
    are fetched before they are asked for, and each segment reaches the cluster once."""
    async def go() -> None:
        async with Client.connect(cluster.path, cache_dir=tmp_path) as c:
            got = b""
            for i in range(5):
                got += await c.get("cache", "five", i * SEG, (i + 1) * SEG - 1)
                await asyncio.sleep(0.2)  # the reader's own work; prefetches run meanwhile
            assert got == data["five"]
            assert c.read_stats["prefetched"] >= 2
            assert c.read_stats["segments_fetched"] == 5
            assert c.read_stats["cache_hits"] + c.read_stats["coalesced"] >= 2
    run(go())


def test_cache_file_format_rejects_damage(tmp_path: Path) -> None:
    cache = SegmentCache(tmp_path, 10 * MiB)
    cache.put("v.0", b"abc" * 1000)
    assert cache.get("v.0") == b"abc" * 1000
    path = tmp_path / "segments" / "v.0"
    path.write_bytes(path.read_bytes()[:-1])  # truncated
    assert cache.get("v.0") is None
    assert not path.exists()
    with pytest.raises(ValueError):
        cache.get("../escape")


def test_eviction_takes_the_least_recently_used(tmp_path: Path) -> None:
    seg = 1000
    cache = SegmentCache(tmp_path, 3 * (seg + 16))   # room for three
    for i, key in enumerate(("a.0", "b.0", "c.0")):
        cache.put(key, bytes([i]) * seg)
        os.utime(tmp_path / "segments" / key, ns=(10**9 * (i + 1),) * 2)
    assert cache.get("a.0") == bytes([0]) * seg          # a hit makes "a" the newest
    cache.put("d.0", b"d" * seg)                          # over the limit: evict to 90%
    kept = sorted(p.name for p in (tmp_path / "segments").iterdir())
    assert kept == ["a.0", "d.0"]                         # b and c were used least recently


def test_the_size_limit_holds_for_every_process_sharing_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process counted the directory once, then only its own writes: four processes
    filled it to four times the limit. Each counts it again every RECOUNT_S."""
    import store.cache as cache_module
    monkeypatch.setattr(cache_module, "RECOUNT_S", 0.0)
    seg = 100_000
    caches = [SegmentCache(tmp_path, 4 * (seg + 16)) for _ in range(4)]   # room for four
    for n in range(3):
        for i, cache in enumerate(caches):
            cache.put(f"p{i}-{n}.0", bytes([i]) * seg)
    total = sum(p.stat().st_size for p in (tmp_path / "segments").iterdir())
    assert total <= 4 * (seg + 16), total


def test_a_cache_another_user_made_is_a_miss_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Files and lock files this process may not write or touch (another user's shared
    cache: EACCES, as root never sees it, so the calls are made to fail so): a cached
    segment is served, a missing one is fetched without the lock and not cached, nothing
    raises, and the log says so once."""
    import builtins
    import errno as errno_module

    import store.cache as cache_module
    cache = SegmentCache(tmp_path, 10 * MiB)
    cache.put("v.0", b"cached" * 100)
    cache.unlock(cache.try_lock("w.0") or 0)            # its lock file: the other user's
    denied = PermissionError(errno_module.EACCES, "Permission denied")
    real_os, real_open = cache_module.os, builtins.open

    class OtherUsersOs:
        def __getattr__(self, name: str) -> object:
            return getattr(real_os, name)

        def utime(self, *a: object, **kw: object) -> None:
            raise denied

        def open(self, path: object, flags: int, *a: object) -> int:
            if flags & real_os.O_RDWR:
                raise denied
            return real_os.open(path, flags, *a)

    def other_users_open(file: object, mode: str = "r", *a: object, **kw: object) -> object:
        if "w" in mode:
            raise denied
        return real_open(file, mode, *a, **kw)
    monkeypatch.setattr(cache_module, "os", OtherUsersOs())
    monkeypatch.setattr(cache_module, "open", other_users_open, raising=False)
    with caplog.at_level("WARNING", logger="ecstore.cache"):
        assert cache.get("v.0") == b"cached" * 100        # served, not touched
        assert cache.get("w.0") is None
        fd = cache.try_lock("w.0")                          # read-only: flock still works
        assert fd is not None and fd != cache_module.NO_LOCK
        cache.put("w.0", b"fetched")                        # skipped
        cache.unlock(fd)
        assert cache.get("w.0") is None
    said = [r.getMessage() for r in caplog.records]
    assert any("cannot write to it" in m for m in said) and \
        any("cannot mark its files used" in m for m in said), said
