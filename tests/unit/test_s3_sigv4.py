"""SigV4 verification against requests signed by botocore itself and against AWS's documented examples."""
from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from node.s3 import sigv4
from node.s3.errors import S3Error
from node.s3.sigv4 import AuthResult, authenticate

AK, SECRET = "AKIDECSTORETEST", "s3cr3t/with+odd=chars"
SECRETS = {AK: SECRET, "AKIAIOSFODNN7EXAMPLE": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
ENDPOINT = "http://127.0.0.1:9000"
EMPTY = sigv4.EMPTY_SHA256
DOC_NOW_S = calendar.timegm((2013, 5, 24, 0, 0, 0))
# Keys with every character class that trips canonical URIs: spaces, '+', '%', '=', '&', '~', unicode, slashes.
KEYS = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60)


class Captured(Exception):
    """Raised by a before-send hook: carries the request botocore would have put on the wire."""


def _client(endpoint: str = ENDPOINT, **config: Any) -> Any:
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SECRET,
                          region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 0}, **config))

    def before_send(request: Any, **_: Any) -> None:
        raise Captured(request)
    client.meta.events.register("before-send.s3", before_send)
    return client


CLIENT = _client()
PRESIGNER = _client(signature_version="s3v4")


def wire(call: Callable[[], Any]) -> tuple[str, str, list[tuple[str, str]], dict[str, str]]:
    """(method, raw path, decoded query as aiohttp gives it, headers incl. Host) of a botocore call."""
    with pytest.raises(Captured) as caught:
        call()
    request = caught.value.args[0]
    return request.method, *split_url(request.url), headers_of(request.headers, request.url)


def split_url(url: str) -> tuple[str, list[tuple[str, str]]]:
    parsed = URL(url, encoded=True)  # what aiohttp builds request.rel_url with
    return parsed.raw_path, list(parsed.query.items())


def headers_of(headers: Any, url: str) -> dict[str, str]:
    """Lower-case names, as one HTTP request carries them (the CRT signer sets 'host' itself)."""
    out = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in headers.items()}
    out.setdefault("host", urlsplit(url).netloc)
    return out


def auth(method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
         now_s: float | None = None, secrets: dict[str, str] = SECRETS) -> AuthResult | None:
    return authenticate(method, path, query, headers, secrets.get, time.time() if now_s is None else now_s)


def rejected(code: str, status: int, method: str, path: str, query: list[tuple[str, str]],
             headers: dict[str, str], now_s: float | None = None, secrets: dict[str, str] = SECRETS) -> S3Error:
    with pytest.raises(S3Error) as caught:
        auth(method, path, query, headers, now_s, secrets)
    assert (caught.value.code, caught.value.status) == (code, status), caught.value
    return caught.value


def doc_headers(**extra: str) -> dict[str, str]:
    return {"Host": "examplebucket.s3.amazonaws.com", "x-amz-date": "20130524T000000Z",
            "x-amz-content-sha256": EMPTY, **extra}


def doc_authorization(signed: str, signature: str) -> str:
    return ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            f"SignedHeaders={signed},Signature={signature}")


# --- AWS documented examples (sig-v4-header-based-auth and sigv4-streaming pages) ---------------------------------

def test_aws_example_get_object_with_range() -> None:
    headers = doc_headers(Range="bytes=0-9", Authorization=doc_authorization(
        "host;range;x-amz-content-sha256;x-amz-date",
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"))
    result = auth("GET", "/test.txt", [], headers, DOC_NOW_S)
    assert result is not None and result.access_key == "AKIAIOSFODNN7EXAMPLE"
    assert result.scope == "20130524/us-east-1/s3/aws4_request" and result.payload_sha256 == EMPTY
    assert not result.presigned
    rejected("SignatureDoesNotMatch", 403, "GET", "/test.txt", [], {**headers, "Range": "bytes=0-10"}, DOC_NOW_S)


def test_aws_example_put_object_with_dollar_key_and_date_header() -> None:
    body_sha256 = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
    headers = doc_headers(**{"Date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY",
                             "x-amz-content-sha256": body_sha256})
    headers["authorization"] = doc_authorization("date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
                                                 "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
    result = auth("PUT", "/test%24file.text", [], headers, DOC_NOW_S)
    assert result is not None and result.payload_sha256 == body_sha256
    assert auth("PUT", "/test$file.text", [], headers, DOC_NOW_S) is not None  # '$' unencoded on the wire


def test_aws_example_get_bucket_lifecycle_and_list_objects() -> None:
    lifecycle = doc_headers(Authorization=doc_authorization(
        "host;x-amz-content-sha256;x-amz-date", "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"))
    assert auth("GET", "/", [("lifecycle", "")], lifecycle, DOC_NOW_S) is not None
    listing = doc_headers(Authorization=doc_authorization(
        "host;x-amz-content-sha256;x-amz-date", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"))
    assert auth("GET", "/", [("prefix", "J"), ("max-keys", "2")], listing, DOC_NOW_S) is not None
    rejected("SignatureDoesNotMatch", 403, "GET", "/", [("prefix", "K"), ("max-keys", "2")], listing, DOC_NOW_S)


def test_aws_example_chunked_upload_seed_signature() -> None:
    headers = doc_headers(**{"x-amz-storage-class": "REDUCED_REDUNDANCY", "Content-Encoding": "aws-chunked",
                             "Content-Length": "66824", "x-amz-decoded-content-length": "66560",
                             "x-amz-content-sha256": sigv4.STREAMING_SIGNED, "Host": "s3.amazonaws.com"})
    headers["authorization"] = doc_authorization(
        "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;"
        "x-amz-storage-class", "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
    result = auth("PUT", "/examplebucket/chunkObject.txt", [], headers, DOC_NOW_S)
    assert result is not None
    assert result.seed_signature == "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
    assert result.payload_sha256 == sigv4.STREAMING_SIGNED and result.amz_date == "20130524T000000Z"


# --- botocore-signed requests ---------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(key=KEYS, body=st.binary(max_size=64))
def test_accepts_botocore_put_object_for_any_key(key: str, body: bytes) -> None:
    method, path, query, headers = wire(lambda: CLIENT.put_object(Bucket="bkt", Key=key, Body=body))
    result = auth(method, path, query, headers)
    assert result is not None and result.access_key == AK and not result.presigned
    assert result.payload_sha256 == headers["x-amz-content-sha256"]


@settings(max_examples=100, deadline=None)
@given(prefix=KEYS, start_after=KEYS, delimiter=st.sampled_from(["/", "&", "=", "+", " ", "é"]))
def test_accepts_botocore_listings_with_any_query_values(prefix: str, start_after: str, delimiter: str) -> None:
    call = lambda: CLIENT.list_objects_v2(Bucket="bkt", Prefix=prefix, StartAfter=start_after,  # noqa: E731
                                          Delimiter=delimiter, MaxKeys=7)
    assert auth(*wire(call)) is not None


@pytest.mark.parametrize("call", [
    lambda: CLIENT.get_object(Bucket="b", Key="a/b c", Range="bytes=0-99", IfMatch='"etag"'),
    lambda: CLIENT.head_object(Bucket="b", Key="x", VersionId="v 1+2"),
    lambda: CLIENT.put_object(Bucket="b", Key="m", Body=b"x", Metadata={"Owner": "Ann  Lee", "n": "1"},
                              ContentType="text/plain; charset=utf-8", CacheControl="no-cache"),
    lambda: CLIENT.copy_object(Bucket="b", Key="dst", CopySource={"Bucket": "s", "Key": "src key+é"}),
    lambda: CLIENT.delete_objects(Bucket="b", Delete={"Objects": [{"Key": "a"}, {"Key": "b&c"}]}),
    lambda: CLIENT.upload_part(Bucket="b", Key="k", UploadId="u/1=2", PartNumber=3, Body=b"part"),
    lambda: CLIENT.get_bucket_acl(Bucket="b"),
    lambda: CLIENT.list_object_versions(Bucket="b", Prefix="p", KeyMarker="k~1"),
    lambda: CLIENT.create_bucket(Bucket="new-bucket"),
], ids=["get-range", "head-version", "put-meta", "copy", "delete-objects", "upload-part", "acl", "versions",
        "create-bucket"])
def test_accepts_botocore_operations(call: Callable[[], Any]) -> None:
    assert auth(*wire(call)) is not None


def test_accepts_any_region_and_uses_it_in_the_scope() -> None:
    request = AWSRequest(method="GET", url=f"{ENDPOINT}/b/k", headers={"Host": "127.0.0.1:9000"})
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "garage-zone-1").add_auth(request)
    result = auth("GET", "/b/k", [], headers_of(request.headers, request.url))
    assert result is not None and result.scope.endswith("/garage-zone-1/s3/aws4_request")


def test_accepts_a_multidict_with_repeated_headers() -> None:
    multidict = pytest.importorskip("multidict")
    request = AWSRequest(method="PUT", url=f"{ENDPOINT}/b/k", data=b"x")
    request.headers["X-Amz-Meta-Tag"] = "a"
    request.headers["X-Amz-Meta-Tag"] = "b  c"  # HTTPHeaders appends: the header is sent twice
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    headers = multidict.CIMultiDict((k, v) for k, v in request.headers.items())
    headers["Host"] = "127.0.0.1:9000"
    assert len(headers.getall("x-amz-meta-tag")) == 2
    assert auth("PUT", "/b/k", [], headers) is not None  # type: ignore[arg-type]
    headers.popall("x-amz-meta-tag")
    headers.add("x-amz-meta-tag", "a")
    rejected("SignatureDoesNotMatch", 403, "PUT", "/b/k", [], headers)  # type: ignore[arg-type]


def test_date_header_stands_in_for_x_amz_date() -> None:
    headers = {"host": "h", "date": "Tue, 01 Dec 2026 10:15:00 GMT", "x-amz-content-sha256": EMPTY}
    signed = ("date", "host", "x-amz-content-sha256")
    lower = {name: [value] for name, value in headers.items()}
    canonical = sigv4.canonical_request("GET", "/b/k", "", lower, signed, EMPTY)
    scope = "20261201/us-east-1/s3/aws4_request"
    key = sigv4.signing_key(SECRET, "20261201", "us-east-1")
    signature = hmac.new(key, sigv4.string_to_sign("20261201T101500Z", scope, canonical).encode(),
                         hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={AK}/{scope}, SignedHeaders=date;host;"
                                f"x-amz-content-sha256, Signature={signature}")
    now_s = calendar.timegm((2026, 12, 1, 10, 15, 0))
    result = auth("GET", "/b/k", [], headers, now_s)
    assert result is not None and result.amz_date == "20261201T101500Z"
    rejected("RequestTimeTooSkewed", 403, "GET", "/b/k", [], headers, now_s + 3600)


@settings(max_examples=100, deadline=None)
@given(key=KEYS, expires_s=st.integers(1, sigv4.PRESIGN_MAX_EXPIRES_S))
def test_accepts_presigned_urls_for_any_key(key: str, expires_s: int) -> None:
    url = PRESIGNER.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": key}, ExpiresIn=expires_s)
    path, query = split_url(url)
    result = auth("GET", path, query, {"Host": "127.0.0.1:9000"})
    assert result is not None and result.presigned and result.payload_sha256 == sigv4.UNSIGNED_PAYLOAD


def test_accepts_presigned_put_with_signed_metadata() -> None:
    url = PRESIGNER.generate_presigned_url("put_object", Params={"Bucket": "b", "Key": "k", "Metadata": {"a": "1"}})
    path, query = split_url(url)
    assert auth("PUT", path, query, {"Host": "127.0.0.1:9000", "x-amz-meta-a": "1"}) is not None
    rejected("SignatureDoesNotMatch", 403, "PUT", path, query, {"Host": "127.0.0.1:9000", "x-amz-meta-a": "2"})


def test_accepts_botocore_query_auth_request() -> None:
    request = AWSRequest(method="GET", url=f"{ENDPOINT}/b/some%20key?versionId=3&x-id=GetObject")
    S3SigV4QueryAuth(Credentials(AK, SECRET), "s3", "us-east-1", expires=60).add_auth(request)
    path, query = split_url(request.url)
    assert auth("GET", path, query, {"Host": "127.0.0.1:9000"}) is not None


# --- rejections -----------------------------------------------------------------------------------------------------

def test_no_authentication_is_anonymous() -> None:
    assert auth("GET", "/b/k", [("prefix", "x")], {"Host": "h"}) is None


def test_wrong_secret_is_signature_does_not_match() -> None:
    rejected("SignatureDoesNotMatch", 403, *wire(lambda: CLIENT.get_object(Bucket="b", Key="k")),
             secrets={AK: SECRET + "x"})


def test_unknown_access_key_is_invalid_access_key_id() -> None:
    rejected("InvalidAccessKeyId", 403, *wire(lambda: CLIENT.get_object(Bucket="b", Key="k")), secrets={})


def test_tampered_method_path_query_or_header_is_signature_does_not_match() -> None:
    method, path, query, headers = wire(lambda: CLIENT.list_objects_v2(Bucket="b", Prefix="p/"))
    rejected("SignatureDoesNotMatch", 403, "DELETE", path, query, headers)
    rejected("SignatureDoesNotMatch", 403, method, path + "x", query, headers)
    rejected("SignatureDoesNotMatch", 403, method, path, [*query, ("max-keys", "1")], headers)
    rejected("SignatureDoesNotMatch", 403, method, path, [(k, v + "q") for k, v in query], headers)
    rejected("SignatureDoesNotMatch", 403, method, path, query, {**headers, "host": "evil:9000"})
    _, path, query, headers = wire(lambda: CLIENT.put_object(Bucket="b", Key="k", Body=b"x", Metadata={"a": "1"}))
    rejected("SignatureDoesNotMatch", 403, "PUT", path, query, {**headers, "x-amz-meta-a": "2"})
    rejected("SignatureDoesNotMatch", 403, "PUT", path, query, {**headers, "x-amz-content-sha256": EMPTY})


def test_unsigned_x_amz_header_is_access_denied() -> None:
    method, path, query, headers = wire(lambda: CLIENT.put_object(Bucket="b", Key="k", Body=b"x"))
    error = rejected("AccessDenied", 403, method, path, query, {**headers, "x-amz-meta-extra": "1"})
    assert "x-amz-meta-extra" in error.message


def test_expired_presigned_url_is_access_denied() -> None:
    url = PRESIGNER.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"}, ExpiresIn=60)
    path, query = split_url(url)
    signed_at_s = calendar.timegm(time.strptime(dict(query)["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    error = rejected("AccessDenied", 403, "GET", path, query, {"Host": "127.0.0.1:9000"}, signed_at_s + 60.5)
    assert error.message == "Request has expired"
    assert auth("GET", path, query, {"Host": "127.0.0.1:9000"}, signed_at_s + 60) is not None


def test_presigned_url_from_the_future_is_access_denied() -> None:
    url = PRESIGNER.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"}, ExpiresIn=60)
    path, query = split_url(url)
    rejected("AccessDenied", 403, "GET", path, query, {"Host": "127.0.0.1:9000"}, time.time() - 3600)


def test_tampered_presigned_url_is_signature_does_not_match() -> None:
    url = PRESIGNER.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"}, ExpiresIn=60)
    path, query = split_url(url)
    rejected("SignatureDoesNotMatch", 403, "GET", "/b/other", query, {"Host": "127.0.0.1:9000"})
    rejected("SignatureDoesNotMatch", 403, "PUT", path, query, {"Host": "127.0.0.1:9000"})
    longer = [(k, "120") if k == "X-Amz-Expires" else (k, v) for k, v in query]
    rejected("SignatureDoesNotMatch", 403, "GET", path, longer, {"Host": "127.0.0.1:9000"})
    rejected("SignatureDoesNotMatch", 403, "GET", path, [*query, ("response-content-type", "text/html")],
             {"Host": "127.0.0.1:9000"})


@pytest.mark.parametrize("skew_s", [-901, 901, 86400])
def test_skewed_date_is_request_time_too_skewed(skew_s: float) -> None:
    rejected("RequestTimeTooSkewed", 403, *wire(lambda: CLIENT.get_object(Bucket="b", Key="k")),
             now_s=time.time() + skew_s)


def test_date_within_skew_is_accepted() -> None:
    assert auth(*wire(lambda: CLIENT.get_object(Bucket="b", Key="k")), now_s=time.time() + 600) is not None


def test_sigv2_is_rejected_as_an_unsupported_mechanism() -> None:
    rejected("InvalidRequest", 400, "GET", "/b/k", [], {"Host": "h", "Authorization": "AWS AKID:c2lnbmF0dXJl"})
    sigv2_url = _client().generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
    path, query = split_url(sigv2_url)
    assert {"AWSAccessKeyId", "Signature"} <= dict(query).keys()  # botocore presigns SigV2 unless told s3v4
    rejected("InvalidRequest", 400, "GET", path, query, {"Host": "127.0.0.1:9000"})


def test_header_and_query_auth_together_is_invalid_argument() -> None:
    method, path, query, headers = wire(lambda: CLIENT.get_object(Bucket="b", Key="k"))
    rejected("InvalidArgument", 400, method, path, [("X-Amz-Algorithm", sigv4.ALGORITHM)], headers)


def _good_request() -> tuple[str, str, list[tuple[str, str]], dict[str, str]]:
    return wire(lambda: CLIENT.get_object(Bucket="b", Key="k"))


@pytest.mark.parametrize("authorization", [
    "AWS4-HMAC-SHA256",
    "AWS4-HMAC-SHA256 Credential=AKIDECSTORETEST/20260101/us-east-1/s3/aws4_request",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request,SignedHeaders=host,Signature=a,Signature=b",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3, SignedHeaders=host, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/2026-01-01/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws5_request, SignedHeaders=host, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101//s3/aws4_request, SignedHeaders=host, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=x-amz-date, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;;x, Signature=ab",
    "AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/s3/aws4_request SignedHeaders=host Signature=ab",
])
def test_malformed_authorization_header(authorization: str) -> None:
    method, path, query, headers = _good_request()
    headers["x-amz-date"] = "20260101T000000Z"
    rejected("AuthorizationHeaderMalformed", 400, method, path, query, {**headers, "Authorization": authorization},
             now_s=calendar.timegm((2026, 1, 1, 0, 0, 0)))


def test_credential_date_must_match_request_date() -> None:
    method, path, query, headers = _good_request()
    headers["authorization"] = headers["authorization"].replace(f"{AK}/{headers['x-amz-date'][:8]}/",
                                                                f"{AK}/20000101/", 1)
    assert "/20000101/" in headers["authorization"]
    rejected("AuthorizationHeaderMalformed", 400, method, path, query, headers)


@pytest.mark.parametrize("scheme", ["AWS4-ECDSA-P256-SHA256 Credential=a", "Bearer token", "Basic dXNlcjpwYXNz"])
def test_other_authorization_schemes_are_unsupported(scheme: str) -> None:
    rejected("InvalidRequest", 400, "GET", "/", [], {"Host": "h", "Authorization": scheme})


def test_missing_payload_hash_header_is_invalid_request() -> None:
    method, path, query, headers = _good_request()
    del headers["x-amz-content-sha256"]
    error = rejected("InvalidRequest", 400, method, path, query, headers)
    assert error.message == "Missing required header for this request: x-amz-content-sha256"


def test_bad_payload_hash_header_is_invalid_argument() -> None:
    method, path, query, headers = _good_request()
    rejected("InvalidArgument", 400, method, path, query, {**headers, "x-amz-content-sha256": "abc"})
    rejected("InvalidArgument", 400, method, path, query,
             {**headers, "x-amz-content-sha256": "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"})


@pytest.mark.parametrize("date", [None, "yesterday", "2026-01-01T00:00:00Z", "20261301T000000Z"])
def test_missing_or_bad_date_is_access_denied(date: str | None) -> None:
    method, path, query, headers = _good_request()
    del headers["x-amz-date"]
    if date is not None:
        headers["x-amz-date"] = date
    rejected("AccessDenied", 403, method, path, query, headers)


def _presigned_query() -> tuple[str, list[tuple[str, str]]]:
    return split_url(PRESIGNER.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"}))


@pytest.mark.parametrize("name,value", [
    ("X-Amz-Expires", "0"), ("X-Amz-Expires", "604801"), ("X-Amz-Expires", "-5"), ("X-Amz-Expires", "1h"),
    ("X-Amz-Expires", None), ("X-Amz-Algorithm", "AWS4-HMAC-SHA1"), ("X-Amz-Date", "2026-12-01"),
    ("X-Amz-Date", None), ("X-Amz-Credential", "AK/20260101/us-east-1/s3"), ("X-Amz-SignedHeaders", "range"),
    ("X-Amz-Credential", None), ("X-Amz-SignedHeaders", None), ("X-Amz-Signature", None),
])
def test_malformed_presign_parameters(name: str, value: str | None) -> None:
    path, query = _presigned_query()
    query = [(k, v) for k, v in query if k != name] + ([(name, value)] if value is not None else [])
    rejected("AuthorizationQueryParametersError", 400, "GET", path, query, {"Host": "127.0.0.1:9000"})


def test_presign_credential_date_must_match_x_amz_date() -> None:
    path, query = _presigned_query()
    query = [(k, f"{AK}/20000101/us-east-1/s3/aws4_request") if k == "X-Amz-Credential" else (k, v)
             for k, v in query]
    rejected("AuthorizationQueryParametersError", 400, "GET", path, query, {"Host": "127.0.0.1:9000"})


# --- building blocks ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,canonical", [
    ("", "/"), ("/", "/"), ("/b/a%20b", "/b/a%20b"), ("/b/a+b", "/b/a%2Bb"), ("/b/%2b", "/b/%2B"),
    ("/b/caf%C3%A9", "/b/caf%C3%A9"), ("/b/a=b&c", "/b/a%3Db%26c"), ("/b/~x", "/b/~x"), ("/b/%7Ex", "/b/~x"),
    ("/b//./../x", "/b//./../x"), ("/b/%FF", "/b/%FF"),
])
def test_canonical_uri_encodes_once_and_never_normalises(raw: str, canonical: str) -> None:
    assert sigv4.canonical_uris(raw)[0] == canonical


def test_canonical_query_sorts_by_encoded_name_then_value() -> None:
    pairs = [("b", "2"), ("a", "z"), ("a", "y"), ("é", ""), ("a b", "c+d"), ("acl", "")]
    assert sigv4.canonical_query_string(pairs) == "%C3%A9=&a=y&a=z&a%20b=c%2Bd&acl=&b=2"


def test_signing_key_cache_is_bounded() -> None:
    for day in range(sigv4.SIGNING_KEY_CACHE_MAX_ENTRIES + 50):
        sigv4.signing_key("secret", f"2026{day:04d}", "r")
    assert len(sigv4._signing_keys) <= sigv4.SIGNING_KEY_CACHE_MAX_ENTRIES
    assert sigv4.signing_key("s", "20260101", "r") == sigv4.signing_key("s", "20260101", "r")
    assert sigv4.signing_key("s", "20260101", "r") != sigv4.signing_key("s", "20260101", "r2")
