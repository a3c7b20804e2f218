"""A local cluster: every node a process on 127.0.0.1, described by DIR/cluster.json.

Used by `ecstore cluster up/down` and by the cluster tests (kill, restart, wipe a node).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import Node
from placement.policy import Policy
from store.auth import sign_headers
from store.cluster import read_cluster_file
from store.errors import BadRequest
from store.keys import new_key_pair

HEALTH_TIMEOUT_S = 120.0   # a node opening a big store from a cold page cache takes a while
GATEWAY_HEALTH_PATH = "/_ecstore/health"
GATEWAY_REGION = "us-east-1"
STOP_TIMEOUT_S = 10.0


_HANDED_OUT: set[int] = set()          # ports free_port() gave this process
_PORTS = random.Random(secrets.randbits(64))   # its own: tests may seed the module's
LISTEN_PORT_FLOOR = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999                # Linux's default


PORT_RANGE_ENV = "ECSTORE_PORT_RANGE"


def _listen_range() -> tuple[int, int] | None:
    """[first, last) of the ports free_port picks from: ECSTORE_PORT_RANGE=FIRST-LAST when
    set (a firewall's opening; the test suite gives each parallel worker its own), else
    LISTEN_PORT_FLOOR up to the kernel's ephemeral range, None when there is no room."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if spec:
        try:
            first, last = (int(p) for p in spec.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected FIRST-LAST, "
                             "e.g. 20000-20999") from None
        if not 1024 <= first < last <= 65535:
            raise ValueError(f"{PORT_RANGE_ENV}={spec!r}: expected 1024 <= FIRST < LAST "
                             "<= 65535")
        return first, last + 1
    lo, _ = _ephemeral_range()
    return (LISTEN_PORT_FLOOR, lo) if lo - LISTEN_PORT_FLOOR > 1000 else None


def free_port() -> int:
    """A port nothing listens on now, never handed out twice in one process, and below
    the kernel's ephemeral range when there is room: an outgoing connection's local
    port comes from that range, and one could take the port of a node that is down
    before it restarts (its bind then fails with EADDRINUSE). bind(0) handed out ports
    from that very range, and now and then the same port to two nodes of one cluster."""
    span = _listen_range()
    for _ in range(500):
        port = _PORTS.randrange(*span) if span else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port for a node on 127.0.0.1")


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a node's log (at most `limit` characters), "" if none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last[:limit]


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie child is dead for our purposes
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    # so is another process's zombie (a node of a foreground `cluster up` that died)
    stat = proc_stat(pid)
    if stat is None:
        return True                        # no /proc: kill(0) is all we know
    return stat[0] not in ("Z", "X")


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name - state, ppid, ... (fields 3
    on) - or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def _answered_by(pid: object, started: int, role: str) -> bool:
    """Whether a health answer's `pid` comes from the process this cluster started: that
    process, or for a gateway one of its workers (with --workers N the started process
    supervises and workers answer: their parent is it). A gateway of an earlier version
    sends no pid: taken as its own."""
    if pid == started:
        return True
    if role != "gateway":
        return False
    if pid is None:
        return True
    try:
        stat = proc_stat(int(str(pid)))
    except ValueError:
        return False
    return stat is not None and stat[1] == str(started)   # the ppid


@dataclass
class NodeSpec:
    id: str
    role: str          # "storage", "control" or "gateway"
    port: int
    data: str
    zone: str = ""
    tier: str = "hot"
    pid: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "role": self.role, "url": self.url, "port": self.port,
                "data": self.data, "zone": self.zone or self.id, "tier": self.tier,
                "pid": self.pid}


def _private_dir(path: Path) -> None:
    """A directory of the cluster's, for this user only (0700): the logs name buckets and
    keys, the data directories hold objects (nodes also make their own 0700)."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _reap(pid: int, deadline: float) -> None:
    """Wait for a signalled process to exit until `deadline`, then SIGKILL it (and wait
    5 s more for that)."""
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)


class LocalCluster:
    def __init__(self, data_dir: Path, secret: str, nodes: list[NodeSpec],
                 k: int, m: int, fsync: bool = True,
                 s3_keys: dict[str, str] | None = None, cold_k: int = 8,
                 cold_m: int = 3) -> None:
        self.dir = data_dir.resolve()
        self.secret = secret
        self.nodes = {n.id: n for n in nodes}
        self.k, self.m, self.fsync = k, m, fsync
        self.cold_k, self.cold_m = cold_k, cold_m
        self.s3_keys = s3_keys or {}      # the gateway's admin key pair
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def gateway(self) -> dict[str, str] | None:
        """{"url", "access_key", "secret_key", "region"} of the S3 gateway, or None."""
        gw = next((n for n in self.nodes.values() if n.role == "gateway"), None)
        if gw is None:
            return None
        return {"url": gw.url, **self.s3_keys, "region": GATEWAY_REGION}

    @property
    def path(self) -> Path:
        return self.dir / "cluster.json"

    @staticmethod
    def create(data_dir: Path, storage: int = 6, control: int = 3, k: int = 4, m: int = 2,
               fsync: bool = True, gateway: bool = True, cold: int = 0, cold_k: int = 8,
               cold_m: int = 3) -> "LocalCluster":
        """`storage` hot storage nodes (policy "hot", k+m) and `cold` cold ones (policy
        "cold", cold_k+cold_m, when cold > 0). ValueError before anything is started for
        sizes no map takes."""
        Policy("hot", k, m).check()
        if cold:
            Policy("cold", cold_k, cold_m, tier="cold").check()
        if storage < k + m:
            raise ValueError(f"policy {k}+{m} needs at least {k + m} storage nodes, "
                             f"got {storage}")
        if cold and cold < cold_k + cold_m:
            raise ValueError(f"cold policy {cold_k}+{cold_m} needs at least "
                             f"{cold_k + cold_m} cold storage nodes, got {cold}")
        if control < 1:
            raise ValueError("at least one control node is needed")
        data_dir = data_dir.resolve()
        specs = [NodeSpec(f"c{i}", "control", free_port(), str(data_dir / f"c{i}"))
                 for i in range(1, control + 1)]
        specs += [NodeSpec(f"s{i}", "storage", free_port(), str(data_dir / f"s{i}"))
                  for i in range(1, storage + 1)]
        specs += [NodeSpec(f"s{i}", "storage", free_port(), str(data_dir / f"s{i}"), tier="cold")
                  for i in range(storage + 1, storage + cold + 1)]
        keys = {}
        if gateway:
            specs.append(NodeSpec("gw1", "gateway", free_port(), str(data_dir / "gw1")))
            access, secret = new_key_pair()
            keys = {"access_key": access, "secret_key": secret}
        return LocalCluster(data_dir, secrets.token_hex(24), specs, k, m, fsync, keys,
                            cold_k, cold_m)

    @staticmethod
    def load(data_dir: Path) -> "LocalCluster":
        """The local cluster `cluster.json` in data_dir describes; BadRequest (a one-line
        reason) when it is not valid JSON or lacks what `cluster up` writes."""
        path = data_dir / "cluster.json"
        data = read_cluster_file(path, f"no cluster.json in {data_dir}: pass the --data DIR "
                                       "of `ecstore cluster up`")
        try:
            nodes = [NodeSpec(n["id"], n["role"], n["port"], n["data"], n.get("zone", ""),
                              n.get("tier", "hot"), n.get("pid")) for n in data["nodes"]]
            gw = data.get("gateway") or {}
            keys = {k: gw[k] for k in ("access_key", "secret_key") if k in gw}
            return LocalCluster(data_dir, data["secret"], nodes, data["k"], data["m"],
                                data.get("fsync", True), keys, data.get("cold_k", 8),
                                data.get("cold_m", 3))
        except (KeyError, TypeError, AttributeError) as exc:
            raise BadRequest(f"cluster file {path} is not one `ecstore cluster up` wrote "
                             f"(missing or malformed: {exc})") from None

    def running(self) -> list[str]:
        return [n.id for n in self.nodes.values() if pid_alive(n.pid)]

    def write(self) -> None:
        _private_dir(self.dir)
        data = {
            "secret": self.secret,
            "control": [n.url for n in self.nodes.values() if n.role == "control"],
            "gateway": self.gateway,
            "k": self.k, "m": self.m, "fsync": self.fsync,
            "cold_k": self.cold_k, "cold_m": self.cold_m,
            "nodes": [n.to_json() for n in self.nodes.values()],
        }
        self._replace_file(data)

    def _replace_file(self, data: dict[str, Any]) -> None:
        """cluster.json as `data`, whole or not at all, mode 0600 (it holds the secret)."""
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    # ---- processes ----------------------------------------------------------------------
    def start_node(self, node_id: str) -> None:
        n = self.nodes[node_id]
        _private_dir(self.dir)      # cluster.json, the logs, the nodes' data: ours only
        _private_dir(Path(n.data))
        logs = self.dir / "logs"
        _private_dir(logs)
        cmd = [sys.executable, "-m", f"node.{n.role}", "--id", n.id, "--port", str(n.port)]
        env = {**os.environ, "ECSTORE_SECRET": self.secret}
        if n.role == "gateway":
            cmd += ["--control", ",".join(x.url for x in self.nodes.values()
                                          if x.role == "control")]
            env.update(ECSTORE_S3_ACCESS_KEY=self.s3_keys["access_key"],
                       ECSTORE_S3_SECRET_KEY=self.s3_keys["secret_key"])
        else:
            cmd += ["--data", n.data] + ([] if self.fsync else ["--no-fsync"])
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        with open(os.open(logs / f"{n.id}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
                  "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[node_id] = proc
        n.pid = proc.pid
        self._record_pid(node_id, proc.pid)

    def _record_pid(self, node_id: str, pid: int) -> None:
        """Put a started node's pid into cluster.json at once, and nothing else of this
        object's view (another LocalCluster may have started other nodes since): a node
        started again by one object and stopped through another (`ecstore cluster
        down`, a test's LocalCluster.load(...).stop()) was left running, its pid unknown."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return              # not written yet: start() writes it whole
        for spec in data.get("nodes", []):
            if spec.get("id") == node_id:
                spec["pid"] = pid
                self._replace_file(data)
                return

    def wait_healthy(self, node_ids: list[str], timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(node_ids)
        while pending:
            pending = [i for i in pending if not self._healthy(i)]
            if not pending:
                return
            for i in pending:
                proc = self.procs.get(i)
                if proc is not None and proc.poll() is not None:
                    log = self.dir / "logs" / f"{i}.log"
                    last = last_line(log)
                    raise RuntimeError(f"node {i} exited with {proc.returncode}"
                                       + (f" ({last})" if last else "") + f"; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not healthy after {timeout_s}s: {pending}")
            time.sleep(0.1)

    def _healthy(self, node_id: str) -> bool:
        """The node answers its health check - as itself: a node that could not bind its
        port must not pass for healthy because another process answers there, not even
        one that answers as this node (an old instance of it): a node this object started
        must answer with that process's pid (a gateway: its own or a worker's)."""
        try:
            n = self.nodes[node_id]
            path = GATEWAY_HEALTH_PATH if n.role == "gateway" else "/v1/health"
            with urllib.request.urlopen(n.url + path, timeout=1) as r:
                body = json.loads(r.read() or b"{}")
                proc = self.procs.get(node_id)
                if proc is not None and not _answered_by(body.get("pid"), proc.pid, n.role):
                    return False
                return bool(r.status == 200) and node_id in (body.get("node_id"),
                                                             body.get("node"))
        except (OSError, ValueError, AttributeError):
            return False

    def stop_node(self, node_id: str, sig: int = signal.SIGTERM) -> None:
        n = self.nodes[node_id]
        if not pid_alive(n.pid):
            return
        assert n.pid is not None
        try:
            os.kill(n.pid, sig)
        except ProcessLookupError:
            return
        _reap(n.pid, time.monotonic() + STOP_TIMEOUT_S)

    def kill_node(self, node_id: str) -> None:
        self.stop_node(node_id, signal.SIGKILL)

    def start(self) -> None:
        """Start every node not already running, wait for health, install the map."""
        ids = [i for i in self.nodes if not pid_alive(self.nodes[i].pid)]
        for i in ids:
            if self.nodes[i].role != "gateway":
                self.start_node(i)
        self.write()
        self.wait_healthy([i for i in self.nodes if self.nodes[i].role != "gateway"])
        self.install_map()
        gateways = [i for i in ids if self.nodes[i].role == "gateway"]
        for i in gateways:  # after the map: it reads it at start
            self.start_node(i)
        self.write()
        self.wait_healthy(gateways)

    def stop(self) -> None:
        """SIGTERM to every node at once, then SIGKILL to those still running after
        STOP_TIMEOUT_S - one SIGTERM each: a second one during a node's shutdown, after it
        gave the signal back to its default action, killed it before its last log lines."""
        signalled = []
        for n in self.nodes.values():
            if pid_alive(n.pid):
                assert n.pid is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGTERM)
                    signalled.append(n.pid)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for pid in signalled:
            _reap(pid, deadline)
        for n in self.nodes.values():
            n.pid = None
        if self.path.exists():
            self.write()

    def add_node_spec(self, role: str, zone: str = "", tier: str = "hot") -> NodeSpec:
        """A new node of `role` with the next free id and port (not started)."""
        prefix = "s" if role == "storage" else "c"
        used = {int(i[1:]) for i in self.nodes if i.startswith(prefix) and i[1:].isdigit()}
        num = max(used, default=0) + 1
        while (self.dir / f"{prefix}{num}").exists():
            # a removed node's data directory (a drained storage node keeps the fragments
            # of dead versions; a control node its records): a new node started on it
            # came up holding them
            num += 1
        spec = NodeSpec(f"{prefix}{num}", role, free_port(), str(self.dir / f"{prefix}{num}"),
                        zone, tier)
        self.nodes[spec.id] = spec
        return spec

    def forget_node(self, node_id: str) -> None:
        self.stop_node(node_id)
        del self.nodes[node_id]
        self.write()

    # ---- the cluster map --------------------------------------------------------------
    def initial_map(self) -> ClusterMap:
        def node(n: NodeSpec) -> Node:
            return Node(id=n.id, address=n.url, zone=n.zone or n.id, tier=n.tier)
        storage = [node(n) for n in self.nodes.values() if n.role == "storage"]
        control = [node(n) for n in self.nodes.values() if n.role == "control"]
        return ClusterMap.initial(storage, control, k=self.k, m=self.m, cold_k=self.cold_k,
                                  cold_m=self.cold_m)

    def install_map(self) -> None:
        """Give every control node the map, unless one already holds one (a restart)."""
        controls = [n.url for n in self.nodes.values() if n.role == "control"]
        install_map(self.secret, controls, self.initial_map)


# ---- talking to nodes: shared with `ecstore cluster bootstrap` ----------------------------
MAP_REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MapInstall:
    """What install_map did: the epoch every control node now holds, whether that map was
    built here (no control node held one), and which control nodes were sent it."""

    epoch: int
    created: bool
    sent_to: tuple[str, ...]
    held: bytes


def install_map(secret: str, control_urls: list[str],
                initial: Callable[[], ClusterMap]) -> MapInstall:
    """Make every control node hold the newest map any of them holds; if none holds one,
    install `initial()` on all. Idempotent: a rerun sends nothing.

    Raises urllib.error.HTTPError (a node refused, e.g. 401 for a wrong secret or 409 for
    a racing writer) or OSError (a node unreachable).
    """
    held = [fetch_map(secret, url) for url in control_urls]
    known = [m for m in held if m is not None]
    data = max(known, key=lambda b: ClusterMap.from_bytes(b).epoch) if known \
        else initial().to_bytes()
    sent = []
    for url, h in zip(control_urls, held):
        if h != data:
            signed_request(secret, "PUT", url, "/v1/map", data)
            sent.append(url)
    return MapInstall(ClusterMap.from_bytes(data).epoch, not known, tuple(sent), data)


def fetch_map(secret: str, url: str) -> bytes | None:
    """The map a control node holds (msgpack bytes), None if it holds none."""
    try:
        return signed_request(secret, "GET", url, "/v1/map", b"")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def signed_request(secret: str, method: str, url: str, path: str, body: bytes = b"",
                   timeout_s: float = MAP_REQUEST_TIMEOUT_S) -> bytes:
    """One request signed with the cluster secret; the response body. Raises like urlopen."""
    headers = sign_headers(secret, method, path, hashlib.sha256(body).hexdigest())
    req = urllib.request.Request(url + path, data=body or None, method=method,
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return bytes(r.read())


def not_itself(body: bytes | bytearray, url: str, role: str, node_id: str) -> str | None:
    """Why a node's /v1/status answer (`body`) is not that of `role` node `node_id` (None
    when it is): `ring add` and `cluster bootstrap` ask a node who it is before they
    give it placements."""
    try:
        status = json.loads(body)
        answered = (status.get("role"), status.get("node_id"))
    except (ValueError, AttributeError):
        answered = (None, None)
    if answered == (role, node_id):
        return None
    what = f"{answered[0]} node {answered[1]}" if answered[0] else "something else"
    return f"{url} answers as {what}, not as {role} node {node_id}"


def node_health(url: str, timeout_s: float = 1.0) -> str | None:
    """None when GET url/v1/health answers 200, else why not (for messages)."""
    try:
        with urllib.request.urlopen(url + "/v1/health", timeout=timeout_s) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return str(exc.reason)
    except OSError as exc:
        return str(exc) or type(exc).__name__
