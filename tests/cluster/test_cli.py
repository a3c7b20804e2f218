"""The `ecstore` console script against its own detached cluster, as a user runs it."""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster, pid_alive
from tests.cluster.uncached import skip_unless_uncached_writes, uncached_writes

ROOT = Path(__file__).resolve().parents[2]


def ecstore(*args: str, cwd: Path, stdin: bytes = b"", ok: bool = True) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, input=stdin,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if ok:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ecstore-cli-"))
    ecstore("cluster", "up", "--detach", "--storage", "5", "--control", "1", "--k", "3",
            "--m", "2", cwd=d)
    yield d
    ecstore("cluster", "down", cwd=d, ok=False)
    shutil.rmtree(d, ignore_errors=True)


def test_put_uncached_asks_every_node_of_the_object_for_an_uncached_write(workdir: Path) -> None:
    skip_unless_uncached_writes()
    cluster = LocalCluster.load(workdir / ".ecstore")
    ecstore("mb", "cli-uncached", cwd=workdir)
    (workdir / "cold.bin").write_bytes(os.urandom(1 << 20))
    before = uncached_writes(cluster)
    ecstore("put", "cli-uncached/warm", "cold.bin", cwd=workdir)
    assert uncached_writes(cluster) == before
    ecstore("put", "cli-uncached/cold", "cold.bin", "--uncached", cwd=workdir)
    assert uncached_writes(cluster) - before == 5          # k + m, one segment
    out = ecstore("get", "cli-uncached/cold", "-", cwd=workdir).stdout
    assert out == (workdir / "cold.bin").read_bytes()


def test_cluster_json_names_every_node(workdir: Path) -> None:
    data = json.loads((workdir / ".ecstore" / "cluster.json").read_text())
    assert len(data["secret"]) >= 32 and len(data["control"]) == 1
    assert sorted(n["role"] for n in data["nodes"]) == ["control", "gateway"] + ["storage"] * 5
    for n in data["nodes"]:
        assert {"id", "role", "url", "data", "pid"} <= n.keys() and n["pid"] > 0
    gw = data["gateway"]  # on by default, with one key pair
    assert gw["url"].startswith("http://127.0.0.1:") and len(gw["secret_key"]) >= 16
    assert gw["access_key"].isalnum() and gw["access_key"].isupper()


def test_a_nodes_data_is_for_its_own_user_only(workdir: Path) -> None:
    """Control nodes' RocksDB files hold the S3 secret keys, volumes the objects: they
    were 0644 in 0755 directories, readable by every local user (a security review)."""
    ecstore("mb", "private", cwd=workdir)
    ecstore("put", "private/k", "-", cwd=workdir, stdin=b"x" * 200_000)
    data = json.loads((workdir / ".ecstore" / "cluster.json").read_text())
    for n in data["nodes"]:
        if n["role"] == "gateway":
            continue
        root = Path(n["data"])
        assert stat.S_IMODE(root.stat().st_mode) == 0o700, n["id"]
        made = [p for p in root.rglob("*") if p.is_file()]
        assert made, n["id"]
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in made), \
            [(str(p), oct(p.stat().st_mode)) for p in made if p.stat().st_mode & 0o077]
    # the cluster's own directory, its logs (they name buckets and keys) and the gateway's
    # directory too: they were 0755 and 0644
    top = workdir / ".ecstore"
    for d in (top, top / "logs", Path(next(n["data"] for n in data["nodes"]
                                            if n["role"] == "gateway"))):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    logs = list((top / "logs").glob("*.log"))
    assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs), \
        [(str(p), oct(p.stat().st_mode)) for p in logs]


def test_put_get_ls_head_rm(workdir: Path) -> None:
    payload = os.urandom(9 * 1024 * 1024 + 7)
    (workdir / "in.bin").write_bytes(payload)
    ecstore("mb", "cli-bucket", cwd=workdir)
    ecstore("put", "cli-bucket/dir/in.bin", "in.bin", cwd=workdir)
    ecstore("put", "cli-bucket/dir/small", "-", stdin=b"from stdin", cwd=workdir)
    ecstore("get", "cli-bucket/dir/in.bin", "out.bin", cwd=workdir)
    assert (workdir / "out.bin").read_bytes() == payload
    assert ecstore("get", "cli-bucket/dir/small", cwd=workdir).stdout == b"from stdin"
    assert ecstore("get", "cli-bucket/dir/in.bin", "-", "--range", "5-9",
                   cwd=workdir).stdout == payload[5:10]
    listing = json.loads(ecstore("ls", "cli-bucket/dir/", "--json", cwd=workdir).stdout)
    assert [o["key"] for o in listing["objects"]] == ["dir/in.bin", "dir/small"]
    top = ecstore("ls", "cli-bucket", cwd=workdir).stdout.decode()
    assert "PRE" in top and "dir/" in top
    head = json.loads(ecstore("head", "cli-bucket/dir/in.bin", "--json", cwd=workdir).stdout)
    assert head["size"] == len(payload)
    ecstore("rm", "cli-bucket/dir/small", cwd=workdir)
    gone = ecstore("get", "cli-bucket/dir/small", cwd=workdir, ok=False)
    assert gone.returncode != 0 and b"no such object" in gone.stderr
    assert b"Traceback" not in gone.stderr


def test_status_json_and_table(workdir: Path, tmp_path: Path) -> None:
    status = json.loads(ecstore("status", "--json", cwd=workdir).stdout)
    assert status["epoch"] == 1 and len(status["nodes"]) == 7
    assert all(n["up"] for n in status["nodes"])
    assert [n["role"] for n in status["nodes"]].count("gateway") == 1
    table = ecstore("status", cwd=workdir).stdout.decode()
    assert "storage" in table and "gateway" in table and "up" in table
    # a wrong secret is said to be one: it read as every control node down
    control = next(n["url"] for n in status["nodes"] if n["role"] == "control")
    wrong = subprocess.run([sys.executable, "-m", "cli.main", "status"], cwd=tmp_path,
                           capture_output=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT),
                                "ECSTORE_CONTROL": control, "ECSTORE_SECRET": "wrong-secret"})
    said = " ".join(wrong.stderr.decode().split())
    assert wrong.returncode == 3 and "is not the one the nodes were started with" in said, said
    assert "down or unreachable" not in said and "Traceback" not in said
    wrong_json = subprocess.run([sys.executable, "-m", "cli.main", "status", "--json"],
                                cwd=tmp_path, capture_output=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(ROOT),
                                     "ECSTORE_CONTROL": control, "ECSTORE_SECRET": "wrong"})
    shape = json.loads(wrong_json.stdout)      # the shape of no control node answering
    assert wrong_json.returncode == 3 and (shape["epoch"], shape["nodes"]) == (None, [])
    assert "is not the one the nodes were started with" in shape["error"]


def test_errors_are_messages_not_tracebacks(workdir: Path) -> None:
    for args in (["mb", "Bad_Name"], ["get", "nokey"], ["put", "cli-bucket/x", "/no/such/file"],
                 ["--cluster", "/nonexistent.json", "ls"], ["get", "cli-bucket/x", "-", "--range", "zz"]):
        proc = ecstore(*args, cwd=workdir, ok=False)
        assert proc.returncode != 0, args
        assert b"Traceback" not in proc.stderr and b"error" in proc.stderr, (args, proc.stderr)


@pytest.mark.parametrize("sizes", [["--k", "0"], ["--k", "-1"], ["--k", "40", "--storage", "42"],
                                   ["--m", "0"], ["--storage", "5"],
                                   ["--cold", "11", "--cold-k", "0"]])
def test_up_refuses_sizes_no_map_takes_before_starting_anything(sizes: list[str],
                                                                tmp_path: Path) -> None:
    """One line and exit 2, no node started (--k 0 started every node, then failed with a
    traceback, exit 1, and left them running)."""
    proc = ecstore("cluster", "up", "--detach", "--data", str(tmp_path / "c"), *sizes,
                   cwd=tmp_path, ok=False)
    assert proc.returncode == 2, proc.stderr
    assert b"Traceback" not in proc.stderr and proc.stderr.startswith(b"error: "), proc.stderr
    assert not (tmp_path / "c").exists()


def test_tier_status_counts_an_inline_objects_copies_by_the_control_nodes(workdir: Path) -> None:
    """This cluster has one control node: an inline object is one copy (it said "3 copies"
    whatever the cluster)."""
    ecstore("mb", "cli-inline", cwd=workdir)
    ecstore("put", "cli-inline/small", "-", stdin=b"x" * 1000, cwd=workdir)
    rows = [line.split() for line in ecstore("tier", "status", cwd=workdir).stdout.decode().splitlines()]
    inline = next(r for r in rows if r and r[0] == "inline")
    assert inline[2:4] == ["1", "copy"], inline


def test_up_refuses_a_second_cluster_in_the_same_directory(workdir: Path) -> None:
    proc = ecstore("cluster", "up", "--detach", cwd=workdir, ok=False)
    assert proc.returncode != 0 and b"already running" in proc.stderr


def test_up_names_a_node_whose_process_runs_and_does_not_answer(workdir: Path) -> None:
    """A node stopping (draining its requests) or hung: its pid runs, it does not answer.
    `cluster up` said "every node is up ... cluster down first" - which would stop the
    whole cluster - while `status` called it down."""
    data = json.loads((workdir / ".ecstore" / "cluster.json").read_text())
    pid = next(n["pid"] for n in data["nodes"] if n["id"] == "s2")
    os.kill(pid, signal.SIGSTOP)
    try:
        proc = ecstore("cluster", "up", "--detach", cwd=workdir, ok=False)
    finally:
        os.kill(pid, signal.SIGCONT)
    said = b" ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"s2 (pid {pid}) does not answer".encode() in said, said
    assert b"cluster down" not in said


def test_up_starts_the_nodes_that_are_down_and_leaves_the_others(workdir: Path) -> None:
    ecstore("mb", "cli-restart", cwd=workdir)
    payload = os.urandom(3 * 1024 * 1024 + 1)
    ecstore("put", "cli-restart/k", "-", stdin=payload, cwd=workdir)
    before = LocalCluster.load(workdir / ".ecstore")
    for node in ("s2", "gw1"):
        before.kill_node(node)
    assert sorted(set(before.nodes) - set(before.running())) == ["gw1", "s2"]
    proc = ecstore("cluster", "up", "--detach", cwd=workdir)
    assert b"starting s2, gw1" in proc.stderr, proc.stderr
    after = LocalCluster.load(workdir / ".ecstore")
    assert sorted(after.running()) == sorted(after.nodes)
    for i, n in after.nodes.items():   # the others were left alone, not restarted
        assert (n.pid == before.nodes[i].pid) == (i not in ("s2", "gw1")), i
    status = json.loads(ecstore("status", "--json", cwd=workdir).stdout)
    assert all(n["up"] for n in status["nodes"])
    assert ecstore("get", "cli-restart/k", "-", cwd=workdir).stdout == payload


def test_ls_max_keys_prints_no_more_than_asked(workdir: Path) -> None:
    ecstore("mb", "few", cwd=workdir)
    for i in range(5):
        ecstore("put", f"few/k{i}", "-", stdin=b"x", cwd=workdir)
    listing = json.loads(ecstore("ls", "few", "-r", "--max-keys", "3", "--json",
                                 cwd=workdir).stdout)
    assert [o["key"] for o in listing["objects"]] == ["k0", "k1", "k2"]
    # a script can tell the listing was cut, and where (it could not)
    assert (listing["truncated"], listing["last_key"]) == (True, "k2")
    whole = json.loads(ecstore("ls", "few", "-r", "--max-keys", "5", "--json",
                               cwd=workdir).stdout)
    assert len(whole["objects"]) == 5 and whole["truncated"] is False and "last_key" not in whole
    cut = ecstore("ls", "few", "-r", "--max-keys", "2", cwd=workdir)
    assert len(cut.stdout.splitlines()) == 2 and b"more follow" in cut.stderr


def test_more_request_mistakes_exit_2_without_a_traceback(workdir: Path, tmp_path: Path) -> None:
    for args in (["cluster", "add-node", "--data", str(tmp_path / "none")],
                 ["cluster", "remove-node", "--data", str(tmp_path / "none"), "s1"],
                 ["tier", "status", "--window", "0"]):
        proc = ecstore(*args, cwd=workdir, ok=False)
        assert proc.returncode == 2 and b"Traceback" not in proc.stderr, (args, proc.stderr)


def test_remove_node_refuses_the_gateway(workdir: Path) -> None:
    """`cluster remove-node gw1` said `drained and stopped gw1` (exit 0) after rebalance
    passes, and dropped the gateway from cluster.json: `cluster up` never started it again."""
    data = workdir / ".ecstore"
    proc = ecstore("cluster", "remove-node", "--data", str(data), "gw1", cwd=workdir, ok=False)
    said = b" ".join(proc.stderr.split())
    assert proc.returncode == 2 and b"gw1 is the cluster's gateway" in said, proc.stderr
    assert json.loads((data / "cluster.json").read_text())["gateway"]
    assert [n["id"] for n in json.loads((data / "cluster.json").read_text())["nodes"]
            if n["role"] == "gateway"] == ["gw1"]


def test_numbers_a_command_cannot_use_are_refused_before_it_runs(workdir: Path) -> None:
    nodes = (workdir / ".ecstore" / "cluster.json").read_bytes()
    for args in (["gc", "--grace", "nan"], ["gc", "--grace", "inf"], ["gc", "--grace", "-1"],
                 ["repair", "--rate", "-1"], ["rebalance", "--rate", "nan"],
                 ["tier", "run", "--once", "--interval", "-1"],
                 ["tier", "run", "--once", "--rate", "inf"],
                 ["tier", "status", "--cold-after", "nan"], ["ring", "reweight", "s1", "nan"],
                 ["ring", "reweight", "s1", "0"],
                 ["cluster", "add-node", "--weight", "0"], ["cluster", "add-node", "--weight", "x"]):
        proc = ecstore(*args, cwd=workdir, ok=False)
        assert proc.returncode == 2 and b"Traceback" not in proc.stderr, (args, proc.stderr)
        assert b"expected a" in proc.stderr and b"number" in proc.stderr, (args, proc.stderr)
    # refused before a node was started or the map changed
    assert (workdir / ".ecstore" / "cluster.json").read_bytes() == nodes
    ring = json.loads(ecstore("ring", "show", "--json", cwd=workdir).stdout)
    assert {n["id"]: n["weight"] for n in ring["nodes"]}["s1"] == 1.0


def test_get_into_a_directory_writes_the_file_in_it_and_a_missing_one_is_a_message(
        workdir: Path) -> None:
    """`get B/K DIR` writes DIR/<the key's last name> (as cp does); a directory that does
    not exist is a one-line error, exit 2 - not a traceback - and no partial file stays."""
    ecstore("mb", "cli-get", cwd=workdir)
    ecstore("put", "cli-get/deep/obj.bin", "-", stdin=b"payload", cwd=workdir)
    (workdir / "outdir").mkdir()
    ecstore("get", "cli-get/deep/obj.bin", "outdir", cwd=workdir)
    assert (workdir / "outdir" / "obj.bin").read_bytes() == b"payload"
    ecstore("get", "cli-get/deep/obj.bin", ".", cwd=workdir)
    assert (workdir / "obj.bin").read_bytes() == b"payload"
    proc = ecstore("get", "cli-get/deep/obj.bin", "missing/x.bin", cwd=workdir, ok=False)
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"does not exist" in proc.stderr
    assert not list(workdir.glob("**/*.ecstore-partial"))


def test_a_cluster_path_that_is_a_directory_or_holds_wrong_types_is_a_message(
        workdir: Path) -> None:
    bad = workdir / "bad-types.json"
    bad.write_text(json.dumps({"control": "http://127.0.0.1:1", "secret": 5}))
    for args, env in ((["--cluster", str(workdir / ".ecstore"), "ls"], {}),
                      (["ls"], {"ECSTORE_CLUSTER": str(workdir / ".ecstore")}),
                      (["--cluster", str(bad), "ls"], {})):
        proc = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=workdir,
                              capture_output=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **env})
        assert proc.returncode == 2 and b"Traceback" not in proc.stderr, (args, proc.stderr)
        said = " ".join(proc.stderr.decode().split())
        assert "is a directory" in said or "must be a list of URLs" in said, said


def test_ls_max_keys_takes_the_first_entries_in_key_order_and_refuses_nonsense(
        workdir: Path) -> None:
    ecstore("mb", "order", cwd=workdir)
    for key in ("a/x", "b", "c/y"):
        ecstore("put", f"order/{key}", "-", stdin=b"x", cwd=workdir)
    two = json.loads(ecstore("ls", "order", "--max-keys", "2", "--json", cwd=workdir).stdout)
    assert (two["prefixes"], [o["key"] for o in two["objects"]]) == (["a/"], ["b"])
    for n in ("0", "-1", "x", "1.5"):
        proc = ecstore("ls", "order", "--max-keys", n, cwd=workdir, ok=False)
        assert proc.returncode == 2 and b"expected a whole number" in proc.stderr, (n, proc.stderr)


def test_ranges_other_than_a_b_a_or_n_are_refused(workdir: Path) -> None:
    ecstore("put", "order/r", "-", stdin=b"0123456789", cwd=workdir)
    assert ecstore("get", "order/r", "-", "--range", "2-4", cwd=workdir).stdout == b"234"
    assert ecstore("get", "order/r", "-", "--range", "-3", cwd=workdir).stdout == b"789"
    assert ecstore("get", "order/r", "-", "--range", "7-", cwd=workdir).stdout == b"789"
    for r in ("-", "", "1_0-20", "+1-+2", "\u0663-\u0664", "5-3", "--5", "1-2-3"):
        proc = ecstore("get", "order/r", "-", f"--range={r}", cwd=workdir, ok=False)
        assert proc.returncode == 2 and b"Traceback" not in proc.stderr, (r, proc.stderr)
        assert b"range" in proc.stderr and proc.stdout == b"", (r, proc.stderr)


def test_a_missing_bucket_is_named_as_such_by_get_head_and_rm(workdir: Path) -> None:
    for cmd in (["get", "no-such-bucket/k", "-"], ["head", "no-such-bucket/k"],
                ["rm", "no-such-bucket/k"]):
        proc = ecstore(*cmd, cwd=workdir, ok=False)
        assert proc.returncode == 2 and b"no such bucket: no-such-bucket" in proc.stderr, cmd
    proc = ecstore("get", "order/none", "-", cwd=workdir, ok=False)
    assert proc.returncode == 2 and b"no such object: order/none" in proc.stderr


# the last tests stop nodes of the module's cluster
def test_a_failed_get_leaves_no_partial_file(workdir: Path) -> None:
    from cli.localcluster import LocalCluster
    payload = os.urandom(9 * 1024 * 1024)
    (workdir / "big.bin").write_bytes(payload)
    ecstore("put", "cli-bucket/big", "big.bin", cwd=workdir)
    cluster = LocalCluster.load(workdir / ".ecstore")
    for nid in ("s1", "s2", "s3"):      # 3+2 over 5 nodes: two left, three needed
        cluster.kill_node(nid)
    proc = ecstore("get", "cli-bucket/big", "got.bin", cwd=workdir, ok=False)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr
    assert not (workdir / "got.bin").exists()
    assert not (workdir / "got.bin.ecstore-partial").exists()
    proc = ecstore("status", "--json", cwd=workdir, ok=False)     # three nodes down
    assert proc.returncode == 3, proc.stderr
    assert sum(not n["up"] for n in json.loads(proc.stdout)["nodes"]) == 3


def test_status_exits_3_when_no_control_node_answers(workdir: Path) -> None:
    from cli.localcluster import LocalCluster
    LocalCluster.load(workdir / ".ecstore").kill_node("c1")
    proc = ecstore("status", cwd=workdir, ok=False)
    assert proc.returncode == 3, proc.stderr
    assert b"control node" in proc.stderr and b"Traceback" not in proc.stderr
    proc = ecstore("status", "--json", cwd=workdir, ok=False)   # a script gets JSON too
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["nodes"] == [] and json.loads(proc.stdout)["error"]
    for args in (("gc", "--dry-run"), ("repair", "--dry-run"), ("ls",), ("ring", "show"),
                 ("tier", "status")):     # every --json command: JSON on stdout, failing too
        proc = ecstore(*args, "--json", cwd=workdir, ok=False)
        assert proc.returncode == 1, (args, proc.stderr)
        assert json.loads(proc.stdout)["error"] == "unavailable", args
        assert b"Traceback" not in proc.stderr


def test_a_foreground_cluster_reports_a_dead_node_and_ctrl_c_stops_the_nodes_added_since(
        tmp_path: Path) -> None:
    """`make up` runs `cluster up` in the foreground: a node that dies is reported there
    (and reaped) and `cluster up` from another shell starts it again; a node added
    meanwhile (`cluster add-node`) is the cluster's too: Ctrl-C stops it, and cluster.json
    keeps it for the next `cluster up`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fg = subprocess.Popen([sys.executable, "-m", "cli.main", "cluster", "up", "--storage", "3",
                           "--control", "1", "--k", "2", "--m", "1", "--no-gateway"],
                          cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in iter(fg.stderr.readline, b"")]
                     if fg.stderr else None, daemon=True).start()

    def wait_line(text: bytes, timeout_s: float = 60.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if text in line:
                return line
        raise AssertionError(f"the foreground cluster never printed {text!r}")

    try:
        wait_line(b"running in the foreground")
        s2 = LocalCluster.load(tmp_path / ".ecstore").nodes["s2"].pid
        assert s2 is not None
        os.kill(s2, signal.SIGKILL)
        assert b"killed by signal 9" in wait_line(b"node s2 exited")
        assert b"starting s2" in ecstore("cluster", "up", cwd=tmp_path).stderr
        ecstore("cluster", "add-node", "--role", "storage", cwd=tmp_path)
        nodes = LocalCluster.load(tmp_path / ".ecstore").nodes
        assert "s4" in nodes and sorted(LocalCluster.load(tmp_path / ".ecstore").running()) \
            == sorted(nodes)
        fg.send_signal(signal.SIGINT)
        assert fg.wait(timeout=60) == 0
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait(timeout=10)
    after = LocalCluster.load(tmp_path / ".ecstore")
    assert "s4" in after.nodes
    assert [i for i, n in nodes.items() if pid_alive(n.pid)] == []
    assert after.running() == []
    ecstore("cluster", "down", cwd=tmp_path, ok=False)


def test_a_foreground_cluster_exits_when_cluster_down_stops_its_nodes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fg = subprocess.Popen([sys.executable, "-m", "cli.main", "cluster", "up", "--storage", "3",
                           "--control", "1", "--k", "2", "--m", "1", "--no-gateway"],
                          cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    try:
        for _ in range(200):   # bounded: up to 200 lines of its output
            line = fg.stderr.readline() if fg.stderr else b""
            if not line or b"running in the foreground" in line:
                break
        assert b"running in the foreground" in line, line
        assert b"stopped 4 nodes" in ecstore("cluster", "down", cwd=tmp_path).stderr
        assert fg.wait(timeout=30) == 0
        assert fg.stderr is not None
        said = fg.stderr.read()
        assert b"every node has stopped" in said
        # each node shut down on one SIGTERM, cleanly, and is not called crashed: a second
        # SIGTERM during a node's shutdown killed it ("exited (killed by signal 15)", with
        # the advice to start it again)
        assert sorted(line.split()[1] for line in said.splitlines()
                      if line.startswith(b"node ")) == [b"c1", b"s1", b"s2", b"s3"], said
        assert b"exited" not in said and b"stopped" in said, said
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait(timeout=10)
            ecstore("cluster", "down", cwd=tmp_path, ok=False)


@pytest.mark.parametrize("content", [b"{bad", b"\xff\xfe", b'{"secret": "x", "nodes": [{"id": 1}]}',
                                     b"[]"], ids=["not-json", "not-utf8", "a-node-half", "a-list"])
def test_a_broken_cluster_file_is_a_message_for_every_local_cluster_command(
        tmp_path: Path, content: bytes) -> None:
    (tmp_path / ".ecstore").mkdir()
    (tmp_path / ".ecstore" / "cluster.json").write_bytes(content)
    for args in (["cluster", "up", "--detach"], ["cluster", "down"], ["cluster", "add-node"],
                 ["cluster", "remove-node", "s1"], ["status"]):
        proc = ecstore(*args, cwd=tmp_path, ok=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert b"Traceback" not in proc.stderr and b"cluster.json" in proc.stderr, \
            (args, proc.stderr)
