"""A node's data disk: its free and total space, and the free space a node keeps in
reserve - writes that would leave less are refused with 507 (storage and control nodes
alike), so the disk never fills to the last byte under a node's own writes."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from node.metrics import Families, gauge

log = logging.getLogger("ecstore.disk")

DEFAULT_RESERVE_FRACTION = 0.01            # refuse writes that would leave less free
DEFAULT_RESERVE_MAX_BYTES = 1024 ** 3      # ... but never reserve more than 1 GiB


def disk_space(path: Path | str) -> dict[str, int]:
    """{"disk_total_bytes", "disk_free_bytes"} of the filesystem holding `path` (free:
    what an unprivileged user may still write)."""
    st = os.statvfs(path)
    return {"disk_total_bytes": st.f_blocks * st.f_frsize,
            "disk_free_bytes": st.f_bavail * st.f_frsize}


def default_reserve_bytes(path: Path | str) -> int:
    """The reserve a node keeps on the disk holding `path` when none is configured: 1% of
    the disk, at most 1 GiB."""
    return min(DEFAULT_RESERVE_MAX_BYTES,
               int(disk_space(path)["disk_total_bytes"] * DEFAULT_RESERVE_FRACTION))


def disk_full_problem(free_bytes: int, reserve_bytes: int, writing_bytes: int = 0) -> str | None:
    """What an operator reads when a write of `writing_bytes` would leave less than the
    reserve free (None while it fits): the words of a node's 507 and of its status."""
    if free_bytes - writing_bytes >= reserve_bytes and free_bytes > 0:
        return None
    return (f"disk full: {free_bytes} bytes free, {reserve_bytes} kept in reserve "
            "(writes refused with 507 until space is freed)")


def private_dir(path: Path) -> None:
    """Make a node's data directory, and keep it for the node's user only (0700): files a
    node made before this version are 0644, and the directory's mode is what keeps other
    local users from reading them (S3 secret keys in a control node's RocksDB files,
    object data in volumes). A directory we cannot change (another owner): said, left."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError as exc:
        log.warning("could not make %s private (mode 0700): %s", path, exc)


def disk_gauges(role: str, disk: dict[str, int], reserve_bytes: int, what: str) -> Families:
    """The three disk gauges of a node role's /metrics - ecstore_<role>_disk_free_bytes,
    _disk_total_bytes and _reserve_bytes - of `what` (the disk's name in their help)."""
    return [gauge(f"ecstore_{role}_disk_free_bytes", f"Free bytes on the {what} (for "
                  "unprivileged users).", disk["disk_free_bytes"]),
            gauge(f"ecstore_{role}_disk_total_bytes", f"Size of the {what}.",
                  disk["disk_total_bytes"]),
            gauge(f"ecstore_{role}_reserve_bytes", "Free space kept: a write that would leave "
                  "less is refused with 507.", reserve_bytes)]


RECENT_DISK_ERROR_S = 300.0   # status names a disk error this long after the last one


def iso_utc(t: float) -> str:
    """Unix seconds as 2026-12-04T14:37:24Z (status and log texts)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class ErrorTally:
    """Errors of one kind a node's disk gave (reads it could not do, writes it failed):
    how many since the start, the last one's text and when, for status to name them for
    RECENT_DISK_ERROR_S after the last - an error the node survives (the read answered
    503 or corrupt, the database reopened) left status saying `up`."""

    __slots__ = ("count", "last", "last_at")
    count: int
    last: str | None
    last_at: float              # unix s

    def __init__(self) -> None:
        self.count, self.last, self.last_at = 0, None, 0.0

    def note(self, what: str, now: float | None = None) -> None:
        self.count += 1
        self.last, self.last_at = what, time.time() if now is None else now

    def recent(self, window_s: float = RECENT_DISK_ERROR_S) -> bool:
        return self.last is not None and time.time() - self.last_at <= window_s

    def summary(self) -> str:
        """"N since start, the last at T: TEXT" (status's words)."""
        return f"{self.count} since start, the last at {iso_utc(self.last_at)}: {self.last}"
