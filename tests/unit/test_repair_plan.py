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
