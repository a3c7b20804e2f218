"""What a storage node needs to send a fragment from its volume file with sendfile(2):
is the record in the page cache (Linux's cachestat(2), 6.5+), TCP_CORK on and off, and
sendfile until the socket is full - through ctypes and os, no socket object per call.

A fragment is sent from the event loop only when all of it is cached: sendfile reads the
file synchronously, and a fragment that must come from the disk would stall every
request the loop serves. `resident` answers None where cachestat is missing (an older
kernel: ENOSYS; a container's seccomp filter: EPERM) and the caller reads in a thread as
before."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
from typing import Any

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


def _libc() -> Any:
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.setsockopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_libc_ = _libc()
_fn = _libc_.syscall if _libc_ is not None else None
_available = _fn is not None
_ON, _OFF = ctypes.c_int(1), ctypes.c_int(0)


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


def cork(fd: int, on: bool) -> None:
    """TCP_CORK on a socket by its fd: while on, what is written waits for full segments
    (the head of a response and the body sendfile adds); off sends the rest. (The
    socket object uvloop hands out makes a socket.socket for each setsockopt.)"""
    if _libc_ is not None:
        _libc_.setsockopt(fd, socket.IPPROTO_TCP, socket.TCP_CORK,
                          ctypes.byref(_ON if on else _OFF), 4)


def send(sock_fd: int, file_fd: int, offset: int, length: int) -> int:
    """sendfile(2) of file_fd's bytes offset..offset+length to a non-blocking socket:
    how many the socket took (all, or as many as fit its buffer now); -1 if the
    connection is gone."""
    sent = 0
    while sent < length:
        try:
            n = os.sendfile(sock_fd, file_fd, offset + sent, length - sent)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:    # EPIPE, ECONNRESET
            return -1
        if n == 0:         # the file ends before offset + length
            break
        sent += n
    return sent
