"""store.crc: ISA-L's CRC-32 gives zlib's values (fragments, cache files and S3 checksums
written with zlib still check), for every bytes-like type the data path hands it."""
from __future__ import annotations

import os
import zlib

import pytest

from store import crc


def test_the_fast_crc_is_in_use() -> None:
    assert crc.FAST, "isal is a dependency: store.crc fell back to zlib"
    assert crc.crc32 is not zlib.crc32


@pytest.mark.parametrize("size", [0, 1, 7, 4096, 256 * 1024 + 3])
def test_values_match_zlib(size: int) -> None:
    data = os.urandom(size)
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(bytearray(data)) == zlib.crc32(data)
    assert crc.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])
    half = size // 2     # running over pieces, as RunningChecksum does
    assert crc.crc32(data[half:], crc.crc32(data[:half])) == zlib.crc32(data)
