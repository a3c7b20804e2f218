"""A listing of 5,000 keys merged over every control node matches a model."""
from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster
from node.metadb import SUMMARIES_KEY, MetaDB
from store.client import Client
from store.listing import ListResult
from store.wire import unpack
from tests import scrape
from tests.cluster.conftest import fill_bucket, wait_for


def model(keys: list[str], prefix: str, delimiter: str, start_after: str,
          max_keys: int) -> tuple[list[str], list[str], bool]:
    """The naive reference: S3's rules in a few lines."""
    entries: list[tuple[str, bool]] = []
    for k in sorted(keys):
        if not k.startswith(prefix) or k <= start_after:
            continue
        cut = k.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            cp = k[:cut + len(delimiter)]
            if entries and entries[-1] == (cp, True):
                continue
            entries.append((cp, True))
        else:
            entries.append((k, False))
    page = entries[:max_keys]
    return ([e for e, p in page if not p], [e for e, p in page if p], len(entries) > max_keys)


@pytest.fixture(scope="module")
def keys(cluster: LocalCluster) -> list[str]:
    rnd = random.Random(7)
    names = set()
    while len(names) < 5000:
        depth = rnd.randint(0, 3)
        parts = [rnd.choice(["a", "b", "logs", "img", "z9"]) + str(rnd.randint(0, 9))
                 for _ in range(depth)]
        names.add("/".join(parts + [f"obj-{rnd.randint(0, 10**6):07d}"]))
    keys = sorted(names)

    async def fill() -> None:
        async with Client.connect(cluster.path) as c:
            await fill_bucket(c, "many", keys)
            # delete a few so tombstones are in the merge
            for k in keys[::97]:
                await c.delete("many", k)
    asyncio.run(fill())
    return [k for i, k in enumerate(keys) if i % 97 != 0]


async def walk_pages(page_after: Callable[[str], Awaitable[ListResult]]
                     ) -> tuple[list[str], list[str]]:
    """Every key and common prefix of a listing, page after page (a bounded loop)."""
    objs: list[str] = []
    prefixes: list[str] = []
    after = ""
    for _ in range(10_000):
        page = await page_after(after)
        objs += [o.key for o in page.objects]
        prefixes += page.common_prefixes
        if not page.truncated:
            return objs, prefixes
        after = page.next_start_after
    raise AssertionError("listing did not end")


async def walk(c: Client, prefix: str, delimiter: str, max_keys: int) -> tuple[list[str], list[str]]:
    return await walk_pages(lambda after: c.list("many", prefix, delimiter, after, max_keys))


@pytest.mark.parametrize("prefix,delimiter,max_keys", [
    ("", "", 1000), ("", "/", 7), ("a1/", "/", 50), ("logs", "", 333), ("img3/b", "/", 1),
    ("nothing-here", "/", 10),
])
def test_listing_matches_the_model(cluster: LocalCluster, keys: list[str], prefix: str,
                                   delimiter: str, max_keys: int) -> None:
    async def go() -> tuple[list[str], list[str]]:
        async with Client.connect(cluster.path) as c:
            return await walk(c, prefix, delimiter, max_keys)
    objs, prefixes = asyncio.run(go())
    want_objs, want_prefixes, _ = model(keys, prefix, delimiter, "", 10**9)
    assert objs == want_objs
    assert prefixes == want_prefixes


def test_one_page_with_start_after(cluster: LocalCluster, keys: list[str]) -> None:
    start = keys[1234]

    async def go() -> ListResult:
        async with Client.connect(cluster.path) as c:
            return await c.list("many", "", "/", start, 25)
    page = asyncio.run(go())
    objs, prefixes, truncated = model(keys, "", "/", start, 25)
    assert [o.key for o in page.objects] == objs
    assert page.common_prefixes == prefixes
    assert page.truncated == truncated


def test_deletes_control_nodes_missed_never_list_their_prefix(all_up: LocalCluster) -> None:
    """Control nodes roll a delimiter listing up at each prefix's first live record. d/a
    is deleted while c1 is down and d/c while c2 is down: each comes back with one stale
    live key, and each one's rolled-up scan hides its tombstone of the other's key. d/
    has no live key and must never be listed, whichever two control nodes are asked."""
    from store.errors import BadRequest
    cluster = all_up

    async def go() -> None:
        async with Client.connect(cluster.path) as c:
            await c.create_bucket("stale")
            for k in ("d/a", "d/c", "e"):
                await c.put("stale", k, b"x")
            for node, key in (("c1", "d/a"), ("c2", "d/c")):
                cluster.kill_node(node)
                await c.delete("stale", key)
                cluster.start_node(node)
                cluster.wait_healthy([node])
            for _ in range(20):
                page = await c.list("stale", "", "/")
                assert ([o.key for o in page.objects], page.common_prefixes) == (["e"], [])
            page = await c.list("stale", "d/", "/")
            assert page.objects == [] and page.common_prefixes == []
            cmap = await c.cluster_map()
            with pytest.raises(BadRequest, match="delimiter"):
                await c.t.request("GET", cmap.control.nodes[0].address, "/v1/list/stale",
                                  query={"prefix": "", "after": "", "limit": 10,
                                         "delimiter": "/" * 2000})
    asyncio.run(go())


async def listed_rows(c: Client, address: str) -> dict[str, float]:
    """A control node's ecstore_control_listed_rows_total, by source."""
    text = (await c.t.request("GET", address, "/metrics")).body.decode()
    return scrape.by_label(scrape.parse(text), "ecstore_control_listed_rows_total", "source")


async def node_rows(c: Client, address: str, bucket: str) -> list[list[object]]:
    """Every row one control node lists of a bucket (rows=1, a bounded loop of pages)."""
    out: list[list[object]] = []
    after = ""
    for _ in range(1000):
        body = unpack((await c.t.request("GET", address, f"/v1/list/{bucket}", query={
            "prefix": "", "after": after, "limit": 1000, "rows": 1})).body)
        out += body["rows"]
        if not body["truncated"]:
            return out
        after = body["rows"][-1][0]
    raise AssertionError("listing did not end")


def test_listings_read_summaries_and_a_database_without_them_gets_them(
        all_up: LocalCluster, keys: list[str]) -> None:
    """Records written by this version list from their summaries; a control node whose
    database has none (written by an earlier version) lists the same rows from the whole
    records, then fills the summaries in once it starts, and lists from them again."""
    cluster = all_up
    node = cluster.nodes["c1"]

    async def rows_and_sources() -> tuple[list[list[object]], dict[str, float]]:
        async with Client.connect(cluster.path) as c:
            before = await listed_rows(c, node.url)
            rows = await node_rows(c, node.url, "many")
            after = await listed_rows(c, node.url)
            return rows, {s: after.get(s, 0) - before.get(s, 0) for s in ("summary", "record")}

    rows, sources = asyncio.run(rows_and_sources())
    assert [r[0] for r in rows if not r[3]] == keys   # and the tombstones of the deletes
    assert sources == {"summary": len(rows), "record": 0}

    cluster.stop_node("c1")
    db = MetaDB(Path(node.data) / "db", sync=True)
    try:
        assert db.db.get(SUMMARIES_KEY) is not None   # marked at its first start
        dropped = [k for k in db.db.keys(from_key=b"l") if k[:1] == b"l"]   # as an old version
        db.write({**{k: None for k in dropped}, SUMMARIES_KEY: None}, sync=True)
    finally:
        db.close()
    assert len(dropped) >= len(rows)
    cluster.start_node("c1")
    cluster.wait_healthy(["c1"])
    log = cluster.dir / "logs" / "c1.log"
    wait_for(lambda: "worker=summaries" in log.read_text(errors="replace"), 60.0,
             "the summaries filled in")
    filled = re.search(r"worker=summaries filled=(\d+)", log.read_text(errors="replace"))
    assert filled is not None and int(filled.group(1)) == len(dropped)
    again, sources = asyncio.run(rows_and_sources())
    assert again == rows and sources == {"summary": len(rows), "record": 0}
