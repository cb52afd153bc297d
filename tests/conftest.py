"""Shared fixtures: one test body runs against every selected device.

``device`` is parametrized over the first selected device of each available
backend (``ANYCHIP_DEVICES`` narrows it, e.g. ``ANYCHIP_DEVICES=opencl:0 ci/test``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import anychip

TESTS = Path(__file__).resolve().parent       # tests/, laid out like the package: runtime/, devices/, ...
ROOT = TESTS.parent

# The one timeout policy. pytest-timeout ends a test after TEST_SECONDS (pyproject.toml's
# `timeout`; ci/test does not override it). A test that waits for a child process gives it
# CHILD_SECONDS, less than its own limit, so that the child's timeout fires first and the
# failure shows the child's output. The few tests that run whole suites or compile a framework
# extension are marked `pytest.mark.timeout(LONG_TEST_SECONDS)` and give their children
# LONG_CHILD_SECONDS. A shorter bound written in a test is part of what it asserts (a fault
# ends in bounded time), not a policy.
TEST_SECONDS = 300
CHILD_SECONDS = 240
LONG_TEST_SECONDS = 900
LONG_CHILD_SECONDS = 840


def paddle_dir() -> Path | None:
    """The installed paddlepaddle package's folder, found without importing Paddle (seconds in
    every process that collects the tests, each pytest-xdist worker's included); None where
    the wheel is absent (a folder named paddle without __init__.py is no Paddle)."""
    spec = importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None or not spec.origin.endswith("__init__.py"):
        return None
    return Path(spec.origin).parent


def _first_device_of_each_backend() -> list[str]:
    seen: dict[str, str] = {}
    try:
        for d in anychip.devices():
            seen.setdefault(d.backend, d.name)
    except anychip.SelectionError:
        return []
    return list(seen.values())


DEVICE_NAMES = _first_device_of_each_backend()


def ccl_segments() -> set[str]:
    """anychip's shared-memory segments in /dev/shm (other programs, MPI's among them, make their own)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("anychip-ccl-")} if os.path.isdir("/dev/shm") else set()


def leaked_segments(before: set[str]) -> set[str]:
    """anychip segments that appeared since ``before`` and stay. Another job on the machine can
    hold one for a moment while its ranks join (it is unlinked once all have); a leak stays, so
    a name still there after 2 s is one."""
    deadline = time.monotonic() + 2.0
    left = ccl_segments() - before
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left &= ccl_segments()
    return left


@pytest.fixture(params=DEVICE_NAMES)
def device(request: pytest.FixtureRequest) -> anychip.Device:
    return anychip.device(request.param)


#: compiled test fixtures (plugins, programs), kept between runs: build/test-fixtures/<key>/
FIXTURE_CACHE = ROOT / "build" / "test-fixtures"
_SOURCES = (".c", ".cc", ".cpp")


def _compiler_identity(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    return f"{shutil.which(cc) or cc}\n{out}"


def cached_compile(cmd: list[str], output: Path, roots: tuple[Path, ...] = ()) -> Path:
    """Run ``cmd`` (a compiler command that writes ``output``), or copy ``output`` from the last
    run of the same compile. The key is what the compile reads, by content: the compiler's
    identity and version, the command, the preprocessed text of each C source it names (so
    every header it includes counts) and the bytes of every other file it names (objects,
    libraries); the temporary directories ``roots`` are named alike in every run."""
    def same_everywhere(text: str) -> str:
        for i, root in enumerate(roots):
            text = text.replace(str(root), f"<root{i}>")
        return text

    out_at = cmd.index("-o") + 1
    flags = [a for i, a in enumerate(cmd[1:], 1) if i != out_at and not a.endswith(_SOURCES)
             and not os.path.isfile(a)]
    preprocess: list[str] = []
    for i, a in enumerate(flags):
        if a.startswith(("-I", "-D", "-U", "-std", "-f")) or (i and flags[i - 1] == "-I"):
            preprocess.append(a)
    h = hashlib.sha256(_compiler_identity(cmd[0]).encode())
    h.update(same_everywhere("\0".join(flags)).encode())
    for i, a in enumerate(cmd[1:], 1):
        if i == out_at or a.startswith("-"):
            continue
        if a.endswith(_SOURCES):
            lang = ["-x", "c++"] if a.endswith((".cc", ".cpp")) else []
            text = subprocess.run([cmd[0], *preprocess, *lang, "-E", a], capture_output=True, text=True,
                                  check=True).stdout
            h.update(same_everywhere(text).encode())
        elif os.path.isfile(a):
            h.update(Path(a).read_bytes())
    cached = FIXTURE_CACHE / h.hexdigest()[:32] / output.name
    if not cached.is_file():
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(output, f"{cached}.{os.getpid()}")
        os.replace(f"{cached}.{os.getpid()}", cached)         # whole, or not there
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, output)
        output.chmod(0o755)
    return output


#: the backend name of the scaffolded C plugin (`anychip plugin new`, unchanged) some tests load
SCAFFOLD = "tkern"


def build_scaffold(directory: Path, name: str = SCAFFOLD) -> Path:
    """Render `anychip plugin new NAME` (C) in ``directory`` and compile it as its Makefile does
    (skips the test without a C compiler): the library's path."""
    from anychip.scaffold import new_plugin

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the scaffolded plugin")
    project = new_plugin(name, "c", directory)
    lib = project / f"lib{name}.so"
    return cached_compile([cc, "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-fPIC",
                           f"-I{project / 'include'}", "-shared", "-o", str(lib),
                           *(str(p) for p in sorted((project / "src").glob("*.c"))), "-lpthread", "-lm"],
                          lib, roots=(directory,))



def build_template_wrapper(cc: str, project: Path, wrapper: Path, lib: Path, *defines: str,
                           opt: str = "-O1", includes: tuple[Path, ...] = (), roots: tuple[Path, ...] = ()) -> Path:
    """A test plugin made of a rendered C template ``project`` (`anychip plugin new NAME`, without
    collectives) and ``wrapper`` (tests/c), which includes the template's internal header (passed as
    TEMPLATE_HEADER) and wraps its init: the template's NAME.c is compiled with its
    anychip_plugin_init renamed template_plugin_init, and linked with the wrapper and src/kernels.c.
    ``defines`` are the wrapper's -D flags; both compiles are cached (cached_compile)."""
    name = project.name
    common = [opt, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden",
              f"-I{project / 'include'}", *(f"-I{p}" for p in includes)]
    obj = lib.parent / f"{lib.stem}.template.o"
    cached_compile([cc, "-c", *common, "-Danychip_plugin_init=template_plugin_init", "-o", str(obj),
                    str(project / "src" / f"{name}.c")], obj, roots=roots)
    return cached_compile([cc, *common, "-shared", f'-DTEMPLATE_HEADER="{project / "src" / f"{name}.h"}"',
                           *defines, "-o", str(lib), str(wrapper), str(project / "src" / "kernels.c"), str(obj),
                           "-lpthread", "-lm"], lib, roots=roots)
@pytest.fixture(scope="session")
def scaffold_plugin(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The scaffolded C plugin, loaded once (its CPlugin instance; not registered)."""
    from anychip.chips import cplugin

    _, loader = cplugin.probe(str(build_scaffold(tmp_path_factory.mktemp("scaffold"))))
    return loader()


@pytest.fixture
def scaffold_device(scaffold_plugin: Any):
    """Device 0 of the scaffolded C plugin, registered for the test (backend SCAFFOLD)."""
    anychip.runtime.registry.register_plugin(scaffold_plugin, source="the scaffolded C plugin (tests)")
    try:
        yield anychip.device(f"{SCAFFOLD}:0")
    finally:
        anychip.device(f"{SCAFFOLD}:0").synchronize()
        anychip.runtime.registry.unregister_plugin(SCAFFOLD)


def solo(device: str) -> Any:
    """A one-rank communicator on ``device`` in this process (no launcher), its job id unique."""
    from anychip import collectives
    return collectives.init(device, world=collectives.World(0, 1, 0, 1, f"solo-{os.getpid()}-{time.monotonic_ns()}",
                                                            "none"))


@pytest.fixture
def comm():
    """A one-rank communicator on cpu:0, destroyed after the test."""
    c = solo("cpu:0")
    yield c
    c.destroy()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No ANYCHIP_DEVICES from the outside; registry and selection rebuilt after the test."""
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    yield monkeypatch
    anychip.runtime.registry.reset()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--serial", choices=("run", "only", "skip"), default="run",
                     help="the tests marked serial (they change what every process on the machine sees, e.g. "
                          "install into the venv): run them with the others (default), only them, or none; "
                          "ci/test -n N runs them alone first, then the rest on N processes (CONTRIBUTING.md)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = config.getoption("--serial")
    if mode == "run":
        return
    keep = [it for it in items if (it.get_closest_marker("serial") is not None) == (mode == "only")]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    lines = [f"anychip devices under test: {', '.join(DEVICE_NAMES) or 'none'}"]
    for b in anychip.backends():
        if not b.available:
            lines.append(f"  {b.name}: skipped, unavailable ({b.reason})")
    if os.environ.get("ANYCHIP_DEVICES"):
        lines.append(f"  ANYCHIP_DEVICES={os.environ['ANYCHIP_DEVICES']!r}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def at() -> Any:
    """anychip.torch, imported with PrivateUse1 bound to the default backend (the simulated
    Ascend): no ANYCHIP_TORCH or launcher device left over from another test."""
    os.environ.pop("ANYCHIP_TORCH", None)
    os.environ.pop("ANYCHIP_LAUNCH_DEVICE", None)
    import anychip.torch as module
    return module
