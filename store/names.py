"""Rules for bucket names and object keys (S3's rules)."""
from __future__ import annotations

import re

from store.errors import BadRequest

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z")
MAX_KEY_BYTES = 1024
RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")   # S3 reserves these
RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# Internal namespaces on the control ring: no S3 bucket name can start with "_".
UPLOADS_BUCKET = "_uploads"    # multipart uploads in progress
PARTS_BUCKET = "_parts"        # their parts
KEYS_BUCKET = "_keys"          # S3 access keys
OPS_BUCKET = "_ops"            # progress of the CLI's workers, key = WORKER_OPS (for /metrics)
PUTS_BUCKET = "_puts"          # puts running long, key = their version id (for gc)
SYSTEM_BUCKETS = frozenset({UPLOADS_BUCKET, PARTS_BUCKET, KEYS_BUCKET, OPS_BUCKET, PUTS_BUCKET})
WORKER_OPS = ("repair", "rebalance", "gc", "tier")


def check_bucket_name(name: str, system_ok: bool = False) -> str:
    """Return name if valid: 3-63 of a-z 0-9 . -, starting and ending alnum, no '..'.

    With system_ok, the internal namespaces (SYSTEM_BUCKETS) are accepted too.
    """
    if not isinstance(name, str):   # from a decoded body: any msgpack value
        raise BadRequest("bucket name must be a string")
    if system_ok and name in SYSTEM_BUCKETS:
        return name
    if (not BUCKET_RE.match(name) or ".." in name or re.match(r"^\d+\.\d+\.\d+\.\d+$", name)
            or name.startswith(RESERVED_PREFIXES) or name.endswith(RESERVED_SUFFIXES)):
        raise BadRequest(f"invalid bucket name {name[:80]!r}: use 3-63 characters "
                         "a-z 0-9 . -, starting and ending with a letter or digit")
    return name


def check_key(key: str) -> str:
    """Return key if valid: 1-1024 UTF-8 bytes, no NUL."""
    if not isinstance(key, str):   # from a decoded body: any msgpack value
        raise BadRequest("object key must be a string")
    if not key:
        raise BadRequest("object key must not be empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise BadRequest(f"object key longer than {MAX_KEY_BYTES} bytes")
    if "\0" in key:
        raise BadRequest("object key must not contain NUL")
    return key


def check_new_key(key: str) -> str:
    """check_key, for a key a put or upload creates: also no U+10FFFF (a noncharacter;
    listings use it as the end of a common prefix, store.listing.PAST_PREFIX). Keys
    written before this rule still read, list and delete."""
    check_key(key)
    if "\U0010ffff" in key:
        raise BadRequest("object key must not contain U+10FFFF (a Unicode noncharacter, "
                         "reserved by ecstore's listings)")
    return key
