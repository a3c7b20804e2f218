"""The client library: encoding, striping, degraded reads, metadata quorum, listing merge.

The only package that encodes or decodes. Imports placement; must not import node or cli.
"""
from store.alloc import tune_allocator
from store.client import Client, ObjectInfo, SyncClient

__all__ = ["Client", "SyncClient", "ObjectInfo", "tune_allocator"]
