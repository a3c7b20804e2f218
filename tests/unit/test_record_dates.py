"""A control node notes records put dated ahead of its clock (node.metadb.MetaDB.
note_record_date): their writer's clock, or the node's, is off."""
from __future__ import annotations

import time
from pathlib import Path

from node.metadb import CLOCK_AHEAD_NOTE_S, MetaDB


def test_only_records_dated_past_the_margin_ahead_are_noted(tmp_path: Path) -> None:
    db = MetaDB(tmp_path / "db", sync=False)
    try:
        now = time.time_ns()
        db.note_record_date(now - 3_600 * 10**9)            # an old record (repair's copy)
        db.note_record_date(now)
        db.note_record_date(now + int((CLOCK_AHEAD_NOTE_S - 0.5) * 1e9))   # within NTP's noise
        assert db.future_records.count == 0 and db.recent_problems() == []
        db.note_record_date(now + 30 * 10**9)
        db.note_record_date(now + 45 * 10**9)
        assert db.future_records.count == 2
        [problem] = db.recent_problems()
        assert "2 since start" in problem and "dated 4" in problem and "NTP" in problem
    finally:
        db.close()
