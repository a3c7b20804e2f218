"""Plumbing shared by every server role: errors to statuses, authentication, running."""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from store.auth import CHECKSUM_HEADER, verify
from store.errors import BadRequest, EcstoreError, Unauthorized

log = logging.getLogger("ecstore.node")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SECRET_KEY = web.AppKey("secret", str)
UNAUTHENTICATED_PATHS = frozenset({"/v1/health"})


def json_error(exc: EcstoreError) -> web.Response:
    return web.Response(status=exc.status, text=json.dumps(exc.to_body()),
                        content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place that turns errors into responses."""
    try:
        return await handler(request)
    except EcstoreError as exc:
        return json_error(exc)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return json_error(_http_to_error(exc))
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:  # a bug: log it whole, answer 500 without internals
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(EcstoreError("internal error"))


def _http_to_error(exc: web.HTTPException) -> EcstoreError:
    err = EcstoreError(exc.reason or "error")
    err.status = exc.status
    err.code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
        exc.status, "bad_request")
    return err


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse any request not signed with the cluster secret."""
    if request.path not in UNAUTHENTICATED_PATHS:
        reason = verify(request.app[SECRET_KEY], request.method, request.raw_path,
                        request.headers, time.time())
        if reason is not None:
            raise Unauthorized(reason)
    return await handler(request)


def make_base_app(secret: str, max_body_bytes: int) -> web.Application:
    app = web.Application(middlewares=[error_middleware, auth_middleware],
                          client_max_size=max_body_bytes)
    app[SECRET_KEY] = secret
    return app


def secret_from_env() -> str:
    secret = os.environ.get("ECSTORE_SECRET", "")
    if len(secret) < 16:
        raise SystemExit("ECSTORE_SECRET must be set to the cluster secret (16+ chars)")
    return secret


def run(app: web.Application, host: str, port: int, reuse_port: bool = False) -> None:
    """Serve on uvloop until SIGTERM or SIGINT (reuse_port: several processes share it).
    (uvloop cannot sendfile; asyncio's loop can, but serves small requests slower: measured,
    uvloop plus one unverified read per fragment GET was the better trade.)"""
    import uvloop

    logging.basicConfig(level=os.environ.get("ECSTORE_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    uvloop.install()
    web.run_app(app, host=host, port=port, print=None, access_log=None,
                handle_signals=True, reuse_port=reuse_port or None)


async def verified_body(request: web.Request) -> bytes:
    """The request body, checked against the signed checksum header."""
    body = await request.read()
    if hashlib.sha256(body).hexdigest() != request.headers.get(CHECKSUM_HEADER):
        raise BadRequest("body does not match its signed checksum")
    return body


def query_int(request: web.Request, name: str, default: int, maximum: int) -> int:
    """An integer query parameter in 1..maximum; BadRequest otherwise."""
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None
    if not 1 <= value <= maximum:
        raise BadRequest(f"{name} must be between 1 and {maximum}")
    return value


def node_arg_parser(role: str) -> argparse.ArgumentParser:
    """The flags every node role takes: --id, --data, --host, --port, --no-fsync."""
    p = argparse.ArgumentParser(prog=f"python -m node.{role}")
    p.add_argument("--id", required=True)
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-fsync", action="store_true")
    return p
