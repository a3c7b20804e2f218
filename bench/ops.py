"""Operations benchmarks: repair and rebalance throughput, data movement of a node add.

Each function returns rows as plain dicts of `bench.run.Row` keyword arguments (this module
does not import bench.run, which usually runs as __main__).

- `ops_workloads` runs on its own local cluster (6 storage nodes) holding only a fresh set
  of 4 MiB objects: wipe one storage node's fragments and time repair; start a 7th storage
  node, add it to the hot ring and time rebalance (bytes moved vs the optimum, total/7);
  then read every object back and verify it.
- `ring_movement` is pure: the share of placements a ring add moves, vs 1/7.
"""
from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

from cli.localcluster import LocalCluster
from node.volumes import stored_fragments
from placement.nodes import Node
from placement.ring import Ring
from store.client import Client
from store.rebalance import prepare_rebalance
from store.repair import prepare_repair

MiB = 1024 * 1024
OBJ_SIZE = 4 * MiB
BUCKET = "ops"
VICTIM = "s3"
PUT_CONC = 8
OP_TIMEOUT_S = 120.0


def mb_s(nbytes: int, secs: float) -> float:
    return nbytes / 1e6 / secs if secs > 0 else 0.0


def payload(i: int) -> bytes:
    return hashlib.shake_256(f"ops-{i}".encode()).digest(OBJ_SIZE)


def fragment_bytes(data_dir: str) -> tuple[int, int]:
    """(fragments, body bytes) stored on one storage node, read from its volume files (a
    read-only scan: the node may be running)."""
    stored = stored_fragments(data_dir)
    return len(stored), sum(size for _, _, size in stored.values())


def storage_ids(cluster: LocalCluster) -> list[str]:
    return [i for i, n in cluster.nodes.items() if n.role == "storage"]


class Errs:
    def __init__(self) -> None:
        self.n = 0
        self.sample = ""

    def add(self, msg: str, n: int = 1) -> None:
        self.n += n
        if not self.sample:
            self.sample = msg[:300]


async def _pool(count: int, conc: int, op: Callable[[int], Any], errs: Errs) -> float:
    it = iter(range(count))

    async def worker() -> None:
        for i in it:
            try:
                await asyncio.wait_for(op(i), OP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - counted, keep going
                errs.add(f"object {i}: {type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return time.perf_counter() - t0


async def _restart(cluster: LocalCluster, node_id: str) -> None:
    cluster.start_node(node_id)
    cluster.write()
    await asyncio.to_thread(cluster.wait_healthy, [node_id])


async def repair_row(c: Client, cluster: LocalCluster, log: Callable[[str], None]) -> dict[str, Any]:
    errs = Errs()
    data = cluster.nodes[VICTIM].data
    frags_before, bytes_before = fragment_bytes(data)
    log(f"repair: stopping {VICTIM}, deleting its fragments ({frags_before} fragments, "
        f"{bytes_before / MiB:.1f} MiB), starting it again")
    await asyncio.to_thread(cluster.stop_node, VICTIM)
    shutil.rmtree(Path(data) / "volumes", ignore_errors=True)   # every fragment it held
    await _restart(cluster, VICTIM)
    w, t_prep, secs = await _timed_pass(prepare_repair(c))
    r = w.report
    if r.unrecoverable:
        errs.add(f"unrecoverable: {r.unrecoverable[:5]}", len(r.unrecoverable))
    if r.failed:
        errs.add(f"{r.failed} fragments failed: {r.errors[:3]}", r.failed)
    down = [e for e in r.errors if e.startswith("storage node")]
    if down:
        errs.add("; ".join(down), len(down))
    if r.fragments_rebuilt != r.fragments_missing or r.fragments_rebuilt == 0:
        errs.add(f"rebuilt {r.fragments_rebuilt} of {r.fragments_missing} missing fragments")
    frags_after, bytes_after = fragment_bytes(data)
    return dict(name=f"repair: rebuild {VICTIM}'s wiped fragments", group="ops",
                value=mb_s(r.bytes_rebuilt, secs), unit="MB/s",
                mb_s=mb_s(r.bytes_rebuilt, secs),
                ops_s=r.fragments_rebuilt / secs if secs > 0 else 0.0,
                duration_s=secs, count=r.fragments_rebuilt, bytes=r.bytes_rebuilt,
                errors=errs.n, error_sample=errs.sample,
                extra={"ops_s_is": "fragments rebuilt per second",
                       "prepare_s": t_prep, "objects_checked": r.objects_checked,
                       "segments_damaged": r.segments_damaged,
                       "fragments_missing": r.fragments_missing,
                       "unrecoverable": r.unrecoverable[:20], "failed": r.failed,
                       "report_errors": r.errors[:20],
                       "victim_fragments_before": frags_before,
                       "victim_bytes_before": bytes_before,
                       "victim_fragments_after": frags_after, "victim_bytes_after": bytes_after})


async def rebalance_row(c: Client, cluster: LocalCluster,
                        log: Callable[[str], None]) -> dict[str, Any]:
    errs = Errs()
    old_ids = storage_ids(cluster)
    total = sum(fragment_bytes(cluster.nodes[i].data)[1] for i in old_ids)
    spec = cluster.add_node_spec("storage")
    log(f"rebalance: starting {spec.id}, adding it to the {spec.tier} ring")
    await _restart(cluster, spec.id)
    cmap = await c.cluster_map(refresh=True)
    node = Node(id=spec.id, address=spec.url, weight=1.0, zone=spec.zone or spec.id,
                tier=spec.tier)
    new_ring, ring_report = cmap.storage_ring(spec.tier).add(node)
    new = cmap.with_storage_ring(new_ring)
    not_reached = await c.publish_map(new)
    if not_reached:
        errs.add(f"map epoch {new.epoch} not reached: {not_reached}", len(not_reached))
    n_after = len(old_ids) + 1
    w, t_prep, secs = await _timed_pass(prepare_rebalance(c))
    r = w.report
    if r.failed:
        errs.add(f"{r.failed} moves failed: {r.errors[:3]}", r.failed)
    if r.skipped:
        errs.add(f"{r.skipped} fragments found on no node", r.skipped)
    down = [e for e in r.errors if e.startswith("storage node")]
    if down:
        errs.add("; ".join(down), len(down))
    optimum = total / n_after
    per_node = {i: fragment_bytes(cluster.nodes[i].data)[1] for i in storage_ids(cluster)}
    return dict(name=f"rebalance: add {spec.id} (6 -> {n_after} storage nodes)", group="ops",
                value=mb_s(r.bytes_moved, secs), unit="MB/s",
                mb_s=mb_s(r.bytes_moved, secs), ops_s=r.moved / secs if secs > 0 else 0.0,
                ratio=r.bytes_moved / optimum if optimum else None, ratio_of="moved/optimum",
                duration_s=secs, count=r.moved, bytes=r.bytes_moved,
                errors=errs.n, error_sample=errs.sample,
                extra={"ops_s_is": "fragments moved per second", "prepare_s": t_prep,
                       "objects_checked": r.objects_checked,
                       "fragment_bytes_total_before": total,
                       "optimum_bytes": optimum, "moved_fraction_of_total":
                           r.bytes_moved / total if total else None,
                       "fragment_bytes_per_node_after": per_node,
                       "ring_moved_fraction_n6": ring_report.moved_fraction(6),
                       "report_errors": r.errors[:20]})


async def verify_row(c: Client, count: int, hashes: dict[int, str]) -> dict[str, Any]:
    errs = Errs()
    ok = 0

    async def get(i: int) -> None:
        nonlocal ok
        data = await c.get(BUCKET, f"o/{i:05d}")
        if hashlib.sha256(data).hexdigest() != hashes.get(i):
            raise RuntimeError(f"sha256 mismatch ({len(data)} bytes read)")
        ok += 1

    secs = await _pool(count, PUT_CONC, get, errs)
    return dict(name=f"get 4 MiB x{PUT_CONC} conc (after repair+rebalance)", group="ops",
                value=mb_s(ok * OBJ_SIZE, secs), unit="MB/s",
                mb_s=mb_s(ok * OBJ_SIZE, secs), ops_s=ok / secs if secs > 0 else 0.0,
                duration_s=secs, count=count, bytes=ok * OBJ_SIZE, errors=errs.n,
                error_sample=errs.sample, extra={"verified": ok})


async def ops_workloads(cluster: LocalCluster, count: int,
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Put `count` 4 MiB objects, then repair, rebalance, verify (rows as Row kwargs)."""
    rows: list[dict[str, Any]] = []
    async with Client.connect(cluster.path) as c:
        await c.create_bucket(BUCKET)
        log(f"ops: put {count} x 4 MiB")
        hashes: dict[int, str] = {}
        errs = Errs()

        async def put(i: int) -> None:
            data = payload(i)
            hashes[i] = hashlib.sha256(data).hexdigest()
            await c.put(BUCKET, f"o/{i:05d}", data)

        await _pool(count, PUT_CONC, put, errs)
        if errs.n:
            log(f"ops put errors: {errs.n}: {errs.sample}")
        rows.append(await repair_row(c, cluster, log))
        if errs.n:  # objects that failed to put would not read back either
            rows[-1]["errors"] += errs.n
            rows[-1]["error_sample"] = rows[-1]["error_sample"] or f"put: {errs.sample}"
        rows.append(await rebalance_row(c, cluster, log))
        log("ops: reading every object back")
        rows.append(await verify_row(c, count, hashes))
    return rows


def ring_movement(keys: int = 100_000, n: int = 6, part_power: int = 10) -> dict[str, Any]:
    """Pure ring: 6 equal nodes, add a 7th; share of placements (positions < n) that changed."""
    t0 = time.perf_counter()
    nodes = [Node(id=f"s{i}", address=f"http://127.0.0.1:{9000 + i}", weight=1.0,
                  zone=f"s{i}", tier="hot") for i in range(1, 7)]
    old = Ring.build(nodes, part_power, tier="hot")
    new, report = old.add(Node(id="s7", address="http://127.0.0.1:9007", weight=1.0,
                               zone="s7", tier="hot"))
    moved = 0
    for k in range(keys):
        key = f"key-{k}"
        a, b = old.locate(key, n), new.locate(key, n)
        moved += sum(1 for x, y in zip(a, b) if x.id != y.id)
    frac = moved / (keys * n)
    optimum = 1 / 7
    secs = time.perf_counter() - t0
    return dict(name=f"ring add 7th node: placements moved (n={n}, {keys:,} keys)",
                group="ops", value=frac, unit="fraction", ratio=frac / optimum,
                ratio_of="moved/optimum", duration_s=secs, count=keys,
                extra={"moved_fraction": frac, "optimum_fraction": optimum,
                       "moved_placements": moved, "part_power": part_power,
                       "partition_moved_fraction": report.moved_fraction(n)})


async def _timed_pass(preparing: Awaitable[Any]) -> tuple[Any, float, float]:
    """Prepare a worker and step it to its end: (worker, prepare seconds, total seconds)."""
    t0 = time.perf_counter()
    w = await preparing
    t_prep = time.perf_counter() - t0
    while await w.step():
        pass
    secs = time.perf_counter() - t0
    w.finish()
    w.report.seconds = secs
    return w, t_prep, secs
