"""What a storage node needs to send a fragment from its volume file with sendfile(2):
is the record in the page cache (Linux's cachestat(2), 6.5+, or mincore(2)), TCP_CORK on
and off, and sendfile until the socket is full - through ctypes and os, no socket object
per call.

A fragment is sent from the event loop only when all of it is cached: sendfile reads the
file synchronously, and a fragment that must come from the disk would stall every
request the loop serves. Where cachestat is missing (an older kernel: ENOSYS; a
container's seccomp filter older than it, Docker's default before 26.0: EPERM),
`resident` asks mincore(2) about a read-only mapping of the range instead (an mmap,
mincore and munmap: 25-30 us for 1 MiB against cachestat's 2). mincore tells about a
file's pages only to a process that owns the file or may write it - a storage node, for
its own volumes. `resident` answers None only where neither works, and the caller reads
in a thread as before."""

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
_PROT_READ, _MAP_SHARED = 1, 1     # the same on every Linux architecture


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


def _mapping(libc: Any) -> bool:
    """Declare mmap, mincore and munmap's types (pointers and sizes are 64-bit)."""
    try:
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mincore.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except AttributeError:
        return False
    return True


_libc_ = _libc()
_fn = _libc_.syscall if _libc_ is not None else None
_cachestat = _fn is not None          # until the kernel says it has none
_mincore = _libc_ is not None and _mapping(_libc_)
_MAP_FAILED = ctypes.c_void_p(-1).value
# mincore's answer per page: bit 0 is "resident", the others are reserved
_NOT_RESIDENT = bytes(0 if b & 1 else 1 for b in range(256))
_ON, _OFF = ctypes.c_int(1), ctypes.c_int(0)


def available() -> bool:
    """False once neither cachestat nor mincore answers here (then every answer is
    None)."""
    return _cachestat or _mincore


def supported() -> bool:
    """Whether `resident` answers here: asked once about this module's own file."""
    _ask()
    return available()


def cachestat_supported() -> bool:
    """Whether `resident` asks cachestat here (else mincore, or nothing)."""
    _ask()
    return _cachestat


def _ask() -> None:
    if available():
        fd = os.open(__file__, os.O_RDONLY)
        try:
            resident(fd, 0, 1)
        finally:
            os.close(fd)


def disable() -> None:
    """Answer None from now on (tests: the path that cannot tell)."""
    global _cachestat, _mincore
    _cachestat = _mincore = False


def resident(fd: int, offset: int, length: int) -> bool | None:
    """True if every page of fd's bytes offset..offset+length is in the page cache,
    False if some are not, None if this kernel cannot say."""
    global _cachestat
    first = offset // PAGE
    pages = (offset + length + PAGE - 1) // PAGE - first
    if _cachestat:
        rng, st = _Range(first * PAGE, pages * PAGE), _Stat()
        if _fn(_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) == 0:  # type: ignore[misc]
            return st.nr_cache >= pages
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            return False   # EBADF and the like: let the ordinary read say what is wrong
        _cachestat = False
    if _mincore:
        return _resident_mincore(fd, first, pages)
    return None


def _resident_mincore(fd: int, first: int, pages: int) -> bool:
    """mincore(2) over a read-only shared mapping of the pages (never touched: mapping
    and asking read nothing from the disk)."""
    if pages <= 0:
        return True
    size = pages * PAGE
    addr = _libc_.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, first * PAGE)
    if addr is None or addr == _MAP_FAILED:
        return False   # EBADF, ENODEV and the like: let the ordinary read say what is wrong
    try:
        vec = ctypes.create_string_buffer(pages)
        if _libc_.mincore(addr, size, vec) != 0:
            return False
        return b"\x01" not in vec.raw[:pages].translate(_NOT_RESIDENT)
    finally:
        _libc_.munmap(addr, size)


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
