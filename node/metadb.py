"""Metadata records in RocksDB (rocksdict, raw bytes keys).

Key layout: b"o" bucket b"\\0" key -> object record; b"b" bucket -> bucket record;
b"m" -> the cluster map; b"a" bucket b"\\0" key -> how the object is read (tiering);
b"l" bucket b"\\0" key -> the object record's listing summary: [CRC-32 of the record's
bytes, then its SUMMARY_FIELDS], written with the record in the same batch, so a listing
reads a few fields instead of decoding whole records. A summary whose CRC does not match
its record (one written by a version without summaries, or none at all) is not used: the
record is decoded instead, so a listing never depends on them. b"s" -> set once every
object record has its summary (node.control.fill_summaries, at a node's first start on a
database written before summaries; not checked again after). b"r" bucket b"\\0" key ->
the versions the object record's predecessors read, for gc (`new_notes` below).
Every record carries "ts" (ns) and "version_id"; a put keeps the newest by
(ts, version_id), so replicas converge whatever the order of arrival.

Writes go through a GroupCommit: the mutations that arrive while one synced write is
on disk are decided in order and written together as one batch with one sync, in a
thread, so the event loop never waits for the disk and N concurrent writes cost one
WAL sync, not N.

A full disk: a write that would find less than the reserve free is refused with 507
(InsufficientStorage) before RocksDB sees it. One that RocksDB still fails (the disk
filled by something else, an I/O error) leaves RocksDB refusing every later write - its
background error is sticky, and this rocksdict (0.3) has no DB::Resume() - while reads
go on; the node answers writes 507 (ENOSPC) or 503 meanwhile, and GroupCommit.recover()
reopens the database in the process once the disk takes writes again.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgpack
from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from node.disk import ErrorTally, default_reserve_bytes, disk_full_problem, disk_space, iso_utc
from store import listing
from store.errors import EcstoreError, InsufficientStorage, Unavailable
from store.listing import DELETED
from store.names import SYSTEM_BUCKETS
from store.striping import record_extents
from store.wire import pack, unpack

log = logging.getLogger("ecstore.metadb")

MAP_KEY = b"m"
SUMMARIES_KEY = b"s"   # every object record has its listing summary (see the key layout)
T = TypeVar("T")


PAST_PREFIX = listing.PAST_PREFIX.encode()   # sorts after any key character


def object_key(bucket: str, key: str) -> bytes:
    return b"o" + bucket.encode() + b"\0" + key.encode()


def access_key(bucket: str, key: str) -> bytes:
    return b"a" + bucket.encode() + b"\0" + key.encode()


# what a listing shows of a record, in a summary's and a listed row's order (after the key)
SUMMARY_FIELDS = listing.ROW_FIELDS[1:]


def summary_key(k: bytes) -> bytes:
    """The listing summary's key of an object record's key."""
    return b"l" + k[1:]


def summarize(value: bytes, record: dict[str, Any]) -> bytes:
    return pack([zlib.crc32(value), *(record.get(f) for f in SUMMARY_FIELDS)])


class SummaryCursor:
    """The listing summaries of a scan's object records, read in step with the scan by a
    second iterator (each record's summary, if any, is the next summary key after the
    previous record's: a seek only after a gap)."""

    def __init__(self, db: Rdict, start: bytes) -> None:
        # a read of it that fails makes a summary look absent: the record is read whole
        self.it = db.iter()
        self.it.seek(summary_key(start))

    def of(self, k: bytes, value: bytes) -> list[Any] | None:
        """The summary of the record `value` at `k` unpacked ([CRC, *SUMMARY_FIELDS]), or
        None when there is none or it is not this record's."""
        it, want = self.it, b"l" + k[1:]
        lk = it.key() if it.valid() else None
        if lk is not None and lk < want:   # summaries of records gone, or a seek
            it.seek(want)
            lk = it.key() if it.valid() else None
        if lk != want:
            return None
        raw = it.value()
        it.next()
        try:
            row = unpack(raw)
        except EcstoreError:
            return None
        if type(row) is not list or not row or row[0] != zlib.crc32(value):
            return None
        if len(row) == len(SUMMARY_FIELDS) + 1:
            return row
        if len(row) == len(SUMMARY_FIELDS):   # written before storage_class: its record has none
            return [*row, None]
        return None


def bucket_key(bucket: str) -> bytes:
    return b"b" + bucket.encode()


def order(record: dict[str, Any]) -> tuple[int, str]:
    return int(record["ts"]), str(record["version_id"])


# a record put dated further than this ahead of a control node's clock is noted (status,
# log, metric): its writer's clock or the node's is off (NTP keeps hosts within ms)
CLOCK_AHEAD_NOTE_S = 2.0


class MetaDB:
    """Blocking RocksDB access; every call is short (one key or one page). Reads from
    anywhere; writes only through `write` (a GroupCommit's batches).

    `reserve_bytes`: free space kept on the disk (None: 1%, at most 1 GiB); a write
    while less is free is refused with 507. `failed`: why RocksDB stopped taking writes
    (None while it takes them) - until `reopen`."""

    def __init__(self, path: Path, sync: bool = True, reserve_bytes: int | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.reserve_bytes = default_reserve_bytes(path) if reserve_bytes is None else reserve_bytes
        self.failed: str | None = None
        self.failed_at = 0.0          # when (unix s)
        self._shadow: Path | None = None   # see _open_shadowed
        # reads RocksDB failed (an I/O error: a bad sector under an SST file), and writes
        # it failed for another reason than a full disk (once reopened, such a database
        # took writes until the next one failed, and status said up in between)
        self.read_errors = ErrorTally()
        self.write_errors = ErrorTally()
        # records put dated ahead of this node's clock (note_record_date)
        self.future_records = ErrorTally()
        self._future_logged = 0.0
        try:
            self._rdict: Rdict | None = self._open()
        except Exception as exc:  # rocksdict raises Exception with RocksDB's status text
            if not (_no_space(str(exc)) or _read_only_fs(str(exc))):
                raise
            # A full disk, or a filesystem mounted read-only (ext4 remounts itself so after
            # an error, errors=remount-ro; an operator mounts it so to save what is on
            # it): RocksDB cannot open for writing (it appends to its MANIFEST), so the
            # node would not start and its replicas' reads were lost with it - until the
            # twenty-seventh session for a read-only filesystem. Read-only, it serves
            # reads; writes get 507 (full) or 503 until recover() reopens it.
            self._rdict = self._open_read_only()
            self.failed, self.failed_at = str(exc), time.time()
            log.error("metadata database opened read-only, %s: %s",
                      "its disk is full (writes refused with 507 until space is freed)"
                      if _no_space(str(exc)) else "its filesystem is read-only (writes "
                      "refused with 503 until it is mounted read-write again)", exc)
        self.reopens = 0              # times reopen() brought writes back
        self.write_opts = WriteOptions()
        self.write_opts.sync = sync
        self.lazy_opts = WriteOptions()   # advisory data (read counts): no fsync
        self.lazy_opts.sync = False
        self.listed = {"summary": 0, "record": 0}   # listed rows, by what they were read from

    def _open(self) -> Rdict:
        return Rdict(str(self.path), Options(raw_mode=True))

    def _open_read_only(self) -> Rdict:
        try:
            return Rdict(str(self.path), Options(raw_mode=True),
                         access_type=AccessType.read_only())
        except Exception as exc:  # rocksdict raises Exception with RocksDB's status text
            if not _read_only_fs(str(exc)):
                raise
            return self._open_shadowed()

    def _open_shadowed(self) -> Rdict:
        """The database opened read-only through a shadow directory on a writable disk
        (the system's temporary directory): rocksdict writes its rocksdict-config.json
        beside the database at every open, read-only ones included, so on a read-only
        filesystem no open succeeds. The shadow holds a symlink to each of the
        database's files (nothing writes them: RocksDB opened read-only, the filesystem
        read-only) and its own copy of that config file; RocksDB's info LOG is written
        there too. Removed when the database closes or reopens for writing."""
        self._drop_shadow()
        _drop_dead_shadows()
        shadow = Path(tempfile.mkdtemp(prefix=f"{SHADOW_PREFIX}{os.getpid()}-"))
        try:
            for f in self.path.iterdir():
                if f.name.startswith("LOG"):
                    continue              # RocksDB's info log: a new one in the shadow
                if f.name == "rocksdict-config.json":
                    shutil.copyfile(f, shadow / f.name)
                else:
                    (shadow / f.name).symlink_to(f)
            rdict = Rdict(str(shadow), Options(raw_mode=True),
                          access_type=AccessType.read_only())
        except BaseException:
            shutil.rmtree(shadow, ignore_errors=True)
            raise
        self._shadow = shadow
        log.warning("metadata database %s opened read-only through %s (its filesystem is "
                    "read-only)", self.path, shadow)
        return rdict

    def _drop_shadow(self) -> None:
        shadow, self._shadow = self._shadow, None
        if shadow is not None:
            shutil.rmtree(shadow, ignore_errors=True)

    @property
    def db(self) -> Rdict:
        """The open RocksDB; Unavailable (503: ask another replica) while it is being
        reopened, or stays closed because reopening failed."""
        rdict = self._rdict
        if rdict is None:
            raise Unavailable("the metadata database is closed while it reopens after a "
                              f"failed write ({self.failed or 'no error'})")
        return rdict

    @property
    def is_open(self) -> bool:
        return self._rdict is not None

    def close(self) -> None:
        rdict, self._rdict = self._rdict, None
        if rdict is not None:
            _close_quietly(rdict)
        self._drop_shadow()

    def disk(self) -> dict[str, int]:
        """{"disk_total_bytes", "disk_free_bytes", "reserve_bytes"} of the database's disk."""
        return {**disk_space(self.path), "reserve_bytes": self.reserve_bytes}

    def note_record_date(self, ts_ns: int) -> None:
        """Note a record put dated more than CLOCK_AHEAD_NOTE_S ahead of this node's
        clock. A record's ts is its writer's clock when it committed (a client's, a
        gateway's), and the newest ts wins: a writer whose clock runs ahead makes its
        puts outrank later ones from writers with a right clock - those are
        acknowledged, and not seen - until real time passes its dates. Nothing is
        refused (the record may be right and this node's clock wrong); status names it
        for RECENT_DISK_ERROR_S, the log once a minute."""
        now = time.time()
        ahead = ts_ns / 1e9 - now
        if ahead <= CLOCK_AHEAD_NOTE_S:
            return
        self.future_records.note(f"dated {ahead:.1f} s ahead", now)
        if now - self._future_logged >= 60.0:
            self._future_logged = now
            log.warning("a record put is dated %.1f s ahead of this node's clock (%d such "
                        "since start): a writer's clock (a client's or a gateway's) or this "
                        "node's is off - records are ordered by their writers' clocks, so a "
                        "later put from a right clock loses to it; check NTP on both",
                        ahead, self.future_records.count)

    def records_estimate(self) -> int | None:
        """RocksDB's estimate of the keys held (rocksdb.estimate-num-keys: overwrites
        and deletes not yet compacted counted roughly), None while closed or when it
        cannot say: for status, which notes a control node that came back empty."""
        rdict = self._rdict
        if rdict is None:
            return None
        try:
            n = rdict.property_int_value("rocksdb.estimate-num-keys")
        except Exception:  # noqa: BLE001 - a hint for status, never an error of its own
            return None
        return None if n is None else int(n)

    def read_error(self, exc: Exception) -> Unavailable:
        """What a read that RocksDB failed answers: 503 (the client asks another replica;
        it was a 500 and a traceback per request), noted for status and logged at most
        once every READ_ERROR_LOG_S."""
        errors, now = self.read_errors, time.time()
        if now - errors.last_at >= READ_ERROR_LOG_S:
            log.error("metadata database read failed: %s (%d reads failed since start; "
                      "check the disk: dmesg)", exc, errors.count + 1)
        errors.note(str(exc) or type(exc).__name__, now)
        return Unavailable(f"the metadata database could not read ({errors.last}); "
                           "another replica may")

    @property
    def read_failures(self) -> int:
        return self.read_errors.count

    def get_raw(self, k: bytes) -> bytes | None:
        """A record as stored (packed), None if absent; Unavailable when RocksDB fails
        the read."""
        try:
            raw: bytes | None = self.db.get(k)
        except EcstoreError:
            raise
        except Exception as exc:  # rocksdict raises Exception with RocksDB's status text
            raise self.read_error(exc) from None
        return raw

    def _ended(self, it: Any) -> None:
        """After an iterator stopped being valid: at the end of the keys, or because a
        read failed - which RocksDB says only through status(). A scan that stopped on
        an I/O error answered its page short, as if complete (200, no more), and a
        listing left out records."""
        try:
            it.status()
        except Exception as exc:  # rocksdict raises Exception with RocksDB's status text
            raise self.read_error(exc) from None

    def recent_problems(self) -> list[str]:
        """Reads RocksDB failed in the last RECENT_DISK_ERROR_S, and writes it failed (not
        for a full disk) in that time while it takes writes again: the words of status."""
        out = []
        if self.read_errors.recent():
            out.append(f"metadata database reads failed ({self.read_errors.summary()}); those "
                       "reads answer 503 and clients ask another replica - check the disk "
                       "(dmesg), then `ecstore repair` once it reads again")
        if self.future_records.recent():
            out.append(f"records put dated ahead of this node's clock "
                       f"({self.future_records.summary()}): a writer's clock (a client's or "
                       "a gateway's) or this node's is off, and records are ordered by their "
                       "writers' clocks - a later put from a host with a right clock loses to "
                       "them until then; check NTP (chronyc tracking, timedatectl) on the "
                       "writers and on this node")
        if self.failed is None and self.write_errors.recent():
            out.append(f"metadata database writes failed ({self.write_errors.summary()}); "
                       "reopened, it takes writes again - check the disk (dmesg)")
        return out

    def problems(self) -> list[str]:
        """Why this database refuses writes now (empty while it takes them): the words of
        the node's status."""
        out = []
        if self.failed is not None and _read_only_fs(self.failed):
            out.append(f"metadata database on a read-only filesystem since "
                       f"{iso_utc(self.failed_at)}: it serves the records it holds and "
                       "refuses writes (the other replicas take them); check the disk "
                       "(dmesg: ext4 remounts read-only after an error), then mount it "
                       "read-write - the node takes writes again within seconds - and run "
                       f"`ecstore repair` for the records it missed ({self.failed})")
        elif self.failed is not None:
            out.append(f"metadata database refuses writes since {iso_utc(self.failed_at)}: "
                       f"{self.failed} (it reopens once the disk takes writes again)")
        full = disk_full_problem(disk_space(self.path)["disk_free_bytes"], self.reserve_bytes)
        if full is not None:
            out.append(full)
        return out

    def refusal(self) -> EcstoreError:
        """The error a write gets while RocksDB refuses writes: 507 when the disk filled."""
        assert self.failed is not None
        if _no_space(self.failed):
            return InsufficientStorage(f"disk full: the metadata database stopped taking "
                                       f"writes ({self.failed}); it takes them again once "
                                       "space is freed")
        if _read_only_fs(self.failed):
            return Unavailable(f"the metadata database's filesystem is read-only "
                               f"({self.failed}): this node serves reads only; another "
                               "replica takes the write")
        return Unavailable(f"the metadata database stopped taking writes ({self.failed})")

    def reopen(self, rdict: Rdict | None) -> None:
        """Close `rdict` (the database, already detached from readers: see
        GroupCommit.recover) and open the database again, which clears RocksDB's
        background error; raises what opening raised. Then the database is opened
        read-only, if it can be, and serves reads (writes still refused: `failed` stays);
        it stayed closed, and every read answered 503 for as long as the disk failed RocksDB's
        writes but not the probe's (a real-EIO sweep: writes failing under db/ only)."""
        if rdict is not None:
            _close_quietly(rdict)   # with the error still set, its final flush fails
        try:
            self._rdict = self._open()
        except Exception:
            with contextlib.suppress(Exception):   # else closed: reads 503 until it opens
                self._rdict = self._open_read_only()
            raise
        self._drop_shadow()
        log.warning("metadata database reopened: it takes writes again (it had refused "
                    "them since %s: %s)", iso_utc(self.failed_at), self.failed)
        self.failed = None
        self.reopens += 1

    def detach(self) -> Rdict | None:
        """Take the database from readers (they get Unavailable until reopen); on the
        event loop, where they run, so none is half-way through it."""
        rdict, self._rdict = self._rdict, None
        return rdict

    def disk_takes_writes(self) -> bool:
        """Whether the disk has room past the reserve and a probe file of
        REOPEN_PROBE_BYTES can be written and synced there (a remount read-only, an
        I/O error, a quota: the probe fails)."""
        if disk_space(self.path)["disk_free_bytes"] < self.reserve_bytes + REOPEN_PROBE_BYTES:
            return False
        probe = self.path.parent / ".ecstore-write-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"\0" * REOPEN_PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(probe)

    def get(self, k: bytes) -> dict[str, Any] | None:
        raw = self.get_raw(k)
        return None if raw is None else unpack(raw)

    def write(self, writes: dict[bytes, bytes | None], sync: bool) -> None:
        """Puts (bytes) and deletes (None) as one atomic write. InsufficientStorage
        (507) when less than the reserve is free, or RocksDB failed with ENOSPC (then
        every write until reopen() fails so: its error is sticky); Unavailable for
        another failure of RocksDB."""
        if self.failed is not None:
            raise self.refusal()
        full = disk_full_problem(disk_space(self.path)["disk_free_bytes"], self.reserve_bytes)
        if full is not None:
            raise InsufficientStorage(full)
        wb = WriteBatch(raw_mode=True)
        for k, v in writes.items():
            if v is None:
                wb.delete(k)
            else:
                wb.put(k, v)
        try:
            self.db.write(wb, self.write_opts if sync else self.lazy_opts)
        except EcstoreError:
            raise
        except Exception as exc:   # rocksdict raises Exception with RocksDB's status text
            self.failed, self.failed_at = str(exc) or type(exc).__name__, time.time()
            if not _no_space(self.failed):
                self.write_errors.note(self.failed, self.failed_at)
            log.error("metadata database write failed, it refuses writes until it is "
                      "reopened: %s", self.failed)
            raise self.refusal() from None

    def scan(self, prefix: bytes, after: bytes, limit: int) -> tuple[list[tuple[bytes, dict[str, Any]]], bool]:
        """Records whose key starts with prefix and sorts after `after`, sorted."""
        it = self.db.iter()
        start = max(prefix, after + b"\0") if after else prefix
        it.seek(start)
        out: list[tuple[bytes, dict[str, Any]]] = []
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                return out, False
            if len(out) == limit:
                return out, True
            out.append((k, unpack(it.value())))
            it.next()
        self._ended(it)
        return out, False

    def replaced_in(self, prefix: bytes, after: bytes, last: bytes | None, since_ns: int
                    ) -> Iterator[tuple[bytes, list[tuple[str, int]], int]]:
        """(object key, its notes at or after since_ns, how many notes were read) beside
        every object key that starts with prefix, sorts after `after` and is at most `last`
        (None: no bound), in key order, read as they are asked for (a listing stops at its
        cut)."""
        it = self.db.iter()
        lo, hi = replaced_key(prefix), None if last is None else replaced_key(last)
        it.seek(max(lo, replaced_key(after) + b"\0") if after else lo)
        while it.valid():
            k = it.key()
            if not k.startswith(lo) or (hi is not None and k > hi):
                return
            read = notes_of(it.value())
            notes = [(v, at) for v, at in read if at >= since_ns]
            yield b"o" + k[1:], notes, len(read)
            it.next()
        self._ended(it)     # a read that failed: not a short answer taken for complete

    def scan_listed(self, prefix: bytes, after: bytes, limit: int, cut_from: int = 0,
                    delimiter: bytes = b"") -> tuple[list[list[Any]], bool, bytes]:
        """What a listing shows of the object records whose key starts with prefix and
        sorts after `after`: rows [key, *SUMMARY_FIELDS], sorted, each from the record's
        summary where that matches the record, else from the record. With a delimiter, under
        each common prefix (the key up to the first `delimiter` at or past byte
        `cut_from`) only the rows up to and including the first live one, then a seek
        past the rest of that prefix. Returns the rows, whether there are more, and the
        key to resume after (a prefix's end when the last row closed one). A prefix shows
        by its first live key on this node; the client checks across nodes that it is
        the newest version (store/listing.py)."""
        it = self.db.iter()
        start = max(prefix, listing.scan_from(after)) if after else prefix
        it.seek(start)
        summaries = SummaryCursor(self.db, start)
        out: list[list[Any]] = []
        resume = after
        listed = self.listed
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            if len(out) == limit:
                return out, True, resume
            value = it.value()
            row = summaries.of(k, value)
            if row is not None:
                row[0] = k
                listed["summary"] += 1
            else:
                record = unpack(value)
                row = [k, *(record.get(f) for f in SUMMARY_FIELDS)]
                listed["record"] += 1
            out.append(row)
            resume = k
            cut = k.find(delimiter, cut_from) if delimiter else -1
            if cut >= 0 and not row[DELETED]:
                resume = k[:cut + len(delimiter)] + PAST_PREFIX
                it.seek(listing.scan_from(resume))      # past every key under the prefix
                continue
            it.next()
        else:
            self._ended(it)
        return out, False, resume

    def unsummarized(self, after: bytes, limit: int) -> tuple[list[bytes], bytes | None]:
        """Object records after `after` (up to `limit` of them looked at) whose listing
        summary is missing or does not match: their keys, and the last key looked at
        (None: no more records)."""
        it = self.db.iter()
        start = after + b"\0" if after else b"o"
        it.seek(start)
        summaries = SummaryCursor(self.db, start)
        out: list[bytes] = []
        last: bytes | None = None
        for _ in range(limit):
            if not it.valid():
                self._ended(it)
                return out, None
            k = it.key()
            if k[:1] != b"o":
                return out, None
            if summaries.of(k, it.value()) is None:
                out.append(k)
            last = k
            it.next()
        if not it.valid():
            self._ended(it)
        return out, last if it.valid() and it.key()[:1] == b"o" else None

    def get_map(self) -> bytes | None:
        return self.get_raw(MAP_KEY)



READ_ERROR_LOG_S = 10.0        # a failing read is logged at most this often
REOPEN_PROBE_BYTES = 1024 * 1024   # written and synced before a reopen: the disk takes writes


def _no_space(message: str) -> bool:
    """Whether RocksDB's error text says the disk is full (its Status::NoSpace, ENOSPC)."""
    return "No space left on device" in message or os.strerror(errno.ENOSPC) in message


def _read_only_fs(message: str) -> bool:
    """Whether RocksDB's error text says the filesystem is read-only (EROFS)."""
    return "Read-only file system" in message or os.strerror(errno.EROFS) in message


SHADOW_PREFIX = "ecstore-metadb-ro-"   # + the node's pid + "-": MetaDB._open_shadowed


def _drop_dead_shadows() -> None:
    """Remove the read-only shadow directories of control nodes that died without
    removing theirs (killed): those whose pid no longer runs."""
    for d in Path(tempfile.gettempdir()).glob(f"{SHADOW_PREFIX}*-*"):
        pid = d.name[len(SHADOW_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:   # another user's process: alive
            pass


def _close_quietly(rdict: Rdict) -> None:
    try:
        rdict.close()     # drops the database even when its final flush fails
    except Exception as exc:  # noqa: BLE001 - a flush refused by a failed database
        log.warning("metadata database closed with an error: %s", exc)


class View:
    """What one mutation of a batch reads: the database with the writes decided before
    it in the same batch on top."""

    _ABSENT = object()

    def __init__(self, db: MetaDB) -> None:
        self.db = db
        self.staged: dict[bytes, bytes | None] = {}   # None: deleted
        self._undo: list[tuple[bytes, Any]] = []       # (key, staged value before) to roll back

    def get_raw(self, k: bytes) -> bytes | None:
        if k in self.staged:
            return self.staged[k]
        return self.db.get_raw(k)   # raw_mode: bytes already

    def get(self, k: bytes) -> dict[str, Any] | None:
        raw = self.get_raw(k)
        return None if raw is None else unpack(raw)

    def put(self, k: bytes, value: dict[str, Any] | bytes,
            record: dict[str, Any] | None = None) -> None:
        """Stage value (a dict, or packed: then `record` is it unpacked, if the caller
        has that). An object record's listing summary is staged with it."""
        packed = value if isinstance(value, bytes) else pack(value)
        self._stage(k, packed)
        if k[:1] == b"o":
            if record is None:
                record = value if isinstance(value, dict) else unpack(packed)
            self._stage(summary_key(k), summarize(packed, record))

    def summarize(self, k: bytes) -> bool:
        """Stage the listing summary of the object record at k as it is (if it is there)."""
        raw = self.get_raw(k)
        if raw is None:
            return False
        self._stage(summary_key(k), summarize(raw, unpack(raw)))
        return True

    def delete(self, k: bytes) -> None:
        self._stage(k, None)
        if k[:1] == b"o":
            self._stage(summary_key(k), None)
            self._stage(replaced_key(k), None)

    def stage(self, k: bytes, value: bytes | None) -> None:
        """Stage raw bytes at k (None: delete it) - a key beside a record, not a record."""
        self._stage(k, value)

    def _stage(self, k: bytes, value: bytes | None) -> None:
        self._undo.append((k, self.staged.get(k, self._ABSENT)))
        self.staged[k] = value

    def mark(self) -> int:
        return len(self._undo)

    def roll_back(self, mark: int) -> None:
        """Forget what was staged since `mark` (a mutation that raised)."""
        while len(self._undo) > mark:
            k, before = self._undo.pop()
            if before is self._ABSENT:
                del self.staged[k]
            else:
                self.staged[k] = before


# a mutation: reads the view, stages its writes on it, returns its result or raises
# (an EcstoreError such as Conflict: then none of its writes are kept)
Mutation = Callable[[View], T]


class _Pending(Generic[T]):
    __slots__ = ("fn", "lazy", "fut")

    def __init__(self, fn: Mutation[T], lazy: bool, fut: asyncio.Future[T]) -> None:
        self.fn, self.lazy, self.fut = fn, lazy, fut


class GroupCommit:
    """Serializes every write to a MetaDB and batches the ones that queue up.

    `await apply(fn)` returns once fn's writes are in RocksDB (synced unless `lazy`, and
    unless the MetaDB was opened without sync). One batch is on its way at a time; the
    mutations that arrive meanwhile are decided, in arrival order, against the database
    plus the writes decided before them, then written as one WriteBatch. Reads from the
    event loop see only written batches: a write is visible no earlier than it is
    acknowledged."""

    def __init__(self, db: MetaDB) -> None:
        self.db = db
        self._queue: list[_Pending[Any]] = []
        self._running = False
        self._db_lock = asyncio.Lock()   # a batch on its way, or a reopen: one at a time
        self.batches = 0
        self.mutations = 0

    async def apply(self, fn: Mutation[T], lazy: bool = False) -> T:
        return await self.submit(fn, lazy)

    def submit(self, fn: Mutation[T], lazy: bool = False) -> asyncio.Future[T]:
        """apply() without a coroutine: the future of fn's result (node.fastpath's
        record writes wait on it with a callback)."""
        fut: asyncio.Future[T] = self._enqueue([fn], lazy)[0]
        return fut

    def submit_many(self, fns: list[Mutation[Any]], lazy: bool = False
                    ) -> asyncio.Future[list[Any]]:
        """apply_many() without a coroutine: one future of every result or exception."""
        return asyncio.gather(*self._enqueue(fns, lazy), return_exceptions=True)

    async def apply_many(self, fns: list[Mutation[Any]], lazy: bool = False
                         ) -> list[Any | BaseException]:
        """apply() of each, queued together (one batch, unless one is on its way): their
        results or exceptions, in order."""
        return await self.submit_many(fns, lazy)

    def _enqueue(self, fns: list[Mutation[Any]], lazy: bool) -> list[asyncio.Future[Any]]:
        """Queue fns for the next batch (starting the drain if none is on its way)."""
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[Any]] = []
        for fn in fns:
            futs.append(loop.create_future())
            self._queue.append(_Pending(fn, lazy, futs[-1]))
        if futs and not self._running:
            self._running = True
            asyncio.ensure_future(self._drain())
        return futs

    async def drained(self) -> None:
        """Wait until every queued mutation is written (before closing the database)."""
        while self._running or self._queue:
            await asyncio.sleep(0.005)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    async with self._db_lock:
                        outcomes = await loop.run_in_executor(None, self._commit, batch)
                except BaseException as exc:  # the write itself failed: nobody's is known
                    for p in batch:
                        if not p.fut.done():
                            p.fut.set_exception(exc if isinstance(exc, Exception)
                                                else RuntimeError("write interrupted"))
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for p, (ok, value) in zip(batch, outcomes):
                    if p.fut.done():   # its request went away; the write stands anyway
                        continue
                    if ok:
                        p.fut.set_result(value)
                    else:
                        p.fut.set_exception(value)
        finally:
            self._running = False

    async def recover(self) -> bool:
        """Reopen the database if RocksDB refuses writes (MetaDB.failed) and the disk
        takes writes again; True if it did. No batch is on its way meanwhile (the writes
        that arrive wait, then go to the reopened database); reads get Unavailable for
        the few milliseconds it takes (the client reads another replica). A reopen that
        fails leaves the database closed - reads 503 too - until a later call succeeds."""
        db = self.db
        if db.failed is None and db.is_open:
            return False
        loop = asyncio.get_running_loop()
        async with self._db_lock:
            if not await loop.run_in_executor(None, db.disk_takes_writes):
                return False
            try:
                await loop.run_in_executor(None, db.reopen, db.detach())
            except Exception as exc:  # noqa: BLE001 - RocksDB's; tried again later
                log.error("reopening the metadata database failed (%s until it opens): %s",
                          "serving reads read-only, writes refused" if db.is_open
                          else "reads and writes refused", exc)
                return False
        return True

    def _commit(self, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        """In a thread: decide every mutation in order, then one write for all."""
        view = View(self.db)
        outcomes: list[tuple[bool, Any]] = []
        synced = False
        for p in batch:
            mark = view.mark()
            try:
                outcomes.append((True, p.fn(view)))
                synced = synced or not p.lazy
            except Exception as exc:  # noqa: BLE001 - this mutation's error, for its caller
                view.roll_back(mark)
                outcomes.append((False, exc))
        if view.staged:
            self.db.write(view.staged, synced)
        self.batches += 1
        self.mutations += len(batch)
        return outcomes


# When an object record replaces a live one, the control node notes the versions whose
# fragments the old record read - its own id, each multipart part's, those a tiering move
# of it had replaced - with when (the new record's ts), beside the record under its own key
# (`replaced_key`: b"r" bucket b"\0" key -> msgpack [version_id, replaced_at_ns] entries one
# after the other, appended; the newest last), written in the same batch. gc keeps them for
# its grace after that (store.gc.replaced_recently), not only after their creation: a
# reader that opened the old version - an fsspec file, a training worker mid-shard - reads
# on while someone overwrites or deletes the object. The notes are not in the record:
# reads and record batches never carry them (in the record they made a key
# overwritten all day 180 KB to read at every get). Each control node notes what it held
# before, so replicas may differ: gc takes every replica's, after it has read the live
# records (`?replaced=1&notes=1` on a listing, with the grace's start: only notes since
# then are sent, and a page ends early rather than carry more than MAX_NOTES_PER_PAGE). A
# metadata move brings a key's notes to the nodes that hold it now (`carried_notes`)
# before it drops the record where it was.
# Cost: an overwrite that notes nothing does not touch the notes (a version replaced
# within REPLACED_MIN_LIFE_NS of its creation is not noted: its creation-time grace ends at
# most that much sooner, so a key overwritten every few seconds notes nothing); one that
# does appends its entries to the bytes held, unread but for the first (oldest) entry. The
# notes are read and trimmed when that one is a quarter day past REPLACED_FOR_NS (then to
# REPLACED_FOR_NS: a rewrite every six hours, not at every put), or the bytes pass
# REPLACED_TRIM_BYTES, or they do not start as notes do: those older than REPLACED_FOR_NS
# go; those younger than REPLACED_FLOOR_NS stay (a multipart object's 10,000 parts noted at
# an overwrite, through the puts after it); of the rest, past REPLACED_KEEP, those that
# lived least before their replacement (whose creation-time grace ends nearly as late)
# go - never those just added. A longer
# grace and a note dropped fall back to the creation time. Not for system buckets (no reader
# holds their fragments) or inline objects (a reader holds the bytes).
REPLACED_MIN_LIFE_NS = 10 * 10**9
REPLACED_FOR_NS = 24 * 3600 * 10**9
REPLACED_FLOOR_NS = 2 * 3600 * 10**9   # notes this young are never dropped by the bound
REPLACED_KEEP = 1_000
REPLACED_TRIM_BYTES = 64 * 1024
MAX_NOTED_ID = 128             # a version id longer than ours (32) is not noted
NOTE_BYTES = 45                # one packed note of one of our version ids
MAX_NOTES_PER_PAGE = 100_000
_SYSTEM_PREFIXES = tuple(b"o" + name.encode() + b"\0" for name in SYSTEM_BUCKETS)


def replaced_key(k: bytes) -> bytes:
    """The key of the versions an object record's predecessors read (b"o..." -> b"r...")."""
    return b"r" + k[1:]


def _created_ns(version_id: Any) -> int:
    """A version id's creation time (its first 16 hex digits), 0 if it has none."""
    try:
        return int(version_id[:16], 16)
    except (ValueError, TypeError):
        return 0


def read_versions(record: dict[str, Any]) -> list[tuple[str, int | None]]:
    """The versions a reader of `record` reads fragments of, each with when a tiering move
    replaced it (None: the record's own) - none for a tombstone or an inline object; what
    is not a string is left out (a record of another shape never stops a put)."""
    if record.get("deleted") or record.get("inline") is not None:
        return []
    try:
        out: list[tuple[str, int | None]] = [(e.version_id, None) for e in record_extents(record)]
    except (KeyError, TypeError, AttributeError):
        out = [(record.get("version_id"), None)]  # type: ignore[list-item]
    moved_from = record.get("tiered_from_versions") or [record.get("tiered_from")]
    if record.get("tiered_from") and isinstance(moved_from, list):
        moved = _created_ns(record.get("version_id"))
        out += [(v, moved) for v in moved_from]
    return [(v, at) for v, at in out if type(v) is str]


def notes_of(raw: bytes | None) -> list[tuple[str, int]]:
    """The well-formed [version_id, at] entries of a note value, in the order written;
    an unreadable tail is left out."""
    out: list[tuple[str, int]] = []
    if not raw:
        return out
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(raw), 1),
                                max_array_len=4, max_str_len=4 * MAX_NOTED_ID)
    unpacker.feed(raw)
    try:
        for e in unpacker:
            if type(e) is list and len(e) == 2 and type(e[0]) is str and type(e[1]) is int:
                out.append((e[0], e[1]))
    except (ValueError, msgpack.UnpackException, TypeError):
        pass
    return out


def _first_note_before(raw: bytes, cutoff_ns: int) -> bool:
    """Whether the notes' first (oldest) entry is older than cutoff_ns - or the bytes do
    not start with a well-formed entry (then they are rewritten: what follows an
    unreadable entry could not be read)."""
    first = notes_of(raw[:16 + 4 * MAX_NOTED_ID])[:1]
    return not first or first[0][1] < cutoff_ns


def new_notes(current: dict[str, Any], record: dict[str, Any]) -> list[tuple[str, int]]:
    """What `record` replacing `current` adds to the notes: the versions `current` read
    that lived REPLACED_MIN_LIFE_NS or more before now, and that `record` does not read
    itself (an ACL change rewrites the same version)."""
    ts = record["ts"]
    if type(ts) is not int:
        return []
    out = []
    for vid, moved in read_versions(current):
        at = ts if moved is None else moved
        if at - _created_ns(vid) >= REPLACED_MIN_LIFE_NS and len(vid) <= MAX_NOTED_ID:
            out.append((vid, at))
    if out:
        keep = {v for v, _ in read_versions(record)}
        out = [(v, at) for v, at in out if v not in keep]
    return out


def trimmed_notes(held: list[tuple[str, int]], fresh: list[tuple[str, int]], now_ns: int
                  ) -> list[tuple[str, int]]:
    """Notes cut back: every fresh one; of the held, none older than REPLACED_FOR_NS, every
    one younger than REPLACED_FLOOR_NS (gc's default grace is an hour: a multipart object's
    parts noted at an overwrite stay through the next puts), and of the rest at most
    REPLACED_KEEP, those that lived longest before their replacement (ties: the latest
    replaced); one entry a version (its latest replacement), oldest first."""
    fresh_ids = {v for v, _ in fresh}
    latest: dict[str, int] = {}
    for v, at in held:
        if v not in fresh_ids and at >= now_ns - REPLACED_FOR_NS:
            latest[v] = max(at, latest.get(v, at))
    older = [v for v, at in latest.items() if at < now_ns - REPLACED_FLOOR_NS]
    # room for the older ones: REPLACED_KEEP, and what keeps the notes under half the trim
    # bound with the young and fresh (else the next put would trim again, and every one
    # after it: 1.3 ms a put for a key overwritten every 12 s)
    room = min(REPLACED_KEEP, max(0, REPLACED_TRIM_BYTES // 2 // NOTE_BYTES
                                  - (len(latest) - len(older)) - len(fresh)))
    if len(older) > room:
        kept = set(sorted(older, key=lambda v: (_created_ns(v) - latest[v], -latest[v], v))
                   [:room])
        latest = {v: at for v, at in latest.items() if v in kept or at >= now_ns - REPLACED_FLOOR_NS}
    return sorted(latest.items(), key=lambda e: (e[1], e[0])) + fresh


def pack_notes(entries: list[tuple[str, int]]) -> bytes:
    return b"".join(pack([v, at]) for v, at in entries)


MAX_CARRIED_NOTES = 20_000   # entries one request may bring (a metadata move sends more in parts)


def carried_notes(k: bytes, entries: list[tuple[str, int]], now_ns: int) -> Mutation[int]:
    """Add to the notes beside object key k those another control node held for it (a
    metadata move after a control ring change: store.metamove), merged with what this node
    noted and cut back as a put cuts them (`trimmed_notes`); entries older than
    REPLACED_FOR_NS or with too long an id are left out. Returns how many were new."""
    def fn(view: View) -> int:
        rk = replaced_key(k)
        held = notes_of(view.get_raw(rk))
        have = set(held)
        new = [(v, at) for v, at in entries
               if (v, at) not in have and len(v) <= MAX_NOTED_ID
               and at >= now_ns - REPLACED_FOR_NS]
        if new:
            view.stage(rk, pack_notes(trimmed_notes(held + new, [], now_ns)))
        return len(new)
    return fn


def newest(k: bytes, record: dict[str, Any], packed: bytes | None = None
           ) -> Mutation[tuple[bool, dict[str, Any]]]:
    """Store record unless a newer one is there; (applied, current). `packed`: the
    record as it arrived, stored as it is (not packed a second time). An object record
    that replaces one notes what that one read (beside it: `new_notes`)."""
    tracked = k[:1] == b"o" and not k.startswith(_SYSTEM_PREFIXES)

    def fn(view: View) -> tuple[bool, dict[str, Any]]:
        current = view.get(k)
        if current is not None and order(current) >= order(record):
            return False, current
        view.put(k, record if packed is None else packed, record)
        if tracked and current is not None:
            fresh = new_notes(current, record)
            if fresh:
                rk = replaced_key(k)
                try:
                    raw = view.get_raw(rk) or b""
                except EcstoreError:      # the notes cannot be read: the put goes on
                    return True, record
                # past the bound, or the oldest note a quarter day past its day (then
                # trimmed to a day: a rewrite every six hours, not at every put)
                if raw and (len(raw) >= REPLACED_TRIM_BYTES
                            or _first_note_before(raw, record["ts"] - REPLACED_FOR_NS * 5 // 4)):
                    view.stage(rk, pack_notes(trimmed_notes(notes_of(raw), fresh,
                                                            record["ts"])))
                else:
                    view.stage(rk, raw + pack_notes(fresh))
        return True, record
    return fn
