"""The vendor API headers shipped with anychip, and the cffi declarations read from them.

Each vendor API is declared once, in a C header under ``csrc/include`` (installed with the
package as ``anychip/_include``): the simulator's front ends and the adapters are compiled
against it, C programs include it, and anychip reads the part of it between the lines
``/* ANYCHIP-CDEF-BEGIN */`` and ``/* ANYCHIP-CDEF-END */``. That part holds only what
cffi's ``cdef`` accepts: typedefs, enums, structs, prototypes and ``#define NAME number``
(no ``#include``, ``#if`` or function-like macros, which stay outside the markers): the
vendors' status-code names (the backends' ``code_names`` and the adapters' generated error
strings) and the cffi declarations of the simulator's controls (anychip/sim.h).
"""
from __future__ import annotations

import functools
import os
import re

__all__ = ["include_dir", "cdef_of", "code_names", "Codes", "ADAPTER_CODES", "c_code_table"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: a source checkout's headers: the package is src/anychip
_CHECKOUT_INCLUDE = os.path.join(os.path.dirname(os.path.dirname(_PKG)), "csrc", "include")
_BEGIN = "/* ANYCHIP-CDEF-BEGIN */"
_END = "/* ANYCHIP-CDEF-END */"
_ALLOWED_DIRECTIVE = re.compile(r"#define\s+\w+\s+(0x[0-9A-Fa-f]+|\d+)\s*(/\*.*\*/)?\s*$")


def include_dir() -> str:
    """The directory holding the vendor headers (``acl/acl.h``, ``hip/hip_runtime_api.h`` ...):
    the installed copy, or ``csrc/include`` of a source checkout."""
    for path in (os.path.join(_PKG, "_include"), _CHECKOUT_INCLUDE):
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


def _section(rel: str) -> str:
    return "\n".join(re.findall(re.escape(_BEGIN) + r"(.*?)" + re.escape(_END),
                                 open(os.path.join(include_dir(), rel), encoding="utf-8").read(), re.S))


@functools.cache
def code_names(rel: str, name: str) -> dict[int, str]:
    """The status codes a vendor header declares, value -> name: the members of the enum
    typedef'd as ``name`` (``hipError_t``), or, for ``name`` ``"#define PATTERN"``, the
    ``#define``s whose names start with the regular expression PATTERN
    (``"#define ACL_(SUCCESS|ERROR_)"``: ``ACL_SUCCESS``, ``ACL_ERROR_*``). Where two names share a value the
    last one declared wins (``ACL_SUCCESS`` over ``ACL_ERROR_NONE``)."""
    text = re.sub(r"/\*.*?\*/", "", _section(rel), flags=re.S)
    names: dict[int, str] = {}
    if name.startswith("#define "):
        pattern = name[len("#define "):]
        for m in re.finditer(rf"^#define\s+(?P<name>{pattern}\w*)\s+(?P<value>0x[0-9A-Fa-f]+|\d+)\s*$", text, re.M):
            names[int(m.group("value"), 0)] = m.group("name")
        if not names:
            raise ValueError(f"{rel} has no {name}")
        return names
    enum = re.search(r"typedef\s+enum\s*\w*\s*\{([^}]*)\}\s*" + re.escape(name) + r"\s*;", text)
    if enum is None:
        raise ValueError(f"{rel} has no enum {name}")
    value = -1
    for item in enum.group(1).split(","):
        item = item.strip()
        if not item:
            continue
        key, _, given = item.partition("=")
        value = int(given.strip(), 0) if given.strip() else value + 1
        names[value] = key.strip()
    return names


#: the status codes of each adapter (csrc/adapters/*/plugin_*.c), as (header, enum typedef or #define
#: prefix[, offset]): the runtime's, then the collective library's. The Python backends name
#: codes from it, and setup.py writes it as the C table the adapters' error strings use
#: (anychip/adapter_codes_<api>.h).
ADAPTER_CODES: dict[str, tuple[tuple, ...]] = {
    "acl": (("acl/acl.h", "#define ACL_(SUCCESS|ERROR_)"), ("hccl/hccl_types.h", "HcclResult")),
    "xpu": (("xpu/runtime.h", "XPUError_t"), ("bkcl/bkcl.h", "BKCLResult_t")),
    "hip": (("hip/hip_runtime_api.h", "hipError_t"), ("rccl/rccl.h", "ncclResult_t", 10000)),   # RCCL_BASE
}


def c_code_table(api: str) -> str:
    """The C header of ``api``'s code names (ADAPTER_CODES): ``adapter_code_name(code)``."""
    names = sorted(Codes(*ADAPTER_CODES[api]).names().items())
    rows = "".join(f"    {{{code}, \"{name}\"}},\n" for code, name in names)
    headers = ", ".join(src[0] for src in ADAPTER_CODES[api])
    return (f"/* Generated by setup.py from {headers} (anychip/chips/_headers.py): */\n"
            "/* the vendors' names of their status codes, for the adapter's error strings. */\n"
            "#include <stddef.h>\n\n"
            "static const struct { int code; const char *name; } ADAPTER_CODE_NAMES[] = {\n" + rows + "};\n\n"
            "static inline const char *adapter_code_name(int code)\n{\n"
            "    for (size_t i = 0; i < sizeof ADAPTER_CODE_NAMES / sizeof *ADAPTER_CODE_NAMES; i++)\n"
            "        if (ADAPTER_CODE_NAMES[i].code == code)\n"
            "            return ADAPTER_CODE_NAMES[i].name;\n"
            "    return NULL;\n}\n")


class Codes:
    """A class attribute holding the status-code names of one or more vendor headers, read on
    first use: each source is (header, enum typedef or #define prefix[, offset added to the
    values]), as :func:`code_names` reads it; later sources do not override earlier ones."""

    def __init__(self, *sources: tuple) -> None:
        self.sources = sources
        self._names: dict[int, str] | None = None

    def names(self) -> dict[int, str]:
        if self._names is None:
            names: dict[int, str] = {}
            for rel, name, *offset in self.sources:
                for code, text in code_names(rel, name).items():
                    names.setdefault(code + (offset[0] if offset else 0), text)
            self._names = names
        return self._names

    def __get__(self, obj: object, owner: type | None = None) -> dict[int, str]:
        return self.names()


#: backend -> (module, plugin class, the headers a C program includes, the vendor's
#: runtime and collective libraries, as -l names)
_C_APIS = {
    "ascend": ("anychip.chips.ascend", "AscendPlugin", "acl/acl.h, hccl/hccl.h", ("ascendcl", "hccl")),
    "kunlun": ("anychip.chips.kunlun", "KunlunPlugin", "xpu/runtime.h, bkcl/bkcl.h", ("xpurt", "bkcl")),
    "hygon": ("anychip.chips.hygon", "HygonPlugin", "hip/hip_runtime_api.h, rccl/rccl.h", ("amdhip64", "rccl")),
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
    ccl = plugin.ccl_path if plugin.ccl_path != plugin.library_path else None
    if ccl is not None and os.path.dirname(ccl) not in dirs:
        dirs.append(os.path.dirname(ccl))
    links = " ".join(f"-L{d}" for d in dirs)
    rpaths = " ".join(f"-Wl,-rpath,{d}" for d in dirs)
    # the vendor's collective library is a separate file (libhccl.so beside libascendcl.so)
    libs = f"-l:{os.path.basename(plugin.library_path)}" + (f" -l:{os.path.basename(ccl)}" if ccl else "")
    return f"-I{include_dir()} {links} {libs} {rpaths} -lpthread"

