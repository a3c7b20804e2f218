"""A large streamed put and get keep the client's memory bounded."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from cli.localcluster import LocalCluster
from store.client import SyncClient

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent("""
    import asyncio, hashlib, sys
    from store.client import Client
    MIB = 1024 * 1024
    TOTAL_MIB = int(sys.argv[2])
    async def source():
        for i in range(TOTAL_MIB):
            yield bytes([i % 256]) * MIB
    async def main():
        async with Client.connect(sys.argv[1]) as c:
            await c.put("mem", "big", source())
            h, n = hashlib.sha256(), 0
            async for part in c.get_stream("mem", "big"):
                h.update(part); n += len(part)
        want = hashlib.sha256()
        for i in range(TOTAL_MIB):
            want.update(bytes([i % 256]) * MIB)
        assert n == TOTAL_MIB * MIB and h.digest() == want.digest()
        # VmHWM starts anew at exec; ru_maxrss would carry the pytest parent's peak
        print(next(int(l.split()[1]) for l in open("/proc/self/status")
                   if l.startswith("VmHWM")) // 1024)
    asyncio.run(main())
""")


def test_512_mib_put_and_get_stay_under_200_mib_of_client_memory(cluster: LocalCluster,
                                                                  client: SyncClient) -> None:
    client.create_bucket("mem")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(cluster.path), "512"], cwd=ROOT,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    peak_mib = int(out.stdout.decode().split()[-1])
    print(f"client peak RSS for a 512 MiB put+get: {peak_mib} MiB")
    assert peak_mib < 200
