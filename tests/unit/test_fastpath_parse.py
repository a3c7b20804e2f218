"""node.fastpath.parse_head: which request heads the storage node's fast path answers
itself (a signed fragment GET or PUT it can answer exactly as aiohttp would), and which
it hands to aiohttp (everything else: None); and the client's lanes match the storage and
control nodes' fast paths."""
from __future__ import annotations

import re

import pytest

from node.control import RecordRoutes
from node.fastpath import parse_head, route_fragment
from store.auth import sign_headers
from store.digest import digest
from store.fetch import data_lane
from store.transport import REQUEST_ID_HEADER
from store.wire import FRAGMENT_META_HEADER, pack_header

SECRET = "s" * 32
MAX_BODY = 1000


def head(method: str = "GET", target: str = "/v1/fragments/v1.0.2", body: bytes = b"",
         extra: str = "", length: str | None = None, version: str = "HTTP/1.1") -> bytes:
    hdrs = sign_headers(SECRET, method, target, digest(body))
    fields = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    cl = f"Content-Length: {len(body) if length is None else length}\r\n" if length != "" else ""
    return f"{method} {target} {version}\r\nHost: h\r\n{fields}{extra}{cl}".rstrip(
        "\r\n").encode()


def test_signed_fragment_gets_and_puts_are_taken() -> None:
    req = parse_head(head(), MAX_BODY)
    assert req is not None and (req.method, req.arg, req.length, req.op) == (
        "GET", ("v1.0.2", {}), 0, "get_fragment")
    meta = f"{FRAGMENT_META_HEADER}: {pack_header({'crc32': 7})}\r\n"
    req = parse_head(head("PUT", body=b"x" * 10, extra=meta), MAX_BODY)
    assert req is not None and (req.method, req.length, req.op) == ("PUT", 10, "put_fragment")
    assert req.arg == ("v1.0.2", {"crc32": 7})
    assert parse_head(head(length=""), MAX_BODY) is not None          # GET, no length
    assert parse_head(head("PUT", body=b"x" * MAX_BODY), MAX_BODY) is not None
    assert parse_head(head(extra="Connection: Keep-Alive\r\n"), MAX_BODY) is not None


def test_a_request_id_is_kept_when_well_formed_else_made() -> None:
    req = parse_head(head(extra=f"{REQUEST_ID_HEADER}: abc-123\r\n"), MAX_BODY)
    assert req is not None and req.rid == "abc-123"
    req = parse_head(head(extra=f"{REQUEST_ID_HEADER}: bad id!\r\n"), MAX_BODY)
    assert req is not None and req.rid != "bad id!" and len(req.rid) == 16


def stable_id(data: bytes) -> str:
    """The case's name without the signed headers, which hold the time: every run (and
    every pytest-xdist worker) collects the same names."""
    return repr(re.sub(rb"x-ecstore-[a-z-]+: [^\r]*\r\n", b"", data)[:60])


@pytest.mark.parametrize("data", [
    head("HEAD"), head("DELETE"), head("POST"),
    head(target="/v1/fragments/v1.0.2/verify"), head(target="/v1/fragments/v1.0.2?x=1"),
    head(target="/v1/fragments/a..b"), head(target="/v1/fragments/%41"),
    head(target="/v1/fragments/"), head(target="/v1/health"), head(target="/metrics"),
    head(version="HTTP/1.0"),
    head(extra="Connection: close\r\n"),
    head(extra="Transfer-Encoding: chunked\r\n"),
    head(extra="Expect: 100-continue\r\n"),
    head(extra="Upgrade: h2c\r\n"),
    head(extra="Host: again\r\n"),                              # a repeated header
    head(extra="x-bad : 1\r\n"), head(extra="no colon\r\n"), head(extra=" folded\r\n"),
    head(extra="x(y): 1\r\n"), head(extra=": empty name\r\n"),
    head(extra="x-note: caf\u00e9\r\n"), head(extra="x-note: a\x01b\r\n"),
    head(extra="x-long: " + "a" * 9000 + "\r\n"),
    head(length="5"),                                           # a GET with a body
    head("PUT", length=""),                                     # a PUT without a length
    head("PUT", length="-1"), head("PUT", length="1e3"), head("PUT", length=str(MAX_BODY + 1)),
    head("PUT", extra=f"{FRAGMENT_META_HEADER}: !!\r\n"),
    b"GET /v1/fragments/v1.0.2 HTTP/1.1\r\nHost: h",            # unsigned
    head().replace(b"x-ecstore-signature: ", b"x-ecstore-signature: zz"),   # malformed
    b"GET  /v1/fragments/v1.0.2 HTTP/1.1\r\nHost: h",
    b"\xff\xfe",
], ids=stable_id)
def test_anything_else_goes_to_aiohttp(data: bytes) -> None:
    assert parse_head(data, MAX_BODY) is None


# every kind of request the client library sends a node (store.*)
CLIENT_REQUESTS = [
    ("GET", "/v1/fragments/v1.0.2"), ("PUT", "/v1/fragments/v1.0.2"),
    ("HEAD", "/v1/fragments/v1.0.2"), ("DELETE", "/v1/fragments/v1.0.2"),
    ("POST", "/v1/fragments/v1.0.2/verify"), ("GET", "/v1/fragments?after=x&limit=10"),
    ("GET", "/v1/quarantine"), ("POST", "/v1/scrub"), ("GET", "/v1/status"),
    ("GET", "/v1/objects/b/k%2F1"), ("PUT", "/v1/objects/b/k%2F1"),
    ("POST", "/v1/objects"), ("POST", "/v1/objects/read"),
    ("DELETE", "/v1/objects/b/k?version_id=v1"), ("DELETE", "/v1/records/b/k?version_id=v"),
    ("GET", "/v1/map"), ("PUT", "/v1/map"), ("GET", "/v1/list/b?prefix=a&limit=10"),
    ("POST", "/v1/access"), ("GET", "/v1/access/b"), ("GET", "/v1/health"),
    ("GET", "/v1/buckets"), ("GET", "/v1/buckets/b"), ("PUT", "/v1/buckets/b"),
    ("GET", "/metrics"),
]


@pytest.mark.parametrize("method,target", CLIENT_REQUESTS)
def test_the_clients_data_lane_is_what_the_fast_paths_answer(method: str, target: str) -> None:
    """store.fetch.data_lane keeps the client's pooled connections apart: the requests a
    node's fast path answers on one lane, the rest (which hand a connection to aiohttp for
    good) on another."""
    length = 10 if method in ("PUT", "POST") else 0
    headers = {"content-length": str(length)}
    taken = (route_fragment(method, target, headers, length) is not None
             or RecordRoutes().route(method, target, headers, length) is not None)
    assert data_lane(method, target) == taken
