"""The OpenCL devices: discovery, properties, contexts, fork handling, and the translation
of pyopencl's errors (OpenCL status codes) into anychip's errors."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...runtime.errors import DeviceError, OutOfMemoryError, UnsupportedError
from ...runtime.plugin import DevicePlugin

__all__ = ["FORK_REASON", "OpenCLDevice", "cl_code_name"]

log = logging.getLogger("anychip")

_NO_PLATFORM_HINT = "install an ICD such as Debian's pocl-opencl-icd"

# Status codes whose failure means "no room"; used when pyopencl cannot name a code.
_CL_CODE_NAMES = {
    0: "CL_SUCCESS",
    -1: "CL_DEVICE_NOT_FOUND",
    -2: "CL_DEVICE_NOT_AVAILABLE",
    -3: "CL_COMPILER_NOT_AVAILABLE",
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE",
    -5: "CL_OUT_OF_RESOURCES",
    -6: "CL_OUT_OF_HOST_MEMORY",
    -7: "CL_PROFILING_INFO_NOT_AVAILABLE",
    -11: "CL_BUILD_PROGRAM_FAILURE",
    -14: "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
    -30: "CL_INVALID_VALUE",
    -33: "CL_INVALID_DEVICE",
    -34: "CL_INVALID_CONTEXT",
    -36: "CL_INVALID_COMMAND_QUEUE",
    -38: "CL_INVALID_MEM_OBJECT",
    -54: "CL_INVALID_WORK_GROUP_SIZE",
    -58: "CL_INVALID_EVENT",
    -61: "CL_INVALID_BUFFER_SIZE",
    -1001: "CL_PLATFORM_NOT_FOUND_KHR",
}
_CL_ALLOCATION_FAILURE = -4
_CL_OUT_OF_RESOURCES = -5
_CL_OUT_OF_HOST_MEMORY = -6
_CL_INVALID_BUFFER_SIZE = -61
_OOM_CODES = (_CL_ALLOCATION_FAILURE, _CL_OUT_OF_RESOURCES, _CL_OUT_OF_HOST_MEMORY)


FORK_REASON = (
    "OpenCL was initialized in the parent process before fork(), and an OpenCL platform cannot be used "
    "in a forked child (the driver's threads stay in the parent, so the first wait would hang); start "
    "worker processes with the 'spawn' start method: multiprocessing.get_context('spawn') or "
    "multiprocessing.set_start_method('spawn')")

#: OpenCL objects a forked child inherited; never released there (see _after_fork_in_child)
_FORK_LEFTOVERS: list[Any] = []
_FORK_LEFTOVERS_PINNED: list[bool] = []


def cl_code_name(code: int | None) -> str | None:
    """The OpenCL name of a status code (``-4`` -> ``"CL_MEM_OBJECT_ALLOCATION_FAILURE"``)."""
    if code is None:
        return None
    try:
        import pyopencl as cl

        return "CL_" + cl.status_code.to_string(code)  # type: ignore[operator, unused-ignore]  # stubs: a constant
    except (ImportError, ValueError, AttributeError):
        return _CL_CODE_NAMES.get(code, f"CL_STATUS_{code}")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


class _DeviceState:
    """Per-device lazily created context, default queue, kernels and accounting."""

    def __init__(self, cl_device: Any, platform_index: int, device_in_platform: int) -> None:
        self.device = cl_device
        self.platform_index = platform_index
        self.device_in_platform = device_in_platform
        self.context: Any = None
        self.default: Any = None
        self.touch_queue: Any = None
        self.streams: weakref.WeakSet[Any] = weakref.WeakSet()
        self.allocated = 0
        self.live: set[int] = set()             # id() of every buffer not released yet
        self.lock = threading.RLock()
        self.program: Any = None
        self.local_sizes: dict[str, int] = {}
        self.kernels: dict[str, Any] = {}
        self.kernel_locks: dict[str, threading.Lock] = {}


class OpenCLDevice(DevicePlugin):
    """Devices and their state; the streams, memory, events and kernels build on it."""

    def __init__(self) -> None:
        self._cl: Any = None
        self._states: list[_DeviceState] | None = None
        self._reason = "not probed"
        self._forked = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ identity
    def _probe(self) -> None:
        """Import pyopencl and list devices once; sets ``_states`` or ``_reason``."""
        with self._lock:
            if self._states is not None:
                return
            try:
                import pyopencl as cl
            except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install (OSError...)
                self._reason = f"pyopencl is not importable ({type(exc).__name__}: {exc}); pip install pyopencl"
                return
            try:
                platforms = cl.get_platforms()
            except Exception as exc:  # noqa: BLE001 - CL_PLATFORM_NOT_FOUND_KHR, or a broken ICD
                code = getattr(exc, "code", None)
                self._reason = (f"pyopencl found no OpenCL platform ({cl_code_name(code) or exc}); "
                                f"{_NO_PLATFORM_HINT}")
                return
            states: list[_DeviceState] = []
            for p_index, platform in enumerate(platforms):
                try:
                    devices = platform.get_devices()
                except Exception as exc:  # noqa: BLE001 - CL_DEVICE_NOT_FOUND on an empty platform
                    log.debug("OpenCL platform %r lists no devices: %s", getattr(platform, "name", "?"), exc)
                    continue
                states.extend(_DeviceState(d, p_index, i) for i, d in enumerate(devices))
            if not platforms:
                self._reason = f"pyopencl found no OpenCL platform; {_NO_PLATFORM_HINT}"
                return
            if not states:
                names = ", ".join(p.name for p in platforms)
                self._reason = f"the OpenCL platforms ({names}) list no devices"
                return
            self._cl = cl
            self._states = states

    def _after_fork_in_child(self) -> None:
        # An OpenCL platform does not survive fork(): PoCL's (and GPU drivers') worker
        # threads stay in the parent, so the first wait in the child would hang, even
        # on a context created afresh. Refuse OpenCL in the child instead, with the fix.
        self._lock = threading.Lock()
        if self._cl is None:
            return                       # never initialized here: the child may probe it itself
        self._forked = True
        for st in self._states or ():
            st.lock = threading.RLock()
            # the parent's objects must never be released in the child (pyopencl's
            # destructors wait on the dead platform): keep them for the process' life
            _FORK_LEFTOVERS.append((st.context, st.default, st.touch_queue, list(st.streams), st.program))
            for stream in list(st.streams):
                _FORK_LEFTOVERS.append((stream.queue, stream.last, list(stream.pending)))
            _FORK_LEFTOVERS.append(dict(st.kernels))
        # A module-level list is still freed when the interpreter clears its modules at
        # exit, and freeing a parent's NannyEvent waits in clWaitForEvents (a command
        # queue's release in clFinish) for work only the parent's threads could run: the
        # child hung in its exit. One reference that is never dropped keeps the list,
        # and so every object in it, out of the child's teardown.
        if not _FORK_LEFTOVERS_PINNED:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(_FORK_LEFTOVERS))
            _FORK_LEFTOVERS_PINNED.append(True)

    def available(self) -> tuple[bool, str]:
        if self._forked:
            return False, FORK_REASON
        try:
            self._probe()
        except Exception as exc:  # noqa: BLE001 - available() never raises
            return False, f"OpenCL probe failed: {type(exc).__name__}: {exc}"
        if self._states is None:
            return False, self._reason
        descs = []
        for st in self._states:
            d = st.device
            descs.append(f"{d.platform.name.strip()} / {d.name.strip()}")
        n = len(self._states)
        # OpenCL on the host CPU only (PoCL) ranks with the host backends, after simulated chips
        cpu = self._cl.device_type.CPU
        self.accelerator = any(not (st.device.type & cpu) for st in self._states)
        return True, f"{n} OpenCL device{'s' if n != 1 else ''}: " + "; ".join(descs)

    def device_count(self) -> int:
        self._probe()
        return 0 if self._states is None else len(self._states)

    def _state(self, index: int) -> _DeviceState:
        if self._forked:
            raise UnsupportedError(FORK_REASON)
        self._probe()
        if self._states is None:
            raise UnsupportedError(f"OpenCL is unavailable: {self._reason}")
        return self._states[index]

    def properties(self, index: int) -> dict:
        st = self._state(index)
        cl = self._cl
        d = st.device
        types = []
        for flag, label in ((cl.device_type.CPU, "CPU"), (cl.device_type.GPU, "GPU"),
                            (cl.device_type.ACCELERATOR, "ACCELERATOR")):
            if d.type & flag:
                types.append(label)
        with self._translate("clGetDeviceInfo", index):
            return {
                "name": d.name.strip(),
                "platform": d.platform.name.strip(),
                "platform_version": d.platform.version.strip(),
                "vendor": d.vendor.strip(),
                "version": d.version.strip(),
                "driver_version": d.driver_version.strip(),
                "type": "|".join(types) or "OTHER",
                "total_memory": int(d.global_mem_size),
                "max_alloc": int(d.max_mem_alloc_size),
                "compute_units": int(d.max_compute_units),
                "max_work_group_size": int(d.max_work_group_size),
                "mem_base_addr_align_bytes": int(d.mem_base_addr_align) // 8,
                "fp64": self._has_fp64(d),
                "platform_index": st.platform_index,
                "device_in_platform": st.device_in_platform,
            }

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _has_fp64(d: Any) -> bool:
        try:
            return bool(d.double_fp_config) or "cl_khr_fp64" in d.extensions
        except Exception:  # noqa: BLE001 - CL_INVALID_VALUE on OpenCL 1.0 devices
            return "cl_khr_fp64" in d.extensions

    def _context(self, index: int) -> Any:
        st = self._state(index)
        if st.context is None:
            with st.lock:
                if st.context is None:
                    with self._translate("clCreateContext", index):
                        st.context = self._cl.Context(devices=[st.device])
        return st.context

    @contextmanager
    def _translate(self, what: str, index: int | None = None, requested: int | None = None) -> Iterator[None]:
        """Turn pyopencl errors into anychip errors carrying the OpenCL code name."""
        cl = self._cl
        try:
            yield
        except DeviceError:
            raise
        except Exception as exc:
            if cl is None or not isinstance(exc, cl.Error):
                raise
            raise self._convert(exc, what, index, requested) from exc

    def _convert(self, exc: Any, what: str, index: int | None, requested: int | None) -> DeviceError:
        code = getattr(exc, "code", None)
        if not isinstance(code, int):
            code = None
        name = cl_code_name(code)
        dev = f"opencl:{index}" if index is not None else None
        if code == _CL_ALLOCATION_FAILURE or (requested is not None and code in _OOM_CODES):
            free = total = None
            if index is not None and self._states is not None:
                free, total = self._mem_info(index)
            return OutOfMemoryError(requested or 0, free, total, backend=self.name, device=dev,
                                    code=code, code_name=name, detail=f"{what} failed")
        where = f" on {dev}" if dev else ""
        return DeviceError(f"{what} failed{where}: {exc}", backend=self.name, code=code, code_name=name)


    def _mem_info(self, index: int) -> tuple[int, int]:
        st = self._state(index)
        total = int(st.device.global_mem_size)
        free = total - st.allocated
        try:  # AMD drivers report the real figure (in KiB)
            if "cl_amd_device_attribute_query" in st.device.extensions:
                amd_free = int(st.device.global_free_memory_amd[0]) * 1024
                free = min(free, amd_free)
        except Exception as exc:  # noqa: BLE001 - an optional vendor query
            log.debug("CL_DEVICE_GLOBAL_FREE_MEMORY_AMD failed: %s", exc)
        return max(free, 0), total

    # ------------------------------------------------------------------ copies
