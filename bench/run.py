"""ecstore benchmark: codec overhead, client throughput/latency, degraded reads, and
operations (repair and rebalance throughput, data moved by adding a node; bench/ops.py).

    python -m bench.run [--quick] [--json PATH]

Starts its own local cluster (6 storage + 3 control nodes, 4+2 isa_l_rs_vand, fsync on) in a
temporary directory, runs every workload from one asyncio.run (uvloop if importable), prints a
table and writes JSON (default bench/results/latest.json). The operations rows run afterwards
on a second, fresh cluster holding only their own 4 MiB objects.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from pyeclib.ec_iface import ECDriver

from bench import ops
from cli.localcluster import LocalCluster
from store import codec
from store.client import Client

K, M, EC_TYPE = 4, 2, "isa_l_rs_vand"
SEGMENT = 4 * 1024 * 1024
MiB = 1024 * 1024
BUCKET = "bench"
KILLED = ["s1", "s2"]

PROFILES: dict[str, dict[str, int]] = {
    "quick": dict(codec_iters=25, medium_count=128, medium_conc=8, large_mib=64,
                  small_count=1000, small_conc=16, warmup=16, ops_count=16),
    "full": dict(codec_iters=100, medium_count=1024, medium_conc=8, large_mib=256,
                 small_count=10000, small_conc=16, warmup=32, ops_count=64),
}
OP_TIMEOUT_S = {"medium": 60.0, "small": 30.0}
LARGE_TIMEOUT_S = 600.0


@dataclass
class Row:
    name: str
    group: str
    value: float | None = None         # headline number
    unit: str = ""
    mb_s: float | None = None
    ops_s: float | None = None
    ratio: float | None = None         # ours/raw (codec) or degraded/healthy (gets)
    ratio_of: str = ""
    p50_ms: float | None = None
    p99_ms: float | None = None
    duration_s: float = 0.0
    count: int = 0
    bytes: int = 0
    errors: int = 0
    error_sample: str = ""
    loop_max_lag_ms: float | None = None   # worst event-loop stall seen during the row
    rss_peak_mib: float = 0.0              # client process peak RSS after the row
    extra: dict[str, Any] = field(default_factory=dict)


def peak_rss_mib() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 / 1024 if sys.platform == "darwin" else r / 1024


def mb_s(nbytes: int, secs: float) -> float:
    return nbytes / 1e6 / secs if secs > 0 else 0.0


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    idx = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[idx]


# ---- codec --------------------------------------------------------------------------------
def _time_pair(fns: dict[str, Callable[[], Any]], iters: int) -> dict[str, tuple[float, Any]]:
    """Time each fn `iters` times, alternating call by call (A B, B A, ...), dropping each
    result before the next call so every call starts from the same allocator state.
    (pyeclib's speed depends on whether glibc hands it reused heap memory or fresh mmap'd
    pages for the 6 fragment buffers; keeping one side's previous result alive made the
    *same* call look 3x slower in one arm than the other.)
    Returns, per fn, (median seconds per call * iters, result of the warm-up call)."""
    per_call: dict[str, list[float]] = {who: [] for who in fns}
    first = {who: fn() for who, fn in fns.items()}  # warm up; kept for verification
    order = list(fns.items())
    for i in range(iters):
        for who, fn in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fn()  # result dropped at once
            per_call[who].append(time.perf_counter() - t0)
    return {who: (statistics.median(per_call[who]) * iters, first[who]) for who in fns}


def bench_codec(iters: int) -> list[Row]:
    rows: list[Row] = []
    seg = os.urandom(SEGMENT)
    raw = ECDriver(k=K, m=M, ec_type=EC_TYPE)
    frags = raw.encode(seg)
    data_frags = frags[:K]
    degraded = frags[2:K + M]  # data fragments 0 and 1 missing
    nbytes = SEGMENT * iters
    placed = codec.SegmentBuffer(K)     # a degraded read: data fragments 2, 3 read in place
    for i in (2, 3):
        assert placed.place(i, frags[i])
    apart = {K + j: bytearray(frags[K + j]) for j in range(M)}   # parity read apart

    def raw_rebuild() -> bytes | None:   # what pyeclib offers for it: reconstruct and join
        made = raw.reconstruct(degraded, [0, 1])
        return codec.join_data_fragments(K, [*made, *frags[2:K]])

    cases = [
        ("encode", lambda: raw.encode(seg), lambda: codec.encode(K, M, EC_TYPE, seg), None),
        ("decode (k data frags)", lambda: raw.decode(data_frags),
         lambda: codec.decode(K, M, EC_TYPE, data_frags), seg),
        ("decode (2 data frags missing)", lambda: raw.decode(degraded),
         lambda: codec.decode(K, M, EC_TYPE, degraded), seg),
        ("rebuild in place (2 data frags missing)", raw_rebuild,
         lambda: placed.rebuild(M, EC_TYPE, [2, 3], apart), seg),
    ]
    for label, raw_fn, ours_fn, expect in cases:
        fns = {"pyeclib raw": raw_fn, "ecstore codec": ours_fn}
        try:
            timed: dict[str, tuple[float, Any]] | None = _time_pair(fns, iters)
            failure = ""
        except Exception as exc:  # noqa: BLE001 - report, keep going
            timed, failure = None, f"{type(exc).__name__}: {exc}"
        rates = {}
        for who in fns:
            errors, sample, secs = 0, failure, 0.0
            if timed is None:
                errors = 1
            else:
                secs, out = timed[who]
                if expect is not None and out != expect:
                    errors, sample = 1, "decoded bytes differ from the segment"
                if expect is None and len(out) != K + M:
                    errors, sample = 1, f"encode returned {len(out)} fragments"
            rate = mb_s(nbytes, secs)
            rates[who] = rate
            rows.append(Row(name=f"codec {label}: {who}", group="codec", value=rate,
                            unit="MB/s", mb_s=rate, duration_s=secs, count=iters,
                            bytes=nbytes, errors=errors, error_sample=sample,
                            rss_peak_mib=peak_rss_mib(),
                            extra={"segment_bytes": SEGMENT,
                                   "timing": "median per-call time x count, calls of "
                                             "ours and raw alternated"}))
        if rates.get("pyeclib raw"):
            rows[-1].ratio = rates["ecstore codec"] / rates["pyeclib raw"]
            rows[-1].ratio_of = "ours/raw"
    return rows


# ---- client workloads ---------------------------------------------------------------------
class LoopLag:
    """Samples event-loop responsiveness: how late a 5 ms sleep wakes up."""

    def __init__(self) -> None:
        self.max_lag = 0.0
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    async def _run(self) -> None:
        while not self._stop:
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            self.max_lag = max(self.max_lag, time.perf_counter() - t0 - 0.005)

    def __enter__(self) -> "LoopLag":
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        if self._task:
            self._task.cancel()

    @property
    def ms(self) -> float:
        return self.max_lag * 1000


class Errors:
    def __init__(self) -> None:
        self.n = 0
        self.sample = ""

    def add(self, msg: str) -> None:
        self.n += 1
        if not self.sample:
            self.sample = msg[:300]


async def run_pool(count: int, conc: int, op: Callable[[int], Awaitable[None]],
                   timeout_s: float, errs: Errors) -> tuple[float, list[float]]:
    """Run op(0..count-1) with `conc` workers; returns (wall seconds, per-op latencies)."""
    lat: list[float] = []
    next_i = iter(range(count))

    async def worker() -> None:
        for i in next_i:  # shared iterator: bounded by count
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(op(i), timeout_s)
                lat.append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001
                errs.add(f"op {i}: {type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return time.perf_counter() - t0, lat


def pool_row(name: str, group: str, size: int, count: int, secs: float, lat: list[float],
             errs: Errors, lag: LoopLag, headline: str, conc: int) -> Row:
    ok = len(lat)
    row = Row(name=name, group=group, duration_s=secs, count=count, bytes=ok * size,
              errors=errs.n, error_sample=errs.sample, loop_max_lag_ms=lag.ms,
              mb_s=mb_s(ok * size, secs), ops_s=ok / secs if secs > 0 else 0.0,
              p50_ms=(pct(lat, 0.50) or 0) * 1000 if lat else None,
              p99_ms=(pct(lat, 0.99) or 0) * 1000 if lat else None,
              rss_peak_mib=peak_rss_mib(),
              extra={"object_bytes": size, "concurrency": conc, "ok": ok,
                     "mean_ms": statistics.fmean(lat) * 1000 if lat else None})
    row.value, row.unit = (row.mb_s, "MB/s") if headline == "mb" else (row.ops_s, "ops/s")
    return row


def medium_payload(i: int) -> bytes:
    # distinct, incompressible-looking data per object, cheap to regenerate
    return hashlib.shake_256(f"medium-{i}".encode()).digest(MiB)


async def large_source(total: int, chunk: int, hasher: Any) -> AsyncIterator[bytes]:
    pool = [os.urandom(chunk) for _ in range(8)]
    sent = 0
    i = 0
    while sent < total:
        n = min(chunk, total - sent)
        block = i.to_bytes(8, "big") + pool[i % len(pool)][8:n]
        hasher.update(block)
        sent += n
        i += 1
        yield block
        await asyncio.sleep(0)


async def medium_rows(c: Client, p: dict[str, int], label: str, keys_hash: dict[int, str],
                      do_put: bool) -> list[Row]:
    rows = []
    n, conc = p["medium_count"], p["medium_conc"]
    if do_put:
        errs = Errors()

        async def put(i: int) -> None:
            data = medium_payload(i)
            keys_hash[i] = hashlib.sha256(data).hexdigest()
            await c.put(BUCKET, f"m/{i:06d}", data)

        with LoopLag() as lag:
            secs, lat = await run_pool(n, conc, put, OP_TIMEOUT_S["medium"], errs)
        rows.append(pool_row(f"put 1 MiB x{conc} conc", "put", MiB, n, secs, lat, errs, lag,
                             "mb", conc))
    errs = Errors()

    async def get(i: int) -> None:
        data = await c.get(BUCKET, f"m/{i:06d}")
        if i not in keys_hash:
            raise RuntimeError("object was never put")
        if hashlib.sha256(data).hexdigest() != keys_hash[i]:
            raise RuntimeError(f"sha256 mismatch ({len(data)} bytes read)")

    with LoopLag() as lag:
        secs, lat = await run_pool(n, conc, get, OP_TIMEOUT_S["medium"], errs)
    rows.append(pool_row(f"get 1 MiB x{conc} conc{label}", "get", MiB, n, secs, lat, errs,
                         lag, "mb", conc))
    return rows


async def large_put(c: Client, size: int) -> tuple[Row, str]:
    errs = Errors()
    h = hashlib.sha256()
    with LoopLag() as lag:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(c.put(BUCKET, "large", large_source(size, MiB, h)),
                                   LARGE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001
            errs.add(f"{type(exc).__name__}: {exc}")
        secs = time.perf_counter() - t0
    ok = errs.n == 0
    row = Row(name=f"put {size // MiB} MiB streamed", group="put", duration_s=secs, count=1,
              bytes=size if ok else 0, errors=errs.n, error_sample=errs.sample,
              mb_s=mb_s(size, secs) if ok else 0.0, loop_max_lag_ms=lag.ms,
              rss_peak_mib=peak_rss_mib(), extra={"object_bytes": size, "chunk_bytes": MiB})
    row.value, row.unit = row.mb_s, "MB/s"
    return row, h.hexdigest()


async def large_get(c: Client, size: int, expect: str, label: str) -> Row:
    errs = Errors()
    h = hashlib.sha256()
    got = 0
    chunks = 0

    async def consume() -> None:
        nonlocal got, chunks
        async for part in c.get_stream(BUCKET, "large"):
            h.update(part)
            got += len(part)
            chunks += 1
            if got > size:
                raise RuntimeError(f"stream longer than {size} bytes")

    with LoopLag() as lag:
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(consume(), LARGE_TIMEOUT_S)
            if got != size:
                errs.add(f"read {got} bytes, expected {size}")
            elif h.hexdigest() != expect:
                errs.add("sha256 mismatch")
        except Exception as exc:  # noqa: BLE001
            errs.add(f"{type(exc).__name__}: {exc}")
        secs = time.perf_counter() - t0
    ok = errs.n == 0
    row = Row(name=f"get {size // MiB} MiB streamed{label}", group="get", duration_s=secs,
              count=1, bytes=got, errors=errs.n, error_sample=errs.sample,
              mb_s=mb_s(got, secs) if ok else 0.0, loop_max_lag_ms=lag.ms,
              rss_peak_mib=peak_rss_mib(), extra={"object_bytes": size, "chunks": chunks})
    row.value, row.unit = row.mb_s, "MB/s"
    return row


async def small_rows(c: Client, p: dict[str, int]) -> list[Row]:
    n, conc = p["small_count"], p["small_conc"]
    hashes: dict[int, str] = {}
    rows = []
    errs = Errors()

    async def put(i: int) -> None:
        data = hashlib.shake_256(f"small-{i}".encode()).digest(4096)
        hashes[i] = hashlib.sha256(data).hexdigest()
        await c.put(BUCKET, f"s/{i:06d}", data)

    with LoopLag() as lag:
        secs, lat = await run_pool(n, conc, put, OP_TIMEOUT_S["small"], errs)
    rows.append(pool_row(f"put 4 KiB x{conc} conc", "small", 4096, n, secs, lat, errs, lag,
                         "ops", conc))
    errs = Errors()

    async def get(i: int) -> None:
        data = await c.get(BUCKET, f"s/{i:06d}")
        if hashlib.sha256(data).hexdigest() != hashes.get(i):
            raise RuntimeError(f"sha256 mismatch ({len(data)} bytes read)")

    with LoopLag() as lag:
        secs, lat = await run_pool(n, conc, get, OP_TIMEOUT_S["small"], errs)
    rows.append(pool_row(f"get 4 KiB x{conc} conc", "small", 4096, n, secs, lat, errs, lag,
                         "ops", conc))
    return rows


async def client_workloads(cluster: LocalCluster, p: dict[str, int],
                           log: Callable[[str], None]) -> list[Row]:
    rows: list[Row] = []
    size = p["large_mib"] * MiB
    async with Client.connect(cluster.path) as c:
        await c.create_bucket(BUCKET)
        log(f"warm-up: {p['warmup']} x 1 MiB put+get (not measured)")
        warm = Errors()

        async def warm_op(i: int) -> None:
            data = medium_payload(-1 - i)
            await c.put(BUCKET, f"w/{i:06d}", data)
            if await c.get(BUCKET, f"w/{i:06d}") != data:
                raise RuntimeError("warm-up read back different bytes")

        await run_pool(p["warmup"], p["medium_conc"], warm_op, OP_TIMEOUT_S["medium"], warm)
        if warm.n:
            log(f"warm-up errors: {warm.n}: {warm.sample}")
        hashes: dict[int, str] = {}
        log("1 MiB put/get")
        rows += await medium_rows(c, p, "", hashes, do_put=True)
        healthy_medium = rows[-1]
        log(f"{p['large_mib']} MiB put")
        r, large_hash = await large_put(c, size)
        rows.append(r)
        log(f"{p['large_mib']} MiB get")
        healthy_large = await large_get(c, size, large_hash, "")
        rows.append(healthy_large)
        log("4 KiB put/get")
        rows += await small_rows(c, p)

        log(f"killing {KILLED} (SIGKILL)")
        for nid in KILLED:
            await asyncio.to_thread(cluster.kill_node, nid)
        label = f" ({'+'.join(KILLED)} killed)"
        log("degraded 1 MiB get")
        deg = (await medium_rows(c, p, label, hashes, do_put=False))[0]
        deg.group = "degraded"
        if healthy_medium.mb_s:
            deg.ratio, deg.ratio_of = (deg.mb_s or 0) / healthy_medium.mb_s, "vs healthy"
        rows.append(deg)
        log(f"degraded {p['large_mib']} MiB get")
        deg = await large_get(c, size, large_hash, label)
        deg.group = "degraded"
        if healthy_large.mb_s:
            deg.ratio, deg.ratio_of = (deg.mb_s or 0) / healthy_large.mb_s, "vs healthy"
        rows.append(deg)
    return rows


# ---- output -------------------------------------------------------------------------------
def fmt(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def print_table(rows: list[Row], meta: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"ecstore bench ({meta['profile']}, {K}+{M} {EC_TYPE}, "
                    f"fsync={meta['fsync']}, loop={meta['loop']})")
    for col, just in (("benchmark", "left"), ("MB/s", "right"), ("ops/s", "right"),
                      ("ratio", "right"), ("p50 ms", "right"), ("p99 ms", "right"),
                      ("count", "right"), ("secs", "right"), ("errors", "right"),
                      ("loop lag ms", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    group = None
    for r in rows:
        if group is not None and r.group != group:
            t.add_section()
        group = r.group
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f} {r.ratio_of}"
        t.add_row(r.name, fmt(r.mb_s), fmt(r.ops_s), ratio, fmt(r.p50_ms, 2),
                  fmt(r.p99_ms, 2), str(r.count), f"{r.duration_s:.2f}",
                  str(r.errors) if not r.errors else f"[red]{r.errors}[/red]",
                  fmt(r.loop_max_lag_ms))
    con = Console(width=160)
    con.print(t)
    con.print(f"client peak RSS: {meta['client_peak_rss_mib']:.1f} MiB   "
              f"total run time: {meta['total_s']:.1f} s   "
              f"cluster startup: {meta['cluster_start_s']:.1f} s")
    for r in rows:
        if r.errors:
            con.print(f"[red]{r.name}[/red]: {r.error_sample}", markup=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small counts, 64 MiB large object")
    ap.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    args = ap.parse_args(argv)
    profile = "quick" if args.quick else "full"
    p = PROFILES[profile]
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    uvloop: Any
    try:
        import uvloop
    except ImportError:
        uvloop = None

    log("codec")
    rows = bench_codec(p["codec_iters"])

    meta: dict[str, Any] = {"profile": profile, "params": p, "k": K, "m": M,
                            "ec_type": EC_TYPE, "segment_bytes": SEGMENT, "fsync": True,
                            "loop": "uvloop" if uvloop else "asyncio",
                            "python": sys.version.split()[0], "platform": platform.platform(),
                            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="ecstore-bench-") as tmp:
        cluster = LocalCluster.create(Path(tmp), storage=6, control=3, k=K, m=M, fsync=True, gateway=False)
        try:
            log(f"starting cluster in {tmp}")
            t0 = time.perf_counter()
            cluster.start()
            meta["cluster_start_s"] = time.perf_counter() - t0
            coro = client_workloads(cluster, p, log)
            rows += uvloop.run(coro) if uvloop else asyncio.run(coro)
        finally:
            log("stopping cluster")
            cluster.stop()
    with tempfile.TemporaryDirectory(prefix="ecstore-bench-ops-") as tmp:
        cluster = LocalCluster.create(Path(tmp), storage=6, control=3, k=K, m=M, fsync=True, gateway=False)
        try:
            log(f"starting ops cluster in {tmp}")
            cluster.start()
            ops_coro = ops.ops_workloads(cluster, p["ops_count"], log)
            op_rows = uvloop.run(ops_coro) if uvloop else asyncio.run(ops_coro)
            rows += [Row(**d, rss_peak_mib=peak_rss_mib()) for d in op_rows]
        finally:
            log("stopping ops cluster")
            cluster.stop()
    log("ring movement (pure)")
    rows.append(Row(**ops.ring_movement(), rss_peak_mib=peak_rss_mib()))
    meta["total_s"] = time.perf_counter() - t_start
    meta["client_peak_rss_mib"] = peak_rss_mib()
    meta["total_errors"] = sum(r.errors for r in rows)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]},
                                    indent=2) + "\n")
    print_table(rows, meta)
    print(f"results written to {args.json}")
    return 1 if meta["total_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
