"""Small real filesystems for full-disk tests: a tmpfs with a size limit mounted on a
node's data directory (root only), and a filler file that takes its free space."""
from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster

MiB = 1024 * 1024


def mount_tmpfs(path: Path, size_mib: int) -> str | None:
    """Mount a tmpfs of size_mib at path; the reason it could not, or None."""
    if os.geteuid() != 0:
        return "mounting a small filesystem needs root (CI runs as root)"
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"mount -t tmpfs failed here: {r.stderr.strip()}"
    return None


@contextlib.contextmanager
def tmpfs_disk(path: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of size_mib on `path` for the block - the test skipped, saying why, where
    one cannot be mounted - unmounted after (lazily: a store a failed test left open
    goes with its last reference)."""
    why = mount_tmpfs(path, size_mib)
    if why is not None:
        pytest.skip(why)
    try:
        yield path
    finally:
        gc.collect()
        unmount(path)


@contextlib.contextmanager
def cluster_on_tmpfs(prefix: str, size_mib: int, node_id: str = "s1") -> Iterator[LocalCluster]:
    """A started local cluster of 7 storage and 3 control nodes (4+2) whose node
    `node_id` keeps its data on a tmpfs of size_mib - the test skipped, saying why, where
    one cannot be mounted; stopped, unmounted and removed after."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    c = LocalCluster.create(tmp, storage=7, control=3, k=4, m=2, gateway=False)
    disk = Path(c.nodes[node_id].data)
    why = mount_tmpfs(disk, size_mib)
    if why is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(why)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        gc.collect()    # a FragmentStore a failed test left open holds its volume files
        unmount(disk)
        shutil.rmtree(tmp, ignore_errors=True)


def unmount(path: Path) -> None:
    subprocess.run(["umount", "--lazy", str(path)], check=False)   # a failed test may hold files open


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave_bytes: int) -> Path:
    """A filler file taking the disk's free space but about `leave_bytes` (0: all of it,
    to the last block); its path, to unlink when the space is to come back."""
    filler = disk / "filler"
    with open(filler, "ab") as f:
        while free_bytes(disk) > leave_bytes:
            try:
                f.write(b"\0" * min(MiB, max(4096, free_bytes(disk) - leave_bytes)))
                f.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler
