"""A storage node's disk failing under it (found on a real failing disk, a FUSE layer that
injected EIO under ext4): a failed fdatasync is not forgotten by a later one that returns
0, compaction keeps its sources when its copy could not be synced, and a fragment the
disk cannot read (EIO) is quarantined - counted by the scrubber, rebuilt by repair - not
answered 500 for ever. Real volumes on a real disk; the OS calls fail where injected."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from pathlib import Path

import pytest
from aiohttp import web

from node import fragments, storage, volumes
from node.fragments import FragmentStore
from node.scrub import Scrubber
from store.digest import digest
from store.errors import Corrupt, EcstoreError, NotFound, Unavailable
from store.transport import Transport
from tests.functional import harness
from tests.scrape import parse, value


def put(store: FragmentStore, fid: str, body: bytes) -> None:
    store.put(fid, body, digest(body), {"crc32": 1})


def fail_next_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next fdatasync fails with EIO and the ones after it return 0, as the kernel
    reports a writeback error once."""
    real, fail = os.fdatasync, [True]

    def fdatasync(fd: int) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError(errno.EIO, "I/O error (injected)")
        real(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)


def test_a_sync_waiting_behind_a_failed_one_fails_too(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers sync one volume: the first fdatasync fails (EIO), the kernel reports it
    to that caller only, and the second caller's own fdatasync returns 0 - which it took
    as its records being on the disk. Now every sync after a failed one fails."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    put(store, "a.0.0", b"a" * 5000)
    vol = store._volumes[max(store._volumes)]
    entered, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if not entered.is_set():
            entered.set()
            release.wait(10)
            raise OSError(errno.EIO, "I/O error (injected)")
        real(fd)      # the error was reported once: the next call returns 0
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    outcomes: dict[str, BaseException | None] = {}

    def sync(name: str) -> None:
        try:
            vol.sync()
            outcomes[name] = None
        except OSError as exc:
            outcomes[name] = exc
    first = threading.Thread(target=sync, args=("first",))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=sync, args=("second",))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert isinstance(outcomes["first"], OSError) and isinstance(outcomes["second"], OSError)
    with pytest.raises(OSError) as later:
        vol.sync()
    assert later.value.errno == errno.EIO and "earlier sync failed" in str(later.value)


def test_after_a_failed_sync_the_store_refuses_writes_and_keeps_what_it_had(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    put(store, "a.0.0", b"a" * 5000)
    fail_next_sync(monkeypatch)
    with pytest.raises(OSError):
        put(store, "b.0.0", b"b" * 5000)
    with pytest.raises(Unavailable, match="refuses writes"):
        put(store, "c.0.0", b"c" * 5000)
    with pytest.raises(Unavailable):
        store.delete("a.0.0")
    assert store.compact().volumes == 0
    assert bytes(store.read("a.0.0").body) == b"a" * 5000
    with pytest.raises(NotFound):
        store.read("b.0.0")
    assert "sync of volume" in (store.write_failure or "")


def test_compaction_keeps_its_sources_when_its_copy_cannot_be_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction copies the live records to the newest volume, syncs it, then deletes the
    old one: a failed sync (the writers' sync had taken the error, or this one gets it)
    must leave the old volume where it is."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    kept = {f"k{i}.0.0": os.urandom(6000) for i in range(4)}
    for fid, b in kept.items():
        put(store, fid, b)
    for i in range(12):
        put(store, f"gone{i}.0.0", os.urandom(6000))
        store.delete(f"gone{i}.0.0")
    before = sorted(p.name for p in (tmp_path / "volumes").glob("*.vol"))
    assert store.compactable()
    fail_next_sync(monkeypatch)   # a writer's sync takes the error; the next returns 0
    with pytest.raises(OSError):
        put(store, "late.0.0", b"x" * 6000)
    assert store.compact().volumes == 0     # it compacted (and deleted) with a 0 from sync
    assert sorted(p.name for p in (tmp_path / "volumes").glob("*.vol")) == before

    def always(fd: int) -> None:            # compaction's own sync failing
        raise OSError(errno.EIO, "I/O error (injected)")
    monkeypatch.setattr(os, "fdatasync", always)
    fresh = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    with pytest.raises(OSError):
        fresh.compact()
    assert set(before) <= {p.name for p in (tmp_path / "volumes").glob("*.vol")}
    monkeypatch.undo()
    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    assert {fid: bytes(again.read(fid).body) for fid in kept} == kept


def test_a_fragment_the_disk_cannot_read_is_quarantined_and_the_scrubber_counts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO under a record: a read answers corrupt and quarantines it (repair rebuilds it
    elsewhere), the scrubber counts it - it answered 500 on every read, the scrubber's
    pass stopped at it, and nothing ever reported it."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    for fid in ("bad.0.0", "good.0.0", "worse.0.0"):
        put(store, fid, fid.encode() * 1000)
    bad = {store.record_at(f)[1] for f in ("bad.0.0", "worse.0.0")}   # their offsets
    real_pread, real_preadv = os.pread, os.preadv

    def pread(fd: int, n: int, off: int) -> bytes:
        if off in bad:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real_pread(fd, n, off)

    def preadv(fd: int, bufs: list, off: int, *flags: int) -> int:   # type: ignore[type-arg]
        if off in bad:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real_preadv(fd, bufs, off, *flags)
    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(volumes.os, "pread", pread)
    monkeypatch.setattr(fragments.os, "pread", pread)
    with pytest.raises(Corrupt, match="could not be read"):
        store.read("bad.0.0")
    assert "bad.0.0" not in store.list("", 100)
    result = Scrubber(store).step(100)
    assert result.corrupt == ["worse.0.0"] and result.checked == 2
    assert store.list("", 100) == ["good.0.0"]
    assert set(store.quarantined_ids()) <= {"bad.0.0", "worse.0.0"}
    # a failing disk is said in status, not only counted in quarantined (a real-EIO
    # sweep: status showed the node up, no problem, after its disk failed reads)
    assert store.read_errors == 2 and store.read_error is not None
    assert "worse.0.0" in store.read_error


PAGE = 4096


class BadPages:
    """Pages of files the disk cannot read, as a failing disk behaves: a read that starts
    in one fails with EIO, one that reaches one returns the bytes before it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bad: set[tuple[int, int]] = set()    # (inode, page start)
        self.reads = 0      # reads that met a bad page
        self.errors = 0     # of them, those that failed (EIO)
        real = os.pread

        def pread(fd: int, n: int, off: int) -> bytes:
            if n > 0 and self.bad:
                ino = os.fstat(fd).st_ino
                for page in range(off - off % PAGE, off + n, PAGE):
                    if (ino, page) in self.bad:
                        self.reads += 1
                        if page <= off:
                            self.errors += 1
                            raise OSError(errno.EIO, "Input/output error (injected)")
                        n = page - off
                        break
            return real(fd, n, off)
        for mod in (os, volumes.os, fragments.os):
            monkeypatch.setattr(mod, "pread", pread)

    def add(self, path: str, offset: int) -> None:
        self.bad.add((os.stat(path).st_ino, offset - offset % PAGE))


def test_a_volume_with_an_unreadable_record_head_opens_and_is_kept_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad sector under a record's head while the node opens its volumes: the scan read
    them through mmap, and the page it could not read was a SIGBUS that killed the node at
    every start - every fragment of the disk unavailable, not just that one. Now the node
    opens, reads every other fragment, reports the damage (status), and keeps the volume
    as it is: not cut short, not appended to, not compacted."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    bodies = {f"f{i:02d}.0.0": bytes([i]) * 20_000 for i in range(24)}
    for fid, body in bodies.items():
        put(store, fid, body)
    deleted = {"f01.0.0", "f02.0.0", "f03.0.0"}    # the first volume: less than half live
    for fid in deleted:
        store.delete(fid)
    path, off, _ = store.record_at("f05.0.0")
    last_path, last_off, _ = store.record_at("f23.0.0")   # the last volume's last record
    assert path != last_path
    del store
    sizes = {p: os.path.getsize(p) for p in (path, last_path)}
    disk = BadPages(monkeypatch)
    disk.add(path, off + 10)            # f05's head, and the end of f04's body before it
    disk.add(last_path, last_off + 10)  # f23's head, and the end of f22's body

    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    assert disk.reads > 0
    assert again.unreadable == {path: PAGE, last_path: PAGE}
    headless = {"f05.0.0", "f23.0.0"}
    assert again.list("", 100) == sorted(set(bodies) - deleted - headless)
    for fid in set(bodies) - deleted - headless - {"f04.0.0", "f22.0.0"}:
        assert bytes(again.read(fid).body) == bodies[fid]
    for fid in ("f04.0.0", "f22.0.0"):     # their bodies' ends are in the bad pages
        with pytest.raises(Corrupt):
            again.read(fid)
    with pytest.raises(NotFound):
        again.read("f05.0.0")
    # the bytes after the last volume's bad page are not a crash's cut-short record:
    # nothing is cut off, and appends go to a new volume
    put(again, "new.0.0", b"n" * 20_000)
    assert again.record_at("new.0.0")[0] not in (path, last_path)
    again.compact()
    assert {p: os.path.getsize(p) for p in (path, last_path)} == sizes
    assert bytes(again.read("new.0.0").body) == b"n" * 20_000
    assert bytes(again.read("f00.0.0").body) == bodies["f00.0.0"]
    del again

    async def status(t: Transport, url: str, app: web.Application) -> None:
        got = json.loads((await t.request("GET", url, "/v1/status")).body)
        said = [p for p in got["problems"] if "could not read" in p]
        assert len(said) == 1 and "8192 bytes of 2 volume(s)" in said[0], got["problems"]
        assert path in said[0] and "ecstore repair" in said[0]
        frag = await t.request("GET", url, "/v1/fragments/f00.0.0")
        assert frag.body == bodies["f00.0.0"]
    harness.serve(tmp_path, status)


def test_compaction_leaves_a_volume_it_cannot_read_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of a volume goes bad after the node opened it: compaction's scan cannot see
    the records there, which may be live - it leaves the volume as it is (it copied out
    what it could see and deleted the volume; the live records behind the bad page were
    quarantined) and the node reports it."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    bodies = {f"f{i:02d}.0.0": bytes([i]) * 20_000 for i in range(16)}
    for fid, body in bodies.items():
        put(store, fid, body)
    for i in (0, 1, 2, 3, 4, 6, 8, 9):   # the first volume (12 records): a third live
        store.delete(f"f{i:02d}.0.0")
    path, off, _ = store.record_at("f07.0.0")
    assert store.record_at("f05.0.0")[0] == path
    BadPages(monkeypatch).add(path, off + 10)
    assert path in {v.path for v in store.compactable()}
    store.compact()
    assert os.path.exists(path) and store.unreadable == {path: PAGE}
    assert path not in {v.path for v in store.compactable()}
    assert bytes(store.read("f05.0.0").body) == bodies["f05.0.0"]
    assert store.record_at("f07.0.0")[0] == path    # not quarantined: its body reads whole


def test_a_disk_that_stops_answering_shows_in_health_status_and_metrics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung disk (a sync that does not return): the node's threads wait on it and its
    health went on answering 200 while `ecstore status` timed out and called it down.
    Now health answers 503 naming the stall (docker's health check sees it), status
    answers at once, degraded, saying why, and the age of the oldest disk operation is a
    gauge; once the disk answers again all is as before and the put completes."""
    monkeypatch.setattr(storage, "DISK_STALL_S", 0.5, raising=False)
    release = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if not release.is_set():
            release.wait(30)
        real(fd)
    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        health = await t.request("GET", url, "/v1/health")
        assert json.loads(health.body)["ok"] is True
        put = asyncio.ensure_future(t.request("PUT", url, "/v1/fragments/hung.0.0", body=b"x" * 100))
        for _ in range(100):      # bounded: 10 s
            await asyncio.sleep(0.1)
            try:
                await t.request("GET", url, "/v1/health")
            except EcstoreError as exc:
                assert exc.status == 503 and exc.details["ok"] is False
                assert "disk is not answering" in str(exc.details["problem"])
                break
        else:
            raise AssertionError("health never said the disk stalled")
        assert not put.done()
        got = await asyncio.wait_for(t.request("GET", url, "/v1/status"), 3)
        st = json.loads(got.body)
        assert any("disk is not answering" in p for p in st["problems"]), st
        page = (await t.request("GET", url, "/metrics")).body.decode()
        assert value(parse(page), "ecstore_storage_disk_oldest_op_seconds") >= 0.5
        release.set()
        assert (await asyncio.wait_for(put, 10)).status == 201
        assert (await t.request("GET", url, "/v1/fragments/hung.0.0")).body == b"x" * 100
        health = await t.request("GET", url, "/v1/health")
        assert json.loads(health.body)["ok"] is True
        st = json.loads((await t.request("GET", url, "/v1/status")).body)
        assert not any("disk" in p for p in st["problems"]), st
    try:
        harness.serve(tmp_path, body, timeout_s=60)
    finally:
        release.set()


def test_a_volume_whose_header_page_is_unreadable_is_left_and_the_node_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO on a volume's first page (its header, whose salt checks every record): the
    node raised OSError opening its volumes and could not start on that disk at all. Now
    that volume is left alone (not read, not written, its number not taken again), every
    other volume's fragments read, the status says so, and puts go to a new volume."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    bodies = {f"f{i:02d}.0.0": bytes([i]) * 20_000 for i in range(24)}
    for fid, body in bodies.items():
        put(store, fid, body)
    first, _, _ = store.record_at("f00.0.0")
    lost = {fid for fid in bodies if store.record_at(fid)[0] == first}
    assert 0 < len(lost) < len(bodies)
    del store
    size = os.path.getsize(first)
    BadPages(monkeypatch).add(first, 0)

    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    assert again.unreadable == {first: size} and again.unopened == [first]
    assert again.list("", 100) == sorted(set(bodies) - lost)
    for fid in set(bodies) - lost:
        assert bytes(again.read(fid).body) == bodies[fid]
    put(again, "new.0.0", b"n" * 20_000)
    new_path = again.record_at("new.0.0")[0]
    assert new_path != first and os.path.basename(new_path) > os.path.basename(first)
    again.compact()
    assert os.path.getsize(first) == size
    del again

    async def status(t: Transport, url: str, app: web.Application) -> None:
        got = json.loads((await t.request("GET", url, "/v1/status")).body)
        said = [p for p in got["problems"] if "could not read" in p]
        assert len(said) == 1 and first in said[0], got["problems"]
    harness.serve(tmp_path, status)


def test_a_bad_page_is_asked_for_once_per_scan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan goes on past a bad page to the next record; it asked the disk for that
    page again for every window and search that touched it (a failing disk answers each
    EIO slowly, after its retries)."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=1024 * 1024)
    for i in range(30):
        put(store, f"f{i:02d}.0.0", bytes([i]) * 5_000)
    path, off, _ = store.record_at("f10.0.0")
    del store
    disk = BadPages(monkeypatch)
    disk.add(path, off + 10)
    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=1024 * 1024)
    assert again.unreadable == {path: PAGE}
    assert disk.errors <= 2, disk.errors   # the window that met it, then the page alone


def test_a_read_only_filesystem_with_no_volumes_on_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node started on an empty data directory whose filesystem is read-only makes no
    volumes/ or quarantine/ directory: its space (status), compaction and the quarantine
    listing raised FileNotFoundError or ValueError (a 500 on every status)."""
    real = os.statvfs

    class ReadOnly:
        def __init__(self, st: os.statvfs_result) -> None:
            self.st = st

        def __getattr__(self, name: str) -> int:
            value = getattr(self.st, name)
            return int(value | os.ST_RDONLY) if name == "f_flag" else int(value)

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly(real(p)))
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    assert store.read_only and not store.vdir.exists() and not store.quarantine.exists()
    assert store.disk()["volumes"] == 0
    assert store.compactable() == [] and store.compact().volumes == 0
    assert store.quarantined_ids() == []
    with pytest.raises(Unavailable):
        put(store, "a.0.0", b"a")


def test_a_quarantine_on_a_store_that_refuses_writes_writes_nothing(tmp_path: Path) -> None:
    """Quarantine writes a tombstone; once the store refuses writes (a sync failed, the
    filesystem went read-only) it appended one all the same, or raised EROFS making a
    volume for it. Now the fragment is dropped from the index and nothing is written to
    its volumes (the copy into quarantine/ is tried, as on a full disk)."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=256 * 1024)
    put(store, "a.0.0", b"a" * 1000)
    put(store, "b.0.0", b"b" * 1000)
    store._fail_writes("an injected sync failure")
    files = {p.name: p.stat().st_size for p in store.vdir.iterdir()}
    assert store.quarantine_fragment("a.0.0") is True
    assert {p.name: p.stat().st_size for p in store.vdir.iterdir()} == files
    with pytest.raises(NotFound):
        store.read("a.0.0")
    assert bytes(store.read("b.0.0").body) == b"b" * 1000


def test_status_of_a_busy_node_whose_disk_answers_is_not_a_stall(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Status read the disk's statistics in the pool the requests' reads and writes use:
    with every thread of it busy (a burst on a slow but working disk) for over
    STATUS_DISK_TIMEOUT_S, it said "the disk is not answering" of a disk that answers."""
    monkeypatch.setattr(storage, "STATUS_DISK_TIMEOUT_S", 0.5)

    async def body(t: Transport, url: str, app: web.Application) -> None:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        busy = [loop.run_in_executor(None, release.wait, 10) for _ in range(64)]
        try:
            await asyncio.sleep(0.1)
            st = json.loads((await asyncio.wait_for(t.request("GET", url, "/v1/status"),
                                                    5)).body)
            assert not any("not answering" in p for p in st["problems"]), st
            assert st["disk_free_bytes"] > 0 and st["volumes"] >= 1
        finally:
            release.set()
            await asyncio.gather(*busy)
    harness.serve(tmp_path, body)


def test_a_put_after_the_newest_volume_went_unread_outranks_what_it_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest volume's header unreadable at a start: the next seq came from the
    volumes read only, lower than the seqs of the records in the unread one. A fragment
    deleted there (its tombstone unread: it is back), put again and acknowledged, was
    NotFound once the volume read again (an EIO that passes, a sector remapped) - the old
    tombstone outranked the new put. Compaction meanwhile may not drop a tombstone an
    unread volume's record may need."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    put(store, "x.0.0", b"old" * 1000)
    put(store, "y.0.0", b"y" * 1000)
    for i in range(8):                                  # on to a later volume
        put(store, f"f{i}.0.0", bytes([i]) * 20_000)
    store.delete("x.0.0")                               # its tombstone in the newest volume
    x_volume = store.record_at("y.0.0")[0]
    newest = store.record_at("f7.0.0")[0]
    assert x_volume != newest
    del store
    disk = BadPages(monkeypatch)
    disk.add(newest, 0)

    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    assert again.unopened == [newest]
    assert bytes(again.read("x.0.0").body) == b"old" * 1000    # its tombstone is unread
    put(again, "x.0.0", b"new" * 1000)                          # acknowledged
    again.delete("y.0.0")
    for v in again.compactable():                               # y's volume, a tombstone
        assert v.path != newest
    again.compact()
    del again

    disk.bad.clear()                                            # the disk reads it again
    healed = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    assert healed.unopened == [] and healed.unreadable == {}
    assert bytes(healed.read("x.0.0").body) == b"new" * 1000
    with pytest.raises(NotFound):
        healed.read("y.0.0")


def test_compaction_keeps_tombstones_while_a_volume_is_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tombstone is dropped by compaction once no other volume can hold an older record
    of its fragment - judged from the volumes opened. An older volume left unread (its
    header page unreadable) holds one: the tombstone was dropped, and the deleted
    fragment was back once that volume read again."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    put(store, "z.0.0", b"z" * 1000)
    first = store.record_at("z.0.0")[0]

    def fill(store: FragmentStore, prefix: str, volume: str) -> list[str]:
        """Puts until one lands after `volume`; their ids, that one last."""
        fids: list[str] = []
        for n in range(10):   # bounded: three fit in a volume
            fids.append(f"{prefix}{n}.0.0")
            put(store, fids[-1], b"f" * 20_000)
            if store.record_at(fids[-1])[0] != volume:
                return fids
        raise AssertionError("no new volume")
    second = store.record_at(fill(store, "a", first)[-1])[0]
    store.delete("z.0.0")                               # its tombstone in volume 2
    for fid in fill(store, "b", second)[:-1]:                  # volume 2 left mostly dead
        store.delete(fid)
    del store
    disk = BadPages(monkeypatch)
    disk.add(first, 0)
    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    assert again.unopened == [first]
    assert second in {v.path for v in again.compactable()}
    again.compact()
    assert not os.path.exists(second)
    del again
    disk.bad.clear()
    healed = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=64 * 1024)
    with pytest.raises(NotFound):
        healed.read("z.0.0")


def test_status_names_fragments_the_disk_could_not_read(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """After reads failed with EIO (the fragments quarantined) a storage node's status
    was up with no problem: only the quarantined count hinted at a failing disk."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    put(store, "bad.0.0", b"b" * 40_000)
    put(store, "ok.0.0", b"k" * 40_000)
    path, off, _ = store.record_at("bad.0.0")
    del store

    async def body(t: Transport, url: str, app: web.Application) -> None:
        st = json.loads((await t.request("GET", url, "/v1/status")).body)
        assert st["problems"] == [], st
        BadPages(monkeypatch).add(path, off)
        with pytest.raises(Corrupt):    # a GET's read when its record is not cached
            await asyncio.to_thread(app[storage.STORE].read, "bad.0.0", False)
        st = json.loads((await t.request("GET", url, "/v1/status")).body)
        [said] = st["problems"]
        assert said.startswith("the disk could not read 1 fragment(s) since start (EIO)")
        assert "bad.0.0" in said and "ecstore repair" in said
        monkeypatch.setattr(storage, "READ_ERROR_SHOWN_S", 0.0)
        await asyncio.sleep(0.01)
        assert json.loads((await t.request("GET", url, "/v1/status")).body)["problems"] == []
    harness.serve(tmp_path, body)


def test_a_bad_page_inside_a_fragment_body_reads_as_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk returns the bytes before a sector it cannot read and the error on the next
    read; a read that came back short was taken for the file's end and the rest padded
    with zeros - a fragment with a bad page in mid-body was served (unverified, as GETs
    are) with zeros in it, and only the client's check and a /verify round trip found it
    (real EIO through FUSE, the twenty-fifth session's sweep). Now the read goes on to
    the error: corrupt, quarantined, as for a bad first page."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0)
    put(store, "mid.0.0", b"m" * 40_000)
    put(store, "ok.0.0", b"k" * 40_000)
    path, off, length = store.record_at("mid.0.0")
    bad = off + length // 2
    assert bad // PAGE > off // PAGE        # not the record's first page
    BadPages(monkeypatch).add(path, bad)
    with pytest.raises(Corrupt, match="could not be read"):
        store.read("mid.0.0", False)
    assert "mid.0.0" in store.quarantined_ids()
    assert bytes(store.read("ok.0.0", False).body) == b"k" * 40_000


def test_a_put_after_the_newest_volume_lost_pages_outranks_their_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad pages at the end of the newest volume at a start (not its header): the next seq
    came from the records read, and a tombstone in those pages (a quarantine's) could tie
    with or outrank the fragment's rebuilt copy put since, acknowledged - gone once the
    disk read the pages again (real EIO through FUSE, the twenty-fifth session's sweep)."""
    store = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=1024 * 1024)
    for i in range(6):
        put(store, f"f{i}.0.0", bytes([i]) * 9_000)
    put(store, "x.0.0", b"old" * 3000)
    path, x_off, _ = store.record_at("x.0.0")
    assert store.quarantine_fragment("x.0.0")   # its tombstone: the newest record
    end = os.path.getsize(path)
    del store
    disk = BadPages(monkeypatch)
    disk.add(path, x_off)
    disk.add(path, end - 1)
    again = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=1024 * 1024)
    assert path in again.unreadable
    put(again, "x.0.0", b"new" * 3000)          # repair rebuilds it here: acknowledged
    del again
    disk.bad.clear()
    healed = FragmentStore(tmp_path, fsync=True, reserve_bytes=0, volume_bytes=1024 * 1024)
    assert bytes(healed.read("x.0.0").body) == b"new" * 3000
    assert [bytes(healed.read(f"f{i}.0.0").body) for i in range(6)] == \
        [bytes([i]) * 9_000 for i in range(6)]
