"""S3 gateway: the S3 API over the client library (no second data path).

One dispatcher routes each request by path (/, /bucket, /bucket/key) and subresource
(?uploads, ?acl, ...) to a handler in node.s3; a middleware authenticates (AWS SigV4,
header or presigned) and turns every error into S3's XML error answer. The gateway's
own health check is GET /_ecstore/health (no bucket name can start with "_"), its metrics
GET /_ecstore/metrics (and GET /metrics, see metrics_or_s3; the README, Observability).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping

from aiohttp import web

from node import ui
from node.logs import configure_logging
from node.metrics import (
    OP,
    REQUEST_ID,
    ObservabilityConfig,
    Observer,
    add_observability_args,
    client_metrics,
    observability_config,
    observability_from_argv,
    op_name,
)
from node.s3 import buckets, objects, uploads
from node.s3.context import DEFAULT_SEGMENT_SLOTS, Gateway, GatewayConfig, S3Ctx, defer_continue
from node.s3.errors import S3Error, access_denied, not_implemented, to_s3_error
from node.s3.sigv2 import access_key_v2, authenticate_v2, is_v2
from node.s3.sigv4 import AuthResult, authenticate
from node.server import OBSERVER, PUBLISHED_SECRETS, install_observer, metrics, run
from node.workers import (
    Heartbeat,
    Supervisor,
    WorkerStats,
    stall_timeout_from_env,
    worker_metrics,
    workers_view,
)
from store.client import Client
from store.cluster import ClusterInfo
from store.errors import EcstoreError
from store.names import MAX_KEY_BYTES

log = logging.getLogger("ecstore.gateway")
HEALTH_PATH = "/_ecstore/health"
METRICS_PATH = "/_ecstore/metrics"   # also GET /metrics, unless an S3 request (metrics_or_s3)
GATEWAY = web.AppKey("gateway", Gateway)
Handler = Callable[[S3Ctx], Awaitable[web.StreamResponse]]
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
MAP_RETRY_S = 1.0
# Subresources S3 has and we do not: answered NotImplemented, never ignored.
UNSUPPORTED = frozenset({"policy", "lifecycle", "cors", "tagging", "website", "logging",
                         "notification", "replication", "encryption", "object-lock", "retention",
                         "legal-hold", "torrent", "restore", "select", "accelerate",
                         "requestPayment", "analytics", "inventory", "metrics", "ownershipControls",
                         "publicAccessBlock", "intelligent-tiering", "policyStatus", "attributes",
                         "session"})
# Every query parameter a request may carry here: the subresources routed below, the
# operations' parameters, presigned URLs' (SigV4 and SigV2) and response overrides. S3
# keeps adding operations that are a subresource of a plain one (?renameObject,
# ?annotation, ?metadataTable, ?abac, ...): a parameter not here is answered
# NotImplemented on a PUT, POST or DELETE (whatever it names would be run as the plain
# put, delete or create - a rename emptied its target, an annotation's delete deleted
# the object) and, when it has no value (a subresource's form), on GET and HEAD too - an
# unknown parameter with a value on a read is ignored, as S3 ignores one.
KNOWN_QUERY = frozenset({
    "acl", "location", "versioning", "uploads", "versions", "delete", "uploadId",
    "partNumber", "versionId", "list-type", "prefix", "delimiter", "max-keys", "marker",
    "start-after", "continuation-token", "fetch-owner", "encoding-type", "key-marker",
    "upload-id-marker", "max-uploads", "version-id-marker", "max-parts",
    "part-number-marker", "max-buckets", "bucket-region", "x-id",
    "response-content-type", "response-content-language", "response-expires",
    "response-cache-control", "response-content-disposition", "response-content-encoding",
    "AWSAccessKeyId", "Signature", "Expires"})
KNOWN_QUERY_PREFIX = "x-amz-"    # presigned URLs' X-Amz-*, and headers SDKs hoist into them


def unknown_query(method: str, query: Mapping[str, str]) -> str | None:
    """The first query parameter this request must be refused for (see KNOWN_QUERY)."""
    for name, value in query.items():
        if name in KNOWN_QUERY or name.lower().startswith(KNOWN_QUERY_PREFIX):
            continue
        if method not in ("GET", "HEAD") or not value:
            return name
    return None


# Request headers (by prefix) asking for what we do not do - encryption (SSE-S3, SSE-KMS,
# SSE-C, of a copy's source too), tags (x-amz-tagging, CopyObject's
# x-amz-tagging-directive), object lock, website redirects, appends (a put at
# x-amz-write-offset-bytes replaced the object), deletes on the condition of a size or
# time (x-amz-if-match-size, -last-modified-time), an expected bucket owner (an AWS
# account id: we have none to compare it with): NotImplemented, never ignored.
# None is sent by boto3, the aws cli or s3fs unless asked for.
UNSUPPORTED_HEADERS = ("x-amz-server-side-encryption", "x-amz-copy-source-server-side-encryption",
                       "x-amz-tagging", "x-amz-object-lock-", "x-amz-bucket-object-lock-",
                       "x-amz-website-redirect-location", "x-amz-write-offset-bytes",
                       "x-amz-if-match-", "x-amz-expected-bucket-owner",
                       "x-amz-source-expected-bucket-owner")


def unsupported_header(headers: Iterable[str]) -> str | None:
    """The first request header (lower case) naming a feature we do not have, or None."""
    return next((h for h in map(str.lower, headers) if h.startswith(UNSUPPORTED_HEADERS)), None)


def route(method: str, ctx: S3Ctx) -> Handler:
    """The handler for a request, by path shape, method and subresource."""
    q = ctx.query
    named = [n for n in q if not n.lower().startswith(KNOWN_QUERY_PREFIX)
             and n not in ("x-id", "AWSAccessKeyId", "Signature", "Expires")]
    if method == "GET" and len(named) == 1:   # "nothing set" for what we do not have
        sub = named[0]
        if ctx.bucket and not ctx.key and sub in buckets.NOT_CONFIGURED:
            return buckets.not_configured(sub)
        if ctx.key and sub == "tagging":
            return objects.get_object_tagging
    bad = sorted(UNSUPPORTED & set(q))
    if bad or (method == "PUT" and "versioning" in q):
        raise S3Error("NotImplemented", f"{(bad or ['versioning'])[0]} is not supported", 501)
    unknown = unknown_query(method, q)
    if unknown is not None:
        raise S3Error("NotImplemented", f"the query parameter {unknown[:80]!r} names an "
                      "operation or option this gateway does not support", 501)
    header = unsupported_header(ctx.headers)
    if header is not None:
        raise not_implemented("A header you provided implies functionality that is not "
                              f"implemented: {header}", header)
    if not ctx.bucket:
        if method == "GET":
            return buckets.list_buckets
    elif not ctx.key:
        table: dict[tuple[str, str], Handler] = {
            ("GET", "acl"): buckets.get_bucket_acl, ("PUT", "acl"): buckets.put_bucket_acl,
            ("GET", "location"): buckets.get_location, ("GET", "versioning"): buckets.get_versioning,
            ("GET", "uploads"): uploads.list_uploads, ("GET", "versions"): buckets.list_object_versions,
            ("POST", "delete"): objects.delete_objects,
        }
        for (m, sub), h in table.items():
            if method == m and sub in q:
                return h
        plain: dict[str, Handler] = {
            "PUT": buckets.create_bucket, "HEAD": buckets.head_bucket, "DELETE": buckets.delete_bucket,
            "GET": buckets.list_objects_v2 if q.get("list-type") == "2" else buckets.list_objects_v1}
        if method in plain:
            return plain[method]
    else:
        if "uploadId" in q:
            by_method: dict[str, Handler] = {"PUT": uploads.upload_part, "POST": uploads.complete_upload,
                                             "DELETE": uploads.abort_upload, "GET": uploads.list_parts}
            if method in by_method and (method != "PUT" or "partNumber" in q):
                return by_method[method]
        elif method == "POST" and "uploads" in q:
            return uploads.create_upload
        elif "acl" in q and method in ("GET", "PUT"):
            return objects.get_object_acl if method == "GET" else objects.put_object_acl
        elif method in ("GET", "HEAD"):
            head = method == "HEAD"
            return lambda c: objects.get_object(c, head)
        elif method == "PUT":
            return objects.put_object
        elif method == "DELETE":
            return objects.delete_object
    raise S3Error("MethodNotAllowed", "The specified method is not allowed against this "
                  "resource.", 405)


def split_path(path: str) -> tuple[str, str]:
    bucket, _, key = path.lstrip("/").partition("/")
    return bucket, key


def request_target(host: str | None, path: str, domains: Collection[str]) -> tuple[str, str, bool]:
    """(bucket, key, virtual-hosted): from the Host header when it is BUCKET.DOMAIN for one
    of `domains` (ECSTORE_S3_DOMAIN; the longest that matches: BUCKET may hold dots) - the
    key is then the whole path - else, a domain itself among them, from the path (path
    style: /bucket/key)."""
    if host and domains:
        name = host.lower()
        name = name.split("]", 1)[0] + "]" if name.startswith("[") else name.rsplit(":", 1)[0]
        name = name.rstrip(".")
        if name not in domains:
            for domain in sorted(domains, key=len, reverse=True):
                if name.endswith("." + domain):
                    key = path[1:] if path.startswith("/") else path
                    return name[:-len(domain) - 1], key, True
    bucket, key = split_path(path)
    return bucket, key, False


async def _authenticate(request: web.Request, gw: Gateway, bucket: str = ""
                        ) -> tuple[str | None, AuthResult | None]:
    """(user, AuthResult) of a signed request, (None, None) for an anonymous one.
    `bucket`: of a virtual-hosted request (SigV2 signs /bucket/key whatever the Host)."""
    header = request.headers.get("Authorization", "")
    v2 = is_v2(request.query, request.headers)
    m = _CREDENTIAL.search(header)
    if v2:
        access_key = access_key_v2(request.query, request.headers)
    else:
        access_key = m.group(1) if m else request.query.get("X-Amz-Credential", "").split("/")[0]
    record = await gw.key_record(access_key) if access_key else None
    raw_path = request.raw_path.split("?", 1)[0]
    if v2 and bucket:
        raw_path = f"/{bucket}{raw_path}"
    verify = authenticate_v2 if v2 else authenticate
    result = verify(request.method, raw_path, list(request.query.items()), request.headers,
                    lambda ak: record["secret_key"] if record and ak == access_key else None,
                    time.time())
    if result is None:
        return None, None
    assert record is not None
    return str(record["user"]), result


def error_response(request: web.Request, err: S3Error, request_id: str) -> web.Response:
    headers = {"x-amz-request-id": request_id, **err.headers}
    body = b"" if request.method == "HEAD" else err.to_xml(request.path, request_id)
    return web.Response(status=err.status, body=body, headers=headers,
                        content_type="application/xml")


async def dispatch(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    # the header, not request.host: without one aiohttp asks socket.getfqdn() (DNS, blocking)
    bucket, key, virtual = request_target(request.headers.get("Host"), request.path,
                                          gw.config.domains)
    ctx = S3Ctx(request, gw, bucket, key, None, None, request[REQUEST_ID],  # node.server's id
                virtual=virtual)
    resp = await _answer(request, ctx)
    if ctx.body_declined() and not resp.prepared:
        resp.force_close()   # "Connection: close": the body the client kept back never comes
    return resp


async def _answer(request: web.Request, ctx: S3Ctx) -> web.StreamResponse:
    gw, key = ctx.gw, ctx.key
    try:
        if request.method == "POST" and ctx.bucket and not key \
                and request.content_type == "multipart/form-data":
            # a browser's form upload (POST Object): its signature is in the form, so
            # it read as an anonymous request - AccessDenied sent users after their keys
            raise not_implemented("browser-based uploads (POST Object, a form) are not "
                                  "supported: use PUT, or a presigned PUT URL", "Content-Type")
        user, auth = await _authenticate(request, gw, ctx.bucket if ctx.virtual else "")
        ctx.user, ctx.auth = user, auth
        if user is None and not (request.method in ("GET", "HEAD") and key
                                 and not (({"acl", "uploadId"} | UNSUPPORTED) & set(request.query))):
            raise access_denied()
        handler = route(request.method, ctx)
        request[OP] = op_name(handler, request.method)  # the metrics' and log's operation
        if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise S3Error("KeyTooLongError", "Your key is too long")
        resp = await handler(ctx)
        resp.headers["x-amz-request-id"] = ctx.request_id
        return resp
    except S3Error as exc:
        return error_response(request, exc, ctx.request_id)
    except EcstoreError as exc:
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc.message)
        return error_response(request, to_s3_error(exc, key), ctx.request_id)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(request, to_s3_error(EcstoreError("internal"), key), ctx.request_id)


async def health(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    try:
        cmap = await gw.client.cluster_map()
    except EcstoreError as exc:
        return web.json_response({"ok": False, "error": exc.message}, status=503)
    return web.json_response({"ok": True, "node": gw.config.node_id, "epoch": cmap.epoch,
                              "pid": os.getpid()})   # the worker that answered


async def metrics_or_s3(request: web.Request) -> web.StreamResponse:
    """GET /metrics: the gateway's metrics, unless it is S3's (a bucket may be named
    "metrics"): signed for S3 or with a query. /_ecstore/metrics is never S3's."""
    auth = request.headers.get("Authorization", "bearer")
    if request.query_string or not auth.lower().startswith("bearer"):
        return await dispatch(request)
    return await metrics(request)


def make_app(config: GatewayConfig, observability: ObservabilityConfig | None = None,
             workers: WorkerStats | None = None) -> web.Application:
    """The gateway's app; `workers`: the supervisor's counts, when it is one of several
    worker processes (node.workers), for its metrics and status page."""
    config.check()
    app = web.Application(handler_args={"auto_decompress": False},  # bodies are stored as sent
                          client_max_size=1024 ** 2)
    install_observer(app, Observer(config.node_id, "gateway", config.secret,
                                   observability or observability_config()),
                     id_header="x-amz-request-id")  # on every answer, streamed ones too
    app[PUBLISHED_SECRETS] = {"ECSTORE_SECRET": config.secret,
                              "ECSTORE_S3_SECRET_KEY": config.admin_secret_key}
    app[OBSERVER].add_collector(lambda: client_metrics(app[GATEWAY].client if GATEWAY in app else None))
    app[OBSERVER].add_collector(lambda: worker_metrics(workers))

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        client = Client(ClusterInfo(config.control, config.secret))
        client.set_segment_slots(config.segment_slots)
        app[GATEWAY] = Gateway(config, client)
        yield
        await client.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get(HEALTH_PATH, health)
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get("/metrics", metrics_or_s3, allow_head=False)
    ui.setup(app, GATEWAY, _authenticate,   # GET /ui, /ui/status.json: the status page
             lambda: workers_view(workers))
    # [\s\S], not ".": a key may hold a newline (%0A), which "." does not match - such a
    # request got aiohttp's plain-text 404 instead of reaching the S3 dispatcher
    app.router.add_route("*", r"/{tail:[\s\S]*}", dispatch, expect_handler=defer_continue)
    return app


def config_from_args(argv: list[str] | None = None) -> GatewayConfig:
    p = argparse.ArgumentParser(prog="python -m node.gateway")
    p.add_argument("--id", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--control", default=os.environ.get("ECSTORE_CONTROL", ""),
                   help="control node URLs, comma separated (or $ECSTORE_CONTROL)")
    p.add_argument("--region", default=os.environ.get("ECSTORE_S3_REGION", "us-east-1"))
    p.add_argument("--domain", default=os.environ.get("ECSTORE_S3_DOMAIN", ""),
                   help="host names, comma separated, whose subdomains are buckets: "
                        "virtual-hosted-style requests (bucket.DOMAIN/key) besides path style "
                        "(or $ECSTORE_S3_DOMAIN)")
    p.add_argument("--workers", type=int, default=int(os.environ.get("ECSTORE_GATEWAY_WORKERS", 1)),
                   help="processes sharing the port (default 1; one per core is typical)")
    p.add_argument("--segment-slots", type=int,
                   default=int(os.environ.get("ECSTORE_GATEWAY_SEGMENT_SLOTS", DEFAULT_SEGMENT_SLOTS)),
                   help="segments held in memory across all requests (the memory bound)")
    add_observability_args(p)  # read by observability_from_argv
    a = p.parse_args(argv)
    config = GatewayConfig(
        node_id=a.id, control=tuple(u.strip() for u in a.control.split(",") if u.strip()),
        secret=os.environ.get("ECSTORE_SECRET", ""),
        admin_access_key=os.environ.get("ECSTORE_S3_ACCESS_KEY", ""),
        admin_secret_key=os.environ.get("ECSTORE_S3_SECRET_KEY", ""),
        host=a.host, port=a.port, region=a.region, segment_slots=a.segment_slots,
        workers=a.workers,
        domains=tuple(d.strip().lower().strip(".") for d in a.domain.split(",") if d.strip()))
    try:
        return config.check()
    except ValueError as exc:
        raise SystemExit(f"gateway: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    """Serve; with `workers` > 1, this process forks that many workers sharing the port
    (SO_REUSEPORT), so the gateway's hashing and encoding use every core, and keeps them
    serving (node.workers: replaced when one dies or stalls, all stopped on SIGTERM)."""
    config = config_from_args(argv)
    obs = observability_from_argv(argv)
    if config.workers == 1:
        run(make_app(config, obs), config.host, config.port)
        return
    stall_timeout_s = stall_timeout_from_env()
    stats, parent = WorkerStats(), os.getpid()

    def serve(_index: int, heartbeat_fd: int) -> None:
        heartbeat = Heartbeat(parent, heartbeat_fd)
        run(make_app(config, obs, stats), config.host, config.port, reuse_port=True,
            ready=heartbeat.start)
    # unbuffered: no log thread in a process that forks
    configure_logging(config.node_id, obs.log_format, buffered=False)
    raise SystemExit(Supervisor(config.workers, serve, stall_timeout_s, stats).run())


if __name__ == "__main__":
    main()
