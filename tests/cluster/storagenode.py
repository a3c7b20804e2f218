"""One storage node process of our own on 127.0.0.1, for tests that talk to a node
directly over raw TCP (test_limits: its connection cap; test_fastpath: its fast path
against a node without it)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cli.localcluster import free_port
from node.server import MAX_CONNECTIONS_ENV
from tests.cluster.conftest import wait_for
from tests.cluster.rawhttp import exchange, head_bytes

ROOT = Path(__file__).resolve().parents[2]
SECRET = "limits-test-secret-0123456789"
START_TIMEOUT_S = 30.0


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def storage_node(max_connections: int, extra_env: dict[str, str] | None = None,
                 data: Path | None = None) -> Iterator[Node]:
    """A storage node process of our own on 127.0.0.1, killed (by its pid) at the end;
    its data in `data` if given (kept), else in a temporary directory (removed)."""
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-limits-"))
    port = free_port()
    env = {**os.environ, "ECSTORE_SECRET": SECRET, MAX_CONNECTIONS_ENV: str(max_connections),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(extra_env or {})}
    log = tmp / "node.log"
    if data is None:
        data = tmp / "s1"
        data.mkdir()   # as LocalCluster does
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "node.storage", "--id", "s1", "--data", str(data),
             "--host", "127.0.0.1", "--port", str(port), "--no-fsync", "--scrub-rate-mb-s", "0"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    node = Node(port, proc, log)
    try:
        wait_for(lambda: proc.poll() is not None or health(node) == 200, START_TIMEOUT_S,
                   "the node to start")
        assert proc.poll() is None, log.read_text()[-3000:]
        yield node
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def health(node: Node) -> int | None:
    try:
        return exchange(node.port, "GET", head_bytes("GET", b"/v1/health", node.port,
                                                     [("Connection", b"close")]), timeout_s=2).status
    except OSError:
        return None
