"""Listings with a delimiter, rolled up on the control nodes (MetaDB.scan_listed: under
each common prefix only the records up to the first live one), merged by the client
(store.listing.merge_listing), against the naive model - with replicas that missed
acknowledged writes and deletes, as a write quorum of 2 of 3 allows."""
from __future__ import annotations

import asyncio
import tempfile
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.control import list_page
from node.metadb import SUMMARY_FIELDS, MetaDB, View, object_key, summary_key
from placement.nodes import Node
from store import listing
from store.listing import merge_listing
from store.transport import Reply, Transport
from store.wire import pack, unpack
from tests.cluster.test_listing import model, walk_pages

BUCKET = "b"
NODES = tuple(Node(f"c{i}", f"http://c{i}", zone=f"c{i}", tier="control") for i in range(3))


class DBTransport(Transport):
    """The control node's list route (node/control.py list_page) over one real MetaDB
    per node, counting records sent. `maps`: the nodes answer with maps whatever the
    client asks, as nodes from before rows did."""

    def __init__(self, dbs: dict[str, MetaDB], maps: bool = False) -> None:
        super().__init__(secret="unused")
        self.dbs, self.sent, self.maps = dbs, 0, maps

    async def request(self, method: str, base_url: str, path: str, *,
                      body: bytes | bytearray | memoryview = b"", checksum: str | None = None,
                      query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0, ok_404: bool = False) -> Reply:
        assert query is not None and path == f"/v1/list/{BUCKET}"
        reply = list_page(self.dbs[base_url], BUCKET, query["prefix"], query["after"],
                          int(query["limit"]), query.get("delimiter", ""),
                          rows=str(query.get("rows")) == "1" and not self.maps)
        self.sent += len(reply["records" if self.maps else "rows"])
        return Reply(200, {}, bytearray(pack(reply)))


def rec(ts: int, deleted: bool) -> bytes:
    return pack({"ts": ts, "version_id": f"v{ts:04d}", "deleted": deleted, "size": 1,
                 "etag": None, "content_type": ""})


HOWS = ("summary", "none", "stale", "garbage", "seven")


def old_summary(value: bytes) -> bytes:
    """A record's summary as a version before storage_class wrote it: one field fewer."""
    record = unpack(value)
    return pack([zlib.crc32(value), *(record.get(f) for f in SUMMARY_FIELDS[:-1])])


def store(db: MetaDB, key: str, value: bytes, how: str) -> None:
    """Write a record as a control node does ("summary": with its listing summary), as one
    that keeps none ("none"), or over a summary of another version ("stale": a record a
    node without summaries wrote after one with them) or one that is not msgpack
    ("garbage") - which must not be listed - or with a summary written before summaries
    had a storage class ("seven"), which is used."""
    k = object_key(BUCKET, key)
    if how == "garbage":
        db.write({summary_key(k): b"\xc1", k: value}, sync=False)
        return
    if how == "seven":
        db.write({summary_key(k): old_summary(value), k: value}, sync=False)
        return
    if how != "none":
        view = View(db)
        view.put(k, value if how == "summary" else rec(10**6, not unpack(value)["deleted"]))
        db.write(view.staged, sync=False)
    if how != "summary":
        db.write({k: value}, sync=False)


names = st.text(alphabet="ab/", min_size=1, max_size=5)
# per key: its history of writes (True = a delete), and which node missed the last one
histories = st.dictionaries(names, st.tuples(st.lists(st.booleans(), min_size=1, max_size=3),
                                             st.integers(-1, 2)), max_size=30)


def fill(dbs: list[MetaDB], history: dict[str, tuple[list[bool], int]],
         how: str = "summary") -> list[str]:
    """Write every key's history to all three nodes, except that node `missed` (if >= 0)
    keeps the second newest state; returns the keys live at their newest write. `how`
    (see store), or "mixed": each key's own by its length."""
    live = []
    for key, (writes, missed) in history.items():
        for n, db in enumerate(dbs):
            upto = len(writes) - 1 if n == missed and len(writes) > 1 else len(writes)
            if n == missed and len(writes) == 1:
                continue                      # the only write never reached this node
            ts = upto
            store(db, key, rec(ts, writes[upto - 1]),
                  HOWS[len(key) % len(HOWS)] if how == "mixed" else how)
        if not writes[-1]:
            live.append(key)
    return sorted(live)


@contextmanager
def replicas(root: Path, maps: bool = False) -> Iterator[tuple[list[MetaDB], DBTransport]]:
    """Three control nodes' databases under `root`, and the transport that lists them."""
    dbs = [MetaDB(root / f"c{i}", sync=False) for i in range(3)]
    try:
        yield dbs, DBTransport({n.address: db for n, db in zip(NODES, dbs)}, maps)
    finally:
        for db in dbs:
            db.close()


def walk(t: Transport, prefix: str, delimiter: str, max_keys: int,
         rolled: bool) -> tuple[list[str], list[str]]:
    return asyncio.run(walk_pages(lambda after: merge_listing(
        t, NODES, BUCKET, prefix, delimiter, after, max_keys, allowed_failures=0,
        rolled=rolled)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories, prefix=st.sampled_from(["", "a", "a/", "b/"]),
       delimiter=st.sampled_from(["/", "b", "ab"]), max_keys=st.integers(1, 12),
       page_limit=st.integers(1, 6), how=st.sampled_from([*HOWS, "mixed"]),
       maps=st.booleans())
def test_rolled_listing_matches_the_model(history: dict[str, tuple[list[bool], int]],
                                          prefix: str, delimiter: str, max_keys: int,
                                          page_limit: int, how: str, maps: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp, replicas(Path(tmp), maps) as (dbs, t):
        live = fill(dbs, history, how)
        old = listing.PAGE_LIMIT
        listing.PAGE_LIMIT = page_limit       # many rounds and node pages
        try:
            got = walk(t, prefix, delimiter, max_keys, rolled=True)
            full = walk(t, prefix, delimiter, max_keys, rolled=False)
        finally:
            listing.PAGE_LIMIT = old
        want_objs, want_prefixes, _ = model(live, prefix, delimiter, "", 10**9)
        assert got == (want_objs, want_prefixes)
        assert full == got
        listed = {src: sum(db.listed[src] for db in dbs) for src in ("summary", "record")}
        if how in ("summary", "seven"):   # every row from a summary; else from records,
            assert listed["record"] == 0    # but "mixed"
        elif how != "mixed":
            assert listed["summary"] == 0


def test_a_rolled_prefix_costs_a_record_per_node_not_one_per_key(tmp_path: Path) -> None:
    with replicas(tmp_path) as (dbs, t):
        for db in dbs:
            db.write({object_key(BUCKET, f"d{p}/k{i:04d}"): rec(1, False)
                      for p in range(5) for i in range(2000)}, sync=False)
        assert walk(t, "", "/", 1000, rolled=True) == ([], [f"d{p}/" for p in range(5)])
        assert t.sent == 3 * 5                    # one record per prefix per node
        t.sent = 0
        assert walk(t, "", "/", 1000, rolled=False) == ([], [f"d{p}/" for p in range(5)])
        assert t.sent == 3 * 5 * 2000


def test_a_delete_missing_on_one_replica_falls_back_to_every_record(tmp_path: Path) -> None:
    """d/k0 deleted (acknowledged by c1 and c2), c0 still has it live: c0 rolls d/ up at
    d/k0. d/ has no live key, so it must not be listed."""
    with replicas(tmp_path) as (dbs, t):
        for n, db in enumerate(dbs):
            db.write({object_key(BUCKET, "d/k0"): rec(1 if n == 0 else 2, n != 0),
                      object_key(BUCKET, "d/k1"): rec(2, True),
                      object_key(BUCKET, "e"): rec(1, False)}, sync=False)
        assert walk(t, "", "/", 1000, rolled=True) == (["e"], [])


def test_stale_replicas_hiding_each_others_deletes_fall_back(tmp_path: Path) -> None:
    """P/a, P/b and P/c were each put and then deleted; each delete missed a different node
    (c0 still has P/a live, c1 P/b, c2 P/c). Rolled, c0 stops at P/a, c1 at P/b: their
    tombstones of P/c are never sent, and c2's stale P/c would look live - the stale
    P/a (its tombstone is newer, and every node sent what it has up to P/a) sends the
    listing back to every record. P/ must not be listed."""
    with replicas(tmp_path) as (dbs, t):
        for n, db in enumerate(dbs):
            db.write({object_key(BUCKET, f"P/{k}"): rec(1, False) if n == i else rec(2, True)
                      for i, k in enumerate("abc")}, sync=False)
        assert walk(t, "", "/", 1000, rolled=True) == ([], [])


def test_a_delimiter_longer_than_a_node_takes_is_not_sent(tmp_path: Path) -> None:
    """No key can hold a delimiter over 1,024 bytes: the listing is a plain one."""
    with replicas(tmp_path) as (dbs, t):
        for db in dbs:
            db.write({object_key(BUCKET, k): rec(1, False) for k in ("a/b", "c")}, sync=False)
        assert walk(t, "", "/" * 1025, 1000, rolled=True) == (["a/b", "c"], [])


def test_summaries_are_filled_in_once_then_the_database_is_marked(tmp_path: Path) -> None:
    """fill_summaries writes the summaries a database lacks (and replaces stale ones), marks
    it, and skips a marked database: a later start does not scan every record again."""
    from node.control import fill_summaries
    from node.metadb import SUMMARIES_KEY, GroupCommit

    async def fill(db: MetaDB) -> int:
        return await fill_summaries(db, GroupCommit(db), batch=7)
    with replicas(tmp_path) as (dbs, t):
        db = dbs[0]
        for i in range(40):
            store(db, f"k{i:02d}", rec(1, i % 5 == 0), HOWS[i % len(HOWS)])
        assert asyncio.run(fill(db)) == 24          # all but the 16 written with theirs
        #                                             ("summary" and "seven": still good)
        assert db.db.get(SUMMARIES_KEY) is not None
        store(db, "late", rec(1, False), "none")    # as a version without summaries would
        assert asyncio.run(fill(db)) == 0           # marked: not looked at again
        db.write({SUMMARIES_KEY: None}, sync=False)
        assert asyncio.run(fill(db)) == 1
        db.listed.update(summary=0, record=0)
        rows = db.scan_listed(object_key(BUCKET, ""), b"", 100)[0]
        assert len(rows) == 41 and db.listed == {"summary": 41, "record": 0}


class OldRows(DBTransport):
    """Nodes of a version before storage_class: rows one field shorter."""

    async def request(self, *args: Any, **kwargs: Any) -> Reply:
        reply = await super().request(*args, **kwargs)
        page = unpack(reply.body)
        page["rows"] = [row[:-1] for row in page["rows"]]
        return Reply(200, {}, bytearray(pack(page)))


def test_the_storage_class_is_listed_from_summaries_records_and_older_nodes(
        tmp_path: Path) -> None:
    """The listed row's storage_class, whatever the row was read from: a summary, the
    record (no summary, a stale one), a summary written before the field (its record has
    no class) - and None from nodes that send rows without it, or maps without it."""
    def record(ts: int, cls: str | None) -> bytes:
        r = {"ts": ts, "version_id": f"v{ts:04d}", "deleted": False, "size": 1, "etag": None,
             "content_type": ""}
        return pack({**r, "storage_class": cls} if cls else r)
    written = {"ia/summary": ("summary", "STANDARD_IA"), "ia/none": ("none", "GLACIER_IR"),
               "ia/stale": ("stale", "ONEZONE_IA"), "std/summary": ("summary", None),
               "std/seven": ("seven", None)}

    def entries(t: Transport) -> dict[str, str | None]:
        page = asyncio.run(merge_listing(t, NODES, BUCKET, "", "", "", 100, allowed_failures=0))
        return {e.key: e.storage_class for e in page.objects}
    with replicas(tmp_path) as (dbs, t):
        for key, (how, cls) in written.items():
            for db in dbs:
                store(db, key, record(5, cls), how)
        want = {key: cls for key, (_, cls) in written.items()}
        assert entries(t) == want
        listed = {src: sum(db.listed[src] for db in dbs) for src in ("summary", "record")}
        from_summary = sum(how in ("summary", "seven") for how, _ in written.values())
        assert listed == {"summary": 3 * from_summary,           # every node asked
                          "record": 3 * (len(written) - from_summary)}
        assert entries(DBTransport(t.dbs, maps=True)) == want
        assert entries(OldRows(t.dbs)) == dict.fromkeys(written)


def test_keys_holding_u10ffff_list_once_and_the_listing_ends(tmp_path: Path) -> None:
    """U+10FFFF marks the end of a common prefix in a listing position; a key that holds it
    (written before check_new_key refused such keys) made the control node find the same
    key again after every seek past its prefix, and the listing never ended. Every page
    size, rolled or not: the model's answer, in a bounded number of pages."""
    from store.errors import BadRequest
    from store.names import check_new_key

    keys = ["a/\U0010ffffz", "a/\U0010ffff/q", "a/b", "\U0010ffff/x", "\U0010ffffy", "c",
            "c/\U0010ffff"]
    failures: list[object] = []

    def every_way(t: Transport) -> None:
        try:
            for page_limit in (1, 2, 3, 1000):
                listing.PAGE_LIMIT = page_limit
                for prefix, delimiter in (("", "/"), ("a/", "/"), ("", ""), ("a/", ""),
                                          ("", "\U0010ffff")):
                    for max_keys in (1, 2, 1000):
                        for rolled in (True, False):
                            got = walk(t, prefix, delimiter, max_keys, rolled)
                            want = model(sorted(keys), prefix, delimiter, "", 10**9)[:2]
                            if got != want:
                                failures.append((page_limit, prefix, delimiter, max_keys,
                                                 rolled, got, want))
        except BaseException as exc:    # reported below, not lost in the thread
            failures.append(exc)

    with replicas(tmp_path) as (dbs, t):
        for db in dbs:
            db.write({object_key(BUCKET, k): rec(1, False) for k in keys}, sync=False)
        old = listing.PAGE_LIMIT
        worker = threading.Thread(target=every_way, args=(t,), daemon=True)
        try:
            worker.start()
            worker.join(120)     # the bug was a listing that never ends: fail, not hang
            assert not worker.is_alive(), "a listing did not end"
        finally:
            listing.PAGE_LIMIT = old
    assert failures == []
    try:
        check_new_key("new/\U0010ffff")
    except BadRequest as exc:
        assert "U+10FFFF" in exc.message
    else:
        raise AssertionError("a new key holding U+10FFFF was taken")
