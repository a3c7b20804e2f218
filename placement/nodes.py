"""Node description shared by rings and the cluster map, plus small validators."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ADDRESS_RE = re.compile(r"https?://[^\s/]+(/[^\s]*)?")


class UnknownNodeError(KeyError, ValueError):
    """A node id is not part of a ring (both a KeyError and a ValueError)."""


def check_name(what: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a str matching ``[A-Za-z0-9_-]{1,64}``."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(f"{what} must match [A-Za-z0-9_-]{{1,64}}, got {value!r}")


def check_int(what: str, value: object, lo: int, hi: int) -> None:
    """Raise ValueError unless ``value`` is an int (not bool) in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an int, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], got {value}")


def fields(what: str, d: object, required: set[str], optional: set[str]) -> dict[str, Any]:
    """Validate that ``d`` is a dict with str keys, all ``required`` and only known keys.

    Returns ``d`` (typed as a dict).  Raises ValueError otherwise.
    """
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a map, got {type(d).__name__}")
    keys = set(d)
    if not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{what} keys must be strings")
    missing = required - keys
    unknown = keys - required - optional
    if missing:
        raise ValueError(f"{what} is missing {sorted(missing)}")
    if unknown:
        raise ValueError(f"{what} has unknown fields {sorted(unknown)}")
    return d


@dataclass(frozen=True)
class Node:
    """A storage or control node.

    Attributes:
        id: unique name, ``[A-Za-z0-9_-]{1,64}``, e.g. ``"s1"``.
        address: base URL, ``http(s)://host:port``, e.g. ``"http://127.0.0.1:9001"``.
        weight: relative capacity, finite and > 0 (placement share is proportional).
        zone: failure domain name; placement spreads copies over distinct zones.
        tier: storage tier name, e.g. ``"hot"``.
    """

    id: str
    address: str
    weight: float = 1.0
    zone: str = "z1"
    tier: str = "hot"

    def check(self) -> None:
        """Raise ValueError if any attribute is invalid."""
        check_name("node id", self.id)
        if not isinstance(self.address, str) or not _ADDRESS_RE.fullmatch(self.address):
            raise ValueError(
                f"node {self.id}: address must be a http(s):// base URL, got {self.address!r}"
            )
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"node {self.id}: weight must be a finite number > 0, got {w!r}")
        check_name(f"node {self.id}: zone", self.zone)
        check_name(f"node {self.id}: tier", self.tier)

    def to_dict(self) -> dict[str, Any]:
        """Return a msgpack/JSON friendly dict (weight always a float)."""
        return {
            "id": self.id,
            "address": self.address,
            "weight": float(self.weight),
            "zone": self.zone,
            "tier": self.tier,
        }

    @staticmethod
    def from_dict(d: object) -> "Node":
        """Build and check a Node from ``to_dict`` output.  Raises ValueError."""
        f = fields("node", d, {"id", "address"}, {"weight", "zone", "tier"})
        weight = f.get("weight", 1.0)
        if isinstance(weight, int) and not isinstance(weight, bool):
            weight = float(weight)
        node = Node(
            id=f["id"],
            address=f["address"],
            weight=weight,
            zone=f.get("zone", "z1"),
            tier=f.get("tier", "hot"),
        )
        node.check()
        return node
