"""S3 access keys, kept as records in the KEYS_BUCKET namespace of the control ring.

A key record: {"secret_key", "user", "created"}; the record's key is the access key id.
The gateway looks keys up (and caches them briefly); `ecstore key` manages them.
"""
from __future__ import annotations

import re
import secrets
import string
import time
from typing import Any

from store.client import Client, new_version_id
from store.errors import BadRequest, NotFound
from store.names import KEYS_BUCKET

USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}\Z")
ACCESS_KEY_RE = re.compile(r"^[A-Z0-9]{16,128}\Z")
MAX_KEYS_LISTED = 10_000


def new_key_pair() -> tuple[str, str]:
    """(access key id: 20 upper-case letters and digits, secret: 40 characters)."""
    alphabet = string.ascii_uppercase + string.digits
    access = "EC" + "".join(secrets.choice(alphabet) for _ in range(18))
    return access, secrets.token_urlsafe(30)[:40]


def check_user(user: str) -> str:
    if not USER_RE.match(user):
        raise BadRequest(f"invalid user name {user[:80]!r}: use 1-64 of A-Z a-z 0-9 _ . @ -")
    return user


async def create_key(c: Client, user: str, access_key: str = "",
                     secret_key: str = "") -> dict[str, Any]:
    """Make (or install the given) key pair for `user`; returns access_key, secret_key, user."""
    check_user(user)
    if not access_key:
        access_key, secret_key = new_key_pair()
    if not ACCESS_KEY_RE.match(access_key) or len(secret_key) < 16:
        raise BadRequest("an access key is 16-128 of A-Z 0-9 and its secret 16+ characters")
    record = {"ts": time.time_ns(), "version_id": new_version_id(), "deleted": False,
              "secret_key": secret_key, "user": user, "created": time.time()}
    await c.commit(KEYS_BUCKET, access_key, record)
    return {"access_key": access_key, "secret_key": secret_key, "user": user,
            "created": record["created"]}


async def lookup_key(c: Client, access_key: str) -> dict[str, Any] | None:
    """The key's record, or None if there is no such live key."""
    if not ACCESS_KEY_RE.match(access_key):
        return None
    rec = await c.read_record(KEYS_BUCKET, access_key)
    return None if rec is None or rec["deleted"] else rec


async def list_keys(c: Client) -> list[dict[str, Any]]:
    """Every live key: access_key, user, created (never the secret), sorted by access key."""
    page = await c.list_namespace(KEYS_BUCKET, max_keys=MAX_KEYS_LISTED)
    out = []
    for o in page.objects:
        rec = await lookup_key(c, o.key)
        if rec is not None:
            out.append({"access_key": o.key, "user": rec["user"], "created": rec["created"]})
    return out


async def delete_key(c: Client, access_key: str) -> None:
    """Revoke a key; NotFound if there is no such key."""
    if await lookup_key(c, access_key) is None:
        raise NotFound(f"no such access key: {access_key[:130]}")
    await c.commit(KEYS_BUCKET, access_key, {"ts": time.time_ns(),
                                            "version_id": new_version_id(), "deleted": True})
