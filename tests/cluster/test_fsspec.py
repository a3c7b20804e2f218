"""ecstore:// through fsspec as pandas, pyarrow and webdataset use it, and one namespace
shared with the client library and the S3 gateway (a real cluster with its gateway)."""
from __future__ import annotations

import errno
import gc
import hashlib
import importlib.metadata
import io
import multiprocessing
import pickle
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
import pytest
from botocore.client import BaseClient

from cli.localcluster import LocalCluster
from store.client import SyncClient
from store.errors import BadRequest, Conflict, NotFound, Unavailable
from store.fs import ECStoreFileSystem, os_error, parent_dirs, segment_bounds, segments_for, slice_range
from tests.cluster.s3_fixtures import SEG, MiB, blob, s3, s3_cluster  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "fsspec-data"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def so(s3_cluster: LocalCluster) -> dict[str, Any]:  # noqa: F811
    """The storage options every caller passes."""
    return {"cluster": str(s3_cluster.path)}


@pytest.fixture(scope="module")
def fs(so: dict[str, Any]) -> ECStoreFileSystem:
    fs = fsspec.filesystem("ecstore", **so)
    fs.mkdir(BUCKET)
    return fs


@pytest.fixture(scope="module")
def lib(s3_cluster: LocalCluster, fs: ECStoreFileSystem) -> Iterator[SyncClient]:  # noqa: F811
    c = SyncClient(s3_cluster.path)
    yield c
    c.close()


def segments_read(fs: ECStoreFileSystem) -> int:
    assert fs._client_obj is not None
    stats = fs._client_obj.read_stats  # what reached the cluster (or the local cache)
    return int(stats["segments_fetched"] + stats["cache_hits"])


# ---- pure parts ----------------------------------------------------------------------------
def test_slice_range_follows_python_slices() -> None:
    data = bytes(range(10))
    for start in (None, -12, -3, 0, 4, 9, 10, 15):
        for end in (None, -12, -3, 0, 4, 9, 10, 15):
            lo, hi = slice_range(len(data), start, end)
            assert data[lo:hi] == data[start:end], (start, end)


def test_segment_bounds_restart_at_each_part() -> None:
    plain = {"size": 10, "segment_size": 4, "version_id": "v", "segments": 3}
    assert segment_bounds(plain) == [0, 4, 8, 10]
    assert segment_bounds({"size": 3, "inline": b"abc", "segment_size": 4}) == [0, 3]
    parts = {"size": 11, "segment_size": 4, "version_id": "v",
             "parts": [{"version_id": "a", "size": 5, "segments": 2},
                       {"version_id": "b", "size": 6, "segments": 2}]}
    bounds = segment_bounds(parts)
    assert bounds == [0, 4, 5, 9, 11]
    assert list(segments_for(bounds, 3, 6)) == [0, 1, 2]
    assert list(segments_for(bounds, 4, 5)) == [1]
    assert list(segments_for(bounds, 9, 11)) == [3]


def test_parent_dirs_and_error_mapping() -> None:
    assert parent_dirs("b/x", "b/x/y/z/f") == ["b/x/y", "b/x/y/z"]
    assert parent_dirs("b", "b/f") == []
    assert isinstance(os_error(NotFound("x"), "p"), FileNotFoundError)
    assert isinstance(os_error(BadRequest("x"), "p"), ValueError)
    assert isinstance(os_error(BadRequest("x"), "p", reading=True), FileNotFoundError)
    assert isinstance(os_error(Conflict("x"), "p"), FileExistsError)
    assert isinstance(os_error(Unavailable("x"), "p"), ConnectionError)


# ---- fsspec's entry point ------------------------------------------------------------------
def test_entry_point_serves_ecstore_urls_without_registration(so: dict[str, Any]) -> None:
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="fsspec.specs")}
    assert names["ecstore"] == "store.fs:ECStoreFileSystem"
    assert fsspec.get_filesystem_class("ecstore") is ECStoreFileSystem
    fs = fsspec.filesystem("ecstore", **so)
    assert fs is fsspec.filesystem("ecstore", **so)  # fsspec's instance cache
    fs.mkdir("fsspec-open")
    with fsspec.open("ecstore://fsspec-open/hello.txt", "w", **so) as f:
        f.write("hello, ecstore\n")
    with fsspec.open("ecstore://fsspec-open/hello.txt", "r", **so) as f:
        assert f.read() == "hello, ecstore\n"
    assert fs.cat("ecstore://fsspec-open/hello.txt") == b"hello, ecstore\n"
    with pytest.raises(TypeError, match="clsuter"):
        fsspec.filesystem("ecstore", clsuter=so["cluster"])


# ---- pandas and pyarrow --------------------------------------------------------------------
def test_pandas_reads_back_the_parquet_it_wrote(fs: ECStoreFileSystem, so: dict[str, Any]) -> None:
    n = 60_000
    df = pd.DataFrame({"id": range(n), "x": [i * 0.5 for i in range(n)],
                       "name": [f"row-{i % 977}" for i in range(n)], "part": [i % 3 for i in range(n)]})
    url = f"ecstore://{BUCKET}/tables/rows.parquet"
    df.to_parquet(url, storage_options=so, row_group_size=10_000)
    assert fs.info(url)["size"] > 0
    pd.testing.assert_frame_equal(pd.read_parquet(url, storage_options=so), df)
    pd.testing.assert_frame_equal(pd.read_parquet(url, storage_options=so, columns=["name"]), df[["name"]])
    # a partitioned data set: pyarrow makes "directories", finds and reads every file
    df.to_parquet(f"ecstore://{BUCKET}/tables/parts", storage_options=so, partition_cols=["part"])
    assert len(fs.find(f"{BUCKET}/tables/parts")) == 3
    back = pd.read_parquet(f"ecstore://{BUCKET}/tables/parts", storage_options=so)
    back = back.sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(back[["id", "x", "name"]], df[["id", "x", "name"]])
    assert sorted(back["part"].astype(int).unique()) == [0, 1, 2]


# ---- tar shards, as webdataset reads them ----------------------------------------------------
def shard_members() -> dict[str, bytes]:
    """Samples of a few sizes, so members start and end on both sides of segment edges."""
    out = {}
    for i, size in enumerate([100, 3 * MiB + 7, 5 * MiB, 1, 700_000, 2 * MiB]):
        out[f"{i:06d}.cls"] = str(i).encode()
        out[f"{i:06d}.bin"] = blob(size, seed=100 + i)
    return out


def test_tar_shard_written_streaming_and_read_member_by_member(fs: ECStoreFileSystem,
                                                                so: dict[str, Any]) -> None:
    members = shard_members()
    path = f"{BUCKET}/shards/shard-000000.tar"
    with fs.open(path, "wb", block_size=MiB) as f, tarfile.open(fileobj=f, mode="w|") as tar:
        for name, data in members.items():  # webdataset's TarWriter: a stream, never a seek
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert fs.size(path) > 10 * MiB
    # random access: each member found with a seek, read in the reverse order
    with fs.open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == list(members)
        for info in reversed(infos):
            extracted = tar.extractfile(info)
            assert extracted is not None
            assert extracted.read() == members[info.name], info.name
    # streaming, as webdataset's url_opener does: fsspec.open(url) and a tar stream
    with fsspec.open(f"ecstore://{path}", "rb", **so) as f, tarfile.open(fileobj=f, mode="r|") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert got == members


# ---- byte ranges -----------------------------------------------------------------------------
def test_ranged_reads_across_segment_edges_read_only_what_they_need(fs: ECStoreFileSystem,
                                                                     lib: SyncClient) -> None:
    data = blob(2 * SEG + 12345, seed=7)
    lib.put(BUCKET, "ranges/ragged", data)
    path = f"{BUCKET}/ranges/ragged"
    for start, end in [(0, 10), (SEG - 10, SEG + 10), (SEG, 2 * SEG), (SEG - 1, SEG),
                       (2 * SEG - 1, None), (-100, None), (None, 5), (2 * SEG + 12340, 10 ** 9),
                       (10 ** 9, None), (5, 5), (-SEG - 3, -SEG + 3)]:
        assert fs.cat_file(path, start, end) == data[start:end], (start, end)
    before = segments_read(fs)
    assert fs.cat_file(path, SEG + 1, SEG + 100) == data[SEG + 1:SEG + 100]
    assert segments_read(fs) - before == 1
    before = segments_read(fs)
    assert fs.cat_file(path, SEG - 100, SEG + 100) == data[SEG - 100:SEG + 100]
    assert segments_read(fs) - before == 2
    assert fs.read_block(path, SEG - 5, 10) == data[SEG - 5:SEG + 5]
    with fs.open(path, "rb") as f:
        for pos, length in [(SEG - 3, 6), (0, 1), (2 * SEG + 12340, 100), (SEG, SEG), (100, 3 * SEG)]:
            f.seek(pos)
            assert f.read(length) == data[pos:pos + length], (pos, length)
        f.seek(-4, 2)
        assert f.read() == data[-4:]
        assert f.tell() == len(data)
        f.seek(SEG - 1)
        again = pickle.loads(pickle.dumps(f))  # as a DataLoader hands a file to a worker
        assert again.tell() == SEG - 1 and again.read(2) == data[SEG - 1:SEG + 1]


def test_an_open_file_keeps_reading_the_version_it_opened(fs: ECStoreFileSystem, lib: SyncClient) -> None:
    old, new = blob(SEG + 10, seed=1), blob(SEG + 10, seed=2)
    lib.put(BUCKET, "ranges/pinned", old)
    with fs.open(f"{BUCKET}/ranges/pinned", "rb") as f:
        head = f.read(10)
        lib.put(BUCKET, "ranges/pinned", new)
        assert head + f.read() == old
    assert fs.cat(f"{BUCKET}/ranges/pinned") == new


def test_an_open_file_whose_version_was_collected_says_so(fs: ECStoreFileSystem, lib: SyncClient,
                                                          s3_cluster: LocalCluster) -> None:  # noqa: F811
    """The version an open file reads, overwritten and collected by `ecstore gc`: it will
    never read again. It raised ConnectionError (EAGAIN), which a data loader retries for
    ever (an ML sweep); now FileNotFoundError saying to open the file again."""
    old, new = blob(SEG + 10, seed=3), blob(SEG + 10, seed=4)
    lib.put(BUCKET, "ranges/collected", old)
    with fs.open(f"{BUCKET}/ranges/collected", "rb") as f:
        assert f.read(10) == old[:10]          # the first segment read (and kept)
        lib.put(BUCKET, "ranges/collected", new)
        gc_run = subprocess.run([sys.executable, "-m", "cli.main", "--cluster",
                                 str(s3_cluster.path), "gc", "--grace", "0", "--force"],
                                capture_output=True, timeout=120)
        assert gc_run.returncode == 0, gc_run.stderr.decode()
        f.seek(SEG)
        with pytest.raises(FileNotFoundError) as gone:
            f.read()
    assert gone.value.errno == errno.ENOENT and "open the file again" in str(gone.value)
    assert fs.cat(f"{BUCKET}/ranges/collected") == new


# ---- names: ls, info, find, glob, walk, rm -----------------------------------------------------
TREE = {"tree/a.txt": b"a", "tree/sub/b.txt": b"bb", "tree/sub/deeper/c.txt": b"ccc",
        "tree/other/d.csv": b"dddd", "tree/sub/e.bin": b"e"}


def make_tree(fs: ECStoreFileSystem, root: str) -> None:
    fs.pipe({f"{root}/{k}": v for k, v in TREE.items()})


def test_ls_info_find_glob_and_walk_see_prefixes_as_directories(fs: ECStoreFileSystem) -> None:
    fs.mkdir("fsspec-names")
    make_tree(fs, "fsspec-names")
    b = "fsspec-names"
    assert fs.ls(f"{b}/tree", detail=False) == [f"{b}/tree/a.txt", f"{b}/tree/other", f"{b}/tree/sub"]
    entries = {e["name"]: e for e in fs.ls(f"ecstore://{b}/tree/")}
    assert entries[f"{b}/tree/sub"]["type"] == "directory"
    assert entries[f"{b}/tree/a.txt"]["type"] == "file" and entries[f"{b}/tree/a.txt"]["size"] == 1
    info = fs.info(f"{b}/tree/sub/b.txt")
    assert info["type"] == "file" and info["size"] == 2 and info["version_id"]
    assert info["etag"] == hashlib.md5(b"bb").hexdigest()  # as S3 would say
    assert info["content_type"] == "text/plain"
    assert fs.info(f"{b}/tree/sub")["type"] == "directory"
    assert fs.info(b)["type"] == "directory"
    assert fs.ls(f"{b}/tree/a.txt", detail=False) == [f"{b}/tree/a.txt"]
    assert b in fs.ls("", detail=False) and BUCKET in fs.ls("ecstore://", detail=False)
    assert fs.isdir(f"{b}/tree/sub/deeper") and fs.isfile(f"{b}/tree/sub/deeper/c.txt")
    assert not fs.exists(f"{b}/tree/nope") and not fs.exists("no-such-bucket/x")
    assert not fs.exists("Not_A_Bucket/x")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{b}/tree/nope")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{b}/tree/nope")
    assert fs.find(f"{b}/tree") == sorted(f"{b}/{k}" for k in TREE)
    assert fs.find(f"{b}/tree", maxdepth=1) == [f"{b}/tree/a.txt"]
    dirs = [p for p, i in fs.find(f"{b}/tree", withdirs=True, detail=True).items() if i["type"] == "directory"]
    assert dirs == [f"{b}/tree", f"{b}/tree/other", f"{b}/tree/sub", f"{b}/tree/sub/deeper"]
    assert fs.glob(f"{b}/tree/*/*.txt") == [f"{b}/tree/sub/b.txt"]
    assert fs.glob(f"ecstore://{b}/tree/**/*.txt") == [f"{b}/tree/a.txt", f"{b}/tree/sub/b.txt",
                                                     f"{b}/tree/sub/deeper/c.txt"]
    walked = {root: (sorted(d), sorted(f)) for root, d, f in fs.walk(f"{b}/tree")}
    assert walked[f"{b}/tree/sub"] == (["deeper"], ["b.txt", "e.bin"])
    assert fs.du(f"{b}/tree") == sum(len(v) for v in TREE.values())
    assert fs.modified(f"{b}/tree/a.txt").tzinfo is not None


def test_rm_deletes_files_prefixes_and_empty_buckets(fs: ECStoreFileSystem) -> None:
    b = "fsspec-rm"
    fs.makedirs(b, exist_ok=True)
    fs.makedirs(f"{b}/some/prefix", exist_ok=False)  # a prefix: nothing to make
    with pytest.raises(FileExistsError):
        fs.mkdir(b)
    make_tree(fs, b)
    fs.rm(f"{b}/tree/a.txt")
    with pytest.raises(FileNotFoundError):
        fs.rm(f"{b}/tree/a.txt")
    with pytest.raises(IsADirectoryError):
        fs.rm(f"{b}/tree/sub")
    # a path with the bucket left out ("ecstore://data.csv"): no such bucket, not "a
    # bucket is a directory"; a bucket that exists, opened as a file, is one
    with pytest.raises(FileNotFoundError, match="no such bucket"):
        fs.open("fsspec-no-such-bucket-x", "rb")
    with pytest.raises(IsADirectoryError):
        fs.open(b, "rb")
    with pytest.raises(ValueError, match="root"):
        fs.rm("ecstore://", recursive=True)
    fs.rm(f"{b}/tree/sub", recursive=True)
    assert fs.find(b) == [f"{b}/tree/other/d.csv"]
    with pytest.raises(OSError) as exc:
        fs.rmdir(b)
    assert exc.value.errno == errno.ENOTEMPTY
    assert isinstance(exc.value.__cause__, Conflict)   # the cluster's answer, as README says
    fs.rm(f"ecstore://{b}", recursive=True)  # the bucket goes too
    assert not fs.exists(b) and b not in fs.ls("", detail=False)
    with pytest.raises(FileNotFoundError):
        fs.ls(b)


def test_listings_are_never_stale_whoever_writes(fs: ECStoreFileSystem, lib: SyncClient,
                                                 s3: BaseClient) -> None:  # noqa: F811
    d = f"{BUCKET}/fresh"
    assert not fs.exists(d)
    fs.pipe(f"{d}/one", b"1")
    assert fs.ls(d, detail=False) == [f"{d}/one"]
    lib.put(BUCKET, "fresh/two", b"2")
    s3.put_object(Bucket=BUCKET, Key="fresh/three", Body=b"3")
    assert fs.ls(d, detail=False) == [f"{d}/one", f"{d}/three", f"{d}/two"]
    lib.delete(BUCKET, "fresh/one")
    s3.delete_object(Bucket=BUCKET, Key="fresh/three")
    assert fs.ls(d, detail=False) == [f"{d}/two"]
    assert not fs.exists(f"{d}/one")
    fs.rm(f"{d}/two")
    assert not fs.exists(d)
    assert "fresh/two" not in [o.key for o in lib.list(BUCKET, prefix="fresh/").objects]


# ---- streaming writes -------------------------------------------------------------------------
MEMORY_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import fsspec
    MIB = 1024 * 1024
    fs = fsspec.filesystem("ecstore", cluster=sys.argv[1])
    def peak_mib():  # VmHWM starts anew at exec (ru_maxrss would count the parent's)
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM"))
    def write(path, mib):
        h = hashlib.sha256()
        with fs.open(path, "wb") as f:
            for i in range(mib):
                block = bytes([i % 251]) * MIB
                f.write(block)
                h.update(block)
        return h.hexdigest()
    fs.pipe(sys.argv[2] + "-small", b"x")
    start = peak_mib()
    write(sys.argv[2] + "-warm", int(sys.argv[3]) // 4)
    warm = peak_mib()
    digest = write(sys.argv[2], int(sys.argv[3]))
    print(start, warm, peak_mib(), digest)
""")


def test_a_large_streaming_write_keeps_memory_bounded(fs: ECStoreFileSystem, so: dict[str, Any]) -> None:
    """Peak memory does not grow with the object: from a 48 MiB write to a 192 MiB one it
    rises by less than 40 MiB (a leak of a third of what is written would pass that).
    Measured with 32 and 128 MiB: flat on a quiet machine, up to 22 MiB higher while
    another process wrote to the disk (fragment sends waiting in the transports' buffers
    at their worst in the larger write); a 512 MiB write then peaked no higher."""
    total_mib = 192
    path = f"{BUCKET}/big/stream.bin"
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, so["cluster"], path, str(total_mib)],
                         cwd=ROOT, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    start, warm, peak, digest = out.stdout.decode().split()
    print(f"fsspec streaming writes: peak RSS {start} MiB before, {warm} MiB after {total_mib // 4} MiB, "
          f"{peak} MiB after {total_mib} MiB")
    assert int(peak) - int(warm) < 40
    assert int(peak) - int(start) < total_mib * 3 // 4
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while block := f.read(3 * MiB + 1):
            h.update(block)
    assert h.hexdigest() == digest and fs.size(path) == total_mib * MiB


def test_a_write_that_raises_leaves_nothing_visible(fs: ECStoreFileSystem, so: dict[str, Any]) -> None:
    big = blob(9 * MiB, seed=3)  # more than two blocks: the put is already streaming
    path = f"{BUCKET}/broken/with-fs-open"
    with pytest.raises(RuntimeError), fs.open(path, "wb") as f:
        f.write(big)
        raise RuntimeError("the writer fails half way")
    with pytest.raises(RuntimeError), fsspec.open(f"ecstore://{BUCKET}/broken/with-fsspec-open", "wb", **so) as f:
        f.write(big)
        raise RuntimeError("fsspec.open's context manager closes without the exception")
    with pytest.raises(RuntimeError), fs.open(f"{BUCKET}/broken/text", "w") as t:  # a TextIOWrapper
        t.write("x" * (5 * MiB))
        raise RuntimeError("the wrapper closes the file while this propagates")
    small = f"{BUCKET}/broken/small"
    with pytest.raises(KeyError), fs.open(small, "wb") as f:
        f.write(b"tiny")
        raise KeyError("before the first block")
    unclosed = fs.open(f"{BUCKET}/broken/never-closed", "wb")
    unclosed.write(big)
    with pytest.warns(ResourceWarning, match="never closed"):
        del unclosed
        gc.collect()

    # a text writer dropped unclosed when an exception left the function writing it: the
    # TextIOWrapper's own finalizer closed - committed - the rows written so far
    def rows() -> None:
        t = fs.open(f"{BUCKET}/broken/text-dropped.csv", "w")
        for i in range(10):
            if i == 5:
                raise RuntimeError("the row source fails")
            t.write(f"row {i}\n")
    with pytest.warns(ResourceWarning, match="never closed"):
        with pytest.raises(RuntimeError):
            rows()
        gc.collect()
    with fs.open(f"{BUCKET}/text-ok.csv", "w", newline="\r\n") as t:   # closed: committed
        t.write("a\nb\n")
    assert fs.cat(f"{BUCKET}/text-ok.csv") == b"a\r\nb\r\n"
    assert not fs.exists(f"{BUCKET}/broken")
    assert fs.find(f"{BUCKET}/broken") == []
    # a put that fails (no such bucket) raises from write or close, and commits nothing
    with pytest.raises(FileNotFoundError):
        with fs.open("fsspec-no-bucket/x", "wb") as f:
            f.write(big)
    # an exception handled before the file was opened does not count
    try:
        raise ValueError("handled")
    except ValueError:
        with fs.open(f"{BUCKET}/broken-ok", "wb") as f:
            f.write(b"kept")
    assert fs.cat(f"{BUCKET}/broken-ok") == b"kept"


# ---- one namespace: client library, S3, fsspec --------------------------------------------------
def test_every_interface_reads_back_what_another_wrote(fs: ECStoreFileSystem, lib: SyncClient,
                                                       s3: BaseClient) -> None:  # noqa: F811
    by_lib, by_fs, by_s3 = blob(SEG + 999, seed=11), blob(2 * SEG + 5, seed=12), blob(SEG - 3, seed=13)
    lib.put(BUCKET, "x/by-lib", by_lib)
    assert sha(fs.cat(f"{BUCKET}/x/by-lib")) == sha(by_lib)
    assert sha(s3.get_object(Bucket=BUCKET, Key="x/by-lib")["Body"].read()) == sha(by_lib)

    with fs.open(f"{BUCKET}/x/by-fs", "wb") as f:
        for i in range(0, len(by_fs), 1_000_003):
            f.write(by_fs[i:i + 1_000_003])
    got = s3.get_object(Bucket=BUCKET, Key="x/by-fs")
    assert sha(got["Body"].read()) == sha(by_fs)
    assert got["ETag"] == f'"{hashlib.md5(by_fs).hexdigest()}"'
    assert sha(lib.get(BUCKET, "x/by-fs")) == sha(by_fs)
    ranged = s3.get_object(Bucket=BUCKET, Key="x/by-fs", Range=f"bytes={SEG - 2}-{SEG + 2}")["Body"].read()
    assert ranged == by_fs[SEG - 2:SEG + 3]

    s3.put_object(Bucket=BUCKET, Key="x/by-s3", Body=by_s3)
    assert sha(fs.cat(f"{BUCKET}/x/by-s3")) == sha(by_s3)
    assert fs.info(f"{BUCKET}/x/by-s3")["etag"] == hashlib.md5(by_s3).hexdigest()
    assert sha(lib.get(BUCKET, "x/by-s3")) == sha(by_s3)


def test_put_get_and_copy_through_local_files(fs: ECStoreFileSystem, tmp_path: Path) -> None:
    src = tmp_path / "up"
    (src / "d").mkdir(parents=True)
    (src / "d" / "one.bin").write_bytes(blob(SEG + 1, seed=21))
    (src / "two.txt").write_bytes(b"two")
    fs.put(str(src), f"{BUCKET}/tree-up", recursive=True)
    assert fs.find(f"{BUCKET}/tree-up") == [f"{BUCKET}/tree-up/d/one.bin", f"{BUCKET}/tree-up/two.txt"]
    fs.get(f"{BUCKET}/tree-up", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "d" / "one.bin").read_bytes() == (src / "d" / "one.bin").read_bytes()
    fs.cp(f"{BUCKET}/tree-up/d/one.bin", f"{BUCKET}/tree-up/copy.bin")
    assert fs.cat(f"{BUCKET}/tree-up/copy.bin") == (src / "d" / "one.bin").read_bytes()
    fs.mv(f"{BUCKET}/tree-up/two.txt", f"{BUCKET}/tree-up/moved.txt")
    assert fs.cat(f"{BUCKET}/tree-up/moved.txt") == b"two" and not fs.exists(f"{BUCKET}/tree-up/two.txt")
    # a whole tree: the directories fsspec lists beside the files have nothing to copy
    fs.cp(f"{BUCKET}/tree-up/d", f"{BUCKET}/tree-cp", recursive=True)
    assert fs.cat(f"{BUCKET}/tree-cp/one.bin") == (src / "d" / "one.bin").read_bytes()
    fs.mv(f"{BUCKET}/tree-cp", f"{BUCKET}/tree-mv", recursive=True)
    assert fs.find(f"{BUCKET}/tree-mv") == [f"{BUCKET}/tree-mv/one.bin"]
    assert not fs.exists(f"{BUCKET}/tree-cp")


# ---- processes ----------------------------------------------------------------------------------
def _read_in_child(fs: ECStoreFileSystem, path: str, queue: Any) -> None:
    queue.put(sha(fs.cat(path)))


def test_a_forked_worker_uses_the_parents_filesystem(fs: ECStoreFileSystem) -> None:
    """A DataLoader worker forked after the parent used the filesystem."""
    data = blob(SEG + 77, seed=31)
    fs.pipe(f"{BUCKET}/fork/obj", data)
    assert sha(fs.cat(f"{BUCKET}/fork/obj")) == sha(data)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(fs, f"{BUCKET}/fork/obj", queue))
    child.start()
    try:
        assert queue.get(timeout=60) == sha(data)
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0
    assert sha(fs.cat(f"{BUCKET}/fork/obj")) == sha(data)  # the parent goes on too
