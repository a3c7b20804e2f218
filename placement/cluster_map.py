"""The cluster map: every ring and policy of the cluster, versioned by epoch.

Replication decision: ``replicas`` (R) may exceed the number of control
nodes; the *effective* R is ``min(R, len(control.nodes))`` and both quorums
must fit in it (``1 <= write_quorum, read_quorum <= effective R``).  So a
1-control-node cluster is valid with R=1 (or R=3) and W = read quorum = 1.

A cluster started with fewer than three control nodes gets R = its node count
(``default_quorums``); when its control ring later grows, ``with_control_ring`` raises R,
W and the read quorum by the same rule, up to ``DEFAULT_REPLICAS`` - else a cluster
grown from one control node to three would keep every record on one node. Until the
records have moved (rebalance), the map keeps the previous R and W
(``previous_replicas``, ``previous_write_quorum``): a record written before the change
may be on only the old W of its old owners, and ``metadata_read_plan`` and
``listing_misses_allowed`` count with that.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from placement.nodes import Node, UnknownNodeError, check_int, check_name, fields
from placement.policy import Policy
from placement.ring import Ring

FORMAT_VERSION = 1
CONTROL_TIER = "control"
MAX_MAP_BYTES = 256 * 1024 * 1024
MAX_INLINE_BYTES = 16 * 1024 * 1024
_MAX_EPOCH = 2**63 - 1
_MAX_REPLICAS = 32
DEFAULT_REPLICAS = 3

_UNPACK_LIMITS: dict[str, int] = {
    "max_bin_len": 128 * 1024 * 1024,
    "max_str_len": 1024 * 1024,
    "max_array_len": 1_000_000,
    "max_map_len": 10_000,
    "max_ext_len": 0,
}


@dataclass(frozen=True)
class ClusterMap:
    """Everything needed to place data, identical on every node for one epoch.

    Attributes:
        epoch: version, >= 1; every change bumps it.
        storage_rings: one ring per storage tier (``ring.tier`` = tier name).
        control: the control (metadata) ring, tier ``"control"``.
        policies: EC policies, unique names.
        default_policy: name of the policy used when none is given.
        replicas: R, control replicas per metadata key (effective min(R, nodes)).
        write_quorum: W, acks needed for a metadata write.
        read_quorum: replies needed for a metadata read.
        inline_max_bytes: objects up to this size are stored inline in metadata.
        previous_storage_rings: the storage rings of the epoch before the last ring
            change, so that a reader can look where a fragment was before a rebalance
            moved it (empty when there was no ring change).
        previous_epoch: the epoch those rings belong to (0 when none).
        previous_control: the control ring before the last control ring change, so that
            metadata reads also ask where a record was before it was moved.
        previous_replicas, previous_write_quorum: R and W before that change, when it
            changed them (0: the same as now).
    """

    epoch: int
    storage_rings: tuple[Ring, ...]
    control: Ring
    policies: tuple[Policy, ...]
    default_policy: str = "hot"
    replicas: int = 3
    write_quorum: int = 2
    read_quorum: int = 2
    inline_max_bytes: int = 64 * 1024
    previous_storage_rings: tuple[Ring, ...] = ()
    previous_epoch: int = 0
    previous_control: Ring | None = None
    previous_replicas: int = 0
    previous_write_quorum: int = 0

    # ------------------------------------------------------------ invariants
    def check(self) -> None:
        """Raise ValueError unless the map is consistent (see module docstring)."""
        check_int("epoch", self.epoch, 1, _MAX_EPOCH)
        self._check_rings()
        self._check_policies()
        check_int("replicas", self.replicas, 1, _MAX_REPLICAS)
        eff = self.effective_replicas
        check_int(f"write_quorum (effective replicas {eff})", self.write_quorum, 1, eff)
        check_int(f"read_quorum (effective replicas {eff})", self.read_quorum, 1, eff)
        check_int("inline_max_bytes", self.inline_max_bytes, 0, MAX_INLINE_BYTES)
        check_int("previous_replicas", self.previous_replicas, 0, _MAX_REPLICAS)
        check_int("previous_write_quorum", self.previous_write_quorum, 0, _MAX_REPLICAS)

    def _check_rings(self) -> None:
        if not isinstance(self.control, Ring):
            raise ValueError("control must be a Ring")
        self.control.check()
        if self.control.tier != CONTROL_TIER:
            raise ValueError(f"control ring tier must be {CONTROL_TIER!r}, got {self.control.tier!r}")
        if not isinstance(self.storage_rings, tuple) or not self.storage_rings:
            raise ValueError("storage_rings must be a non-empty tuple")
        tiers: set[str] = set()
        ids: set[str] = set()
        for ring in self.storage_rings:
            if not isinstance(ring, Ring):
                raise ValueError("storage_rings must hold Ring objects")
            ring.check()
            self._check_storage_ring(ring, tiers, ids)

    @staticmethod
    def _check_storage_ring(ring: Ring, tiers: set[str], ids: set[str]) -> None:
        check_name("storage ring tier", ring.tier)
        if ring.tier == CONTROL_TIER or ring.tier in tiers:
            raise ValueError(f"storage ring tier {ring.tier!r} is reserved or duplicated")
        tiers.add(ring.tier)
        for nd in ring.nodes:
            if nd.tier != ring.tier:
                raise ValueError(f"node {nd.id} has tier {nd.tier!r} but is in ring {ring.tier!r}")
            if nd.id in ids:
                raise ValueError(f"storage node {nd.id} appears in several rings")
            ids.add(nd.id)

    def _check_policies(self) -> None:
        if not isinstance(self.policies, tuple) or not self.policies:
            raise ValueError("policies must be a non-empty tuple")
        names: set[str] = set()
        rings = {r.tier: r for r in self.storage_rings}
        for p in self.policies:
            if not isinstance(p, Policy):
                raise ValueError("policies must hold Policy objects")
            p.check()
            if p.name in names:
                raise ValueError(f"duplicate policy name {p.name!r}")
            names.add(p.name)
            ring = rings.get(p.tier)
            if ring is None:
                raise ValueError(f"policy {p.name}: no storage ring for tier {p.tier!r}")
            if len(ring.nodes) < p.n:
                raise ValueError(
                    f"policy {p.name}: needs k+m={p.n} nodes, tier {p.tier!r} has {len(ring.nodes)}"
                )
        check_name("default_policy", self.default_policy)
        if self.default_policy not in names:
            raise ValueError(f"default policy {self.default_policy!r} is not defined")

    # ---------------------------------------------------------------- lookup
    @property
    def effective_replicas(self) -> int:
        """Control replicas actually used per key: ``min(replicas, control nodes)``."""
        return min(self.replicas, len(self.control.nodes))

    def policy(self, name: str | None = None) -> Policy:
        """Return the named policy (default policy if None).  Raises KeyError."""
        name = self.default_policy if name is None else name
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(f"no policy {name!r}")

    def storage_ring(self, tier: str) -> Ring:
        """Return the storage ring of ``tier``.  Raises KeyError."""
        for ring in self.storage_rings:
            if ring.tier == tier:
                return ring
        raise KeyError(f"no storage ring for tier {tier!r}")

    def storage_node(self, node_id: str) -> Node:
        """Return the storage node ``node_id`` from any tier.  Raises UnknownNodeError (KeyError)."""
        for ring in self.storage_rings:
            try:
                return ring.node(node_id)
            except KeyError:
                continue
        raise UnknownNodeError(f"no storage node {node_id!r}")

    def all_storage_nodes(self) -> tuple[Node, ...]:
        """Return every storage node of every tier, sorted by id."""
        return tuple(sorted((nd for r in self.storage_rings for nd in r.nodes), key=lambda n: n.id))

    def control_nodes_for(self, key: bytes | str) -> tuple[Node, ...]:
        """Return the ``effective_replicas`` control nodes holding metadata ``key``."""
        return self.control.locate(key, self.effective_replicas)

    def _previous_quorum(self) -> tuple[int, int]:
        """(R, W) of the previous control ring, each at most its node count."""
        assert self.previous_control is not None
        n = len(self.previous_control.nodes)
        return (min(self.previous_replicas or self.replicas, n),
                min(self.previous_write_quorum or self.write_quorum, n))

    def metadata_read_plan(self, key: bytes | str) -> tuple[tuple[Node, ...], int]:
        """The control nodes a read of metadata ``key`` asks, and how many answers it
        needs so that they include one replica of every acknowledged write: a write
        reached W of the key's owners, or - made before the last control ring change and
        not moved yet - the previous W of its previous owners. Missing no more than
        W - 1 of the nodes asked sees any W of them."""
        owners = self.control_nodes_for(key)
        nodes = self.metadata_nodes_for(key)
        r, w = len(owners), min(self.write_quorum, len(owners))
        needed = min(self.read_quorum, r) + len(nodes) - r   # the owners' read quorum
        if self.previous_control is not None:
            needed = max(needed, len(nodes) - min(w, self._previous_quorum()[1]) + 1)
        return nodes, min(len(nodes), needed)

    def listing_misses_allowed(self) -> int:
        """How many of the control nodes a listing may leave unasked (store.listing's
        `enough` = all of them less this): every record is on W of its R owners, or on the
        previous W of its previous owners while a control ring change is not moved yet."""
        r = self.effective_replicas
        w = min(self.write_quorum, r)
        misses = max(0, r - w)
        if self.previous_control is not None:
            misses = min(misses, self._previous_quorum()[1] - 1)
        return misses

    def fragment_nodes(self, policy: Policy, version_id: str, segment_index: int) -> tuple[Node, ...]:
        """Return the k+m nodes of one segment; position i holds fragment index i.

        Raises KeyError if the policy's tier has no ring, ValueError if it is too small.
        """
        ring = self.storage_ring(policy.tier)
        return ring.locate(f"{version_id}/{segment_index}", policy.n)

    # --------------------------------------------------------------- changes
    def bump(self, **changes: Any) -> "ClusterMap":
        """Return a copy with ``changes`` applied and epoch + 1, checked.

        Raises ValueError if the result is invalid or ``epoch`` is given.
        """
        if "epoch" in changes:
            raise ValueError("bump() sets the epoch itself")
        new = replace(self, epoch=self.epoch + 1, **changes)
        new.check()
        return new

    def with_storage_ring(self, ring: Ring) -> "ClusterMap":
        """A new epoch where `ring` replaces the ring of its tier; the old rings are kept
        as the previous placement (for readers during a rebalance)."""
        rings = tuple(ring if r.tier == ring.tier else r for r in self.storage_rings)
        if ring.tier not in {r.tier for r in self.storage_rings}:
            rings = rings + (ring,)
        return self.bump(storage_rings=rings, previous_storage_rings=self.storage_rings,
                         previous_epoch=self.epoch)

    def without_storage_ring(self, tier: str) -> "ClusterMap":
        """A new epoch without the storage ring of `tier` (its last node removed; no
        policy may place fragments on the tier - check() refuses it otherwise). Nothing
        is placed there, so nothing moves: the previous placement stays as it is (another
        tier's change not rebalanced yet keeps its own)."""
        rings = tuple(r for r in self.storage_rings if r.tier != tier)
        if len(rings) == len(self.storage_rings):
            raise ValueError(f"no storage ring for tier {tier!r}")
        return self.bump(storage_rings=rings)

    def with_control_ring(self, ring: Ring) -> "ClusterMap":
        """A new epoch with `ring` as the control ring; the old one is kept as previous.

        A ring grown past R while R is below DEFAULT_REPLICAS raises R, W and the read
        quorum (default_quorums of the new node count); the old R and W are kept beside
        the previous ring until the move is done (``settled``)."""
        r, w, rq = self.replicas, self.write_quorum, self.read_quorum
        if min(DEFAULT_REPLICAS, len(ring.nodes)) > r:
            r, w, rq = default_quorums(len(ring.nodes))
        changed = (r, w) != (self.replicas, self.write_quorum)
        return self.bump(control=ring, previous_control=self.control,
                         previous_epoch=self.epoch, replicas=r, write_quorum=w, read_quorum=rq,
                         previous_replicas=self.replicas if changed else 0,
                         previous_write_quorum=self.write_quorum if changed else 0)

    def settled_control(self) -> "ClusterMap":
        """A new epoch without the previous control ring (its records all moved)."""
        return self.bump(previous_control=None, previous_replicas=0, previous_write_quorum=0)

    def metadata_nodes_for(self, key: bytes | str) -> tuple[Node, ...]:
        """The control nodes that hold `key` now, then those that held it before the last
        control ring change (readers ask both while metadata moves)."""
        now = self.control_nodes_for(key)
        if self.previous_control is None:
            return now
        before = self.previous_control.locate(key, self._previous_quorum()[0])
        return now + tuple(n for n in before if n.id not in {x.id for x in now})

    def previous_fragment_node(self, policy: Policy, version_id: str, segment_index: int,
                               index: int) -> Node | None:
        """Where the previous epoch put fragment `index`, or None (no previous ring, or
        the previous ring had too few nodes)."""
        for ring in self.previous_storage_rings:
            if ring.tier == policy.tier and len(ring.nodes) >= policy.n:
                return ring.locate(f"{version_id}/{segment_index}", policy.n)[index]
        return None

    @staticmethod
    def initial(
        storage_nodes: Iterable[Node],
        control_nodes: Iterable[Node],
        k: int = 4,
        m: int = 2,
        ec_type: str = "isa_l_rs_vand",
        part_power: int = 10,
        segment_size_bytes: int = 4 * 1024 * 1024,
        cold_k: int = 8,
        cold_m: int = 3,
    ) -> "ClusterMap":
        """Return the epoch-1 map: a ring per storage tier, a control ring, a "hot" policy
        (k+m on the hot tier) and, when cold nodes exist, a "cold" one (cold_k+cold_m).

        R, W and the read quorum: default_quorums of the control nodes.
        Raises ValueError if invalid (e.g. fewer than k+m hot nodes).
        """
        storage = list(storage_nodes)
        by_tier: dict[str, list[Node]] = {}
        for nd in storage:
            by_tier.setdefault(nd.tier, []).append(nd)
        rings = tuple(Ring.build(by_tier[t], part_power, tier=t) for t in sorted(by_tier))
        control = Ring.build(control_nodes, part_power, tier=CONTROL_TIER)
        r, w, rq = default_quorums(len(control.nodes))
        policies = [Policy("hot", k, m, ec_type, segment_size_bytes, "hot")]
        if "cold" in by_tier:
            policies.append(Policy("cold", cold_k, cold_m, ec_type, segment_size_bytes, "cold"))
        cmap = ClusterMap(1, rings, control, tuple(policies), "hot", r, w, rq)
        cmap.check()
        return cmap

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        """Return a msgpack-friendly dict."""
        return {
            "format": FORMAT_VERSION,
            "epoch": self.epoch,
            "storage_rings": [r.to_dict() for r in self.storage_rings],
            "control": self.control.to_dict(),
            "policies": [p.to_dict() for p in self.policies],
            "default_policy": self.default_policy,
            "replicas": self.replicas,
            "write_quorum": self.write_quorum,
            "read_quorum": self.read_quorum,
            "inline_max_bytes": self.inline_max_bytes,
            "previous_storage_rings": [r.to_dict() for r in self.previous_storage_rings],
            "previous_epoch": self.previous_epoch,
            "previous_control": (None if self.previous_control is None
                                 else self.previous_control.to_dict()),
        } | ({"previous_replicas": self.previous_replicas,       # only when R changed: maps
              "previous_write_quorum": self.previous_write_quorum}  # as earlier versions read
             if self.previous_replicas or self.previous_write_quorum else {})

    @staticmethod
    def from_dict(d: object) -> "ClusterMap":
        """Build and check a map from ``to_dict`` output.  Raises ValueError."""
        required = set(_FIELDS) | {"format", "epoch", "storage_rings", "control", "policies"}
        f = fields("cluster map", d, required, {"previous_storage_rings", "previous_epoch",
                                                       "previous_control", "previous_replicas",
                                                       "previous_write_quorum"})
        if f["format"] != FORMAT_VERSION:
            raise ValueError(f"unsupported cluster map format {f['format']!r}")
        for key in ("storage_rings", "policies"):
            if not isinstance(f[key], list):
                raise ValueError(f"cluster map {key} must be a list")
        cmap = ClusterMap(
            epoch=f["epoch"],
            storage_rings=tuple(Ring.from_dict(r) for r in f["storage_rings"]),
            control=Ring.from_dict(f["control"]),
            policies=tuple(Policy.from_dict(p) for p in f["policies"]),
            **{k: f[k] for k in _FIELDS},
            previous_storage_rings=tuple(Ring.from_dict(r)
                                         for r in f.get("previous_storage_rings") or ()),
            previous_epoch=int(f.get("previous_epoch", 0)),
            previous_control=(None if f.get("previous_control") is None
                              else Ring.from_dict(f["previous_control"])),
            previous_replicas=f.get("previous_replicas", 0),
            previous_write_quorum=f.get("previous_write_quorum", 0),
        )
        cmap.check()
        return cmap

    def to_bytes(self) -> bytes:
        """Return the map as msgpack bytes (``use_bin_type=True``)."""
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @staticmethod
    def from_bytes(b: bytes | bytearray) -> "ClusterMap":
        """Decode and check ``to_bytes`` output.  Raises ValueError on anything invalid."""
        if not isinstance(b, (bytes, bytearray, memoryview)):
            raise ValueError(f"cluster map must be bytes, got {type(b).__name__}")
        if len(b) > MAX_MAP_BYTES:
            raise ValueError(f"cluster map larger than {MAX_MAP_BYTES} bytes")
        try:
            d = msgpack.unpackb(bytes(b), raw=False, strict_map_key=True, use_list=True, **_UNPACK_LIMITS)
        except Exception as e:  # msgpack raises many types on garbage
            raise ValueError(f"cluster map is not valid msgpack: {e}") from None
        try:
            return ClusterMap.from_dict(d)
        except ValueError:
            raise
        except Exception as e:  # defensive: any other decoding failure is bad input
            raise ValueError(f"invalid cluster map: {e!r}") from None


def default_quorums(control_nodes: int) -> tuple[int, int, int]:
    """(R, W, read quorum) for a control ring of this many nodes: R = min(3, nodes),
    W = R // 2 + 1, read = R - W + 1 (1/1/1 for one node, 2/2/1 for two, 3/2/2 for three
    or more): any read quorum meets any write quorum."""
    r = max(1, min(DEFAULT_REPLICAS, control_nodes))
    w = r // 2 + 1
    return r, w, r - w + 1


_FIELDS = ("default_policy", "replicas", "write_quorum", "read_quorum", "inline_max_bytes")
