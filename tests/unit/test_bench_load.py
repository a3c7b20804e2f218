"""bench/load.py without servers: object bodies and their check, the S3 body file, the plan
of operations, the statistics, the verdict and the table."""
from __future__ import annotations

import io
import random
from typing import Any

import pytest

from bench import load
from store.errors import Unavailable

SMALL, MEDIUM = 4 * 1024, 3 * load.PIECE_BYTES + 123      # a medium body spans several pieces


@pytest.fixture(scope="module")
def payloads() -> load.Payloads:
    return load.Payloads([SMALL, MEDIUM])


def body(p: load.Payloads, obj: load.Obj) -> bytes:
    return b"".join(bytes(x) for x in p.pieces(obj))


def checked(p: load.Payloads, obj: load.Obj, data: bytes, cut: int = 1000) -> None:
    """Feed `data` in pieces of `cut` bytes (stamp split across pieces), then finish."""
    check = load.Check(p, obj)
    for off in range(0, len(data), cut):
        check.feed(memoryview(data)[off:off + cut])
    check.done()


# ---- bodies and the check ---------------------------------------------------------------------
def test_a_body_is_its_stamp_then_the_pool_slice_of_its_variant(payloads: load.Payloads) -> None:
    obj = load.Obj("mixed/c0001/0000007", MEDIUM, 3)
    data = body(payloads, obj)
    assert len(data) == MEDIUM
    assert data[:load.STAMP_BYTES] == obj.stamp and obj.key.encode() in obj.stamp
    assert data[load.STAMP_BYTES:] == bytes(payloads.tail(MEDIUM, 3))
    assert [len(x) for x in payloads.pieces(obj)][:3] == [load.PIECE_BYTES] * 3


def test_variants_differ(payloads: load.Payloads) -> None:
    tails = {bytes(payloads.tail(SMALL, v)) for v in range(load.VARIANTS)}
    assert len(tails) == load.VARIANTS


@pytest.mark.parametrize("size,cut", [(SMALL, 7), (SMALL, 64), (MEDIUM, 1000), (MEDIUM, load.PIECE_BYTES)])
def test_the_check_accepts_exactly_what_was_put(payloads: load.Payloads, size: int, cut: int) -> None:
    obj = load.Obj("k", size, 5)
    checked(payloads, obj, body(payloads, obj), cut)


def test_the_check_rejects_a_flipped_byte_anywhere(payloads: load.Payloads) -> None:
    obj = load.Obj("k", MEDIUM, 1)
    good = body(payloads, obj)
    for pos in (0, load.STAMP_BYTES - 1, load.STAMP_BYTES, MEDIUM // 2, MEDIUM - 1):
        bad = bytearray(good)
        bad[pos] ^= 1
        with pytest.raises(load.Mismatch) as exc:
            checked(payloads, obj, bytes(bad))
        assert exc.value.kind == "wrong bytes"


def test_the_check_rejects_another_objects_bytes_and_a_wrong_length(payloads: load.Payloads) -> None:
    obj = load.Obj("a", SMALL, 2)
    with pytest.raises(load.Mismatch, match="stamp"):         # same variant, another key
        checked(payloads, obj, body(payloads, load.Obj("b", SMALL, 2)))
    with pytest.raises(load.Mismatch, match="stamp"):         # same key, another variant
        checked(payloads, obj, body(payloads, load.Obj("a", SMALL, 3)))
    with pytest.raises(load.Mismatch, match="SHA-256"):       # its stamp, another variant's body
        checked(payloads, obj, obj.stamp + bytes(payloads.tail(SMALL, 3)))
    for data in (body(payloads, obj)[:-1], body(payloads, obj) + b"x", b""):
        with pytest.raises(load.Mismatch) as exc:
            checked(payloads, obj, data)
        assert exc.value.kind == "wrong size"


def test_the_s3_body_file_reads_and_seeks_like_the_body(payloads: load.Payloads) -> None:
    obj = load.Obj("k", MEDIUM, 4)
    f = load.PayloadFile(payloads, obj)
    assert f.seek(0, io.SEEK_END) == MEDIUM and f.tell() == MEDIUM
    f.seek(0)
    assert f.read() == body(payloads, obj)
    assert f.read(10) == b""
    f.seek(load.STAMP_BYTES - 3)
    assert f.read(6) == body(payloads, obj)[load.STAMP_BYTES - 3:load.STAMP_BYTES + 3]


# ---- the plan -----------------------------------------------------------------------------------
def test_a_get_reads_only_acknowledged_objects_and_falls_back_to_a_put() -> None:
    cat = load.Catalog()
    w = load.Workload("mixed", load.SIZES, 0.0, cat)            # gets only, if it can
    rng = random.Random(1)
    first = w.plan(3, 0, rng)
    assert first is not None and first.kind == "put" and first.obj.key == "mixed/c0003/0000000"
    for label, size, _ in load.SIZES:
        cat.add(label, load.Obj(f"x/{label}", size, 0))
    ops = [w.plan(3, i, rng) for i in range(200)]
    assert all(op is not None and op.kind == "get" and op.obj.key == f"x/{op.label}" for op in ops)
    assert {op.label for op in ops if op} == {s[0] for s in load.SIZES}


def test_the_mix_follows_the_weights_and_the_put_fraction() -> None:
    cat = load.Catalog()
    for label, size, _ in load.SIZES:
        cat.add(label, load.Obj(f"x/{label}", size, 0))
    w = load.Workload("mixed", load.SIZES, 0.5, cat)
    rng = random.Random(2)
    ops = [w.plan(0, i, rng) for i in range(4000)]
    puts = sum(1 for op in ops if op and op.kind == "put")
    assert 1800 < puts < 2200
    share = {label: sum(1 for op in ops if op and op.label == label) / len(ops) for label, _, _ in load.SIZES}
    for label, _, pct in load.SIZES:
        assert abs(share[label] - pct / 100) < 0.04, share


def test_a_queue_is_handed_out_once_then_ends() -> None:
    queue = [load.Op("get", "4 KiB", load.Obj(f"q/{i}", SMALL, 0)) for i in range(3)]
    w = load.Workload("readback", load.SIZES, 0.0, load.Catalog(), list(queue))
    rng = random.Random(0)
    assert [w.plan(c, 0, rng) for c in range(5)] == [*queue, None, None]


def test_spread_picks_evenly_over_the_order_of_acks() -> None:
    cat = load.Catalog()
    for i in range(100):
        cat.add("16 MiB", load.Obj(f"f/{i}", 1, 0))
    assert [o.key for o in cat.spread("16 MiB", 4)] == ["f/0", "f/25", "f/50", "f/75"]
    assert len(cat.spread("16 MiB", 1000)) == 100 and cat.spread("1 MiB", 4) == []


# ---- statistics and errors ----------------------------------------------------------------------
def test_stats_report_rates_percentiles_and_errors_by_kind() -> None:
    s = load.Stats()
    put = load.Op("put", "1 MiB", load.Obj("p", load.MiB, 0))
    get = load.Op("get", "4 KiB", load.Obj("g", SMALL, 0))
    for i in range(1, 101):
        s.ok(put, i / 1000)
    s.ok(get, 0.5)
    s.fail(get, "wrong bytes", "SHA-256 differs")
    s.fail(get, "timeout", "slow")
    s.fail(get, "timeout", "slow again")
    s.close()
    s.ok(put, 99.0)                                   # after the phase: ignored
    s.fail(put, "timeout", "late")
    r = s.report(wall_s=2.0)
    row = next(x for x in r["rows"] if x["op"] == "put")
    assert row["ok"] == 100 and row["errors"] == 0 and row["ops_s"] == 50
    assert row["mb_s"] == pytest.approx(100 * load.MiB / 1e6 / 2)
    assert row["p50_ms"] == pytest.approx(50) and row["p99_ms"] == pytest.approx(99)
    assert row["max_ms"] == pytest.approx(100)
    assert r["totals"]["get"]["ok"] == 1 and r["totals"]["get"]["errors"] == 3
    assert r["errors"]["timeout"]["count"] == 2 and "slow" in r["errors"]["timeout"]["sample"]
    assert r["wrong_bytes"] == 1
    assert [x["op"] for x in r["rows"]] == ["put", "get"]


class FakeClientError(Exception):
    response = {"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}


class ReadTimeoutError(Exception):
    pass


def test_error_kinds() -> None:
    assert load.error_kind(load.Mismatch("wrong size", "x")) == "wrong size"
    assert load.error_kind(TimeoutError()) == "timeout"
    assert load.error_kind(ReadTimeoutError()) == "timeout"
    assert load.error_kind(FakeClientError()) == "S3 SlowDown (503)"
    assert load.error_kind(Unavailable("no")) == "Unavailable (503)"
    assert load.error_kind(ValueError("x")) == "ValueError"


# ---- verdict and output -------------------------------------------------------------------------
def proc(name: str, role: str, peak: float) -> dict[str, Any]:
    return {"name": name, "role": role, "pid": 1, "cpu_s": 1.0, "peak_rss_mib": peak, "hwm_mib": peak,
            "rss_start_mib": peak, "rss_end_mib": peak, "rss_per_s_mib": [peak, None]}


def report(wrong: int = 0, gw_peak: float = 200, bench_peak: float = 900, gets: int = 5) -> dict[str, Any]:
    s = load.Stats()
    s.ok(load.Op("put", "4 KiB", load.Obj("p", SMALL, 0)), 0.01)
    for _ in range(gets):
        s.ok(load.Op("get", "4 KiB", load.Obj("p", SMALL, 0)), 0.01)
    for _ in range(wrong):
        s.fail(load.Op("get", "4 KiB", load.Obj("p", SMALL, 0)), "wrong bytes", "bad")
    phase = {"phase": "mixed", "planned_s": 1.0, "wall_s": 1.0, **s.report(1.0),
             "processes": [proc("c1", "control", 60), proc("s1", "storage", 90), proc("gw1", "gateway", gw_peak),
                           proc("bench", "bench", bench_peak)]}
    return {"meta": {"failures": []}, "runs": [{"mode": "s3", "clients": 2, "failure": None, "phases": [phase]}],
            "bound": {"max_rss_mib": 300.0, "roles": list(load.LIMITED_ROLES), "segment_mib": 4,
                      "gateway_segment_slots": 16}, "server_logs": {}}


def test_a_clean_run_passes_whatever_the_bench_process_uses() -> None:
    assert load.verdict(report(), 300) == []
    assert load.peaks(report()["runs"][0]) == {"control": 60, "storage": 90, "gateway": 200, "bench": 900}


def test_wrong_bytes_memory_over_the_bound_or_no_gets_fail_the_run() -> None:
    assert any("wrong bytes" in r for r in load.verdict(report(wrong=2), 300))
    assert any("gw1" in r and "301" in r for r in load.verdict(report(gw_peak=301), 300))
    assert any("no get" in r for r in load.verdict(report(gets=0), 300))
    assert load.verdict({"meta": {"failures": ["interrupted"]}, "runs": []}, 300) == ["interrupted", "nothing ran"]


def test_render_shows_the_tables_the_bound_and_the_verdict() -> None:
    r = report(gw_peak=420)
    reasons = load.verdict(r, 300)
    r["verdict"] = {"ok": not reasons, "reasons": reasons}
    text = load.render(r)
    for part in ("mixed", "4 KiB", "gw1", "420", "under 300 MiB", "16 segments", "FAIL"):
        assert part in text, part


def test_quick_and_explicit_durations() -> None:
    a = load.parse_args(["--quick"])
    assert (a.duration, a.flood_duration, a.clients, a.mode) == (load.QUICK_DURATION_S, load.QUICK_FLOOD_S,
                                                                 64, "s3")
    a = load.parse_args(["--quick", "--duration", "3", "--flood-duration", "0", "--mode", "both"])
    assert (a.duration, a.flood_duration, a.mode) == (3, 0, "both")
    assert load.parse_args([]).duration == load.DEFAULT_DURATION_S
    for bad in (["--duration", "0"], ["--clients", "0"], ["--put-fraction", "2"], ["--mode", "x"]):
        with pytest.raises(SystemExit):
            load.parse_args(bad)
