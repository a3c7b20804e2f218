"""`ecstore status`'s note of a storage node that came back empty (cli.main.empty_node_notes)."""
from __future__ import annotations

from typing import Any

from cli.main import EMPTY_NODE_NOTE_MIN, empty_node_notes


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
