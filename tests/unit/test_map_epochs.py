"""A ring change keeps the previous placement so readers can look in both places."""
from __future__ import annotations

from placement.cluster_map import ClusterMap
from placement.nodes import Node


def nodes(prefix: str, count: int, tier: str = "hot") -> list[Node]:
    return [Node(id=f"{prefix}{i}", address=f"http://127.0.0.1:{9000 + i}", zone=f"{prefix}{i}",
                 tier=tier) for i in range(1, count + 1)]


def test_storage_ring_change_keeps_the_previous_rings_and_round_trips() -> None:
    cmap = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    grown = cmap.with_storage_ring(cmap.storage_ring("hot").add(nodes("s", 7)[-1])[0])
    assert grown.epoch == 2 and grown.previous_epoch == 1
    assert grown.previous_storage_rings == cmap.storage_rings
    back = ClusterMap.from_bytes(grown.to_bytes())
    assert back == grown
    pol = grown.policy()
    moved = 0
    for seg in range(500):
        now = grown.fragment_nodes(pol, "v" * 32, seg)
        for i in range(pol.n):
            before = grown.previous_fragment_node(pol, "v" * 32, seg, i)
            assert before == cmap.fragment_nodes(pol, "v" * 32, seg)[i]
            if before != now[i]:
                assert now[i].id == "s7"  # a placement only ever moves onto the new node
                moved += 1
    assert moved > 0


def test_control_ring_change_reads_ask_the_previous_owners_too() -> None:
    cmap = ClusterMap.initial(nodes("s", 6), nodes("c", 3, "control"))
    grown = cmap.with_control_ring(cmap.control.add(nodes("c", 4, "control")[-1])[0])
    back = ClusterMap.from_bytes(grown.to_bytes())
    assert back.previous_control == cmap.control
    some_moved = False
    for i in range(200):
        key = f"bucket/key-{i}"
        owners = grown.control_nodes_for(key)
        asked = grown.metadata_nodes_for(key)
        assert asked[:len(owners)] == owners
        assert {n.id for n in cmap.control_nodes_for(key)} <= {n.id for n in asked}
        some_moved |= len(asked) > len(owners)
    assert some_moved
    finished = grown.bump(previous_control=None)
    assert finished.metadata_nodes_for("bucket/key-1") == finished.control_nodes_for("bucket/key-1")
