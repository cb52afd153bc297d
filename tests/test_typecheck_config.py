"""`mypy` runs clean where the optional modules are not installed (a contributor without torch,
Paddle, CuPy or pyopencl): every module anychip imports that is not one of its dependencies
is listed in pyproject's mypy override with ``ignore_missing_imports``."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported_top_level_modules() -> set[str]:
    found = set()
    for path in (ROOT / "src" / "anychip").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "anychip"}


def test_every_optional_module_may_be_missing_for_mypy() -> None:
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    required = {re.split(r"[<>=!~ \[]", dep)[0] for dep in project["project"]["dependencies"]}
    lenient = {m for o in project["tool"]["mypy"]["overrides"] if o.get("ignore_missing_imports")
               for m in o["module"]}
    optional = _imported_top_level_modules() - required
    assert {"torch", "paddle", "cupy", "pyopencl"} <= optional
    assert sorted(m for m in optional if m not in lenient or f"{m}.*" not in lenient) == []
