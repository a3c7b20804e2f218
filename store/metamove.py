"""Moving metadata after a control ring change.

Every record on every control node (current and previous ring) is written to the
control nodes the current map names for its key (a put keeps the newest, so this is
idempotent), and then dropped from a node that no longer should hold it, only if that
node still holds the very version that was copied - after the notes that node kept of the
versions the key's records replaced (gc keeps those for its grace) are given to the nodes
that hold the key now. Bucket records go to every control node. Safe to run again at any
point.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.client import Client, meta_path
from store.errors import EcstoreError, NotFound
from store.names import SYSTEM_BUCKETS
from store.transport import quote_key
from store.wire import pack, unpack
from store.workers import WorkReport, gather_or_cancel

SCAN_PAGE = 1000
NOTES_PER_POST = 10_000            # under node.metadb.MAX_CARRIED_NOTES
KEYS_PARALLEL = 16                 # keys of a page moved at once
NOTES_PAGE = SCAN_PAGE             # keys with notes per notes-only listing page
MAX_NOTES_PAGES = 1000             # notes-only pages read for one page of records


@dataclass
class MetaMoveReport(WorkReport):
    records_checked: int = 0
    copied: int = 0
    dropped: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def control_nodes_all(cmap: ClusterMap) -> dict[str, Node]:
    nodes = {n.id: n for n in cmap.control.nodes}
    if cmap.previous_control is not None:
        for n in cmap.previous_control.nodes:
            nodes.setdefault(n.id, n)
    return nodes


async def move_metadata(c: Client, dry_run: bool = False) -> MetaMoveReport:
    started = time.monotonic()
    cmap = await c.cluster_map(refresh=True)
    report = MetaMoveReport()
    for node in control_nodes_all(cmap).values():
        buckets = await _bucket_records(c, node, report)
        if buckets is None:
            continue
        for b in buckets:
            name = b.pop("name")
            if not dry_run:
                await _put_all(c, cmap.control.nodes, f"/v1/buckets/{name}", b, report)
            await _move_bucket(c, cmap, node, name, dry_run, report)
        for name in sorted(SYSTEM_BUCKETS):  # uploads, parts, keys: no bucket record
            await _move_bucket(c, cmap, node, name, dry_run, report)
    report.seconds = time.monotonic() - started
    return report


async def _bucket_records(c: Client, node: Node, report: MetaMoveReport | ReplicaReport
                          ) -> list[dict[str, Any]] | None:
    """The bucket records one control node holds; None (counted as failed) if it did not
    answer."""
    try:
        reply = await c.t.request("GET", node.address, "/v1/buckets", timeout_s=10)
    except EcstoreError as exc:
        report.failed += 1
        report.errors.append(f"{node.id}: {exc.message}")
        return None
    buckets: list[dict[str, Any]] = unpack(reply.body)["buckets"]
    return buckets


async def _put_all(c: Client, nodes: tuple[Node, ...], path: str, record: dict[str, Any],
                   report: MetaMoveReport, object_name: tuple[str, str] | None = None) -> bool:
    """The record to every node at once; True if each took it (or held it already). An
    object's record (`object_name`: bucket, key) travels in a batch with the others on
    their way to the same node (store.metadata.MetaQuorum.put_to)."""
    body = pack(record) if object_name is None else b""    # put_to packs its own

    async def one(n: Node) -> bool:
        try:
            if object_name is not None:
                answer = await c.meta.put_to(n, *object_name, path, record)
            else:
                answer = unpack((await c.t.request("PUT", n.address, path, body=body,
                                                   timeout_s=10)).body)
            if answer.get("applied"):
                report.copied += 1
            return True
        except EcstoreError as exc:
            report.failed += 1
            report.errors.append(f"{path} -> {n.id}: {exc.message}")
            return False
    return all(await gather_or_cancel(*(one(n) for n in nodes)))


async def _move_bucket(c: Client, cmap: ClusterMap, node: Node, bucket: str, dry_run: bool,
                       report: MetaMoveReport) -> None:
    after = ""
    while True:
        reply = await c.t.request("GET", node.address, f"/v1/list/{bucket}",
                                  query={"after": after, "limit": SCAN_PAGE, "full": "1"},
                                  timeout_s=60)
        page = unpack(reply.body, 64 * 1024 * 1024)
        start = after
        if page["records"]:     # read before the loop takes each record's key out of it
            after = page["records"][-1]["key"]
        moving: list[tuple[str, dict[str, Any], tuple[Node, ...]]] = []
        for rec in page["records"]:
            key = rec.pop("key")
            report.records_checked += 1
            owners = cmap.control_nodes_for(f"{bucket}/{key}")
            if node.id in {o.id for o in owners} or dry_run:
                if dry_run and node.id not in {o.id for o in owners}:
                    report.copied += 1
                continue
            moving.append((key, rec, owners))
        if moving:
            # the notes of this page's keys, read after their records (a version written
            # since is another one: its drop is refused, the next run moves it)
            notes = await _page_notes(c, node, bucket, start, moving[-1][0], report)
            sem = asyncio.Semaphore(KEYS_PARALLEL)

            async def move(key: str, rec: dict[str, Any], owners: tuple[Node, ...]) -> None:
                async with sem:
                    if await _put_all(c, owners, meta_path(bucket, key), rec, report,
                                      (bucket, key)) \
                            and notes is not None \
                            and await _carry_notes(c, owners, bucket, key, notes.get(key), report):
                        await _drop(c, node, bucket, key, rec["version_id"], report)
                    # notes unread: copied, not dropped (a later run drops it)
            await gather_or_cancel(*(move(*m) for m in moving))
        if not page["truncated"] or not page["records"]:
            return


async def _page_notes(c: Client, node: Node, bucket: str, after: str, last: str,
                      report: MetaMoveReport) -> dict[str, list[Any]] | None:
    """The notes `node` keeps of the versions replaced by the records of keys after
    `after` up to `last` (the notes-only listing, resumed until it passes `last`); None,
    counted as failed, if it did not answer - the page's records are then copied but not
    dropped (a later run tries again). A node of a version before the notes answers
    none."""
    if bucket in SYSTEM_BUCKETS:        # never noted
        return {}
    notes: dict[str, list[Any]] = {}
    try:
        for _ in range(MAX_NOTES_PAGES):
            reply = await c.t.request("GET", node.address, f"/v1/list/{bucket}", timeout_s=30,
                                      query={"after": after, "limit": NOTES_PAGE, "replaced": 1,
                                             "notes": 1})
            page = unpack(reply.body, 64 * 1024 * 1024)
            notes.update((k, v) for k, v in page.get("replaced", {}).items() if k <= last)
            if not page.get("truncated"):
                return notes
            # where the next page starts: "last"; a node of a version before notes=1
            # answers records and their notes, cut at a record
            records = page.get("records") or page.get("rows") or []
            resume = page.get("last") or (_key_of(records[-1]) if records else "")
            if not resume:      # truncated, and nowhere to go on from: not all read
                raise EcstoreError(f"a truncated page of notes after {after!r} that says "
                                   "nowhere to resume")
            if resume >= last:
                return notes
            after = resume
        raise EcstoreError(f"more than {MAX_NOTES_PAGES} pages of notes for one page of "
                           "records")
    except EcstoreError as exc:
        report.failed += 1
        report.errors.append(f"notes of {bucket} after {after!r} from {node.id}: {exc.message}")
        return None


def _key_of(row: Any) -> str:
    """A listing row's key (a record map, or a row list whose first field is the key)."""
    return str(row["key"] if isinstance(row, dict) else row[0])


async def _carry_notes(c: Client, owners: tuple[Node, ...], bucket: str, key: str,
                       entries: list[Any] | None, report: MetaMoveReport) -> bool:
    """Bring the notes of the versions this key's records replaced on the node it leaves
    (_page_notes) to each of its owners, for gc (node.metadb.carried_notes). False,
    counted as failed, when they could not be given: the record is not dropped then (a
    later run tries again)."""
    if not entries:
        return True
    try:
        for n in owners:
            for at in range(0, len(entries), NOTES_PER_POST):   # merged: any split will do
                given = await c.t.request(
                    "POST", n.address, f"/v1/notes/{bucket}/{quote_key(key)}", timeout_s=30,
                    body=pack(entries[at:at + NOTES_PER_POST]), ok_404=True)
                if given.status == 404:
                    report.failed += 1
                    report.errors.append(
                        f"notes of {bucket}/{key}: control node {n.id} takes none (a version "
                        "before the twenty-ninth session): upgrade it, then run rebalance "
                        "again - the record stays where it is")
                    return False
        return True
    except EcstoreError as exc:
        report.failed += 1
        report.errors.append(f"notes of {bucket}/{key} to the owners: {exc.message}")
        return False


async def _drop(c: Client, node: Node, bucket: str, key: str, version_id: str,
                report: MetaMoveReport) -> None:
    try:
        await c.t.request("DELETE", node.address,
                          f"/v1/records/{bucket}/{quote_key(key)}",
                          query={"version_id": version_id}, timeout_s=10)
        report.dropped += 1
    except NotFound:
        pass
    except EcstoreError as exc:  # a newer version arrived: the next run moves it
        report.errors.append(f"drop {bucket}/{key} on {node.id}: {exc.message}")


@dataclass
class ReplicaReport(WorkReport):
    records_checked: int = 0
    copied: int = 0             # replicas given the newest record they lacked
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


async def repair_replicas(c: Client, dry_run: bool = False) -> ReplicaReport:
    """Give every control node that should hold a record and lacks it (or holds an older
    one) the newest: a control node whose disk was replaced or wiped comes back empty, and
    reads repair only the records they read - the next node lost would take the only
    copy of the others. Bucket records go to every control node (as move_metadata does).
    Needs every control node (store.gc.control_scan). Returns what it did."""
    from store.gc import control_scan
    from store.metadata import newest

    started = time.monotonic()
    report = ReplicaReport()
    cmap = await c.cluster_map(refresh=True)
    if not dry_run:
        await _copy_bucket_records(c, cmap, report)
    scan = await control_scan(c, cmap, "the replica check")
    keys = sorted({bk for rows in scan.values() for bk in rows})
    sem = asyncio.Semaphore(KEYS_PARALLEL)

    async def give(bucket: str, key: str, holder: Node, lacking: list[Node]) -> None:
        async with sem:
            try:
                reply = await c.t.request("GET", holder.address, meta_path(bucket, key),
                                          timeout_s=10)
            except EcstoreError as exc:
                report.failed += 1
                report.errors.append(f"{bucket}/{key} from {holder.id}: {exc.message}")
                return
            copy = MetaMoveReport()
            await _put_all(c, tuple(lacking), meta_path(bucket, key), unpack(reply.body), copy,
                           (bucket, key))
            report.copied += copy.copied
            report.failed += copy.failed
            report.errors += copy.errors
    gives = []
    for bucket, key in keys:
        report.records_checked += 1
        owners = cmap.control_nodes_for(f"{bucket}/{key}")
        best = newest([rows.get((bucket, key)) for rows in scan.values()])
        assert best is not None
        order = (best["ts"], best["version_id"])
        lacking = [o for o in owners
                   if (r := scan.get(o.id, {}).get((bucket, key))) is None
                   or (r["ts"], r["version_id"]) < order]
        if not lacking:
            continue
        if dry_run:
            report.copied += len(lacking)
            continue
        holder = next(n for n in cmap.control.nodes
                      if (r := scan[n.id].get((bucket, key))) is not None
                      and (r["ts"], r["version_id"]) == order)
        gives.append(give(bucket, key, holder, lacking))
        if len(gives) >= 4 * KEYS_PARALLEL:     # coroutines made a batch at a time
            await gather_or_cancel(*gives)
            gives = []
    await gather_or_cancel(*gives)
    report.seconds = time.monotonic() - started
    return report


async def _copy_bucket_records(c: Client, cmap: ClusterMap, report: ReplicaReport) -> None:
    """Every bucket record any control node holds, to every control node (a put keeps the
    newest: a node holding it already changes nothing)."""
    for node in cmap.control.nodes:
        buckets = await _bucket_records(c, node, report)
        if buckets is None:
            continue
        copy = MetaMoveReport()
        for b in buckets:
            name = b.pop("name")
            await _put_all(c, cmap.control.nodes, f"/v1/buckets/{name}", b, copy)
        report.failed += copy.failed
        report.errors += copy.errors
