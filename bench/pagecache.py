"""The page cache as the benchmarks (and the tests) look at it: /proc/meminfo fields, and
files dropped from it."""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def meminfo_kib(*fields: str) -> int | None:
    """The sum of /proc/meminfo `fields` (kB there, KiB in fact); None where there is no
    such file or field."""
    try:
        kib = {k: v.split()[0] for k, v in (line.split(":", 1) for line in
                                            Path("/proc/meminfo").read_text().splitlines())}
        return sum(int(kib[f]) for f in fields)
    except (OSError, KeyError, ValueError):
        return None


def evict(paths: Iterable[Path], sync: bool = False) -> int:
    """Drop every file under `paths` (files or folders) from the page cache
    (POSIX_FADV_DONTNEED), fsync'd first with `sync` (dirty pages are not dropped);
    how many files."""
    count = 0
    for root in paths:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    if sync:
                        os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                count += 1
    return count
