"""`ecstore key create/list/delete`: S3 access keys (the work is store/keys.py)."""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.table import Table

from cli.main import err, out, with_client
from store.client import Client
from store.errors import BadRequest
from store.keys import create_key, delete_key, list_keys


async def cmd_key_create(c: Client, a: argparse.Namespace) -> int:
    key = await create_key(c, a.user)
    if a.json:
        print(json.dumps(key, indent=2))
        return 0
    out.print(f"access key: {key['access_key']}\nsecret key: {key['secret_key']}\n"
              f"user:       {key['user']}", highlight=False)
    err.print("keep the secret now: it is not shown again by `ecstore key list`")
    return 0


async def cmd_key_list(c: Client, a: argparse.Namespace) -> int:
    keys = await list_keys(c)
    if a.json:
        print(json.dumps(keys, indent=2))
        return 0
    t = Table(title=f"S3 access keys ({len(keys)})", box=None)
    for col in ("access key", "user", "created"):
        t.add_column(col, no_wrap=True)
    for k in keys:
        t.add_row(k["access_key"], k["user"],
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(k["created"])))
    out.print(t)
    return 0


async def cmd_key_delete(c: Client, a: argparse.Namespace) -> int:
    gateway = c.info.raw.get("gateway") or {}
    if a.access_key == gateway.get("access_key"):   # not a key `key create` made
        raise BadRequest(f"{a.access_key} is the gateway's own admin key (its environment: "
                         "ECSTORE_S3_ACCESS_KEY / ECSTORE_S3_SECRET_KEY, written in "
                         "cluster.json), not one `ecstore key create` made: change it where "
                         "the gateway is started")
    await delete_key(c, a.access_key)
    err.print(f"deleted access key {a.access_key}; the gateway stops taking it within seconds")
    return 0


def register(sub: Any) -> None:
    """Add `key create|list|delete` to the ecstore parser's subparsers."""
    kp = sub.add_parser("key", help="manage S3 access keys (create, list, delete)")
    ksub = kp.add_subparsers(dest="key_command", required=True)
    cr = ksub.add_parser("create", help="make a key pair for a user (it owns what it creates)")
    cr.add_argument("--user", default="admin", help="user the key belongs to (default admin)")
    cr.add_argument("--json", action="store_true")
    cr.set_defaults(func=with_client(cmd_key_create))
    ls = ksub.add_parser("list", help="every key: access key id, user, created (no secrets)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=with_client(cmd_key_list))
    rm = ksub.add_parser("delete", help="revoke a key")
    rm.add_argument("access_key")
    rm.set_defaults(func=with_client(cmd_key_delete))
