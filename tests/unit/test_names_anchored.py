"""Names checked by a regular expression end where the string ends: `$` also matched
before a trailing newline, so a fragment id "abc\n" was stored and listed as such, and a
user "alice\n" or bucket "data\n" passed their checks (a security review)."""
from __future__ import annotations

import pytest

from node.volumes import check_fragment_id
from store.errors import BadRequest
from store.gc import _FID
from store.keys import ACCESS_KEY_RE, USER_RE
from store.names import check_bucket_name


@pytest.mark.parametrize("fid", ["abc\n", "v1.0.0\n"])
def test_a_fragment_id_with_a_trailing_newline_is_refused(fid: str) -> None:
    with pytest.raises(BadRequest):
        check_fragment_id(fid)
    assert check_fragment_id(fid[:-1]) == fid[:-1]


def test_names_and_keys_with_a_trailing_newline_do_not_match() -> None:
    with pytest.raises(BadRequest):
        check_bucket_name("data\n")
    check_bucket_name("data")
    assert not USER_RE.match("alice\n") and USER_RE.match("alice")
    assert not ACCESS_KEY_RE.match("A" * 20 + "\n") and ACCESS_KEY_RE.match("A" * 20)
    assert not _FID.match("0" * 32 + ".1.2\n") and _FID.match("0" * 32 + ".1.2")
