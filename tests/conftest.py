"""Shared fixtures. `--keep-tmp` keeps cluster directories for debugging."""
from __future__ import annotations

import os

import pytest

from cli.localcluster import LISTEN_PORT_FLOOR, PORT_RANGE_ENV, _ephemeral_range, _listen_range

# Under pytest-xdist (`make test` runs two workers) each worker's clusters take their
# ports from a range of their own, so one worker never binds the port of a node the other
# has stopped and is about to restart: a part of ECSTORE_PORT_RANGE when that is set (a
# whole range shared by both workers once gave a control node EADDRINUSE), else of the
# ports from LISTEN_PORT_FLOOR up to the kernel's ephemeral range. The variable is
# inherited by the CLI and node processes the tests start.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _n, _count = int(_WORKER[2:]), max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    if os.environ.get(PORT_RANGE_ENV):
        _range = _listen_range()     # its checks, its message for a malformed range
        assert _range is not None
        _lo, _hi = _range
    else:
        _lo, _hi = LISTEN_PORT_FLOOR, _ephemeral_range()[0]
    _span = (_hi - _lo) // _count
    if _span < 100:
        raise pytest.UsageError(f"{PORT_RANGE_ENV}: {_hi - _lo} ports cannot give each of "
                                f"{_count} test workers 100 of its own")
    _first = _lo + _n * _span
    os.environ[PORT_RANGE_ENV] = f"{_first}-{_first + _span - 1}"

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--keep-tmp", action="store_true",
                     help="keep cluster data directories after the tests")
