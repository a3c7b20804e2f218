"""The gateway supervisor's pure decisions (node.workers): restart backoff, exit reasons,
the stall timeout setting, and the counts it shares with its workers."""
from __future__ import annotations

import os
import signal

import pytest

from node import workers


def test_restart_backoff_doubles_to_its_cap_and_is_zero_after_a_long_run() -> None:
    assert workers.restart_delay_s(0) == 0.0
    delays = [workers.restart_delay_s(n) for n in range(1, 12)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(delays) == delays[-1] == workers.RESTART_BACKOFF_MAX_S
    assert delays == sorted(delays)


def test_exit_reason_names_the_signal_or_the_code() -> None:
    assert workers.exit_reason(signal.SIGKILL) == "killed by SIGKILL"   # a wait status
    assert workers.exit_reason(3 << 8) == "exited with 3"
    assert workers.exit_reason(0) == "exited with 0"


def test_stall_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(workers.STALL_TIMEOUT_ENV, raising=False)
    assert workers.stall_timeout_from_env() == workers.DEFAULT_STALL_TIMEOUT_S
    monkeypatch.setenv(workers.STALL_TIMEOUT_ENV, "4.5")
    assert workers.stall_timeout_from_env() == 4.5
    for bad in ("1", "soon", "-3", "nan"):
        monkeypatch.setenv(workers.STALL_TIMEOUT_ENV, bad)
        with pytest.raises(SystemExit, match=workers.STALL_TIMEOUT_ENV):
            workers.stall_timeout_from_env()


def test_worker_stats_are_shared_with_a_forked_child() -> None:
    stats = workers.WorkerStats()
    stats.set(configured=3, running=3)
    pid = os.fork()
    if pid == 0:   # the supervisor's side, in a child: the parent must see it
        stats.add("restarts")
        stats.add("stalls", 2)
        os._exit(0)
    os.waitpid(pid, 0)
    assert stats.get() == {"configured": 3, "running": 3, "restarts": 1, "stalls": 2}
    view = workers.workers_view(stats)
    assert view["supervised"] is True and view["pid"] == os.getpid()
    assert workers.workers_view(None)["configured"] == 1
