"""Existing PaddlePaddle CustomDevice plugins as anychip backends (see docs/paddle.md).

A CustomDevice plugin is a shared library exporting ``void InitPlugin(CustomRuntimeParams *)``
that fills a ``C_DeviceInterface`` of function pointers (Paddle's
``paddle/phi/backends/device_ext.h``). anychip loads it unchanged, as Paddle does:

* libraries: every ``*.so`` in the directory ``CUSTOM_DEVICE_ROOT``, and every library in
  the directories of ``ANYCHIP_PLUGIN_PATH`` that exports ``InitPlugin``;
* the core zeroes both structs, writes their sizes, calls ``InitPlugin`` and then checks
  what the plugin wrote: a ``device_type`` (NULL means the plugin's size check refused
  anychip's structs: it was built against another header), a runtime version of at least
  0.1.1 with major 0, NULL reserved slots (a plugin that writes there was built against
  another member order), and every entry Paddle requires;
* one backend per plugin, named by its ``device_type``; ``initialize`` and ``init_device``
  run when the backend is first used, and a failure there refuses it with the reason.

The mirror below is written from Paddle 3.x's header (C_DeviceInterface 1128 bytes,
CustomRuntimeParams 96 on LP64); Paddle 2.6's (912 / 88) is refused by its size check.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

import numpy as np

from ..runtime._libs import copy_pointers, dlopen
from ..runtime.errors import DeviceError, InvalidArgumentError, PluginError, UnsupportedError
from ..runtime.native_ccl import NativeLibrary
from ..runtime.plugin import DevicePlugin
from ..runtime.status import StatusCodes
from ._headers import cdef_of

__all__ = ["HEADER", "PaddlePlugin", "PaddleXccl", "probe", "root_libraries", "REQUIRED", "RUNTIME_VERSION"]

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
            import cffi  # type: ignore[import-untyped]
            f = cffi.FFI()
            f.cdef(cdef_of(HEADER) + "void InitPlugin(struct CustomRuntimeParams *params);\n" + EXTENSION_CDEF)
            _ffi_obj = f
        return _ffi_obj


def status_text(code: int) -> tuple[str, str]:
    return STATUS.get(code, (f"status {code}", "unknown status"))


def _returned(code: int) -> str:
    name, meaning = status_text(code)
    return f"returned {name} ({meaning})"


# ---------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------

def root_libraries() -> list[str]:
    """The libraries of ``CUSTOM_DEVICE_ROOT`` (Paddle's plugin directory), in name order."""
    root = os.path.expanduser(os.environ.get(ROOT_ENV, "").strip())
    if not root or not os.path.isdir(root):
        return []
    return [os.path.abspath(os.path.join(root, n)) for n in sorted(os.listdir(root))
            if (n.endswith(".so") or ".so." in n) and os.path.isfile(os.path.join(root, n))]


#: realpath -> what InitPlugin filled, and the plugin made from it: a library is initialized
#: once per process, as in Paddle (rediscovery after registry.reset() finds the same backend)
_params_cache: dict[str, _Params] = {}
_instances: dict[str, Any] = {}
_classes: dict[str, type] = {}
_instances_lock = threading.Lock()


def probe(path: str) -> tuple[str, Any]:
    """Open the Paddle plugin at ``path`` (the registry's probe for libraries exporting
    ``InitPlugin``): (backend name, loader). Raises PluginError with the reason to refuse it."""
    key = os.path.realpath(path)
    with _instances_lock:
        params = _params_cache.get(key)
        if params is None:
            params = _params_cache[key] = _init_plugin(path)
        name = params.device_type
        cls = _classes.get(name)
        if cls is None:
            cls = _classes[name] = type(f"PaddlePlugin_{name}", (PaddlePlugin,), {"name": name,
                                                                                "__module__": __name__})
    return name, _Loader(cls, params)


class _Loader:
    def __init__(self, cls: type, params: _Params) -> None:
        self.cls, self.params = cls, params

    def __call__(self) -> PaddlePlugin:
        key = os.path.realpath(self.params.path)
        with _instances_lock:
            plugin = _instances.get(key)
            if plugin is None or plugin._pid != os.getpid():
                plugin = _instances[key] = self.cls(self.params)
            return plugin


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


# ---------------------------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------------------------

class _Stream:
    __slots__ = ("raw", "index", "__weakref__")

    def __init__(self, raw: Any, index: int) -> None:
        self.raw, self.index = raw, index


class _Mark:
    __slots__ = ("ns", "handle")

    def __init__(self) -> None:
        self.ns: int | None = None
        self.handle: Any = None


class _Event:
    __slots__ = ("raw", "timed", "mark")

    def __init__(self, raw: Any, timed: bool) -> None:
        self.raw, self.timed = raw, timed
        self.mark: _Mark | None = None


_callback: Any = None


def _timing_callback() -> Any:
    """The C_Callback that stamps a timed event's mark (run on the plugin's stream)."""
    global _callback
    if _callback is None:
        f = ffi()

        @f.callback("void(C_Device, C_Stream, void *, C_Status *)")
        def stamp(device: Any, stream: Any, user_data: Any, status: Any) -> None:
            f.from_handle(user_data).ns = time.perf_counter_ns()
            if status != f.NULL:
                status[0] = 0
        _callback = stamp
    return _callback


class PaddlePlugin(DevicePlugin):
    """One Paddle CustomDevice plugin (a subclass per ``device_type`` is made by :func:`discover`)."""

    api_version = (1, 0)
    priority = -10

    def __init__(self, params: _Params) -> None:
        self.p = params
        self.ffi = ffi()
        self.iface = params.iface
        self.library_path = params.path
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._defaults: dict[int, _Stream] = {}
        self._streams: dict[int, set[_Stream]] = {}
        self._xccl: PaddleXccl | None = None
        self._pid = os.getpid()
        #: Paddle's C_Status codes (C_WARNING is done, perhaps not as asked): every call's status goes through it
        self.status = StatusCodes(self.name, name=lambda rc: status_text(rc)[0], text=_returned, success=(0, 1),
                                  oom_unnamed=True)
        self._ids = self._open()

    # -- loading ----------------------------------------------------------------------------
    def _has(self, entry: str) -> bool:
        return bool(getattr(self.iface, entry) != self.ffi.NULL)

    def _open(self) -> list[int]:
        f, iface = self.ffi, self.iface
        if self._has("initialize"):
            self.status.check(iface.initialize(), "initialize", failure=PluginError)
        count = f.new("size_t *")
        self.status.check(iface.get_device_count(count), "get_device_count", failure=PluginError)
        ids = f.new("size_t[]", max(int(count[0]), 1))
        self.status.check(iface.get_device_list(ids), "get_device_list", failure=PluginError)
        phys = [int(ids[i]) for i in range(int(count[0]))]
        if self._has("init_device"):
            for p in phys:
                self.status.check(iface.init_device(f.new("struct C_Device_st *", {"id": p})), f"init_device({p})",
                                  failure=PluginError)
        atexit.register(self._close)
        return phys

    def _close(self) -> None:
        if os.getpid() != self._pid:
            return
        f, iface = self.ffi, self.iface
        try:
            for i in range(len(self._ids)):
                self._synchronize(i)
            if self._has("deinit_device"):
                for p in self._ids:
                    iface.deinit_device(f.new("struct C_Device_st *", {"id": p}))
            if self._has("finalize"):
                iface.finalize()
        except Exception as exc:  # noqa: BLE001 - at exit: report, never raise
            log.warning("anychip: %s: shutting the plugin down failed: %s", self.name, exc)

    # -- identity ---------------------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        if os.getpid() != self._pid:
            return False, (f"Paddle CustomDevice plugin {self.p.path} was initialized in the parent process and "
                           "cannot be used after fork() (its runtime threads did not survive); start processes "
                           "with spawn or `anychip launch`")
        v = self.p.version
        return True, (f"Paddle CustomDevice plugin {self.p.path} (device_type {self.p.device_type}, runtime "
                      f"{v[0]}.{v[1]}.{v[2]}); {len(self._ids)} device(s)")

    def device_count(self) -> int:
        return len(self._ids)

    def _dev(self, index: int) -> Any:
        return self.ffi.new("struct C_Device_st *", {"id": self._ids[index]})

    def _size_query(self, entry: str, index: int) -> int | None:
        if not self._has(entry):
            return None
        out = self.ffi.new("size_t *")
        self._call(entry, self._dev(index), out)
        return int(out[0])

    def properties(self, index: int) -> dict:
        free, total = self._mem_info(index)
        props: dict[str, Any] = {
            "name": f"{self.p.device_type}" + (f" ({self.p.sub_device_type})" if self.p.sub_device_type else ""),
            "total_memory": total, "physical_id": self._ids[index], "library": self.p.path,
            "runtime_version": ".".join(map(str, self.p.version)), "api": "Paddle CustomDevice",
            "host_memory": self._has("host_memory_allocate"), "unified_memory": self._has("unified_memory_allocate"),
            "collectives": "xccl" if self.native_ccl() is not None else "host transport",
        }
        for key, entry in (("min_chunk_size", "device_min_chunk_size"), ("max_chunk_size", "device_max_chunk_size"),
                           ("max_alloc_size", "device_max_alloc_size"),
                           ("compute_capability", "get_compute_capability"),
                           ("driver_version", "get_driver_version"), ("plugin_runtime_version", "get_runtime_version")):
            value = self._size_query(entry, index)
            if value is not None:
                props[key] = value
        return props

    # -- calling the plugin -------------------------------------------------------------------
    def _call(self, entry: str, *args: Any) -> None:
        rc = getattr(self.iface, entry)(*args)
        if rc and rc != 1:                      # C_WARNING: done, perhaps not as asked (e.g. synchronously)
            raise self.status.error(rc, entry)

    def _use(self, index: int) -> None:
        if getattr(self._tls, "dev", -1) != index:
            self._call("set_device", self._dev(index))
            self._tls.dev = index

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._tls = threading.local()

    # -- memory -----------------------------------------------------------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        self._use(index)
        out = self.ffi.new("void **")
        n = max(nbytes, 1)
        rc = self.iface.device_memory_allocate(self._dev(index), out, n)
        if rc and rc != 1 or out[0] == self.ffi.NULL:
            what = "device_memory_allocate" if rc else "device_memory_allocate gave NULL"
            raise self.status.oom_error(rc, what, nbytes, f"{self.name}:{index}", lambda: self._mem_info(index))
        ptr = int(self.ffi.cast("uintptr_t", out[0]))
        with self._lock:
            self._sizes[ptr] = n
        return ptr

    def _free(self, index: int, handle: Any) -> None:
        self._use(index)
        with self._lock:
            size = self._sizes.pop(handle, 0)
        self._call("device_memory_deallocate", self._dev(index), self.ffi.cast("void *", handle), size)

    def _mem_info(self, index: int) -> tuple[int, int]:
        total, free = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        self._call("device_memory_stats", self._dev(index), total, free)
        return int(free[0]), int(total[0])

    def _pointer(self, handle: Any, offset: int) -> int:
        return int(handle) + offset

    def _host_alloc(self, entry: str, free_entry: str, nbytes: int, index: int) -> np.ndarray:
        if not self._has(entry):
            raise UnsupportedError(f"{self.name}: the plugin has no {entry} entry")
        self._use(index)
        out = self.ffi.new("void **")
        self._call(entry, self._dev(index), out, max(nbytes, 1))
        raw = self.ffi.gc(out[0], lambda p: getattr(self.iface, free_entry)(self._dev(index), p, max(nbytes, 1)))
        arr = np.frombuffer(self.ffi.buffer(raw, nbytes), dtype=np.uint8)
        return _Owned(arr, raw)

    def pinned_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """Host memory from the plugin's ``host_memory_allocate`` (freed with the array)."""
        return self._host_alloc("host_memory_allocate", "host_memory_deallocate", nbytes, index)

    def unified_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """Unified memory from the plugin's ``unified_memory_allocate`` (freed with the array)."""
        return self._host_alloc("unified_memory_allocate", "unified_memory_deallocate", nbytes, index)

    # -- copies -----------------------------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        if nbytes == 0:
            return
        self._use(index)
        f = self.ffi
        ptrs = copy_pointers(f, kind, dst, dst_off, src, src_off)
        if ptrs is None:
            raise InvalidArgumentError(f"unknown copy kind {kind!r}")
        d, s = ptrs
        dev = self._dev(index)
        async_entry = f"async_memory_copy_{kind}"
        if self._has(async_entry):
            self._call(async_entry, dev, stream.raw, d, s, nbytes)
        else:                                   # the synchronous form, after the stream's earlier work
            self._call("synchronize_stream", dev, stream.raw)
            self._call(f"memory_copy_{kind}", dev, d, s, nbytes)

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        f = self.ffi
        d, s = f.cast("void *", dst + dst_off), f.cast("void *", src + src_off)
        ddev, sdev = self._dev(dst_index), self._dev(src_index)
        self._use(src_index)
        if self._has("async_memory_copy_p2p"):
            self._call("async_memory_copy_p2p", ddev, sdev, stream.raw, d, s, nbytes)
        elif self._has("memory_copy_p2p"):
            self._call("synchronize_stream", sdev, stream.raw)
            self._call("memory_copy_p2p", ddev, sdev, d, s, nbytes)
        else:
            raise UnsupportedError(f"{self.name}: the plugin has no memory_copy_p2p entry")

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        self._use(index)
        dev = self._dev(index)
        self._call("synchronize_stream", dev, stream.raw)     # device_memory_set is synchronous
        ptr = self.ffi.cast("void *", dst + dst_off)
        if self._has("device_memory_set"):
            self._call("device_memory_set", dev, ptr, value, nbytes)
        else:                                   # fallback: a host buffer of the value, copied synchronously
            host = np.full(nbytes, value, dtype=np.uint8)
            self._call("memory_copy_h2d", dev, ptr, self.ffi.from_buffer(host), nbytes)

    # -- streams ----------------------------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        s = self._defaults.get(index)
        if s is None:
            s = self._defaults[index] = self._stream_create(index)
        return s

    def _stream_create(self, index: int) -> Any:
        self._use(index)
        out = self.ffi.new("C_Stream *")
        self._call("create_stream", self._dev(index), out)
        s = _Stream(out[0], index)
        with self._lock:
            self._streams.setdefault(index, set()).add(s)
        return s

    def _stream_destroy(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call("destroy_stream", self._dev(index), stream.raw)
        with self._lock:
            self._streams.get(index, set()).discard(stream)

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call("synchronize_stream", self._dev(index), stream.raw)

    def _stream_query(self, index: int, stream: Any) -> bool:
        self._use(index)
        if not self._has("query_stream"):       # Paddle's fallback: synchronize, then done
            self._stream_synchronize(index, stream)
            return True
        return bool(self.iface.query_stream(self._dev(index), stream.raw) == 0)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        self._call("stream_wait_event", self._dev(index), stream.raw, event.raw)

    # -- events -----------------------------------------------------------------------------
    def _new_event(self, index: int, timed: bool) -> _Event:
        self._use(index)
        out = self.ffi.new("C_Event *")
        self._call("create_event", self._dev(index), out)
        return _Event(out[0], timed)

    def _event_create(self, index: int) -> Any:
        return self._new_event(index, True)

    def _event_create_untimed(self, index: int) -> Any:
        return self._new_event(index, False)

    def _event_destroy(self, index: int, event: Any) -> None:
        self._use(index)
        self._call("destroy_event", self._dev(index), event.raw)

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._use(index)
        dev = self._dev(index)
        if event.timed:
            mark = _Mark()
            if self._has("stream_add_callback"):
                # the stamp runs on the stream just before the event's point: when the event
                # has completed, the stamp has been taken
                mark.handle = self.ffi.new_handle(mark)
                self._call("stream_add_callback", dev, stream.raw, _timing_callback(), mark.handle)
            else:
                # fallback: drain the stream, then stamp (the time of the work before the point)
                self._call("synchronize_stream", dev, stream.raw)
                mark.ns = time.perf_counter_ns()
            event.mark = mark
        self._call("record_event", dev, stream.raw, event.raw)

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._use(index)
        self._call("synchronize_event", self._dev(index), event.raw)

    def _event_query(self, index: int, event: Any) -> bool:
        self._use(index)
        if not self._has("query_event"):
            self._event_synchronize(index, event)
            return True
        return bool(self.iface.query_event(self._dev(index), event.raw) == 0)

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        for ev in (start, end):
            if not ev.timed:
                raise InvalidArgumentError("elapsed_ms needs timed events")
            self._event_synchronize(index, ev)
        a, b = start.mark, end.mark
        if a is None or b is None or a.ns is None or b.ns is None:
            raise DeviceError("the plugin completed an event without running the stream callback queued before "
                              "it", backend=self.name)
        return (b.ns - a.ns) / 1e6

    def _synchronize(self, index: int) -> None:
        self._use(index)
        if self._has("synchronize_device"):
            self._call("synchronize_device", self._dev(index))
            return
        with self._lock:
            streams = list(self._streams.get(index, ()))
        for s in streams:
            self._call("synchronize_stream", self._dev(index), s.raw)

    # -- collectives -------------------------------------------------------------------------
    def native_ccl(self) -> Any:
        if self._xccl is None and all(self._has(e) for e in PaddleXccl.needed):
            self._xccl = PaddleXccl(self)
        return self._xccl


class _Owned(np.ndarray):
    """A uint8 array that keeps the plugin memory it views alive."""

    _owner: Any = None

    def __new__(cls, arr: np.ndarray, owner: Any) -> _Owned:
        obj = arr.view(cls)
        obj._owner = owner
        return obj


# ---------------------------------------------------------------------------------------------
# xccl_* as a native collective library
# ---------------------------------------------------------------------------------------------

class PaddleXccl(NativeLibrary):
    """A plugin's ``xccl_*`` entries, driven by the native transport as HCCL is."""

    api = "xccl"
    needed = ("xccl_get_unique_id_size", "xccl_get_unique_id", "xccl_comm_init_rank", "xccl_destroy_comm")
    codes = {k: v[0] for k, v in STATUS.items()}
    invalid_codes = frozenset({3})
    dtypes = {"int8": 6, "uint8": 2, "int32": 8, "int64": 9, "float16": 10, "float32": 11, "float64": 12,
              "bfloat16": 13}
    byte = 2                                    # UINT8
    redops = {"sum": 0, "avg": 1, "max": 2, "min": 3, "prod": 4}
    _entries = {"all_reduce": "xccl_all_reduce", "broadcast": "xccl_broadcast", "reduce": "xccl_reduce",
                "all_gather": "xccl_all_gather", "reduce_scatter": "xccl_reduce_scatter",
                "all_to_all": "xccl_all_to_all", "send": "xccl_send", "recv": "xccl_recv"}

    def __init__(self, plugin: PaddlePlugin) -> None:
        super().__init__(plugin.ffi, plugin.iface, plugin.p.path, False)
        self.plugin = plugin
        grouped = plugin._has("xccl_group_start") and plugin._has("xccl_group_end")
        # without group entries send / recv pairs could deadlock: the engine runs them
        self.entries = frozenset(k for k, e in self._entries.items()
                               if plugin._has(e) and (grouped or k not in ("send", "recv", "all_to_all")))
        self._grouped = grouped
        self._comms: dict[int, tuple[int, int]] = {}
        try:
            self._comm_error: Any = plugin.p.lib.anychip_paddle_comm_error
        except AttributeError:
            self._comm_error = None

    def supports(self, spec: Any) -> bool:
        if spec.kind not in self.entries:
            return False
        if spec.kind in ("all_reduce", "reduce", "reduce_scatter"):
            return spec.dtype in self.dtypes and spec.op in self.redops
        return True

    def _rc(self, rc: int) -> int:
        return 0 if rc == 1 else int(rc)

    def unique_id(self) -> bytes:
        f, lib = self.ffi, self.lib
        size = f.new("size_t *")
        self.check(self._rc(lib.xccl_get_unique_id_size(size)), "xccl_get_unique_id_size")
        data = f.new("char[]", max(int(size[0]), 1))
        root = f.new("C_CCLRootId *", {"sz": int(size[0]), "data": data})
        self.check(self._rc(lib.xccl_get_unique_id(root)), "xccl_get_unique_id")
        return bytes(f.buffer(data, int(size[0])))

    def init(self, nranks: int, uid: bytes, rank: int) -> Any:
        f = self.ffi
        data = f.new("char[]", uid or b"\0")
        root = f.new("C_CCLRootId *", {"sz": len(uid), "data": data})
        out = f.new("C_CCLComm *")
        self.check(self._rc(self.lib.xccl_comm_init_rank(nranks, root, rank, out)),
                   f"xccl_comm_init_rank (rank {rank} of {nranks})")
        self._comms[int(f.cast("uintptr_t", out[0]))] = (rank, nranks)
        return out[0]

    def destroy(self, comm: Any) -> int:
        self._comms.pop(int(self.ffi.cast("uintptr_t", comm)), None)
        return self._rc(self.lib.xccl_destroy_comm(comm))

    def async_error(self, comm: Any) -> int:
        """C_ERROR when the plugin's error extension reports a failed op of ``comm``; without
        it, failures of enqueued ops surface only where the plugin reports them (its stream)."""
        return 3 if self.comm_detail(comm) else 0

    def comm_detail(self, comm: Any) -> str:
        if self._comm_error is None:
            return ""
        p = self._comm_error(comm)
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def group_start(self) -> int:
        return self._rc(self.lib.xccl_group_start()) if self._grouped else 0

    def group_end(self) -> int:
        return self._rc(self.lib.xccl_group_end()) if self._grouped else 0

    def use_device(self, plugin: Any, index: int) -> None:
        plugin._use(index)

    def stream_handle(self, plugin: Any, raw: Any) -> Any:
        return raw.raw

    def op(self, comm, kind, send, recv, count, dtype, redop, root, stream):  # noqa: ANN001, ANN201
        lib, f = self.lib, self.ffi
        if kind == "all_reduce":
            return self._rc(lib.xccl_all_reduce(send, recv, count, dtype, redop, comm, stream))
        if kind == "broadcast":
            rank, _ = self._comms[int(f.cast("uintptr_t", comm))]
            if rank == root and send != recv and count:          # xccl broadcasts in place
                self.plugin._call("async_memory_copy_d2d" if self.plugin._has("async_memory_copy_d2d")
                                  else "memory_copy_d2d", *self._d2d_args(stream, recv, send, count))
            return self._rc(lib.xccl_broadcast(recv, count, dtype, root, comm, stream))
        if kind == "reduce":
            return self._rc(lib.xccl_reduce(send, recv, count, dtype, redop, root, comm, stream))
        if kind == "all_gather":
            return self._rc(lib.xccl_all_gather(send, recv, count, dtype, comm, stream))
        if kind == "reduce_scatter":
            return self._rc(lib.xccl_reduce_scatter(send, recv, count, dtype, redop, comm, stream))
        if kind == "send":
            return self._rc(lib.xccl_send(send, count, dtype, root, comm, stream))
        if kind == "recv":
            return self._rc(lib.xccl_recv(recv, count, dtype, root, comm, stream))
        rank, size = self._comms[int(f.cast("uintptr_t", comm))]
        s, r = int(f.cast("uintptr_t", send)), int(f.cast("uintptr_t", recv))
        sends = f.new("void *[]", [f.cast("void *", s + p * count) for p in range(size)])
        recvs = f.new("void *[]", [f.cast("void *", r + p * count) for p in range(size)])
        counts = f.new("size_t[]", [count] * size)
        types = f.new("C_DataType[]", [dtype] * size)
        return self._rc(lib.xccl_all_to_all(f.cast("const void **", sends), counts, types, recvs, counts, types,
                                            rank, size, comm, stream))

    def _d2d_args(self, stream: Any, dst: Any, src: Any, nbytes: int) -> tuple:
        plugin = self.plugin
        index = getattr(plugin._tls, "dev", 0)
        dev = plugin._dev(index if index >= 0 else 0)
        if plugin._has("async_memory_copy_d2d"):
            return dev, stream, dst, src, nbytes
        plugin._call("synchronize_stream", dev, stream)
        return dev, dst, src, nbytes
