"""The pyeclib codec, one driver per (k, m, ec_type)."""
from __future__ import annotations

from functools import lru_cache

from pyeclib.ec_iface import ECDriver

from store.errors import Corrupt


@lru_cache(maxsize=32)
def driver(k: int, m: int, ec_type: str) -> ECDriver:
    return ECDriver(k=k, m=m, ec_type=ec_type)


def encode(k: int, m: int, ec_type: str, segment: bytes | memoryview) -> list[bytes]:
    """k+m fragments of one segment; fragment i is at list index i."""
    return driver(k, m, ec_type).encode(bytes(segment) if isinstance(segment, memoryview) else segment)


def decode(k: int, m: int, ec_type: str, fragments: list[bytes]) -> bytes:
    """The segment from any k fragments (more are ignored)."""
    try:
        return driver(k, m, ec_type).decode(fragments)
    except Exception as exc:  # pyeclib raises its own ECDriverError family
        raise Corrupt(f"decode failed: {exc}") from None


def reconstruct(k: int, m: int, ec_type: str, fragments: list[bytes], missing: list[int]) -> list[bytes]:
    try:
        return driver(k, m, ec_type).reconstruct(fragments, missing)
    except Exception as exc:
        raise Corrupt(f"reconstruct failed: {exc}") from None
