"""One storage or control node process of our own on 127.0.0.1, for tests that talk to
a node directly over raw TCP (test_limits: its connection cap; test_fastpath and
test_control_fastpath: the fast path against a node without it)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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


def logged(node: Node, pick: Callable[[str, dict[str, str]], tuple[str, ...] | None],
           at_least: int = 0) -> list[tuple[str, ...]]:
    """What `pick(line, its key=value fields)` makes of each line of the node's log (None:
    left out); once there are `at_least` (the log is written in batches, at most 0.2 s
    apart: on a loaded machine later), at most 10 s."""
    deadline = time.monotonic() + 10.0
    time.sleep(0.3)
    while True:
        out = []
        for line in node.log.read_text(errors="replace").splitlines():
            got = pick(line, dict(kv.split("=", 1) for kv in line.split() if "=" in kv))
            if got is not None:
                out.append(got)
        if len(out) >= at_least or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


@contextlib.contextmanager
def storage_node(max_connections: int, extra_env: dict[str, str] | None = None,
                 data: Path | None = None) -> Iterator[Node]:
    """A storage node process of our own on 127.0.0.1, killed (by its pid) at the end;
    its data in `data` if given (kept), else in a temporary directory (removed)."""
    with node_process("storage", max_connections, extra_env, data,
                      ["--scrub-rate-mb-s", "0"]) as node:
        yield node


@contextlib.contextmanager
def control_node(extra_env: dict[str, str] | None = None) -> Iterator[Node]:
    """A control node process of our own (fsync off, data in a temporary directory)."""
    with node_process("control", 64, extra_env, None, []) as node:
        yield node


@contextlib.contextmanager
def node_process(role: str, max_connections: int, extra_env: dict[str, str] | None,
                 data: Path | None, args: list[str]) -> Iterator[Node]:
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-limits-"))
    port = free_port()
    env = {**os.environ, "ECSTORE_SECRET": SECRET, MAX_CONNECTIONS_ENV: str(max_connections),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(extra_env or {})}
    log = tmp / "node.log"
    node_id = "s1" if role == "storage" else "c1"
    if data is None:
        data = tmp / node_id
        data.mkdir()   # as LocalCluster does
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"node.{role}", "--id", node_id, "--data", str(data),
             "--host", "127.0.0.1", "--port", str(port), "--no-fsync", *args],
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
