"""Scrub on one storage node in-process: step(), quarantine, status, routes, pacing math."""
from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from node.fragments import FragmentStore
from node.scrub import Scrubber, ScrubStats, pacing_pause_s, scrub_now, step_budget_bytes
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
