"""Metadata records in RocksDB (rocksdict, raw bytes keys).

Key layout: b"o" bucket b"\\0" key -> object record; b"b" bucket -> bucket record;
b"m" -> the cluster map; b"a" bucket b"\\0" key -> how the object is read (tiering).
Every record carries "ts" (ns) and "version_id"; a put keeps the newest by
(ts, version_id), so replicas converge whatever the order of arrival.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteOptions

from store.wire import pack, unpack

MAP_KEY = b"m"


def object_key(bucket: str, key: str) -> bytes:
    return b"o" + bucket.encode() + b"\0" + key.encode()


def access_key(bucket: str, key: str) -> bytes:
    return b"a" + bucket.encode() + b"\0" + key.encode()


def bucket_key(bucket: str) -> bytes:
    return b"b" + bucket.encode()


def order(record: dict[str, Any]) -> tuple[int, str]:
    return int(record["ts"]), str(record["version_id"])


class MetaDB:
    """Blocking RocksDB access; every call is short (one key or one page)."""

    def __init__(self, path: Path, sync: bool = True) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.write_opts = WriteOptions()
        self.write_opts.sync = sync
        self.lazy_opts = WriteOptions()   # advisory data (read counts): no fsync
        self.lazy_opts.sync = False

    def close(self) -> None:
        self.db.close()

    def get(self, k: bytes) -> dict[str, Any] | None:
        raw = self.db.get(k)
        return None if raw is None else unpack(raw)

    def put_newest(self, k: bytes, record: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Store record unless a newer one is there; returns (applied, current)."""
        current = self.get(k)
        if current is not None and order(current) >= order(record):
            return False, current
        self.db.put(k, pack(record), self.write_opts)
        return True, record

    def put_lazy(self, k: bytes, record: dict[str, Any]) -> None:
        self.db.put(k, pack(record), self.lazy_opts)

    def delete(self, k: bytes) -> None:
        self.db.delete(k, self.write_opts)

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
        return out, False

    def get_map(self) -> bytes | None:
        return self.db.get(MAP_KEY)

    def put_map(self, data: bytes) -> None:
        self.db.put(MAP_KEY, data, self.write_opts)
