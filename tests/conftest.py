"""Shared fixtures. `--keep-tmp` keeps cluster directories for debugging."""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--keep-tmp", action="store_true",
                     help="keep cluster data directories after the tests")
