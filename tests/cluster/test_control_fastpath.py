"""The control node's fast path (node.control.RecordRoutes on node.fastpath) over real TCP
against real control node processes: object record reads and writes, alone and in
batches, get exactly the answers the aiohttp routes give (a node with
ECSTORE_FAST_PATH=0 is the reference: statuses, header names, bodies, request and batch
log lines), keys are unescaped as aiohttp's router unescapes them, any other request
takes the connection to aiohttp with every byte not yet answered, and the client library
keeps its record requests on connections no other request has used (store.fetch's lanes),
so they stay on the fast path."""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from node.fastpath import FAST_PATH_ENV
from store.digest import digest
from store.transport import Transport, quote_key
from store.wire import pack, unpack
from tests import scrape
from tests.cluster.rawhttp import Conn, converse, exchange, first_answer, signed_request
from tests.cluster.storagenode import SECRET, Node, control_node, logged


@pytest.fixture(scope="module")
def fast() -> Iterator[Node]:
    with control_node({FAST_PATH_ENV: "1"}) as node:
        yield node
        text = node.log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


@pytest.fixture(scope="module")
def plain() -> Iterator[Node]:
    with control_node({FAST_PATH_ENV: "0"}) as node:
        yield node


def request(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None,
            checksum: str | None = None) -> bytes:
    return signed_request(SECRET, method, target, body, headers, checksum)


def record(ts: int, version: str, **extra: object) -> bytes:
    return pack({"ts": ts, "version_id": version, "deleted": False, "size": 3, **extra})


def once(node: Node, data: bytes) -> tuple[int, bytes]:
    a = exchange(node.port, data.split(b" ", 1)[0].decode(), data)
    assert a.status is not None, "the node closed without answering"
    return a.status, a.body


def metrics(node: Node) -> dict[str, float]:
    """The fast path's counters, from one scrape on a connection of its own (handed to
    aiohttp, and counted)."""
    status, body = once(node, request("GET", "/metrics"))
    assert status == 200
    got = scrape.counters(body.decode(), ("fast_requests_total", "fast_handovers_total"),
                          prefix="ecstore_control_")
    return {n.removesuffix("_total"): v for n, v in got.items()}


def log_lines(node: Node, at_least: int = 0) -> list[tuple[str, ...]]:
    """(method, op, status, bytes_in, bytes_out) of each record request logged, and
    (items, request_ids) of each batch line (once there are `at_least`:
    storagenode.logged)."""
    def pick(line: str, f: dict[str, str]) -> tuple[str, ...] | None:
        if "ecstore.request" in line and "_object" in f.get("op", ""):
            return (f["method"], f["op"], f["status"], f["bytes_in"], f["bytes_out"])
        if " batch " in line:
            return ("batch", f.get("items", "?"), f.get("request_ids", "?"))
        return None
    return logged(node, pick, at_least)


# ---- the same answers as aiohttp's --------------------------------------------------------
ODD_KEY = "dir/sub file+x%y\u00e9?#"          # every escape quote_key writes, %2F among them


def conversation() -> list[bytes]:
    """Record puts and gets, alone and in batches, good and bad, on one connection."""
    k1, odd = "/v1/objects/bkt/k1", f"/v1/objects/bkt/{quote_key(ODD_KEY)}"
    batch_put = pack([["bkt", "k2", record(5, "v5"), "rid-a"],
                      ["BAD_", "k3", record(5, "v5"), "rid-b"],
                      ["bkt", "k4", pack({"ts": 1}), "rid-c"],
                      ["bkt", "k1", record(1, "v0"), "rid-d"],
                      "not a list"])
    batch_get = pack([["bkt", "k1", "rid-e"], ["bkt", "k2", "rid-f"], ["bkt", "nope", "rid-g"],
                      ["BAD_", "k", "rid-h"], ["bkt"]])
    return [
        request("PUT", k1, record(2, "v2")),
        request("PUT", k1, record(1, "v1")),              # older: not applied
        request("PUT", k1, record(3, "v3")),              # newer: applied
        request("GET", k1),
        request("GET", "/v1/objects/bkt/missing"),
        request("GET", "/v1/objects/BAD_/k1"),            # a bad bucket name: 400
        request("PUT", "/v1/objects/BAD_/k1", record(1, "v1")),
        request("PUT", k1, record(4, "v4"), checksum=digest(b"other")),
        request("PUT", k1, pack([1, 2])),                 # not a map
        request("PUT", k1, pack({"ts": 9, "version_id": "v9"})),   # a field missing
        request("PUT", k1, b"\xc1"),                      # not msgpack
        request("PUT", odd, record(1, "odd")),
        request("GET", odd),
        request("POST", "/v1/objects", batch_put, {"x-ecstore-request-id": "batch-put-1"}),
        request("POST", "/v1/objects/read", batch_get),
        request("POST", "/v1/objects/read", pack({"not": "a list"})),
        request("POST", "/v1/objects", pack([])),         # no items
        request("POST", "/v1/objects/read", pack(["x"] * 300)),   # too many
        request("POST", "/v1/objects/read", batch_get, checksum=digest(b"other")),
        request("GET", "/v1/objects/bkt/k2"),
    ]


def test_record_requests_get_the_answers_aiohttp_gives(fast: Node, plain: Node) -> None:
    before = metrics(fast)
    lines_fast, lines_plain = len(log_lines(fast)), len(log_lines(plain))
    steps = conversation()
    got_fast, got_plain = converse(fast.port, steps), converse(plain.port, steps)
    assert [s for s, _, _ in got_fast] == [200, 200, 200, 200, 404, 400, 400, 400, 400, 400,
                                           400, 200, 200, 200, 200, 400, 400, 400, 400, 200]
    assert got_fast == got_plain
    assert unpack(got_fast[1][2])["applied"] is False and unpack(got_fast[2][2])["applied"]
    assert unpack(got_fast[3][2])["version_id"] == "v3"
    assert unpack(got_fast[12][2])["version_id"] == "odd"
    assert [item[0] for item in unpack(got_fast[13][2])] == [200, 400, 400, 200, 400]
    assert [item[0] for item in unpack(got_fast[14][2])] == [200, 200, 404, 400, 400]
    assert unpack(got_fast[19][2])["version_id"] == "v5"
    # the fast node answered every one itself, on one connection, never handed it over
    after = metrics(fast)
    assert after["fast_requests"] - before["fast_requests"] == len(steps)
    assert after["fast_handovers"] - before["fast_handovers"] == 1   # the scrape's own
    assert metrics(plain)["fast_requests"] == 0
    # and logged them the same: op, status, bytes in and out, each batch's request ids
    batches = 2   # a batch line for the two good batches; the others are refused first
    new_fast = log_lines(fast, lines_fast + len(steps) + batches)[lines_fast:]
    new_plain = log_lines(plain, lines_plain + len(steps) + batches)[lines_plain:]
    assert len([x for x in new_fast if x[0] != "batch"]) == len(steps)
    assert ("batch", "5", "rid-a,rid-b,rid-c,rid-d") in new_fast
    assert new_fast == new_plain


# raw targets no client of ours writes, unescaped by both nodes' routers
RAW_KEYS = ["a%2Fb", "a%2fb", "a%252Fb", "a%25b", "%E2%82%AC", "%FF%FE", "a%2F..%2Fb",
            "%2E%2E", "a%20b", "%2B", "~x-y_z.w", "a%00b", "a%0Ab", "a/b/c", "a//b",
            "a/./b", "a/../b", "."]


def test_keys_are_unescaped_as_aiohttps_router_does(fast: Node, plain: Node) -> None:
    """Each raw target PUT on both nodes, then the bucket listed (by each node's own
    path): the same keys stored under the same names, the same answers."""
    answers = {}
    for node in (fast, plain):
        steps = [request("PUT", f"/v1/objects/raw/{k}", record(1, f"v{i}"))
                 for i, k in enumerate(RAW_KEYS)]
        answers[node.port] = [a[:1] + a[2:] for a in converse(node.port, steps)]
    assert answers[fast.port] == answers[plain.port]
    assert [a[0] for a in answers[fast.port]].count(200) >= len(RAW_KEYS) - 4
    listed = []
    for node in (fast, plain):
        status, body = once(node, request("GET", "/v1/list/raw?limit=100"))
        assert status == 200
        listed.append([(r["key"], r["version_id"]) for r in unpack(body)["records"]])
    assert listed[0] == listed[1]
    # %2F and %2f both a "/" (the second put, of the same ts, the newer version), %252F
    # the three characters "%2F", a euro sign from its UTF-8
    assert {("a/b", "v1"), ("a%2Fb", "v2"), ("\u20ac", "v4")} <= set(listed[0])


def test_listings_get_the_answers_aiohttp_gives(fast: Node, plain: Node) -> None:
    """The same records on both nodes, then listings good and bad - rows and maps,
    prefixes, delimiters, resumes, whole records, escapes, a repeated parameter, every
    refusal - on one connection: the fast node answers each itself, as aiohttp does."""
    keys = ["a/1", "a/2", "a/3/x", "b x", "c+d", "\u00e9/1", "gone/1", "z"]
    for node in (fast, plain):
        steps = [request("PUT", f"/v1/objects/lst/{quote_key(k)}", record(1, f"v-{k}"))
                 for k in keys]
        steps.append(request("PUT", "/v1/objects/lst/gone%2F1",
                             record(2, "v-del", deleted=True)))   # a tombstone
        assert [a[0] for a in converse(node.port, steps)] == [200] * len(steps)
    targets = [
        "/v1/list/lst", "/v1/list/lst?prefix=a%2F&limit=10&rows=1",
        "/v1/list/lst?prefix=&after=&delimiter=%2F&rows=1", "/v1/list/lst?delimiter=%2F",
        "/v1/list/lst?after=a%2F1&limit=1", "/v1/list/lst?after=a%2F1&limit=2&rows=1",
        "/v1/list/lst?prefix=b+x&rows=1", "/v1/list/lst?prefix=%C3%A9", "/v1/list/lst?full=1",
        "/v1/list/lst?prefix=c%2B&prefix=a", "/v1/list/lst?rows&limit=3",
        "/v1/list/nobucket?rows=1", "/v1/list/lst?limit=0", "/v1/list/lst?limit=x",
        "/v1/list/lst?limit=10001", "/v1/list/lst?limit=", "/v1/list/BAD_?limit=x",
        "/v1/list/lst?delimiter=" + "x" * 1025,
    ]
    before = metrics(fast)["fast_requests"]
    got_fast = converse(fast.port, [request("GET", t) for t in targets])
    got_plain = converse(plain.port, [request("GET", t) for t in targets])
    assert [a[0] for a in got_fast] == [200] * 12 + [400] * 6
    assert got_fast == got_plain
    assert metrics(fast)["fast_requests"] - before == len(targets)
    rows = unpack(got_fast[2][2])
    assert [r[0] for r in rows["rows"]] == ["a/1", "b x", "c+d", "gone/1", "z", "\u00e9/1"]
    assert rows["rows"][3][3] is True                 # the tombstone, and the end of é/
    assert rows["resume"] == "\u00e9/\U0010ffff"
    assert [r[0] for r in unpack(got_fast[6][2])["rows"]] == ["b x"]
    assert [r["key"] for r in unpack(got_fast[9][2])["records"]] == ["c+d"]   # the first


# ---- anything else: aiohttp's, with every byte ----------------------------------------------
def test_other_requests_hand_the_connection_to_aiohttp_with_what_was_sent(fast: Node) -> None:
    handovers = metrics(fast)["fast_handovers"]
    c = Conn(fast.port)
    try:
        c.send(request("PUT", "/v1/objects/hand/k", record(1, "v1")))
        assert c.answer()[0] == 200
        # the map (none held: 404) and a record read in one write: the first hands the
        # connection over, the second is then aiohttp's, from the bytes already read
        c.send(request("GET", "/v1/map") + request("GET", "/v1/objects/hand/k"))
        map_answer, rec = c.answer(), c.answer()
        assert map_answer[0] == 404
        assert rec[0] == 200 and unpack(rec[2])["version_id"] == "v1"
        c.send(request("PUT", "/v1/objects/hand/k", record(2, "v2")))
        assert c.answer()[0] == 200
    finally:
        c.close()
    assert metrics(fast)["fast_handovers"] - handovers == 2   # this one, and the scrape's
    assert unpack(once(fast, request("GET", "/v1/objects/hand/k"))[1])["version_id"] == "v2"


ODD = {
    "unsigned": b"GET /v1/objects/odd/k HTTP/1.1\r\nHost: h\r\n\r\n",
    "bad signature": request("GET", "/v1/objects/odd/k").replace(
        b"x-ecstore-signature: ", b"x-ecstore-signature: 0"),
    "query": request("GET", "/v1/objects/odd/k?x=1"),
    "purge": request("DELETE", "/v1/objects/odd/k"),
    "batch read by GET": request("GET", "/v1/objects/read"),
    "empty batch body": request("POST", "/v1/objects"),
    "empty record body": request("PUT", "/v1/objects/odd/k"),
    "sub-delims in the key": request("GET", "/v1/objects/odd/a:b!c"),
    "bad escape": request("GET", "/v1/objects/odd/a%zz"),
    "bucket only": request("GET", "/v1/objects/odd"),
    "no bucket": request("GET", "/v1/objects//k"),
    "http/1.0": request("GET", "/v1/objects/odd/k").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "close": request("GET", "/v1/objects/odd/k", headers={"Connection": "close"}),
    "get with a body": request("GET", "/v1/objects/odd/k").replace(
        b"Content-Length: 0\r\n\r\n", b"Content-Length: 3\r\n\r\nabc"),
    "expect": request("PUT", "/v1/objects/odd/k", record(1, "v"), {"Expect": "100-continue"}),
    "too large": request("POST", "/v1/objects", b"x" * (9 * 1024 * 1024)),
    "non-ascii": request("GET", "/v1/objects/odd/k", headers={"x-note": "caf\u00e9"}),
    "list: a query not UTF-8": request("GET", "/v1/list/odd?prefix=%ff"),
    "list: a bad escape in the query": request("GET", "/v1/list/odd?prefix=a%2"),
    "list: sub-delims in the query": request("GET", "/v1/list/odd?prefix=a;b=c"),
    "list: by POST": request("POST", "/v1/list/odd", b"x"),
    "list: no bucket": request("GET", "/v1/list/"),
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_requests_get_aiohttps_answer(case: str, fast: Node, plain: Node) -> None:
    before = metrics(fast)["fast_requests"]
    answers = [first_answer(node.port, ODD[case]) for node in (fast, plain)]
    assert answers[0] == answers[1]
    assert answers[0][0] != 0, "no answer"
    assert metrics(fast)["fast_requests"] == before    # aiohttp's answer, not ours


def test_a_record_put_cut_short_is_not_stored_and_the_node_serves_on(fast: Node) -> None:
    body = record(1, "v1", etag="x" * 5000)
    data = request("PUT", "/v1/objects/cut/k", body)
    # the tests before logged lines of their own, the last ones maybe not yet (a request
    # line is written after its answer is sent): counted once two reads agree
    earlier, again = -1, len(log_lines(fast))
    for _ in range(20):
        if again == earlier:
            break
        earlier, again = again, len(log_lines(fast))
    c = Conn(fast.port)
    c.send(data[:len(data) - 100])
    time.sleep(0.2)
    c.close(reset=True)
    time.sleep(0.2)
    assert once(fast, request("GET", "/v1/objects/cut/k"))[0] == 404
    assert once(fast, data)[0] == 200
    assert unpack(once(fast, request("GET", "/v1/objects/cut/k"))[1])["version_id"] == "v1"
    # the cut put logged as 499 (the client hung up: node.server.CLIENT_CLOSED, as an
    # aiohttp route logs it), then the get, the put and the get (this asserted a 400
    # anywhere in the log, which the tests before had logged)
    ours = [line[:3] for line in log_lines(fast, at_least=earlier + 4)[earlier:]]
    assert ours[0] == ("PUT", "put_object", "499"), ours
    assert ours[1:] == [("GET", "get_object", "404"), ("PUT", "put_object", "200"),
                        ("GET", "get_object", "200")], ours


# ---- the client's lanes ---------------------------------------------------------------------
def test_the_client_keeps_record_requests_off_connections_other_requests_used(
        fast: Node) -> None:
    """A map fetch and read-count listings through the client library among record
    writes, reads and listings: those go over connections of their own, so the fast path
    answers every record request and listing (with one pooled lane for everything, the
    map fetch's connection would have carried them all to aiohttp)."""
    before = metrics(fast)
    url = f"http://127.0.0.1:{fast.port}"

    async def go() -> None:
        t = Transport(SECRET)
        try:
            assert (await t.request("GET", url, "/v1/map", ok_404=True)).status == 404
            for i in range(10):
                await t.request("PUT", url, f"/v1/objects/lane/{quote_key(f'k/{i}')}",
                                body=record(1, f"v{i}"))
                assert unpack((await t.request("GET", url, "/v1/list/lane")).body)["records"]
                assert (await t.request("GET", url, "/v1/access/lane")).status == 200
                got = await t.request("GET", url, f"/v1/objects/lane/{quote_key(f'k/{i}')}")
                assert unpack(got.body)["version_id"] == f"v{i}"
            await t.request("POST", url, "/v1/objects/read",
                            body=pack([["lane", "k/1", "r1"], ["lane", "k/2", "r2"]]))
        finally:
            await t.close()
    asyncio.run(go())
    after = metrics(fast)
    assert after["fast_requests"] - before["fast_requests"] == 31
    # the map's connection (which then carried the read-count listings) and the scrape's
    assert after["fast_handovers"] - before["fast_handovers"] == 2


def test_record_bodies_arrive_in_pieces(fast: Node) -> None:
    """A batch body larger than one read, sent in small pieces with pauses, then three
    requests in one write: each answered once whole, in order."""
    items = [["pieces", f"k{i}", record(1, f"v{i}", etag=os.urandom(32).hex()), f"r{i}"]
             for i in range(200)]
    data = request("POST", "/v1/objects", pack(items))
    c = Conn(fast.port)
    try:
        for i in range(0, len(data), 9000):
            c.send(data[i:i + 9000])
            time.sleep(0.002)
        status, _, body = c.answer()
        assert status == 200 and [x[0] for x in unpack(body)] == [200] * 200
        c.send(request("GET", "/v1/objects/pieces/k7") + request("GET", "/v1/objects/pieces/k9")
               + request("POST", "/v1/objects/read", pack([["pieces", "k199", "r"]])))
        answers = [c.answer() for _ in range(3)]
    finally:
        c.close()
    assert [unpack(a[2])["version_id"] for a in answers[:2]] == ["v7", "v9"]
    assert unpack(unpack(answers[2][2])[0][1])["version_id"] == "v199"
