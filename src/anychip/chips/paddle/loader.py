"""Finding and initializing Paddle CustomDevice libraries: Paddle's ABI (its header, the
required entries, the runtime version, C_Status), ``InitPlugin`` and the checks of what it filled."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ...runtime._libs import dlopen, new_ffi
from ...runtime.errors import PluginError
from .._headers import cdef_of

__all__ = ["HEADER", "REQUIRED", "RUNTIME_VERSION", "ffi", "root_libraries", "status_text"]

log = logging.getLogger("anychip")

ROOT_ENV = "CUSTOM_DEVICE_ROOT"
PATH_ENV = "ANYCHIP_PLUGIN_PATH"

#: the runtime version Paddle 3.x's header declares (PADDLE_CUSTOM_RUNTIME_*_VERSION)
RUNTIME_VERSION = (0, 1, 1)
#: sizes of Paddle 2.6's structs (LP64), named in the refusal of a plugin built against them
PADDLE26_SIZES = (88, 912)

#: the header declaring Paddle's CustomDevice ABI (under anychip/_include), whose
#: cffi section the host loader reads
HEADER = "anychip/paddle/device_ext.h"

#: entries Paddle requires (ValidCustomCustomRuntimeParams); anychip requires the same
REQUIRED: tuple[str, ...] = (
    "set_device", "get_device", "create_stream", "destroy_stream", "create_event", "record_event",
    "destroy_event", "synchronize_stream", "synchronize_event", "stream_wait_event",
    "device_memory_allocate", "device_memory_deallocate", "memory_copy_h2d", "memory_copy_d2h",
    "memory_copy_d2d", "get_device_count", "get_device_list", "device_memory_stats", "device_min_chunk_size",
)
RESERVED = ("reserved_dev_api", "reserved_mem_api", "reserved_info_api", "reserved_ccl_api",
            "reserved_profiler_api", "reserved_other_api")
#: what each C_Status means (device_ext.h's comments)
STATUS = {0: ("C_SUCCESS", "success"),
          1: ("C_WARNING", "results may not meet expectation"),
          2: ("C_FAILED", "resource exhausted or query failed"),
          3: ("C_ERROR", "invalid argument, wrong usage or uninitialized"),
          4: ("C_INTERNAL_ERROR", "plugin error")}

#: anychip's optional extension a plugin may export (device_ext.h has no error strings): the
#: message of the first failed op of a communicator, "" when none (see docs/paddle.md)
EXTENSION_CDEF = "const char *anychip_paddle_comm_error(C_CCLComm comm);"

_ffi_lock = threading.Lock()
_ffi_obj: Any = None


def ffi() -> Any:
    """The one cffi FFI holding the mirror (shared by every plugin and its xccl library)."""
    global _ffi_obj
    with _ffi_lock:
        if _ffi_obj is None:
            f = new_ffi()
            f.cdef(cdef_of(HEADER) + "void InitPlugin(struct CustomRuntimeParams *params);\n" + EXTENSION_CDEF)
            _ffi_obj = f
        return _ffi_obj


def status_text(code: int) -> tuple[str, str]:
    return STATUS.get(code, (f"status {code}", "unknown status"))


def _returned(code: int) -> str:
    name, meaning = status_text(code)
    return f"returned {name} ({meaning})"


def root_libraries() -> list[str]:
    """The libraries of ``CUSTOM_DEVICE_ROOT`` (Paddle's plugin directory), in name order."""
    root = os.path.expanduser(os.environ.get(ROOT_ENV, "").strip())
    if not root or not os.path.isdir(root):
        return []
    return [os.path.abspath(os.path.join(root, n)) for n in sorted(os.listdir(root))
            if (n.endswith(".so") or ".so." in n) and os.path.isfile(os.path.join(root, n))]


#: realpath -> what InitPlugin filled: a library is initialized once per process, as in Paddle
#: (rediscovery after registry.reset() finds the same backend)
_params_cache: dict[str, _Params] = {}


class _Params:
    """What InitPlugin filled, kept alive with the library."""

    def __init__(self, path: str, lib: Any, params: Any, iface: Any) -> None:
        f = ffi()
        self.path, self.lib, self.params, self.iface = path, lib, params, iface
        self.device_type = f.string(params.device_type).decode("utf-8", "replace")
        sub = params.sub_device_type
        self.sub_device_type = f.string(sub).decode("utf-8", "replace") if sub != f.NULL else ""
        v = params.version
        self.version = (int(v.major), int(v.minor), int(v.patch))


def _init_plugin(path: str) -> _Params:
    f = ffi()
    try:
        lib = dlopen(f, path)
    except OSError as exc:
        raise PluginError(f"cannot be loaded: {exc}") from None
    try:
        init = lib.InitPlugin
    except AttributeError:
        raise PluginError("exports no InitPlugin (the entry point of a Paddle CustomDevice plugin)") from None
    params = f.new("struct CustomRuntimeParams *")
    iface = f.new("struct C_DeviceInterface *")
    params.size = f.sizeof("struct CustomRuntimeParams")
    params.interface = iface
    iface.size = f.sizeof("struct C_DeviceInterface")
    init(params)
    problem = _params_problem(f, params, iface)
    if problem:
        raise PluginError(problem)
    return _Params(path, lib, params, iface)


def _params_problem(f: Any, params: Any, iface: Any) -> str | None:
    v = (int(params.version.major), int(params.version.minor), int(params.version.patch))
    if params.device_type == f.NULL:
        psize, isize = f.sizeof("struct CustomRuntimeParams"), f.sizeof("struct C_DeviceInterface")
        if v == (0, 0, 0):
            return (f"InitPlugin returned without filling the parameters (device_type NULL, no version): the "
                    f"plugin's size check refused anychip's CustomRuntimeParams ({psize} bytes) and "
                    f"C_DeviceInterface ({isize} bytes) of Paddle 3.x's device_ext.h, so it was built against "
                    f"another header (Paddle 2.6's are {PADDLE26_SIZES[0]} and {PADDLE26_SIZES[1]} bytes); "
                    f"rebuild it against Paddle 3.x")
        return "InitPlugin set no device_type (a sign of a header-version mismatch); the plugin must name its type"
    want = RUNTIME_VERSION
    if v[0] != want[0] or v < want:
        return (f"reports custom runtime version {v[0]}.{v[1]}.{v[2]}; anychip loads plugins of version "
                f"{want[0]}.{want[1]}.{want[2]} or a later {want[0]}.x")
    for group in RESERVED:
        slots = getattr(iface, group)
        if any(slots[i] != f.NULL for i in range(len(slots))):
            return (f"the plugin wrote into {group}, a reserved slot of Paddle 3.x's C_DeviceInterface: it was "
                    f"built against another member order (an older device_ext.h?); rebuild it against Paddle 3.x")
    missing = [e for e in REQUIRED if getattr(iface, e) == f.NULL]
    if missing:
        return f"leaves the required entr{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)} NULL"
    return None

