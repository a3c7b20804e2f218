"""store.workers.InOrder: objects a step works on at once reach the checkpoint in their
order - a position is saved only once every object before it is done, and a failed one
holds the checkpoint before it (a resumed run comes back to it)."""
from __future__ import annotations

import json
from pathlib import Path

from store.workers import Checkpoint, InOrder


class Recording(Checkpoint):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saved: list[tuple[str, str]] = []

    def save(self, bucket: str, key: str) -> None:
        before = self.path.read_text() if self.path is not None and self.path.exists() else None
        super().save(bucket, key)
        if self.path is not None and self.path.read_text() != before:
            self.saved.append((bucket, key))


def test_positions_are_saved_in_order_whatever_order_objects_finish(tmp_path: Path) -> None:
    cp = Recording(tmp_path / "state.json")
    names = [("b", f"k{i}") for i in range(5)]
    order = InOrder(cp, names)
    order.done(2, False)
    order.done(1, False)
    assert cp.saved == []                       # k0 still running: nothing before it done
    order.done(0, False)
    assert cp.saved == names[:3]
    order.done(4, False)
    assert cp.saved == names[:3]
    order.done(3, False)
    assert cp.saved == names
    assert json.loads((tmp_path / "state.json").read_text()) == {"bucket": "b", "key": "k4"}


def test_a_failed_object_holds_the_checkpoint_before_it(tmp_path: Path) -> None:
    cp = Recording(tmp_path / "state.json")
    names = [("b", f"k{i}") for i in range(4)]
    order = InOrder(cp, names)
    order.done(0, False)
    order.done(2, False)
    order.done(1, True)                         # k1 failed: k2, k3 done, but not saved past k0
    order.done(3, False)
    assert cp.saved == names[:1]
    assert cp.load() == ("b", "k0")
