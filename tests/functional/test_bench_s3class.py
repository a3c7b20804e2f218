"""bench/s3class.py end to end on a local cluster: both classes put, read back and
checked (hash and HEAD's storage class), the figures written; and against bench.bound's
null S3 endpoint, which keeps no storage class, a round of another class is counted as
failed - a figure cannot come from objects that did not keep their class."""
from __future__ import annotations

import json
from pathlib import Path

from bench import bound, s3class
from bench import workloads as wl

MIB = 1024 * 1024


def test_quick_run_compares_standard_with_a_storage_class(tmp_path: Path) -> None:
    out = tmp_path / "s3class.json"
    assert s3class.main(["--quick", "--mib", "8", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["failures"] == []
    rows = report["rows"]
    assert [(r["round"], r["storage_class"]) for r in rows] == [(0, "STANDARD"), (0, "STANDARD_IA")]
    for r in rows:
        assert r["errors"] == 0 and r["put_mb_s"] > 0 and r["get_mb_s"] > 0
        assert {"gateway", "storage", "control", "bench"} <= r["put_cpu_ms_per_mib"].keys()


def test_objects_that_did_not_keep_their_class_are_errors() -> None:
    data = wl.Data()
    with bound.null_endpoint() as (target, roles):
        target.create_bucket()
        plain = s3class.one_round(target, roles, data, "STANDARD", 0, 1, 2 * MIB)
        other = s3class.one_round(target, roles, data, "GLACIER_IR", 0, 1, 2 * MIB)
    assert plain["errors"] == 0 and plain["get_mb_s"] > 0
    assert other["errors"] == 1 and "stored without class GLACIER_IR" in other["error_sample"]
