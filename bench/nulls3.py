"""A null S3 endpoint, for bench/bound.py: the least a Python S3 server does for an object.

    python -m bench.nulls3 --port PORT [--host 127.0.0.1]

It answers boto3's CreateBucket, PutObject and GetObject on aiohttp and uvloop (what the
ecstore gateway is built on), and does for every byte what any S3 server must: the MD5
of the ETag, the SHA-256 that SigV4 signs over plain HTTP (checked against the
x-amz-content-sha256 header), and the CRC32 boto3 sends (x-amz-checksum-crc32, checked).
It keeps objects in memory, one process, no copies made durable, no erasure coding, no
metadata service: a floor for "one Python HTTP hop", not a store. The SigV4 signature
itself is not checked (per request, not per byte). Anything else (a streamed aws-chunked
body, another checksum, another operation) gets a 501, so a measure cannot pass by
skipping work. Bounded: at most MAX_OBJECTS objects of at most MAX_OBJECT_BYTES.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import zlib

from aiohttp import web
from multidict import CIMultiDictProxy

MAX_OBJECT_BYTES = 64 * 1024 * 1024
MAX_OBJECTS = 256
UNSIGNED = {"UNSIGNED-PAYLOAD"}
OBJECTS: web.AppKey[dict[tuple[str, str], tuple[bytes, str]]] = web.AppKey("objects", dict)
BUCKETS: web.AppKey[set[str]] = web.AppKey("buckets", set)


def error(status: int, code: str, message: str) -> web.Response:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>")
    return web.Response(status=status, text=body, content_type="application/xml")


def body_checks(headers: CIMultiDictProxy[str], data: bytes) -> web.Response | None:
    """The per-byte checks an S3 server owes a put: None when the body passes."""
    if "aws-chunked" in headers.get("Content-Encoding", "") or \
            headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
        return error(501, "NotImplemented", "streamed (aws-chunked) bodies are not handled here")
    sha = headers.get("x-amz-content-sha256", "")
    if sha not in UNSIGNED and hashlib.sha256(data).hexdigest() != sha:
        return error(400, "XAmzContentSHA256Mismatch", "body does not match its SHA-256")
    algo = headers.get("x-amz-sdk-checksum-algorithm", "").upper()
    sums = [h for h in headers if h.lower().startswith("x-amz-checksum-")]
    if algo not in ("", "CRC32") or any(h.lower() != "x-amz-checksum-crc32" for h in sums):
        return error(501, "NotImplemented", "only CRC32 checksums are handled here")
    crc = headers.get("x-amz-checksum-crc32")
    if crc is not None and base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode() != crc:
        return error(400, "BadDigest", "body does not match its CRC32")
    return None


async def put_bucket(request: web.Request) -> web.Response:
    request.app[BUCKETS].add(request.match_info["bucket"])
    return web.Response()


async def put_object(request: web.Request) -> web.Response:
    bucket, key = request.match_info["bucket"], request.match_info["key"]
    if bucket not in request.app[BUCKETS]:
        return error(404, "NoSuchBucket", "no such bucket")
    if request.query:
        return error(501, "NotImplemented", "only plain PutObject is handled here")
    if request.content_length is None or request.content_length > MAX_OBJECT_BYTES:
        return error(400, "InvalidRequest", f"a Content-Length up to {MAX_OBJECT_BYTES} is needed")
    objects = request.app[OBJECTS]
    if (bucket, key) not in objects and len(objects) >= MAX_OBJECTS:
        return error(507, "InsufficientStorage", f"this endpoint keeps {MAX_OBJECTS} objects")
    data = await request.read()
    refused = body_checks(request.headers, data)
    if refused is not None:
        return refused
    etag = f'"{hashlib.md5(data).hexdigest()}"'
    objects[(bucket, key)] = (data, etag)
    return web.Response(headers={"ETag": etag})


async def get_object(request: web.Request) -> web.Response:
    if request.query or "Range" in request.headers:
        return error(501, "NotImplemented", "only plain GetObject is handled here")
    found = request.app[OBJECTS].get((request.match_info["bucket"], request.match_info["key"]))
    if found is None:
        return error(404, "NoSuchKey", "no such key")
    data, etag = found
    return web.Response(body=data, headers={"ETag": etag, "Content-Type": "binary/octet-stream"})


def make_app() -> web.Application:
    app = web.Application(client_max_size=MAX_OBJECT_BYTES)
    app[OBJECTS] = {}
    app[BUCKETS] = set()
    app.router.add_put("/{bucket}", put_bucket)
    app.router.add_put("/{bucket}/{key:.+}", put_object)
    app.router.add_get("/{bucket}/{key:.+}", get_object)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.nulls3", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args(argv)
    import uvloop
    uvloop.install()
    web.run_app(make_app(), host=a.host, port=a.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
