"""Child processes import their parent's anychip whatever the current directory holds
(anychip/_spawn.py), and an unbuilt source tree never stands in for a built anychip
(anychip/__init__.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip._spawn import anychip_root, python_command
from anychip.collectives.launch import launch

PARENT = os.path.abspath(anychip.__file__)
SOURCE = Path(anychip_root()) / "anychip"


@pytest.fixture
def shadow(tmp_path: Path) -> Path:
    """A directory holding an unbuilt copy of anychip's source tree (its Python files, none of
    its compiled libraries), as a fresh clone's root does."""
    shutil.copytree(SOURCE, tmp_path / "anychip",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "_include", "_templates"))
    assert not any(p.suffix == ".so" for p in (tmp_path / "anychip" / "_lib").iterdir())
    return tmp_path


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A directory holding an ``anychip`` package that fails when imported: whatever a child
    imports from there shows."""
    (tmp_path / "anychip").mkdir()
    (tmp_path / "anychip" / "__init__.py").write_text("raise ImportError('the decoy anychip was imported')\n")
    return tmp_path


def child(argv: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(python_command(argv), cwd=cwd, capture_output=True, text=True, timeout=CHILD_SECONDS, **kw)


PROBE = "import anychip, sys; print(anychip.__file__); print(sys.argv); print(__name__)"


def test_a_module_child_beside_a_decoy_imports_the_parents_anychip(decoy: Path):
    (decoy / "probe_mod.py").write_text(PROBE + "\nimport os; print(os.getcwd() in __import__('sys').path)\n")
    plain = subprocess.run([sys.executable, "-m", "probe_mod"], cwd=decoy, capture_output=True, text=True,
                           timeout=CHILD_SECONDS)
    assert "the decoy anychip was imported" in plain.stderr          # what a plain `python -m` child does
    r = child(["-m", "probe_mod", "a", "b"], decoy)
    assert r.returncode == 0, r.stderr
    where, argv, name, cwd_on_path = r.stdout.splitlines()
    assert where == PARENT
    assert argv == str([str(decoy / "probe_mod.py"), "a", "b"])      # as `python -m` sets it
    assert name == "__main__"
    assert cwd_on_path == "True"                                      # `python -m` semantics kept


def test_a_code_child_beside_a_decoy_imports_the_parents_anychip(decoy: Path):
    r = child(["-c", PROBE, "x"], decoy)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [PARENT, str(["-c", "x"]), "__main__"]


def test_a_script_child_has_its_directory_first_and_the_parents_anychip(decoy: Path, tmp_path: Path):
    script = decoy / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys
        import helper_beside_prog
        import anychip
        for value in (anychip.__file__, sys.path[0], __file__, sys.argv, __name__):
            print(value)
        raise SystemExit(7)
    """))
    (decoy / "helper_beside_prog.py").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = child([str(script), "--flag"], elsewhere)
    assert r.returncode == 7, r.stderr                                # the program's exit code
    assert r.stdout.splitlines() == [PARENT, str(decoy), str(script), str([str(script), "--flag"]), "__main__"]


def test_a_missing_script_fails_as_python_does(tmp_path: Path):
    r = child(["nothere.py"], tmp_path)
    assert r.returncode == 2
    assert "can't open file 'nothere.py'" in r.stderr


def test_python_command_refuses_an_empty_program():
    with pytest.raises(ValueError, match="no program given"):
        python_command([])
    with pytest.raises(ValueError, match="-m needs an argument"):
        python_command(["-m"])


@pytest.mark.slow
def test_launched_ranks_beside_a_decoy_use_the_launchers_anychip(decoy: Path, capfd):
    (decoy / "where.py").write_text("import anychip; print('AT', anychip.__file__)\n")
    cwd = os.getcwd()
    os.chdir(decoy)
    try:
        rc = launch(2, ["where.py"])
    finally:
        os.chdir(cwd)
    out = capfd.readouterr().out.splitlines()
    assert rc == 0
    assert sorted(out) == [f"[0] AT {PARENT}", f"[1] AT {PARENT}"]


def test_an_unbuilt_tree_first_on_sys_path_defers_to_the_built_anychip(shadow: Path):
    """`python -c 'import anychip'` in a clone's root (the current directory first on sys.path)."""
    r = subprocess.run([sys.executable, "-c", "import anychip; print(anychip.__file__); anychip.device('cpu:0')"],
                       cwd=shadow, capture_output=True, text=True, timeout=CHILD_SECONDS,
                       env={**os.environ, "PYTHONPATH": anychip_root()})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == PARENT


def test_an_unbuilt_tree_alone_says_what_to_run(shadow: Path):
    # -S: no site-packages, so the unbuilt tree in the current directory is the only anychip
    r = subprocess.run([sys.executable, "-S", "-c", "import anychip"], cwd=shadow, capture_output=True, text=True,
                       timeout=CHILD_SECONDS, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: anychip at {shadow / 'anychip'} is a source tree whose C parts are not built "
                    f"(no compiled allocator core in {shadow / 'anychip' / '_lib'}) and no built anychip is "
                    f"installed; run `pip install {shadow}` (or `pip install -e {shadow}` to build it in place)")


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
