"""Requests between nodes sign their x-ecstore-* headers: a request captured on the network
cannot be sent again with other ones (a fragment's metadata, its uncached flag, the
request id). A request that signs none - a client of an earlier version - is still taken."""
from __future__ import annotations

import http.client
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from cli.localcluster import LocalCluster
from store.auth import SIGNED_HEADERS_HEADER, sign_headers
from store.client_base import new_version_id
from store.crc import crc32
from store.digest import digest
from store.striping import fragment_id
from store.transport import REQUEST_ID_HEADER
from store.wire import FRAGMENT_META_HEADER, UNCACHED, UNCACHED_HEADER, pack_header
from tests.cluster.conftest import running_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster("ecstore-signed-", storage=2, control=1, k=1, m=1,
                         gateway=False) as c:
        yield c


def send(url: str, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> int:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def fragment_put(cluster: LocalCluster) -> tuple[str, str, bytes, dict[str, str]]:
    """(node url, path, body, its x-ecstore-* headers) of a new fragment."""
    body = b"fragment bytes " * 100
    vid = new_version_id()
    meta = {"bucket": "b", "key": "k", "version_id": vid, "segment": 0, "index": 0,
            "crc32": crc32(body)}
    ours = {FRAGMENT_META_HEADER: pack_header(meta), REQUEST_ID_HEADER: "SIGNEDHDRTEST0001"}
    return cluster.nodes["s1"].url, f"/v1/fragments/{fragment_id(vid, 0, 0)}", body, ours


def test_a_request_with_its_headers_signed_is_taken(cluster: LocalCluster) -> None:
    url, path, body, ours = fragment_put(cluster)
    signed = sign_headers(cluster.secret, "PUT", path, digest(body), headers=ours)
    assert signed[SIGNED_HEADERS_HEADER] == ";".join(sorted(ours))
    assert send(url, "PUT", path, {**signed, **ours}, body) < 300


@pytest.mark.parametrize("change", ["other meta", "unsigned extra", "signed one missing",
                                    "list reordered", "auth header listed"])
def test_a_request_with_other_headers_than_it_signed_is_refused(cluster: LocalCluster,
                                                                 change: str) -> None:
    url, path, body, ours = fragment_put(cluster)
    signed = sign_headers(cluster.secret, "PUT", path, digest(body), headers=ours)
    sent = {**signed, **ours}
    if change == "other meta":       # the fragment said to be another object's
        other = {"bucket": "b", "key": "other", "version_id": new_version_id(), "segment": 0,
                 "index": 0, "crc32": crc32(body)}
        sent[FRAGMENT_META_HEADER] = pack_header(other)
    elif change == "unsigned extra":
        sent[UNCACHED_HEADER] = UNCACHED
    elif change == "signed one missing":
        del sent[REQUEST_ID_HEADER]
    elif change == "list reordered":
        sent[SIGNED_HEADERS_HEADER] = ";".join(sorted(ours, reverse=True))
    else:
        sent[SIGNED_HEADERS_HEADER] += ";x-ecstore-date"
    assert send(url, "PUT", path, sent, body) == 401


def test_a_request_of_an_earlier_client_signing_no_headers_is_taken(cluster: LocalCluster) -> None:
    """Nodes are upgraded before clients: an older client's request, its x-ecstore-*
    headers not signed, still works (on the storage node's fast path and on a control
    node's aiohttp routes alike)."""
    url, path, body, ours = fragment_put(cluster)
    old = sign_headers(cluster.secret, "PUT", path, digest(body))
    assert SIGNED_HEADERS_HEADER not in old
    assert send(url, "PUT", path, {**old, **ours}, body) < 300
    status = "/v1/status"
    control = cluster.nodes["c1"].url
    rid = {REQUEST_ID_HEADER: "OLDCLIENT0000001"}
    assert send(control, "GET", status, {**sign_headers(cluster.secret, "GET", status), **rid}) == 200
    new = sign_headers(cluster.secret, "GET", status, headers=rid)
    assert send(control, "GET", status, {**new, **rid}) == 200
    assert send(control, "GET", status, {**new, REQUEST_ID_HEADER: "CHANGED000000001"}) == 401
