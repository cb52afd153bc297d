"""Compiling the PrivateUse1 extension (the C++ sources of ``csrc/torch``, shipped as ``anychip/_src/torch``)
against the torch that is installed, once, into a cache directory.

The extension is built on first ``import anychip.torch`` rather than at ``pip install``:
pip builds anychip in an isolated environment without torch, and a torch installed or
upgraded later needs a rebuild anyway (the C++ ABI of torch changes with every release).
The cache key covers the sources, the compiler and its flags, the torch version (and
commit) and the Python version, not where they are installed: a second environment with the
same torch and anychip loads the first one's build. Each source is a translation unit of its
own: they compile side by side, one compiler per CPU this process may use, then one link. A
build says what it compiles and shows each step as it ends; concurrent first imports (the ranks
of one job) wait for one compile under a file lock. A build that is interrupted (Ctrl-C, an
exception) stops its compilers and removes its partial files; one whose process dies stops them
too (they get SIGTERM when it goes), and the next build removes what it left.

``ANYCHIP_TORCH_CACHE`` sets the cache directory (default ``~/.cache/anychip/torch``);
``CXX`` the compiler (default ``c++``).
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from .._data import get_include, sources_dir
from ..runtime.env import torch_cache
from ..runtime.errors import AnychipError

__all__ = ["source_dir", "sources", "cache_dir", "load_extension"]

MODULE = "_anychip_torch"


def source_dir() -> Path:
    """The extension's sources: ``csrc/torch`` in a checkout, ``anychip/_src/torch`` in a wheel."""
    return sources_dir() / "torch"


#: the units that take longest to compile (they read the most of torch's headers), started first so
#: that no long compile starts last while the other CPUs have nothing left to do
_LONGEST = ("amp.cpp", "c10d.cpp", "random.cpp", "ops.cpp")


def sources() -> list[Path]:
    """Every file the extension is built from: its C++ sources (one translation unit each, the
    longest compiles first) and the internal header they share (device.h, which lists them)."""
    here = source_dir()
    units = sorted(here.glob("*.cpp"), key=lambda p: (_LONGEST.index(p.name) if p.name in _LONGEST
                                                      else len(_LONGEST), p.name))
    return [*units, *sorted(here.glob("*.h"))]


def cache_dir() -> Path:
    raw = torch_cache()
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "anychip" / "torch"


def _commands(out: Path) -> list[list[str]]:
    """The compiler commands that build the extension into ``out``: one per C++ source (run
    side by side), then the link. The link records no path of this environment's torch (no
    rpath): the extension is loaded after ``import torch``, whose libraries it then binds by
    their names, so the build serves every environment with the same torch."""
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise AnychipError("anychip.torch needs a C++ compiler to build its extension (set CXX, or install g++)")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    flags = [cxx, "-O2", "-std=c++20", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-I{get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    # Kineto's headers (the activity profiler of kineto.cpp), where this torch ships them
    flags += [f"-I{p}/kineto" for p in cpp_extension.include_paths() if Path(p, "kineto").is_dir()]
    objects = [out.with_name(f"{out.name}.{p.stem}.o") for p in sources() if p.suffix == ".cpp"]
    cmds = [[*flags, "-c", str(p), "-o", str(o)]
            for p, o in zip((p for p in sources() if p.suffix == ".cpp"), objects, strict=True)]
    link = [cxx, "-shared", *map(str, objects), "-o", str(out)]
    link += [f"-L{lib_dir}" for lib_dir in cpp_extension.library_paths()]
    link += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl"]
    return [*cmds, link]


def _own_group() -> Callable[[], None]:
    """Popen's preexec_fn for a compiler: a process group of its own (so that stopping it stops
    the compiler proper its driver runs, cc1plus), and on Linux SIGTERM when the process that
    started it dies (prctl(PR_SET_PDEATHSIG)): a killed import leaves no compiler driver running."""
    import ctypes
    import signal
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        prctl = None
    parent = os.getpid()

    def preexec() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, int(signal.SIGTERM), 0, 0, 0)      # PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os._exit(1)

    return preexec


def _stop(proc: subprocess.Popen) -> None:
    """Stop a compiler and everything it started (its process group), and reap it."""
    import signal
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
    proc.wait()


def _width() -> int:
    """How many sources compile at once: one per CPU this process may use (each compile of torch's
    headers takes about 1.6 GB; four at once on 2 CPUs are no faster, and ran machines out of memory)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _killed(rc: int) -> str:
    """What a compiler's exit code says when a signal ended it."""
    if rc >= 0:
        return ""
    import signal
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = f"signal {-rc}"
    return (f"\nthe compiler was killed by {name}" + (" (what the kernel's out-of-memory killer sends: each "
            "compile takes about 1.6 GB)" if -rc == signal.SIGKILL else ""))


def _say(text: str) -> None:
    print(f"anychip.torch: {text}", file=sys.stderr, flush=True)


def _build(out: Path) -> list[list[str]]:
    """Run _commands(out): the compiles at once, then the link, each step's end shown; AnychipError
    on a failure. However it ends, no compiler is left running and no object file is left behind."""
    *compiles, link = cmds = _commands(out)
    steps = len(cmds)
    start = time.monotonic()
    names = {id(c): Path(c[c.index("-c") + 1]).name for c in compiles}
    preexec = _own_group()
    procs: list[tuple[list[str], subprocess.Popen]] = []
    failed: list[tuple[list[str], str]] = []
    width = _width()
    waiting = list(compiles)
    running: list[tuple[list[str], subprocess.Popen]] = []
    try:
        done = 0
        shown = start
        while (waiting or running) and not failed:
            while waiting and len(running) < width:
                c = waiting.pop(0)
                proc = subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        preexec_fn=preexec)
                procs.append((c, proc))
                running.append((c, proc))
            for c, proc in list(running):
                try:
                    _, err = proc.communicate(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                running.remove((c, proc))
                done += 1
                if proc.returncode != 0:
                    failed.append((c, err + _killed(proc.returncode)))
                _say(f"[{done}/{steps}] {'compiled' if proc.returncode == 0 else 'FAILED'} {names[id(c)]} "
                     f"({time.monotonic() - start:.0f} s)")
            if running and time.monotonic() - shown >= 30:
                shown = time.monotonic()
                _say(f"still compiling {', '.join(names[id(c)] for c, _ in running)} "
                     f"({shown - start:.0f} s)")
        if not failed:
            linked = subprocess.run(link, capture_output=True, text=True, preexec_fn=preexec)
            if linked.returncode != 0:
                failed.append((link, linked.stderr))
            else:
                _say(f"[{steps}/{steps}] linked ({time.monotonic() - start:.0f} s)")
    finally:
        for _, proc in procs:
            _stop(proc)
        for c in compiles:
            Path(c[-1]).unlink(missing_ok=True)
        if failed or sys.exc_info()[0] is not None:
            out.unlink(missing_ok=True)
    if failed:
        c, err = failed[0]
        raise AnychipError(f"compiling anychip's torch extension failed ({' '.join(c)}):\n{err.strip()[-4000:]}")
    return cmds


def _key(cmds: list[list[str]]) -> str:
    """The build's identity: the sources, the compiler (its path, size and date) and every flag
    but the directories it reads (which differ between environments), the torch version and
    commit, the Python version."""
    import torch

    h = hashlib.sha256()
    for p in [*sources(), Path(get_include()) / "anychip" / "plugin.h"]:
        h.update(hashlib.sha256(p.read_bytes()).digest())
    cxx = Path(shutil.which(cmds[0][0]) or cmds[0][0]).resolve()
    info = cxx.stat() if cxx.exists() else None
    h.update(f"{cxx}\0{info.st_size if info else 0}\0{info.st_mtime_ns if info else 0}".encode())
    paths = {str(p) for p in sources()}
    flags = [f for cmd in cmds for f in cmd[1:]
             if not f.startswith(("-I", "-L")) and "OUT" not in f and f not in paths]
    h.update("\0".join(flags).encode())
    h.update(f"{torch.__version__}\0{torch.version.git_version}\0{sys.version}\0"
             f"{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    return h.hexdigest()[:20]


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_extension() -> ModuleType:
    """The compiled extension, built first if this torch and source have no cached build."""
    here = source_dir()
    if not (here / "device.h").exists() or not any(p.suffix == ".cpp" for p in sources()):
        raise AnychipError(f"anychip's torch extension sources are missing from {here}; reinstall anychip")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    probe = _commands(Path("OUT"))
    key = _key(probe)
    where = cache_dir() / key
    target = where / f"{MODULE}{suffix}"
    if target.exists():
        return _import(target)
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"waiting for another process that compiles the extension into {where}")
            fcntl.flock(lock, fcntl.LOCK_EX)      # one compile; the other processes wait for it
        if not target.exists():
            for stale in where.glob(f".{MODULE}.*"):     # what a killed build left
                stale.unlink(missing_ok=True)
            tmp = where / f".{MODULE}.{os.getpid()}{suffix}"
            import torch
            cpp = [p.name for p in sources() if p.suffix == ".cpp"]
            _say(f"compiling anychip's PyTorch device extension ({', '.join(cpp)}: {len(cpp)} C++ sources, "
                 f"{min(_width(), len(cpp))} at a time, then a link) against torch {torch.__version__} into "
                 f"{where}; once per torch version and anychip source, shared by every environment with them; "
                 "about 3 minutes of CPU time")
            start = time.monotonic()
            cmds = _build(tmp)
            os.replace(tmp, target)
            (where / "command.txt").write_text("".join(" ".join(c) + "\n" for c in cmds))
            _say(f"compiled in {time.monotonic() - start:.0f} s")
    return _import(target)
