"""`python -m bench.training` in a tiny form against the real cluster it starts: every read
checked, no fragment GET once the shared cache holds the data set, the herd's segments
fetched once in all with the cache (and once per reader without), and the storage nodes'
own reads agree."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
READERS, HERD_READERS, SHARDS = 2, 3, 4
ARGS = ["--shards", str(SHARDS), "--shard-mib", "4", "--readers", str(READERS), "--epochs", "2",
        "--herd-readers", str(HERD_READERS), "--herd-mib", "8"]
SHARD_SEGMENTS, HERD_SEGMENTS = 1, 2          # 4 MiB segments


def run_training(tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
    out = tmp_path / "training.json"
    proc = subprocess.run([sys.executable, "-m", "bench.training", *ARGS, "--json", str(out)], cwd=ROOT,
                          capture_output=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), proc.stderr.decode()[-3000:]
    return proc, json.loads(out.read_text())


def test_tiny_training_run_reads_right_and_the_cache_spares_the_cluster(tmp_path: Path) -> None:
    proc, report = run_training(tmp_path)
    assert proc.returncode == 0, (report["meta"]["failures"], proc.stderr.decode()[-3000:])
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    phases = report["epochs"] + report["herd"]
    assert [p["name"] for p in phases] == ["epoch 1, no cache", "epoch 2, no cache", "epoch 1, cache",
                                           "epoch 2, cache", "herd, no cache", "herd, cache",
                                           "herd, cache, warm"]
    for p in phases:
        assert p["wrong_reads"] == 0 and p["errors"] == 0, p
        assert p["bytes"] == p["expected_bytes"] > 0 and p["mb_s"] > 0, p
    data_set = SHARDS * SHARD_SEGMENTS
    e1, e2, c1, c2 = report["epochs"]
    for p in (e1, e2, c1):
        assert p["segments_fetched"] == data_set and p["fragment_gets"] >= 4 * data_set, p
        assert p["server"]["fragment_reads_est"] >= 4 * data_set, p
    assert c2["fragment_gets"] == 0 and c2["segments_fetched"] == 0, c2
    assert c2["cache_hits"] == data_set and c2["server"]["fragment_reads_est"] == 0, c2
    no_cache, cold, warm = report["herd"]
    assert no_cache["segments_fetched"] == HERD_READERS * HERD_SEGMENTS, no_cache
    assert cold["segments_fetched"] == cold["object_segments"] == HERD_SEGMENTS, cold
    assert cold["cache_hits"] == (HERD_READERS - 1) * HERD_SEGMENTS, cold
    assert warm["fragment_gets"] == 0 and warm["cache_hits"] == HERD_READERS * HERD_SEGMENTS, warm
    assert "herd, cache" in proc.stdout.decode()
