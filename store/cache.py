"""The client's local segment cache: decoded segments on local disk, shared by processes.

A segment is keyed by its extent's version id and its index: a version id names one
write forever, so an overwritten or deleted object can never be served from the cache
stale (its new version has another id). Each file is `b"ECC1"`, the CRC-32 of the bytes,
their length, then the bytes; a file that fails its check is deleted and fetched again.
Files are written to a temporary name and renamed, so a reader never sees half a file,
whichever process wrote it.

Eviction is least recently used by file mtime (a hit touches the file), down to 90% of
the limit once the limit is passed. The cache survives restarts: it is just files.

Many processes sharing the directory fetch a segment once: a process that misses takes an
exclusive lock (flock on one of 256 lock files, chosen by the key's hash) before fetching,
and one that finds the lock taken waits for it and then reads the file the first wrote.

The cache only saves fetches: a file or directory this process may not read, write or
touch (another user's cache, a read-only disk, a full one) is a miss, a write skipped or a
fetch without the lock - said once in the log - never an error for the reader.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
import time
from pathlib import Path

from store.crc import crc32

log = logging.getLogger("ecstore.cache")

MAGIC = b"ECC1"
NO_LOCK = -1                       # try_lock: no lock file this process may open - go on
HEADER = struct.Struct(">4sIQ")    # magic, crc32, length
LOCK_FILES = 256
EVICT_TO = 0.9                     # of the limit, once it is passed
RECOUNT_S = 5.0                    # the directory's size is counted again this often


class SegmentCache:
    """Blocking file operations; the client calls them from a thread."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("cache size must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.data = self.root / "segments"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"
        for d in (self.data, self.locks, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self._mutex = threading.Lock()
        self._evicting = threading.Lock()  # one eviction at a time: two would both delete
        self.bytes = self._count()
        self._counted = time.monotonic()
        self.hits = self.misses = self.corrupt = self.evicted = 0
        self._said: set[str] = set()    # what the log has been told once

    def _unusable(self, what: str, exc: OSError) -> None:
        """Log, once per kind, that part of the cache cannot be used by this process."""
        if what not in self._said:
            self._said.add(what)
            log.warning("segment cache %s: cannot %s (%s); reading from the cluster instead",
                        self.root, what, exc.strerror or exc)

    @staticmethod
    def key(version_id: str, segment: int) -> str:
        return f"{version_id}.{segment}"

    def _path(self, key: str) -> Path:
        if "/" in key or key.startswith("."):
            raise ValueError(f"bad cache key {key!r}")
        return self.data / key

    def get(self, key: str) -> bytes | None:
        """The cached bytes, checked, or None (a damaged file is deleted)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                self._unusable("read its files", exc)
            with self._mutex:
                self.misses += 1
            return None
        if len(raw) >= HEADER.size:
            magic, crc, length = HEADER.unpack_from(raw)
            body = memoryview(raw)[HEADER.size:]
            if magic == MAGIC and length == len(body) and crc32(body) == crc:
                try:
                    os.utime(path)  # recently used
                except FileNotFoundError:
                    pass
                except OSError as exc:      # another user's file: served, not touched
                    self._unusable("mark its files used", exc)
                with self._mutex:
                    self.hits += 1
                return bytes(body)
        self._drop(path)
        with self._mutex:
            self.corrupt += 1
            self.misses += 1
        return None

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        tmp = self.tmp / f"{key}.{os.getpid()}.{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(MAGIC, crc32(data), len(data)))
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self.evict(self.max_bytes // 2)  # the local disk is full: make room, go on
                return
            self._unusable("write to it", exc)
            return
        if time.monotonic() - self._counted > RECOUNT_S:
            # every process sharing the directory writes into it: what this one wrote
            # since it counted is not all there is (each would let it grow to the limit)
            total, self._counted = self._count(), time.monotonic()
            with self._mutex:
                self.bytes = total
        with self._mutex:
            self.bytes += HEADER.size + len(data)
            over = self.bytes > self.max_bytes
        if over:
            self.evict(int(self.max_bytes * EVICT_TO))

    def _count(self) -> int:
        """Bytes of every segment file in the directory, whoever wrote it."""
        total = 0
        for e in os.scandir(self.data):
            with contextlib.suppress(OSError):
                total += e.stat().st_size
        return total

    def evict(self, target: int) -> None:
        """Delete least recently used files until at most `target` bytes stay (every
        process's files count: the directory is scanned)."""
        with self._evicting:
            self._evict(target)

    def _evict(self, target: int) -> None:
        entries = []
        for e in os.scandir(self.data):
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime_ns, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        entries.sort()
        for _, size, path in entries:
            if total <= target:
                break
            if self._drop(Path(path)):
                total -= size
                with self._mutex:
                    self.evicted += 1
        with self._mutex:
            self.bytes = total

    def _drop(self, path: Path) -> bool:
        try:
            path.unlink()
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._unusable("delete its files", exc)
            return False

    def try_lock(self, key: str) -> int | None:
        """An fd holding the key's fetch lock, None if another process holds it, or
        NO_LOCK when this process may not open the lock file (fetch without it)."""
        n = crc32(key.encode()) % LOCK_FILES
        path = self.locks / f"{n:02x}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            try:        # another user's lock file: flock takes a read-only descriptor too
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                self._unusable("take its fetch locks", exc)
                return NO_LOCK
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        if fd == NO_LOCK:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "corrupt": self.corrupt,
                "evicted": self.evicted, "bytes": self.bytes, "max_bytes": self.max_bytes}
