"""Virtual-hosted-style requests (bucket.DOMAIN/key: the AWS SDKs for JavaScript v3, Go v2
and Java v2 send them by default) with ECSTORE_S3_DOMAIN set: boto3 with addressing_style
"virtual" does everything through them, and path style keeps working beside them.
`*.s3.test` resolves to 127.0.0.1 in this process only (socket.getaddrinfo patched)."""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.client import BaseClient

from cli.localcluster import LocalCluster
from tests.cluster.s3_fixtures import Gateway, gateway_cluster, gateway_of, make_client

DOMAIN = "s3.test"


@pytest.fixture(scope="module")
def vhost_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with gateway_cluster(request, "ecstore-vhost-", env={"ECSTORE_S3_DOMAIN": DOMAIN}) as c:
        yield c


@pytest.fixture(scope="module")
def resolve_test_domain() -> Iterator[None]:
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and (host == DOMAIN or host.endswith("." + DOMAIN)):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        yield


def clients(cluster: LocalCluster) -> tuple[BaseClient, BaseClient]:
    """(virtual-hosted, path-style) boto3 clients of the gateway, reached as s3.test."""
    gw = gateway_of(cluster)
    port = urlsplit(gw.url).port
    named = Gateway(f"http://{DOMAIN}:{port}", gw.access_key, gw.secret_key, gw.region)
    return (make_client(named, s3={"addressing_style": "virtual"}),
            make_client(named, s3={"addressing_style": "path"}))


def test_virtual_hosted_requests_reach_the_bucket_in_the_host(
        vhost_cluster: LocalCluster, resolve_test_domain: None) -> None:
    virtual, path = clients(vhost_cluster)
    virtual.create_bucket(Bucket="vbkt")
    path.create_bucket(Bucket="other")
    virtual.put_object(Bucket="vbkt", Key="other/deep key", Body=b"in vbkt")
    virtual.put_object(Bucket="vbkt", Key="other", Body=b"a key named like a bucket")
    assert path.get_object(Bucket="vbkt", Key="other/deep key")["Body"].read() == b"in vbkt"
    assert path.list_objects_v2(Bucket="other").get("KeyCount") == 0   # nothing went there
    listed = virtual.list_objects_v2(Bucket="vbkt")["Contents"]
    assert [o["Key"] for o in listed] == ["other", "other/deep key"]
    assert virtual.head_object(Bucket="vbkt", Key="other")["ContentLength"] == 25
    assert virtual.get_object(Bucket="vbkt", Key="other", Range="bytes=0-0")["Body"].read() == b"a"
    up = virtual.create_multipart_upload(Bucket="vbkt", Key="mp")
    part = virtual.upload_part(Bucket="vbkt", Key="mp", UploadId=up["UploadId"], PartNumber=1,
                               Body=b"multi")
    done = virtual.complete_multipart_upload(
        Bucket="vbkt", Key="mp", UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    # the object's URL: the bucket in the host, not again in the path (a key "vbkt/mp")
    assert urlsplit(done["Location"])[1:3] == (f"vbkt.{DOMAIN}:{urlsplit(path.meta.endpoint_url).port}", "/mp")
    assert path.get_object(Bucket="vbkt", Key="mp")["Body"].read() == b"multi"
    url = virtual.generate_presigned_url("get_object", Params={"Bucket": "vbkt", "Key": "mp"})
    assert urlsplit(url).hostname == f"vbkt.{DOMAIN}"
    with urllib.request.urlopen(url, timeout=30) as r:     # noqa: S310 - our own gateway
        assert r.read() == b"multi"
    virtual.delete_object(Bucket="vbkt", Key="other")    # the object, not the bucket "other"
    path.head_bucket(Bucket="other")
    assert [o["Key"] for o in path.list_objects_v2(Bucket="vbkt")["Contents"]] == \
        ["mp", "other/deep key"]
    names = {b["Name"] for b in virtual.list_buckets()["Buckets"]}
    assert {"vbkt", "other"} <= names
