"""Child processes and the source layout: the package lives in src/anychip, so a program or
child started in a checkout's root imports the installed (or editable) anychip as any other
package, with the interpreter's own rules; no import-system trick stands between them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip.collectives.launch import launch

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import anychip, sys; print(anychip.__file__); print(sys.path[0])"


def test_the_checkout_root_holds_no_package_to_shadow_the_installed_one():
    assert (ROOT / "src" / "anychip" / "__init__.py").is_file()
    assert not (ROOT / "anychip").exists()
    assert not (ROOT / "src" / "__init__.py").exists()


def test_children_in_the_checkout_root_import_this_anychip_with_pythons_own_rules(tmp_path: Path):
    """`python -c` and `python -m` put the current directory first on sys.path; with the package
    under src/ that finds nothing named anychip, so the child imports the same anychip as this
    process (the editable install or the wheel)."""
    for argv in (["-c", PROBE], ["-m", "anychip", "--version"]):
        r = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=CHILD_SECONDS)
        assert r.returncode == 0, r.stderr
        if argv[0] == "-c":
            assert r.stdout.splitlines() == [anychip.__file__, ""]      # "" is the current directory
        else:
            assert r.stdout.strip() == f"anychip {anychip.__version__}"


def test_launched_ranks_run_a_script_with_its_directory_first(tmp_path: Path, capfd):
    (tmp_path / "where.py").write_text(PROBE + "\nimport os; print(os.environ['ANYCHIP_RANK'])\n")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert launch(2, [str(tmp_path / "where.py")]) == 0
    finally:
        os.chdir(cwd)
    out = sorted(capfd.readouterr().out.splitlines())
    assert out == sorted(f"[{r}] {line}" for r in (0, 1) for line in (anychip.__file__, str(tmp_path), str(r)))


@pytest.mark.slow
def test_python_dash_m_anychip_is_the_anychip_command(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "anychip", "--version"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"anychip {anychip.__version__}"
    r = subprocess.run([sys.executable, "-m", "anychip", "devices", "--bogus"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=CHILD_SECONDS)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0].startswith("usage: anychip ")


@pytest.mark.parametrize("given", [None, "3"])
def test_launched_ranks_get_their_share_of_the_cpus_unless_told(tmp_path: Path, capfd, given: str | None):
    (tmp_path / "threads.py").write_text("import os; print('T', os.environ['OMP_NUM_THREADS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if given is not None:
        env["OMP_NUM_THREADS"] = given
    assert launch(2, [str(tmp_path / "threads.py")], env=env) == 0
    share = given or str(max(1, (os.cpu_count() or 1) // 2))
    assert sorted(capfd.readouterr().out.splitlines()) == [f"[0] T {share}", f"[1] T {share}"]
