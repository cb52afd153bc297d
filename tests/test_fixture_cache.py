"""The cache of compiled test fixtures (conftest.cached_compile) is keyed on what the compile
reads: the same sources in another temporary directory are a hit, and a changed header that
a source includes is a new build, never the stale one."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import conftest
import pytest
from conftest import cached_compile

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


def _program(root: Path, value: int) -> list[str]:
    (root / "inc").mkdir(parents=True, exist_ok=True)
    (root / "inc" / "value.h").write_text(f"#define VALUE {value}\n")
    (root / "main.c").write_text('#include <stdio.h>\n#include "value.h"\nint main(void) { printf("%d\\n", VALUE); '
                                 'return 0; }\n')
    return [CC, "-O1", f"-I{root / 'inc'}", "-o", str(root / "prog"), str(root / "main.c")]


def _run(root: Path) -> str:
    return subprocess.run([str(root / "prog")], capture_output=True, text=True, check=True).stdout


def test_a_hit_in_another_directory_and_a_rebuild_after_a_header_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "FIXTURE_CACHE", tmp_path / "cache")
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    cached_compile(_program(first, 1), first / "prog", roots=(first,))
    assert _run(first) == "1\n"
    cached_compile(_program(second, 1), second / "prog", roots=(second,))     # the same compile elsewhere
    assert _run(second) == "1\n"
    assert len(list((tmp_path / "cache").iterdir())) == 1
    cached_compile(_program(third, 2), third / "prog", roots=(third,))        # only the header differs
    assert _run(third) == "2\n"
    assert len(list((tmp_path / "cache").iterdir())) == 2
