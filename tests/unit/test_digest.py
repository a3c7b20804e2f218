"""store.digest: BLAKE3 for what is written now, SHA-256 still checked for what was."""
from __future__ import annotations

import hashlib
import os

import pytest
from blake3 import blake3

from store.digest import EMPTY, PREFIX, digest, matches, well_formed


def test_digest_is_prefixed_blake3() -> None:
    data = os.urandom(300_000)
    assert digest(data) == "b3:" + blake3(data).hexdigest()
    assert digest(b"") == EMPTY == PREFIX + blake3(b"").hexdigest()
    assert well_formed(digest(data))


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_any_bytes_like_object_hashes_alike(kind: type) -> None:
    data = os.urandom(5000)
    assert digest(kind(data)) == digest(data)
    assert matches(kind(data), digest(data))


def test_legacy_sha256_values_still_match() -> None:
    data = os.urandom(70_000)
    legacy = hashlib.sha256(data).hexdigest()
    assert well_formed(legacy)
    assert matches(data, legacy)
    assert not matches(data[:-1], legacy)


def test_a_flipped_bit_fails_either_form() -> None:
    data = bytearray(os.urandom(4096))
    new, old = digest(data), hashlib.sha256(data).hexdigest()
    data[100] ^= 1
    assert not matches(data, new)
    assert not matches(data, old)


@pytest.mark.parametrize("value", [
    None, "", "b3:", "b3:" + "0" * 63, "b3:" + "G" * 64, "B3:" + "0" * 64,
    "0" * 63, "0" * 65, "A" * 64, "sha256:" + "0" * 64, "b3:" + "0" * 64 + "\n",
])
def test_malformed_values_never_match(value: str | None) -> None:
    assert not matches(b"x", value)
    if value is not None:
        assert not well_formed(value)


def test_a_blake3_value_is_not_taken_for_sha256_of_the_same_bytes() -> None:
    data = b"same bytes"
    assert not matches(data, PREFIX + hashlib.sha256(data).hexdigest())
    assert not matches(data, blake3(data).hexdigest())   # unprefixed: read as SHA-256
