"""The storage node's fast path (node.fastpath) over real TCP against real node
processes: it answers fragment GETs and PUTs exactly as the aiohttp routes do (a node with
ECSTORE_FAST_PATH=0 is the reference: the same statuses, header names, bodies and request
log lines), heads split across packets and requests sent together are read right, a
connection with any other request goes to aiohttp with every byte not yet answered, and
clients that hang up, read slowly or meet a shutdown lose nothing that was acknowledged."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.fastpath import FAST_PATH_ENV
from node.volumes import stored_fragments
from store.auth import CHECKSUM_HEADER
from store.digest import digest
from store.wire import FRAGMENT_CRC_HEADER, FRAGMENT_META_HEADER, pack_header
from tests import scrape
from tests.cluster.rawhttp import Conn, converse, exchange, first_answer, signed_request
from tests.cluster.storagenode import SECRET, Node, logged, storage_node

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def fast() -> Iterator[Node]:
    with storage_node(64, {FAST_PATH_ENV: "1"}) as node:
        yield node
        text = node.log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


@pytest.fixture(scope="module")
def plain() -> Iterator[Node]:
    with storage_node(64, {FAST_PATH_ENV: "0"}) as node:
        yield node


def request(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None,
            checksum: str | None = None) -> bytes:
    """A signed request as the nodes' client sends one (store.fetch)."""
    return signed_request(SECRET, method, target, body, headers, checksum)


def once(node: Node, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: its answer (rawhttp.exchange)."""
    a = exchange(node.port, data.split(b" ", 1)[0].decode(), data)
    assert a.status is not None, "the node closed without answering"
    return a.status, a.headers, a.body


def metrics(node: Node) -> dict[str, float]:
    """The node's fast path and sendfile counters, from one scrape (on a connection of
    its own: that connection is handed to aiohttp, and counted)."""
    status, _, body = once(node, request("GET", "/metrics"))
    assert status == 200
    got = scrape.counters(body.decode(), ("fast_requests_total", "fast_handovers_total",
                                          "sendfile_gets_total"), prefix="ecstore_storage_")
    return {n.removesuffix("_total"): v for n, v in got.items()}


def request_lines(node: Node, at_least: int = 0) -> list[tuple[str, ...]]:
    """(method, op, status, bytes_in, bytes_out) of each fragment request logged (once
    there are `at_least`: storagenode.logged)."""
    def pick(line: str, f: dict[str, str]) -> tuple[str, ...] | None:
        if "ecstore.request" in line and "_fragment" in line:
            return (f["method"], f["op"], f["status"], f["bytes_in"], f["bytes_out"])
        return None
    return logged(node, pick, at_least)


# ---- the same answers as aiohttp's --------------------------------------------------------
def conversation(node: Node, prefix: str, big: bytes,
                 small: bytes) -> list[tuple[int, list[str], bytes]]:
    """Fragment puts and gets, found and not, good and damaged, on one connection."""
    meta = {FRAGMENT_META_HEADER: pack_header({"crc32": 1234, "len": 300_000})}
    steps = [
        request("PUT", f"/v1/fragments/{prefix}big", big, meta),
        request("PUT", f"/v1/fragments/{prefix}big", big, meta),     # replaced: 200
        request("GET", f"/v1/fragments/{prefix}big"),
        request("PUT", f"/v1/fragments/{prefix}small", small),
        request("GET", f"/v1/fragments/{prefix}small"),
        request("GET", f"/v1/fragments/{prefix}missing"),
        request("PUT", f"/v1/fragments/{prefix}bad", small, checksum=digest(b"other")),
        request("GET", f"/v1/fragments/{prefix}bad"),
        request("PUT", f"/v1/fragments/{prefix}empty", b""),
        request("GET", f"/v1/fragments/{prefix}empty"),
    ]
    out = converse(node.port, steps)
    assert out[2][2] == big and out[4][2] == small
    return out


def test_fragment_requests_get_the_answers_aiohttp_gives(fast: Node, plain: Node) -> None:
    before = metrics(fast)
    lines_fast, lines_plain = len(request_lines(fast)), len(request_lines(plain))
    big, small = os.urandom(300_000), os.urandom(1000)
    got_fast = conversation(fast, "a.", big, small)
    got_plain = conversation(plain, "a.", big, small)
    assert [s for s, _, _ in got_fast] == [201, 200, 200, 201, 200, 404, 400, 404, 201, 200]
    assert got_fast == got_plain
    assert b'"not_found"' in got_fast[5][2] and b'"bad_request"' in got_fast[6][2]
    assert FRAGMENT_CRC_HEADER in got_fast[2][1] and CHECKSUM_HEADER in got_fast[2][1]
    # the fast node answered every one of them itself, on one connection, never handed over
    after = metrics(fast)
    assert after["fast_requests"] - before["fast_requests"] == 10
    assert after["fast_handovers"] - before["fast_handovers"] == 1   # the scrape's own
    assert metrics(plain)["fast_requests"] == 0
    # and counted and logged them the same: op, status, bytes in and out
    new_fast = request_lines(fast, lines_fast + 10)[lines_fast:]
    new_plain = request_lines(plain, lines_plain + 10)[lines_plain:]
    assert len(new_fast) == 10 and new_fast == new_plain


# ---- how bytes arrive ---------------------------------------------------------------------
def test_heads_split_across_packets_and_requests_sent_together(fast: Node) -> None:
    body = os.urandom(200_000)
    before = metrics(fast)["fast_requests"]
    c = Conn(fast.port)
    try:
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = request("PUT", "/v1/fragments/b.split", body)
        head_end = data.index(b"\r\n\r\n") + 4
        for i in range(0, head_end, 7):          # the head a few bytes at a time
            c.send(data[i:min(i + 7, head_end)])
            time.sleep(0.002)
        for i in range(head_end, len(data), 65_000):
            c.send(data[i:i + 65_000])
            time.sleep(0.01)
        first = c.answer()
        assert first[0] == 201, first
        other = os.urandom(5000)
        c.send(request("GET", "/v1/fragments/b.split")            # three in one write
               + request("PUT", "/v1/fragments/b.other", other)
               + request("GET", "/v1/fragments/b.other"))
        answers = [c.answer() for _ in range(3)]
    finally:
        c.close()
    assert [a[0] for a in answers] == [200, 201, 200]
    assert answers[0][2] == body and answers[2][2] == other
    assert metrics(fast)["fast_requests"] - before == 4


# ---- anything else: aiohttp's, with every byte ----------------------------------------------
def test_other_requests_hand_the_connection_to_aiohttp_with_what_was_sent(fast: Node) -> None:
    body = os.urandom(100_000)
    handovers = metrics(fast)["fast_handovers"]
    c = Conn(fast.port)
    try:
        c.send(request("PUT", "/v1/fragments/c.one", body))
        assert c.answer()[0] == 201
        # a health check and a fragment GET in one write: the first hands over, the
        # second is then aiohttp's, from the bytes already read
        c.send(request("GET", "/v1/health") + request("GET", "/v1/fragments/c.one"))
        health, frag = c.answer(), c.answer()
        assert health[0] == 200 and b'"ok": true' in health[2]
        assert frag[0] == 200 and frag[2] == body
        bad = request("GET", "/v1/fragments/c.one").replace(b"x-ecstore-signature: ",
                                                             b"x-ecstore-signature: 0")
        c.send(bad)
        assert c.answer()[0] == 401
        c.send(request("GET", "/v1/fragments/c.one"))     # the connection goes on
        assert c.answer()[2] == body
    finally:
        c.close()
    assert metrics(fast)["fast_handovers"] - handovers == 2   # this one, and the scrape's


ODD = {
    "unsigned": b"GET /v1/fragments/d.x HTTP/1.1\r\nHost: h\r\n\r\n",
    "query": request("GET", "/v1/fragments/d.x?x=1"),
    "sub-path": request("GET", "/v1/fragments/d.x/verify"),
    "dotdot": request("GET", "/v1/fragments/d..x"),
    "http/1.0": request("GET", "/v1/fragments/d.x").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "close": request("GET", "/v1/fragments/d.x", headers={"Connection": "close"}),
    "get with a body": request("GET", "/v1/fragments/d.x").replace(
        b"Content-Length: 0\r\n\r\n", b"Content-Length: 3\r\n\r\nabc"),
    "chunked put": request("PUT", "/v1/fragments/d.x", b"abc").replace(
        b"Content-Length: 3\r\n\r\nabc", b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
    "expect": request("PUT", "/v1/fragments/d.x", b"abc", {"Expect": "100-continue"}),
    "double length": request("PUT", "/v1/fragments/d.x", b"abc").replace(
        b"Content-Length: 3\r\n", b"Content-Length: 3\r\nContent-Length: 3\r\n"),
    "bad meta": request("PUT", "/v1/fragments/d.x", b"abc", {FRAGMENT_META_HEADER: "!!"}),
    "non-ascii": request("GET", "/v1/fragments/d.x", headers={"x-note": "caf\u00e9"}),
    "control char": request("GET", "/v1/fragments/d.x", headers={"x-note": "a\x01b"}),
    "header name not a token": request("GET", "/v1/fragments/d.x", headers={"x(y)": "1"}),
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_odd_requests_get_aiohttps_answer(case: str, fast: Node, plain: Node) -> None:
    before = metrics(fast)["fast_requests"]
    answers = [first_answer(node.port, ODD[case]) for node in (fast, plain)]
    assert answers[0] == answers[1]
    assert answers[0][0] != 0, "no answer"
    assert metrics(fast)["fast_requests"] == before    # aiohttp's answer, not ours


# ---- hang-ups, slow readers, cold fragments ------------------------------------------------
@pytest.fixture(params=["fast", "plain"])
def either(request: pytest.FixtureRequest) -> Node:
    node: Node = request.getfixturevalue(request.param)
    return node


def test_a_put_cut_short_is_not_stored_and_the_node_serves_on(either: Node) -> None:
    fast = either       # the fast path and aiohttp's count it alike
    logged = len(request_lines(fast))
    body = os.urandom(500_000)
    data = request("PUT", "/v1/fragments/e.cut", body)
    c = Conn(fast.port)
    c.send(data[:len(data) // 2])
    time.sleep(0.2)
    c.close(reset=True)
    time.sleep(0.2)
    c = Conn(fast.port)
    try:
        c.send(request("GET", "/v1/fragments/e.cut"))
        assert c.answer()[0] == 404
        c.send(data)
        assert c.answer()[0] == 201
        c.send(request("GET", "/v1/fragments/e.cut"))
        assert c.answer()[2] == body
    finally:
        c.close()
    # the cut PUT (499: the client closed it - no 400 it did not earn), then GET 404,
    # PUT 201, GET 200
    new = request_lines(fast, logged + 4)[logged:]
    assert ("PUT", "put_fragment", "499") in [line[:3] for line in new]


def test_a_slow_reader_and_a_fragment_not_in_the_page_cache(fast: Node) -> None:
    body = os.urandom(4 * 1024 * 1024 + 17)
    assert once(fast, request("PUT", "/v1/fragments/f.slow", body))[0] == 201
    sends = metrics(fast)["sendfile_gets"]
    slow = Conn(fast.port, rcvbuf=8192)      # sendfile takes what fits, the rest is written
    try:
        slow.send(request("GET", "/v1/fragments/f.slow"))
        time.sleep(0.3)
        while b"\r\n\r\n" not in slow.pending:
            slow._more(4096)
        for _ in range(3):                   # a few slow reads, then the rest
            slow._more(4096)
            time.sleep(0.05)
        status, _, got = slow.answer()
        assert status == 200 and got == body
        assert metrics(fast)["sendfile_gets"] == sends + 1
        # out of the page cache: read in a thread, then answered on the same connection
        data_dir = Path(fast.log).parent / "s1"
        path, off, size = stored_fragments(data_dir)["f.slow"]
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(50):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if not _cached(path):
                    break
                time.sleep(0.02)
        finally:
            os.close(fd)
        slow.send(request("GET", "/v1/fragments/f.slow"))
        status, _, got = slow.answer()
        assert status == 200 and got == body
    finally:
        slow.close()


def test_reading_pauses_while_requests_pile_up_behind_an_answer(fast: Node) -> None:
    """A client that pipelines requests behind an answer it does not read: the node reads
    about 1 MiB ahead (node.fastpath.MAX_BUFFERED_BYTES), then leaves the rest in the
    kernel's buffers - it does not take 48 MiB into memory - and once the answer is read,
    the requests that piled up are answered in order."""
    big = os.urandom(8 * 1024 * 1024)
    assert once(fast, request("PUT", "/v1/fragments/f.pile", big))[0] == 201
    one = os.urandom(1024 * 1024)
    put = request("PUT", "/v1/fragments/f.piled", one)
    stream = put * 48                        # 48 PUTs of 1 MiB, sent behind the GET
    slow = Conn(fast.port, rcvbuf=8192)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    try:
        slow.send(request("GET", "/v1/fragments/f.pile"))
        time.sleep(0.3)                      # the answer has filled the socket: pending
        slow.sock.setblocking(False)
        sent, stalled_since = 0, None
        deadline = time.monotonic() + TIMEOUT_S
        while sent < len(stream) and time.monotonic() < deadline:
            try:
                sent += slow.sock.send(stream[sent:sent + 256 * 1024])
                stalled_since = None
            except BlockingIOError:          # the node has stopped reading: for how long?
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 1.0:
                    break
                time.sleep(0.01)
        # the kernel's buffers on both sides take some (a few MiB: tcp_rmem autotuning)
        assert sent < len(stream) // 2, f"the node read {sent} bytes behind a pending answer"
        slow.sock.settimeout(TIMEOUT_S)
        status, _, got = slow.answer()
        assert status == 200 and got == big
        whole, rest = divmod(sent, len(put))
        slow.send(stream[sent:(whole + 1) * len(put)] if rest else b"")
        statuses = [slow.answer()[0] for _ in range(whole + (1 if rest else 0))]
        assert statuses == [201] + [200] * (len(statuses) - 1)   # in order: new, replaced
    finally:
        slow.close()
    status, _, got = once(fast, request("GET", "/v1/fragments/f.piled"))
    assert status == 200 and got == one


def _cached(path: str) -> bool:
    from node import zerocopy
    fd = os.open(path, os.O_RDONLY)
    try:
        return bool(zerocopy.resident(fd, 0, os.fstat(fd).st_size))
    finally:
        os.close(fd)


# ---- shutdown ----------------------------------------------------------------------------
def test_sigterm_closes_idle_connections_and_finishes_a_put_under_way() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="ecstore-fastpath-"))
    try:
        sigterm_mid_put(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def sigterm_mid_put(data_dir: Path) -> None:
    body = os.urandom(300_000)
    data = request("PUT", "/v1/fragments/g.late", body)
    with storage_node(64, {FAST_PATH_ENV: "1"}, data=data_dir) as node:
        idle, busy = Conn(node.port), Conn(node.port)
        idle.send(request("GET", "/v1/fragments/g.none"))
        assert idle.answer()[0] == 404
        busy.send(data[:1000])
        time.sleep(0.2)
        node.proc.send_signal(signal.SIGTERM)
        assert idle.closed_by_node()          # the idle one is closed at once
        busy.send(data[1000:])                # the one under way is answered
        assert busy.answer()[0] == 201
        assert busy.closed_by_node()
        assert node.proc.wait(timeout=TIMEOUT_S) == 0
        idle.close()
        busy.close()
    with storage_node(64, {FAST_PATH_ENV: "1"}, data=data_dir) as node:
        assert once(node, request("GET", "/v1/fragments/g.late"))[2] == body
