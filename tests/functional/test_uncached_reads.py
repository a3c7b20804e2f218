"""Uncached fragment reads on a real disk (FragmentStore.read_raw/read(uncached=True):
RWF_DONTCACHE, Linux 6.14+, or a read then POSIX_FADV_DONTNEED where the kernel refuses
the flag): a fragment that was not in the page cache is read whole and is still not there
after; one that was stays there. The scrubber reads that way, and compaction copies the
records nobody was reading that way (read and written: without the flag, written plain
and dropped once synced), the others through the cache.

Where a record is comes from the store's index (record_at), which reads nothing: a read
of a volume (stored_fragments' scan) would bring pages back into the cache by itself."""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import pytest

from node import fragments, zerocopy
from node.fragments import FragmentStore
from node.scrub import Scrubber
from store.digest import digest
from tests.functional.harness import (
    cached_pages,
    dontcache_refusal,
    evict_volumes,
    refuse_dontcache,
    settle_uncached,
    whole_pages,
)

MIB = 1024 * 1024


def new_store(tmp_path: Path, **kw: int) -> FragmentStore:
    why = dontcache_refusal(tmp_path)
    if why is not None:
        pytest.skip(why)
    return FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0, **kw)


def all_pages(where: tuple[str, int, int]) -> int:
    return whole_pages(*where[1:])


def put(store: FragmentStore, fid: str, body: bytes, meta: dict[str, int] | None = None) -> None:
    store.put(fid, body, digest(body), meta or {})


def test_an_uncached_read_leaves_the_page_cache_as_it_was(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    rnd = random.Random(11)
    cold, after, warm = rnd.randbytes(MIB), rnd.randbytes(MIB), rnd.randbytes(MIB)
    put(store, "f.cold", cold, {"crc32": 1})
    put(store, "f.after", after, {"crc32": 3})
    put(store, "f.warm", warm, {"crc32": 2})
    at_cold, at_warm = store.record_at("f.cold"), store.record_at("f.warm")
    at_after = store.record_at("f.after")
    evict_volumes(store.data_dir)
    store.read("f.warm", False)                 # a reader has it in the cache
    assert cached_pages(*at_cold) == cached_pages(*at_after) == 0
    assert cached_pages(*at_warm) == all_pages(at_warm) >= 255

    got = store.read("f.cold", True, uncached=True)
    assert bytes(got.body) == cold and got.meta == {"crc32": 1}
    # what it brought in is gone, and no readahead brought in the record after it
    assert settle_uncached([at_cold, at_after]) == [0, 0]
    assert bytes(store.read("f.warm", True, uncached=True).body) == warm
    assert cached_pages(*at_warm) == all_pages(at_warm)     # what was there stays
    assert store.uncached_reads == 2

    store.read("f.cold", False)      # a plain read caches it, as before
    assert cached_pages(*at_cold) == all_pages(at_cold)


def test_the_scrubber_checks_every_fragment_without_filling_the_page_cache(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    bodies = {f"f.{i}": random.Random(i).randbytes(300_000) for i in range(6)}
    for fid, body in bodies.items():
        put(store, fid, body)
    put(store, "f.hot", b"h" * 300_000)
    at = {fid: store.record_at(fid) for fid in [*bodies, "f.hot"]}
    path, off, length = at["f.3"]
    with open(path, "r+b") as f:     # one of them damaged on the disk
        f.seek(off + length - 1)
        last = f.read(1)
        f.seek(off + length - 1)
        f.write(bytes([last[0] ^ 1]))
        f.flush()
        os.fsync(f.fileno())
    evict_volumes(store.data_dir)
    store.read("f.hot", False)
    assert [cached_pages(*at[fid]) for fid in bodies] == [0] * 6
    assert cached_pages(*at["f.hot"]) == all_pages(at["f.hot"])

    r = Scrubber(store).step(batch=100, max_bytes=1 << 30)
    assert r.checked == 7 and r.corrupt == ["f.3"] and r.pass_complete
    assert store.uncached_reads == 7
    assert settle_uncached([at[fid] for fid in bodies if fid != "f.3"]) == [0] * 5
    assert cached_pages(*at["f.hot"]) == all_pages(at["f.hot"])


@pytest.mark.parametrize("kernel", ["dontcache", "refusing"])
def test_compaction_copies_records_nobody_reads_uncached_and_the_others_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """Where the kernel refuses RWF_DONTCACHE, the cold copies are read and written plain
    and dropped from the cache after (the reads at once, the writes once synced). Pages
    are checked on the middle cold copy: the page-cache folio a copy shares with the hot
    record beside it stays, as it should, and a large folio can reach a few pages in."""
    store = new_store(tmp_path, volume_bytes=1024 * 1024)
    refused = refuse_dontcache(monkeypatch) if kernel == "refusing" else []
    bodies = {fid: random.Random(i).randbytes(100_000)
              for i, fid in enumerate(["f.cold1", "f.cold2", "f.cold3", "f.hot"])}
    for fid, body in bodies.items():
        put(store, fid, body)
    for i in range(8):                  # garbage: the volume becomes mostly dead
        put(store, f"f.junk{i}", random.Random(10 + i).randbytes(100_000))
        store.delete(f"f.junk{i}")
    old = {fid: store.record_at(fid) for fid in bodies}
    evict_volumes(store.data_dir)
    store.read("f.hot", False)
    assert cached_pages(*old["f.cold2"]) == 0

    result = store.compact()
    assert result.volumes >= 1 and result.records_moved >= 4
    new = {fid: store.record_at(fid) for fid in bodies}
    assert all(new[fid][0] != old[fid][0] for fid in bodies)
    assert store.uncached_writes == 3 and store.uncached_reads == 3
    assert refused == ([0x80] if kernel == "refusing" else [])
    assert settle_uncached([new["f.cold2"]]) == [0]
    assert cached_pages(*new["f.hot"]) == all_pages(new["f.hot"])
    assert {fid: bytes(store.read(fid, True).body) for fid in bodies} == bodies


def test_a_refused_uncached_read_drops_the_pages_it_brought_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A kernel without RWF_DONTCACHE (EOPNOTSUPP for the flag): the read succeeds as a
    plain one, then what was not cached before is dropped again (POSIX_FADV_DONTNEED);
    what was cached stays; the flag is dropped for good and that is said once."""
    if fragments.RWF_DONTCACHE is None or not zerocopy.available():
        pytest.skip("not Linux, or the page cache cannot be asked (neither cachestat nor mincore)")
    refused = refuse_dontcache(monkeypatch)
    store = FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0)
    cold, warm = random.Random(3).randbytes(MIB), random.Random(4).randbytes(MIB)
    put(store, "f.cold", cold)
    put(store, "f.warm", warm)
    at_cold, at_warm = store.record_at("f.cold"), store.record_at("f.warm")
    evict_volumes(store.data_dir)
    store.read("f.warm", False)
    assert cached_pages(*at_cold) == 0
    with caplog.at_level(logging.WARNING, logger="ecstore.fragments"):
        assert bytes(store.read("f.cold", True, uncached=True).body) == cold
        assert bytes(store.read("f.warm", True, uncached=True).body) == warm
    assert refused == [0x80]            # asked once, then the fallback
    assert store.uncached_flag == 0 and store.uncached_reads == 1   # only the cold one
    assert cached_pages(*at_cold) == 0
    assert cached_pages(*at_warm) == all_pages(at_warm)
    said = [r.getMessage() for r in caplog.records if "refused here" in r.getMessage()]
    assert len(said) == 1, said
