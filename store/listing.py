"""Listing merge: sorted, paginated scans of every control node, merged into one page.

Each key lives on R control nodes, so the same key arrives from several nodes: the
newest record by (ts, version_id) wins and tombstones are dropped. The pure part
(`merge_page`) is separate from the fetching so it can be tested against a naive model.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from placement.nodes import Node
from store.errors import EcstoreError, Unavailable
from store.metadata import staged_answers
from store.transport import Transport
from store.wire import unpack

PAGE_LIMIT = 1000   # records one node sends per request, at most (+1, see node_limit)
MAX_ROLLED_DELIMITER_BYTES = 1024   # what a control node takes (a longer one is in no key)
# A listing position that ends in PAST_PREFIX ("resume after cp + PAST_PREFIX", where a
# page ended at a common prefix cp) means past every key under cp: scan_from seeks to
# cp + b"\xff", which sorts after any UTF-8. U+10FFFF is a Unicode noncharacter, which
# no new key may hold (store.names.check_key); a key written before that rule that holds
# it is still listed (keys under it are passed by the seek, not found again and again).
PAST_PREFIX = "\U0010ffff"
_PAST_BYTES = PAST_PREFIX.encode()


def scan_from(after: bytes) -> bytes:
    """The first key a scan that resumes after `after` may return (UTF-8 bytes)."""
    if after.endswith(_PAST_BYTES):
        return after[:-len(_PAST_BYTES)] + b"\xff"
    return after + b"\0"
# a control node's listed row (GET /v1/list/{bucket}?rows=1): these fields, in this order;
# the merge below works on such rows (lists), by these indexes
# (fields are only ever appended - storage_class came later: a node of an older version
# sends shorter rows, padded with None where they arrive, _NodeCursor.fetch)
ROW_FIELDS = ("key", "ts", "version_id", "deleted", "size", "etag", "content_type",
              "storage_class")
KEY, TS, VERSION, DELETED, SIZE, ETAG, CONTENT_TYPE, STORAGE_CLASS = range(8)
Row = list[Any]
_key = itemgetter(KEY)


def node_limit(max_keys: int) -> int:
    """How many records to ask each node for: one more than the page can hold (at most
    PAGE_LIMIT + 1), so a node that has more says so in the same answer. Asking for
    exactly max_keys made a full page end level with every node's answer: the merge could
    not tell whether the page was complete and fetched a second page from every node - a
    1,000-key page cost each node two 1,000-record scans."""
    return min(PAGE_LIMIT, max_keys) + 1


@dataclass(frozen=True)
class ListEntry:
    key: str
    size: int
    ts: int
    version_id: str
    etag: str | None = None
    storage_class: str | None = None   # None: STANDARD (S3's default)


@dataclass(frozen=True)
class ListResult:
    objects: list[ListEntry] = field(default_factory=list)
    common_prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_start_after: str = ""


def row_of(record: dict[str, Any]) -> Row:
    """The row of a listed record sent as a map (by a node that sends no rows)."""
    return [record["key"], record["ts"], record["version_id"], record["deleted"],
            record.get("size"), record.get("etag"), record.get("content_type"),
            record.get("storage_class")]


def newest_per_key(streams: Iterable[Iterator[Row]],
                   on_stale: Callable[[str], None] | None = None) -> Iterator[Row]:
    """Merge sorted row streams; one row per key, the newest, tombstones kept.
    `on_stale(key)` is called for a key whose newest row is a tombstone while some
    node still holds a live version (a delete that has not reached every replica)."""
    # the streams are sorted runs: sorting them together is a merge in C (timsort finds
    # the runs), several times faster than heapq.merge's Python loop with a key
    merged = sorted(chain.from_iterable(streams), key=_key)
    current: Row | None = None
    live_seen = False
    for r in merged:
        if current is not None and r[KEY] == current[KEY]:
            live_seen = live_seen or not r[DELETED]
            if (r[TS], r[VERSION]) > (current[TS], current[VERSION]):
                current = r
            continue
        if current is not None:
            if on_stale is not None and live_seen and current[DELETED]:
                on_stale(current[KEY])
            yield current
        current, live_seen = r, not r[DELETED]
    if current is not None:
        if on_stale is not None and live_seen and current[DELETED]:
            on_stale(current[KEY])
        yield current


def merge_page(records: Iterator[Row], prefix: str, delimiter: str,
               max_keys: int) -> ListResult:
    """Apply tombstones, delimiter and max_keys to the merged newest-per-key stream."""
    objects: list[ListEntry] = []
    prefixes: list[str] = []
    last = ""
    listed, cut_from, entry = 0, len(prefix), ListEntry
    for r in records:
        if r[DELETED]:
            continue
        key = r[KEY]
        if delimiter:
            cut = key.find(delimiter, cut_from)
            if cut >= 0:
                cp = key[:cut + len(delimiter)]
                if prefixes and prefixes[-1] == cp:
                    continue
                if listed == max_keys:
                    return ListResult(objects, prefixes, True, last)
                prefixes.append(cp)
                listed += 1
                last = cp + PAST_PREFIX  # resume after every key under cp
                continue
        if listed == max_keys:
            return ListResult(objects, prefixes, True, last)
        objects.append(entry(key, r[SIZE], r[TS], r[VERSION], r[ETAG], r[STORAGE_CLASS]))
        listed += 1
        last = key
    return ListResult(objects, prefixes, False, last)


class _NodeCursor:
    """Pages of one control node's scan, fetched lazily."""

    def __init__(self, t: Transport, node: Node, bucket: str, prefix: str, after: str,
                 delimiter: str = "", limit: int = PAGE_LIMIT + 1) -> None:
        self.t, self.node, self.bucket, self.prefix, self.after = t, node, bucket, prefix, after
        self.delimiter, self.limit = delimiter, limit
        self.page: list[Row] = []
        self.truncated = True

    async def fetch(self) -> None:
        query: dict[str, Any] = {"prefix": self.prefix, "after": self.after, "limit": self.limit,
                                 "rows": 1}
        if self.delimiter:
            query["delimiter"] = self.delimiter
        reply = await self.t.request("GET", self.node.address, f"/v1/list/{self.bucket}",
                                     query=query, timeout_s=10.0)
        body = unpack(reply.body)
        rows = body.get("rows")   # None: a node that sends maps ("records") only
        if rows is None:
            self.page = [row_of(r) for r in body["records"]]
        elif rows and len(rows[0]) < len(ROW_FIELDS):   # a node of an older version
            self.page = [r + [None] * (len(ROW_FIELDS) - len(r)) for r in rows]
        else:
            self.page = rows
        self.truncated = body["truncated"]
        if self.page:
            self.after = body.get("resume") or self.page[-1][KEY]


async def merge_listing(t: Transport, nodes: tuple[Node, ...], bucket: str, prefix: str,
                        delimiter: str, start_after: str, max_keys: int,
                        allowed_failures: int, enough: int | None = None,
                        rolled: bool = True) -> ListResult:
    """Fetch and merge until one page of max_keys entries is complete.

    Each round merges what every node returned; the round's result is final up to the
    smallest last key of the nodes that have more, so the next round starts there.

    Only `enough` nodes (default all) are asked, starting at a random one so the load
    spreads: every record a write acknowledged is on enough of its replicas that any
    `enough` nodes see it (the caller's quorum arithmetic). A node that fails, or lags
    past the grace once another has answered, brings in one of the others (a stalled
    control node does not stall listings); up to `allowed_failures` may fail in all.

    With a delimiter (and `rolled`), each node sends, under each common prefix, only its
    records up to its first live one (node/metadb.py scan_listed): a prefix of a million
    keys costs a few records, not a million. That is exact as long as the smallest such
    first-live key of all nodes is the newest version of its key - every node sent all
    its records up to it, so that is known; when it is not (a delete that has not reached
    one replica), the page is listed again with every record (`rolled=False`).
    """
    need = len(nodes) if enough is None else max(1, min(enough, len(nodes)))
    first = random.randrange(len(nodes)) if need < len(nodes) else 0
    order = nodes[first:] + nodes[:first]
    rolled = rolled and 0 < len(delimiter.encode()) <= MAX_ROLLED_DELIMITER_BYTES
    cursors = [_NodeCursor(t, n, bucket, prefix, start_after, delimiter if rolled else "",
                           node_limit(max_keys)) for n in order]
    results = await staged_answers([c.fetch for c in cursors], need)
    failed = [r for r in results if isinstance(r, BaseException)]
    for r in failed:
        if not isinstance(r, EcstoreError):
            raise r
    if len(failed) > allowed_failures:
        raise Unavailable(f"listing {bucket}: {len(failed)} of {len(nodes)} control nodes "
                          "failed", tried=len(nodes), failed=len(failed))
    live = [c for c, r in zip(cursors, results) if not isinstance(r, BaseException)]
    collected: list[Row] = []
    doubtful: list[str] = []

    def stale(key: str) -> None:
        if key.find(delimiter, len(prefix)) >= 0:
            doubtful.append(key)
    while True:
        more = [c for c in live if c.truncated and c.page]
        horizon = min((c.page[-1][KEY] for c in more), default=None)
        batch = [iter([r for r in c.page if horizon is None or r[KEY] <= horizon])
                 for c in live]
        for c in live:
            c.page = [r for r in c.page if horizon is not None and r[KEY] > horizon]
        collected.extend(newest_per_key(batch, stale if rolled else None))
        if doubtful:
            return await merge_listing(t, nodes, bucket, prefix, delimiter, start_after,
                                       max_keys, allowed_failures, enough, rolled=False)
        page = merge_page(iter(collected), prefix, delimiter, max_keys)
        if page.truncated or horizon is None:
            return page
        await asyncio.gather(*(_refill(c) for c in more))


async def _refill(c: _NodeCursor) -> None:
    rest = c.page
    await c.fetch()
    c.page = rest + c.page
