"""Shared fixtures. `--keep-tmp` keeps cluster directories for debugging."""
from __future__ import annotations

import os

import pytest

from cli.localcluster import LISTEN_PORT_FLOOR, PORT_RANGE_ENV, _ephemeral_range

# Under pytest-xdist (`make test` runs two workers) each worker's clusters take their
# ports from a range of their own, so one worker never binds the port of a node the other
# has stopped and is about to restart. The variable is inherited by the CLI and node
# processes the tests start.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit() and PORT_RANGE_ENV not in os.environ:
    _n, _count = int(_WORKER[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _span = (_ephemeral_range()[0] - LISTEN_PORT_FLOOR) // max(_count, 1)
    if _span >= 1000:
        _first = LISTEN_PORT_FLOOR + _n * _span
        os.environ[PORT_RANGE_ENV] = f"{_first}-{_first + _span - 1}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--keep-tmp", action="store_true",
                     help="keep cluster data directories after the tests")
