"""store.codec: the joined fast path of decode gives exactly pyeclib's answer, and steps
aside (to pyeclib) for anything but the k data fragments in order."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import codec

EC = "isa_l_rs_vand"


@settings(max_examples=60, deadline=None)
@given(km=st.sampled_from([(4, 2), (8, 3), (2, 1), (6, 3)]),
       size=st.one_of(st.integers(1, 5000), st.integers(60_000, 70_000),
                      st.sampled_from([1 << 20, (4 << 20) - 1, 4 << 20])),
       seed=st.integers(0, 2**32 - 1))
def test_join_equals_pyeclib(km: tuple[int, int], size: int, seed: int) -> None:
    k, m = km
    seg = random.Random(seed).randbytes(size)
    frags = codec.encode(k, m, EC, seg)
    assert codec.join_data_fragments(k, frags[:k]) == seg
    assert codec.join_data_fragments(k, frags) == seg           # extras ignored
    assert codec.driver(k, m, EC).decode(frags[:k]) == seg      # the reference agrees


def test_anything_else_goes_to_pyeclib() -> None:
    k, m = 4, 2
    seg = random.Random(1).randbytes(1_000_003)
    frags = codec.encode(k, m, EC, seg)
    assert codec.join_data_fragments(k, frags[1:k + 1]) is None          # a parity one in
    assert codec.join_data_fragments(k, [frags[1], frags[0], *frags[2:k]]) is None  # order
    assert codec.join_data_fragments(k, frags[:k - 1]) is None          # too few
    bad_magic = bytearray(frags[2])
    bad_magic[59] ^= 0xFF
    assert codec.join_data_fragments(k, [*frags[:2], bytes(bad_magic), frags[3]]) is None
    short = frags[3][:-1]                                               # truncated payload
    assert codec.join_data_fragments(k, [*frags[:3], short]) is None
    # decode still answers from any k, through pyeclib
    assert codec.decode(k, m, EC, frags[2:]) == seg
    assert codec.decode(k, m, EC, [frags[0], frags[5], frags[2], frags[4]]) == seg


def test_garbage_is_corrupt_not_a_crash() -> None:
    with pytest.raises(codec.Corrupt):
        codec.decode(4, 2, EC, [b"x" * 100] * 4)


def test_fragment_intact_checks_crc_then_sha256() -> None:
    import hashlib
    import zlib

    from store.client import fragment_intact
    from store.wire import FRAGMENT_CRC_HEADER
    body = random.Random(3).randbytes(70_000)
    sha = {"x-ecstore-checksum": hashlib.sha256(body).hexdigest()}
    crc = f"{zlib.crc32(body):08x}"
    flipped = bytearray(body)
    flipped[12_345] ^= 0x01
    assert fragment_intact((body,), {**sha, FRAGMENT_CRC_HEADER: crc})
    assert fragment_intact((body,), sha)                                   # no CRC: SHA-256
    assert not fragment_intact((bytes(flipped),), {**sha, FRAGMENT_CRC_HEADER: crc})
    assert not fragment_intact((bytes(flipped),), sha)
    # a wrong or malformed CRC does not condemn a body its SHA-256 vouches for
    assert fragment_intact((body,), {**sha, FRAGMENT_CRC_HEADER: "00000000" if crc != "00000000" else "1"})
    assert fragment_intact((body,), {**sha, FRAGMENT_CRC_HEADER: "zzzzzzzz"})
    # and a matching CRC is enough on its own (the fast path never hashes)
    assert fragment_intact((body,), {"x-ecstore-checksum": "0" * 64, FRAGMENT_CRC_HEADER: crc})
    assert not fragment_intact((body[:-1],), {**sha, FRAGMENT_CRC_HEADER: crc})
    # a body read in pieces (a header apart, the payload into a segment) checks the same
    cut = (body[:80], memoryview(body)[80:])
    assert fragment_intact(cut, {**sha, FRAGMENT_CRC_HEADER: crc})
    assert fragment_intact(cut, sha)
    assert not fragment_intact((bytes(flipped[:80]), bytes(flipped[80:])),
                               {**sha, FRAGMENT_CRC_HEADER: crc})
    assert not fragment_intact((body[:80], body[81:]), sha)


@settings(max_examples=40, deadline=None)
@given(km=st.sampled_from([(4, 2), (8, 3), (6, 3)]), size=st.integers(1, 300_000),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_k_fragments_decode_to_the_segment(km: tuple[int, int], size: int, seed: int,
                                               data: st.DataObject) -> None:
    """Degraded reads (parity fragments standing in, in any order) rebuild only the
    missing data fragments; the result is the segment, as pyeclib's decode gives it."""
    k, m = km
    seg = random.Random(seed).randbytes(size)
    frags = codec.encode(k, m, EC, seg)
    chosen = data.draw(st.permutations(range(k + m)))[:k]
    picked = [bytearray(frags[i]) if i % 2 else frags[i] for i in chosen]  # reads give bytearrays
    assert codec.decode(k, m, EC, picked) == seg


@pytest.mark.parametrize("size", [4 * 1024 * 1024, 1024 * 1024 + 13, 100])
def test_a_segment_read_in_place_is_the_segment(size: int) -> None:
    """Data fragments read into a SegmentBuffer (header apart, payload in place) give the
    segment itself, the last one's padding cut; their copies decode to the same."""
    from store.codec import HEADER_BYTES, SegmentBuffer, decode, encode
    seg = random.Random(size).randbytes(size)
    frags = encode(4, 2, EC, seg)
    buf = SegmentBuffer(4)
    for i in (2, 0, 3, 1):                      # in any order, as they arrive
        views = buf.sink(i)(200, len(frags[i]))
        assert views is not None and sum(len(v) for v in views) == len(frags[i])
        pos = 0
        for v in views:
            v[:] = frags[i][pos:pos + len(v)]
            pos += len(v)
        assert b"".join(bytes(p) for p in buf.pieces(i)) == frags[i]
        assert buf.fragment(i) == frags[i]
    assert buf.sink(0)(404, len(frags[0])) is None                  # only a 200
    assert buf.sink(0)(200, len(frags[0]) + 1) is None              # only the same length
    assert buf.sink(0)(200, HEADER_BYTES) is None                   # a header alone is not one
    copies = [buf.fragment(i) for i in range(4)]
    got = buf.segment()
    assert got is not None and bytes(got) == seg
    assert decode(4, 2, EC, copies) == seg


def test_a_segment_buffer_with_a_wrong_header_is_not_a_segment() -> None:
    from store.codec import SegmentBuffer, encode
    seg = random.Random(5).randbytes(50_000)
    frags = encode(4, 2, EC, seg)
    for order in ([0, 1, 2, 4], [0, 1, 2, 2]):  # a parity fragment, a duplicate in slot 3
        buf = SegmentBuffer(4)
        for slot, i in enumerate(order):
            assert buf.place(slot, frags[i])
        assert buf.segment() is None


def _place(buf: codec.SegmentBuffer, slot: int, frag: bytes) -> None:
    assert buf.place(slot, frag)


@pytest.mark.parametrize("size", [4 * 1024 * 1024, 1024 * 1024 + 13, 100])
@pytest.mark.parametrize("lost", [(1,), (0, 3), (2, 3)])
def test_a_degraded_segment_is_rebuilt_in_place(size: int, lost: tuple[int, ...]) -> None:
    """Data fragments lost: the ones read in place and parity read apart rebuild the
    missing payloads into their slots - the segment, with no join."""
    seg = random.Random(size + len(lost)).randbytes(size)
    frags = codec.encode(4, 2, EC, seg)
    buf = codec.SegmentBuffer(4)
    placed = [i for i in range(4) if i not in lost]
    for i in placed:
        _place(buf, i, frags[i])
    others = {4 + j: frags[4 + j] for j in range(len(lost))}
    got = buf.rebuild(2, EC, placed, others)
    assert got is not None and bytes(got) == seg


def test_a_rebuild_that_cannot_work_says_so() -> None:
    seg = random.Random(9).randbytes(300_000)
    frags = codec.encode(4, 2, EC, seg)
    buf = codec.SegmentBuffer(4)
    assert buf.rebuild(2, EC, [], {4: frags[4], 5: frags[5]}) is None   # nothing placed
    for i in (0, 1):
        _place(buf, i, frags[i])
    assert buf.rebuild(2, EC, [0, 1], {4: frags[4]}) is None            # 3 of 4 needed
    assert buf.rebuild(2, EC, [0, 1], {2: frags[2], 4: frags[4]}) is None   # a data one apart
    assert buf.rebuild(2, EC, [0, 1], {4: frags[4], 5: frags[5][:-7]}) is None   # damaged
    assert bytes(buf.rebuild(2, EC, [0, 1], {4: frags[4], 5: frags[5]}) or b"") == seg
