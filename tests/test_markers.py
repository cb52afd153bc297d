"""The `slow` list in conftest.py names tests that exist: a renamed test does not silently
move into the fast loop's share, nor a stale name linger."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).parent


def test_every_slow_name_is_a_test_function_of_its_file():
    defined = set()
    for file in TESTS.rglob("test_*.py"):
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


def test_one_timeout_policy():
    """pyproject's per-test limit is conftest's TEST_SECONDS, ci/test does not override it, each
    child bound is under its test's limit, and no test writes its own long child bound."""
    import re

    from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS, TEST_SECONDS

    root = TESTS.parent
    assert re.search(r"^timeout = (\d+)$", (root / "pyproject.toml").read_text(), re.M).group(1) == str(TEST_SECONDS)
    assert "--timeout" not in (root / "ci" / "test").read_text()
    assert CHILD_SECONDS < TEST_SECONDS and LONG_CHILD_SECONDS < LONG_TEST_SECONDS
    literal = re.compile(r"\btimeout(?:=|: \w+ = )(\d+)|mark\.timeout\((\d+)\)")
    long_ones = [f"{f.relative_to(TESTS)}: {m.group(0)}" for f in sorted(TESTS.rglob("*.py"))
                 for m in literal.finditer(f.read_text()) if int(m.group(1) or m.group(2)) >= 120]
    assert long_ones == []
