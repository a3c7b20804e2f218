"""bench/checkpoint.py end to end, small: its own cluster and two gloo ranks save and load
through DCP and raw puts and gets, every phase verified against the tensors saved (the
run exits 1 otherwise). A change that broke the ranks' code once hung the benchmark
while every test passed: this runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'ecstore[torch]')")

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["ecstore DCP save", "ecstore DCP load, warm", "ecstore DCP load, cold",
          "ecstore raw put, one object a tensor (no DCP)",
          "ecstore raw get, one object a tensor (no DCP)"]


def test_a_small_run_saves_and_loads_every_phase_verified(tmp_path: Path) -> None:
    out = tmp_path / "ck.json"
    run = subprocess.run([sys.executable, "-m", "bench.checkpoint", "--quick", "--only", "ecstore",
                          "--ranks", "2", "--mib-per-rank", "8", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["phase"] for r in report["rows"]] == PHASES
    for r in report["rows"]:
        assert r["verified"] is True and r["bytes"] == 2 * 8 * 1024 * 1024, r
        assert r["seconds"] > 0 and r["mb_s"] > 0 and r["ranks_cpu_s"] > 0, r
    assert report["meta"]["ranks"] == 2 and report["meta"]["fsync"] is True
    assert "ecstore DCP save" in run.stdout
