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
