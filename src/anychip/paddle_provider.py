"""anychip's chips as PaddlePaddle devices (see docs/paddle.md, "Paddle on anychip").

The bridge (``csrc/paddle/``, shipped in a wheel as ``anychip/_src/paddle/``: units compiled
at the user's site, see ``bridge.h`` there) implements Paddle's CustomDevice ``InitPlugin`` over
one ``anychip/plugin.h`` library. Paddle gives each library it loads one device type, named
``anychip_<backend>``:

* the simulated chips: ``paddle_custom_device/libanychip_sim`` beside the anychip package
  (installed there by ``pip install anychip``) serves the chip ``ANYCHIP_PADDLE`` names
  (ascend, kunlun or hygon; the Ascend when unset), through each simulator's plugin.h face
  (csrc/adapters/acl/plugin_acl.c, plugin_xpu.c, plugin_hip.c);
* a vendor's C plugin: :func:`build_bridge` (``anychip plugin paddle NAME``) compiles a
  copy of the bridge bound to the library anychip loads for the backend NAME (the installed
  package's: a reinstall is seen by Paddle too; a path to another copy of it is refused).

Both register Paddle phi kernels built from the plugin's kernel table (``anychip/plugin.h``
minor 1; ``paddle/kernels.c``), per dtype its masks allow; every other op takes Paddle's CPU
fallback.

Paddle reads ``CUSTOM_DEVICE_ROOT``, or, when it is unset, ``<site-packages>/paddle_custom_device``
of the site directory holding ``paddle/libs`` (paddle/base/core.py of Paddle 3.3.1).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ._data import get_include, sources_dir
from .runtime._libs import find_library
from .runtime.env import PADDLE_CHIPS, paddle_chip
from .runtime.errors import AnychipError

__all__ = ["SIMULATED", "PREFIX", "device_type", "bridge_dir", "simulator_bridge", "paddle_dir", "status",
           "build_bridge", "kernel_table", "kernel_note", "kernels_summary"]

#: the simulated chips the bridge serves, in the order ANYCHIP_PADDLE accepts them
SIMULATED = PADDLE_CHIPS
#: Paddle device type = PREFIX + the anychip backend name (no clash with Paddle's built-ins,
#: cpu / gpu / xpu / ipu, or the vendors' plugins, npu / mlu / gcu / sdaa / custom_cpu / ...)
PREFIX = "anychip_"
DIR_NAME = "paddle_custom_device"
_PACKAGE = Path(__file__).resolve().parent


def device_type(backend: str) -> str:
    """The Paddle device type anychip provides for ``backend`` (``ascend`` -> ``anychip_ascend``)."""
    return PREFIX + backend


def bridge_dir() -> Path:
    """Where this anychip's simulated-chip bridge lies: paddle_custom_device/ beside the package."""
    return _PACKAGE.parent / DIR_NAME


def simulator_bridge() -> Path | None:
    """The simulated chips' bridge library, or None when this anychip was built without it."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = bridge_dir() / f"libanychip_sim{suffix}"
    return path if path.exists() else None


def selected_simulator(environ: Any = None) -> str | None:
    """The simulated chip the bridge serves under ANYCHIP_PADDLE (None for none). Unset, the
    Ascend, unless a C plugin's bridge lies in Paddle's directory: that chip is then the one
    the user chose, and the simulated chips' bridge registers none (init.c, chosen_simulator),
    so that Paddle's launcher, which takes the first device type, cannot run on a simulator."""
    env = os.environ if environ is None else environ
    if env.get("ANYCHIP_PADDLE") is None and _plugin_bridges(paddle_dir(env)[0]):
        return None
    return paddle_chip(env.get("ANYCHIP_PADDLE"))


def paddle_dir(environ: Any = None) -> tuple[Path | None, str]:
    """(the directory Paddle loads CustomDevice libraries from, how it was found), without
    importing Paddle: CUSTOM_DEVICE_ROOT, else <the site directory holding paddle>/paddle_custom_device."""
    env = os.environ if environ is None else environ
    root = env.get("CUSTOM_DEVICE_ROOT")
    if root:
        return Path(root), "CUSTOM_DEVICE_ROOT"
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.origin:
        return None, "paddle is not installed"
    site_dir = Path(spec.origin).resolve().parent.parent
    return site_dir / DIR_NAME, f"the default of Paddle in {site_dir} (CUSTOM_DEVICE_ROOT unset)"


def _bridge_text(bridge: str | os.PathLike[str] | None, symbol: str) -> str | None:
    """The text a bridge's function ``symbol`` returns (None when it lacks it), read without Paddle."""
    import ctypes

    path = Path(bridge) if bridge is not None else simulator_bridge()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise AnychipError(f"cannot load the Paddle bridge {path}: {exc}") from None
    fn = getattr(lib, symbol, None)
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return (fn() or b"").decode()


def kernel_table(bridge: str | os.PathLike[str] | None = None) -> dict[str, list[str]]:
    """The phi kernels a bridge registers for its device type, {op: [dtype, ...]}, read from the
    library without Paddle (the simulated chips' bridge by default). It loads the bridge's plugin,
    whose kernel table (plugin.h minor 1) and its dtype masks decide: {} for a plugin without the
    table, or a bridge built without a C++ compiler -- every op takes Paddle's CPU fallback there
    (:func:`kernel_note` says why), but for the strided views' copies (:data:`HOST_VIEWS`), which
    every bridge registers regardless, copying through the host."""
    table: dict[str, list[str]] = {}
    for line in (_bridge_text(bridge, "anychip_paddle_kernel_table") or "").splitlines():
        name, _, dtypes = line.partition("\t")
        table[name] = dtypes.split(",")
    return table


def kernel_note(bridge: str | os.PathLike[str] | None = None) -> str:
    """Why a bridge registers no kernels ("" when it registers some)."""
    note = _bridge_text(bridge, "anychip_paddle_kernel_note")
    return "the bridge was built before its kernel layer existed; rebuild it" if note is None else note


#: what a bridge without a usable kernel table (or built without a C++ compiler) still registers: the strided
#: views' copies, which Paddle 3.x asks a custom device for with no CPU fallback
HOST_VIEWS = ", but for the strided views' copies (contiguous, strided_copy, fill), which copy through the host"


def _no_kernels(note: str) -> str:
    return f"none ({note}); every op takes Paddle's CPU fallback{HOST_VIEWS}"


def kernels_summary(bridge: str | os.PathLike[str]) -> str:
    """One line on a bridge's kernels, as ``anychip plugin paddle`` prints it after the build."""
    table = kernel_table(bridge)
    if not table:
        return f"kernels: {_no_kernels(kernel_note(bridge))}"
    dtypes = sorted({t for types in table.values() for t in types}, key=_DTYPE_ORDER.index)
    return (f"kernels: {len(table)} ops run on the device ({', '.join(dtypes)}, as the plugin's kernel table "
            "allows; `anychip info` lists them); every other op takes Paddle's CPU fallback")


_DTYPE_ORDER = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool", "uint8", "int8", "int16",
                "complex64", "complex128"]


def _plugin_bridges(where: Path | None) -> dict[str, str]:
    """{Paddle device type: library} of the C-plugin bridges (`anychip plugin paddle`) in `where`."""
    if where is None or not where.is_dir():
        return {}
    return {p.name[len("lib"):].split(".")[0]: str(p) for p in sorted(where.glob(f"lib{PREFIX}*.so"))
            if not p.name.startswith(f"lib{PREFIX}sim")}


def status(environ: Any = None, kernels: bool = True) -> dict[str, Any]:
    """What anychip provides to Paddle and whether Paddle finds it (for ``anychip info`` / ``devices``).
    With ``kernels``, also each device type's kernels, which loads every bridge in Paddle's
    directory and its plugin (``anychip devices`` leaves them out)."""
    try:
        version: str | None = importlib.metadata.version("paddlepaddle")
    except importlib.metadata.PackageNotFoundError:
        version = None
    bridge = simulator_bridge()
    where, how = paddle_dir(environ)
    chip = selected_simulator(environ)
    found = bool(bridge and where and (where / bridge.name).exists()
                 and (where / bridge.name).resolve() == bridge.resolve())
    if bridge is None:
        why = "this anychip was built without the Paddle bridge"
    elif version is None:
        why = "paddlepaddle is not installed (pip install 'anychip[paddle]')"
    elif found:
        why = f"Paddle loads {bridge.name} from {where} ({how})"
    else:
        why = (f"Paddle reads {where} ({how}), which does not hold this anychip's bridge; an editable install "
               f"keeps it in {bridge_dir()}: set CUSTOM_DEVICE_ROOT={bridge_dir()}")
    table = kernel_table(bridge) if bridge and kernels else {}
    plugins = _plugin_bridges(where)
    plugin_kernels = {t: kernel_table(lib) for t, lib in plugins.items()} if kernels else {}
    # the device type Paddle's launcher takes: the simulated chip's, else a C plugin's (when only one)
    launcher_type = device_type(chip) if chip else (next(iter(plugins)) if len(plugins) == 1 else None)
    return {"paddle": version, "bridge": str(bridge) if bridge else None, "paddle_dir": str(where) if where else None,
            "found": found and version is not None, "status": why,
            "device_type": launcher_type, "chip": chip,
            "device_types": {b: device_type(b) for b in SIMULATED},
            # per device type: the ops with a device kernel; every other op takes Paddle's CPU fallback
            "kernels": {**({device_type(b): table for b in SIMULATED} if kernels else {}),
                        **plugin_kernels},
            # per device type without kernels: why
            "kernel_notes": {**({device_type(b): kernel_note(bridge) for b in SIMULATED}
                                if bridge and kernels and not table else {}),
                             **{t: kernel_note(lib) for t, lib in plugins.items()
                                if kernels and not plugin_kernels[t]}}}


def _cxx_compiler(cxx: str | None) -> str | None:
    """The C++ compiler the kernel layer is built with: ``cxx``, else $CXX, else c++ / g++ / clang++ on PATH."""
    name = cxx or os.environ.get("CXX")
    if name:
        found = shutil.which(name)
        if found is None:
            raise AnychipError(f"the C++ compiler {name!r} ({'CXX' if not cxx else 'cxx'}) was not found")
        return found
    return next((p for p in (shutil.which(c) for c in ("c++", "g++", "clang++")) if p), None)


#: the reason a bridge built without a C++ compiler gives (`anychip info`, kernel_note)
NO_CXX = ("no C++ compiler was found when the bridge was built (set CXX and rerun `anychip plugin paddle`): "
          "its kernel layer raises C++ exceptions (paddle/kernels_throw.cc)")
#: what stands in for kernels_throw.cc where no C++ compiler is found: the kernel layer then
#: registers only the strided views' copies, through the host (kernels_c.c says how)
NO_CXX_UNITS: tuple[str, ...] = ("kernels.c", "profiler.c", "kernels_c.c")

#: the bridge's units (anychip's shipped sources, paddle/: see bridge.h there), each compiled on
#: its own with the bridge's configuration and linked; setup.py builds the simulated chips' bridge
#: from the same (PADDLE_BRIDGE, PADDLE_KERNELS) with provider_sim.c
BRIDGE_UNITS: tuple[str, ...] = ("init.c", "device.c", "streams.c", "memory.c", "xccl.c")
#: its kernel layer, built where a C++ compiler is found
KERNEL_UNITS: tuple[str, ...] = ("kernels.c", "profiler.c", "kernels_throw.cc")


def build_bridge(library: str, dest: str | os.PathLike[str] | None = None, cc: str | None = None,
                 cxx: str | None = None) -> Path:
    """Compile the bridge bound to the plugin.h library ``library`` into ``dest`` (default:
    the directory Paddle reads): ``libanychip_<backend>.so``. Returns its path.

    With a C++ compiler (``cxx``, $CXX, or c++ / g++ / clang++) the bridge carries its kernel
    layer (paddle/kernels.c, registered per the plugin's kernel table); without one it is
    built without kernels, and :func:`kernel_note` on it says so."""
    from .runtime import registry
    from .runtime.errors import PluginError

    lib = Path(library).resolve()
    if not lib.is_file():
        raise AnychipError(f"{library}: no such file; want the path of a C plugin library (anychip/plugin.h)")
    try:
        symbol, probe = registry._library_probe(str(lib))     # anychip's loader checks it as it would load it
        if symbol != "anychip_plugin_init":
            raise PluginError(f"exports {symbol}, not anychip_plugin_init: it is not an anychip/plugin.h library")
        name, _ = probe(str(lib))
    except PluginError as exc:
        raise AnychipError(f"{library} is not a usable anychip C plugin: {exc}") from None
    try:
        installed, how = registry.find_library(name)
    except PluginError:
        installed = None                  # not installed under its name: this file is the only copy
    if installed is not None and os.path.realpath(installed) != str(lib):
        raise AnychipError(f"{library} is a second copy of the plugin {name}: anychip and PyTorch load "
                           f"{installed} (from {how}); bind Paddle to that one, `anychip plugin paddle {name}`, "
                           "so that a reinstall is seen by all three")
    if dest is None:
        where, how = paddle_dir()
        if where is None:
            raise AnychipError(f"cannot tell where Paddle looks for plugins ({how}); pass --dest DIR")
        dest = where
    out_dir = Path(dest)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"lib{device_type(name)}.so"
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise AnychipError("no C compiler found (set CC); the bridge is compiled from anychip's paddle/*.c")
    engine = find_library("libanychip_ccl")
    if engine is None:
        raise AnychipError("anychip's collective engine (libanychip_ccl) was not built; reinstall anychip")
    src = sources_dir()                   # paddle/ (the bridge's units) and ccl/ccl.h
    flags = ["-O2", "-fPIC", "-Wall", "-Wextra", "-Werror"]
    config = [f"-I{get_include()}", f"-I{src}", f"-DANYCHIP_PADDLE_TARGET={_c_string(str(lib))}",
              f"-DANYCHIP_PADDLE_CCL={_c_string(engine)}"]
    libs = ["-ldl", "-lpthread", "-lm"]
    cxx_path = _cxx_compiler(cxx)
    if cxx_path is None:                  # the views' copies only, C throwing Paddle's exception, linked as C
        units, linker = BRIDGE_UNITS + NO_CXX_UNITS, compiler
        config += ["-fexceptions", "-DANYCHIP_PADDLE_KERNELS=1", f"-DANYCHIP_PADDLE_VIEWS_ONLY={_c_string(NO_CXX)}"]
    else:                                 # the kernel layer: C built to unwind, its C++ piece, linked as C++
        units, linker = BRIDGE_UNITS + KERNEL_UNITS, cxx_path
        config += ["-fexceptions", "-DANYCHIP_PADDLE_KERNELS=1"]
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    with tempfile.TemporaryDirectory(prefix="anychip-bridge-") as tmp:
        objects, compiles = [], []
        for unit in units:                # C++ (kernels_throw.cc) with the C++ compiler, the linker then
            objects.append(os.path.join(tmp, Path(unit).stem + ".o"))
            lang = [linker, "-std=c++11"] if unit.endswith(".cc") else [compiler, "-std=gnu11"]
            compiles.append([*lang, *flags, *config, "-c", str(src / "paddle" / unit), "-o", objects[-1]])
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:     # the units, in parallel
            for cmd, done in zip(compiles, pool.map(_run, compiles), strict=True):
                _built(cmd, done)
        cmd = [linker, "-shared", *objects, "-o", str(out), *libs]
        _built(cmd, _run(cmd))
    return out


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


def _built(cmd: list[str], done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise AnychipError(f"compiling the Paddle bridge failed ({' '.join(cmd)}):\n{done.stderr.strip()}")


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main_info(out: Any = sys.stdout) -> None:
    """The ``paddle:`` part of ``anychip info``."""
    st = status()
    print("\npaddle (anychip's chips as Paddle devices, docs/paddle.md):", file=out)
    print(f"  paddlepaddle  {st['paddle'] or '(not installed)'}", file=out)
    types = ", ".join(f"{t} ({b})" for b, t in st["device_types"].items())
    print(f"  device types  {types}; this process: {st['device_type'] or 'none'} (ANYCHIP_PADDLE)", file=out)
    print(f"  bridge        {st['bridge'] or '(not built)'}", file=out)
    print(f"  found         {'yes' if st['found'] else 'no'}: {st['status']}", file=out)
    by_table: dict[str, list[str]] = {}
    for t, table in st["kernels"].items():         # types with the same kernels (or the same reason for none)
        key = json.dumps([table, "" if table else st["kernel_notes"].get(t, "")], sort_keys=True)
        by_table.setdefault(key, []).append(t)
    for key, same in by_table.items():
        table, note = json.loads(key)
        print(f"  kernels       {', '.join(same)}: ", end="", file=out)
        if not table:
            print(_no_kernels(note), file=out)
            continue
        print(f"{len(table)} ops run on the device; every other op takes Paddle's CPU fallback", file=out)
        for name, dtypes in table.items():
            print(f"    {name:<16}{', '.join(dtypes)}", file=out)
