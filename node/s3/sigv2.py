"""AWS Signature Version 2: what boto3's `generate_presigned_url` (and `aws s3 presign`)
still produce by default for an endpoint in us-east-1 (?AWSAccessKeyId=&Signature=&Expires=),
and the `Authorization: AWS key:signature` header form.

StringToSign = Method \\n Content-MD5 \\n Content-Type \\n Expires-or-Date \\n
CanonicalizedAmzHeaders CanonicalizedResource, signed with HMAC-SHA1, base64. Pure like
node.s3.sigv4: the caller passes the clock and the secret lookup.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime

from node.s3.errors import S3Error, access_denied
from node.s3.sigv4 import PRESIGN_MAX_EXPIRES_S, UNSIGNED_PAYLOAD, AuthResult

# The query parameters that are part of the signed resource (botocore's list).
SIGNED_SUBRESOURCES = frozenset({
    "accelerate", "acl", "cors", "defaultObjectAcl", "location", "logging", "partNumber",
    "policy", "requestPayment", "torrent", "versioning", "versionId", "versions", "website",
    "uploads", "uploadId", "response-content-type", "response-content-language",
    "response-expires", "response-cache-control", "response-content-disposition",
    "response-content-encoding", "delete", "lifecycle", "tagging", "restore", "storageClass",
    "notification", "replication", "analytics", "metrics", "inventory", "select",
    "select-type", "object-lock"})
MAX_SKEW_S = 900.0


def is_v2(query: Mapping[str, str], headers: Mapping[str, str]) -> bool:
    return ("Signature" in query and "AWSAccessKeyId" in query) or \
        headers.get("Authorization", "").startswith("AWS ")


def access_key_v2(query: Mapping[str, str], headers: Mapping[str, str]) -> str:
    if "AWSAccessKeyId" in query:
        return query["AWSAccessKeyId"]
    return headers.get("Authorization", "")[4:].rpartition(":")[0].strip()


def string_to_sign(method: str, raw_path: str, query: Sequence[tuple[str, str]],
                   headers: Mapping[str, str], expires_or_date: str) -> str:
    lower = {k.lower(): v for k, v in headers.items()}
    amz = sorted((k, v.strip()) for k, v in lower.items()
                 if k.startswith("x-amz-") and k != "x-amz-date")
    if "x-amz-date" in lower and not expires_or_date:
        amz = sorted(amz + [("x-amz-date", lower["x-amz-date"].strip())])
    subs = sorted((k, v) for k, v in query if k in SIGNED_SUBRESOURCES)
    resource = raw_path + ("?" + "&".join(f"{k}={v}" if v else k for k, v in subs) if subs else "")
    return "\n".join([method, lower.get("content-md5", ""), lower.get("content-type", ""),
                      expires_or_date]) + "\n" + "".join(f"{k}:{v}\n" for k, v in amz) + resource


def signed_paths(raw_path: str) -> list[str]:
    """The resource paths a client may have signed for a request to `raw_path`: itself,
    and for a bucket ("/bucket") also "/bucket/" - botocore's SigV2 signer signs the
    bucket with a trailing slash but sends the path without one (presigned ListObjects
    in us-east-1, signature_version="s3" clients on bucket requests)."""
    bucket_level = raw_path.count("/") == 1 and len(raw_path) > 1
    return [raw_path, raw_path + "/"] if bucket_level else [raw_path]


def sign(secret: str, text: str) -> str:
    mac = hmac.new(secret.encode(), text.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(mac).decode()


def authenticate_v2(method: str, raw_path: str, query: Sequence[tuple[str, str]],
                    headers: Mapping[str, str], lookup_secret: Callable[[str], str | None],
                    now_s: float) -> AuthResult:
    """Verify a SigV2 presigned URL or header; raise S3Error (S3's codes) if it fails."""
    q = dict(query)
    if "Signature" in q:
        access_key, given = q.get("AWSAccessKeyId", ""), q["Signature"]
        try:
            expires = int(q.get("Expires", ""))
        except ValueError:
            raise access_denied("Query-string authentication requires the Signature, "
                                "Expires and AWSAccessKeyId parameters") from None
        if expires < now_s:
            raise access_denied("Request has expired")
        if expires > now_s + PRESIGN_MAX_EXPIRES_S:    # a link for ever (the year 2100 ...)
            raise access_denied("Query-string authentication expires at most a week ahead "
                                f"({PRESIGN_MAX_EXPIRES_S} s), as SigV4's does")
        when = str(expires)
    else:
        access_key, _, given = headers.get("Authorization", "")[4:].strip().rpartition(":")
        date = headers.get("x-amz-date") or headers.get("Date", "")
        try:
            signed_at = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            raise access_denied("AWS authentication requires a valid Date or x-amz-date "
                                "header") from None
        if abs(signed_at - now_s) > MAX_SKEW_S:
            raise S3Error("RequestTimeTooSkewed", "The difference between the request time "
                          "and the current time is too large.", 403)
        when = "" if "x-amz-date" in headers else headers.get("Date", "")
    secret = lookup_secret(access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not "
                      "exist in our records.", 403)
    candidates = [sign(secret, string_to_sign(method, path, query, headers, when))
                  for path in signed_paths(raw_path)]
    if not any(hmac.compare_digest(expected, given) for expected in candidates):
        raise S3Error("SignatureDoesNotMatch", "The request signature we calculated does not "
                      "match the signature you provided. Check your key and signing method.", 403)
    return AuthResult(access_key=access_key, payload_sha256=UNSIGNED_PAYLOAD, signing_key=b"",
                      seed_signature="", amz_date="", scope="", presigned="Signature" in q)
