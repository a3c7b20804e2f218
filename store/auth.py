"""Request signing between components with the cluster secret.

signature = HMAC-SHA256(secret, method \\n path?query \\n timestamp \\n body digest).
The body digest (store.digest: "b3:" + BLAKE3 hex; a bodiless request carries the
SHA-256 of nothing, as before) is the same one the storage node verifies for a fragment
and stores beside it, so no byte is hashed twice.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Mapping

SIGNATURE_HEADER = "x-ecstore-signature"
DATE_HEADER = "x-ecstore-date"
CHECKSUM_HEADER = "x-ecstore-checksum"
MAX_CLOCK_SKEW_S = 300.0
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def signature(secret: str, method: str, path_qs: str, timestamp: str, checksum: str) -> str:
    msg = "\n".join((method.upper(), path_qs, timestamp, checksum)).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def sign_headers(secret: str, method: str, path_qs: str, checksum: str = EMPTY_SHA256,
                 now_s: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request; `checksum` is the body's digest (store.digest)."""
    ts = f"{(time.time() if now_s is None else now_s):.3f}"
    return {
        DATE_HEADER: ts,
        CHECKSUM_HEADER: checksum,
        SIGNATURE_HEADER: signature(secret, method, path_qs, ts, checksum),
    }


def verify(secret: str, method: str, path_qs: str, headers: Mapping[str, str],
           now_s: float) -> str | None:
    """Return None when the request is signed correctly, else the reason it is not."""
    get = headers.get
    sig, ts, checksum = get(SIGNATURE_HEADER), get(DATE_HEADER), get(CHECKSUM_HEADER)
    if not sig or not ts or not checksum:
        return "unsigned request"
    try:
        ts_s = float(ts)
    except ValueError:
        return "bad signature date"
    if not math.isfinite(ts_s) or abs(now_s - ts_s) > MAX_CLOCK_SKEW_S:
        return "stale signature date"
    try:
        expected = signature(secret, method, path_qs, ts, checksum)
    except UnicodeEncodeError:  # bytes that are not UTF-8 in the path or a header
        return "malformed request target or signature headers"
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogatepass")):
        return "signature does not match"
    return None
