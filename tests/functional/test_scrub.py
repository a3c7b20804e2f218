"""Scrub on one storage node in-process: step(), quarantine, status, routes, pacing math."""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import pytest

from node.fragments import FragmentStore
from node.scrub import (
    SCRUB_STATE_FILE,
    Scrubber,
    ScrubStats,
    pacing_pause_s,
    scrub_loop,
    scrub_now,
    step_budget_bytes,
)
from node.storage import scrub_metrics
from node.volumes import parse_fragment
from store.auth import CHECKSUM_HEADER
from store.errors import Corrupt, NotFound
from store.transport import Transport
from store.wire import unpack
from tests.functional.harness import flip_last_byte, fragments_on_disk, run


def filled_store(data_dir: Path, n: int) -> FragmentStore:
    import hashlib
    store = FragmentStore(data_dir, fsync=False)
    for i in range(n):
        body = bytes([i]) * (100 + i)
        store.put(f"v{i:03d}.0.0", body, hashlib.sha256(body).hexdigest(), {"i": i})
    return store


def test_step_walks_in_batches_and_wraps_around(tmp_path: Path) -> None:
    store = filled_store(tmp_path, 7)
    s = Scrubber(store, list_page=3)
    seen = []
    for _ in range(3):
        r = s.step(batch=3)
        seen.append((r.checked, r.pass_complete))
    assert seen == [(3, False), (3, False), (1, True)]
    assert s.cursor == ""
    assert s.stats.fragments_checked_total == 7
    assert s.stats.last_pass_completed_at is not None and not s.stats.to_json()["running"]
    r = s.step(batch=100)  # the next pass starts over
    assert (r.checked, r.pass_complete) == (7, True)


def test_the_background_scrubber_goes_on_where_it_was_after_a_restart(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "data", 7)
    state = tmp_path / "data" / SCRUB_STATE_FILE
    s = Scrubber(store, ScrubStats(state), list_page=3, resume=True)
    assert s.step(batch=3).checked == 3 and s.cursor == "v002.0.0"
    # the node restarts: a fresh scrubber checks only the other four to end the pass
    again = Scrubber(store, ScrubStats(state), list_page=3, resume=True)
    assert again.cursor == "v002.0.0"
    r = again.step(batch=100)
    assert (r.checked, r.pass_complete) == (4, True)
    after = ScrubStats(state)       # and the end of that pass is known after the next one
    assert after.cursor == "" and after.last_pass_completed_at is not None
    assert abs(after.last_pass_completed_at - time.time()) < 60
    # an on-demand pass (POST /v1/scrub) neither starts from nor moves that place
    Scrubber(store, after, resume=True).step(batch=2)
    assert scrub_now(store, after).checked == 7 and ScrubStats(state).cursor == "v001.0.0"


def test_a_damaged_scrub_state_file_means_a_fresh_start(tmp_path: Path) -> None:
    for text in ("{", "[]", '{"last_pass_completed_at": "x", "cursor": 5}'):
        (tmp_path / SCRUB_STATE_FILE).write_text(text)
        stats = ScrubStats(tmp_path / SCRUB_STATE_FILE)
        assert (stats.last_pass_completed_at, stats.cursor) == (None, "")


def test_a_node_restarted_between_passes_rests_out_the_interval(tmp_path: Path) -> None:
    store = filled_store(tmp_path, 3)
    stats = ScrubStats(tmp_path / SCRUB_STATE_FILE)
    scrub_now(store, stats)                 # a pass just ended, then the node restarted
    stats = ScrubStats(tmp_path / SCRUB_STATE_FILE)
    assert stats.last_pass_completed_at is not None

    async def run_loop() -> None:
        task = asyncio.ensure_future(scrub_loop(Scrubber(store, stats, resume=True),
                                                rate_mb_s=8.0, pass_interval_s=3600.0,
                                                start_delay_s=0.0))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(run_loop())
    assert stats.fragments_checked_total == 0       # resting, not a second pass at once


def test_the_last_pass_metric_is_zero_before_the_first_pass() -> None:
    def value(stats: ScrubStats) -> float:
        fam = [f for f in scrub_metrics(stats)
               if f.name == "ecstore_scrub_last_pass_completed_timestamp_seconds"]
        return fam[0].samples[0].value
    stats = ScrubStats()
    assert value(stats) == 0       # absent, an alert on its age would never fire
    stats.last_pass_completed_at = 1234.5
    assert value(stats) == 1234.5


def test_step_stops_at_its_byte_budget(tmp_path: Path) -> None:
    store = filled_store(tmp_path, 5)
    r = Scrubber(store).step(batch=100, max_bytes=1)
    assert r.checked == 1 and not r.pass_complete


def test_step_finds_a_flipped_byte_and_quarantines_it(tmp_path: Path) -> None:
    store = filled_store(tmp_path, 5)
    count, size = store.count, store.bytes
    flip_last_byte(tmp_path, "v002.0.0")
    s = Scrubber(store)
    r = s.step(batch=100)
    assert r.corrupt == ["v002.0.0"] and r.checked == 5 and r.pass_complete
    assert store.count == count - 1 and store.bytes < size and store.quarantined == 1
    assert (tmp_path / "quarantine" / "v002.0.0").exists()  # kept aside
    with pytest.raises(Corrupt):        # its record as it was: the flipped byte included
        parse_fragment("v002.0.0", (tmp_path / "quarantine" / "v002.0.0").read_bytes())
    assert sorted(fragments_on_disk(tmp_path)) == [f"v{i:03d}.0.0" for i in (0, 1, 3, 4)]
    assert "v002.0.0" not in store.list("", 100)
    assert store.quarantined_ids() == ["v002.0.0"]
    with pytest.raises(NotFound):
        store.read("v002.0.0")
    assert s.stats.corrupt_found_total == 1
    # a fresh store (a restart) counts what it finds on disk
    again = FragmentStore(tmp_path, fsync=False)
    assert (again.count, again.bytes, again.quarantined) == (store.count, store.bytes, 1)


def test_a_record_whose_header_fails_its_crc_is_quarantined(tmp_path: Path) -> None:
    # A flipped bit in a record's header CRC leaves its body whole and readable, but a
    # restart's scan skips the record: the fragment would vanish then, unnoticed, with
    # the scrubber having passed it as good. Quarantined now, it is missing for repair.
    store = filled_store(tmp_path, 3)
    path, off, _ = store.record_at("v001.0.0")
    with open(path, "r+b") as f:
        f.seek(off + 8)                 # b"ECV1", u32 header length, u32 CRC
        crc = f.read(1)[0]
        f.seek(off + 8)
        f.write(bytes([crc ^ 0x01]))
    assert store.read("v001.0.0", verify=False).body == bytes([1]) * 101
    r = Scrubber(store).step(batch=100)
    assert r.corrupt == ["v001.0.0"] and r.checked == 3
    assert store.quarantined_ids() == ["v001.0.0"]
    with pytest.raises(NotFound):
        store.read("v001.0.0")
    again = FragmentStore(tmp_path, fsync=False)   # a restart agrees: it is not there
    assert again.list("", 100) == ["v000.0.0", "v002.0.0"] and again.quarantined == 1


def test_a_read_that_verifies_checks_the_header_crc_too(tmp_path: Path) -> None:
    store = filled_store(tmp_path, 1)       # POST .../verify reads this way
    path, off, _ = store.record_at("v000.0.0")
    with open(path, "r+b") as f:
        f.seek(off + 8)
        crc = f.read(1)[0]
        f.seek(off + 8)
        f.write(bytes([crc ^ 0x80]))
    with pytest.raises(Corrupt, match="header failed its CRC"):
        store.read("v000.0.0")
    assert store.quarantined_ids() == ["v000.0.0"] and store.count == 0


def test_a_repaired_fragment_leaves_the_quarantine_list_but_its_file_stays(tmp_path: Path) -> None:
    import hashlib
    store = filled_store(tmp_path, 2)
    for _ in range(2):  # corrupt, repair, corrupt again: both bad copies kept
        flip_last_byte(tmp_path, "v001.0.0")
        assert scrub_now(store, ScrubStats()).corrupt == ["v001.0.0"]
        body = bytes([1]) * 101
        store.put("v001.0.0", body, hashlib.sha256(body).hexdigest(), {"i": 1})
    assert store.quarantined == 2 and len(list((tmp_path / "quarantine").iterdir())) == 2
    assert fragments_on_disk(tmp_path) == {"v000.0.0": 100, "v001.0.0": 101}   # the repair
    assert store.quarantined_ids() == []
    assert store.read("v001.0.0").body == bytes([1]) * 101


def test_a_fragment_replaced_after_the_read_is_not_quarantined(tmp_path: Path) -> None:
    import hashlib
    store = filled_store(tmp_path, 1)
    _, loc = store.read_raw("v000.0.0")
    body = b"repaired"
    store.put("v000.0.0", body, hashlib.sha256(body).hexdigest(), {})
    assert not store.quarantine_fragment("v000.0.0", loc)
    assert store.read("v000.0.0").body == body and store.quarantined == 0
    assert not list((tmp_path / "quarantine").iterdir())
    assert fragments_on_disk(tmp_path) == {"v000.0.0": len(body)}


def test_pacing_pause_keeps_the_rate() -> None:
    mb = 1_000_000
    assert pacing_pause_s(8 * mb, 0.0, 8 * mb) == pytest.approx(1.0)
    assert pacing_pause_s(8 * mb, 0.25, 8 * mb) == pytest.approx(0.75)
    assert pacing_pause_s(8 * mb, 2.0, 8 * mb) == 0.0  # the disk was slower than the rate
    assert pacing_pause_s(0, 0.1, 8 * mb) == 0.0
    assert pacing_pause_s(mb, 0.0, 4 * mb) == pytest.approx(0.25)
    for read, elapsed in ((123_456, 0.01), (10 * mb, 0.5), (1, 0.0)):
        pause = pacing_pause_s(read, elapsed, 2 * mb)
        assert read / (elapsed + pause) <= 2 * mb * (1 + 1e-9)
    with pytest.raises(ValueError):
        pacing_pause_s(1, 0.0, 0)
    assert step_budget_bytes(8 * mb) == 8 * mb and step_budget_bytes(0.000001) == 1


async def status(t: Transport, url: str) -> dict[str, object]:
    return dict(json.loads((await t.request("GET", url, "/v1/status")).body))


def test_post_scrub_quarantines_and_the_get_answers_not_found(tmp_path: Path) -> None:
    async def body(t: Transport, url: str) -> None:
        for i in range(4):
            await t.request("PUT", url, f"/v1/fragments/v9.0.{i}", body=bytes([i]) * 5000)
        before = await status(t, url)
        assert before["quarantined"] == 0 and before["fragments"] == 4
        assert before["scrub"] == {"last_pass_completed_at": None,
                                   "fragments_checked_total": 0, "corrupt_found_total": 0,
                                   "running": False, "rate_mb_s": 0.0}
        flip_last_byte(tmp_path, "v9.0.1")
        flip_last_byte(tmp_path, "v9.0.3")
        r = json.loads((await t.request("POST", url, "/v1/scrub")).body)
        assert r["checked"] == 4 and r["bytes_checked"] > 4 * 5000
        assert r["corrupt"] == ["v9.0.1", "v9.0.3"]
        with pytest.raises(NotFound):
            await t.request("GET", url, "/v1/fragments/v9.0.1")
        assert (await t.request("GET", url, "/v1/fragments/v9.0.2")).body == bytes([2]) * 5000
        after = await status(t, url)
        assert after["quarantined"] == 2 and after["fragments"] == 2
        scrub = after["scrub"]
        assert isinstance(scrub, dict)
        assert scrub["fragments_checked_total"] == 4 and scrub["corrupt_found_total"] == 2
        assert scrub["last_pass_completed_at"] is not None and scrub["running"] is False
        q = unpack((await t.request("GET", url, "/v1/quarantine")).body)
        assert q == {"fragments": ["v9.0.1", "v9.0.3"]}
        page = unpack((await t.request("GET", url, "/v1/fragments")).body)
        assert page["fragments"] == ["v9.0.0", "v9.0.2"]
        r = json.loads((await t.request("POST", url, "/v1/scrub")).body)
        assert r == {"checked": 2, "bytes_checked": r["bytes_checked"], "corrupt": []}
    run(tmp_path, body, scrub_rate_mb_s=0.0)


def test_a_corrupt_fragment_reported_by_a_reader_is_quarantined_on_the_spot(tmp_path: Path) -> None:
    async def body(t: Transport, url: str) -> None:
        await t.request("PUT", url, "/v1/fragments/v5.0.0", body=b"y" * 2000)
        await t.request("POST", url, "/v1/fragments/v5.0.0/verify")  # good: stays
        flip_last_byte(tmp_path, "v5.0.0")
        got = await t.request("GET", url, "/v1/fragments/v5.0.0")  # the reader verifies
        assert hashlib.sha256(got.body).hexdigest() != got.headers[CHECKSUM_HEADER]
        with pytest.raises(Corrupt):
            await t.request("POST", url, "/v1/fragments/v5.0.0/verify")
        with pytest.raises(NotFound):
            await t.request("GET", url, "/v1/fragments/v5.0.0")
        st = await status(t, url)
        assert st["quarantined"] == 1 and st["fragments"] == 0 and st["bytes"] == 0
        q = unpack((await t.request("GET", url, "/v1/quarantine")).body)
        assert q == {"fragments": ["v5.0.0"]}
    run(tmp_path, body, scrub_rate_mb_s=0.0)


def test_background_scrub_finds_corruption_by_itself(tmp_path: Path) -> None:
    async def body(t: Transport, url: str) -> None:
        await t.request("PUT", url, "/v1/fragments/v6.0.0", body=b"z" * 3000)
        flip_last_byte(tmp_path, "v6.0.0")
        for _ in range(200):
            st = await status(t, url)
            if st["quarantined"] == 1:
                break
            await asyncio.sleep(0.02)
        assert st["quarantined"] == 1 and st["fragments"] == 0
        scrub = st["scrub"]
        assert isinstance(scrub, dict) and scrub["corrupt_found_total"] == 1
    run(tmp_path, body, scrub_rate_mb_s=8.0, scrub_start_delay_s=0.3,
        scrub_pass_interval_s=0.05)


def test_scrub_routes_are_signed(tmp_path: Path) -> None:
    async def body(t: Transport, url: str) -> None:
        import aiohttp
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/scrub") as r:
                assert r.status == 401
            async with s.get(url + "/v1/quarantine") as r:
                assert r.status == 401
    run(tmp_path, body, scrub_rate_mb_s=0.0)
