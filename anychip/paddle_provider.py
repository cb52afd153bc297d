"""anychip's chips as PaddlePaddle devices (see docs/paddle.md, "Paddle on anychip").

The bridge (``anychip/paddle/bridge.c``, in the headers anychip ships) implements Paddle's
CustomDevice ``InitPlugin`` over one ``anychip/plugin.h`` library. Paddle gives each library
it loads one device type, named ``anychip_<backend>``:

* the simulated chips: ``paddle_custom_device/libanychip_sim`` beside the anychip package
  (installed there by ``pip install anychip``) serves the chip ``ANYCHIP_PADDLE`` names
  (ascend, kunlun or hygon; the Ascend when unset), through each simulator's plugin.h face
  (csrc/sim/plugin_acl.c, plugin_xpu.c, plugin_hip.c);
* a vendor's C plugin: :func:`build_bridge` (``anychip plugin paddle LIBRARY``) compiles a
  copy of the bridge bound to that library.

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

from ._data import get_include
from .runtime._libs import find_library
from .runtime.env import PADDLE_CHIPS, paddle_chip
from .runtime.errors import AnychipError

__all__ = ["SIMULATED", "PREFIX", "device_type", "bridge_dir", "simulator_bridge", "paddle_dir", "status",
           "build_bridge", "kernel_table"]

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
    """The simulated chip the bridge serves under ANYCHIP_PADDLE (None for none)."""
    env = os.environ if environ is None else environ
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


def kernel_table(bridge: str | os.PathLike[str] | None = None) -> dict[str, list[str]]:
    """The phi kernels a bridge registers for its device type, {op: [dtype, ...]}, read from the
    library without Paddle (the simulated chips' bridge by default). A bridge over a vendor's C
    plugin registers none (plugin.h has no kernel interface): {} -- every op takes Paddle's CPU
    fallback there."""
    import ctypes

    path = Path(bridge) if bridge is not None else simulator_bridge()
    if path is None:
        return {}
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise AnychipError(f"cannot load the Paddle bridge {path}: {exc}") from None
    fn = getattr(lib, "anychip_paddle_kernel_table", None)
    if fn is None:
        return {}
    fn.restype = ctypes.c_char_p
    table: dict[str, list[str]] = {}
    for line in (fn() or b"").decode().splitlines():
        name, _, dtypes = line.partition("\t")
        table[name] = dtypes.split(",")
    return table


def _plugin_bridges(where: Path | None) -> dict[str, str]:
    """{Paddle device type: library} of the C-plugin bridges (`anychip plugin paddle`) in `where`."""
    if where is None or not where.is_dir():
        return {}
    return {p.name[len("lib"):].split(".")[0]: str(p) for p in sorted(where.glob(f"lib{PREFIX}*.so"))
            if not p.name.startswith(f"lib{PREFIX}sim")}


def status(environ: Any = None) -> dict[str, Any]:
    """What anychip provides to Paddle and whether Paddle finds it (for ``anychip info`` / ``devices``)."""
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
    kernels = kernel_table(bridge) if bridge else {}
    return {"paddle": version, "bridge": str(bridge) if bridge else None, "paddle_dir": str(where) if where else None,
            "found": found and version is not None, "status": why,
            "device_type": device_type(chip) if chip else None, "chip": chip,
            "device_types": {b: device_type(b) for b in SIMULATED},
            # per device type: the ops with a device kernel; every other op takes Paddle's CPU fallback
            "kernels": {**{device_type(b): kernels for b in SIMULATED},
                        **{t: {} for t in _plugin_bridges(where)}}}


def build_bridge(library: str, dest: str | os.PathLike[str] | None = None, cc: str | None = None) -> Path:
    """Compile the bridge bound to the plugin.h library ``library`` into ``dest`` (default:
    the directory Paddle reads): ``libanychip_<backend>.so``. Returns its path."""
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
        raise AnychipError("no C compiler found (set CC); the bridge is compiled from anychip/paddle/bridge.c")
    inc = get_include()
    engine = find_library("libanychip_ccl")
    if engine is None:
        raise AnychipError("anychip's collective engine (libanychip_ccl) was not built; reinstall anychip")
    # ccl/ccl.h: csrc/ccl beside csrc/include in a source tree, _include/ccl in a wheel
    ccl_inc = next((d for d in (inc, str(Path(inc).parent)) if (Path(d) / "ccl" / "ccl.h").exists()), None)
    if ccl_inc is None:
        raise AnychipError(f"anychip's ccl/ccl.h is missing beside {inc}; reinstall anychip")
    cmd = [compiler, "-O2", "-std=gnu11", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", f"-I{inc}",
           f"-I{ccl_inc}", f"-DANYCHIP_PADDLE_TARGET={_c_string(str(lib))}",
           f"-DANYCHIP_PADDLE_CCL={_c_string(engine)}", os.path.join(inc, "anychip", "paddle", "bridge.c"),
           "-o", str(out), "-ldl", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AnychipError(f"compiling the Paddle bridge failed ({' '.join(cmd)}):\n{done.stderr.strip()}")
    return out


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
    for t, table in st["kernels"].items():
        key = json.dumps(table, sort_keys=True)
        by_table.setdefault(key, []).append(t)
    for key, same in by_table.items():
        table = json.loads(key)
        print(f"  kernels       {', '.join(same)}: ", end="", file=out)
        if not table:
            print("none (a C plugin: plugin.h has no kernel interface); every op takes Paddle's CPU fallback",
                  file=out)
            continue
        print(f"{len(table)} ops run on the device; every other op takes Paddle's CPU fallback", file=out)
        for name, dtypes in table.items():
            print(f"    {name:<16}{', '.join(dtypes)}", file=out)
