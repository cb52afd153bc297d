"""The `slow` list in conftest.py names tests that exist: a renamed test does not silently
move into the fast loop's share, nor a stale name linger."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).parent


def test_every_slow_name_is_a_test_function_of_its_file():
    defined = set()
    for file in TESTS.glob("test_*.py"):
        tree = ast.parse(file.read_text())
        defined |= {f"{file.name}::{n.name}" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert sorted(SLOW - defined) == []
    assert len(SLOW) > 40


def test_the_marker_is_applied(request):
    # this file's own tests are fast; a slow one is marked at collection
    assert request.node.get_closest_marker("slow") is None
    items = request.session.items
    slow = [i for i in items if i.get_closest_marker("slow")]
    assert all(f"{i.path.name}::{getattr(i, 'originalname', i.name)}" in SLOW for i in slow)
