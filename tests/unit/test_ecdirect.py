"""store.ecdirect: ISA-L called directly rebuilds exactly the payloads pyeclib made, for
every set of lost fragments a policy survives, into the caller's buffers - and steps
aside (False, nothing written) wherever it cannot, so the callers fall back to pyeclib."""
from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from store import codec, ecdirect

H = ecdirect.HEADER_BYTES
CODES = ["isa_l_rs_vand", "isa_l_rs_cauchy"]


def _payloads(frags: list[bytes]) -> list[bytes]:
    return [f[H:] for f in frags]


@pytest.mark.parametrize("ec_type", CODES)
@pytest.mark.parametrize("k,m", [(4, 2), (2, 1), (3, 2), (6, 3), (8, 3), (10, 4)])
def test_every_loss_the_policy_survives_is_rebuilt_as_pyeclib_made_it(ec_type: str, k: int,
                                                                     m: int) -> None:
    seg = random.Random(k * 31 + m).randbytes(k * 1000 + 13)    # the last fragment padded
    frags = codec.encode(k, m, ec_type, seg)
    size = len(frags[0]) - H
    want = _payloads(frags)
    assert ecdirect.usable(k, m, ec_type)
    for lost_n in range(1, m + 1):
        for lost in itertools.combinations(range(k + m), lost_n):
            sources = {i: (frags[i], H) for i in range(k + m) if i not in lost}
            out = {i: bytearray(size) for i in lost}
            ok = ecdirect.rebuild(k, m, ec_type, size, sources, {i: (b, 0) for i, b in out.items()})
            if not ok:   # only where ISA-L's Vandermonde matrix is singular for these
                assert ec_type == "isa_l_rs_vand" and m >= 4, (k, m, lost)
                continue
            assert {i: bytes(b) for i, b in out.items()} == {i: want[i] for i in lost}, lost


def test_large_payloads_in_place_in_one_buffer() -> None:
    """A 4 MiB segment: the data payloads laid end to end in one bytearray (as a
    SegmentBuffer holds them), two of them rebuilt in their slots from the other two and
    the parity payloads; the buffer is free to be cut afterwards (no view left on it)."""
    k, m = 4, 2
    seg = random.Random(5).randbytes((4 << 20) - 5)
    frags = codec.encode(k, m, "isa_l_rs_vand", seg)
    p = len(frags[0]) - H
    buf = bytearray(k * p)
    for i in (1, 3):
        buf[i * p:(i + 1) * p] = frags[i][H:]
    sources = {1: (buf, p), 3: (buf, 3 * p), 4: (bytearray(frags[4]), H), 5: (frags[5], H)}
    assert ecdirect.rebuild(k, m, "isa_l_rs_vand", p, sources, {0: (buf, 0), 2: (buf, 2 * p)})
    del buf[len(seg):]
    assert buf == seg


def test_it_steps_aside_and_writes_nothing_where_it_cannot() -> None:
    k, m, ec = 4, 2, "isa_l_rs_vand"
    frags = codec.encode(k, m, ec, random.Random(2).randbytes(40_000))
    p = len(frags[0]) - H
    src = {i: (frags[i], H) for i in (2, 3, 4, 5)}

    def attempt(sources: dict[int, Any], targets: dict[int, Any], ec_type: str = ec) -> bool:
        return ecdirect.rebuild(k, m, ec_type, p, sources, targets)

    out = bytearray(b"\xaa" * p)
    assert not attempt({i: src[i] for i in (2, 3, 4)}, {0: (out, 0)})          # 3 of 4
    assert not attempt(src, {0: (bytearray(p - 1), 0)})                         # target short
    assert not attempt({**src, 2: (frags[2][:-1], H)}, {0: (out, 0)})           # source short
    assert not attempt(src, {0: (bytes(p), 0)})                                 # read-only
    assert not attempt(src, {2: (out, 0)})                                      # one of the sources
    assert not attempt(src, {0: (out, 0)}, "isa_l_rs_vand_inv")                 # not ours
    assert not attempt(src, {0: (out, 0)}, "liberasurecode_rs_vand")
    assert out == b"\xaa" * p
    assert attempt(src, {0: (out, 0)}) and out == frags[0][H:]


def test_a_matrix_pyeclib_does_not_use_is_refused() -> None:
    """The self-check compares ISA-L's parity with pyeclib's: the Cauchy matrix given for
    the Vandermonde code fails it (so a pyeclib that changed its matrix would too)."""
    lib = ecdirect._lib()
    import ctypes
    a = (ctypes.c_ubyte * (6 * 4))()
    lib.gf_gen_cauchy1_matrix(a, 6, 4)
    assert not ecdirect._agrees_with_pyeclib(4, 2, "isa_l_rs_vand", bytes(a))
    lib.gf_gen_rs_matrix(a, 6, 4)
    assert ecdirect._agrees_with_pyeclib(4, 2, "isa_l_rs_vand", bytes(a))


def _place(buf: codec.SegmentBuffer, slot: int, frag: bytes) -> None:
    assert buf.place(slot, frag)


@pytest.mark.parametrize("direct", ["1", "0"])
def test_segment_buffer_and_decode_use_it_and_fall_back(monkeypatch: pytest.MonkeyPatch,
                                                        direct: str) -> None:
    """A degraded segment read in place is rebuilt without pyeclib's reconstruct; with
    ECSTORE_EC_DIRECT=0 through it, the same bytes either way. decode() likewise."""
    monkeypatch.setenv(ecdirect.ENV, direct)
    calls = []
    drv = codec.driver(4, 2, "isa_l_rs_vand")
    real = drv.reconstruct

    def counted(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(drv, "reconstruct", counted)
    seg = random.Random(11).randbytes(3_000_001)
    frags = codec.encode(4, 2, "isa_l_rs_vand", seg)
    buf = codec.SegmentBuffer(4)
    for i in (1, 2):
        _place(buf, i, frags[i])
    got = buf.rebuild(2, "isa_l_rs_vand", [1, 2], {4: bytearray(frags[4]), 5: bytearray(frags[5])})
    assert got is not None and got == seg
    assert bytes(codec.decode(4, 2, "isa_l_rs_vand", [frags[5], frags[3], frags[4], frags[1]])) == seg
    assert len(calls) == (0 if direct == "1" else 2)


def test_a_fragment_read_apart_of_another_shape_goes_to_pyeclib(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parity fragment whose header names another index, or of another length, is not
    used in place: rebuild says None (damaged) or pyeclib decides - never wrong bytes."""
    seg = random.Random(12).randbytes(500_000)
    frags = codec.encode(4, 2, "isa_l_rs_vand", seg)
    buf = codec.SegmentBuffer(4)
    for i in (0, 1):
        _place(buf, i, frags[i])
    before = ecdirect.stats["rebuilds"]
    swapped = buf.rebuild(2, "isa_l_rs_vand", [0, 1], {4: frags[5], 5: frags[4]})
    assert swapped is not None and bytes(swapped) == seg     # pyeclib reads their headers
    assert ecdirect.stats["rebuilds"] == before                  # not rebuilt in place
    assert bytes(buf.rebuild(2, "isa_l_rs_vand", [0, 1], {4: frags[4], 5: frags[5]}) or b"") == seg
    assert ecdirect.stats["rebuilds"] == before + 1


def test_the_headers_rebuilt_in_place_are_pyeclibs() -> None:
    """A rebuilt slot's header is the one pyeclib made for that fragment (its index and
    metadata checksum set), so its copy decodes like the original."""
    seg = random.Random(13).randbytes(2_000_000)
    frags = codec.encode(4, 2, "isa_l_rs_vand", seg)
    buf = codec.SegmentBuffer(4)
    for i in (0, 3):
        _place(buf, i, frags[i])
    assert bytes(buf.rebuild(2, "isa_l_rs_vand", [0, 3], {4: frags[4], 5: frags[5]}) or b"") == seg
    for i in range(4):
        assert buf.fragment(i) == frags[i], i
    drv = codec.driver(4, 2, "isa_l_rs_vand")
    assert drv.decode([buf.fragment(1), buf.fragment(2), frags[4], frags[5]]) == seg


def test_fragments_of_two_segments_are_never_rebuilt_into_one() -> None:
    """Parity of another segment whose payloads are as long (a different data size,
    the last segment of another object): not rebuilt from - rebuild says None and decode
    raises Corrupt (pyeclib's reconstruct made wrong bytes of it)."""
    a = random.Random(14).randbytes(40_000)
    b = random.Random(15).randbytes(39_997)
    fa, fb = codec.encode(4, 2, "isa_l_rs_vand", a), codec.encode(4, 2, "isa_l_rs_vand", b)
    assert len(fa[0]) == len(fb[0])
    buf = codec.SegmentBuffer(4)
    for i in (0, 1):
        _place(buf, i, fa[i])
    assert buf.rebuild(2, "isa_l_rs_vand", [0, 1], {4: fb[4], 5: fb[5]}) is None
    with pytest.raises(codec.Corrupt):
        codec.decode(4, 2, "isa_l_rs_vand", [fa[0], fa[1], fb[4], fb[5]])
    assert bytes(codec.decode(4, 2, "isa_l_rs_vand", [fa[0], fa[1], fa[4], fa[5]])) == a


def test_a_code_that_fails_the_self_check_goes_to_pyeclib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ecdirect, "_agrees_with_pyeclib", lambda *a: False)
    ecdirect._matrix.cache_clear()
    try:
        assert not ecdirect.usable(4, 2, "isa_l_rs_vand")
        seg = random.Random(16).randbytes(300_000)
        frags = codec.encode(4, 2, "isa_l_rs_vand", seg)
        before = ecdirect.stats["rebuilds"]
        buf = codec.SegmentBuffer(4)
        for i in (2, 3):
            _place(buf, i, frags[i])
        assert bytes(buf.rebuild(2, "isa_l_rs_vand", [2, 3], {4: frags[4], 5: frags[5]}) or b"") == seg
        assert ecdirect.stats["rebuilds"] == before
    finally:
        monkeypatch.undo()
        ecdirect._matrix.cache_clear()
    assert ecdirect.usable(4, 2, "isa_l_rs_vand")


def test_read_only_views_and_oversized_lengths_are_refused() -> None:
    k, m, ec = 4, 2, "isa_l_rs_vand"
    frags = codec.encode(k, m, ec, random.Random(17).randbytes(40_000))
    p = len(frags[0]) - H
    src = {i: (frags[i], H) for i in (2, 3, 4, 5)}
    out = bytearray(p)
    assert not ecdirect.rebuild(k, m, ec, p, src, {0: (memoryview(out).toreadonly(), 0)})
    ro = {**src, 2: (memoryview(frags[2]), H)}      # a view of bytes: read-only, refused
    assert not ecdirect.rebuild(k, m, ec, p, ro, {0: (out, 0)})
    assert not ecdirect.rebuild(k, m, ec, 2**31, src, {0: (out, 0)})
    assert out == bytes(p)
