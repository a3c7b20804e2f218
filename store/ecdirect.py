"""Missing fragments' payloads rebuilt with ISA-L's erasure code called directly - the
libisal pyeclib's wheel ships (or the system's) - into buffers the caller names: no copy
in, no copy out, and the GIL let go for the arithmetic.

pyeclib's reconstruct takes whole fragments as `bytes` and returns new ones: a degraded
read copied every fragment it had read in place into a `bytes` (its header joined on),
every parity fragment read apart into another, and each rebuilt payload back into the
segment - 21% of a degraded reader's CPU, beside 22% for reconstruct itself (the
twenty-ninth session's py-spy). Here the payloads are used where they lie.

Only for the codes whose encode matrix ISA-L generates itself (isa_l_rs_vand:
gf_gen_rs_matrix; isa_l_rs_cauchy: gf_gen_cauchy1_matrix). Before a (k, m, code) is used
here, the parity ISA-L computes with that matrix is compared with pyeclib's for a small
segment: if they differ (another pyeclib, another matrix) the caller goes on with
pyeclib, as it does when the library or its symbols are missing or ECSTORE_EC_DIRECT=0.
Any k fragments of a segment determine its data (the code is MDS where the matrix is
invertible; where a survivor set's matrix is singular, False, and pyeclib is asked).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

HEADER_BYTES = 80
GENERATORS = {"isa_l_rs_vand": "gf_gen_rs_matrix", "isa_l_rs_cauchy": "gf_gen_cauchy1_matrix"}
ENV = "ECSTORE_EC_DIRECT"       # "0": never (pyeclib for every rebuild: A/B runs)
SELF_CHECK_PAYLOAD = 4096       # bytes per fragment of the segment the matrix is checked on
MAX_PAYLOAD = 2**31 - 1         # ec_encode_data's length is a C int

stats = {"rebuilds": 0}         # rebuild() calls that rebuilt (benchmarks and tests read it)

# (buffer, offset): the fragment's payload is buffer[offset:offset + payload]
Where = tuple[Any, int]


@functools.cache
def _lib() -> Any:
    """libisal with the symbols used, argument types set; None if there is none."""
    def candidates() -> Iterator[str]:
        try:
            import pyeclib
            libs = Path(pyeclib.__file__).resolve().parent.parent / "pyeclib.libs"
            yield from sorted(str(p) for p in libs.glob("libisal*.so*"))
        except ImportError:   # pragma: no cover - pyeclib is a dependency
            pass
        found = ctypes.util.find_library("isal")     # the system's (slower to look up)
        if found:
            yield found
    for name in candidates():
        try:
            lib = ctypes.CDLL(name)
            vp, i = ctypes.c_void_p, ctypes.c_int
            for gen in GENERATORS.values():
                getattr(lib, gen).argtypes = [vp, i, i]
                getattr(lib, gen).restype = None
            lib.gf_invert_matrix.argtypes = [vp, vp, i]
            lib.gf_invert_matrix.restype = i
            lib.ec_init_tables.argtypes = [i, i, vp, vp]
            lib.ec_init_tables.restype = None
            lib.ec_encode_data.argtypes = [i, i, i, vp, vp, vp]
            lib.ec_encode_data.restype = None
        except (OSError, AttributeError):
            continue
        return lib
    return None


@functools.lru_cache(maxsize=64)
def _matrix(k: int, m: int, ec_type: str) -> bytes | None:
    """The (k+m) x k encode matrix, rows of k bytes; None if this code is not ours to do
    or ISA-L's parity with it is not pyeclib's."""
    lib = _lib()
    gen = GENERATORS.get(ec_type)
    if lib is None or gen is None or not 0 < k <= 32 or not 0 < m <= 32:
        return None
    a = (ctypes.c_ubyte * ((k + m) * k))()
    getattr(lib, gen)(a, k + m, k)
    matrix = bytes(a)
    return matrix if _agrees_with_pyeclib(k, m, ec_type, matrix) else None


def _agrees_with_pyeclib(k: int, m: int, ec_type: str, matrix: bytes) -> bool:
    from store.codec import driver
    seg = random.Random(k * 1000 + m).randbytes(k * SELF_CHECK_PAYLOAD - 7)
    try:
        frags = driver(k, m, ec_type).encode(seg)
    except Exception:  # noqa: BLE001 - pyeclib cannot do this code here: nor can we
        return False
    size = len(frags[0]) - HEADER_BYTES
    if any(len(f) != HEADER_BYTES + size for f in frags):
        return False
    parity = [bytearray(size) for _ in range(m)]
    keep: list[Any] = []
    src = [_address(f, HEADER_BYTES, size, False, keep) for f in frags[:k]]
    dst = [_address(b, 0, size, True, keep) for b in parity]
    _encode(k, m, size, _tables(k, m, matrix[k * k:]), src, dst)
    keep.clear()
    return all(parity[j] == frags[k + j][HEADER_BYTES:] for j in range(m))


def _tables(k: int, rows: int, coefficients: bytes) -> Any:
    tables = (ctypes.c_ubyte * (32 * k * rows))()
    _lib().ec_init_tables(k, rows, ctypes.c_char_p(coefficients), tables)
    return tables


@functools.lru_cache(maxsize=256)
def _decode_tables(k: int, m: int, ec_type: str, survivors: tuple[int, ...],
                   missing: tuple[int, ...]) -> Any:
    """ISA-L's tables that turn the payloads of `survivors` (k fragment indices, sorted)
    into those of `missing`; None where that matrix is singular."""
    matrix = _matrix(k, m, ec_type)
    assert matrix is not None
    sub = (ctypes.c_ubyte * (k * k))(*b"".join(matrix[r * k:(r + 1) * k] for r in survivors))
    inv = (ctypes.c_ubyte * (k * k))()
    if _lib().gf_invert_matrix(sub, inv, k) != 0:
        return None
    inverse = bytes(inv)
    rows = []
    for target in missing:
        if target < k:          # a data fragment: its row of the inverse
            rows.append(inverse[target * k:(target + 1) * k])
        else:                   # a parity one: its encode row times the inverse
            enc = matrix[target * k:(target + 1) * k]
            rows.append(bytes(_row_times(enc, inverse, k)))
    return _tables(k, len(missing), b"".join(rows))


def _row_times(row: bytes, inverse: bytes, k: int) -> list[int]:
    out = []
    for c in range(k):
        acc = 0
        for j in range(k):
            acc ^= _gf_mul(row[j], inverse[j * k + c])
        out.append(acc)
    return out


def _gf_mul(a: int, b: int) -> int:
    """GF(2^8) with ISA-L's polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d)."""
    out = 0
    while b:
        if b & 1:
            out ^= a
        a <<= 1
        if a & 0x100:
            a ^= 0x11D
        b >>= 1
    return out


def usable(k: int, m: int, ec_type: str) -> bool:
    """Whether rebuild() can serve this code (else the caller uses pyeclib)."""
    return os.environ.get(ENV, "1") != "0" and _matrix(k, m, ec_type) is not None


def rebuild(k: int, m: int, ec_type: str, payload: int, sources: Mapping[int, Where],
            targets: Mapping[int, Where]) -> bool:
    """Write the payloads of fragments `targets` (index -> where) from those of at least
    k `sources` (index -> where; the k lowest indices are used), each `payload` bytes.
    Every target must be writable (a bytearray or a view of one). False, nothing
    written, when this cannot be done here (unusable code, too few sources, a singular
    matrix, a buffer too short): the caller falls back to pyeclib."""
    if not targets or not 0 < payload <= MAX_PAYLOAD or not usable(k, m, ec_type):
        return False
    survivors = tuple(sorted(i for i in sources if 0 <= i < k + m)[:k])
    missing = tuple(sorted(targets))
    if len(survivors) < k or set(missing) & set(survivors) \
            or not all(0 <= i < k + m for i in missing):
        return False
    tables = _decode_tables(k, m, ec_type, survivors, missing)
    if tables is None:
        return False
    keep: list[Any] = []     # the ctypes views: each holds its buffer while it lives
    try:
        src = [_address(*sources[i], payload, False, keep) for i in survivors]
        dst = [_address(*targets[i], payload, True, keep) for i in missing]
    except (TypeError, ValueError, BufferError):
        return False
    try:
        _encode(k, len(missing), payload, tables, src, dst)
    finally:
        keep.clear()         # the buffers can be resized again
    stats["rebuilds"] += 1
    return True


def _address(buf: Any, offset: int, payload: int, writable: bool, keep: list[Any]) -> int:
    """Where buf[offset:offset + payload] lies (bounds checked); `bytes` only read."""
    if offset < 0 or len(buf) < offset + payload:
        raise ValueError("buffer too short")
    if type(buf) is bytes:
        if writable:
            raise TypeError("bytes cannot be written")
        pointer = ctypes.c_char_p(buf)          # the bytes' own storage, not a copy
        keep.append(pointer)
        return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0) + offset
    view = (ctypes.c_char * payload).from_buffer(buf, offset)
    keep.append(view)
    return ctypes.addressof(view)


def _encode(k: int, rows: int, payload: int, tables: Any, src: list[int], dst: list[int]) -> None:
    """ec_encode_data: `rows` outputs at the addresses `dst` from k inputs at `src`."""
    _lib().ec_encode_data(payload, k, rows, tables, (ctypes.c_void_p * k)(*src),
                          (ctypes.c_void_p * rows)(*dst))
