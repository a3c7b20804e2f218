"""bench/listing.py against the ecstore gateway on a local cluster (SeaweedFS's `weed` comes
with the bench extra, not with the tests'): both listings run, checked and timed, their
medians summarized; a listing that does not give back every key put is an error, not a
figure; bad arguments are refused."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from bench import bound, listing
from bench import workloads as wl

PREFIXES = 2


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[wl.S3Target, bound.Roles, list[str]]]:
    keys = wl.list_keys(dataclasses.replace(wl.PROFILES["quick"], list_prefixes=PREFIXES))
    with bound.ecstore_gateway() as (t, roles):
        t.create_bucket()
        made = t.put_objects(lambda i: keys[i], lambda i: b"k" * wl.LIST_OBJECT_BYTES,
                             len(keys), 16, wl.SMALL_TIMEOUT_S)
        assert made.errors == 0, made.error_sample
        yield t, roles, keys
        t.close()


def test_rounds_list_every_key_and_are_summarized(
        gateway: tuple[wl.S3Target, bound.Roles, list[str]]) -> None:
    t, roles, keys = gateway
    rows = listing.run_rounds([(t, roles)], keys, 2, lambda _: None)
    assert [(r["round"], r["listing"]) for r in rows] == [
        (0, "prefix+delimiter"), (0, "full pagination"),
        (1, "prefix+delimiter"), (1, "full pagination")]
    for r in rows:
        assert r["errors"] == 0 and r["keys"] == 100 * PREFIXES, r
        assert r["keys_s"] > 0 and r["client_cpu_ms_per_page"] > 0
        # the gateway's and control nodes' CPU, from /proc in clock ticks (10 ms): a few
        # small pages may take less than one
        assert r["server_cpu_ms_per_page"] >= 0
    assert [r["pages"] for r in rows[:2]] == [1 + PREFIXES, 1]
    summary = listing.summarize(rows)
    assert [s["listing"] for s in summary] == ["prefix+delimiter", "full pagination"]
    for s in summary:
        assert s["medians"]["gw"]["keys_s"] > 0
        assert s["medians"]["weed"]["keys_s"] is None and s["gw_over_weed"] is None
    assert "gateway / SeaweedFS: -" in listing.render(summary, 2)


def test_a_listing_that_misses_a_key_is_an_error(
        gateway: tuple[wl.S3Target, bound.Roles, list[str]]) -> None:
    t, roles, keys = gateway
    row = listing.one_listing(t, roles, [*keys, "ls/p000/never-put"], "full pagination", 0)
    assert row["errors"] == 1 and "expected" in row["error_sample"]
    assert listing.summarize([row])[1]["medians"]["gw"]["keys_s"] is None


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--prefixes", "0"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        listing.parse_args(argv)
    assert exc.value.code == 2
