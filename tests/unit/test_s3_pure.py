"""Pure pieces of the S3 gateway and multipart: extents, ranges, conditions, part checks."""
from __future__ import annotations

import base64
import hashlib
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.gateway import request_target, split_path
from node.s3.buckets import resume_after, token_decode, token_encode
from node.s3.errors import S3Error
from node.s3.objects import check_conditions, copy_source, parse_range, part_bounds
from node.s3.uploads import copy_source_range
from node.s3.xml import escape, parse
from store.listing import PAST_PREFIX
from store.multipart import MIN_PART_BYTES, PartError, check_complete, multipart_etag
from store.striping import Extent, extent_slices, record_extents

SEG = 100
SECRET = "s" * 32


def multipart_record(sizes: list[int]) -> dict[str, object]:
    parts = [{"version_id": f"v{i}", "size": s, "segments": -(-s // SEG), "handoffs": {}}
             for i, s in enumerate(sizes)]
    return {"version_id": "obj", "size": sum(sizes), "parts": parts, "inline": None}


@given(st.lists(st.integers(0, 450), min_size=1, max_size=6), st.data())
def test_extent_slices_cover_exactly_the_range(sizes: list[int], data: st.DataObject) -> None:
    rec = multipart_record(sizes)
    total = sum(sizes)
    lo = data.draw(st.integers(0, total))
    hi = data.draw(st.integers(lo, total))
    exts = record_extents(rec)
    # a naive reference: every byte of the object named by (extent, offset in extent)
    want = [(e.version_id, i - e.offset) for e in exts for i in range(e.offset, e.offset + e.size)][lo:hi]
    got = [(e.version_id, s.index * SEG + j) for e, s in extent_slices(exts, SEG, lo, hi)
           for j in range(s.start, s.stop)]
    assert got == want


def test_plain_record_is_one_extent_and_inline_has_none() -> None:
    rec = {"version_id": "v", "size": 250, "segments": 3, "handoffs": {"1.2": "s4"}, "inline": None}
    assert record_extents(rec) == [Extent("v", 0, 250, 3, {"1.2": "s4"})]
    assert record_extents({"version_id": "v", "size": 3, "inline": b"abc"}) == []


def test_multipart_etag_is_md5_of_part_md5s() -> None:
    md5s = [hashlib.md5(b"a").hexdigest(), hashlib.md5(b"b").hexdigest()]
    want = hashlib.md5(hashlib.md5(b"a").digest() + hashlib.md5(b"b").digest()).hexdigest()
    assert multipart_etag(md5s) == f"{want}-2"


def part(size: int, etag: str = "e") -> dict[str, object]:
    return {"size": size, "etag": etag}


@pytest.mark.parametrize("requested, parts, code", [
    ([(2, "e"), (1, "e")], {1: part(MIN_PART_BYTES), 2: part(1)}, "InvalidPartOrder"),
    ([(1, "e"), (1, "e")], {1: part(MIN_PART_BYTES)}, "InvalidPartOrder"),
    ([(1, "x")], {1: part(10)}, "InvalidPart"),
    ([(1, "e"), (3, "e")], {1: part(MIN_PART_BYTES)}, "InvalidPart"),
    ([(1, "e"), (2, "e")], {1: part(MIN_PART_BYTES - 1), 2: part(1)}, "EntityTooSmall"),
    ([], {}, "MalformedXML"),
])
def test_complete_rejects_what_s3_rejects(requested: list[tuple[int, str]],
                                          parts: dict[int, dict[str, object]], code: str) -> None:
    with pytest.raises(PartError) as exc:
        check_complete(requested, parts)  # type: ignore[arg-type]
    assert exc.value.s3_code == code


def test_complete_accepts_small_last_part_and_quoted_etags() -> None:
    check_complete([(1, '"e"'), (5, "E")], {1: part(MIN_PART_BYTES), 5: part(1)})  # type: ignore[dict-item]


@pytest.mark.parametrize("header, size, want", [
    ("bytes=0-9", 100, (0, 10)), ("bytes=90-", 100, (90, 100)), ("bytes=-10", 100, (90, 100)),
    ("bytes=-500", 100, (0, 100)), ("bytes=5-500", 100, (5, 100)),
    (None, 100, None), ("bytes=0-1,5-6", 100, None), ("items=0-1", 100, None),
    ("bytes=9-2", 100, None), ("bytes=-", 100, None),
])
def test_parse_range(header: str | None, size: int, want: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == want


@pytest.mark.parametrize("header, size", [("bytes=100-", 100), ("bytes=0-0", 0), ("bytes=-0", 100)])
def test_unsatisfiable_range_is_416_with_content_range(header: str, size: int) -> None:
    with pytest.raises(S3Error) as exc:
        parse_range(header, size)
    assert (exc.value.code, exc.value.status) == ("InvalidRange", 416)
    assert exc.value.headers["Content-Range"] == f"bytes */{size}"


REC = {"etag": "abc", "ts": 1_700_000_000 * 10**9, "version_id": "v"}
BEFORE, AFTER = "Mon, 13 Nov 2023 00:00:00 GMT", "Thu, 16 Nov 2023 00:00:00 GMT"


@pytest.mark.parametrize("headers, want", [
    ({}, None), ({"If-Match": '"abc"'}, None), ({"If-Match": '"zzz"'}, 412),
    ({"If-Match": "*"}, None), ({"If-None-Match": '"abc"'}, 304), ({"If-None-Match": '"z"'}, None),
    ({"If-Modified-Since": AFTER}, 304), ({"If-Modified-Since": BEFORE}, None),
    ({"If-Unmodified-Since": BEFORE}, 412), ({"If-Unmodified-Since": AFTER}, None),
    # S3's combinations: If-Match true wins over If-Unmodified-Since false ...
    ({"If-Match": '"abc"', "If-Unmodified-Since": BEFORE}, None),
    # ... and If-None-Match false with If-Modified-Since true still answers 304
    ({"If-None-Match": '"z"', "If-Modified-Since": AFTER}, None),
    ({"If-Modified-Since": "not a date"}, None),
])
def test_conditions_as_s3_answers_them(headers: dict[str, str], want: int | None) -> None:
    assert check_conditions(headers, REC) == want


def test_copy_source_forms() -> None:
    assert copy_source("/bkt/a%20b/c") == ("bkt", "a b/c")
    assert copy_source("bkt/k?versionId=null") == ("bkt", "k")
    for bad in ("bkt", "/bkt/", "bkt/k?versionId=123"):
        with pytest.raises(S3Error):
            copy_source(bad)


def test_resume_after_skips_a_common_prefix_marker() -> None:
    assert resume_after("photos/", "", "/") == "photos/" + PAST_PREFIX
    assert resume_after("a/b/", "a/", "/") == "a/b/" + PAST_PREFIX
    assert resume_after("a/b/c", "a/", "/") == "a/b/c"
    assert resume_after("photos/", "", "") == "photos/"


def test_resume_after_a_folder_marker_key_equal_to_the_prefix_is_right_after_it() -> None:
    # "dir/" listed under prefix "dir/" is a key, not a common prefix: the keys under it follow
    assert resume_after("dir/", "dir/", "/") == "dir/"
    assert resume_after("x--", "x--", "--") == "x--"
    assert resume_after("x--", "x-", "--") == "x--"    # rest "-": shorter than the delimiter
    assert resume_after("dir/sub/", "dir/", "/") == "dir/sub/" + PAST_PREFIX


@given(st.text(max_size=200))
def test_continuation_token_round_trips(after: str) -> None:
    try:
        after.encode()
    except UnicodeEncodeError:
        return
    assert token_decode(token_encode(after, SECRET, "b1"), SECRET, "b1") == after


def test_bad_token_and_bad_xml_are_400() -> None:
    forged = base64.urlsafe_b64encode(b"foo").decode()   # base64, but not a token of ours
    other = token_encode("foo", "another cluster's secret", "b1")
    elsewhere = token_encode("foo", SECRET, "b2")   # another bucket's listing gave it
    for token in ("%%%", forged, "Zm9v", other, elsewhere, "",
                  token_encode("foo", SECRET, "b1")[:-4]):
        with pytest.raises(S3Error) as exc:
            token_decode(token, SECRET, "b1")
        assert (exc.value.code, exc.value.status) == ("InvalidArgument", 400)
    for body in (b"<Delete><Object>", b"<!DOCTYPE x [<!ENTITY a 'b'>]><Delete/>", b"<Other/>", b""):
        with pytest.raises(S3Error) as exc:
            parse(body, "Delete")
        assert exc.value.code == "MalformedXML"


def test_xml_bodies_with_a_dtd_are_refused_in_any_encoding() -> None:
    # UTF-16 passed the byte check for "<!DOCTYPE", and its entities expanded: a 1.8 MB
    # DeleteObjects body became an 81-million-character key (a security review)
    bomb = ('<?xml version="1.0" encoding="{enc}"?><!DOCTYPE d [<!ENTITY a "aaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;">]><Delete><Object><Key>&b;</Key></Object></Delete>')
    for enc in ("UTF-16", "UTF-16-LE", "UTF-16-BE", "UTF-32"):
        with pytest.raises(S3Error) as exc:     # refused, or an encoding expat does not take
            parse(bomb.format(enc=enc).encode(enc.lower()), "Delete")
        assert exc.value.code == "MalformedXML", enc
    plain = '<?xml version="1.0" encoding="UTF-16"?><Delete><Object><Key>k</Key></Object></Delete>'
    assert parse(plain.encode("utf-16"), "Delete").find("Object/Key").text == "k"  # type: ignore[union-attr]


def test_xml_escape_control_characters() -> None:
    assert escape("a&b<\x01>") == "a&amp;b&lt;&#x1;&gt;"
    for key in ("cr\rx", "crlf\r\nx", "lf\nx", "tab\tx"):    # a parser gives each back as it was
        assert ET.fromstring(f"<Key>{escape(key)}</Key>").text == key


def test_part_bounds_are_the_parts_of_a_multipart_record_and_one_part_otherwise() -> None:
    rec = multipart_record([5, 7, 3])
    assert [part_bounds(rec, n) for n in (1, 2, 3)] == [(0, 5, 3), (5, 12, 3), (12, 15, 3)]
    assert part_bounds({"size": 9, "version_id": "v"}, 1) == (0, 9, 1)
    for record, number in ((rec, 4), ({"size": 9, "version_id": "v"}, 2)):
        with pytest.raises(S3Error) as exc:
            part_bounds(record, number)
        assert (exc.value.code, exc.value.status) == ("InvalidPartNumber", 416)


def test_a_copy_source_range_is_bytes_first_last_within_the_source_or_invalid_argument() -> None:
    assert copy_source_range(None, 10) is None
    assert copy_source_range("bytes=0-9", 10) == (0, 10)
    assert copy_source_range("bytes=3-3", 10) == (3, 4)
    for bad in ("bytes=7-3", "bytes=abc", "bytes=0-1,4-5", "bytes=-3", "bytes=3-", "0-3",
                "bytes=0-10", "bytes=10-12"):
        with pytest.raises(S3Error) as exc:
            copy_source_range(bad, 10)
        assert (exc.value.code, exc.value.status) == ("InvalidArgument", 400), bad


@pytest.mark.parametrize("host,path,want", [
    # the longest domain that matches: the bucket is what comes before it
    ("data.s3.example.com", "/a/b", ("data", "a/b", True)),
    ("Data.S3.Example.COM:9000", "/a", ("data", "a", True)),
    ("my.dotted.bucket.example.com.", "/k", ("my.dotted.bucket", "k", True)),
    # a domain itself, whichever other domain it ends in: path style
    ("s3.example.com", "/bkt/k/x", ("bkt", "k/x", False)),
    ("example.com:80", "/bkt/k", ("bkt", "k", False)),
    # no Host, another host, an address: path style
    (None, "/bkt/k", ("bkt", "k", False)),
    ("127.0.0.1:9000", "/bkt/k", ("bkt", "k", False)),
    ("[::1]:9000", "/bkt", ("bkt", "", False)),
    ("other.org", "/bkt/k", ("bkt", "k", False)),
])
def test_request_target_reads_the_bucket_from_the_longest_domain(
        host: str | None, path: str, want: tuple[str, str, bool]) -> None:
    """Domains example.com and s3.example.com (in that order, as ECSTORE_S3_DOMAIN may
    list them): data.s3.example.com was bucket "data.s3" of example.com, and the S3
    endpoint s3.example.com itself bucket "s3", its path's bucket a key."""
    assert request_target(host, path, ("example.com", "s3.example.com")) == want
    assert request_target(host, path, ()) == ((*split_path(path), False))


def test_the_clusters_refusal_of_the_gateway_is_a_503_not_a_500() -> None:
    """The nodes refusing the gateway's own signed requests (a secret it does not share)
    is the service's fault: 503 ServiceUnavailable, which the gateway logs (a 500
    InternalError said nothing of it)."""
    from node.s3.errors import to_s3_error
    from store.errors import Forbidden, NotFound, Unauthorized
    for exc in (Unauthorized("signature does not match"), Forbidden("no")):
        err = to_s3_error(exc, "k")
        assert (err.code, err.status) == ("ServiceUnavailable", 503)
        assert "the cluster refused the gateway" in err.message
    assert to_s3_error(NotFound("x"), "k").status == 404
