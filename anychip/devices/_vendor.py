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
from typing import Any, ClassVar

from ..runtime._libs import find_library
from ..runtime.errors import DeviceError, OutOfMemoryError, UnsupportedError
from ..runtime.plugin import DevicePlugin

__all__ = ["VendorPlugin", "simulate_mode", "find_vendor_library", "roots", "SIM_CDEF"]

log = logging.getLogger("anychip")

SIMULATE_ENV = "ANYCHIP_SIMULATE"
_MODES = ("auto", "always", "never")

#: declarations of the simulator's own controls (see csrc/sim/core.h)
SIM_CDEF = """
typedef struct anychip_sim_ipc_handle {
    uint32_t magic; uint32_t version; int32_t pid; int32_t fd; int32_t device; int32_t reserved0;
    uint64_t offset; uint64_t size; uint64_t alloc_id; uint8_t reserved[16];
} anychip_sim_ipc_handle;
int anychip_sim_stream_hold(void *stream);
int anychip_sim_stream_release(void *stream);
int anychip_sim_stream_enqueue_host_fn(void *stream, void (*fn)(void *), void *arg);
const char *anychip_sim_last_error(void);
const char *anychip_sim_status_string(int status);
int anychip_sim_config(int *physical_devices, int *visible_devices, uint64_t *capacity);
int anychip_sim_physical_device(int logical);
int anychip_sim_ipc_get_handle(const void *devptr, anychip_sim_ipc_handle *handle);
int anychip_sim_ipc_open(const anychip_sim_ipc_handle *handle, void **devptr);
int anychip_sim_ipc_open_fd(int fd, const anychip_sim_ipc_handle *handle, void **devptr);
int anychip_sim_ipc_close(void *devptr);
"""

_announced: set[str] = set()
_announce_lock = threading.Lock()


def simulate_mode() -> str:
    """The value of ``ANYCHIP_SIMULATE``: ``auto`` (default), ``always`` or ``never``."""
    raw = os.environ.get(SIMULATE_ENV, "").strip().lower()
    if not raw:
        return "auto"
    if raw not in _MODES:
        raise ValueError(f"{SIMULATE_ENV}={os.environ.get(SIMULATE_ENV)!r} is not one of {', '.join(_MODES)}")
    return raw


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


class _ThreadState(threading.local):
    dev = -1          # the device last made current on this thread through this library


_thread_states: dict[str, _ThreadState] = {}


def _thread_state(path: str) -> _ThreadState:
    """One per loaded library: plugin instances over the same library share the current device."""
    with _announce_lock:
        return _thread_states.setdefault(os.path.realpath(path), _ThreadState())


class VendorPlugin(DevicePlugin):
    """Base of the cffi vendor backends: library discovery, loading, the per-thread
    current device, and translation of status codes into anychip errors."""

    api_version = (1, 0)

    #: the vendor's library file names, in order of preference
    vendor_libraries: ClassVar[tuple[str, ...]] = ()
    #: the simulator library built from csrc/sim (anychip/_lib/<name>.*.so)
    simulator_library: ClassVar[str] = ""
    #: the vendor API in words ("Ascend ACL runtime")
    api_label: ClassVar[str] = ""
    #: cffi declarations of the vendor API (SIM_CDEF is appended)
    cdef: ClassVar[str] = ""
    #: status code -> the vendor's name for it
    code_names: ClassVar[dict[int, str]] = {}
    #: status codes meaning "out of device memory"
    oom_codes: ClassVar[frozenset[int]] = frozenset()

    def __init__(self) -> None:
        self._state: tuple[bool, str] | None = None
        self._load_lock = threading.Lock()
        self._tls = _ThreadState()
        self.ffi: Any = None
        self.lib: Any = None
        self.library_path: str | None = None
        self.simulated = False
        self._count = 0

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
            mode = simulate_mode()
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
                lib = ffi.dlopen(path)
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
        ffi.cdef(self.cdef + SIM_CDEF)
        lib = ffi.dlopen(sim)
        ok, reason = self._finish(ffi, lib, sim, simulated=True)
        if ok and mode == "auto":
            reason += f" ({failure or names + ' not found'})"
        return ok, reason

    def _finish(self, ffi: Any, lib: Any, path: str, simulated: bool) -> tuple[bool, str]:
        self.ffi, self.lib, self.library_path, self.simulated = ffi, lib, path, simulated
        self._tls = _thread_state(path)
        self._count = self._open()
        self._bind()
        kind = f"simulated {self.api_label}" if simulated else self.api_label
        if simulated:
            with _announce_lock:
                if self.name not in _announced:
                    _announced.add(self.name)
                    log.info("%s: using the simulator %s in place of %s", self.name, path,
                             " / ".join(self.vendor_libraries))
        return True, f"{kind} ({path}); {self._count} device(s)"

    def _open(self) -> int:
        """Initialize the library and return the device count."""
        raise NotImplementedError

    def _bind(self) -> None:
        """Cache bound functions on self (hot paths avoid attribute lookups on lib)."""

    def device_count(self) -> int:
        ok, _ = self.available()
        return self._count if ok else 0

    # -- helpers ----------------------------------------------------------
    def _use(self, index: int) -> None:
        """Make ``index`` the current device of this thread (only when it is not already)."""
        if self._tls.dev != index:
            self._set_device(index)
            self._tls.dev = index

    def _set_device(self, index: int) -> None:
        raise NotImplementedError

    def _sym(self, name: str) -> Any:
        """A function of the loaded library, or None when the library lacks it."""
        try:
            return getattr(self.lib, name)
        except (AttributeError, NotImplementedError):
            return None

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

    def _error(self, code: int, what: str) -> DeviceError:
        return DeviceError(f"{what} failed: {self._message(code)}", backend=self.name, code=code,
                           code_name=self.code_name(code))

    def _oom(self, code: int, index: int, nbytes: int, what: str) -> DeviceError:
        msg = self._message(code)
        if code not in self.oom_codes:
            return DeviceError(f"{what} of {nbytes} bytes failed: {msg}", backend=self.name, code=code,
                               code_name=self.code_name(code))
        free = total = None
        try:
            free, total = self._mem_info(index)
        except Exception:  # noqa: BLE001 - the OOM error matters more than the numbers
            pass
        return OutOfMemoryError(nbytes, free, total, backend=self.name, device=f"{self.name}:{index}",
                                code=code, code_name=self.code_name(code), detail=f"{what}: {msg}")

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

    # -- simulator controls ------------------------------------------------
    def _sim_only(self, what: str) -> None:
        if not self.simulated:
            raise UnsupportedError(f"{what} exists only on the simulator; {self.name} runs on {self.library_path}")

    def sim_hold_stream(self, index: int, stream: Any) -> None:
        """Stop ``stream`` from starting queued work until :meth:`sim_release_stream`
        (simulator only): queued work stays pending, so "not ready" is deterministic."""
        self._sim_only("sim_hold_stream")
        self._use(index)
        rc = self.lib.anychip_sim_stream_hold(stream)
        if rc:
            raise DeviceError(f"sim_hold_stream failed: {self._detail()}", backend=self.name)

    def sim_release_stream(self, index: int, stream: Any) -> None:
        """Let a held stream run its queued work again (simulator only)."""
        self._sim_only("sim_release_stream")
        self._use(index)
        rc = self.lib.anychip_sim_stream_release(stream)
        if rc:
            raise DeviceError(f"sim_release_stream failed: {self._detail()}", backend=self.name)

    def sim_ipc_handle(self, handle: int) -> bytes:
        """A 64-byte handle another process can open with :meth:`sim_ipc_open` (simulator only)."""
        self._sim_only("sim_ipc_handle")
        h = self.ffi.new("anychip_sim_ipc_handle *")
        rc = self.lib.anychip_sim_ipc_get_handle(self.ffi.cast("void *", handle), h)
        if rc:
            raise DeviceError(f"sim_ipc_handle failed: {self._detail()}", backend=self.name)
        return bytes(self.ffi.buffer(h))

    def sim_ipc_open(self, blob: bytes) -> int:
        """Map an allocation exported by another process; returns its address here (simulator only)."""
        self._sim_only("sim_ipc_open")
        h = self.ffi.new("anychip_sim_ipc_handle *")
        self.ffi.memmove(h, blob, self.ffi.sizeof("anychip_sim_ipc_handle"))
        out = self.ffi.new("void **")
        rc = self.lib.anychip_sim_ipc_open(h, out)
        if rc:
            raise DeviceError(f"sim_ipc_open failed: {self._detail()}", backend=self.name)
        return int(self.ffi.cast("uintptr_t", out[0]))

    def sim_ipc_close(self, address: int) -> None:
        self._sim_only("sim_ipc_close")
        rc = self.lib.anychip_sim_ipc_close(self.ffi.cast("void *", address))
        if rc:
            raise DeviceError(f"sim_ipc_close failed: {self._detail()}", backend=self.name)
