"""The S3 gateway as its users reach it: boto3, the aws cli and raw SigV4 requests.

A test module imports the fixtures it uses by name, e.g.
`from tests.cluster.s3_fixtures import s3, s3_cluster  # noqa: F401`.

Each module gets its own local cluster with a gateway. The machine's AWS configuration
(~/.aws, AWS_* variables) is hidden from every client while the module runs, so boto3, the
aws cli and s3fs run with their default settings and only the gateway's key.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zlib
from base64 import b64encode
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock
from urllib.parse import urlsplit

import boto3
import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from cli.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 60.0
AWS_CLI_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 60.0
KEY_PROPAGATION_S = 15.0   # the gateway caches keys for ~5 s; allow three times that
T = TypeVar("T")


@dataclass(frozen=True)
class Gateway:
    url: str
    access_key: str
    secret_key: str
    region: str

    @property
    def host(self) -> str:
        return str(urlsplit(self.url).hostname)

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 80)


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]   # names lower-cased
    body: bytes

    @property
    def code(self) -> str | None:
        """The <Code> of an S3 XML error body, None when the body is not one."""
        return xml_error_code(self.body)


def xml_error_code(body: bytes) -> str | None:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    return root.findtext("Code") if root.tag == "Error" else None


def md5_b64(data: bytes) -> str:
    return b64encode(hashlib.md5(data).digest()).decode()


# ---- the cluster and its clients ---------------------------------------------------------
# Every fixture here depends on s3_cluster alone, so a module imports just what it uses.
@contextlib.contextmanager
def gateway_cluster(request: pytest.FixtureRequest, prefix: str, *, fsync: bool = True,
                    unset: Iterable[str] = (), env: dict[str, str] | None = None
                    ) -> Iterator[LocalCluster]:
    """A local cluster with the gateway in TMP/cluster; while it runs no AWS_* variable or
    AWS config file of the machine is seen (TMP/no-such-aws-* do not exist), the variables
    `unset` are unset and `env` is set (the nodes inherit both)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("AWS_") or name in unset:
                mp.delenv(name)
        mp.setenv("AWS_CONFIG_FILE", str(tmp / "no-such-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-such-aws-credentials"))
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        c = LocalCluster.create(tmp / "cluster", storage=6, control=3, k=4, m=2, gateway=True,
                                fsync=fsync)
        try:
            c.start()
            yield c
        finally:
            c.stop()
            if request.config.getoption("--keep-tmp"):
                print(f"\nkept test directory {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def s3_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with gateway_cluster(request, "ecstore-s3-") as c:
        yield c


def gateway_of(cluster: LocalCluster) -> Gateway:
    g = cluster.gateway
    assert g and {"url", "access_key", "secret_key", "region"} <= g.keys(), g
    return Gateway(g["url"], g["access_key"], g["secret_key"], g["region"])


@pytest.fixture(scope="module")
def gateway(s3_cluster: LocalCluster) -> Gateway:
    return gateway_of(s3_cluster)


def make_client(gw: Gateway, access_key: str | None = None, secret_key: str | None = None, *,
                retries: bool = True, **config: Any) -> BaseClient:
    """A boto3 S3 client with the default config (retries, checksums, addressing).

    `retries=False` only turns off botocore's retries, for tests of errors it retries
    (BadDigest is one) that would otherwise wait through its backoff; `config` is passed
    to botocore's Config (read_timeout=..., signature_version="s3v4" for SigV4 presigning).
    """
    session = boto3.session.Session()
    if not retries:
        config["retries"] = {"total_max_attempts": 1}
    return session.client("s3", endpoint_url=gw.url, region_name=gw.region,
                          config=Config(**config) if config else None,
                          aws_access_key_id=access_key or gw.access_key,
                          aws_secret_access_key=secret_key or gw.secret_key)


@pytest.fixture(scope="module")
def s3(s3_cluster: LocalCluster) -> BaseClient:
    return make_client(gateway_of(s3_cluster))


@pytest.fixture(scope="module")
def s3_once(s3_cluster: LocalCluster) -> BaseClient:
    """Like `s3`, without retries."""
    return make_client(gateway_of(s3_cluster), retries=False)


@pytest.fixture(scope="module")
def s3_resource(s3_cluster: LocalCluster) -> Any:
    gw = gateway_of(s3_cluster)
    return boto3.session.Session().resource(
        "s3", endpoint_url=gw.url, region_name=gw.region,
        aws_access_key_id=gw.access_key, aws_secret_access_key=gw.secret_key)


def aws_env(cluster: LocalCluster, gw: Gateway) -> dict[str, str]:
    """The environment of an `aws` subprocess: this key, no config files, no AWS_* else."""
    tmp = cluster.dir.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=gw.access_key, AWS_SECRET_ACCESS_KEY=gw.secret_key,
               AWS_DEFAULT_REGION=gw.region,
               AWS_CONFIG_FILE=str(tmp / "no-such-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-such-aws-credentials"))
    return env


@pytest.fixture(scope="module")
def s3_env(s3_cluster: LocalCluster) -> dict[str, str]:
    return aws_env(s3_cluster, gateway_of(s3_cluster))


AwsCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module")
def aws(s3_cluster: LocalCluster) -> AwsCli:
    """`aws(*args, ok=True)`: run `aws --endpoint-url URL *args` (the awscli of this Python)."""
    gw = gateway_of(s3_cluster)
    env = aws_env(s3_cluster, gw)

    def run(*args: str, ok: bool = True, timeout_s: float = AWS_CLI_TIMEOUT_S,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "awscli", "--endpoint-url", gw.url, *args],
                              env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=cwd, stdin=subprocess.DEVNULL)
        if ok:
            assert proc.returncode == 0, f"aws {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
        return proc
    return run


# ---- errors and polling ------------------------------------------------------------------
def client_error(call: Callable[[], object]) -> tuple[str, int]:
    """Run a boto3 call that must fail; return (S3 error code, HTTP status)."""
    with pytest.raises(ClientError) as exc:
        call()
    resp = exc.value.response
    return resp["Error"]["Code"], resp["ResponseMetadata"]["HTTPStatusCode"]


def poll(fn: Callable[[], T], until: Callable[[T], bool], timeout_s: float, what: str) -> T:
    """Call fn until `until(result)` holds; fail after timeout_s with the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = fn()
        if until(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {result!r}")
        time.sleep(0.1)


# ---- raw HTTP ----------------------------------------------------------------------------
def http_request(method: str, url: str, body: bytes | Iterable[bytes] = b"",
                 headers: dict[str, str] | None = None, chunked: bool = False) -> RawResponse:
    """One HTTP request with http.client, exactly as given (no retries, no redirects)."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = http.client.HTTPConnection(str(parts.hostname), parts.port or 80, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request(method, target, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = conn.getresponse()
        data = resp.read()
        return RawResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def sign(gw: Gateway, method: str, url: str, body: bytes = b"",
         headers: dict[str, str] | None = None, *, secret_key: str | None = None,
         trailer: str | None = None, skew_s: float = 0.0) -> dict[str, str]:
    """The headers botocore's own SigV4 signer adds for this request (payload hash signed).

    `trailer` (e.g. "x-amz-checksum-crc32") signs as STREAMING-UNSIGNED-PAYLOAD-TRAILER, as
    boto3 does over TLS. `skew_s` moves the signer's clock.
    """
    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    if trailer:
        algorithm = trailer.removeprefix("x-amz-checksum-")
        req.context["checksum"] = {"request_algorithm": {"in": "trailer", "algorithm": algorithm,
                                                         "name": trailer}}
    creds = Credentials(gw.access_key, secret_key or gw.secret_key)
    if skew_s:
        now = botocore.auth.get_current_datetime() + timedelta(seconds=skew_s)
        with mock.patch("botocore.auth.get_current_datetime", return_value=now):
            S3SigV4Auth(creds, "s3", gw.region).add_auth(req)
    else:
        S3SigV4Auth(creds, "s3", gw.region).add_auth(req)
    return {k: v for k, v in req.headers.items()}


def raw_request(gw: Gateway, method: str, path: str, query: str = "", body: bytes = b"",
                headers: dict[str, str] | None = None, *, anonymous: bool = False,
                secret_key: str | None = None, trailer: str | None = None, skew_s: float = 0.0,
                wire_body: Iterable[bytes] | None = None) -> RawResponse:
    """A request signed in headers (unless anonymous), sent with http.client.

    `path` is already URL-encoded. With `trailer`, `wire_body` is the aws-chunked body,
    sent with HTTP chunked transfer encoding as botocore sends it.
    """
    url = gw.url + path + (f"?{query}" if query else "")
    sent = dict(headers or {}) if anonymous else sign(
        gw, method, url, body, headers, secret_key=secret_key, trailer=trailer, skew_s=skew_s)
    if wire_body is not None:
        return http_request(method, url, wire_body, sent, chunked=True)
    return http_request(method, url, body, sent)


# ---- access keys through the CLI ---------------------------------------------------------
def ecstore(cluster_path: Path | None, *args: str, ok: bool = True,
            timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the `ecstore` CLI (with `--cluster cluster_path` unless None) as a user runs it."""
    flags = ["--cluster", str(cluster_path)] if cluster_path is not None else []
    proc = subprocess.run([sys.executable, "-m", "cli.main", *flags, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if ok:
        assert proc.returncode == 0, f"ecstore {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return proc


def create_key(cluster: LocalCluster, user: str) -> dict[str, str]:
    """`ecstore key create --user USER --json`, then wait until the gateway accepts the key."""
    key = json.loads(ecstore(cluster.path, "key", "create", "--user", user, "--json").stdout)
    assert {"access_key", "secret_key", "user"} <= key.keys(), key
    assert key["user"] == user
    wait_key_state(gateway_of(cluster), key, works=True)
    return key


def key_status(gw: Gateway, key: dict[str, str]) -> str:
    """'ok' if ListBuckets with the key succeeds, else the S3 error code."""
    try:
        make_client(gw, key["access_key"], key["secret_key"], retries=False).list_buckets()
        return "ok"
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])


def wait_key_state(gw: Gateway, key: dict[str, str], works: bool) -> str:
    """Poll until the gateway accepts (or refuses) the key; return the last status."""
    want = "usable" if works else "refused"
    return poll(lambda: key_status(gw, key), lambda s: (s == "ok") == works,
                KEY_PROPAGATION_S, f"key {key['access_key']} to be {want}")


def user_client(gw: Gateway, key: dict[str, str]) -> BaseClient:
    return make_client(gw, key["access_key"], key["secret_key"])


# ---- helpers shared by the S3 test modules -------------------------------------------
def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def crc32_b64(data: bytes) -> str:
    return b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def status(resp: dict) -> int:
    return int(resp["ResponseMetadata"]["HTTPStatusCode"])


def record_headers(client: BaseClient, event: str) -> list[dict[str, str]]:
    """The headers of every request `client` sends for `event` (e.g. "PutObject", "*")."""
    sent: list[dict[str, str]] = []

    def record(request: Any, **_: object) -> None:
        sent.append({k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()})
    client.meta.events.register(f"before-send.s3.{event}", record)
    return sent


MiB = 1024 * 1024
SEG = 4 * MiB          # the default policy's segment size
BUCKET = "objects"


@pytest.fixture(scope="module")
def bucket(s3: BaseClient) -> str:
    """One bucket per module (each module has a cluster of its own)."""
    s3.create_bucket(Bucket=BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def ragged(s3: BaseClient, bucket: str) -> bytes:
    """Two full 4 MiB segments and a ragged third, stored with one PutObject."""
    data = blob(2 * SEG + 12345, 1)
    s3.put_object(Bucket=bucket, Key="ragged", Body=data)
    return data
