"""ecstore:// for fsspec: pandas, pyarrow, Hugging Face datasets and webdataset with no glue.

    fs = fsspec.filesystem("ecstore", cluster=".ecstore/cluster.json")
    pandas.read_parquet("ecstore://datasets/table.parquet", storage_options={"cluster": ...})

A path is `bucket/key`; "directories" are key prefixes up to a "/" (listed with the "/"
delimiter), buckets are the directories of the root. The filesystem is an fsspec
AsyncFileSystem with one async Client on fsspec's I/O loop thread, so bulk calls
(cat of many paths, rm -r, put/get of trees) run concurrently and the sync methods are
fsspec's wrappers. Listings are never cached: every ls/info/find asks the cluster, so a
write or delete by anyone (this fs, the client library, S3) is seen at once.

Reads pin the version an open file saw first and fetch whole segments (the unit the
cluster stores), keeping a few decoded and reading ahead when the reads are sequential.
Writes stream: the put runs on the loop, fed block by block through a bounded queue, and
commits on close; an exception (in the `with` body, in the put, or propagating while the
file is closed) discards it, and nothing becomes visible.

The pure parts (paths, byte ranges, segment bounds, error mapping) are plain functions.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import hashlib
import io
import mimetypes
import os
import sys
import warnings
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from fsspec.asyn import AsyncFileSystem, _run_coros_in_chunks, get_loop, sync
from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractBufferedFile

from store.client import Client, ObjectInfo
from store.cluster import ClusterInfo
from store.errors import (
    BadRequest,
    Conflict,
    EcstoreError,
    Forbidden,
    InsufficientStorage,
    NotFound,
    RangeNotSatisfiable,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from store.listing import ListEntry
from store.striping import record_extents
from store.transport import retrieved

MiB = 1 << 20
WRITE_BLOCK_BYTES = 4 * MiB     # a writer hands the put one block this size at a time
WRITE_QUEUE_BLOCKS = 2          # blocks waiting for the put: a writer blocks beyond this
READ_KEEP_SEGMENTS = 2          # decoded segments an open file keeps for small reads
READ_AHEAD_SEGMENTS = 2         # ... and fetches ahead of a sequential reader
DIRECT_READ_SEGMENTS = 3        # a read spanning more streams through the client, uncached
RM_CONCURRENCY = 32             # deletes in flight for rm of many paths
ABORT_WAIT_S = 10.0             # how long a discarded write waits for its put to unwind
CLOSE_WAIT_S = 2.0              # closing the client at exit
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# Storage options fsspec itself understands; anything else is refused, so that a misspelt
# `cluster` cannot silently send data to the cluster of $ECSTORE_CLUSTER instead.
FSSPEC_OPTIONS = frozenset({"asynchronous", "loop", "batch_size", "skip_instance_cache",
                            "use_listings_cache", "listings_expiry_time", "max_paths"})
_ORPHANS: list[Client] = []     # clients inherited over a fork: never closed nor collected


# ---- pure helpers ----------------------------------------------------------------------------
def split_path(path: str) -> tuple[str, str]:
    """("bucket", "key/in/bucket") of a stripped path; either may be empty."""
    bucket, _, key = path.partition("/")
    return bucket, key


def slice_range(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """[lo, hi) of a Python slice start:end (negatives count from the end) of `size` bytes;
    lo >= hi means no bytes."""
    lo, hi, _ = slice(start, end).indices(size)
    return lo, max(lo, hi)


def segment_bounds(record: Mapping[str, Any]) -> list[int]:
    """Where each stored segment of an object starts, then its size: segment i holds bytes
    [b[i], b[i+1]). A multipart object's segments restart at each part."""
    size = int(record["size"])
    extents = record_extents(record)
    if not extents:  # inline: one piece, in the record itself
        return [0, size] if size else [0]
    seg = int(record["segment_size"])
    out: list[int] = []
    for ext in extents:
        out.extend(range(ext.offset, ext.offset + ext.size, seg))
    out.append(size)
    return out


def segments_for(bounds: list[int], lo: int, hi: int) -> range:
    """Indices of the segments that bytes [lo, hi) (hi > lo) touch."""
    return range(bisect.bisect_right(bounds, lo) - 1, bisect.bisect_left(bounds, hi))


def parent_dirs(root: str, name: str) -> list[str]:
    """The directories strictly between `root` and the path `name` below it."""
    rel = name[len(root) + 1:] if root else name
    parts = rel.split("/")[:-1]
    base = f"{root}/" if root else ""
    return [base + "/".join(parts[:i + 1]) for i in range(len(parts))]


def os_error(exc: EcstoreError, path: str, reading: bool = False) -> Exception:
    """The builtin exception fsspec's users expect for an ecstore error on `path`.

    When `reading`, a name the cluster refuses (BadRequest) cannot exist: FileNotFoundError.
    """
    msg = exc.message
    if isinstance(exc, NotFound) or (reading and isinstance(exc, BadRequest)):
        return FileNotFoundError(errno.ENOENT, msg, path)
    if isinstance(exc, (Forbidden, Unauthorized)):
        return PermissionError(errno.EACCES, msg, path)
    if isinstance(exc, Conflict):
        return FileExistsError(errno.EEXIST, msg, path)
    if isinstance(exc, (BadRequest, RangeNotSatisfiable)):
        return ValueError(f"{path}: {msg}")
    if isinstance(exc, TooLarge):
        return OSError(errno.EFBIG, msg, path)
    if isinstance(exc, InsufficientStorage):
        return OSError(errno.ENOSPC, msg, path)
    if isinstance(exc, Unavailable):
        return ConnectionError(errno.EAGAIN, msg, path)
    return OSError(errno.EIO, msg, path)   # Corrupt and the rest


@contextlib.contextmanager
def _mapped(path: str, reading: bool = False) -> Iterator[None]:
    """Raise ecstore errors as builtin ones (the original is the __cause__)."""
    try:
        yield
    except EcstoreError as exc:
        raise os_error(exc, path, reading) from exc


def dir_info(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "size": 0, "type": "directory", **extra}


def record_info(name: str, rec: Mapping[str, Any]) -> dict[str, Any]:
    """fsspec info of an object from its metadata record."""
    return {"name": name, "size": rec["size"], "type": "file", "mtime": rec["ts"] / 1e9,
            "etag": rec.get("etag") or rec["version_id"], "version_id": rec["version_id"],
            "content_type": rec.get("content_type") or DEFAULT_CONTENT_TYPE,
            "meta": dict(rec.get("meta") or {})}


def entry_info(bucket: str, e: ListEntry) -> dict[str, Any]:
    """fsspec info of an object from a listing entry."""
    return {"name": f"{bucket}/{e.key}", "size": e.size, "type": "file", "mtime": e.ts / 1e9,
            "etag": e.etag or e.version_id, "version_id": e.version_id}


def content_type_of(key: str) -> str:
    return mimetypes.guess_type(key)[0] or DEFAULT_CONTENT_TYPE


def exception_since(before: BaseException | None) -> bool:
    """Whether an exception other than `before` is being raised or handled right now: a
    file closed while one propagates (pandas, pyarrow and fsspec.open's context managers
    close in `finally` / `__exit__` without passing it on) must not commit."""
    current = sys.exc_info()[1]
    return current is not None and current is not before


class UnclosedTextDiscarded(io.TextIOWrapper):
    """A text writer whose garbage collection, unclosed, throws the write away (the binary
    writer's own rule: ECStoreWriteFile.__del__) instead of closing - committing - it."""

    def __del__(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.flush()        # what was written goes to the binary writer, uncommitted
        with contextlib.suppress(Exception):
            self.detach()       # which, dropped, discards with its ResourceWarning


# ---- the filesystem --------------------------------------------------------------------------
class ECStoreFileSystem(AsyncFileSystem):  # type: ignore[misc]
    """fsspec filesystem for ecstore://bucket/key.

    Storage options: `cluster` (a cluster.json path; default: the client library's lookup,
    $ECSTORE_CLUSTER, ./.ecstore/cluster.json, $ECSTORE_CONTROL+$ECSTORE_SECRET),
    `cache_dir` and `cache_max_bytes` (the client's local segment cache), `block_size`
    (bytes per write block, default 4 MiB), and fsspec's own (asynchronous, loop, ...).
    Errors are builtin: FileNotFoundError, FileExistsError, PermissionError, ValueError
    (a bad name or range), ConnectionError (too few nodes), OSError; the ecstore error is
    the __cause__.
    """

    protocol = "ecstore"
    root_marker = ""
    _pid: int

    def __init__(self, cluster: str | os.PathLike[str] | None = None, cache_dir: str | None = None,
                 cache_max_bytes: int | None = None, block_size: int | None = None,
                 **kwargs: Any) -> None:
        unknown = set(kwargs) - FSSPEC_OPTIONS
        if unknown:
            raise TypeError(f"unknown ecstore storage options {sorted(unknown)}: known are cluster, "
                            f"cache_dir, cache_max_bytes, block_size, {', '.join(sorted(FSSPEC_OPTIONS))}")
        super().__init__(**kwargs)
        try:
            self.cluster_info = ClusterInfo.load(cluster)
        except BadRequest as exc:
            raise ValueError(exc.message) from exc
        self.cache_options: dict[str, Any] = {"cache_dir": cache_dir, "cache_max_bytes": cache_max_bytes}
        self.write_block_bytes = block_size or WRITE_BLOCK_BYTES
        self._client_obj: Client | None = None
        self._puts: set[asyncio.Future[ObjectInfo]] = set()  # streaming writes in progress

    # -- the client and its loop --
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """fsspec's I/O loop. In a forked child (a DataLoader worker) the parent's loop
        thread does not exist: start over on the child's loop with a new client."""
        if self._pid != os.getpid():
            if self._client_obj is not None:
                _ORPHANS.append(self._client_obj)  # its session belongs to the parent's loop
            self._client_obj = None
            self._pid = os.getpid()
            if not self.asynchronous:
                self._loop = get_loop()
        return self._loop  # type: ignore[no-any-return]

    async def _client(self) -> Client:
        if self._client_obj is None:
            c = Client.connect(self.cluster_info, **self.cache_options)
            self._client_obj = c
            weakref.finalize(self, _close_client, os.getpid(), asyncio.get_running_loop(), c)
        return self._client_obj

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """"ecstore://bucket/key/", "/bucket/key" -> "bucket/key"."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return super()._strip_protocol(path).lstrip("/")

    def _run(self, coro: Any) -> Any:
        return sync(self.loop, lambda: coro)

    # -- stat and list --
    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        if not bucket:
            return dir_info("")
        c = await self._client()
        with _mapped(path, reading=True):
            if not key:
                rec = await c.bucket_record(bucket)
                return dir_info(bucket, created=rec.get("created"))
            try:
                return record_info(path, await c.live_record(bucket, key))
            except NotFound:
                pass
            page = await c.list(bucket, prefix=key + "/", max_keys=1)
            if page.objects or page.common_prefixes:
                return dir_info(path)
            raise NotFound(f"no such object or directory: {path}")

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        try:
            await self._info(path)
            return True
        except FileNotFoundError:
            return False

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        c = await self._client()
        out: list[dict[str, Any]] = []
        with _mapped(path, reading=True):
            if not bucket:
                out = [dir_info(r["name"], created=r.get("created"))
                       for r in await c.list_bucket_records()]
            else:
                prefix = key + "/" if key else ""
                async for page in c.list_all(bucket, prefix, "/"):
                    out += [dir_info(f"{bucket}/{p[:-1]}") for p in page.common_prefixes]
                    # a key equal to the prefix is a directory marker ("dir/"), not a child
                    out += [entry_info(bucket, e) for e in page.objects if e.key != prefix]
        if not out and key:  # a file lists as itself; an empty "directory" does not exist
            info = await self._info(path)
            out = [info] if info["type"] == "file" else []
        out.sort(key=lambda i: i["name"])
        return out if detail else [i["name"] for i in out]

    async def _find(self, path: str, maxdepth: int | None = None, withdirs: bool = False,
                    **kwargs: Any) -> Any:
        """Every object below `path` from one flat listing (no walk), unless maxdepth."""
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        detail = kwargs.pop("detail", False)
        if maxdepth is not None or not bucket:
            return await super()._find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail,
                                       **kwargs)
        c = await self._client()
        prefix = key + "/" if key else ""
        out: dict[str, dict[str, Any]] = {}
        try:
            with _mapped(path, reading=True):
                async for page in c.list_all(bucket, prefix):
                    for e in page.objects:
                        name = f"{bucket}/{e.key}"
                        if withdirs:
                            out.update({d: dir_info(d) for d in parent_dirs(path, name) if d not in out})
                        if not e.key.endswith("/"):  # "dir/" markers are directories only
                            out[name] = entry_info(bucket, e)
        except FileNotFoundError:
            return {} if detail else []
        if withdirs and (out or not key):
            out[path] = dir_info(path)
        if not out and key:
            with contextlib.suppress(FileNotFoundError):
                info = await self._info(path)
                if info["type"] == "file":
                    out[path] = info
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def modified(self, path: str) -> datetime:
        """When the object's current version was written (UTC)."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, "directories have no time", path)
        return datetime.fromtimestamp(info["mtime"], timezone.utc)

    # -- read --
    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None,
                        **kwargs: Any) -> bytes:
        """Bytes [start, end) (Python slice rules); only the segments they touch are read."""
        path = self._strip_protocol(path)
        rec = await self._record(path)
        lo, hi = slice_range(rec["size"], start, end)
        return await self._read_range(path, rec, lo, hi)

    async def _record(self, path: str) -> dict[str, Any]:
        bucket, key = split_path(path)
        if not key:
            # a path with no key ("ecstore://data.csv": the bucket left out): say so, and
            # say there is no such bucket when there is none (it said "a bucket is a
            # directory" of a bucket that did not exist)
            if not await self._exists(bucket):
                raise FileNotFoundError(errno.ENOENT, "no such bucket (a path is "
                                        "BUCKET/KEY: is the bucket left out?)", path)
            raise IsADirectoryError(errno.EISDIR, "a bucket is a directory (a path is "
                                    "BUCKET/KEY)", path)
        c = await self._client()
        with _mapped(path, reading=True):
            try:
                return await c.live_record(bucket, key)
            except NotFound:
                if (await self._info(path))["type"] == "directory":
                    raise IsADirectoryError(errno.EISDIR, "a directory", path) from None
                raise

    async def _read_range(self, path: str, rec: dict[str, Any], lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the version `rec` (whatever has been written since)."""
        if hi <= lo:
            return b""
        bucket, key = split_path(path)
        c = await self._client()
        with _mapped(path, reading=True):
            try:
                return b"".join([bytes(p) async for p in c.get_stream(bucket, key, lo, hi - 1,
                                                                      record=rec)])
            except Unavailable as exc:
                gone = await self._gone(c, bucket, key, rec, exc)
                if gone is exc:
                    raise
                raise gone from exc

    @staticmethod
    async def _gone(c: Client, bucket: str, key: str, rec: dict[str, Any],
                    exc: Unavailable) -> EcstoreError:
        """What a read of an open file's version that failed raises: NotFound when every
        node said its fragments are not there and the version is no longer the object's
        (overwritten or deleted, then collected by `ecstore gc`) - it will never read
        again, and as Unavailable (ConnectionError EAGAIN) a data loader retried it for
        ever; else the Unavailable (nodes down: worth a retry)."""
        listed = exc.details.get("errors")
        errors = [str(e) for e in listed] if isinstance(listed, list) else []
        if not errors or not all(e.endswith(": not_found") for e in errors):
            return exc
        try:
            live = await c.read_record(bucket, key)
        except EcstoreError:
            return exc
        if live is not None and not live["deleted"] and live["version_id"] == rec["version_id"]:
            return exc      # still the object: lost fragments, repair's work - not "gone"
        return NotFound(f"the version of {bucket}/{key} this file was opened on "
                        f"({rec['version_id']}) was {'deleted' if live is None or live['deleted'] else 'replaced'} "
                        "and its data collected (ecstore gc): open the file again")

    async def _get_file(self, rpath: str, lpath: str, callback: Any = DEFAULT_CALLBACK,
                        **kwargs: Any) -> None:
        rpath = self._strip_protocol(rpath)
        try:
            rec = await self._record(rpath)
        except IsADirectoryError:
            os.makedirs(lpath, exist_ok=True)
            return
        bucket, key = split_path(rpath)
        c = await self._client()
        callback.set_size(rec["size"])
        try:
            with open(lpath, "wb") as f, _mapped(rpath, reading=True):
                async for part in c.get_stream(bucket, key, record=rec):
                    await asyncio.to_thread(f.write, part)
                    callback.relative_update(len(part))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(lpath)  # no half file left behind
            raise

    # -- write --
    async def _put_object(self, path: str, source: Any, md5: Any, **kwargs: Any) -> ObjectInfo:
        """Put `source` (bytes or an async iterator) at path; the record's ETag is `md5`'s
        digest, taken once every byte is read (S3 readers see an MD5 ETag, as for their own)."""
        bucket, key = split_path(path)
        if not key:
            raise IsADirectoryError(errno.EISDIR, "cannot write a bucket (a path is "
                                    "BUCKET/KEY: is the bucket left out?)", path)
        c = await self._client()
        with _mapped(path):
            return await c.put(bucket, key, source, content_type=kwargs.get("content_type")
                               or content_type_of(key), meta=kwargs.get("meta"),
                               extra=lambda: {"etag": md5.hexdigest()})

    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        _check_overwrite(mode)
        await self._put_object(self._strip_protocol(path), value, hashlib.md5(value), **kwargs)

    async def _put_file(self, lpath: str, rpath: str, mode: str = "overwrite",
                        callback: Any = DEFAULT_CALLBACK, **kwargs: Any) -> None:
        _check_overwrite(mode)
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            await self._makedirs(rpath, exist_ok=True)
            return
        md5 = hashlib.md5()
        callback.set_size(os.path.getsize(lpath))

        async def chunks() -> AsyncIterator[bytes]:
            with open(lpath, "rb") as f:
                while chunk := await asyncio.to_thread(_read_hashed, f, self.write_block_bytes, md5):
                    callback.relative_update(len(chunk))
                    yield chunk
        await self._put_object(rpath, chunks(), md5, **kwargs)

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy through this process, a segment at a time (bounded memory). A directory
        (what a recursive cp or mv lists beside the files) has nothing to copy: directories
        are the keys' prefixes, so the files copied under path2 make it."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            rec = await self._record(path1)
        except IsADirectoryError:
            return
        bucket, key = split_path(path1)
        c = await self._client()
        md5 = hashlib.md5()

        async def chunks() -> AsyncIterator[bytes]:
            with _mapped(path1, reading=True):
                async for part in c.get_stream(bucket, key, record=rec):
                    md5.update(part)
                    yield bytes(part)
        await self._put_object(path2, chunks(), md5, content_type=rec.get("content_type"),
                               meta=rec.get("meta"))

    def open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        """fsspec's open; a text-mode writer is an UnclosedTextDiscarded: dropped unclosed
        (an exception left the writing function), it discards as a binary writer does -
        io.TextIOWrapper's own finalizer closed it, and the partial object was committed."""
        if "b" in mode or "r" in mode or args:
            return super().open(path, mode, *args, **kwargs)
        text = {k: kwargs.pop(k) for k in ("encoding", "errors", "newline") if k in kwargs}
        binary = super().open(path, mode.replace("t", "") + "b", **kwargs)
        return UnclosedTextDiscarded(binary, **text)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None,
              autocommit: bool = True, cache_options: dict[str, Any] | None = None,
              **kwargs: Any) -> AbstractBufferedFile:
        path = self._strip_protocol(path)
        if mode == "rb":
            rec = self._run(self._record(path))
            return ECStoreReadFile(self, path, rec, block_size, cache_options=cache_options, **kwargs)
        if mode != "wb":
            raise NotImplementedError(f"mode {mode!r}: objects are written whole (\"wb\") and "
                                      "have no append or exclusive create")
        if not autocommit:
            raise NotImplementedError("transactions (autocommit=False) are not supported")
        return ECStoreWriteFile(self, path, block_size or self.write_block_bytes, **kwargs)

    # -- delete --
    async def _rm_file(self, path: str, missing_ok: bool = False, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        if not key:
            raise IsADirectoryError(errno.EISDIR, "use rmdir or rm(recursive=True) for a bucket", path)
        c = await self._client()
        try:
            with _mapped(path):
                await c.delete(bucket, key)
        except FileNotFoundError:
            if missing_ok:
                return
            if await self._isdir(path):
                raise IsADirectoryError(errno.EISDIR, "a directory: use recursive=True", path) from None
            raise

    async def _rm(self, path: str | list[str], recursive: bool = False, batch_size: int | None = None,
                  maxdepth: int | None = None, **kwargs: Any) -> None:
        """Delete objects; with recursive, everything below too, and a bare bucket itself
        once empty. Directories among the expanded paths are only prefixes: skipped."""
        if "" in self._strip_protocol([path] if isinstance(path, str) else path):
            raise ValueError("refusing to delete the root: name the buckets")
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        keys = [p for p in paths if "/" in p]
        buckets = [p for p in paths if p and "/" not in p]
        await _run_coros_in_chunks([self._rm_file(p, missing_ok=recursive) for p in keys],
                                   batch_size=batch_size or RM_CONCURRENCY, nofiles=True)
        for bucket in buckets:
            await self._rmdir(bucket)

    async def _rmdir(self, path: str) -> None:
        """Delete an empty bucket; a prefix has nothing to delete, but must be empty."""
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        c = await self._client()
        with _mapped(path, reading=True):
            if key:
                if (await c.list(bucket, prefix=key + "/", max_keys=1)).objects:
                    raise OSError(errno.ENOTEMPTY, "directory not empty", path)
                return
            try:
                await c.delete_bucket(bucket)
            except Conflict as exc:
                raise OSError(errno.ENOTEMPTY, "bucket not empty", path) from exc

    def rmdir(self, path: str) -> None:
        self._run(self._rmdir(path))

    # -- directories --
    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """A bare bucket is created (FileExistsError if it exists); a prefix needs nothing,
        but its bucket must exist (it is created with create_parents)."""
        path = self._strip_protocol(path)
        bucket, key = split_path(path)
        if not bucket:
            raise FileExistsError(errno.EEXIST, "the root exists", path)
        c = await self._client()
        with _mapped(path):
            if not key:
                await c.create_bucket(bucket)
                return
            try:
                await c.bucket_record(bucket)
            except NotFound:
                if not create_parents:
                    raise
                with contextlib.suppress(Conflict):
                    await c.create_bucket(bucket)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        try:
            await self._mkdir(path, create_parents=True)
        except FileExistsError:
            if not exist_ok:
                raise


def _check_overwrite(mode: str) -> None:
    if mode != "overwrite":
        raise NotImplementedError(f"mode {mode!r}: ecstore has no conditional put; only 'overwrite'")


def _read_hashed(f: Any, size: int, md5: Any) -> bytes:
    chunk: bytes = f.read(size)
    md5.update(chunk)
    return chunk


def _close_client(pid: int, loop: asyncio.AbstractEventLoop, client: Client) -> None:
    """Close a filesystem's client at exit or when it is collected (never in a forked
    child: the loop that owns the client's sockets runs only in the parent)."""
    if os.getpid() != pid or loop.is_closed() or not loop.is_running():
        return
    with contextlib.suppress(Exception):
        sync(loop, client.close, timeout=CLOSE_WAIT_S)


# ---- files -----------------------------------------------------------------------------------
class ECStoreReadFile(AbstractBufferedFile):  # type: ignore[misc]
    """A readable object pinned to the version seen at open: every read returns bytes of
    that version, even if the key is overwritten meanwhile.

    Small reads are served from whole decoded segments (the last READ_KEEP_SEGMENTS), and a
    reader that goes on where it stopped gets READ_AHEAD_SEGMENTS fetched ahead; a read
    spanning more than DIRECT_READ_SEGMENTS streams through the client without caching.
    The segment state lives on the loop thread only (no lock)."""

    def __init__(self, fs: ECStoreFileSystem, path: str, record: dict[str, Any],
                 block_size: int | None = None, cache_type: str = "none", **kwargs: Any) -> None:
        kwargs.pop("size", None)  # reopen() after unpickling passes one: the record's is the truth
        self.record = record
        self.bounds = segment_bounds(record)
        self._segments: OrderedDict[int, asyncio.Future[bytes]] = OrderedDict()
        self._last_read_segment = -2
        super().__init__(fs, path, "rb", block_size or record.get("segment_size") or WRITE_BLOCK_BYTES,
                         cache_type=cache_type, size=record["size"], **kwargs)
        self.details = record_info(path, record)

    def _fetch_range(self, start: int, end: int) -> bytes:
        lo, hi = start, min(end, self.size)
        if hi <= lo:
            return b""
        return self.fs._run(self._read(lo, hi))  # type: ignore[no-any-return]

    async def _read(self, lo: int, hi: int) -> bytes:
        wanted = segments_for(self.bounds, lo, hi)
        if len(wanted) > DIRECT_READ_SEGMENTS:
            self._last_read_segment = wanted[-1]
            return await self.fs._read_range(self.path, self.record, lo, hi)  # type: ignore[no-any-return]
        sequential = wanted[0] in (self._last_read_segment, self._last_read_segment + 1)
        futures = [self._segment(i) for i in wanted]
        self._last_read_segment = wanted[-1]
        if sequential:
            for i in range(wanted[-1] + 1, min(wanted[-1] + 1 + READ_AHEAD_SEGMENTS, len(self.bounds) - 1)):
                self._segment(i)
        parts = [await asyncio.shield(f) for f in futures]
        base = self.bounds[wanted[0]]
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data[lo - base:hi - base]

    def _segment(self, i: int) -> asyncio.Future[bytes]:
        """Segment i decoded: kept, in flight, or fetched now (the oldest is forgotten). A
        fetch that failed is not kept: the next read of the segment tries again."""
        fut = self._segments.get(i)
        if fut is not None and not (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            self._segments.move_to_end(i)
            return fut
        fut = asyncio.ensure_future(self.fs._read_range(self.path, self.record, self.bounds[i],
                                                        self.bounds[i + 1]))
        fut.add_done_callback(retrieved)
        self._segments[i] = fut
        while len(self._segments) > READ_KEEP_SEGMENTS + READ_AHEAD_SEGMENTS:
            # forgotten, not cancelled: a read in progress may be waiting for it
            self._segments.popitem(last=False)
        return fut

    def close(self) -> None:
        futures, self._segments = list(self._segments.values()), OrderedDict()
        loop = self.fs._loop
        if futures and loop is not None and not loop.is_closed():
            for f in futures:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(f.cancel)
        super().close()


async def _drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    """A writer's blocks as a put source, until None."""
    while (block := await queue.get()) is not None:
        yield block


class ECStoreWriteFile(AbstractBufferedFile):  # type: ignore[misc]
    """A streaming writer: the put runs on the loop, fed blocks through a queue of
    WRITE_QUEUE_BLOCKS (a writer faster than the cluster waits), and commits on close.

    Discarded, nothing visible, if the put fails, the `with` body raises, close() runs
    while an exception raised since open propagates, or the file is dropped unclosed."""

    closed: bool

    def __init__(self, fs: ECStoreFileSystem, path: str, block_size: int,
                 content_type: str | None = None, meta: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        if not split_path(path)[1]:
            raise IsADirectoryError(errno.EISDIR, "cannot write a bucket (a path is "
                                    "BUCKET/KEY: is the bucket left out?)", path)
        super().__init__(fs, path, "wb", block_size, **kwargs)
        self.put_options = {"content_type": content_type, "meta": meta}
        self.object_info: ObjectInfo | None = None
        self._md5 = hashlib.md5()
        self._queue: asyncio.Queue[bytes | None] | None = None
        self._task: asyncio.Task[ObjectInfo] | None = None
        self._exc_at_open = sys.exc_info()[1]

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getvalue()
        self._md5.update(data)
        if final and self._task is None:  # it all fitted in one block: a plain put
            self.object_info = self.fs._run(self.fs._put_object(self.path, data, self._md5,
                                                                **self.put_options))
            return True
        if self._task is None:
            self.fs._run(self._start())
        if data:
            self.fs._run(self._feed(data))
        if final:
            self.fs._run(self._feed(None))
            self.object_info = self.fs._run(self._finish())
        return True

    async def _start(self) -> None:
        self._queue = asyncio.Queue(maxsize=WRITE_QUEUE_BLOCKS)
        task = asyncio.ensure_future(self.fs._put_object(self.path, _drain(self._queue), self._md5,
                                                         **self.put_options))
        # Held by the filesystem, not by this file: a pending put must never be garbage
        # (its coroutine would be closed on whatever thread collects it), and nothing the
        # put holds may keep this file alive, so that an unclosed file is collected.
        self.fs._puts.add(task)
        task.add_done_callback(self.fs._puts.discard)
        task.add_done_callback(retrieved)
        self._task = task

    async def _feed(self, block: bytes | None) -> None:
        """Queue a block (None: the end), waiting for room; raise the put's error if it
        failed meanwhile."""
        assert self._queue is not None and self._task is not None
        put = asyncio.ensure_future(self._queue.put(block))
        await asyncio.wait({put, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done() and self._task.exception() is not None:
            put.cancel()
            self._task.result()

    async def _finish(self) -> ObjectInfo:
        assert self._task is not None
        return await self._task

    async def _abort(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # the client deletes the fragments it placed
            await asyncio.wait({task}, timeout=ABORT_WAIT_S)

    def close(self) -> None:
        if self.closed:
            return
        if exception_since(self._exc_at_open):
            self.discard()
            return
        try:
            super().close()
        except BaseException:
            self.fs._run(self._abort())
            raise

    def discard(self) -> None:
        """Throw the write away: nothing of it becomes visible."""
        if self.closed:
            return
        self.closed = True
        self.buffer = io.BytesIO()
        self.fs._run(self._abort())

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.discard()
        else:
            self.close()

    def __del__(self) -> None:
        if self.closed:
            return
        self.closed = True
        warnings.warn(f"ecstore writer for {self.path} was never closed: discarded", ResourceWarning,
                      stacklevel=2)
        task, loop = self._task, self.fs._loop
        if task is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
