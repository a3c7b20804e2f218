"""cli.ops.passes_until_still: how many rebalance passes a drain runs while puts that
took the old map are still to commit fragments on the leaving node (pure: the passes'
reports and the count of such fragments are given)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

import cli.ops as ops


@dataclass
class Pass:
    moved: int = 0
    failed: int = 0
    incomplete: bool = False
    resumed_after: int = 0


def run(passes: list[Pass], awaited: list[int], monkeypatch: pytest.MonkeyPatch
        ) -> tuple[list[Any], bool, list[int]]:
    """Run the loop over scripted passes and awaited() answers: (reports, settled, the
    awaited answers left unused)."""
    monkeypatch.setattr(ops, "MAP_TTL_S", -0.5)         # no wait between passes

    async def settled(c: Any) -> bool:
        return True
    monkeypatch.setattr(ops, "settle_storage", settled)
    script, answers = list(passes), list(awaited)

    async def run_pass(n: int) -> Pass:
        return script.pop(0)

    async def still() -> int:
        return answers.pop(0)
    reports: list[Any] = []
    done = asyncio.run(ops.passes_until_still(None, run_pass, reports,  # type: ignore[arg-type]
                                              retry_failed=True, awaited=still))
    return reports, done, answers


def test_passes_go_on_past_drain_passes_while_puts_commit_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # each late commit costs a pass that moves it, then one that finds it gone: 8 passes,
    # past DRAIN_PASSES (5) - the loop stopped at 8 with 3 fragments still awaited
    passes = [Pass(100), Pass(0), Pass(3), Pass(0), Pass(3), Pass(0), Pass(3), Pass(0), Pass(0)]
    reports, done, left = run(passes, [9, 6, 3, 0], monkeypatch)
    assert len(reports) == 8 and done and left == []


def test_without_awaited_fragments_it_is_drain_passes_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reports, done, _ = run([Pass(5), Pass(0)], [0], monkeypatch)
    assert len(reports) == 2 and done
    reports, done, _ = run([Pass(5)] * 7, [], monkeypatch)
    assert len(reports) == ops.DRAIN_PASSES and not done          # still moving: not settled


def test_a_failing_pass_is_not_retried_past_drain_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    passes = [Pass(0)] + [Pass(1, failed=1)] * 10
    reports, done, _ = run(passes, [4], monkeypatch)
    assert len(reports) == ops.DRAIN_PASSES and not done
