"""`ecstore cluster bootstrap`: install the initial cluster map on nodes that something
else runs (containers, service units), once every node answers its health check.

Idempotent, so that `docker compose up` can run it on every start: when some control node
already holds a map, no new map is built; every control node is brought to the newest map
held (a control node whose volume was wiped gets it back).
"""
from __future__ import annotations

import argparse
import os
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placement.cluster_map import ClusterMap
from placement.nodes import NAME_RE, Node
from store.errors import BadRequest, Conflict, EcstoreError, Unauthorized, Unavailable

DEFAULT_WAIT_S = 120.0
MAX_WAIT_S = 3600.0
POLL_INTERVAL_S = 0.5
REPORT_INTERVAL_S = 5.0
HEALTH_TIMEOUT_S = 2.0
MIN_SECRET_CHARS = 16
DEFAULT_TIER = "hot"
NODE_SYNTAX = "ID=URL[@ZONE][:TIER]"


@dataclass(frozen=True)
class NodeArg:
    """One node named on the command line. An empty zone means "the node's id"."""

    id: str
    url: str
    zone: str = ""
    tier: str = ""

    def node(self) -> Node:
        return Node(id=self.id, address=self.url, zone=self.zone or self.id,
                    tier=self.tier or DEFAULT_TIER)


# ---- parsing (pure) -------------------------------------------------------------------
def parse_node(text: str) -> NodeArg:
    """'ID=URL[@ZONE][:TIER]' as a NodeArg, e.g. 'storage1=http://storage1:7200@rack1:hot'.

    A tier without a zone follows the port: 'storage1=http://storage1:7200:cold'.
    Raises ValueError saying what is wrong.
    """
    node_id, sep, rest = text.strip().partition("=")
    if not sep or not node_id or not rest:
        raise ValueError(f"expected {NODE_SYNTAX}, got {text!r}")
    zone = tier = ""
    if "@" in rest:
        rest, _, where = rest.rpartition("@")
        zone, colon, tier = where.partition(":")
        if not zone or (colon and not tier):
            raise ValueError(f"{node_id}: expected @ZONE or @ZONE:TIER after the URL, got {text!r}")
    else:
        head, colon, last = rest.rpartition(":")
        if colon and NAME_RE.fullmatch(last) and not last.isdigit():
            rest, tier = head, last
    url = _check_url(node_id, rest)
    arg = NodeArg(node_id, url, zone, tier)
    arg.node().check()  # id, zone and tier names
    return arg


def _check_url(node_id: str, url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{node_id}: bad URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{node_id}: URL must look like http://HOST:PORT, got {url!r}")
    return url.rstrip("/")


def node_list(text: str) -> list[NodeArg]:
    """argparse type: a comma-separated list of ID=URL[@ZONE][:TIER]."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected {NODE_SYNTAX}[,...], got {text!r}")
    try:
        return [parse_node(p) for p in parts]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def initial_map(control: list[NodeArg], storage: list[NodeArg], k: int, m: int,
                cold_k: int = 8, cold_m: int = 3) -> ClusterMap:
    """The epoch-1 map the arguments describe. Raises BadRequest saying why there is none."""
    for c in control:
        if c.tier:
            raise BadRequest(f"control node {c.id}: a tier applies to storage nodes only")
    ids = [n.id for n in control + storage]
    urls = [n.url for n in control + storage]
    for what, values in (("node id", ids), ("URL", urls)):
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise BadRequest(f"each node needs its own {what}; repeated: {', '.join(dup)}")
    try:
        return ClusterMap.initial([s.node() for s in storage], [c.node() for c in control],
                                  k=k, m=m, cold_k=cold_k, cold_m=cold_m)
    except ValueError as exc:
        raise BadRequest(f"no valid cluster map for these nodes: {exc}") from None


def read_secret(secret_file: str | None) -> str:
    """The cluster secret from --secret-file, else $ECSTORE_SECRET. Raises BadRequest."""
    if secret_file:
        try:
            with open(secret_file, encoding="utf-8") as f:
                secret, source = f.read().strip(), secret_file
        except (OSError, UnicodeDecodeError) as exc:
            raise BadRequest(f"cannot read the secret file {secret_file}: {exc}") from None
    else:
        secret, source = os.environ.get("ECSTORE_SECRET", ""), "$ECSTORE_SECRET"
    if len(secret) < MIN_SECRET_CHARS:
        raise BadRequest(f"the cluster secret ({source}) must be set, at least "
                         f"{MIN_SECRET_CHARS} characters, the same as the nodes'")
    return secret


# ---- talking to the nodes -------------------------------------------------------------
def wait_healthy(nodes: list[NodeArg], wait_s: float, say: Callable[[str], None]) -> None:
    """Poll every node's /v1/health until all answer 200; every REPORT_INTERVAL_S say which
    are still down and why. Raises Unavailable naming them after wait_s seconds."""
    from cli.localcluster import node_health

    start = time.monotonic()
    next_report = start
    while True:
        down = {n.id: (n, why) for n in nodes
                if (why := node_health(n.url, HEALTH_TIMEOUT_S)) is not None}
        if not down:
            say(f"all {len(nodes)} nodes are healthy")
            return
        waited = time.monotonic() - start
        lines = [f"  {i} ({n.url}): {why}" for i, (n, why) in down.items()]
        if waited >= wait_s:
            raise Unavailable(f"{len(down)} of {len(nodes)} nodes not healthy after "
                              f"{wait_s:g} s:\n" + "\n".join(lines),
                              tried=len(nodes), failed=len(down))
        if time.monotonic() >= next_report:
            say(f"waiting for {len(down)} of {len(nodes)} nodes ({waited:.0f} of "
                f"{wait_s:g} s):\n" + "\n".join(lines))
            next_report = time.monotonic() + REPORT_INTERVAL_S
        time.sleep(POLL_INTERVAL_S)


def check_identities(secret: str, control: list[NodeArg], storage: list[NodeArg]) -> None:
    """Ask every node, signed with the cluster secret, who it is (GET /v1/status). A
    storage node started with another secret refuses every fragment request, and two
    URLs swapped on the command line put each node's fragments where readers never
    look: both used to pass a bootstrap that asked only the control nodes. Raises one
    error naming every node that fails (BadRequest: a mistake in the topology)."""
    from cli.localcluster import not_itself, signed_request

    problems: list[str] = []
    refused: list[str] = []
    for role, nodes in (("control", control), ("storage", storage)):
        for n in nodes:
            try:
                body = signed_request(secret, "GET", n.url, "/v1/status",
                                      timeout_s=HEALTH_TIMEOUT_S * 5)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    refused.append(f"{role} node {n.id} ({n.url})")
                else:
                    problems.append(f"{role} node {n.id} ({n.url}) answered HTTP {exc.code}: "
                                    f"{_body(exc)}")
                continue
            except OSError as exc:
                problems.append(f"{role} node {n.id} ({n.url}) did not say who it is: {exc}")
                continue
            problem = not_itself(body, n.url, role, n.id)
            if problem is not None:
                problems.append(problem)
    if len(refused) == len(control) + len(storage):
        raise Unauthorized("every node refused the signed request: the cluster secret is not "
                           "the one the nodes were started with")
    if refused:
        problems.append(f"{', '.join(refused)} refused the signed request: started with "
                        "another cluster secret than the one given here and the other nodes")
    if problems:
        raise BadRequest("no map installed: " + "; ".join(problems))


def install(secret: str, control: list[NodeArg], cmap: ClusterMap) -> Any:
    """install_map with its failures turned into readable EcstoreErrors."""
    from cli.localcluster import install_map

    names = {c.url: c.id for c in control}

    def who(url: str) -> str:
        base = next((u for u in names if url.startswith(u)), url)
        return f"control node {names.get(base, '?')} ({base})"
    try:
        return install_map(secret, [c.url for c in control], lambda: cmap)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise Unauthorized(f"{who(exc.url)} refused the signed request: the cluster "
                               "secret is not the one the nodes were started with") from None
        if exc.code == 409:
            raise Conflict(f"{who(exc.url)} got a newer map meanwhile; run bootstrap "
                           "again") from None
        raise EcstoreError(f"{who(exc.url)} answered HTTP {exc.code}: {_body(exc)}") from None
    except urllib.error.URLError as exc:
        raise Unavailable(f"a control node went away while the map was installed: "
                          f"{exc.reason}") from None
    except (OSError, ValueError) as exc:  # a timeout, or a held map that does not decode
        raise EcstoreError(f"installing the map failed: {exc}") from None


def _body(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(500).decode("utf-8", "replace").strip() or exc.reason
    except OSError:
        return str(exc.reason)


def drift(held: ClusterMap, wanted: ClusterMap) -> list[str]:
    """How the map the control nodes hold differs from the nodes named on the command line."""
    def nodes(cmap: ClusterMap) -> set[tuple[str, str]]:
        return {(n.id, n.address) for n in list(cmap.all_storage_nodes()) + list(cmap.control.nodes)}
    have, want = nodes(held), nodes(wanted)
    return ([f"not in the map: {i} {u}" for i, u in sorted(want - have)]
            + [f"in the map, not named here: {i} {u}" for i, u in sorted(have - want)])


# ---- the command ----------------------------------------------------------------------
def cmd_bootstrap(a: argparse.Namespace) -> int:
    from cli.main import err

    def say(text: str) -> None:
        err.print(text, highlight=False, markup=False, soft_wrap=True)

    if not 0 <= a.wait_s <= MAX_WAIT_S:
        raise BadRequest(f"--wait-s must be between 0 and {MAX_WAIT_S:g}, got {a.wait_s:g}")
    cmap = initial_map(a.control, a.storage, a.k, a.m, a.cold_k, a.cold_m)
    secret = read_secret(a.secret_file)
    wait_healthy(a.control + a.storage, a.wait_s, say)
    check_identities(secret, a.control, a.storage)
    done = install(secret, a.control, cmap)
    by_url = {c.url: c.id for c in a.control}
    sent = ", ".join(by_url[u] for u in done.sent_to)
    if done.created:
        say(f"installed the initial cluster map (epoch {done.epoch}, policy {a.k}+{a.m}, "
            f"{len(a.control)} control and {len(a.storage)} storage nodes) on {sent}")
        return 0
    say(f"the control nodes already hold map epoch {done.epoch}; "
        + (f"sent it to {sent}" if sent else "nothing to do"))
    differences = drift(ClusterMap.from_bytes(done.held), cmap)
    if differences:
        say("note: the installed map differs from the nodes named here (change it with "
            "`ecstore ring add/remove`, not with bootstrap):\n  " + "\n  ".join(differences))
    return 0


def register_cluster(csub: Any) -> None:
    """Add `cluster bootstrap` to the `ecstore cluster` subcommands."""
    b = csub.add_parser(
        "bootstrap", help="wait for nodes run elsewhere (e.g. containers), then install "
        "the initial cluster map on every control node; safe to rerun",
        description="Wait until every node answers GET /v1/health, then install the "
        "initial cluster map on every control node, unless one already holds a map: then "
        "make every control node hold the newest. The cluster secret comes from "
        "--secret-file, else $ECSTORE_SECRET.")
    b.add_argument("--control", type=node_list, action="extend", required=True,
                   metavar="ID=URL,...", help="control nodes (comma-separated or repeated)")
    b.add_argument("--storage", type=node_list, action="extend", required=True,
                   metavar=f"{NODE_SYNTAX},...",
                   help="storage nodes; zone defaults to the node id, tier to hot")
    b.add_argument("--k", type=int, default=4, help="data fragments per segment (default 4)")
    b.add_argument("--m", type=int, default=2, help="parity fragments (default 2)")
    b.add_argument("--cold-k", type=int, default=8,
                   help="cold policy data fragments, when :cold nodes are given (default 8)")
    b.add_argument("--cold-m", type=int, default=3, help="cold policy parity fragments (default 3)")
    b.add_argument("--wait-s", type=float, default=DEFAULT_WAIT_S,
                   help=f"how long to wait for the nodes, seconds (default {DEFAULT_WAIT_S:g})")
    b.add_argument("--secret-file", help="file holding the cluster secret "
                   "(default: $ECSTORE_SECRET)")
    b.set_defaults(func=cmd_bootstrap)
