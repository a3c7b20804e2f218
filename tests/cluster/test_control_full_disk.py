"""A control node whose disk fills up: it refuses metadata writes with 507 and a JSON
error body (as a full storage node refuses fragments), keeps answering reads, says so in
its status, health, metrics and `ecstore status` (degraded, exit 3), and takes writes
again once space is freed - without a restart, although RocksDB's error after a failed
write is sticky. The client's quorum writes go on with one of three control nodes full
and fail clearly, acknowledging nothing, with two. The full disks are real small
filesystems (tmpfs with a size limit) mounted on the control nodes' data directories."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from cli.localcluster import LocalCluster, free_port, signed_request
from node.metadb import GroupCommit, MetaDB
from store.client import SyncClient
from store.errors import InsufficientStorage, NotFound, Unavailable
from store.wire import pack, unpack
from tests.cluster.conftest import wait_for
from tests.cluster.tmpfs import MiB, fill, free_bytes, mount_tmpfs, tmpfs_disk, unmount

ROOT = Path(__file__).resolve().parents[2]
DISK_MIB = 16
SLACK_BYTES = 8192          # left free: RocksDB's own write is what finds the disk full
PADDING_BYTES = 64 * 1024   # a record this large cannot fit in that slack
FULL = ("c1", "c2")         # the control nodes on small disks


@pytest.fixture(scope="module")
def small_disks() -> Iterator[LocalCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-ctlfull-"))
    c = LocalCluster.create(tmp, storage=6, control=3, k=4, m=2, gateway=False)
    disks = [Path(c.nodes[n].data) for n in FULL]
    mounted = []
    old = os.environ.get("ECSTORE_CONTROL_RESERVE_MB")
    try:
        for disk in disks:
            why = mount_tmpfs(disk, DISK_MIB)
            if why is not None:
                pytest.skip(why)
            mounted.append(disk)
        # no reserve: the disk fills under RocksDB's own writes, the failure whose
        # error RocksDB keeps (a reserve refuses before it: test_metadb_* below)
        os.environ["ECSTORE_CONTROL_RESERVE_MB"] = "0"
        c.start()
        yield c
    finally:
        if old is None:
            os.environ.pop("ECSTORE_CONTROL_RESERVE_MB", None)
        else:
            os.environ["ECSTORE_CONTROL_RESERVE_MB"] = old
        c.stop()
        for disk in mounted:
            unmount(disk)
        shutil.rmtree(tmp, ignore_errors=True)


def _record(**extra: Any) -> bytes:
    return pack({"ts": time.time_ns(), "version_id": f"v{time.time_ns()}", "deleted": False,
                 **extra})


def _call(c: LocalCluster, node: str, method: str, path: str, body: bytes = b""
          ) -> tuple[int, bytes]:
    """(status, body) of one signed request to a node."""
    try:
        return 200, signed_request(c.secret, method, c.nodes[node].url, path, body)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _put_record(c: LocalCluster, node: str, key: str, padding: int = 0) -> tuple[int, bytes]:
    return _call(c, node, "PUT", f"/v1/objects/cfull/{key}",
                 _record(pad=os.urandom(padding)) if padding else _record())


def _trip(c: LocalCluster, node: str) -> None:
    """Fill the node's disk but SLACK_BYTES, then write a record too large for the
    slack straight to it: 507 with a JSON error body, not the 500 of an unhandled
    RocksDB error; RocksDB's error is then the one its status names."""
    fill(Path(c.nodes[node].data), SLACK_BYTES)
    status, body = _put_record(c, node, "trip", PADDING_BYTES)
    assert status == 507, (status, body)
    err = json.loads(body)
    assert err["error"] == "insufficient_storage" and "disk full" in err["message"], err
    assert _status(c, node)["db_error"], "RocksDB itself did not fail the write"


def _refusals_logged(c: LocalCluster, node: str) -> int:
    """Request lines of writes the node answered 507."""
    text = (c.dir / "logs" / f"{node}.log").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if "status=507" in ln and "request" in ln)


def _status(c: LocalCluster, node: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(signed_request(c.secret, "GET", c.nodes[node].url,
                                                      "/v1/status"))
    return value


def _health(c: LocalCluster, node: str) -> dict[str, Any]:
    with urllib.request.urlopen(c.nodes[node].url + "/v1/health", timeout=5) as r:
        value: dict[str, Any] = json.loads(r.read())
        return value


def _metrics(c: LocalCluster, node: str) -> dict[str, float]:
    text = signed_request(c.secret, "GET", c.nodes[node].url, "/metrics").decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("ecstore_control_")}


def _ecstore_status(c: LocalCluster) -> tuple[int, dict[str, Any], str]:
    """`ecstore status --json` and `ecstore status`: (exit code, JSON, table)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECSTORE_CLUSTER": str(c.path),
           "COLUMNS": "200"}
    runs = [subprocess.run([sys.executable, "-m", "cli.main", "status", *args],
                           capture_output=True, timeout=60, env=env) for args in (["--json"], [])]
    assert runs[0].returncode == runs[1].returncode
    return runs[0].returncode, json.loads(runs[0].stdout), runs[1].stdout.decode()


def _free_space(c: LocalCluster, node: str) -> None:
    (Path(c.nodes[node].data) / "filler").unlink()


def test_one_full_control_node_refuses_writes_with_507_serves_reads_and_recovers(
        small_disks: LocalCluster) -> None:
    c = small_disks
    pid = c.nodes["c1"].pid
    with SyncClient(c.path) as client:
        client.create_bucket("cfull")
        before = {f"b{i}": os.urandom(200 + i) for i in range(10)}
        for k, v in before.items():
            client.put("cfull", k, v)
        _trip(c, "c1")
        # still 507, not a 500 of RocksDB's sticky error, whatever the size
        assert _put_record(c, "c1", "again")[0] == 507
        # it keeps answering reads: a record it held before the disk filled
        status, raw = _call(c, "c1", "GET", "/v1/objects/cfull/b0")
        assert status == 200 and unpack(raw)["version_id"]
        # W=2 of 3: puts and overwrites go on through the other two
        during = {f"d{i}": os.urandom(300 + i) for i in range(10)}
        refused_before = _refusals_logged(c, "c1")
        started = time.monotonic()
        for k, v in {**during, "b0": b"overwritten"}.items():
            client.put("cfull", k, v)
        # ... and a client does not send c1 a write it will refuse for 2 s after a 507
        # (each put was refused and logged there: ~2 lines a put, a flood in a busy hour)
        time.sleep(0.5)     # INFO and WARNING lines alike are out within 0.2 s
        assert _refusals_logged(c, "c1") - refused_before <= 2 + (time.monotonic() - started) / 2
        for k, v in {**before, **during, "b0": b"overwritten"}.items():
            assert client.get("cfull", k) == v

        # what an operator sees: degraded, with why, disk free near 0, exit 3
        st = _status(c, "c1")
        assert st["writable"] is False and st["disk_free_bytes"] <= SLACK_BYTES
        assert st["disk_total_bytes"] == DISK_MIB * MiB
        # the database's files, not the filler beside them (it counted the whole directory)
        assert st["db_bytes"] < DISK_MIB * MiB // 2
        assert any("refuses writes" in p for p in st["problems"]), st["problems"]
        health = _health(c, "c1")
        assert health["ok"] is True and health["writable"] is False and health["problems"]
        m = _metrics(c, "c1")
        assert m["ecstore_control_db_writable"] == 0
        assert m["ecstore_control_disk_total_bytes"] == DISK_MIB * MiB
        assert m["ecstore_control_disk_free_bytes"] <= SLACK_BYTES
        assert m["ecstore_control_db_bytes"] < DISK_MIB * MiB // 2
        code, js, table = _ecstore_status(c)
        rows = {r["id"]: r for r in js["nodes"]}
        assert code == 3
        assert rows["c1"]["state"] == "degraded" and rows["c1"]["up"] is True
        assert rows["c1"]["disk_free_bytes"] <= SLACK_BYTES
        assert all(rows[n]["state"] == "up" for n in rows if n != "c1"), rows
        assert rows["c3"]["disk_total_bytes"] > 0 and rows["c3"]["disk_free_bytes"] > 0
        assert "degraded" in table and "c1 degraded: metadata database refuses writes" in table

        # space freed: writes come back on their own, the same process
        _free_space(c, "c1")
        wait_for(lambda: _put_record(c, "c1", "after", PADDING_BYTES)[0] == 200,
                 timeout_s=20, what="c1 to take writes again without a restart")
        assert c.nodes["c1"].pid == pid and _health(c, "c1")["pid"] == pid
        st = _status(c, "c1")
        assert st["writable"] is True and st["problems"] == [] and st["db_error"] is None
        assert _metrics(c, "c1")["ecstore_control_db_reopens_total"] == 1
        code, js, _ = _ecstore_status(c)
        assert code == 0 and {r["state"] for r in js["nodes"]} == {"up"}
        # what it held is all there, and it takes the quorum's writes again
        for k in before:
            assert _call(c, "c1", "GET", f"/v1/objects/cfull/{k}")[0] == 200
        client.put("cfull", "later", b"later")
        status, raw = _call(c, "c1", "GET", "/v1/objects/cfull/later")
        assert status == 200


def test_two_full_control_nodes_fail_puts_clearly_and_acknowledge_nothing(
        small_disks: LocalCluster) -> None:
    c = small_disks
    with SyncClient(c.path) as client:
        client.create_bucket("cfull2")
        client.put("cfull2", "kept", b"kept before")
        for node in FULL:
            _trip(c, node)
        failed = {}
        for i in range(5):
            with pytest.raises(Unavailable) as info:
                client.put("cfull2", f"refused{i}", b"x" * (100 + i))
            failed[f"refused{i}"] = b"x" * (100 + i)
        msg = info.value.message
        assert "1 of 3 control nodes answered, 2 needed" in msg, msg
        assert "c1: disk full" in msg and "c2: disk full" in msg, msg
        # reads go on: every control node answers them
        assert client.get("cfull2", "kept") == b"kept before"
        assert "kept" in [o.key for o in client.list("cfull2").objects]

        for node in FULL:
            _free_space(c, node)

        def put_works() -> bool:
            try:
                client.put("cfull2", "back", b"back")
                return True
            except Unavailable:
                return False
        wait_for(put_works, timeout_s=20, what="puts to work again once space is freed")
        assert client.get("cfull2", "back") == b"back"
        # a put that failed is absent or whole, never partial (its outcome was unknown)
        for k, v in failed.items():
            try:
                assert client.get("cfull2", k) == v
            except NotFound:
                pass


def test_metadb_refuses_writes_under_its_reserve_and_reopens_after_enospc(
        tmp_path: Path) -> None:
    """The database alone on a 4 MiB tmpfs: with a reserve, a write while less is free
    is refused (507) before RocksDB sees it, and RocksDB keeps taking writes once space
    is freed; without one, RocksDB's own ENOSPC makes every later write fail - reads
    go on - until GroupCommit.recover() reopens it once the disk takes writes again."""
    disk = tmp_path / "disk"

    async def go() -> None:
        db = MetaDB(disk / "db", sync=True, reserve_bytes=MiB)
        commit = GroupCommit(db)

        def put(k: bytes, v: bytes) -> Any:
            def fn(view: Any) -> None:
                view.put(k, v)
            return commit.apply(fn)
        try:
            await put(b"a", b"1")
            filler = fill(disk, MiB // 2)
            with pytest.raises(InsufficientStorage, match="disk full"):
                await put(b"b", b"2")
            assert db.failed is None and db.problems()      # refused by the reserve
            filler.unlink()
            await put(b"b", b"2")
            assert not db.problems()

            db.reserve_bytes = 0
            filler = fill(disk, SLACK_BYTES)
            with pytest.raises(InsufficientStorage):
                for i in range(64):
                    await put(b"big%d" % i, os.urandom(PADDING_BYTES))
            assert db.failed is not None
            assert db.db.get(b"a") == b"1"                  # reads go on
            assert not await commit.recover()               # the disk is still full
            filler.unlink()
            assert free_bytes(disk) > 2 * MiB
            with pytest.raises(InsufficientStorage):        # sticky until reopened
                await put(b"c", b"3")
            assert await commit.recover()
            await put(b"c", b"3")
            assert db.failed is None and db.reopens == 1
            assert db.db.get(b"a") == b"1" and db.db.get(b"c") == b"3"
        finally:
            await commit.drained()
            db.close()
    with tmpfs_disk(disk, 4):
        asyncio.run(go())


def test_metadb_opens_read_only_on_a_full_disk_and_reopens_for_writes(tmp_path: Path) -> None:
    """A control node restarted while its disk is full (a crash, an upgrade, a reboot):
    RocksDB cannot open for writing (it appends to its MANIFEST), so the node did not
    start at all and its replicas' reads were gone with it. It opens read-only now:
    reads go on, writes are refused with 507, and recover() reopens it for writes once
    the disk takes them again."""
    disk = tmp_path / "disk"

    async def go() -> None:
        db = MetaDB(disk / "db", sync=True, reserve_bytes=0)
        db.write({b"k%d" % i: os.urandom(1000) for i in range(500)}, True)
        db.close()
        filler = fill(disk, 0)
        db = MetaDB(disk / "db", sync=True, reserve_bytes=0)   # raised before: no node
        commit = GroupCommit(db)
        try:
            assert db.failed is not None and len(db.db.get(b"k7")) == 1000
            with pytest.raises(InsufficientStorage):
                db.write({b"new": b"1"}, True)
            assert not await commit.recover()       # still full
            filler.unlink()
            assert await commit.recover()
            db.write({b"new": b"1"}, True)
            assert db.failed is None and db.db.get(b"new") == b"1"
            assert len(db.db.get(b"k7")) == 1000
        finally:
            await commit.drained()
            db.close()
    with tmpfs_disk(disk, 8):
        asyncio.run(go())


def test_a_reopen_that_fails_leaves_the_database_serving_reads(tmp_path: Path) -> None:
    """recover() reopens a database that refuses writes once the disk takes a probe's
    writes; when RocksDB's own open for writing still fails (here its LOCK, held by
    another handle; in a real-EIO sweep, writes failing under db/ but not the probe's),
    the database stayed closed and every read answered 503 for as long as that lasted.
    It is opened read-only then: reads go on, writes are still refused."""
    async def go() -> None:
        db = MetaDB(tmp_path / "db", sync=True, reserve_bytes=0)
        commit = GroupCommit(db)
        db.write({b"a": b"1"}, True)
        db.failed, db.failed_at = "injected write failure", time.time()
        try:
            db.close()                          # as recover's detach leaves it
            holder = Rdict(str(tmp_path / "db"), Options(raw_mode=True))   # takes LOCK
            try:
                assert not await commit.recover()
                assert db.is_open and db.get_raw(b"a") == b"1"    # reads served
                with pytest.raises(Unavailable, match="stopped taking writes"):
                    db.write({b"b": b"2"}, True)
            finally:
                holder.close()
            assert await commit.recover()       # the lock is free: open for writing
            db.write({b"b": b"2"}, True)
            assert db.failed is None and db.get_raw(b"b") == b"2"
        finally:
            await commit.drained()
            db.close()
    asyncio.run(go())


def test_a_control_node_whose_database_cannot_open_says_so_in_one_line(tmp_path: Path) -> None:
    """A control node whose database cannot open (here its CURRENT file damaged; a sweep
    with real EIO: "Input/output error (os error 5)"): it exited with a traceback whose
    last line was rocksdict's error, naming nothing. Now one line names the node, the
    database and what to check, exit 1. (A read-only filesystem no longer stops it: it
    serves read-only, tests/cluster/test_readonly_disk.py.)"""
    disk = tmp_path / "disk"
    db = MetaDB(disk / "db", sync=True, reserve_bytes=0)
    db.write({b"a": b"1"}, True)
    db.close()
    (disk / "db" / "CURRENT").write_bytes(b"MANIFEST-999999")   # no newline, no such file
    proc = subprocess.run(
        [sys.executable, "-m", "node.control", "--id", "c9", "--data", str(disk),
         "--host", "127.0.0.1", "--port", str(free_port())],
        env={**os.environ, "ECSTORE_SECRET": "s" * 32}, capture_output=True, text=True,
        timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"control node c9: cannot open its metadata database {disk / 'db'}: " \
        in proc.stderr and "check its disk" in proc.stderr, proc.stderr
