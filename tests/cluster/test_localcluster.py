"""Local clusters' ports and health checks: a node that cannot bind its port is found
out, never taken for healthy because something else answers there."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from cli.localcluster import (
    PORT_RANGE_ENV,
    LocalCluster,
    _ephemeral_range,
    free_port,
    pid_alive,
)


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    lo, _ = _ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(p < lo for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_port_range_bounds_the_ports_and_a_bad_one_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-23099")
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == 40 and all(23000 <= p <= 23099 for p in ports)
    for bad in ("23000", "x-y", "23100-23000", "80-90", "60000-70000"):
        monkeypatch.setenv(PORT_RANGE_ENV, bad)
        with pytest.raises(ValueError, match=PORT_RANGE_ENV):
            free_port()


def test_another_process_zombie_is_not_alive(tmp_path: Path) -> None:
    """A node that died under a foreground `cluster up` stays a zombie until that process
    reaps it: to every other process it is down, not running."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                               "p = subprocess.Popen(['true']); print(p.pid, flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        for _ in range(100):   # until `true` has exited and is a zombie
            if Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] == "Z":
                break
            time.sleep(0.05)
        assert not pid_alive(child)
        assert pid_alive(parent.pid)
    finally:
        parent.kill()
        parent.wait(timeout=10)


@pytest.fixture(params=["other", "s1"])
def impostor(request: pytest.FixtureRequest) -> Iterator[int]:
    """An HTTP server that answers every health check with 200 as node "other" - or as
    "s1" itself, as an old instance of the node (another secret, another version) would:
    a node this cluster started passes only when its own process answers (its pid)."""
    with health_impostor(request.param) as port:
        yield port


@contextlib.contextmanager
def health_impostor(answers_as: str) -> Iterator[int]:
    """The impostor's server, answering as `answers_as` with pid 1; its port."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"node_id": answers_as, "ok": True, "pid": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_whose_port_is_taken_is_not_healthy(tmp_path: Path, impostor: int) -> None:
    cluster = LocalCluster.create(tmp_path, storage=6, control=1, gateway=False)
    cluster.nodes["s1"].port = impostor        # the storage node will fail to bind
    try:
        cluster.start_node("s1")
        with pytest.raises(RuntimeError, match="s1") as raised:
            cluster.wait_healthy(["s1"], timeout_s=10)
        # the node says why in one line, which the error repeats: no traceback
        said = f"s1: cannot listen on 127.0.0.1:{impostor}: address already in use"
        assert f"exited with 1 ({said})" in str(raised.value)
        log = (tmp_path / "logs" / "s1.log").read_text()
        assert said in log and "Traceback" not in log
    finally:
        cluster.stop()


def test_a_gateway_whose_port_is_taken_is_not_healthy(tmp_path: Path) -> None:
    # the gateway's health answer names the pid of the worker that answered: its own, or
    # with --workers N a child of the process the cluster started - not any other
    with health_impostor("gw1") as port:
        cluster = LocalCluster.create(tmp_path, storage=6, control=1, gateway=True)
        cluster.nodes["gw1"].port = port
        try:
            cluster.start_node("gw1")
            with pytest.raises(RuntimeError, match="gw1 exited with 1"):
                cluster.wait_healthy(["gw1"], timeout_s=20)
        finally:
            cluster.stop()


def test_a_node_started_again_by_one_object_is_stopped_by_another(tmp_path: Path) -> None:
    # start_node kept the new pid in its own object only: a node started again through
    # LocalCluster.load(...) and stopped through another load (as `ecstore cluster down`
    # does) was left running - tests leaked whole clusters' nodes this way
    cluster = LocalCluster.create(tmp_path, storage=6, control=1, gateway=False)
    cluster.start()
    try:
        LocalCluster.load(tmp_path).kill_node("s1")
        again = LocalCluster.load(tmp_path)
        again.start_node("s1")
        again.wait_healthy(["s1"])
        pid = again.nodes["s1"].pid
        assert pid_alive(pid) and LocalCluster.load(tmp_path).nodes["s1"].pid == pid
    finally:
        LocalCluster.load(tmp_path).stop()
    for _ in range(100):
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    assert not pid_alive(pid)
