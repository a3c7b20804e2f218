"""Request logs on real node processes: one line per request on every node a request
touches, all carrying its request id (the gateway's x-amz-request-id, sent on by its
client library), so `grep ID logs/*.log` traces a put, a failed one too; JSON lines with
ECSTORE_LOG_FORMAT=json. And one line per background step (a scrub batch).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from cli.localcluster import LocalCluster
from node.fragments import FragmentStore
from node.logs import JsonFormatter, TextFormatter, step_log
from node.scrub import Scrubber, scrub_loop
from tests.cluster.s3_fixtures import gateway_cluster, gateway_of, make_client

BUCKET = "logged"
OBJECT_BYTES = 300_000      # one segment: a fragment on each of the 6 storage nodes
FIELDS = {"request_id", "method", "op", "status", "duration_ms", "bytes_in", "bytes_out"}


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with gateway_cluster(request, "ecstore-logs-", fsync=False,
                         unset=("ECSTORE_LOG_FORMAT", "ECSTORE_REQUEST_LOG")) as c:
        yield c


@pytest.fixture(scope="module")
def s3(cluster: LocalCluster) -> BaseClient:
    s3 = make_client(gateway_of(cluster), retries=False)  # one request per call: one id
    s3.create_bucket(Bucket=BUCKET)
    return s3


def log_text(cluster: LocalCluster, node_id: str) -> str:
    return (cluster.dir / "logs" / f"{node_id}.log").read_text(errors="replace")


def grep(cluster: LocalCluster, needle: str) -> dict[str, list[str]]:
    """{node id: its log lines holding `needle`}: `grep needle logs/*.log`."""
    return {i: [ln for ln in log_text(cluster, i).splitlines() if needle in ln]
            for i in cluster.nodes}


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def fields(line: str) -> dict[str, str]:
    """The key=value pairs of a text line."""
    return dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))


def roles(cluster: LocalCluster, node_ids: list[str]) -> set[str]:
    return {cluster.nodes[i].role for i in node_ids}


def test_one_put_is_traced_by_its_request_id_on_every_node(cluster: LocalCluster,
                                                          s3: BaseClient) -> None:
    answer = s3.put_object(Bucket=BUCKET, Key="traced", Body=os.urandom(OBJECT_BYTES))
    rid = answer["ResponseMetadata"]["RequestId"]
    assert re.fullmatch(r"[0-9A-F]{16}", rid)
    storage = [i for i, n in cluster.nodes.items() if n.role == "storage"]
    control = [i for i, n in cluster.nodes.items() if n.role == "control"]
    # every storage node got a fragment, every control node the record (W acks, then all R:
    # the last control node may log its put_object after the gateway answered, and its
    # bucket lookup for the same request before, so wait for the put itself)
    def logged() -> bool:
        hits = grep(cluster, rid)
        return bool(hits["gw1"]) and all(hits[i] for i in storage) and all(
            any(fields(ln).get("op") == "put_object" for ln in hits[i]) for i in control)
    wait_for(logged, "every node to log the put")
    hits = grep(cluster, rid)
    [gw_line] = hits["gw1"]
    f = fields(gw_line)
    assert FIELDS <= f.keys(), gw_line
    assert (f["method"], f["op"], f["status"], f["request_id"]) == ("PUT", "put_object", "200", rid)
    assert int(f["bytes_in"]) >= OBJECT_BYTES and float(f["duration_ms"]) > 0
    assert " gw1 ecstore.request INFO request " in gw_line
    for i in storage:
        ops = {fields(ln)["op"] for ln in hits[i]}
        assert ops == {"put_fragment"}, hits[i]
        assert all(f" {i} ecstore.request " in ln for ln in hits[i])
    for i in control:
        assert "put_object" in {fields(ln)["op"] for ln in hits[i]}, hits[i]
    # another request is another id
    other = s3.head_object(Bucket=BUCKET, Key="traced")["ResponseMetadata"]["RequestId"]
    assert other != rid


def test_a_failed_put_is_traced_across_the_nodes_it_reached(cluster: LocalCluster,
                                                           s3: BaseClient) -> None:
    """With a storage node down and no spare node (4+2 on 6), a put fails with 503: its id
    shows the gateway's 503 and the fragment puts (and their clean-up) on the live nodes."""
    cluster.kill_node("s3")
    try:
        with pytest.raises(ClientError) as failed:
            s3.put_object(Bucket=BUCKET, Key="doomed", Body=os.urandom(OBJECT_BYTES))
        meta = failed.value.response["ResponseMetadata"]
        assert meta["HTTPStatusCode"] == 503
        rid = meta["RequestId"]
        storage = [i for i, n in cluster.nodes.items() if n.role == "storage"]
        # the gateway's request line is written once its answer is sent (the client may read
        # the 503 first) and its warning before: wait for the request line itself
        def reached() -> bool:
            hits = grep(cluster, rid)
            return any(" ecstore.request " in ln for ln in hits["gw1"]) and any(
                hits[i] for i in storage)
        wait_for(reached, "the gateway's request line and a storage node's lines")
        hits = grep(cluster, rid)
        [answer] = [ln for ln in hits["gw1"] if " ecstore.request " in ln]
        assert fields(answer)["status"] == "503" and " WARNING " in answer
        # the gateway's own warning, saying why, carries the id too
        assert any(" ecstore.gateway WARNING " in ln and "could not be written" in ln
                   for ln in hits["gw1"]), hits["gw1"]
        touched = [i for i, lines in hits.items() if lines and i != "gw1"]
        assert "storage" in roles(cluster, touched) and "s3" not in touched, hits
        for i in touched:  # fragment puts (cut short when the put failed), their clean-up,
            # and on control nodes the bucket's record if the gateway's cache had expired
            allowed = {"put_fragment", "delete_fragment"} if cluster.nodes[i].role == "storage" \
                else {"get_bucket", "get_map"}
            assert {fields(ln)["op"] for ln in hits[i]} <= allowed, hits[i]
    finally:
        cluster.start_node("s3")
        cluster.wait_healthy(["s3"])


def test_json_mode_lines_parse_as_json(cluster: LocalCluster, s3: BaseClient,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    restarted = ["gw1", "c1", "s1"]
    for i in restarted:
        cluster.stop_node(i)
    offsets = {i: len(log_text(cluster, i).encode()) for i in restarted}
    monkeypatch.setenv("ECSTORE_LOG_FORMAT", "json")
    for i in restarted:
        cluster.start_node(i)
    cluster.wait_healthy(restarted)
    rid = s3.put_object(Bucket=BUCKET, Key="json", Body=os.urandom(OBJECT_BYTES)
                        )["ResponseMetadata"]["RequestId"]
    wait_for(lambda: all(rid in log_text(cluster, i) for i in restarted), "the put's lines")

    for i in restarted:
        with open(cluster.dir / "logs" / f"{i}.log", "rb") as f:
            f.seek(offsets[i])
            lines = f.read().decode().splitlines()
        records = [json.loads(ln) for ln in lines]   # every line, not only request lines
        assert records and all(r["node"] == i and "time" in r and "level" in r for r in records)
        mine = [r for r in records if r.get("request_id") == rid]
        assert mine and all(FIELDS <= r.keys() and r["logger"] == "ecstore.request"
                            for r in mine), mine
        assert isinstance(mine[0]["status"], int) and isinstance(mine[0]["duration_ms"], float)
    [gw] = [r for r in records_of(cluster, "gw1", offsets["gw1"]) if r.get("request_id") == rid]
    assert (gw["method"], gw["op"], gw["status"]) == ("PUT", "put_object", 200)
    # back to text, as the other tests expect
    monkeypatch.delenv("ECSTORE_LOG_FORMAT")
    for i in restarted:
        cluster.stop_node(i)
        cluster.start_node(i)
    cluster.wait_healthy(restarted)


def records_of(cluster: LocalCluster, node_id: str, offset: int) -> list[dict[str, object]]:
    with open(cluster.dir / "logs" / f"{node_id}.log", "rb") as f:
        f.seek(offset)
        return [json.loads(ln) for ln in f.read().decode().splitlines()]


def test_a_restart_leaves_its_trace_whatever_the_log_level(cluster: LocalCluster) -> None:
    """At the default ECSTORE_LOG_LEVEL (WARNING) a node's log held nothing of a restart:
    not when it stopped, on which signal, nor when it listened again and what its store
    found on disk (found by an operator sweep)."""
    assert "ECSTORE_LOG_LEVEL" not in os.environ
    before = len(log_text(cluster, "s2"))
    cluster.stop_node("s2")
    cluster.start_node("s2")
    cluster.wait_healthy(["s2"])
    wait_for(lambda: "listening" in log_text(cluster, "s2")[before:], "the INFO lines, written "
             "in batches within 0.2 s")
    lines = log_text(cluster, "s2")[before:].splitlines()
    stopping = [ln for ln in lines if "stopping" in ln]
    assert stopping and fields(stopping[0])["signal"] == "SIGTERM", lines
    assert any("opened" in ln and "fragments" in ln for ln in lines), lines
    listening = [ln for ln in lines if "listening" in ln]
    assert listening and fields(listening[-1])["address"].endswith(f":{cluster.nodes['s2'].port}")


def test_no_node_logged_an_error_or_a_traceback(cluster: LocalCluster) -> None:
    for i in cluster.nodes:
        text = log_text(cluster, i)
        assert "Traceback" not in text and " ERROR " not in text, f"{i}:\n{text[-3000:]}"


# ---- background steps ---------------------------------------------------------------------
class Capture(logging.Handler):
    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.mark.parametrize("formatter", [TextFormatter("s9"), JsonFormatter("s9")],
                         ids=["text", "json"])
def test_a_scrub_step_is_one_line(tmp_path: Path, formatter: logging.Formatter) -> None:
    store = FragmentStore(tmp_path, fsync=False)
    for i in range(5):
        body = bytes([i]) * 1000
        store.put(f"v1.0.{i}", body, hashlib.sha256(body).hexdigest(), {})
    capture = Capture(formatter)
    step_log.addHandler(capture)
    level = step_log.level
    step_log.setLevel(logging.INFO)

    async def one_pass() -> None:
        task = asyncio.ensure_future(scrub_loop(Scrubber(store), 100.0, 3600.0, 0.0))
        while not capture.lines:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    try:
        asyncio.run(asyncio.wait_for(one_pass(), 20))
    finally:
        step_log.removeHandler(capture)
        step_log.setLevel(level)
    [line] = capture.lines
    if isinstance(formatter, JsonFormatter):
        rec = json.loads(line)
        assert (rec["worker"], rec["checked"], rec["corrupt"], rec["pass_complete"], rec["node"]) \
            == ("scrub", 5, 0, True, "s9")
        assert isinstance(rec["duration_ms"], float)
    else:
        assert " s9 ecstore.step INFO step " in line
        f = fields(line)
        assert (f["worker"], f["checked"], f["corrupt"], f["pass_complete"]) == ("scrub", "5", "0", "True")
