"""`ecstore ring ...`, `ecstore rebalance` and `ecstore cluster add-node/remove-node`."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from cli.argtypes import non_negative, positive
from placement.cluster_map import ClusterMap
from placement.nodes import Node
from store.client import MAP_TTL_S, Client
from store.cluster import state_path
from store.errors import BadRequest, EcstoreError, NotFound, Unavailable
from store.workers import only_one


def ring_rows(cmap: ClusterMap) -> list[dict[str, Any]]:
    rows = []
    for ring in cmap.storage_rings:
        n = max((p.n for p in cmap.policies if p.tier == ring.tier), default=1)
        share = ring.share(min(n, len(ring.nodes)))
        for node in ring.nodes:
            rows.append({"ring": ring.tier, "id": node.id, "url": node.address,
                         "zone": node.zone, "tier": node.tier, "weight": node.weight,
                         "share": round(share.get(node.id, 0.0), 4)})
    share = cmap.control.share(cmap.effective_replicas)
    for node in cmap.control.nodes:
        rows.append({"ring": "control", "id": node.id, "url": node.address, "zone": node.zone,
                     "tier": "", "weight": node.weight,
                     "share": round(share.get(node.id, 0.0), 4)})
    return rows


async def cmd_ring_show(c: Client, a: argparse.Namespace) -> int:
    from cli.main import out
    cmap = await c.cluster_map(refresh=True)
    rows = ring_rows(cmap)
    pending = [name for name, yes in (("storage", bool(cmap.previous_storage_rings)),
                                      ("control", cmap.previous_control is not None)) if yes]
    if a.json:
        print(json.dumps({"epoch": cmap.epoch, "previous_epoch": cmap.previous_epoch,
                          "rebalance_pending": pending,
                          "metadata": {"replicas": cmap.effective_replicas,
                                       "write_quorum": cmap.write_quorum,
                                       "read_quorum": cmap.read_quorum},
                          "policies": [p.to_dict() for p in cmap.policies], "nodes": rows},
                         indent=2))
        return 0
    t = Table(title=f"cluster map epoch {cmap.epoch}", box=None)
    for col in ("ring", "node", "zone", "weight", "share", "url"):
        t.add_column(col, no_wrap=True, justify="right" if col in ("weight", "share") else "left")
    for r in rows:
        t.add_row(r["ring"], r["id"], r["zone"], f"{r['weight']:g}", f"{100 * r['share']:.1f}%",
                  r["url"])
    out.print(t)
    for p in cmap.policies:
        out.print(f"policy {p.name}: {p.k}+{p.m} {p.ec_type}, "
                  f"{p.segment_size_bytes // 1024} KiB segments, tier {p.tier}", highlight=False)
    out.print(f"metadata: {cmap.effective_replicas} replica"
              f"{'s' if cmap.effective_replicas != 1 else ''} of each record on the control "
              f"ring, write quorum {cmap.write_quorum}, read quorum {cmap.read_quorum}",
              highlight=False)
    if pending:
        out.print(f"rebalance pending: the last {' and '.join(pending)} ring change (epoch "
                  f"{cmap.previous_epoch}) is not all moved yet; run `ecstore rebalance`",
                  highlight=False)
    return 0


async def change_ring(c: Client, op: str, a: argparse.Namespace) -> ClusterMap:
    """Apply one ring change to the newest map, publish it, return it.

    Refused while the last change of the same ring is not rebalanced yet (a map keeps one
    previous placement: a second change would leave fragments where no reader looks),
    unless `a.force`; a change that changes nothing is not published."""
    cmap = await c.cluster_map(refresh=True)
    try:
        if op == "add" and getattr(a, "role", "storage") == "control":
            node = Node(id=a.id, address=a.url, weight=a.weight, zone=a.zone or a.id,
                        tier="control")
            node.check()
            if any(n.id == a.id for n in cmap.control.nodes):
                raise BadRequest(f"node {a.id} is already in the map")
            if not getattr(a, "force", False):
                await _refuse_unreachable(c, node, "control")
            old, ring = cmap.control, cmap.control.add(node)[0]
        elif op == "add":
            node = Node(id=a.id, address=a.url, weight=a.weight, zone=a.zone or a.id,
                        tier=a.tier)
            node.check()
            if any(n.id == a.id for n in cmap.all_storage_nodes()):
                raise BadRequest(f"node {a.id} is already in the map")
            if not getattr(a, "force", False):
                await _refuse_unreachable(c, node, "storage")
            try:
                old = cmap.storage_ring(a.tier)
                ring = old.add(node)[0]
            except KeyError:
                from placement.ring import Ring
                old, ring = None, Ring.build([node], cmap.storage_rings[0].part_power,
                                             tier=a.tier)
        elif any(n.id == a.id for n in cmap.control.nodes):
            old = cmap.control
            ring = _change(cmap.control, op, a)
        else:
            old = next((r for r in cmap.storage_rings if any(n.id == a.id for n in r.nodes)),
                       None)
            if old is None:
                raise NotFound(f"no node {a.id} in the map")
            if op == "remove" and len(old.nodes) == 1 \
                    and not any(p.tier == old.tier for p in cmap.policies):
                # the last node of a tier no policy uses (added with a mistyped --tier):
                # the ring goes with it - it said "cannot remove the last node of a ring",
                # and the node stayed in the map for good
                return await _publish(c, cmap, cmap.without_storage_ring(old.tier))
            ring = _change(old, op, a)
        control = ring.tier == "control"
        if old is not None and (ring.to_dict() == old.to_dict() or _asks_nothing(old, op, a)):
            from cli.main import err
            err.print(f"no change: the map stays at epoch {cmap.epoch}")
            return cmap
        if control and old is not None and not getattr(a, "force", False):
            _refuse_fewer_replicas(cmap, old, ring, a.id)
        pending = cmap.previous_control is not None if control \
            else bool(cmap.previous_storage_rings)
        if pending and not getattr(a, "force", False):
            what = "metadata" if control else "fragments"
            raise BadRequest(
                f"refused: the {what} of the last {'control' if control else 'storage'} "
                f"ring change (epoch {cmap.previous_epoch} -> {cmap.epoch}) are not all moved "
                "yet: run `ecstore rebalance` first (a map keeps one previous placement, so "
                "a second change now would leave some where no reader looks). --force "
                "changes the ring anyway")
        new = cmap.with_control_ring(ring) if control else cmap.with_storage_ring(ring)
    except ValueError as exc:  # a change that leaves a policy unable to place k+m
        said = str(exc)
        if "quorum" in said and "effective replicas" in said:
            # the map's own check; it said only "write_quorum (effective replicas 1) must
            # be in [1, 1], got 2"
            said = (f"the control ring would keep too few nodes for the metadata write and "
                    f"read quorums ({said}); add a control node first")
        elif "needs k+m=" in said and op == "remove":
            # it gave no next step: on a cluster of exactly k+m storage nodes (the default
            # 6 for 4+2) the runbook's first step for a dead node ended here
            said += (f": add a storage node to that tier first (`ecstore cluster add-node`, "
                     f"or `ecstore ring add`), then remove {a.id} - with --force if it is "
                     "down for good; `ecstore repair` then rebuilds what only it held")
        raise BadRequest(f"refused: {said}") from None
    return await _publish(c, cmap, new)


async def _publish(c: Client, cmap: ClusterMap, new: ClusterMap) -> ClusterMap:
    """Publish a changed map and say so."""
    failed = await c.publish_map(new)
    from cli.main import err
    err.print(f"map epoch {cmap.epoch} -> {new.epoch}"
              + (f" (not reached: {', '.join(failed)})" if failed else ""))
    return new


async def _refuse_unreachable(c: Client, node: Node, role: str) -> None:
    """BadRequest unless the node at `url` answers a request signed with the cluster
    secret as `role` node `node_id`: a typo in a URL, a node not started yet or started
    with another secret would otherwise get its share of placements, and every write
    and rebalance move to it would fail."""
    from cli.localcluster import not_itself

    node_id, url = node.id, node.address
    try:
        reply = await c.t.request("GET", url.rstrip("/"), "/v1/status", timeout_s=5.0)
    except EcstoreError as exc:
        raise BadRequest(f"refused: {role} node {node_id} at {url} does not answer ("
                         f"{exc.message}): start it first, with this cluster's secret; "
                         "--force adds it anyway") from None
    problem = not_itself(reply.body, url, role, node_id)
    if problem is not None:
        raise BadRequest(f"refused: {problem}; --force adds it anyway")


def _refuse_fewer_replicas(cmap: ClusterMap, old: Any, ring: Any, node_id: str) -> None:
    """BadRequest if a control ring change leaves fewer control nodes than the map's R:
    every record whose replica was there would keep fewer copies, and the next control
    node down would stop metadata writes or reads (the quorums of fewer nodes)."""
    keep = len(ring.nodes)
    if keep >= min(cmap.replicas, len(old.nodes)):
        return
    raise BadRequest(
        f"refused: without {node_id} the control ring keeps {keep} node"
        f"{'s' if keep != 1 else ''} for {cmap.replicas} replicas of each metadata record: "
        "every record would lose a copy, and one more control node down would stop "
        "metadata writes. Add a control node first (`ecstore ring add ID --url URL --role "
        "control`, or `ecstore cluster add-node --role control` on a local cluster), then "
        "remove this one; --force removes it anyway")


async def settle_storage(c: Client) -> bool:
    """Publish a map without the previous storage placement, once a rebalance pass found
    nothing left to move (readers stop looking there; the next ring change is allowed).
    True if a map was published."""
    cmap = await c.cluster_map(refresh=True)
    if not cmap.previous_storage_rings:
        return False
    await c.publish_map(cmap.bump(previous_storage_rings=()))
    return True


async def passes_until_still(c: Client, run_pass: Callable[[int], Awaitable[Any]],
                             reports: list[Any], retry_failed: bool,
                             awaited: Callable[[], Awaitable[int]] | None = None) -> bool:
    """Rebalance passes (`run_pass(n)` -> its report), appended to `reports` (the passes
    already run), until one finds nothing to move, at most DRAIN_PASSES in all. Each waits
    until every writer holds the current map first (writers with a map up to MAP_TTL_S
    old may have placed fragments the old way meanwhile). A pass that failed ends them
    unless `retry_failed`. `awaited()`: how many fragments puts may still commit that a
    pass would then move (a drain: on the node that leaves); while there are some, the
    passes go on (past DRAIN_PASSES, for at most DRAIN_AWAIT_MAX_S). True if the last
    moved and failed nothing, was complete (no fragment found nowhere while a node did not
    answer its listing: it may hold them at the previous placement), nothing was still
    awaited, and the map then dropped the previous placement (settle_storage)."""
    until = time.monotonic() + DRAIN_AWAIT_MAX_S
    pending = 0     # fragments puts may still commit, as of the last pass that moved nothing
    while True:
        # a resumed pass saw only the objects after the killed run's checkpoint: it never
        # settles the ring by itself (one that moved nothing was taken as a whole pass)
        last = reports[-1] if reports else None
        if last is not None and not last.resumed_after:
            if last.failed and not retry_failed:
                break
            if not last.failed and not last.moved:
                if awaited is None:
                    break
                pending = await awaited()
                if pending <= 0 or time.monotonic() > until:   # -1: unknown, never settled
                    break
        # DRAIN_PASSES at most, but while puts are still to commit (and no pass fails)
        # as many as DRAIN_AWAIT_MAX_S allows: each commit costs a pass that moves it
        waiting = pending > 0 and not (last and last.failed) and time.monotonic() <= until
        if len(reports) >= DRAIN_PASSES and not waiting:
            break
        await asyncio.sleep(MAP_TTL_S + 0.5)
        reports.append(await run_pass(len(reports) + 1))
    last = reports[-1]
    return (not last.moved and not last.failed and not last.incomplete and not pending
            and await settle_storage(c))


DRAIN_SETTLE_S = 30.0       # a version younger (by its id) may be a put yet to commit ...
DRAIN_AWAIT_MAX_S = 300.0   # ... waited for this long at most by a drain, then it says so


async def awaited_on(c: Client, node: Node) -> int:
    """Fragments on `node` (one being drained, out of the map) that a put may still
    commit - then a pass moves them: of versions younger than DRAIN_SETTLE_S (their ids
    start with their writer's clock; a put running longer says so in PUTS_BUCKET, past
    INTENT_AFTER_S) or of a put that says it runs. A put that took its map before the
    node left places fragments there until it ends, and commits after the pass that
    would have moved them: the drain stopped the node and those objects were short of a
    fragment (a fresh-clone CI run of test_rebalance found one so). The rest are a dead
    put's, gc's. -1 when the node did not answer its listing: unknown, not none."""
    from store.gc import cutoff, fragment_version, running_puts, version_time_ns
    from store.workers import all_listings

    listings, _ = await all_listings(c, [node])
    if node.id not in listings:   # what it holds is unknown: never "nothing awaited"
        return -1
    now = time.time_ns()
    of = [v for v in map(fragment_version, listings.get(node.id, ())) if v is not None]
    young = {v for v in of if version_time_ns(v) >= cutoff(now, DRAIN_SETTLE_S)}
    if set(of) - young:
        running, _ = await running_puts(c, now)
        young |= (set(of) - young) & running
    return sum(1 for v in of if v in young)


def _asks_nothing(ring: Any, op: str, a: argparse.Namespace) -> bool:
    """A reweight to the weight a node has, or a set-zone to its zone."""
    node = next((n for n in ring.nodes if n.id == a.id), None)
    return node is not None and ((op == "reweight" and node.weight == a.weight)
                                 or (op == "set-zone" and node.zone == a.zone))


def _change(ring: Any, op: str, a: argparse.Namespace) -> Any:
    if op == "remove":
        return ring.remove(a.id)[0]
    if op == "reweight":
        return ring.reweight(a.id, a.weight)[0]
    return ring.set_zone(a.id, a.zone)[0]


def ring_command(op: str) -> Any:
    async def run(c: Client, a: argparse.Namespace) -> int:
        await change_ring(c, op, a)
        return 0
    return run


async def cmd_rebalance(c: Client, a: argparse.Namespace) -> int:
    """Move fragments to where the current map places them, then metadata records. A pass
    that moved something is followed by another once every client holds the new map
    (writers with a map up to MAP_TTL_S old may have placed fragments the old way while
    it ran), up to DRAIN_PASSES; once a pass finds nothing to move, the map drops the
    previous placement and the next ring change is allowed. One at a time (only_one)."""
    state = state_path(a.cluster, "rebalance.state.json")
    with only_one(state, "rebalance") if not a.dry_run else contextlib.nullcontext():
        return await _rebalance(c, a, state)


async def _rebalance(c: Client, a: argparse.Namespace, state: Path) -> int:
    from cli.main import FAILED, drive, err, human
    from store.rebalance import prepare_rebalance

    err.print("reading metadata and fragment listings ...")
    w = await prepare_rebalance(c, a.dry_run, a.rate, state)
    if w.resumed_after:
        err.print(f"resuming: {w.resumed_after} objects were done by an earlier run")
    r = w.report
    show = err.is_terminal and not a.json
    ops = await drive(w, "rebalance", lambda: f"rebalance: {r.moved} moved, {human(r.bytes_moved)}",
                      show, last=False)   # its end is reported below, after every pass
    try:
        rep, last = await _rebalance_rest(c, a, state, w, show)
        code = _rebalance_report(a, rep, last)
    except BaseException:
        if ops is not None:   # a later pass or the metadata move failed
            await ops.finish(r.moved, 0, FAILED)
        raise
    if ops is not None:   # the whole command's end: until now the record said "running"
        ops.final = (rep["moved"], 0)
        await ops.end(code)
    return code


def _rebalance_report(a: argparse.Namespace, rep: dict[str, Any], last: Any) -> int:
    """rebalance's end: its report printed; the exit code."""
    from cli.main import err, human, report_table

    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        md = rep["metadata"]
        report_table("rebalance" + (" (dry run: would move)" if a.dry_run else ""),
                     [(n.replace("_", " "), rep[n])
                      for n in ("objects_checked", "moved", "skipped", "failed", "passes")]
                     + [("bytes moved", human(rep["bytes_moved"]))]
                     # a record read before the move (this command reads every live one,
                     # and reads put a record back where the ring wants it) is on its new
                     # node already: the copy changes nothing, the drop off the old one is
                     # the move
                     + ([("metadata records to move", md["copied"])] if a.dry_run else
                        [("metadata records moved off old nodes", md["dropped"]),
                         ("metadata copies written", md["copied"])])
                     + [("metadata failed", md["failed"])],
                     rep["errors"] + [f"metadata: {e}" for e in md.get("errors", [])[:10]]
                     + ([f"metadata: and {len(md['errors']) - 10} more (--json lists them)"]
                        if len(md.get("errors", [])) > 10 else []))
        if md["failed"]:
            err.print("some metadata records were not moved (above): the control ring stays "
                      "unsettled, readers still look where the previous ring put them; start "
                      "the control nodes named, or take a dead one out of the map (`ecstore "
                      "cluster remove-node ID --force`), then run `ecstore rebalance` again",
                      highlight=False)
    if last.incomplete and not a.dry_run:
        err.print(f"incomplete: {unlisted_note(last)}; no ring change waits for this "
                  "rebalance (the map has no previous placement), but what the node holds "
                  "was not checked: start it and run `ecstore rebalance` again"
                  if rep["settled"] else
                  f"not settled: {unlisted_note(last)}; the map keeps the previous "
                  "placement, where readers still look. Start them and run `ecstore "
                  "rebalance` again; for a node gone for good, take it out of the map "
                  "(`ecstore cluster remove-node ID --force`, or `ring remove ID --force`: "
                  "this ring change is not rebalanced), run `ecstore repair` (it rebuilds "
                  "what the node held) and the next rebalance settles",
                  highlight=False)
        return 1
    if last.unlisted and a.dry_run:
        # as repair --dry-run: what those nodes hold was not looked at (it exited 0)
        err.print(f"incomplete: storage node{'s' if len(last.unlisted) > 1 else ''} "
                  f"{', '.join(last.unlisted)} did not answer its listing: what the map "
                  "places there, or what it holds, was not looked at", highlight=False)
        return 1
    return 1 if rep["failed"] or rep["metadata"]["failed"] else 0


async def _rebalance_rest(c: Client, a: argparse.Namespace, state: Path, w: Any,
                          show: bool) -> tuple[dict[str, Any], Any]:
    """rebalance after its first pass: the passes that follow and the metadata move; the
    whole command's report and its last pass's."""
    from cli.main import drive, err
    from store.rebalance import prepare_rebalance

    w.report.seconds = time.monotonic() - w.limiter.start
    w.finish()
    rep = w.report.to_dict()
    reports = [w.report]
    settled = False
    if not a.dry_run:
        async def again(n: int) -> Any:
            err.print(f"pass {n}: looking for fragments placed the old way meanwhile ...")
            nxt = await prepare_rebalance(c, False, a.rate, state)
            await drive(nxt, f"rebalance pass {n}", lambda: "rebalance", show, op="rebalance",
                        last=False)
            nxt.finish()
            return nxt.report
        settled = await passes_until_still(c, again, reports, retry_failed=False)
    # nothing to settle is settled: no ring change waits for a rebalance (a dry run says
    # whether one waits now: it settles nothing)
    settled = settled or not (await c.cluster_map(refresh=True)).previous_storage_rings
    for more in reports[1:]:
        for field in ("moved", "bytes_moved", "failed"):
            rep[field] += getattr(more, field)
        rep["errors"] += more.errors
    # fragments found on no node: every pass finds the same ones (it counted them once a
    # pass, 1,032 for a dead node's 516 after two passes)
    rep["skipped"] = reports[-1].skipped
    rep["unlisted"] = reports[-1].unlisted
    if a.dry_run:   # nothing moved: no rate (the bytes are what would move)
        rep["moved_mb_s"] = 0.0
    rep["passes"] = len(reports)
    rep["settled"] = settled
    rep["metadata"] = (await finish_metadata_move(c, a.dry_run)).to_dict()
    return rep, reports[-1]


def unlisted_note(report: Any) -> str:
    """What an incomplete pass could not see, in a sentence."""
    names = ", ".join(report.unlisted)
    return (f"storage node{'s' if len(report.unlisted) > 1 else ''} {names} did not answer "
            f"{'their' if len(report.unlisted) > 1 else 'its'} listing and {report.skipped} "
            "fragments were found on no other node: they may be there")


async def finish_metadata_move(c: Client, dry_run: bool, force: bool = False) -> Any:
    """Move metadata records to the current control ring; once nothing failed - or with
    `force` whatever failed (a dead node's records: their other replicas hold them, and
    repair makes the copies anew) - publish a map without the previous control ring
    (readers stop asking the old places)."""
    from store.metamove import move_metadata

    report = await move_metadata(c, dry_run)
    cmap = await c.cluster_map(refresh=True)
    if not dry_run and (force or not report.failed) and cmap.previous_control is not None:
        await c.publish_map(cmap.settled_control())
    return report


DRAIN_PASSES = 5


def _load_local(data: Path) -> Any:
    from cli.localcluster import LocalCluster
    return LocalCluster.load(data)   # BadRequest when there is none or it is broken


def _changing(data: Path) -> Any:
    """The lock `cluster add-node` and `cluster remove-node` hold for their run: each
    reads cluster.json, changes it and writes it back, and two at once lost a node from
    it (still running and in the map, out of the file: `cluster down` left it running,
    `remove-node` did not know it). A second one is refused, naming the first's pid."""
    return only_one(data / "cluster-change.state", "cluster add-node or remove-node")


def cmd_add_node(a: argparse.Namespace) -> int:
    with _changing(Path(a.data)):
        return _add_node(a)


def _add_node(a: argparse.Namespace) -> int:
    from cli.main import err
    from store.cluster import ClusterInfo

    cluster = _load_local(Path(a.data))
    try:
        spec = cluster.add_node_spec(a.role, a.zone, a.tier)
    except ValueError as exc:   # ECSTORE_PORT_RANGE malformed
        raise BadRequest(str(exc)) from None
    try:
        cluster.start_node(spec.id)
        cluster.write()
        cluster.wait_healthy([spec.id])
    except BaseException:   # it did not start, or Ctrl-C: not left running out of the map
        cluster.forget_node(spec.id)
        raise

    async def add() -> None:
        c = Client(ClusterInfo.load(cluster.path))
        try:
            tiers = sorted({pol.tier for pol in (await c.cluster_map(refresh=True)).policies})
            if a.role == "storage" and a.tier not in tiers:   # a typo, most likely
                err.print(f"[yellow]warning:[/] no policy places fragments on tier {a.tier!r} "
                          f"(the map's policies use {', '.join(tiers)}): the node will hold "
                          "nothing", highlight=False)
            ns = argparse.Namespace(id=spec.id, url=spec.url, weight=a.weight, role=a.role,
                                    zone=a.zone or spec.id, tier=a.tier)
            await change_ring(c, "add", ns)
            if a.role == "control":
                await _give_new_map(c, spec.id, spec.url)
        finally:
            await c.close()
    try:
        asyncio.run(add())
    except BaseException:   # Ctrl-C too: a node left running out of the map, else
        if not _in_map(cluster.path, spec.id):   # a map that holds it keeps it
            cluster.forget_node(spec.id)
        raise
    err.print(f"started {spec.id} at {spec.url}; run `ecstore rebalance` to move data onto it")
    if a.json:
        print(json.dumps({"id": spec.id, "url": spec.url, "role": a.role,
                          "zone": a.zone or spec.id, "tier": a.tier if a.role == "storage" else "",
                          "weight": a.weight},
                         indent=2))
    return 0


async def _give_new_map(c: Client, node_id: str, url: str) -> None:
    """Make a control node just added hold the newest map (publish_map sent it; this
    checks, and sends it again if the node holds an older one). Only that node is asked:
    one of the others down must not fail the command - until the thirty-first session
    every control node was asked, and one down ended `cluster add-node --role control`
    in a traceback after the node had been added."""
    from placement.cluster_map import ClusterMap

    async def held() -> int:     # the epoch of the map it holds; 0: none (404)
        reply = await c.t.request("GET", url, "/v1/map", timeout_s=10.0, ok_404=True)
        return 0 if reply.status == 404 else ClusterMap.from_bytes(reply.body).epoch
    cmap = await c.cluster_map(refresh=True)
    if await held() < cmap.epoch:   # publish_map's PUT to it failed (a majority took it)
        await c.t.request("PUT", url, "/v1/map", body=cmap.to_bytes(), timeout_s=10.0)
        if await held() < cmap.epoch:
            raise Unavailable(f"control node {node_id} does not hold map epoch {cmap.epoch}")


def _in_map(cluster_path: Path, node_id: str) -> bool:
    """Whether the cluster's newest map names node_id - also when that cannot be told
    (then the node is kept: `cluster remove-node` takes it out either way)."""
    from store.cluster import ClusterInfo

    async def go() -> bool:
        c = Client(ClusterInfo.load(cluster_path))
        try:
            cmap = await asyncio.wait_for(c.cluster_map(refresh=True), 10.0)
            return any(n.id == node_id for n in (*cmap.control.nodes, *cmap.all_storage_nodes()))
        finally:
            await c.close()
    try:
        return asyncio.run(go())
    except BaseException:  # noqa: BLE001 - no answer, or Ctrl-C again: keep it
        return True


def cmd_remove_node(a: argparse.Namespace) -> int:
    with _changing(Path(a.data)):
        return _remove_node(a)


def _remove_node(a: argparse.Namespace) -> int:
    from cli.main import err, human
    from store.cluster import ClusterInfo
    from store.rebalance import prepare_rebalance

    cluster = _load_local(Path(a.data))
    if a.id not in cluster.nodes:
        raise NotFound(f"no node {a.id} in {cluster.path}")
    role = cluster.nodes[a.id].role
    if role not in ("storage", "control"):   # it drained nothing and dropped the gateway
        raise BadRequest(f"{a.id} is the cluster's {role}, not a storage or control node: "
                         "`ecstore cluster down` stops it with the rest")

    summary: dict[str, Any] = {"id": a.id}
    show = err.is_terminal and not a.json
    answered = True     # the node answered a listing (drain() says, for a storage node)

    async def drain() -> str:
        """Why the node could not be drained, or "" once it is."""
        c = Client(ClusterInfo.load(cluster.path))
        try:
            cmap = await c.cluster_map(refresh=True)
            if role == "control":
                # out of the map already when a run was killed after its ring change: the
                # metadata move is finished and the ring settled all the same (the rerun
                # took the storage path, stopped the node and left the control ring
                # unsettled for good - every ring change then refused)
                if any(n.id == a.id for n in cmap.control.nodes):
                    await change_ring(c, "remove", argparse.Namespace(id=a.id, force=a.force))
                    await asyncio.sleep(MAP_TTL_S + 0.5)  # every client writes to the new ring
                # --force: a dead node - the ring settles without its records (else no
                # rerun could ever end)
                report = await finish_metadata_move(c, False, force=a.force)
                summary.update(role="control", metadata=report.to_dict())
                if report.failed and a.force:
                    err.print(f"[yellow]warning:[/] {report.failed} metadata moves failed "
                              f"({'; '.join(report.errors[:3])}); the control ring is settled "
                              "without them (--force): run `ecstore repair` to give every "
                              "record its replicas again", highlight=False)
                    summary["settled_without"] = report.failed
                    return ""
                return (f"{report.failed} metadata records could not be moved off {a.id} "
                        f"({'; '.join(report.errors[:3])}); if {a.id} is dead for good, run "
                        f"`ecstore cluster remove-node {a.id} --force` (its records have "
                        "other replicas), then `ecstore repair`" if report.failed else "")
            if any(n.id == a.id for n in cmap.all_storage_nodes()):
                # --force: as `ring remove --force` (the last change not rebalanced yet:
                # a dead node's replacement added first, its rebalance held up by the dead)
                await change_ring(c, "remove", argparse.Namespace(id=a.id, force=a.force))

            async def drain_pass(n: int) -> Any:
                w = await prepare_rebalance(c)
                total = w.remaining
                while await w.step():
                    if show:
                        err.print(f"\rdraining {a.id} (pass {n}): {total - w.remaining}/"
                                  f"{total} objects, {w.report.moved} fragments moved", end="")
                if show:
                    err.print("")
                return w.report
            reports: list[Any] = []
            began = time.monotonic()
            leaving = next((n for n in cmap.all_storage_nodes() if n.id == a.id), None)
            awaited = None if leaving is None else lambda: awaited_on(c, leaving)
            await passes_until_still(c, drain_pass, reports, retry_failed=True,
                                     awaited=awaited)
            pending = 0 if awaited is None or reports[-1].failed else await awaited()
            last = reports[-1]
            summary.update(role="storage", passes=len(reports),
                           moved=sum(r.moved for r in reports),
                           bytes_moved=sum(r.bytes_moved for r in reports),
                           failed=last.failed, skipped=last.skipped, unlisted=last.unlisted,
                           errors=last.errors[:20])
            # whether the node answered a listing in any pass (a node drained in one and
            # stopped after is not "dead: nothing moved off it")
            nonlocal answered
            answered = any(a.id not in r.unlisted for r in reports)
            for e in last.errors[:20]:
                err.print(f"[yellow]warning:[/] {e}", highlight=False)
            if last.failed:
                return f"{last.failed} fragments could not be moved off {a.id}"
            if last.incomplete:
                return unlisted_note(last)
            if pending < 0:
                return (f"{a.id} did not answer its listing after the last pass: whether puts "
                        "still place fragments on it cannot be told")
            if pending:
                return (f"{pending} fragments on {a.id} may belong to puts not committed yet "
                        f"(waited {time.monotonic() - began:.0f} s; their objects would be "
                        "short of them)")
            return ""
        finally:
            await c.close()
    with only_one(state_path(str(cluster.path), "rebalance.state.json"), "rebalance"):
        problem = asyncio.run(drain())   # its passes are rebalances: not beside another
    if problem:    # a cluster failure (exit 1), not a mistake in the request; --json: the
        # summary with drained false, beside the error and its message (cli.main)
        raise Unavailable(f"{problem}; {a.id} is out of the map, and still in cluster.json "
                          "(left running if it runs): fix the cause (start the nodes that are "
                          "down: `ecstore cluster up`) and run the command again"
                          + ("" if role == "control" else
                             "; for a node gone for good, `ecstore repair` now rebuilds what it "
                             "held, then run this command again"),
                          **summary, drained=False)
    summary["drained"] = True
    data_dir = Path(cluster.nodes[a.id].data)
    cluster.forget_node(a.id)
    left = dir_bytes(data_dir)
    summary.update(data_dir=str(data_dir), data_bytes_left=left)
    what = ("fragments of versions no object names now" if role == "storage"
            else "records other control nodes hold now")
    moved = (f"{summary['moved']} fragments ({human(summary['bytes_moved'])})"
             if role == "storage" else f"{summary['metadata']['dropped']} metadata records")
    err.print(f"moved {moved} while draining {a.id}", highlight=False)
    done = (f"removed {a.id}, which did not answer (dead: nothing was moved off it; every "
            "fragment a live object needs was found on another node)"
            if not answered else f"drained and stopped {a.id}")
    err.print(f"{done}; its data directory {data_dir} ({human(left)}: "
              f"{what}) is kept - delete it when you no longer want it", highlight=False)
    if a.json:
        print(json.dumps(summary, indent=2))
    return 0


def register_cluster(csub: Any) -> None:
    add = csub.add_parser("add-node", help="start one more node and add it to the map")
    add.add_argument("--data", default=".ecstore")
    add.add_argument("--role", choices=["storage", "control"], default="storage")
    add.add_argument("--zone", default="")
    add.add_argument("--tier", default="hot")
    add.add_argument("--weight", type=positive, default=1.0)
    add.add_argument("--json", action="store_true",
                     help="print the node added as JSON (id, url, role, zone, tier, weight)")
    add.set_defaults(func=cmd_add_node)
    rm = csub.add_parser("remove-node", help="drain a node (rebalance off it), then stop it")
    rm.add_argument("--data", default=".ecstore")
    rm.add_argument("id")
    rm.add_argument("--force", action="store_true",
                    help="remove a control node although fewer control nodes than the "
                         "map's replicas per record would be left; a node of a ring whose "
                         "last change is not rebalanced yet (as ring remove --force)")
    rm.add_argument("--json", action="store_true",
                    help="print what was moved off it as JSON (a storage node: passes, "
                         "moved, bytes_moved, failed; a control node: metadata)")
    rm.set_defaults(func=cmd_remove_node)


FORCE_HELP = ("change the ring although the last change is not rebalanced yet (objects "
              "not moved yet may be unreadable until a rebalance), or although fewer "
              "control nodes than the replicas of each metadata record would be left")


def register(sub: Any, with_client: Any) -> None:
    ring = sub.add_parser("ring", help="show or change the cluster map's rings")
    rs = ring.add_subparsers(dest="ring_command", required=True)
    show = rs.add_parser("show", help="epoch, nodes with zone, weight, tier and share")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=with_client(cmd_ring_show))
    add = rs.add_parser("add", help="add a storage node to its tier's ring, or a control node")
    add.add_argument("id")
    add.add_argument("--url", required=True, help="the node's base URL")
    add.add_argument("--zone", default="")
    add.add_argument("--weight", type=positive, default=1.0)
    add.add_argument("--tier", default="hot")
    add.add_argument("--role", choices=["storage", "control"], default="storage")
    add.add_argument("--force", action="store_true",
                     help=FORCE_HELP + ", or although the node does not answer as this "
                          "node with this cluster's secret")
    add.set_defaults(func=with_client(ring_command("add")))
    rm = rs.add_parser("remove", help="remove a node from its ring (then run rebalance)")
    rm.add_argument("id")
    rm.add_argument("--force", action="store_true", help=FORCE_HELP)
    rm.set_defaults(func=with_client(ring_command("remove")))
    rw = rs.add_parser("reweight", help="change a node's weight")
    rw.add_argument("id")
    rw.add_argument("weight", type=positive)
    rw.add_argument("--force", action="store_true", help=FORCE_HELP)
    rw.set_defaults(func=with_client(ring_command("reweight")))
    sz = rs.add_parser("set-zone", help="move a node to another zone")
    sz.add_argument("id")
    sz.add_argument("zone")
    sz.add_argument("--force", action="store_true", help=FORCE_HELP)
    sz.set_defaults(func=with_client(ring_command("set-zone")))

    rb = sub.add_parser("rebalance", help="move fragments to where the current map puts them")
    rb.add_argument("--dry-run", action="store_true", help="report what would move")
    rb.add_argument("--rate", type=non_negative, default=0.0, metavar="MB/s",
                    help="limit moved bytes per second (default: no limit)")
    rb.add_argument("--json", action="store_true")
    rb.set_defaults(func=with_client(cmd_rebalance))


__all__ = ["register", "change_ring", "Path"]


def dir_bytes(path: Path, allocated: bool = False) -> int:
    """The bytes of the files under path (0 if it is gone); `allocated`: the disk space
    they take (their blocks), not their sizes."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_blocks * 512 if allocated else st.st_size
    return total
