"""bench/loopback.py: real round trips between two processes over TCP and a Unix socket;
every answer arrives whole (a short one would hang the loop, so a count that finishes is
the check), figures for each kind and size; bad arguments are refused."""
from __future__ import annotations

import json

import pytest

from bench import loopback


def test_round_trips_over_both_sockets(capsys: pytest.CaptureFixture[str]) -> None:
    assert loopback.main(["--sizes", "200,70000", "--count", "50", "--rounds", "1",
                          "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["round_trips"]
    assert [(r["kind"], r["answer_bytes"]) for r in rows] == [
        ("tcp", 200), ("unix", 200), ("tcp", 70000), ("unix", 70000)]
    assert all(r["count"] == 50 and r["wall_us"] > 0 and r["cpu_us"] > 0 for r in rows)


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--sizes", "0"], ["--sizes", "a,b"], ["--count", "0"]):
        with pytest.raises(SystemExit) as exc:
            loopback.main(args)
        assert exc.value.code == 2
    assert "sizes must be" in capsys.readouterr().err
