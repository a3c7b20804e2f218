"""Prometheus metrics of one node process (prometheus-client), served at /metrics.

An `Observer` per app holds a private registry: request counters and latency histograms by
operation (`op`: the route handler's name, or the S3 operation on the gateway; a bounded
set, never a key, bucket or fragment id) and status, bytes in and out, connections, the
process collectors, and the gauges each role adds with `add_collector` (fragments stored,
disk free, map epoch, repair progress ...), computed only when scraped.

Requests are counted by the access-log hook of node.server.run (after the response is
written, so the latency includes sending it); the same hook writes the request's log line
(node.logs). Per request that is two dict lookups, four metric updates and one log line.
The README (Observability: metrics and logs) lists every name.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from node.logs import LOG_FORMATS, log_event, log_format_from_env, request_log

log = logging.getLogger("ecstore.metrics")

METRICS_PATH = "/metrics"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4      # Prometheus' text format
METRICS_PUBLIC_ENV = "ECSTORE_METRICS_PUBLIC"
METRICS_TOKEN_ENV = "ECSTORE_METRICS_TOKEN"
MIN_METRICS_TOKEN_CHARS = 16
# request latency, seconds: fragment requests take ~1 ms, a gateway put of 5 GiB minutes
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0, 300.0)
KNOWN_METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"})
UNPARSED_OP = "unparsed"      # a request aiohttp could not parse (answered 400 before routing)
UNMATCHED_OP = "unmatched"    # no route: 404 or 405

REQUEST_ID = web.RequestKey("ecstore_request_id", str)
OP = web.RequestKey("ecstore_op", str)
STARTED = web.RequestKey("ecstore_started", float)   # time.perf_counter() at the middleware
# why an answer whose status line was sent could not be finished (the connection was cut):
# its log line says so at WARNING, and it is counted as a 500
CUT_SHORT = web.RequestKey("ecstore_cut_short", str)
Families = Iterable[Metric]

# No *_created series: they double what a scrape carries and Prometheus does not need them.
disable_created_metrics()


@dataclass(frozen=True)
class ObservabilityConfig:
    """How a node exposes itself. metrics_public: /metrics answers anyone; metrics_token:
    a bearer token /metrics accepts besides a request signed with the cluster secret
    ("" = none); log_format: "text" or "json"."""

    metrics_public: bool = False
    metrics_token: str = ""
    log_format: str = "text"

    def check(self) -> "ObservabilityConfig":
        if self.metrics_token and (len(self.metrics_token) < MIN_METRICS_TOKEN_CHARS
                                   or not self.metrics_token.isprintable()
                                   or " " in self.metrics_token):
            raise ValueError(f"{METRICS_TOKEN_ENV} must be {MIN_METRICS_TOKEN_CHARS}+ printable "
                             "characters without spaces")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}")
        return self


def add_observability_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-public", action="store_true", default=None,
                   help=f"serve /metrics without authentication (or ${METRICS_PUBLIC_ENV}=1)")
    p.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                   help="log lines as readable text or JSON (default $ECSTORE_LOG_FORMAT, else text)")


def observability_config(a: argparse.Namespace | None = None) -> ObservabilityConfig:
    """From the flags of add_observability_args (when given), else the environment:
    ECSTORE_METRICS_PUBLIC=1, ECSTORE_METRICS_TOKEN, ECSTORE_LOG_FORMAT. SystemExit if bad."""
    public_env = os.environ.get(METRICS_PUBLIC_ENV, "").strip().lower()
    if public_env not in ("", "0", "1", "true", "false", "yes", "no"):
        raise SystemExit(f"{METRICS_PUBLIC_ENV} must be 1 or 0, got {public_env!r}")
    public = getattr(a, "metrics_public", None) or public_env in ("1", "true", "yes")
    fmt = getattr(a, "log_format", None) or log_format_from_env()
    try:
        return ObservabilityConfig(bool(public), os.environ.get(METRICS_TOKEN_ENV, "").strip(),
                                   fmt).check()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def observability_from_argv(argv: list[str] | None = None) -> ObservabilityConfig:
    """observability_config of the add_observability_args flags found in `argv` (default
    sys.argv), for a command whose own parser has them too."""
    p = argparse.ArgumentParser(add_help=False)
    add_observability_args(p)
    known, _ = p.parse_known_args(argv)
    return observability_config(known)


class _Collect:
    """A registry collector around a function called at each scrape."""

    def __init__(self, fn: Callable[[], Families]) -> None:
        self.fn = fn

    def collect(self) -> Families:
        return self.fn()


def gauge(name: str, doc: str, value: float | None,
          labels: Mapping[str, str] | None = None) -> GaugeMetricFamily:
    """A gauge family of one sample (none if value is None)."""
    fam = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    if value is not None:
        fam.add_metric(list((labels or {}).values()), value)
    return fam


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """A counter family of one sample; `name` without the _total the format adds."""
    return CounterMetricFamily(name, doc, value=value)


class Observer:
    """The metrics and request log of one node process (one app)."""

    def __init__(self, node_id: str, role: str, secret: str,
                 config: ObservabilityConfig | None = None) -> None:
        self.node_id, self.role, self.secret = node_id, role, secret
        self.config = (config or ObservabilityConfig()).check()
        self.trust_request_ids = role != "gateway"  # the gateway assigns its own ids
        reg = self.registry = CollectorRegistry()
        for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # also in the global one
            reg.register(c)  # type: ignore[arg-type]
        Gauge("ecstore_node_info", "This node's id and role (always 1).", ["node_id", "role"],
              registry=reg).labels(node_id, role).set(1)
        self._requests = Counter("ecstore_http_requests_total", "Requests answered, by "
                                 "operation and HTTP status.", ["op", "status"], registry=reg)
        self._latency = Histogram("ecstore_http_request_duration_seconds", "Time from a "
                                  "request's arrival to the end of its response, by operation "
                                  "and status.", ["op", "status"], buckets=LATENCY_BUCKETS_S,
                                  registry=reg)
        self._received = Counter("ecstore_http_received_bytes_total", "Request body bytes "
                                 "received, by operation.", ["op"], registry=reg)
        self._sent = Counter("ecstore_http_sent_bytes_total", "Response bytes sent (status line "
                             "and headers included), by operation.", ["op"], registry=reg)
        self._children: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}
        self.in_flight = 0        # requests in a handler now
        self.stopping = False     # SIGTERM: answers say Connection: close (node.server)
        self.cap: Any = None      # node.server.ConnectionCap, set when serving
        reg.register(_Collect(self._server_metrics))  # type: ignore[arg-type]

    def add_collector(self, fn: Callable[[], Families]) -> None:
        """Call `fn` at every scrape for more metric families (role gauges)."""
        self.registry.register(_Collect(fn))  # type: ignore[arg-type]

    def exposition(self) -> bytes:
        """Every metric in the text format (blocking: collectors may read the disk)."""
        return generate_latest(self.registry)

    def _server_metrics(self) -> Families:
        yield gauge("ecstore_http_requests_in_flight", "Requests being handled now.",
                    self.in_flight)
        cap = self.cap
        if cap is not None:
            yield gauge("ecstore_http_connections_open", "Open client connections (idle "
                        "keep-alive ones included).", cap.open)
            yield gauge("ecstore_http_connections_max", "The open connections cap "
                        "(ECSTORE_MAX_CONNECTIONS).", cap.limit)
            yield counter("ecstore_http_connections_refused", "Connections refused with 503 "
                          "at the cap.", cap.refused_total)
            heads = CounterMetricFamily(
                "ecstore_http_heads_refused", "Request heads refused, the connection closed: "
                "431 past MAX_REQUEST_HEAD_BYTES (size), 408 past the head timeout (timeout).",
                labels=["reason"])
            for reason, n in cap.heads_refused.items():
                heads.add_metric([reason], n)
            yield heads

    def request_done(self, request: BaseRequest, response: web.StreamResponse,
                     elapsed_s: float) -> None:
        """Count one answered request and write its log line. `elapsed_s` is aiohttp's
        (the loop's clock: whole ms on uvloop); the middleware's start time is finer."""
        started = request.get(STARTED)
        if started is not None:
            elapsed_s = time.perf_counter() - started
        cut = request.get(CUT_SHORT)
        self.record(request.get(OP, UNPARSED_OP), request.method,
                    response.status if cut is None else 500, elapsed_s,
                    getattr(request.content, "total_bytes", 0), response.body_length,
                    request.get(REQUEST_ID, "-"), cut, response.status)

    def record(self, op: str, method: str, status: int, elapsed_s: float, n_in: int,
               n_out: int, request_id: str, cut_short: str | None = None,
               sent_status: int = 0) -> None:
        """Count one answered request and write its log line (request_done's, and the
        storage node's fast path's: node.fastpath answers without an aiohttp request)."""
        key = (op, status)
        children = self._children.get(key)
        if children is None:  # op and status are bounded sets, so is this dict
            st = str(status)
            children = self._children[key] = (
                self._requests.labels(op, st), self._latency.labels(op, st),
                self._received.labels(op), self._sent.labels(op))
        children[0].inc()
        children[1].observe(elapsed_s)
        if n_in:
            children[2].inc(n_in)
        if n_out:
            children[3].inc(n_out)
        if method not in KNOWN_METHODS:
            method = "OTHER"
        fields = {"request_id": request_id, "method": method, "op": op,
                  "status": status, "duration_ms": round(elapsed_s * 1000, 1),
                  "bytes_in": n_in, "bytes_out": n_out}
        if cut_short is not None:   # the status line said sent_status; the body was cut
            fields.update(sent_status=sent_status, cut_short=cut_short)
        log_event(request_log, logging.INFO if status < 500 else logging.WARNING, "request",
                  fields)


def client_metrics(client: Any) -> Families:
    """The counters of a node's embedded client library (store.client.Client: the
    gateway's), read when scraped; nothing before it exists."""
    if client is None:
        return
    faults, reads = client.fault_stats, client.read_stats
    yield counter("ecstore_client_degraded_reads", "Segments decoded with parity fragments "
                  "standing in for data fragments (a node failed, was slow, or sent a bad "
                  "fragment).", faults["degraded_reads"])
    yield counter("ecstore_client_checksum_failures", "Fragments received whose checksum did "
                  "not match (reported to their node, which quarantines a bad file).",
                  faults["checksum_failures"])
    yield counter("ecstore_client_metadata_quorum_failures", "Metadata reads and writes that "
                  "got fewer answers than their quorum.", faults["metadata_quorum_failures"])
    yield counter("ecstore_client_fragment_gets", "Fragment reads sent to storage nodes.",
                  reads["fragment_gets"])
    yield counter("ecstore_client_segments_fetched", "Segments fetched and decoded.",
                  reads["segments_fetched"])
    yield gauge("ecstore_map_epoch", "Epoch of the cluster map this node holds (0: none).",
                client.map_epoch)


def op_name(handler: Callable[..., Any], method: str) -> str:
    """The operation label of a route's handler: its function name (a lambda, as the
    gateway's get/head routes are, is named by the method: get_object, head_object)."""
    name = getattr(handler, "__name__", "other")
    return f"{method.lower()}_object" if name == "<lambda>" else name


def access_log_class(observer: Observer) -> type[AbstractAccessLogger]:
    """An aiohttp access logger that hands each finished request to `observer`."""
    class AccessLog(AbstractAccessLogger):
        def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
            try:
                observer.request_done(request, response, time)
            except Exception:  # a bug here must not break the connection it runs on
                log.exception("request accounting failed")

    return AccessLog
