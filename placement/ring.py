"""Stateful partition ring (in the style of OpenStack Swift's ring builder).

Model:
    key -> partition = top ``part_power`` bits of ``hash64(key)``.
    Each partition has a *row*: a permutation of all node indexes.
    ``locate(key, n)`` returns the first ``n`` nodes of the key's row, so a
    placement is the pair (key, position i < n) -> node.

Goals, in priority order:
    1. Zone spread: the first ``Zc`` positions of every row hold distinct
       zones (``Zc`` = number of distinct zones).  A row always contains every
       node, hence every zone, so this is always reachable by ``build``.
    2. Minimal, positional movement: ``add`` only ever replaces a position by
       the new node (the displaced node goes to a new last position);
       ``remove`` only replaces the removed node's position.
    3. Balance: in column ``j`` each node holds about its target
       ``partitions * weight / total_weight`` rows (water-filled: a node can
       appear only once per row, so very heavy nodes are capped and the
       excess goes to the others).  Counts end within about +-1 of targets
       after ``build``/``reweight``/``set_zone``; ``add`` keeps that for the
       positions it touches; ``remove`` spreads the removed node's positions
       over the rows' last nodes (statistically even, not exact).

Trade-offs (documented, by design):
    * Zone spread wins over balance.  With unequal zone weights the first
      ``Zc`` columns cannot be balanced per node, and a new node of an existing
      zone can only take first-``Zc`` positions from nodes of its own zone.
    * ``remove`` of a node sitting inside the first ``Zc`` positions fills the
      hole with the row's last node when that keeps the zone spread;
      otherwise with the last-most later node (at a position ``>= Zc``) that
      does, and the row's last node takes that node's old position.  So with
      several zones a removal may also change placements at positions
      ``>= Zc`` (never below ``Zc``) that were not on the removed node.
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from placement.hashing import hash64, key_bytes
from placement.nodes import Node, UnknownNodeError, check_int, check_name, fields

MAX_PART_POWER = 16
MAX_NODES = 65535
_EPS = 1e-9

Rows = list[list[int]]


@dataclass(frozen=True)
class MoveReport:
    """What a ring change moved, by comparing old and new rows (by node id).

    Attributes:
        changed_rows: partitions whose row differs in any position.
        total_rows: number of partitions.
        moved_positions: (partition, position) pairs, position below
            ``min(old width, new width)``, whose node changed.
        moved_by_position: ``moved_positions`` split by position index.
        added: node ids present only in the new ring.
        removed: node ids present only in the old ring.
    """

    changed_rows: int
    total_rows: int
    moved_positions: int
    moved_by_position: tuple[int, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def moved_fraction(self, n: int) -> float:
        """Fraction (0..1) of placements at positions ``< n`` that changed."""
        if not 1 <= n <= len(self.moved_by_position):
            raise ValueError(f"n must be in [1, {len(self.moved_by_position)}], got {n}")
        return sum(self.moved_by_position[:n]) / (n * self.total_rows)

    @staticmethod
    def compare(old: "Ring", new: "Ring") -> "MoveReport":
        """Return the report of going from ``old`` to ``new`` (same part_power)."""
        if old.part_power != new.part_power:
            raise ValueError("cannot compare rings with different part_power")
        width = min(len(old.nodes), len(new.nodes))
        by_pos = [0] * width
        changed = 0
        for a, b in zip(old._id_rows(), new._id_rows()):
            if a != b:
                changed += 1
                for i in range(width):
                    if a[i] != b[i]:
                        by_pos[i] += 1
        old_ids = {nd.id for nd in old.nodes}
        new_ids = {nd.id for nd in new.nodes}
        return MoveReport(
            changed_rows=changed,
            total_rows=old.partitions,
            moved_positions=sum(by_pos),
            moved_by_position=tuple(by_pos),
            added=tuple(sorted(new_ids - old_ids)),
            removed=tuple(sorted(old_ids - new_ids)),
        )


@dataclass(frozen=True)
class Ring:
    """An immutable placement ring.

    Attributes:
        nodes: the nodes, sorted by id (unique ids).
        part_power: partitions = ``2 ** part_power`` (0..16).
        table: ``partitions`` rows of ``len(nodes)`` uint16 little-endian node
            indexes (``array('H')`` bytes); each row is a permutation of
            ``range(len(nodes))``.
        tier: free label, e.g. ``"hot"`` or ``"control"`` (``""`` = none).
    """

    nodes: tuple[Node, ...]
    part_power: int
    table: bytes = field(repr=False)
    tier: str = ""

    # ----------------------------------------------------------------- build
    @classmethod
    def build(cls, nodes: Iterable[Node], part_power: int = 10, tier: str = "") -> "Ring":
        """Build a balanced, zone-spread ring deterministically from ``nodes``.

        Adds the nodes one by one (zones interleaved round robin, ids sorted
        within a zone), then repairs zone spread and balances with swaps.
        Raises ValueError on invalid or duplicate nodes or part_power.
        """
        todo = _round_robin_zones(list(nodes))
        if not todo:
            raise ValueError("a ring needs at least one node")
        check_int("part_power", part_power, 0, MAX_PART_POWER)
        todo[0].check()
        ring = cls._from_rows((todo[0],), [[0] for _ in range(1 << part_power)], part_power, tier)
        for node in todo[1:]:
            ring, _ = ring.add(node)
        rows = ring._index_rows()
        _repair_zones(rows, ring._zones())
        _rebalance(rows, ring._targets(), ring._zones())
        return cls._from_rows(ring.nodes, rows, part_power, tier)

    @classmethod
    def _from_rows(cls, nodes: Sequence[Node], rows: Rows, part_power: int, tier: str) -> "Ring":
        """Encode ``rows`` (indexes into ``nodes`` order) into a checked Ring.

        ``nodes`` may be in any order; the result is re-indexed by sorted id.
        """
        order = sorted(range(len(nodes)), key=lambda i: nodes[i].id)
        new_index = [0] * len(nodes)
        for new, old in enumerate(order):
            new_index[old] = new
        flat = array("H", (new_index[i] for i in itertools.chain.from_iterable(rows)))
        if sys.byteorder == "big":
            flat.byteswap()
        ring = cls(tuple(nodes[i] for i in order), part_power, flat.tobytes(), tier)
        ring.check()
        return ring

    # ------------------------------------------------------------- changes
    def add(self, node: Node) -> tuple["Ring", MoveReport]:
        """Return a ring with ``node`` added and the movement report.

        Every changed placement (at positions below the old width) moves
        onto ``node``; no placement moves between old nodes.
        Raises ValueError if the node is invalid or its id already exists.
        """
        node.check()
        if node.id in self._index:
            raise ValueError(f"node {node.id} is already in the ring")
        if len(self.nodes) >= MAX_NODES:
            raise ValueError(f"a ring holds at most {MAX_NODES} nodes")
        nodes = self.nodes + (node,)
        rows = self._index_rows()
        y = len(nodes) - 1
        zones = _zone_ids(nodes)
        order = _seeded_order(node.id, self.partitions)
        _place_new(rows, y, _targets([n.weight for n in nodes], self.partitions), zones, order)
        return self._changed(nodes, rows)

    def remove(self, node_id: str) -> tuple["Ring", MoveReport]:
        """Return a ring without ``node_id`` and the movement report.

        Only placements that were on the removed node change, except the
        zone trade-off described in the module docstring (positions >= Zc).
        Raises UnknownNodeError if absent, ValueError if it is the last node.
        """
        z = self._require(node_id)
        if len(self.nodes) == 1:
            raise ValueError("cannot remove the last node of a ring")
        rows = self._index_rows()
        zones = _zone_ids(self.nodes)
        zc = len(set(zones[i] for i in range(len(zones)) if i != z))
        for row in rows:
            _drop(row, z, zones, zc)
        keep = [i for i in range(len(self.nodes)) if i != z]
        remap = {old: new for new, old in enumerate(keep)}
        rows = [[remap[i] for i in row] for row in rows]
        return self._changed(tuple(self.nodes[i] for i in keep), rows)

    def reweight(self, node_id: str, weight: float) -> tuple["Ring", MoveReport]:
        """Return a ring where ``node_id`` has ``weight``, rebalanced by swaps.

        Raises UnknownNodeError if absent, ValueError if the weight is invalid.
        """
        i = self._require(node_id)
        node = replace(self.nodes[i], weight=weight)
        node.check()
        return self._rebalanced(i, node)

    def set_zone(self, node_id: str, zone: str) -> tuple["Ring", MoveReport]:
        """Return a ring where ``node_id`` is in ``zone``, zone spread repaired.

        Raises UnknownNodeError if absent, ValueError if the zone name is invalid.
        """
        i = self._require(node_id)
        node = replace(self.nodes[i], zone=zone)
        node.check()
        return self._rebalanced(i, node)

    def with_node(self, node: Node) -> "Ring":
        """Return the same placement with a node's non-placement attributes updated.

        Only ``address`` and ``tier`` may differ.  Raises UnknownNodeError if
        the id is absent, ValueError if weight or zone differ (use
        ``reweight``/``set_zone``) or the node is invalid.
        """
        node.check()
        i = self._require(node.id)
        old = self.nodes[i]
        if node.weight != old.weight or node.zone != old.zone:
            raise ValueError(
                f"node {node.id}: weight/zone changes move data, use reweight()/set_zone()"
            )
        nodes = self.nodes[:i] + (node,) + self.nodes[i + 1 :]
        return replace(self, nodes=nodes)

    # -------------------------------------------------------------- lookup
    @property
    def partitions(self) -> int:
        """Number of partitions (rows): ``2 ** part_power``."""
        return 1 << self.part_power

    def partition(self, key: bytes | str) -> int:
        """Return the partition of ``key``: the top ``part_power`` bits of hash64."""
        return hash64(key_bytes(key)) >> (64 - self.part_power)

    def locate(self, key: bytes | str, n: int) -> tuple[Node, ...]:
        """Return the ``n`` distinct nodes for ``key``; position i = copy/fragment i.

        Raises ValueError unless ``1 <= n <= len(nodes)``.
        """
        return self.row(self.partition(key), n)

    def row(self, partition: int, n: int | None = None) -> tuple[Node, ...]:
        """Return the first ``n`` (default all) nodes of ``partition``'s row.

        Raises ValueError for a bad partition or n.
        """
        width = len(self.nodes)
        n = width if n is None else n
        check_int("n", n, 1, width)
        check_int("partition", partition, 0, self.partitions - 1)
        start = partition * width
        return tuple(self.nodes[i] for i in self._flat[start : start + n])

    def node(self, node_id: str) -> Node:
        """Return the node with ``node_id``.  Raises UnknownNodeError (a KeyError)."""
        return self.nodes[self._require(node_id)]

    def share(self, n: int) -> dict[str, float]:
        """Return, per node id, its fraction of all first-``n`` positions (sums to 1).

        Raises ValueError unless ``1 <= n <= len(nodes)``.
        """
        width = len(self.nodes)
        check_int("n", n, 1, width)
        counts = [0] * width
        flat = self._flat
        for start in range(0, len(flat), width):
            for i in flat[start : start + n]:
                counts[i] += 1
        total = n * self.partitions
        return {nd.id: c / total for nd, c in zip(self.nodes, counts)}

    # ---------------------------------------------------------- invariants
    def check(self) -> None:
        """Raise ValueError unless all invariants hold (see class docstring)."""
        check_int("part_power", self.part_power, 0, MAX_PART_POWER)
        if self.tier != "":
            check_name("ring tier", self.tier)
        if not isinstance(self.nodes, tuple) or not self.nodes:
            raise ValueError("ring nodes must be a non-empty tuple")
        if len(self.nodes) > MAX_NODES:
            raise ValueError(f"a ring holds at most {MAX_NODES} nodes")
        for nd in self.nodes:
            if not isinstance(nd, Node):
                raise ValueError(f"ring nodes must be Node, got {type(nd).__name__}")
            nd.check()
        ids = [nd.id for nd in self.nodes]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise ValueError("ring nodes must be sorted by id with unique ids")
        self._check_table()

    def _check_table(self) -> None:
        width = len(self.nodes)
        if not isinstance(self.table, bytes) or len(self.table) != 2 * width * self.partitions:
            raise ValueError(
                f"ring table must be {2 * width * self.partitions} bytes "
                f"({self.partitions} rows x {width} uint16)"
            )
        full = set(range(width))
        flat = self._flat
        for start in range(0, len(flat), width):
            if set(flat[start : start + width]) != full:
                raise ValueError(f"ring row {start // width} is not a permutation of the nodes")

    # -------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        """Return a msgpack-friendly dict (str keys, bytes, ints, floats, lists)."""
        return {
            "nodes": [nd.to_dict() for nd in self.nodes],
            "part_power": self.part_power,
            "table": self.table,
            "tier": self.tier,
        }

    @staticmethod
    def from_dict(d: object) -> "Ring":
        """Build and check a Ring from ``to_dict`` output.  Raises ValueError."""
        f = fields("ring", d, {"nodes", "part_power", "table"}, {"tier"})
        if not isinstance(f["nodes"], (list, tuple)):
            raise ValueError("ring nodes must be a list")
        if not isinstance(f["table"], (bytes, bytearray)):
            raise ValueError("ring table must be bytes")
        tier = f.get("tier", "")
        if not isinstance(tier, str):
            raise ValueError("ring tier must be a string")
        check_int("part_power", f["part_power"], 0, MAX_PART_POWER)
        nodes = tuple(Node.from_dict(x) for x in f["nodes"])
        ring = Ring(nodes, f["part_power"], bytes(f["table"]), tier)
        ring.check()
        return ring

    # ------------------------------------------------------------ internals
    @cached_property
    def _flat(self) -> array:
        """The table decoded to native uint16s (cached; the table is immutable)."""
        flat = array("H")
        if len(self.table) % flat.itemsize:
            raise ValueError("ring table length must be even")
        flat.frombytes(self.table)
        if sys.byteorder == "big":
            flat.byteswap()
        return flat

    @cached_property
    def _index(self) -> dict[str, int]:
        return {nd.id: i for i, nd in enumerate(self.nodes)}

    def _require(self, node_id: str) -> int:
        try:
            return self._index[node_id]
        except (KeyError, TypeError):
            raise UnknownNodeError(f"no node {node_id!r} in ring {self.tier!r}") from None

    def _index_rows(self) -> Rows:
        width = len(self.nodes)
        flat = self._flat
        return [flat[s : s + width].tolist() for s in range(0, len(flat), width)]

    def _id_rows(self) -> list[list[str]]:
        ids = [nd.id for nd in self.nodes]
        return [[ids[i] for i in row] for row in self._index_rows()]

    def _zones(self) -> list[int]:
        return _zone_ids(self.nodes)

    def _targets(self) -> list[list[float]]:
        return _targets([nd.weight for nd in self.nodes], self.partitions)

    def _changed(self, nodes: Sequence[Node], rows: Rows) -> tuple["Ring", MoveReport]:
        new = Ring._from_rows(nodes, rows, self.part_power, self.tier)
        return new, MoveReport.compare(self, new)

    def _rebalanced(self, i: int, node: Node) -> tuple["Ring", MoveReport]:
        nodes = self.nodes[:i] + (node,) + self.nodes[i + 1 :]
        rows = self._index_rows()
        zones = _zone_ids(nodes)
        _repair_zones(rows, zones)
        _rebalance(rows, _targets([nd.weight for nd in nodes], self.partitions), zones)
        return self._changed(nodes, rows)


# ====================================================================== helpers
def _round_robin_zones(nodes: list[Node]) -> list[Node]:
    """Order nodes zone by zone round robin (zones sorted, ids sorted within)."""
    by_zone: dict[str, list[Node]] = {}
    for nd in sorted(nodes, key=lambda x: x.id):
        by_zone.setdefault(nd.zone, []).append(nd)
    groups = [by_zone[z] for z in sorted(by_zone)]
    out: list[Node] = []
    for tier in itertools.zip_longest(*groups):
        out.extend(nd for nd in tier if nd is not None)
    return out


def _zone_ids(nodes: Sequence[Node]) -> list[int]:
    """Map each node to a small int per zone (stable: zones sorted by name)."""
    names = sorted({nd.zone for nd in nodes})
    ids = {z: i for i, z in enumerate(names)}
    return [ids[nd.zone] for nd in nodes]


def _seeded_order(seed: str, parts: int) -> list[int]:
    """Deterministic pseudo-random order of partitions, seeded by a node id."""
    return sorted(range(parts), key=lambda r: hash64(f"{seed}/{r}".encode()))


def _cumulative(weights: list[float], c: int, parts: int) -> list[float]:
    """Water-filled target count of each node over the first ``c`` positions.

    Proportional to weight, but a node holds at most ``parts`` (once per row).
    """
    n = len(weights)
    if c >= n:
        return [float(parts)] * n
    capped = [False] * n
    while True:
        free_total = (c - sum(capped)) * parts
        free_w = sum(w for w, cp in zip(weights, capped) if not cp)
        out = [float(parts) if cp else free_total * w / free_w for w, cp in zip(weights, capped)]
        over = [i for i in range(n) if not capped[i] and out[i] > parts]
        if not over:
            return out
        for i in over:
            capped[i] = True


def _targets(weights: list[float], parts: int) -> list[list[float]]:
    """Return targets[node][column]: the wanted row count of node in column."""
    n = len(weights)
    cum = [_cumulative(weights, c, parts) for c in range(n + 1)]
    return [[max(0.0, cum[c + 1][i] - cum[c][i]) for c in range(n)] for i in range(n)]


def _column_counts(rows: Rows, j: int, n_nodes: int) -> list[int]:
    counts = [0] * n_nodes
    for row in rows:
        if j < len(row):
            counts[row[j]] += 1
    return counts


def _zone_score(prefix: Sequence[int], zones: Sequence[int], zc: int) -> int:
    """Length of the longest prefix with distinct zones, at most ``zc``."""
    seen: set[int] = set()
    for k, i in enumerate(prefix[:zc]):
        if zones[i] in seen:
            return k
        seen.add(zones[i])
    return min(zc, len(prefix))


def _place_new(rows: Rows, y: int, targets: list[list[float]], zones: list[int], order: list[int]) -> None:
    """Add node ``y`` to every row in place (see ``Ring.add``).

    Column by column, ``y`` takes the position of nodes over their target
    (rows visited in ``order``), the displaced node goes to a new last
    position; rows where ``y`` was never placed get ``y`` appended.
    """
    parts = len(rows)
    old_width = len(rows[0])
    zc = len(set(zones))
    placed = [False] * parts
    for j in range(old_width):
        counts = _column_counts(rows, j, len(zones))
        t = [targets[i][j] for i in range(len(zones))]
        for strict in (True, False):
            for r in order:
                if placed[r]:
                    continue
                row = rows[r]
                x = row[j]
                if not _should_take(counts[x] - t[x], counts[y] - t[y], strict):
                    continue
                if j < zc and not _take_keeps_zones(row, j, y, zones, zc):
                    continue
                row[j] = y
                row.append(x)
                placed[r] = True
                counts[x] -= 1
                counts[y] += 1
    for r in range(parts):
        if not placed[r]:
            rows[r].append(y)


def _should_take(ex: float, ey: float, strict: bool) -> bool:
    """Should the new node (excess ``ey``) take a position from a node with excess ``ex``.

    Strict pass: both stay within their rounding (donor >= -0.5, taker <= +0.5).
    Loose pass: only if it reduces the squared imbalance.
    """
    if strict:
        return ex - 1 >= -0.5 - _EPS and ey + 1 <= 0.5 + _EPS
    return ex - ey > 1 + _EPS


def _take_keeps_zones(row: list[int], j: int, y: int, zones: list[int], zc: int) -> bool:
    """Is zone spread of ``row`` with ``y`` at ``j`` no worse than with ``y`` appended."""
    taken = (row[:j] + [y] + row[j + 1 :] + [row[j]])[:zc]
    appended = (row + [y])[:zc]
    return _zone_score(taken, zones, zc) >= _zone_score(appended, zones, zc)


def _drop(row: list[int], z: int, zones: list[int], zc: int) -> None:
    """Remove node ``z`` from ``row`` in place, filling its position (see ``Ring.remove``)."""
    j = row.index(z)
    last = len(row) - 1
    if j == last:
        row.pop()
        return
    p = _filler(row, j, zones, zc)
    if p == last:
        row[j] = row.pop()
    else:
        row[j] = row[p]
        row[p] = row.pop()


def _filler(row: list[int], j: int, zones: list[int], zc: int) -> int:
    """Position whose node should fill hole ``j``: the last one unless zones need another."""
    last = len(row) - 1
    if j >= zc:
        return last
    best, best_score = last, -1
    for p in range(last, max(j + 1, zc) - 1, -1):
        prefix = row[:zc]
        prefix[j] = row[p]
        score = _zone_score(prefix, zones, zc)
        if score > best_score:
            best, best_score = p, score
        if score >= zc:
            break
    return best


def _repair_zones(rows: Rows, zones: list[int]) -> None:
    """Swap within rows so each row's first Zc positions have distinct zones.

    The first duplicate is swapped with the nearest later node of a missing zone.
    """
    zc = len(set(zones))
    for row in rows:
        seen: set[int] = set()
        for s in range(min(zc, len(row))):
            if zones[row[s]] in seen:
                for p in range(s + 1, len(row)):
                    if zones[row[p]] not in seen:
                        row[s], row[p] = row[p], row[s]
                        break
            seen.add(zones[row[s]])


def _rebalance(rows: Rows, targets: list[list[float]], zones: list[int], max_passes: int = 64) -> None:
    """Swap positions within rows, column by column, towards the targets.

    Column ``j`` only swaps with later positions, so fixed columns stay
    fixed; swaps never reduce a row's zone spread.
    """
    n_nodes = len(zones)
    zc = len(set(zones))
    for j in range(len(rows[0]) - 1):
        counts = _column_counts(rows, j, n_nodes)
        excess = [counts[i] - targets[i][j] for i in range(n_nodes)]
        for _ in range(max_passes):
            if not _balance_pass(rows, j, excess, zones, zc):
                break


def _balance_pass(rows: Rows, j: int, excess: list[float], zones: list[int], zc: int) -> bool:
    """One pass over rows improving column ``j``; returns whether anything moved."""
    moved = False
    for row in rows:
        x = row[j]
        if excess[x] - min(excess) <= 1 + _EPS:
            continue
        best = -1
        for p in range(j + 1, len(row)):
            u = row[p]
            if excess[x] - excess[u] <= 1 + _EPS:
                continue
            if best >= 0 and excess[u] >= excess[row[best]]:
                continue
            if _swap_keeps_zones(row, j, p, zones, zc):
                best = p
        if best >= 0:
            u = row[best]
            row[j], row[best] = u, x
            excess[x] -= 1
            excess[u] += 1
            moved = True
    return moved


def _swap_keeps_zones(row: list[int], j: int, p: int, zones: list[int], zc: int) -> bool:
    """Does swapping positions ``j < p`` keep the row's zone spread."""
    if j >= zc or zones[row[j]] == zones[row[p]]:
        return True
    swapped = row[:zc]
    swapped[j] = row[p]
    if p < zc:
        swapped[p] = row[j]
    return _zone_score(swapped, zones, zc) >= _zone_score(row[:zc], zones, zc)
