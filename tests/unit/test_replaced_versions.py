"""When an object record replaces a live one, the control node notes the versions the old
one read, beside it (node.metadb.new_notes, replaced_key), and gc keeps what any replica
noted for its grace after the replacement (store.gc.named_replaced, replaced_recently)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from node import control, metadb
from node.control import list_page
from node.metadb import (
    MAX_NOTED_ID,
    REPLACED_FOR_NS,
    GroupCommit,
    MetaDB,
    carried_notes,
    new_notes,
    newest,
    notes_of,
    object_key,
    pack_notes,
    replaced_key,
    trimmed_notes,
)
from store.errors import BadRequest
from store.gc import named_replaced, replaced_recently
from store.names import PUTS_BUCKET
from store.wire import pack

S = 10**9


def vid(created_ns: int, tag: int = 0) -> str:
    """A version id as ours are: its creation time (ns) in the first 16 hex digits."""
    return f"{created_ns:016x}{tag:016x}"


def rec(version_id: str, ts: int, deleted: bool = False, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "version_id": version_id, "deleted": deleted, "inline": None,
            "size": 100, "segments": 1, **extra}


def at(t_s: float, tag: int = 0, **extra: Any) -> dict[str, Any]:
    """A version created and committed at t_s."""
    return rec(vid(int(t_s * S), tag), int(t_s * S), **extra)


def test_an_overwrite_notes_what_the_old_version_read() -> None:
    old = at(10)
    assert new_notes(old, at(20)) == [(old["version_id"], 20 * S)]
    assert new_notes(old, at(30, deleted=True)) == [(old["version_id"], 30 * S)]   # a delete
    assert new_notes(at(30, deleted=True), old) == []           # a tombstone read nothing
    assert new_notes({**old, "inline": b"x"}, at(20)) == []     # nor an inline object
    assert new_notes(old, at(10.5)) == []                       # lived under a second
    p1, p2 = vid(5 * S, 1), vid(6 * S, 2)
    multi = at(9, parts=[{"version_id": p1, "size": 5, "segments": 1},
                         {"version_id": p2, "size": 5, "segments": 1}])
    assert sorted(v for v, _ in new_notes(multi, at(20))) == sorted([p1, p2])   # its parts
    assert new_notes(multi, {**multi, "ts": 30 * S}) == []      # an ACL change: still read
    moved = rec(vid(40 * S), 20 * S, tiered_from=vid(10 * S), tiered_from_versions=[vid(10 * S)])
    assert dict(new_notes(moved, at(50))) == {vid(40 * S): 50 * S, vid(10 * S): 40 * S}
    # a record of another shape never stops the put that replaces it
    for odd in ({**multi, "parts": [{"version_id": None, "size": 1, "segments": 1}]},
                {**moved, "tiered_from_versions": 5}, {**old, "version_id": 7},
                {**old, "parts": "?"}):
        new_notes(odd, at(60))


def test_every_fresh_and_young_note_is_kept_and_the_older_ones_are_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadb, "REPLACED_KEEP", 10)
    now = 5 * 3600 * S
    held = [(vid(int((100 + 20 * i) * S), i), int((120 + 20 * i) * S)) for i in range(50)]
    lasting = (vid(200 * S, 99), 4000 * S)                       # lived an hour: kept
    held.insert(20, lasting)
    # a multipart object's 300 parts, noted at an overwrite half an hour ago: all kept
    group = [(vid(300 * S, 1000 + i), now - 1800 * S) for i in range(300)]
    fresh = [(vid(400 * S, 5000 + i), now) for i in range(40)]
    out = trimmed_notes(held + group, fresh, now)
    assert out[-40:] == fresh                                    # every fresh one, last
    assert set(group) <= set(out)                                # young: never dropped
    older = [e for e in out if e not in group and e not in fresh]
    assert len(older) == 10 and lasting in older                 # the longest-lived
    assert trimmed_notes(out, [], now + REPLACED_FOR_NS + S) == []   # a day on
    # 10,000 young parts: every one kept, no room left for older notes (the bytes stay
    # under half the trim bound when they can, so the next puts append, not trim again)
    big = [(vid(300 * S, 20000 + i), now - 1800 * S) for i in range(10_000)]
    out = trimmed_notes(held + big, fresh, now)
    assert set(big) <= set(out) and out[-40:] == fresh and len(out) == 10_040
    few = trimmed_notes(held, [], now)
    assert len(pack_notes(few)) <= metadb.REPLACED_TRIM_BYTES // 2


def commit_all(db: MetaDB, bucket: str, key: str, records: list[dict[str, Any]]) -> list[bool]:
    commit = GroupCommit(db)

    async def go() -> list[bool]:
        return [(await commit.apply(newest(object_key(bucket, key), r, pack(r))))[0]
                for r in records]
    return asyncio.run(go())


def test_notes_are_appended_beside_the_record_trimmed_and_deleted_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        recs = [at(10), at(20), at(20.5), at(40)]
        assert commit_all(db, "b", "k", recs) == [True] * 4
        assert db.get_raw(object_key("b", "k")) == pack(recs[3])   # the record as it came
        rk = replaced_key(object_key("b", "k"))
        # v3 lived half a second: not noted
        assert notes_of(db.get_raw(rk)) == [(recs[0]["version_id"], 20 * S),
                                            (recs[2]["version_id"], 40 * S)]
        assert commit_all(db, "b", "k", [at(5)]) == [False]         # older: nothing changes
        commit_all(db, PUTS_BUCKET, "k", recs)                       # a system bucket: none
        assert db.get_raw(replaced_key(object_key(PUTS_BUCKET, "k"))) is None
        monkeypatch.setattr(metadb, "REPLACED_TRIM_BYTES", 200)
        monkeypatch.setattr(metadb, "REPLACED_KEEP", 2)
        monkeypatch.setattr(metadb, "REPLACED_FLOOR_NS", 0)
        commit_all(db, "b", "k", [at(40 + 10 * i, i) for i in range(1, 12)])
        assert len(db.get_raw(rk)) < 200 + 60                        # trimmed as it grew
        assert notes_of(db.get_raw(rk))[-1] == (at(140, 10)["version_id"], 150 * S)

        def purge(view: metadb.View) -> None:
            view.delete(object_key("b", "k"))
        asyncio.run(GroupCommit(db).apply(purge))
        assert db.get_raw(rk) is None
        db.write({rk: b"\xc1garbage"}, sync=False)                    # unreadable notes
        assert commit_all(db, "b", "k", [at(500), at(600)]) == [True, True]
        assert notes_of(db.get_raw(rk)) == [(at(500)["version_id"], 600 * S)]   # rewritten

        long_id = {**at(700), "version_id": "f" * 200}                # not one of ours
        commit_all(db, "b", "k", [long_id, at(800), at(900)])
        assert [v for v, _ in notes_of(db.get_raw(rk))][-1] == at(800)["version_id"]
    finally:
        db.close()


def test_notes_go_a_quarter_day_after_their_day_not_at_every_put(tmp_path: Path) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        day = REPLACED_FOR_NS // S
        t1 = 40 + day * 13 // 10
        recs = [at(10), at(20), at(30), at(t1), at(t1 + 10), at(t1 + day * 11 // 10)]
        commit_all(db, "b", "k", recs[:5])
        rk = replaced_key(object_key("b", "k"))
        # at t1 the oldest note (20) was past a day and a quarter: trimmed to a day
        assert notes_of(db.get_raw(rk)) == [(recs[2]["version_id"], t1 * S),
                                            (recs[3]["version_id"], (t1 + 10) * S)]
        commit_all(db, "b", "k", recs[5:])
        # its oldest (t1) now 1.1 days old: appended to, not rewritten
        assert [at_ for _, at_ in notes_of(db.get_raw(rk))] == [t1 * S, (t1 + 10) * S,
                                                                 recs[5]["ts"]]
    finally:
        db.close()


def test_a_listing_pages_the_notes_since_the_grace_and_ends_early_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    now = __import__("time").time_ns() // S
    try:
        for i in range(6):
            commit_all(db, "b", f"m{i}", [at(now - 100, i), at(now - 50, i), at(now - 10, i)])
        seen: dict[str, Any] = {}
        after, pages = "", 0
        while True:
            page = list_page(db, "b", "", after, 2, "", replaced=True)
            seen.update(page["replaced"])
            pages += 1
            if not page["truncated"]:
                break
            after = page["records"][-1]["key"]
        assert pages == 3 and sorted(seen) == [f"m{i}" for i in range(6)]
        assert all(len(v) == 2 for v in seen.values())
        since = list_page(db, "b", "", "", 10, "", replaced=True, replaced_since=(now - 20) * S)
        assert all(len(v) == 1 for v in since["replaced"].values())   # only the last one
        assert "replaced" not in list_page(db, "b", "", "", 10, "")   # only when asked
        commit_all(db, "b", "t", [at(now - 100), at(now - 50, deleted=True)])   # a tombstone
        monkeypatch.setattr(control, "MAX_NOTES_PER_PAGE", 3)
        cut = list_page(db, "b", "", "", 10, "", replaced=True)
        assert cut["truncated"] and [r["key"] for r in cut["records"]] == ["m0", "m1"]
        assert sorted(cut["replaced"]) == ["m0", "m1"]
        for cap, limit, rows in ((1, 1, False), (3, 4, True), (5, 3, False), (100, 2, True)):
            # gc's crawl, resumed after the last record of each page: every key and note
            monkeypatch.setattr(control, "MAX_NOTES_PER_PAGE", cap)
            keys: list[str] = []
            notes: dict[str, Any] = {}
            after = ""
            for _ in range(50):
                page = list_page(db, "b", "", after, limit, "", rows=rows, replaced=True)
                got = [r[0] for r in page["rows"]] if rows else [r["key"] for r in page["records"]]
                assert got or not page["truncated"], page
                keys += got
                notes.update(page["replaced"])
                if not page["truncated"]:
                    break
                after = got[-1]
            assert keys == [*(f"m{i}" for i in range(6)), "t"]
            assert sorted(notes) == keys and all(len(v) == 2 for k, v in notes.items() if k != "t")
        with pytest.raises(BadRequest):
            list_page(db, "b", "", "", 10, "/", replaced=True)
    finally:
        db.close()


def test_a_notes_only_listing_pages_the_keys_with_notes_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc reads the notes after the live records (store.gc.replaced_notes): notes=1 lists
    only the keys that have notes, resumed after "last", bounded by keys and notes read."""
    db = MetaDB(tmp_path / "db", sync=False)
    now = __import__("time").time_ns() // S
    try:
        for i in range(5):
            commit_all(db, "b", f"m{i}", [at(now - 100, i), at(now - 50, i), at(now - 10, i)])
        commit_all(db, "b", "plain", [at(now - 5)])        # one record: no notes
        commit_all(db, "c", "m0", [at(now - 100), at(now - 50)])   # another bucket's
        for rows in (False, True):
            for cap, limit in ((100, 1), (100, 2), (1, 10), (3, 10), (100, 100)):
                monkeypatch.setattr(control, "MAX_NOTES_PER_PAGE", cap)
                notes: dict[str, Any] = {}
                after, pages = "", 0
                for _ in range(20):
                    page = list_page(db, "b", "", after, limit, "", rows=rows, replaced=True,
                                     notes_only=True)
                    pages += 1
                    assert page["rows" if rows else "records"] == []
                    assert not set(page["replaced"]) & set(notes)
                    notes.update(page["replaced"])
                    if not page["truncated"]:
                        break
                    after = page["last"]
                assert sorted(notes) == [f"m{i}" for i in range(5)], (cap, limit)
                assert all(len(v) == 2 for v in notes.values())
                assert pages >= -(-5 // limit)
        since = list_page(db, "b", "", "", 10, "", replaced=True, notes_only=True,
                          replaced_since=(now - 20) * S)
        assert [len(v) for v in since["replaced"].values()] == [1] * 5
        assert list_page(db, "b", "m3", "", 10, "", replaced=True,
                         notes_only=True)["replaced"].keys() == {"m3"}
        with pytest.raises(BadRequest):
            list_page(db, "b", "", "", 10, "", notes_only=True)   # needs replaced=1
    finally:
        db.close()


def test_notes_a_metadata_move_brings_are_merged_with_those_held(tmp_path: Path) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    now = __import__("time").time_ns()
    try:
        k = object_key("b", "k")
        held = at(now // S - 100)
        commit_all(db, "b", "k", [held, at(now // S - 50)])
        mine = notes_of(db.get_raw(replaced_key(k)))
        assert [v for v, _ in mine] == [held["version_id"]]
        brought = [(vid(now - 300 * S, 1), now - 200 * S),          # new
                   mine[0],                                         # held already
                   (vid(now - 3 * REPLACED_FOR_NS, 2), now - 2 * REPLACED_FOR_NS),  # too old
                   ("x" * (MAX_NOTED_ID + 1), now - S)]             # not an id we note
        commit = GroupCommit(db)
        added = asyncio.run(commit.apply(carried_notes(k, brought, now)))
        assert added == 1
        got = notes_of(db.get_raw(replaced_key(k)))
        assert sorted(got) == sorted([mine[0], brought[0]])
        assert asyncio.run(commit.apply(carried_notes(k, brought, now))) == 0   # again: none
        assert notes_of(db.get_raw(replaced_key(k))) == got
        fresh = object_key("b", "new")          # a key this node holds no notes of
        assert asyncio.run(commit.apply(carried_notes(fresh, brought[:1], now))) == 1
        assert notes_of(db.get_raw(replaced_key(fresh))) == brought[:1]
    finally:
        db.close()


def test_gc_keeps_what_was_noted_within_the_grace() -> None:
    merged: dict[str, int] = {}
    for entries in ([["v8", 100 * S], ["v7", 50 * S]], [["v7", 60 * S], ["bad"], [3, S]]):
        for v, t in named_replaced(entries):
            merged[v] = max(t, merged.get(v, t))
    assert merged == {"v8": 100 * S, "v7": 60 * S}
    assert replaced_recently(merged, 70 * S) == {"v8"}
    assert replaced_recently(merged, 10 * S) == {"v8", "v7"}
    assert pack_notes([("a", 1)]) == pack(["a", 1])


def test_gc_waits_for_the_read_repairs_and_the_writes_they_start() -> None:
    """store.gc.settle: until no background task is left (a repair's writes are started
    by the repair: one look at the set missed them), within its deadline."""
    from types import SimpleNamespace

    from store.gc import settle

    async def go() -> tuple[list[str], bool, bool]:
        done: list[str] = []
        background: set[asyncio.Future[Any]] = set()
        c: Any = SimpleNamespace(meta=SimpleNamespace(background=background))

        async def write() -> None:
            await asyncio.sleep(0.05)
            done.append("write")

        async def repair() -> None:
            await asyncio.sleep(0.05)
            background.add(asyncio.ensure_future(write()))   # as Metadata._quorum does
            done.append("repair")
        background.add(asyncio.ensure_future(repair()))
        settled = await settle(c, timeout_s=5)
        background.add(asyncio.ensure_future(asyncio.sleep(3)))
        late = await settle(c, timeout_s=0.1)
        for t in background:
            t.cancel()
        return done, settled, late
    done, settled, late = asyncio.run(go())
    assert done == ["repair", "write"] and settled and not late
