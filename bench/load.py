"""A bounded load test: N concurrent clients write and read for a fixed time.

    python -m bench.load [--quick] [--duration S] [--flood-duration S] [--clients N]
                         [--mode lib|s3|both] [--max-rss-mib MIB] [--json PATH] [--keep]

Starts a local cluster (3 control + 6 storage nodes + the S3 gateway, 4+2, fsync on) in a
temporary directory and, for each mode, runs these phases with N clients (default 64):

- mixed (--duration, default 60 s): puts and gets, half each, of 4 KiB (inline), 1 MiB and
  16 MiB objects (50/40/10 of the operations). A get reads a random object that some client
  put and had acknowledged, and checks every byte of it;
- flood (--flood-duration, default 20 s): every client puts 16 MiB objects back to back,
  faster than the disks write. What must hold the servers' memory is backpressure (the
  gateway's segment slots, TCP flow control), not buffering;
- readback: up to READBACK_OBJECTS of the flood's objects, read back and checked.

Mode lib: one store.client.Client, N asyncio tasks on one event loop. Mode s3: the gateway
through boto3, N threads sharing one client (max_pool_connections=N, no retries: a failure
is counted, not hidden). A sampler thread reads the RSS of every server process (the
gateway's workers included) and of this one every SAMPLE_INTERVAL_S; each phase also resets
and reads VmHWM (bench.compare.ProcWatch), so a peak between two samples is not missed.

Prints tables on stdout (progress on stderr) and writes --json. Exit status 1 when a get
returned wrong bytes, a control, storage or gateway process's peak RSS exceeded
--max-rss-mib, no put or no get succeeded, or the run failed; 130 when interrupted. Not part
of the timed suite (bench/run.py). Every phase ends: no operation starts after its time,
one still running END_GRACE_S later is cut and counted as an error.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import io
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import compare as cmp
from bench import workloads as wl

KiB, MiB = 1024, 1024 * 1024
SIZES = (("4 KiB", 4 * KiB, 50), ("1 MiB", MiB, 40), ("16 MiB", 16 * MiB, 10))  # label, bytes, % of ops
FLOOD = ("16 MiB", 16 * MiB)
PUT_FRACTION = 0.5
K, M, STORAGE_NODES, CONTROL_NODES = 4, 2, 6, 3
STAMP_BYTES = 64               # an object starts with a stamp naming its key and variant
VARIANTS = 8                   # distinct bodies per size (offsets into one random pool)
VARIANT_STRIDE_BYTES = 4099
PIECE_BYTES = MiB              # a put's source yields, and a get is checked in, pieces of this
DATA_SEED = 20261202
DEFAULT_CLIENTS, MAX_CLIENTS = 64, 1024
DEFAULT_DURATION_S, QUICK_DURATION_S = 60.0, 10.0
DEFAULT_FLOOD_S, QUICK_FLOOD_S = 20.0, 5.0
MAX_PHASE_S = 3600.0           # also bounds the sampler's rows: phases x MAX_PHASE_S / interval
OP_TIMEOUT_S = 120.0           # lib: per operation; s3: botocore's read timeout per socket read
# botocore's default. urllib3 applies the connect timeout to every send() of the request body
# too, so under backpressure (the gateway not reading a body while it waits for a segment
# slot) it bounds how long one send may stall: bench.workloads' 10 s failed flood puts.
S3_CONNECT_TIMEOUT_S = 60.0
END_GRACE_S = 30.0
READBACK_OBJECTS = 16
SAMPLE_INTERVAL_S = 0.2
DESCENDANTS_EVERY_S = 5.0
DEFAULT_MAX_RSS_MIB = 300.0
LIMITED_ROLES = ("control", "storage", "gateway")
WRONG = ("wrong bytes", "wrong size")      # error kinds that fail the run
CUT = "cut at the end of the phase"
LOG_MARKERS = (" WARNING ", " ERROR ", "Traceback")
LOG_SAMPLES = 3
ERROR_SAMPLE_CHARS = 600


# ---- objects and their check (pure) -------------------------------------------------------
@dataclass(frozen=True)
class Obj:
    key: str
    size: int
    variant: int

    @property
    def stamp(self) -> bytes:
        s = f"ecstore-load {self.key} v{self.variant} ".encode()
        assert len(s) <= STAMP_BYTES, self.key
        return s.ljust(STAMP_BYTES, b".")


class Payloads:
    """Object bodies without a copy per put: the object's stamp, then a slice of one seeded
    random pool (variant v starts v * VARIANT_STRIDE_BYTES in). The SHA-256 of every (size,
    variant) tail is computed once, up front: a put hashes nothing, a get hashes once."""

    def __init__(self, sizes: list[int], seed: int = DATA_SEED) -> None:
        assert min(sizes) > STAMP_BYTES
        self.pool = memoryview(random.Random(seed).randbytes(max(sizes) + VARIANTS * VARIANT_STRIDE_BYTES))
        self.sha = {(s, v): hashlib.sha256(self.tail(s, v)).digest()
                    for s in set(sizes) for v in range(VARIANTS)}

    def tail(self, size: int, variant: int) -> memoryview:
        off = variant * VARIANT_STRIDE_BYTES
        return self.pool[off:off + size - STAMP_BYTES]

    def pieces(self, obj: Obj) -> Iterator[bytes | memoryview]:
        """The object in pieces of PIECE_BYTES (views of the pool after the first)."""
        tail, first = self.tail(obj.size, obj.variant), PIECE_BYTES - STAMP_BYTES
        yield obj.stamp + bytes(tail[:first])
        for off in range(first, len(tail), PIECE_BYTES):
            yield tail[off:off + PIECE_BYTES]


class Mismatch(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Check:
    """Feed it what a get reads, then call done(): raises Mismatch unless it is exactly the
    object that was put (its length, its stamp, the SHA-256 of the rest)."""

    def __init__(self, payloads: Payloads, obj: Obj) -> None:
        self.obj, self.want = obj, payloads.sha[(obj.size, obj.variant)]
        self.head, self.sha, self.got = bytearray(), hashlib.sha256(), 0

    def feed(self, part: bytes | memoryview) -> None:
        self.got += len(part)
        need = STAMP_BYTES - len(self.head)
        if need > 0:
            self.head += part[:need]
            part = part[need:]
        self.sha.update(part)

    def done(self) -> None:
        if self.got != self.obj.size:
            raise Mismatch("wrong size", f"{self.obj.key}: read {self.got} bytes, put {self.obj.size}")
        if bytes(self.head) != self.obj.stamp:
            raise Mismatch("wrong bytes", f"{self.obj.key}: stamp {bytes(self.head)[:40]!r}")
        if self.sha.digest() != self.want:
            raise Mismatch("wrong bytes", f"{self.obj.key}: SHA-256 of the body differs")


def error_kind(exc: BaseException) -> str:
    """A short class for counting: wrong bytes, timeout, an S3 code, an ecstore error."""
    if isinstance(exc, Mismatch):
        return exc.kind
    resp = getattr(exc, "response", None)                     # botocore ClientError
    if isinstance(resp, dict) and "Error" in resp:
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        return f"S3 {resp['Error'].get('Code', '?')} ({status})"
    name = type(exc).__name__
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return "timeout"
    status = getattr(exc, "status", None)                     # store.errors.EcstoreError
    return f"{name} ({status})" if isinstance(status, int) else name


def describe(exc: BaseException) -> str:
    """The exception and, for an ecstore error, its details (which nodes failed, how)."""
    details = getattr(exc, "details", None)
    return f"{type(exc).__name__}: {exc}" + (f" {details}" if details else "")


# ---- what clients do (thread-safe) --------------------------------------------------------
@dataclass(frozen=True)
class Op:
    kind: str          # "put" or "get"
    label: str         # size class
    obj: Obj


class Catalog:
    """Objects whose put was acknowledged, by size class: what gets may read."""

    def __init__(self) -> None:
        self.objs: dict[str, list[Obj]] = {}
        self.lock = threading.Lock()

    def add(self, label: str, obj: Obj) -> None:
        with self.lock:
            self.objs.setdefault(label, []).append(obj)

    def pick(self, label: str, rng: random.Random) -> Obj | None:
        with self.lock:
            objs = self.objs.get(label)
            return rng.choice(objs) if objs else None

    def spread(self, label: str, n: int) -> list[Obj]:
        """Up to n objects of `label`, evenly spaced over the order they were acknowledged."""
        objs = self.objs.get(label, [])
        step = max(1, len(objs) // n) if objs else 1
        return objs[::step][:n]


class Workload:
    """One phase's plan: a mix of puts and gets, or a fixed queue of operations."""

    def __init__(self, name: str, sizes: tuple[tuple[str, int, int], ...], put_fraction: float,
                 catalog: Catalog, queue: list[Op] | None = None) -> None:
        self.name, self.sizes, self.put_fraction, self.catalog = name, sizes, put_fraction, catalog
        self.queue = queue
        self.lock = threading.Lock()

    def plan(self, client: int, seq: int, rng: random.Random) -> Op | None:
        """The next operation of `client` (its `seq`th), None when the queue is empty."""
        if self.queue is not None:
            with self.lock:
                return self.queue.pop(0) if self.queue else None
        label, size, _ = rng.choices(self.sizes, weights=[w for _, _, w in self.sizes])[0]
        if rng.random() >= self.put_fraction:
            obj = self.catalog.pick(label, rng)
            if obj is not None:
                return Op("get", label, obj)
        return Op("put", label, Obj(f"{self.name}/c{client:04d}/{seq:07d}", size, rng.randrange(VARIANTS)))


class Stats:
    """Latencies and bytes of one phase by (op, size), errors by kind. Thread-safe; once
    closed (the phase is over) late outcomes are ignored."""

    def __init__(self) -> None:
        self.lat: dict[tuple[str, str], list[float]] = {}
        self.nbytes: dict[tuple[str, str], int] = {}
        self.failed: dict[tuple[str, str], int] = {}
        self.kinds: dict[str, list[Any]] = {}   # kind -> [count, first message, first s, last s]
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.closed = False

    def ok(self, op: Op, latency_s: float) -> None:
        with self.lock:
            if not self.closed:
                self.lat.setdefault((op.kind, op.label), []).append(latency_s)
                k = (op.kind, op.label)
                self.nbytes[k] = self.nbytes.get(k, 0) + op.obj.size

    def fail(self, op: Op, kind: str, message: str) -> None:
        with self.lock:
            if not self.closed:
                k = (op.kind, op.label)
                self.failed[k] = self.failed.get(k, 0) + 1
                at = round(time.monotonic() - self.t0, 2)
                e = self.kinds.setdefault(kind, [0, f"{op.kind} {op.obj.key}: {message}"[:ERROR_SAMPLE_CHARS], at, at])
                e[0] += 1
                e[3] = at

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def report(self, wall_s: float) -> dict[str, Any]:
        keys = sorted(set(self.lat) | set(self.failed), key=_row_order)
        rows = [row(op, label, self.lat.get((op, label), []), self.nbytes.get((op, label), 0),
                    self.failed.get((op, label), 0), wall_s) for op, label in keys]
        totals = {}
        for op in ("put", "get"):
            ks = [k for k in keys if k[0] == op]
            totals[op] = row(op, "all", [x for k in ks for x in self.lat.get(k, [])],
                             sum(self.nbytes.get(k, 0) for k in ks), sum(self.failed.get(k, 0) for k in ks),
                             wall_s)
        errors = {k: {"count": c, "sample": s, "first_at_s": a, "last_at_s": b}
                  for k, (c, s, a, b) in sorted(self.kinds.items())}
        return {"rows": rows, "totals": totals, "errors": errors,
                "wrong_bytes": sum(self.kinds.get(k, [0])[0] for k in WRONG)}


def _row_order(key: tuple[str, str]) -> tuple[int, int]:
    labels = [s[0] for s in SIZES]
    return (0 if key[0] == "put" else 1, labels.index(key[1]) if key[1] in labels else len(labels))


def row(op: str, label: str, lat: list[float], nbytes: int, errors: int, wall_s: float) -> dict[str, Any]:
    """ops/s and MB/s (10^6 B/s) over the phase's wall time; latencies in ms."""
    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000
    good = wall_s > 0
    return {"op": op, "size": label, "ok": len(lat), "errors": errors,
            "ops_s": len(lat) / wall_s if good else None, "mb_s": nbytes / 1e6 / wall_s if good else None,
            "p50_ms": ms(wl.pct(lat, 0.50)), "p99_ms": ms(wl.pct(lat, 0.99)),
            "max_ms": ms(max(lat)) if lat else None}


# ---- the two kinds of client ----------------------------------------------------------------
class LibRunner:
    """The client library: one Client, one task per client, on one event loop."""

    mode = "lib"

    def __init__(self, cluster_path: Path, bucket: str, payloads: Payloads, segment_slots: int) -> None:
        from store.client import Client
        self.bucket, self.payloads = bucket, payloads
        self.runner = asyncio.Runner(loop_factory=wl._loop_factory())
        self.client = Client.connect(cluster_path)
        if segment_slots:
            self.client.segment_slots = asyncio.Semaphore(segment_slots)
        try:
            self.runner.run(self.client.create_bucket(bucket))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.runner.run(self._shutdown())
        finally:
            self.runner.close()

    async def _shutdown(self) -> None:
        """End what an interrupted phase left running, then close the Client (in this
        order: tasks still running would otherwise meet a closed session)."""
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=10.0)
        await asyncio.wait_for(self.client.close(), 10.0)

    async def _source(self, obj: Obj) -> AsyncIterator[bytes | memoryview]:
        for piece in self.payloads.pieces(obj):
            yield piece

    async def run_op(self, op: Op) -> None:
        if op.kind == "put":
            await self.client.put(self.bucket, op.obj.key, self._source(op.obj))  # type: ignore[arg-type]
            return
        check = Check(self.payloads, op.obj)
        async for part in self.client.get_stream(self.bucket, op.obj.key):
            check.feed(part)
        check.done()

    def run_phase(self, w: Workload, stats: Stats, clients: int, duration_s: float) -> float:
        return self.runner.run(self._phase(w, stats, clients, duration_s))

    async def _phase(self, w: Workload, stats: Stats, clients: int, duration_s: float) -> float:
        deadline = time.monotonic() + duration_s
        # Python 3.11's wait_for can swallow a cancel that arrives as its operation ends
        # (fixed in 3.12): the flag, not the cancel alone, ends the clients.
        stop = asyncio.Event()

        async def client(c: int) -> None:
            rng = random.Random(f"{w.name}/{c}")
            for seq in range(1 << 62):               # ends by the deadline, the queue or stop
                op = w.plan(c, seq, rng)
                if op is None or stop.is_set() or time.monotonic() >= deadline:
                    return
                t0 = time.perf_counter()
                try:
                    await asyncio.wait_for(self.run_op(op), OP_TIMEOUT_S)
                except asyncio.CancelledError:
                    stats.fail(op, CUT, f"still running {END_GRACE_S:.0f} s after the phase's time")
                    raise
                except Exception as exc:  # noqa: BLE001 - counted, keep going
                    stats.fail(op, error_kind(exc), describe(exc))
                    continue
                stats.ok(op, time.perf_counter() - t0)
                if op.kind == "put":
                    w.catalog.add(op.label, op.obj)

        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(client(c)) for c in range(clients)]
        try:
            await asyncio.wait(tasks, timeout=duration_s + END_GRACE_S)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            stats.close()
        return time.perf_counter() - t0


class PayloadFile(io.RawIOBase):
    """A seekable file over an object's stamp and pool slice, not joined into one bytes
    (botocore reads the body to sign and checksum it, seeks back, then sends it)."""

    def __init__(self, payloads: Payloads, obj: Obj) -> None:
        super().__init__()
        self.stamp, self.tail = memoryview(obj.stamp), payloads.tail(obj.size, obj.variant)
        self.size, self.pos = obj.size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buf: Any) -> int:
        view, n = memoryview(buf).cast("B"), 0
        while n < len(view) and self.pos < self.size:     # at most two rounds: stamp, tail
            src = self.stamp[self.pos:] if self.pos < STAMP_BYTES else self.tail[self.pos - STAMP_BYTES:]
            k = min(len(view) - n, len(src))
            view[n:n + k] = src[:k]
            n += k
            self.pos += k
        return n


class S3Runner:
    """The S3 gateway through boto3: one client shared by every thread, one thread per client."""

    mode = "s3"

    def __init__(self, gw: dict[str, str], bucket: str, payloads: Payloads, clients: int) -> None:
        import boto3
        from botocore.config import Config
        self.bucket, self.payloads = bucket, payloads
        self.s3_config = {**copy.deepcopy(wl.S3_CLIENT), "max_pool_connections": clients,
                          "connect_timeout": S3_CONNECT_TIMEOUT_S, "read_timeout": OP_TIMEOUT_S}
        self.s3 = boto3.session.Session().client(
            "s3", endpoint_url=gw["url"], region_name=gw["region"], aws_access_key_id=gw["access_key"],
            aws_secret_access_key=gw["secret_key"],
            config=Config(s3={"addressing_style": "path"}, **self.s3_config))  # type: ignore[arg-type]
        self.s3.create_bucket(Bucket=bucket)

    def close(self) -> None:
        self.s3.close()

    def run_op(self, op: Op) -> None:
        if op.kind == "put":
            self.s3.put_object(Bucket=self.bucket, Key=op.obj.key, Body=PayloadFile(self.payloads, op.obj))
            return
        check = Check(self.payloads, op.obj)
        body = self.s3.get_object(Bucket=self.bucket, Key=op.obj.key)["Body"]
        with body:
            for part in body.iter_chunks(PIECE_BYTES):
                check.feed(part)
        check.done()

    def run_phase(self, w: Workload, stats: Stats, clients: int, duration_s: float) -> float:
        deadline = time.monotonic() + duration_s
        current: list[Op | None] = [None] * clients
        stop = threading.Event()

        def client(c: int) -> None:
            rng = random.Random(f"{w.name}/{c}")
            for seq in range(1 << 62):               # ends by the deadline, the queue or stop
                op = w.plan(c, seq, rng)
                if op is None or stop.is_set() or time.monotonic() >= deadline:
                    return
                current[c] = op
                t0 = time.perf_counter()
                try:
                    self.run_op(op)
                except Exception as exc:  # noqa: BLE001 - counted, keep going
                    stats.fail(op, error_kind(exc), describe(exc))
                    continue
                finally:
                    current[c] = None
                stats.ok(op, time.perf_counter() - t0)
                if op.kind == "put":
                    w.catalog.add(op.label, op.obj)

        threads = [threading.Thread(target=client, args=(c,), daemon=True, name=f"load-{c}")
                   for c in range(clients)]
        t0 = time.perf_counter()
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(0.0, deadline + END_GRACE_S - time.monotonic()))
        finally:
            stop.set()
            for c, t in enumerate(threads):
                op = current[c]
                if t.is_alive() and op is not None:   # left behind (daemon), counted as cut
                    stats.fail(op, CUT, f"still running {END_GRACE_S:.0f} s after the phase's time")
            stats.close()
        return time.perf_counter() - t0


Runner = LibRunner | S3Runner


# ---- processes: RSS sampled, CPU and VmHWM per phase ------------------------------------------
def proc_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Sampler:
    """RSS of every watched process (and this one) every SAMPLE_INTERVAL_S, on a thread."""

    def __init__(self, procs: Callable[[], dict[str, tuple[str, int]]]) -> None:
        self.procs = procs
        self.pids: list[int] = []
        self.rows: list[tuple[float, dict[int, float]]] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(5.0)

    def _run(self) -> None:
        refresh = 0.0
        while not self.halt.wait(SAMPLE_INTERVAL_S):
            if time.monotonic() >= refresh:
                self.pids = [os.getpid()] + [p for _, pid in self.procs().values()
                                             for p in [pid, *cmp.descendants(pid)]]
                refresh = time.monotonic() + DESCENDANTS_EVERY_S
            sample = {p: r for p in self.pids if (r := proc_rss_mib(p)) is not None}
            with self.lock:
                self.rows.append((time.monotonic(), sample))

    def series(self, t0: float, t1: float) -> dict[int, list[tuple[float, float]]]:
        """pid -> [(seconds since t0, RSS MiB)] of the samples taken in [t0, t1]."""
        out: dict[int, list[tuple[float, float]]] = {}
        with self.lock:
            rows = [r for r in self.rows if t0 <= r[0] <= t1]
        for t, sample in rows:
            for pid, rss in sample.items():
                out.setdefault(pid, []).append((t - t0, rss))
        return out


def merge_usage(usage: dict[str, Any], series: dict[int, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Each process of a phase: CPU seconds, peak RSS (the larger of VmHWM and the largest
    sample), RSS at the first and last sample, and the largest RSS in each second (None for
    a second without a sample: the sampler shares this process's GIL with the clients)."""
    out = []
    for p in usage["processes"]:
        s = series.get(p["pid"], [])
        per_s: dict[int, float] = {}
        for t, rss in s:
            per_s[int(t)] = max(per_s.get(int(t), 0.0), rss)
        out.append({**p, "peak_rss_mib": max([p["peak_rss_mib"], *(r for _, r in s)]),
                    "hwm_mib": p["peak_rss_mib"],
                    "rss_start_mib": s[0][1] if s else None, "rss_end_mib": s[-1][1] if s else None,
                    "rss_per_s_mib": [round(per_s[i], 1) if i in per_s else None
                                      for i in range(max(per_s, default=-1) + 1)]})
    return out


# ---- a run ----------------------------------------------------------------------------------
@dataclass
class Ctx:
    args: argparse.Namespace
    payloads: Payloads
    watch: cmp.ProcWatch
    sampler: Sampler
    log: Callable[[str], None]


def measure(ctx: Ctx, runner: Runner, w: Workload, duration_s: float) -> dict[str, Any]:
    ctx.log(f"{runner.mode}: {w.name}, {ctx.args.clients} clients, "
            + (f"{duration_s:.0f} s" if w.queue is None else f"{len(w.queue)} operations"))
    stats = Stats()
    ctx.watch.begin()
    t0 = time.monotonic()
    wall = runner.run_phase(w, stats, ctx.args.clients, duration_s)
    t1 = time.monotonic()
    usage = ctx.watch.end()
    out = {"phase": w.name, "planned_s": duration_s if w.queue is None else None, "wall_s": wall,
           **stats.report(wall), "processes": merge_usage(usage, ctx.sampler.series(t0, t1))}
    t = out["totals"]
    ctx.log(f"{runner.mode}: {w.name}: put {t['put']['ok']} ok / {t['put']['errors']} failed, "
            f"get {t['get']['ok']} ok / {t['get']['errors']} failed, wrong bytes {out['wrong_bytes']}")
    return out


def run_mode(ctx: Ctx, mode: str, cluster: Any, runs: list[dict[str, Any]]) -> None:
    """Warm-up (not measured), mixed, flood, readback against one fresh bucket; the run
    goes into `runs` first, so that an interrupted one keeps the phases it finished."""
    a = ctx.args
    out: dict[str, Any] = {"mode": mode, "clients": a.clients, "phases": [], "failure": None}
    runs.append(out)
    runner: Runner | None = None
    try:
        if mode == "lib":
            runner = LibRunner(cluster.path, "load-lib", ctx.payloads, a.lib_segment_slots)
        else:
            runner = S3Runner(cluster.gateway, "load-s3", ctx.payloads, a.clients)
            out["s3_client"] = runner.s3_config
        warm = [Op("put", "4 KiB", Obj(f"warm/{c:04d}", SIZES[0][1], 0)) for c in range(a.clients)]
        warm_stats = Stats()
        runner.run_phase(Workload("warm", SIZES, 1.0, Catalog(), warm), warm_stats, a.clients, OP_TIMEOUT_S)
        if warm_stats.kinds:
            ctx.log(f"{mode}: warm-up errors (not counted): {warm_stats.report(1.0)['errors']}")
        mixed = Workload("mixed", SIZES, a.put_fraction, Catalog())
        out["phases"].append(measure(ctx, runner, mixed, a.duration))
        if a.flood_duration > 0:
            flood = Workload("flood", ((*FLOOD, 100),), 1.0, Catalog())
            out["phases"].append(measure(ctx, runner, flood, a.flood_duration))
            queue = [Op("get", FLOOD[0], o) for o in flood.catalog.spread(FLOOD[0], READBACK_OBJECTS)]
            out["phases"].append(measure(ctx, runner, Workload("readback", SIZES, 0.0, Catalog(), queue),
                                         OP_TIMEOUT_S))
    except Exception as exc:  # noqa: BLE001 - reported, the other mode still runs
        out["failure"] = f"{type(exc).__name__}: {exc}"
        ctx.log(f"{mode}: failed: {out['failure']}")
    finally:
        if runner is not None:
            try:
                runner.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the result
                ctx.log(f"{mode}: close failed: {exc}")


def scan_logs(logs: Path) -> dict[str, dict[str, Any]]:
    """Per node log: lines with a warning, an error or a traceback, and the first few."""
    out = {}
    for f in sorted(logs.glob("*.log")):
        hits = [ln for ln in f.read_text(errors="replace").splitlines() if any(m in ln for m in LOG_MARKERS)]
        if hits:
            out[f.stem] = {"lines": len(hits), "first": [h[:300] for h in hits[:LOG_SAMPLES]]}
    return out


@contextmanager
def work_dir(keep: bool, log: Callable[[str], None]) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ecstore-load-"))
    try:
        yield path
    finally:
        if keep:
            log(f"kept {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def run_all(args: argparse.Namespace, report: dict[str, Any], log: Callable[[str], None]) -> None:
    from cli.localcluster import LocalCluster
    payloads = Payloads([s for _, s, _ in SIZES])
    with work_dir(args.keep, log) as tmp:
        cluster = LocalCluster.create(tmp, storage=STORAGE_NODES, control=CONTROL_NODES, k=K, m=M,
                                      fsync=True, gateway=True)
        sampler = Sampler(lambda: cmp.ecstore_procs(cluster))
        watch = cmp.ProcWatch(lambda: cmp.ecstore_procs(cluster))
        try:
            log(f"starting the cluster in {tmp}")
            cluster.start()
            sampler.start()
            ctx = Ctx(args, payloads, watch, sampler, log)
            for mode in ("lib", "s3") if args.mode == "both" else (args.mode,):
                run_mode(ctx, mode, cluster, report["runs"])
        finally:
            sampler.stop()
            report["meta"]["peaks_reset"] = watch.peaks_reset
            log("stopping the cluster")
            cluster.stop()
            report["server_logs"] = scan_logs(tmp / "logs")


# ---- verdict and output ---------------------------------------------------------------------
def peaks(run: dict[str, Any]) -> dict[str, float]:
    """role -> the largest peak RSS (MiB) of one process of that role over the run's phases."""
    out: dict[str, float] = {}
    for ph in run["phases"]:
        for p in ph["processes"]:
            out[p["role"]] = max(out.get(p["role"], 0.0), p["peak_rss_mib"])
    return out


def verdict(report: dict[str, Any], max_rss_mib: float) -> list[str]:
    """Why the run fails; empty when it passes."""
    reasons = list(report["meta"].get("failures", []))
    if not report["runs"]:
        reasons.append("nothing ran")
    for run in report["runs"]:
        mode = run["mode"]
        if run["failure"]:
            reasons.append(f"{mode}: {run['failure']}")
        over: dict[str, tuple[float, str, str]] = {}       # process -> (peak, role, phase)
        for ph in run["phases"]:
            if ph["wrong_bytes"]:
                reasons.append(f"{mode} {ph['phase']}: {ph['wrong_bytes']} gets returned wrong bytes")
            for p in ph["processes"]:
                if p["role"] in LIMITED_ROLES and p["peak_rss_mib"] > max(max_rss_mib, over.get(p["name"], (0,))[0]):
                    over[p["name"]] = (p["peak_rss_mib"], p["role"], ph["phase"])
        reasons += [f"{mode}: {name} ({role}) peak RSS {peak:.0f} MiB > {max_rss_mib:.0f} MiB (in {phase})"
                    for name, (peak, role, phase) in over.items()]
        mixed = next((ph for ph in run["phases"] if ph["phase"] == "mixed"), None)
        for op in ("put", "get"):
            if mixed is None or not mixed["totals"][op]["ok"]:
                reasons.append(f"{mode}: no {op} succeeded in the mixed phase")
    return reasons


def fmt(v: float | None) -> str:
    return cmp.fmt(v)


def ops_table(run: dict[str, Any]) -> Any:
    from rich.table import Table
    t = Table(title=f"mode {run['mode']}: {run['clients']} clients (MB/s = 10^6 B/s over the phase's wall time)")
    for col in ("phase", "op", "size", "ok", "errors", "ops/s", "MB/s", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="left" if col in ("phase", "op", "size") else "right")
    for ph in run["phases"]:
        for r in [*ph["rows"], *(ph["totals"][op] for op in ("put", "get") if ph["totals"][op]["ok"]
                                 or ph["totals"][op]["errors"])]:
            t.add_row(f"{ph['phase']} ({ph['wall_s']:.0f} s)", r["op"], r["size"], str(r["ok"]),
                      f"[red]{r['errors']}[/red]" if r["errors"] else "0", fmt(r["ops_s"]), fmt(r["mb_s"]),
                      fmt(r["p50_ms"]), fmt(r["p99_ms"]), fmt(r["max_ms"]))
    return t


def usage_table(run: dict[str, Any]) -> Any:
    from rich.table import Table
    t = Table(title=f"mode {run['mode']}: per process, per phase: peak RSS MiB / RSS at the end MiB / CPU s")
    t.add_column("process")
    t.add_column("role")
    for ph in run["phases"]:
        t.add_column(ph["phase"], justify="right")
    names: dict[str, str] = {}
    for ph in run["phases"]:
        names.update({p["name"]: p["role"] for p in ph["processes"]})
    for name, role in names.items():
        cells = []
        for ph in run["phases"]:
            p = next((x for x in ph["processes"] if x["name"] == name), None)
            cells.append("-" if p is None else
                         f"{p['peak_rss_mib']:.0f} / {fmt(p['rss_end_mib'])} / {p['cpu_s']:.1f}")
        t.add_row(name, role, *cells)
    return t


def render(report: dict[str, Any], width: int = 150) -> str:
    from rich.console import Console
    con = Console(width=width, record=True, file=io.StringIO())
    bound = report["bound"]
    for run in report["runs"]:
        con.print(ops_table(run))
        for ph in run["phases"]:
            for kind, e in ph["errors"].items():
                con.print(f"[red]{run['mode']} {ph['phase']}[/red]: {e['count']} x {kind}, e.g. {e['sample']}")
        con.print(usage_table(run))
        top = ", ".join(f"{role} {v:.0f} MiB" for role, v in sorted(peaks(run).items()))
        con.print(f"mode {run['mode']}: largest peak RSS of one process per role: {top}")
        if run["failure"]:
            con.print(f"[red]mode {run['mode']} failed[/red]: {run['failure']}")
    for node, hits in report.get("server_logs", {}).items():
        con.print(f"log {node}: {hits['lines']} warning/error lines, first: {hits['first'][0]}")
    con.print(f"memory bound: every {', '.join(LIMITED_ROLES)} process under {bound['max_rss_mib']:.0f} MiB "
              f"peak RSS (the gateway holds at most {bound['gateway_segment_slots']} segments of "
              f"{bound['segment_mib']} MiB, backpressure beyond). Gets checked byte for byte.")
    v = report["verdict"]
    con.print("[green]PASS[/green]" if v["ok"] else "[red]FAIL[/red]: " + "; ".join(v["reasons"]))
    return con.export_text()


def git_state() -> dict[str, Any]:
    """The commit measured and the files changed on top of it (figures move with both)."""
    root = Path(__file__).resolve().parent.parent

    def git(*a: str) -> str:
        out = subprocess.run(["git", *a], cwd=root, capture_output=True, timeout=10, check=False)
        return out.stdout.decode(errors="replace").rstrip()
    try:
        return {"commit": git("rev-parse", "--short", "HEAD"),
                "changed": [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()]}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}


def base_meta(args: argparse.Namespace) -> dict[str, Any]:
    return {"git": git_state(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": sys.version.split()[0],
            "platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "cluster": {"storage": STORAGE_NODES, "control": CONTROL_NODES, "k": K, "m": M, "fsync": True,
                        "gateway_workers": int(os.environ.get("ECSTORE_GATEWAY_WORKERS", "1"))},
            "sizes": [{"label": lb, "bytes": b, "percent_of_ops": w} for lb, b, w in SIZES],
            "lib_loop": "uvloop" if wl._loop_factory() else "asyncio", "failures": []}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_DURATION_S:.0f} s mixed + {QUICK_FLOOD_S:.0f} s flood (unless given)")
    ap.add_argument("--duration", type=float, default=None, metavar="S",
                    help=f"mixed phase seconds (default {DEFAULT_DURATION_S:.0f})")
    ap.add_argument("--flood-duration", type=float, default=None, metavar="S",
                    help=f"flood phase seconds, 0 = no flood (default {DEFAULT_FLOOD_S:.0f})")
    ap.add_argument("--clients", type=int, default=DEFAULT_CLIENTS, metavar="N")
    ap.add_argument("--mode", choices=("lib", "s3", "both"), default="s3",
                    help="lib: the client library, one Client and N tasks; s3: the gateway through "
                         "boto3, N threads (default); both: lib, then s3 on the same cluster")
    ap.add_argument("--put-fraction", type=float, default=PUT_FRACTION, metavar="F",
                    help=f"share of puts in the mixed phase (default {PUT_FRACTION})")
    ap.add_argument("--max-rss-mib", type=float, default=DEFAULT_MAX_RSS_MIB, metavar="MIB",
                    help="fail when a control, storage or gateway process peaks above this")
    ap.add_argument("--lib-segment-slots", type=int, default=0, metavar="N",
                    help="mode lib: bound the Client's segments in memory, as the gateway does "
                         "(default 0: the library's default, no shared bound)")
    ap.add_argument("--gateway-workers", type=int, default=None, metavar="N",
                    help="gateway processes (default $ECSTORE_GATEWAY_WORKERS or 1)")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs, data)")
    a = ap.parse_args(argv)
    a.duration = a.duration if a.duration is not None else QUICK_DURATION_S if a.quick else DEFAULT_DURATION_S
    if a.flood_duration is None:
        a.flood_duration = QUICK_FLOOD_S if a.quick else DEFAULT_FLOOD_S
    if not 0 < a.duration <= MAX_PHASE_S or not 0 <= a.flood_duration <= MAX_PHASE_S:
        ap.error(f"phase durations must be within (0, {MAX_PHASE_S:.0f}] seconds")
    if not 1 <= a.clients <= MAX_CLIENTS:
        ap.error(f"--clients must be 1..{MAX_CLIENTS}")
    if not 0 <= a.put_fraction <= 1:
        ap.error("--put-fraction must be within [0, 1]")
    return a


def sigterm_as_ctrl_c() -> None:
    """SIGTERM does what Ctrl-C does: during a lib phase asyncio.Runner's handler cancels
    the phase's tasks cleanly, elsewhere KeyboardInterrupt unwinds to the cleanup."""
    def handler(signum: int, frame: Any) -> None:
        on_int = signal.getsignal(signal.SIGINT)
        if callable(on_int):
            on_int(signal.SIGINT, frame)
        else:  # SIGINT ignored (started in the background by a shell): stop anyway
            raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gateway_workers is not None:
        os.environ["ECSTORE_GATEWAY_WORKERS"] = str(args.gateway_workers)   # read by the gateway
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    sigterm_as_ctrl_c()
    from node.s3.context import DEFAULT_SEGMENT_SLOTS
    report: dict[str, Any] = {"meta": base_meta(args), "runs": []}
    report["bound"] = {"max_rss_mib": args.max_rss_mib, "roles": list(LIMITED_ROLES), "segment_mib": 4,
                       "gateway_segment_slots": int(os.environ.get("ECSTORE_GATEWAY_SEGMENT_SLOTS",
                                                                   DEFAULT_SEGMENT_SLOTS))}
    interrupted = False
    try:
        run_all(args, report, log)
    except KeyboardInterrupt:
        interrupted = True
        report["meta"]["failures"].append("interrupted")
        log("interrupted: cluster stopped, reporting what was measured")
    except Exception as exc:  # noqa: BLE001 - still report what was measured
        report["meta"]["failures"].append(f"{type(exc).__name__}: {exc}")
        log(f"failed: {type(exc).__name__}: {exc}")
    report["meta"].update(total_s=time.perf_counter() - t_start, loadavg_end=os.getloadavg())
    reasons = verdict(report, args.max_rss_mib)
    report["verdict"] = {"ok": not reasons, "reasons": reasons}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        log(f"report written to {args.json}")
    print(render(report))
    return 130 if interrupted else 0 if not reasons else 1


if __name__ == "__main__":
    sys.exit(main())
