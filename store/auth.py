"""Request signing between components with the cluster secret.

signature = HMAC-SHA256(secret, method \\n path?query \\n timestamp \\n body digest
                        [\\n x-ecstore-signed-headers:NAMES (\\n name:value)...]).
A request carrying x-ecstore-* headers (its request id, a fragment's metadata, ...) names
them in x-ecstore-signed-headers and the signature covers their values: one captured on
the network cannot be sent again with other headers. A request without that header - from
a client of an earlier version - is checked as before (nodes are upgraded first).
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
SIGNED_HEADERS_HEADER = "x-ecstore-signed-headers"
AUTH_HEADERS = frozenset({SIGNATURE_HEADER, DATE_HEADER, CHECKSUM_HEADER, SIGNED_HEADERS_HEADER})
OUR_PREFIX = "x-ecstore-"
MAX_CLOCK_SKEW_S = 300.0
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def signature(secret: str, method: str, path_qs: str, timestamp: str, checksum: str,
              signed: str = "") -> str:
    """`signed`: canonical_headers() of the signed x-ecstore-* headers, "" for none."""
    msg = "\n".join((method.upper(), path_qs, timestamp, checksum)) + signed
    return hmac.digest(secret.encode(), msg.encode(), "sha256").hex()   # OpenSSL's one-shot


def canonical_headers(names: list[str], values: list[str]) -> str:
    """What the signature covers of the signed headers (names sorted, lower-case): a
    line naming them, then one per header. Header values hold no line break, so this
    never reads as a request signed without it."""
    return (f"\n{SIGNED_HEADERS_HEADER}:{';'.join(names)}"
            + "".join(f"\n{n}:{v.strip()}" for n, v in zip(names, values)))


def sign_headers(secret: str, method: str, path_qs: str, checksum: str = EMPTY_SHA256,
                 now_s: float | None = None,
                 headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """Headers that authenticate one request; `checksum` is the body's digest (store.digest),
    `headers` the others it carries: its x-ecstore-* ones are signed too."""
    ts = f"{(time.time() if now_s is None else now_s):.3f}"
    out = {DATE_HEADER: ts, CHECKSUM_HEADER: checksum}
    signed = ""
    if headers:
        ours = {k.lower(): v for k, v in headers.items() if k[:10].lower() == OUR_PREFIX}
        names = sorted(n for n in ours if n not in AUTH_HEADERS)
        if names:
            out[SIGNED_HEADERS_HEADER] = ";".join(names)
            signed = canonical_headers(names, [ours[n] for n in names])
    out[SIGNATURE_HEADER] = signature(secret, method, path_qs, ts, checksum, signed)
    return out


def _signed_part(headers: Mapping[str, str]) -> str | None:
    """canonical_headers() of the headers a request says it signed; None when one is not
    there (or twice), the list is not sorted and lower-case, or the request carries an
    x-ecstore-* header it did not sign."""
    listed = headers.get(SIGNED_HEADERS_HEADER)
    if listed is None:
        return ""     # a client of an earlier version: nothing beyond the four fields
    getall = getattr(headers, "getall", None)   # aiohttp's multidict: a name twice
    parts = [f"\n{SIGNED_HEADERS_HEADER}:{listed}"]
    prev = ""
    names = listed.split(";")
    for n in names:
        if n <= prev or not n.startswith(OUR_PREFIX) or n in AUTH_HEADERS:
            return None
        prev = n
        v = headers.get(n)
        if v is None or (getall is not None and len(getall(n)) > 1):
            return None
        parts.append(f"\n{n}:{v.strip()}")
    # every x-ecstore-* header is a signed one or one of the four auth headers, once each
    if sum(1 for k in headers if k[:10].lower() == OUR_PREFIX) != len(names) + len(AUTH_HEADERS):
        return None
    return "".join(parts)


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
    signed = _signed_part(headers)
    if signed is None:
        return "x-ecstore-* headers not signed as x-ecstore-signed-headers says"
    try:
        expected = signature(secret, method, path_qs, ts, checksum, signed)
    except UnicodeEncodeError:  # bytes that are not UTF-8 in the path or a header
        return "malformed request target or signature headers"
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogatepass")):
        return "signature does not match"
    return None
