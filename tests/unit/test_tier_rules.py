"""store.tiering.decide: what a tiering pass does with one live record - idle hot objects
go cold, busy cold ones come back, and an object of an S3 archive storage class goes cold
at once and stays there however often it is read."""
from __future__ import annotations

from typing import Any

import pytest

from store.tiering import ARCHIVE_CLASSES, TierRules, Usage, decide

NOW = 1_800_000_000.0
DAY = 86400.0
RULES = TierRules(cold_after_s=7 * DAY, promote_reads=3, window_s=3600.0)


def rec(policy: str, age_s: float, **more: Any) -> dict[str, Any]:
    return {"policy": policy, "ts": int((NOW - age_s) * 1e9), "inline": None, **more}


def read(times: int, ago_s: float = 60.0) -> Usage:
    minute = str(int((NOW - ago_s) // 60))
    return Usage(NOW - ago_s, {minute: times})


NEVER = Usage(0.0, {})


def test_idle_hot_objects_go_cold_and_busy_cold_ones_come_back() -> None:
    assert decide(rec("hot", 6 * DAY), NEVER, RULES, NOW) is None
    assert decide(rec("hot", 8 * DAY), NEVER, RULES, NOW) == "demote"
    assert decide(rec("hot", 8 * DAY), read(1), RULES, NOW) is None          # read just now
    assert decide(rec("cold", 30 * DAY), read(3), RULES, NOW) == "promote"
    assert decide(rec("cold", 30 * DAY), read(2), RULES, NOW) is None
    assert decide(rec("cold", 30 * DAY), read(9, ago_s=2 * 3600), RULES, NOW) is None
    # infrequent access is still tiered by use: the class asks for no medium
    ia = {"storage_class": "STANDARD_IA"}
    assert decide(rec("hot", 8 * DAY, **ia), NEVER, RULES, NOW) == "demote"
    assert decide(rec("cold", 30 * DAY, **ia), read(3), RULES, NOW) == "promote"


@pytest.mark.parametrize("cls", sorted(ARCHIVE_CLASSES))
def test_archive_classes_go_cold_at_once_and_stay(cls: str) -> None:
    assert decide(rec("hot", 0.0, storage_class=cls), read(50), RULES, NOW) == "demote"
    assert decide(rec("cold", 30 * DAY, storage_class=cls), read(50), RULES, NOW) is None
    assert decide(rec("cold", 0.0, storage_class=cls), NEVER, RULES, NOW) is None
    inline = rec("hot", 0.0, storage_class=cls) | {"inline": b"x"}
    assert decide(inline, NEVER, RULES, NOW) is None                          # no fragments
    deleted = rec("hot", 0.0, storage_class=cls) | {"deleted": True}
    assert decide(deleted, NEVER, RULES, NOW) is None


def test_the_archive_classes_are_s3s() -> None:
    assert ARCHIVE_CLASSES == {"GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"}


def _vid(at: float) -> str:
    """A version id created at unix time `at` (its first 16 hex digits: ns)."""
    return f"{int(at * 1e9):016x}" + "0" * 16


def test_reads_before_a_demotion_do_not_bring_the_object_back() -> None:
    """With --cold-after under --window, an object read a few times and then left alone
    was demoted, and the next pass promoted it for the reads before the demotion - by
    turns, every pass rewriting it. Reads after the move count; an object written cold
    (no move) counts every read in the window."""
    rules = TierRules(cold_after_s=60.0, promote_reads=3, window_s=3600.0)
    moved = rec("cold", 2 * DAY, tiered_from="a" * 32, version_id=_vid(NOW - 300))
    assert decide(moved, read(5, ago_s=600), rules, NOW) is None        # read, then demoted
    assert decide(moved, read(5, ago_s=120), rules, NOW) == "promote"   # read since
    written_cold = rec("cold", 2 * DAY, version_id=_vid(NOW - 2 * DAY))
    assert decide(written_cold, read(5, ago_s=600), rules, NOW) == "promote"
