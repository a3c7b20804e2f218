"""/metrics on real node processes (storage, control, gateway) after real traffic: the
numbers move as they should, labels stay bounded, and only the cluster secret, the
configured bearer token, or public mode opens it. Parsed with prometheus_client's parser.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from cli.localcluster import LocalCluster, free_port, signed_request
from node.volumes import MAX_HEADER_BYTES, RECORD_MAGIC, RECORD_PREFIX, stored_fragments
from store.client import SyncClient
from store.wire import unpack
from tests.cluster.s3_fixtures import gateway_cluster, gateway_of, make_client
from tests.functional.harness import flip_last_byte, fragments_on_disk
from tests.scrape import Samples, parse, value

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-metrics-token-0123456789"
BUCKET = "metered"
OBJECT_BYTES = 300_000          # above the inline limit: one segment, k+m fragments


# ---- the cluster and scraping -----------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster with a gateway whose nodes accept TOKEN on /metrics; no AWS settings of
    the machine are seen while it runs."""
    with gateway_cluster(request, "ecstore-metrics-", fsync=False,
                         unset=[n for n in os.environ if n.startswith("ECSTORE_METRICS")],
                         env={"ECSTORE_METRICS_TOKEN": TOKEN}) as c:
        yield c


@pytest.fixture(scope="module")
def s3(cluster: LocalCluster) -> BaseClient:
    s3 = make_client(gateway_of(cluster), retries=False)
    s3.create_bucket(Bucket=BUCKET)
    return s3


@pytest.fixture(scope="module")
def lib(cluster: LocalCluster) -> Iterator[SyncClient]:
    c = SyncClient(cluster.path)
    yield c
    c.close()


def metrics_path(cluster: LocalCluster, node_id: str) -> str:
    return "/_ecstore/metrics" if cluster.nodes[node_id].role == "gateway" else "/metrics"


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError as exc:  # not listening (yet)
        return 0, str(exc.reason)


def scrape(cluster: LocalCluster, node_id: str) -> Samples:
    status, text = fetch(cluster.nodes[node_id].url + metrics_path(cluster, node_id),
                         {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, text
    return parse(text)


def nodes(cluster: LocalCluster, role: str) -> list[str]:
    return [i for i, n in cluster.nodes.items() if n.role == role]


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def fragment_holders(cluster: LocalCluster, vid: str, index: int) -> list[str]:
    """The storage nodes with fragment `index` of segment 0 of version `vid` on disk."""
    return [i for i in nodes(cluster, "storage")
            if f"{vid}.0.{index}" in fragments_on_disk(cluster.dir / i)]


def live_record_bytes(data_dir: Path) -> int:
    """Bytes of the records (prefix, header and body) of every fragment stored under
    data_dir, read from its volume files: each record found back from its body."""
    total = 0
    for path, body_off, size in stored_fragments(data_dir).values():
        start = max(0, body_off - RECORD_PREFIX.size - MAX_HEADER_BYTES)
        with open(path, "rb") as f:
            f.seek(start)
            before = f.read(body_off - start)
        end = len(before) - RECORD_PREFIX.size + len(RECORD_MAGIC)
        while True:     # the nearest b"ECV1" whose header length ends where the body starts
            at = before.rfind(RECORD_MAGIC, 0, end)
            assert at >= 0, f"no record before the body at {body_off} in {path}"
            _, header_len, _ = RECORD_PREFIX.unpack_from(before, at)
            if at + RECORD_PREFIX.size + header_len == len(before):
                break
            end = at + len(RECORD_MAGIC) - 1
        total += len(before) - at + size
    return total


def put_object(s3: BaseClient, key: str) -> bytes:
    data = os.urandom(OBJECT_BYTES)
    s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    return data


# ---- counters move with traffic --------------------------------------------------------
def test_puts_raise_request_counters_and_bytes_in_on_every_role(cluster: LocalCluster,
                                                                s3: BaseClient) -> None:
    ids = nodes(cluster, "storage") + nodes(cluster, "control") + ["gw1"]
    before = {i: scrape(cluster, i) for i in ids}
    n = 3
    for i in range(n):
        put_object(s3, f"counted/{i}")
    after = {i: scrape(cluster, i) for i in ids}

    def delta(node: str, name: str, **labels: str) -> float:
        return value(after[node], name, **labels) - value(before[node], name, **labels)

    ok = {"op": "put_object", "status": "200"}
    assert delta("gw1", "ecstore_http_requests_total", **ok) == n
    assert delta("gw1", "ecstore_http_request_duration_seconds_count", **ok) == n
    assert delta("gw1", "ecstore_http_received_bytes_total", op="put_object") >= n * OBJECT_BYTES
    assert delta("gw1", "ecstore_http_sent_bytes_total", op="put_object") > 0
    # each put: k+m fragments, one per storage node (6 of 6), about a quarter of it each
    frag_puts = sum(delta(i, "ecstore_http_requests_total", op="put_fragment", status="201")
                    for i in nodes(cluster, "storage"))
    assert frag_puts == n * 6
    # every one went through a storage node's writer thread, in batches of one or more
    taken = [delta(i, "ecstore_storage_fragment_puts_total") for i in nodes(cluster, "storage")]
    batches = [delta(i, "ecstore_storage_put_batches_total") for i in nodes(cluster, "storage")]
    assert sum(taken) == n * 6
    assert all(0 < b <= t for b, t in zip(batches, taken))
    frag_bytes = sum(delta(i, "ecstore_http_received_bytes_total", op="put_fragment")
                     for i in nodes(cluster, "storage"))
    assert frag_bytes >= n * OBJECT_BYTES * 6 / 4
    # the commit: a record on the key's control nodes (W acks, all R eventually)
    wait_for(lambda: sum(value(scrape(cluster, i), "ecstore_http_requests_total", op="put_object")
                         - value(before[i], "ecstore_http_requests_total", op="put_object")
                         for i in nodes(cluster, "control")) >= n * 2, "the records' writes")


def test_a_storage_nodes_fragments_gauge_equals_its_listing(cluster: LocalCluster,
                                                            s3: BaseClient) -> None:
    put_object(s3, "listed")
    for node_id in nodes(cluster, "storage"):
        url = cluster.nodes[node_id].url
        listing = unpack(signed_request(cluster.secret, "GET", url, "/v1/fragments?limit=10000"))
        samples = scrape(cluster, node_id)
        assert value(samples, "ecstore_storage_fragments") == len(listing["fragments"]) > 0
        data_dir = cluster.dir / node_id
        assert value(samples, "ecstore_storage_fragment_bytes") == live_record_bytes(data_dir)
        volumes = list((data_dir / "volumes").glob("*.vol"))
        assert value(samples, "ecstore_storage_volumes") == len(volumes) > 0
        assert value(samples, "ecstore_storage_volume_bytes") \
            == sum(v.stat().st_size for v in volumes)
        assert 0 < value(samples, "ecstore_storage_disk_free_bytes") \
            <= value(samples, "ecstore_storage_disk_total_bytes")


def test_a_corrupted_fragment_read_raises_checksum_failures(cluster: LocalCluster,
                                                            s3: BaseClient, lib: SyncClient) -> None:
    data = put_object(s3, "corrupted")
    vid = lib.head(BUCKET, "corrupted").version_id
    [holder] = fragment_holders(cluster, vid, 0)    # a data fragment: read first
    flip_last_byte(cluster.dir / holder, f"{vid}.0.0")
    gw_before, node_before = scrape(cluster, "gw1"), scrape(cluster, holder)

    assert s3.get_object(Bucket=BUCKET, Key="corrupted")["Body"].read() == data
    gw = scrape(cluster, "gw1")
    assert value(gw, "ecstore_client_checksum_failures_total") \
        == value(gw_before, "ecstore_client_checksum_failures_total") + 1
    assert value(gw, "ecstore_client_degraded_reads_total") \
        == value(gw_before, "ecstore_client_degraded_reads_total") + 1
    # the reader reported it: the node verified the record and quarantined it (in a
    # thread: the quarantined count goes up before the fragment is forgotten and its
    # tombstone written, so wait for all of it)
    def quarantined() -> bool:
        now = scrape(cluster, holder)
        return (value(now, "ecstore_storage_quarantined_fragments")
                == value(node_before, "ecstore_storage_quarantined_fragments") + 1
                and value(now, "ecstore_storage_fragments")
                != value(node_before, "ecstore_storage_fragments")
                and f"{vid}.0.0" not in fragments_on_disk(cluster.dir / holder))
    wait_for(quarantined, "the fragment to be quarantined")
    assert value(scrape(cluster, holder), "ecstore_storage_fragments") \
        == value(node_before, "ecstore_storage_fragments") - 1
    assert (cluster.dir / holder / "quarantine" / f"{vid}.0.0").exists()
    assert f"{vid}.0.0" not in fragments_on_disk(cluster.dir / holder)


def test_gets_with_a_node_killed_raise_degraded_reads(cluster: LocalCluster, s3: BaseClient,
                                                      lib: SyncClient, all_up: LocalCluster) -> None:
    data = put_object(s3, "degraded")
    vid = lib.head(BUCKET, "degraded").version_id
    [holder] = fragment_holders(cluster, vid, 1)
    before = scrape(cluster, "gw1")
    cluster.kill_node(holder)
    for _ in range(3):
        assert s3.get_object(Bucket=BUCKET, Key="degraded")["Body"].read() == data
    after = scrape(cluster, "gw1")
    assert value(after, "ecstore_client_degraded_reads_total") \
        == value(before, "ecstore_client_degraded_reads_total") + 3
    assert value(after, "ecstore_client_checksum_failures_total") \
        == value(before, "ecstore_client_checksum_failures_total")


def test_metadata_quorum_failures_are_counted(cluster: LocalCluster, s3: BaseClient,
                                              all_up: LocalCluster) -> None:
    put_object(s3, "quorum")
    before = scrape(cluster, "gw1")
    cluster.kill_node("c1")
    cluster.kill_node("c2")
    with pytest.raises(ClientError) as failed:
        s3.head_object(Bucket=BUCKET, Key="quorum")
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    after = scrape(cluster, "gw1")
    assert value(after, "ecstore_client_metadata_quorum_failures_total") \
        > value(before, "ecstore_client_metadata_quorum_failures_total")
    assert value(after, "ecstore_http_requests_total", op="head_object", status="503") \
        == value(before, "ecstore_http_requests_total", op="head_object", status="503") + 1


def test_map_epoch_and_node_info(cluster: LocalCluster, lib: SyncClient) -> None:
    epoch = lib._run(lib.client.cluster_map(refresh=True)).epoch
    for node_id, node in cluster.nodes.items():
        samples = scrape(cluster, node_id)
        assert value(samples, "ecstore_node_info", node_id=node_id, role=node.role) == 1
        if node.role != "storage":
            assert value(samples, "ecstore_map_epoch") == epoch


def test_repair_progress_is_published_and_exported_by_the_control_nodes(
        cluster: LocalCluster, s3: BaseClient) -> None:
    put_object(s3, "repaired")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "cli.main", "--cluster", str(cluster.path),
                           "repair", "--json", "--restart"], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode in (0, 1), proc.stderr.decode()
    checked = json.loads(proc.stdout)["objects_checked"]
    assert checked > 0
    # the last record is acknowledged by a write quorum (2 of 3); the third replica is
    # written after, and the CLI's close waits for it 2 s at most: a replica may show the
    # run's first record a moment after the command exits - wait for every replica that
    # holds one to hold the last
    def last_held() -> list[Samples]:
        holders = [scrape(cluster, i) for i in nodes(cluster, "control")]
        return [s for s in holders
                if value(s, "ecstore_op_last_update_timestamp_seconds", op="repair")]
    wait_for(lambda: all(value(s, "ecstore_op_finished", op="repair") == 1
                         for s in last_held()), "every repair record replica to be the last")
    holders = [scrape(cluster, i) for i in nodes(cluster, "control")]
    holding = [s for s in holders if value(s, "ecstore_op_last_update_timestamp_seconds", op="repair")]
    assert len(holding) >= 2  # a write quorum of the record's replicas, at least
    for s in holding:
        assert value(s, "ecstore_op_done", op="repair") == checked
        assert value(s, "ecstore_op_remaining", op="repair") == 0
        assert value(s, "ecstore_op_rate_per_second", op="repair") > 0
        assert value(s, "ecstore_op_last_update_timestamp_seconds", op="repair") >= started - 1
        assert value(s, "ecstore_op_finished", op="repair") == 1
    labels = {dict(ls).get("op") for s in holders for (n, ls) in s if n.startswith("ecstore_op_")}
    assert labels <= {"repair", "rebalance", "gc", "tier"}


class _Steps:
    """A worker of three steps for cli.main.drive; `fail`: its second step raises."""

    def __init__(self, c: Any, fail: bool) -> None:
        self.c, self.fail, self.remaining = c, fail, 3

    async def step(self) -> bool:
        if self.fail and self.remaining == 2:
            raise RuntimeError("a storage node's disk caught fire")
        self.remaining -= 1
        return self.remaining > 0


def test_an_op_record_says_running_until_its_command_ends_and_failed_when_it_raised(
        cluster: LocalCluster, lib: SyncClient) -> None:
    """rebalance reports its end only after its last pass and metadata move: a rebalance
    killed after its first pass read "remaining 0", as if it had finished."""
    from cli.main import drive
    from store.names import OPS_BUCKET

    def state() -> tuple[str, list[float]]:
        rec = lib._run(lib.client.read_record(OPS_BUCKET, "rebalance"))
        finished = [value(scrape(cluster, i), "ecstore_op_finished", op="rebalance")
                    for i in nodes(cluster, "control")]
        return rec["state"], [f for f in finished if f is not None]

    def reads(expected: tuple[str, list[float]]) -> None:
        # the record's third replica may be written a moment after the command goes on
        wait_for(lambda: state() == expected, f"the rebalance record to say {expected}")

    lib._run(drive(_Steps(lib.client, False), "rebalance", lambda: "", False, last=False))
    reads(("running", [0, 0, 0]))
    lib._run(drive(_Steps(lib.client, False), "rebalance", lambda: "", False))
    reads(("finished", [1, 1, 1]))
    with pytest.raises(RuntimeError):
        lib._run(drive(_Steps(lib.client, True), "rebalance", lambda: "", False))
    reads(("failed", [0, 0, 0]))


def test_labels_never_hold_a_bucket_a_key_or_an_id(cluster: LocalCluster, s3: BaseClient,
                                                   lib: SyncClient) -> None:
    put_object(s3, "secret-name-of-a-key")
    vid = lib.head(BUCKET, "secret-name-of-a-key").version_id
    s3.list_objects_v2(Bucket=BUCKET, Prefix="secret-name")
    for node_id in cluster.nodes:
        values = {v for (_, ls) in scrape(cluster, node_id) for _, v in ls}
        assert not {v for v in values if BUCKET in v or "secret-name" in v or vid[:16] in v}
        assert all(len(v) <= 64 for v in values), node_id


# ---- who may read /metrics ------------------------------------------------------------
@pytest.mark.parametrize("node_id", ["s1", "c1", "gw1"])
def test_unauthorized_scrapes_are_401_and_bearer_and_signed_ones_work(cluster: LocalCluster,
                                                                       node_id: str) -> None:
    url = cluster.nodes[node_id].url + metrics_path(cluster, node_id)
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Basic Zm9vOmJhcg=="},
                    {"x-ecstore-date": "1", "x-ecstore-checksum": "0", "x-ecstore-signature": "bad"}):
        status, body = fetch(url, headers)
        assert status == 401, (headers, body)
        assert json.loads(body)["error"] == "unauthorized"
    status, text = fetch(url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "ecstore_http_requests_total" in text
    signed = signed_request(cluster.secret, "GET", cluster.nodes[node_id].url,
                            metrics_path(cluster, node_id)).decode()
    assert "ecstore_node_info" in signed
    if node_id == "gw1":  # the gateway's /metrics is the same, for an unsigned-for-S3 GET
        status, text = fetch(cluster.nodes[node_id].url + "/metrics",
                             {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and 'role="gateway"' in text


def test_a_bucket_named_metrics_is_still_s3s(cluster: LocalCluster, s3: BaseClient) -> None:
    s3.create_bucket(Bucket="metrics")
    s3.put_object(Bucket="metrics", Key="k", Body=b"v")
    assert [o["Key"] for o in s3.list_objects(Bucket="metrics")["Contents"]] == ["k"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="metrics")["Contents"]] == ["k"]
    assert s3.head_bucket(Bucket="metrics")["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_public_mode_serves_metrics_without_credentials(cluster: LocalCluster,
                                                        all_up: LocalCluster,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    url = cluster.nodes["s2"].url + "/metrics"
    assert fetch(url)[0] == 401
    cluster.stop_node("s2")
    monkeypatch.setenv("ECSTORE_METRICS_PUBLIC", "1")
    cluster.start_node("s2")
    cluster.wait_healthy(["s2"])
    status, text = fetch(url)
    assert status == 200 and value(parse(text), "ecstore_node_info", node_id="s2") == 1
    # public mode opens /metrics only
    assert fetch(cluster.nodes["s2"].url + "/v1/fragments")[0] == 401
    monkeypatch.delenv("ECSTORE_METRICS_PUBLIC")
    cluster.stop_node("s2")  # all_up starts it again, as configured before


def test_the_metrics_public_flag_and_a_bad_token_setting(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ECSTORE_SECRET": "s" * 24}
    env.pop("ECSTORE_METRICS_TOKEN", None)
    env.pop("ECSTORE_METRICS_PUBLIC", None)
    base = [sys.executable, "-m", "node.storage", "--id", "solo", "--data", str(tmp_path),
            "--port", str(port), "--no-fsync"]
    bad = subprocess.run(base, env={**env, "ECSTORE_METRICS_TOKEN": "short"},
                         capture_output=True, timeout=60)
    assert bad.returncode != 0 and b"ECSTORE_METRICS_TOKEN" in bad.stderr
    with open(tmp_path / "solo.log", "wb") as log:
        proc = subprocess.Popen(base + ["--metrics-public"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: fetch(f"http://127.0.0.1:{port}/v1/health")[0] == 200, "the node")
        status, text = fetch(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and value(parse(text), "ecstore_storage_fragments") == 0
    finally:
        proc.terminate()
        proc.wait(timeout=20)
