"""A bug in a CLI command: its traceback for the report, one line saying so, exit 1, and
with --json still JSON on stdout (a script parsing it gets an error object)."""
from __future__ import annotations

import json
from typing import Any

import pytest

import cli.main


def test_a_bug_prints_its_traceback_and_json_still_gets_json(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(fn: Any, no_map_exit: int | None = None) -> Any:
        def run(a: Any) -> int:
            raise RuntimeError("boom")
        return run
    monkeypatch.setattr(cli.main, "with_client", broken)
    assert cli.main.main(["ls", "--json"]) == 1
    out, errors = capsys.readouterr()
    assert json.loads(out) == {"error": "internal", "message": "RuntimeError: boom"}
    assert "Traceback" in errors and "bug in ecstore" in errors
    assert cli.main.main(["ls"]) == 1       # no --json: nothing on stdout
    out, _ = capsys.readouterr()
    assert out == ""
