"""An object record that replaces a live version names the versions a reader of it read
from (node.metadb.REPLACED), and gc keeps what any replica names for its grace after the
replacement (store.gc.named_replaced, replaced_recently)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from node import metadb
from node.metadb import REPLACED_FOR_NS, GroupCommit, MetaDB, newest, object_key
from store.gc import named_replaced, replaced_recently
from store.names import PUTS_BUCKET
from store.wire import MAX_RECORD_BYTES, pack

S = 10**9


def vid(created_s: int, tag: int = 0) -> str:
    """A version id as ours are: its creation time (ns) in the first 16 hex digits."""
    return f"{created_s * S:016x}{tag:016x}"


def rec(version_id: str, ts: int, deleted: bool = False, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "version_id": version_id, "deleted": deleted, "inline": None,
            "size": 100, "segments": 1, **extra}


def apply_all(tmp_path: Path, bucket: str, records: list[dict[str, Any]]
              ) -> list[tuple[bool, dict[str, Any]]]:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        commit = GroupCommit(db)

        async def go() -> list[tuple[bool, dict[str, Any]]]:
            return [await commit.apply(newest(object_key(bucket, "k"), r)) for r in records]
        out = asyncio.run(go())
        if out[-1][0]:
            assert db.get(object_key(bucket, "k")) == out[-1][1]   # stored as answered
        return out
    finally:
        db.close()


def names(r: dict[str, Any]) -> list[str]:
    return [v for v, _ in r.get("replaced", [])]


def test_an_overwrite_and_a_delete_name_what_they_replaced(tmp_path: Path) -> None:
    v1, v2, v3, v4 = (vid(i) for i in (1, 2, 3, 4))
    out = apply_all(tmp_path, "b", [rec(v1, 10 * S), rec(v2, 20 * S),
                                    rec(v3, 30 * S, deleted=True), rec(v4, 40 * S)])
    assert "replaced" not in out[0][1]                  # a new key replaces nothing
    assert out[1][1]["replaced"] == [[v1, 20 * S]]
    assert out[2][1]["replaced"] == [[v2, 30 * S], [v1, 20 * S]]
    assert out[3][1]["replaced"] == [[v2, 30 * S], [v1, 20 * S]]   # not the tombstone
    assert all(applied for applied, _ in out)


def test_a_multipart_object_names_its_parts_and_a_moved_one_what_the_move_replaced(
        tmp_path: Path) -> None:
    p1, p2, obj, moved_from, moved, nxt = (vid(i) for i in range(1, 7))
    multi = rec(obj, 10 * S, parts=[{"version_id": p1, "size": 5, "segments": 1},
                                    {"version_id": p2, "size": 5, "segments": 1}])
    out = apply_all(tmp_path, "b", [multi, rec(nxt, 20 * S)])
    assert sorted(names(out[1][1])) == sorted([p1, p2])          # not obj: no fragments
    tiered = rec(moved, 30 * S, tiered_from=moved_from, tiered_from_versions=[moved_from])
    out = apply_all(tmp_path / "t", "b", [tiered, rec(nxt, 40 * S)])
    assert dict(out[1][1]["replaced"]) == {moved: 40 * S, moved_from: 5 * S}   # the move's time
    inline = {**rec(obj, 10 * S), "inline": b"x"}
    assert "replaced" not in apply_all(tmp_path / "i", "b", [inline, rec(nxt, 20 * S)])[1][1]


def test_older_arrivals_change_nothing_and_the_names_are_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadb, "REPLACED_KEEP", 3)
    records = [rec(vid(100 - i), (i + 1) * S) for i in range(6)]   # created later, earlier
    records.append(rec(vid(200), S // 2))                # older than what is held: refused
    out = apply_all(tmp_path, "b", records)
    assert out[-1][0] is False
    # past the bound the versions created last go first (the creation rule keeps them)
    assert sorted(names(out[-2][1])) == sorted(vid(100 - i) for i in (2, 3, 4))
    far = rec(vid(300), records[5]["ts"] + REPLACED_FOR_NS + S)
    assert apply_all(tmp_path / "f", "b", [records[5], far])[1][1]["replaced"] == \
        [[vid(95), far["ts"]]]                            # a day on: what came before is gone


def test_a_copied_record_keeps_its_names_and_system_buckets_and_big_records_name_nothing(
        tmp_path: Path) -> None:
    v1, v2, v3 = vid(1), vid(2), vid(3)
    copied = rec(v3, 30 * S, replaced=[[v2, 30 * S]])    # read repair, a metadata move
    out = apply_all(tmp_path, "b", [rec(v1, 10 * S), copied])
    assert out[1][1]["replaced"] == [[v1, 30 * S], [v2, 30 * S]]
    sysb = apply_all(tmp_path / "sys", PUTS_BUCKET, [rec(v1, 10 * S), rec(v2, 20 * S)])
    assert "replaced" not in sysb[1][1]
    big = rec(v2, 20 * S, meta={"x": ""})
    big["meta"]["x"] = "y" * (MAX_RECORD_BYTES - 10 - len(pack(big)))
    assert MAX_RECORD_BYTES - 20 < len(pack(big)) <= MAX_RECORD_BYTES   # a name would not fit
    out = apply_all(tmp_path / "big", "b", [rec(v1, 10 * S), big])
    assert out[1][0] and "replaced" not in out[1][1]     # stored as it came, readable


def test_gc_keeps_what_any_replica_named_within_the_grace() -> None:
    merged: dict[str, int] = {}
    for entries in ([["v8", 100 * S], ["v7", 50 * S]], [["v7", 60 * S], ["bad"], [3, S]]):
        for v, at in named_replaced(entries):
            merged[v] = max(at, merged.get(v, at))
    assert merged == {"v8": 100 * S, "v7": 60 * S}
    assert replaced_recently(merged, 70 * S) == {"v8"}
    assert replaced_recently(merged, 10 * S) == {"v8", "v7"}
