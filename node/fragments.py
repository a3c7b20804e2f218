"""Fragment files on one storage node's disk.

A fragment file is: b"ECF1", a 4-byte big-endian header length, a msgpack header
({"checksum": the body's digest, "size": body bytes, "meta": {...}}), the body. The digest
is store.digest's: "b3:" + BLAKE3 hex, or the plain SHA-256 hex of fragments written
before BLAKE3 (still checked).
Files are written to tmp/, fsynced, then renamed into place, so a crash never leaves a
half fragment under its real name. Paths are derived from validated fragment ids only.

A fragment that fails its checksum (found by a read or by the scrubber, node/scrub.py) is
quarantined: moved to quarantine/ under its id (`{fid}~{ns}` if that name is taken), kept
for inspection, never served again and no longer listed, so repair sees it missing.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement.hashing import hash64
from store.digest import matches as digest_matches
from store.errors import BadRequest, Corrupt, InsufficientStorage, NotFound
from store.wire import pack, unpack

MAGIC = b"ECF1"
MAX_HEADER_BYTES = 64 * 1024
QUARANTINE_SEPARATOR = "~"  # never in a fragment id: `{fid}~{ns}` for a second copy
DEFAULT_RESERVE_FRACTION = 0.01            # refuse fragments that would leave less free
DEFAULT_RESERVE_MAX_BYTES = 1024 ** 3      # ... but never reserve more than 1 GiB
_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
FRAGMENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


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


class FragmentStore:
    """Blocking file operations; the server calls them from a thread pool."""

    def __init__(self, data_dir: Path, fsync: bool = True,
                 reserve_bytes: int | None = None) -> None:
        self.root = data_dir / "fragments"
        self._root_str = str(self.root)
        self.tmp = data_dir / "tmp"
        self._tmp_str = str(self.tmp)
        self._tmp_seq = itertools.count()   # next() is atomic under the GIL
        self.quarantine = data_dir / "quarantine"
        self.fsync = fsync
        if reserve_bytes is None:
            st = os.statvfs(data_dir)
            reserve_bytes = min(DEFAULT_RESERVE_MAX_BYTES,
                                int(st.f_blocks * st.f_frsize * DEFAULT_RESERVE_FRACTION))
        self.reserve_bytes = reserve_bytes
        for d in (self.root, self.tmp, self.quarantine):
            d.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp.iterdir():  # half-written files of a crash
            leftover.unlink(missing_ok=True)
        # guards renames into and out of fragments/ with the counts they change
        self._lock = threading.Lock()
        self._dirs_made: set[str] = set()   # fan-out directories known to exist (<= 256)
        self.count, self.bytes = self._scan()
        self.quarantined = sum(1 for _ in self.quarantine.iterdir())

    def path(self, fid: str) -> Path:
        return Path(self._path_str(fid))

    def _scan(self) -> tuple[int, int]:
        count = size = 0
        for sub in self.root.iterdir():
            for f in sub.iterdir():
                count += 1
                size += f.stat().st_size
        return count, size

    def put(self, fid: str, body: bytes | bytearray, checksum: str,
            meta: dict[str, Any]) -> bool:
        """Store a fragment whose body must hash to `checksum`; True if it replaced one.

        Plain os calls on str paths (no pathlib, no buffered file object, no uuid): a
        1 KiB put was ~17 system calls, now ~12."""
        if not digest_matches(body, checksum):
            raise BadRequest("body does not match its checksum (truncated or damaged upload)")
        header = pack({"checksum": checksum, "size": len(body), "meta": meta})
        head = MAGIC + struct.pack(">I", len(header)) + header
        size = len(head) + len(body)
        final = self._path_str(fid)
        st = os.statvfs(self._tmp_str)
        if st.f_bavail * st.f_frsize - size < self.reserve_bytes:
            raise InsufficientStorage(f"disk full: fewer than {self.reserve_bytes} bytes "
                                      "would stay free")
        # unique in this process, and tmp/ is emptied when the store opens
        tmp = f"{self._tmp_str}/{fid}.{os.getpid()}.{next(self._tmp_seq)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                written = os.writev(fd, [head, body])
                if written < size:      # short only as the disk fills: the rest, or ENOSPC
                    _write_all(fd, memoryview(head + bytes(body))[written:])
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            sub = final[len(self._root_str) + 1:len(self._root_str) + 3]
            if sub not in self._dirs_made:  # a mkdir per put cost ~8% of it
                os.makedirs(os.path.dirname(final), exist_ok=True)
                if self.fsync:
                    _fsync_dir(self.root)
                self._dirs_made.add(sub)
            with self._lock:
                try:
                    old: int | None = os.stat(final).st_size
                except FileNotFoundError:
                    old = None
                os.replace(tmp, final)
                if old is None:
                    self.count += 1
                    self.bytes += size
                else:
                    self.bytes += size - old
            if self.fsync:  # the rename must survive a power loss too (~0.2 ms here)
                _fsync_dir(os.path.dirname(final))
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if exc.errno == errno.ENOSPC:
                raise InsufficientStorage("no space left on device") from None
            raise
        return old is not None

    def read(self, fid: str, verify: bool = True) -> Fragment:
        """Read and verify one fragment; NotFound, or Corrupt after quarantining it."""
        raw, inode = self.read_raw(fid)
        try:
            return parse_fragment(fid, raw, verify)
        except Corrupt:
            self.quarantine_fragment(fid, inode)
            raise

    def read_cached(self, fid: str) -> Fragment | None:
        """The fragment, unverified, when its whole file is in the page cache - read with
        RWF_NOWAIT, which fails rather than wait for the disk, so it may run on the event
        loop and save a fragment GET its trip through the thread pool. None when the file
        is not cached (or is damaged: read() in a thread then quarantines it); NotFound.
        The open() itself can wait for a directory block that is not cached: the 256
        fan-out directories of a serving node are."""
        if _RWF_NOWAIT is None:     # not Linux: always the thread
            return None
        try:
            fd = os.open(self._path_str(fid), os.O_RDONLY)
        except FileNotFoundError:
            raise NotFound(f"fragment {fid} not found") from None
        try:
            size = os.fstat(fd).st_size
            raw = bytearray(size)
            try:
                if os.preadv(fd, [raw], 0, _RWF_NOWAIT) != size:
                    return None
            except OSError:     # EAGAIN: not cached; EOPNOTSUPP: no RWF_NOWAIT here
                return None
        finally:
            os.close(fd)
        try:
            return parse_fragment(fid, raw, verify=False)
        except Corrupt:
            return None

    def _path_str(self, fid: str) -> str:
        """The fragment's file: under a fan-out directory chosen by its id's hash (a str:
        the event-loop read path skips pathlib)."""
        return f"{self._root_str}/{hash64(fid.encode()) >> 56:02x}/{check_fragment_id(fid)}"

    def read_raw(self, fid: str) -> tuple[bytes, int]:
        """The whole file of a fragment, unchecked, and its inode number; NotFound."""
        try:
            fd = os.open(self._path_str(fid), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"fragment {fid} not found") from None
        try:
            st = os.fstat(fd)
            parts = [os.read(fd, st.st_size)]
            while parts[-1]:    # the file grew or the read came back short: read to EOF
                parts.append(os.read(fd, 1 << 20))
            return parts[0] if len(parts) == 2 else b"".join(parts), st.st_ino
        finally:
            os.close(fd)

    def quarantine_fragment(self, fid: str, inode: int | None = None) -> bool:
        """Move a fragment file into quarantine/; True if moved.

        With `inode`, only the file that was read is moved: if a put replaced it since
        (a repair), the new file stays. False when the file is gone or was replaced.
        """
        path = self.path(fid)
        with self._lock:
            try:
                st = path.stat()
            except FileNotFoundError:
                return False
            if inode is not None and st.st_ino != inode:
                return False
            dest = self.quarantine / fid
            if dest.exists():
                dest = self.quarantine / f"{fid}{QUARANTINE_SEPARATOR}{time.time_ns()}"
            os.replace(path, dest)
            self.count -= 1
            self.bytes -= st.st_size
            self.quarantined += 1
        return True

    def quarantined_ids(self) -> list[str]:
        """Sorted ids of quarantined fragments that have no good copy here again."""
        ids = {n.split(QUARANTINE_SEPARATOR, 1)[0] for n in os.listdir(self.quarantine)}
        return sorted(fid for fid in ids if FRAGMENT_ID_RE.match(fid) and ".." not in fid
                      and not self.path(fid).exists())

    def delete(self, fid: str) -> None:
        path = self.path(fid)
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                raise NotFound(f"fragment {fid} not found") from None
            self.count -= 1
            self.bytes -= size

    def list(self, after: str, limit: int) -> list[str]:
        """Fragment ids sorted, strictly after `after`, at most `limit`."""
        names = sorted(
            n for sub in self.root.iterdir() for n in os.listdir(sub) if n > after
        )
        return names[:limit]

    def disk(self) -> dict[str, int]:
        st = os.statvfs(self.root)
        return {"disk_total_bytes": st.f_blocks * st.f_frsize,
                "disk_free_bytes": st.f_bavail * st.f_frsize}


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parse_fragment(fid: str, raw: bytes | bytearray, verify: bool = True) -> Fragment:
    if len(raw) < 8 or raw[:4] != MAGIC:
        raise Corrupt(f"fragment {fid} has a damaged header")
    (hlen,) = struct.unpack(">I", raw[4:8])
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(raw):
        raise Corrupt(f"fragment {fid} has a damaged header")
    try:
        header = unpack(raw[8:8 + hlen], MAX_HEADER_BYTES)
        checksum, size, meta = header["checksum"], header["size"], header["meta"]
    except (BadRequest, KeyError, TypeError):
        raise Corrupt(f"fragment {fid} has a damaged header") from None
    body = memoryview(raw)[8 + hlen:]  # no copy of the body: hashed and sent as is
    if len(body) != size or (verify and not digest_matches(body, checksum)):
        raise Corrupt(f"fragment {fid} failed its checksum")
    return Fragment(fid, checksum, meta, body)
