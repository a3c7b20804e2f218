"""Storage node: fragment put, get, head, delete, listing and status over HTTP.

Routes (all signed with the cluster secret except /v1/health), see docs/PROTOCOL.md.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from node.fragments import FragmentStore
from node.server import make_base_app, run, secret_from_env
from store.auth import CHECKSUM_HEADER
from store.errors import BadRequest
from store.wire import FRAGMENT_META_HEADER as META_HEADER
from store.wire import pack, pack_header, unpack_header

MAX_FRAGMENT_BYTES = 80 * 1024 * 1024
MAX_LIST_LIMIT = 10_000


@dataclass(frozen=True)
class StorageConfig:
    node_id: str
    data_dir: Path
    secret: str
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True


STORE = web.AppKey("store", FragmentStore)
CONFIG = web.AppKey("config", StorageConfig)


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def put_fragment(request: web.Request) -> web.Response:
    checksum = request.headers.get(CHECKSUM_HEADER, "")
    meta = unpack_header(request.headers.get(META_HEADER))
    body = await request.read()
    replaced = await _in_thread(request.app[STORE].put, request.match_info["fid"],
                                body, checksum, meta)
    return web.Response(status=200 if replaced else 201)


async def get_fragment(request: web.Request) -> web.Response:
    frag = await _in_thread(request.app[STORE].read, request.match_info["fid"])
    return web.Response(body=frag.body, headers={
        CHECKSUM_HEADER: frag.checksum, META_HEADER: pack_header(frag.meta)})


async def head_fragment(request: web.Request) -> web.Response:
    frag = await _in_thread(request.app[STORE].read, request.match_info["fid"])
    return web.Response(headers={CHECKSUM_HEADER: frag.checksum,
                                 META_HEADER: pack_header(frag.meta),
                                 "x-ecstore-size": str(len(frag.body))})


async def delete_fragment(request: web.Request) -> web.Response:
    await _in_thread(request.app[STORE].delete, request.match_info["fid"])
    return web.Response(status=204)


def _int_param(request: web.Request, name: str, default: int, maximum: int) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None
    if not 1 <= value <= maximum:
        raise BadRequest(f"{name} must be between 1 and {maximum}")
    return value


async def list_fragments(request: web.Request) -> web.Response:
    after = request.query.get("after", "")
    limit = _int_param(request, "limit", 1000, MAX_LIST_LIMIT)
    names = await _in_thread(request.app[STORE].list, after, limit + 1)
    return web.Response(body=pack({"fragments": names[:limit],
                                   "truncated": len(names) > limit}),
                        content_type="application/msgpack")


async def status(request: web.Request) -> web.Response:
    store, cfg = request.app[STORE], request.app[CONFIG]
    disk = await _in_thread(store.disk)
    return web.json_response({"node_id": cfg.node_id, "role": "storage",
                              "fragments": store.count, "bytes": store.bytes, **disk})


async def health(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    return web.json_response({"node_id": cfg.node_id, "role": "storage", "ok": True,
                              "time": time.time()})


def make_app(config: StorageConfig) -> web.Application:
    app = make_base_app(config.secret, MAX_FRAGMENT_BYTES)
    app[CONFIG] = config

    async def open_store(app: web.Application) -> AsyncIterator[None]:
        app[STORE] = await _in_thread(FragmentStore, config.data_dir, config.fsync)
        yield

    app.cleanup_ctx.append(open_store)
    fid = "/v1/fragments/{fid}"
    app.add_routes([
        web.get("/v1/health", health),
        web.get("/v1/status", status),
        web.get("/v1/fragments", list_fragments),
        web.put(fid, put_fragment),
        web.get(fid, get_fragment, allow_head=False),
        web.head(fid, head_fragment),
        web.delete(fid, delete_fragment),
    ])
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m node.storage")
    p.add_argument("--id", required=True)
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--no-fsync", action="store_true")
    a = p.parse_args(argv)
    cfg = StorageConfig(a.id, a.data, secret_from_env(), a.host, a.port, not a.no_fsync)
    run(make_app(cfg), cfg.host, cfg.port)


if __name__ == "__main__":
    main()
