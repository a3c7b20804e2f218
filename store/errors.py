"""One error hierarchy for the whole system, and its mapping to HTTP statuses.

Servers raise these; a middleware turns them into a JSON error body and status.
The client turns a status and error code back into the same class.
"""
from __future__ import annotations

import json


class EcstoreError(Exception):
    """Base of every error ecstore raises on purpose."""

    status = 500
    code = "internal"

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details = details

    def to_body(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message, **self.details}


class BadRequest(EcstoreError):
    status, code = 400, "bad_request"


class Unauthorized(EcstoreError):
    status, code = 401, "unauthorized"


class Forbidden(EcstoreError):
    status, code = 403, "forbidden"


class NotFound(EcstoreError):
    status, code = 404, "not_found"


class Conflict(EcstoreError):
    status, code = 409, "conflict"


class TooLarge(EcstoreError):
    status, code = 413, "too_large"


class RangeNotSatisfiable(EcstoreError):
    status, code = 416, "range_not_satisfiable"


class Corrupt(EcstoreError):
    """Stored bytes failed their checksum: never served as good."""

    status, code = 500, "corrupt"


class InsufficientStorage(EcstoreError):
    status, code = 507, "insufficient_storage"


class Unavailable(EcstoreError):
    """Not enough peers answered; details say how many were tried and failed."""

    status, code = 503, "unavailable"


class Unreachable(Unavailable):
    """A node refused or dropped the connection, or sent no reply in time (client side
    only: never sent by a server, so not in ERRORS_BY_CODE; a server reports it as
    `unavailable`)."""


class WrongEventLoop(EcstoreError, RuntimeError):
    """An async client used from an event loop while another loop, still running, holds
    its connections (client side only: a mistake in the caller's code)."""


class ClientClosed(EcstoreError, RuntimeError):
    """A SyncClient used after close() (client side only: a mistake in the caller's
    code; its loop thread is gone, so the call could never finish)."""


ERRORS_BY_CODE: dict[str, type[EcstoreError]] = {
    cls.code: cls
    for cls in (BadRequest, Unauthorized, Forbidden, NotFound, Conflict, TooLarge,
                RangeNotSatisfiable, Corrupt, InsufficientStorage, Unavailable, EcstoreError)
}


def error_from_body(status: int, body: bytes | bytearray) -> EcstoreError:
    """The error a server raised, from its status and raw (JSON, or anything) body."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    return error_from_response(status, value if isinstance(value, dict) else None)


def error_from_response(status: int, body: dict[str, object] | None) -> EcstoreError:
    """Rebuild the error a server raised from its status and JSON body."""
    code = str((body or {}).get("error", ""))
    message = str((body or {}).get("message", f"HTTP {status}"))
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        cls = next((c for c in ERRORS_BY_CODE.values() if c.status == status), EcstoreError)
    details = {k: v for k, v in (body or {}).items()
               if isinstance(k, str) and k not in ("error", "message")}
    return cls(message, **details)
