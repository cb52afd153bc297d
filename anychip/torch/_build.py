"""Compiling the PrivateUse1 extension (anychip/torch/device.cpp and c10d.cpp in anychip's headers) against
the torch that is installed, once, into a cache directory.

The extension is built on first ``import anychip.torch`` rather than at ``pip install``:
pip builds anychip in an isolated environment without torch, and a torch installed or
upgraded later needs a rebuild anyway (the C++ ABI of torch changes with every release).
The cache key covers the source, the compiler command, the torch version and location and
the Python version, so a changed torch or source compiles anew; concurrent first imports
(the ranks of one job) wait for one compile under a file lock.

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
from pathlib import Path
from types import ModuleType

from .._data import get_include
from ..runtime.env import torch_cache
from ..runtime.errors import AnychipError

__all__ = ["source", "sources", "cache_dir", "load_extension"]

MODULE = "_anychip_torch"


def source() -> Path:
    """The extension's main C++ source (the device), shipped with anychip's headers."""
    return Path(get_include()) / "anychip" / "torch" / "device.cpp"


def sources() -> list[Path]:
    """Every file the extension is built from: the device, the c10d backend's direct ops, the
    device's generators and random ops, its autocast kernels, the header they share."""
    here = source().parent
    return [here / "device.cpp", here / "c10d.cpp", here / "random.cpp", here / "amp.cpp", here / "device.h"]


def cache_dir() -> Path:
    raw = torch_cache()
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "anychip" / "torch"


def _commands(out: Path) -> list[list[str]]:
    """The compiler commands that build the extension into ``out``: one per C++ source (run
    side by side), then the link."""
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
    objects = [out.with_name(f"{out.name}.{p.stem}.o") for p in sources() if p.suffix == ".cpp"]
    cmds = [[*flags, "-c", str(p), "-o", str(o)]
            for p, o in zip((p for p in sources() if p.suffix == ".cpp"), objects, strict=True)]
    link = [cxx, "-shared", *map(str, objects), "-o", str(out)]
    for lib_dir in cpp_extension.library_paths():
        link += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    link += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl"]
    return [*cmds, link]


def _build(out: Path) -> list[list[str]]:
    """Run _commands(out): the compiles at once, then the link; AnychipError on a failure."""
    *compiles, link = cmds = _commands(out)
    procs = [(c, subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for c in compiles]
    failed = []
    for c, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            failed.append((c, err))
    if not failed:
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode != 0:
            failed.append((link, done.stderr))
    for c in compiles:
        Path(c[-1]).unlink(missing_ok=True)
    if failed:
        out.unlink(missing_ok=True)
        c, err = failed[0]
        raise AnychipError(f"compiling anychip's torch extension failed ({' '.join(c)}):\n{err.strip()[-4000:]}")
    return cmds


def _key(cmds: list[list[str]]) -> str:
    import torch

    h = hashlib.sha256()
    for p in sources():
        h.update(p.read_bytes())
    h.update((Path(get_include()) / "anychip" / "plugin.h").read_bytes())
    h.update("\0".join(c for cmd in cmds for c in cmd if "OUT" not in c and c not in map(str, sources())).encode())
    h.update(f"{torch.__version__}\0{torch.__file__}\0{sys.version}".encode())
    return h.hexdigest()[:20]


def _import(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_extension(verbose: bool = False) -> ModuleType:
    """The compiled extension, built first if this torch and source have no cached build."""
    for p in sources():
        if not p.exists():
            raise AnychipError(f"anychip's torch extension source {p} is missing; reinstall anychip")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    probe = _commands(Path("OUT"))
    key = _key(probe)
    where = cache_dir() / key
    target = where / f"{MODULE}{suffix}"
    if target.exists():
        return _import(target)
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # one compile; the other processes wait for it
        if not target.exists():
            tmp = where / f".{MODULE}.{os.getpid()}{suffix}"
            print(f"anychip.torch: compiling the PrivateUse1 extension for torch into {where} (once per torch "
                  "version; about a minute)", file=sys.stderr, flush=True)
            start = time.monotonic()
            cmds = _build(tmp)
            os.replace(tmp, target)
            (where / "command.txt").write_text("".join(" ".join(c) + "\n" for c in cmds))
            if verbose:
                print(f"anychip.torch: compiled in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return _import(target)
