"""`python -m bench.degraded` in a tiny form against the real cluster it starts: every
byte read checked (objects of 9 MiB and a bit: a short last segment), the healthy
rounds read no segment degraded, the rounds with two storage nodes killed do - every
such segment rebuilt in place in the first, through pyeclib in the second, the same
bytes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_degraded_bench_reads_right_both_ways() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.degraded", "--streams", "2", "--mib", "9",
                           "--tail", "12345",
                           "--rounds", "1", "--verify", "--json"], cwd=ROOT, capture_output=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["state"], r["rebuild"]) for r in rows] == [
        ("healthy", "-"), ("degraded", "isa-l in place"), ("degraded", "pyeclib")]
    for r in rows:
        assert r["errors"] == [] and r["mb_s"] > 0, r
    assert rows[0]["degraded_segments"] == rows[0]["rebuilt_in_place"] == 0
    # each degraded segment rebuilt in place in the first, none in the second
    assert rows[1]["degraded_segments"] == rows[1]["rebuilt_in_place"] > 0
    assert rows[2]["degraded_segments"] > 0 and rows[2]["rebuilt_in_place"] == 0
