"""The client library: encoding, striping, degraded reads, metadata quorum, listing merge.

The only package that encodes or decodes. Imports placement; must not import node or cli.
The names below are loaded when first used: a storage or control node imports a few of
this package's modules (wire, errors, alloc ...), not the whole client.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store.alloc import tune_allocator
    from store.client import Client, ObjectInfo, SyncClient

__all__ = ["Client", "SyncClient", "ObjectInfo", "tune_allocator"]
_WHERE = {"Client": "store.client", "SyncClient": "store.client", "ObjectInfo": "store.client",
          "tune_allocator": "store.alloc"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'store' has no attribute {name!r}")
