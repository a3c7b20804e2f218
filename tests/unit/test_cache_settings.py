"""The client's segment cache settings: a directory it cannot use makes misses (a warning),
never an error; a bad $ECSTORE_CACHE_MAX_MB names itself (a bare ValueError of float())."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from store.client import Client
from store.errors import BadRequest


def cluster_file(tmp_path: Path) -> Path:
    p = tmp_path / "cluster.json"
    p.write_text(json.dumps({"secret": "s" * 32, "control": ["http://127.0.0.1:1"]}))
    return p


def test_a_cache_directory_that_cannot_be_made_is_no_cache(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="ecstore.cache"):
        c = Client.connect(cluster_file(tmp_path), cache_dir=blocker / "cache")
    assert c.cache is None
    assert "cannot be used" in caplog.text and "reading from the cluster" in caplog.text
    ok = Client.connect(cluster_file(tmp_path), cache_dir=tmp_path / "cache")
    assert ok.cache is not None


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan"])
def test_a_bad_cache_size_in_the_environment_names_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      value: str) -> None:
    monkeypatch.setenv("ECSTORE_CACHE_MAX_MB", value)
    with pytest.raises(BadRequest, match="ECSTORE_CACHE_MAX_MB"):
        Client.connect(cluster_file(tmp_path), cache_dir=tmp_path / "cache")
