"""Imports flow one way: placement <- store <- node, cli."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"placement": {"store", "node", "cli"}, "store": {"node", "cli"}, "node": {"cli"}}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downwards(package: str) -> None:
    bad = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN[package]]
    assert not bad


def test_placement_does_no_io() -> None:
    for path in (ROOT / "placement").rglob("*.py"):
        text = path.read_text()
        for word in ("import asyncio", "import socket", "open(", "import time", "import random"):
            assert word not in text, f"{path.name} uses {word}"


def test_storage_and_control_nodes_do_not_load_the_client_library() -> None:
    """`store` loads its client when a name of it is first used: a storage or control node
    (a process per node, started at every restart) takes only the modules it needs."""
    import subprocess
    import sys
    code = ("import sys, node.storage, node.control; "
            "print('store.client' in sys.modules); "
            "from store import Client, SyncClient, tune_allocator; import store; "
            "print(Client is store.Client and 'store.client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["False", "True"]
    with pytest.raises(AttributeError):
        import store
        store.NoSuchName  # noqa: B018
