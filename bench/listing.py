"""S3 listings against SeaweedFS, alternated: the ecstore gateway (a local cluster, 6
storage + 3 control nodes, 4+2, fsync on) and SeaweedFS up at once, the same keys put into
both (P prefixes x 100 keys of 64 bytes, as bench.compare's), then bench.compare's two
listings - every prefix with prefix+delimiter (1 + P requests), and all keys with full
pagination (1,000 keys a page) - in R rounds, the gateway and SeaweedFS in turn, every
listing checked against the keys put.

    python -m bench.listing [--quick] [--prefixes P] [--rounds R] [--json] [--out PATH]

For each target and listing: keys/s in each round and their median, and per page (one
ListObjectsV2 request) the wall time, this process's CPU (boto3: signing, the request, the
XML and its dates) and the servers' CPU (from /proc: the gateway and the control nodes, or
`weed`). bench.compare runs each listing once per target, a second or two, one target after
the other; on this shared host a figure moves by a tenth from one minute to the next, and
the ratio with it. Rounds in turn compare the two in the same minutes. Writes the JSON to
--out (default bench/results/listing.json). Exit status 1 when anything failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.bound import Roles, cpu_by_role, ecstore_gateway, finish, seaweedfs, start

DEFAULT_OUT = Path("bench/results/listing.json")
TARGETS = ("gw", "weed")
LISTINGS: dict[str, Callable[[wl.Target], wl.Listing]] = {
    "prefix+delimiter": wl.by_prefix,
    "full pagination": lambda t: t.list_all("ls/", ""),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 prefixes, 2 rounds")
    ap.add_argument("--prefixes", type=int, default=None,
                    help="prefixes of 100 keys each (default 100: bench.compare's 10,000 keys)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of each target (default 5)")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    a.prefixes = a.prefixes if a.prefixes is not None else 20 if a.quick else 100
    a.rounds = a.rounds if a.rounds is not None else 2 if a.quick else 5
    if a.prefixes < 1 or a.rounds < 1:
        ap.error("--prefixes and --rounds must be at least 1")
    return a


def one_listing(t: wl.Target, roles: Roles, keys: list[str], name: str,
                rnd: int) -> dict[str, Any]:
    """One listing of every key, timed and checked; CPU per page by process."""
    before, c0 = cpu_by_role(roles()), time.thread_time()
    m = wl.timed_listing(t, keys, name, LISTINGS[name], {})
    client, after = time.thread_time() - c0, cpu_by_role(roles())
    pages = max(1, int(m.extra.get("pages") or 0))
    server = sum(after[r] - before.get(r, after[r]) for r in after if r != "bench")
    return {"target": t.key, "listing": name, "round": rnd, "keys": len(keys),
            "pages": m.extra.get("pages"), "errors": m.errors, "error_sample": m.error_sample,
            "keys_s": m.metrics.get("keys_s"), "wall_ms_per_page": 1000 * m.wall_s / pages,
            "client_cpu_ms_per_page": 1000 * client / pages,
            "server_cpu_ms_per_page": 1000 * server / pages}


def run_rounds(targets: Sequence[tuple[wl.Target, Roles]], keys: list[str], rounds: int,
               log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for rnd in range(rounds):
        for name in LISTINGS:
            for t, roles in targets:
                rows.append(one_listing(t, roles, keys, name, rnd))
                r = rows[-1]
                log(f"round {rnd} {name} {t.key}: {r['keys_s'] or 0:,.0f} keys/s, "
                    f"{r['errors']} errors")
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the rounds per (listing, target) - of the rounds without errors - and
    the gateway / SeaweedFS ratio of the median keys/s."""
    out = []
    for name in LISTINGS:
        med: dict[str, dict[str, float | None]] = {}
        for target in TARGETS:
            ok = [r for r in rows if r["listing"] == name and r["target"] == target
                  and not r["errors"] and r["keys_s"]]
            med[target] = {f: statistics.median(r[f] for r in ok) if ok else None
                           for f in ("keys_s", "wall_ms_per_page", "client_cpu_ms_per_page",
                                     "server_cpu_ms_per_page")}
        gw, weed = med["gw"]["keys_s"], med["weed"]["keys_s"]
        out.append({"listing": name, "medians": med,
                    "gw_over_weed": gw / weed if gw and weed else None})
    return out


def render(summary: list[dict[str, Any]], rounds: int) -> str:
    head = (f"{'listing':<18} {'target':<6} {'keys/s':>8} {'ms/page':>8} {'client CPU':>10} "
            f"{'server CPU':>10}   (medians of {rounds} rounds; CPU in ms per page)")
    lines = [head, "-" * len(head)]
    for s in summary:
        for target in TARGETS:
            m = s["medians"][target]

            def f(v: float | None, fmt: str) -> str:
                return format(v, fmt) if v is not None else "-"
            lines.append(f"{s['listing']:<18} {target:<6} {f(m['keys_s'], ',.0f'):>8} "
                         f"{f(m['wall_ms_per_page'], '.2f'):>8} "
                         f"{f(m['client_cpu_ms_per_page'], '.2f'):>10} "
                         f"{f(m['server_cpu_ms_per_page'], '.2f'):>10}")
        ratio = s["gw_over_weed"]
        lines.append(f"{s['listing']:<18} gateway / SeaweedFS: "
                     f"{format(ratio, '.2f') if ratio is not None else '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log, started, load = start()
    keys = wl.list_keys(dataclasses.replace(wl.PROFILES["full"], list_prefixes=args.prefixes))
    data = wl.Data()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        with ExitStack() as stack:
            targets = [stack.enter_context(ecstore_gateway()), stack.enter_context(seaweedfs())]
            for t, _ in targets:
                stack.callback(t.close)
                t.create_bucket()
                made = t.put_objects(lambda i: keys[i],
                                     lambda i: data.payload(wl.TAG_LIST, i, wl.LIST_OBJECT_BYTES),
                                     len(keys), 16, wl.SMALL_TIMEOUT_S)
                if made.errors:
                    raise RuntimeError(f"{t.key}: putting the keys failed: {made.error_sample}")
                log(f"{t.key}: {len(keys):,} keys put")
            rows = run_rounds(targets, keys, args.rounds, log)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON and the exit status
        failures.append(f"{type(exc).__name__}: {exc}")
        log(failures[-1])
    summary = summarize(rows)
    report = {"started": started, "loadavg_start": load, "prefixes": args.prefixes,
              "keys": len(keys), "rounds": args.rounds, "rows": rows, "summary": summary,
              "failures": failures}
    return finish(report, args.out, args.json, render(summary, args.rounds))


if __name__ == "__main__":
    sys.exit(main())
