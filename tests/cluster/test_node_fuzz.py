"""Random requests against a real storage node and a real control node, most of them
signed with the cluster secret so that they reach the handlers: never a 5xx, never a
traceback or error in the node's log, never a hang, the node healthy after each one, an
unsigned request never served, and no stored byte changed.

Writes that a node may legitimately accept are aimed at scratch names only (fragment ids
starting "fz", bucket "fz-scratch"), and no DELETE can name a seed fragment or the seed
bucket; the seed state is compared before and after, scratch names left out.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.localcluster import LocalCluster
from node.control import MAX_BODY_BYTES as CONTROL_MAX_BODY_BYTES
from node.storage import MAX_FRAGMENT_BYTES
from store.auth import CHECKSUM_HEADER, DATE_HEADER, SIGNATURE_HEADER, signature
from store.client import SyncClient
from store.names import SYSTEM_BUCKETS
from store.wire import FRAGMENT_META_HEADER, pack, unpack
from tests.cluster.rawhttp import Answer, exchange, head_bytes, signed

SEED_BUCKET = "fz-seed"
SEED_OBJECTS = {"big": random.Random(7).randbytes(300_000),  # fragments on every node
                "small": b"inline seed bytes " * 8}              # held in its record
SCRATCH_FID = "fz"
SCRATCH_BUCKET = "fz-scratch"
EXAMPLES = 250          # per node role: about 15 s each on 2 busy cores
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None,
                deadline=timedelta(seconds=30),  # a hang fails sooner, on TIMEOUT_S
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LOG_ALARMS = ("Traceback", " ERROR ", " CRITICAL ")


# ---- the cluster, its seed and what must not change ------------------------------------
@dataclass(repr=False)
class World:
    cluster: LocalCluster
    client: SyncClient
    storage_id: str
    control_id: str
    seed_fids: list[str]          # fragment ids held by the fuzzed storage node
    before: dict[str, Any]
    log_offsets: dict[str, int]

    def port(self, node_id: str) -> int:
        return self.cluster.nodes[node_id].port

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:   # keep failures short
        printer.text(f"World({self.cluster.dir})")


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, client: SyncClient) -> Iterator[World]:
    client.create_bucket(SEED_BUCKET)
    for key, data in SEED_OBJECTS.items():
        client.put(SEED_BUCKET, key, data)
    before = snapshot(cluster)
    storage_id = next(i for i, n in cluster.nodes.items() if n.role == "storage" and before[i])
    control_id = next(i for i, n in cluster.nodes.items() if n.role == "control")
    offsets = {i: log_path(cluster, i).stat().st_size for i in cluster.nodes}
    yield World(cluster, client, storage_id, control_id, sorted(before[storage_id]), before,
                offsets)


def log_path(cluster: LocalCluster, node_id: str) -> Path:
    return cluster.dir / "logs" / f"{node_id}.log"


def call(cluster: LocalCluster, node_id: str, method: str, path: str) -> Answer:
    target = path.encode()
    port = cluster.nodes[node_id].port
    return exchange(port, method, head_bytes(method, target, port,
                                             signed(cluster.secret, method, target)))


def snapshot(cluster: LocalCluster) -> dict[str, Any]:
    """Every node's stored state outside the scratch names."""
    return {i: (storage_state(cluster, i) if n.role == "storage" else control_state(cluster, i))
            for i, n in cluster.nodes.items() if n.role in ("storage", "control")}


def storage_state(cluster: LocalCluster, node_id: str) -> dict[str, tuple[str, str]]:
    """fid -> (checksum, meta header); HEAD verifies the bytes against the checksum."""
    listing = call(cluster, node_id, "GET", "/v1/fragments?limit=10000")
    assert listing.status == 200, listing
    page = unpack(listing.body)
    assert not page["truncated"]
    out = {}
    for fid in page["fragments"]:
        if not fid.startswith(SCRATCH_FID):
            head = call(cluster, node_id, "HEAD", f"/v1/fragments/{fid}")
            assert head.status == 200, (fid, head)
            out[fid] = (head.headers["x-ecstore-checksum"], head.headers[FRAGMENT_META_HEADER])
    return out


def control_state(cluster: LocalCluster, node_id: str) -> dict[str, Any]:
    cmap = call(cluster, node_id, "GET", "/v1/map")
    buckets = call(cluster, node_id, "GET", "/v1/buckets")
    assert cmap.status == 200 and buckets.status == 200, (cmap, buckets)
    rows = [b for b in unpack(buckets.body)["buckets"] if b["name"] != SCRATCH_BUCKET]
    records = {}
    for name in sorted({b["name"] for b in rows} | SYSTEM_BUCKETS | {SEED_BUCKET}):
        page = call(cluster, node_id, "GET", f"/v1/list/{name}?full=1&limit=10000")
        assert page.status == 200, (name, page)
        records[name] = unpack(page.body)
    return {"map": cmap.body, "buckets": rows, "records": records}


# ---- what a request may be -------------------------------------------------------------
@dataclass(frozen=True)
class Req:
    method: str
    target: bytes
    headers: tuple[tuple[str, bytes], ...]
    body: bytes
    auth: str      # signed, mismatch (signed, checksum not the body's), unsigned, badsig, ...
    framing: str   # length, chunked, badchunk, cut_close, cut_half, none

    def __repr__(self) -> str:   # bodies of 80 MiB make falsifying examples unreadable
        body = repr(self.body[:200]) + (f"...({len(self.body)} bytes)" if len(self.body) > 200 else "")
        return (f"Req({self.method!r}, {self.target[:300]!r}, headers={self.headers!r}, "
                f"body={body}, auth={self.auth!r}, framing={self.framing!r})")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:   # hypothesis prints this
        printer.text(repr(self))

    @property
    def signed(self) -> bool:
        return self.auth in ("signed", "mismatch")


# A request's envelope (method, signature, framing, extra headers, query syntax) is right
# but for at most two flaws, so that most requests reach a handler with their garbage
# (ids, names, bodies, meta headers, query values) instead of failing at the door.
FLAWS = ["method", "auth", "framing", "headers", "query"]
BAD_AUTH = ["unsigned", "badsig", "garbage", "stale", "nan"]
BAD_FRAMING = ["badchunk", "cut_close", "cut_half", "none"]
METHODS = ["GET", "PUT", "POST", "DELETE", "HEAD", "PATCH", "OPTIONS", "TRACE", "get", "BREW"]
STORAGE_ROUTES = ([("fid", "PUT")] * 5 + [("fid", "GET")] * 2 + [("fid", "HEAD"), ("fid", "DELETE")]
                  + [("verify", "POST"), ("list", "GET"), ("list", "GET"), ("status", "GET"),
                     ("quarantine", "GET"), ("scrub", "POST"), ("health", "GET"), ("junk", "GET")])
CONTROL_ROUTES = ([("object", "PUT")] * 4 + [("bucket", "PUT")] * 2 + [("map", "PUT")] * 2
                  + [("object", "GET"), ("object", "DELETE"), ("records", "DELETE"),
                     ("bucket", "GET"), ("list", "GET"), ("list", "GET"), ("map", "GET"),
                     ("buckets", "GET"), ("status", "GET"), ("health", "GET"), ("junk", "GET"),
                     ("access", "POST"), ("access", "POST"), ("access_list", "GET"),
                     ("notes", "POST"), ("notes", "POST")])
NASTY_SEGMENTS = ["..", ".", "%2e%2e", "%2E%2E%2F..", "a%2Fb", "%00", "%ff", "%ED%A0%80", "%zz",
                  "%", "~", "a b", "\u00e9", "\U0001f4a5", "x" * 201, "y" * 1025, "z" * 9000,
                  "?", "#", ";x=1", "\\", "{fid}", "_keys", "\ufeff", "%C0%AE"]
JUNK_PATHS = ["/", "", "*", "/v1", "/v1/", "//v1/status", "/v1/../v1/status", "/v2/status",
              "/v1/fragments/", "/v1/objects/", "/v1/objects/abc", "/v1/list/", "/v1/map/x",
              "/V1/STATUS", "/v1/status/", "/v1/health/../status", "http://x/v1/status",
              "/v1/%76%31", "/v1/\xff", "/" + "a/" * 3000]
QUERY_NAMES = ["after", "limit", "prefix", "full", "version_id", "x", "", "limit[]",
               "replaced", "notes", "replaced_since"]
QUERY_VALUES = ["", "0", "-1", "1", "10000", "10001", "1e3", "99999999999999999999", "abc",
                "%ff", "%ED%A0%80", "\u00e9", "a" * 3000, "1", "\x00"]
HEADER_NAMES = ["Content-Type", "Content-Encoding", "Expect", "Range", "Accept-Encoding",
                "X-Forwarded-For", "Connection", "Authorization", "Cookie", "Upgrade",
                FRAGMENT_META_HEADER, CHECKSUM_HEADER, "x-ecstore-size", "Bad Header", "X:Y",
                "Content-Length", "Transfer-Encoding"]
HEADER_VALUES = ["gzip", "deflate", "br", "identity", "100-continue", "keep-alive", "close",
                 "bytes=0-1", "websocket", "application/msgpack", "application/json", "a" * 9000]

segment_text = st.text(max_size=30)
texty = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_characters="\x7f"),
                max_size=60)


def encode(seg: str, mode: str) -> bytes:
    if mode == "quote":
        return quote(seg, safe="").encode()
    if mode == "slash":
        return quote(seg, safe="/%").encode()
    return seg.encode("utf-8", "surrogateescape")


fid_like = st.from_regex(r"[0-9a-f]{8,32}\.[0-9]{1,3}\.[0-9]{1,2}", fullmatch=True)
bucket_like = st.from_regex(r"[a-z0-9][a-z0-9.\-]{1,20}[a-z0-9]", fullmatch=True)
key_like = st.from_regex(r"[\w/.\- ]{1,40}", fullmatch=True)


@st.composite
def segments(draw: st.DrawFn, choices: list[str], like: st.SearchStrategy[str]) -> tuple[str, str]:
    """(segment, encoding) for an id, bucket or key."""
    seg = draw(st.one_of(st.sampled_from(choices), like, segment_text,
                         st.sampled_from(NASTY_SEGMENTS)))
    return seg, draw(st.sampled_from(["quote"] * 3 + ["slash", "raw"]))


@st.composite
def queries(draw: st.DrawFn, raw: bool) -> bytes:
    """A query string, percent-encoded or (raw) as the characters come."""
    pairs = draw(st.lists(st.tuples(st.sampled_from(QUERY_NAMES),
                                    st.one_of(st.sampled_from(QUERY_VALUES), texty)), max_size=3))
    if not pairs:
        return b""
    parts = [(k if raw else quote(k, safe="")) + "=" + (v if raw else quote(v, safe=""))
             for k, v in pairs]
    return b"?" + "&".join(parts).encode("utf-8", "surrogateescape")


msgpack_values = st.recursive(   # built once: a recursive strategy is costly to set up
    st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64), st.floats(),
              st.text(max_size=20), st.binary(max_size=20)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(
        st.one_of(st.text(max_size=8), st.sampled_from(["ts", "version_id", "deleted", "epoch"])),
        kids, max_size=4)),
    max_leaves=12)


def packable(value: Any) -> bytes:
    try:
        return pack(value)
    except (OverflowError, ValueError, TypeError):  # ints past 64 bits: garbage of its own
        return b"\xcf" + b"\xff" * 9


RAW_GARBAGE = [b"\xc1", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\x91" * 5000,
               b"\xc7\x05\x01abcde", b"\xd6\xffabcd", b"\x81\x01\x02", b"\x81\xc0\x02",
               b"{\"ts\": 1}", b"null", b"\x00" * 100, b"\x85" + b"\xa1a" * 3]


@st.composite
def bodies(draw: st.DrawFn, limit_bytes: int) -> bytes:
    if draw(st.integers(0, 99)) == 0:   # rare: costs limit_bytes on the wire
        return oversized(limit_bytes)
    kind = draw(st.sampled_from(["empty", "bytes", "bytes", "msgpack", "record", "record",
                                 "json", "garbage", "cut_record"]))
    record: dict[str, Any] = {"ts": draw(st.integers(-2**63, 2**64 - 1)),
                              "version_id": draw(st.text(max_size=40)), "deleted": draw(st.booleans())}
    if draw(st.booleans()):   # one field of the wrong type (or, by chance, still right)
        record[draw(st.sampled_from(sorted(record)))] = draw(st.one_of(
            st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=3),
            st.binary(max_size=3), st.lists(st.none(), max_size=1)))
    if kind == "empty":
        return b""
    if kind == "bytes":
        return draw(st.binary(max_size=2000))
    if kind == "msgpack":
        return packable(draw(msgpack_values))
    if kind == "record":
        return packable({**record, **draw(st.dictionaries(st.text(max_size=8), msgpack_values,
                                                          max_size=3))})
    if kind == "json":
        return json.dumps(record, default=repr).encode()
    if kind == "garbage":
        return draw(st.sampled_from(RAW_GARBAGE))
    data = packable(record)   # cut short
    return data[:draw(st.integers(0, max(0, len(data) - 1)))]


_OVERSIZED: dict[int, bytes] = {}
_SHA256: dict[int, str] = {}   # of the oversized bodies, by id: hashing 80 MiB takes a while


def oversized(limit_bytes: int) -> bytes:
    if limit_bytes not in _OVERSIZED:
        _OVERSIZED[limit_bytes] = bytes(limit_bytes + 1)
    return _OVERSIZED[limit_bytes]


def sha256_hex(data: bytes) -> str:
    if len(data) <= 2**20:
        return hashlib.sha256(data).hexdigest()
    return _SHA256.setdefault(id(data), hashlib.sha256(data).hexdigest())


# entries of POST /v1/access (read counts): each field right, or of a wrong type or size
note_entries = st.lists(st.one_of(st.text(max_size=140), st.integers(-2, 2**64 - 1),
                                   msgpack_values), min_size=1, max_size=3)
access_entries = st.fixed_dictionaries({
    "bucket": st.one_of(bucket_like, st.sampled_from([SCRATCH_BUCKET, "_keys", "A"]), msgpack_values),
    "key": st.one_of(key_like, msgpack_values),
    "reads": st.one_of(st.integers(-2, 2**64 - 1), st.sampled_from([1e30, "9" * 30, True]),
                       msgpack_values),
    "last": st.one_of(st.floats(), st.sampled_from(["nan", "soon"]), msgpack_values)})

# values for x-ecstore-fragment-meta: base64 of garbage, of non-maps, of maps, too long
meta_values = st.one_of(
    st.binary(max_size=40).map(base64.urlsafe_b64encode),
    msgpack_values.map(packable).map(base64.urlsafe_b64encode),
    st.sampled_from([b"A" * 5000, b"====", b"kQ==", b"\xff\xfe", b"gA==",
                     base64.urlsafe_b64encode(pack({"bucket": "b", "key": "k", "index": 1})),
                     base64.urlsafe_b64encode(b"\x81\x01\x02"),
                     base64.urlsafe_b64encode(b"\xc7\x05\x01abcde")]))
Headers = tuple[tuple[str, bytes], ...]
header_lists = st.lists(st.tuples(
    st.one_of(st.sampled_from(HEADER_NAMES), st.from_regex(r"[A-Za-z0-9-]{1,20}", fullmatch=True)),
    st.one_of(st.sampled_from(HEADER_VALUES).map(str.encode), texty.map(str.encode), meta_values)),
    max_size=4).map(tuple)


def chunked(body: bytes) -> bytes:
    mid = len(body) // 2
    parts = [p for p in (body[:mid], body[mid:]) if p]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


BAD_CHUNKS = [b"zz\r\nabc\r\n0\r\n\r\n", b"ffffffffffffffffffff\r\nabc", b"3\r\nabcdef\r\n0\r\n\r\n",
              b"-1\r\n\r\n", b"3;x=\x01\r\nabc\r\n0\r\n\r\n", b"5\r\nab"]


@st.composite
def envelopes(draw: st.DrawFn, route_method: str) -> tuple[str, str, str, Headers, bool]:
    """(method, auth, framing, extra headers, raw query) with at most two flaws."""
    flaws = draw(st.sets(st.sampled_from(FLAWS), max_size=2))
    method = draw(st.sampled_from(METHODS)) if "method" in flaws else route_method
    auth = draw(st.sampled_from(BAD_AUTH if "auth" in flaws else ["signed"] * 5 + ["mismatch"]))
    framing = draw(st.sampled_from(BAD_FRAMING if "framing" in flaws else ["length"] * 4 + ["chunked"]))
    headers = draw(header_lists) if "headers" in flaws else ()
    return method, auth, framing, headers, "query" in flaws


@st.composite
def storage_requests(draw: st.DrawFn, seed_fids: list[str]) -> Req:
    shape, method = draw(st.sampled_from(STORAGE_ROUTES))
    method, auth, framing, headers, raw_query = draw(envelopes(method))
    body = draw(bodies(MAX_FRAGMENT_BYTES))
    meta = draw(st.one_of(st.none(), meta_values, st.dictionaries(
        st.sampled_from(["bucket", "key", "version_id", "segment", "index"]), msgpack_values,
        max_size=5).map(packable).map(base64.urlsafe_b64encode)))
    if meta is not None:
        headers = ((FRAGMENT_META_HEADER, meta),) + headers
    fid, mode = draw(segments(seed_fids, fid_like))
    verb = method.upper()
    writes = verb == "PUT" and auth == "signed"   # could be stored: a scratch id only
    if writes or verb == "DELETE":
        mode = "quote"  # no '/' of its own: the target cannot climb out to another route
        if writes or unquote(fid) in seed_fids or unquote(unquote(fid)) in seed_fids:
            fid = SCRATCH_FID + fid
        if shape == "junk":
            shape = "fid"
    paths = {"fid": b"/v1/fragments/" + encode(fid, mode),
             "verify": b"/v1/fragments/" + encode(fid, mode) + b"/verify",
             "list": b"/v1/fragments", "status": b"/v1/status", "quarantine": b"/v1/quarantine",
             "scrub": b"/v1/scrub", "health": b"/v1/health"}
    path = paths.get(shape) or draw(st.sampled_from(JUNK_PATHS)).encode("utf-8", "surrogateescape")
    return Req(method, path + draw(queries(raw_query)), headers, body, auth, framing)


@st.composite
def control_requests(draw: st.DrawFn, seeds: list[tuple[str, str]], held_map: bytes) -> Req:
    shape, method = draw(st.sampled_from(CONTROL_ROUTES))
    method, auth, framing, headers, raw_query = draw(envelopes(method))
    bucket, bmode = draw(segments([b for b, _ in seeds] + sorted(SYSTEM_BUCKETS), bucket_like))
    key, kmode = draw(segments([k for _, k in seeds], key_like))
    body = draw(bodies(CONTROL_MAX_BODY_BYTES))
    if shape == "access" and draw(st.booleans()):
        body = packable({"entries": draw(st.lists(access_entries, max_size=3))})
    if shape == "notes" and draw(st.booleans()):   # notes a metadata move brings
        body = packable(draw(st.lists(st.one_of(note_entries, msgpack_values), max_size=3)))
    if shape == "map" and draw(st.integers(0, 9)) == 0:
        body = held_map   # the map held: accepted, changes nothing
    verb = method.upper()
    if (verb == "PUT" and auth == "signed" and shape != "map") \
            or (shape == "notes" and auth == "signed"):
        bucket = SCRATCH_BUCKET              # a record (or notes) that may be valid: scratch only
    if (verb == "PUT" and auth == "signed") or verb == "DELETE":
        bmode = kmode = "quote"
        if shape == "junk":
            shape = "object"
        if any(s in unquote(unquote(bucket)) for s, _ in seeds):
            bucket = "fz-other"
    paths = {"object": b"/v1/objects/" + encode(bucket, bmode) + b"/" + encode(key, kmode),
             "records": b"/v1/records/" + encode(bucket, bmode) + b"/" + encode(key, kmode),
             "bucket": b"/v1/buckets/" + encode(bucket, bmode), "map": b"/v1/map",
             "list": b"/v1/list/" + encode(bucket, bmode), "buckets": b"/v1/buckets",
             "access": b"/v1/access", "access_list": b"/v1/access/" + encode(bucket, bmode),
             "status": b"/v1/status", "health": b"/v1/health",
             "notes": b"/v1/notes/" + encode(bucket, bmode) + b"/" + encode(key, kmode)}
    path = paths.get(shape) or draw(st.sampled_from(JUNK_PATHS)).encode("utf-8", "surrogateescape")
    return Req(method, path + draw(queries(raw_query)), headers, body, auth, framing)


# ---- sending one and judging the answer ------------------------------------------------
def auth_headers(secret: str, req: Req) -> list[tuple[str, bytes]]:
    checksum = sha256_hex(req.body) if req.auth != "mismatch" else hashlib.sha256(
        req.body[:100] + b"!").hexdigest()
    try:
        path_qs = req.target.decode()
    except UnicodeDecodeError:
        path_qs = None   # not UTF-8: nobody can sign it; the node must refuse it cleanly
    now = time.time()
    date = {"stale": f"{now - 1000:.3f}", "nan": "nan"}.get(req.auth, f"{now:.3f}")
    if req.auth == "unsigned":
        return []
    if req.auth == "garbage":
        return [(DATE_HEADER, "tomorrow \u00e9".encode()), (CHECKSUM_HEADER, b"\xff" * 64),
                (SIGNATURE_HEADER, "\u00e9".encode() * 32)]
    sig = ("0" * 64 if req.auth == "badsig" or path_qs is None
           else signature(secret, req.method, path_qs, date, checksum))
    return [(DATE_HEADER, date.encode()), (CHECKSUM_HEADER, checksum.encode()),
            (SIGNATURE_HEADER, sig.encode())]


def send(world: World, node_id: str, req: Req) -> Answer:
    port = world.port(node_id)
    headers = auth_headers(world.cluster.secret, req) + list(req.headers)
    body, cut = req.body, ""
    if req.framing in ("chunked", "badchunk") and len(body) <= 2**20:
        headers.append(("Transfer-Encoding", b"chunked"))
        if req.framing == "chunked":
            body = chunked(body)
        else:   # and our side shut: a chunk cut short must not leave the node waiting
            body, cut = BAD_CHUNKS[len(body) % len(BAD_CHUNKS)], "half"
    elif req.framing in ("cut_close", "cut_half"):
        headers.append(("Content-Length", b"%d" % (len(body) + 1 + len(body) // 2)))
        cut = req.framing[4:]
    elif req.framing == "length" or body:
        headers.append(("Content-Length", b"%d" % len(body)))
    headers.append(("Connection", b"close"))
    return exchange(port, req.method, head_bytes(req.method, req.target, port, headers) + body,
                    cut=cut)


def judge(world: World, node_id: str, req: Req, answer: Answer) -> None:
    where = f"{node_id} {req.method} {req.target[:200]!r} auth={req.auth} framing={req.framing}"
    if answer.status is None:
        # only a client that vanished or shut its side mid-body may go unanswered (the
        # node sees the end of the connection before the end of the request); one still
        # sending a body over the limit may lose the answer to the node's close
        assert req.framing in ("cut_close", "cut_half", "badchunk") or len(req.body) > 2**20, \
            f"no answer: {where}"
    else:
        full = answer.status == 507 and b"insufficient_storage" in answer.body  # disk really full
        assert answer.status < 500 or full, f"{answer.status} {answer.body[:300]!r}: {where}"
        if answer.status >= 400 and req.method != "HEAD":
            assert answer.body.strip(), f"{answer.status} without a reason: {where}"
        if 200 <= answer.status < 300 and not req.signed:   # only /v1/health is open
            assert req.method == "HEAD" or b'"ok": true' in answer.body, f"served unsigned: {where}"
            assert b"health" in req.target, where
    health = exchange(world.port(node_id), "GET", head_bytes(
        "GET", b"/v1/health", world.port(node_id), [("Connection", b"close")]))
    assert health.status == 200, f"unhealthy after {where}: {health}"
    for i in (world.storage_id, world.control_id):
        new = read_new_log(world, i)
        assert not any(a in new for a in LOG_ALARMS), f"{i} logged after {where}:\n{new[-3000:]}"


def read_new_log(world: World, node_id: str) -> str:
    with open(log_path(world.cluster, node_id), "rb") as f:
        f.seek(world.log_offsets[node_id])
        data = f.read()
    world.log_offsets[node_id] += len(data)
    return data.decode(errors="replace")


# ---- the tests -------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_random_requests_to_a_storage_node_never_fail_it(world: World, data: st.DataObject) -> None:
    req = data.draw(storage_requests(world.seed_fids), label="request")
    judge(world, world.storage_id, req, send(world, world.storage_id, req))


@FUZZ
@given(data=st.data())
def test_random_requests_to_a_control_node_never_fail_it(world: World, data: st.DataObject) -> None:
    held_map = world.before[world.control_id]["map"]
    req = data.draw(control_requests([(SEED_BUCKET, k) for k in SEED_OBJECTS], held_map),
                    label="request")
    judge(world, world.control_id, req, send(world, world.control_id, req))


def test_nothing_stored_changed_and_no_node_logged_an_error(world: World) -> None:
    after = snapshot(world.cluster)
    for node_id, state in world.before.items():
        assert after[node_id] == state, f"{node_id} changed"
    for key, data in SEED_OBJECTS.items():
        assert world.client.get(SEED_BUCKET, key) == data
    assert sorted(world.cluster.running()) == sorted(world.cluster.nodes)
    for node_id in world.cluster.nodes:
        text = log_path(world.cluster, node_id).read_text(errors="replace")
        assert not any(a in text for a in LOG_ALARMS), f"{node_id} logged:\n{text[-3000:]}"


@settings(FUZZ, max_examples=EXAMPLES // 3)
@given(entries=st.lists(access_entries, min_size=1, max_size=4))
def test_read_count_reports_with_garbage_entries_never_fail_a_control_node(
        world: World, entries: list[dict[str, Any]]) -> None:
    # one route, many entry shapes: the route-wide fuzz reaches the entry checks too rarely
    req = Req("POST", b"/v1/access", (), packable({"entries": entries}), "signed", "length")
    judge(world, world.control_id, req, send(world, world.control_id, req))
