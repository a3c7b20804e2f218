"""Scale simulation: how placement and listing costs grow with cluster size (pure code, no servers).

    python -m bench.scale [--quick] [--json] [--build-all]

Three sections, each printed as a table with the growth factor between neighbouring sizes:

- ring: storage rings of 10, 100 and 1,000 nodes (10 zones, the part power that
  ``ClusterMap.initial`` uses): build time, ``locate(key, 6)`` per second over distinct keys
  (and ``locate(key, all nodes)``, which ``Client._put_segment`` calls for its handoff list),
  memory of a ring loaded from its serialized form (tracemalloc), serialized and map bytes.
- moved: a 100-node ring grows by 1 node and by 10 (10%) and loses one: the fraction of
  placements (partition x fragment position < 6) whose node changed, against the optimum
  (the added or removed nodes' share of weight), cross-checked by sampling keys.
- listing: one page of 1,000 keys from a big bucket whose keys sit on R=3 of C = 3, 32, 256
  control nodes, merged by the rules of ``store.listing.merge_listing`` (rounds, PAGE_LIMIT):
  requests, records sent and merged, and the time of the pure merge
  (``newest_per_key`` + ``merge_page``). The counts are checked against the real
  ``merge_listing`` driven by an in-memory transport (no sockets).

``Ring.build`` costs about O(nodes^2 x partitions) in Python (minutes at 1,000 nodes), so rings
above the profile's ``build_limit`` nodes are made by ``stand_in_ring``: valid rows of the same
shape (every row a permutation of all nodes, zones spread), which is all that lookup speed and
memory depend on. Build time and balance are shown only for rings made by ``Ring.build``;
``--build-all`` builds every ring with it (slow: minutes).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import math
import os
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from placement import cluster_map
from placement.cluster_map import CONTROL_TIER, MAX_MAP_BYTES, ClusterMap
from placement.hashing import hash64, key_bytes
from placement.nodes import Node
from placement.policy import Policy
from placement.ring import MAX_PART_POWER, Ring
from store.listing import KEY, PAGE_LIMIT, ListResult, Row, merge_listing, merge_page, newest_per_key, node_limit
from store.transport import Reply, Transport
from store.wire import pack

PART_POWER: int = inspect.signature(ClusterMap.initial).parameters["part_power"].default
FRAGMENTS = Policy().n          # k+m of the default 4+2 policy: positions per placement
ZONES = 10
REPLICAS = 3                    # control replicas per metadata key (ClusterMap.initial's R)
PAGE_KEYS = 1000                # max_keys of the simulated listing page
BUCKET = "bench"
RING_SIZES = (10, 100, 1000)
GROWTH_BASE = 100               # nodes of the ring that grows in the "moved" section
CONTROL_SIZES = (3, 32, 256)

PROFILES: dict[str, dict[str, int]] = {
    "quick": dict(lookup_keys=20_000, move_keys=20_000, bucket_keys=100_000, repeats=3, build_limit=100),
    "full": dict(lookup_keys=100_000, move_keys=200_000, bucket_keys=200_000, repeats=5, build_limit=300),
}

Record = Row   # [key, ts, version_id, deleted, size, etag, content_type, storage_class]
Log = Callable[[str], None]


# ---- nodes and rings ----------------------------------------------------------------------------
def make_nodes(count: int, prefix: str = "s", tier: str = "hot", first: int = 0) -> list[Node]:
    """`count` equal-weight nodes, node i in zone i mod ZONES (ids sort in index order)."""
    return [Node(id=f"{prefix}{i:05d}", address=f"http://10.{i // 250}.{i % 250}.1:6000",
                 zone=f"z{i % ZONES:02d}", tier=tier) for i in range(first, first + count)]


def stand_in_ring(nodes: Sequence[Node], part_power: int, tier: str) -> Ring:
    """A valid ring of `Ring.build`'s shape, made in O(partitions x nodes) without balancing.

    Row p is the nodes in zone-round-robin order, rotated by p*N/P: the first positions hold
    distinct zones when zones are equally full. For lookup speed and memory only.
    """
    by_id = sorted(nodes, key=lambda n: n.id)
    index = {nd.id: i for i, nd in enumerate(by_id)}
    by_zone: dict[str, list[int]] = {}
    for nd in by_id:
        by_zone.setdefault(nd.zone, []).append(index[nd.id])
    groups = [by_zone[z] for z in sorted(by_zone)]
    order = [g[r] for r in range(max(map(len, groups))) for g in groups if r < len(g)]
    width, parts = len(order), 1 << part_power
    flat = array("H")
    for p in range(parts):
        s = p * width // parts
        flat.extend(order[s:] + order[:s])
    if sys.byteorder == "big":
        flat.byteswap()
    ring = Ring(tuple(by_id), part_power, flat.tobytes(), tier)
    ring.check()
    return ring


def make_ring(nodes: Sequence[Node], tier: str, build_limit: int) -> tuple[Ring, float | None]:
    """(ring, Ring.build seconds) for up to `build_limit` nodes, else (stand-in ring, None)."""
    if len(nodes) > build_limit:
        return stand_in_ring(nodes, PART_POWER, tier), None
    t0 = time.perf_counter()
    ring = Ring.build(nodes, PART_POWER, tier=tier)
    return ring, time.perf_counter() - t0


def placement_keys(count: int, salt: str = "v") -> list[str]:
    """Distinct keys shaped like the data path's `version_id/segment_index`."""
    return [f"{salt}{i:026x}/{i % 16}" for i in range(count)]


# ---- ring lookups and memory --------------------------------------------------------------------
def best_rate(fn: Callable[[str], Any], keys: Sequence[str], repeats: int) -> float:
    """Calls per second of fn over `keys`: the best of `repeats` passes."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in keys:
            fn(k)
        best = min(best, time.perf_counter() - t0)
    return len(keys) / best


def loaded_ring_bytes(ring: Ring) -> tuple[int, int, int]:
    """(serialized bytes, bytes held, peak bytes while loading) of a ring decoded from msgpack
    and used once, as a node holds it: tracemalloc around `Ring.from_dict` + one `locate`."""
    blob = msgpack.packb(ring.to_dict(), use_bin_type=True)
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        loaded = Ring.from_dict(msgpack.unpackb(blob, raw=False, strict_map_key=True))
        loaded.locate("warm-up", min(FRAGMENTS, len(loaded.nodes)))  # decodes the cached table
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del loaded
    return len(blob), held - base, peak - base


def map_with(storage: Ring) -> ClusterMap:
    """An epoch-1 map around `storage` with 3 control nodes and the default 4+2 policy."""
    control = Ring.build(make_nodes(3, "c", CONTROL_TIER), PART_POWER, tier=CONTROL_TIER)
    cmap = ClusterMap(1, (storage,), control, (Policy(),), "hot", REPLICAS, 2, 2)
    cmap.check()
    return cmap


def balance(ring: Ring, n: int) -> tuple[float, float]:
    """(min, max) of each node's share of the first-n positions over its weight share."""
    total_w = sum(nd.weight for nd in ring.nodes)
    share = ring.share(n)
    ratios = [share[nd.id] / (nd.weight / total_w) for nd in ring.nodes]
    return min(ratios), max(ratios)


def ring_row(ring: Ring, build_s: float | None, p: dict[str, int]) -> dict[str, Any]:
    """Every ring figure for a storage ring (`build_s` None: made by `stand_in_ring`)."""
    count = len(ring.nodes)
    n = min(FRAGMENTS, count)
    keys = placement_keys(p["lookup_keys"])
    cmap = map_with(ring)
    policy = cmap.policy()
    ser, held, peak = loaded_ring_bytes(ring)
    blob = cmap.to_bytes()
    t0 = time.perf_counter()
    ClusterMap.from_bytes(blob)
    decode_s = time.perf_counter() - t0
    lo, hi = balance(ring, n) if build_s is not None else (None, None)
    return {
        "nodes": count, "builder": "Ring.build" if build_s is not None else "stand-in",
        "part_power": ring.part_power, "partitions": ring.partitions,
        "partitions_per_node": ring.partitions / count, "build_s": build_s,
        "share_min": lo, "share_max": hi,
        "locate_per_s": best_rate(lambda k: ring.locate(k, n), keys, p["repeats"]),
        "locate_all_per_s": best_rate(lambda k: ring.locate(k, count), keys[: len(keys) // 10], p["repeats"]),
        "hash_per_s": best_rate(lambda k: hash64(key_bytes(k)), keys, p["repeats"]),
        "fragment_nodes_per_s": best_rate(lambda k: cmap.fragment_nodes(policy, k, 0), keys, p["repeats"]),
        "table_bytes": len(ring.table), "ring_serialized_bytes": ser, "ring_held_bytes": held,
        "ring_load_peak_bytes": peak, "map_bytes": len(blob), "map_decode_s": decode_s,
    }


def part_power_limits(count: int) -> dict[str, Any]:
    """What the largest part power would cost at `count` nodes (arithmetic on the table format:
    2 bytes x partitions x nodes), against the map's decode limits."""
    table = 2 * (1 << MAX_PART_POWER) * count
    return {"nodes": count, "max_part_power": MAX_PART_POWER,
            "partitions_per_node_at_max": (1 << MAX_PART_POWER) / count,
            "table_bytes_at_max": table, "map_max_bin_len": cluster_map._UNPACK_LIMITS["max_bin_len"],
            "map_max_bytes": MAX_MAP_BYTES,
            "map_with_previous_ring_bytes": 2 * table}


# ---- data moved ---------------------------------------------------------------------------------
def moved_fraction(old: Ring, new: Ring, n: int) -> float:
    """Fraction of placements (partition, position < n) whose node id differs between rings.

    Every key of a partition moves with it, so this is the expected fraction of fragments moved.
    Raises ValueError if the part powers differ or n exceeds either ring's width.
    """
    if old.part_power != new.part_power:
        raise ValueError("rings must have the same part_power")
    moved = 0
    for part in range(old.partitions):
        moved += sum(a.id != b.id for a, b in zip(old.row(part, n), new.row(part, n)))
    return moved / (old.partitions * n)


def touched_fraction(old: Ring, new: Ring, n: int) -> float:
    """Fraction of partitions with at least one of the first n positions changed: the share of
    segments that lose or gain at least one fragment."""
    touched = sum(tuple(a.id for a in old.row(part, n)) != tuple(b.id for b in new.row(part, n))
                  for part in range(old.partitions))
    return touched / old.partitions


def sampled_moved_fraction(old: Ring, new: Ring, keys: Sequence[str], n: int) -> float:
    """Fraction of (key, position < n) placements whose node id differs, over `keys`."""
    moved = 0
    for k in keys:
        moved += sum(a.id != b.id for a, b in zip(old.locate(k, n), new.locate(k, n)))
    return moved / (len(keys) * n)


def optimal_fraction(old: Ring, new: Ring) -> float:
    """The least fraction that must move for a pure add or a pure removal: the added nodes'
    share of the new weight plus the removed nodes' share of the old weight."""
    old_w = {nd.id: nd.weight for nd in old.nodes}
    new_w = {nd.id: nd.weight for nd in new.nodes}
    added = sum(w for i, w in new_w.items() if i not in old_w) / sum(new_w.values())
    removed = sum(w for i, w in old_w.items() if i not in new_w) / sum(old_w.values())
    return added + removed


def grow(ring: Ring, nodes: Sequence[Node]) -> Ring:
    """The ring after adding `nodes` one by one (as the admin CLI would)."""
    for nd in nodes:
        ring, _ = ring.add(nd)
    return ring


def moved_row(case: str, old: Ring, change: Callable[[], Ring], keys: Sequence[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    new = change()
    change_s = time.perf_counter() - t0
    frac = moved_fraction(old, new, FRAGMENTS)
    opt = optimal_fraction(old, new)
    old_ids = {nd.id for nd in old.nodes}
    added = [nd for nd in new.nodes if nd.id not in old_ids]
    share = new.share(FRAGMENTS)
    total_w = sum(nd.weight for nd in new.nodes)
    added_fair = (sum(share[nd.id] for nd in added) / (sum(nd.weight for nd in added) / total_w)
                  if added else None)
    return {"case": case, "nodes_before": len(old.nodes), "nodes_after": len(new.nodes),
            "moved_fraction": frac, "sampled_moved_fraction": sampled_moved_fraction(old, new, keys, FRAGMENTS),
            "sampled_keys": len(keys), "optimal_fraction": opt, "moved_over_optimal": frac / opt,
            "added_share_over_fair": added_fair, "share_max_after": balance(new, FRAGMENTS)[1],
            "segments_touched": touched_fraction(old, new, FRAGMENTS), "change_s": change_s}


def moved_rows(base: Ring, p: dict[str, int], log: Log) -> list[dict[str, Any]]:
    """Grow the GROWTH_BASE-node ring by 1 and by 10% of its nodes, and remove one node."""
    count = len(base.nodes)
    keys = placement_keys(p["move_keys"], salt="m")
    log("moved: +1 node")
    rows = [moved_row("+1 node", base, lambda: grow(base, make_nodes(1, first=count)), keys)]
    log(f"moved: +{count // 10} nodes")
    rows.append(moved_row(f"+{count // 10} nodes (10%)", base,
                          lambda: grow(base, make_nodes(count // 10, first=count)), keys))
    log("moved: -1 node")
    rows.append(moved_row("-1 node", base, lambda: base.remove(base.nodes[0].id)[0], keys))
    return rows


# ---- listing fan-out ----------------------------------------------------------------------------
def record(key: str, i: int) -> Record:
    """A record as a control node's listing sends it (a row, store.listing.ROW_FIELDS)."""
    return [key, 1_700_000_000_000_000_000 + i, f"{i:026x}", False, 4 * 1024 * 1024, f"{i:032x}",
            "application/octet-stream", None]


def spread_keys(keys: Sequence[str], ring: Ring, replicas: int) -> list[list[Record]]:
    """Each control node's sorted scan of the bucket: the records of the keys it holds
    (`ring.locate(bucket/key, replicas)`, as `ClusterMap.control_nodes_for`), in ring node order."""
    pos = {nd.id: i for i, nd in enumerate(ring.nodes)}
    scans: list[list[Record]] = [[] for _ in ring.nodes]
    r = min(replicas, len(ring.nodes))
    for i, key in enumerate(sorted(keys)):
        rec = record(key, i)
        for nd in ring.locate(f"{BUCKET}/{key}", r):
            scans[pos[nd.id]].append(rec)
    return scans


@dataclass
class FanOut:
    """What one listing page cost: requests (one per node per fetch), records the nodes sent,
    records fed to the merge, rounds, and the batches each round merged (for timing)."""

    nodes: int
    rounds: int = 0
    requests: int = 0
    records_sent: int = 0
    records_merged: int = 0
    page_keys: int = 0
    truncated: bool = False
    batches: list[list[list[Record]]] | None = None


class _Cursor:
    def __init__(self, scan: Sequence[Record]) -> None:
        self.scan, self.pos, self.page, self.truncated = scan, 0, list[Record](), True

    def fetch(self, limit: int, fan: FanOut) -> None:
        """Like `_NodeCursor.fetch` + the node's scan: the next `limit` records after the last."""
        got = list(self.scan[self.pos:self.pos + limit])
        self.pos += len(got)
        self.page, self.truncated = got, self.pos < len(self.scan)
        fan.requests += 1
        fan.records_sent += len(got)


def simulate_listing(scans: Sequence[Sequence[Record]], max_keys: int,
                     page_limit: int | None = None) -> tuple[FanOut, ListResult]:
    """Replay `merge_listing`'s rounds (no prefix, delimiter or start-after) over in-memory
    scans, counting what it would send and merge; each node is asked for `page_limit`
    records a request (default: what merge_listing asks, node_limit). Returns (counts,
    the page)."""
    if page_limit is None:
        page_limit = node_limit(max_keys)
    fan = FanOut(nodes=len(scans), batches=[])
    cursors = [_Cursor(s) for s in scans]
    for c in cursors:
        c.fetch(page_limit, fan)
    collected: list[Record] = []
    while True:
        more = [c for c in cursors if c.truncated and c.page]
        horizon = min((c.page[-1][KEY] for c in more), default=None)
        batch = [[r for r in c.page if horizon is None or r[KEY] <= horizon] for c in cursors]
        for c in cursors:
            c.page = [r for r in c.page if horizon is not None and r[KEY] > horizon]
        fan.rounds += 1
        fan.records_merged += sum(map(len, batch))
        assert fan.batches is not None
        fan.batches.append(batch)
        collected.extend(newest_per_key(iter(b) for b in batch))
        page = merge_page(iter(collected), "", "", max_keys)
        if page.truncated or horizon is None:
            fan.page_keys, fan.truncated = len(page.objects), page.truncated
            return fan, page
        for c in more:
            rest = c.page
            c.fetch(page_limit, fan)
            c.page = rest + c.page


def replay_merge(batches: Sequence[Sequence[Sequence[Record]]], max_keys: int) -> ListResult:
    """The CPU part of a listing page: per round, newest_per_key over the node batches, then
    merge_page over everything collected (what merge_listing does between fetches)."""
    collected: list[Record] = []
    page = ListResult()
    for batch in batches:
        collected.extend(newest_per_key(iter(b) for b in batch))
        page = merge_page(iter(collected), "", "", max_keys)
    return page


class ScanTransport(Transport):
    """A Transport that answers `GET /v1/list/<bucket>` from in-memory scans (no sockets),
    counting requests and records, so the real `merge_listing` can be measured."""

    def __init__(self, scans: dict[str, Sequence[Record]]) -> None:
        super().__init__(secret="unused")
        self.scans, self.requests, self.records_sent = scans, 0, 0

    async def request(self, method: str, base_url: str, path: str, *,
                      body: bytes | bytearray | memoryview = b"", checksum: str | None = None,
                      query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0, ok_404: bool = False) -> Reply:
        assert method == "GET" and path.startswith("/v1/list/") and query is not None
        scan = self.scans[base_url]
        after, limit = query["after"], int(query["limit"])
        rows = [r for r in scan if r[KEY] > after and r[KEY].startswith(query["prefix"])]
        self.requests += 1
        self.records_sent += min(limit, len(rows))
        return Reply(200, {}, bytearray(pack({"rows": rows[:limit],
                                              "truncated": len(rows) > limit})))


def count_with_merge_listing(nodes: Sequence[Node], scans: Sequence[Sequence[Record]],
                             max_keys: int) -> tuple[int, int, ListResult]:
    """(requests, records sent, page) of the real `merge_listing` over in-memory scans."""
    t = ScanTransport({nd.address: s for nd, s in zip(nodes, scans)})
    page = asyncio.run(merge_listing(t, tuple(nodes), BUCKET, "", "", "", max_keys, allowed_failures=0))
    return t.requests, t.records_sent, page


def listing_row(c_nodes: int, keys: Sequence[str], p: dict[str, int], log: Log) -> dict[str, Any]:
    log(f"listing: {c_nodes} control nodes")
    nodes = make_nodes(c_nodes, "c", CONTROL_TIER)
    ring, build_s = make_ring(nodes, CONTROL_TIER, p["build_limit"])
    scans = spread_keys(keys, ring, REPLICAS)
    fan, page = simulate_listing(scans, PAGE_KEYS)
    assert [o.key for o in page.objects] == sorted(keys)[:PAGE_KEYS], "the simulated page is wrong"
    real_requests, real_sent, real_page = count_with_merge_listing(ring.nodes, scans, PAGE_KEYS)
    checked = (real_requests, real_sent, real_page.objects) == (fan.requests, fan.records_sent, page.objects)
    merge_s = min(_timed(lambda: replay_merge(fan.batches or [], PAGE_KEYS)) for _ in range(p["repeats"]))
    held = [len(s) for s in scans]
    r = min(REPLICAS, c_nodes)
    return {"control_nodes": c_nodes, "builder": "Ring.build" if build_s is not None else "stand-in",
            "build_s": build_s, "bucket_keys": len(keys), "keys_per_node": sum(held) / c_nodes, "rounds": fan.rounds,
            "requests": fan.requests, "records_sent": fan.records_sent, "records_merged": fan.records_merged,
            "records_needed": r * PAGE_KEYS, "sent_over_needed": fan.records_sent / (r * PAGE_KEYS),
            "merge_ms": merge_s * 1000, "merge_us_per_record": merge_s * 1e6 / fan.records_merged,
            "page_keys": fan.page_keys, "truncated": fan.truncated,
            "checked_against_merge_listing": checked}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- output -------------------------------------------------------------------------------------
Metric = tuple[str, str, str]   # (row key, label, format)

RING_METRICS: list[Metric] = [
    ("builder", "ring made by", "s"), ("part_power", "part_power", "d"),
    ("partitions_per_node", "partitions per node per position", ".2f"), ("build_s", "Ring.build s", ".2f"),
    ("share_max", "max node share / fair share (n=6)", ".2f"),
    ("share_min", "min node share / fair share (n=6)", ".2f"),
    ("locate_per_s", "locate(key, 6) per s", ",.0f"), ("hash_per_s", "hash64 alone per s", ",.0f"),
    ("locate_all_per_s", "locate(key, all nodes) per s (PUT)", ",.0f"),
    ("fragment_nodes_per_s", "map.fragment_nodes per s", ",.0f"),
    ("table_bytes", "table bytes (2 x partitions x nodes)", ",d"),
    ("ring_serialized_bytes", "ring serialized bytes", ",d"), ("ring_held_bytes", "ring bytes held (loaded)", ",d"),
    ("ring_load_peak_bytes", "peak bytes while loading", ",d"), ("map_bytes", "cluster map bytes", ",d"),
    ("map_decode_s", "ClusterMap.from_bytes s", ".3f"),
]
MOVED_METRICS: list[Metric] = [
    ("nodes_after", "nodes after", "d"), ("moved_fraction", "placements moved (all partitions)", ".4f"),
    ("sampled_moved_fraction", "placements moved (sampled keys)", ".4f"),
    ("optimal_fraction", "optimum (weight share)", ".4f"), ("moved_over_optimal", "moved / optimum", ".3f"),
    ("added_share_over_fair", "added nodes' share / fair share", ".3f"),
    ("share_max_after", "max node share / fair share after", ".3f"),
    ("segments_touched", "segments with >= 1 fragment moved", ".4f"), ("change_s", "ring change s", ".2f"),
]
LISTING_METRICS: list[Metric] = [
    ("builder", "control ring made by", "s"), ("build_s", "Ring.build s", ".2f"),
    ("keys_per_node", "bucket keys held per node", ",.0f"),
    ("rounds", "rounds", "d"), ("requests", "requests", ",d"), ("records_sent", "records sent", ",d"),
    ("records_merged", "records merged", ",d"), ("sent_over_needed", "records sent / (R x page)", ".1f"),
    ("merge_ms", "pure merge ms", ".1f"), ("merge_us_per_record", "merge us per record merged", ".2f"),
    ("checked_against_merge_listing", "same counts as merge_listing", "s"),
]


def growth(values: Sequence[Any]) -> list[float | None]:
    """Factor from each value to the next (None where not both positive numbers)."""
    out: list[float | None] = []
    for a, b in zip(values, values[1:]):
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (a, b))
        out.append(b / a if ok else None)
    return out


def _cell(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    if fmt == "s" or isinstance(v, (bool, str)):
        return str(v)
    return format(v, fmt)


def table(title: str, heads: Sequence[str], rows: Sequence[dict[str, Any]], metrics: list[Metric],
          with_growth: bool = True) -> str:
    """Metrics down, sizes across; with_growth adds, before each size after the first, a
    column "x" holding the factor from the previous size."""
    widths = [max(12, len(h) + 2) for h in heads]
    head = "".join(("        x" if i and with_growth else "") + f"{h:>{w}}"
                   for i, (h, w) in enumerate(zip(heads, widths)))
    lines = [title, f"  {'':38}{head}"]
    for key, label, fmt in metrics:
        vals = [r.get(key) for r in rows]
        g = growth(vals)
        line = f"  {label:38}"
        for i, (v, w) in enumerate(zip(vals, widths)):
            if i and with_growth:
                line += f"{'-' if g[i - 1] is None or fmt == 's' else f'x{g[i - 1]:.2f}':>9}"
            line += f"{_cell(v, fmt):>{w}}"
        lines.append(line)
    return "\n".join(lines)


def notes(result: dict[str, Any]) -> list[str]:
    """Plain statements derived from the measured rows."""
    ring, moved, listing = result["ring"], result["moved"], result["listing"]
    out = [f"part_power {PART_POWER} ({1 << PART_POWER} partitions) is ClusterMap.initial's default for every "
           f"ring size; rows list every node, so the table is 2 x partitions x nodes bytes."]
    lim = result["part_power_limits"]
    out.append(f"At {lim['nodes']:,} nodes the largest part_power ({MAX_PART_POWER}) gives "
               f"{lim['partitions_per_node_at_max']:.1f} partitions per node per position and a "
               f"{lim['table_bytes_at_max']:,}-byte table ({lim['map_with_previous_ring_bytes']:,} with the previous "
               f"ring kept during a rebalance; limits: {lim['map_max_bin_len']:,} per bin, "
               f"{lim['map_max_bytes']:,} per map) -- arithmetic, not measured.")
    built = sorted({(r["nodes"], r["build_s"]) for r in ring if r["build_s"] is not None}
                   | {(r["control_nodes"], r["build_s"]) for r in listing if r["build_s"] is not None})
    if len(built) >= 2 and any(r["build_s"] is None for r in ring):
        (n1, t1), (n2, t2) = built[-2], built[-1]
        exp = _exponent(n1, t1, n2, t2)
        big = ring[-1]["nodes"]
        out.append(f"Ring.build ({ZONES} zones) grew as nodes^{exp:.2f} from {n1} to {n2} nodes; at that rate "
                   f"{big:,} nodes would take ~{t2 * (big / n2) ** exp:,.0f} s, a lower bound: each add is "
                   "O(nodes x partitions) and build adds the nodes one by one (--build-all measures it).")
    out.append(f"Load average (1 min) at start and end: {result['load_avg'][0]:.2f}, {result['load_avg'][1]:.2f} "
               f"on {result['cpus']} CPUs: timings are single-threaded and slow down if it exceeds that.")
    out.append(f"Growing {GROWTH_BASE} nodes: " + "; ".join(
        f"{m['case']} moved {m['moved_fraction']:.2%} vs optimum {m['optimal_fraction']:.2%}" for m in moved) + ".")
    out.append("Listing one page: " + "; ".join(
        f"C={r['control_nodes']}: {r['requests']} requests, {r['records_sent']:,} records sent" for r in listing)
        + f" (a page needs {PAGE_KEYS:,} keys x R={REPLICAS}).")
    return out


def _exponent(n1: int, t1: float, n2: int, t2: float) -> float:
    return math.log(t2 / t1) / math.log(n2 / n1)


def render(result: dict[str, Any]) -> str:
    ring, moved, listing = result["ring"], result["moved"], result["listing"]
    out = [
        table(f"ring: storage nodes ({ZONES} zones, locate n={FRAGMENTS}, {result['params']['lookup_keys']:,} "
              "distinct keys)", [f"{r['nodes']:,} nodes" for r in ring], ring, RING_METRICS),
        table(f"moved: a {GROWTH_BASE}-node ring changes (positions < {FRAGMENTS}; "
              f"{result['params']['move_keys']:,} sampled keys)", [m["case"] for m in moved], moved,
              MOVED_METRICS, with_growth=False),
        table(f"listing: one {PAGE_KEYS:,}-key page, R={REPLICAS}, PAGE_LIMIT={PAGE_LIMIT}, bucket of "
              f"{listing[0]['bucket_keys']:,} keys", [f"C={r['control_nodes']}" for r in listing], listing,
              LISTING_METRICS),
        "notes:\n" + "\n".join(f"  - {n}" for n in result["notes"]),
    ]
    return "\n\n".join(out)


def with_growth(rows: list[dict[str, Any]], metrics: list[Metric]) -> dict[str, list[float | None]]:
    return {key: growth([r.get(key) for r in rows]) for key, _, fmt in metrics if fmt != "s"}


# ---- main ---------------------------------------------------------------------------------------
def run(profile: str, build_all: bool, log: Log, load_start: float) -> dict[str, Any]:
    p = dict(PROFILES[profile])
    if build_all:
        p["build_limit"] = 1 << 16
    ring_rows, rings = [], {}
    for count in RING_SIZES:
        log(f"ring: {count} nodes")
        ring, build_s = make_ring(make_nodes(count), "hot", p["build_limit"])
        ring_rows.append(ring_row(ring, build_s, p))
        rings[count] = (ring, build_s)
    base, build_s = rings.get(GROWTH_BASE, (None, None))
    if base is None or build_s is None:  # movement needs the real builder
        base, _ = make_ring(make_nodes(GROWTH_BASE), "hot", GROWTH_BASE)
    moved = moved_rows(base, p, log)
    keys = [f"data/{i:08d}" for i in range(p["bucket_keys"])]
    listing = [listing_row(c, keys, p, log) for c in CONTROL_SIZES]
    result: dict[str, Any] = {
        "profile": profile, "params": p, "part_power": PART_POWER, "fragments": FRAGMENTS, "zones": ZONES,
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "load_avg": [load_start, os.getloadavg()[0]],
        "ring": ring_rows, "moved": moved, "listing": listing,
        "part_power_limits": part_power_limits(RING_SIZES[-1]),
        "growth": {"ring": with_growth(ring_rows, RING_METRICS), "listing": with_growth(listing, LISTING_METRICS),
                   "moved_add_10_over_add_1": with_growth(moved[:2], MOVED_METRICS)},
    }
    result["notes"] = notes(result)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer keys and repeats (under 30 s)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    ap.add_argument("--build-all", action="store_true", help="build every ring with Ring.build (minutes)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    load_start = os.getloadavg()[0]
    result = run("quick" if args.quick else "full", args.build_all, log, load_start)
    result["duration_s"] = time.perf_counter() - t_start
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
