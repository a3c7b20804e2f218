"""Stable hashing used for placement (identical in every process and run)."""

from __future__ import annotations

import hashlib


def key_bytes(key: bytes | str) -> bytes:
    """Return ``key`` as bytes (str is UTF-8 encoded).

    Raises:
        TypeError: if ``key`` is neither bytes nor str.
    """
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"key must be bytes or str, not {type(key).__name__}")


def hash64(data: bytes) -> int:
    """Return the 64-bit blake2b digest of ``data`` as a big-endian unsigned int."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
