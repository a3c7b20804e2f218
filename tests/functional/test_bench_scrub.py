"""bench/scrub.py on a real store: a small run reads every fragment in both modes, checks
each (a damaged one stops it), and reports what it measured; bad arguments are refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scrub
from node.fragments import FragmentStore
from store.errors import Corrupt


def test_a_small_run_reads_every_fragment_in_both_modes(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert scrub.main(["--mib", "6", "--rounds", "2", "--dir", str(tmp_path / "s"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["mode"] for p in out["passes"]] == ["plain", "uncached"] * 2
    assert all(p["fragments"] == 6 and p["mb_s"] > 0 and p["sys_s"] >= 0 for p in out["passes"])
    store = FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0)     # kept with --dir
    assert store.count == 6 and store.bytes > 6 * 1024 * 1024


def test_a_damaged_fragment_stops_the_run(tmp_path: Path) -> None:
    assert scrub.main(["--mib", "2", "--rounds", "1", "--dir", str(tmp_path / "s")]) == 0
    path, off, length = FragmentStore(tmp_path / "s", fsync=True, reserve_bytes=0).locate("bench.000001")
    with open(path, "r+b") as f:
        f.seek(off + length // 2)
        f.write(b"\xff\x00\xff")
    with pytest.raises(Corrupt, match="bench.000001"):
        scrub.main(["--mib", "2", "--rounds", "1", "--dir", str(tmp_path / "s")])


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        scrub.main(["--mib", "0"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err
