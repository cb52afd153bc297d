"""Backends from C libraries implementing ``anychip/plugin.h``.

:func:`probe` opens one library with cffi (ABI mode), calls its
``anychip_plugin_init`` on a zeroed table and checks it: the major version, the
device type name, the required entries, the event group. A library that fails is
refused with a :class:`PluginError` naming the library and the reason. One that
passes becomes a :class:`CPlugin` subclass instance named by its device type; the
registry lists it like a built-in backend.

Status codes are the plugin's own: a failure becomes a ``DeviceError`` carrying the
code, the plugin's text for it (``get_error_string``) and the detail of the thread's
last failure (``get_last_error``). Optional entries fall back as the header says
(synchronous copies ordered on the stream, host-timestamp events after a stream
synchronize, host staging for peer copies). A plugin with collectives gets a native
transport (:class:`PluginCollectives`); without, the host transport serves. A plugin with a
kernel table (minor 1) gets a tensor kernel set (``kernels``, chips/_plugin_kernels.py);
without, every tensor op takes the host fallback.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import numpy as np

from .._data import plugin_header
from ..runtime._libs import copy_pointers, dlopen, new_ffi
from ..runtime.env import collective_check
from ..runtime.errors import DeviceError, PluginError, UnsupportedError
from ..runtime.native_ccl import NativeLibrary
from ..runtime.plugin import D2D, D2H, H2D, DevicePlugin
from ..runtime.status import StatusCodes
from . import _plugin_kernels

__all__ = ["CPlugin", "PluginCollectives", "probe", "open_table", "cdef", "abi", "REQUIRED_ENTRIES", "EVENT_ENTRIES",
           "INIT_SYMBOL"]

INIT_SYMBOL = "anychip_plugin_init"
log = logging.getLogger("anychip")

#: entries every plugin must set
REQUIRED_ENTRIES: tuple[str, ...] = ("device_count", "mem_info", "mem_alloc", "mem_free", "copy",
                                     "stream_create", "stream_destroy", "stream_synchronize")
#: all of these or none
EVENT_ENTRIES: tuple[str, ...] = ("event_create", "event_destroy", "event_record", "event_synchronize")
#: the least a plugin's collectives need to be used
CCL_ENTRIES: tuple[str, ...] = ("get_unique_id", "comm_init_rank", "comm_destroy", "all_reduce")
#: send / recv are used only with the group calls
P2P_ENTRIES: tuple[str, ...] = ("send", "recv", "group_start", "group_end")

DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")   # anychip_dtype order
REDOPS = ("sum", "prod", "min", "max", "avg")                                             # anychip_redop order
_COPY_KINDS = {H2D: 0, D2H: 1, D2D: 2}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
WAIT_SLICE_S = 1e-3
SPIN_S = 50e-6

_ffi_lock = threading.Lock()
_ffi: Any = None
_abi: tuple[int, int] = (0, 0)


def _header_text() -> tuple[str, dict[str, int]]:
    text = plugin_header().read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    consts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^#define\s+(\w+)\s+(\d+)\s*$", text, flags=re.M)}
    return text, consts


def cdef() -> str:
    """The declarations of ``plugin.h`` as cffi reads them (the header is the one source)."""
    text, consts = _header_text()
    body = text[text.index("typedef int32_t anychip_status;"):text.index("#define ANYCHIP_PLUGIN_HAS")]
    body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("#"))
    for name, value in consts.items():
        body = re.sub(rf"\b{name}\b", str(value), body)
    return body + f"\nanychip_status {INIT_SYMBOL}(anychip_plugin *plugin);\n"


def abi() -> tuple[Any, tuple[int, int]]:
    """(the shared cffi FFI of plugin.h, (major, minor) this anychip implements)."""
    global _ffi, _abi
    with _ffi_lock:
        if _ffi is None:
            ffi = new_ffi()
            ffi.cdef(cdef())
            consts = _header_text()[1]
            _abi = (consts["ANYCHIP_PLUGIN_API_MAJOR"], consts["ANYCHIP_PLUGIN_API_MINOR"])
            _ffi = ffi
        return _ffi, _abi


def _missing(table: Any, ffi: Any, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if getattr(table, n) == ffi.NULL]


def _init_failure(ffi: Any, table: Any, rc: int) -> str:
    text = ""
    if table.get_error_string != ffi.NULL:
        p = table.get_error_string(rc)
        text = ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""
    if table.get_last_error != ffi.NULL:
        p = table.get_last_error()
        if p != ffi.NULL:
            detail = ffi.string(p).decode("utf-8", "replace")
            text = f"{text}: {detail}" if text else detail
    return f"{INIT_SYMBOL} failed with status {rc}" + (f" ({text})" if text else "")


def _check_table(ffi: Any, table: Any, major: int, minor: int) -> str:
    """The device type, or PluginError saying what is wrong with the table."""
    if table.major != major:
        if table.major == 0:
            raise PluginError(f"{INIT_SYMBOL} did not set the ABI version (major = 0); set major = "
                              f"ANYCHIP_PLUGIN_API_MAJOR and minor = ANYCHIP_PLUGIN_API_MINOR")
        newer = "a newer" if table.major > major else "an older"
        raise PluginError(f"is built for plugin ABI {table.major}.{table.minor}, {newer} major version; this "
                          f"anychip implements {major}.{minor} and loads only plugins of major version {major}"
                          + (" (upgrade anychip)" if table.major > major else " (rebuild the plugin)"))
    raw = bytes(ffi.buffer(table.device_type))
    name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    if not _NAME.match(name):
        raise PluginError(f"device_type {name!r} is not a backend name: want lower-case letters, digits and _, "
                          "starting with a letter (e.g. \"mychip\")")
    missing = _missing(table, ffi, REQUIRED_ENTRIES)
    if missing:
        raise PluginError(f"{name}: the required entr{'ies' if len(missing) > 1 else 'y'} {', '.join(missing)} "
                          f"{'are' if len(missing) > 1 else 'is'} not set (plugin ABI {major}.{minor})")
    events = _missing(table, ffi, EVENT_ENTRIES)
    if events and len(events) < len(EVENT_ENTRIES):
        raise PluginError(f"{name}: events need all of {', '.join(EVENT_ENTRIES)}; {', '.join(events)} "
                          "not set (set all four, or none for the stream-synchronize fallback)")
    return name


def probe(path: str) -> tuple[str, Any]:
    """Open the C plugin at ``path``: (backend name, a loader returning its DevicePlugin).
    Raises PluginError (naming the reason) when the library is refused."""
    name, ffi, lib, table, space = open_table(path)
    cls = type(f"CPlugin_{name}", (CPlugin,), {"name": name, "__module__": __name__})
    plugin = cls(path, ffi, lib, table)
    plugin._table_space = space          # owns the table's memory
    return name, lambda: plugin


def open_table(path: str) -> tuple[str, Any, Any, Any, Any]:
    """Open the library at ``path``, call its init on a zeroed table and check the table:
    (device type, ffi, library, table, the memory that holds the table). Raises PluginError
    (naming the reason) when the library is refused."""
    ffi, (major, minor) = abi()
    try:
        lib = dlopen(ffi, path)
    except OSError as exc:
        raise PluginError(f"cannot be loaded: {exc}") from None
    try:
        init = getattr(lib, INIT_SYMBOL)
    except AttributeError:
        raise PluginError(f"exports no {INIT_SYMBOL} (the entry point of anychip/plugin.h)") from None
    # the table, and as much guard space after it: a plugin that ignores struct_size (built
    # against a later, larger table) writes there instead of over the heap, and is refused
    size = ffi.sizeof("anychip_plugin")
    space = ffi.new("anychip_plugin[2]")
    table = ffi.cast("anychip_plugin *", space)
    table.struct_size = size
    rc = init(table)
    spilled = len(bytes(ffi.buffer(space)[size:]).rstrip(b"\0"))
    if spilled:
        raise PluginError(f"{INIT_SYMBOL} wrote {spilled} bytes past the end of the {size}-byte table it was given "
                          "(it ignores struct_size): rebuild it against this anychip's anychip/plugin.h "
                          "(anychip plugin cflags)")
    if rc:
        raise PluginError(_init_failure(ffi, table, rc))
    return _check_table(ffi, table, major, minor), ffi, lib, table, space


class _HostEvent:
    """An event of a plugin without events: a host timestamp taken after a stream synchronize."""

    __slots__ = ("t_ns",)

    def __init__(self) -> None:
        self.t_ns: int | None = None


class _Tls(threading.local):
    dev = -1


class CPlugin(DevicePlugin):
    """One C plugin library as a backend (a subclass per library names it)."""

    api_version = (1, 0)

    def __init__(self, path: str, ffi: Any, lib: Any, table: Any) -> None:
        self.path = path
        self.ffi, self.library, self.t = ffi, lib, table   # (not `lib`: that marks the simulator)
        self.abi = (int(table.major), int(table.minor))
        self.simulated = bool(table.flags & 1)
        #: device memory is host memory (ANYCHIP_PLUGIN_HOST_MEMORY): its pointers are host addresses
        self.host_memory = bool(table.flags & 2)
        v = table.plugin_version
        self.plugin_version = ffi.string(v).decode("utf-8", "replace") if v != ffi.NULL else ""
        self._events = table.event_create != ffi.NULL
        oom = int(table.oom_status)
        #: the plugin's codes (its table names the out-of-memory and not-ready ones; its
        #: get_error_string / get_last_error give the text): every call's status goes through it
        self.status = StatusCodes(self.name, text=self._text, not_ready=int(table.not_ready_status) or None,
                                  oom=(oom,) if oom else (), oom_unnamed=not oom)
        self._tls = _Tls()
        self._lock = threading.Lock()
        self._count: int | None = None
        self._defaults: dict[int, Any] = {}
        self._streams: dict[int, set] = {}
        self._ccl: Any = None
        self._forked = False
        problem = self.collectives_problem()
        if problem is not None and "lack" in problem:      # some collective entries set, not enough
            log.warning("anychip: %s: its collective entries are not used (the host transport serves): %s",
                        path, problem)
        problem = self.kernels_problem()
        if problem is not None:
            log.warning("anychip: %s: its kernel table is not used (every tensor op runs on the host): %s",
                        path, problem)
        self._kernels: Any = None

    # -- errors ------------------------------------------------------------------
    def _text(self, code: int) -> str:
        ffi, t = self.ffi, self.t
        text = ""
        if t.get_error_string != ffi.NULL:
            p = t.get_error_string(code)
            text = ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""
        if t.get_last_error != ffi.NULL:
            p = t.get_last_error()
            detail = ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""
            if detail and detail not in text:
                text = f"{text}: {detail}" if text else detail
        return text or "no detail available"

    def _call(self, what: str, *args: Any) -> None:
        rc = getattr(self.t, what)(*args)
        if rc:
            raise self.status.error(rc, what)

    def _use(self, index: int) -> None:
        if self._tls.dev != index:
            if self.t.set_device != self.ffi.NULL:
                self._call("set_device", index)
            self._tls.dev = index

    # -- identity ------------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        if self._forked:
            return False, (f"C plugin {self.path}: its streams did not survive fork(); use it in a process "
                           "started fresh (anychip launch, multiprocessing's spawn)")
        try:
            n = self.device_count()
        except DeviceError as exc:
            return False, f"C plugin {self.path}: {exc}"
        version = f", {self.plugin_version}" if self.plugin_version else ""
        return True, f"C plugin {self.path} (ABI {self.abi[0]}.{self.abi[1]}{version}); {n} device(s)"

    def device_count(self) -> int:
        if self._count is None:
            out = self.ffi.new("int *")
            self._call("device_count", out)
            self._count = int(out[0])
        return self._count

    def properties(self, index: int) -> dict:
        name = f"{self.name} {index}"
        if self.t.device_name != self.ffi.NULL:
            buf = self.ffi.new("char[256]")
            self._call("device_name", index, buf, 256)
            name = self.ffi.string(buf).decode("utf-8", "replace") or name
        free, total = self._mem_info(index)
        return {"name": name, "total_memory": total, "simulated": self.simulated, "library": self.path,
                "abi": f"{self.abi[0]}.{self.abi[1]}", "plugin_version": self.plugin_version}

    # -- memory ---------------------------------------------------------------------
    def _mem_info(self, index: int) -> tuple[int, int]:
        self._use(index)
        free, total = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        self._call("mem_info", index, free, total)
        return int(free[0]), int(total[0])

    def _malloc(self, index: int, nbytes: int) -> Any:
        self._use(index)
        out = self.ffi.new("void **")
        rc = self.t.mem_alloc(index, max(nbytes, 1), out)
        if rc:
            raise self.status.oom_error(rc, "mem_alloc", nbytes, f"{self.name}:{index}", lambda: self._mem_info(index))
        return int(self.ffi.cast("uintptr_t", out[0]))

    def _free(self, index: int, handle: Any) -> None:
        self._use(index)
        self._call("mem_free", index, self.ffi.cast("void *", handle))

    def _pointer(self, handle: Any, offset: int) -> int:
        return handle + offset

    # -- copies ---------------------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        self._use(index)
        ffi = self.ffi
        ptrs = copy_pointers(ffi, kind, dst, dst_off, src, src_off)
        if ptrs is None:
            raise DeviceError(f"unknown copy kind {kind!r}", backend=self.name)
        d, s = ptrs
        t = self.t
        if t.copy_async != ffi.NULL:
            rc = t.copy_async(index, d, s, nbytes, _COPY_KINDS[kind], stream)
            if rc:
                raise self.status.error(rc, "copy_async")
            return
        self._call("stream_synchronize", index, stream)       # ordered after the stream's work
        self._call("copy", index, d, s, nbytes, _COPY_KINDS[kind])

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        if self.t.copy_peer == self.ffi.NULL:
            raise UnsupportedError(f"{self.name} has no peer-to-peer copy")
        self._use(src_index)
        cast = self.ffi.cast
        self._call("copy_peer", dst_index, cast("void *", dst + dst_off), src_index, cast("void *", src + src_off),
                   nbytes, stream)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        self._use(index)
        t, ffi = self.t, self.ffi
        ptr = ffi.cast("void *", dst + dst_off)
        if t.fill_async != ffi.NULL:
            self._call("fill_async", index, ptr, value, nbytes, stream)
        elif t.fill != ffi.NULL:
            self._call("stream_synchronize", index, stream)
            self._call("fill", index, ptr, value, nbytes)
        else:                               # a host buffer of the byte, alive until the copy completed
            host = np.full(nbytes, value, dtype=np.uint8)
            self._copy(index, dst, dst_off, host, 0, nbytes, H2D, stream)
            self._stream_synchronize(index, stream)

    # -- streams --------------------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        s = self._defaults.get(index)
        if s is None:
            with self._lock:
                s = self._defaults.get(index)
                if s is None:
                    s = self._defaults[index] = self._new_stream(index)
        return s

    def _new_stream(self, index: int) -> Any:
        self._use(index)
        out = self.ffi.new("anychip_stream *")
        self._call("stream_create", index, out)
        return out[0]

    def _stream_create(self, index: int) -> Any:
        s = self._new_stream(index)
        with self._lock:
            self._streams.setdefault(index, set()).add(s)
        return s

    def _stream_destroy(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call("stream_destroy", index, stream)
        with self._lock:
            self._streams.get(index, set()).discard(stream)

    def _done(self, what: str, rc: int) -> bool:
        return self.status.done(rc, what)

    def _poll(self, what: str, query: Any, index: int, handle: Any) -> None:
        """Wait until ``query`` says complete: spin for SPIN_S (short work ends there), then
        sleep in growing steps up to WAIT_SLICE_S, so that Ctrl-C interrupts a long wait."""
        spin_until = time.perf_counter() + SPIN_S
        while not self._done(what, query(index, handle)):
            if time.perf_counter() > spin_until:
                delay = 1e-5
                while not self._done(what, query(index, handle)):
                    time.sleep(delay)
                    delay = min(delay * 2, WAIT_SLICE_S)
                return

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._use(index)
        query = self.t.stream_query
        if query != self.ffi.NULL:          # waits Ctrl-C can interrupt: poll, then synchronize
            self._poll("stream_query", query, index, stream)
        self._call("stream_synchronize", index, stream)

    def _stream_query(self, index: int, stream: Any) -> bool:
        self._use(index)
        if self.t.stream_query != self.ffi.NULL:
            return self._done("stream_query", self.t.stream_query(index, stream))
        if self._events:
            ev = self._event_create(index)
            try:
                self._event_record(index, ev, stream)
                return self._event_query(index, ev)
            finally:
                self._event_destroy(index, ev)
        self._call("stream_synchronize", index, stream)
        return True

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        if isinstance(event, _HostEvent):
            return                          # recorded = complete (see _event_record)
        if self.t.stream_wait_event != self.ffi.NULL:
            self._call("stream_wait_event", index, stream, event)
        else:
            self._event_synchronize(index, event)

    # -- events ---------------------------------------------------------------------
    def _event_create(self, index: int) -> Any:
        if not self._events:
            return _HostEvent()
        self._use(index)
        out = self.ffi.new("anychip_event *")
        self._call("event_create", index, out)
        return out[0]

    def _event_destroy(self, index: int, event: Any) -> None:
        if not isinstance(event, _HostEvent):
            self._use(index)
            self._call("event_destroy", index, event)

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        if isinstance(event, _HostEvent):
            self._stream_synchronize(index, stream)
            event.t_ns = time.perf_counter_ns()
            return
        self._use(index)
        self._call("event_record", index, event, stream)

    def _event_synchronize(self, index: int, event: Any) -> None:
        if isinstance(event, _HostEvent):
            return
        self._use(index)
        query = self.t.event_query
        if query != self.ffi.NULL:
            self._poll("event_query", query, index, event)
        self._call("event_synchronize", index, event)

    def _event_query(self, index: int, event: Any) -> bool:
        if isinstance(event, _HostEvent):
            return True
        self._use(index)
        if self.t.event_query != self.ffi.NULL:
            return self._done("event_query", self.t.event_query(index, event))
        self._call("event_synchronize", index, event)
        return True

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        if isinstance(start, _HostEvent) and isinstance(end, _HostEvent):
            if start.t_ns is None or end.t_ns is None:
                raise DeviceError("elapsed time of an event that was never recorded", backend=self.name)
            return (end.t_ns - start.t_ns) / 1e6
        if self.t.event_elapsed_ms == self.ffi.NULL:
            raise UnsupportedError(f"{self.name} has no event timing (event_elapsed_ms is not set)")
        self._use(index)
        ms = self.ffi.new("float *")
        self._call("event_elapsed_ms", index, ms, start, end)
        return float(ms[0])

    def _synchronize(self, index: int) -> None:
        self._use(index)
        with self._lock:
            streams = [s for s in (self._defaults.get(index),) if s is not None]
            streams += list(self._streams.get(index, ()))
        for s in streams:                   # waits that Ctrl-C can interrupt
            self._stream_synchronize(index, s)
        if self.t.device_synchronize != self.ffi.NULL:
            self._call("device_synchronize", index)

    # -- kernels ----------------------------------------------------------------------
    def kernels_problem(self) -> str | None:
        """Why the plugin's kernel table is not used, or None (also when it has none)."""
        return _plugin_kernels.table_problem(self)

    @property
    def kernels(self) -> Any:
        """The kernel table as a tensor kernel set (``_plugin_kernels.PluginKernels``), or None
        when the plugin has no usable table (minor 0, no table, or one refused at load)."""
        if self._kernels is None and _plugin_kernels.has_table(self):
            with self._lock:
                if self._kernels is None:
                    self._kernels = _plugin_kernels.PluginKernels(self)
        return self._kernels

    # -- collectives ------------------------------------------------------------------
    def collectives_problem(self) -> str | None:
        """Why the plugin's collective entries are not used, or None when they are."""
        missing = _missing(self.t, self.ffi, CCL_ENTRIES)
        if len(missing) == len(CCL_ENTRIES):
            return f"{self.name} sets no collective entries"
        if missing:
            return f"{self.name}'s collectives lack {', '.join(missing)}"
        return None

    def native_ccl(self) -> Any:
        # ANYCHIP_COLLECTIVE_CHECK=1: communicators made now use the host transport, whose
        # engine compares every rank's op signature first (a plugin's library has no such check)
        if self.collectives_problem() is not None or collective_check():
            return None
        with self._lock:
            if self._ccl is None:
                self._ccl = _collectives_class(self)(self)
            return self._ccl

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._tls = _Tls()
        if self._defaults or any(self._streams.values()):
            self._forked = True             # the plugin's stream threads stayed in the parent
        self._defaults, self._streams = {}, {}


def _collectives_class(plugin: CPlugin) -> type[PluginCollectives]:
    t, ffi = plugin.t, plugin.ffi
    dmask = int(t.ccl_dtype_mask) or ~0
    rmask = int(t.ccl_redop_mask) or ~0
    kinds = {"all_reduce", *(k for k in ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
                             if getattr(t, k) != ffi.NULL)}
    if not _missing(t, ffi, P2P_ENTRIES):
        kinds |= {"send", "recv"}
    per_op = t.ccl_op_dtype_masks if plugin.abi[1] >= 2 else ffi.NULL      # (plugin.h's anychip_plugin_reduces)
    refused = frozenset() if per_op == ffi.NULL else frozenset(
        (r, d) for i, r in enumerate(REDOPS) for j, d in enumerate(DTYPES) if not per_op[i] & (1 << j))
    attrs = {
        "api": getattr(plugin, "ccl_api", "") or f"{plugin.name} collectives", "backend": plugin.name,
        "id_type": "anychip_unique_id",
        "dtypes": {d: i for i, d in enumerate(DTYPES) if dmask & (1 << i)},
        "redops": {r: i for i, r in enumerate(REDOPS) if rmask & (1 << i)}, "refused": refused,
        "byte": 1, "kinds": frozenset(kinds),
        # (a built-in chip's adapter names its collective library's codes too: ccl_invalid_codes)
        "invalid_codes": frozenset({int(t.invalid_status), *getattr(plugin, "ccl_invalid_codes", ())} - {0}),
        "timeout_codes": frozenset({int(t.timeout_status)} - {0}),
    }
    return type(f"PluginCollectives_{plugin.name}", (PluginCollectives,), attrs)


class PluginCollectives(NativeLibrary):
    """A C plugin's collective entries as a native library (the native transport drives it)."""

    #: the entries of anychip/plugin.h's table (``function`` reads them there)
    calls = {"all_reduce": ("all_reduce", "send recv count dtype redop comm stream"),
             "broadcast": ("broadcast", "send recv count dtype root comm stream"),
             "reduce": ("reduce", "send recv count dtype redop root comm stream"),
             "all_gather": ("all_gather", "send recv count dtype comm stream"),
             "reduce_scatter": ("reduce_scatter", "send recv count dtype redop comm stream"),
             "all_to_all": ("all_to_all", "send recv count dtype comm stream"),
             "send": ("send", "send count dtype root comm stream"),
             "recv": ("recv", "recv count dtype root comm stream")}

    def __init__(self, plugin: CPlugin) -> None:
        super().__init__(plugin.ffi, plugin.library, plugin.path, plugin.simulated)
        self.plugin = plugin
        self.t = plugin.t
        self._tls = _Tls()

    def code_name(self, code: int) -> str:
        return self.plugin.status.name(code) or f"status {code}"

    def detail(self) -> str:
        return self.comm_detail(None)

    def text(self, code: int) -> str:
        # the plugin's text for the code and its last error, read once (an adapter's get_last_error
        # hands its message over once); an adapter's error string begins with the code's name
        name, text = self.code_name(code), self.plugin._text(code)
        if text.startswith(f"{name}: "):
            text = text[len(name) + 2:]
        return f"{self.api} returned {name}: {text}"

    def comm_detail(self, comm: Any) -> str:
        t = self.t
        if t.get_last_error == self.ffi.NULL:
            return ""
        p = t.get_last_error()
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def use_device(self, plugin: Any, index: int) -> None:
        self._tls.dev = index
        self.plugin._use(index)

    def stream_handle(self, plugin: Any, raw: Any) -> Any:
        return raw if raw is not None else self.plugin._default_stream(max(self._tls.dev, 0))

    def unique_id(self) -> bytes:
        uid = self.ffi.new("anychip_unique_id *")
        self.check(self.t.get_unique_id(uid), f"{self.api}: get_unique_id")
        return bytes(self.ffi.buffer(uid))

    def init(self, nranks: int, uid: bytes, rank: int) -> Any:
        return self._init_comm(nranks, uid, rank, None)

    def init_with_timeout(self, nranks: int, uid: bytes, rank: int, timeout: float) -> Any:
        """Through the plugin's comm_init_rank_timeout (plugin.h minor 3, the rule of its
        ``anychip_plugin_comm_init_timeout``) where it has one: the communicator's own waits for
        peers then end at ``timeout``, naming the peer; else ``init``."""
        has = self.plugin.abi[1] >= 3 and self.t.comm_init_rank_timeout != self.ffi.NULL
        return self._init_comm(nranks, uid, rank, timeout if has else None)

    def _init_comm(self, nranks: int, uid: bytes, rank: int, timeout: float | None) -> Any:
        out = self.ffi.new("anychip_comm *")
        idp = self.ffi.new("anychip_unique_id *")
        self.ffi.memmove(idp, uid, self.ffi.sizeof("anychip_unique_id"))
        dev = max(self._tls.dev, 0)
        if timeout is None:
            self.check(self.t.comm_init_rank(dev, nranks, idp, rank, out),
                       f"{self.api}: comm_init_rank (rank {rank} of {nranks})")
        else:
            self.check(self.t.comm_init_rank_timeout(dev, nranks, idp, rank, float(timeout), out),
                       f"{self.api}: comm_init_rank_timeout (rank {rank} of {nranks}, {timeout:g} s)")
        return out[0]

    def destroy(self, comm: Any) -> int:
        return int(self.t.comm_destroy(comm))

    def abort(self, comm: Any) -> int:
        if self.t.comm_abort != self.ffi.NULL:
            return int(self.t.comm_abort(comm))
        return self.destroy(comm)

    def async_error(self, comm: Any) -> int:
        if self.t.comm_get_async_error == self.ffi.NULL:
            return 0
        err = self.ffi.new("anychip_status *")
        rc = self.t.comm_get_async_error(comm, err)
        return int(rc or err[0])

    def group_start(self) -> int:
        return int(self.t.group_start()) if self.t.group_start != self.ffi.NULL else 0

    def group_end(self) -> int:
        return int(self.t.group_end()) if self.t.group_end != self.ffi.NULL else 0

    def function(self, name: str) -> Any:
        return getattr(self.t, name)
