"""What the three cffi-bound vendor backends (ascend, kunlun, hygon) share.

Each backend binds its vendor's *real* C runtime API in ABI mode (``ffi.dlopen``).
The library is the vendor's own when it is installed; otherwise, when
``ANYCHIP_SIMULATE`` allows (``auto``, the default, or ``always``), it is the
simulator library built from ``csrc/sim``, which exports the same symbols. Every
call below goes through the same code whichever library answered.

The simulator adds a few controls under ``anychip_sim_*`` names (stream hold /
release, the detail of the last failure, IPC handles). They are looked up only
when ``simulated`` is true.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from ..runtime._libs import dlopen, find_library
from ..runtime.env import simulate
from ..runtime.errors import DeviceError, UnsupportedError
from ..runtime.native_ccl import NativeLibrary
from ..runtime.plugin import D2D, D2H, H2D, DevicePlugin
from ..runtime.status import StatusCodes
from ._headers import cdef_of

__all__ = ["VendorPlugin", "find_vendor_library", "roots", "load_ccl"]

log = logging.getLogger("anychip")

SIMULATE_ENV = "ANYCHIP_SIMULATE"

#: the simulator's status for a timed wait that ran out (ANYCHIP_SIM_E_TIMEOUT in anychip/sim.h)
SIM_E_TIMEOUT = 18
#: longest time a wait stays in C: Python runs signal handlers (Ctrl-C) between slices
WAIT_SLICE_MS = 50

_announced: set[str] = set()
_announce_lock = threading.Lock()


def _ld_library_path() -> list[str]:
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]


def find_vendor_library(names: tuple[str, ...], dirs: list[str]) -> tuple[str | None, list[str]]:
    """First ``dir/name`` that exists, searching ``dirs`` then ``LD_LIBRARY_PATH``.

    Returns (path or None, the directories searched, in order, without duplicates).
    """
    searched: list[str] = []
    for d in [*dirs, *_ld_library_path()]:
        d = os.path.abspath(os.path.expanduser(d))
        if d in searched:
            continue
        searched.append(d)
        for name in names:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path, searched
    return None, searched


def roots(env_vars: tuple[str, ...], defaults: tuple[str, ...]) -> list[str]:
    """Install roots named by environment variables (when set), then the usual defaults."""
    return [*(os.environ[v] for v in env_vars if os.environ.get(v)), *defaults]


def load_ccl(plugin: Any, cls: type[NativeLibrary]) -> tuple[NativeLibrary | None, str]:
    """The collective library ``cls`` binds, for the loaded vendor ``plugin``, or (None, why not).

    On the simulator the simulator library itself exports the collective API; on the
    vendor's runtime the vendor's library must be installed beside it (the plugin's
    search directories, the library's own install roots, then ``LD_LIBRARY_PATH``)."""
    import cffi  # type: ignore[import-untyped]

    if plugin.simulated:
        path = plugin.library_path
    else:
        dirs = [*plugin.search_dirs(), *roots(*cls.extra_roots)]
        path, searched = find_vendor_library(cls.real_names, dirs)
        if path is None:
            return None, (f"{' or '.join(cls.real_names)} not found beside {plugin.library_path} "
                          f"(searched {', '.join(searched)})")
    ffi = cffi.FFI()
    ffi.cdef(cls.cdef + ("const char *anychip_sim_last_error(void);"
                         "int anychip_sim_ccl_abort(void *comm, const char *reason);" if plugin.simulated else ""))
    try:
        lib = dlopen(ffi, path)
        getattr(lib, cls.probe)                 # the library has the API
    except (OSError, AttributeError) as exc:
        return None, f"{path} cannot serve {cls.api}: {exc}"
    return cls(ffi, lib, path, plugin.simulated), ""


_ccl_lock = threading.Lock()


class _ThreadState(threading.local):
    dev = -1          # the device last made current on this thread through this library
    out: Any = None   # an int the library's GET_DEVICE writes (made on the thread's first use)


_thread_states: dict[str, _ThreadState] = {}


def _thread_state(path: str) -> _ThreadState:
    """One per loaded library: plugin instances over the same library share the current device."""
    with _announce_lock:
        return _thread_states.setdefault(os.path.realpath(path), _ThreadState())


class VendorPlugin(DevicePlugin):
    """Base of the cffi vendor backends: library discovery and loading, the per-thread
    current device, one checked way to call the library (:meth:`_call`), waits that
    Ctrl-C interrupts, and every operation of the plugin interface written once over the
    vendor's calls. A vendor module supplies its declarations, the names of its calls
    (the upper-case class attributes below) and a few adapters where argument orders or
    semantics differ."""

    api_version = (1, 0)

    #: the vendor's library file names, in order of preference
    vendor_libraries: ClassVar[tuple[str, ...]] = ()
    #: the simulator library built from csrc/sim (anychip/_lib/<name>.*.so)
    simulator_library: ClassVar[str] = ""
    #: the vendor API in words ("Ascend ACL runtime")
    api_label: ClassVar[str] = ""
    #: cffi declarations of the vendor API, from its header (the simulator's controls are appended)
    cdef: ClassVar[str] = ""
    #: status code -> the vendor's name for it
    code_names: ClassVar[dict[int, str]] = {}
    #: status codes meaning "out of device memory"
    oom_codes: ClassVar[frozenset[int]] = frozenset()
    #: copy kind -> the vendor's memcpy-kind value
    copy_kinds: ClassVar[dict[str, int]] = {}
    #: the binding of the vendor's collective library (its ``native_ccl()``), or None
    ccl_library: ClassVar[type[NativeLibrary] | None] = None
    #: C types of stream and event handles
    stream_type: ClassVar[str] = "void *"
    event_type: ClassVar[str] = "void *"

    # names of the vendor's calls that take the same arguments everywhere
    SET_DEVICE: ClassVar[str] = ""
    GET_DEVICE: ClassVar[str] = ""          # (int *device): the thread's current device
    MALLOC: ClassVar[str] = ""
    FREE: ClassVar[str] = ""
    STREAM_CREATE: ClassVar[str] = ""
    STREAM_DESTROY: ClassVar[str] = ""
    STREAM_SYNCHRONIZE: ClassVar[str] = ""
    STREAM_WAIT_EVENT: ClassVar[str] = ""
    EVENT_CREATE: ClassVar[str] = ""
    EVENT_DESTROY: ClassVar[str] = ""
    EVENT_RECORD: ClassVar[str] = ""
    EVENT_SYNCHRONIZE: ClassVar[str] = ""
    EVENT_ELAPSED: ClassVar[str] = ""
    DEVICE_SYNCHRONIZE: ClassVar[str] = ""
    #: the asynchronous copy: (dst, src, count, kind, stream), or with copy_dest_max
    #: (dst, destMax, src, count, kind, stream)
    MEMCPY_ASYNC: ClassVar[str] = ""
    copy_dest_max: ClassVar[bool] = False
    def __init__(self) -> None:
        self._state: tuple[bool, str] | None = None
        self._ccl: tuple[NativeLibrary | None, str] | None = None    # (library, why not), loaded once
        self._load_lock = threading.Lock()
        self._tls = _ThreadState()
        self.ffi: Any = None
        self.lib: Any = None
        self.library_path: str | None = None
        self.simulated = False
        self._count = 0
        self._note = ""
        self._fns: dict[str, Any] = {}
        self._peers: set[tuple[int, int]] = set()
        self._peer_lock = threading.Lock()        # also guards _streams
        self._streams: dict[int, set] = {}        # device -> streams created and not destroyed
        # bound when the library loads (_finish)
        self._cast: Any = None
        self._from_buffer: Any = None
        self._memcpy_async: Any = None
        self._sync_stream: Any = None
        self._timed_stream_wait: Any = None
        self._timed_event_wait: Any = None
        self._timed_device_wait: Any = None

    # -- discovery --------------------------------------------------------
    def search_dirs(self) -> list[str]:
        """Directories that may hold the vendor library (before LD_LIBRARY_PATH)."""
        raise NotImplementedError

    def available(self) -> tuple[bool, str]:
        state = self._state
        if state is None:
            with self._load_lock:
                if self._state is None:
                    try:
                        self._state = self._load()
                    except Exception as exc:  # noqa: BLE001 - available() never raises
                        self.lib = None
                        self._state = (False, f"{type(exc).__name__}: {exc}")
                state = self._state
        return state

    def _load(self) -> tuple[bool, str]:
        try:
            mode = simulate()
        except ValueError as exc:
            return False, str(exc)
        import cffi

        names = " or ".join(self.vendor_libraries)
        path: str | None = None
        searched: list[str] = []
        failure = ""
        if mode != "always":
            path, searched = find_vendor_library(self.vendor_libraries, self.search_dirs())
        if path is not None:
            ffi = cffi.FFI()
            ffi.cdef(self.cdef)
            try:
                lib = dlopen(ffi, path)
            except OSError as exc:
                failure = f"{path} could not be loaded ({exc})"
                path = None
            else:
                try:
                    return self._finish(ffi, lib, path, simulated=False)
                except Exception as exc:  # noqa: BLE001 - reported as the reason
                    self.lib = None
                    return False, (f"{path} was found but does not work ({exc}); "
                                   f"{SIMULATE_ENV}=always selects the simulator instead")
        where = ", ".join(searched) if searched else "nowhere"
        if mode == "never":
            why = failure or f"{names} not found (searched {where}; LD_LIBRARY_PATH included)"
            return False, f"{why}; {SIMULATE_ENV}=never forbids the simulator"
        sim = find_library(self.simulator_library)
        if sim is None:
            why = failure or f"{names} not found"
            return False, (f"{why}, and the simulator library {self.simulator_library} is not built "
                           "(run `pip install -e .` or `python setup.py build_ext --inplace`)")
        ffi = cffi.FFI()
        ffi.cdef(self.cdef + cdef_of("anychip/sim.h"))      # the simulator's own controls
        lib = dlopen(ffi, sim)
        ok, reason = self._finish(ffi, lib, sim, simulated=True)
        if ok and mode == "auto":
            reason += f" ({failure or names + ' not found'})"
        return ok, reason

    def _finish(self, ffi: Any, lib: Any, path: str, simulated: bool) -> tuple[bool, str]:
        self.ffi, self.lib, self.library_path, self.simulated = ffi, lib, path, simulated
        #: the vendor API's codes: every call's status is translated through it
        self.status = StatusCodes(self.name, name=self.code_name, text=self._message, oom=self.oom_codes)
        self._tls = _thread_state(path)
        self._fns = {}
        self._cast, self._from_buffer = ffi.cast, ffi.from_buffer
        self._memcpy_async = getattr(lib, self.MEMCPY_ASYNC) if self.MEMCPY_ASYNC else None
        self._sync_stream = self._fn(self.STREAM_SYNCHRONIZE) if self.STREAM_SYNCHRONIZE else None
        self._get_device = self._fn(self.GET_DEVICE)
        # the simulator's timed waits; on a vendor library, waits poll the vendor's queries
        self._timed_stream_wait = lib.anychip_sim_stream_wait if simulated else None
        self._timed_event_wait = lib.anychip_sim_event_wait if simulated else None
        self._timed_device_wait = lib.anychip_sim_device_wait if simulated else None
        self._note = ""
        self._count = self._open()
        self._bind()
        kind = f"simulated {self.api_label}" if simulated else self.api_label
        if simulated:
            with _announce_lock:
                if self.name not in _announced:
                    _announced.add(self.name)
                    log.info("%s: using the simulator %s in place of %s", self.name, path,
                             " / ".join(self.vendor_libraries))
        note = f" ({self._note})" if self._note else ""
        return True, f"{kind} ({path}); {self._count} device(s){note}"

    def _open(self) -> int:
        """Initialize the library and return the device count (setting ``self._note`` to
        say why it is 0 where the library tells)."""
        raise NotImplementedError

    def _bind(self) -> None:
        """Cache bound functions on self (hot paths avoid attribute lookups on lib)."""

    def device_count(self) -> int:
        ok, _ = self.available()
        return self._count if ok else 0

    @property
    def kernels(self) -> Any:
        """The simulator's tensor kernels (devices/_sim_kernels.py), made on first use; None on a
        vendor library (the tensor layer then uses its host fallback)."""
        if not self.simulated or self.lib is None:
            return None
        k = self.__dict__.get("_kernels")
        if k is None or k._plugin is not self:
            from ._sim_kernels import SimKernels
            with self._load_lock:
                k = self.__dict__.get("_kernels")
                if k is None:
                    k = self.__dict__["_kernels"] = SimKernels(self)
        return k

    # -- calling the library ------------------------------------------------
    def _fn(self, name: str) -> Any:
        """The library's function ``name`` (cached)."""
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = getattr(self.lib, name)
        return fn

    def _sym(self, name: str) -> Any:
        """A function of the loaded library, or None when the library lacks it."""
        try:
            return self._fn(name)
        except (AttributeError, NotImplementedError):
            return None

    def _call(self, name: str, *args: Any) -> None:
        """Call the library's function ``name``; a non-zero status raises DeviceError
        with the vendor's name for the code and message (the one checked way to call)."""
        rc = self._fn(name)(*args)
        if rc:
            raise self.status.error(rc, name)

    def _out(self, ctype: str, name: str, *args: Any) -> Any:
        """Call ``name(*args, &out)`` for an output of type ``ctype`` and return ``out``."""
        out = self.ffi.new(ctype + " *")
        self._call(name, *args, out)
        return out[0]

    def _use(self, index: int) -> None:
        """Make ``index`` the current device of this thread (only when it is not already).

        The library's current device is the thread's, shared with the library's other callers
        in the process (the plugin.h face that anychip.torch and the Paddle bridge drive, the
        application): any of them may have changed it since anychip set it, so the library is
        asked (GET_DEVICE) rather than a remembered value trusted. Calls that take the NULL
        stream (the current device's default stream) or make streams depend on it."""
        tls = self._tls
        if tls.dev == index:
            get, out = self._get_device, tls.out
            if out is None:
                out = tls.out = self.ffi.new(self.ffi.typeof(get).args[0])
            if get(out) == 0 and out[0] == index:
                return
        self._set_device(index)
        tls.dev = index

    def _set_device(self, index: int) -> None:
        self._call(self.SET_DEVICE, index)

    # -- waiting ----------------------------------------------------------
    # Waits come back to Python at least every WAIT_SLICE_MS, so that a signal handler
    # runs (Ctrl-C raises KeyboardInterrupt in the loop) even when the work never
    # completes. On the simulator they use its timed waits (anychip_sim_*_wait); on a
    # vendor library they poll the vendor's query with growing sleeps. The vendor's own
    # synchronize follows and reports the failures of the work with the vendor's code.
    def _wait(self, timed: Any, handle: Any, done: Callable[[Any], bool]) -> None:
        if timed is not None:
            while timed(handle, WAIT_SLICE_MS) == SIM_E_TIMEOUT:
                pass
            return
        delay = 0.0
        while not done(handle):
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 1e-3)

    def code_name(self, code: int) -> str:
        return self.code_names.get(code, f"status {code}")

    def _vendor_message(self, code: int) -> str:
        """The vendor library's own text for a failure (overridden per vendor)."""
        return ""

    def _detail(self) -> str:
        """The simulator's description of the calling thread's last failure."""
        if not self.simulated:
            return ""
        fn = self._sym("anychip_sim_last_error")
        if fn is None:
            return ""
        p = fn()
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def _message(self, code: int) -> str:
        vendor = self._vendor_message(code)
        detail = self._detail()
        if detail and detail not in vendor:
            return f"{vendor}: {detail}" if vendor else detail
        return vendor or "no detail available"


    # -- collectives ------------------------------------------------------------
    def _ccl_state(self) -> tuple[NativeLibrary | None, str]:
        if self.ccl_library is None:
            return None, super().native_ccl_problem()
        with _ccl_lock:
            if self._ccl is None:
                ok, why = self.available()
                self._ccl = load_ccl(self, self.ccl_library) if ok else (None, why)
            return self._ccl

    def native_ccl(self) -> NativeLibrary | None:
        """The vendor's collective library (:attr:`ccl_library`), loaded once."""
        return self._ccl_state()[0]

    def native_ccl_problem(self) -> str:
        return self._ccl_state()[1]

    def _after_fork_in_child(self) -> None:
        # The simulator gives the child fresh devices with no current device: forget
        # which device this thread had made current, the streams and peer access of
        # the parent, and locks other parent threads may have held at the fork.
        global _announce_lock
        _announce_lock = threading.Lock()
        self._load_lock = threading.Lock()
        for state in _thread_states.values():
            state.dev = -1
        self._tls.dev = -1
        if hasattr(self, "_peers"):      # peer access is enabled again on the child's fresh devices
            self._peer_lock = threading.Lock()
            self._peers = set()
        if isinstance(getattr(self, "_streams", None), dict):   # streams a backend tracks (kunlun)
            self._lock = threading.Lock()
            self._streams = {}

    def _host_ptr(self, arr: Any, offset: int) -> Any:
        return self.ffi.from_buffer(arr) + offset

    def _pointer(self, handle: Any, offset: int) -> int:
        return handle + offset

    def properties(self, index: int) -> dict:
        props = {"name": self.name, "total_memory": 0, "simulated": self.simulated,
                 "library": self.library_path, "api": self.api_label}
        if self.simulated:
            props["physical_index"] = int(self.lib.anychip_sim_physical_device(index))
        return props

    # -- memory ---------------------------------------------------------
    def _malloc_args(self, out: Any, nbytes: int) -> tuple:
        """Arguments of MALLOC in the vendor's order (``out`` is a void **)."""
        return out, nbytes

    def _malloc(self, index: int, nbytes: int) -> Any:
        self._use(index)
        out = self.ffi.new("void **")
        rc = self._fn(self.MALLOC)(*self._malloc_args(out, max(nbytes, 1)))
        if rc:
            raise self.status.oom_error(abs(rc), self.MALLOC, nbytes, f"{self.name}:{index}",
                                        lambda: self._mem_info(index))
        return int(self._cast("uintptr_t", out[0]))

    def _free(self, index: int, handle: Any) -> None:
        self._use(index)
        self._call(self.FREE, self._cast("void *", handle))

    # -- copies ---------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        self._use(index)
        cast = self._cast
        if kind == H2D:
            d, s = cast("void *", dst + dst_off), self._from_buffer(src) + src_off
        elif kind == D2H:
            d, s = self._from_buffer(dst) + dst_off, cast("void *", src + src_off)
        elif kind == D2D:
            d, s = cast("void *", dst + dst_off), cast("void *", src + src_off)
        else:
            raise DeviceError(f"unknown copy kind {kind!r}", backend=self.name)
        if self.copy_dest_max:
            rc = self._memcpy_async(d, nbytes, s, nbytes, self.copy_kinds[kind], stream)
        else:
            rc = self._memcpy_async(d, s, nbytes, self.copy_kinds[kind], stream)
        if rc:
            raise self.status.error(rc, self.MEMCPY_ASYNC)

    # -- streams --------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        return self.ffi.NULL

    def _new_stream(self) -> Any:
        """A new stream of the current device (the vendor's STREAM_CREATE)."""
        return self._out(self.stream_type, self.STREAM_CREATE)

    def _stream_create(self, index: int) -> Any:
        self._use(index)
        stream = self._new_stream()
        with self._peer_lock:
            self._streams.setdefault(index, set()).add(stream)
        return stream

    def _stream_destroy(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call(self.STREAM_DESTROY, stream)
        with self._peer_lock:
            self._streams.get(index, set()).discard(stream)

    def _device_streams(self, index: int) -> list:
        """The default stream and the live streams this plugin created on ``index``."""
        with self._peer_lock:
            return [self.ffi.NULL, *self._streams.get(index, ())]

    def _stream_done(self, stream: Any) -> bool:
        """Whether the stream's work is complete (the vendor's query)."""
        raise NotImplementedError

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._use(index)
        timed = self._timed_stream_wait
        if timed is None:
            self._wait(None, stream, self._stream_done)
        else:                           # the hot path of every synchronous copy, inlined
            while timed(stream, WAIT_SLICE_MS) == SIM_E_TIMEOUT:
                pass
        rc = self._sync_stream(stream)
        if rc:
            raise self.status.error(rc, self.STREAM_SYNCHRONIZE)

    def _stream_query(self, index: int, stream: Any) -> bool:
        self._use(index)
        return self._stream_done(stream)

    def _stream_done_by_event(self, stream: Any) -> bool:
        """Stream query for runtimes without one: record an event and ask it."""
        ev = self._out(self.event_type, self.EVENT_CREATE)
        try:
            self._call(self.EVENT_RECORD, ev, stream)
            return self._event_done(ev)
        finally:
            self._call(self.EVENT_DESTROY, ev)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        self._call(self.STREAM_WAIT_EVENT, stream, event)

    # -- events ---------------------------------------------------------
    def _event_create(self, index: int) -> Any:
        self._use(index)
        return self._out(self.event_type, self.EVENT_CREATE)

    def _event_destroy(self, index: int, event: Any) -> None:
        self._use(index)
        self._call(self.EVENT_DESTROY, event)

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._use(index)
        self._call(self.EVENT_RECORD, event, stream)

    def _event_done(self, event: Any) -> bool:
        """Whether the event's recorded work is complete (the vendor's query)."""
        raise NotImplementedError

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._use(index)
        self._wait(self._timed_event_wait, event, self._event_done)
        self._call(self.EVENT_SYNCHRONIZE, event)

    def _event_query(self, index: int, event: Any) -> bool:
        self._use(index)
        return self._event_done(event)

    def _event_wait(self, index: int, event: Any, seconds: float) -> bool:
        if self._timed_event_wait is None:
            return super()._event_wait(index, event, seconds)
        self._use(index)
        if self._timed_event_wait(event, int(min(seconds, 3600.0) * 1000)) == SIM_E_TIMEOUT:
            return False
        self._call(self.EVENT_SYNCHRONIZE, event)        # complete: a failure of its work raises here
        return True

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        self._use(index)
        ms = self.ffi.new("float *")
        self._call(self.EVENT_ELAPSED, ms, start, end)
        return float(ms[0])

    def _synchronize(self, index: int) -> None:
        self._use(index)
        if self._timed_device_wait is not None:
            while self._timed_device_wait(WAIT_SLICE_MS) == SIM_E_TIMEOUT:
                pass
        else:                                   # wait where Ctrl-C can interrupt: on each stream
            for stream in self._device_streams(index):
                self._wait(None, stream, self._stream_done)
        if self.DEVICE_SYNCHRONIZE:
            self._call(self.DEVICE_SYNCHRONIZE)
            return
        for stream in self._device_streams(index):    # a runtime without device synchronize
            self._stream_synchronize(index, stream)

    def _mem_info_call(self, name: str, *args: Any) -> tuple[int, int]:
        """(free, total) from ``name(*args, &free, &total)``."""
        free = self.ffi.new("size_t *")
        total = self.ffi.new("size_t *")
        self._call(name, *args, free, total)
        return int(free[0]), int(total[0])

    def _enable_peer(self, src_index: int, dst_index: int, name: str, already: int | None = None) -> None:
        """Enable access from ``src_index`` (current) to ``dst_index`` once per pair;
        ``already`` is the vendor's "already enabled" code, which is not an error."""
        pair = (src_index, dst_index)
        if src_index == dst_index or pair in self._peers:
            return
        with self._peer_lock:
            rc = self._fn(name)(dst_index, 0)
            if rc and rc != already:
                raise self.status.error(rc, f"{name}({dst_index})")
            self._peers.add(pair)

    # -- simulator controls ------------------------------------------------
    def _sim_only(self, what: str) -> None:
        if not self.simulated:
            raise UnsupportedError(f"{what} exists only on the simulator; {self.name} runs on {self.library_path}")

    def _sim_call(self, what: str, name: str, *args: Any) -> None:
        """Call a simulator control (it returns the simulator's own status)."""
        self._sim_only(what)
        if self._fn(name)(*args):
            raise DeviceError(f"{what} failed: {self._detail()}", backend=self.name)

    def sim_hold_stream(self, index: int, stream: Any) -> None:
        """Stop ``stream`` from starting queued work until :meth:`sim_release_stream`
        (simulator only): queued work stays pending, so "not ready" is deterministic."""
        self._sim_only("sim_hold_stream")
        self._use(index)
        self._sim_call("sim_hold_stream", "anychip_sim_stream_hold", stream)

    def sim_release_stream(self, index: int, stream: Any) -> None:
        """Let a held stream run its queued work again (simulator only)."""
        self._sim_only("sim_release_stream")
        self._use(index)
        self._sim_call("sim_release_stream", "anychip_sim_stream_release", stream)

    def sim_ipc_handle(self, handle: int) -> bytes:
        """A 64-byte handle another process can open with :meth:`sim_ipc_open` (simulator only)."""
        self._sim_only("sim_ipc_handle")
        h = self.ffi.new("anychip_sim_ipc_handle *")
        self._sim_call("sim_ipc_handle", "anychip_sim_ipc_get_handle", self.ffi.cast("void *", handle), h)
        return bytes(self.ffi.buffer(h))

    def sim_ipc_open(self, blob: bytes) -> int:
        """Map an allocation exported by another process; returns its address here (simulator only)."""
        self._sim_only("sim_ipc_open")
        h = self.ffi.new("anychip_sim_ipc_handle *")
        self.ffi.memmove(h, blob, self.ffi.sizeof("anychip_sim_ipc_handle"))
        out = self.ffi.new("void **")
        self._sim_call("sim_ipc_open", "anychip_sim_ipc_open", h, out)
        return int(self.ffi.cast("uintptr_t", out[0]))

    def sim_ipc_close(self, address: int) -> None:
        self._sim_call("sim_ipc_close", "anychip_sim_ipc_close", self.ffi.cast("void *", address))
