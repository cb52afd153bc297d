"""`anychip plugin new`: both kinds of project (the C one with its collectives, --collectives),
installed with pip into this environment, are listed, run collectives across 2 ranks and pass
the conformance suite; then the vendor's loop: an edit and a reinstall are seen, and an
uninstall leaves nothing behind. (The C project is built once, by the module's fixture.)"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS

from anychip.runtime.errors import InvalidArgumentError
from anychip.scaffold import new_plugin

ROOT = Path(__file__).resolve().parent.parent.parent
ANYCHIP = [sys.executable, "-m", "anychip.cli"]
PIP = [sys.executable, "-m", "pip"]
NAMES = {"c": "scafc", "python": "scafpy"}

#: the module installs its projects into the venv (every process there sees them): never beside other tests
pytestmark = pytest.mark.serial


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_DEVICES", "ANYCHIP_PLUGIN_PATH",
                                                              "ANYCHIP_TORCH")}
    env["ANYCHIP_LOG_LEVEL"] = "ERROR"
    return env


def _pip_install(*projects: Path) -> None:
    """`pip install ./NAME`, the C compiled with -Werror on top of the project's -Wall -Wextra
    (setuptools adds CFLAGS)."""
    env = dict(os.environ, CFLAGS=(os.environ.get("CFLAGS", "") + " -Werror").strip())
    r = subprocess.run([*PIP, "install", "-q", "--no-deps", *map(str, projects)], capture_output=True, text=True,
                       env=env, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the C plugin")
    root = tmp_path_factory.mktemp("scaffold")
    projects = {lang: new_plugin(name, lang, root, collectives=lang == "c") for lang, name in NAMES.items()}
    _pip_install(*projects.values())
    try:
        yield projects
    finally:
        subprocess.run([*PIP, "uninstall", "-q", "-y", *(f"anychip-{n}" for n in NAMES.values())],
                       capture_output=True, text=True, timeout=CHILD_SECONDS)


def test_projects_have_what_the_vendor_needs(tmp_path: Path) -> None:
    c = new_plugin("mychip", "c", tmp_path)
    assert sorted(str(p.relative_to(c)) for p in c.rglob("*") if p.is_file()) == [
        ".gitignore", "Makefile", "README.md", "anychip_mychip/__init__.py", "include/anychip/plugin.h",
        "pyproject.toml", "setup.py", "src/kernels.c", "src/mychip.c", "src/mychip.h"]
    source = (c / "src" / "mychip.c").read_text()
    assert "@name@" not in source and "@NAME@" not in source          # every token rendered
    assert source.count("DRIVER") >= 5 and "MYCHIP_DEVICES" in source
    assert '"mychip" = "anychip_mychip:library"' in (c / "pyproject.toml").read_text()
    assert "| `mem_alloc` / `mem_free` |" in (c / "README.md").read_text()
    assert "set_collectives" not in source and "`anychip plugin new NAME --collectives` writes" in source
    # --collectives: plugin.h's collective entries over the stand-in library, a DRIVER line each
    cc = new_plugin("ccchip", "c", tmp_path, collectives=True)
    assert sorted(str(p.relative_to(cc)) for p in cc.rglob("*") if p.is_file()) == [
        ".gitignore", "Makefile", "README.md", "anychip_ccchip/__init__.py", "include/anychip/plugin.h",
        "pyproject.toml", "setup.py", "src/ccchip.c", "src/ccchip.h", "src/collectives.c", "src/kernels.c"]
    ccl = (cc / "src" / "collectives.c").read_text()
    assert sorted(re.findall(r"p->(\w+) = c_", ccl)) == sorted(
        ["get_unique_id", "comm_init_rank", "comm_init_rank_timeout", "comm_destroy", "comm_abort",
         "comm_get_async_error", "all_reduce",
         "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "group_start",
         "group_end"])
    for call in ("ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError",
                 "ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter", "ncclAllToAll",
                 "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd"):
        assert f"DRIVER: {call}" in ccl, call
    assert "set_collectives(p);" in (cc / "src" / "ccchip.c").read_text() and "/ccchip-ccl-" in ccl
    readme = (cc / "README.md").read_text()
    assert "| `c_all_reduce` | `shm_all_reduce` | `ncclAllReduce` | `HcclAllReduce` |" in readme
    assert "anychip conformance --device ccchip -n 3 " in readme and "static anychip_status use(int device)" in readme
    for project in (c, cc):                         # every conditional block rendered, every token replaced
        for f in project.rglob("*"):
            if f.is_file() and f.name != "plugin.h":
                assert not re.search(r"^@[{}]|@\w+@", f.read_text(), re.M), f
        for f in (project / "src").iterdir():      # each file of src/ is compiled on its own and linked
            assert not re.search(r"^\s*#\s*include\s*[<\"].*\.c[>\"]", f.read_text(), re.M), f
    with pytest.raises(InvalidArgumentError, match=r"^--collectives writes plugin.h's collective entries: it takes "
                                                   r"--lang c"):
        new_plugin("pychip", "python", tmp_path, collectives=True)
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


def _wheel_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The anychip package as a wheel lays it out: setup.py's build_py run into ``tmp_path`` (templates
    and sources), csrc/include copied as build_ext copies it. Returns the package directory."""
    import runpy

    import setuptools
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    dist = setuptools.Distribution({"packages": ["anychip"], "package_dir": {"": "src"}, "script_name": "setup.py"})
    cmd = captured["cmdclass"]["build_py"](dist)
    cmd.build_lib = str(tmp_path)
    cmd.ensure_finalized()
    cmd.run()
    pkg = tmp_path / "anychip"
    shutil.copytree(ROOT / "csrc" / "include", pkg / "_include")          # what build_ext adds
    return pkg


def test_wheel_ships_the_header_and_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup.py's build_py and build_ext (what a wheel holds) copy csrc/templates to anychip/_templates,
    the sources compiled at the user's site to anychip/_src and csrc/include to anychip/_include,
    where the installed package reads them."""
    pkg = _wheel_package(tmp_path, monkeypatch)
    shipped = sorted(str(p.relative_to(pkg / "_templates")) for p in (pkg / "_templates").rglob("*") if p.is_file())
    source = sorted(str(p.relative_to(ROOT / "csrc" / "templates"))
                    for p in (ROOT / "csrc" / "templates").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert shipped == source and "c/src/@name@.c" in shipped
    from anychip._data import SHIPPED_SOURCES
    from anychip.paddle_provider import BRIDGE_UNITS, KERNEL_UNITS
    sources = sorted(str(p.relative_to(pkg / "_src")) for p in (pkg / "_src").rglob("*") if p.is_file())
    assert sources == sorted(str(p.relative_to(ROOT / "csrc")) for part in SHIPPED_SOURCES
                             for p in (ROOT / "csrc" / part).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert "ccl/ccl.h" in sources
    # the Paddle bridge's units and headers, which `anychip plugin paddle` compiles at the user's site
    assert {f"paddle/{f}" for f in (*BRIDGE_UNITS, *KERNEL_UNITS, "bridge.h", "phi_capi.h")} <= set(sources)
    assert {"torch/device.h", "torch/module.cpp", "torch/ops.cpp", "torch/c10d.cpp"} <= set(sources)
    probe = (f"import anychip._data as d, pathlib; d._PACKAGE = pathlib.Path(r'{pkg}'); "
             "print(d.get_include()); print(d.templates_dir()); print(d.sources_dir())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [str(pkg / "_include"), str(pkg / "_templates"), str(pkg / "_src")]


def test_a_paddle_bridge_builds_from_what_a_wheel_ships(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`anychip plugin paddle` in an installed anychip compiles the bridge from anychip/_src (its
    units, ccl/ccl.h) and anychip/_include alone: the bridge over the scaffolded C plugin, built
    there, exports what Paddle and the tools read and registers the plugin's kernels."""
    from conftest import build_scaffold

    import anychip._data
    from anychip import paddle_provider
    lib = build_scaffold(tmp_path / "scaffold", "wheelchip")
    pkg = _wheel_package(tmp_path / "wheel", monkeypatch)
    monkeypatch.setattr(anychip._data, "_PACKAGE", pkg)          # get_include() and sources_dir() read the wheel's
    assert anychip._data.sources_dir() == pkg / "_src"
    out = paddle_provider.build_bridge(str(lib), tmp_path / "paddle")
    exported = subprocess.run(["nm", "-D", "--defined-only", "--format=just-symbols", str(out)],
                              capture_output=True, text=True, check=True).stdout.split()
    # Paddle's InitPlugin, the tools' queries and kernels_throw.cc's functions; what the units share is hidden
    assert sorted(exported) == ["InitPlugin", *(f"anychip_paddle_{name}" for name in (
        "attr", "calls", "device_type", "i32s", "i64s", "kernel_calls", "kernel_note", "kernel_table", "kernels",
        "ptrs", "raise", "str", "target", "trace_device", "trace_runtime"))]
    table = paddle_provider.kernel_table(out)
    assert len(table) == 46 and "transpose" in table and "transpose_grad" in table, table
    assert table["matmul"] == ["float32", "float64", "float16", "bfloat16"], table


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
    transport = "native/scafc collectives (simulated)" if lang == "c" else "shm/staged"   # the plugin's own
    assert sorted(r.stdout.splitlines()) == [f"[0] {name}:0 {transport} correct", f"[1] {name}:1 {transport} correct"]


@pytest.mark.slow
def test_installed_plugins_pass_the_conformance_suite(installed: dict[str, Path], tmp_path: Path) -> None:
    """As generated, on 3 ranks: the C project's collectives through its own entries (the header
    line says `via native/scafc`), the Python project's on the host transport."""
    out = tmp_path / "out.json"
    r = subprocess.run([*ANYCHIP, "conformance", "--device", ",".join(NAMES.values()), "-n", "3", "--json",
                        str(out), "--no-progress", "--iters", "1", "--warmup", "0"],   # (values, not timings)
                       capture_output=True, text=True, env=_env(), timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "# anychip conformance: scafc (simulated), 3 ranks on scafc:0 via native/scafc collectives (simulated), " \
        "quick\n" in r.stdout
    report = json.loads(out.read_text())
    assert report["passed"] is True
    assert sorted(b["backend"] for b in report["backends"]) == sorted(NAMES.values())
    assert {b["backend"]: b["transport"] for b in report["backends"]} == {
        "scafc": "native/scafc collectives (simulated)", "scafpy": "shm/staged"}
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
    assert ("collectives: native (all_gather, all_reduce, all_to_all, broadcast, recv, reduce, reduce_scatter, send); "
            "the host transport runs the rest") in lines
    assert lines[-2:] == ["on the host: nothing: every entry is set, for every dtype plugin.h allows it",
                          "kernels:     5 entries (binary, unary, reduce, gemm, fill), 249 dtype cases checked (1560 "
                          "calls) against NumPy: all agree"]
    assert "anychip plugin check scafc " in (installed["c"] / "README.md").read_text()
    # src/*.c are linked into one library whose one exported symbol is anychip_plugin_init
    if shutil.which("nm"):
        library = lines[0].split()[1]
        r = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True)
        assert [line.split()[-1] for line in r.stdout.splitlines()] == ["anychip_plugin_init"], r.stdout
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


def _framework_conformance_passes(framework: str) -> None:
    r = subprocess.run([*ANYCHIP, "conformance", "--framework", framework, "--device", "scafc", "-n", "2"],
                       capture_output=True, text=True, env=_env(), timeout=LONG_CHILD_SECONDS)
    failed = re.findall(r"^#   FAIL (\S+) \(ranks? [\d,]+\): ", r.stdout, flags=re.M)
    assert failed == [] and r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"conformance ({framework}): PASS" in r.stdout


@pytest.mark.slow
def test_the_c_project_passes_the_torch_conformance(installed: dict[str, Path]) -> None:
    """`--framework torch`: PyTorch's device and c10d on the C project as generated, its collectives
    through the plugin's own entries."""
    pytest.importorskip("torch")
    _framework_conformance_passes("torch")


@pytest.mark.slow
def test_the_c_project_passes_the_paddle_conformance(installed: dict[str, Path]) -> None:
    """`--framework paddle`: Paddle's collectives and computes on the C project as generated, under
    Paddle's launcher, through a bridge compiled for the installed library."""
    pytest.importorskip("paddle.sysconfig")
    _framework_conformance_passes("paddle")


PADDLE_JOB = """
import paddle, paddle.distributed as dist
dist.init_parallel_env()
rank = dist.get_rank()
x = paddle.to_tensor([float(rank + 1)] * 5)
dist.all_reduce(x)
paddle.seed(7)
net = paddle.nn.Linear(4, 3)
before = float(net.weight.sum())
opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
model = paddle.DataParallel(net)
loss = model(paddle.full([2, 4], float(rank + 1))).sum()
loss.backward()
opt.step()
print("RANK", rank, "ON", paddle.device.get_device(), "SUM", x.numpy().tolist(), "STEP",
      round(before - float(net.weight.sum()), 5), flush=True)
"""


@pytest.mark.slow
def test_paddles_launcher_runs_a_job_on_the_c_project(installed: dict[str, Path], tmp_path: Path) -> None:
    """`anychip plugin paddle scafc`, then a user's job under `python -m paddle.distributed.launch` on 2
    ranks: an all_reduce through the plugin's collectives and a DataParallel SGD step (the gradient of
    a sum over a [2, 4] batch of rank + 1 is 2 (rank + 1) per weight, averaged 3: each of the 12
    weights moves by 0.3)."""
    pytest.importorskip("paddle.sysconfig")
    from anychip.conformance.framework import run_paddle_launch
    r = subprocess.run([*ANYCHIP, "plugin", "paddle", "scafc", "--dest", str(tmp_path / "pd")], capture_output=True,
                       text=True, env=_env(), timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    prog = tmp_path / "job.py"
    prog.write_text(PADDLE_JOB)
    env = {k: v for k, v in _env().items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env.update(CUSTOM_DEVICE_ROOT=str(tmp_path / "pd"), GLOG_minloglevel="2")
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp_path / "log"), "--devices", "0,1",
           str(prog)]
    r = run_paddle_launch(cmd, LONG_CHILD_SECONDS, cwd=tmp_path, env=env)
    logs = [(tmp_path / "log" / f"workerlog.{i}").read_text(errors="replace") for i in range(2)]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + "".join(logs)
    for rank, log in enumerate(logs):
        assert f"RANK {rank} ON anychip_scafc:{rank} SUM [3.0, 3.0, 3.0, 3.0, 3.0] STEP 3.6" in log, log[-3000:]


# -- the vendor's loop: edit, reinstall, uninstall (these two run last: they change the install) --------

@pytest.mark.slow
def test_an_edit_and_a_reinstall_are_seen(installed: dict[str, Path], tmp_path: Path) -> None:
    """An edit of the C source (the devices' name, their default count 4 -> 3) and `pip install ./scafc`
    again: anychip, PyTorch and Paddle (through the bridge `anychip plugin paddle scafc` bound to the
    installed library before the edit) run the new library."""
    paddle = importlib.util.find_spec("paddle") is not None
    if paddle:
        r = subprocess.run([*ANYCHIP, "plugin", "paddle", "scafc", "--dest", str(tmp_path / "pd")],
                           capture_output=True, text=True, env=_env(), timeout=CHILD_SECONDS)
        assert r.returncode == 0, r.stderr
    source = installed["c"] / "src" / "scafc.c"
    text = source.read_text()
    assert text.count('"scafc device %d (host memory)"') == 1 and text.count('env_long("SCAFC_DEVICES", 4,') == 1
    source.write_text(text.replace('"scafc device %d (host memory)"', '"scafc device %d (edited)"')
                      .replace('env_long("SCAFC_DEVICES", 4,', 'env_long("SCAFC_DEVICES", 3,'))
    _pip_install(installed["c"])
    r = subprocess.run([*ANYCHIP, "devices", "--all", "--json"], capture_output=True, text=True, env=_env(),
                       timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stderr
    names = {row["device"]: row["name"] for row in json.loads(r.stdout) if row["device"].startswith("scafc:")}
    assert names == {f"scafc:{i}": f"scafc device {i} (edited)" for i in range(3)}
    if importlib.util.find_spec("torch") is not None:
        probe = "import anychip.torch, torch; print(torch.anychip.get_device_name(1), torch.anychip.device_count())"
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=dict(_env(), ANYCHIP_TORCH="scafc"), timeout=LONG_CHILD_SECONDS)
        assert (r.returncode, r.stdout) == (0, "scafc device 1 (edited) 3\n"), r.stderr[-3000:]
    if paddle:
        probe = "import paddle; print(paddle.device.get_available_custom_device())"
        env = {k: v for k, v in _env().items() if not k.startswith(("PADDLE_", "FLAGS_"))}
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=dict(env, CUSTOM_DEVICE_ROOT=str(tmp_path / "pd"), GLOG_minloglevel="2"),
                           timeout=LONG_CHILD_SECONDS)
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == str([f"anychip_scafc:{i}" for i in range(3)]), \
            r.stdout[-2000:] + r.stderr[-3000:]


def test_an_uninstall_leaves_nothing_behind(installed: dict[str, Path]) -> None:
    files = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, json; print(json.dumps({n: [str(f."
                            "locate()) for f in m.files(n)] for n in ('anychip-scafc', 'anychip-scafpy')}))"],
                           capture_output=True, text=True, check=True, timeout=CHILD_SECONDS).stdout
    installed_files = [Path(f) for names in json.loads(files).values() for f in names]
    packages = {f.parent for f in installed_files if f.name == "__init__.py"}
    assert {p.name for p in packages} == {"anychip_scafc", "anychip_scafpy"}
    assert any(f.name == "libscafc.so" for f in installed_files)
    r = subprocess.run([*PIP, "uninstall", "-q", "-y", "anychip-scafc", "anychip-scafpy"], capture_output=True,
                       text=True, timeout=CHILD_SECONDS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [str(f) for f in installed_files if f.exists()] == []
    assert [str(p) for p in packages if p.exists()] == []          # no __pycache__ or build left either
    r = subprocess.run([*ANYCHIP, "devices", "--all", "--json"], capture_output=True, text=True, env=_env(),
                       timeout=CHILD_SECONDS)
    assert [row["device"] for row in json.loads(r.stdout) if row["device"].startswith(("scafc:", "scafpy:"))] == []
    r = subprocess.run([*ANYCHIP, "plugin", "check", "scafc"], capture_output=True, text=True, env=_env(),
                       timeout=CHILD_SECONDS)
    assert (r.returncode, r.stdout) == (1, "") and "no C plugin library called scafc" in r.stderr
