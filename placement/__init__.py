"""Placement: owns placement, rings, policies and the cluster map.

Pure, deterministic code: no I/O, no clock, no asyncio, no unseeded
randomness, stable hashes only (blake2b, never ``hash()``).  This package
must not import ``store``, ``node`` or ``cli``; they import it.
"""

from placement.cluster_map import ClusterMap
from placement.hashing import hash64
from placement.nodes import Node, UnknownNodeError
from placement.policy import EC_TYPES, Policy
from placement.ring import MoveReport, Ring

__all__ = [
    "EC_TYPES",
    "ClusterMap",
    "MoveReport",
    "Node",
    "Policy",
    "Ring",
    "UnknownNodeError",
    "hash64",
]
