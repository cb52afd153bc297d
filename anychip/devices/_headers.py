"""The vendor API headers shipped with anychip, and the cffi declarations read from them.

Each vendor API is declared once, in a C header under ``csrc/include`` (installed with the
package as ``anychip/_include``): the simulator's front ends are compiled against it, C
programs include it, and the Python backends give cffi the part of it between the lines
``/* ANYCHIP-CDEF-BEGIN */`` and ``/* ANYCHIP-CDEF-END */``. That part holds only what
cffi's ``cdef`` accepts: typedefs, enums, structs, prototypes and ``#define NAME number``
(no ``#include``, ``#if`` or function-like macros, which stay outside the markers).
"""
from __future__ import annotations

import functools
import os
import re

__all__ = ["include_dir", "cdef_of", "Declarations"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BEGIN = "/* ANYCHIP-CDEF-BEGIN */"
_END = "/* ANYCHIP-CDEF-END */"
_ALLOWED_DIRECTIVE = re.compile(r"#define\s+\w+\s+(0x[0-9A-Fa-f]+|\d+)\s*(/\*.*\*/)?\s*$")


def include_dir() -> str:
    """The directory holding the vendor headers (``acl/acl.h``, ``hip/hip_runtime_api.h`` ...):
    the installed copy, or ``csrc/include`` of a source checkout."""
    for path in (os.path.join(_PKG, "_include"), os.path.join(os.path.dirname(_PKG), "csrc", "include")):
        if os.path.isfile(os.path.join(path, "acl", "acl.h")):
            return path
    raise FileNotFoundError(f"the vendor headers are neither in {_PKG}/_include nor in a source checkout "
                            "(reinstall anychip)")


@functools.cache
def cdef_of(*headers: str) -> str:
    """The cffi declarations of ``headers`` (paths under :func:`include_dir`), in order."""
    parts = []
    for rel in headers:
        path = os.path.join(include_dir(), rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        sections = re.findall(re.escape(_BEGIN) + r"(.*?)" + re.escape(_END), text, re.S)
        if not sections:
            raise ValueError(f"{path} has no {_BEGIN} ... {_END} section")
        for section in sections:
            for line in section.splitlines():
                if line.lstrip().startswith("#") and not _ALLOWED_DIRECTIVE.match(line.strip()):
                    raise ValueError(f"{path}: {line.strip()!r} cannot be given to cffi (only "
                                     "'#define NAME number' lines may stand between the markers)")
            parts.append(section)
    return "\n".join(parts)


class Declarations:
    """A class attribute holding the cffi declarations of ``headers``, read on first use
    (so importing a backend never depends on finding the headers)."""

    def __init__(self, *headers: str) -> None:
        self.headers = headers

    def __get__(self, obj: object, owner: type | None = None) -> str:
        return cdef_of(*self.headers)


#: backend -> (module, plugin class, the headers a C program includes, the vendor's
#: runtime and collective libraries, as -l names)
_C_APIS = {
    "ascend": ("anychip.devices.ascend", "AscendPlugin", "acl/acl.h, hccl/hccl.h", ("ascendcl", "hccl")),
    "kunlun": ("anychip.devices.kunlun", "KunlunPlugin", "xpu/runtime.h, bkcl/bkcl.h", ("xpurt", "bkcl")),
    "hygon": ("anychip.devices.hygon", "HygonPlugin", "hip/hip_runtime_api.h, rccl/rccl.h", ("amdhip64", "rccl")),
}


def cflags(backend: str) -> str:
    """Compiler and linker flags that build a C program written for ``backend``'s vendor
    API (ACL + HCCL, XPU + BKCL, HIP + RCCL) against the library the backend uses: the
    simulator, or the vendor's own library when it is installed."""
    import importlib

    from ..runtime.errors import InvalidArgumentError, UnsupportedError

    if backend not in _C_APIS:
        raise InvalidArgumentError(f"--cflags: no C API for backend {backend!r}; want one of {', '.join(_C_APIS)}")
    module, cls, _, (runtime, collectives) = _C_APIS[backend]
    plugin = getattr(importlib.import_module(module), cls)()
    ok, reason = plugin.available()
    if not ok or not plugin.library_path:
        raise UnsupportedError(f"--cflags {backend}: the backend is unavailable: {reason}")
    libdir = os.path.dirname(plugin.library_path)
    if plugin.simulated:
        # the vendor's link line: -l<runtime> -l<collectives> name linker scripts in _lib/link
        # that stand for the one simulator library (setup.py, write_link_scripts)
        return (f"-I{include_dir()} -L{os.path.join(libdir, 'link')} -L{libdir} -l{runtime} -l{collectives} "
                f"-Wl,-rpath,{libdir} -lpthread")
    dirs = [libdir]
    ccl = plugin.native_ccl()
    if ccl is not None and os.path.dirname(ccl.path) not in dirs:
        dirs.append(os.path.dirname(ccl.path))
    links = " ".join(f"-L{d}" for d in dirs)
    rpaths = " ".join(f"-Wl,-rpath,{d}" for d in dirs)
    # the vendor's collective library is a separate file (libhccl.so beside libascendcl.so)
    libs = f"-l:{os.path.basename(plugin.library_path)}" + (f" -l:{os.path.basename(ccl.path)}" if ccl else "")
    return f"-I{include_dir()} {links} {libs} {rpaths} -lpthread"

