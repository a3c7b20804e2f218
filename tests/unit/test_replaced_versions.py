"""An object record that replaces a live version names it (node.metadb.REPLACED), and gc
keeps what a record names for its grace after the replacement (store.gc.replaced_recently)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from node.metadb import REPLACED_FOR_NS, REPLACED_KEEP, GroupCommit, MetaDB, newest, object_key
from store.gc import replaced_recently
from store.names import PUTS_BUCKET

S = 10**9


def rec(vid: str, ts: int, deleted: bool = False, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "version_id": vid, "deleted": deleted, **extra}


def apply_all(tmp_path: Path, bucket: str, records: list[dict[str, Any]]
              ) -> list[tuple[bool, dict[str, Any]]]:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        commit = GroupCommit(db)

        async def go() -> list[tuple[bool, dict[str, Any]]]:
            return [await commit.apply(newest(object_key(bucket, "k"), r)) for r in records]
        out = asyncio.run(go())
        stored = db.get(object_key(bucket, "k"))
        assert stored == out[-1][1] or not out[-1][0]
        return out
    finally:
        db.close()


def test_an_overwrite_and_a_delete_name_what_they_replaced(tmp_path: Path) -> None:
    out = apply_all(tmp_path, "b", [rec("v1", 10 * S), rec("v2", 20 * S),
                                    rec("v3", 30 * S, deleted=True), rec("v4", 40 * S)])
    assert "replaced" not in out[0][1]                  # a new key replaces nothing
    assert out[1][1]["replaced"] == [["v1", 20 * S]]
    assert out[2][1]["replaced"] == [["v2", 30 * S], ["v1", 20 * S]]
    assert out[3][1]["replaced"] == [["v2", 30 * S], ["v1", 20 * S]]   # not the tombstone
    assert all(applied for applied, _ in out)


def test_older_arrivals_change_nothing_and_the_list_is_bounded(tmp_path: Path) -> None:
    records = [rec(f"v{i}", (i + 1) * S) for i in range(REPLACED_KEEP + 3)]
    records.append(rec("late", S // 2))                  # older than what is held: refused
    records.append(rec("far", records[-2]["ts"] + REPLACED_FOR_NS + S))
    out = apply_all(tmp_path, "b", records)
    assert out[-2][0] is False
    last_ok = out[-3][1]["replaced"]
    assert len(last_ok) == REPLACED_KEEP
    assert [v for v, _ in last_ok] == [f"v{i}" for i in range(REPLACED_KEEP + 1, 1, -1)]
    assert out[-1][1]["replaced"] == [[f"v{REPLACED_KEEP + 2}", records[-1]["ts"]]]  # a day on


def test_a_copied_record_keeps_what_it_names_and_system_buckets_name_nothing(tmp_path: Path) -> None:
    # read repair or a metadata move brings a record that names a version already
    copied = rec("v3", 30 * S, replaced=[["v2", 25 * S]])
    out = apply_all(tmp_path, "b", [rec("v1", 10 * S), copied])
    assert out[1][1]["replaced"] == [["v1", 30 * S], ["v2", 25 * S]]
    sysb = apply_all(tmp_path / "sys", PUTS_BUCKET, [rec("p1", 10 * S), rec("p2", 20 * S)])
    assert "replaced" not in sysb[1][1]


def test_gc_keeps_only_what_was_replaced_within_the_grace() -> None:
    r = rec("v9", 100 * S, replaced=[["v8", 100 * S], ["v7", 50 * S], ["bad"], [3, 99 * S]])
    assert replaced_recently(r, 60 * S) == ["v8"]
    assert replaced_recently(r, 10 * S) == ["v8", "v7"]
    assert replaced_recently(rec("v1", 1), 0) == []
