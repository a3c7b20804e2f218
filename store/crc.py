"""CRC-32 with zlib's polynomial (the same values as zlib.crc32, so every stored
fragment, cache file and S3 x-amz-checksum-crc32 still checks) from ISA-L through the
isal package: ~57 GB/s on this machine against zlib's ~4.2, which made the CRC-32 a
third of the client library's CPU per byte read. zlib's when isal is not installed."""
from __future__ import annotations

from collections.abc import Callable

crc32: Callable[..., int]   # crc32(data, value=0) -> int, data any bytes-like object
try:
    from isal.isal_zlib import crc32
    FAST = True
except ImportError:   # pragma: no cover - isal is a dependency; a platform without its wheel
    from zlib import crc32
    FAST = False

__all__ = ["crc32", "FAST"]
