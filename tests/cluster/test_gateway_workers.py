"""`--workers N`: gateway processes share one port, and the gateway's own process (the pid
cluster.json records) keeps N of them serving: a worker that dies (SIGKILL, a crash) or
stops answering (SIGSTOP) is replaced within a bound, one that crashes at start is retried
with a backoff (no fork loop), SIGTERM stops them all, and a killed gateway process takes
its workers with it (no orphans serving a stale cluster).

Which processes serve is read from /proc (the processes of the gateway's process group
holding a listening socket on its port), so a test means the same whatever process
serves: the old design (the first process served too) fails them for what they prove.
"""
from __future__ import annotations

import base64
import json
import os
import re
import resource
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.localcluster import LocalCluster, pid_alive
from tests.cluster.conftest import wait_for
from tests.cluster.s3_fixtures import gateway_cluster

WORKERS = 3
STALL_TIMEOUT_S = 3.0             # ECSTORE_GATEWAY_WORKER_TIMEOUT_S for these tests
REPLACED_WITHIN_S = 15.0          # reap or stall timeout, backoff, start, and slack
CLIENT_TIMEOUT_S = 3.0            # a request that hangs longer is a failure
LOOP_REQUESTS = 60                # new connections: a stuck worker of 3 gets ~20
MAX_BACKOFF_S = 30.0              # node.workers.RESTART_BACKOFF_MAX_S


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    env = {"ECSTORE_GATEWAY_WORKERS": str(WORKERS), "ECSTORE_METRICS_PUBLIC": "1",
           "ECSTORE_GATEWAY_WORKER_TIMEOUT_S": str(STALL_TIMEOUT_S)}
    with gateway_cluster(request, "ecstore-gwworkers-", fsync=False, env=env) as c:
        yield c


@pytest.fixture
def gw(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster with its gateway up and WORKERS processes serving: started again when a
    test before killed it or left it short of workers."""
    deadline = time.monotonic() + REPLACED_WITHIN_S
    while len(serving(cluster)) != WORKERS and time.monotonic() < deadline:
        time.sleep(0.1)
    if len(serving(cluster)) != WORKERS:
        cluster.stop_node("gw1")
        cluster.start_node("gw1")
        cluster.wait_healthy(["gw1"])
    wait_for(lambda: len(serving(cluster)) == WORKERS, REPLACED_WITHIN_S,
             f"{WORKERS} gateway processes listening")
    yield cluster
    for pid in group(cluster):   # a test that failed may leave a worker stopped
        os.kill(pid, signal.SIGCONT)


# ---- who serves, read from /proc -------------------------------------------------------------
def group(c: LocalCluster) -> list[int]:
    """The processes of the gateway's process group (it is a session leader)."""
    leader = c.nodes["gw1"].pid
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == leader:   # state, pgrp
            out.append(int(name))
    return out


def listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # LISTEN
                    inodes.add(cols[9])
    return inodes


def serving(c: LocalCluster) -> set[int]:
    """Pids of the gateway's processes holding a listening socket on its port."""
    inodes = {f"socket:[{i}]" for i in listening_inodes(c.nodes["gw1"].port)}
    out = set()
    for pid in group(c):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                out.add(pid)
        except OSError:
            continue
    return out


def replaced(c: LocalCluster, victim: int) -> bool:
    """WORKERS processes serve and the victim is not one of them, in one reading of /proc:
    two readings, the first while the killed victim still held its socket, the second
    after, once passed with only WORKERS - 1 serving (CI, stop 32)."""
    now = serving(c)
    return len(now) == WORKERS and victim not in now


def a_worker(c: LocalCluster) -> int:
    """A serving process that is not the one cluster.json names (that one's own death is
    the last test's)."""
    return min(serving(c) - {c.nodes["gw1"].pid})


def health_loop(c: LocalCluster, n: int = LOOP_REQUESTS) -> list[int]:
    """n health checks, each on a new connection (the kernel spreads them over the
    workers) with a CLIENT_TIMEOUT_S timeout; the pids that answered. Fails on the first
    that does not succeed."""
    pids = []
    for i in range(n):
        try:
            with urllib.request.urlopen(c.nodes["gw1"].url + "/_ecstore/health",
                                        timeout=CLIENT_TIMEOUT_S) as r:
                body = json.loads(r.read())
        except (OSError, urllib.error.URLError) as exc:
            pytest.fail(f"request {i + 1} of {n} failed: {exc!r}")
        assert body["ok"] is True
        pids.append(body.get("pid"))
    return pids


def metric(c: LocalCluster, name: str) -> float | None:
    """A metric of the gateway (whichever worker answers: they share these), None if absent."""
    with urllib.request.urlopen(c.nodes["gw1"].url + "/_ecstore/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def status_json(c: LocalCluster) -> dict[str, Any]:
    """The status page's data, signed in with the gateway's admin key (HTTP Basic)."""
    auth = base64.b64encode(f"{c.s3_keys['access_key']}:{c.s3_keys['secret_key']}".encode())
    req = urllib.request.Request(c.nodes["gw1"].url + "/ui/status.json",
                                 headers={"Authorization": "Basic " + auth.decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return dict(json.loads(r.read()))


def log_lines(c: LocalCluster, what: str) -> list[str]:
    return [ln for ln in (c.dir / "logs" / "gw1.log").read_text().splitlines() if what in ln]


# ---- the tests ---------------------------------------------------------------------------------
def test_a_killed_worker_is_replaced_and_logged(gw: LocalCluster) -> None:
    restarts = metric(gw, "ecstore_gateway_worker_restarts_total") or 0.0
    victim = a_worker(gw)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: replaced(gw, victim),
             REPLACED_WITHIN_S, "a new worker in place of the killed one")
    new = serving(gw) - {victim}
    answered = health_loop(gw)
    assert set(answered) <= new and len(set(answered)) == WORKERS, (answered, new)
    [line] = [ln for ln in log_lines(gw, "worker exited") if f"pid={victim} " in ln]
    assert "SIGKILL" in line and "WARNING" in line, line
    assert metric(gw, "ecstore_gateway_worker_restarts_total") == restarts + 1
    workers = status_json(gw)["workers"]
    assert workers["restarts"] == restarts + 1 and workers["supervised"] is True
    assert (workers["configured"], workers["running"]) == (WORKERS, WORKERS)


def test_a_stopped_worker_is_killed_and_replaced(gw: LocalCluster) -> None:
    """SIGSTOP: the kernel keeps giving the stopped worker's socket 1/N of new
    connections, which hang; its missing heartbeats get it killed and replaced."""
    stalls = metric(gw, "ecstore_gateway_worker_stalls_total") or 0.0
    victim = a_worker(gw)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: replaced(gw, victim),
                 REPLACED_WITHIN_S, "the stopped worker to be replaced")
    finally:
        if pid_alive(victim):
            os.kill(victim, signal.SIGCONT)
    print(f"\nstopped worker replaced {time.monotonic() - stopped:.1f} s after SIGSTOP")
    health_loop(gw)   # no request hangs any more
    [line] = [ln for ln in log_lines(gw, "worker stalled") if f"pid={victim} " in ln]
    assert "SIGKILL" in line, line
    assert metric(gw, "ecstore_gateway_worker_stalls_total") == stalls + 1


def test_a_worker_that_crashes_at_start_is_retried_with_a_backoff(gw: LocalCluster) -> None:
    """Workers started while the gateway process cannot give them memory (its address space
    limit, inherited by a fork) die at start; the retries back off instead of looping, and
    a worker serves again once memory is back."""
    parent = gw.nodes["gw1"].pid
    assert parent is not None
    vm_kib = int(re.search(r"VmSize:\s+(\d+)", Path(f"/proc/{parent}/status").read_text())[1])
    before = len(log_lines(gw, "worker exited"))
    # room for the gateway process's own loop, not for a worker's threads (8 MiB stacks);
    # the soft limit only: raising a hard limit again needs privileges
    _, hard = resource.prlimit(parent, resource.RLIMIT_AS)
    resource.prlimit(parent, resource.RLIMIT_AS, ((vm_kib + 4096) * 1024, hard))
    try:
        os.kill(a_worker(gw), signal.SIGKILL)
        time.sleep(6.0)
        exits = len(log_lines(gw, "worker exited")) - before
        # the killed one, then retries after 0.5, 1, 2 s (+ start): a loop would be hundreds
        assert 2 <= exits <= 6, log_lines(gw, "worker exited")[before:]
        assert len(serving(gw)) == WORKERS - 1
    finally:
        resource.prlimit(parent, resource.RLIMIT_AS, (hard, hard))
    wait_for(lambda: len(serving(gw)) == WORKERS, MAX_BACKOFF_S + 10.0,
             "a worker to start once memory is back")
    health_loop(gw)
    assert pid_alive(parent)


def test_sigterm_stops_every_worker_promptly_a_stopped_one_too(gw: LocalCluster) -> None:
    workers = serving(gw)
    os.kill(a_worker(gw), signal.SIGSTOP)
    started = time.monotonic()
    gw.stop_node("gw1")
    wait_for(lambda: not any(pid_alive(p) for p in workers), 5.0, "every worker to exit")
    assert time.monotonic() - started < 5.0
    assert not group(gw)


def test_workers_die_with_the_gateway_process(gw: LocalCluster) -> None:
    parent = gw.nodes["gw1"].pid
    assert parent is not None
    workers = serving(gw)
    os.kill(parent, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) or os.path.exists(f"/proc/{p}") for p in workers),
             timeout_s=15, what="gateway workers to exit after their parent died")
