"""A node stopped with SIGTERM finishes the requests in flight: an upload still sending
its body when the signal came was cut (aiohttp's shutdown closes every connection, and
drops what arrives after), hung until the 60 s grace ran out and failed, and the node
stopped 60 s late with its port closed - a gateway restarted under S3 load lost uploads
and S3 for 45-60 s (found by a rolling-restart sweep). Here the S3 gateway, a raw HTTP
PUT whose body is half sent when the gateway gets SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from cli.localcluster import LocalCluster, pid_alive
from tests.cluster.s3_fixtures import gateway_cluster, gateway_of, make_client

MiB = 1024 * 1024


@pytest.fixture()
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with gateway_cluster(request, "ecstore-stop-") as c:
        yield c


def test_sigterm_finishes_an_upload_whose_body_is_still_coming(cluster: LocalCluster) -> None:
    s3 = make_client(gateway_of(cluster))
    s3.create_bucket(Bucket="stopping")
    body = os.urandom(MiB)
    url = urlsplit(s3.generate_presigned_url("put_object", Params={"Bucket": "stopping",
                                                                   "Key": "half"}))
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    try:
        sock.sendall(f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:MiB // 2])
        time.sleep(0.5)    # the gateway is reading the body
        gw = cluster.nodes["gw1"]
        assert gw.pid is not None
        os.kill(gw.pid, signal.SIGTERM)
        time.sleep(0.5)    # it stops listening; the upload goes on
        sock.sendall(body[MiB // 2:])
        reply = b""
        started = time.monotonic()
        while b"\r\n\r\n" not in reply and time.monotonic() - started < 30:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    took = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 200"), (reply[:300], took)
    assert took < 10, took
    assert b"connection: close" in reply.lower()   # the next request goes elsewhere
    deadline = time.monotonic() + 15     # and the gateway stops, not 60 s later
    while pid_alive(gw.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(gw.pid), "the gateway did not stop within 15 s of its last request"

    cluster.start_node("gw1")
    cluster.wait_healthy(["gw1"])
    got = make_client(gateway_of(cluster)).get_object(Bucket="stopping", Key="half")
    assert got["Body"].read() == body
