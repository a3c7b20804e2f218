"""repair's plan (store.repair.plan_object, pure) against a ring change not moved yet."""
from __future__ import annotations

from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.repair import plan_object
from store.striping import fragment_id

VID = "18edd7fc0cd219d3a0a746dc99e43510"


def nodes(count: int, tier: str = "hot") -> list[Node]:
    return [Node(id=f"s{i}", address=f"http://127.0.0.1:{9000 + i}", zone=f"s{i}", tier=tier)
            for i in range(1, count + 1)]


def record(segments: int) -> dict[str, Any]:
    return {"version_id": VID, "k": 4, "m": 2, "ec_type": "isa_l_rs_vand", "policy": "hot",
            "segment_size": 4 << 20, "size": segments * (4 << 20), "segments": segments,
            "handoffs": {}, "inline": None, "deleted": False, "ts": 1}


def test_a_fragment_still_at_its_previous_placement_is_not_missing() -> None:
    """After a reweight, before the rebalance: fragments sit where the previous ring put
    them, where readers look too. Repair counted each as missing (and objects as
    unrecoverable) and rebuilt what the rebalance was about to move; it reads them from
    there now. One found nowhere is still missing."""
    before = ClusterMap.initial(nodes(8), [Node(id="c1", address="http://127.0.0.1:9100",
                                                zone="c1", tier="control")])
    after = before.with_storage_ring(before.storage_ring("hot").reweight("s1", 3.0)[0])
    rec = record(40)
    pol = after.policy("hot")
    listings: dict[str, set[str]] = {n.id: set() for n in nodes(8)}
    moved = 0
    for seg in range(40):
        old = before.fragment_nodes(pol, VID, seg)
        new = after.fragment_nodes(pol, VID, seg)
        for i in range(6):
            listings[old[i].id].add(fragment_id(VID, seg, i))   # all where they were
            moved += old[i].id != new[i].id
    assert moved > 0
    assert plan_object(after, "b", "k", rec, listings).segments == ()
    lost = fragment_id(VID, 0, 0)
    for ids in listings.values():
        ids.discard(lost)
    plan = plan_object(after, "b", "k", rec, listings)
    assert [(s.segment, s.missing) for s in plan.segments] == [(0, (0,))]


def test_a_handoff_onto_a_node_the_map_now_gives_another_fragment_is_not_followed() -> None:
    """A put with a node down pins a fragment to a spare (record["handoffs"]); a ring
    change can make that spare the node of another fragment of the same segment. Readers,
    repair and rebalance followed the handoff: two fragments of the segment on one node,
    repair rebuilt onto it, and losing it and one more lost the object (crash sweep).
    Such a handoff is not followed: the fragment belongs where the map places it (the
    rebalance moves it there, else repair rebuilds it), so the segment's nodes stay
    distinct. A handoff onto a spare is followed; one onto a node gone from the map too."""
    from store.client_get import expected_fragment_nodes
    cmap = ClusterMap.initial(nodes(8), [Node(id="c1", address="http://127.0.0.1:9100",
                                              zone="c1", tier="control")])
    pol = cmap.policy("hot")
    row = cmap.fragment_nodes(pol, VID, 0)
    spare = next(n for n in nodes(8) if n.id not in {r.id for r in row})
    rec = record(1)
    rec["handoffs"] = {"0.4": row[1].id}       # another fragment's node now
    got = expected_fragment_nodes(cmap, rec, 0)
    assert [n.id for n in got] == [n.id for n in row]
    assert len({n.id for n in got}) == 6
    rec["handoffs"] = {"0.4": spare.id}
    assert expected_fragment_nodes(cmap, rec, 0)[4].id == spare.id
    rec["handoffs"] = {"0.4": "s99"}           # removed from the map
    assert [n.id for n in expected_fragment_nodes(cmap, rec, 0)] == [n.id for n in row]
