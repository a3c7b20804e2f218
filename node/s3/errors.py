"""S3 errors: a code, an HTTP status and a message, rendered as S3's XML error body."""
from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import escape

from store.errors import (
    BadRequest,
    Conflict,
    EcstoreError,
    Forbidden,
    NotFound,
    RangeNotSatisfiable,
    TooLarge,
    Unauthorized,
    Unavailable,
)


class S3Error(Exception):
    """One S3 error answer (`code` as AWS spells it, e.g. NoSuchKey). `header` names the
    request header that caused it, where S3 names one (<Header> of a NotImplemented)."""

    def __init__(self, code: str, message: str, status: int = 400,
                 headers: dict[str, str] | None = None, *, header: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status
        self.headers = dict(headers or {})
        self.header = header

    def to_xml(self, resource: str = "", request_id: str = "") -> bytes:
        header = "" if self.header is None else f"<Header>{escape(self.header)}</Header>"
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                f"<Code>{escape(self.code)}</Code><Message>{escape(self.message)}</Message>"
                f"{header}<Resource>{escape(resource)}</Resource><RequestId>{escape(request_id)}"
                "</RequestId></Error>").encode()


def not_implemented(message: str, header: str | None = None) -> S3Error:
    """501 NotImplemented; `header`: the request header asking for what we lack."""
    return S3Error("NotImplemented", message, 501, header=header)


def access_denied(message: str = "Access Denied") -> S3Error:
    return S3Error("AccessDenied", message, 403)


def require_length(headers: Mapping[str, str]) -> None:
    """An object or part upload without Content-Length (and not chunked): S3's 411. It
    was read as an empty body - a client that meant to send bytes got 200 and an empty
    object."""
    if "Content-Length" in headers or "chunked" in headers.get("Transfer-Encoding", "").lower():
        return
    raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.",
                  411)


def bad_digest(message: str) -> S3Error:
    return S3Error("BadDigest", message, 400)


def to_s3_error(exc: EcstoreError, key: str) -> S3Error:
    """The S3 error answering one of ours (the one table; DeleteObjects uses it per key)."""
    if isinstance(exc, NotFound):
        return (S3Error("NoSuchKey", "The specified key does not exist.", 404) if key
                else S3Error("NoSuchBucket", "The specified bucket does not exist", 404))
    if isinstance(exc, RangeNotSatisfiable):
        return S3Error("InvalidRange", "The requested range is not satisfiable", 416)
    if isinstance(exc, TooLarge):
        return S3Error("EntityTooLarge", exc.message)
    if isinstance(exc, BadRequest):
        return S3Error("InvalidArgument", exc.message)
    if isinstance(exc, Conflict):
        return S3Error("OperationAborted", exc.message, 409)
    if isinstance(exc, Unavailable):
        return S3Error("ServiceUnavailable", f"too few nodes answered: {exc.message}", 503)
    if isinstance(exc, (Unauthorized, Forbidden)):
        # the cluster's nodes refused the gateway's own signed requests (a secret or clock
        # the gateway does not share with them): the service's fault, not the client's -
        # it was a 500 InternalError, and under 500 the gateway did not log it
        return S3Error("ServiceUnavailable", f"the cluster refused the gateway: {exc.message}",
                       503)
    return S3Error("InternalError", "We encountered an internal error. Please try again.", 500)
