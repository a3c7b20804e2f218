"""A request head (request line and headers, to the blank line) must arrive whole within
MAX_REQUEST_HEAD_BYTES and the head timeout (node.server.ConnectionCap): past them 431 or
408 and the connection closes, on every front (a storage and a control node's fast path,
aiohttp's alone), so unfinished heads cannot hold a node's memory or its slots."""
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.rawhttp import exchange, head_bytes, signed
from tests.cluster.storagenode import SECRET, Node, control_node, health, storage_node

REQUEST_HEAD_TIMEOUT_ENV = "ECSTORE_REQUEST_HEAD_TIMEOUT_S"  # node.server's
HEAD_TIMEOUT_S = 2          # the nodes' here; cut off within one sweep tick (1 s) more
CUT_OFF_S = HEAD_TIMEOUT_S + 3.0
ENV = {REQUEST_HEAD_TIMEOUT_ENV: str(HEAD_TIMEOUT_S)}
PAD = b"X-Pad-%03d: " + b"a" * 8000 + b"\r\n"   # under aiohttp's 8190 per line
FLOOD_CONNECTIONS = 200
MAX_RSS_GROWTH_MIB = 100


@pytest.fixture(scope="module", params=["storage", "storage-aiohttp", "control"])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    if request.param == "control":
        ctx = control_node(ENV)
    else:
        env = {**ENV, "ECSTORE_FAST_PATH": "0" if request.param == "storage-aiohttp" else "1"}
        ctx = storage_node(FLOOD_CONNECTIONS + 64, env)
    with ctx as n:
        yield n
        text = n.log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


def connect(node: Node) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port), timeout=CUT_OFF_S + 5)


def answer_and_close(s: socket.socket, within_s: float) -> bytes:
    """What the node sent until it closed, which must be within `within_s`."""
    deadline = time.monotonic() + within_s
    data = b""
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the node did not close within {within_s} s: {data[:200]!r}")


def rss_mib(node: Node) -> float:
    for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def health_on(s: socket.socket, node: Node) -> bytes:
    s.sendall(head_bytes("GET", b"/v1/health", node.port, []))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        assert chunk, data
        data += chunk
    return data


def test_a_head_trickled_without_its_end_is_cut_off_with_408(node: Node) -> None:
    t0 = time.monotonic()
    with connect(node) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        data = b""
        for i in range(int(CUT_OFF_S * 10)):   # a header every 0.1 s, never the blank line
            try:
                s.sendall(b"X-%d: y\r\n" % i)
            except OSError:
                break
            s.settimeout(0.1)
            try:
                data = s.recv(4096)
            except TimeoutError:
                continue
            break
        assert data.startswith(b"HTTP/1.1 408 "), data
        assert b"Connection: close" in data
    assert time.monotonic() - t0 < CUT_OFF_S
    assert health(node) == 200


def test_a_connection_that_sends_nothing_is_closed_with_408(node: Node) -> None:
    with connect(node) as s:
        assert answer_and_close(s, CUT_OFF_S).startswith(b"HTTP/1.1 408 ")


def test_a_head_over_the_size_limit_is_431(node: Node) -> None:
    with connect(node) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        try:   # refused part way: the node reads on and drops what comes, for a while
            for i in range(126):
                s.sendall(PAD.replace(b"%03d", b"%03d" % i))
        except OSError:
            pass
        assert answer_and_close(s, CUT_OFF_S).startswith(b"HTTP/1.1 431 ")


def test_a_later_head_on_a_keep_alive_connection_is_bounded_too(node: Node) -> None:
    with connect(node) as s:
        body = b"b" * 100_000   # a body the bound must not count, then a head too long
        s.sendall(head_bytes("GET", b"/v1/health", node.port,
                             [("Content-Length", str(len(body)).encode())]) + body)
        first = health_on(s, node)   # the answer to the first, then to a second request
        while first.count(b"HTTP/1.1 200 ") < 2:
            chunk = s.recv(4096)
            assert chunk, first
            first += chunk
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"
                  + b"".join(PAD.replace(b"%03d", b"%03d" % i) for i in range(9)))
        assert b"HTTP/1.1 431 " in answer_and_close(s, CUT_OFF_S)


def test_a_slow_head_within_the_deadline_is_served(node: Node) -> None:
    head = head_bytes("GET", b"/v1/health", node.port, [("Connection", b"close")])
    with connect(node) as s:
        step = max(1, len(head) // 10)
        for i in range(0, len(head), step):   # ~1 s in all, under HEAD_TIMEOUT_S
            s.sendall(head[i:i + step])
            time.sleep(0.1)
        assert answer_and_close(s, CUT_OFF_S).startswith(b"HTTP/1.1 200 ")


def test_many_unfinished_heads_leave_the_rss_bounded(node: Node) -> None:
    before = rss_mib(node)
    socks = []
    try:
        for _ in range(FLOOD_CONNECTIONS):
            s = connect(node)
            s.setblocking(False)
            socks.append(s)
            try:
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"
                          + b"".join(PAD.replace(b"%03d", b"%03d" % i) for i in range(126)))
            except OSError:
                pass   # refused part way (431) or the socket buffer full
        time.sleep(1.0)
        during = rss_mib(node)
        print(f"rss before {before:.1f} MiB, with {FLOOD_CONNECTIONS} unfinished heads "
              f"{during:.1f} MiB")
        assert during - before < MAX_RSS_GROWTH_MIB
        assert health(node) == 200   # a normal request right after
    finally:
        for s in socks:
            s.close()


def test_the_refused_heads_are_counted(node: Node) -> None:
    answer = exchange(node.port, "GET", head_bytes("GET", b"/metrics", node.port,
                                                   signed(SECRET, "GET", b"/metrics", b"")))
    text = answer.body.decode()
    assert 'ecstore_http_heads_refused_total{reason="timeout"}' in text, text[-2000:]
    assert 'ecstore_http_heads_refused_total{reason="size"}' in text
