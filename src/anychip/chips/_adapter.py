"""The built-in chips (ascend, kunlun, hygon): the plugin.h adapters over the vendors' C APIs.

Each chip is reached through one C adapter (csrc/adapters/acl/plugin_acl.c, plugin_xpu.c,
plugin_hip.c), written against the vendor's API only (ACL + HCCL, XPU + BKCL, HIP + RCCL)
and loaded by the same loader as a vendor's C plugin (chips/cplugin.py). It is the code
PyTorch (anychip.torch) and Paddle (the bridge) run too, so what ``anychip conformance
--device ascend`` certifies is what the frameworks run.

Discovery picks which library answers the adapter's calls:

* the vendor's own runtime, when ``ANYCHIP_SIMULATE`` allows (``auto``, the default, or
  ``never``) and it is found (the install roots the vendor's variables name, the usual
  install paths, then ``LD_LIBRARY_PATH``): the runtime and its collective library are
  opened with global symbols, and the adapter built without the simulator's extensions
  (``anychip/_lib/libanychip_acl`` ...) binds to them;
* otherwise, unless ``ANYCHIP_SIMULATE=never``, the simulator library (csrc/sim), which
  implements the same vendor API with the adapter compiled in.

The vendors' visibility variables (``ASCEND_RT_VISIBLE_DEVICES``, ``XPU_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``) are the runtime's to read, as on a real chip.

On the simulator, GEMM of float32 / float64 calls the CBLAS bundled with NumPy when it is
found (handed to the simulator once, as a chip's runtime links its BLAS library); otherwise
a loop in C runs it.

On the simulator the backend also offers the simulator's controls (anychip/sim.h: holding
a stream, IPC handles, timed waits that Ctrl-C interrupts); they are never vendor API.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading
import weakref
from typing import Any, ClassVar

from ..runtime._libs import dlopen, find_library, new_ffi
from ..runtime.env import simulate
from ..runtime.errors import DeviceError, PluginError, UnsupportedError
from ..runtime.status import StatusCodes
from . import cplugin
from ._headers import cdef_of

__all__ = ["VendorAdapter", "find_vendor_library", "roots"]

log = logging.getLogger("anychip")

SIMULATE_ENV = "ANYCHIP_SIMULATE"
#: the simulator's status for a timed wait that ran out (ANYCHIP_SIM_E_TIMEOUT in anychip/sim.h)
SIM_E_TIMEOUT = 18
#: longest time a wait stays in C: Python runs signal handlers (Ctrl-C) between slices
WAIT_SLICE_MS = 50

_announced: set[str] = set()
_blas_lock = threading.Lock()
_blas_given: dict[str, tuple[Any, Any]] = {}      # simulator library -> the (BLAS, simulator) kept open
_sim_ffi_lock = threading.Lock()
_sim_ffi: Any = None


def _ld_library_path() -> list[str]:
    return [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]


def find_vendor_library(names: tuple[str, ...], dirs: list[str]) -> tuple[str | None, list[str]]:
    """First ``dir/name`` that exists, searching ``dirs`` then ``LD_LIBRARY_PATH``.

    Returns (path or None, the directories searched, in order, without duplicates)."""
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


def _sim_controls() -> Any:
    """The cffi declarations of the simulator's controls (anychip/sim.h), made once."""
    global _sim_ffi
    with _sim_ffi_lock:
        if _sim_ffi is None:
            ffi = new_ffi()
            ffi.cdef(cdef_of("anychip/sim.h"))
            _sim_ffi = ffi
        return _sim_ffi


def _give_numpy_blas(library: str) -> bool:
    """Hand the simulator ``library`` the CBLAS bundled with NumPy for its float32 / float64
    GEMM (once per library); False where there is none (the simulator runs its own loop)."""
    import numpy as np

    key = os.path.realpath(library)
    with _blas_lock:
        if key in _blas_given:
            return True
        root = os.path.dirname(os.path.dirname(np.__file__))
        found = sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas64_*.so")))
        if not found:
            log.debug("no CBLAS beside NumPy; the simulator's GEMM runs its own loop")
            return False
        try:
            blas, sim = ctypes.CDLL(found[0]), ctypes.CDLL(library)
            sgemm = ctypes.cast(blas.scipy_cblas_sgemm64_, ctypes.c_void_p)
            dgemm = ctypes.cast(blas.scipy_cblas_dgemm64_, ctypes.c_void_p)
            sim.anychip_simk_set_blas.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            sim.anychip_simk_set_blas.restype = None
        except (OSError, AttributeError) as exc:
            log.debug("NumPy's BLAS %s is not usable (%s); the simulator's GEMM runs its own loop", found[0], exc)
            return False
        sim.anychip_simk_set_blas(sgemm, dgemm)
        _blas_given[key] = (blas, sim)
        return True


def _forget_in_child(ref: Any) -> None:
    plugin = ref()
    if plugin is not None:
        plugin._after_fork_in_child()


class VendorAdapter(cplugin.CPlugin):
    """A built-in chip: its vendor library found, then its plugin.h adapter loaded through
    the C plugin loader. A subclass per chip gives the names and paths below."""

    #: the vendor's runtime library files, in order of preference
    vendor_libraries: ClassVar[tuple[str, ...]] = ()
    #: the vendor's collective library files (beside the runtime, or under ``ccl_roots``)
    ccl_libraries: ClassVar[tuple[str, ...]] = ()
    #: (variables naming install roots, default roots) of the collective library
    ccl_roots: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())
    #: the simulator library built from csrc/sim (anychip/_lib/<name>.*.so)
    simulator_library: ClassVar[str] = ""
    #: the adapter built for the vendor's own libraries (anychip/_lib/<name>.*.so)
    adapter_library: ClassVar[str] = ""
    #: the vendor's collective library in words ("HCCL"): the native transport's name
    ccl_api: ClassVar[str] = ""
    #: the vendor API in words ("Ascend ACL runtime")
    api_label: ClassVar[str] = ""
    #: status code -> the vendor's name for it (read from the vendor headers)
    code_names: ClassVar[dict[int, str]] = {}
    #: the collective library's codes for bad arguments (raised as InvalidArgumentError)
    ccl_invalid_codes: ClassVar[frozenset[int]] = frozenset()
    #: codes meaning "out of device memory" besides the table's oom_status
    oom_codes: ClassVar[frozenset[int]] = frozenset()

    def __init__(self) -> None:              # the library is found and loaded by available()
        self._state: tuple[bool, str] | None = None
        self._load_lock = threading.Lock()
        self.t: Any = None
        self.library_path: str | None = None
        self.ccl_path: str | None = None
        self.simulated = False
        self._sim: Any = None
        self._forked = False
        self._count: int | None = None

    # -- discovery ------------------------------------------------------------------
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
                        self.t = None
                        self._state = (False, f"{type(exc).__name__}: {exc}")
                state = self._state
        if state[0] and self._forked:
            return cplugin.CPlugin.available(self)
        return state

    def _load(self) -> tuple[bool, str]:
        try:
            mode = simulate()
        except ValueError as exc:
            return False, str(exc)
        names = " or ".join(self.vendor_libraries)
        path: str | None = None
        searched: list[str] = []
        failure = ""
        if mode != "always":
            path, searched = find_vendor_library(self.vendor_libraries, self.search_dirs())
        if path is not None:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as exc:
                failure = f"{path} could not be loaded ({exc})"
            else:
                try:
                    return self._open_vendor(path)
                except Exception as exc:  # noqa: BLE001 - reported as the reason
                    self.t = None
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
        ok, reason = self._open(sim, sim, simulated=True)
        if ok and mode == "auto":
            reason += f" ({failure or names + ' not found'})"
        if ok and self.name not in _announced:
            _announced.add(self.name)
            log.info("%s: using the simulator %s in place of %s", self.name, sim, " / ".join(self.vendor_libraries))
        return ok, reason

    def _open_vendor(self, runtime: str) -> tuple[bool, str]:
        """The adapter over the vendor's runtime at ``runtime`` (already opened with global
        symbols) and its collective library."""
        dirs = [os.path.dirname(runtime), *self.search_dirs(), *roots(*self.ccl_roots)]
        ccl, searched = find_vendor_library(self.ccl_libraries, dirs)
        if ccl is not None:
            ctypes.CDLL(ccl, mode=ctypes.RTLD_GLOBAL)
        adapter = find_library(self.adapter_library)
        if adapter is None:
            raise PluginError(f"the adapter library {self.adapter_library} is not built (run `pip install -e .`)")
        try:
            ok, reason = self._open(adapter, runtime, simulated=False)
        except PluginError as exc:
            if ccl is None:                  # the runtime alone lacks the collective symbols
                raise PluginError(f"{exc} ({' or '.join(self.ccl_libraries)} not found: searched "
                                  f"{', '.join(searched)})") from None
            raise
        self.ccl_path = ccl or runtime
        return ok, reason

    def _open(self, adapter: str, library: str, simulated: bool) -> tuple[bool, str]:
        name, ffi, lib, table, space = cplugin.open_table(adapter)
        if name != self.name:
            raise PluginError(f"{adapter} is the adapter of {name!r}, not of {self.name!r}")
        cplugin.CPlugin.__init__(self, adapter, ffi, lib, table)
        self._table_space = space
        self.simulated, self.library_path = simulated, library
        if simulated:
            self.ccl_path = library
            self._sim = dlopen(_sim_controls(), library)
            _give_numpy_blas(library)
            # the simulator gives a forked child fresh devices: this object forgets the parent's
            # streams there (also where no registry hands it the fork, as for a plugin made directly)
            me = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: _forget_in_child(me))
        #: the adapter's codes, named as the vendor's headers name them
        self.status = StatusCodes(self.name, name=self.code_name, text=self._text, not_ready=self.status.not_ready,
                                  oom=self.status.oom | self.oom_codes)
        n = cplugin.CPlugin.device_count(self)
        why = self._last_error() if n == 0 else ""      # e.g. a visibility variable the runtime rejected
        note = f" ({why})" if why else ""
        kind = f"simulated {self.api_label}" if simulated else self.api_label
        return True, f"{kind} ({library}); {n} device(s){note}"

    def code_name(self, code: int) -> str:
        return self.code_names.get(code, f"status {code}")

    def _last_error(self) -> str:
        t, ffi = self.t, self.ffi
        p = t.get_last_error() if t.get_last_error != ffi.NULL else ffi.NULL
        return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""

    def device_count(self) -> int:
        if not self.available()[0] or self.t is None:
            return 0
        return cplugin.CPlugin.device_count(self)

    def properties(self, index: int) -> dict:
        props = cplugin.CPlugin.properties(self, index)
        props.update(library=self.library_path, api=self.api_label, adapter=self.path)
        if self.simulated:
            props["physical_index"] = int(self._sim.anychip_sim_physical_device(index))
        return props

    @property
    def kernels(self) -> Any:
        return cplugin.CPlugin.kernels.fget(self) if self.t is not None else None  # type: ignore[attr-defined]

    def native_ccl(self) -> Any:
        return cplugin.CPlugin.native_ccl(self) if self.available()[0] else None

    def native_ccl_problem(self) -> str:
        ok, why = self.available()
        if not ok:
            return why
        return self.collectives_problem() or "ANYCHIP_COLLECTIVE_CHECK=1: the host transport checks every op"

    # -- waits on the simulator: in slices, so that Ctrl-C interrupts them -----------------
    def _sim_wait(self, fn: Any, *args: Any) -> None:
        while fn(*args, WAIT_SLICE_MS) == SIM_E_TIMEOUT:
            pass

    def _handle(self, handle: Any) -> Any:
        """A stream or event of the adapter as the simulator's controls take it."""
        return _sim_controls().cast("void *", int(self.ffi.cast("uintptr_t", handle)))

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        if self._sim is None:
            return cplugin.CPlugin._stream_synchronize(self, index, stream)
        self._use(index)
        self._sim_wait(self._sim.anychip_sim_stream_wait, self._handle(stream))
        self._call("stream_synchronize", index, stream)

    def _event_synchronize(self, index: int, event: Any) -> None:
        if self._sim is None:
            return cplugin.CPlugin._event_synchronize(self, index, event)
        self._use(index)
        self._sim_wait(self._sim.anychip_sim_event_wait, self._handle(event))
        self._call("event_synchronize", index, event)

    def _event_wait(self, index: int, event: Any, seconds: float) -> bool:
        if self._sim is None:
            return cplugin.CPlugin._event_wait(self, index, event, seconds)
        self._use(index)
        if self._sim.anychip_sim_event_wait(self._handle(event), int(min(seconds, 3600.0) * 1000)) == SIM_E_TIMEOUT:
            return False
        self._call("event_synchronize", index, event)    # complete: a failure of its work raises here
        return True

    def _synchronize(self, index: int) -> None:
        if self._sim is not None:
            self._use(index)
            self._sim_wait(self._sim.anychip_sim_device_wait)
        cplugin.CPlugin._synchronize(self, index)

    def _after_fork_in_child(self) -> None:
        if self._sim is None:
            cplugin.CPlugin._after_fork_in_child(self)
            return
        # the simulator gives the child fresh devices: forget the parent's streams, which
        # device this thread had made current, and locks other threads may have held
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        self._tls = cplugin._Tls()
        self._defaults, self._streams = {}, {}
        if self._ccl is not None:
            self._ccl._tls = cplugin._Tls()

    # -- simulator controls ----------------------------------------------------------------
    @property
    def sim_ffi(self) -> Any:
        """The cffi declarations of the simulator's controls (anychip/sim.h)."""
        return _sim_controls()

    @property
    def sim_lib(self) -> Any:
        """The simulator library's controls, or None on a vendor's library."""
        return self._sim

    def sim_handle(self, handle: Any) -> Any:
        """A stream or event of the backend as the simulator's controls take it."""
        return self._handle(handle)

    def sim_detail(self) -> str:
        """The simulator's description of the calling thread's last failure."""
        p = self._sim.anychip_sim_last_error() if self._sim is not None else None
        return _sim_controls().string(p).decode("utf-8", "replace") if p else ""

    def _sim_only(self, what: str) -> None:
        if not self.simulated or self._sim is None:
            raise UnsupportedError(f"{what} exists only on the simulator; {self.name} runs on {self.library_path}")

    def _sim_call(self, what: str, status: int) -> None:
        if status:
            raise DeviceError(f"{what} failed: {self.sim_detail()}", backend=self.name)

    def sim_hold_stream(self, index: int, stream: Any) -> None:
        """Stop ``stream`` from starting queued work until :meth:`sim_release_stream`
        (simulator only): queued work stays pending, so "not ready" is deterministic."""
        self._sim_only("sim_hold_stream")
        self._use(index)
        self._sim_call("sim_hold_stream", self._sim.anychip_sim_stream_hold(self._handle(stream)))

    def sim_release_stream(self, index: int, stream: Any) -> None:
        """Let a held stream run its queued work again (simulator only)."""
        self._sim_only("sim_release_stream")
        self._use(index)
        self._sim_call("sim_release_stream", self._sim.anychip_sim_stream_release(self._handle(stream)))

    def sim_ipc_handle(self, handle: int) -> bytes:
        """A 64-byte handle another process can open with :meth:`sim_ipc_open` (simulator only)."""
        self._sim_only("sim_ipc_handle")
        ffi = _sim_controls()
        h = ffi.new("anychip_sim_ipc_handle *")
        self._sim_call("sim_ipc_handle", self._sim.anychip_sim_ipc_get_handle(ffi.cast("void *", handle), h))
        return bytes(ffi.buffer(h))

    def sim_ipc_open(self, blob: bytes) -> int:
        """Map an allocation exported by another process; returns its address here (simulator only)."""
        self._sim_only("sim_ipc_open")
        ffi = _sim_controls()
        h = ffi.new("anychip_sim_ipc_handle *")
        ffi.memmove(h, blob, ffi.sizeof("anychip_sim_ipc_handle"))
        out = ffi.new("void **")
        self._sim_call("sim_ipc_open", self._sim.anychip_sim_ipc_open(h, out))
        return int(ffi.cast("uintptr_t", out[0]))

    def sim_ipc_close(self, address: int) -> None:
        self._sim_only("sim_ipc_close")
        self._sim_call("sim_ipc_close", self._sim.anychip_sim_ipc_close(_sim_controls().cast("void *", address)))
