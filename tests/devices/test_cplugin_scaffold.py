"""`anychip plugin new`: both kinds of project, installed with pip into this environment,
are listed, run collectives across 2 ranks and pass the conformance suite; uninstalled after."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS

from anychip.runtime.errors import InvalidArgumentError
from anychip.scaffold import new_plugin

ROOT = Path(__file__).resolve().parent.parent.parent
ANYCHIP = [sys.executable, "-m", "anychip.cli"]
PIP = [sys.executable, "-m", "pip"]
NAMES = {"c": "scafc", "python": "scafpy"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "ANYCHIP_PLUGIN_PATH")}
    env["ANYCHIP_LOG_LEVEL"] = "ERROR"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the C plugin")
    root = tmp_path_factory.mktemp("scaffold")
    projects = {lang: new_plugin(name, lang, root) for lang, name in NAMES.items()}
    r = subprocess.run([*PIP, "install", "-q", "--no-deps", *map(str, projects.values())],
                       capture_output=True, text=True, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield projects
    finally:
        subprocess.run([*PIP, "uninstall", "-q", "-y", *(f"anychip-{n}" for n in NAMES.values())],
                       capture_output=True, text=True, timeout=CHILD_SECONDS)


def test_projects_have_what_the_vendor_needs(tmp_path: Path) -> None:
    c = new_plugin("mychip", "c", tmp_path)
    assert sorted(str(p.relative_to(c)) for p in c.rglob("*") if p.is_file()) == [
        ".gitignore", "Makefile", "README.md", "anychip_mychip/__init__.py", "include/anychip/plugin.h",
        "pyproject.toml", "setup.py", "src/kernels.c", "src/mychip.c"]
    source = (c / "src" / "mychip.c").read_text()
    assert "@name@" not in source and "@NAME@" not in source          # every token rendered
    assert source.count("DRIVER") >= 5 and "MYCHIP_DEVICES" in source
    assert '"mychip" = "anychip_mychip:library"' in (c / "pyproject.toml").read_text()
    assert "| `mem_alloc` / `mem_free` |" in (c / "README.md").read_text()
    py = new_plugin("my_chip", "python", tmp_path)
    assert sorted(str(p.relative_to(py)) for p in py.rglob("*") if p.is_file()) == [
        ".gitignore", "README.md", "anychip_my_chip/__init__.py", "anychip_my_chip/device.py", "pyproject.toml"]
    assert "class MyChipPlugin(DevicePlugin):" in (py / "anychip_my_chip" / "device.py").read_text()
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    r = subprocess.run([ruff, "check", "--no-cache", "--select", "E,F,W,B,I,UP", "--line-length", "120",
                        "--target-version", "py310", str(py)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bad_names_and_places(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"plugin name 'My-Chip' is not a backend name"):
        new_plugin("My-Chip", "c", tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"plugin name 'cpu' is taken by a built-in backend"):
        new_plugin("cpu", "c", tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"--lang 'rust': want one of c, python"):
        new_plugin("chip", "rust", tmp_path)
    # a trailing newline ("$" matched before it) and names longer than plugin.h's device_type holds
    with pytest.raises(InvalidArgumentError, match=r"^plugin name 'nlchip\\n' is not a backend name"):
        new_plugin("nlchip\n", "c", tmp_path)
    new_plugin("c" * 63, "c", tmp_path / "long")
    with pytest.raises(InvalidArgumentError, match=r"^plugin name 'cccccccccccccccccccc'\.\.\. has 64 characters; a "
                       r"backend name has at most 63 \(plugin.h's device_type\)$"):
        new_plugin("c" * 64, "c", tmp_path)
    (tmp_path / "FILE").write_text("")
    with pytest.raises(InvalidArgumentError, match=f"^--dir {tmp_path / 'FILE'} is not a directory$"):
        new_plugin("chip", "c", tmp_path / "FILE")
    with pytest.raises(InvalidArgumentError, match="^--dir /proc/nope: cannot write /proc/nope: No such file or "
                       "directory$"):
        new_plugin("chip", "c", "/proc/nope")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "long"]
    r = subprocess.run([*ANYCHIP, "plugin", "new", "chip", "--lang", "python"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:3] == ["wrote ./chip (Python, DevicePlugin)", "next:", "  pip install ./chip"]
    assert (tmp_path / "chip" / "anychip_chip" / "device.py").is_file()
    r = subprocess.run([*ANYCHIP, "plugin", "new", "chip", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == f"anychip plugin new: error: {tmp_path / 'chip'} exists and is not empty; choose another " \
                       "--dir or remove it\n"


def test_wheel_ships_the_header_and_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py's build_py and build_ext (what a wheel holds) copy csrc/templates to anychip/_templates
    and csrc/include to anychip/_include, where the installed package reads them."""
    import runpy

    import setuptools
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    dist = setuptools.Distribution({"packages": ["anychip"], "script_name": "setup.py"})
    cmd = captured["cmdclass"]["build_py"](dist)
    cmd.build_lib = str(tmp_path)
    cmd.ensure_finalized()
    cmd.run()
    pkg = tmp_path / "anychip"
    shipped = sorted(str(p.relative_to(pkg / "_templates")) for p in (pkg / "_templates").rglob("*") if p.is_file())
    source = sorted(str(p.relative_to(ROOT / "csrc" / "templates"))
                    for p in (ROOT / "csrc" / "templates").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert shipped == source and "c/src/@name@.c" in shipped
    shutil.copytree(ROOT / "csrc" / "include", pkg / "_include")          # what build_ext adds
    probe = (f"import anychip._data as d, pathlib; d._PACKAGE = pathlib.Path(r'{pkg}'); "
             "print(d.get_include()); print(d.templates_dir())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [str(pkg / "_include"), str(pkg / "_templates")]


@pytest.mark.slow
def test_installed_plugins_are_listed(installed: dict[str, Path]) -> None:
    r = subprocess.run([*ANYCHIP, "devices", "--all", "--json"], capture_output=True, text=True, env=_env(),
                       timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    rows = {row["device"]: row for row in json.loads(r.stdout)}
    for name in NAMES.values():
        for i in range(4):
            assert rows[f"{name}:{i}"]["kind"] == "simulated"
            assert rows[f"{name}:{i}"]["name"] == f"{name} device {i} (host memory)"
            assert rows[f"{name}:{i}"]["memory"] == 1 << 30
    info = json.loads(subprocess.run([*ANYCHIP, "info", "--json"], capture_output=True, text=True, env=_env(),
                                     timeout=CHILD_SECONDS).stdout)
    sources = {b["name"]: b["source"] for b in info["backends"]}
    assert sources["scafc"].startswith("C library ")
    assert sources["scafc"].endswith("/anychip_scafc/libscafc.so (from entry point anychip_scafc:library "
                                     "(package anychip-scafc))")
    assert sources["scafpy"] == "entry point anychip_scafpy:ScafpyPlugin (package anychip-scafpy)"
    assert info["refused_plugins"] == []


PROG = """
import numpy as np, anychip
from anychip import collectives
comm = collectives.init()
t = comm.transport
dev = anychip.device(f"{BACKEND}:{t.rank}")
x = dev.alloc(4 << 20).copy_from(np.arange(1 << 20, dtype=np.float32) * (t.rank + 1))
comm.all_reduce(x, op="sum", dtype="float32").wait()
ok = np.array_equal(x.to_numpy(np.float32), np.arange(1 << 20, dtype=np.float32) * 3)
print(dev, t.name, "correct" if ok else "WRONG", flush=True)
"""


@pytest.mark.parametrize("lang", ["c", "python"])
def test_installed_plugins_run_collectives(installed: dict[str, Path], lang: str, tmp_path: Path) -> None:
    name = NAMES[lang]
    prog = tmp_path / "prog.py"
    prog.write_text(PROG.replace("{BACKEND}", name))
    r = subprocess.run([*ANYCHIP, "launch", "-n", "2", "--device", name, str(prog)], capture_output=True,
                       text=True, env=_env(), timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == [f"[0] {name}:0 shm/staged correct", f"[1] {name}:1 shm/staged correct"]


@pytest.mark.slow
def test_installed_plugins_pass_the_conformance_suite(installed: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    r = subprocess.run([*ANYCHIP, "conformance", "--device", ",".join(NAMES.values()), "-n", "2", "--json",
                        str(out), "--no-progress"], capture_output=True, text=True, env=_env(), timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["passed"] is True
    assert sorted(b["backend"] for b in report["backends"]) == sorted(NAMES.values())
    for b in report["backends"]:
        failed = [c["name"] for c in b["cases"] if c["status"] == "failed"]
        skipped = [c["name"] for c in b["cases"] if c["status"] == "skipped"]
        no_kernel_set = b["backend"] == NAMES["python"]      # the Python scaffold's tensor ops run on the host
        assert failed == [] and skipped == (["kernels"] if no_kernel_set else []), (b["backend"], failed, skipped)
        assert {"all_reduce", "bad_free", "oom_recovery", "events_timing", "killed_rank"} <= \
            {c["name"] for c in b["cases"]}


def test_plugin_check_finds_an_installed_plugin_by_name(installed: dict[str, Path], tmp_path: Path) -> None:
    # the generated README's step after `pip install ./NAME`: the library lies in site-packages
    r = subprocess.run([*ANYCHIP, "plugin", "check", "scafc"], capture_output=True, text=True, env=_env(),
                       cwd=tmp_path, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("library:     /") and lines[0].endswith(
        "/anychip_scafc/libscafc.so (from entry point anychip_scafc:library (package anychip-scafc))")
    assert lines[1] == "backend:     scafc (simulated)"
    assert "kernels:     " in r.stdout and "FAIL" not in r.stdout
    assert "anychip plugin check scafc " in (installed["c"] / "README.md").read_text()
    # a file name that is not there points at the name; a Python plugin and an unknown name are refused
    for arg, why in [("libscafc.so", "no such file; an installed plugin is named by its backend name: scafc"),
                     ("scafpy", "scafpy is a Python plugin (entry point anychip_scafpy:ScafpyPlugin (package "
                                "anychip-scafpy)), not a C plugin library (anychip/plugin.h)"),
                     ("nochip", "no C plugin library called nochip: no anychip.plugin_libraries entry point "
                                "nochip (is its package installed? `pip install ./nochip`) and no libnochip.so "
                                "in ANYCHIP_PLUGIN_PATH; or pass the library's path")]:
        r = subprocess.run([*ANYCHIP, "plugin", "check", arg], capture_output=True, text=True, env=_env(),
                           cwd=tmp_path, timeout=CHILD_SECONDS)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"anychip plugin check: {arg} refused: {why}\n")


def test_plugin_paddle_binds_the_installed_copy(installed: dict[str, Path], tmp_path: Path) -> None:
    """`anychip plugin paddle NAME` binds the library anychip and PyTorch load (the installed package's:
    a reinstall rewrites that file, so Paddle sees it too); a path to a second copy is refused."""
    lib = Path(installed["c"]).parent / "copy" / "libscafc.so"      # e.g. the checkout's `make` build
    lib.parent.mkdir()
    r = subprocess.run([*ANYCHIP, "plugin", "check", "scafc"], capture_output=True, text=True, env=_env(),
                       timeout=CHILD_SECONDS)
    site_lib = r.stdout.splitlines()[0].split()[1]
    shutil.copyfile(site_lib, lib)
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", str(lib), "--dest", str(tmp_path)], capture_output=True,
                       text=True, env=_env(), timeout=CHILD_SECONDS)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"anychip: error: {lib} is a second copy of the plugin scafc: anychip and PyTorch load "
                        f"{site_lib} (from entry point anychip_scafc:library (package anychip-scafc)); bind Paddle "
                        "to that one, `anychip plugin paddle scafc`, so that a reinstall is seen by all three\n")
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", "scafc", "--dest", str(tmp_path)], capture_output=True,
                       text=True, env=_env(), timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (f"{tmp_path}/libanychip_scafc.so: the Paddle device type anychip_scafc over "
                                        f"{site_lib} (from entry point anychip_scafc:library (package anychip-scafc))")
    assert f"{site_lib}\0".encode() in (tmp_path / "libanychip_scafc.so").read_bytes()   # the bound path
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", "scafpy", "--dest", str(tmp_path)], capture_output=True,
                       text=True, env=_env(), timeout=CHILD_SECONDS)
    assert (r.returncode, r.stderr) == (1, "anychip plugin paddle: scafpy refused: scafpy is a Python plugin (entry "
                                           "point anychip_scafpy:ScafpyPlugin (package anychip-scafpy)), not a C "
                                           "plugin library (anychip/plugin.h)\n")


def test_framework_conformance_refuses_a_python_plugin_up_front(installed: dict[str, Path]) -> None:
    pytest.importorskip("torch")
    r = subprocess.run([*ANYCHIP, "conformance", "--framework", "torch", "--device", "scafpy", "-n", "2"],
                       capture_output=True, text=True, env=_env(), timeout=CHILD_SECONDS)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("anychip: error: conformance --framework torch: backend scafpy (entry point "
                        "anychip_scafpy:ScafpyPlugin (package anychip-scafpy)) has no anychip/plugin.h face, which "
                        "PyTorch's device and Paddle's run on (the simulated chips and C plugins have one; a Python "
                        "plugin cannot)\n")
