"""Is a byte range of a file in the page cache? Linux's cachestat(2) (6.5+), through ctypes.

A storage node sends a fragment with sendfile(2) from the event loop only when all of it
is cached: sendfile reads the file synchronously, and a fragment that must come from the
disk would stall every request the loop serves. `resident` answers None where the call
is missing (an older kernel: ENOSYS; a container's seccomp filter: EPERM) and the caller
reads in a thread as before."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# cachestat's number is the same on every architecture that has it (the syscall table
# was unified before 6.5): 451.
_CACHESTAT = 451


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


def _syscall() -> object | None:
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_fn = _syscall()
_available = _fn is not None


def available() -> bool:
    """False once cachestat turned out missing here (then every answer is None)."""
    return _available


def supported() -> bool:
    """Whether cachestat answers here: asked once about this module's own file."""
    if _available:
        fd = os.open(__file__, os.O_RDONLY)
        try:
            resident(fd, 0, 1)
        finally:
            os.close(fd)
    return _available


def disable() -> None:
    """Answer None from now on (tests: the path without cachestat)."""
    global _available
    _available = False


def resident(fd: int, offset: int, length: int) -> bool | None:
    """True if every page of fd's bytes offset..offset+length is in the page cache,
    False if some are not, None if this kernel cannot say."""
    global _available
    if not _available or _fn is None:
        return None
    first = offset // PAGE
    pages = (offset + length + PAGE - 1) // PAGE - first
    rng, st = _Range(first * PAGE, pages * PAGE), _Stat()
    if _fn(_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:  # type: ignore[operator]
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            _available = False
            return None
        return False   # EBADF and the like: let the ordinary read say what is wrong
    return st.nr_cache >= pages
