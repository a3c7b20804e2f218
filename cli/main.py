"""`ecstore`: the admin and user CLI. Parsing and presentation only."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from cli.argtypes import count, non_negative
from store.client import Client, ObjectInfo, new_version_id
from store.cluster import ClusterInfo
from store.errors import BadRequest, EcstoreError, Unauthorized, Unavailable
from store.names import OPS_BUCKET, WORKER_OPS

if TYPE_CHECKING:
    from cli.localcluster import LocalCluster

PROGRESS_MIN_BYTES = 8 * 1024 * 1024
OPS_PUBLISH_INTERVAL_S = 2.0   # a worker's progress record is written this often
OPS_FINAL_TIMEOUT_S = 5.0      # longest wait for the last one when the worker is done
READ_CHUNK_BYTES = 1024 * 1024
# not on a terminal (a pipe, a log, cron): tables as wide as they need, not cut at 80
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def split_path(path: str, need_key: bool = True) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    if not bucket or (need_key and not key):
        raise BadRequest(f"expected BUCKET/KEY, got {path!r}")
    return bucket, key


# ---- cluster up/down ---------------------------------------------------------------------
def cmd_cluster_up(a: argparse.Namespace) -> int:
    from cli.localcluster import LocalCluster

    data = Path(a.data)
    if (data / "cluster.json").exists():
        cluster = LocalCluster.load(data)
        running = cluster.running()
        if running:
            return start_down_nodes(cluster, running)
        err.print(f"restarting the cluster in {data}")
    else:
        try:
            cluster = LocalCluster.create(data, a.storage, a.control, a.k, a.m,
                                          fsync=not a.no_fsync, gateway=not a.no_gateway,
                                          cold=a.cold, cold_k=a.cold_k, cold_m=a.cold_m)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        cluster.stop()
        raise EcstoreError(f"cluster did not start: {exc}") from None
    roles = [n.role for n in cluster.nodes.values()]
    cold = sum(1 for n in cluster.nodes.values() if n.role == "storage" and n.tier == "cold")
    err.print(f"cluster up: {roles.count('control')} control, {roles.count('storage') - cold} "
              f"hot storage nodes (policy hot {cluster.k}+{cluster.m})"
              + (f", {cold} cold (policy cold {cluster.cold_k}+{cluster.cold_m})" if cold else "")
              + f"; cluster file {cluster.path}")
    gw = cluster.gateway
    if gw is not None:
        err.print(f"S3 gateway: {gw['url']} (access key {gw['access_key']}; the secret key is "
                  f"in {cluster.path})", highlight=False)
    if a.detach:
        return 0
    err.print("running in the foreground; Ctrl-C stops every node")
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    ticks = 0
    while not stop:
        time.sleep(0.2)
        report_exits(cluster)
        ticks += 1
        if ticks % 5 == 0 and not any_node_running(data):
            err.print("every node has stopped (`ecstore cluster down`?); exiting")
            return 0
    err.print("stopping nodes")
    try:   # as cluster.json lists them now: nodes added or restarted since are stopped too
        cluster = LocalCluster.load(data)
    except (OSError, EcstoreError):
        pass
    cluster.stop()
    return 0


def any_node_running(data: Path) -> bool:
    """Whether a node cluster.json lists runs (True when the file cannot be read)."""
    from cli.localcluster import LocalCluster

    try:
        return bool(LocalCluster.load(data).running())
    except (OSError, EcstoreError):
        return True


def report_exits(cluster: LocalCluster) -> None:
    """Reap the foreground cluster's nodes that exited (no zombies) and say which."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        node = next((i for i, n in cluster.nodes.items() if n.pid == pid), f"pid {pid}")
        if os.WIFEXITED(status) and os.waitstatus_to_exitcode(status) == 0:
            err.print(f"node {node} stopped", highlight=False)   # `cluster down`, a SIGTERM
            continue
        how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.waitstatus_to_exitcode(status)}")
        err.print(f"node {node} exited ({how}); `ecstore cluster up` in another shell "
                  "starts it again", highlight=False)


def start_down_nodes(cluster: LocalCluster, running: list[str]) -> int:
    """`cluster up` on a cluster that runs: start the nodes that are down (a crashed or
    killed one), as `docker compose up` starts the services that are not running; the
    running ones are left alone. Refused when every node is up."""
    down = [i for i in cluster.nodes if i not in running]
    if not down:
        silent = [i for i in running if not cluster._healthy(i)]
        if silent:   # its process runs, and it does not answer: stopping (draining), or hung
            raise BadRequest(
                "every node's process runs, but " + ", ".join(
                    f"{i} (pid {cluster.nodes[i].pid})" for i in silent)
                + " does not answer its health check: stopping (it finishes its requests "
                "in flight first, 60 s at most) or hung - wait for it to exit, or stop it "
                "(kill PID), then run `ecstore cluster up` again")
        raise BadRequest(f"a cluster is already running from {cluster.dir} (every node is up: "
                         f"{', '.join(running)}); `ecstore cluster down --data DIR` first")
    err.print(f"{len(running)} nodes running; starting {', '.join(down)}")
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        raise EcstoreError(f"could not start {', '.join(down)}: {exc}") from None
    err.print(f"started {', '.join(down)}; every node of {cluster.path} is up")
    return 0


def cmd_cluster_down(a: argparse.Namespace) -> int:
    from cli.localcluster import LocalCluster

    cluster = LocalCluster.load(Path(a.data))   # BadRequest when there is none
    running = cluster.running()
    cluster.stop()
    err.print(f"stopped {len(running)} nodes")
    return 0


# ---- commands that talk to the cluster ---------------------------------------------------
def with_client(fn: Callable[[Client, argparse.Namespace], Awaitable[int]],
                no_map_exit: int | None = None) -> Callable[[argparse.Namespace], int]:
    """Run `fn` with a client holding the cluster map; `no_map_exit`: when no control node
    answers with one, say so and exit with this code instead of failing (status: 3)."""
    def run(a: argparse.Namespace) -> int:
        async def go() -> int:
            c = Client(ClusterInfo.load(a.cluster))
            try:
                try:
                    await c.cluster_map()
                except (Unavailable, Unauthorized) as exc:
                    if no_map_exit is None:
                        raise
                    err.print(f"error: {exc.message}" + (
                        " - every control node is down or unreachable"
                        if isinstance(exc, Unavailable) else ""), highlight=False)
                    if getattr(a, "json", False):   # a script still gets JSON
                        print(json.dumps({"epoch": None, "nodes": [], "error": exc.message}))
                    return no_map_exit
                return await fn(c, a)
            finally:
                await c.close()
        return asyncio.run(go())
    return run


STATE_STYLES = {"up": "[green]up[/]", "degraded": "[yellow]degraded[/]", "down": "[red]down[/]"}


EMPTY_NODE_NOTE_MIN = 16   # fragments another node of the tier holds for an empty one to be noted
# a control node holding under 1/8 of the records the fullest one holds (once that one holds
# 64 or more: RocksDB's count is an estimate; records are spread by key, three copies each,
# so every node of the ring holds about the same share)
EMPTY_CONTROL_NOTE_MIN = 64
EMPTY_CONTROL_NOTE_RATIO = 8


def empty_node_notes(rows: list[dict[str, Any]]) -> list[str]:
    """A storage node that answers with no fragment while another of its tier holds at
    least EMPTY_NODE_NOTE_MIN: it came back on a new disk, or was added and not
    rebalanced - either way it is `up`, and the objects it should hold a fragment of are
    one loss less safe until repair (or the rebalance) puts them there. The same of a
    control node holding far fewer records than the fullest (EMPTY_CONTROL_NOTE_*): its
    database came back empty. A hint, not a state: the exit code is not changed by it."""
    notes = []
    storage = [r for r in rows if r["role"] == "storage" and isinstance(r.get("fragments"), int)]
    for r in storage:
        peers = [p for p in storage if p["tier"] == r["tier"] and p is not r]
        fullest = max(peers, key=lambda p: int(p["fragments"]), default=None)
        if r["fragments"] == 0 and fullest is not None \
                and fullest["fragments"] >= EMPTY_NODE_NOTE_MIN:
            notes.append(f"{r['id']} holds no fragments while {fullest['id']} (tier "
                         f"{r['tier']}) holds {fullest['fragments']}: its disk replaced, or "
                         "added without `ecstore rebalance`? `ecstore repair --dry-run` says "
                         "what is missing, `ecstore repair` rebuilds it")
    control = [r for r in rows if r["role"] == "control" and isinstance(r.get("records"), int)]
    fullest = max(control, key=lambda p: int(p["records"]), default=None)
    for r in control:
        if fullest is not None and fullest["records"] >= EMPTY_CONTROL_NOTE_MIN \
                and r["records"] * EMPTY_CONTROL_NOTE_RATIO < fullest["records"]:
            notes.append(f"{r['id']} holds about {r['records']} metadata records while "
                         f"{fullest['id']} holds about {fullest['records']}: its disk "
                         "replaced, or down while others were written? `ecstore repair` puts "
                         "back every record it should hold (until then each of those has "
                         "one copy less)")
    return notes


SLOW_ANSWER_NOTE_MS = 1000.0   # a node answering status this slowly ...
SLOW_ANSWER_RATIO = 5.0        # ... and this many times slower than the others' median is noted


def slow_node_notes(rows: list[dict[str, Any]]) -> list[str]:
    """A node that answers status, but SLOW_ANSWER_NOTE_MS or more late and many times
    slower than the others: a slow or lossy link, an overloaded host, a disk slow to give
    its statistics - it showed `up` like the rest (a bad-network sweep: 500 ms of latency,
    30% loss or a 10 Mbit link on one node all said nothing). A hint, not a state."""
    timed = [r for r in rows if isinstance(r.get("answered_ms"), (int, float))]
    notes = []
    for r in timed:
        others = sorted(float(p["answered_ms"]) for p in timed if p is not r)
        if not others:
            continue
        median = others[len(others) // 2]
        if r["answered_ms"] >= SLOW_ANSWER_NOTE_MS and r["answered_ms"] >= SLOW_ANSWER_RATIO * median:
            notes.append(f"{r['id']} answered in {r['answered_ms']:.0f} ms, the others in "
                         f"{median:.0f} ms (median): a slow or lossy link, an overloaded host or "
                         "a slow disk? Reads go around it; puts wait for it when no other node "
                         "can take its fragments")
    return notes


ROLE_ORDER = {"control": 0, "storage": 1, "gateway": 2}


def status_order(row: dict[str, Any]) -> tuple[int, list[tuple[int, str]]]:
    """Control nodes, storage nodes, the gateway; ids in natural order within a role (s3
    before s10: they came in the map's order, s10 before s3)."""
    parts = [(int(t), "") if t.isdigit() else (-1, t)
             for t in re.split(r"(\d+)", str(row["id"])) if t]
    return ROLE_ORDER.get(row["role"], 3), parts


async def cmd_status(c: Client, a: argparse.Namespace) -> int:
    """Every node's state; exit 3 when one is down or degraded (a full disk, a database
    that refuses writes), each problem named under the table; a storage node that came
    back empty is noted (empty_node_notes)."""
    rows = sorted(await c.node_status(), key=status_order)
    cmap = await c.cluster_map()
    code = 0 if all(r["state"] == "up" for r in rows) else 3
    notes = empty_node_notes(rows) + slow_node_notes(rows)
    if a.json:
        print(json.dumps({"epoch": cmap.epoch, "nodes": rows, "notes": notes}, indent=2))
        return code
    t = Table(title=f"ecstore cluster, map epoch {cmap.epoch}", box=None)
    for col in ("node", "role", "zone", "tier", "state", "fragments", "bytes", "disk free", "epoch"):
        t.add_column(col, no_wrap=True,
                     justify="right" if col in ("fragments", "bytes", "disk free") else "left")
    for r in rows:
        t.add_row(r["id"], r["role"], r["zone"], r["tier"], STATE_STYLES[r["state"]],
                  str(r.get("fragments", "")) if r["role"] == "storage" else "",
                  human(r.get("bytes", r.get("db_bytes"))), human(r.get("disk_free_bytes")),
                  str(r.get("epoch", "")))
    out.print(t)
    for r in rows:
        if r["state"] == "down":
            out.print(f"{r['id']} down: {r.get('error') or 'no answer'}", highlight=False,
                      markup=False)
        for problem in r.get("problems") or ():
            out.print(f"{r['id']} degraded: {problem}", highlight=False, markup=False)
    for note in notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    return code


async def cmd_scrub(c: Client, a: argparse.Namespace) -> int:
    """POST /v1/scrub to one storage node, or to each in turn; a full pass on each."""
    from store.errors import NotFound

    cmap = await c.cluster_map()
    if a.node:
        try:
            nodes = [cmap.storage_node(a.node)]
        except KeyError:
            known = ", ".join(n.id for n in cmap.all_storage_nodes())
            raise NotFound(f"no storage node {a.node!r} in the cluster map "
                           f"(storage nodes: {known})") from None
    else:
        nodes = list(cmap.all_storage_nodes())
    results: list[dict[str, Any]] = []
    for node in nodes:
        if not a.json:
            err.print(f"scrubbing {node.id} ({node.address})", highlight=False)
        try:
            # a stalled node answers nothing, and the pass below may rightly take an hour:
            # ask first whether it answers at all
            await c.t.request("GET", node.address, "/v1/status", timeout_s=5.0)
            reply = await c.t.request("POST", node.address, "/v1/scrub", timeout_s=3600)
        except EcstoreError as exc:
            if a.node:
                raise
            results.append({"node": node.id, "error": exc.message})
            if not a.json:
                err.print(f"[red]error:[/] {node.id}: {exc.message}", highlight=False)
            continue
        r = {"node": node.id, **json.loads(reply.body)}
        results.append(r)
        if not a.json:
            out.print(f"{node.id}: checked {r['checked']} fragments "
                      f"({human(r['bytes_checked'])}), {len(r['corrupt'])} corrupt",
                      highlight=False)
            for fid in r["corrupt"]:
                out.print(f"  quarantined {fid}", highlight=False)
    if a.json:
        print(json.dumps({"nodes": results}, indent=2))
    # corrupt fragments quarantined are for `ecstore repair` to rebuild: not a clean pass
    return 1 if any("error" in r or r.get("corrupt") for r in results) else 0


def human(n: int | None) -> str:
    if n is None:
        return ""
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if f < 1024 or unit == "TiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return str(n)


async def cmd_mb(c: Client, a: argparse.Namespace) -> int:
    await c.create_bucket(a.bucket, **({"policy": a.policy} if a.policy else {}))
    err.print(f"created bucket {a.bucket}" + (f" (policy {a.policy})" if a.policy else ""))
    return 0


async def cmd_rb(c: Client, a: argparse.Namespace) -> int:
    await c.delete_bucket(a.bucket)
    err.print(f"deleted bucket {a.bucket}")
    return 0


async def _file_chunks(f: Any, progress: Progress | None, task: Any) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    while True:
        chunk = await loop.run_in_executor(None, f.read, READ_CHUNK_BYTES)
        if not chunk:
            return
        if progress is not None:
            progress.advance(task, len(chunk))
        yield chunk


def _progress() -> Progress:
    return Progress("{task.description}", BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), console=err, transient=True)


async def cmd_put(c: Client, a: argparse.Namespace) -> int:
    bucket, key = split_path(a.path)
    options: dict[str, Any] = {"content_type": a.content_type, "cache": not a.uncached}
    if a.file == "-":
        info = await c.put(bucket, key, _file_chunks(sys.stdin.buffer, None, None), **options)
    else:
        try:
            f = open(a.file, "rb")
        except OSError as exc:
            raise BadRequest(f"cannot read {a.file}: {exc.strerror}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            show = size >= PROGRESS_MIN_BYTES and err.is_terminal
            progress = _progress() if show else None
            if progress is not None:
                with progress:
                    task = progress.add_task(f"put {key}", total=size)
                    info = await c.put(bucket, key, _file_chunks(f, progress, task), **options)
            else:
                info = await c.put(bucket, key, _file_chunks(f, None, None), **options)
    err.print(f"put {bucket}/{key}: {info.size} bytes, version {info.version_id}")
    return 0


class LocalFailure(EcstoreError):
    """A local file could not be written (a full disk, an I/O error): exit 1."""


async def cmd_get(c: Client, a: argparse.Namespace) -> int:
    bucket, key = split_path(a.path)
    start, end = parse_range(a.range) if a.range is not None else (None, None)
    if a.file == "-":
        async for part in c.get_stream(bucket, key, start, end):
            sys.stdout.buffer.write(part)
        sys.stdout.buffer.flush()
        return 0
    target = output_path(a.file, key)
    info = await c.head(bucket, key)
    tmp = target.with_name(target.name + ".ecstore-partial")
    progress = _progress() if info.size >= PROGRESS_MIN_BYTES and err.is_terminal else None
    try:
        with open_for_writing(tmp) as f:
            if progress is not None:
                progress.start()
                task = progress.add_task(f"get {key}", total=info.size)
            try:
                async for part in c.get_stream(bucket, key, start, end):
                    f.write(part)
                    if progress is not None:
                        progress.advance(task, len(part))
            finally:
                if progress is not None:
                    progress.stop()
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)     # no half file left behind
        if isinstance(exc, OSError):
            raise LocalFailure(f"cannot write {target}: {exc.strerror or exc}") from None
        raise
    return 0


def output_path(file: str, key: str) -> Path:
    """Where `get` writes: FILE, or FILE/<the key's last name> when FILE is a directory
    (as cp does); BadRequest when that cannot be written."""
    target = Path(file)
    if target.is_dir():
        name = key.rstrip("/").rpartition("/")[2]
        if not name or name in (".", ".."):
            raise BadRequest(f"{file} is a directory and {key!r} names no file in it: "
                             "give a file name")
        target = target / name
        if target.is_dir():
            raise BadRequest(f"{target} is a directory: give a file name")
    if not target.parent.is_dir():
        raise BadRequest(f"cannot write {file}: directory {target.parent} does not exist")
    return target


def open_for_writing(path: Path) -> BinaryIO:
    try:
        return open(path, "wb")
    except OSError as exc:
        raise BadRequest(f"cannot write {path}: {exc.strerror or exc}") from None


RANGE_RE = re.compile(r"([0-9]+)-([0-9]*)|-([0-9]+)", re.ASCII)


def parse_range(text: str) -> tuple[int | None, int | None]:
    """'A-B', 'A-' or '-N' (last N bytes), inclusive like HTTP; ASCII digits only."""
    m = RANGE_RE.fullmatch(text)
    if m is None:
        raise BadRequest(f"range must look like A-B, A- or -N (bytes, inclusive), got {text!r}")
    if m[3] is not None:
        return None, int(m[3])
    start, end = int(m[1]), (int(m[2]) if m[2] else None)
    if end is not None and end < start:
        raise BadRequest(f"range {text}: the end is before the start")
    return start, end


async def cmd_head(c: Client, a: argparse.Namespace) -> int:
    bucket, key = split_path(a.path)
    info = await c.head(bucket, key)
    d = info_dict(info)
    if a.json:
        print(json.dumps(d, indent=2))
    else:
        for k, v in d.items():
            out.print(f"{k:>14}: {v}")
    return 0


def info_dict(info: ObjectInfo) -> dict[str, Any]:
    return {"bucket": info.bucket, "key": info.key, "size": info.size,
            "version_id": info.version_id,
            "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info.ts / 1e9)),
            "content_type": info.content_type, "policy": info.policy or "inline",
            "inline": info.inline, "meta": info.meta}


async def cmd_ls(c: Client, a: argparse.Namespace) -> int:
    if not a.path:
        buckets = await c.list_buckets()
        if a.json:
            print(json.dumps({"buckets": buckets}))
        else:
            for b in buckets:
                out.print(b)
        return 0
    bucket, _, prefix = a.path.partition("/")
    delimiter = "" if a.recursive else "/"
    objects, prefixes, count, more, last = [], [], 0, False, ""
    async for page in c.list_all(bucket, prefix, delimiter):
        # the first --max-keys entries in key order, prefixes and objects alike
        entries = sorted([(p, None) for p in page.common_prefixes]
                         + [(o.key, o) for o in page.objects], key=lambda e: e[0])
        if a.max_keys:
            more = len(entries) > a.max_keys - count
            entries = entries[:a.max_keys - count]
        prefixes += [name for name, o in entries if o is None]
        objects += [o for _, o in entries if o is not None]
        count += len(entries)
        last = entries[-1][0] if entries else last
        if a.max_keys and count >= a.max_keys:
            more = more or page.truncated
            break
    if a.json:   # truncated: --max-keys cut the listing (a script could not tell)
        print(json.dumps({"prefixes": prefixes, "objects": [
            {"key": o.key, "size": o.size, "version_id": o.version_id, "ts": o.ts}
            for o in objects], "truncated": more,
            **({"last_key": last} if more else {})}, indent=2))
        return 0
    for p in prefixes:
        out.print(f"{'PRE':>12}  {p}", highlight=False)
    for o in objects:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(o.ts / 1e9))
        out.print(f"{o.size:>12}  {when}  {o.key}", highlight=False)
    if more:
        err.print(f"(the first {count} shown: --max-keys; more follow {last!r})",
                  highlight=False, markup=False)
    return 0


async def cmd_rm(c: Client, a: argparse.Namespace) -> int:
    bucket, key = split_path(a.path)
    await c.delete(bucket, key)
    err.print(f"deleted {bucket}/{key}")
    return 0


async def drive(worker: Any, label: str, status: Callable[[], str], show: bool,
                total: int | None = None, op: str | None = None,
                last: bool = True) -> OpsProgress | None:
    """Step a worker (repair, rebalance, gc, tier) to its end, with a progress bar on a
    terminal, and publish its progress for the control nodes' /metrics (OpsProgress;
    `op` defaults to the label's first word, "tiering" is "tier"; not for a dry run).
    `last=False`: the command goes on after this worker (rebalance's passes and metadata
    move), so its last report still says "running"; the command reports its end with the
    OpsProgress returned. A worker that raises reports "failed"."""
    total = worker.remaining if total is None else total
    op = op or {"tiering": "tier"}.get(label.split()[0], label.split()[0])
    report = None if getattr(worker, "dry_run", False) else OpsProgress(worker.c, op)
    try:
        with Progress("{task.description}", BarColumn(), "{task.completed}/{task.total}",
                      console=err, transient=True, disable=not show) as progress:
            task = progress.add_task(label, total=total)
            if report is not None:
                report.tick(0, total)
            while await worker.step():
                progress.update(task, completed=total - worker.remaining, description=status())
                if report is not None:
                    report.tick(total - worker.remaining, worker.remaining)
    except BaseException:
        if report is not None:
            await report.finish(total - worker.remaining, worker.remaining, FAILED)
        raise
    if report is not None:
        report.final = (total - worker.remaining, worker.remaining)
        await report.finish(*report.final, FINISHED if last else RUNNING)
    return report


RUNNING, FINISHED, FAILED = "running", "finished", "failed"   # an OpsProgress record's state


class OpsProgress:
    """A CLI worker's progress, written every OPS_PUBLISH_INTERVAL_S as the record
    {"op", "done", "remaining", "rate_per_s", "updated", "state", "finished"} at key `op` of
    the "_ops" namespace; the control nodes holding it export it as ecstore_op_* gauges.
    `state` is RUNNING until the command's end reports FINISHED (`finished` 1) or FAILED:
    a run killed meanwhile is left RUNNING with an old `updated`. Best effort: a write
    runs in the background and a failed one is skipped, so it never slows or fails the
    worker."""

    def __init__(self, c: Client, op: str) -> None:
        assert op in WORKER_OPS, op
        self.c, self.op = c, op
        self.started = self.last_at = time.monotonic()
        self.last_done = 0
        self.next_at = 0.0
        self.pending: asyncio.Future[None] | None = None
        self.final = (0, 0)    # (done, remaining) when the worker stopped (drive)

    def tick(self, done: int, remaining: int) -> None:
        now = time.monotonic()
        if now < self.next_at or (self.pending is not None and not self.pending.done()):
            return
        rate = (done - self.last_done) / (now - self.last_at) if now > self.last_at else 0.0
        self.last_done, self.last_at, self.next_at = done, now, now + OPS_PUBLISH_INTERVAL_S
        self.pending = asyncio.ensure_future(self._publish(done, remaining, rate))

    async def end(self, exit_code: int) -> None:
        """The command's end, as its exit code says: FINISHED for 0, else FAILED (a run
        that exits 1 - something failed, a node unlisted - showed "finished" on the
        status page and in ecstore_op_finished until the thirty-first session)."""
        await self.finish(*self.final, FINISHED if exit_code == 0 else FAILED)

    async def finish(self, done: int, remaining: int, state: str = FINISHED) -> None:
        """The last record (the whole run's rate), waited for a few seconds at most."""
        if self.pending is not None:
            await asyncio.wait([self.pending], timeout=OPS_FINAL_TIMEOUT_S)
        elapsed = time.monotonic() - self.started
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                self._publish(done, remaining, done / elapsed if elapsed else 0.0, state),
                OPS_FINAL_TIMEOUT_S)

    async def _publish(self, done: int, remaining: int, rate: float,
                       state: str = RUNNING) -> None:
        record = {"ts": time.time_ns(), "version_id": new_version_id(), "deleted": False,
                  "op": self.op, "done": done, "remaining": remaining,
                  "rate_per_s": round(rate, 3), "updated": time.time(),
                  "state": state, "finished": int(state == FINISHED)}
        with contextlib.suppress(EcstoreError):
            await self.c.commit(OPS_BUCKET, self.op, record)


def report_table(title: str, rows: list[tuple[str, object]], errors: list[str]) -> None:
    """A worker's summary as a two-column table, then its errors as warnings."""
    t = Table(title=title, box=None)
    t.add_column("")
    t.add_column("count", justify="right")
    for name, value in rows:
        t.add_row(name, str(value))
    out.print(t)
    for e in errors:
        err.print(f"[yellow]warning:[/] {e}", highlight=False)


async def cmd_repair(c: Client, a: argparse.Namespace) -> int:
    from store.cluster import state_path
    from store.workers import only_one

    state = state_path(a.cluster, "repair.state.json")
    with only_one(state, "repair") if not a.dry_run else contextlib.nullcontext():
        return await _repair(c, a, state)


async def _repair(c: Client, a: argparse.Namespace, state: Path) -> int:
    from store.repair import prepare_repair

    if a.restart:
        state.unlink(missing_ok=True)
    # the metadata replicas first: the fragment pass's record reads repair the replicas
    # they read on the way (read repair), which this report would then not count
    metadata = await _repair_replicas(c, a.dry_run)
    err.print("reading metadata and fragment listings ...")
    worker = await prepare_repair(c, a.dry_run, a.rate, state)
    if worker.skipped:
        err.print(f"resuming: {worker.skipped} objects were done by an earlier run")
    r = worker.report
    ops = await drive(worker, "repair" + (" (dry run)" if a.dry_run else ""),
                      lambda: f"repair: {r.fragments_rebuilt} rebuilt, {human(r.bytes_rebuilt)}",
                      err.is_terminal and not a.json, last=False)
    try:
        code = await _repair_report(c, a, worker, metadata)
    except BaseException:
        if ops is not None:
            await ops.end(1)
        raise
    if ops is not None:
        await ops.end(code)
    return code


async def _repair_report(c: Client, a: argparse.Namespace, worker: Any,
                         metadata: dict[str, Any]) -> int:
    """repair's end: its report printed; the exit code."""
    from store.repair import tell_repaired
    worker.report.seconds = time.monotonic() - worker.limiter.start
    worker.finish()
    await tell_repaired(c, worker)
    rep = worker.report.to_dict()
    rep["metadata"] = metadata
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        names = ("objects_checked", "segments_damaged", "fragments_missing",
                 "fragments_rebuilt", "failed")
        report_table("repair" + (" (dry run: nothing written)" if a.dry_run else ""),
                     [(n.replace("_", " "), rep[n]) for n in names]
                     + [("bytes rebuilt", human(rep["bytes_rebuilt"])),
                        ("unrecoverable objects" if not rep["unlisted"] else
                         "unrecoverable objects while nodes are unlisted",
                         len(rep["unrecoverable"])),
                        ("metadata records checked", rep["metadata"]["records_checked"]),
                        ("metadata replicas to copy" if a.dry_run else "metadata replicas copied",
                         rep["metadata"]["copied"]),
                        ("metadata failed", rep["metadata"]["failed"])],
                     rep["metadata"]["errors"])
        for node_id, volumes in sorted(rep["damage_cleared"].items()):
            out.print(f"{node_id}: rewriting {', '.join(volumes)} without the damaged bytes "
                      "its status named (what they held is rebuilt)", highlight=False)
        for name in rep["unrecoverable"]:   # with nodes unlisted: maybe only for now
            out.print(f"[red]unrecoverable:[/] {name}" if not rep["unlisted"] else
                      f"[red]unrecoverable now:[/] {name} (fragments it lacks may be on the "
                      "nodes that did not answer)", highlight=False)
        for e in rep["errors"]:
            err.print(f"[yellow]warning:[/] {e}", highlight=False)
    if rep["unlisted"]:     # a cluster failure: what they hold was not checked
        down = ", ".join(rep["unlisted"])
        err.print(f"incomplete: storage node{'s' if len(rep['unlisted']) > 1 else ''} {down} "
                  "did not answer: the fragments the map places there were not checked or "
                  "rebuilt. Start them and run `ecstore repair` again; for a node gone for "
                  "good, take it out of the map (`ecstore ring remove`, or `cluster "
                  "remove-node`) and repair rebuilds what it held", highlight=False)
    return 1 if (rep["unrecoverable"] or rep["failed"] or rep["unlisted"]
                 or rep["metadata"]["failed"]) else 0


async def _repair_replicas(c: Client, dry_run: bool) -> dict[str, Any]:
    """repair's first half: every metadata record onto each of its replicas (a control
    node whose disk was replaced comes back empty). A control node down: not checked."""
    from store.metamove import ReplicaReport, repair_replicas
    err.print("checking every metadata record's replicas ...")
    try:
        return (await repair_replicas(c, dry_run)).to_dict()
    except Unavailable as exc:
        return ReplicaReport(failed=1, errors=[f"metadata replicas not checked: {exc.message}"]
                             ).to_dict()


# ---- parser ---------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ecstore", description="erasure-coded object store")
    p.add_argument("--cluster", help="cluster.json (default $ECSTORE_CLUSTER, else "
                   "./.ecstore/cluster.json; if neither exists, $ECSTORE_CONTROL and "
                   "$ECSTORE_SECRET, as in the containers)")
    sub = p.add_subparsers(dest="command", required=True)

    cl = sub.add_parser("cluster", help="start and stop a local cluster")
    clsub = cl.add_subparsers(dest="cluster_command", required=True)
    up = clsub.add_parser("up", help="start a local cluster on 127.0.0.1")
    up.add_argument("--data", default=".ecstore", help="data directory (default .ecstore)")
    up.add_argument("--storage", type=int, default=6, help="storage nodes (default 6)")
    up.add_argument("--control", type=int, default=3, help="control nodes (default 3)")
    up.add_argument("--k", type=int, default=4, help="data fragments per segment (default 4)")
    up.add_argument("--m", type=int, default=2, help="parity fragments (default 2)")
    up.add_argument("--cold", type=int, default=0, metavar="N",
                    help="also start N cold-tier storage nodes (policy cold; default 0)")
    up.add_argument("--cold-k", type=int, default=8, help="cold policy data fragments (default 8)")
    up.add_argument("--cold-m", type=int, default=3, help="cold policy parity fragments (default 3)")
    up.add_argument("--detach", action="store_true", help="return once all nodes are healthy")
    up.add_argument("--no-fsync", action="store_true", help="skip fsync (faster, unsafe)")
    up.add_argument("--no-gateway", action="store_true", help="do not start the S3 gateway")
    up.set_defaults(func=cmd_cluster_up)
    down = clsub.add_parser("down", help="stop a detached local cluster")
    down.add_argument("--data", default=".ecstore")
    down.set_defaults(func=cmd_cluster_down)
    from cli import ops
    ops.register_cluster(clsub)
    __import__("cli.bootstrap").bootstrap.register_cluster(clsub)

    st = sub.add_parser("status", help="every node: up or down, fragments, bytes, epoch")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=with_client(cmd_status, no_map_exit=3))
    sc = sub.add_parser("scrub", help="check every fragment of a storage node now, "
                        "quarantine corrupt ones")
    sc.add_argument("--node", help="storage node id (default: every storage node in turn)")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=with_client(cmd_scrub))
    for name, fn, helptext in (("mb", cmd_mb, "make a bucket"), ("rb", cmd_rb, "remove an empty bucket")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("bucket")
        if name == "mb":
            sp.add_argument("--policy", help="default storage policy of the bucket's objects "
                            "(e.g. hot or cold; default: the map's default)")
        sp.set_defaults(func=with_client(fn))
    put = sub.add_parser("put", help="store FILE (or stdin) as BUCKET/KEY")
    put.add_argument("path", metavar="BUCKET/KEY")
    put.add_argument("file", nargs="?", default="-", help="file to upload, - for stdin")
    put.add_argument("--content-type", default="application/octet-stream")
    put.add_argument("--uncached", action="store_true",
                     help="the storage nodes write it without keeping it in their page "
                     "cache (a backup, an archive: nobody reads it soon; Linux 6.14+)")
    put.set_defaults(func=with_client(cmd_put))
    get = sub.add_parser("get", help="write BUCKET/KEY to FILE (or stdout)")
    get.add_argument("path", metavar="BUCKET/KEY")
    get.add_argument("file", nargs="?", default="-", help="output file, - for stdout")
    get.add_argument("--range", help="bytes A-B, A- or -N (inclusive)")
    get.set_defaults(func=with_client(cmd_get))
    head = sub.add_parser("head", help="show an object's size, version and metadata")
    head.add_argument("path", metavar="BUCKET/KEY")
    head.add_argument("--json", action="store_true")
    head.set_defaults(func=with_client(cmd_head))
    ls = sub.add_parser("ls", help="list buckets, or keys under BUCKET[/PREFIX]")
    ls.add_argument("path", nargs="?", metavar="BUCKET[/PREFIX]")
    ls.add_argument("-r", "--recursive", action="store_true", help="no '/' grouping")
    ls.add_argument("--max-keys", type=count, default=0, help="show at most this many entries")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=with_client(cmd_ls))
    rm = sub.add_parser("rm", help="delete BUCKET/KEY")
    rm.add_argument("path", metavar="BUCKET/KEY")
    rm.set_defaults(func=with_client(cmd_rm))
    from cli import ops
    ops.register(sub, with_client)
    rp = sub.add_parser("repair", help="rebuild missing or corrupt fragments from any k others")
    rp.add_argument("--dry-run", action="store_true", help="report what is missing, write nothing")
    rp.add_argument("--rate", type=non_negative, default=0.0, metavar="MB/s",
                    help="limit rebuilt bytes written per second (default: no limit)")
    rp.add_argument("--restart", action="store_true", help="ignore a saved position, start over")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=with_client(cmd_repair))
    __import__("cli.gc_cmd").gc_cmd.register(sub)
    __import__("cli.keys_cmd").keys_cmd.register(sub)
    __import__("cli.tier_cmd").tier_cmd.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return int(a.func(a))
    except EcstoreError as exc:
        err.print(f"[red]error:[/] {exc.message}", highlight=False)
        if getattr(a, "json", False):   # a script reading stdout still gets JSON
            print(json.dumps(exc.to_body(), indent=2, default=str))
        return 2 if exc.status < 500 else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:    # a bug: its traceback for the report, and JSON still JSON
        traceback.print_exc()
        err.print(f"[red]error:[/] internal error ({type(exc).__name__}: {exc}); this is a "
                  "bug in ecstore - please report the traceback above", highlight=False)
        if getattr(a, "json", False):
            print(json.dumps({"error": "internal", "message": f"{type(exc).__name__}: {exc}"},
                             indent=2))
        return 1


if __name__ == "__main__":
    sys.exit(main())
