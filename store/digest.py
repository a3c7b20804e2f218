"""The digest that checks a fragment's bytes and authenticates a request's body.

Written as "b3:" + the BLAKE3 hex digest (blake3 package): 6.4 GB/s on this machine
against SHA-256's 1.8, and every fragment is hashed twice on its way in (by the writer,
to sign the request, and by the storage node, before it stores it) - SHA-256 was
~1.7 ms of CPU per MiB put, BLAKE3 ~0.5. Both hashes release the GIL.

A plain 64-hex-digit value is the SHA-256 that fragments and requests carried before
(still checked: fragments on disk keep the digest they were written with, and a node
takes requests from writers not yet upgraded). A value in neither form never matches.
"""
from __future__ import annotations

import hashlib
import re

from blake3 import blake3

PREFIX = "b3:"
EMPTY = PREFIX + blake3(b"").hexdigest()
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"(b3:)?[0-9a-f]{64}")


def digest(data: bytes | bytearray | memoryview) -> str:
    """The digest new fragments and requests carry (EMPTY for no bytes)."""
    return PREFIX + blake3(data).hexdigest()


def well_formed(value: str) -> bool:
    """A BLAKE3 or SHA-256 digest in our notation (checked before any hashing)."""
    return _DIGEST.fullmatch(value) is not None


def matches(data: bytes | bytearray | memoryview, value: str | None) -> bool:
    """True if `data` hashes to `value`, in whichever of the two forms it is written."""
    if not value:
        return False
    if value.startswith(PREFIX):
        return PREFIX + blake3(data).hexdigest() == value
    if _HEX64.fullmatch(value):
        return hashlib.sha256(data).hexdigest() == value
    return False
