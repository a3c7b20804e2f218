"""A storage node's fragments: the index over its volume files, and every change to them.

The files' format - volumes, records, seq numbers, how a torn record is found and
skipped - is node/volumes.py. A FragmentStore opens every volume, rebuilds the in-memory
index (fragment id -> volume, offset, length, seq) from the records' headers (the bodies
are skipped), cuts off a record a crash left unfinished at the end of the newest volume,
and moves fragment files of the earlier file-per-fragment layout into volumes. The
fragments lost with a damaged header are missing, and repair rebuilds them.

Why volumes: a file per fragment cost a file create, a rename and a directory fsync per
put; on this project's benchmark machine that was ~40% of a storage node's CPU per put
(README, Benchmark). An append plus one fdatasync (shared by concurrent puts: group
commit) is most of what is left.

A put is acknowledged after its record is written and fdatasynced (with fsync on).
Deletions are not fsynced (a deleted fragment that comes back after a crash is garbage
that gc removes, as an unlinked file whose directory was not synced was).

Space: an overwritten or deleted fragment's record stays in its volume until the volume
is compacted - once less than half of a volume that is no longer being written to is
live, its live records are copied to the newest volume (fsynced) and the file deleted
(`compact`, run by the storage node in the background). Reads hold a reference to the
volume they read, and a volume's file descriptor is closed only when the last reference
goes, so a read never races a compaction.

A fragment that fails its checksum (found by a read or by the scrubber, node/scrub.py) is
quarantined: its record is copied to quarantine/ under its id (`{fid}~{ns}` if that name
is taken) and a tombstone written, so it is never served again and no longer listed, and
repair sees it missing.
"""
from __future__ import annotations

import bisect
import builtins
import contextlib
import errno
import functools
import itertools
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from node import zerocopy
from node.disk import ErrorTally, default_reserve_bytes, disk_space
from node.volumes import (
    FRAGMENT_ID_RE,
    MAX_HEADER_BYTES,
    RECORD_MAGIC,
    RECORD_PREFIX,
    UNREADABLE_ERRNOS,
    VOLUME_HEADER,
    VOLUME_MAGIC,
    Fragment,
    Loc,
    Volume,
    check_fragment_id,
    fsync_dir,
    loc_length,
    loc_off,
    loc_seq,
    loc_vid,
    make_loc,
    open_volume,
    parse_fragment,
    parse_record_head,
    pread_padded,
    record_crc_ok,
    records_in_tail,
    scan_records,
)
from store.alloc import unfilled
from store.digest import matches as digest_matches
from store.errors import BadRequest, Corrupt, InsufficientStorage, NotFound, Unavailable
from store.wire import pack

log = logging.getLogger("ecstore.fragments")
lifecycle_log = logging.getLogger("ecstore.lifecycle")   # shown whatever the log level
P = ParamSpec("P")
T = TypeVar("T")

CACHED_HEAD_BYTES = 1024         # read first for a cached body: most headers are ~200 bytes
QUARANTINE_SEPARATOR = "~"  # never in a fragment id: `{fid}~{ns}` for a second copy
DEFAULT_VOLUME_BYTES = 1024 ** 3           # a volume takes no new records past this size
COMPACT_LIVE_FRACTION = 0.5                # compact a full volume once less is live
COMPACT_FREE_MARGIN_BYTES = 64 * 1024     # free space a compaction needs past its copies
MIGRATE_BATCH_BYTES = 256 * 1024 ** 2      # old fragment files moved per sync
LIST_SNAPSHOT_S = 60.0                     # a listing's sorted ids are reused this long
DROP_BACK_BYTES = 2 * 1024 ** 2            # the largest page-cache folio (drop_written)
_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
# Linux 6.14's uncached buffered I/O (include/uapi/linux/fs.h; Python 3.11's os module
# predates it): the pages a write dirties are written back and dropped from the page cache
# as it completes, the pages a read brings in are dropped once copied - instead of staying
# there and pushing out what readers use. Pages cached before stay cached.
RWF_DONTCACHE: int | None = getattr(os, "RWF_DONTCACHE", 0x80) if sys.platform == "linux" else None


class CachedBody(NamedTuple):
    """A fragment's body in a volume file, in the page cache (FragmentStore.cached_body):
    holding `vol` keeps its file open."""
    vol: Volume
    checksum: str
    meta: dict[str, Any]
    offset: int
    length: int


class Written(NamedTuple):
    """A record appended by FragmentStore.write_record, not yet in the index."""
    fid: str
    vol: "Volume"
    off: int
    length: int
    seq: int
    drop: bool = False   # asked uncached, written plain: dropped from the cache once synced



class DiskOps:
    """The store's disk operations in flight (record reads and writes, syncs, deletes,
    the disk's statistics) and when each started: a disk that stops answering - a hung
    device, a dead network filesystem - shows as the age of the oldest, while the
    threads waiting on it fill up and nothing else would say why (the node's health
    and status answer from here without touching the disk). No lock: a dict's item set
    and delete, and list() of its values, are each one step under the GIL (~0.5 us an
    operation; a lock and a context manager took 4-5)."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}     # token -> time.monotonic() at its start
        self.tokens = itertools.count()

    def oldest_s(self) -> float:
        """How long the oldest operation in flight has been running (0: none)."""
        first = min(list(self.started.values()), default=None)
        return 0.0 if first is None else time.monotonic() - first

    def in_flight(self) -> int:
        return len(self.started)


def disk_op(fn: Callable[Concatenate["FragmentStore", P], T]
            ) -> Callable[Concatenate["FragmentStore", P], T]:
    """A FragmentStore method that waits on the disk: counted in its DiskOps."""
    @functools.wraps(fn)
    def run(self: "FragmentStore", *args: P.args, **kwargs: P.kwargs) -> T:
        ops = self.ops
        token = next(ops.tokens)
        ops.started[token] = time.monotonic()
        try:
            return fn(self, *args, **kwargs)
        finally:
            del ops.started[token]
    return run


# how far past what the unread newest volumes could hold a store's next seq goes
UNOPENED_SEQ_MARGIN = 1 << 32


@dataclass
class CompactResult:
    volumes: int = 0
    records_moved: int = 0
    bytes_moved: int = 0
    bytes_freed: int = 0


class FragmentStore:
    """Blocking file operations; the server calls them from a thread pool (read_cached
    excepted: it never waits for the disk)."""

    def __init__(self, data_dir: Path, fsync: bool = True,
                 reserve_bytes: int | None = None,
                 volume_bytes: int = DEFAULT_VOLUME_BYTES) -> None:
        self.data_dir = Path(data_dir)
        self.ops = DiskOps()
        self.vdir = self.data_dir / "volumes"
        self.quarantine = self.data_dir / "quarantine"
        self.fsync = fsync
        self.volume_bytes = volume_bytes
        self.data_dir.mkdir(parents=True, exist_ok=True)   # as a control node makes its own
        # a filesystem mounted (or remounted, after errors: ext4's errors=remount-ro)
        # read-only: the volumes are opened for reading and served, writes refused
        self.read_only = bool(os.statvfs(self.data_dir).f_flag & os.ST_RDONLY)
        self.reserve_bytes = (default_reserve_bytes(self.data_dir) if reserve_bytes is None
                              else reserve_bytes)
        # the volume still appended to is compacted once it holds this much: a quarter
        # volume, or an eighth of a disk too small for that (it would never compact)
        self.compact_active_bytes = min(volume_bytes // 4,
                                        disk_space(self.data_dir)["disk_total_bytes"] // 8)
        for d in (self.vdir, self.quarantine):
            if not (self.read_only and not d.is_dir()):
                d.mkdir(parents=True, exist_ok=True)
        # guards the index, the volumes and the counts; file I/O happens outside it
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)    # a volume's writers went to 0
        self._compact_lock = threading.Lock()
        self._index: dict[str, Loc] = {}
        self._tombs: dict[str, Loc] = {}    # the newest record of a deleted fragment
        self._volumes: dict[int, Volume] = {}
        self._listing: tuple[float, builtins.list[str]] | None = None   # (made, sorted ids)
        self._seq = 0
        self.count = self.bytes = self.quarantined = 0
        # the flag of an uncached write or read (0 once the kernel or filesystem refused
        # it: writes then go through the page cache, reads are dropped from it after), and
        # how many were written and read uncached
        self.uncached_flag = RWF_DONTCACHE or 0
        self.uncached_writes = self.uncached_reads = 0
        # why writes are refused since a volume sync or write failed (EIO, a read-only
        # filesystem): nothing written after that may be called durable - until a restart
        self.write_failure: str | None = None
        # why the last compaction could not start (no compactable volume's live records
        # fit in the free space), None when it could: for status
        self.compaction_blocked: str | None = None
        self.compaction_errors = ErrorTally()   # compactions that failed (storage.compact_loop)
        # fragments refused because the reserve would not stay free after them: status
        # said `up` while free space was between the reserve and the reserve plus a fragment
        self.full_refusals = ErrorTally()
        if self.read_only:
            self.write_failure = (f"its filesystem ({self.data_dir}) is mounted read-only - "
                                  "an error may have made the kernel remount it so; fragments "
                                  "are served, not stored")
        # volume file -> bytes of it the disk could not read (EIO) when it was scanned
        self.unreadable: dict[str, int] = {}
        # bytes the scan at open passed over in each volume: records whose heads fail
        # their checks (a flipped bit, a zeroed page), and a volume with no valid header -
        # fragments missing here, which only a repair's listing noticed (status said up,
        # and a scrub found nothing: it reads what the index holds)
        self.damaged_bytes: dict[str, int] = {}
        # fragments the disk could not read (EIO): status names them for a while
        self.eio_reads = ErrorTally()
        # volume files not opened (a header unreadable or not a volume's): compaction keeps
        # every tombstone while there are any
        self.unopened: list[str] = []
        # volumes to rewrite without their damaged bytes (a repair since the open rebuilt
        # what was in them: damage_repaired): compacted first, whatever their live share
        self._rewrite: set[int] = set()
        # this run's: a listing carries it, and a repair's word that it rebuilt what a
        # listing lacked counts only if the listing came from this run (damage_repaired)
        self.open_id = secrets.token_hex(8)
        t0 = time.monotonic()
        self.open_volumes()
        migrated = self._migrate_files()
        self.quarantined = (sum(1 for _ in self.quarantine.iterdir())
                            if self.quarantine.is_dir() else 0)
        if self.read_only:
            lifecycle_log.error("the data directory %s is on a read-only filesystem: serving "
                                "the fragments it holds, refusing writes until restarted on a "
                                "writable one", self.data_dir)
        lifecycle_log.info("opened %d fragments (%d bytes) in %d volumes in %.2f s%s",
                 self.count, self.bytes, len(self._volumes), time.monotonic() - t0,
                 f"; moved {migrated} fragment files into volumes" if migrated else "")

    @property
    def read_errors(self) -> int:
        """Fragments the disk could not read (EIO) since the start."""
        return self.eio_reads.count

    @property
    def read_error(self) -> str | None:
        """The last of them ("FID: strerror"), None if none."""
        return self.eio_reads.last

    # ---- opening --------------------------------------------------------------------
    def open_volumes(self) -> None:
        found: list[tuple[int, str]] = []
        for name in os.listdir(self.vdir) if self.vdir.is_dir() else ():
            stem, dot, ext = name.partition(".")
            if dot and ext == "vol" and stem.isdigit():
                found.append((int(stem), str(self.vdir / name)))
            elif name.endswith(".new") and not self.read_only:  # its header never reached the disk
                os.unlink(self.vdir / name)
        found.sort()
        # a volume that cannot be read keeps its number: new ones never take its name
        self._last_vid = found[-1][0] if found else 0
        self._damaged_tail = False
        # bytes of the newest volumes that were not read: volumes not opened after the
        # last one opened, and the pages of that one the disk could not read
        tail_unread: int | None = None
        for i, (vid, path) in enumerate(found):
            vol = self._scan_volume(vid, path, last=i == len(found) - 1)
            if vol is not None:
                self._volumes[vid] = vol
                tail_unread = self.unreadable.get(path)
                continue
            self.unopened.append(path)
            with contextlib.suppress(OSError):
                tail_unread = (tail_unread or 0) + os.stat(path).st_size
        if tail_unread is not None:
            # the seqs of a volume's records are below the seq any later volume was made
            # at (read from its header above); of the records the newest volumes hold
            # where they were not read nothing is known: a new record must outrank them -
            # were they readable again (an EIO that passes, a sector remapped), a tombstone
            # there of a fragment put since (a repair's rebuild of a quarantined one) would
            # win, and the acknowledged put be gone - so the next seq goes past the most
            # records those bytes could hold, and then some (seqs lost to failed writes)
            self._seq += tail_unread // RECORD_PREFIX.size + UNOPENED_SEQ_MARGIN
        for fid, loc in self._index.items():
            self._volumes[loc_vid(loc)].live_bytes += loc_length(loc)
            self.bytes += loc_length(loc)
        self.count = len(self._index)
        self._seq += 1
        if (not self._volumes or self._damaged_tail) and not self.read_only:
            self._new_volume()      # appends never go after damaged bytes

    def _scan_volume(self, vid: int, path: str, last: bool) -> Volume | None:
        try:
            vol = open_volume(vid, path, os.O_RDONLY if self.read_only else os.O_RDWR)
        except OSError as exc:
            if exc.errno not in UNREADABLE_ERRNOS:
                raise
            # its first page: no salt to check a record with, so none of it is read (a
            # node that raised here could not start on that disk at all)
            size = 0
            with contextlib.suppress(OSError):   # its inode may not read either
                size = os.stat(path).st_size
            log.error("volume %s: the disk cannot read its header (%s): left alone, not read; "
                      "its fragments are missing here until repair rebuilds them", path,
                      exc.strerror)
            self.unreadable[path] = size
            self._damaged_tail = self._damaged_tail or last
            return None
        if vol is None:
            log.error("volume %s has no valid header: left alone (its fragments are missing "
                      "here until repair rebuilds them), not read", path)
            with contextlib.suppress(OSError):
                self.damaged_bytes[path] = os.stat(path).st_size
            return None
        size = vol.end
        self._seq = max(self._seq, vol.min_seq)     # the seq it was made at, so far
        # heads only (no read-around): readahead brought every body of the volume in to
        # read its heads - a node with 2.2 GB of fragments took 31 s to open from a cold
        # cache (400 MiB read for 400 fragments, 1.6 MiB without), past `cluster up`'s wait
        records, good_end, skipped, unreadable = scan_records(vol, size, heads_only=True)
        for pos, fid, seq, deleted, length in records:
            self._apply(fid, make_loc(vid, pos, length, seq), deleted)
            vol.min_seq = min(vol.min_seq, seq)
            self._seq = max(self._seq, seq)
        if skipped:
            log.error("volume %s: skipped %d damaged bytes between records", path, skipped)
            self.damaged_bytes[path] = skipped
        if unreadable:
            # never cut short, compacted or appended to: what the disk can still read of
            # it is read; the fragments whose heads it cannot are missing here until
            # repair rebuilds them
            log.error("volume %s: the disk could not read %d bytes of it (EIO); the records "
                      "there are missing here until repair rebuilds them - the volume is "
                      "kept as it is, read, never appended to or compacted", path, unreadable)
            vol.damaged = True
            self.unreadable[path] = unreadable
            self._damaged_tail = self._damaged_tail or last
        elif good_end < size:
            if last and records_in_tail(vol, good_end, size) >= 2:
                log.error("volume %s: %d bytes at its end hold records that fail their "
                          "header check - damage (its salt?), not a crash, which cuts short one "
                          "record at most: left as it is and no longer appended to; the "
                          "fragments in those bytes are missing here until repair rebuilds "
                          "them", path, size - good_end)
                self._damaged_tail = vol.damaged = True
                self.damaged_bytes[path] = self.damaged_bytes.get(path, 0) + size - good_end
            elif last and self.read_only:
                log.warning("volume %s: %d bytes of an unfinished record at its end (left: "
                            "the filesystem is read-only)", path, size - good_end)
            elif last:  # a record cut short by a crash: appends continue after the good ones
                log.warning("volume %s: cut off %d bytes of an unfinished record",
                            path, size - good_end)
                os.ftruncate(vol.fd, good_end)
                vol.end = good_end
            else:
                log.error("volume %s: %d bytes at its end are not a whole record",
                          path, size - good_end)
        return vol

    def _apply(self, fid: str, loc: Loc, deleted: bool) -> None:
        """While opening: keep the record with the highest seq for each id."""
        cur = self._index.get(fid)
        if cur is None:
            cur = self._tombs.get(fid)
        if cur is not None and loc_seq(cur) >= loc_seq(loc):
            return
        if deleted:
            self._index.pop(fid, None)
            self._tombs[fid] = loc
        else:
            self._tombs.pop(fid, None)
            self._index[fid] = loc

    def _new_volume(self) -> Volume:
        """Make the next volume and make it the one appended to; under self._lock (or
        while opening)."""
        vid = self._last_vid = max(self._last_vid, max(self._volumes, default=0)) + 1
        final = str(self.vdir / f"{vid:08d}.vol")
        tmp = final + ".new"
        salt = os.urandom(8)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, VOLUME_HEADER.pack(VOLUME_MAGIC, salt, self._seq))
            if self.fsync:
                os.fsync(fd)
            os.rename(tmp, final)
            if self.fsync:
                fsync_dir(self.vdir)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if exc.errno == errno.ENOSPC:
                raise InsufficientStorage("no space left on device") from None
            raise
        vol = Volume(vid, final, fd, salt, self._seq, VOLUME_HEADER.size)
        self._volumes[vid] = vol
        return vol

    def _active(self, length: int) -> Volume:
        """The volume the next record of `length` bytes goes to; under self._lock."""
        vol = self._volumes[max(self._volumes)]
        if vol.end + length > self.volume_bytes and vol.end > VOLUME_HEADER.size:
            vol = self._new_volume()
        return vol

    def _migrate_files(self) -> int:
        """Move fragment files of the earlier layout (fragments/xx/{fid}) into volumes.
        Each is checked first (a damaged one goes to quarantine/); the files are deleted
        only after the volume holding their records is synced, so a crash part way
        leaves every fragment readable (perhaps twice: the newer record wins)."""
        old_root = self.data_dir / "fragments"
        if not old_root.is_dir():
            return 0
        if self.read_only:
            log.error("fragment files of the earlier layout under %s are not served: they are "
                      "moved into volumes when the node starts on a writable filesystem",
                      old_root)
            return 0
        batch: list[Path] = []
        batch_bytes = total = 0

        def commit() -> None:   # the records synced, then their files deleted
            nonlocal batch_bytes
            if self.fsync:
                for vol in list(self._volumes.values()):
                    os.fdatasync(vol.fd)
            for path in batch:
                path.unlink()
            batch.clear()
            batch_bytes = 0

        for sub in sorted(old_root.iterdir()):
            for path in sorted(sub.iterdir()) if sub.is_dir() else ():
                fid = path.name
                raw = path.read_bytes()
                try:
                    check_fragment_id(fid)
                    frag = parse_fragment(fid, raw, verify=True)
                except (Corrupt, BadRequest) as exc:
                    log.warning("not moving %s into a volume: %s", path, exc)
                    self._quarantine_bytes(fid, raw)
                else:   # the space is moved, not added: no reserve check
                    self.put(fid, frag.body, frag.checksum, frag.meta, sync=False,
                             reserve=False)
                batch.append(path)
                batch_bytes += len(raw)
                total += 1
                if batch_bytes >= MIGRATE_BATCH_BYTES:  # bounds the extra space needed
                    commit()
        commit()
        for sub in old_root.iterdir():
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            old_root.rmdir()
        tmp = self.data_dir / "tmp"        # half-written files of the earlier layout
        if tmp.is_dir():
            for leftover in tmp.iterdir():
                leftover.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                tmp.rmdir()
        return total

    # ---- writes ---------------------------------------------------------------------
    def put(self, fid: str, body: bytes | bytearray | memoryview, checksum: str,
            meta: dict[str, Any], sync: bool = True, reserve: bool = True,
            uncached: bool = False) -> bool:
        """Store a fragment whose body must hash to `checksum`; True if it replaced one.
        Durable (with fsync on) when it returns. `uncached`: as write_record."""
        w = self.write_record(fid, body, checksum, meta, reserve, uncached)
        try:
            if self.fsync and sync:
                self.sync_volume(w.vol)
        except BaseException:
            self.abandon(w)
            raise
        return self.commit_record(w)

    @disk_op
    def write_record(self, fid: str, body: bytes | bytearray | memoryview, checksum: str,
                     meta: dict[str, Any], reserve: bool = True,
                     uncached: bool = False) -> Written:
        """The first step of a put: check the fragment, append its record (not synced,
        not in the index yet). Then the caller syncs w.vol (or not) and calls
        commit_record(w), or abandon(w) if the sync failed. `uncached`: written without
        staying in the page cache where the kernel can (uncached_flag)."""
        check_fragment_id(fid)
        self.check_writable()
        if not digest_matches(body, checksum):
            raise BadRequest("body does not match its checksum (truncated or damaged upload)")
        st = os.statvfs(self.vdir)
        if reserve and st.f_bavail * st.f_frsize - len(body) < self.reserve_bytes:
            self.full_refusals.note(f"{len(body)} bytes with {st.f_bavail * st.f_frsize} free")
            raise InsufficientStorage(f"disk full: fewer than {self.reserve_bytes} bytes "
                                      "would stay free")
        with self._lock:
            seq = self._seq
            self._seq += 1
            header = pack({"fid": fid, "seq": seq, "checksum": checksum,
                           "size": len(body), "meta": meta})
            length = RECORD_PREFIX.size + len(header) + len(body)
            vol, off = self._reserve(length, seq)   # vol may be new: made after seq
        try:
            prefix = RECORD_PREFIX.pack(RECORD_MAGIC, len(header), vol.header_crc(header))
            dropped = self._write(vol, off, [prefix, header, body], length, uncached)
        except BaseException as exc:
            with self._lock:
                self._done(vol)
            if isinstance(exc, OSError) and exc.errno in (errno.EIO, errno.EROFS):
                self._fail_writes(f"a write to volume {vol.vid} failed: "
                                  f"{exc.strerror or exc} (errno {exc.errno})")
            raise
        return Written(fid, vol, off, length, seq, uncached and not dropped)

    @disk_op
    def sync_volume(self, vol: Volume) -> None:
        """vol.sync(); a failure stops every write of this store (_fail_writes)."""
        try:
            vol.sync()
        except OSError:
            self._fail_writes(f"a sync of volume {vol.vid} failed: {vol.sync_error}")
            raise

    def _fail_writes(self, why: str) -> None:
        if self.write_failure is None:
            self.write_failure = f"{why} at {time.strftime('%Y-%m-%d %H:%M:%S')}"
            log.error("writes refused from now on: %s; check the disk, then restart the "
                      "node (what it acknowledged before is on the disk)", why)

    def check_writable(self) -> None:
        """Unavailable (503: the client writes elsewhere) once a write or sync failed."""
        if self.write_failure is not None:
            raise Unavailable(f"this storage node refuses writes: {self.write_failure}; "
                              "check its disk and restart it", refuses_writes=True)

    def abandon(self, w: Written) -> None:
        """A written record that will not be committed (its sync failed)."""
        with self._lock:
            self._done(w.vol)

    def commit_record(self, w: Written) -> bool:
        """The last step of a put: the index points at the record (unless a later put or
        delete of the id finished first); True if it replaced a fragment. The write is
        done (_done) whether or not this succeeds: call it once per write_record. A
        record asked uncached and written plain (w.drop) leaves the page cache either way."""
        try:
            return self._commit_record(w)
        finally:
            if w.drop:
                self.drop_written(w.vol, w.off, w.length)

    def _commit_record(self, w: Written) -> bool:
        fid, vol, seq, length = w.fid, w.vol, w.seq, w.length
        with self._lock:
            try:
                loc = make_loc(vol.vid, w.off, length, seq)
                old = self._index.get(fid)
                if old is not None and loc_seq(old) > seq:   # a later put finished first
                    return True
                tomb = self._tombs.get(fid)
                if tomb is not None and loc_seq(tomb) > seq:     # deleted while written
                    return False
                self._tombs.pop(fid, None)
                self._index[fid] = loc
                vol.live_bytes += length
                self.bytes += length
                if old is None:
                    self.count += 1
                else:
                    self._volumes[loc_vid(old)].live_bytes -= loc_length(old)
                    self.bytes -= loc_length(old)
            finally:    # the write is done in the same locked step as the index: no gap
                self._done(vol)     # between, and done exactly once whatever happened
        return old is not None

    def drop_written(self, vol: Volume, offset: int, length: int) -> None:
        """An uncached write the kernel could not do (no RWF_DONTCACHE), once synced: its
        pages dropped from the page cache (POSIX_FADV_DONTNEED; clean pages go at once,
        dirty ones - fsync off - are only sent to the disk: best effort). The kernel
        drops only the folios wholly inside the range, and a large folio (up to 2 MiB)
        can hold the end of the record before: when that one was dropped too (the run of
        uncached records goes on), the range reaches back into it."""
        if not hasattr(os, "posix_fadvise"):
            return
        with self._lock:
            run_from, run_to = vol.dropped
            start = max(run_from, offset - DROP_BACK_BYTES) if run_to == offset else offset
            vol.dropped = (run_from if run_to == offset else offset, offset + length)
        os.posix_fadvise(vol.fd, start, offset + length - start, os.POSIX_FADV_DONTNEED)
        self.uncached_writes += 1

    def _reserve(self, length: int, seq: int) -> tuple[Volume, int]:
        """The volume and offset for a record of `length` bytes, counted among the
        volume's writers until _done; under self._lock. Compaction retires a volume only
        once its writers are done: one still writing would be left out of the copy."""
        vol = self._active(length)
        off = vol.end
        vol.end += length
        vol.min_seq = min(vol.min_seq, seq)
        vol.writers += 1
        return vol, off

    def _done(self, vol: Volume) -> None:
        """A write reserved with _reserve is finished (or failed); under self._lock."""
        vol.writers -= 1
        if vol.writers == 0:
            self._written.notify_all()

    def _write(self, vol: Volume, off: int, parts: list[Any], length: int,
               uncached: bool = False) -> bool:
        """Write a record's parts at off; a short write (the disk filling) is finished or
        fails with ENOSPC. A failed write's record is unmarked (its magic zeroed, where
        those bytes made it to the disk), so the open-time scan skips it rather than take
        a whole header over a cut-short body; reads never point at it. `uncached`: with
        uncached_flag, which is turned off for good the first time it is refused; True if
        the kernel wrote it so (else the caller drops it once synced: drop_written)."""
        try:
            written, dropped = self._pwritev(vol.fd, parts, off, uncached)
            if written < length:
                rest = memoryview(b"".join(bytes(p) for p in parts))[written:]
                while rest:
                    n = os.pwrite(vol.fd, rest, off + length - len(rest))
                    rest = rest[n:]
            return dropped
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.pwrite(vol.fd, bytes(len(RECORD_MAGIC)), off)
            if exc.errno == errno.ENOSPC:
                raise InsufficientStorage("no space left on device") from None
            raise

    def _pwritev(self, fd: int, parts: list[Any], off: int, uncached: bool) -> tuple[int, bool]:
        """Bytes written, and whether with RWF_DONTCACHE."""
        flag = self.uncached_flag if uncached else 0
        if not flag:
            return os.pwritev(fd, parts, off), False
        try:
            written = os.pwritev(fd, parts, off, flag)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._refused(exc)
            return os.pwritev(fd, parts, off), False
        self.uncached_writes += 1
        return written, True

    def _refused(self, exc: OSError) -> None:
        """RWF_DONTCACHE was refused: plain writes and reads from now on, said once (an
        older kernel, or a filesystem without it)."""
        if self.uncached_flag:
            log.warning("uncached writes refused here (%s): fragments are written through "
                        "the page cache and dropped from it once synced, and what uncached "
                        "reads bring in is dropped after", os.strerror(exc.errno or 0))
            self.uncached_flag = 0

    def _append_tombstone(self, fid: str) -> tuple[Volume, int, list[bytes], int]:
        """Reserve a tombstone for fid in the active volume; under self._lock. The caller
        writes it, then calls _done(vol)."""
        seq = self._seq
        self._seq += 1
        header = pack({"fid": fid, "seq": seq, "deleted": True})
        length = RECORD_PREFIX.size + len(header)
        vol, off = self._reserve(length, seq)
        self._tombs[fid] = make_loc(vol.vid, off, length, seq)
        prefix = RECORD_PREFIX.pack(RECORD_MAGIC, len(header), vol.header_crc(header))
        return vol, off, [prefix, header], length

    def _forget(self, fid: str, loc: Loc) -> None:
        """Drop an index entry's counts; under self._lock, after popping it."""
        self._volumes[loc_vid(loc)].live_bytes -= loc_length(loc)
        self.count -= 1
        self.bytes -= loc_length(loc)

    @disk_op
    def delete(self, fid: str) -> int:
        """Delete fid; the bytes its record held (the volume gives them back when it is
        compacted)."""
        check_fragment_id(fid)
        self.check_writable()
        with self._lock:
            loc = self._index.pop(fid, None)
            if loc is None:
                raise NotFound(f"fragment {fid} not found")
            self._forget(fid, loc)
            freed = loc_length(loc)
            vol, off, parts, length = self._append_tombstone(fid)
        try:
            self._write(vol, off, parts, length)
        except (OSError, InsufficientStorage) as exc:   # gone until a restart, then gc's
            log.error("could not write the deletion of %s: %s", fid, exc)
        finally:
            with self._lock:
                self._done(vol)
        return freed

    # ---- reads ----------------------------------------------------------------------
    def _locate(self, fid: str) -> tuple[Loc, Volume]:
        """Where fid's record is and its volume (held, its file stays open while read);
        NotFound. Without the lock: a compaction points the index at the copy before it
        drops the volume, so a volume found gone means a fresh look at the index."""
        check_fragment_id(fid)
        for _ in range(3):
            loc = self._index.get(fid)
            if loc is None:
                raise NotFound(f"fragment {fid} not found")
            vol = self._volumes.get(loc_vid(loc))
            if vol is not None:
                return loc, vol
        with self._lock:    # moved three times while we looked: very unlikely
            loc = self._index.get(fid)
            if loc is None:
                raise NotFound(f"fragment {fid} not found")
            return loc, self._volumes[loc_vid(loc)]

    def read(self, fid: str, verify: bool = True, uncached: bool = False) -> Fragment:
        """Read (and with verify, check) one fragment; NotFound, or Corrupt after
        quarantining it. `uncached`: as pread_uncached."""
        try:
            raw, loc = self.read_raw(fid, uncached)
        except Corrupt:   # the disk could not read it (EIO)
            self.quarantine_fragment(fid)
            raise
        try:
            return self.check_record(fid, raw, loc, verify)
        except Corrupt:
            self.quarantine_fragment(fid, loc)
            raise

    def check_record(self, fid: str, raw: bytes | bytearray, loc: Loc,
                     verify: bool = True) -> Fragment:
        """The fragment in a record read_raw returned; with verify, its body checked
        against its checksum and its header against the volume's CRC (a header that fails
        it would make the fragment vanish at the next restart). Corrupt if damaged."""
        frag = parse_fragment(fid, raw, verify)
        vol = self._volumes.get(loc_vid(loc)) if verify else None
        if vol is not None and not record_crc_ok(vol, raw):  # None: compacted since: moved
            raise Corrupt(f"fragment {fid}'s record header failed its CRC")
        return frag

    def read_cached(self, fid: str) -> Fragment | None:
        """The fragment, unverified, when its whole record is in the page cache - read
        with RWF_NOWAIT, which fails rather than wait for the disk, so it may run on the
        event loop and save a fragment GET its trip through the thread pool. None when it
        is not cached (or is damaged: read() in a thread then quarantines it); NotFound."""
        loc, vol = self._locate(fid)
        if _RWF_NOWAIT is None:     # not Linux: always the thread
            return None
        raw = unfilled(loc_length(loc))
        try:
            if os.preadv(vol.fd, [raw], loc_off(loc), _RWF_NOWAIT) != loc_length(loc):
                return None
        except OSError:     # EAGAIN: not cached; EOPNOTSUPP: no RWF_NOWAIT here
            return None
        try:
            return parse_fragment(fid, raw, verify=False)
        except Corrupt:
            return None

    def cached_body(self, fid: str, min_bytes: int = 0) -> CachedBody | None:
        """Where a fragment's body is, with its checksum and meta, when its whole record
        is in the page cache (node.zerocopy): for sendfile from the event loop. None when
        the record is under `min_bytes`, some of it is not cached, the kernel cannot
        tell, or the header looks damaged (read() in a thread then quarantines it);
        NotFound."""
        if not zerocopy.available():
            return None
        loc, vol = self._locate(fid)
        off, length = loc_off(loc), loc_length(loc)
        if length < min_bytes or not zerocopy.resident(vol.fd, off, length):
            return None
        head = os.pread(vol.fd, min(length, CACHED_HEAD_BYTES), off)
        if head[:4] == RECORD_MAGIC and len(head) >= RECORD_PREFIX.size:
            want = RECORD_PREFIX.size + RECORD_PREFIX.unpack_from(head)[1]
            if len(head) < want <= min(length, RECORD_PREFIX.size + MAX_HEADER_BYTES):
                head = os.pread(vol.fd, want, off)
        try:
            start, checksum, size, meta = parse_record_head(fid, head)
        except Corrupt:
            return None
        if head[:4] != RECORD_MAGIC or start + size != length:
            return None
        return CachedBody(vol, checksum, meta, off + start, size)

    @disk_op
    def read_raw(self, fid: str, uncached: bool = False) -> tuple[bytes | bytearray, Loc]:
        """A fragment's whole record, unchecked, and where it was read from (for
        quarantine_fragment); NotFound. `uncached`: as pread_uncached."""
        loc, vol = self._locate(fid)
        try:
            if uncached:
                return self.pread_uncached(vol, loc_length(loc), loc_off(loc)), loc
            return pread_padded(vol.fd, loc_length(loc), loc_off(loc)), loc
        except OSError as exc:
            if exc.errno not in UNREADABLE_ERRNOS:
                raise
            # a bad sector: the fragment is as lost as a damaged one (quarantined by
            # read() and the scrubber, rebuilt elsewhere by repair), not a 500 to retry;
            # counted for status (the disk is failing: quarantines alone did not say so)
            self.eio_reads.note(f"{fid}: {exc.strerror}")
            raise Corrupt(f"fragment {fid} could not be read: {exc.strerror} "
                          f"(errno {exc.errno})") from None

    def pread_uncached(self, vol: Volume, length: int, offset: int) -> bytes | bytearray:
        """pread_padded for a reader nobody will follow soon (the scrubber, compaction, the
        source of a repair, rebalance or tier demotion): the page cache keeps what it held
        and nothing more. Read through the volume's without_readahead, so no readahead
        brings in the records after it. With uncached_flag (RWF_DONTCACHE) the kernel drops
        the pages this read brings in; where it refuses the flag, a range that was not all
        cached before is dropped after the read (POSIX_FADV_DONTNEED: its pages that were
        cached go too - best effort), and one the kernel cannot say about is left as read."""
        with vol.without_readahead() as fd:
            return self._pread_uncached(fd, length, offset)

    def _pread_uncached(self, fd: int, length: int, offset: int) -> bytes | bytearray:
        if self.uncached_flag:
            raw = unfilled(length)
            try:
                got = os.preadv(fd, [raw], offset, self.uncached_flag)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self._refused(exc)
            else:
                if got < length:   # a bad sector ahead (EIO), or zeros past the file's end
                    raw[got:] = pread_padded(fd, length - got, offset + got)
                self.uncached_reads += 1
                return raw
        before = zerocopy.resident(fd, offset, length)
        raw_bytes = pread_padded(fd, length, offset)
        if before is False:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
            self.uncached_reads += 1
        return raw_bytes

    def record_at(self, fid: str) -> tuple[str, int, int]:
        """(volume file, offset, length) of a stored fragment's whole record, from the
        index alone - nothing read, so the page cache is left as it is (tests of it);
        NotFound."""
        loc, vol = self._locate(fid)
        return vol.path, loc_off(loc), loc_length(loc)

    def locate(self, fid: str) -> tuple[str, int, int]:
        """(volume file, offset of the body, body length) of a stored fragment: for
        tools and tests that look at the bytes on disk; NotFound."""
        loc, vol = self._locate(fid)
        head = os.pread(vol.fd, RECORD_PREFIX.size, loc_off(loc))
        _, hlen, _ = RECORD_PREFIX.unpack(head)
        body_off = loc_off(loc) + RECORD_PREFIX.size + hlen
        return vol.path, body_off, loc_off(loc) + loc_length(loc) - body_off

    # ---- quarantine -----------------------------------------------------------------
    def quarantine_fragment(self, fid: str, where: Loc | None = None) -> bool:
        """Move a fragment's record to quarantine/ and forget it; True if moved. With
        `where` (from read_raw), only the record that was read (by its seq: a compaction
        may have moved it meanwhile): if a put replaced it since (a repair), the new one
        stays. False when it is gone or was replaced. Rare, so done under the lock."""
        with self._lock:
            loc = self._index.get(fid)
            if loc is None or (where is not None and loc_seq(loc) != loc_seq(where)):
                return False
            try:
                raw = os.pread(self._volumes[loc_vid(loc)].fd, loc_length(loc), loc_off(loc))
            except OSError as exc:   # unreadable: nothing to keep a copy of
                log.error("quarantine of %s: no copy kept (%s)", fid, exc.strerror or exc)
            else:
                self._quarantine_bytes(fid, raw)
            del self._index[fid]
            self._forget(fid, loc)
            if self.write_failure is not None:
                # no tombstone: the disk takes no writes (a read-only filesystem raised
                # EROFS making a volume for one); the record is back after a restart,
                # and scrub or a read quarantines it again
                log.error("quarantine of %s: no tombstone written (%s)", fid, self.write_failure)
                return True
            vol, off, parts, length = self._append_tombstone(fid)
            try:
                self._write(vol, off, parts, length)
            except (OSError, InsufficientStorage) as exc:  # back after a restart: scrub
                log.error("could not write the quarantine of %s: %s", fid, exc)
            finally:
                self._done(vol)     # written under the lock: compaction never saw it open
        return True

    def _quarantine_bytes(self, fid: str, raw: bytes) -> None:
        """Keep a copy of a damaged record in quarantine/, for inspection. Where it cannot
        be written (a full disk) the fragment is dropped all the same - serving or listing
        a fragment known to be damaged is worse than having no copy to look at - and no
        partial file stays behind."""
        dest = self.quarantine / fid
        if dest.exists():
            dest = self.quarantine / f"{fid}{QUARANTINE_SEPARATOR}{time.time_ns()}"
        try:
            dest.write_bytes(raw)
        except OSError as exc:
            with contextlib.suppress(OSError):
                dest.unlink()
            log.error("quarantine of %s: no copy kept (%s); dropped all the same", fid,
                      exc.strerror or exc)
            return
        self.quarantined += 1

    def quarantined_ids(self) -> list[str]:
        """Sorted ids of quarantined fragments that have no good copy here again."""
        if not self.quarantine.is_dir():    # a read-only filesystem it was never made on
            return []
        ids = {n.split(QUARANTINE_SEPARATOR, 1)[0] for n in os.listdir(self.quarantine)}
        return sorted(fid for fid in ids if FRAGMENT_ID_RE.match(fid) and ".." not in fid
                      and fid not in self._index)

    # ---- listing and space ----------------------------------------------------------
    def list(self, after: str, limit: int) -> list[str]:
        """Fragment ids sorted, strictly after `after`, at most `limit`.

        Pages come from one sorted copy of the ids, made when a listing starts (`after`
        empty) or the copy is LIST_SNAPSHOT_S old: a page costs its own length, not a
        pass over every id (a whole listing of a million fragments took 21 s of CPU in
        pages of 10,000 that way). Ids deleted since the copy are left out; an id put
        since may be missing until the next copy, as it always could in a listing of
        many pages (who lists read what must exist before they list: repair)."""
        now = time.monotonic()
        snap = self._listing
        if snap is None or not after or now - snap[0] > LIST_SNAPSHOT_S:
            with self._lock:
                ids = builtins.list(self._index)
            ids.sort()
            snap = self._listing = (now, ids)
        ids = snap[1]
        out: builtins.list[str] = []
        i = bisect.bisect_right(ids, after)
        index = self._index
        while len(out) < limit and i < len(ids):
            if ids[i] in index:
                out.append(ids[i])
            i += 1
        if i >= len(ids) and self._listing is snap:
            self._listing = None    # a listing's last page: its memory back
        return out

    @disk_op
    def disk(self) -> dict[str, int]:
        st = os.statvfs(self.vdir if self.vdir.is_dir() else self.data_dir)
        with self._lock:
            size = sum(v.end for v in self._volumes.values())
        return {"disk_total_bytes": st.f_blocks * st.f_frsize,
                "disk_free_bytes": st.f_bavail * st.f_frsize,
                "volumes": len(self._volumes), "volume_bytes": size,
                "dead_bytes": max(0, size - self.bytes
                                  - VOLUME_HEADER.size * len(self._volumes))}

    def free_bytes(self) -> int:
        """Free bytes on the volumes' filesystem (an unprivileged user's)."""
        return disk_space(self.vdir)["disk_free_bytes"]

    def compactable(self) -> builtins.list[Volume]:
        """Volumes less than half live: those no longer appended to, and the one that is
        once it holds a quarter of a volume's size or an eighth of the disk, whichever is
        less (a disk that fills before its volume does gets the space of deletions back
        too; one smaller than a quarter volume would never have). And first, any volume
        to rewrite without its damaged bytes (damage_repaired)."""
        with self._lock:
            if not self._volumes:   # a read-only filesystem with none on it
                return []
            active = max(self._volumes)
            rewrite = self._rewrite
            found = [v for vid, v in sorted(self._volumes.items())
                     if (vid in rewrite and v.path not in self.unreadable)
                     or (v.live_bytes < (v.end - VOLUME_HEADER.size) * COMPACT_LIVE_FRACTION
                         and (vid != active or v.end >= self.compact_active_bytes)
                         and not v.damaged)]
        # the most space back per byte copied first: on a disk short of space the oldest
        # volume came first whatever it cost, and one whose live records did not fit was
        # tried again and again while another would have freed space for it
        return sorted(found, key=lambda v: (v.vid not in rewrite,
                                            v.live_bytes / max(1, v.end - VOLUME_HEADER.size)))

    def damage_repaired(self) -> builtins.list[str]:
        """A repair whose listing came from this run of the node (`open_id`: after its
        volumes were opened) has rebuilt the fragments lost in the bytes the open passed over
        (`damaged_bytes`): status stops naming them, and each volume holding some is
        rewritten without them (compaction, first in line: its live records copied out, the
        file deleted); a volume with no valid header, never opened, is renamed
        `NNNNNN.vol.damaged` - out of the way, kept for a look (a newer version's volume, a
        header page alone damaged), deleted by hand. Until the twenty-eighth session nothing
        took the damage away: status named it after every repair and every restart.
        Volumes the disk cannot read (EIO, `unreadable`) are not touched: the disk is
        failing. Nothing changes on a node that cannot write (read-only, a failed write):
        the damage would be found again at its next start. Returns the files cleared."""
        if self.read_only or self.write_failure is not None:
            return []
        with self._lock:
            paths = sorted(p for p in self.damaged_bytes if p not in self.unreadable)
            opened = {v.path: v for v in self._volumes.values()}
        cleared = []
        for path in paths:
            if path not in opened:
                try:
                    os.rename(path, path + ".damaged")
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.error("volume %s (no valid header): not renamed (%s); said again",
                              path, exc.strerror)
                    continue
                log.warning("volume %s had no valid header: renamed %s.damaged (a repair "
                            "since the node opened rebuilt what it held) - delete it when "
                            "you no longer want it", path, os.path.basename(path))
            with self._lock:
                self.damaged_bytes.pop(path, None)
                if path in opened:
                    self._rewrite.add(opened[path].vid)
                elif path in self.unopened:
                    self.unopened.remove(path)
            cleared.append(path)
        return cleared

    def compact(self, max_volumes: int | None = None,
                pace: Callable[[int], None] | None = None) -> CompactResult:
        """Copy the live records of compactable volumes to the newest one and delete
        them; blocking, one compaction at a time. `pace(n)` is called after each record
        of n bytes is copied (the storage node sleeps in it to hold a rate)."""
        out = CompactResult()
        if self.write_failure is not None:   # it writes; the volumes stay as they are
            return out
        with self._compact_lock:
            candidates = self.compactable()
            blocked: builtins.list[tuple[Volume, int]] = []
            done = 0
            for vol in candidates:
                if max_volumes is not None and done >= max_volumes:
                    break
                free = self.free_bytes()    # again for each: the last one freed space
                if vol.live_bytes and vol.live_bytes + COMPACT_FREE_MARGIN_BYTES > free:
                    # its copy would fail with the disk full half-way (a failed copy keeps
                    # what it copied, but the disk gets no space back from it)
                    blocked.append((vol, free))
                    continue
                done += 1
                with self._lock:
                    if vol.vid == max(self._volumes):   # appends move to a new volume
                        self._new_volume()
                    while vol.writers:   # sealed now; writes already placed in it finish
                        self._written.wait()
                self._compact_one(vol, out, pace)
            self.compaction_blocked = None
            if blocked and not done:
                v, free = min(blocked, key=lambda b: b[0].live_bytes)
                self.compaction_blocked = (
                    f"volume compaction cannot run: {len(blocked)} volume(s) wait for it "
                    f"(mostly dead bytes, or damaged bytes a repair has rebuilt), and the "
                    f"one with the fewest live bytes to copy "
                    f"({os.path.basename(v.path)}: {v.live_bytes}) needs more than the "
                    f"{free} free - their {sum(b.end - b.live_bytes for b, _ in blocked)} "
                    "dead bytes stay until space is freed (delete objects and run "
                    "`ecstore gc`, or add disk space)")
        return out

    def _compact_one(self, vol: Volume, out: CompactResult,
                     pace: Callable[[int], None] | None) -> None:
        """Copy out a sealed volume's live records and needed tombstones, then delete it.
        Which records are live is found from the volume's own record headers (read
        outside the lock, no writer is left in it), each checked against the index: the
        cost is the volume's records, not every fragment of the node under the lock. A
        live record the scan cannot see (its header damaged since it was written) is
        found by walking the index before the volume may go, and quarantined: a copy
        would give its damaged header a fresh checksum."""
        records, _, _, unreadable = scan_records(vol, vol.end, heads_only=True)
        if unreadable:  # records it cannot see may be live: the volume stays as it is
            log.error("not compacting %s: the disk could not read %d bytes of it (EIO); "
                      "kept as it is, never compacted", vol.path, unreadable)
            vol.damaged = True
            self.unreadable[vol.path] = unreadable
            self._rewrite.discard(vol.vid)   # else it came first at every try, for ever
            return
        live: builtins.list[tuple[str, Loc]] = []
        tombs: builtins.list[tuple[str, Loc]] = []
        for i in range(0, len(records), 4096):    # the lock held a few ms at a time
            with self._lock:
                self._in_volume(vol, records[i:i + 4096], live, tombs)
        moved = self._copy_out(vol, live, tombs, out, pace)
        with self._lock:
            leftover = vol.live_bytes != 0
            if leftover:
                live = [(f, loc) for f, loc in self._index.items() if loc_vid(loc) == vol.vid]
        if leftover:
            log.warning("compacting %s: %d live records with a damaged header, "
                        "quarantined", vol.path, len(live))
            for fid, loc in live:
                self.quarantine_fragment(fid, where=loc)
        with self._lock:
            if vol.live_bytes != 0:     # never expected: keep the volume, say so
                log.error("not deleting %s: %d live bytes left in it after compaction",
                          vol.path, vol.live_bytes)
                self._rewrite.discard(vol.vid)
                return
            del self._volumes[vol.vid]
            self._rewrite.discard(vol.vid)
        os.unlink(vol.path)
        out.volumes += 1
        out.bytes_freed += vol.end
        log.info("compacted volume %s: moved %d fragments and %d tombstones", vol.path,
                 sum(1 for m in moved if not m[3]), sum(1 for m in moved if m[3]))

    def _in_volume(self, vol: Volume, records: builtins.list[tuple[int, str, int, bool, int]],
                   live: builtins.list[tuple[str, Loc]],
                   tombs: builtins.list[tuple[str, Loc]]) -> None:
        """Add the records of vol (from scan_records) that the index points at to live,
        those the tombstones point at to tombs; under self._lock. (Once not pointed at, a
        record of a sealed volume never is again: it may be looked at in pieces.)"""
        for off, fid, _, deleted, _ in records:
            loc = (self._tombs if deleted else self._index).get(fid)
            if loc is not None and loc_vid(loc) == vol.vid and loc_off(loc) == off:
                (tombs if deleted else live).append((fid, loc))

    def _copy_out(self, vol: Volume, live: builtins.list[tuple[str, Loc]],
                  tombs: builtins.list[tuple[str, Loc]], out: CompactResult,
                  pace: Callable[[int], None] | None) -> builtins.list[tuple[str, Loc, Loc, bool]]:
        """Copy the live records and needed tombstones to the newest volume, synced, and
        point the index at the copies (unless replaced meanwhile); the tombstones not
        needed any more are dropped."""
        with self._lock:
            # A tombstone is kept while a volume other than this one may hold an older
            # record of its fragment (one with a lower seq); otherwise it has done its job.
            others = [v.min_seq for v in self._volumes.values() if v is not vol]
            floor = min(others, default=None)
            if self.unopened:   # volumes not read may hold older records of any fragment
                floor = -1
        work = [(f, loc, False) for f, loc in live]
        work += [(f, loc, True) for f, loc in tombs if floor is not None and floor < loc_seq(loc)]
        moved: builtins.list[tuple[str, Loc, Loc, bool]] = []
        dests: dict[int, Volume] = {}
        to_drop: builtins.list[tuple[Volume, int, int]] = []   # cold copies written plain
        try:
            self._copy_records(vol, work, moved, dests, to_drop, pace)
        except BaseException:
            # a full disk half-way (or an I/O error): the records copied so far are kept -
            # synced, the index pointed at them, their old copies dead - so the next try
            # copies only the rest; they were left as dead bytes in the newest volume,
            # more at every try, and the disk never got its space back
            if moved:
                with contextlib.suppress(Exception):
                    self._repoint(vol, moved, dests, to_drop, out)
            raise
        self._repoint(vol, moved, dests, to_drop, out)
        with self._lock:
            for fid, loc in tombs:
                if self._tombs.get(fid) == loc:     # dropped: nothing older left to hide
                    del self._tombs[fid]
        return moved

    def _copy_records(self, vol: Volume, work: builtins.list[tuple[str, Loc, bool]],
                      moved: builtins.list[tuple[str, Loc, Loc, bool]], dests: dict[int, Volume],
                      to_drop: builtins.list[tuple[Volume, int, int]],
                      pace: Callable[[int], None] | None) -> None:
        """Copy each record of `work` to the newest volume (unsynced), adding each to
        `moved`, its volume to `dests` and a cold copy's range to `to_drop`."""
        for fid, loc, deleted in work:
            # a record in the page cache (being read) is copied through it; the others,
            # read and written uncached, leave the cache as it was
            hot = zerocopy.resident(vol.fd, loc_off(loc), loc_length(loc)) is not False
            if hot:
                raw: bytes | bytearray = os.pread(vol.fd, loc_length(loc), loc_off(loc))
            else:
                raw = self.pread_uncached(vol, loc_length(loc), loc_off(loc))
            _, hlen, _ = RECORD_PREFIX.unpack_from(raw)
            header = memoryview(raw)[RECORD_PREFIX.size:RECORD_PREFIX.size + hlen]
            with self._lock:
                dest, off = self._reserve(loc_length(loc), loc_seq(loc))
            try:
                prefix = RECORD_PREFIX.pack(RECORD_MAGIC, hlen, dest.header_crc(header))
                if not self._write(dest, off, [prefix, memoryview(raw)[RECORD_PREFIX.size:]],
                                   loc_length(loc), uncached=not hot) and not hot:
                    to_drop.append((dest, off, loc_length(loc)))
            finally:
                with self._lock:
                    self._done(dest)
            new = make_loc(dest.vid, off, loc_length(loc), loc_seq(loc))
            moved.append((fid, loc, new, deleted))
            dests[dest.vid] = dest
            if pace is not None:
                pace(loc_length(loc))

    def _repoint(self, vol: Volume, moved: builtins.list[tuple[str, Loc, Loc, bool]],
                 dests: dict[int, Volume], to_drop: builtins.list[tuple[Volume, int, int]],
                 out: CompactResult) -> None:
        """Sync the copies and point the index at them (unless replaced meanwhile)."""
        if self.fsync:
            for dest in dests.values():
                self.sync_volume(dest)   # raises: the sources stay, nothing is repointed
        for dest, off, length in to_drop:
            self.drop_written(dest, off, length)
        with self._lock:
            for fid, old, new, deleted in moved:
                table = self._tombs if deleted else self._index
                if table.get(fid) == old:       # not replaced or deleted meanwhile
                    table[fid] = new
                    if not deleted:
                        vol.live_bytes -= loc_length(old)
                        dests[loc_vid(new)].live_bytes += loc_length(new)
                    out.records_moved += 1
                    out.bytes_moved += loc_length(new)
