"""AWS Signature Version 4 verification: the Authorization header and presigned (query) URLs.

Pure: the caller passes the clock (`now_s`) and a secret lookup; nothing here does I/O. Every
rejection is an S3Error carrying the code S3 answers:

    AuthorizationHeaderMalformed 400       bad Authorization header, credential scope or date
    AuthorizationQueryParametersError 400  bad or missing X-Amz-* presign parameters
    InvalidRequest 400                     not SigV4 (SigV2 "AWS ak:sig", other schemes): the
                                           answer of S3 regions that accept only SigV4; also a
                                           missing x-amz-content-sha256
    InvalidArgument 400                    both header and query auth; bad x-amz-content-sha256
    AccessDenied 403                       presign expired / not yet valid, no usable date,
                                           x-amz-* headers present but not signed
    InvalidAccessKeyId 403                 unknown access key
    RequestTimeTooSkewed 403               header auth date more than max_skew_s from now
    SignatureDoesNotMatch 403              wrong signature

The chunk and trailer signatures of aws-chunked bodies are computed here too (`chunk_signature`,
`trailer_signature`); node.s3.body verifies them.
"""
from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote_to_bytes

from node.s3.errors import S3Error, access_denied

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_PAYLOADS = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER})
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
PRESIGN_MAX_EXPIRES_S = 604_800  # one week, S3's limit
SIGNING_KEY_CACHE_MAX_ENTRIES = 256  # (secret, date, region) triples; one per key and day in practice
PRESIGN_PARAMS = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                  "X-Amz-SignedHeaders", "X-Amz-Signature")

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_SCOPE_DATE = re.compile(r"[0-9]{8}")
_signing_keys: dict[tuple[str, str, str], bytes] = {}


@dataclass(frozen=True)
class AuthResult:
    access_key: str
    payload_sha256: str  # the x-amz-content-sha256 value; "UNSIGNED-PAYLOAD" for presigned
    signing_key: bytes  # derived key, verifies aws-chunked chunk signatures
    seed_signature: str  # the request's signature: seed of the chunk-signature chain
    amz_date: str  # e.g. 20261201T101500Z
    scope: str  # e.g. 20261201/us-east-1/s3/aws4_request
    presigned: bool


@dataclass(frozen=True)
class _Claim:
    """What a request says about its own signature, before any check against a secret."""
    access_key: str
    scope_date: str
    region: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str
    payload_sha256: str
    presigned: bool

    @property
    def scope(self) -> str:
        return f"{self.scope_date}/{self.region}/s3/aws4_request"


def authenticate(method: str, raw_path: str, query: Sequence[tuple[str, str]], headers: Mapping[str, str],
                 lookup_secret: Callable[[str], str | None], now_s: float,
                 max_skew_s: float = 900.0) -> AuthResult | None:
    """Verify a request's SigV4 signature (header or presigned). `raw_path` is the path as sent (percent-encoded,
    no query); `query` the decoded pairs in order; `now_s` Unix seconds. Returns None when the request carries no
    authentication at all (anonymous), the verified AuthResult otherwise; raises S3Error (module docstring)."""
    lower = _lower_headers(headers)
    names = {name for name, _ in query}
    query_auth = bool(names & {"X-Amz-Algorithm", "X-Amz-Signature", "X-Amz-Credential"})
    if "authorization" not in lower and not query_auth:
        if {"AWSAccessKeyId", "Signature"} <= names:
            raise _unsupported_mechanism()
        return None
    if "authorization" in lower and query_auth:
        raise S3Error("InvalidArgument", "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
                      "Signature query string parameter or the Authorization header should be specified")
    if query_auth:
        claim = _parse_query_auth(query, lower, now_s, max_skew_s)
        canonical_query = [(n, v) for n, v in query if n != "X-Amz-Signature"]
    else:
        claim = _parse_header_auth(lower, now_s, max_skew_s)
        canonical_query = list(query)
    _check_x_amz_headers_signed(lower, claim.signed_headers)
    secret = lookup_secret(claim.access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.", 403)
    key = signing_key(secret, claim.scope_date, claim.region)
    query_text = canonical_query_string(canonical_query)
    for uri in canonical_uris(raw_path):
        request = canonical_request(method, uri, query_text, lower, claim.signed_headers, claim.payload_sha256)
        expected = _hmac_hex(key, string_to_sign(claim.amz_date, claim.scope, request))
        if hmac.compare_digest(expected, claim.signature):
            return AuthResult(claim.access_key, claim.payload_sha256, key, claim.signature, claim.amz_date,
                              claim.scope, claim.presigned)
    raise S3Error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you "
                  "provided. Check your key and signing method.", 403)


def _lower_headers(headers: Mapping[str, str]) -> dict[str, list[str]]:
    """Lower-case names -> every value in order (a multidict repeats a name in items())."""
    lower: dict[str, list[str]] = {}
    for name, value in headers.items():
        lower.setdefault(name.lower(), []).append(value)
    return lower


def _first(lower: dict[str, list[str]], name: str) -> str | None:
    values = lower.get(name)
    return values[0] if values else None


def _unsupported_mechanism() -> S3Error:
    return S3Error("InvalidRequest", "The authorization mechanism you have provided is not supported. "
                   "Please use AWS4-HMAC-SHA256.")


def _header_malformed(detail: str) -> S3Error:
    return S3Error("AuthorizationHeaderMalformed", f"The authorization header is malformed; {detail}")


def _query_malformed(detail: str) -> S3Error:
    return S3Error("AuthorizationQueryParametersError", detail)


def _parse_header_auth(lower: dict[str, list[str]], now_s: float, max_skew_s: float) -> _Claim:
    algorithm, _, rest = (_first(lower, "authorization") or "").strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _unsupported_mechanism()
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name in fields:
            raise _header_malformed(f"the Authorization header component \"{part.strip()}\" is malformed.")
        fields[name] = value
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise _header_malformed("expecting Credential, SignedHeaders and Signature.")
    access_key, scope_date, region = _parse_credential(fields["Credential"], _header_malformed)
    amz_date = _header_amz_date(lower)
    request_s = _amz_date_s(amz_date)
    if amz_date[:8] != scope_date:
        raise _header_malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    if abs(request_s - now_s) > max_skew_s:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and the current time is "
                      "too large.", 403)
    payload = _first(lower, "x-amz-content-sha256")
    if payload is None:
        raise S3Error("InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
    if payload not in STREAMING_PAYLOADS and payload != UNSIGNED_PAYLOAD and not _HEX_SHA256.fullmatch(payload):
        raise S3Error("InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a STREAMING- value of "
                      "AWS4-HMAC-SHA256 or a valid sha256 value.")
    signed = _parse_signed_headers(fields["SignedHeaders"], _header_malformed)
    return _Claim(access_key, scope_date, region, signed, fields["Signature"], amz_date, payload, False)


def _parse_query_auth(query: Sequence[tuple[str, str]], lower: dict[str, list[str]], now_s: float,
                      max_skew_s: float) -> _Claim:
    params: dict[str, str] = {}
    for name, value in query:
        params.setdefault(name, value)
    if any(name not in params for name in PRESIGN_PARAMS):
        raise _query_malformed("Query-string authentication version 4 requires the X-Amz-Algorithm, "
                               "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
                               "and X-Amz-Expires parameters.")
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise _query_malformed(f"X-Amz-Algorithm only supports \"{ALGORITHM}\"")
    access_key, scope_date, region = _parse_credential(params["X-Amz-Credential"], _query_malformed)
    amz_date = params["X-Amz-Date"]
    if not _AMZ_DATE.fullmatch(amz_date):
        raise _query_malformed("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"")
    if amz_date[:8] != scope_date:
        raise _query_malformed("Invalid credential date. Date is not the same as X-Amz-Date.")
    _check_presign_window(_amz_date_s(amz_date), _presign_expires_s(params["X-Amz-Expires"]), now_s, max_skew_s)
    signed = _parse_signed_headers(params["X-Amz-SignedHeaders"], _query_malformed)
    return _Claim(access_key, scope_date, region, signed, params["X-Amz-Signature"], amz_date,
                  UNSIGNED_PAYLOAD, True)


def _presign_expires_s(text: str) -> int:
    if not text.isdigit():
        raise _query_malformed("X-Amz-Expires should be a number")
    expires_s = int(text)
    if expires_s < 1:
        raise _query_malformed("X-Amz-Expires must be at least 1 second")
    if expires_s > PRESIGN_MAX_EXPIRES_S:
        raise _query_malformed(f"X-Amz-Expires must be less than a week (in seconds) that is {PRESIGN_MAX_EXPIRES_S}")
    return expires_s


def _check_presign_window(signed_at_s: int, expires_s: int, now_s: float, max_skew_s: float) -> None:
    if signed_at_s + expires_s < now_s:
        raise access_denied("Request has expired")
    if signed_at_s - max_skew_s > now_s:
        raise access_denied("Request is not valid yet")


def _parse_credential(text: str, error: Callable[[str], S3Error]) -> tuple[str, str, str]:
    """'AK/YYYYMMDD/region/s3/aws4_request' -> (access key, date, region); any region is accepted."""
    parts = text.split("/")
    if len(parts) != 5 or not parts[0] or not parts[2] or not _SCOPE_DATE.fullmatch(parts[1]):
        raise error("the Credential is mal-formed; expecting \"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\".")
    access_key, scope_date, region, service, terminal = parts
    if service != "s3":
        raise error(f"incorrect service \"{service}\". This endpoint belongs to \"s3\".")
    if terminal != "aws4_request":
        raise error(f"incorrect terminal \"{terminal}\". This endpoint uses \"aws4_request\".")
    return access_key, scope_date, region


def _parse_signed_headers(text: str, error: Callable[[str], S3Error]) -> tuple[str, ...]:
    names = tuple(name.lower() for name in text.split(";"))
    if not all(names):
        raise error("SignedHeaders is mal-formed.")
    if "host" not in names:
        raise error("SignedHeaders must include host.")
    return names


def _check_x_amz_headers_signed(lower: dict[str, list[str]], signed: tuple[str, ...]) -> None:
    """S3 refuses x-amz-* headers (metadata, ACLs, copy sources) that the signature does not cover."""
    unsigned = sorted(name for name in lower if name.startswith("x-amz-") and name not in signed)
    if unsigned:
        raise access_denied("There were headers present in the request which were not signed: " + ", ".join(unsigned))


def _header_amz_date(lower: dict[str, list[str]]) -> str:
    """The request time as yyyyMMddTHHmmssZ, from x-amz-date or else the Date header."""
    amz_date = _first(lower, "x-amz-date")
    if amz_date is not None and _AMZ_DATE.fullmatch(amz_date):
        return amz_date
    date = _first(lower, "date")
    if amz_date is None and date is not None:
        try:
            return time.strftime("%Y%m%dT%H%M%SZ", parsedate_to_datetime(date).utctimetuple())
        except (TypeError, ValueError):
            pass
    raise access_denied("AWS authentication requires a valid Date or x-amz-date header")


def _amz_date_s(amz_date: str) -> int:
    try:
        return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise access_denied("AWS authentication requires a valid Date or x-amz-date header") from None


def canonical_uris(raw_path: str) -> tuple[str, ...]:
    """The canonical URIs a signer may have used: the path re-encoded as S3 expects (each byte outside
    unreserved and '/' percent-encoded once, upper-case hex, no normalisation: what botocore signs), then the path
    exactly as sent, for clients that sign their own wire encoding (lower-case hex, unencoded '=' or '@')."""
    path = raw_path or "/"
    normalized = quote(unquote_to_bytes(path), safe="/~")
    return (normalized,) if normalized == path else (normalized, path)


def canonical_query_string(pairs: Sequence[tuple[str, str]]) -> str:
    """Every pair URI-encoded (RFC 3986), sorted by encoded name then value; empty values as 'name='."""
    encoded = sorted((quote(name, safe="-_.~"), quote(value, safe="-_.~")) for name, value in pairs)
    return "&".join(f"{name}={value}" for name, value in encoded)


def canonical_request(method: str, canonical_uri: str, canonical_query: str, lower_headers: dict[str, list[str]],
                      signed_headers: Sequence[str], payload_sha256: str) -> str:
    lines = "".join(f"{name}:{_canonical_value(lower_headers.get(name, []))}\n" for name in signed_headers)
    return "\n".join([method.upper(), canonical_uri, canonical_query, lines, ";".join(signed_headers),
                      payload_sha256])


def _canonical_value(values: list[str]) -> str:
    """Values trimmed, inner runs of whitespace collapsed, repeated headers joined with ','."""
    return ",".join(" ".join(value.split()) for value in values)


def string_to_sign(amz_date: str, scope: str, canonical: str) -> str:
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"


def signing_key(secret: str, scope_date: str, region: str) -> bytes:
    """kSigning = HMAC chain over date, region, 's3', 'aws4_request'; cached, at most
    SIGNING_KEY_CACHE_MAX_ENTRIES, the oldest evicted first."""
    cache_key = (secret, scope_date, region)
    key = _signing_keys.get(cache_key)
    if key is None:
        key = ("AWS4" + secret).encode()
        for part in (scope_date, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        if len(_signing_keys) >= SIGNING_KEY_CACHE_MAX_ENTRIES:
            del _signing_keys[next(iter(_signing_keys))]
        _signing_keys[cache_key] = key
    return key


def chunk_signature(auth: AuthResult, previous_signature: str, chunk_sha256_hex: str) -> str:
    """Signature of one aws-chunked chunk, chained on the previous chunk's (the seed for the first)."""
    text = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", auth.amz_date, auth.scope, previous_signature, EMPTY_SHA256,
                      chunk_sha256_hex])
    return _hmac_hex(auth.signing_key, text)


def trailer_signature(auth: AuthResult, previous_signature: str, trailer_sha256_hex: str) -> str:
    """Signature of the trailing headers ('name:value\\n' each, sorted), chained on the final chunk's."""
    text = "\n".join(["AWS4-HMAC-SHA256-TRAILER", auth.amz_date, auth.scope, previous_signature,
                      trailer_sha256_hex])
    return _hmac_hex(auth.signing_key, text)


def _hmac_hex(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
