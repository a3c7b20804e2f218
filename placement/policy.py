"""Erasure-coding storage policies (pure description; pyeclib is not imported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placement.nodes import check_int, check_name, fields

EC_TYPES: tuple[str, ...] = (
    "isa_l_rs_vand",
    "isa_l_rs_cauchy",
    "isa_l_rs_vand_inv",
    "liberasurecode_rs_vand",
    "flat_xor_hd_3",
    "flat_xor_hd_4",
)
MAX_FRAGMENTS = 32
MIN_SEGMENT = 64 * 1024
MAX_SEGMENT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Policy:
    """An EC policy: objects are cut in segments, each coded into k data + m parity fragments.

    Attributes:
        name: policy name, ``[A-Za-z0-9_-]{1,64}``.
        k: data fragments per segment (>= 1).
        m: parity fragments per segment (>= 1: no pyeclib backend codes with none); ``k + m <= 32``.
        ec_type: pyeclib backend name, one of ``EC_TYPES``.
        segment_size_bytes: bytes per segment, 64 KiB .. 64 MiB.
        tier: storage tier whose ring places the fragments.
    """

    name: str = "hot"
    k: int = 4
    m: int = 2
    ec_type: str = "isa_l_rs_vand"
    segment_size_bytes: int = 4 * 1024 * 1024
    tier: str = "hot"

    @property
    def n(self) -> int:
        """Fragments per segment: ``k + m``."""
        return self.k + self.m

    def check(self) -> None:
        """Raise ValueError if any attribute is invalid."""
        check_name("policy name", self.name)
        check_int(f"policy {self.name}: k", self.k, 1, MAX_FRAGMENTS)
        check_int(f"policy {self.name}: m", self.m, 1, MAX_FRAGMENTS - 1)   # no codec takes 0
        if self.k + self.m > MAX_FRAGMENTS:
            raise ValueError(f"policy {self.name}: k + m must be <= {MAX_FRAGMENTS}, got {self.n}")
        if self.ec_type not in EC_TYPES:
            raise ValueError(f"policy {self.name}: ec_type must be one of {EC_TYPES}, got {self.ec_type!r}")
        check_int(
            f"policy {self.name}: segment_size_bytes", self.segment_size_bytes, MIN_SEGMENT, MAX_SEGMENT
        )
        check_name(f"policy {self.name}: tier", self.tier)

    def to_dict(self) -> dict[str, Any]:
        """Return a msgpack/JSON friendly dict."""
        return {
            "name": self.name,
            "k": self.k,
            "m": self.m,
            "ec_type": self.ec_type,
            "segment_size_bytes": self.segment_size_bytes,
            "tier": self.tier,
        }

    @staticmethod
    def from_dict(d: object) -> "Policy":
        """Build and check a Policy from ``to_dict`` output.  Raises ValueError."""
        f = fields("policy", d, set(), {"name", "k", "m", "ec_type", "segment_size_bytes", "tier"})
        policy = Policy(**f)
        policy.check()
        return policy
