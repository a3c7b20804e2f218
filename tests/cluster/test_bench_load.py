"""`python -m bench.load` in its smallest form against the real cluster it starts: both
modes, every phase; the JSON it writes has sane numbers and every get was checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.load import READBACK_OBJECTS

ROOT = Path(__file__).resolve().parents[2]
# 4 clients: with 8 the gateway already peaks at 270-304 MiB, near the 300 MiB bound, because a
# put reads its first segments before it takes a segment slot (docs/LOAD.md, finding 1).
CLIENTS = 4
ARGS = ["--mode", "both", "--duration", "2", "--flood-duration", "1", "--clients", str(CLIENTS)]
ROLES = {"control": 3, "storage": 6, "gateway": 1, "bench": 1}


def run_load(tmp_path: Path) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, "-m", "bench.load", *ARGS, "--json", str(out)], cwd=ROOT,
                          capture_output=True, timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), proc.stderr.decode()[-3000:]
    return proc, json.loads(out.read_text())


def check_phase(mode: str, ph: dict[str, Any], ops: tuple[str, ...]) -> None:
    where = f"{mode} {ph['phase']}"
    assert ph["wrong_bytes"] == 0 and not ph["errors"], (where, ph["errors"])
    assert ph["wall_s"] > 0, where
    for op in ops:
        t = ph["totals"][op]
        assert t["ok"] > 0 and t["ops_s"] > 0 and t["mb_s"] > 0, (where, op, t)
        assert 0 < t["p50_ms"] <= t["p99_ms"] <= t["max_ms"] < 120_000, (where, op, t)
    roles: dict[str, int] = {}
    for p in ph["processes"]:
        roles[p["role"]] = roles.get(p["role"], 0) + 1
        assert 10 < p["peak_rss_mib"] < 4096 and p["cpu_s"] >= 0, (where, p)
        assert p["rss_end_mib"] is None or p["rss_end_mib"] <= p["peak_rss_mib"] + 1, (where, p)
    assert roles == ROLES, (where, roles)


def test_quick_load_run_checks_every_get_and_reports_every_process(tmp_path: Path) -> None:
    proc, report = run_load(tmp_path)
    text = proc.stdout.decode()
    assert proc.returncode == 0, (report["verdict"], proc.stderr.decode()[-3000:])
    assert report["verdict"] == {"ok": True, "reasons": []}
    assert [r["mode"] for r in report["runs"]] == ["lib", "s3"]
    for run in report["runs"]:
        assert run["failure"] is None and run["clients"] == CLIENTS
        phases = {ph["phase"]: ph for ph in run["phases"]}
        assert list(phases) == ["mixed", "flood", "readback"]
        check_phase(run["mode"], phases["mixed"], ("put", "get"))
        check_phase(run["mode"], phases["flood"], ("put",))
        check_phase(run["mode"], phases["readback"], ("get",))
        sizes = {(r["op"], r["size"]) for r in phases["mixed"]["rows"] if r["ok"]}
        assert {("put", "4 KiB"), ("put", "1 MiB")} <= sizes, sizes
        assert phases["flood"]["totals"]["get"]["ok"] == 0
        flood_puts = phases["flood"]["totals"]["put"]["ok"]
        assert phases["readback"]["totals"]["get"]["ok"] == min(READBACK_OBJECTS, flood_puts)
    assert report["bound"]["max_rss_mib"] == 300
    assert "PASS" in text and "mode s3" in text and "gw1" in text
