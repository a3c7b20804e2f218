"""What a scrub pass costs, and what it leaves in the page cache: the scrubber's reads
(every fragment read whole and its checksum checked, as node/scrub.py does) over a store
of 1 MiB fragments that are not in the page cache, read as the scrubber reads them
(uncached: FragmentStore.read_raw(uncached=True)) and as plain reads, alternated.

    python -m bench.scrub [--mib N] [--rounds N] [--dir DIR] [--json]

For each pass: MB/s, this process's user and kernel CPU seconds, and how much the page
cache (/proc/meminfo Cached) grew. The store is written once (under --dir, default a
temporary directory, removed after), synced, and dropped from the page cache before each
pass (POSIX_FADV_DONTNEED over its volume files).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pagecache import evict, meminfo_kib
from node.fragments import FragmentStore
from node.volumes import parse_fragment
from store.digest import digest

MiB = 1024 * 1024
MODES = ("plain", "uncached")


def page_cache_bytes() -> int:
    kib = meminfo_kib("Cached")
    if kib is None:
        raise RuntimeError("no Cached: line in /proc/meminfo")
    return kib * 1024


def fill(store: FragmentStore, mib: int) -> list[str]:
    body = bytearray(os.urandom(MiB))
    fids = []
    for i in range(mib):
        body[-8:] = i.to_bytes(8, "big")
        fid = f"bench.{i:06d}"
        store.put(fid, body, digest(body), {"i": i})
        fids.append(fid)
    return fids


def one_pass(store: FragmentStore, fids: list[str], uncached: bool) -> dict[str, Any]:
    evict([store.vdir], sync=True)
    time.sleep(0.2)
    cache0, ru0, t0 = page_cache_bytes(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    read = 0
    for fid in fids:
        raw, _ = store.read_raw(fid, uncached=uncached)
        parse_fragment(fid, raw, verify=True)
        read += len(raw)
    wall = time.perf_counter() - t0
    ru1, cache1 = resource.getrusage(resource.RUSAGE_SELF), page_cache_bytes()
    return {"mode": "uncached" if uncached else "plain", "fragments": len(fids),
            "mb_s": read / wall / 1e6, "user_s": ru1.ru_utime - ru0.ru_utime,
            "sys_s": ru1.ru_stime - ru0.ru_stime,
            "page_cache_grew_mib": (cache1 - cache0) / MiB}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrub", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="store size in MiB (1 MiB fragments)")
    ap.add_argument("--rounds", type=int, default=3, help="passes of each mode, alternated")
    ap.add_argument("--dir", type=Path, default=None, help="where the store goes (kept)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    if a.mib < 1 or a.rounds < 1:
        ap.error("--mib and --rounds must be at least 1")
    where = a.dir or Path(tempfile.mkdtemp(prefix="ecstore-bench-scrub-"))
    try:
        store = FragmentStore(where, fsync=True, reserve_bytes=0)
        fids = sorted(store.list("", 10 ** 9)) or fill(store, a.mib)
        rows = [one_pass(store, fids, mode == "uncached")
                for _ in range(a.rounds) for mode in MODES]
    finally:
        if a.dir is None:
            shutil.rmtree(where, ignore_errors=True)
    if a.json:
        print(json.dumps({"kernel": os.uname().release, "uncached_flag": store.uncached_flag,
                          "passes": rows}, indent=2))
    else:
        print(f"scrub pass over {len(fids)} x 1 MiB, not cached (kernel {os.uname().release}, "
              f"RWF_DONTCACHE {'taken' if store.uncached_flag else 'refused: reads dropped after'})")
        print(f"{'mode':9} {'MB/s':>7} {'user s':>7} {'sys s':>7} {'page cache grew':>16}")
        for r in rows:
            print(f"{r['mode']:9} {r['mb_s']:7.0f} {r['user_s']:7.2f} {r['sys_s']:7.2f} "
                  f"{r['page_cache_grew_mib']:12.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
