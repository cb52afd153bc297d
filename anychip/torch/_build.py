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
    header they share."""
    here = source().parent
    return [here / "device.cpp", here / "c10d.cpp", here / "device.h"]


def cache_dir() -> Path:
    raw = torch_cache()
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "anychip" / "torch"


def _command(out: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise AnychipError("anychip.torch needs a C++ compiler to build its extension (set CXX, or install g++)")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    cmd = [cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           f"-I{get_include()}", f"-I{sysconfig.get_paths()['include']}"]
    cmd += [f"-I{p}" for p in cpp_extension.include_paths()]
    cmd += [str(p) for p in sources() if p.suffix == ".cpp"] + ["-o", str(out)]
    for lib_dir in cpp_extension.library_paths():
        cmd += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    cmd += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl"]
    return cmd


def _key(cmd: list[str]) -> str:
    import torch

    h = hashlib.sha256()
    for p in sources():
        h.update(p.read_bytes())
    h.update((Path(get_include()) / "anychip" / "plugin.h").read_bytes())
    h.update("\0".join(c for c in cmd if c not in (*(str(p) for p in sources()), "OUT")).encode())
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
    probe = _command(Path("OUT"))
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
            cmd = _command(tmp)
            print(f"anychip.torch: compiling the PrivateUse1 extension for torch into {where} (once per torch "
                  "version; about a minute)", file=sys.stderr, flush=True)
            start = time.monotonic()
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise AnychipError(f"compiling anychip's torch extension failed ({' '.join(cmd)}):\n"
                                   f"{done.stderr.strip()[-4000:]}")
            os.replace(tmp, target)
            (where / "command.txt").write_text(" ".join(cmd) + "\n")
            if verbose:
                print(f"anychip.torch: compiled in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return _import(target)
