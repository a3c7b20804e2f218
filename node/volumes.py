"""The on-disk format of a storage node's fragments: append-only volume files.

Layout under the node's data directory:

    volumes/00000001.vol ...  append-only; new records go to the highest-numbered one
    quarantine/{fid}          fragments that failed their checksum, kept for inspection
    fragments/, tmp/          the file-per-fragment layout of earlier versions: migrated
                              into volumes when the store opens, then removed

A volume file starts with a 24-byte header: b"ECVOL001", a random 8-byte salt, and the
store's sequence number when the volume was made. Then records, back to back:

    b"ECV1" | u32 header length | u32 CRC-32 of (salt + header) | msgpack header | body

A fragment's header is {"fid", "seq", "checksum", "size", "meta"}: `checksum` the body's
digest (store.digest: "b3:" + BLAKE3 hex, or the plain SHA-256 hex of earlier writers,
still checked), `size` the body's length. A deletion is a record with no body, a
tombstone: {"fid", "seq", "deleted": True}. `seq` numbers every record a store writes;
for each fragment id the record with the highest seq is the truth (a put after a delete
wins, a delete after a put wins), whichever volume it sits in.

Reading the records back (scan_records) takes only whole, checked ones: a record cut
short at the end of a file stops the scan, and a header that fails its CRC (a torn write
in the middle, bit rot) is skipped by searching for the next record whose header checks
out against the volume's salt - which a fragment body cannot forge, as the salt never
leaves the node.

This module is the format and nothing else: Volume (one open file, its group-committed
sync), Loc (where a record is, packed into an int), scanning and parsing records. The
store that keeps the index and writes, deletes and compacts is node/fragments.py.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from store.digest import matches as digest_matches
from store.errors import BadRequest, Corrupt
from store.wire import unpack

MAGIC = b"ECF1"                 # a quarantined fragment, and the old file-per-fragment layout
RECORD_MAGIC = b"ECV1"
VOLUME_MAGIC = b"ECVOL001"
VOLUME_HEADER = struct.Struct(">8s8sQ")     # magic, salt, seq when the volume was made
RECORD_PREFIX = struct.Struct(">4sII")      # magic, header length, CRC-32 of salt + header
MAX_HEADER_BYTES = 64 * 1024
FRAGMENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}\Z")


def check_fragment_id(fid: str) -> str:
    """Return fid if it is a safe file name; BadRequest otherwise."""
    if not FRAGMENT_ID_RE.match(fid) or ".." in fid:
        raise BadRequest(f"invalid fragment id {fid[:80]!r}")
    return fid


@dataclass(frozen=True)
class Fragment:
    fid: str
    checksum: str
    meta: dict[str, Any]
    body: bytes | memoryview



class Volume:
    """One volume file, open for reading and appending. The descriptor closes when the
    last reference goes (CPython frees it at once), so a reader holding a Loc may read
    while a compaction retires the volume."""

    __slots__ = ("vid", "path", "fd", "salt", "min_seq", "end", "live_bytes", "writers",
                 "dropped", "damaged", "_salt_crc", "_sync_cv", "_ticket", "_synced",
                 "_syncing", "sync_error")

    def __init__(self, vid: int, path: str, fd: int, salt: bytes, min_seq: int,
                 end: int) -> None:
        self.vid, self.path, self.fd, self.salt = vid, path, fd, salt
        self._salt_crc = zlib.crc32(salt)
        self.min_seq = min_seq      # lowest seq of any record in it (tombstones' rule)
        self.end = end              # where the next record goes (reserved, maybe unwritten)
        self.live_bytes = 0         # bytes of records the index points at
        self.writers = 0            # puts and deletes with a place reserved, not done yet
        self.dropped = (0, 0)       # the last run of records drop_written dropped, end to end
        self.damaged = False        # bytes that fail their checks: kept for salvage, never compacted
        self._sync_cv = threading.Condition()
        self._ticket = self._synced = 0
        self._syncing = False
        self.sync_error: str | None = None   # why a sync failed: every later one fails too

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self.fd)

    @contextlib.contextmanager
    def without_readahead(self) -> Iterator[int]:
        """A descriptor of the file for one read that the kernel does not read ahead of
        (POSIX_FADV_RANDOM holds for one open file, not for the fd every other read
        uses), closed after: an uncached read of a record reads that record, not the
        records after it into the page cache. Opened through /proc/self/fd (a file
        compaction unlinked still opens); the usual fd where that cannot be done (no
        descriptor left, not Linux), readahead and all."""
        try:
            fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        try:
            if fd >= 0:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            yield fd if fd >= 0 else self.fd
        finally:
            if fd >= 0:
                os.close(fd)

    def header_crc(self, header: bytes | memoryview) -> int:
        return zlib.crc32(header, self._salt_crc)

    def sync(self) -> None:
        """fdatasync covering every write that finished before this call: concurrent
        callers share one (a group commit) instead of queueing one each.

        A failed one fails every later one (OSError EIO), whoever calls: the kernel reports
        a writeback error once, and the pages it could not write stay in the page cache
        marked clean - a later fdatasync returns 0 with them, or the records appended next
        to them, never on the disk (fsyncgate). Nothing written to this file since its last
        good sync may be called durable again."""
        with self._sync_cv:
            self._ticket += 1
            mine = self._ticket
            while self._syncing:
                self._sync_cv.wait()
            self._raise_if_failed()
            if self._synced >= mine:
                return
            self._syncing = True
            upto = self._ticket
        synced = False
        try:
            os.fdatasync(self.fd)
            synced = True
        except OSError as exc:
            with self._sync_cv:
                self.sync_error = f"{exc.strerror or exc} (errno {exc.errno})"
            raise
        finally:
            with self._sync_cv:
                self._syncing = False
                if synced:
                    self._synced = max(self._synced, upto)
                self._sync_cv.notify_all()

    def _raise_if_failed(self) -> None:
        if self.sync_error is not None:
            raise OSError(errno.EIO, f"volume {self.vid}: an earlier sync failed "
                          f"({self.sync_error}); nothing written since can be made durable")


# Where one record is: its volume's number, offset, length (prefix + header + body) and
# seq, packed into one int (length in bits 0-31, offset 32-79, volume 80-111, seq above):
# 44 bytes where a tuple of four ints took 128, and an int is never tracked by Python's
# cyclic garbage collector, so a full collection does not walk the index (~130 ms per
# million fragments when entries held their Volume object, stalling the node).
Loc = int
_M32, _M48 = (1 << 32) - 1, (1 << 48) - 1


def make_loc(vid: int, off: int, length: int, seq: int) -> Loc:
    assert 0 <= vid <= _M32 and 0 <= off <= _M48 and 0 <= length <= _M32, (vid, off, length)
    return seq << 112 | vid << 80 | off << 32 | length


def loc_vid(loc: Loc) -> int:
    return (loc >> 80) & _M32


def loc_off(loc: Loc) -> int:
    return (loc >> 32) & _M48


def loc_length(loc: Loc) -> int:
    return loc & _M32


def loc_seq(loc: Loc) -> int:
    return loc >> 112



def open_volume(vid: int, path: str, flags: int) -> Volume | None:
    """A volume file opened with `flags`, its end at the file's size; None (and closed)
    when it has no valid volume header. An OSError reading the header (EIO: a bad page)
    is raised with the file closed."""
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        head = os.pread(fd, VOLUME_HEADER.size, 0)
    except OSError:
        os.close(fd)
        raise
    if len(head) < VOLUME_HEADER.size or head[:8] != VOLUME_MAGIC:
        os.close(fd)
        return None
    _, salt, made_seq = VOLUME_HEADER.unpack(head)
    return Volume(vid, path, fd, salt, made_seq, os.fstat(fd).st_size)


PAGE = 4096
SCAN_WINDOW_BYTES = 256 * 1024      # a whole-file scan reads this much at a time
FIND_CHUNK_BYTES = 1024 * 1024      # looking for the next record after damage
UNREADABLE_ERRNOS = frozenset({errno.EIO, errno.EBADMSG, errno.ENODATA})


class ScanResult(NamedTuple):
    """What scan_records found in a volume file."""
    records: list[tuple[int, str, int, bool, int]]  # (offset, fid, seq, deleted, length)
    good_end: int       # the end of the last whole, checked record
    skipped: int        # bytes passed over between records (damaged, unreadable or not)
    unreadable: int     # bytes the disk could not read (EIO): a page each time


def scan_records(vol: Volume, size: int, heads_only: bool = False) -> ScanResult:
    """Every whole, checked record of a volume file of `size` bytes, read through pread.
    `heads_only`: the disk asked for a page at a time, no read-ahead, so that the scan
    brings the pages of its record heads into the page cache and not the bodies around
    them (compaction asks the cache afterwards which records were being read).

    A page the disk cannot read (EIO) is passed over - the records whose heads it holds
    are missing from the result - and counted in `unreadable`; the scan goes on with the
    next record found after it. (Through a mapping of the file, mmap, as until the
    twenty-fourth session, such a page was a SIGBUS that killed the node whenever it
    opened its volumes, so that it could not start on that disk at all.)"""
    records: list[tuple[int, str, int, bool, int]] = []
    pos = good_end = VOLUME_HEADER.size
    skipped = 0
    bad: set[int] = set()   # offsets of unreadable pages
    if size <= pos:
        return ScanResult(records, good_end, skipped, 0)
    with _scan_fd(vol, heads_only) as fd:
        rd = _Reader(fd, size, PAGE if heads_only else SCAN_WINDOW_BYTES, bad)
        while pos < size:
            rec = _parse_record_head(rd, pos, size, vol)
            if rec is None:
                nxt = _next_record(rd, pos + 1, size, vol)
                if nxt < 0:
                    break
                if not _failed_write(rd, pos, nxt, size):
                    skipped += nxt - pos
                pos = nxt
                continue
            fid, seq, deleted, length = rec
            records.append((pos, fid, seq, deleted, length))
            pos += length
            good_end = pos
    return ScanResult(records, good_end, skipped, len(bad) * PAGE)


@contextlib.contextmanager
def _scan_fd(vol: Volume, heads_only: bool) -> Iterator[int]:
    if heads_only:
        with vol.without_readahead() as fd:
            yield fd
    else:
        yield vol.fd


class _Reader:
    """A volume file's bytes through pread, a window of them kept at a time. A page the
    disk cannot read reads as zeros (no record checks out there) and its offset goes into
    `bad`; the one page only, so that the records around it are still found. A page in
    `bad` is not asked for again (a failing disk answers each read of one slowly, after
    its own retries): the scan asked for it once per window and search that touched it."""

    __slots__ = ("fd", "size", "window", "bad", "start", "buf")

    def __init__(self, fd: int, size: int, window: int, bad: set[int]) -> None:
        self.fd, self.size, self.window, self.bad = fd, size, window, bad
        self.start, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        """The n bytes from pos (pos + n <= size)."""
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            self.start = pos - pos % PAGE
            self.buf = self.read(self.start, min(self.size, max(pos + n, self.start + self.window)))
            off = pos - self.start
        return self.buf[off:off + n]

    def read(self, start: int, end: int) -> bytes:
        """The bytes from start to end: unreadable pages (and any bytes past the file's
        end, were it cut short meanwhile) as zeros."""
        pages = range(start - start % PAGE, end, PAGE)
        if not self.bad or self.bad.isdisjoint(pages):
            try:
                return pread_padded(self.fd, end - start, start)
            except OSError as exc:
                if exc.errno not in UNREADABLE_ERRNOS:
                    raise
        out = bytearray()
        for page in pages:   # find the bad pages
            a, b = max(start, page), min(end, page + PAGE)
            if page in self.bad:
                out += bytes(b - a)
                continue
            try:
                out += pread_padded(self.fd, b - a, a)
            except OSError as exc:
                if exc.errno not in UNREADABLE_ERRNOS:
                    raise
                self.bad.add(page)
                out += bytes(b - a)
        return bytes(out)

    def find(self, needle: bytes, pos: int) -> int:
        """Offset of the next `needle` at or after pos; -1 if none."""
        while pos < self.size:
            end = min(self.size, pos + FIND_CHUNK_BYTES)
            chunk = self.read(pos, end)
            i = chunk.find(needle)
            if i >= 0:
                return pos + i
            if end >= self.size:
                return -1
            pos = end - (len(needle) - 1)
        return -1


def stored_fragments(data_dir: Path | str) -> dict[str, tuple[str, int, int]]:
    """Read-only, from the files alone (a node may be running): every fragment stored
    under data_dir as {fid: (volume file, offset of its body, body length)} - for tools
    and tests that look at the bytes on disk. A compaction that retires a volume during
    the scan makes it scan again (at most 5 times)."""
    vdir = Path(data_dir) / "volumes"

    def volume_names() -> list[str]:
        return sorted(n for n in os.listdir(vdir) if n.endswith(".vol")) if vdir.is_dir() else []

    for _ in range(5):
        names = volume_names()
        out = _scan_dir(vdir, names)
        if out is not None and names == volume_names():
            return out
    raise RuntimeError(f"volumes under {vdir} kept changing while they were read")


def _scan_dir(vdir: Path, names: list[str]) -> dict[str, tuple[str, int, int]] | None:
    """stored_fragments' one pass over `names`; None if one of them vanished."""
    best: dict[str, tuple[int, bool, str, int, int]] = {}
    for name in names:      # in volume order; of equal seqs the later (a moved copy) wins
        path = str(vdir / name)
        try:
            vol = open_volume(0, path, os.O_RDONLY)    # closes its fd when dropped
        except FileNotFoundError:   # compacted away meanwhile
            return None
        if vol is None:
            continue
        fd = vol.fd
        records = scan_records(vol, vol.end, heads_only=True).records
        for pos, fid, seq, deleted, length in records:
            if fid not in best or best[fid][0] <= seq:
                hlen = RECORD_PREFIX.unpack(os.pread(fd, RECORD_PREFIX.size, pos))[1]
                best[fid] = (seq, deleted, path, pos + RECORD_PREFIX.size + hlen,
                             length - RECORD_PREFIX.size - hlen)
    return {fid: (path, body_off, size)
            for fid, (_, deleted, path, body_off, size) in best.items() if not deleted}


def records_in_tail(vol: Volume, start: int, size: int, limit: int = 2) -> int:
    """How many records from `start` to `size` are whole but for their header's CRC (up
    to `limit`): a crash leaves at most one record cut short at a volume's end, so more
    than one means damage (a flipped byte of the volume's salt fails every record), not a
    crash - and the bytes must not be cut off."""
    if size <= start:
        return 0
    rd = _Reader(vol.fd, size, SCAN_WINDOW_BYTES, set())
    found, pos = 0, start
    while found < limit:
        pos = _next_record(rd, pos, size, vol, check_crc=False)
        if pos < 0:
            break
        found += 1
        pos += 1
    return found


def _parse_record_head(rd: _Reader, pos: int, size: int, vol: Volume,
                       check_crc: bool = True) -> tuple[str, int, bool, int] | None:
    """(fid, seq, deleted, record length) of the record at pos, or None if there is no
    whole, checked record there (`check_crc` False: whole, its header's CRC unchecked)."""
    if pos + RECORD_PREFIX.size > size:
        return None
    magic, hlen, crc = RECORD_PREFIX.unpack(rd.get(pos, RECORD_PREFIX.size))
    start = pos + RECORD_PREFIX.size
    if magic != RECORD_MAGIC or hlen > MAX_HEADER_BYTES or start + hlen > size:
        return None
    header = rd.get(start, hlen)
    if check_crc and vol.header_crc(header) != crc:
        return None
    try:
        h = unpack(header, MAX_HEADER_BYTES)
        fid, seq = h["fid"], h["seq"]
        deleted = h.get("deleted") is True
        body = 0 if deleted else h["size"]
    except (BadRequest, KeyError, TypeError, AttributeError):
        return None
    if (not isinstance(fid, str) or not FRAGMENT_ID_RE.match(fid) or not isinstance(seq, int)
            or not isinstance(body, int) or body < 0 or start + hlen + body > size):
        return None
    return fid, seq, deleted, RECORD_PREFIX.size + hlen + body


def _failed_write(rd: _Reader, pos: int, end: int, size: int) -> bool:
    """Whether bytes [pos, end) are what a write that failed leaves (FragmentStore._write):
    a record whose magic was zeroed after its prefix was written (a header length there),
    or zeros (its space reserved, nothing written) - not damage: status does not report
    them. A page zeroed by the disk under a record's head reads as zeros followed by the
    rest of the record: damage."""
    if pos + RECORD_PREFIX.size > size:
        return not any(rd.get(pos, end - pos))
    magic, hlen, _ = RECORD_PREFIX.unpack(rd.get(pos, RECORD_PREFIX.size))
    if magic != bytes(len(RECORD_MAGIC)):
        return False
    if 0 < hlen <= MAX_HEADER_BYTES:   # its prefix was written, then the magic unmarked
        return True
    return not any(rd.get(pos, end - pos))


def _next_record(rd: _Reader, pos: int, size: int, vol: Volume,
                 check_crc: bool = True) -> int:
    """Offset of the next whole, checked record at or after pos; -1 if none."""
    while True:
        pos = rd.find(RECORD_MAGIC, pos)
        if pos < 0:
            return -1
        if _parse_record_head(rd, pos, size, vol, check_crc) is not None:
            return pos
        pos += 1


def fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pread_padded(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes of fd from offset; zeros past the file's end (a record cut short on
    disk reads as damaged - its checksum fails - never as short). A short read is read on
    from where it stopped: a disk returns the bytes before a sector it cannot read, and
    the next read the error (EIO) - taken for the file's end, the rest read as zeros,
    and a fragment with a bad page in its body was served whole but for them."""
    raw = os.pread(fd, length, offset)
    if len(raw) == length or not raw:
        return raw + bytes(length - len(raw))
    out = bytearray(raw)
    while len(out) < length:
        raw = os.pread(fd, length - len(out), offset + len(out))
        if not raw:
            break
        out += raw
    return bytes(out) + bytes(length - len(out))


def parse_fragment(fid: str, raw: bytes | bytearray, verify: bool = True) -> Fragment:
    """A fragment from a volume record (b"ECV1") or a fragment file of the earlier
    layout (b"ECF1"; quarantined copies); Corrupt if damaged or not `fid`'s."""
    start, checksum, size, meta = parse_record_head(fid, raw)
    body = memoryview(raw)[start:]  # no copy of the body: hashed and sent as is
    if len(body) != size or (verify and not digest_matches(body, checksum)):
        raise Corrupt(f"fragment {fid} failed its checksum")
    return Fragment(fid, checksum, meta, body)


def record_crc_ok(vol: Volume, raw: bytes | bytearray) -> bool:
    """Whether a volume record read whole from `vol` has a header that checks out against
    the volume's salt. A restart's scan skips a record that fails it, so its fragment
    would vanish then although its body is whole: the scrubber quarantines it now and
    repair rebuilds it. Records of the earlier layout (b"ECF1") carry no CRC: True."""
    if raw[:4] != RECORD_MAGIC or len(raw) < RECORD_PREFIX.size:
        return raw[:4] == MAGIC
    _, hlen, crc = RECORD_PREFIX.unpack_from(raw)
    header = memoryview(raw)[RECORD_PREFIX.size:RECORD_PREFIX.size + hlen]
    return len(header) == hlen and vol.header_crc(header) == crc


def parse_record_head(fid: str, raw: bytes | bytearray) -> tuple[int, str, int, dict[str, Any]]:
    """(where the body starts, checksum, body size, meta) from the start of a record or
    fragment file (at least its whole header); Corrupt if damaged or not `fid`'s."""
    if raw[:4] == RECORD_MAGIC and len(raw) >= RECORD_PREFIX.size:
        _, hlen, _ = RECORD_PREFIX.unpack_from(raw)
        start = RECORD_PREFIX.size
    elif raw[:4] == MAGIC and len(raw) >= 8:
        (hlen,) = struct.unpack(">I", raw[4:8])
        start = 8
    else:
        raise Corrupt(f"fragment {fid} has a damaged header")
    if hlen > MAX_HEADER_BYTES or start + hlen > len(raw):
        raise Corrupt(f"fragment {fid} has a damaged header")
    try:
        header = unpack(raw[start:start + hlen], MAX_HEADER_BYTES)
        checksum, size, meta = header["checksum"], header["size"], header["meta"]
        if header.get("fid", fid) != fid:
            raise Corrupt(f"fragment {fid}'s record names another fragment")
    except (BadRequest, KeyError, TypeError, AttributeError):
        raise Corrupt(f"fragment {fid} has a damaged header") from None
    return start + hlen, checksum, size, meta
