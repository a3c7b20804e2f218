"""Uncached fragment writes (FragmentStore.put(uncached=True): RWF_DONTCACHE, Linux 6.14+)
on a real disk: the fragment is stored as any other - read back, found again after a
reopen - but its pages leave the page cache once written, while a plain put's stay; a
read caches it as usual; a kernel or filesystem that refuses the flag gets plain writes."""
from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from node import fragments, zerocopy
from node.fragments import FragmentStore
from node.volumes import stored_fragments
from store.digest import digest
from tests.functional.harness import (
    cached_pages,
    dontcache_refusal,
    refuse_dontcache,
    settle_uncached,
    whole_pages,
)

MIB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path) -> FragmentStore:
    why = dontcache_refusal(tmp_path)
    if why is not None:
        pytest.skip(why)
    return FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0)


def test_an_uncached_put_is_stored_and_leaves_the_page_cache(store: FragmentStore) -> None:
    rnd = random.Random(7)
    cold, warm = rnd.randbytes(MIB), rnd.randbytes(MIB)
    assert store.put("f.cold", cold, digest(cold), {"crc32": 1}, uncached=True) is False
    assert store.put("f.warm", warm, digest(warm), {"crc32": 2}) is False
    assert store.uncached_writes == 1 and store.uncached_flag == fragments.RWF_DONTCACHE

    found = stored_fragments(store.data_dir)
    assert settle_uncached([found["f.cold"]]) == [0]
    assert cached_pages(*found["f.warm"]) == whole_pages(*found["f.warm"][1:]) >= 255

    got = store.read("f.cold", False)   # from the disk, and cached as any read is
    assert bytes(got.body) == cold and got.meta == {"crc32": 1}
    assert cached_pages(*found["f.cold"]) == whole_pages(*found["f.cold"][1:])


def test_uncached_fragments_are_found_again_after_a_reopen(store: FragmentStore) -> None:
    bodies = {f"f.{i}": random.Random(i).randbytes(300_000) for i in range(4)}
    for i, (fid, body) in enumerate(bodies.items()):
        store.put(fid, body, digest(body), {"i": i}, uncached=i % 2 == 0)
    again = FragmentStore(store.data_dir, fsync=True, reserve_bytes=0)   # as a restarted node opens it
    for i, (fid, body) in enumerate(bodies.items()):
        frag = again.read(fid, True)
        assert bytes(frag.body) == body and frag.meta == {"i": i}


def test_a_refused_uncached_write_is_written_plain_and_dropped_once_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An older kernel (EOPNOTSUPP for an unknown flag) or a filesystem without it: the
    put succeeds as a plain write whose pages are dropped from the page cache once synced
    (POSIX_FADV_DONTNEED), the flag is dropped for good, and it is said once."""
    if not zerocopy.available():
        pytest.skip("the page cache cannot be asked here (neither cachestat nor mincore)")
    refused = refuse_dontcache(monkeypatch)
    store = FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0)
    bodies = [random.Random(i).randbytes(200_000) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="ecstore.fragments"):
        for i, body in enumerate(bodies):
            assert store.put(f"f.{i}", body, digest(body), {}, uncached=True) is False
    assert refused == [0x80]                 # asked once, then plain writes
    assert store.uncached_flag == 0 and store.uncached_writes == 3
    assert [cached_pages(*store.record_at(f"f.{i}")) for i in range(3)] == [0, 0, 0]
    store.put("f.plain", bodies[0], digest(bodies[0]), {})       # not asked: stays cached
    at = store.record_at("f.plain")
    assert cached_pages(*at) == whole_pages(*at[1:]) > 0
    assert [bytes(store.read(f"f.{i}", True).body) for i in range(3)] == bodies
    said = [r.getMessage() for r in caplog.records if "uncached writes refused" in r.getMessage()]
    assert len(said) == 1, said
