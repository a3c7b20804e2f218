"""The gateway's read-only status page: GET /ui and GET /ui/status.json.

/ui is one HTML page with inline CSS and a few lines of plain JavaScript (no framework, no
build step, nothing fetched from anywhere but this gateway: its Content-Security-Policy
forbids it). The script fetches /ui/status.json every REFRESH_S seconds and redraws:
- nodes: role, zone, tier, up or down, disk used and free, the node's share of its ring;
- objects and bytes per bucket and policy (tier), computed in the background at most every
  USAGE_INTERVAL_S and only while someone looks (it reads every live record);
- the last run of repair, rebalance, gc and tiering: records in the OPS_BUCKET namespace
  (key = the operation's name) written by those workers, shown as they are;
- the last MAX_ERRORS warnings and errors this gateway process logged (dispatch logs every
  5xx it answers; the request log line adds its op and status);
- with --workers N, the workers serving and their restarts (node.workers).

Auth, with the keys of the S3 admin user (the gateway's key pair, `ecstore key create`):
- HTTP Basic, access key as user name and secret key as password (a browser asks for it);
- an S3 signature: SigV4 or SigV2, in the header or a presigned URL of GET /ui;
- a token `v1.ACCESS.EXPIRES.HMAC` (`make_token`; `python -m node.ui` prints a URL with
  one) in `?token=`.
Each answers with a cookie holding a token good for TOKEN_TTL_S, which the page's own
fetches carry. Tokens are HMACs with the key's secret: a revoked key stops them too.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from node.s3.context import DEFAULT_OWNER, Gateway
from node.s3.errors import S3Error
from node.s3.sigv4 import AuthResult
from placement.cluster_map import ClusterMap
from store import transport
from store.cluster import ClusterInfo
from store.errors import EcstoreError
from store.names import OPS_BUCKET, WORKER_OPS
from store.tiering import stored_bytes
from store.workers import live_records

UI_PATH = "/ui"
STATUS_PATH = "/ui/status.json"
REFRESH_S = 2                  # the page asks for new data this often
STATUS_TIMEOUT_S = 1.5         # a node silent this long is shown down (a stalled one, too)
SNAPSHOT_TTL_S = 1.0           # requests within this share one round of node probes
USAGE_INTERVAL_S = 30.0        # pause between two bucket usage passes (each reads every record)
MAX_USAGE_ROWS = 500           # (bucket, policy) rows counted; the rest go to OTHER_BUCKETS
OTHER_BUCKETS = "(other buckets)"
OPS = WORKER_OPS   # the progress records of the CLI's workers, in OPS_BUCKET, key = the worker
MAX_OP_FIELDS = 24
MAX_ERRORS = 20
MAX_PROBLEMS = 8               # of one node's (a full disk, a database refusing writes)
MAX_TEXT_CHARS = 300           # of an error message or an operation's field
ERROR_LOGGER = "ecstore"       # warnings and errors of every ecstore.* logger
ACCESS_LOGGER = "ecstore.request"   # node.server's line per request (a 5xx: a warning)
TOKEN_TTL_S = 12 * 3600        # of the cookie and of `python -m node.ui` URLs
MAX_TOKEN_TTL_S = 7 * 86400    # a token further ahead is refused (a presigned URL's limit)
COOKIE = "ecstore_ui"
ADMIN_USER = DEFAULT_OWNER     # the page shows every bucket: only the admin user's keys open it
_TOKEN = re.compile(r"v1\.([A-Za-z0-9]{1,128})\.([0-9]{1,12})\.([0-9a-f]{64})")
_PRESIGN_PARAMS = frozenset({"X-Amz-Signature", "X-Amz-Credential", "X-Amz-Algorithm", "Signature"})
_NODE_FIELDS = ("id", "role", "zone", "tier", "url", "up", "error", "fragments", "bytes",
                "quarantined", "disk_total_bytes", "disk_free_bytes", "db_bytes", "epoch",
                "state", "problems")
_OP_RECORD_FIELDS = frozenset({"ts", "version_id", "deleted", "op", "updated", "finished"})

S3Authenticate = Callable[[web.Request, Gateway], Awaitable[tuple[str | None, AuthResult | None]]]


# ---- tokens and credentials (pure) ---------------------------------------------------------
def make_token(access_key: str, secret_key: str, expires_s: int) -> str:
    """A status-page token for `access_key` good until `expires_s` (unix seconds):
    "v1.ACCESS.EXPIRES.HMAC-SHA256(secret_key, 'ecstore-ui' LF ACCESS LF EXPIRES)"."""
    return f"v1.{access_key}.{expires_s}.{_token_mac(access_key, secret_key, expires_s)}"


def _token_mac(access_key: str, secret_key: str, expires_s: int) -> str:
    msg = f"ecstore-ui\n{access_key}\n{expires_s}".encode()
    return hmac.new(secret_key.encode(), msg, hashlib.sha256).hexdigest()


def token_claim(token: str) -> tuple[str, int, str] | None:
    """(access key, expires unix s, mac) of a well-formed token, else None."""
    m = _TOKEN.fullmatch(token)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def token_ok(claim: tuple[str, int, str], secret_key: str, now_s: float) -> bool:
    access_key, expires_s, mac = claim
    return (now_s < expires_s <= now_s + MAX_TOKEN_TTL_S
            and hmac.compare_digest(mac, _token_mac(access_key, secret_key, expires_s)))


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic` header, None for any other header."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return ("", "")
    return (user, password) if sep else ("", "")


# ---- what the page shows (pure) ------------------------------------------------------------
def ring_shares(cmap: ClusterMap) -> dict[tuple[str, str], float]:
    """{(role, node id): fraction of its ring's placements}: a storage ring counted over the
    first k+m of each row (its widest policy), the control ring over the first R."""
    out: dict[tuple[str, str], float] = {}
    for ring in cmap.storage_rings:
        n = max((p.n for p in cmap.policies if p.tier == ring.tier), default=1)
        for node_id, share in ring.share(min(n, len(ring.nodes))).items():
            out[("storage", node_id)] = share
    for node_id, share in cmap.control.share(cmap.effective_replicas).items():
        out[("control", node_id)] = share
    return out


def node_row(status: Mapping[str, Any], shares: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    """One node of Client.node_status() as the page shows it, with its ring share."""
    row = {f: status.get(f) for f in _NODE_FIELDS}
    row["up"] = bool(status.get("up"))
    row["problems"] = [str(p)[:MAX_TEXT_CHARS] for p in row["problems"] or ()][:MAX_PROBLEMS]
    row["state"] = "down" if not row["up"] else "degraded" if row["problems"] else "up"
    if row["role"] != "storage":   # tiers are storage rings'; a control node's is meaningless
        row["tier"] = None
    share = shares.get((str(status.get("role")), str(status.get("id"))))
    row["ring_share"] = None if share is None else round(share, 4)
    return row


Tally = dict[tuple[str, str], list[int]]   # (bucket, policy) -> [objects, bytes, stored bytes]


def tally(acc: Tally, bucket: str, record: Mapping[str, Any], replicas: int) -> None:
    """Count one live record into acc (`replicas`: copies of an inline object). Past
    MAX_USAGE_ROWS rows, new buckets count as OTHER_BUCKETS (one more row per policy)."""
    policy = "inline" if record.get("inline") is not None else str(record.get("policy"))
    key = (bucket, policy)
    if key not in acc and len(acc) >= MAX_USAGE_ROWS - 1:
        key = (OTHER_BUCKETS, policy)
    row = acc.setdefault(key, [0, 0, 0])
    row[0] += 1
    row[1] += int(record.get("size") or 0)
    row[2] += stored_bytes(record, replicas)


def usage_rows(acc: Tally, cmap: ClusterMap) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows per bucket and policy sorted, totals per tier); inline objects live in the
    control nodes' metadata (tier "control")."""
    tiers = {p.name: p.tier for p in cmap.policies}
    rows = [{"bucket": b, "policy": p, "tier": "control" if p == "inline" else tiers.get(p, "?"),
             "objects": o, "bytes": n, "stored_bytes": s} for (b, p), (o, n, s) in sorted(acc.items())]
    totals: dict[str, dict[str, Any]] = {}
    for r in rows:
        tier = str(r["tier"])
        t = totals.setdefault(tier, {"tier": tier, "objects": 0, "bytes": 0, "stored_bytes": 0})
        for f in ("objects", "bytes", "stored_bytes"):
            t[f] += r[f]
    return rows, sorted(totals.values(), key=lambda t: str(t["tier"]))


def op_summary(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """An operation's record as the page shows it: its scalar fields (nested maps one level
    deep as "a.b", lists of text as their last 3), a progress fraction when the record says
    done and total (or remaining), and when it was written (its "updated", else its ts;
    unix s). The CLI's workers write {"op", "done", "remaining", "rate_per_s", "updated"}."""
    if record is None or record.get("deleted"):
        return {"recorded": False}
    fields: dict[str, Any] = {}
    for name, value in record.items():
        if name in _OP_RECORD_FIELDS:
            continue
        inner = value.items() if isinstance(value, Mapping) else [("", value)]
        for sub, v in inner:
            if len(fields) < MAX_OP_FIELDS:
                fields[f"{name}.{sub}" if sub else str(name)] = _scalar(v)
    updated = record.get("updated")
    if not isinstance(updated, (int, float)) or isinstance(updated, bool):
        updated = record["ts"] / 1e9 if isinstance(record.get("ts"), int) else None
    return {"recorded": True, "fields": fields, "progress": _progress(record), "updated": updated}


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return [str(x)[:MAX_TEXT_CHARS] for x in v[-3:]] if all(isinstance(x, str) for x in v) \
            else f"{len(v)} items"
    return str(v)[:MAX_TEXT_CHARS]


def _progress(r: Mapping[str, Any]) -> float | None:
    def num(name: str) -> float | None:
        v = r.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    done, total, remaining, frac = num("done"), num("total"), num("remaining"), num("progress")
    if total is None and done is not None and remaining is not None:
        total = done + remaining
    if done is not None and total is not None:
        frac = done / total if total else 1.0    # nothing to do is done
    return None if frac is None else round(min(1.0, max(0.0, frac)), 4)


# ---- the last errors -----------------------------------------------------------------------
class ErrorLog(logging.Handler):
    """The last MAX_ERRORS warnings and errors of the ecstore.* loggers in this process:
    every 5xx dispatch answers (it logs why, and the access log its status), a GET stream
    cut short, a refused connection. Lines of one request (same request id) make one
    entry. With several gateway workers each keeps its own."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.entries: deque[dict[str, Any]] = deque(maxlen=MAX_ERRORS)

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None)
        fields = fields if isinstance(fields, Mapping) else {}
        rid = str(fields.get("request_id") or transport.request_id.get() or "") or None
        status = fields.get("status") if isinstance(fields.get("status"), int) else None
        for e in reversed(self.entries):   # the request's entry: dispatch logs before the access log
            if rid is not None and e["request_id"] == rid:
                e["status"] = e["status"] or status
                e["op"] = e["op"] or fields.get("op")
                return
        if record.name == ACCESS_LOGGER:
            message = f"{fields.get('method', '')} answered {status}"
        else:
            message = _message(record)
        self.entries.append({"time": record.created, "level": record.levelname.lower(),
                             "source": record.name, "message": message[:MAX_TEXT_CHARS],
                             "request_id": rid, "op": fields.get("op"), "status": status})

    def recent(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self.entries))


def _message(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except (TypeError, ValueError):
        message = str(record.msg)
    exc = record.exc_info[1] if record.exc_info else None
    return message + (f" ({type(exc).__name__}: {exc})" if exc is not None else "")


# ---- the data, gathered with bounded work ---------------------------------------------------
@dataclass
class Usage:
    buckets: list[dict[str, Any]]
    tiers: list[dict[str, Any]]
    computed_at: float             # unix s
    seconds: float


class StatusPage:
    """Gathers status.json: node probes and operation records shared by requests within
    SNAPSHOT_TTL_S, bucket usage from a background pass started by a request at most every
    USAGE_INTERVAL_S after the previous one ended (no viewer, no work)."""

    def __init__(self, gw: Gateway, errors: ErrorLog,
                 workers: Callable[[], dict[str, Any]] | None = None) -> None:
        self.gw, self.errors = gw, errors
        self.workers = workers
        self._live: asyncio.Future[dict[str, Any]] | None = None
        self._live_at = 0.0
        self._shares: tuple[int, dict[tuple[str, str], float]] = (-1, {})
        self._usage: Usage | None = None
        self._usage_error: str | None = None
        self._usage_task: asyncio.Future[None] | None = None
        self._usage_done_at: float | None = None

    async def status(self) -> dict[str, Any]:
        now = time.monotonic()
        self._start_usage(now)
        if self._live is None or (self._live.done() and now - self._live_at >= SNAPSHOT_TTL_S):
            self._live_at = now
            self._live = asyncio.ensure_future(self._collect())
        live = await asyncio.shield(self._live)
        return {"gateway": self.gw.config.node_id, "refresh_s": REFRESH_S,
                "generated_at": time.time(), **live, "usage": self._usage_view(),
                "errors": self.errors.recent(),
                "workers": self.workers() if self.workers is not None else None}

    async def close(self) -> None:
        for task in (self._usage_task, self._live):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _collect(self) -> dict[str, Any]:
        c = self.gw.client
        try:
            cmap = await c.cluster_map()
            statuses, ops = await asyncio.gather(c.node_status(timeout_s=STATUS_TIMEOUT_S),
                                                 self._ops())
        except EcstoreError as exc:
            return {"epoch": None, "map_error": exc.message, "nodes": [], "ops": {}}
        shares = self._ring_shares(cmap)
        nodes = [node_row(s, shares) for s in statuses]
        if not any(n["role"] == "gateway" for n in nodes):
            nodes.append(node_row({"id": self.gw.config.node_id, "role": "gateway", "up": True,
                                   "epoch": cmap.epoch}, shares))
        return {"epoch": cmap.epoch, "map_error": None, "nodes": nodes, "ops": ops}

    def _ring_shares(self, cmap: ClusterMap) -> dict[tuple[str, str], float]:
        if self._shares[0] != cmap.epoch:   # a map is immutable per epoch
            self._shares = (cmap.epoch, ring_shares(cmap))
        return self._shares[1]

    async def _ops(self) -> dict[str, dict[str, Any]]:
        records = await asyncio.gather(*(self.gw.client.read_record(OPS_BUCKET, name) for name in OPS),
                                       return_exceptions=True)
        out = {}
        for name, r in zip(OPS, records):
            if isinstance(r, EcstoreError):   # e.g. a control node that does not know OPS_BUCKET yet
                out[name] = {"recorded": False, "error": r.message[:MAX_TEXT_CHARS]}
            elif isinstance(r, BaseException):
                raise r
            else:
                out[name] = op_summary(r)
        return out

    def _start_usage(self, now: float) -> None:
        if self._usage_task is not None and not self._usage_task.done():
            return
        if self._usage_done_at is not None and now - self._usage_done_at < USAGE_INTERVAL_S:
            return
        self._usage_task = asyncio.ensure_future(self._count_usage())

    async def _count_usage(self) -> None:
        started = time.monotonic()
        try:
            c = self.gw.client
            acc: Tally = {}
            replicas = (await c.cluster_map()).effective_replicas
            async for bucket, _key, record in live_records(c):
                tally(acc, bucket, record, replicas)
            buckets, tiers = usage_rows(acc, await c.cluster_map())
            self._usage = Usage(buckets, tiers, time.time(), time.monotonic() - started)
            self._usage_error = None
        except EcstoreError as exc:
            self._usage_error = exc.message[:MAX_TEXT_CHARS]
        finally:
            self._usage_done_at = time.monotonic()

    def _usage_view(self) -> dict[str, Any]:
        u = self._usage
        running = self._usage_task is not None and not self._usage_task.done()
        state = "ready" if u is not None else "error" if self._usage_error and not running else "counting"
        return {"state": state, "interval_s": USAGE_INTERVAL_S, "error": self._usage_error,
                "computed_at": u.computed_at if u else None, "seconds": u.seconds if u else None,
                "buckets": u.buckets if u else [], "tiers": u.tiers if u else []}


UI_STATE = web.AppKey("ui_state", StatusPage)


# ---- HTTP ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Viewer:
    access_key: str
    secret_key: str
    via: str        # "basic", "s3", "token" or "cookie"


def _unauthorized(reason: str) -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text=f"{reason}\nSign in with an S3 access key (user name) and its secret key (password).\n",
        headers={"WWW-Authenticate": 'Basic realm="ecstore status", charset="UTF-8"',
                 "Cache-Control": "no-store"})


async def authorize(request: web.Request, gw: Gateway, s3_auth: S3Authenticate) -> Viewer:
    """Who asks: HTTP Basic (access key, secret key), else an S3 signature (header or presigned
    URL), else a token in ?token=, else the cookie. Raises HTTPUnauthorized (with a Basic
    challenge) or HTTPForbidden for a key of another user than ADMIN_USER."""
    header = request.headers.get("Authorization", "")
    basic = basic_credentials(header)
    token = request.query.get("token", "")
    if basic is not None:
        access_key, given, via = basic[0], basic[1], "basic"
        rec = await gw.key_record(access_key) if access_key else None
        if rec is None or not hmac.compare_digest(str(rec["secret_key"]).encode(), given.encode()):
            raise _unauthorized("Unknown access key or wrong secret key.")
    elif header or _PRESIGN_PARAMS & set(request.query):
        try:
            _, result = await s3_auth(request, gw)
        except S3Error as exc:
            raise _unauthorized(f"{exc.code}: {exc.message}") from None
        if result is None:
            raise _unauthorized("Not signed.")
        access_key, via = result.access_key, "s3"
        rec = await gw.key_record(access_key)
    else:
        token, via = (token, "token") if token else (request.cookies.get(COOKIE, ""), "cookie")
        claim = token_claim(token)
        rec = await gw.key_record(claim[0]) if claim else None
        if claim is None or rec is None or not token_ok(claim, str(rec["secret_key"]), time.time()):
            raise _unauthorized("Expired or invalid token." if token else "Not signed in.")
        access_key = claim[0]
    if rec is None or rec.get("user") != ADMIN_USER:
        raise web.HTTPForbidden(text=f"The status page is for keys of the {ADMIN_USER} user.\n")
    return Viewer(access_key, str(rec["secret_key"]), via)


def _signed_in(resp: web.StreamResponse, viewer: Viewer) -> web.StreamResponse:
    resp.headers["Cache-Control"] = "no-store"
    if viewer.via != "cookie":
        token = make_token(viewer.access_key, viewer.secret_key, int(time.time() + TOKEN_TTL_S))
        resp.set_cookie(COOKIE, token, max_age=TOKEN_TTL_S, path=UI_PATH, httponly=True,
                        samesite="Strict")
    return resp


def setup(app: web.Application, gateway_key: web.AppKey[Gateway], s3_auth: S3Authenticate,
          workers: Callable[[], dict[str, Any]] | None = None) -> None:
    """Add the status page's routes to the gateway's app (before its catch-all route), its
    state (made after the gateway's, so register after the gateway's cleanup context) and
    the error log handler. `workers`: the gateway's worker processes and their restarts
    (node.workers.workers_view), shown as status.json's "workers"."""

    async def page(request: web.Request) -> web.StreamResponse:
        viewer = await _viewer(request)
        return _signed_in(web.Response(text=PAGE_HTML, content_type="text/html",
                                       headers=PAGE_HEADERS), viewer)

    async def status_json(request: web.Request) -> web.StreamResponse:
        viewer = await _viewer(request)
        try:
            resp = web.json_response(await request.app[UI_STATE].status())
        except EcstoreError as exc:
            resp = web.json_response({"error": exc.message}, status=503)
        return _signed_in(resp, viewer)

    async def _viewer(request: web.Request) -> Viewer:
        try:
            return await authorize(request, request.app[gateway_key], s3_auth)
        except EcstoreError as exc:   # the key lookup needs the control nodes
            raise web.HTTPServiceUnavailable(text=f"cannot check the key: {exc.message}\n") from None

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        errors = ErrorLog()
        logging.getLogger(ERROR_LOGGER).addHandler(errors)
        app[UI_STATE] = StatusPage(app[gateway_key], errors, workers)
        yield
        logging.getLogger(ERROR_LOGGER).removeHandler(errors)
        await app[UI_STATE].close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get(UI_PATH, page)
    app.router.add_get(STATUS_PATH, status_json)


# ---- the page ------------------------------------------------------------------------------
STYLE = """
:root{--up:#1a7f37;--down:#cf222e;--degraded:#9a6700;--line:#d0d7de;--muted:#57606a;--bg:#f6f8fa;
  --ours:#0969da;--other:#8c959f;--free:#eaeef2}
*{box-sizing:border-box}
body{margin:0;color:#1f2328;background:#fff;
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
header{display:flex;align-items:center;gap:16px;padding:12px 24px;background:#24292f;color:#fff}
header h1{font-size:18px;margin:0}
header .meta{color:#d0d7de;font-size:13px}
main{padding:8px 24px 24px;max-width:1400px}
h2{font-size:15px;margin:22px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h2 small{font-weight:normal;color:var(--muted);margin-left:8px}
table{border-collapse:collapse;width:100%;margin-bottom:8px}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid var(--free);white-space:nowrap}
th{background:var(--bg);font-weight:600;font-size:13px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.note{white-space:normal;color:var(--muted);font-size:12px;max-width:420px}
tr.down td{background:#ffebe9}
.state{display:inline-block;min-width:52px;text-align:center;padding:1px 8px;
  border-radius:10px;color:#fff;font-weight:600;font-size:12px}
.state.up,.pill.ok{background:var(--up)}
.state.down,.pill.bad{background:var(--down)}
.state.degraded,.pill.warn{background:var(--degraded)}
tr.degraded td{background:#fff8c5}
.pill{padding:2px 10px;border-radius:10px;font-weight:600;font-size:13px}
.bar{display:flex;width:180px;height:12px;background:var(--free);border-radius:3px;
  overflow:hidden;border:1px solid var(--line)}
.bar span{display:block;height:100%}
.ours{background:var(--ours)}.other{background:var(--other)}
.share{background:#8250df}.done{background:var(--up)}
.cell{display:flex;align-items:center;gap:8px}
.cell small{color:var(--muted)}
.ops{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:12px}
.op{border:1px solid var(--line);border-radius:6px;padding:10px 12px}
.op h3{margin:0 0 6px;font-size:14px}
#errors tr.error td:nth-child(2){color:var(--down);font-weight:600}
.op dl{display:grid;grid-template-columns:auto 1fr;gap:2px 10px;margin:6px 0 0;font-size:12px}
.op dt{color:var(--muted)}
.op dd{margin:0;overflow-wrap:anywhere}
.muted{color:var(--muted)}
.legend{font-size:12px;color:var(--muted)}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;vertical-align:-1px}
.legend .free{background:var(--free);border:1px solid var(--line)}
#banner{display:none;margin:12px 0 0;padding:8px 12px;border-radius:6px;background:#fff8c5;
  border:1px solid #d4a72c}
body.stale main{opacity:.6}
"""

SCRIPT = """
"use strict";
let refreshMs = 2000;
const DASH = "\\u2013";
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function bytes(n) {
  if (n === null || n === undefined) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
const count = (n) => (n === null || n === undefined) ? DASH : n.toLocaleString();
const pct = (f) => (100 * f).toFixed(1) + "%";
function ago(t) {
  if (!t) return DASH;
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  return s < 172800 ? Math.round(s / 3600) + " h ago" : Math.round(s / 86400) + " d ago";
}
function bar(parts, title) {
  const b = el("div", "bar");
  b.title = title;
  for (const [frac, cls] of parts) {
    const s = el("span", cls);
    s.style.width = (100 * Math.max(0, Math.min(1, frac || 0))).toFixed(2) + "%";
    b.append(s);
  }
  return b;
}
function cell(...children) {
  const d = el("div", "cell");
  d.append(...children);
  return d;
}
function row(cells, numeric) {
  const tr = el("tr");
  cells.forEach((c, i) => {
    const td = el("td", numeric && numeric.includes(i) ? "num" : "");
    if (c instanceof Node) td.append(c);
    else td.textContent = (c === null || c === undefined || c === "") ? DASH : c;
    tr.append(td);
  });
  return tr;
}
function empty(text, columns) {
  const tr = el("tr"), td = el("td", "muted", text);
  td.colSpan = columns;
  tr.append(td);
  return tr;
}
function capacity(n) {
  if (n.disk_total_bytes) {
    const total = n.disk_total_bytes, free = n.disk_free_bytes, used = total - free;
    const ours = Math.min(n.bytes || n.db_bytes || 0, used);
    const title = bytes(ours) + " ecstore data, " + bytes(used - ours) + " other, " + bytes(free) + " free";
    return cell(bar([[ours / total, "ours"], [(used - ours) / total, "other"]], title),
                el("small", null, bytes(used) + " used \\u00b7 " + bytes(free) + " free"));
  }
  if (n.db_bytes !== null && n.db_bytes !== undefined) return el("small", "muted", "metadata " + bytes(n.db_bytes));
  return "";
}
function renderNodes(nodes) {
  const up = nodes.filter((n) => n.up).length;
  const degraded = nodes.filter((n) => n.state === "degraded").length;
  const pill = $("summary");
  pill.textContent = up + " of " + nodes.length + " nodes up" + (degraded ? ", " + degraded + " degraded" : "");
  pill.className = "pill " + (up < nodes.length ? "bad" : degraded ? "warn" : "ok");
  const widest = {};   // the bar of a ring's largest share is full
  for (const n of nodes) widest[n.role] = Math.max(widest[n.role] || 0, n.ring_share || 0);
  $("nodes").tBodies[0].replaceChildren(...nodes.map((n) => {
    const state = n.state || (n.up ? "up" : "down");
    const share = n.ring_share === null ? "" : cell(
      bar([[n.ring_share / widest[n.role], "share"]], "share of its ring's placements"),
      el("small", null, pct(n.ring_share)));
    const note = !n.up ? (n.error || "not answering")
      : [...(n.problems || []), ...(n.quarantined ? [n.quarantined + " quarantined fragment(s)"] : [])].join("; ");
    const tr = row([n.id, n.role, n.zone, n.tier, el("span", "state " + state, state), capacity(n),
                    count(n.fragments), share, note], [6]);
    tr.lastChild.className = "note";
    tr.dataset.node = n.id;
    tr.dataset.role = n.role;
    tr.dataset.state = state;
    if (state !== "up") tr.classList.add(state);
    return tr;
  }));
}
function renderUsage(u) {
  let note = u.error ? "last count failed: " + u.error + ". " : "";
  if (u.computed_at) {
    note += "counted " + ago(u.computed_at) + " in " + u.seconds.toFixed(1) + " s; again every "
      + u.interval_s + " s while this page is open";
  } else if (u.state === "counting") note += "counting\\u2026";
  $("usage-note").textContent = note;
  $("tiers").tBodies[0].replaceChildren(...u.tiers.map((t) =>
    row([t.tier, count(t.objects), bytes(t.bytes), bytes(t.stored_bytes)], [1, 2, 3])));
  const rows = u.buckets.map((b) =>
    row([b.bucket, b.policy, b.tier, count(b.objects), bytes(b.bytes), bytes(b.stored_bytes)], [3, 4, 5]));
  if (!rows.length) rows.push(empty(u.computed_at ? "no objects" : "\\u2026", 6));
  $("buckets").tBodies[0].replaceChildren(...rows);
}
const OP_TITLES = {repair: "Repair", rebalance: "Rebalance", gc: "Garbage collection", tier: "Tiering"};
function renderOps(ops) {
  $("ops").replaceChildren(...Object.entries(ops).map(([name, op]) => {
    const card = el("div", "op");
    card.dataset.op = name;
    card.append(el("h3", null, OP_TITLES[name] || name));
    if (!op.recorded) {
      card.append(el("div", "muted", "no run recorded"));
      if (op.error) card.append(el("small", "muted", op.error));
      return card;
    }
    const f = op.fields;
    const state = f.state || f.status
      || (op.progress === 1 ? "finished" : op.progress === null ? "recorded" : "in progress");
    card.append(cell(el("strong", null, state), el("small", null, "updated " + ago(op.updated))));
    if (op.progress !== null) {
      card.append(cell(bar([[op.progress, "done"]], "progress"), el("small", null, pct(op.progress))));
    }
    const dl = el("dl");
    for (const [k, v] of Object.entries(f)) {
      if (k === "state" || k === "status") continue;
      dl.append(el("dt", null, k), el("dd", null, Array.isArray(v) ? v.join("; ") : v));
    }
    card.append(dl);
    return card;
  }));
}
function renderErrors(errors) {
  const rows = errors.map((e) => {
    const request = e.request_id ? cell(el("span", null, [e.op, e.status].filter(Boolean).join(" ")),
                                        el("small", null, e.request_id)) : "";
    const tr = row([new Date(e.time * 1000).toLocaleTimeString(), e.level, e.source, request, e.message]);
    tr.lastChild.className = "note";
    tr.classList.add(e.level);
    return tr;
  });
  $("errors").tBodies[0].replaceChildren(...(rows.length ? rows : [empty("none since this gateway started", 5)]));
}
function render(s) {
  const w = s.workers;
  $("meta").textContent = "gateway " + s.gateway + " \\u00b7 map epoch " + (s.epoch ?? "?")
    + (w && w.supervised ? " \\u00b7 " + w.running + " of " + w.configured + " workers, "
       + w.restarts + " restarted" : "")
    + " \\u00b7 updated " + new Date(s.generated_at * 1000).toLocaleTimeString();
  banner(s.map_error ? "no cluster map: " + s.map_error : null);
  renderNodes(s.nodes);
  renderUsage(s.usage);
  renderOps(s.ops);
  renderErrors(s.errors);
  document.body.dataset.updated = String(s.generated_at);
}
function banner(text) {
  const b = $("banner");
  b.textContent = text || "";
  b.style.display = text ? "block" : "none";
  document.body.classList.toggle("stale", Boolean(text));
}
async function refresh() {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 10000);
  try {
    const r = await fetch("STATUS_PATH", {cache: "no-store", credentials: "same-origin", signal: ctl.signal});
    if (r.status === 401 || r.status === 403) banner("signed out: reload the page to sign in again");
    else if (!r.ok) throw new Error("HTTP " + r.status);
    else {
      const s = await r.json();
      refreshMs = 1000 * (s.refresh_s || 2);
      render(s);
    }
  } catch (e) {
    banner("cannot reach the gateway (" + (e.message || e) + "), retrying");
  } finally {
    clearTimeout(timer);
    setTimeout(refresh, refreshMs);
  }
}
if (location.search) history.replaceState(null, "", location.pathname);   // drop ?token=
refresh();
""".replace("STATUS_PATH", STATUS_PATH)

_BODY = """
<header><h1>ecstore</h1><span id="summary" class="pill">loading\u2026</span>
<span id="meta" class="meta"></span></header>
<main>
<div id="banner"></div>
<h2>Nodes <small class="legend">capacity:<i class="ours"></i>ecstore data<i class="other"></i>other
<i class="free"></i>free</small></h2>
<table id="nodes"><thead><tr><th>Node</th><th>Role</th><th>Zone</th><th>Tier</th><th>State</th>
<th>Capacity</th><th class="num">Fragments</th><th>Ring share</th><th>Note</th></tr></thead>
<tbody></tbody></table>
<h2>Objects <small id="usage-note"></small></h2>
<table id="tiers"><thead><tr><th>Tier</th><th class="num">Objects</th><th class="num">Bytes</th>
<th class="num">Stored</th></tr></thead><tbody></tbody></table>
<table id="buckets"><thead><tr><th>Bucket</th><th>Policy</th><th>Tier</th><th class="num">Objects</th>
<th class="num">Bytes</th><th class="num">Stored</th></tr></thead><tbody></tbody></table>
<h2>Background work</h2>
<div id="ops" class="ops"></div>
<h2>Last errors <small>warnings and errors this gateway logged, newest first</small></h2>
<table id="errors"><thead><tr><th>Time</th><th>Level</th><th>Source</th><th>Request</th><th>Message</th>
</tr></thead>
<tbody></tbody></table>
</main>
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE_HTML = (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>ecstore status</title><style>{STYLE}</style></head>\n<body>{_BODY}"
             f"<script>{SCRIPT}</script></body></html>\n")
# Only this page's own script, style and fetches: nothing from elsewhere can run or load.
PAGE_HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; script-src {_csp_hash(SCRIPT)}; "
                               f"style-src {_csp_hash(STYLE)}; "
                               "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def main(argv: list[str] | None = None) -> None:
    """Print a URL of the status page that signs in with the gateway's key in cluster.json."""
    p = argparse.ArgumentParser(prog="python -m node.ui", description=main.__doc__)
    p.add_argument("--cluster", help="cluster.json (default: $ECSTORE_CLUSTER, ./.ecstore/cluster.json)")
    p.add_argument("--ttl-s", type=int, default=TOKEN_TTL_S, help="how long the URL works")
    a = p.parse_args(argv)
    if not 1 <= a.ttl_s <= MAX_TOKEN_TTL_S:
        p.error(f"--ttl-s must be between 1 and {MAX_TOKEN_TTL_S}")     # exit 2, as argparse's
    try:
        gw = ClusterInfo.load(a.cluster).raw.get("gateway")
    except EcstoreError as exc:     # no cluster.json there: a message, not a traceback
        p.exit(2, f"error: {exc.message}\n")
    if not gw:
        p.exit(1, "error: cluster.json names no gateway\n")
    token = make_token(gw["access_key"], gw["secret_key"], int(time.time()) + a.ttl_s)
    print(f"{gw['url']}{UI_PATH}?token={token}")


if __name__ == "__main__":
    main()
