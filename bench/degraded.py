"""What a degraded read costs the reader: the client library reading a few large objects
at once from a local cluster (6 storage + 3 control nodes, 4+2 isa_l_rs_vand), healthy,
then with two storage nodes killed - degraded rounds alternated between the in-place
ISA-L rebuild (store.ecdirect) and pyeclib's reconstruct (ECSTORE_EC_DIRECT=0), so both
are measured in the same minutes.

    python -m bench.degraded [--streams N] [--mib N] [--tail BYTES] [--rounds N] [--verify] [--json]

Each round reads every object whole (get_stream) and checks its length; with --verify
also every byte against what was put (a copy and a compare inside the timed part, so
off by default: a round's CPU is then the reading alone; the client checks each
fragment's CRC-32 either way). Per round: MB/s, this process's CPU seconds per GiB read, the segments read degraded
(and how many of them were rebuilt in place),
and that over the median of the healthy rounds. Exit 1 if any round had an error.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from cli.localcluster import LocalCluster
from store import ecdirect
from store.alloc import tune_allocator
from store.client import Client

MiB = 1024 * 1024
BUCKET = "degraded-bench"
KILLED = ("s1", "s2")


def chunk_of(i: int, n: int, tail: int) -> bytes:
    """Chunk n of object i: MiB chunks, then `tail` bytes (n == the object's MiB)."""
    return ((i * 1_000_003 + n).to_bytes(8, "big") * (MiB // 8))[:tail if tail >= 0 else MiB]


def chunks(i: int, mib: int, tail: int) -> list[int]:
    return [-1] * mib + ([tail] if tail else [])


async def source(i: int, mib: int, tail: int) -> AsyncIterator[bytes]:
    for n, t in enumerate(chunks(i, mib, tail)):
        yield chunk_of(i, n, t)


async def read_round(c: Client, streams: int, mib: int, tail: int, verify: bool) -> dict[str, Any]:
    size = mib * MiB + tail
    errors: list[str] = []

    async def one(i: int) -> None:
        got = 0
        parts: list[bytes] = []
        async for part in c.get_stream(BUCKET, f"obj-{i}"):
            got += len(part)
            if verify:
                parts.append(bytes(part))
        if got != size:
            errors.append(f"obj-{i}: read {got} bytes, expected {size}")
        elif verify and b"".join(parts) != b"".join(
                chunk_of(i, n, t) for n, t in enumerate(chunks(i, mib, tail))):
            errors.append(f"obj-{i}: the bytes read differ from the bytes put")

    rebuilt0, direct0 = c.fault_stats["degraded_reads"], ecdirect.stats["rebuilds"]
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(streams)))
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    total = streams * size
    return {"mb_s": total / secs / 1e6, "secs": secs, "cpu_s_per_gib": cpu / (total / 2**30),
            "degraded_segments": c.fault_stats["degraded_reads"] - rebuilt0,
            "rebuilt_in_place": ecdirect.stats["rebuilds"] - direct0, "errors": errors}


async def run(cluster: LocalCluster, a: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with Client.connect(cluster.path) as c:
        await c.create_bucket(BUCKET)
        log(f"putting {a.streams} x {a.mib} MiB")
        await asyncio.gather(*(c.put(BUCKET, f"obj-{i}", source(i, a.mib, a.tail)) for i in range(a.streams)))
        await read_round(c, a.streams, a.mib, a.tail, False)   # warm: page cache, connections
        for r in range(a.rounds):
            rows.append({"round": r, "state": "healthy", "rebuild": "-",
                         **await read_round(c, a.streams, a.mib, a.tail, a.verify)})
            log(json.dumps(rows[-1]))
        log(f"killing {', '.join(KILLED)}")
        for nid in KILLED:
            await asyncio.to_thread(cluster.kill_node, nid)
        await read_round(c, a.streams, a.mib, a.tail, False)   # the first reads find them down
        for r in range(a.rounds):
            for direct in ("1", "0"):
                os.environ["ECSTORE_EC_DIRECT"] = direct
                rows.append({"round": r, "state": "degraded",
                             "rebuild": "isa-l in place" if direct == "1" else "pyeclib",
                             **await read_round(c, a.streams, a.mib, a.tail, a.verify)})
                log(json.dumps(rows[-1]))
        os.environ.pop("ECSTORE_EC_DIRECT", None)
    healthy = statistics.median(r["mb_s"] for r in rows if r["state"] == "healthy")
    for r in rows:
        r["of_healthy"] = r["mb_s"] / healthy
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.degraded", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4, help="objects read at once (default 4)")
    ap.add_argument("--mib", type=int, default=256, help="MiB per object (default 256)")
    ap.add_argument("--tail", type=int, default=0,
                    help="bytes more per object after its MiB (a shorter last segment)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each kind (default 3)")
    ap.add_argument("--verify", action="store_true",
                    help="compare every byte read with what was put (in the timed part)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    if not (1 <= a.streams <= 64 and 1 <= a.mib <= 4096 and 1 <= a.rounds <= 20
            and 0 <= a.tail < MiB):
        ap.error("--streams 1-64, --mib 1-4096, --rounds 1-20, --tail 0-1048575")
    tune_allocator()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="ecstore-degraded-") as tmp:
        cluster = LocalCluster.create(Path(tmp), storage=6, control=3, k=4, m=2, fsync=True,
                                      gateway=False)
        cluster.start()
        try:
            rows = asyncio.run(run(cluster, a, log))
        finally:
            cluster.stop()
    if a.json:
        print(json.dumps({"streams": a.streams, "mib": a.mib, "tail": a.tail, "rows": rows},
                         indent=1))
    else:
        print(f"{'state':9} {'rebuild':15} {'MB/s':>7} {'CPU s/GiB':>10} {'of healthy':>11} "
              f"{'degraded segs':>14} {'in place':>9}  errors")
        for r in rows:
            print(f"{r['state']:9} {r['rebuild']:15} {r['mb_s']:7.0f} {r['cpu_s_per_gib']:10.2f} "
                  f"{r['of_healthy']:11.2f} {r['degraded_segments']:14} "
                  f"{r['rebuilt_in_place']:9}  {len(r['errors'])}")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
