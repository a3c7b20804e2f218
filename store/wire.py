"""msgpack encoding for the wire and for stored records, with explicit limits."""
from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import msgpack

from store.errors import BadRequest

MAX_RECORD_BYTES = 4 * 1024 * 1024


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | bytearray | memoryview, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """Decode msgpack with bounded sizes; BadRequest on garbage."""
    if len(data) > max_bytes:
        raise BadRequest(f"body of {len(data)} bytes exceeds {max_bytes}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_str_len=max_bytes, max_bin_len=max_bytes,
            max_array_len=100_000, max_map_len=100_000,
        )
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise BadRequest(f"malformed msgpack body: {exc}") from None


FRAGMENT_META_HEADER = "x-ecstore-fragment-meta"
# CRC-32 (zlib) of a fragment's body, 8 hex digits: a fragment GET carries it when the
# writer stored one in the fragment's meta ("crc32"), and the reader checks it instead of
# the SHA-256 (2.2x faster); a mismatch is settled by the SHA-256, which stays the
# authority (the scrubber and every write check it).
FRAGMENT_CRC_HEADER = "x-ecstore-crc32"
MAX_META_HEADER_BYTES = 4096
# On a fragment DELETE's answer: the bytes the fragment's record held (gc's bytes_deleted)
FREED_HEADER = "x-ecstore-freed-bytes"
# "1" on a fragment PUT: the storage node writes it without keeping it in its page cache
# (RWF_DONTCACHE, Linux 6.14+; a plain write where the kernel or filesystem has no such
# write) - for bytes nobody is about to read back: checkpoints, repair, rebalance. The
# write is as durable either way; a later read caches the fragment as any read does.
# On a fragment GET: a fragment not in the page cache is read without staying there (one
# that is is sent from it as usual) - for readers nobody follows soon: repair, rebalance.
UNCACHED_HEADER = "x-ecstore-uncached"
UNCACHED = "1"


def uncached_requested(headers: Mapping[str, str]) -> bool:
    """A fragment PUT's or GET's request for uncached I/O (both of a storage node's paths)."""
    return headers.get(UNCACHED_HEADER) == UNCACHED


def pack_header(value: dict[str, Any]) -> str:
    """A small map as an HTTP header value (urlsafe base64 of msgpack)."""
    return base64.urlsafe_b64encode(pack(value)).decode()


def unpack_header(value: str | None) -> dict[str, Any]:
    """Inverse of pack_header; BadRequest on anything else."""
    if not value:
        return {}
    if len(value) > MAX_META_HEADER_BYTES:
        raise BadRequest("header value too large")
    try:
        raw = base64.urlsafe_b64decode(value)
    except ValueError:
        raise BadRequest("header is not base64 msgpack") from None
    out = unpack(raw, MAX_META_HEADER_BYTES)
    if not isinstance(out, dict):
        raise BadRequest("header must hold a map")
    return out
