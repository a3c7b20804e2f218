"""A control node's RocksDB reads that fail (an I/O error under an SST file). RocksDB says
so by raising from get(), and for an iterator only through status(): valid() turns
False as at the end of the keys. A real-EIO sweep (a FUSE layer under a control node's
database, twenty-fifth session) found scans answering short pages as complete (200, no
more) - listings that missed acknowledged objects - and every other read a 500 with a
traceback, while status called the node down. The wrapper below fails reads as RocksDB
does (its error text); the database under it is real."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.control import db_health, list_page, stored_record
from node.metadb import MetaDB, object_key
from store.errors import Unavailable
from store.wire import pack

BUCKET = "b"
EIO = "IO error: While pread offset 4096 len 4096: /db/000009.sst: Input/output error"


class FailingIter:
    """A RocksDB iterator whose read fails after `good` steps: invalid from then on, the
    error in status() only."""

    def __init__(self, real: Any, good: int) -> None:
        self.real, self.good, self.failed = real, good, False

    def valid(self) -> bool:
        return not self.failed and bool(self.real.valid())

    def status(self) -> None:
        if self.failed:
            raise Exception(EIO)  # noqa: TRY002 - what rocksdict raises

    def next(self) -> None:
        self.good -= 1
        if self.good <= 0:
            self.failed = True
        self.real.next()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class FailingRdict:
    def __init__(self, real: Any, good_steps: int, bad_keys: set[bytes]) -> None:
        self.real, self.good_steps, self.bad_keys = real, good_steps, bad_keys

    def get(self, k: bytes) -> Any:
        if k in self.bad_keys:
            raise Exception(EIO)  # noqa: TRY002 - what rocksdict raises
        return self.real.get(k)

    def iter(self) -> FailingIter:
        return FailingIter(self.real.iter(), self.good_steps)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def rec(i: int) -> bytes:
    return pack({"ts": i, "version_id": f"v{i:04d}", "deleted": False, "size": 1,
                 "etag": None, "content_type": ""})


@pytest.fixture
def db(tmp_path: Path) -> MetaDB:
    db = MetaDB(tmp_path / "db", sync=False)
    db.write({object_key(BUCKET, f"k{i:03d}"): rec(i) for i in range(40)}, sync=False)
    return db


def test_a_scan_that_meets_a_read_error_is_unavailable_not_a_short_page(db: MetaDB) -> None:
    whole = list_page(db, BUCKET, "", "", 1000, "", rows=True)
    assert len(whole["rows"]) == 40 and not whole["truncated"]
    db._rdict = FailingRdict(db._rdict, good_steps=19, bad_keys=set())  # type: ignore[assignment]
    with pytest.raises(Unavailable, match="could not read"):
        list_page(db, BUCKET, "", "", 1000, "", rows=True)
    with pytest.raises(Unavailable):
        db.scan(object_key(BUCKET, ""), b"", 1000)
    with pytest.raises(Unavailable):
        db.unsummarized(b"", 1000)
    assert db.read_failures == 3


def test_a_read_error_is_unavailable_and_named_in_status(db: MetaDB) -> None:
    key = object_key(BUCKET, "k007")
    db._rdict = FailingRdict(db._rdict, good_steps=10**6, bad_keys={key})  # type: ignore[assignment]
    with pytest.raises(Unavailable, match="another replica may"):
        stored_record(db, BUCKET, "k007")
    assert stored_record(db, BUCKET, "k008")          # other keys read
    health = db_health(db)
    assert health["writable"] is True                 # writes are not what failed
    [problem] = health["problems"]
    assert "reads failed (1 since start" in problem and "000009.sst" in problem


class FailingWrites:
    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, *args: Any) -> None:
        raise Exception("IO error: While appending to file: /db/000012.log: "  # noqa: TRY002
                        "Input/output error")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_write_error_stays_in_status_after_the_reopen(db: MetaDB) -> None:
    """A write RocksDB failed with an I/O error: refused writes until the reopen (a
    second later, when a probe file is written), then status said up until the next
    write failed - on a disk failing only the WAL's writes, up most of the time."""
    db._rdict = FailingWrites(db._rdict)  # type: ignore[assignment]
    with pytest.raises(Unavailable, match="stopped taking writes"):
        db.write({b"x": b"1"}, True)
    [refusing] = db_health(db)["problems"]
    assert "refuses writes since" in refusing and db_health(db)["writable"] is False
    db.reopen(db.detach())
    db.write({b"x": b"1"}, True)                      # takes writes again
    health = db_health(db)
    assert health["writable"] is True and health["db_error"] is None
    [problem] = health["problems"]
    assert "writes failed (1 since start" in problem and "000012.log" in problem
