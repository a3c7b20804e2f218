"""The garbage collection decisions (pure): fragments and tombstones."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from store.gc import classify_fragment, plan_fragment_gc, plan_stray_gc, plan_tombstone

S = 1_000_000_000
NOW = 1_700_000_000 * S


def vid(t_ns: int, rand: int = 0) -> str:
    return f"{t_ns:016x}{rand:016x}"


def test_the_three_kinds_of_garbage_and_what_is_kept() -> None:
    live = vid(NOW - 7200 * S, 1)          # old but live: kept
    overwritten = vid(NOW - 7200 * S, 2)   # old, no longer live: garbage
    uncommitted = vid(NOW - 4000 * S, 3)   # a put that never committed: garbage
    in_flight = vid(NOW - 10 * S, 4)       # a put in flight: younger than the grace
    listings = {"s1": [f"{live}.0.0", f"{overwritten}.0.1", f"{in_flight}.0.2", "not-a-fragment"],
                "s2": [f"{uncommitted}.3.5", f"{live}.1.4"]}
    plan = plan_fragment_gc({live}, listings, NOW, 3600)
    assert plan == [("s1", f"{overwritten}.0.1"), ("s2", f"{uncommitted}.3.5")]
    assert plan_fragment_gc({live}, listings, NOW, 0) == [
        ("s1", f"{overwritten}.0.1"), ("s1", f"{in_flight}.0.2"), ("s2", f"{uncommitted}.3.5")]


versions = st.builds(vid, st.integers(NOW - 10_000 * S, NOW + 10 * S), st.integers(0, 3))
fids = st.builds(lambda v, s, i: f"{v}.{s}.{i}", versions, st.integers(0, 3), st.integers(0, 5))


@given(listings=st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), st.sets(fids, max_size=20)),
       live=st.sets(versions, max_size=10), grace=st.floats(0, 5000))
def test_never_plans_a_live_or_young_fragment(listings: dict[str, set[str]], live: set[str],
                                              grace: float) -> None:
    plan = plan_fragment_gc(live, listings, NOW, grace)
    planned = set(plan)
    for node, fid in plan:
        v = fid.split(".")[0]
        assert v not in live
        assert int(v[:16], 16) < NOW - int(grace * 1e9)   # strictly older than the grace
        assert fid in listings[node]
    # and everything left out is live, young or not ours
    for node, frags in listings.items():
        for fid in frags:
            if (node, fid) not in planned:
                assert classify_fragment(fid, live, NOW - int(grace * 1e9)) != "garbage"
    assert len(plan) == len(planned)


def rec(ts: int, v: str, deleted: bool) -> dict[str, object]:
    return {"ts": ts, "version_id": v, "deleted": deleted}


OLD_TOMB = rec(NOW - 7200 * S, "b", True)
REPLICAS = ["c1", "c2", "c3"]


def test_tombstone_purged_only_when_every_replica_has_it() -> None:
    act = plan_tombstone(REPLICAS, {n: OLD_TOMB for n in REPLICAS}, NOW, 3600)
    assert act.purge == tuple(REPLICAS) and not act.write
    # one replica lacks it, one holds the older live record: repair first, no purge
    act = plan_tombstone(REPLICAS, {"c1": OLD_TOMB, "c2": None,
                                    "c3": rec(NOW - 9000 * S, "a", False)}, NOW, 3600)
    assert act.purge == () and act.write == ("c2", "c3") and act.tombstone == OLD_TOMB
    # one replica unreachable: nothing
    act = plan_tombstone(REPLICAS, {"c1": OLD_TOMB, "c2": OLD_TOMB}, NOW, 3600)
    assert act.purge == () and act.write == ()


def test_tombstone_young_or_superseded_is_kept() -> None:
    young = rec(NOW - 10 * S, "b", True)
    assert plan_tombstone(REPLICAS, {n: young for n in REPLICAS}, NOW, 3600).reason == "young"
    newer_live = rec(NOW - 5 * S, "c", False)
    act = plan_tombstone(REPLICAS, {"c1": OLD_TOMB, "c2": OLD_TOMB, "c3": newer_live}, NOW, 3600)
    assert act.purge == () and act.write == () and act.reason == "live"
    assert plan_tombstone(REPLICAS, {n: None for n in REPLICAS}, NOW, 0).reason == "gone"


def test_strays_are_copies_away_from_their_homes_and_old_enough() -> None:
    old, young = vid(NOW - 7200 * S, 1), vid(NOW - 10 * S, 2)
    homes = {f"{old}.0.0": frozenset({"s1"}), f"{old}.0.1": frozenset({"s2", "s7"}),
             f"{young}.0.0": frozenset({"s1"})}
    listings = {"s1": [f"{old}.0.0", f"{young}.0.0"],
                "s2": [f"{old}.0.1"],
                "s3": [f"{old}.0.0", f"{young}.0.0", f"{vid(NOW - 9000 * S, 9)}.0.0"],
                "s7": [f"{old}.0.1"]}
    # the copy of old.0.0 on s3 is a stray; young's is within the grace; an unknown version
    # (no record read: a part in progress, a stale replica's) is never a stray
    assert plan_stray_gc(homes, listings, NOW, 3600) == [("s3", f"{old}.0.0")]
    assert plan_stray_gc(homes, listings, NOW, 0) == [("s3", f"{old}.0.0"), ("s3", f"{young}.0.0")]


def test_a_stray_is_never_the_last_copy() -> None:
    """A copy away from its home is deleted only while a home holds one too: a fragment a
    rebalance moved after the map gc planned with (its home by that map emptied, the copy
    now where the new map puts it) or one left where a map two changes back put it is the
    only copy a repair or a reader can still find."""
    old = vid(NOW - 7200 * S, 1)
    homes = {f"{old}.0.0": frozenset({"s1"}), f"{old}.0.1": frozenset({"s2", "s7"})}
    listings = {"s1": [], "s2": [], "s3": [f"{old}.0.0"], "s4": [f"{old}.0.1"],
                "s7": [f"{old}.0.1"]}
    assert plan_stray_gc(homes, listings, NOW, 0) == [("s4", f"{old}.0.1")]
    del listings["s7"]                      # the home did not answer its listing: keep
    assert plan_stray_gc(homes, listings, NOW, 0) == []


@given(listings=st.dictionaries(st.sampled_from(["s1", "s2", "s3"]), st.sets(fids, max_size=20)),
       homed=st.sets(fids, max_size=20), node=st.sampled_from(["s1", "s2", "s3"]))
def test_never_plans_a_fragment_on_its_home(listings: dict[str, set[str]], homed: set[str],
                                            node: str) -> None:
    homes = {f: frozenset({node}) for f in homed}
    for n, fid in plan_stray_gc(homes, listings, NOW, 0):
        assert fid in homes and n not in homes[fid]
        assert any(fid in listings.get(h, ()) for h in homes[fid])   # a copy stays
