"""Round trips, ranges, node loss, corruption, control node loss, auth: real processes."""
from __future__ import annotations

import hashlib
import urllib.error
import urllib.request

import pytest

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.errors import NotFound, RangeNotSatisfiable, Unavailable
from tests.functional.harness import flip_last_byte, fragments_on_disk

SEG = 4 * 1024 * 1024
INLINE = 64 * 1024
SIZES = {
    "empty": 0, "one": 1, "inline_max": INLINE, "just_over_inline": INLINE + 1,
    "one_segment": SEG, "ragged": 2 * SEG + 12345,
}


def blob(size: int, seed: int = 0) -> bytes:
    out = bytearray()
    block = hashlib.sha256(f"{seed}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 128
    return bytes(out[:size])


@pytest.fixture(scope="module")
def stored(client: SyncClient) -> dict[str, bytes]:
    client.create_bucket("data")
    objs = {name: blob(size, i) for i, (name, size) in enumerate(SIZES.items())}
    for name, data in objs.items():
        info = client.put("data", name, data)
        assert info.size == len(data)
    return objs


@pytest.mark.parametrize("name", list(SIZES))
def test_round_trip_is_byte_exact(client: SyncClient, stored: dict[str, bytes], name: str) -> None:
    assert client.get("data", name) == stored[name]
    assert client.head("data", name).size == len(stored[name])


def test_small_objects_are_inline_and_large_ones_are_not(client: SyncClient,
                                                         stored: dict[str, bytes]) -> None:
    assert client.head("data", "inline_max").inline
    assert not client.head("data", "just_over_inline").inline


@pytest.mark.parametrize("lo,hi", [(0, 0), (SEG - 10, SEG + 10), (SEG - 1, SEG),
                                   (1, 2 * SEG + 12344), (2 * SEG, 2 * SEG + 12344),
                                   (SEG, 2 * SEG - 1)])
def test_ranges_across_segment_edges(client: SyncClient, stored: dict[str, bytes],
                                     lo: int, hi: int) -> None:
    assert client.get("data", "ragged", lo, hi) == stored["ragged"][lo:hi + 1]


def test_suffix_and_unsatisfiable_ranges(client: SyncClient, stored: dict[str, bytes]) -> None:
    assert client.get("data", "ragged", None, 100) == stored["ragged"][-100:]
    with pytest.raises(RangeNotSatisfiable):
        client.get("data", "ragged", len(stored["ragged"]), None)


def test_stream_yields_the_whole_object(client: SyncClient, stored: dict[str, bytes]) -> None:
    assert b"".join(client.get_stream("data", "ragged")) == stored["ragged"]


def test_reads_survive_m_storage_nodes_killed(cluster: LocalCluster, client: SyncClient,
                                              stored: dict[str, bytes], all_up: LocalCluster) -> None:
    for victim in ("s1", "s4"):  # m = 2
        cluster.kill_node(victim)
    for name, data in stored.items():
        assert client.get("data", name) == data, name


def test_m_plus_one_nodes_down_fails_clearly(cluster: LocalCluster, client: SyncClient,
                                             stored: dict[str, bytes], all_up: LocalCluster) -> None:
    for victim in ("s2", "s3", "s5"):
        cluster.kill_node(victim)
    with pytest.raises(Unavailable) as exc:
        client.get("data", "ragged")
    assert "fragments readable" in str(exc.value)
    # inline objects live in the metadata and still read
    assert client.get("data", "one") == stored["one"]


def test_corrupted_fragment_files_never_reach_the_reader(cluster: LocalCluster,
                                                         client: SyncClient,
                                                         stored: dict[str, bytes]) -> None:
    vid = client.head("data", "ragged").version_id
    storage = [i for i, n in cluster.nodes.items() if n.role == "storage"]
    held = sorted((fid, node_id) for node_id in storage
                  for fid in fragments_on_disk(cluster.dir / node_id) if fid.startswith(f"{vid}."))
    assert len(held) == 3 * 6
    flipped = 0
    for fid, node_id in held:
        if fid.endswith(".0") or fid.endswith(".1"):  # data fragments, read first
            flip_last_byte(cluster.dir / node_id, fid)
            flipped += 1
    assert flipped == 6
    assert client.get("data", "ragged") == stored["ragged"]


def test_one_control_node_down_puts_gets_and_lists_work(cluster: LocalCluster,
                                                        client: SyncClient,
                                                        stored: dict[str, bytes],
                                                        all_up: LocalCluster) -> None:
    cluster.kill_node("c2")
    data = blob(300_000, 99)
    client.put("data", "while-c2-down", data)
    assert client.get("data", "while-c2-down") == data
    assert client.get("data", "one_segment") == stored["one_segment"]
    keys = [o.key for o in client.list("data").objects]
    assert "while-c2-down" in keys and "ragged" in keys


def test_delete_hides_the_object(client: SyncClient, stored: dict[str, bytes]) -> None:
    client.put("data", "doomed", b"x" * 100_000)
    client.delete("data", "doomed")
    with pytest.raises(NotFound):
        client.get("data", "doomed")
    assert "doomed" not in [o.key for o in client.list("data").objects]


@pytest.mark.parametrize("role_node", ["s1", "c1"])
def test_unsigned_requests_are_refused(cluster: LocalCluster, role_node: str) -> None:
    url = cluster.nodes[role_node].url
    path = "/v1/fragments" if role_node.startswith("s") else "/v1/buckets"
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url + path, timeout=5)
    assert exc.value.code == 401
    req = urllib.request.Request(url + path, headers={
        "x-ecstore-date": "1", "x-ecstore-checksum": "0", "x-ecstore-signature": "bad"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5)
    assert exc.value.code == 401
