"""`ecstore status`'s note of a storage node that came back empty (cli.main.empty_node_notes)."""
from __future__ import annotations

from typing import Any

from cli.main import EMPTY_CONTROL_NOTE_MIN, EMPTY_NODE_NOTE_MIN, empty_node_notes, slow_node_notes


def row(node: str, fragments: int | None, tier: str = "hot", role: str = "storage",
        state: str = "up") -> dict[str, Any]:
    r: dict[str, Any] = {"id": node, "role": role, "tier": tier, "state": state}
    if fragments is not None:
        r["fragments"] = fragments
    return r


def test_an_empty_node_beside_full_ones_of_its_tier_is_noted() -> None:
    rows = [row("s1", 40), row("s2", 0), row("s3", 35), row("c1", None, "", "control")]
    [note] = empty_node_notes(rows)
    assert note.startswith("s2 holds no fragments while s1 (tier hot) holds 40")


def test_no_note_for_a_new_cluster_a_down_node_or_another_tier() -> None:
    assert empty_node_notes([row("s1", 0), row("s2", 0)]) == []           # nothing put yet
    assert empty_node_notes([row("s1", EMPTY_NODE_NOTE_MIN - 1), row("s2", 0)]) == []
    assert empty_node_notes([row("s1", 500), row("s2", None, state="down")]) == []
    # a cold tier's node holds nothing while the hot ones are full: nothing was demoted
    assert empty_node_notes([row("s1", 500), row("s2", 400), row("a1", 0, "cold")]) == []
    assert [n[:3] for n in empty_node_notes([row("a1", 30, "cold"), row("a2", 0, "cold")])] \
        == ["a2 "]


def control(node: str, records: int | None, state: str = "up") -> dict[str, Any]:
    r: dict[str, Any] = {"id": node, "role": "control", "tier": "", "state": state}
    if records is not None:
        r["records"] = records
    return r


def test_a_control_node_holding_far_fewer_records_is_noted() -> None:
    rows = [control("c1", 900), control("c2", 3), control("c3", 870), row("s1", 40)]
    [note] = empty_node_notes(rows)
    assert note.startswith("c2 holds about 3 metadata records while c1 holds about 900")
    assert "ecstore repair" in note
    # a share an eighth of the fullest's is still noted; more is not (RocksDB's count is
    # an estimate, a node that missed a few writes is not worth a note)
    assert [n[:3] for n in empty_node_notes([control("c1", 800), control("c2", 99)])] == ["c2 "]
    assert empty_node_notes([control("c1", 800), control("c2", 100)]) == []


def test_no_control_note_for_a_young_cluster_or_a_down_node() -> None:
    assert empty_node_notes([control("c1", EMPTY_CONTROL_NOTE_MIN - 1), control("c2", 0)]) == []
    assert empty_node_notes([control("c1", 5000), control("c2", None, state="down")]) == []
    assert empty_node_notes([control("c1", 5000), control("c2", 4900),
                             control("c3", 5100)]) == []


def timed(node: str, ms: float) -> dict[str, Any]:
    return {"id": node, "role": "storage", "tier": "hot", "state": "up", "answered_ms": ms}


def test_a_node_answering_far_slower_than_the_others_is_noted() -> None:
    rows = [timed("s1", 2300), timed("s2", 12), timed("s3", 15), timed("c1", 9),
            {"id": "s4", "role": "storage", "tier": "hot", "state": "down"}]
    [note] = slow_node_notes(rows)
    assert note.startswith("s1 answered in 2300 ms, the others in 12 ms (median)")
    # slow, but all alike (a loaded client or host): nothing to single out; fast: no note
    assert slow_node_notes([timed("s1", 1500), timed("s2", 1400), timed("s3", 1600)]) == []
    assert slow_node_notes([timed("s1", 900), timed("s2", 10), timed("s3", 10)]) == []
    assert slow_node_notes([timed("s1", 5000)]) == []


def test_status_rows_are_in_natural_order_by_role() -> None:
    from cli.main import status_order
    rows = [{"id": i, "role": r} for i, r in
            [("gateway", "gateway"), ("s10", "storage"), ("c2", "control"), ("s3", "storage"),
             ("s1", "storage"), ("c10", "control"), ("c1", "control"), ("s1a", "storage")]]
    assert [r["id"] for r in sorted(rows, key=status_order)] == \
        ["c1", "c2", "c10", "s1", "s1a", "s3", "s10", "gateway"]
