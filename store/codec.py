"""The pyeclib codec, one driver per (k, m, ec_type)."""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from pyeclib.ec_iface import ECDriver

from store import ecdirect
from store.alloc import unfilled
from store.crc import crc32
from store.errors import Corrupt

# liberasurecode's fragment header (fragment_header_t, packed, little-endian): idx u32,
# size u32, backend metadata size u32, original data size u64, ... magic u32 at 59;
# 80 bytes in all, then `size` bytes of payload. The codes we use are systematic: data
# fragment i carries bytes [i*size, (i+1)*size) of the segment.
HEADER_BYTES = 80
FRAGMENT_MAGIC = 0xB0C5ECC
_META = struct.Struct("<IIIQ")
_MAGIC = struct.Struct("<I")
_MAGIC_AT = 59
_METADATA_CHKSUM_AT = 67


@lru_cache(maxsize=32)
def driver(k: int, m: int, ec_type: str) -> ECDriver:
    return ECDriver(k=k, m=m, ec_type=ec_type)


def encode(k: int, m: int, ec_type: str, segment: bytes | memoryview) -> list[bytes]:
    """k+m fragments of one segment; fragment i is at list index i."""
    return driver(k, m, ec_type).encode(bytes(segment) if isinstance(segment, memoryview) else segment)


def decode(k: int, m: int, ec_type: str, fragments: Sequence[bytes | bytearray]) -> bytes | bytearray:
    """The segment from any k fragments (more are ignored).

    When the first k given are the k data fragments in order (every healthy read), the
    segment is their payloads joined: one copy, ~25x faster than pyeclib's decode, which
    copies the payloads several times (~1 ms per MiB). Anything else goes to pyeclib."""
    joined = join_data_fragments(k, fragments)
    if joined is not None:
        return joined
    rebuilt = _rebuild_data(k, m, ec_type, fragments)
    if rebuilt is not None:
        return rebuilt
    try:
        return driver(k, m, ec_type).decode(_as_bytes(fragments))
    except Exception as exc:  # pyeclib raises its own ECDriverError family
        raise Corrupt(f"decode failed: {exc}") from None


def _rebuild_data(k: int, m: int, ec_type: str, fragments: Sequence[bytes | bytearray]) -> bytes | bytearray | None:
    """A degraded read: only the missing data fragments rebuilt, into place in a segment
    buffer the data fragments at hand are copied into (store.ecdirect; pyeclib's
    reconstruct and a join where it cannot) - less work than a full decode, which copies
    the whole segment out of every fragment. None: let decode do it."""
    by_idx: dict[int, bytes | bytearray] = {}
    for frag in fragments:
        if len(frag) < HEADER_BYTES or _MAGIC.unpack_from(frag, _MAGIC_AT)[0] != FRAGMENT_MAGIC:
            return None
        by_idx.setdefault(_META.unpack_from(frag, 0)[0], frag)
    missing = [i for i in range(k) if i not in by_idx]
    if not missing or len(by_idx) < k or any(i >= k + m for i in by_idx):
        return None
    if not _one_segment(by_idx.values()):
        raise Corrupt("the fragments read disagree on their segment's size: not one segment's")
    direct = _rebuild_direct(k, m, ec_type, by_idx, missing)
    if direct is not None:
        return direct
    try:
        made = driver(k, m, ec_type).reconstruct(_as_bytes(list(by_idx.values())[:k]), missing)
    except Exception:  # noqa: BLE001 - decode tries again and names the error
        return None
    for i, frag in zip(missing, made):
        by_idx[i] = frag
    return join_data_fragments(k, [by_idx[i] for i in range(k)])


def _rebuild_direct(k: int, m: int, ec_type: str, by_idx: dict[int, bytes | bytearray],
                    missing: list[int]) -> bytearray | None:
    """_rebuild_data through store.ecdirect: the data fragments at hand copied into the
    segment, the missing ones rebuilt there. None when the fragments do not agree on one
    segment's layout or ecdirect cannot (pyeclib then)."""
    first = by_idx[min(by_idx)]
    _, size, backend_meta, orig = _META.unpack_from(first, 0)
    if size <= 0 or not 0 < orig <= k * size or backend_meta != 0:
        return None
    for i, frag in by_idx.items():
        if len(frag) != HEADER_BYTES + size or _META.unpack_from(frag, 0) != (i, size, 0, orig):
            return None
    if not ecdirect.usable(k, m, ec_type):
        return None
    buf = unfilled(k * size)
    view = memoryview(buf)
    for i in range(k):
        if i in by_idx:
            view[i * size:(i + 1) * size] = memoryview(by_idx[i])[HEADER_BYTES:]
    sources = {i: (f, HEADER_BYTES) for i, f in by_idx.items()}
    if not ecdirect.rebuild(k, m, ec_type, size, sources, {i: (buf, i * size) for i in missing}):
        return None
    view.release()
    del buf[orig:]
    return buf


def _one_segment(heads: Iterable[bytes | bytearray]) -> bool:
    """Whether these fragment headers agree on their segment's payload and data sizes, as
    every fragment of one segment does (pyeclib's reconstruct would rebuild wrong bytes
    from fragments of two segments whose payloads happen to be of one size)."""
    return len({_META.unpack_from(h, 0)[1::2] for h in heads if len(h) >= HEADER_BYTES}) <= 1


def _as_bytes(fragments: Sequence[bytes | bytearray]) -> list[bytes]:
    """pyeclib takes bytes only (fragment reads give bytearrays)."""
    return [f if type(f) is bytes else bytes(f) for f in fragments]


def join_data_fragments(k: int, fragments: Sequence[bytes | bytearray]) -> bytes | None:
    """The segment from data fragments 0..k-1 (fragments[i] must be fragment i), or None
    if they are not exactly that with consistent headers (the caller decodes instead).
    The fragments' integrity is not checked here: readers verify their checksums first."""
    if len(fragments) < k:
        return None
    layout = data_layout(k, fragments, [len(f) - HEADER_BYTES for f in fragments[:k]])
    if layout is None:
        return None
    size, orig = layout
    pieces: list[memoryview] = []
    left = orig
    for i in range(k):
        n = min(size, left)
        pieces.append(memoryview(fragments[i])[HEADER_BYTES:HEADER_BYTES + n])
        left -= n
    return b"".join(pieces)


def data_layout(k: int, heads: Sequence[bytes | bytearray | memoryview],
                payloads: Sequence[int]) -> tuple[int, int] | None:
    """(payload size, segment size) if heads[0..k-1] are the headers of data fragments
    0..k-1 of one segment, each followed by at least its payload (payloads[i] bytes
    there), else None."""
    size = orig = -1
    for i in range(k):
        head = heads[i]
        if len(head) < HEADER_BYTES or _MAGIC.unpack_from(head, _MAGIC_AT)[0] != FRAGMENT_MAGIC:
            return None
        idx, fsize, backend_meta, forig = _META.unpack_from(head, 0)
        if i == 0:
            size, orig = fsize, forig
            if size <= 0 or not 0 < orig <= k * size:
                return None
        if idx != i or fsize != size or forig != orig or backend_meta != 0 \
                or payloads[i] < size:
            return None
    return size, orig


class SegmentBuffer:
    """A segment's k data fragments read in place: each fragment's header into a small
    buffer of its own, its payload straight into the segment at i x payload - so a healthy
    read needs no join (a copy of every byte read, 13-18% of a reader's CPU per byte).

    `sink(i)` is the store.fetch.Sink for data fragment i: it takes a 200 whose length is
    a header plus the payload length of the first one taken (the segment buffer is made
    then). `pieces(i)` are fragment i's bytes as read (for its checksum), `fragment(i)`
    a copy of them whole (for a degraded decode), `segment()` the segment itself."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.payload = 0
        self.buf: bytearray | None = None
        self.heads = [bytearray(HEADER_BYTES) for _ in range(k)]

    def sink(self, i: int) -> Callable[[int, int], list[memoryview] | None]:
        def take(status: int, length: int) -> list[memoryview] | None:
            payload = length - HEADER_BYTES
            if status != 200 or payload <= 0:
                return None
            if self.buf is None:
                self.payload, self.buf = payload, unfilled(self.k * payload)
            elif payload != self.payload:
                return None
            return list(self.pieces(i))
        return take

    def pieces(self, i: int) -> tuple[memoryview, memoryview]:
        assert self.buf is not None
        p = self.payload
        return memoryview(self.heads[i]), memoryview(self.buf)[i * p:(i + 1) * p]

    def place(self, i: int, frag: bytes | bytearray) -> bool:
        """Put a whole fragment held in memory into data slot i, as a read into it would
        (benchmarks and tests); False if the slot does not take it."""
        views = self.sink(i)(200, len(frag))
        if views is None:
            return False
        pos = 0
        for v in views:
            v[:] = memoryview(frag)[pos:pos + len(v)]
            pos += len(v)
        return True

    def fragment(self, i: int) -> bytes:
        head, body = self.pieces(i)
        with head, body:
            return b"".join((head, body))   # one copy

    def rebuild(self, m: int, ec_type: str, placed: Sequence[int],
                others: dict[int, bytes | bytearray]) -> bytearray | None:
        """The segment when some data fragments are missing: the data fragments read in
        place (`placed`) and whole ones read apart (`others`, parity among them; k in
        all) rebuild the missing data fragments (pyeclib's reconstruct), whose payloads
        are written into place - no join of the segment afterwards. None when that does
        not work (a fragment of another size, a failed rebuild): the caller decodes."""
        if self.buf is None or any(i < self.k for i in others) \
                or len(placed) + len(others) < self.k:
            return None
        missing = [i for i in range(self.k) if i not in placed]
        if not _one_segment([*(self.heads[i] for i in placed), *others.values()]):
            return None     # the caller's decode says Corrupt
        if self._rebuild_direct(m, ec_type, placed, others, missing):
            return self.segment()
        frags = [self.fragment(i) for i in placed] + _as_bytes(list(others.values()))
        try:
            made = driver(self.k, m, ec_type).reconstruct(frags[:self.k], missing)
        except Exception:  # noqa: BLE001 - decode tries again and names the error
            return None
        for i, frag in zip(missing, made):
            if len(frag) != HEADER_BYTES + self.payload:
                return None
            head, body = self.pieces(i)
            with head, body:
                head[:] = memoryview(frag)[:HEADER_BYTES]
                body[:] = memoryview(frag)[HEADER_BYTES:]
        return self.segment()

    def _rebuild_direct(self, m: int, ec_type: str, placed: Sequence[int],
                        others: dict[int, bytes | bytearray], missing: list[int]) -> bool:
        """rebuild() through store.ecdirect: the payloads read in place and those of the
        fragments read apart are the sources, the missing slots of the segment the
        targets; each missing header is a survivor's with its own index and metadata
        checksum - the header pyeclib would have made. False, nothing changed, when a
        fragment read apart is not of this segment's shape or ecdirect cannot (pyeclib
        then)."""
        p = self.payload
        template = bytes(self.heads[placed[0]]) if placed else None
        for i, frag in others.items():
            if len(frag) != HEADER_BYTES + p or _MAGIC.unpack_from(frag, _MAGIC_AT)[0] != FRAGMENT_MAGIC:
                return False
            idx, size, backend_meta, orig = _META.unpack_from(frag, 0)
            template = template or bytes(frag[:HEADER_BYTES])
            if idx != i or size != p or backend_meta != 0 \
                    or orig != _META.unpack_from(template, 0)[3]:
                return False
        assert self.buf is not None and template is not None
        sources: dict[int, ecdirect.Where] = {i: (self.buf, i * p) for i in placed}
        sources.update((i, (f, HEADER_BYTES)) for i, f in others.items())
        if not ecdirect.rebuild(self.k, m, ec_type, p, sources,
                                {i: (self.buf, i * p) for i in missing}):
            return False
        for i in missing:
            self.heads[i][:] = template
            _set_index(self.heads[i], i)
        return True

    def segment(self) -> bytearray | None:
        """The segment, once all k data fragments were read in (and checked); None if
        their headers do not make one (the caller decodes their copies instead)."""
        if self.buf is None:
            return None
        layout = data_layout(self.k, self.heads, [self.payload] * self.k)
        if layout is None or layout[0] != self.payload:
            return None
        buf, orig = self.buf, layout[1]
        if orig < len(buf):
            try:
                del buf[orig:]          # the last segment's padding; in place
            except BufferError:         # a view of it still held somewhere: copy
                return bytearray(memoryview(buf)[:orig])
        return buf


def _set_index(head: bytearray, idx: int) -> None:
    """A fragment header made another fragment's of the same segment: its index and
    liberasurecode's metadata checksum (CRC-32 of the 59 bytes before the magic); every
    other field is the same in each fragment of a segment."""
    struct.pack_into("<I", head, 0, idx)
    struct.pack_into("<I", head, _METADATA_CHKSUM_AT, crc32(memoryview(head)[:_MAGIC_AT]))


def reconstruct(k: int, m: int, ec_type: str, fragments: Sequence[bytes | bytearray],
                missing: list[int]) -> list[bytes]:
    try:
        return driver(k, m, ec_type).reconstruct(_as_bytes(fragments), missing)
    except Exception as exc:
        raise Corrupt(f"reconstruct failed: {exc}") from None
