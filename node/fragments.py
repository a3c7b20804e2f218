"""Fragment files on one storage node's disk.

A fragment file is: b"ECF1", a 4-byte big-endian header length, a msgpack header
({"checksum": sha256 hex of the body, "size": body bytes, "meta": {...}}), the body.
Files are written to tmp/, fsynced, then renamed into place, so a crash never leaves a
half fragment under its real name. Paths are derived from validated fragment ids only.
"""
from __future__ import annotations

import hashlib
import os
import re
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement.hashing import hash64
from store.errors import BadRequest, Corrupt, InsufficientStorage, NotFound
from store.wire import pack, unpack

MAGIC = b"ECF1"
MAX_HEADER_BYTES = 64 * 1024
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
    body: bytes


class FragmentStore:
    """Blocking file operations; the server calls them from a thread pool."""

    def __init__(self, data_dir: Path, fsync: bool = True) -> None:
        self.root = data_dir / "fragments"
        self.tmp = data_dir / "tmp"
        self.quarantine = data_dir / "quarantine"
        self.fsync = fsync
        for d in (self.root, self.tmp, self.quarantine):
            d.mkdir(parents=True, exist_ok=True)
        for leftover in self.tmp.iterdir():  # half-written files of a crash
            leftover.unlink(missing_ok=True)
        self.count, self.bytes = self._scan()

    def path(self, fid: str) -> Path:
        return self.root / f"{hash64(fid.encode()) >> 56:02x}" / check_fragment_id(fid)

    def _scan(self) -> tuple[int, int]:
        count = size = 0
        for sub in self.root.iterdir():
            for f in sub.iterdir():
                count += 1
                size += f.stat().st_size
        return count, size

    def put(self, fid: str, body: bytes, checksum: str, meta: dict[str, Any]) -> bool:
        """Store a fragment whose body must hash to `checksum`; True if it replaced one."""
        if hashlib.sha256(body).hexdigest() != checksum:
            raise BadRequest("body does not match its checksum (truncated or damaged upload)")
        header = pack({"checksum": checksum, "size": len(body), "meta": meta})
        final = self.path(fid)
        tmp = self.tmp / f"{fid}.{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack(">I", len(header)) + header)
                f.write(body)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            final.parent.mkdir(exist_ok=True)
            old = final.stat().st_size if final.exists() else None
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno == 28:  # ENOSPC
                raise InsufficientStorage("no space left on device") from None
            raise
        new_size = final.stat().st_size
        if old is None:
            self.count += 1
            self.bytes += new_size
        else:
            self.bytes += new_size - old
        return old is not None

    def read(self, fid: str, verify: bool = True) -> Fragment:
        """Read and verify one fragment; NotFound or Corrupt."""
        try:
            raw = self.path(fid).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"fragment {fid} not found") from None
        return parse_fragment(fid, raw, verify)

    def delete(self, fid: str) -> None:
        path = self.path(fid)
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


def parse_fragment(fid: str, raw: bytes, verify: bool = True) -> Fragment:
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
    body = raw[8 + hlen:]
    if len(body) != size or (verify and hashlib.sha256(body).hexdigest() != checksum):
        raise Corrupt(f"fragment {fid} failed its checksum")
    return Fragment(fid, checksum, meta, body)
