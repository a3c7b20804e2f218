"""`--workers N`: gateway processes share one port; a killed first process takes the
others with it (no orphans serving a stale cluster)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import boto3
import pytest

from cli.localcluster import LocalCluster, pid_alive
from tests.cluster.conftest import wait_for


def worker_pids(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_workers_share_the_port_and_die_with_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECSTORE_GATEWAY_WORKERS", "3")
    tmp = Path(tempfile.mkdtemp(prefix="ecstore-gwworkers-"))
    c = LocalCluster.create(tmp, storage=6, control=3, fsync=False, gateway=True)
    try:
        c.start()
        gw = c.gateway
        assert gw is not None
        parent = c.nodes["gw1"].pid
        assert parent is not None
        children = worker_pids(parent)
        assert len(children) == 2
        s3 = boto3.client("s3", endpoint_url=gw["url"], aws_access_key_id=gw["access_key"],
                          aws_secret_access_key=gw["secret_key"], region_name="us-east-1")
        s3.create_bucket(Bucket="workers")
        for i in range(30):  # new connections each time: the kernel spreads them over workers
            body = os.urandom(1000 + i)
            s3.put_object(Bucket="workers", Key=f"k{i}", Body=body)
            assert s3.get_object(Bucket="workers", Key=f"k{i}")["Body"].read() == body
            s3.head_bucket(Bucket="workers")
        os.kill(parent, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) or os.path.exists(f"/proc/{p}") for p in children),
                 timeout_s=15, what="gateway workers to exit after their parent died")
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
