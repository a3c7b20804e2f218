"""Training-style reads: a shuffled data set read by many processes for several epochs, and a
thundering herd of processes starting on one object, each without and with the client's
shared segment cache (store/cache.py).

    python -m bench.training [--quick] [--json PATH] [--shards N] [--shard-mib N]
                             [--readers N] [--epochs N] [--herd-readers N] [--herd-mib N]

Starts a local cluster (3 control + 6 storage nodes, no gateway, 4+2, 4 MiB segments) in a
temporary directory, with fsync OFF (writing the data is set-up, not measured; reads do not
depend on it) and the background scrub off (so what the storage nodes read from disk is what
the readers asked for). Writes the shards (a shard in the training sense: one object of the
data set) and the herd object once from this process, then:

1. epochs: `readers` reader processes (multiprocessing, spawn), `epochs` epochs. Each epoch
   the shards are shuffled (seeded: the same orders without and with the cache) and dealt
   round-robin to the readers; each reads its shards in full, one after another, streamed
   and hashed against what was written. Variant "no cache", then "cache": one cache
   directory shared by every reader (they are on one machine), CACHE_FACTOR times the data
   set in size, so nothing is evicted.
2. herd: `herd_readers` processes wait for a common start time, then all read the same
   object in full. Without the cache, then with a fresh shared cache directory (one process
   fetches a segment, the others wait for its file), then once more with that cache warm
   (every segment a hit: what the cold run costs beyond reading the cache is its waiting).

Before each phase the kernel's dirty pages are flushed (sync, not timed: the set-up writes
6 GiB without fsync, and one phase's cache files must not be written back during the next);
then every reader starts at one common time, after all have connected. Per phase: aggregate
MB/s (10^6 B/s: bytes read / time from the common start to the last byte), the p50 reader
time, fragment GETs the readers sent and segments they fetched (client.read_stats, summed
over readers), cache hits, the readers' CPU seconds, the peak of not-yet-written file data
(/proc/meminfo Dirty + Writeback, whoever wrote it), and what the storage nodes did: bytes
they read from fragment files (/proc/PID/io rchar; divided by the mean fragment file size it
estimates the fragment GETs they served) and their CPU seconds.

Prints tables (progress on stderr) and writes --json (default bench/results/training.json).
Exit status 1 when a read returned wrong bytes or failed, a phase did not complete, or an
expectation failed (see `evaluate`: no fragment GET after the first epoch with the cache,
each herd segment fetched once with it); 130 when interrupted. Readers, cluster and temporary
directories are removed on every way out. Every wait is bounded (the *_TIMEOUT_S below).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import compare as cmp
from bench import workloads as wl
from bench.pagecache import meminfo_kib

MiB = wl.MiB
K, M, STORAGE_NODES, CONTROL_NODES = cmp.K, cmp.M, cmp.STORAGE_NODES, cmp.CONTROL_NODES
BUCKET = "training"
SHARD_SEED, HERD_SEED, SHUFFLE_SEED = 300, 900, 20261203
WRITE_CONCURRENCY = 4          # shards put at once while setting up (not measured)
WRITE_TIMEOUT_S = 900.0        # one object put
READ_TIMEOUT_S = 900.0         # one object read in full by one reader
READY_TIMEOUT_S = 300.0        # every reader connected (32 spawned processes on 2 busy cores)
PHASE_TIMEOUT_S = 1800.0       # from the common start to the last reader's report
START_DELAY_S = 0.5            # the common start, this long after the last reader is ready
POLL_S = 0.5                   # how often a waiting process looks at its peers
CLOSE_TIMEOUT_S = 20.0         # readers asked to exit get this long, then SIGTERM
SYNC_TIMEOUT_S = 300.0         # the flush of dirty pages before each phase; then it goes on anyway
DIRTY_SAMPLE_S = 0.5           # how often a phase samples the kernel's dirty page total
MAX_JOBS = 64                  # jobs one reader process takes before it exits
WORKER_IDLE_S = READY_TIMEOUT_S + PHASE_TIMEOUT_S + 600.0  # a reader with no job this long exits
CACHE_FACTOR = 2               # the shared cache holds this many times what a phase reads
SCRUB_ENV = "ECSTORE_SCRUB_RATE_MB_S"
DEFAULT_OUT = Path("bench/results/training.json")
STAT_KEYS = ("segments_fetched", "fragment_gets", "coalesced", "cache_hits", "prefetched")
ERROR_SAMPLE_CHARS = 300

Obj = tuple[str, int, str]     # key, size in bytes, SHA-256 hex of what was written


@dataclass(frozen=True)
class Profile:
    name: str
    shards: int
    shard_mib: int
    readers: int
    herd_readers: int
    herd_mib: int
    epochs: int = 2

    def check(self) -> None:
        """ValueError naming the setting that makes no sense."""
        if not 1 <= self.readers <= self.shards:
            raise ValueError(f"--readers must be 1..shards ({self.shards}), got {self.readers}")
        for name in ("shard_mib", "herd_readers", "herd_mib", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


PROFILES = {
    "full": Profile("full", shards=64, shard_mib=64, readers=16, herd_readers=32, herd_mib=256),
    "quick": Profile("quick", shards=16, shard_mib=16, readers=8, herd_readers=8, herd_mib=64),
}


# ---- plans and results (pure) -------------------------------------------------------------
def epoch_assignment(shards: int, readers: int, epoch: int, seed: int = SHUFFLE_SEED) -> list[list[int]]:
    """The shard numbers each reader reads in `epoch`: all shards shuffled by a generator
    seeded with (seed, epoch), dealt round-robin (counts differ by at most one)."""
    order = list(range(shards))
    random.Random(seed * 1000 + epoch).shuffle(order)
    return [order[r::readers] for r in range(readers)]


def server_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 fragment_file_bytes: float | None) -> dict[str, Any]:
    """What the storage nodes did between two snapshots ({node: {"rchar", "cpu_s"}}): MB
    read (10^6 B), the fragment reads that makes at the mean fragment file size, CPU s."""
    nodes = [n for n in after if n in before]
    read = sum(after[n]["rchar"] - before[n]["rchar"] for n in nodes)
    est = round(read / fragment_file_bytes) if fragment_file_bytes else None
    return {"nodes": len(nodes), "read_mb": read / 1e6, "fragment_reads_est": est,
            "cpu_s": sum(after[n]["cpu_s"] - before[n]["cpu_s"] for n in nodes)}


def summarize(name: str, start_at: float, results: list[dict[str, Any]], plan: dict[str, Any],
              server: dict[str, Any]) -> dict[str, Any]:
    """One phase's row from its readers' reports. `plan`: expected_bytes, segments_read (by
    all readers), expected_fetches (segments that should reach the cluster), and labels."""
    times = [r["end"] - start_at for r in results]
    wall = max(times) if times else 0.0
    nbytes = sum(r["bytes"] for r in results)
    wrong = [k for r in results for k in r["wrong"]]
    errors = [e for r in results for e in r["errors"]]
    stats = {k: sum(r["read_stats"].get(k, 0) for r in results) for k in STAT_KEYS}
    caches = [r["cache"] for r in results if r["cache"] is not None]
    return {
        "name": name, **plan, "readers": len(results), "wall_s": wall,
        "mb_s": nbytes / 1e6 / wall if wall > 0 else None, "bytes": nbytes, **stats,
        "fragment_gets_per_segment": stats["fragment_gets"] / stats["segments_fetched"]
        if stats["segments_fetched"] else None,
        "reader_p50_s": wl.pct(times, 0.5), "reader_max_s": wall,
        "start_lag_max_s": max((r["began"] - start_at for r in results), default=0.0),
        "reader_cpu_s": sum(r["cpu_s"] for r in results),
        "fetchers": sum(1 for r in results if r["read_stats"].get("segments_fetched")),
        "cache_evicted": sum(c["evicted"] for c in caches),
        "cache_corrupt": sum(c["corrupt"] for c in caches),
        "wrong_reads": len(wrong), "wrong_sample": wrong[:5],
        "errors": len(errors), "error_sample": errors[:3], "server": server,
    }


def evaluate(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The expectations every run must meet, each {"name", "ok", "detail"}: every byte
    right and every object read; segments fetched as planned (each once per reader without
    the cache, each once in all with it, none in a later epoch with it); no fragment GET in
    a phase the cache should serve whole; every planned phase ran."""
    out: list[dict[str, Any]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        out.append({"name": name, "ok": bool(ok), "detail": detail})

    phases = report["epochs"] + report["herd"]
    check("every planned phase ran", len(phases) == report["meta"]["planned_phases"],
          f"{len(phases)} of {report['meta']['planned_phases']}")
    for ph in phases:
        check(f"{ph['name']}: every byte right",
              ph["wrong_reads"] == 0 and ph["errors"] == 0 and ph["bytes"] == ph["expected_bytes"],
              f"{ph['wrong_reads']} wrong, {ph['errors']} failed, {ph['bytes']:,} of "
              f"{ph['expected_bytes']:,} bytes")
        check(f"{ph['name']}: segments fetched as planned",
              ph["segments_fetched"] == ph["expected_fetches"],
              f"{ph['segments_fetched']} fetched, {ph['expected_fetches']} expected")
        if ph["expected_fetches"] == 0:
            check(f"{ph['name']}: no fragment GET", ph["fragment_gets"] == 0,
                  f"{ph['fragment_gets']} fragment GETs")
    return out


# ---- reader processes -----------------------------------------------------------------------
@dataclass(frozen=True)
class ReadJob:
    phase: str
    objects: tuple[Obj, ...]
    cache_dir: str | None = None
    cache_max_bytes: int = 0


def _next_message(inbox: Any, timeout_s: float) -> Any:
    """The next message, or None after timeout_s or once the parent process is gone."""
    deadline = time.monotonic() + timeout_s
    parent = mp.parent_process()
    while time.monotonic() < deadline:
        try:
            return inbox.get(timeout=POLL_S)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None
    return None


def reader_main(idx: int, cluster_path: str, inbox: Any, outbox: Any) -> None:
    """A reader process: run the jobs `inbox` brings until None (or no job for
    WORKER_IDLE_S, or the parent's end). Ctrl-C ends it quietly: the parent reports."""
    with suppress(KeyboardInterrupt):
        for _ in range(MAX_JOBS):
            job = _next_message(inbox, WORKER_IDLE_S)
            if not isinstance(job, ReadJob):
                return
            run_job(idx, cluster_path, job, inbox, outbox)


def run_job(idx: int, cluster_path: str, job: ReadJob, inbox: Any, outbox: Any) -> None:
    """Connect (a fresh Client: a fresh read_stats), report ready, wait for ("go", start
    time), read, report ("done", result). ("go", None) skips the reading."""
    from store.client import Client
    cache = {"cache_dir": job.cache_dir, "cache_max_bytes": job.cache_max_bytes} if job.cache_dir else {}
    with asyncio.Runner(loop_factory=wl._loop_factory()) as runner:
        client = Client.connect(cluster_path, **cache)
        try:
            runner.run(client.cluster_map())
            outbox.put(("ready", job.phase, idx, None))
            go = _next_message(inbox, READY_TIMEOUT_S + 10 * POLL_S)
            if isinstance(go, tuple) and go[0] == "go" and go[1] is not None:
                outbox.put(("done", job.phase, idx, runner.run(read_objects(client, job, go[1]))))
            else:
                outbox.put(("failed", job.phase, idx, "no start time came"))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the phase
            outbox.put(("failed", job.phase, idx, f"{type(exc).__name__}: {exc}"[:ERROR_SAMPLE_CHARS]))
        finally:
            with suppress(Exception):
                runner.run(asyncio.wait_for(client.close(), 10.0))


async def read_objects(client: Any, job: ReadJob, start_at: float) -> dict[str, Any]:
    """Read the job's objects in full one after another from the common start time (unix
    s), each checked against its size and SHA-256; failures are counted, not raised."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    began, cpu0 = time.time(), time.process_time()
    nbytes, wrong, errors = 0, [], []
    for key, size, sha in job.objects:
        try:
            got, digest = await asyncio.wait_for(read_one(client, key), READ_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - counted; the next object is read
            errors.append(f"{key}: {type(exc).__name__}: {exc}"[:ERROR_SAMPLE_CHARS])
            continue
        if got != size or digest != sha:
            wrong.append(key)
        else:
            nbytes += got
    return {"began": began, "end": time.time(), "bytes": nbytes, "wrong": wrong, "errors": errors,
            "read_stats": dict(client.read_stats), "cpu_s": time.process_time() - cpu0,
            "cache": client.cache.stats() if client.cache is not None else None}


async def read_one(client: Any, key: str) -> tuple[int, str]:
    sha, got = hashlib.sha256(), 0
    async for part in client.get_stream(BUCKET, key):
        sha.update(part)
        got += len(part)
    return got, sha.hexdigest()


class PhaseFailed(Exception):
    """A reader failed to connect or report, or a phase ran out of time."""


class ReaderPool:
    """`size` reader processes, spawned once and reused by every phase."""

    def __init__(self, size: int, cluster_path: Path) -> None:
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=reader_main, args=(i, str(cluster_path), q, self.outbox),
                                  name=f"reader-{i}", daemon=True) for i, q in enumerate(self.inboxes)]
        for p in self.procs:
            p.start()

    def run(self, jobs: list[ReadJob], before_start: Callable[[], None]) -> tuple[float, list[dict[str, Any]]]:
        """Give jobs[i] to reader i; once all are connected call before_start(), then start
        them together. Returns the common start (unix s) and each reader's result."""
        assert 0 < len(jobs) <= len(self.procs), len(jobs)
        phase, used = jobs[0].phase, self.inboxes[:len(jobs)]
        for q, job in zip(used, jobs):
            q.put(job)
        try:
            self._collect(phase, "ready", len(jobs), READY_TIMEOUT_S)
        except BaseException:
            for q in used:
                q.put(("go", None))
            raise
        before_start()
        start_at = time.time() + START_DELAY_S
        for q in used:
            q.put(("go", start_at))
        done = self._collect(phase, "done", len(jobs), START_DELAY_S + PHASE_TIMEOUT_S)
        return start_at, [done[i] for i in range(len(jobs))]

    def _collect(self, phase: str, kind: str, n: int, timeout_s: float) -> dict[int, Any]:
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            if time.monotonic() > deadline:
                raise PhaseFailed(f"{phase}: {n - len(got)} readers not {kind} after {timeout_s:.0f} s")
            try:
                what, ph, idx, payload = self.outbox.get(timeout=POLL_S)
            except queue.Empty:
                dead = [p.name for p in self.procs[:n] if not p.is_alive()]
                if dead:
                    raise PhaseFailed(f"{phase}: reader processes exited: {', '.join(dead)}") from None
                continue
            if ph != phase:
                continue  # a late message of an earlier, failed phase
            if what == "failed":
                raise PhaseFailed(f"{phase}: reader {idx}: {payload}")
            if what == kind:
                got[idx] = payload
        return got

    def close(self) -> None:
        """Ask every reader to exit; SIGTERM, then SIGKILL, what does not in time."""
        for q in self.inboxes:
            with suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
        for q in [*self.inboxes, self.outbox]:
            q.cancel_join_thread()
            q.close()


# ---- the storage nodes' side ----------------------------------------------------------------
def proc_rchar(pid: int) -> int | None:
    """Bytes the process read with read() and pread() (files, and uvloop's socket reads:
    request headers, small next to fragments); None if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def storage_snapshot(cluster: Any) -> dict[str, dict[str, float]]:
    out = {}
    for node_id, (role, pid) in cmp.ecstore_procs(cluster).items():
        rchar, cpu = proc_rchar(pid), cmp.proc_cpu_s(pid)
        if role == "storage" and rchar is not None and cpu is not None:
            out[node_id] = {"rchar": float(rchar), "cpu_s": cpu}
    return out


def mean_fragment_file_bytes(cluster: Any) -> float | None:
    """Bytes per fragment file over every storage node's /v1/status; None if none answer."""
    from cli.localcluster import signed_request
    files = size = 0
    for n in cluster.nodes.values():
        if n.role == "storage":
            with suppress(OSError, ValueError):
                st = json.loads(signed_request(cluster.secret, "GET", n.url, "/v1/status"))
                files, size = files + st["fragments"], size + st["bytes"]
    return size / files if files else None


# ---- the machine's side ---------------------------------------------------------------------
def dirty_mb() -> float | None:
    """Dirty + Writeback from /proc/meminfo, MB (10^6 B): file data not yet on disk."""
    kib = meminfo_kib("Dirty", "Writeback")
    return None if kib is None else kib * 1024 / 1e6


class DirtySampler:
    """The largest dirty page total seen during a phase (a thread, every DIRTY_SAMPLE_S)."""

    def __init__(self) -> None:
        self.start = self.peak = dirty_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="dirty-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(DIRTY_SAMPLE_S):
            now = dirty_mb()
            if now is not None and (self.peak is None or now > self.peak):
                self.peak = now

    def stop(self) -> dict[str, float | None]:
        self._stop.set()
        self._thread.join(5 * DIRTY_SAMPLE_S)
        return {"start": self.start, "peak": self.peak, "end": dirty_mb()}


def flush_dirty_pages(timeout_s: float = SYNC_TIMEOUT_S) -> float:
    """sync(2) in a thread, waited for at most timeout_s: a phase then starts without another
    phase's (or the set-up's) writeback competing with it. Returns the seconds waited."""
    t0 = time.perf_counter()
    t = threading.Thread(target=os.sync, daemon=True, name="sync")
    t.start()
    t.join(timeout_s)
    return time.perf_counter() - t0


# ---- running ------------------------------------------------------------------------------
class Run:
    """One benchmark run: the cluster, the readers, what was written and measured."""

    def __init__(self, p: Profile, log: Callable[[str], None]) -> None:
        self.p, self.log = p, log
        self.cluster: Any = None
        self.pool: ReaderPool | None = None
        self.shards: list[Obj] = []
        self.herd_obj: Obj = ("", 0, "")
        self.segments: dict[str, int] = {}       # key -> its segment count
        self.fragment_file_bytes: float | None = None
        self.write: dict[str, Any] = {}
        self.epochs: list[dict[str, Any]] = []
        self.herd: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def write_data(self) -> None:
        """Put the shards and the herd object (WRITE_CONCURRENCY at once), remember their
        SHA-256 and segment counts. Raises if any put failed: there is nothing to read."""
        p, data = self.p, wl.Data()
        specs = [(f"shards/{i:05d}", SHARD_SEED + i, p.shard_mib * MiB) for i in range(p.shards)]
        specs.append(("herd/object", HERD_SEED, p.herd_mib * MiB))
        shas = [""] * len(specs)
        target = wl.LibTarget(self.cluster.path, BUCKET)
        try:
            target.create_bucket()

            async def put(i: int) -> int:
                key, seed, size = specs[i]
                sha = hashlib.sha256()
                info = await target.client.put(BUCKET, key, wl.hashed_blocks(data.stream_blocks(seed, size), sha))
                shas[i] = sha.hexdigest()
                return int(info.size)
            res = target.runner.run(wl.task_pool(len(specs), WRITE_CONCURRENCY, put, WRITE_TIMEOUT_S))
            if res.errors:
                raise RuntimeError(f"{res.errors} puts failed: {res.error_sample}")
            for key, _, _ in specs:
                rec = target.runner.run(target.client.live_record(BUCKET, key))
                self.segments[key] = int(rec["segments"])
        finally:
            target.close()
        objs = [(key, size, sha) for (key, _, size), sha in zip(specs, shas)]
        self.shards, self.herd_obj = objs[:-1], objs[-1]
        self.write = {"objects": len(objs), "bytes": res.bytes, "wall_s": res.wall_s,
                      "mb_s": res.bytes / 1e6 / res.wall_s, "concurrency": WRITE_CONCURRENCY}

    def phase(self, name: str, jobs: list[ReadJob], plan: dict[str, Any]) -> dict[str, Any]:
        """Run one phase on the readers; its row, also logged."""
        assert self.pool is not None
        synced = flush_dirty_pages()
        self.log(f"{name}: {len(jobs)} readers" + (f" (after {synced:.0f} s of sync)" if synced >= 1 else ""))
        snap: dict[str, Any] = {}

        def before_start() -> None:
            snap.update(before=storage_snapshot(self.cluster), dirty=DirtySampler())
        try:
            start_at, results = self.pool.run(jobs, before_start)
        finally:
            dirty = snap["dirty"].stop() if "dirty" in snap else {}
        server = server_delta(snap["before"], storage_snapshot(self.cluster), self.fragment_file_bytes)
        row = {**summarize(name, start_at, results, plan, server), "dirty_mb": dirty, "sync_s": synced}
        self.log(f"  {row['wall_s']:.2f} s, {cmp.fmt(row['mb_s'])} MB/s, fragment GETs {row['fragment_gets']}"
                 f" (storage side ~{server['fragment_reads_est']}), segments fetched {row['segments_fetched']},"
                 f" cache hits {row['cache_hits']}, wrong {row['wrong_reads']}, errors {row['errors']}"
                 + (f" ({row['error_sample'][0]})" if row["errors"] else ""))
        return row

    def epoch_phases(self, variant: str, cache_dir: Path | None) -> None:
        p = self.p
        total = sum(self.segments[k] for k, _, _ in self.shards)
        for epoch in range(1, p.epochs + 1):
            deal = epoch_assignment(p.shards, p.readers, epoch)
            jobs = [ReadJob(f"epoch {epoch}, {variant}", tuple(self.shards[i] for i in d),
                            str(cache_dir) if cache_dir else None, self.cache_max_bytes(p.shards * p.shard_mib))
                    for d in deal]
            fetches = total if cache_dir is None or epoch == 1 else 0
            self.epochs.append(self.phase(jobs[0].phase, jobs, {
                "variant": variant, "cache": cache_dir is not None, "epoch": epoch,
                "expected_bytes": p.shards * p.shard_mib * MiB, "segments_read": total,
                "expected_fetches": fetches}))

    def herd_phase(self, variant: str, cache_dir: Path | None, warm: bool = False) -> None:
        """`warm`: the cache already holds the object (a herd run with it before)."""
        p, segs = self.p, self.segments[self.herd_obj[0]]
        jobs = [ReadJob(f"herd, {variant}", (self.herd_obj,), str(cache_dir) if cache_dir else None,
                        self.cache_max_bytes(p.herd_mib)) for _ in range(p.herd_readers)]
        self.herd.append(self.phase(jobs[0].phase, jobs, {
            "variant": variant, "cache": cache_dir is not None, "object_segments": segs,
            "expected_bytes": p.herd_readers * p.herd_mib * MiB, "segments_read": p.herd_readers * segs,
            "expected_fetches": p.herd_readers * segs if cache_dir is None else 0 if warm else segs}))

    @staticmethod
    def cache_max_bytes(data_mib: int) -> int:
        return CACHE_FACTOR * data_mib * MiB

    def run(self, tmp: Path) -> None:
        """Cluster up, write, the four phases, everything down (on every way out)."""
        from cli.localcluster import LocalCluster
        p = self.p
        self.cluster = LocalCluster.create(tmp / "cluster", storage=STORAGE_NODES, control=CONTROL_NODES,
                                           k=K, m=M, fsync=False, gateway=False)
        try:
            self.log(f"starting the cluster in {tmp}")
            self.cluster.start()
            self.log(f"writing {p.shards} shards of {p.shard_mib} MiB and a {p.herd_mib} MiB herd object")
            self.write_data()
            self.log(f"  {self.write['wall_s']:.1f} s, {self.write['mb_s']:.0f} MB/s")
            self.fragment_file_bytes = mean_fragment_file_bytes(self.cluster)
            self.log(f"starting {max(p.readers, p.herd_readers)} reader processes")
            self.pool = ReaderPool(max(p.readers, p.herd_readers), self.cluster.path)
            self.epoch_phases("no cache", None)
            self.epoch_phases("cache", tmp / "cache-epochs")
            shutil.rmtree(tmp / "cache-epochs", ignore_errors=True)  # its page cache, too
            self.herd_phase("no cache", None)
            self.herd_phase("cache", tmp / "cache-herd")
            self.herd_phase("cache, warm", tmp / "cache-herd", warm=True)
        finally:
            if self.pool is not None:
                self.log("stopping the readers")
                self.pool.close()
            self.log("stopping the cluster")
            self.cluster.stop()

    def report(self, meta: dict[str, Any]) -> dict[str, Any]:
        report: dict[str, Any] = {"meta": {**meta, "failures": self.failures}, "write": self.write,
                                  "epochs": self.epochs, "herd": self.herd}
        report["checks"] = evaluate(report)
        return report


# ---- output ---------------------------------------------------------------------------------
def _served(row: dict[str, Any]) -> str:
    est = row["server"]["fragment_reads_est"]
    return "-" if est is None else f"{est:,}"


def epochs_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    t = Table(title="Data-set epochs: shuffled shards, each reader reads its shards in full")
    for col in ("variant", "epoch", "s", "MB/s", "fragment GETs sent", "served (storage, est.)",
                "segments fetched", "cache hits", "storage CPU s", "reader CPU s", "dirty peak MB", "wrong/failed"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        t.add_row(r["variant"], str(r["epoch"]), cmp.fmt(r["wall_s"]), cmp.fmt(r["mb_s"]),
                  f"{r['fragment_gets']:,}", _served(r), f"{r['segments_fetched']:,}",
                  f"{r['cache_hits']:,}", cmp.fmt(r["server"]["cpu_s"]), cmp.fmt(r["reader_cpu_s"]),
                  cmp.fmt(r["dirty_mb"].get("peak")), f"{r['wrong_reads']}/{r['errors']}")
    return t


def herd_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    t = Table(title="Thundering herd: every reader starts on the same object at once")
    for col in ("variant", "readers", "time to last byte s", "p50 reader s", "MB/s", "fragment GETs sent",
                "served (storage, est.)", "segments fetched", "cache hits", "storage CPU s", "reader CPU s",
                "wrong/failed"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for r in rows:
        t.add_row(r["variant"], str(r["readers"]), cmp.fmt(r["wall_s"]), cmp.fmt(r["reader_p50_s"]),
                  cmp.fmt(r["mb_s"]), f"{r['fragment_gets']:,}", _served(r),
                  f"{r['segments_fetched']:,} of {r['segments_read']:,}", f"{r['cache_hits']:,}",
                  cmp.fmt(r["server"]["cpu_s"]), cmp.fmt(r["reader_cpu_s"]), f"{r['wrong_reads']}/{r['errors']}")
    return t


def render(report: dict[str, Any], width: int = 170) -> str:
    from rich.console import Console
    m, w = report["meta"], report["write"]
    con = Console(width=width, record=True, file=io.StringIO())
    p = m["profile"]
    con.print(f"training reads ({p['name']}): {p['shards']} shards x {p['shard_mib']} MiB, {p['readers']} "
              f"readers, {p['epochs']} epochs; herd: {p['herd_readers']} readers x {p['herd_mib']} MiB")
    if w:
        con.print(f"written once (not measured): {w['objects']} objects, {w['bytes'] / 1e6:,.0f} MB "
                  f"in {w['wall_s']:.1f} s")
    con.print(epochs_table(report["epochs"]))
    con.print(herd_table(report["herd"]))
    con.print("MB/s = 10^6 B/s from the common start to the last byte. 'served (storage, est.)': bytes "
              "the storage nodes read from fragment files / mean fragment file size.")
    for c in report["checks"]:
        con.print(("[green]ok[/green]   " if c["ok"] else "[red]FAIL[/red] ") + f"{c['name']}: {c['detail']}")
    for f in m["failures"]:
        con.print(f"[red]failed[/red]: {f}")
    return con.export_text()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Profile]:
    ap = argparse.ArgumentParser(prog="python -m bench.training", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 shards x 16 MiB, 8 readers; herd 8 x 64 MiB")
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT, metavar="PATH",
                    help=f"where the JSON goes (default {DEFAULT_OUT})")
    for name in ("shards", "shard_mib", "readers", "epochs", "herd_readers", "herd_mib"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the profile")
    args = ap.parse_args(argv)
    p = PROFILES["quick" if args.quick else "full"]
    changed = {k: v for k in asdict(p) if k != "name" and (v := getattr(args, k)) is not None}
    if changed:
        p = replace(p, name=f"{p.name}, changed", **changed)
    try:
        p.check()
    except ValueError as exc:
        ap.error(str(exc))
    return args, p


def base_meta(p: Profile) -> dict[str, Any]:
    return {"profile": asdict(p), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "planned_phases": 2 * p.epochs + 3,
            "cluster": {"storage": STORAGE_NODES, "control": CONTROL_NODES, "k": K, "m": M,
                        "fsync": False, "scrub": "off", "gateway": False},
            "cache_factor": CACHE_FACTOR, "reader_loop": "uvloop" if wl._loop_factory() else "asyncio"}


def main(argv: list[str] | None = None) -> int:
    args, p = parse_args(argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    cmp.interrupt_on_sigterm()
    os.environ[SCRUB_ENV] = "0"               # the storage nodes' file reads are the readers'
    os.environ.pop("ECSTORE_CACHE_DIR", None)  # "no cache" must mean it (readers inherit this)
    r, meta = Run(p, log), base_meta(p)
    try:
        with cmp.temp_dir("ecstore-training-") as tmp:
            r.run(tmp)
    except KeyboardInterrupt:
        r.failures.append("interrupted")
        log("interrupted: readers and servers stopped, writing what was measured")
    except Exception as exc:  # noqa: BLE001 - still write what was measured
        r.failures.append(f"{type(exc).__name__}: {exc}")
        log(f"failed: {r.failures[-1]}")
    meta.update(total_s=time.perf_counter() - t_start, loadavg_end=os.getloadavg(),
                fragment_file_bytes=r.fragment_file_bytes)
    report = r.report(meta)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    log(f"results written to {args.json} ({meta['total_s']:.0f} s in all)")
    failed = r.failures or not all(c["ok"] for c in report["checks"])
    return 130 if "interrupted" in r.failures else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
