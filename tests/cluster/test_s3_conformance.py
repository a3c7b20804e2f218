"""S3 behaviours a sweep of the gateway found wrong, each checked against what S3 answers:
listings resumed at a folder marker, conditional writes, DeleteObjects validation,
UploadPartCopy ranges, GET/HEAD ?partNumber, keys with a newline, SigV2 bucket requests,
headers we cannot honour, clients that hang up mid-GET, forged continuation tokens.
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import s3fs
from boto3.s3.transfer import TransferConfig
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import (  # noqa: F401
    Gateway,
    MiB,
    aws_env,
    blob,
    client_error,
    gateway,
    http_request,
    make_client,
    md5_b64,
    md5_etag,
    poll,
    raw_request,
    record_headers,
    s3,
    s3_cluster,
    sign,
    status,
)

BUCKET = "conform"
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


# ---- 1. listings resumed at a folder marker ----------------------------------------------
LIST_BUCKET = "conform-list"
LIST_KEYS = ["a", "a/", "a/b", "dir/", "dir//x", "dir/a", "dir/b", "dir/sub/", "dir/sub/c",
             "dir/sub/d/e", "x-a", "x--", "x---q", "x--y", "x--y--z", "z"]
LISTINGS = [(p, d) for d in ("/", "--") for p in ("", "dir/", "dir/sub/", "a", "x-", "x--")]
Entry = tuple[str, str]   # ("K", key) or ("P", common prefix)


def model(prefix: str, delimiter: str) -> list[Entry]:
    """What S3 lists, by brute force: each key under the prefix, or the common prefix
    (up to the first delimiter after the prefix) it rolls up into, once, in key order."""
    out: list[Entry] = []
    for key in sorted(LIST_KEYS):   # ASCII: str order is S3's UTF-8 byte order
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix))
        entry = ("P", key[:cut + len(delimiter)]) if cut >= 0 else ("K", key)
        if not out or out[-1] != entry:
            out.append(entry)
    return out


def entries(page: dict[str, Any]) -> list[Entry]:
    got = [("K", o["Key"]) for o in page.get("Contents", [])]
    return sorted(got + [("P", c["Prefix"]) for c in page.get("CommonPrefixes", [])],
                  key=lambda e: e[1])


def paginate(call: Callable[..., dict[str, Any]], resume: Callable[[dict[str, Any]], dict[str, str]],
             max_keys: int, bound: int) -> list[Entry]:
    """Every page of a listing of `max_keys` entries, following `resume` while truncated
    (at most `bound` pages)."""
    got: list[Entry] = []
    extra: dict[str, str] = {}
    for _ in range(bound):
        page = call(MaxKeys=max_keys, **extra)
        assert len(entries(page)) <= max_keys
        got += entries(page)
        if not page["IsTruncated"]:
            return got
        extra = resume(page)
    raise AssertionError(f"still truncated after {bound} pages: {got}")


@pytest.fixture(scope="module")
def list_bucket(s3: BaseClient) -> str:
    s3.create_bucket(Bucket=LIST_BUCKET)
    for key in LIST_KEYS:
        s3.put_object(Bucket=LIST_BUCKET, Key=key, Body=b"")
    return LIST_BUCKET


@pytest.mark.parametrize(("prefix", "delimiter"), LISTINGS)
def test_listings_paged_by_1_to_3_match_a_brute_force_model(s3: BaseClient, list_bucket: str,
                                                            prefix: str, delimiter: str) -> None:
    want = model(prefix, delimiter)
    common = {"Bucket": LIST_BUCKET, "Prefix": prefix, "Delimiter": delimiter}
    for n in (1, 2, 3):
        v2 = paginate(lambda **kw: s3.list_objects_v2(**common, **kw),
                      lambda p: {"ContinuationToken": p["NextContinuationToken"]}, n, len(want) + 1)
        v1 = paginate(lambda **kw: s3.list_objects(**common, **kw),
                      lambda p: {"Marker": p["NextMarker"]}, n, len(want) + 1)
        assert (v2, v1) == (want, want), (n, v2, v1)


@pytest.mark.parametrize(("prefix", "delimiter"), LISTINGS)
def test_start_after_and_marker_at_each_listed_name_list_what_follows_it(
        s3: BaseClient, list_bucket: str, prefix: str, delimiter: str) -> None:
    want = model(prefix, delimiter)
    common = {"Bucket": LIST_BUCKET, "Prefix": prefix, "Delimiter": delimiter}
    for i, (_, name) in enumerate(want):
        assert entries(s3.list_objects_v2(**common, StartAfter=name)) == want[i + 1:], name
        assert entries(s3.list_objects(**common, Marker=name)) == want[i + 1:], name


def test_a_folder_marker_equal_to_the_prefix_is_followed_by_the_keys_under_it(
        s3: BaseClient, list_bucket: str) -> None:
    """The sweep's case: object "dir/" exists, prefix "dir/", delimiter "/"."""
    under = [("P", "dir//"), ("K", "dir/a"), ("K", "dir/b"), ("P", "dir/sub/")]
    common = {"Bucket": LIST_BUCKET, "Prefix": "dir/", "Delimiter": "/"}
    assert entries(s3.list_objects_v2(**common, StartAfter="dir/")) == under
    assert entries(s3.list_objects(**common, Marker="dir/")) == under
    versions = s3.list_object_versions(**common, KeyMarker="dir/")
    assert [v["Key"] for v in versions["Versions"]] == ["dir/a", "dir/b"]


# ---- 10. continuation tokens ---------------------------------------------------------------
@pytest.mark.parametrize("token", ["Zm9v", "ZGlyLw==", "AAAAAAAAAAAAAAAAZGlyLw=="])
def test_a_continuation_token_that_is_base64_but_not_ours_is_invalid_argument(
        s3: BaseClient, list_bucket: str, token: str) -> None:
    assert client_error(lambda: s3.list_objects_v2(Bucket=LIST_BUCKET, ContinuationToken=token)) == (
        "InvalidArgument", 400)


# ---- 2. conditional writes -----------------------------------------------------------------
def test_put_if_none_match_star_refuses_an_existing_key_and_creates_a_new_one(
        s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="cond/lock", Body=b"first writer")
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="cond/lock", Body=b"second",
                                              IfNoneMatch="*")) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="cond/lock")["Body"].read() == b"first writer"
    assert status(s3.put_object(Bucket=bucket, Key="cond/new", Body=b"made", IfNoneMatch="*")) == 200
    assert s3.get_object(Bucket=bucket, Key="cond/new")["Body"].read() == b"made"


def test_put_if_match_writes_only_over_the_named_etag(s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="cond/cas", Body=b"v1")
    wrong = '"00000000000000000000000000000000"'
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="cond/cas", Body=b"v2",
                                              IfMatch=wrong)) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="cond/cas")["Body"].read() == b"v1"
    assert client_error(lambda: s3.put_object(Bucket=bucket, Key="cond/absent", Body=b"x",
                                              IfMatch=wrong)) == ("NoSuchKey", 404)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="cond/absent")) == ("404", 404)
    s3.put_object(Bucket=bucket, Key="cond/cas", Body=b"v2", IfMatch=md5_etag(b"v1"))
    assert s3.get_object(Bucket=bucket, Key="cond/cas")["Body"].read() == b"v2"


def test_complete_multipart_upload_honours_if_none_match_and_if_match(s3: BaseClient,
                                                                      bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="cond/mpu", Body=b"there first")

    def upload() -> tuple[str, dict[str, Any]]:
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key="cond/mpu")["UploadId"]
        etag = s3.upload_part(Bucket=bucket, Key="cond/mpu", UploadId=upload_id, PartNumber=1,
                              Body=b"by parts")["ETag"]
        return upload_id, {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    upload_id, parts = upload()
    assert client_error(lambda: s3.complete_multipart_upload(
        Bucket=bucket, Key="cond/mpu", UploadId=upload_id, MultipartUpload=parts,
        IfNoneMatch="*")) == ("PreconditionFailed", 412)
    assert client_error(lambda: s3.complete_multipart_upload(
        Bucket=bucket, Key="cond/mpu", UploadId=upload_id, MultipartUpload=parts,
        IfMatch='"0123"')) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="cond/mpu")["Body"].read() == b"there first"
    s3.complete_multipart_upload(Bucket=bucket, Key="cond/mpu", UploadId=upload_id,
                                 MultipartUpload=parts, IfMatch=md5_etag(b"there first"))
    assert s3.get_object(Bucket=bucket, Key="cond/mpu")["Body"].read() == b"by parts"


# ---- 3. DeleteObjects ----------------------------------------------------------------------
def post_delete(gw: Gateway, bucket: str, body: bytes) -> tuple[int, ET.Element | None, bytes]:
    resp = raw_request(gw, "POST", f"/{bucket}", "delete=", body, {"Content-MD5": md5_b64(body)})
    try:
        return resp.status, ET.fromstring(resp.body), resp.body
    except ET.ParseError:
        return resp.status, None, resp.body


@pytest.mark.parametrize("bad", [b"<Object><Key></Key></Object>", b"<Object></Object>",
                                 b"<Object><VersionId>null</VersionId></Object>"])
def test_delete_objects_with_an_invalid_entry_deletes_nothing(s3: BaseClient, gateway: Gateway,
                                                              bucket: str, bad: bytes) -> None:
    s3.put_object(Bucket=bucket, Key="del/victim", Body=b"x")
    body = b"<Delete><Object><Key>del/victim</Key></Object>" + bad + b"</Delete>"
    code, _, data = post_delete(gateway, bucket, body)
    assert (code, ET.fromstring(data).findtext("Code")) == (400, "MalformedXML")
    assert status(s3.head_object(Bucket=bucket, Key="del/victim")) == 200


def test_delete_objects_reports_a_key_over_1024_bytes_as_key_too_long(s3: BaseClient,
                                                                      gateway: Gateway,
                                                                      bucket: str) -> None:
    long_key = "del/&<" + "k" * 1100
    s3.put_object(Bucket=bucket, Key="del/kept-going", Body=b"x")
    body = (f"<Delete><Object><Key>{long_key.replace('&', '&amp;').replace('<', '&lt;')}</Key>"
            "</Object><Object><Key>del/kept-going</Key></Object></Delete>").encode()
    code, root, data = post_delete(gateway, bucket, body)
    assert code == 200 and root is not None, data
    errors = root.findall(f"{NS}Error")
    assert [(e.findtext(f"{NS}Key"), e.findtext(f"{NS}Code"), e.findtext(f"{NS}Message"))
            for e in errors] == [(long_key, "KeyTooLongError", "Your key is too long")]
    assert [d.findtext(f"{NS}Key") for d in root.findall(f"{NS}Deleted")] == ["del/kept-going"]
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="del/kept-going")) == ("404", 404)


# ---- 4. UploadPartCopy ranges --------------------------------------------------------------
@pytest.mark.parametrize("rng", ["bytes=7-3", "bytes=abc", "bytes=0-1,4-5", "bytes=-3", "bytes=3-",
                                 "0-3", "bytes=0-10", "bytes=10-12"])
def test_upload_part_copy_refuses_a_range_that_is_not_first_last_within_the_source(
        s3: BaseClient, bucket: str, rng: str) -> None:
    s3.put_object(Bucket=bucket, Key="upc/src10", Body=b"0123456789")
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="upc/dst")["UploadId"]
    try:
        assert client_error(lambda: s3.upload_part_copy(
            Bucket=bucket, Key="upc/dst", UploadId=upload_id, PartNumber=1,
            CopySource=f"{bucket}/upc/src10", CopySourceRange=rng)) == ("InvalidArgument", 400)
        assert s3.list_parts(Bucket=bucket, Key="upc/dst", UploadId=upload_id).get("Parts", []) == []
        s3.upload_part_copy(Bucket=bucket, Key="upc/dst", UploadId=upload_id, PartNumber=1,
                            CopySource=f"{bucket}/upc/src10", CopySourceRange="bytes=3-7")
        assert [p["Size"] for p in s3.list_parts(Bucket=bucket, Key="upc/dst",
                                                   UploadId=upload_id)["Parts"]] == [5]
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key="upc/dst", UploadId=upload_id)


# ---- 5. GET and HEAD ?partNumber -----------------------------------------------------------
PART_SIZES = (5 * MiB, 5 * MiB + 7, 1000)


@pytest.fixture(scope="module")
def parted(s3: BaseClient, bucket: str) -> list[bytes]:
    """An object of three parts (PART_SIZES), uploaded by multipart."""
    parts = [blob(size, 50 + i) for i, size in enumerate(PART_SIZES)]
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key="parts/m")["UploadId"]
    done = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key="parts/m", UploadId=upload_id,
                                                     PartNumber=n, Body=p)["ETag"]}
            for n, p in enumerate(parts, 1)]
    s3.complete_multipart_upload(Bucket=bucket, Key="parts/m", UploadId=upload_id,
                                 MultipartUpload={"Parts": done})
    return parts


def test_get_and_head_part_number_answer_that_part_of_a_multipart_object(
        s3: BaseClient, bucket: str, parted: list[bytes]) -> None:
    total = sum(PART_SIZES)
    for n, data in enumerate(parted, 1):
        lo = sum(PART_SIZES[:n - 1])
        got = s3.get_object(Bucket=bucket, Key="parts/m", PartNumber=n)
        assert status(got) == 206 and got["Body"].read() == data
        assert got["ContentRange"] == f"bytes {lo}-{lo + len(data) - 1}/{total}"
        assert (got["PartsCount"], got["ContentLength"]) == (3, len(data))
        head = s3.head_object(Bucket=bucket, Key="parts/m", PartNumber=n)
        assert (status(head), head["ContentLength"], head["PartsCount"]) == (206, len(data), 3)
    assert client_error(lambda: s3.get_object(Bucket=bucket, Key="parts/m", PartNumber=4)) == (
        "InvalidPartNumber", 416)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="parts/m", PartNumber=4))[1] == 416


def test_part_number_1_of_an_object_not_uploaded_in_parts_is_all_of_it(s3: BaseClient,
                                                                        bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="parts/whole", Body=b"all of it")
    got = s3.get_object(Bucket=bucket, Key="parts/whole", PartNumber=1)
    assert got["Body"].read() == b"all of it" and got["ContentRange"] == "bytes 0-8/9"
    assert client_error(lambda: s3.get_object(Bucket=bucket, Key="parts/whole", PartNumber=2)) == (
        "InvalidPartNumber", 416)


@pytest.mark.parametrize(("query", "headers", "code"), [
    ("partNumber=0", {}, "InvalidArgument"), ("partNumber=10001", {}, "InvalidArgument"),
    ("partNumber=x", {}, "InvalidArgument"), ("partNumber=1", {"Range": "bytes=0-1"}, "InvalidRequest")])
def test_a_bad_part_number_or_one_beside_a_range_is_400(gateway: Gateway, s3: BaseClient, bucket: str,
                                                       query: str, headers: dict[str, str],
                                                       code: str) -> None:
    s3.put_object(Bucket=bucket, Key="parts/whole", Body=b"all of it")
    resp = raw_request(gateway, "GET", f"/{bucket}/parts/whole", query, headers=headers)
    assert (resp.status, resp.code) == (400, code)


# ---- 6. keys with a newline ----------------------------------------------------------------
NEWLINE_KEY = "nl/line1\nline2"


def test_a_request_for_a_key_with_a_newline_reaches_the_s3_dispatcher(gateway: Gateway,
                                                                      s3: BaseClient,
                                                                      bucket: str) -> None:
    """An upload's records are keyed by its id, so this much works whatever the key."""
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=NEWLINE_KEY)["UploadId"]
    listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="nl/")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [(NEWLINE_KEY, upload_id)]
    s3.abort_multipart_upload(Bucket=bucket, Key=NEWLINE_KEY, UploadId=upload_id)
    resp = raw_request(gateway, "POST", f"/{bucket}/{quote(NEWLINE_KEY)}", "uploadId=nope")
    assert (resp.status, resp.code) == (404, "NoSuchUpload")   # S3's XML, not a plain 404


def test_a_key_with_a_newline_is_stored_listed_and_deleted(gateway: Gateway, bucket: str) -> None:
    s3 = make_client(gateway, retries=False)
    s3.put_object(Bucket=bucket, Key=NEWLINE_KEY, Body=b"two lines")
    assert s3.get_object(Bucket=bucket, Key=NEWLINE_KEY)["Body"].read() == b"two lines"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="nl/")["Contents"]] == [NEWLINE_KEY]
    assert status(s3.delete_object(Bucket=bucket, Key=NEWLINE_KEY)) == 204
    assert s3.list_objects_v2(Bucket=bucket, Prefix="nl/")["KeyCount"] == 0


# ---- 7. SigV2 on a bucket ------------------------------------------------------------------
def test_sigv2_bucket_requests_signed_with_a_trailing_slash_are_accepted(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="v2/k", Body=b"v2")
    url = s3.generate_presigned_url("list_objects", Params={"Bucket": bucket, "Prefix": "v2/"},
                                    ExpiresIn=60)
    assert "Signature=" in url and "AWSAccessKeyId=" in url, url   # SigV2, as botocore presigns
    resp = http_request("GET", url)
    assert resp.status == 200, resp.body
    assert [k.text for k in ET.fromstring(resp.body).iter(f"{NS}Key")] == ["v2/k"]
    v2 = make_client(gateway, signature_version="s3")
    assert [o["Key"] for o in v2.list_objects(Bucket=bucket, Prefix="v2/")["Contents"]] == ["v2/k"]
    assert status(v2.head_bucket(Bucket=bucket)) == 200
    assert v2.get_object(Bucket=bucket, Key="v2/k")["Body"].read() == b"v2"


def test_sigv2_with_a_wrong_secret_is_still_refused_on_a_bucket(gateway: Gateway, bucket: str) -> None:
    v2 = make_client(gateway, secret_key="w" * 40, signature_version="s3", retries=False)
    assert client_error(lambda: v2.list_objects(Bucket=bucket)) == ("SignatureDoesNotMatch", 403)


# ---- 8. what we cannot honour --------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "header"), [
    ({"ServerSideEncryption": "AES256"}, "x-amz-server-side-encryption"),
    ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k"}, "x-amz-server-side-encryption"),
    ({"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "0" * 32},
     "x-amz-server-side-encryption-customer-algorithm"),
    ({"Tagging": "a=b"}, "x-amz-tagging"),
    ({"ObjectLockLegalHoldStatus": "ON"}, "x-amz-object-lock-legal-hold"),
    ({"ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": "2030-01-01T00:00:00Z"},
     "x-amz-object-lock-"),
    ({"WebsiteRedirectLocation": "/x"}, "x-amz-website-redirect-location"),
])
def test_a_put_asking_for_what_we_cannot_honour_is_not_implemented(
        gateway: Gateway, bucket: str, kwargs: dict[str, str], header: str) -> None:
    s3 = make_client(gateway, retries=False)   # 501 is not retried, but keep it quick
    for call in (lambda: s3.put_object(Bucket=bucket, Key="unsup/k", Body=b"x", **kwargs),
                 lambda: s3.create_multipart_upload(Bucket=bucket, Key="unsup/k", **kwargs)):
        with pytest.raises(ClientError) as exc:
            call()
        err = exc.value.response["Error"]
        assert (err["Code"], header in err["Message"]) == ("NotImplemented", True), err
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="unsup/k")) == ("404", 404)
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="unsup/").get("Uploads", []) == []


def test_copy_with_tags_get_with_sse_c_and_create_session_are_not_implemented(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="unsup/src", Body=b"x")
    assert client_error(lambda: s3.copy_object(
        Bucket=bucket, Key="unsup/copy", CopySource=f"{bucket}/unsup/src",
        TaggingDirective="REPLACE", Tagging="a=b")) == ("NotImplemented", 501)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="unsup/copy")) == ("404", 404)
    assert client_error(lambda: s3.get_object(
        Bucket=bucket, Key="unsup/src", SSECustomerAlgorithm="AES256",
        SSECustomerKey="0" * 32)) == ("NotImplemented", 501)
    resp = raw_request(gateway, "GET", f"/{bucket}", "session=")
    assert (resp.status, resp.code) == (501, "NotImplemented")


def test_ordinary_boto3_aws_cli_and_s3fs_writes_send_none_of_them_and_work(
        s3_cluster: LocalCluster, gateway: Gateway, bucket: str, tmp_path: Path) -> None:
    from node.gateway import unsupported_header
    client = make_client(gateway)
    sent = record_headers(client, "*")
    client.put_object(Bucket=bucket, Key="plain/put", Body=b"plain")
    data = blob(6 * MiB + 3, 60)
    (tmp_path / "f.bin").write_bytes(data)
    client.upload_file(str(tmp_path / "f.bin"), bucket, "plain/upload_file",
                       Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB))
    client.copy_object(Bucket=bucket, Key="plain/copy", CopySource=f"{bucket}/plain/put")
    assert len(sent) >= 5 and [unsupported_header(h) for h in sent] == [None] * len(sent)
    assert client.get_object(Bucket=bucket, Key="plain/upload_file")["Body"].read() == data
    proc = subprocess.run([sys.executable, "-m", "awscli", "--endpoint-url", gateway.url, "s3", "cp",
                           str(tmp_path / "f.bin"), f"s3://{bucket}/plain/aws_cp"],
                          env=aws_env(s3_cluster, gateway), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    fs = s3fs.S3FileSystem(key=gateway.access_key, secret=gateway.secret_key, endpoint_url=gateway.url,
                           client_kwargs={"region_name": gateway.region}, skip_instance_cache=True)
    fs.put(str(tmp_path / "f.bin"), f"{bucket}/plain/s3fs_put")
    for key in ("plain/aws_cp", "plain/s3fs_put"):
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key


# ---- 9. a client that hangs up mid-GET -----------------------------------------------------
def test_a_client_closing_its_connection_mid_get_leaves_no_traceback(
        s3_cluster: LocalCluster, gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="cut/big", Body=blob(12 * MiB, 70))
    log = s3_cluster.dir / "logs" / "gw1.log"
    before = log.stat().st_size
    url = f"{gateway.url}/{bucket}/cut/big"
    headers = sign(gateway, "GET", url)
    split = urlsplit(gateway.url)
    with socket.create_connection((gateway.host, gateway.port), timeout=10) as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall((f"GET /{bucket}/cut/big HTTP/1.1\r\nHost: {split.netloc}\r\n"
                      + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    # the gateway logs each request when its handler is done: wait for this GET's line
    poll(lambda: log.read_bytes()[before:], lambda text: b"method=GET op=get_object" in text,
         30.0, "the gateway to finish the cut GET")
    text = log.read_bytes()[before:].decode(errors="replace")
    assert "Error handling request" not in text and "Traceback" not in text, text
    assert s3.get_object(Bucket=bucket, Key="cut/big")["ContentLength"] == 12 * MiB



def test_configuration_probes_say_nothing_is_set_and_setting_stays_not_implemented(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    """Tools probe a bucket's policy, lifecycle, CORS, encryption, tags and website, and an
    object's tags: S3's answers for "none set" (they were 501 NotImplemented, which failed
    s3fs's get_tags and such probes); setting any stays 501."""
    s3.put_object(Bucket=bucket, Key="probe/k", Body=b"x")
    for call, code in ((s3.get_bucket_policy, "NoSuchBucketPolicy"),
                       (s3.get_bucket_lifecycle_configuration, "NoSuchLifecycleConfiguration"),
                       (s3.get_bucket_cors, "NoSuchCORSConfiguration"),
                       (s3.get_bucket_encryption,
                        "ServerSideEncryptionConfigurationNotFoundError"),
                       (s3.get_bucket_tagging, "NoSuchTagSet"),
                       (s3.get_bucket_website, "NoSuchWebsiteConfiguration")):
        assert client_error(lambda: call(Bucket=bucket)) == (code, 404), call
        assert client_error(lambda: call(Bucket="no-such-bucket-probe"))[0] == "NoSuchBucket"
    assert s3.get_object_tagging(Bucket=bucket, Key="probe/k")["TagSet"] == []
    assert client_error(lambda: s3.get_object_tagging(Bucket=bucket, Key="probe/none")) \
        == ("NoSuchKey", 404)
    assert client_error(lambda: s3.put_object_tagging(
        Bucket=bucket, Key="probe/k", Tagging={"TagSet": [{"Key": "a", "Value": "b"}]})) \
        == ("NotImplemented", 501)
    assert client_error(lambda: s3.put_bucket_policy(Bucket=bucket, Policy="{}")) \
        == ("NotImplemented", 501)


def test_an_upload_without_content_length_is_411_and_stores_nothing(
        gateway: Gateway, s3: BaseClient, bucket: str) -> None:
    """A PUT of an object without Content-Length (and not chunked) was read as an empty
    body: 200, an empty object where the client meant to send bytes. S3 answers 411."""
    import http.client
    from urllib.parse import urlsplit
    url = f"{gateway.url}/{bucket}/nolength"
    headers = sign(gateway, "PUT", url, b"")
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=30)
    try:
        conn.putrequest("PUT", parts.path)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 411 and b"MissingContentLength" in body, (resp.status, body)
    assert client_error(lambda: s3.head_object(Bucket=bucket, Key="nolength")) == ("404", 404)
    assert raw_request(gateway, "PUT", f"/{bucket}/withlength", body=b"").status == 200
