"""Checkpoint benchmark: 4 ranks save and load ~1 GiB in total through PyTorch Distributed
Checkpoint to ecstore (store/dcp.py), against the same state dicts written with torch.save
and read with torch.load on local disk.

    python -m bench.checkpoint [--quick] [--json PATH] [--ranks 4] [--mib-per-rank 256]
                               [--cache-writes]

Starts its own local cluster (6 storage + 3 control nodes, 4+2, fsync on) in a temporary
directory and RANKS processes joined by gloo on 127.0.0.1. Each rank holds its own float32
tensors of TENSOR_MIB each (MIB_PER_RANK in all; --quick: 32 MiB a rank), as a fully
sharded model does. Every phase starts and ends with a barrier; its time is the wall time
between them. Phases, in order:

  ecstore DCP save     EcstoreWriter: each rank streams 4 shard objects at once, written
                       uncached on the storage nodes (--cache-writes: kept in their page
                       cache); commit
  ecstore DCP load     EcstoreReader: ranged gets of the needed items into preallocated tensors
  local torch.save     one file per rank, flushed and fsync'd before the phase ends
  local torch.load     torch.load(weights_only=True) of that file
  local DCP save/load  FileSystemWriter(sync_files=True) / FileSystemReader, for reference

Loads run twice: warm (files as just written: in the page cache, but for ecstore's
shards written uncached) and cold (every fragment
file of the cluster and every local file evicted with posix_fadvise(DONTNEED) first; the
VM's host may still cache). Every load is checked tensor by tensor against what was saved.
Prints a table and writes JSON (default bench/results/checkpoint.json).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.pagecache import evict as evict_files
from cli.localcluster import LocalCluster, free_port
from store.client import Client, SyncClient

MiB = 1 << 20
OBJECTS_PER_RANK = 4    # store.dcp's defaults, repeated: the driver does not import torch
READS_IN_FLIGHT = 4
BUCKET = "bench-ckpt"
PREFIX = "run"
TENSOR_MIB = 32
RANKS_TIMEOUT_S = 1800.0
PROFILES = {"quick": 32, "full": 256}   # MiB per rank


# ---- one rank ----------------------------------------------------------------------------------
def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _procs_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _view(tensor: Any) -> memoryview:
    """A CPU tensor's bytes, without a copy."""
    return memoryview(tensor.numpy()).cast("B")


def rank_main(rank: int, world: int, port: int, cluster_path: str, work: str, mib: int,
              objects_per_rank: int, reads_in_flight: int, only: str,
              cache_writes: bool = False) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from store.dcp import EcstoreReader, EcstoreWriter

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    workdir = Path(work)
    gen = torch.Generator().manual_seed(rank)
    per_tensor = min(mib, TENSOR_MIB) * MiB // 4
    state = {f"rank{rank}.t{i}": torch.randn(per_tensor, generator=gen)
             for i in range(mib * MiB // 4 // per_tensor)}
    nbytes = sum(t.nbytes for t in state.values())
    targets = {k: torch.zeros_like(v) for k, v in state.items()}
    local_file = workdir / f"torch-save-rank{rank}.pt"
    local_dcp = workdir / "local-dcp"
    nodes = json.loads(Path(cluster_path).read_text())["nodes"]
    data_dirs = [Path(n["data"]) for n in nodes if n["role"] == "storage"]
    node_pids = [int(n["pid"]) for n in nodes if n.get("pid")]
    rows: list[dict[str, Any]] = []
    before: list[Any] = [None] * world
    dist.all_gather_object(before, _rss_mib())  # state and load targets held, nothing else yet

    def phase(name: str, fn: Callable[[], Any], check: Callable[[Any], bool] | None = None) -> None:
        if only != "all" and not name.startswith(only):
            return
        dist.barrier()
        t0, cpu0, nodes0 = time.perf_counter(), _cpu_s(), _procs_cpu_s(node_pids)
        out = fn()
        mine, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        dist.barrier()
        secs, nodes_cpu = time.perf_counter() - t0, _procs_cpu_s(node_pids) - nodes0
        ok = check(out) if check else True
        flags: list[Any] = [None] * world
        dist.all_gather_object(flags, (ok, mine, _rss_mib(), cpu))
        rows.append({"phase": name, "seconds": secs, "bytes": nbytes * world,
                     "verified": all(f[0] for f in flags),
                     "slowest_rank_s": max(f[1] for f in flags),
                     "rank_peak_rss_mib": max(f[2] for f in flags),
                     "ranks_cpu_s": sum(f[3] for f in flags), "nodes_cpu_s": nodes_cpu})

    def same(loaded: dict[str, torch.Tensor]) -> bool:
        return loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)

    def evict(paths: list[Path]) -> None:
        dist.barrier()
        if rank == 0:
            evict_files(paths)   # fsync'd by their writers: clean pages

    def ecstore_save() -> None:
        with EcstoreWriter(cluster_path, BUCKET, PREFIX, "bench-1", objects_per_rank=objects_per_rank,
                           cache_writes=cache_writes) as w:
            dcp.save(state, storage_writer=w)

    def ecstore_load() -> dict[str, torch.Tensor]:
        for t in targets.values():
            t.zero_()
        with EcstoreReader(cluster_path, BUCKET, PREFIX, reads_in_flight=reads_in_flight) as r:
            dcp.load(targets, storage_reader=r)
        return targets

    async def raw_puts() -> None:
        async with Client.connect(cluster_path) as c:
            sem = asyncio.Semaphore(objects_per_rank)

            async def one(key: str, t: torch.Tensor) -> None:
                async with sem:
                    await c.put(BUCKET, f"raw/{key}", _view(t))
            await asyncio.gather(*(one(k, t) for k, t in state.items()))

    async def raw_gets() -> bool:
        async with Client.connect(cluster_path) as c:
            sem = asyncio.Semaphore(reads_in_flight)

            async def one(key: str) -> bool:
                async with sem:
                    h = hashlib.sha256()
                    async for part in c.get_stream(BUCKET, f"raw/{key}"):
                        h.update(part)
                    return h.digest() == hashlib.sha256(_view(state[key])).digest()
            return all(await asyncio.gather(*(one(k) for k in state)))

    def torch_save() -> None:
        with open(local_file, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def torch_load() -> dict[str, torch.Tensor]:
        return dict(torch.load(local_file, map_location="cpu", weights_only=True))

    def local_dcp_save() -> None:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(local_dcp, sync_files=True))

    def local_dcp_load() -> dict[str, torch.Tensor]:
        for t in targets.values():
            t.zero_()
        dcp.load(targets, storage_reader=dcp.FileSystemReader(local_dcp))
        return targets

    phase("ecstore DCP save", ecstore_save)
    phase("ecstore DCP load, warm", ecstore_load, same)
    evict(data_dirs)
    phase("ecstore DCP load, cold", ecstore_load, same)
    phase("ecstore raw put, one object a tensor (no DCP)", lambda: asyncio.run(raw_puts()))
    phase("ecstore raw get, one object a tensor (no DCP)", lambda: asyncio.run(raw_gets()), bool)
    phase("local torch.save (fsync)", torch_save)
    phase("local torch.load, warm", torch_load, same)
    evict([local_file])
    phase("local torch.load, cold", torch_load, same)
    phase("local DCP save (FileSystemWriter, fsync)", local_dcp_save)
    phase("local DCP load, warm", local_dcp_load, same)
    evict([local_dcp])
    phase("local DCP load, cold", local_dcp_load, same)
    if rank == 0:
        (workdir / "rows.json").write_text(json.dumps({"rows": rows, "rank_rss_before_mib": max(before)}))
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------------
def run_ranks(cluster: LocalCluster, work: Path, args: argparse.Namespace, mib: int,
              log: Callable[[str], None]) -> dict[str, Any]:
    world = args.ranks
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(world):
        cmd = [sys.executable, "-m", "bench.checkpoint", "--worker", str(rank), "--ranks", str(world),
               "--port", str(port), "--cluster", str(cluster.path), "--work", str(work),
               "--mib-per-rank", str(mib), "--objects-per-rank", str(args.objects_per_rank),
               "--reads-in-flight", str(args.reads_in_flight), "--only", args.only]
        if args.cache_writes:
            cmd.append("--cache-writes")
        with open(work / f"rank{rank}.log", "wb") as rank_log:
            procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=rank_log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
    log(f"{world} ranks started")
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    if bad or not (work / "rows.json").exists():
        tail = (work / f"rank{bad[0] if bad else 0}.log").read_text()[-3000:]
        raise RuntimeError(f"ranks {bad} failed:\n{tail}")
    out: dict[str, Any] = json.loads((work / "rows.json").read_text())
    return out


def add_ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    by = {r["phase"]: r for r in rows}
    for r in rows:
        r["mb_s"] = r["bytes"] / 1e6 / r["seconds"]
    pairs = {"save": ("ecstore DCP save", "local torch.save (fsync)"),
             "load_warm": ("ecstore DCP load, warm", "local torch.load, warm"),
             "load_cold": ("ecstore DCP load, cold", "local torch.load, cold")}
    return {k: by[a]["mb_s"] / by[b]["mb_s"] for k, (a, b) in pairs.items() if a in by and b in by}


def print_table(rows: list[dict[str, Any]], ratios: dict[str, float], meta: dict[str, Any]) -> None:
    total = rows[0]["bytes"] / MiB
    print(f"\n{meta['ranks']} ranks x {meta['mib_per_rank']} MiB = {total:.0f} MiB; cluster 6 storage + "
          f"3 control, 4+2, fsync on; {meta['cpus']} CPUs; load average {meta['loadavg_1m_at_start']:.1f} "
          f"at start, {meta['loadavg_1m_at_end']:.1f} at end; a rank's RSS before the first phase "
          f"(its tensors and load targets held) {meta['rank_rss_before_mib']:.0f} MiB")
    print(f"{'phase':<48} {'seconds':>8} {'MB/s':>8} {'verified':>9} {'ranks CPU s':>12} "
          f"{'nodes CPU s':>12} {'rank peak RSS MiB':>18}")
    for r in rows:
        print(f"{r['phase']:<48} {r['seconds']:>8.2f} {r['mb_s']:>8.1f} {str(r['verified']):>9} "
              f"{r['ranks_cpu_s']:>12.1f} {r['nodes_cpu_s']:>12.1f} {r['rank_peak_rss_mib']:>18.0f}")
    if ratios:
        print("ecstore / local torch.save|load (MB/s ratio): "
              + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="32 MiB a rank instead of 256")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mib-per-rank", type=int, default=None)
    ap.add_argument("--objects-per-rank", type=int, default=OBJECTS_PER_RANK,
                    help="EcstoreWriter objects_per_rank (default %(default)s)")
    ap.add_argument("--reads-in-flight", type=int, default=READS_IN_FLIGHT,
                    help="EcstoreReader reads_in_flight (default %(default)s)")
    ap.add_argument("--only", choices=["all", "ecstore", "local"], default="all",
                    help="run only the ecstore or the local phases")
    ap.add_argument("--cache-writes", action="store_true",
                    help="EcstoreWriter cache_writes=True: the storage nodes keep the saved "
                    "shards in their page cache (default: written uncached, Linux 6.14+)")
    ap.add_argument("--json", type=Path, default=Path("bench/results/checkpoint.json"))
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cluster", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    mib = args.mib_per_rank or PROFILES["quick" if args.quick else "full"]
    if args.worker is not None:
        rank_main(args.worker, args.ranks, args.port, args.cluster, args.work, mib,
                  args.objects_per_rank, args.reads_in_flight, args.only, args.cache_writes)
        return 0
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    meta: dict[str, Any] = {"ranks": args.ranks, "mib_per_rank": mib,
                            "objects_per_rank": args.objects_per_rank, "reads_in_flight": args.reads_in_flight,
                            "cache_writes": args.cache_writes,
                            "tensor_mib": min(mib, TENSOR_MIB),
                            "k": 4, "m": 2, "fsync": True, "python": sys.version.split()[0],
                            "platform": platform.platform(), "cpus": os.cpu_count(),
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                            "loadavg_1m_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="ecstore-bench-ckpt-") as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", storage=6, control=3, k=4, m=2,
                                      fsync=True, gateway=False)
        work = Path(tmp) / "work"
        work.mkdir()
        try:
            log(f"starting cluster in {tmp}")
            cluster.start()
            with SyncClient(cluster.path) as c:
                c.create_bucket(BUCKET)
            out = run_ranks(cluster, work, args, mib, log)
        finally:
            log("stopping cluster")
            cluster.stop()
    rows = out["rows"]
    meta["rank_rss_before_mib"] = out["rank_rss_before_mib"]
    ratios = add_ratios(rows)
    meta["total_s"] = time.perf_counter() - t_start
    meta["loadavg_1m_at_end"] = os.getloadavg()[0]  # other work on the machine skews every figure
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "ratios": ratios, "rows": rows}, indent=2) + "\n")
    print_table(rows, ratios, meta)
    print(f"results written to {args.json}")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
