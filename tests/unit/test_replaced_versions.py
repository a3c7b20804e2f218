"""When an object record replaces a live one, the control node notes the versions the old
one read, beside it (node.metadb.replaced_names, replaced_key), and gc keeps what any
replica noted for its grace after the replacement (store.gc.named_replaced,
replaced_recently)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from node import metadb
from node.control import list_page
from node.metadb import (
    REPLACED_FOR_NS,
    GroupCommit,
    MetaDB,
    newest,
    object_key,
    replaced_key,
    replaced_names,
)
from store.gc import named_replaced, replaced_recently
from store.names import PUTS_BUCKET
from store.wire import pack, unpack

S = 10**9


def vid(created_ns: int, tag: int = 0) -> str:
    """A version id as ours are: its creation time (ns) in the first 16 hex digits."""
    return f"{created_ns:016x}{tag:016x}"


def rec(version_id: str, ts: int, deleted: bool = False, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "version_id": version_id, "deleted": deleted, "inline": None,
            "size": 100, "segments": 1, **extra}


def history(n: int, every_ns: int, start_ns: int = 1000 * S) -> list[dict[str, Any]]:
    """n versions of one key, each written every_ns after the one before (created and
    committed at once)."""
    return [rec(vid(start_ns + i * every_ns, i), start_ns + i * every_ns) for i in range(n)]


def replay(records: list[dict[str, Any]]) -> list[list[Any]]:
    """The names held after each record in turn replaced the one before (what newest()
    does on one control node), the last."""
    held: list[list[Any]] = []
    for before, after in zip(records, records[1:]):
        held = replaced_names(held, before, after)
    return held


def names(held: list[list[Any]]) -> list[str]:
    return [v for v, _ in held]


def test_an_overwrite_names_what_the_old_version_read() -> None:
    old = rec(vid(10 * S), 10 * S)
    assert replaced_names(None, old, rec(vid(20 * S), 20 * S)) == [[old["version_id"], 20 * S]]
    tomb = rec(vid(30 * S), 30 * S, deleted=True)
    assert names(replaced_names(None, old, tomb)) == [old["version_id"]]   # a delete too
    assert replaced_names(None, tomb, old) == []                           # a tombstone read none
    assert replaced_names(None, {**old, "inline": b"x"}, tomb) == []       # nor an inline one
    p1, p2 = vid(5 * S, 1), vid(6 * S, 2)
    multi = rec(vid(9 * S), 9 * S, parts=[{"version_id": p1, "size": 5, "segments": 1},
                                          {"version_id": p2, "size": 5, "segments": 1}])
    assert sorted(names(replaced_names(None, multi, tomb))) == sorted([p1, p2])  # its parts
    moved = rec(vid(40 * S), 20 * S, tiered_from=vid(10 * S), tiered_from_versions=[vid(10 * S)])
    assert dict(map(tuple, replaced_names(None, moved, rec(vid(50 * S), 50 * S)))) == {
        vid(40 * S): 50 * S, vid(10 * S): 40 * S}   # what the move replaced: at the move
    same = {**multi, "ts": multi["ts"] + 1}         # an ACL change: the same parts, still live
    assert replaced_names(None, multi, same) == []


def test_a_long_lived_version_is_named_whatever_came_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The version just overwritten after living long is what a reader is on: it is named
    whatever the history - 5,000 overwrites half a second apart (too short-lived to need a
    name: none noted), or more long-enough ones than the bound (those that lived least go)."""
    quick = history(5_000, S // 2)
    lasting = rec(vid(quick[-1]["ts"] + S // 2, 9), quick[-1]["ts"] + S // 2)
    nxt = rec(vid(lasting["ts"] + 2 * 3600 * S, 10), lasting["ts"] + 2 * 3600 * S)
    assert replay(quick) == []
    assert names(replay([*quick, lasting, nxt])) == [lasting["version_id"]]
    monkeypatch.setattr(metadb, "REPLACED_KEEP", 10)
    many = history(50, 2 * S)
    lasting = rec(vid(many[-1]["ts"] + 2 * S, 9), many[-1]["ts"] + 2 * S)
    nxt = rec(vid(lasting["ts"] + 3600 * S, 10), lasting["ts"] + 3600 * S)
    held = replay([*many, lasting, nxt])
    assert len(held) == 10 and held[0] == [lasting["version_id"], nxt["ts"]]
    far = rec(vid(nxt["ts"] + REPLACED_FOR_NS + S, 11), nxt["ts"] + REPLACED_FOR_NS + S)
    assert names(replaced_names(held, nxt, far)) == [nxt["version_id"]]   # a day on


def apply_all(db: MetaDB, bucket: str, records: list[dict[str, Any]]) -> list[bool]:
    commit = GroupCommit(db)

    async def go() -> list[bool]:
        return [(await commit.apply(newest(object_key(bucket, "k"), r, pack(r))))[0]
                for r in records]
    return asyncio.run(go())


def test_the_names_are_kept_beside_the_record_listed_for_gc_and_deleted_with_it(
        tmp_path: Path) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        v = [vid(i * 10 * S) for i in range(1, 4)]
        recs = [rec(v[0], 10 * S), rec(v[1], 20 * S), rec(v[2], 30 * S)]
        assert apply_all(db, "b", recs) == [True, True, True]
        assert db.get_raw(object_key("b", "k")) == pack(recs[2])     # the record as it came
        assert unpack(db.get_raw(replaced_key(object_key("b", "k")))) == \
            [[v[1], 30 * S], [v[0], 20 * S]]
        assert apply_all(db, "b", [rec(v[0], 5 * S)]) == [False]      # older: nothing changes
        apply_all(db, PUTS_BUCKET, recs)                              # a system bucket: none
        assert db.get_raw(replaced_key(object_key(PUTS_BUCKET, "k"))) is None
        for i in range(5):                                            # more keys for paging
            commit = GroupCommit(db)
            asyncio.run(commit.apply(newest(object_key("b", f"m{i}"), recs[0])))
            asyncio.run(commit.apply(newest(object_key("b", f"m{i}"), recs[1])))
        seen: dict[str, Any] = {}
        after, pages = "", 0
        while True:
            page = list_page(db, "b", "", after, 2, "", replaced=True)
            seen.update(page["replaced"])
            pages += 1
            if not page["truncated"]:
                break
            after = page["records"][-1]["key"]
        assert pages == 3 and sorted(seen) == ["k", "m0", "m1", "m2", "m3", "m4"]
        assert seen["m3"] == [[v[0], 20 * S]]
        assert "replaced" not in list_page(db, "b", "", "", 10, "")   # only when asked

        def purge(view: metadb.View) -> None:
            view.delete(object_key("b", "k"))
        asyncio.run(GroupCommit(db).apply(purge))
        assert db.get_raw(replaced_key(object_key("b", "k"))) is None
    finally:
        db.close()


def test_gc_keeps_what_any_replica_named_within_the_grace() -> None:
    merged: dict[str, int] = {}
    for entries in ([["v8", 100 * S], ["v7", 50 * S]], [["v7", 60 * S], ["bad"], [3, S]]):
        for v, at in named_replaced(entries):
            merged[v] = max(at, merged.get(v, at))
    assert merged == {"v8": 100 * S, "v7": 60 * S}
    assert replaced_recently(merged, 70 * S) == {"v8"}
    assert replaced_recently(merged, 10 * S) == {"v8", "v7"}
