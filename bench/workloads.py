"""Workloads of the comparison benchmark (bench/compare.py), the same for every target.

A target is the ecstore client library (`LibTarget`: one Client, N asyncio tasks) or an S3
endpoint through boto3 (`S3Target`: one shared client, N threads), the ecstore gateway or
SeaweedFS. Targets offer the same few operations (put/get objects, put/get streams, list);
the workload functions below describe what to run with them and turn pool results into
`Measure` values. Every get verifies a SHA-256 of what it read and every failure is counted.

Data is deterministic (`Data`): a pool of 1 MiB blocks from one seeded generator; an object
or a stream block is a pool block with an 8-byte stamp in front, so each differs and costs
a copy to make. Streams are produced block by block and hashed as they go, never held whole.
Wall time is taken around the measured phase only.
"""
from __future__ import annotations

import asyncio
import copy
import hashlib
import io
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from blake3 import blake3

MiB = 1024 * 1024
BLOCK_BYTES = MiB
POOL_BLOCKS = 8
DATA_SEED = 20261201
SMALL_BYTES = 4 * 1024
MEDIUM_BYTES = MiB
LIST_OBJECT_BYTES = 64
LIST_PAGE_KEYS = 1000          # S3's maximum page, the default of both clients
TAG_SMALL, TAG_MEDIUM, TAG_LIST, TAG_WARM = 1, 2, 3, 4
STORM_SEED, STREAM_SEED = 100, 200
SMALL_TIMEOUT_S = 30.0
MEDIUM_TIMEOUT_S = 60.0
STREAM_TIMEOUT_S = 900.0       # one 1 GiB object at a slow ~1.2 MB/s
POOL_BUDGET_S = 1200.0         # a pool starts no new operation after this long
JOIN_GRACE_S = 30.0


@dataclass(frozen=True)
class Profile:
    name: str
    small_count: int
    medium_count: int
    storm_mib: int
    stream_mib: int
    list_prefixes: int
    list_per_prefix: int = 100
    small_conc: int = 16
    medium_conc: int = 8
    storm_writers: int = 4
    list_conc: int = 16
    warmup: int = 16


PROFILES = {
    "quick": Profile("quick", small_count=500, medium_count=64, storm_mib=64, stream_mib=256,
                     list_prefixes=20, warmup=8),
    "full": Profile("full", small_count=10000, medium_count=1024, storm_mib=256, stream_mib=1024,
                    list_prefixes=100),
}


# ---- data -------------------------------------------------------------------------------
# The hash every workload checks what it read with, the same for every target. The
# benchmark shares the machine's cores with the stores it measures: SHA-256 (1.8 GB/s
# here) took ~0.55 ms of this process's CPU per MB read, BLAKE3 (6.4 GB/s) takes ~0.16,
# and leaves more of the machine to the stores. bench.compare --verify-hash sha256 runs
# the workloads as the fifth session's tables did.
VERIFY_HASHES: dict[str, Callable[[], Any]] = {"blake3": blake3, "sha256": hashlib.sha256}
verify_hash = "blake3"


def new_hash() -> Any:
    """A running hash of the algorithm in `verify_hash` (update, hexdigest)."""
    return VERIFY_HASHES[verify_hash]()


def hash_hex(data: bytes | bytearray | memoryview) -> str:
    h = new_hash()
    h.update(data)
    return str(h.hexdigest())


class Data:
    """Deterministic objects and streams, with their hashes (`new_hash`) cached (computed
    before a measured phase by `prepare`, so gets pay one hash of what they read, nothing
    more)."""

    def __init__(self, seed: int = DATA_SEED) -> None:
        rnd = random.Random(seed)
        self.pool = [rnd.randbytes(BLOCK_BYTES) for _ in range(POOL_BLOCKS)]
        self._sha: dict[tuple[int, int, int], str] = {}
        self.stream_sha: dict[tuple[int, int], str] = {}   # (seed, size) -> sha of a full put

    def payload(self, tag: int, i: int, size: int) -> bytes:
        assert 8 <= size <= BLOCK_BYTES, size
        return ((tag << 40) | i).to_bytes(8, "big") + self.pool[(tag + i) % POOL_BLOCKS][8:size]

    def prepare(self, tag: int, count: int, size: int) -> None:
        for i in range(count):
            if (tag, i, size) not in self._sha:
                self._sha[(tag, i, size)] = hash_hex(self.payload(tag, i, size))

    def sha(self, tag: int, i: int, size: int) -> str:
        return self._sha[(tag, i, size)]

    def stream_blocks(self, seed: int, size: int) -> Iterator[bytes]:
        """The stream `seed` of `size` bytes, in blocks of BLOCK_BYTES (the last may be short)."""
        for k in range(math.ceil(size / BLOCK_BYTES)):
            n = min(BLOCK_BYTES, size - k * BLOCK_BYTES)
            block = ((1 << 63) | (seed << 32) | k).to_bytes(8, "big") + \
                self.pool[(seed + k) % POOL_BLOCKS][8:]
            yield block if n == BLOCK_BYTES else block[:n]

    def record_stream(self, seed: int, size: int, sha: str) -> None:
        """Remember what a complete put sent; every target must send the same bytes."""
        known = self.stream_sha.setdefault((seed, size), sha)
        if known != sha:
            raise AssertionError(f"stream {seed} sent {sha[:12]}, another target {known[:12]}")


class Mismatch(Exception):
    """What a get read is not what was put."""


def check_bytes(data: bytes, expect_sha: str) -> int:
    if hash_hex(data) != expect_sha:
        raise Mismatch(f"{verify_hash} mismatch ({len(data)} bytes read)")
    return len(data)


class StreamReader(io.RawIOBase):
    """A non-seekable file over an iterator of blocks, hashing what it hands out (boto3's
    upload_fileobj reads it part by part: it never holds the whole stream)."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        super().__init__()
        self._blocks = blocks
        self._buf = b""
        self._off = 0
        self.sha = new_hash()
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = size if size is not None and size >= 0 else 1 << 62
        parts: list[bytes] = []
        while want > 0:
            if self._off >= len(self._buf):
                self._buf, self._off = next(self._blocks, b""), 0
                if not self._buf:
                    break
            part = self._buf[self._off:self._off + want] if self._off or want < len(self._buf) \
                else self._buf
            self._off += len(part)
            want -= len(part)
            parts.append(part)
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self.sha.update(out)
        self.sent += len(out)
        return out


async def hashed_blocks(blocks: Iterator[bytes], sha: Any) -> AsyncIterator[bytes]:
    for block in blocks:
        sha.update(block)
        yield block


# ---- measurement ------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0 < q <= 1) by the nearest-rank method: the smallest value with at
    least q of all values at or below it. None for no values."""
    if not values:
        return None
    assert 0 < q <= 1, q
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


@dataclass
class PoolResult:
    """Operations run by a pool: latencies of the successful ones, bytes moved, failures."""

    count: int
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    bytes: int = 0
    errors: int = 0
    error_sample: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ok(self, latency_s: float, nbytes: int) -> None:
        with self._lock:
            self.latencies_s.append(latency_s)
            self.bytes += nbytes

    def fail(self, msg: str, n: int = 1) -> None:
        with self._lock:
            self.errors += n
            if not self.error_sample:
                self.error_sample = msg[:300]

    def account_missing(self, why: str) -> None:
        missing = self.count - len(self.latencies_s) - self.errors
        if missing > 0:
            self.fail(f"{missing} operations {why}", missing)


def thread_pool(count: int, conc: int, op: Callable[[int], int],
                budget_s: float = POOL_BUDGET_S) -> PoolResult:
    """op(0..count-1) on `conc` threads; op returns the bytes it moved. Bounded: no op
    starts after budget_s, and threads still busy JOIN_GRACE_S later are left behind
    (daemon threads) with their operations counted as failed."""
    res = PoolResult(count)
    todo = iter(range(count))
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + budget_s

    def worker() -> None:
        while not stop.is_set():
            with lock:
                i = next(todo, None)
            if i is None or time.monotonic() > deadline:
                return
            t0 = time.perf_counter()
            try:
                n = op(i)
            except Exception as exc:  # noqa: BLE001 - counted, keep going
                res.fail(f"op {i}: {type(exc).__name__}: {exc}")
                continue
            res.ok(time.perf_counter() - t0, n)

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{k}")
               for k in range(max(1, min(conc, count)))]
    t0 = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + JOIN_GRACE_S)
    finally:
        stop.set()
    res.wall_s = time.perf_counter() - t0
    res.account_missing(f"not finished within the {budget_s:.0f} s budget")
    return res


async def task_pool(count: int, conc: int, op: Callable[[int], Awaitable[int]],
                    op_timeout_s: float, budget_s: float = POOL_BUDGET_S) -> PoolResult:
    """op(0..count-1) on `conc` asyncio tasks, each op bounded by op_timeout_s, the whole
    by budget_s; op returns the bytes it moved."""
    res = PoolResult(count)
    todo = iter(range(count))

    async def worker() -> None:
        for i in todo:  # shared iterator: bounded by count
            t0 = time.perf_counter()
            try:
                n = await asyncio.wait_for(op(i), op_timeout_s)
            except Exception as exc:  # noqa: BLE001 - counted, keep going
                res.fail(f"op {i}: {type(exc).__name__}: {exc}")
                continue
            res.ok(time.perf_counter() - t0, n)

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _ in range(max(1, min(conc, count)))]
    try:
        await asyncio.wait(tasks, timeout=budget_s)
    finally:  # on the budget or on Ctrl-C: end the workers and collect their outcome
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    res.wall_s = time.perf_counter() - t0
    res.account_missing(f"not finished within the {budget_s:.0f} s budget")
    return res


@dataclass
class Measure:
    """One measured phase of one workload on one target. metrics: ops_s, mb_s (10^6 B/s),
    p50_ms, p99_ms, keys_s, last_ack_s, whichever apply (None: nothing succeeded)."""

    target: str
    workload: str
    op: str
    wall_s: float
    count: int
    ok: int
    bytes: int
    errors: int
    error_sample: str = ""
    metrics: dict[str, float | None] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def pool_measure(target: str, workload: str, op: str, res: PoolResult, **extra: Any) -> Measure:
    ok, wall, lat = len(res.latencies_s), res.wall_s, res.latencies_s
    good = ok > 0 and wall > 0

    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000

    metrics: dict[str, float | None] = {
        "ops_s": ok / wall if good else None, "mb_s": res.bytes / 1e6 / wall if good else None,
        "p50_ms": ms(pct(lat, 0.50)), "p99_ms": ms(pct(lat, 0.99)),
        "mean_ms": ms(sum(lat) / ok) if ok else None}
    return Measure(target, workload, op, wall, res.count, ok, res.bytes, res.errors,
                   res.error_sample, metrics, dict(extra))


# ---- targets ----------------------------------------------------------------------------
@dataclass
class Listing:
    keys: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    pages: int = 0


KeyFn = Callable[[int], str]
BlocksFn = Callable[[int], Iterator[bytes]]


class Target(Protocol):
    """What a workload needs of a target. Pools take `count` operations; each returns a
    PoolResult whose failures include verification mismatches."""

    key: str

    def create_bucket(self) -> None: ...

    def close(self) -> None: ...

    def put_objects(self, key: KeyFn, body: Callable[[int], bytes], count: int, conc: int,
                    timeout_s: float) -> PoolResult: ...

    def get_objects(self, key: KeyFn, expect: Callable[[int], str], count: int, conc: int,
                    timeout_s: float) -> PoolResult: ...

    def put_streams(self, key: KeyFn, blocks: BlocksFn, count: int,
                    timeout_s: float) -> tuple[PoolResult, list[str]]: ...

    def get_streams(self, key: KeyFn, expect: Callable[[int], str], size: int, count: int,
                    timeout_s: float) -> PoolResult: ...

    def list_all(self, prefix: str, delimiter: str) -> Listing: ...


class LibTarget:
    """The ecstore client library: one Client on one event loop (uvloop when importable,
    as bench.run), N tasks per pool."""

    key = "lib"

    def __init__(self, cluster_path: Path, bucket: str) -> None:
        from store.client import Client
        self.bucket = bucket
        self.runner = asyncio.Runner(loop_factory=_loop_factory())
        self.client = Client.connect(cluster_path)
        try:
            self.runner.run(self.client.cluster_map())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.runner.run(asyncio.wait_for(self.client.close(), 10.0))
        finally:
            self.runner.close()

    def create_bucket(self) -> None:
        self.runner.run(self.client.create_bucket(self.bucket))

    def put_objects(self, key: KeyFn, body: Callable[[int], bytes], count: int, conc: int,
                    timeout_s: float) -> PoolResult:
        async def op(i: int) -> int:
            data = body(i)
            await self.client.put(self.bucket, key(i), data)
            return len(data)
        return self.runner.run(task_pool(count, conc, op, timeout_s))

    def get_objects(self, key: KeyFn, expect: Callable[[int], str], count: int, conc: int,
                    timeout_s: float) -> PoolResult:
        async def op(i: int) -> int:
            return check_bytes(await self.client.get(self.bucket, key(i)), expect(i))
        return self.runner.run(task_pool(count, conc, op, timeout_s))

    def put_streams(self, key: KeyFn, blocks: BlocksFn, count: int,
                    timeout_s: float) -> tuple[PoolResult, list[str]]:
        """`count` streams at once; returns the SHA-256 of what each complete put sent."""
        sent = [""] * count

        async def op(i: int) -> int:
            sha = new_hash()
            info = await self.client.put(self.bucket, key(i), hashed_blocks(blocks(i), sha))
            sent[i] = sha.hexdigest()
            return info.size
        return self.runner.run(task_pool(count, count, op, timeout_s)), sent

    def get_streams(self, key: KeyFn, expect: Callable[[int], str], size: int, count: int,
                    timeout_s: float) -> PoolResult:
        async def op(i: int) -> int:
            sha, got = new_hash(), 0
            async for part in self.client.get_stream(self.bucket, key(i)):
                sha.update(part)
                got += len(part)
            return check_stream(got, size, sha.hexdigest(), expect(i))
        return self.runner.run(task_pool(count, count, op, timeout_s))

    def list_all(self, prefix: str, delimiter: str) -> Listing:
        async def run() -> Listing:
            out, after = Listing(), ""
            while True:
                page = await self.client.list(self.bucket, prefix, delimiter, after, LIST_PAGE_KEYS)
                out.keys += [o.key for o in page.objects]
                out.prefixes += page.common_prefixes
                out.pages += 1
                if not page.truncated:
                    return out
                after = page.next_start_after
        return self.runner.run(run())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def check_stream(got: int, size: int, sha: str, expect: str) -> int:
    if got != size:
        raise Mismatch(f"read {got} bytes, expected {size}")
    if sha != expect:
        raise Mismatch(f"{verify_hash} mismatch")
    return got


# boto3's multipart settings for the storm and the stream: 4 parts of 8 MiB in flight per
# object, as the library keeps up to 4 segments of 4 MiB in flight per put.
TRANSFER = dict(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4,
                preferred_transfer_client="classic")
# connect_timeout: urllib3 applies it to every send of a body too, and a gateway that
# pushes back (its segment slots are full) makes sends wait: 10 s failed puts under load
S3_CLIENT = dict(max_pool_connections=64, connect_timeout=60, read_timeout=120,
                 retries={"total_max_attempts": 1})     # a failure is counted, not retried


class S3Target:
    """An S3 endpoint through boto3: one client shared by every thread (boto3 clients are
    thread safe), its defaults otherwise (checksums when supported, SigV4). botocore's
    connect and read timeouts bound each operation (threads cannot be cancelled), so the
    pools' timeout_s is not used here."""

    def __init__(self, key: str, url: str, access_key: str, secret_key: str, bucket: str,
                 region: str = "us-east-1") -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        self.key, self.bucket = key, bucket
        self.s3 = boto3.session.Session().client(
            "s3", endpoint_url=url, region_name=region, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=Config(s3={"addressing_style": "path"}, **copy.deepcopy(S3_CLIENT)))  # type: ignore[arg-type]
        self.transfer = TransferConfig(**TRANSFER)  # type: ignore[arg-type]

    def close(self) -> None:
        self.s3.close()

    def create_bucket(self) -> None:
        self.s3.create_bucket(Bucket=self.bucket)

    def put_objects(self, key: KeyFn, body: Callable[[int], bytes], count: int, conc: int,
                    timeout_s: float) -> PoolResult:
        def op(i: int) -> int:
            data = body(i)
            self.s3.put_object(Bucket=self.bucket, Key=key(i), Body=data)
            return len(data)
        return thread_pool(count, conc, op)

    def get_objects(self, key: KeyFn, expect: Callable[[int], str], count: int, conc: int,
                    timeout_s: float) -> PoolResult:
        def op(i: int) -> int:
            body = self.s3.get_object(Bucket=self.bucket, Key=key(i))["Body"]
            with body:
                return check_bytes(body.read(), expect(i))
        return thread_pool(count, conc, op)

    def put_streams(self, key: KeyFn, blocks: BlocksFn, count: int, timeout_s: float,
                    extra_args: dict[str, str] | None = None) -> tuple[PoolResult, list[str]]:
        """`extra_args`: upload_fileobj's ExtraArgs (a StorageClass, ...)."""
        sent = [""] * count

        def op(i: int) -> int:
            src = StreamReader(blocks(i))
            self.s3.upload_fileobj(src, self.bucket, key(i), Config=self.transfer,
                                   ExtraArgs=extra_args)
            sent[i] = src.sha.hexdigest()
            return src.sent
        return thread_pool(count, count, op), sent

    def get_streams(self, key: KeyFn, expect: Callable[[int], str], size: int, count: int,
                    timeout_s: float) -> PoolResult:
        def op(i: int) -> int:
            sha, got = new_hash(), 0
            body = self.s3.get_object(Bucket=self.bucket, Key=key(i))["Body"]
            with body:
                for part in body.iter_chunks(BLOCK_BYTES):
                    sha.update(part)
                    got += len(part)
            return check_stream(got, size, sha.hexdigest(), expect(i))
        return thread_pool(count, count, op)

    def list_all(self, prefix: str, delimiter: str) -> Listing:
        out = Listing()
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": LIST_PAGE_KEYS}
        if delimiter:
            args["Delimiter"] = delimiter
        while True:
            page = self.s3.list_objects_v2(**args)
            out.keys += [o["Key"] for o in page.get("Contents", [])]
            out.prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            out.pages += 1
            if not page.get("IsTruncated"):
                return out
            args["ContinuationToken"] = page["NextContinuationToken"]


# ---- workloads --------------------------------------------------------------------------
def small_key(i: int) -> str:
    return f"small/{i:06d}"


def medium_key(i: int) -> str:
    return f"medium/{i:06d}"


def prepare(data: Data, p: Profile) -> None:
    """Hash every object the workloads will read (outside any measured phase)."""
    data.prepare(TAG_SMALL, p.small_count, SMALL_BYTES)
    data.prepare(TAG_MEDIUM, p.medium_count, MEDIUM_BYTES)
    data.prepare(TAG_LIST, p.list_prefixes * p.list_per_prefix, LIST_OBJECT_BYTES)
    data.prepare(TAG_WARM, p.warmup, MEDIUM_BYTES)


def warmup(t: Target, p: Profile, data: Data) -> PoolResult:
    """Not measured: open connections, let the servers settle."""
    def key(i: int) -> str:
        return f"warm/{i:04d}"
    res = t.put_objects(key, lambda i: data.payload(TAG_WARM, i, MEDIUM_BYTES), p.warmup,
                        p.medium_conc, MEDIUM_TIMEOUT_S)
    got = t.get_objects(key, lambda i: data.sha(TAG_WARM, i, MEDIUM_BYTES), p.warmup,
                        p.medium_conc, MEDIUM_TIMEOUT_S)
    res.errors += got.errors
    res.error_sample = res.error_sample or got.error_sample
    return res


def objects(t: Target, p: Profile, data: Data, workload: str) -> list[Measure]:
    """Put then get every object of the 'small' (4 KiB) or 'medium' (1 MiB) workload."""
    if workload == "small":
        key, tag, size, n, conc, tmo = small_key, TAG_SMALL, SMALL_BYTES, p.small_count, \
            p.small_conc, SMALL_TIMEOUT_S
    else:
        key, tag, size, n, conc, tmo = medium_key, TAG_MEDIUM, MEDIUM_BYTES, p.medium_count, \
            p.medium_conc, MEDIUM_TIMEOUT_S
    extra = {"object_bytes": size, "concurrency": conc}
    put = t.put_objects(key, lambda i: data.payload(tag, i, size), n, conc, tmo)
    got = t.get_objects(key, lambda i: data.sha(tag, i, size), n, conc, tmo)
    return [pool_measure(t.key, workload, "put", put, **extra),
            pool_measure(t.key, workload, "get", got, **extra)]


def medium_get(t: Target, p: Profile, data: Data, workload: str) -> Measure:
    res = t.get_objects(medium_key, lambda i: data.sha(TAG_MEDIUM, i, MEDIUM_BYTES),
                        p.medium_count, p.medium_conc, MEDIUM_TIMEOUT_S)
    return pool_measure(t.key, workload, "get 1 MiB", res, object_bytes=MEDIUM_BYTES,
                        concurrency=p.medium_conc)


def streams(t: Target, data: Data, workload: str, seed: int, count: int,
            size: int) -> list[Measure]:
    """`count` streams of `size` bytes put at once, then read back at once."""
    def key(i: int) -> str:
        return f"{workload}/{i:03d}"
    put, sent = t.put_streams(key, lambda i: data.stream_blocks(seed + i, size), count,
                              STREAM_TIMEOUT_S)
    for i, sha in enumerate(sent):
        if sha:
            try:
                data.record_stream(seed + i, size, sha)
            except AssertionError as exc:
                put.fail(str(exc))
    m_put = pool_measure(t.key, workload, "put", put, streams=count, object_bytes=size,
                         ack_s=sorted(put.latencies_s))
    m_put.metrics["last_ack_s"] = put.wall_s if put.errors == 0 else None
    return [m_put, stream_get(t, data, workload, seed, count, size, "get")]


def stream_get(t: Target, data: Data, workload: str, seed: int, count: int, size: int,
               op: str, label: str = "") -> Measure:
    """Read back `workload`'s streams; the measure is named (label or workload, op)."""
    def key(i: int) -> str:
        return f"{workload}/{i:03d}"

    def expect(i: int) -> str:
        return data.stream_sha.get((seed + i, size), "never put completely")
    res = t.get_streams(key, expect, size, count, STREAM_TIMEOUT_S)
    return pool_measure(t.key, label or workload, op, res, streams=count, object_bytes=size)


def list_keys(p: Profile) -> list[str]:
    return [f"ls/p{j:03d}/k{i:03d}" for j in range(p.list_prefixes) for i in range(p.list_per_prefix)]


def listing(t: Target, p: Profile, data: Data) -> list[Measure]:
    """Create the keys (16-way, not the measured figure), then time two listings: every
    prefix with prefix+delimiter, and all keys with full pagination."""
    keys = list_keys(p)
    made = t.put_objects(lambda i: keys[i], lambda i: data.payload(TAG_LIST, i, LIST_OBJECT_BYTES),
                         len(keys), p.list_conc, SMALL_TIMEOUT_S)
    created = {"create_s": made.wall_s, "create_errors": made.errors,
               "create_error_sample": made.error_sample}
    return [timed_listing(t, keys, "prefix+delimiter", by_prefix, created),
            timed_listing(t, keys, "full pagination", lambda t: t.list_all("ls/", ""), created)]


def by_prefix(t: Target) -> Listing:
    top = t.list_all("ls/", "/")
    out = Listing(prefixes=top.prefixes, pages=top.pages)
    for prefix in top.prefixes:
        one = t.list_all(prefix, "/")
        out.keys += one.keys
        out.pages += one.pages
        out.prefixes += one.prefixes   # none expected: a key has no second "/"
    return out


def timed_listing(t: Target, keys: list[str], op: str, run: Callable[[Target], Listing],
                  extra: dict[str, Any]) -> Measure:
    res = PoolResult(1)
    t0 = time.perf_counter()
    try:
        got = run(t)
    except Exception as exc:  # noqa: BLE001 - counted
        got = Listing()
        res.fail(f"{type(exc).__name__}: {exc}")
    wall = time.perf_counter() - t0
    expect_prefixes = sorted({k.rsplit("/", 1)[0] + "/" for k in keys}) if op != "full pagination" else []
    if not res.errors and (got.keys != keys or got.prefixes != expect_prefixes):
        res.fail(f"listed {len(got.keys)} keys and {len(got.prefixes)} prefixes, expected "
                 f"{len(keys)} and {len(expect_prefixes)} (in order)")
    good = not res.errors and wall > 0
    return Measure(t.key, "list", op, wall, len(keys), len(got.keys) if good else 0, 0, res.errors,
                   res.error_sample, {"keys_s": len(got.keys) / wall if good else None},
                   {**extra, "pages": got.pages, "keys": len(keys)})


def suite(p: Profile) -> list[tuple[str, Callable[[Target, Data], list[Measure]]]]:
    """The healthy workloads in order: (name, run(target, data) -> measures)."""
    storm_size, stream_size = p.storm_mib * MiB, p.stream_mib * MiB
    return [
        ("small", lambda t, d: objects(t, p, d, "small")),
        ("medium", lambda t, d: objects(t, p, d, "medium")),
        ("storm", lambda t, d: streams(t, d, "storm", STORM_SEED, p.storm_writers, storm_size)),
        ("stream", lambda t, d: streams(t, d, "stream", STREAM_SEED, 1, stream_size)),
        ("list", lambda t, d: listing(t, p, d)),
    ]


def gets_again(t: Target, p: Profile, data: Data, label: str) -> list[Measure]:
    """The 1 MiB gets and the storm's gets again, named (label, "get 1 MiB") and (label,
    "storm get"): "degraded" with storage nodes stopped by the caller, "healthy again" just
    before they are stopped (what the degraded gets are compared with)."""
    return [medium_get(t, p, data, label),
            stream_get(t, data, "storm", STORM_SEED, p.storm_writers, p.storm_mib * MiB,
                       "storm get", label)]
