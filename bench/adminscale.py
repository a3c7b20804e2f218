"""How the admin commands' memory and time grow with the number of objects: `ecstore
repair`, `ecstore gc` and `ecstore rebalance` read every live record and every storage
node's fragment listing into memory before they work, so their peak RSS grows with the
objects a cluster holds. This measures it, per object, so an operator can size the
machine they run on.

    python -m bench.adminscale [--quick] [--objects N,N2] [--json] [--out PATH]

A local cluster (6 storage + 3 control nodes, 4+2, fsync on, no gateway) in a temporary
directory under /tmp, on ports ECSTORE_PORT_RANGE (default 24000-24999 here). For each
object count N, in increasing order, objects are put into one bucket until N exist (each
one byte over the map's inline limit: one segment, six fragments; the client library,
CONCURRENCY at once), then `repair --dry-run --json`, `gc --dry-run --json` and
`rebalance --dry-run --json` each run as a child process (`python -m cli.main`): its
wall time, CPU and peak RSS (its own ru_maxrss, from os.wait4). Each must exit 0 with
JSON that names every object (repair's and rebalance's objects_checked, gc's
fragments_listed).

From the counts: each command's peak RSS per object (the least-squares slope of peak RSS
over N; with two counts, the slope between them), its fixed cost (the intercept: the
interpreter, imports, the client), the marginal objects per second, and the RSS that
slope gives at 1,000,000 objects (extrapolated). Then, in this process, where the memory
goes: tracemalloc around the same functions the commands call (store.workers.live_records,
store.workers.all_listings, store.gc.control_scan, and gc's fragment homes from
store.gc.record_homes), bytes held per record, per listed fragment id, per scanned
control-node row and per home, the deep size of one of each, and for each command the
bytes per object of what it holds at once (HOLDS) - the part of its RSS slope that its
data's Python objects explain.

Prints rich tables (or, with --json, the JSON) and writes the JSON to --out (default
bench/results/adminscale.json); progress goes to stderr. Exit status 1 when anything
failed. Default counts 5,000 and 20,000 (about 5 minutes on 2 cores); --quick 1,000 and
4,000.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from cli.ops import dir_bytes

K, M, STORAGE_NODES, CONTROL_NODES = 4, 2, 6, 3   # bench.compare's cluster
DEFAULT_OBJECTS = (5_000, 20_000)
QUICK_OBJECTS = (1_000, 4_000)
MAX_OBJECTS = 200_000           # --objects above this: refused (disk, time)
CONCURRENCY = 32                # puts in flight
BUCKET = "adminscale"
PORT_RANGE = "24000-24999"      # ECSTORE_PORT_RANGE unless already set
PUT_TIMEOUT_S = 60.0            # one put
PUT_RETRIES = 2                 # passes over the puts that failed, after the first
MAX_PUT_ERRORS = 200            # a pass stops once this many puts failed
COMMAND_TIMEOUT_S = 600.0       # one admin command
EXTRAPOLATE_TO = 1_000_000      # objects: the RSS the slope gives there
COMMANDS: dict[str, list[str]] = {
    "repair": ["repair", "--dry-run", "--json"],
    "gc": ["gc", "--dry-run", "--json"],
    "rebalance": ["rebalance", "--dry-run", "--json"],
}
# what each command holds at once at its peak (the memory_breakdown entries): repair's
# metadata replica check (a control_scan) is done and dropped before its records are read
HOLDS: dict[str, tuple[str, ...]] = {
    "repair": ("live_records", "all_listings"),
    "gc": ("all_listings", "control_scan", "gc_homes"),
    "rebalance": ("live_records", "all_listings"),
}
DEFAULT_OUT = Path("bench/results/adminscale.json")
ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024

Log = Callable[[str], None]
T = TypeVar("T")


# ---- pure helpers ---------------------------------------------------------------------------
def parse_objects(text: str) -> list[int]:
    """'5000,20000' -> [5000, 20000]: distinct counts, sorted; ValueError unless each is
    an integer in 1..MAX_OBJECTS (underscores allowed) and there is at least one."""
    counts = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        n = int(part)
        if not 1 <= n <= MAX_OBJECTS:
            raise ValueError(f"object count {n} is not in 1..{MAX_OBJECTS:,}")
        counts.add(n)
    if not counts:
        raise ValueError("no object count given")
    return sorted(counts)


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares (slope, intercept) of y over x; None with fewer than two distinct x.
    With two points it is the line through both."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx
    return slope, my - slope * mx


def per_object(rows: Sequence[dict[str, Any]], command: str) -> dict[str, Any]:
    """One command's growth from its measured rows (each with "command", "objects",
    "peak_rss_bytes", "wall_s", "exit_code"; rows that failed are left out):
    bytes of peak RSS per object (slope), fixed bytes (intercept), seconds per object
    (slope of the wall time), the marginal objects per second (its inverse), and the RSS
    the fit gives at EXTRAPOLATE_TO objects. None where fewer than two counts succeeded
    (or the time did not grow)."""
    ok = [r for r in rows if r["command"] == command and r["exit_code"] == 0]
    mem = linear_fit([(r["objects"], r["peak_rss_bytes"]) for r in ok])
    wall = linear_fit([(r["objects"], r["wall_s"]) for r in ok])
    out: dict[str, Any] = {"command": command, "counts": [r["objects"] for r in ok],
                           "rss_bytes_per_object": None, "rss_fixed_bytes": None,
                           "s_per_object": None, "fixed_s": None, "marginal_objects_s": None,
                           f"rss_bytes_at_{EXTRAPOLATE_TO}": None}
    if mem is not None:
        out["rss_bytes_per_object"], out["rss_fixed_bytes"] = mem
        out[f"rss_bytes_at_{EXTRAPOLATE_TO}"] = mem[1] + mem[0] * EXTRAPOLATE_TO
    if wall is not None:
        out["s_per_object"], out["fixed_s"] = wall
        out["marginal_objects_s"] = 1 / wall[0] if wall[0] > 0 else None
    return out


def accounted(breakdown: dict[str, Any] | None, command: str) -> float | None:
    """Bytes per object of what `command` holds at once (HOLDS), by the in-process
    breakdown: the sum of those entries' held bytes over its object count; None without
    a breakdown (or one that lacks an entry)."""
    if not breakdown or not breakdown.get("objects"):
        return None
    parts = [breakdown.get(name) for name in HOLDS[command]]
    if any(p is None for p in parts):
        return None
    return sum(p["held_bytes"] for p in parts if p is not None) / breakdown["objects"]


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """sys.getsizeof of obj and of everything it holds (dict keys and values, list, tuple,
    set and frozenset items), each object counted once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(x, seen) for x in obj)
    return size


def check_report(command: str, report: Any, objects: int) -> str | None:
    """Why a command's JSON report does not show it saw `objects` objects, or None.
    repair and rebalance count objects_checked (parts of uploads too: at least N), gc the
    fragments it listed (six per object here: at least 6 N)."""
    if not isinstance(report, dict):
        return f"{command}: its JSON is not an object"
    if "error" in report:
        return f"{command}: {report.get('error')}: {report.get('message')}"
    if command == "gc":
        listed = report.get("fragments_listed")
        need = objects * (K + M)
        if not isinstance(listed, int) or listed < need:
            return f"gc: fragments_listed {listed}, expected at least {need}"
        return None
    checked = report.get("objects_checked")
    if not isinstance(checked, int) or checked < objects:
        return f"{command}: objects_checked {checked}, expected at least {objects}"
    return None


# ---- the cluster and the puts ---------------------------------------------------------------
@contextmanager
def cluster_dir() -> Iterator[Path]:
    """A temporary directory under /tmp for the cluster's data, removed at the end
    whatever happens."""
    path = Path(tempfile.mkdtemp(prefix="ecstore-adminscale-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def put_until(cluster_path: Path, start: int, stop: int, log: Log) -> dict[str, Any]:
    """Put objects start..stop-1 (CONCURRENCY at once, each one byte over the inline limit);
    the ones that fail are tried again, PUT_RETRIES more passes. Raises if some still fail."""
    from store.client import Client

    async with Client.connect(cluster_path) as c:
        cmap = await c.cluster_map()
        size = cmap.inline_max_bytes + 1
        if start == 0:
            await c.create_bucket(BUCKET)
        body = os.urandom(size)
        todo = list(range(start, stop))
        errors: list[str] = []
        t0 = time.perf_counter()
        retried = 0
        for attempt in range(1 + PUT_RETRIES):
            done: set[int] = set()
            failed = 0
            pending = iter(todo)

            async def worker() -> None:
                nonlocal failed
                for i in pending:       # one iterator shared by the workers
                    if failed >= MAX_PUT_ERRORS:
                        return          # the rest is left for the next pass
                    try:
                        await asyncio.wait_for(c.put(BUCKET, object_key(i), body), PUT_TIMEOUT_S)
                        done.add(i)
                    except Exception as exc:  # noqa: BLE001 - counted, tried again below
                        failed += 1
                        if len(errors) < 5:
                            errors.append(f"{object_key(i)}: {type(exc).__name__}: {exc}")
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            todo = [i for i in todo if i not in done]   # the failed and the ones not tried
            if not todo:
                break
            retried += failed
            log(f"puts: {len(todo)} to try again (pass {attempt + 2}): {errors[-1]}")
        else:
            raise RuntimeError(f"{len(todo)} puts still failed after {1 + PUT_RETRIES} "
                               f"passes: {errors}")
        wall = time.perf_counter() - t0
    n = stop - start
    return {"objects": stop, "added": n, "object_bytes": size, "wall_s": wall,
            "puts_s": n / wall if wall else 0.0, "mb_s": n * size / 1e6 / wall if wall else 0.0,
            "errors_retried": retried, "error_sample": errors}


def object_key(i: int) -> str:
    return f"o/{i:08d}"


# ---- the commands ---------------------------------------------------------------------------
def run_command(command: str, cluster_path: Path, objects: int,
                timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Run one admin command as a child process; its wall time, CPU, peak RSS (the child's
    own ru_maxrss from os.wait4), exit code and parsed JSON check. Killed past timeout_s."""
    argv = [sys.executable, "-m", "cli.main", "--cluster", str(cluster_path), *COMMANDS[command]]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                cwd=ROOT, env=env, start_new_session=True)
        deadline, timed_out = t0 + timeout_s, False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline and not timed_out:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    row: dict[str, Any] = {
        "command": command, "objects": objects, "exit_code": proc.returncode,
        "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_bytes": usage.ru_maxrss * 1024,     # KiB on Linux
        "objects_s": objects / wall if wall else 0.0, "timed_out": timed_out, "problem": None,
    }
    try:
        report = json.loads(stdout)
    except ValueError:
        report = None
        row["problem"] = f"{command}: stdout is not JSON: {stdout[:200]!r}"
    if report is not None:
        row["problem"] = check_report(command, report, objects)
        row["report"] = {k: v for k, v in report.items()
                         if isinstance(v, (int, float, bool)) or k in ("errors", "unlisted", "metadata")}
    if proc.returncode != 0 or timed_out:
        row["problem"] = (f"{command}: exit {proc.returncode}"
                          + (" (timed out)" if timed_out else "")
                          + f": {stderr.strip().splitlines()[-1:] or ''}")
    return row


# ---- where the memory goes (in this process) ------------------------------------------------
async def traced(fn: Callable[[], Awaitable[T]]) -> tuple[T, int, int, float]:
    """(result, bytes it holds, peak bytes while it was built, seconds) of `await fn()`,
    by tracemalloc (which slows allocation: the seconds are not the commands')."""
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        t0 = time.perf_counter()
        result = await fn()
        wall = time.perf_counter() - t0
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, now - base, peak - base, wall


def item_stats(items: int, held: int, peak: int, wall: float, one: object) -> dict[str, Any]:
    return {"items": items, "held_bytes": held, "peak_bytes": peak,
            "held_bytes_per_item": held / items if items else None,
            "peak_bytes_per_item": peak / items if items else None,
            "deep_size_of_one": deep_size(one) if items else None, "wall_s_traced": wall}


async def memory_breakdown(cluster_path: Path) -> dict[str, Any]:
    """tracemalloc around the functions the commands call, run here one after the other,
    each result kept while the next is built (as prepare_gc keeps them): the bytes each
    holds and the peak while it is built, per item; the deep size of one item; and the
    deep size of each field of one record. gc_homes: gc's map of every live fragment id
    to the nodes a reader looks at (store.gc.record_homes of each record), which repair
    and rebalance do not build."""
    from store.client import Client
    from store.gc import control_scan, record_homes
    from store.workers import all_listings, live_records

    out: dict[str, Any] = {}
    async with Client.connect(cluster_path) as c:
        cmap = await c.cluster_map(refresh=True)
        await c.list_buckets()      # the client's own caches, before anything is counted

        async def records_() -> list[tuple[str, str, dict[str, Any]]]:
            return [r async for r in live_records(c, read_repair=False, inline_bytes=False)]

        async def listings_() -> dict[str, set[str]]:
            return (await all_listings(c, cmap.all_storage_nodes()))[0]

        async def scan_() -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
            return await control_scan(c, cmap)   # as gc asks

        async def homes_() -> dict[str, frozenset[str]]:
            homes: dict[str, frozenset[str]] = {}
            for _, _, rec in records:
                homes.update(record_homes(cmap, rec))
            return homes

        records, held, peak, wall = await traced(records_)
        out["live_records"] = item_stats(len(records), held, peak, wall,
                                         records[0] if records else None)
        listings, held, peak, wall = await traced(listings_)
        fid = next((f for ids in listings.values() for f in ids), None)
        out["all_listings"] = item_stats(sum(map(len, listings.values())), held, peak, wall, fid)
        scan, held, peak, wall = await traced(scan_)
        row = next((kv for node_rows in scan.values() for kv in node_rows.items()), None)
        out["control_scan"] = item_stats(sum(map(len, scan.values())), held, peak, wall, row)
        homes, held, peak, wall = await traced(homes_)
        home = next(iter(homes.items()), None)
        out["gc_homes"] = item_stats(len(homes), held, peak, wall, home)
        if records:
            out["record_fields"] = {k: deep_size(v) for k, v in records[0][2].items()}
    return out


# ---- output ---------------------------------------------------------------------------------
def _mib(b: float | None) -> str:
    return "-" if b is None else f"{b / MiB:,.1f}"


def _num(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


SHORT = {"live_records": "records", "all_listings": "listings", "control_scan": "scan",
         "gc_homes": "homes"}


def render(report: dict[str, Any], width: int = 150) -> str:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=width, record=True, file=io.StringIO())
    puts = Table(title=f"puts: {report['object_bytes'] or 0:,}-byte objects (1 segment, "
                       f"{K + M} fragments), {CONCURRENCY} at once, client library")
    for col in ("objects then", "added", "wall s", "puts/s", "MB/s", "retried"):
        puts.add_column(col, justify="right")
    for p in report["puts"]:
        puts.add_row(f"{p['objects']:,}", f"{p['added']:,}", f"{p['wall_s']:.1f}",
                     f"{p['puts_s']:,.0f}", f"{p['mb_s']:.1f}", str(p["errors_retried"]))
    con.print(puts)

    runs = Table(title="admin commands (--dry-run --json, a child process each)")
    for col in ("command", "objects", "exit", "wall s", "CPU s", "objects/s", "peak RSS MiB",
                "RSS bytes/object (whole)"):
        runs.add_column(col, justify="left" if col == "command" else "right")
    for r in report["rows"]:
        code = str(r["exit_code"]) if r["exit_code"] == 0 else f"[red]{r['exit_code']}[/red]"
        runs.add_row(r["command"], f"{r['objects']:,}", code, f"{r['wall_s']:.1f}",
                     f"{r['cpu_s']:.1f}", f"{r['objects_s']:,.0f}", _mib(r["peak_rss_bytes"]),
                     f"{r['peak_rss_bytes'] / r['objects']:,.0f}")
    con.print(runs)

    growth = Table(title=f"growth per object (slope over {', '.join(f'{n:,}' for n in report['objects'])} "
                         f"objects; at {EXTRAPOLATE_TO:,}: extrapolated)")
    for col in ("command", "RSS bytes/object", "held by its data (tracemalloc)", "fixed RSS MiB",
                "ms/1,000 objects", "marginal objects/s", f"RSS at {EXTRAPOLATE_TO:,} GiB"):
        growth.add_column(col, justify="left" if col == "command" else "right")
    for g in report["per_object"].values():
        at = g[f"rss_bytes_at_{EXTRAPOLATE_TO}"]
        growth.add_row(g["command"], _num(g["rss_bytes_per_object"]),
                       _num(g.get("accounted_bytes_per_object")) + " ("
                       + " + ".join(SHORT[n] for n in g.get("accounted_from", [])) + ")",
                       _mib(g["rss_fixed_bytes"]),
                       _num(None if g["s_per_object"] is None else g["s_per_object"] * 1e6),
                       _num(g["marginal_objects_s"]), "-" if at is None else f"{at / 2**30:.2f}")
    con.print(growth)

    mem = report.get("memory_breakdown") or {}
    if mem:
        t = Table(title=f"where the memory goes: in this process at {mem['objects']:,} objects "
                        "(tracemalloc; held = kept after the call, peak = while it ran)")
        for col in ("function", "items", "held bytes/item", "peak bytes/item",
                    "deep size of one", "held MiB"):
            t.add_column(col, justify="left" if col == "function" else "right")
        for name, label in (("live_records", "live_records (records)"),
                            ("all_listings", "all_listings (fragment ids)"),
                            ("control_scan", "control_scan (rows, every node)"),
                            ("gc_homes", "gc_homes (fragment id -> nodes)")):
            m = mem.get(name)
            if m:
                t.add_row(label, f"{m['items']:,}", _num(m["held_bytes_per_item"]),
                          _num(m["peak_bytes_per_item"]), _num(m["deep_size_of_one"]),
                          _mib(m["held_bytes"]))
        con.print(t)
        if "record_fields" in mem:
            fields = sorted(mem["record_fields"].items(), key=lambda kv: -kv[1])
            con.print("one record's fields, deep bytes: "
                      + ", ".join(f"{k} {v}" for k, v in fields))
    for note in report.get("notes", []):
        con.print(f"note: {note}", highlight=False)
    for f in report["failures"]:
        con.print(f"[red]failed[/red]: {f}", highlight=False)
    return con.export_text()


def notes(report: dict[str, Any]) -> list[str]:
    out = [f"load average (1 min) {report['loadavg_start'][0]:.2f} at the start, "
           f"{report['loadavg_end'][0]:.2f} at the end, on {report['cpus']} CPUs; the "
           "cluster's ten processes run on the same machine as the commands"]
    d = report.get("disk", {})
    if d:
        out.append(f"cluster data at the end: {d.get('cluster_bytes', 0) / 2**30:.2f} GiB; "
                   f"/tmp free {d['free_before'] / 2**30:.1f} GiB before, "
                   f"{d['free_after'] / 2**30:.1f} GiB after (directory removed)")
    return out


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.adminscale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_OBJECTS[0]:,} and {QUICK_OBJECTS[1]:,} objects")
    ap.add_argument("--objects", metavar="N,N2", default=None,
                    help="object counts, comma-separated (default "
                         f"{','.join(map(str, DEFAULT_OBJECTS))}; at most {MAX_OBJECTS:,})")
    ap.add_argument("--no-breakdown", action="store_true",
                    help="skip the in-process memory breakdown")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the tables")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    try:
        a.objects = parse_objects(a.objects) if a.objects else \
            list(QUICK_OBJECTS if a.quick else DEFAULT_OBJECTS)
    except ValueError as exc:
        ap.error(f"--objects: {exc}")
    return a


def run(counts: Iterable[int], breakdown: bool, log: Log, report: dict[str, Any]) -> None:
    """Fill `report` as the run goes (what failed midway still leaves what was measured)."""
    from cli.localcluster import LocalCluster

    failures: list[str] = report["failures"]
    with cluster_dir() as tmp:
        cluster = LocalCluster.create(tmp, storage=STORAGE_NODES, control=CONTROL_NODES,
                                      k=K, m=M, fsync=True, gateway=False)
        try:
            log(f"cluster: starting in {tmp}")
            cluster.start()
            have = 0
            for n in counts:
                log(f"puts: {have:,} -> {n:,} objects")
                p = asyncio.run(put_until(cluster.path, have, n, log))
                report["object_bytes"] = p["object_bytes"]
                report["puts"].append(p)
                have = n
                log(f"puts: {p['added']:,} in {p['wall_s']:.1f} s, {p['puts_s']:,.0f}/s")
                for command in COMMANDS:
                    row = run_command(command, cluster.path, n)
                    report["rows"].append(row)
                    log(f"{command} at {n:,}: exit {row['exit_code']}, {row['wall_s']:.1f} s, "
                        f"peak RSS {row['peak_rss_bytes'] / MiB:.0f} MiB")
                    if row["problem"]:
                        failures.append(f"{row['problem']} (at {n:,} objects)")
            if breakdown:
                log(f"memory breakdown at {have:,} objects (tracemalloc, in this process)")
                report["memory_breakdown"] = {"objects": have,
                                              **asyncio.run(memory_breakdown(cluster.path))}
            report["disk"]["cluster_bytes"] = dir_bytes(tmp, allocated=True)
        finally:
            log("cluster: stopping")
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("ECSTORE_PORT_RANGE", PORT_RANGE)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_start": os.getloadavg(),
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "objects": args.objects, "concurrency": CONCURRENCY, "object_bytes": None,
        "port_range": os.environ["ECSTORE_PORT_RANGE"],
        "disk": {"free_before": shutil.disk_usage("/tmp").free},
        "puts": [], "rows": [], "per_object": {}, "memory_breakdown": None, "failures": []}
    try:
        run(args.objects, not args.no_breakdown, log, report)
    except Exception as exc:  # noqa: BLE001 - reported with what was measured before it
        report["failures"].append(f"{type(exc).__name__}: {exc}")
        log(report["failures"][-1])
    report["disk"]["free_after"] = shutil.disk_usage("/tmp").free
    report["loadavg_end"] = os.getloadavg()
    report["duration_s"] = time.perf_counter() - t0
    report["per_object"] = {c: {**per_object(report["rows"], c),
                                "accounted_bytes_per_object": accounted(report["memory_breakdown"], c),
                                "accounted_from": list(HOLDS[c])}
                            for c in COMMANDS}
    report["notes"] = notes(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else render(report))
    for f in report["failures"]:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
