"""A cluster whose every node runs in its own network namespace, for partition tests.

Topology (one run):

    ns <prefix>br:  bridge br0, one port p-<host> per host (the "switch")
    ns <prefix>c1 .. c3, <prefix>s1 .. s7:  one node process each, eth0 = 10.231.X.<n>
    ns <prefix>cl:  the client (the test's own client code runs in a thread inside it)

Every name starts with a per-run prefix (`ecsnt<pid>-`), so parallel runs never clash and
leftovers of a dead run are found and removed by the next one. Nothing is added to the
root namespace: the bridge lives in its own namespace, so deleting the namespaces removes
every veth, route and address of the run.

Faults:
- `isolate(host)`: the host's switch port goes down (a pulled cable): packets to and from
  it vanish, so connects and requests on open connections hang until the caller's timeout.
- `cut(a, b)`: a blackhole route on each side for the other's address: only that pair
  stops talking; a new connect from either side fails at once, a request on an open
  connection hangs.
- `heal()`: undo every fault.

The test's client code does not use `ip netns exec`: `run_in_netns` runs a function on a
thread that first enters the client namespace with setns(2); threads it starts (an asyncio
loop's executor, a SyncClient's loop) inherit that namespace, so every socket the client
opens lives in the client namespace and the cuts apply to it.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cli.bootstrap import NodeArg, initial_map, install
from cli.localcluster import node_health

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
NETNS_DIR = Path("/run/netns")
PREFIX_BASE = "ecsnt"
PREFIX_RE = re.compile(rf"^{PREFIX_BASE}(\d+)-")
CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 10.0
HEALTH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
CONTROL_PORT = 7000   # every host has its own address, so every node can use the same port
STORAGE_PORT = 7100
CLIENT_HOST = "cl"
BRIDGE = "br"


class NetnsUnavailable(Exception):
    """Network namespaces cannot be used here (not root, no `ip`, `ip netns add` fails)."""


class NetnsTimeout(TimeoutError):
    """A function run by run_in_netns did not return in time."""


def run_prefix(pid: int | None = None) -> str:
    return f"{PREFIX_BASE}{os.getpid() if pid is None else pid}-"


def subnet_for(pid: int) -> str:
    """The run's /24 (first three octets). Each run's hosts sit behind their own bridge in
    their own namespaces, so two runs with the same subnet would not clash either."""
    return f"10.231.{pid % 254 + 1}"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS`; raise RuntimeError with its stderr when check and it fails."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def netns_list() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def check_netns_usable() -> None:
    """Raise NetnsUnavailable saying why this machine cannot run the partition tests."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("partition tests need root for `ip netns add` "
                               f"(running as uid {os.geteuid()})")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("partition tests need iproute2's `ip` command on PATH")
    probe = run_prefix() + "probe"
    try:
        proc = ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsUnavailable(f"`ip netns add` failed: {exc}") from None
    if proc.returncode != 0:
        raise NetnsUnavailable(f"`ip netns add {probe}` failed: {proc.stderr.strip()}")
    ip("netns", "del", probe, check=False)


# ---- entering a namespace from a thread ----------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def enter_netns(name: str) -> None:
    """Move the calling thread (only it) into network namespace `name` (setns(2))."""
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(name: str, fn: Callable[[], T], timeout_s: float) -> T:
    """fn() on a fresh thread inside namespace `name`; its result or its exception.

    Raises NetnsTimeout when fn has not returned after timeout_s (the thread is a daemon
    and is left behind: stopping the nodes makes whatever it waits on fail)."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            enter_netns(name)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=main, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise NetnsTimeout(f"{getattr(fn, '__name__', 'function')} in {name} did not finish "
                           f"within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# ---- removing a run's namespaces -----------------------------------------------------------
def remove_netns(name: str) -> None:
    """Kill every process still inside namespace `name` (only our node processes run there),
    then delete it. A namespace with a live process in it would outlive its name."""
    out = ip("netns", "pids", name, check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ip("netns", "del", name, check=False)


def sweep_leftovers(own_prefix: str) -> list[str]:
    """Delete namespaces of this run's prefix and of runs whose process is gone (a crashed
    or killed test run). Namespaces of live runs are left alone. Returns the names removed."""
    removed = []
    for name in netns_list():
        m = PREFIX_RE.match(name)
        if m is None:
            continue
        if name.startswith(own_prefix) or not pid_alive_any(int(m.group(1))):
            remove_netns(name)
            removed.append(name)
    return removed


def pid_alive_any(pid: int) -> bool:
    """Whether any process has this pid (not only our children)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- the cluster ---------------------------------------------------------------------------
@dataclass
class Host:
    id: str            # "c1", "s3", "cl"
    role: str          # "control", "storage" or "client"
    ns: str
    addr: str
    port: int = 0
    data: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}"

    def node_arg(self) -> NodeArg:
        return NodeArg(self.id, self.url)


@dataclass
class NetnsCluster:
    """Nodes in namespaces behind one bridge. `start()`, then faults, then `stop()`."""

    dir: Path
    storage: int = 7
    control: int = 3
    k: int = 4
    m: int = 2
    fsync: bool = False   # partitions do not lose power; fsync only slows two busy cores
    secret: str = field(default_factory=lambda: os.urandom(24).hex())
    pid: int = field(default_factory=os.getpid)
    hosts: dict[str, Host] = field(default_factory=dict)
    cuts: set[tuple[str, str]] = field(default_factory=set)
    isolated: set[str] = field(default_factory=set)
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prefix = run_prefix(self.pid)
        net = subnet_for(self.pid)
        specs = [(f"c{i}", "control", 10 + i, CONTROL_PORT) for i in range(1, self.control + 1)]
        specs += [(f"s{i}", "storage", 100 + i, STORAGE_PORT) for i in range(1, self.storage + 1)]
        specs.append((CLIENT_HOST, "client", 200, 0))
        for hid, role, octet, port in specs:
            data = str(self.dir / hid) if role != "client" else ""
            self.hosts[hid] = Host(hid, role, self.prefix + hid, f"{net}.{octet}", port, data)

    @property
    def path(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def client_ns(self) -> str:
        return self.hosts[CLIENT_HOST].ns

    def nodes(self, role: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.role == role]

    def log_path(self, host_id: str) -> Path:
        return self.dir / "logs" / f"{host_id}.log"

    # ---- bring up and tear down ------------------------------------------------------------
    def start(self) -> None:
        """Namespaces, bridge and veths; node processes; wait for health; install the map
        with `ecstore cluster bootstrap`'s code; write cluster.json. On any failure the
        caller must still call stop()."""
        sweep_leftovers(self.prefix)
        self._build_network()
        for h in self.hosts.values():
            if h.role != "client":
                self._start_node(h)
        run_in_netns(self.client_ns, self._wait_healthy, HEALTH_TIMEOUT_S + 5)
        control = [h.node_arg() for h in self.nodes("control")]
        cmap = initial_map(control, [h.node_arg() for h in self.nodes("storage")], self.k, self.m)
        run_in_netns(self.client_ns, lambda: install(self.secret, control, cmap), 30.0)
        self._write_cluster_json()

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self.created.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _build_network(self) -> None:
        br = self.prefix + BRIDGE
        self._add_netns(br)
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        for h in self.hosts.values():
            self._add_netns(h.ns)
            port = f"p-{h.id}"
            ip("-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", h.ns)
            ip("-n", br, "link", "set", port, "master", "br0", "up")
            ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            ip("-n", h.ns, "link", "set", "eth0", "up")

    def _start_node(self, h: Host) -> None:
        Path(h.data).mkdir(parents=True, exist_ok=True)
        self.log_path(h.id).parent.mkdir(parents=True, exist_ok=True)
        cmd = ["ip", "netns", "exec", h.ns, sys.executable, "-m", f"node.{h.role}",
               "--id", h.id, "--data", h.data, "--host", h.addr, "--port", str(h.port)]
        cmd += [] if self.fsync else ["--no-fsync"]
        cmd += ["--scrub-rate-mb-s", "0"] if h.role == "storage" else []
        env = {**os.environ, "ECSTORE_SECRET": self.secret,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(self.log_path(h.id), "ab") as log:  # `ip netns exec` execs: pid = node's
            h.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL, cwd=ROOT,
                                      start_new_session=True)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        pending = [h for h in self.hosts.values() if h.role != "client"]
        while pending:
            for h in pending:
                if h.proc is not None and h.proc.poll() is not None:
                    raise RuntimeError(f"node {h.id} exited with {h.proc.returncode}:\n"
                                       + self.log_tail(h.id))
            pending = [h for h in pending if node_health(h.url, 1.0) is not None]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"nodes not healthy after {HEALTH_TIMEOUT_S:g} s: "
                                   f"{[h.id for h in pending]}")
            time.sleep(0.1 if pending else 0)

    def _write_cluster_json(self) -> None:
        data = {
            "secret": self.secret,
            "control": [h.url for h in self.nodes("control")],
            "gateway": None, "k": self.k, "m": self.m, "fsync": self.fsync,
            "nodes": [{"id": h.id, "role": h.role, "url": h.url, "port": h.port,
                       "data": h.data, "zone": h.id, "tier": "hot", "netns": h.ns,
                       "pid": h.proc.pid if h.proc else None}
                      for h in self.hosts.values() if h.role != "client"],
        }
        self.path.write_text(json.dumps(data, indent=2) + "\n")
        os.chmod(self.path, 0o600)

    def stop(self) -> None:
        """Stop every node process and delete every namespace of the run. Safe to call on a
        half-started cluster and more than once."""
        procs = [h.proc for h in self.hosts.values() if h.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(STOP_TIMEOUT_S)
        for name in reversed(self.created):
            remove_netns(name)
        self.created.clear()
        sweep_leftovers(self.prefix)

    def log_tail(self, host_id: str, lines: int = 20) -> str:
        try:
            text = self.log_path(host_id).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ---- faults ----------------------------------------------------------------------------
    def isolate(self, host_id: str) -> None:
        """Cut host_id from every other host: its switch port goes down."""
        ip("-n", self.prefix + BRIDGE, "link", "set", f"p-{host_id}", "down")
        self.isolated.add(host_id)

    def rejoin(self, host_id: str) -> None:
        ip("-n", self.prefix + BRIDGE, "link", "set", f"p-{host_id}", "up")
        self.isolated.discard(host_id)

    def cut(self, a: str, b: str) -> None:
        """Cut hosts a and b from each other only: a blackhole route on each side."""
        for x, y in ((a, b), (b, a)):
            ip("-n", self.hosts[x].ns, "route", "add", "blackhole", f"{self.hosts[y].addr}/32")
        self.cuts.add((a, b))

    def uncut(self, a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            ip("-n", self.hosts[x].ns, "route", "del", "blackhole", f"{self.hosts[y].addr}/32",
               check=False)
        self.cuts.discard((a, b))

    def heal(self) -> None:
        """Undo every isolate and cut."""
        for a, b in list(self.cuts):
            self.uncut(a, b)
        for h in list(self.isolated):
            self.rejoin(h)

    def reachable(self, src: str, dst: str, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connect from src to dst's node port succeeds within timeout_s."""
        h = self.hosts[dst]

        def connect() -> bool:
            try:
                socket.create_connection((h.addr, h.port), timeout=timeout_s).close()
            except OSError:
                return False
            return True
        return run_in_netns(self.hosts[src].ns, connect, timeout_s + 5)
