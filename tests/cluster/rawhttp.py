"""HTTP/1.1 over a raw socket, for tests that must send what no client library would:
bytes that are not UTF-8 in the request target, garbage headers, bodies cut short,
broken chunking. Every exchange has a timeout: a node that hangs fails the test."""
from __future__ import annotations

import hashlib
import http.client
import socket
import struct
from dataclasses import dataclass, field

from store.auth import sign_headers
from store.digest import digest

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    """What came back; status None when the node closed without answering."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def signed(secret: str, method: str, target: bytes, body: bytes = b"") -> list[tuple[str, bytes]]:
    """The cluster-secret signing headers for a request (target must be UTF-8)."""
    hdrs = sign_headers(secret, method, target.decode(), hashlib.sha256(body).hexdigest())
    return [(k, v.encode()) for k, v in hdrs.items()]


def signed_request(secret: str, method: str, target: str, body: bytes = b"",
                   headers: dict[str, str] | None = None, checksum: str | None = None,
                   port: int = 0) -> bytes:
    """A whole signed request, as the nodes' client sends one (store.fetch): the body's
    checksum is its fragment digest unless `checksum` says otherwise."""
    hdrs = sign_headers(secret, method, target, checksum or digest(body))
    hdrs.update(headers or {})
    fields = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return (f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{fields}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def head_bytes(method: str, target: bytes, port: int, headers: list[tuple[str, bytes]]) -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", f"Host: 127.0.0.1:{port}".encode()]
    lines += [name.encode("latin-1") + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def exchange(port: int, method: str, data: bytes, *, cut: str = "",
             timeout_s: float = TIMEOUT_S) -> Answer:
    """Send `data` (head and body) on a new connection and read one answer.

    cut="close": close right after sending, read nothing (a client that vanished).
    cut="half": shut our sending side after the data, then read (a body cut short).
    A socket timeout propagates: a node must answer or close in time.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the node answered (and closed) before taking everything: read it
        if cut == "close":
            return Answer(None)
        if cut == "half":
            s.shutdown(socket.SHUT_WR)
        resp = http.client.HTTPResponse(s, method=method)
        try:
            resp.begin()
            body = resp.read()
        except (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError):
            return Answer(None)
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)


class Conn:
    """One keep-alive connection; answers read in order, their bodies by Content-Length."""

    def __init__(self, port: int, rcvbuf: int = 0) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(("127.0.0.1", port))
        self.pending = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self, n: int = 65536) -> None:
        chunk = self.sock.recv(n)
        if not chunk:
            raise ConnectionError(f"closed by the node; unread: {self.pending[:200]!r}")
        self.pending += chunk

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        status = 100
        while status < 200:      # past a 100 Continue
            while b"\r\n\r\n" not in self.pending:
                self._more()
            head, _, self.pending = self.pending.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers["content-length"])
        while len(self.pending) < n:
            self._more()
        body, self.pending = self.pending[:n], self.pending[n:]
        return status, headers, body

    def closed_by_node(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self, reset: bool = False) -> None:
        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def first_answer(port: int, data: bytes) -> tuple[int, bytes]:
    """(status, body) of the answer to `data` on a Conn of its own; (0, b"") when the
    node closed without one."""
    c = Conn(port)
    try:
        c.send(data)
        try:
            status, _, body = c.answer()
        except ConnectionError:
            return 0, b""
    finally:
        c.close()
    return status, body


def converse(port: int, steps: list[bytes]) -> list[tuple[int, list[str], bytes]]:
    """Each request of `steps` on one keep-alive connection, in turn: (status, header
    names but Date, sorted, body) of each answer."""
    c = Conn(port)
    out = []
    try:
        for data in steps:
            c.send(data)
            status, headers, body = c.answer()
            out.append((status, sorted(h for h in headers if h != "date"), body))
    finally:
        c.close()
    return out
