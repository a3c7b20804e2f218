"""S3 listings through the gateway: ListObjectsV2 and V1 against a naive model, paginators,
url encoding, ListObjectVersions, deletes between pages, and the aws cli's s3 commands."""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, unquote_plus

import pytest
from botocore.client import BaseClient

from tests.cluster.s3_fixtures import (  # noqa: F401
    AwsCli,
    Gateway,
    aws,
    client_error,
    gateway,
    raw_request,
    s3,
    s3_cluster,
    s3_resource,
)

BUCKET = "listing"
KEYS = sorted([
    "a/1", "a/2", "a/b/1", "a/b/2", "a/b/c/d", "a/c", "a/d/", "a-sibling", "a0",
    "b", "b/x", "c/x/y/z", "c/x2", "d.txt", "e/", "e/f", "logs/2024/01/x.log",
    "logs/2024/02/y.log", "logs/2025/01/z.log", "logs/readme", "z",
] + [f"flat/{i:03d}" for i in range(25)])
ENCODED_KEYS = ["enc/a b.txt", "enc/a+b.txt", "enc/100%.csv", "enc/한글/x.txt",
                "enc/run books/x.txt", "enc/ünï & <xml>"]


def model(keys: list[str], prefix: str = "", delimiter: str = "",
          start_after: str = "") -> tuple[list[str], list[str]]:
    """The naive reference: every key and common prefix S3 lists, in order, unpaged."""
    objs: list[str] = []
    prefixes: list[str] = []
    for k in sorted(keys):
        if not k.startswith(prefix) or k <= start_after:
            continue
        cut = k.find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            objs.append(k)
        elif k[:cut + len(delimiter)] not in prefixes:
            prefixes.append(k[:cut + len(delimiter)])
    return objs, prefixes


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    for k in KEYS + ENCODED_KEYS:
        s3.put_object(Bucket=BUCKET, Key=k, Body=k.encode())
    return BUCKET


def walk_v2(s3: BaseClient, max_keys: int, **params: Any) -> tuple[list[str], list[str]]:
    objs: list[str] = []
    prefixes: list[str] = []
    token: dict[str, str] = {}
    for _ in range(1000):
        page = s3.list_objects_v2(Bucket=BUCKET, MaxKeys=max_keys, **params, **token)
        got_objs = [o["Key"] for o in page.get("Contents", [])]
        got_prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert page["KeyCount"] == len(got_objs) + len(got_prefixes) <= max_keys
        assert page["MaxKeys"] == max_keys
        objs += got_objs
        prefixes += got_prefixes
        if not page["IsTruncated"]:
            assert "NextContinuationToken" not in page
            return objs, prefixes
        token = {"ContinuationToken": page["NextContinuationToken"]}
    raise AssertionError("listing did not end")


def walk_v1(s3: BaseClient, max_keys: int, **params: Any) -> tuple[list[str], list[str]]:
    objs: list[str] = []
    prefixes: list[str] = []
    marker: dict[str, str] = {}
    for _ in range(1000):
        page = s3.list_objects(Bucket=BUCKET, MaxKeys=max_keys, **{**params, **marker})
        got_objs = [o["Key"] for o in page.get("Contents", [])]
        got_prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        assert len(got_objs) + len(got_prefixes) <= max_keys
        objs += got_objs
        prefixes += got_prefixes
        if not page["IsTruncated"]:
            return objs, prefixes
        if params.get("Delimiter"):   # S3 returns NextMarker only with a delimiter
            marker = {"Marker": page["NextMarker"]}
        else:
            marker = {"Marker": page.get("NextMarker", got_objs[-1])}
    raise AssertionError("listing did not end")


PAGINGS = [("", "", 1000), ("", "/", 4), ("a/", "/", 2), ("logs/", "/", 1), ("logs/", "", 2),
           ("flat/", "", 7), ("a", "/", 3), ("nothing-here", "/", 5), ("", "", 10),
           ("", "-", 3), ("logs/2024/", "/", 1), ("", "x/", 2), ("enc/", " ", 1)]


@pytest.mark.parametrize("prefix,delimiter,max_keys", PAGINGS)
def test_list_objects_v2_pages_match_the_model(s3: BaseClient, bucket: str, prefix: str,
                                               delimiter: str, max_keys: int) -> None:
    got = walk_v2(s3, max_keys, Prefix=prefix, Delimiter=delimiter)
    assert got == model(KEYS + ENCODED_KEYS, prefix, delimiter)


@pytest.mark.parametrize("prefix,delimiter,max_keys", PAGINGS)
def test_list_objects_v1_pages_match_the_model(s3: BaseClient, bucket: str, prefix: str,
                                               delimiter: str, max_keys: int) -> None:
    got = walk_v1(s3, max_keys, Prefix=prefix, Delimiter=delimiter)
    assert got == model(KEYS + ENCODED_KEYS, prefix, delimiter)


def test_paginators_walk_every_key(s3: BaseClient, bucket: str) -> None:
    everything = model(KEYS + ENCODED_KEYS)[0]
    v2 = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, PaginationConfig={"PageSize": 5})
    assert [o["Key"] for page in v2 for o in page.get("Contents", [])] == everything
    v1 = s3.get_paginator("list_objects").paginate(Bucket=BUCKET, PaginationConfig={"PageSize": 6})
    assert [o["Key"] for page in v1 for o in page.get("Contents", [])] == everything
    grouped = s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Delimiter="/", PaginationConfig={"PageSize": 3})
    prefixes = [p["Prefix"] for page in grouped for p in page.get("CommonPrefixes", [])]
    assert prefixes == model(KEYS + ENCODED_KEYS, "", "/")[1]


@pytest.mark.parametrize("after", ["a/b/1", "a/bb", "logs/2024/", "zz", ""])
def test_start_after_and_marker_need_not_name_a_key(s3: BaseClient, bucket: str, after: str) -> None:
    want = model(KEYS + ENCODED_KEYS, start_after=after)
    assert walk_v2(s3, 9, StartAfter=after) == want
    assert walk_v1(s3, 9, Marker=after) == want


def test_listed_entries_carry_size_etag_and_time(s3: BaseClient, bucket: str) -> None:
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix="a/b/")
    assert page["Name"] == BUCKET and page["Prefix"] == "a/b/"
    for o in page["Contents"]:
        body = o["Key"].encode()
        assert o["Size"] == len(body)
        assert o["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
        assert o["StorageClass"] == "STANDARD" and o["LastModified"].year >= 2024


def test_owner_is_listed_only_with_fetch_owner(s3: BaseClient, bucket: str) -> None:
    plain = s3.list_objects_v2(Bucket=BUCKET, Prefix="flat/")
    assert plain["KeyCount"] == 25 and all("Owner" not in o for o in plain["Contents"])
    owned = s3.list_objects_v2(Bucket=BUCKET, Prefix="flat/", FetchOwner=True)
    assert all(o["Owner"]["ID"] for o in owned["Contents"])


def test_a_page_holds_at_most_1000_keys(s3: BaseClient) -> None:
    s3.create_bucket(Bucket="thousand")
    keys = [f"t/{i:04d}" for i in range(1005)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket="thousand", Key=k, Body=b""), keys))
    for asked in ({}, {"MaxKeys": 5000}):
        first = s3.list_objects_v2(Bucket="thousand", **asked)
        assert first["KeyCount"] == 1000 and first["IsTruncated"]
        rest = s3.list_objects_v2(Bucket="thousand", ContinuationToken=first["NextContinuationToken"])
        assert [o["Key"] for o in first["Contents"] + rest["Contents"]] == keys and not rest["IsTruncated"]
        v1 = s3.list_objects(Bucket="thousand", **asked)
        assert len(v1["Contents"]) == 1000 and v1["IsTruncated"]
        versions = s3.list_object_versions(Bucket="thousand", **asked)
        assert len(versions["Versions"]) == 1000 and versions["IsTruncated"]


# ---- url encoding ------------------------------------------------------------------------
def test_boto3_default_listing_returns_the_exact_keys(s3: BaseClient, bucket: str) -> None:
    # boto3 asks for encoding-type=url by itself and decodes the answer
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="enc/")["Contents"]] == sorted(ENCODED_KEYS)
    assert [o["Key"] for o in s3.list_objects(Bucket=BUCKET, Prefix="enc/")["Contents"]] == sorted(ENCODED_KEYS)
    versions = s3.list_object_versions(Bucket=BUCKET, Prefix="enc/")["Versions"]
    assert [v["Key"] for v in versions] == sorted(ENCODED_KEYS)
    grouped = s3.list_objects_v2(Bucket=BUCKET, Prefix="enc/", Delimiter="/")
    assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == ["enc/run books/", "enc/한글/"]


@pytest.mark.parametrize("call", ["list_objects_v2", "list_objects"])
def test_encoding_type_url_encodes_keys_and_prefixes(s3: BaseClient, bucket: str, call: str) -> None:
    # Asked for explicitly, botocore leaves the answer as it came: S3 form-encodes
    # ("a b" -> "a+b", "+" -> "%2B"), so unquote_plus must give the key back.
    page = getattr(s3, call)(Bucket=BUCKET, Prefix="enc/", Delimiter="/", EncodingType="url")
    assert page["EncodingType"] == "url"
    raw_keys = [o["Key"] for o in page["Contents"]]
    raw_prefixes = [p["Prefix"] for p in page["CommonPrefixes"]]
    for raw in raw_keys + raw_prefixes:
        assert raw.isascii() and not set(raw) & set(" <&"), raw
    assert [unquote_plus(k) for k in raw_keys] == sorted(k for k in ENCODED_KEYS if "/" not in k[4:])
    assert [unquote_plus(p) for p in raw_prefixes] == ["enc/run books/", "enc/한글/"]
    assert unquote_plus(page["Prefix"]) == "enc/"


def test_without_encoding_type_keys_are_plain_xml_text(gateway: Gateway, bucket: str) -> None:
    resp = raw_request(gateway, "GET", f"/{BUCKET}", f"list-type=2&prefix={quote('enc/', safe='')}")
    assert resp.status == 200
    ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
    root = ET.fromstring(resp.body)
    keys = [e.text for e in root.findall("s3:Contents/s3:Key", ns)] or \
        [e.text for e in root.findall("Contents/Key")]
    assert keys == sorted(ENCODED_KEYS)


# ---- versions in an unversioned bucket ---------------------------------------------------
def test_list_object_versions_shows_version_null_latest(s3: BaseClient, bucket: str) -> None:
    page = s3.list_object_versions(Bucket=BUCKET, Prefix="a/b/")
    assert [v["Key"] for v in page["Versions"]] == ["a/b/1", "a/b/2", "a/b/c/d"]
    for v in page["Versions"]:
        assert v["VersionId"] == "null" and v["IsLatest"] is True
        assert v["Size"] == len(v["Key"]) and v["ETag"] == f'"{hashlib.md5(v["Key"].encode()).hexdigest()}"'
    assert page.get("DeleteMarkers", []) == []
    grouped = s3.list_object_versions(Bucket=BUCKET, Delimiter="/")
    assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == model(KEYS + ENCODED_KEYS, "", "/")[1]
    assert [v["Key"] for v in grouped["Versions"]] == model(KEYS + ENCODED_KEYS, "", "/")[0]


def test_list_object_versions_pages_with_key_marker(s3: BaseClient, bucket: str) -> None:
    keys: list[str] = []
    pages = s3.get_paginator("list_object_versions").paginate(
        Bucket=BUCKET, Prefix="flat/", PaginationConfig={"PageSize": 4})
    for page in pages:
        keys += [v["Key"] for v in page.get("Versions", [])]
    assert keys == [f"flat/{i:03d}" for i in range(25)]


def test_version_null_reads_the_object(s3: BaseClient, bucket: str) -> None:
    assert s3.get_object(Bucket=BUCKET, Key="d.txt", VersionId="null")["Body"].read() == b"d.txt"
    assert s3.head_object(Bucket=BUCKET, Key="d.txt", VersionId="null")["ContentLength"] == 5


def test_a_bucket_emptied_through_object_versions_can_be_deleted(s3: BaseClient, s3_resource: Any) -> None:
    s3.create_bucket(Bucket="emptied")
    for i in range(30):
        s3.put_object(Bucket="emptied", Key=f"dir{i % 3}/obj {i}", Body=b"x" * i)
    s3.delete_object(Bucket="emptied", Key="dir0/obj 0")   # no delete marker while unversioned
    b = s3_resource.Bucket("emptied")
    b.object_versions.delete()
    assert s3.list_object_versions(Bucket="emptied").get("Versions", []) == []
    assert s3.list_objects_v2(Bucket="emptied")["KeyCount"] == 0
    b.delete()
    assert client_error(lambda: s3.head_bucket(Bucket="emptied")) == ("404", 404)


def test_a_bucket_emptied_through_objects_all_can_be_deleted(s3: BaseClient, s3_resource: Any) -> None:
    s3.create_bucket(Bucket="emptied-too")
    for i in range(12):
        s3.put_object(Bucket="emptied-too", Key=f"k{i}", Body=b"y")
    b = s3_resource.Bucket("emptied-too")
    b.objects.all().delete()
    b.delete()
    assert "emptied-too" not in [x["Name"] for x in s3.list_buckets()["Buckets"]]


# ---- deletes between pages ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["v2-token", "v2-start-after", "v1-marker", "versions-key-marker"])
def test_listing_continues_when_the_marker_key_was_deleted(s3: BaseClient, how: str) -> None:
    name = f"marker-{how}"
    s3.create_bucket(Bucket=name)
    keys = [f"m/{i:03d}" for i in range(20)]
    for k in keys:
        s3.put_object(Bucket=name, Key=k, Body=b"m")
    if how.startswith("v2"):
        first = s3.list_objects_v2(Bucket=name, MaxKeys=5)
    elif how == "v1-marker":
        first = s3.list_objects(Bucket=name, MaxKeys=5)
    else:
        first = s3.list_object_versions(Bucket=name, MaxKeys=5)
    entries = first.get("Contents") or first.get("Versions")
    seen = [o["Key"] for o in entries]
    assert seen == keys[:5] and first["IsTruncated"]
    # the key the marker names, and the one after it, go away between the pages
    s3.delete_objects(Bucket=name, Delete={"Objects": [{"Key": keys[4]}, {"Key": keys[5]}]})
    rest: list[str] = []
    if how == "v2-token":
        rest = [o["Key"] for o in s3.list_objects_v2(
            Bucket=name, ContinuationToken=first["NextContinuationToken"]).get("Contents", [])]
    elif how == "v2-start-after":
        rest = [o["Key"] for o in s3.list_objects_v2(Bucket=name, StartAfter=seen[-1]).get("Contents", [])]
    elif how == "v1-marker":
        rest = [o["Key"] for o in s3.list_objects(Bucket=name, Marker=seen[-1]).get("Contents", [])]
    else:
        page = s3.list_object_versions(Bucket=name, KeyMarker=first["NextKeyMarker"],
                                       VersionIdMarker=first["NextVersionIdMarker"])
        rest = [v["Key"] for v in page.get("Versions", [])]
    assert rest == keys[6:]


def test_a_key_added_after_the_marker_between_pages_is_listed(s3: BaseClient) -> None:
    s3.create_bucket(Bucket="grows")
    for k in ("g/a", "g/c", "g/e", "g/g"):
        s3.put_object(Bucket="grows", Key=k, Body=b"g")
    first = s3.list_objects_v2(Bucket="grows", MaxKeys=2)
    assert [o["Key"] for o in first["Contents"]] == ["g/a", "g/c"] and first["IsTruncated"]
    s3.put_object(Bucket="grows", Key="g/b", Body=b"behind the marker")
    s3.put_object(Bucket="grows", Key="g/d", Body=b"ahead of the marker")
    rest = s3.list_objects_v2(Bucket="grows", ContinuationToken=first["NextContinuationToken"])
    assert [o["Key"] for o in rest["Contents"]] == ["g/d", "g/e", "g/g"]


def test_a_forged_continuation_token_is_invalid_argument(s3: BaseClient, bucket: str) -> None:
    assert client_error(lambda: s3.list_objects_v2(Bucket=BUCKET, ContinuationToken="not-a-token!")) == (
        "InvalidArgument", 400)


# ---- the aws cli -------------------------------------------------------------------------
def test_aws_s3_ls_lists_buckets_prefixes_and_keys(aws: AwsCli, bucket: str) -> None:
    assert BUCKET in aws("s3", "ls").stdout.split()
    top = aws("s3", "ls", f"s3://{BUCKET}/").stdout.splitlines()
    assert "PRE a/" in [line.strip() for line in top]
    assert any(line.split()[-1] == "d.txt" for line in top if not line.strip().startswith("PRE"))
    logs = aws("s3", "ls", f"s3://{BUCKET}/logs/", "--recursive").stdout.splitlines()
    assert [line.split()[-1] for line in logs] == [k for k in KEYS if k.startswith("logs/")]
    spaced = aws("s3", "ls", f"s3://{BUCKET}/enc/run books/").stdout
    assert "x.txt" in spaced


def test_aws_s3_rm_recursive_empties_a_prefix(aws: AwsCli, s3: BaseClient) -> None:
    s3.create_bucket(Bucket="rm-me")
    keys = [f"top/{d}/{i}" for d in ("x", "y y", "z+") for i in range(8)] + ["keep/me"]
    for k in keys:
        s3.put_object(Bucket="rm-me", Key=k, Body=b"r")
    aws("s3", "rm", "s3://rm-me/top/", "--recursive")
    left = [o["Key"] for o in s3.list_objects_v2(Bucket="rm-me").get("Contents", [])]
    assert left == ["keep/me"]


def test_aws_s3_mb_and_rb_force(aws: AwsCli, s3: BaseClient) -> None:
    aws("s3", "mb", "s3://rb-me")
    for i in range(15):
        s3.put_object(Bucket="rb-me", Key=f"d{i % 2}/k {i}", Body=b"b")
    aws("s3", "rb", "s3://rb-me", "--force")
    assert client_error(lambda: s3.head_bucket(Bucket="rb-me")) == ("404", 404)


def test_aws_s3api_reports_s3_errors(aws: AwsCli) -> None:
    proc = aws("s3api", "head-object", "--bucket", BUCKET, "--key", "missing", ok=False)
    assert proc.returncode != 0 and "404" in proc.stderr
    proc = aws("s3api", "get-object", "--bucket", "no-such-bucket-here", "--key", "k", "/dev/null", ok=False)
    assert proc.returncode != 0 and "NoSuchBucket" in proc.stderr


def test_list_buckets_pages_with_max_buckets_and_prefix(s3: BaseClient, gateway: Gateway) -> None:
    """ListBuckets takes max-buckets, continuation-token, prefix and bucket-region as S3
    does (it listed every bucket whatever it was asked)."""
    names = [f"lbpage-{i:02d}" for i in range(7)]
    for n in names:
        s3.create_bucket(Bucket=n)
    s3.create_bucket(Bucket="lbother")
    pages, token = [], None
    for _ in range(10):   # bounded: 7 buckets in pages of 3
        kw: dict[str, Any] = {"MaxBuckets": 3, "Prefix": "lbpage-"}
        if token:
            kw["ContinuationToken"] = token
        r = s3.list_buckets(**kw)
        pages.append([b["Name"] for b in r["Buckets"]])
        assert r["Prefix"] == "lbpage-"
        assert all(b["BucketRegion"] == s3.meta.region_name for b in r["Buckets"])
        token = r.get("ContinuationToken")
        if not token:
            break
    assert pages == [names[0:3], names[3:6], names[6:7]]
    assert [b["Name"] for b in s3.list_buckets(Prefix="lbo")["Buckets"]] == ["lbother"]
    assert s3.list_buckets(BucketRegion="xx-nowhere-1", Prefix="lb")["Buckets"] == []
    every = [b["Name"] for b in s3.list_buckets()["Buckets"]]   # unpaged: all, no token
    assert set(names) | {"lbother"} <= set(every)
    for bad in ("0", "10001", "-1", "3x", "%EF%BC%93"):   # boto3 refuses some before sending
        resp = raw_request(gateway, "GET", "/", f"max-buckets={bad}")
        assert resp.status == 400 and b"<Code>InvalidArgument</Code>" in resp.body, bad
    assert client_error(lambda: s3.list_buckets(ContinuationToken="bm90IG91cnM=")) \
        == ("InvalidArgument", 400)
    for n in names + ["lbother"]:
        s3.delete_bucket(Bucket=n)
