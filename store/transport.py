"""Signed HTTP requests to storage and control nodes."""
from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

from store.auth import EMPTY_SHA256, sign_headers
from store.errors import EcstoreError, Unavailable, error_from_response

MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_NODE = 32
CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class Transport:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS,
                                               limit_per_host=MAX_CONNECTIONS_PER_NODE),
                auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, base_url: str, path: str, *,
                      body: bytes = b"", checksum: str | None = None,
                      query: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0, ok_404: bool = False) -> Reply:
        """Send one signed request; raise the server's error, or Unavailable if unreachable.

        `path` must already be quoted. With ok_404, a 404 is returned, not raised.
        """
        path_qs = path + ("?" + urlencode(query) if query else "")
        if checksum is None:
            checksum = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        hdrs = sign_headers(self.secret, method, path_qs, checksum)
        if headers:
            hdrs.update(headers)
        # sock_connect, not connect: a wait for a pooled connection is the client's own
        # queue, not a sign of a dead node (it counts against `total` only)
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self.session.request(method, URL(base_url + path_qs, encoded=True), data=body or None,
                                            headers=hdrs, timeout=timeout) as resp:
                data = await resp.read()
                reply = Reply(resp.status, dict(resp.headers), data)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise Unavailable(f"{base_url} unreachable: {type(exc).__name__} {exc}") from None
        if reply.status >= 400 and not (ok_404 and reply.status == 404):
            raise error_from_response(reply.status, _json(reply.body))
        return reply


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def quote_key(key: str) -> str:
    return quote(key, safe="")


__all__ = ["Transport", "Reply", "quote_key", "EcstoreError"]
