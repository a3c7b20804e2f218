"""Structured logs for every node role: one line per request (node.server's access log)
and per background step (a scrub batch), readable `key=value` text by default, one JSON
object per line with ECSTORE_LOG_FORMAT=json (or --log-format json).

Every line names its node; a request line, and any line logged while a request is handled
(the gateway's warning of why a put failed), carries the request id that follows one
operation across the nodes it touches (store.transport.REQUEST_ID_HEADER), so
`grep ID DIR/logs/*.log` shows one put or get on the gateway, control and storage nodes.

Loggers: "ecstore.request" (requests), "ecstore.step" (background steps) log at INFO and
are on by default (ECSTORE_REQUEST_LOG=0 turns them down to warnings only);
"ecstore.lifecycle" (a node listening, stopping, what its store found on disk when it
opened) always logs at INFO; every other logger follows ECSTORE_LOG_LEVEL (default WARNING).

Lines are written in batches (LineWriter): a write per request cost a storage node a
fifth of its small-GET throughput. A WARNING or worse goes out at once, with every line
before it; INFO lines wait at most FLUSH_INTERVAL_S (so a SIGKILL can lose that much).
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from store.transport import request_id

LOG_FORMAT_ENV = "ECSTORE_LOG_FORMAT"
LOG_LEVEL_ENV = "ECSTORE_LOG_LEVEL"
REQUEST_LOG_ENV = "ECSTORE_REQUEST_LOG"
LOG_FORMATS = ("text", "json")
DEFAULT_LOG_LEVEL = "WARNING"
FLUSH_INTERVAL_S = 0.2          # longest an INFO line waits in the buffer
MAX_BUFFERED_BYTES = 64 * 1024  # ... or until this much is waiting
_PLAIN = re.compile(r'[^\s"=\\]+')   # a text value that needs no quotes

request_log = logging.getLogger("ecstore.request")
step_log = logging.getLogger("ecstore.step")
# a node's start, stop and what it found on disk when it opened: shown at INFO whatever
# ECSTORE_LOG_LEVEL says - a restart must leave a trace in the log
lifecycle_log = logging.getLogger("ecstore.lifecycle")


def log_event(logger: logging.Logger, level: int, event: str, fields: Mapping[str, Any]) -> None:
    """One structured line: `event` and its fields (names without spaces, values short).
    In a node process (configure_logging) it is formatted and queued straight to the
    LineWriter: no LogRecord, no caller lookup, no handler chain (it runs per request) -
    unless a logger on its way to the root has a handler of its own that takes this level
    (the gateway's status page keeps the warnings of "ecstore" in node.ui.ErrorLog): that
    one must see the line too, or a 5xx's op and status never reach the page's last errors.
    Lines below such a handler's level (a 2xx's INFO line) still go straight."""
    if not logger.isEnabledFor(level):
        return
    writer = _writer
    if writer is not None and writer.formatter is not None and _only_root_takes(logger, level):
        fmt: Any = writer.formatter
        writer.write(fmt.event_line(time.time(), _LEVEL_NAMES.get(level) or logging.getLevelName(level),
                                    logger.name, event, fields), level)
    else:  # not configured here (a test, a library user): through logging as usual
        logger.handle(logger.makeRecord(logger.name, level, "", 0, event, (), None,
                                        extra={"fields": fields}))


def _only_root_takes(logger: logging.Logger, level: int) -> bool:
    """No handler on `logger` or its ancestors but the root's (where the LineWriter is)
    takes a line of `level`, and nothing stops the line on its way there."""
    node: logging.Logger | None = logger
    while node is not None and node.parent is not None:   # the root has no parent
        if not node.propagate or any(level >= h.level for h in node.handlers):
            return False
        node = node.parent
    return True


def log_step(worker: str, started_monotonic: float, **fields: Any) -> None:
    """The line of one background step of `worker` (e.g. "scrub"), with its duration."""
    ms = round((time.monotonic() - started_monotonic) * 1000, 1)
    log_event(step_log, logging.INFO, "step", {"worker": worker, **fields, "duration_ms": ms})


_LEVEL_NAMES = {logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR"}
_second: list[Any] = [None, ""]   # the last whole second formatted, and its text


def _iso_utc(created: float) -> str:
    whole = int(created)
    if _second[0] != whole:
        _second[:] = [whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))]
    return f"{_second[1]}.{int(created % 1 * 1000):03d}Z"


def _fields(record: logging.LogRecord) -> Mapping[str, Any] | None:
    """The record's fields; for a plain line logged while a request is handled (in its
    task: formatting runs where the line was logged), the request's id."""
    fields: Mapping[str, Any] | None = getattr(record, "fields", None)
    if fields is None:
        rid = request_id.get()
        if rid is not None:
            return {"request_id": rid}
    return fields


def _text_value(v: Any) -> str:
    if v is None:
        return "-"
    s = str(v)
    if type(v) in (int, float) or _PLAIN.fullmatch(s) and s.isprintable():
        return s
    return json.dumps(s)


class TextFormatter(logging.Formatter):
    """`TIME NODE LOGGER LEVEL message key=value ...`, times in UTC."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def event_line(self, created: float, level: str, name: str, msg: str,
                   fields: Mapping[str, Any] | None) -> str:
        line = f"{_iso_utc(created)} {self.node_id} {name} {level} {msg}"
        if fields:
            line += " " + " ".join([f"{k}={_text_value(v)}" for k, v in fields.items()])
        return line

    def format(self, record: logging.LogRecord) -> str:
        line = self.event_line(record.created, record.levelname, record.name,
                               record.getMessage(), _fields(record))
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, node, msg, then the event's fields
    (and "exc", a traceback)."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def event_line(self, created: float, level: str, name: str, msg: str,
                   fields: Mapping[str, Any] | None, exc: str | None = None) -> str:
        out: dict[str, Any] = {"time": _iso_utc(created), "level": level.lower(),
                               "logger": name, "node": self.node_id, "msg": msg}
        if fields:
            out.update(fields)
        if exc:
            out["exc"] = exc
        return json.dumps(out, default=str)

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self.event_line(record.created, record.levelname, record.name,
                               record.getMessage(), _fields(record), exc)


class LineWriter(logging.Handler):
    """Formatted lines to a file descriptor (default stderr's), in batches: written when
    a line is WARNING or worse, when MAX_BUFFERED_BYTES wait, or by a thread every
    FLUSH_INTERVAL_S; and at exit (logging.shutdown flushes every handler)."""

    def __init__(self, fd: int = 2, interval_s: float | None = FLUSH_INTERVAL_S) -> None:
        """interval_s None: every line is written at once, and no thread is started (a
        process that forks, the gateway's supervisor: node.workers)."""
        super().__init__()
        self.fd, self.interval_s = fd, interval_s
        self._lines: list[bytes] = []
        self._size = 0
        if interval_s is not None:
            threading.Thread(target=self._flush_often, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:  # under self.lock (Handler.handle)
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._add(text, record.levelno)

    def write(self, text: str, level: int) -> None:
        """Queue one formatted line (log_event's way in)."""
        with self.lock:  # type: ignore[union-attr]
            self._add(text, level)

    def _add(self, text: str, level: int) -> None:
        line = (text + "\n").encode("utf-8", "backslashreplace")
        self._lines.append(line)
        self._size += len(line)
        if level >= logging.WARNING or self._size >= MAX_BUFFERED_BYTES or self.interval_s is None:
            self._write()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()

    def _write(self) -> None:
        data = b"".join(self._lines)
        self._lines, self._size = [], 0
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # nowhere to log to: dropping the lines is all that is left

    def _flush_often(self) -> None:
        assert self.interval_s is not None
        while True:
            time.sleep(self.interval_s)
            if self._lines:
                self.flush()


_writer: LineWriter | None = None   # this process's, once configure_logging ran


def log_format_from_env() -> str:
    fmt = os.environ.get(LOG_FORMAT_ENV, "").strip().lower() or "text"
    if fmt not in LOG_FORMATS:
        raise SystemExit(f"{LOG_FORMAT_ENV} must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return fmt


def configure_logging(node_id: str, log_format: str, buffered: bool = True) -> None:
    """Send every log line of this process to stderr in `log_format` ("text" or "json"),
    in batches unless not `buffered` (then no thread is started)."""
    assert log_format in LOG_FORMATS, log_format
    global _writer
    sys.stderr.flush()
    handler = _writer = LineWriter(sys.stderr.fileno(), FLUSH_INTERVAL_S if buffered else None)
    handler.setFormatter(JsonFormatter(node_id) if log_format == "json" else TextFormatter(node_id))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(os.environ.get(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL).upper())
    on = os.environ.get(REQUEST_LOG_ENV, "1").strip() != "0"
    for logger in (request_log, step_log):
        logger.setLevel(logging.INFO if on else logging.WARNING)
    lifecycle_log.setLevel(logging.INFO)
    logging.captureWarnings(True)  # Python warnings in the same format (JSON stays JSON)
