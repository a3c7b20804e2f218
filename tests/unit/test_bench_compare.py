"""bench/compare.py without servers: percentiles, ratios, row assembly, the JSON and the
table, usage aggregation, target names, the data generators and the pools."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from blake3 import blake3

from bench import compare, seaweed
from bench import workloads as wl

QUICK = wl.PROFILES["quick"]


def measure(target: str, workload: str, op: str, errors: int = 0, **metrics: float) -> wl.Measure:
    return wl.Measure(target, workload, op, wall_s=1.0, count=10, ok=10 - errors, bytes=0,
                      errors=errors, metrics=dict(metrics))


# ---- percentiles and ratios ---------------------------------------------------------------
def test_pct_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]      # 1..100, unsorted
    assert wl.pct(values, 0.50) == 50
    assert wl.pct(values, 0.99) == 99
    assert wl.pct(values, 1.0) == 100
    assert wl.pct([float(v) for v in range(1, 1001)], 0.99) == 990
    assert wl.pct([3.0, 1.0, 2.0], 0.5) == 2
    assert wl.pct([7.0], 0.99) == 7


def test_pct_of_nothing_is_none() -> None:
    assert wl.pct([], 0.5) is None


def test_ratio_is_none_when_a_side_is_missing_or_zero() -> None:
    assert compare.ratio(3.0, 2.0) == 1.5
    assert compare.ratio(None, 2.0) is None
    assert compare.ratio(3.0, None) is None
    assert compare.ratio(3.0, 0.0) is None


def test_pool_measure_derives_rates_and_latencies() -> None:
    res = wl.PoolResult(count=4, wall_s=2.0, latencies_s=[0.010, 0.020, 0.030], bytes=3_000_000)
    res.fail("op 3: boom")
    m = wl.pool_measure("lib", "medium", "put", res)
    assert m.ok == 3 and m.errors == 1 and m.error_sample == "op 3: boom"
    assert m.metrics["ops_s"] == pytest.approx(1.5)
    assert m.metrics["mb_s"] == pytest.approx(1.5)
    assert m.metrics["p50_ms"] == pytest.approx(20.0)
    assert m.metrics["p99_ms"] == pytest.approx(30.0)


def test_pool_measure_with_no_success_has_no_rates() -> None:
    res = wl.PoolResult(count=2, wall_s=1.0)
    res.fail("x", 2)
    m = wl.pool_measure("gw", "small", "get", res)
    assert m.metrics["ops_s"] is None and m.metrics["p50_ms"] is None and m.errors == 2


# ---- assembly -----------------------------------------------------------------------------
def test_assemble_computes_both_ratios_and_errors_per_target() -> None:
    spec = compare.RowSpec("medium", "get", "mb_s", "1 MiB get", "MB/s")
    ms = [measure("lib", "medium", "get", mb_s=300.0), measure("gw", "medium", "get", errors=2, mb_s=150.0),
          measure("weed", "medium", "get", mb_s=200.0)]
    [row] = compare.assemble(ms, [spec])
    assert row.values == {"lib": 300.0, "gw": 150.0, "weed": 200.0}
    assert row.gw_weed == pytest.approx(0.75)
    assert row.lib_weed == pytest.approx(1.5)
    assert row.errors == {"lib": 0, "gw": 2, "weed": 0}
    assert row.degraded == {}


def test_assemble_degraded_row_divides_by_the_same_targets_healthy_figure() -> None:
    specs = [s for s in compare.row_specs(QUICK) if s.workload == "degraded"]
    ms = [measure("lib", "medium", "get", mb_s=200.0), measure("gw", "medium", "get", mb_s=100.0),
          measure("lib", "degraded", "get 1 MiB", mb_s=180.0), measure("gw", "degraded", "get 1 MiB", mb_s=50.0),
          measure("lib", "storm", "get", mb_s=400.0), measure("lib", "degraded", "storm get", mb_s=100.0)]
    medium, storm = compare.assemble(ms, specs)
    assert medium.degraded == {"lib": pytest.approx(0.9), "gw": pytest.approx(0.5)}
    assert medium.gw_weed is None and medium.values["weed"] is None
    assert storm.degraded == {"lib": pytest.approx(0.25), "gw": None}


def test_degraded_gets_compare_with_the_healthy_gets_measured_just_before() -> None:
    """The "healthy again" gets (run right before the kill) are what a degraded figure is
    divided by; the first healthy ones only when those are missing (one target here)."""
    specs = [s for s in compare.row_specs(QUICK) if s.workload == "degraded"]
    ms = [measure("lib", "medium", "get", mb_s=400.0), measure("gw", "medium", "get", mb_s=100.0),
          measure("lib", compare.AGAIN, "get 1 MiB", mb_s=300.0),
          measure("lib", "degraded", "get 1 MiB", mb_s=270.0),
          measure("gw", "degraded", "get 1 MiB", mb_s=80.0),
          measure("lib", "storm", "get", mb_s=900.0), measure("lib", compare.AGAIN, "storm get", mb_s=600.0),
          measure("lib", "degraded", "storm get", mb_s=540.0)]
    medium, storm = compare.assemble(ms, specs)
    assert medium.degraded == {"lib": pytest.approx(0.9), "gw": pytest.approx(0.8)}
    assert storm.degraded == {"lib": pytest.approx(0.9), "gw": None}


def test_gets_again_name_their_measures_by_label() -> None:
    """What compare's rows look up: (label, "get 1 MiB") and (label, "storm get")."""
    class Fake:
        key = "lib"

        def get_objects(self, *a: object) -> wl.PoolResult:
            return wl.PoolResult(1)

        def get_streams(self, *a: object) -> wl.PoolResult:
            return wl.PoolResult(1)
    ms = wl.gets_again(Fake(), QUICK, wl.Data(), compare.AGAIN)  # type: ignore[arg-type]
    assert [(m.target, m.workload, m.op) for m in ms] == [
        ("lib", compare.AGAIN, "get 1 MiB"), ("lib", compare.AGAIN, "storm get")]


def test_assemble_without_a_target_leaves_its_cells_empty() -> None:
    specs = compare.row_specs(QUICK)
    rows = compare.assemble([measure("weed", "small", "put", ops_s=500.0, p50_ms=3.0, p99_ms=9.0)], specs)
    assert len(rows) == len(specs)
    put = rows[0]
    assert put.values == {"lib": None, "gw": None, "weed": 500.0}
    assert put.errors == {"weed": 0}
    assert put.lib_weed is None and put.gw_weed is None
    assert all(r.values["lib"] is None for r in rows)


def test_row_specs_name_the_profile_sizes() -> None:
    labels = [s.label for s in compare.row_specs(wl.PROFILES["full"])]
    assert "stream 1 GiB put" in labels
    assert "storm 4 x 256 MiB last put acked" in labels
    assert "list 10,000 keys, prefix+delimiter" in labels
    assert "stream 256 MiB get" in [s.label for s in compare.row_specs(QUICK)]


def test_report_is_json_and_the_table_shows_its_numbers() -> None:
    ms = [measure("lib", "medium", "put", mb_s=1234.0), measure("weed", "medium", "put", mb_s=617.0),
          measure("gw", "small", "get", errors=3, ops_s=42.0)]
    usage = [{"target": "weed", "workload": "medium", "roles": {"weed": {"cpu_s": 2.5, "peak_rss_mib": 300.0,
                                                                        "processes": 1}}, "processes": []}]
    meta = {"profile": {"name": "quick"}, "durability": {"seaweedfs": {"fsync": "off"}}, "failures": []}
    report = compare.build_report(meta, ms, usage, compare.row_specs(QUICK))
    again = json.loads(json.dumps(report))
    assert again == report
    put = next(r for r in again["rows"] if r["label"] == "1 MiB x8 put")
    assert put["lib_weed"] == pytest.approx(2.0)
    text = compare.render(report)
    assert "1,234" in text and "617" in text and "2.00" in text
    assert "2.5 s / 300" in text
    assert "fsync: off" in text
    assert "gw small get: 3 failed" in text


def test_aggregate_usage_sums_cpu_and_keeps_the_largest_peak() -> None:
    procs = [{"role": "storage", "cpu_s": 1.0, "peak_rss_mib": 80.0},
             {"role": "storage", "cpu_s": 2.0, "peak_rss_mib": 120.0},
             {"role": "gateway", "cpu_s": 0.5, "peak_rss_mib": 60.0}]
    out = compare.aggregate_usage(procs)
    assert out["storage"] == {"cpu_s": 3.0, "peak_rss_mib": 120.0, "processes": 2}
    assert out["gateway"]["processes"] == 1


def test_fmt_scales_decimals() -> None:
    assert [compare.fmt(v) for v in (None, 12345.6, 45.67, 1.234)] == ["-", "12,346", "45.7", "1.23"]


def test_parse_only_accepts_letters_and_names_in_a_fixed_order() -> None:
    assert compare.parse_only("c,a") == ["lib", "weed"]
    assert compare.parse_only("gateway, SeaweedFS") == ["gw", "weed"]
    with pytest.raises(ValueError):
        compare.parse_only("a,minio")
    with pytest.raises(ValueError):
        compare.parse_only(" , ")


# ---- data and pools -----------------------------------------------------------------------
def test_stream_reader_gives_the_same_bytes_whatever_the_read_sizes() -> None:
    data = wl.Data(seed=1)
    size = 3 * wl.BLOCK_BYTES + 12345
    whole = b"".join(data.stream_blocks(7, size))
    assert len(whole) == size
    for step in (1000, wl.BLOCK_BYTES, 8 * wl.BLOCK_BYTES, -1):
        r = wl.StreamReader(data.stream_blocks(7, size))
        parts = []
        while chunk := r.read(step):
            parts.append(chunk)
        assert b"".join(parts) == whole
        assert r.sent == size and r.sha.hexdigest() == blake3(whole).hexdigest()


def test_data_is_deterministic_and_distinct() -> None:
    a, b = wl.Data(seed=3), wl.Data(seed=3)
    assert a.payload(1, 5, 4096) == b.payload(1, 5, 4096)
    assert a.payload(1, 5, 4096) != a.payload(1, 6, 4096) != a.payload(2, 5, 4096)
    blocks = list(a.stream_blocks(0, 2 * wl.BLOCK_BYTES))
    assert blocks[0] != blocks[1]
    a.prepare(1, 3, 4096)
    assert a.sha(1, 2, 4096) == blake3(a.payload(1, 2, 4096)).hexdigest()


@pytest.mark.parametrize("name,fn", [("blake3", blake3), ("sha256", hashlib.sha256)])
def test_verify_hash_chooses_what_every_workload_checks_with(
        monkeypatch: pytest.MonkeyPatch, name: str, fn: Any) -> None:
    monkeypatch.setattr(wl, "verify_hash", name)
    d = wl.Data(seed=4)
    d.prepare(2, 2, 4096)
    payload = d.payload(2, 1, 4096)
    assert d.sha(2, 1, 4096) == fn(payload).hexdigest()
    assert wl.check_bytes(payload, d.sha(2, 1, 4096)) == 4096
    with pytest.raises(wl.Mismatch, match=name):
        wl.check_bytes(payload[:-1] + b"?", d.sha(2, 1, 4096))
    r = wl.StreamReader(d.stream_blocks(3, 5000))
    assert r.read(-1) and r.sha.hexdigest() == fn(b"".join(d.stream_blocks(3, 5000))).hexdigest()


def test_verify_hash_flag() -> None:
    assert compare.parse_args([]).verify_hash == "blake3"
    assert compare.parse_args(["--verify-hash", "sha256"]).verify_hash == "sha256"
    with pytest.raises(SystemExit):
        compare.parse_args(["--verify-hash", "md5"])


def test_record_stream_refuses_a_target_that_sent_other_bytes() -> None:
    d = wl.Data(seed=1)
    d.record_stream(1, 10, "aa")
    d.record_stream(1, 10, "aa")
    with pytest.raises(AssertionError):
        d.record_stream(1, 10, "bb")


def test_thread_pool_counts_failures_and_times_successes() -> None:
    def op(i: int) -> int:
        if i % 3 == 0:
            raise wl.Mismatch("sha256 mismatch")
        return 100
    res = wl.thread_pool(10, 4, op)
    assert res.errors == 4 and len(res.latencies_s) == 6 and res.bytes == 600
    assert "Mismatch" in res.error_sample


def test_task_pool_bounds_each_operation() -> None:
    async def op(i: int) -> int:
        await asyncio.sleep(5 if i == 1 else 0)
        return 1
    res = asyncio.run(wl.task_pool(3, 3, op, op_timeout_s=0.05))
    assert res.errors == 1 and len(res.latencies_s) == 2 and "TimeoutError" in res.error_sample


def test_weed_command_binds_loopback_only_and_turns_off_telemetry(tmp_path: Path) -> None:
    s = seaweed.SeaweedServer("weed", tmp_path)
    s.ports = {n: 40000 + i for i, n in enumerate(
        ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc"))}
    cmd = s.command()
    assert "-ip.bind=127.0.0.1" in cmd and "-master.telemetry=false" in cmd
    assert "-s3.port.iceberg=0" in cmd and "-s3.port.lance=0" in cmd
    assert f"-dir={tmp_path / 'data'}" in cmd and "-s3.port=40006" in cmd
    assert s.url == "http://127.0.0.1:40006"


def test_file_create_probe_measures_and_leaves_nothing(tmp_path: Path) -> None:
    us = compare.file_create_us(tmp_path, count=16)
    assert 0 <= us < 1e6
    assert list(tmp_path.iterdir()) == []


def test_a_slow_disk_is_noted_in_the_log_and_the_meta(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    r = compare.Run(wl.PROFILES["quick"], ["lib"], lines.append)
    monkeypatch.setattr(compare, "file_create_us", lambda parent: 900.0)
    compare.note_file_create(r, tmp_path, "start")
    assert r.meta["file_create_us_start"] == 900.0
    assert any("900 us" in line for line in lines)
    monkeypatch.setattr(compare, "file_create_us", lambda parent: 12.0)
    compare.note_file_create(r, tmp_path, "end")
    assert r.meta["file_create_us_end"] == 12.0 and len(lines) == 1


def test_a_probe_that_cannot_write_does_not_stop_the_run(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    r = compare.Run(wl.PROFILES["quick"], ["lib"], lines.append)

    def full(parent: Path) -> float:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(compare, "file_create_us", full)
    compare.note_file_create(r, tmp_path, "end")
    assert "file_create_us_end" not in r.meta
    assert any("No space left" in line for line in lines)


class _Watch:
    def begin(self) -> None:
        pass

    def end(self) -> dict[str, Any]:
        return {"roles": {}, "processes": []}


class _Target:
    key = "lib"


@pytest.mark.parametrize("flush", [True, False])
def test_each_phase_starts_with_the_page_cache_written_out(tmp_path: Path, flush: bool) -> None:
    """A phase's dirty pages are written out before the next phase (it is measured
    without them); with --no-flush they are left, as before."""
    r = compare.Run(QUICK, ["lib"], lambda _msg: None, flush=flush)
    dirty = tmp_path / "dirty"

    def write() -> list[wl.Measure]:
        with open(dirty, "wb") as f:   # no fsync: 64 MiB left for the kernel to write out
            for _ in range(64):
                f.write(b"\1" * wl.MiB)
        return []
    r.phase(_Target(), "one", _Watch(), write)  # type: ignore[arg-type]
    r.phase(_Target(), "two", _Watch(), list)   # type: ignore[arg-type]
    second = r.usage[1]
    if flush:
        assert second["flushed_before"]["s"] >= 0
        assert compare.dirty_mib() < 64      # written out before "two" ran
        assert "page cache written out" in compare.render(
            compare.build_report({"profile": {"name": "quick"}, "failures": []}, [], r.usage,
                                 compare.row_specs(QUICK)))
    else:
        assert "flushed_before" not in second


def test_no_flush_flag() -> None:
    assert compare.parse_args([]).no_flush is False
    assert compare.parse_args(["--no-flush"]).no_flush is True
