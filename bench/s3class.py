"""Checkpoints through S3 with and without a storage class: W writers each put an object
of M MiB at once through boto3 (multipart, as bench.compare's storm), then read them back,
on one local cluster (6 storage + 3 control nodes, 4+2, fsync on, one gateway), in rounds
that alternate STANDARD and --storage-class (default STANDARD_IA: the gateway writes
infrequent-access and archive classes uncached - the storage nodes keep none of their
fragments in the page cache).

    python -m bench.s3class [--quick] [--writers W] [--mib M] [--rounds N]
                            [--storage-class NAME] [--json] [--out PATH]

For each round and class: put and get MB/s, the time until the last put is acknowledged,
and the CPU milliseconds per MiB of each process role (from /proc) and of this benchmark
process (boto3). Every get is checked against a hash of what was put, and every object's
storage class (HEAD) against the one it was put with. The page cache is written out
(sync) before each round. On a machine whose page cache is still growing into memory the
host takes back when freed (this one: see the README), a write into new page-cache pages
costs several times a write into reused ones, so a round's figures depend on what ran
before it: compare the classes within a run, round by round. Writes the JSON to --out
(default bench/results/s3class.json). Exit status 1 when anything failed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.bound import cpu_by_role, ecstore_gateway, finish, start
from bench.compare import flush_page_cache
from node.s3.objects import STORAGE_CLASSES

MIB = 1024 * 1024
DEFAULT_OUT = Path("bench/results/s3class.json")
SEED = 500


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.s3class", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 writers x 32 MiB, one round of each class")
    ap.add_argument("--writers", type=int, default=None, help="objects put at once (default 4)")
    ap.add_argument("--mib", type=int, default=None, help="MiB per object (default 256)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of each class, alternated (default 2)")
    ap.add_argument("--storage-class", default="STANDARD_IA",
                    help="the class compared with STANDARD (default STANDARD_IA)")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    a.writers = a.writers or (2 if a.quick else 4)
    a.mib = a.mib or (32 if a.quick else 256)
    a.rounds = a.rounds or (1 if a.quick else 2)
    if min(a.writers, a.mib, a.rounds) < 1:
        ap.error("--writers, --mib and --rounds must be at least 1")
    if a.storage_class == "STANDARD" or a.storage_class not in STORAGE_CLASSES:
        ap.error(f"--storage-class: one of {', '.join(STORAGE_CLASSES[1:])} (compared with "
                 f"STANDARD); got {a.storage_class!r}")
    return a


def per_mib(before: dict[str, float], after: dict[str, float], mib: float) -> dict[str, float]:
    return {r: round(1000 * (after[r] - before.get(r, after[r])) / mib, 2) for r in after}


def one_round(t: wl.S3Target, roles: Any, data: wl.Data, cls: str, n: int, writers: int,
              size: int) -> dict[str, Any]:
    """Put `writers` objects of `size` bytes of class `cls` at once, then get them back."""
    def key(i: int) -> str:
        return f"r{n}/{cls}/{i}"
    mib = writers * size / MIB
    flush_page_cache()
    before = cpu_by_role(roles())
    res_put, sent = t.put_streams(key, lambda i: data.stream_blocks(SEED + i, size), writers,
                                  600.0, None if cls == "STANDARD" else {"StorageClass": cls})
    mid = cpu_by_role(roles())
    for i, sha in enumerate(sent):
        if sha:
            data.record_stream(SEED + i, size, sha)
    res_get = t.get_streams(key, lambda i: data.stream_sha.get((SEED + i, size), "not put"),
                            size, writers, 600.0)
    after = cpu_by_role(roles())
    wrong = [key(i) for i in range(writers)
             if t.s3.head_object(Bucket=t.bucket, Key=key(i)).get("StorageClass", "STANDARD") != cls]
    return {"round": n, "storage_class": cls,
            "put_mb_s": res_put.bytes / res_put.wall_s / 1e6 if res_put.wall_s else 0.0,
            "last_put_s": res_put.wall_s,
            "get_mb_s": res_get.bytes / res_get.wall_s / 1e6 if res_get.wall_s else 0.0,
            "errors": res_put.errors + res_get.errors + len(wrong),
            "error_sample": res_put.error_sample or res_get.error_sample
            or (f"stored without class {cls}: {wrong[0]}" if wrong else ""),
            "put_cpu_ms_per_mib": per_mib(before, mid, mib),
            "get_cpu_ms_per_mib": per_mib(mid, after, mib)}


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'round':>5} {'class':12} {'put MB/s':>9} {'get MB/s':>9} {'errors':>6}  "
             "CPU ms per MiB put | get (by process)", "-" * 110]
    for r in rows:
        def cpu(d: dict[str, float]) -> str:
            return ", ".join(f"{k} {v:.2f}" for k, v in d.items())
        lines.append(f"{r['round']:>5} {r['storage_class']:12} {r['put_mb_s']:9.1f} "
                     f"{r['get_mb_s']:9.1f} {r['errors']:6d}  {cpu(r['put_cpu_ms_per_mib'])} | "
                     f"{cpu(r['get_cpu_ms_per_mib'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log, started, load = start()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    data = wl.Data()
    try:
        with ecstore_gateway() as (t, roles):
            t.create_bucket()
            for n in range(args.rounds):
                for cls in ("STANDARD", args.storage_class):
                    rows.append(one_round(t, roles, data, cls, n, args.writers, args.mib * MIB))
                    r = rows[-1]
                    log(f"round {n} {cls}: put {r['put_mb_s']:.1f} MB/s, get "
                        f"{r['get_mb_s']:.1f}, errors {r['errors']}")
    except Exception as exc:  # noqa: BLE001 - reported as a failure, the JSON still written
        failures.append(f"{type(exc).__name__}: {exc}")
        log(failures[-1])
    report = {"started": started, "loadavg_start": load, "writers": args.writers,
              "object_bytes": args.mib * MIB, "rounds": args.rounds,
              "storage_class": args.storage_class, "rows": rows, "failures": failures}
    return finish(report, args.out, args.json, render(rows))


if __name__ == "__main__":
    sys.exit(main())
