"""OpenCL backend on pyopencl.

Devices
    One anychip device per OpenCL device of every platform: platforms in the
    order ``pyopencl.get_platforms()`` returns them (the ICD loader's order),
    devices in the order each platform lists them (all device types).
    ``opencl:0`` is therefore the first device of the first platform. No
    ``PYOPENCL_CTX`` is needed or read.

Memory
    A raw allocation is one ``cl.Buffer`` segment; the caching allocator
    sub-allocates it by offset, so every copy, fill and kernel takes a byte
    offset into the segment. OpenCL allocates buffers lazily, so ``_malloc``
    runs a one-byte fill to make the allocation real; CPU implementations such
    as PoCL never fail there (Linux over-commits), so this backend also keeps
    its own count of the bytes it holds per device and refuses allocations
    beyond ``CL_DEVICE_GLOBAL_MEM_SIZE``. Single buffers larger than
    ``CL_DEVICE_MAX_MEM_ALLOC_SIZE`` are refused up front.

Streams and events
    A stream is an in-order command queue with profiling enabled. An event is
    a marker enqueued on the queue it is recorded on; waiting on it is a
    barrier with the marker in its wait list; elapsed time comes from the
    markers' profiling timestamps. Every enqueue is followed by a flush so
    work starts at once, as on CUDA.

Host arrays
    pyopencl returns a ``NannyEvent`` for copies that touch host memory; it
    keeps the array alive and its destructor *blocks* until the copy has
    finished. The stream object therefore holds those events until the stream
    is synchronized (or they are seen complete), which keeps copies
    asynchronous.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..runtime._checks import non_negative_int
from ..runtime.errors import (
    DeviceError,
    InvalidArgumentError,
    OutOfMemoryError,
    UnsupportedError,
)
from ..runtime.plugin import D2D, D2H, H2D, DevicePlugin
from ._opencl_tensor import OpenCLTensorKernels

__all__ = ["OpenCLKernels", "OpenCLPlugin", "cl_code_name"]

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


_wait_lib: list[Any] = []      # [clWaitForEvents of the loaded ICD loader, or None]


def _open_wait(names: list[str]) -> Any:
    for name in names:
        try:
            fn = ctypes.CDLL(name).clWaitForEvents
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        return fn
    return None


def _cl_wait_for_events() -> Any:
    """clWaitForEvents of the OpenCL ICD loader pyopencl uses (its wheels bundle one
    under pyopencl/.libs), through ctypes, which releases the GIL during the call and
    takes it back in plain C; None when no loader can be opened."""
    if not _wait_lib:
        import glob

        import pyopencl

        libs = sorted(glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*")))
        fn = _open_wait(libs + ["libOpenCL.so.1"])
        if fn is None:    # find_library runs ldconfig in a child: only where nothing else opened
            found = ctypes.util.find_library("OpenCL")
            fn = _open_wait([found] if found else [])
        _wait_lib.append(fn)
    return _wait_lib[0]


def cl_code_name(code: int | None) -> str | None:
    """The OpenCL name of a status code (``-4`` -> ``"CL_MEM_OBJECT_ALLOCATION_FAILURE"``)."""
    if code is None:
        return None
    try:
        import pyopencl as cl

        return "CL_" + cl.status_code.to_string(code)  # type: ignore[operator]  # pyopencl's stubs call it a constant class
    except (ImportError, ValueError, AttributeError):
        return _CL_CODE_NAMES.get(code, f"CL_STATUS_{code}")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


class _Stream:
    """A stream handle: an in-order, profiling command queue of one device.

    ``last`` is the event of the most recent command (for ``query``);
    ``pending`` holds the ``NannyEvent``s of host copies not yet known complete.
    """

    __slots__ = ("__weakref__", "index", "last", "lock", "pending", "queue")

    def __init__(self, queue: Any, index: int) -> None:
        self.queue = queue
        self.index = index
        self.last: Any = None
        self.pending: list[Any] = []
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<opencl stream of device {self.index}>"


class _Event:
    """An event handle: the marker of its last ``record`` (None before the first)."""

    __slots__ = ("index", "marker", "stream")

    def __init__(self, index: int) -> None:
        self.index = index
        self.marker: Any = None
        self.stream: _Stream | None = None

    def __repr__(self) -> str:
        return f"<opencl event of device {self.index}{' (unrecorded)' if self.marker is None else ''}>"


class _DeviceState:
    """Per-device lazily created context, default queue, kernels and accounting."""

    def __init__(self, cl_device: Any, platform_index: int, device_in_platform: int) -> None:
        self.device = cl_device
        self.platform_index = platform_index
        self.device_in_platform = device_in_platform
        self.context: Any = None
        self.default: _Stream | None = None
        self.touch_queue: Any = None
        self.streams: weakref.WeakSet[_Stream] = weakref.WeakSet()
        self.allocated = 0
        self.live: set[int] = set()             # id() of every buffer not released yet
        self.lock = threading.RLock()
        self.program: Any = None
        self.local_sizes: dict[str, int] = {}
        self.kernels: dict[str, Any] = {}
        self.kernel_locks: dict[str, threading.Lock] = {}


class OpenCLPlugin(DevicePlugin):
    """anychip backend for every OpenCL device pyopencl can see."""

    name = "opencl"
    api_version = (1, 0)
    priority = 10
    accelerator = True

    def __init__(self) -> None:
        self._cl: Any = None
        self._states: list[_DeviceState] | None = None
        self._reason = "not probed"
        self._forked = False
        self._lock = threading.Lock()
        self.kernels = OpenCLKernels(self)

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

    def _after_enqueue(self, stream: _Stream, event: Any, nanny: bool = False) -> None:
        stream.last = event
        if nanny:
            pending = stream.pending
            pending.append(event)  # list.append is atomic; only pruning takes the lock
            if len(pending) % 64 == 0:
                with stream.lock:
                    self._prune(stream)
        stream.queue.flush()

    def _prune(self, stream: _Stream) -> None:
        """Drop NannyEvents already complete (the caller holds ``stream.lock``)."""
        complete = self._cl.command_execution_status.COMPLETE
        pending = stream.pending
        if pending and pending[-1].command_execution_status == complete:
            pending.clear()
            return
        done = 0
        for ev in pending:
            if ev.command_execution_status != complete:
                break
            done += 1
        del pending[:done]

    def _new_stream(self, index: int) -> _Stream:
        cl = self._cl
        ctx = self._context(index)
        st = self._state(index)
        with self._translate("clCreateCommandQueue", index):
            q = cl.CommandQueue(ctx, st.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        s = _Stream(q, index)
        st.streams.add(s)
        return s

    # ------------------------------------------------------------------ memory
    def _malloc(self, index: int, nbytes: int) -> Any:
        st = self._state(index)
        cl = self._cl
        d = st.device
        max_alloc = int(d.max_mem_alloc_size)
        total = int(d.global_mem_size)
        size = max(int(nbytes), 1)  # clCreateBuffer refuses size 0
        if size > max_alloc:
            raise OutOfMemoryError(nbytes, *self._mem_info(index), backend=self.name, device=f"opencl:{index}",
                                   code=_CL_INVALID_BUFFER_SIZE, code_name="CL_INVALID_BUFFER_SIZE",
                                   detail=f"one buffer may hold at most {_mib(max_alloc)} on this device "
                                          f"(CL_DEVICE_MAX_MEM_ALLOC_SIZE)")
        with st.lock:
            if st.allocated + size > total:
                raise OutOfMemoryError(nbytes, max(total - st.allocated, 0), total, backend=self.name,
                                       device=f"opencl:{index}", code=_CL_ALLOCATION_FAILURE,
                                       code_name="CL_MEM_OBJECT_ALLOCATION_FAILURE",
                                       detail=f"anychip already holds {_mib(st.allocated)} of the "
                                              f"{_mib(total)} CL_DEVICE_GLOBAL_MEM_SIZE")
            st.allocated += size
        try:
            ctx = self._context(index)
            with self._translate("clCreateBuffer", index, requested=nbytes):
                buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size)
                # buffers are allocated lazily; touch one byte so a failure shows here. On a
                # queue of its own, so the wait does not queue behind the streams' work.
                if st.touch_queue is None:
                    st.touch_queue = cl.CommandQueue(ctx, st.device)
                cl.enqueue_fill_buffer(st.touch_queue, buf, np.uint8(0), 0, 1).wait()
        except BaseException:
            with st.lock:
                st.allocated -= size
            raise
        with st.lock:
            st.live.add(id(buf))
        return buf

    def _free(self, index: int, handle: Any) -> None:
        st = self._state(index)
        with st.lock:
            if id(handle) not in st.live:
                raise DeviceError(f"free of an OpenCL buffer that is not a live allocation of opencl:{index} "
                                  "(released already?)", backend=self.name)
            st.live.discard(id(handle))
        size = max(int(handle.size), 1)
        with self._translate("clReleaseMemObject", index):
            # OpenCL defers the actual release until enqueued commands using it finish
            handle.release()
        with st.lock:
            st.allocated -= size

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
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int,
              nbytes: int, kind: str, stream: Any) -> None:
        # hot path: no context managers, one dispatch, the bookkeeping inlined
        if nbytes == 0:
            return
        cl = self._cl
        q = stream.queue
        try:
            if kind == H2D:
                host = src[src_off:src_off + nbytes] if (src_off or src.size != nbytes) else src
                ev = cl.enqueue_copy(q, dst, host, dst_offset=dst_off, is_blocking=False)
                nanny = True
            elif kind == D2H:
                host = dst[dst_off:dst_off + nbytes] if (dst_off or dst.size != nbytes) else dst
                ev = cl.enqueue_copy(q, host, src, src_offset=src_off, is_blocking=False)
                nanny = True
            elif kind == D2D:
                ev = cl.enqueue_copy(q, dst, src, src_offset=src_off, dst_offset=dst_off, byte_count=nbytes)
                nanny = False
            else:
                raise InvalidArgumentError(f"unknown copy kind {kind!r}")
            stream.last = ev
            if nanny:
                pending = stream.pending
                pending.append(ev)
                if len(pending) % 64 == 0:
                    with stream.lock:
                        self._prune(stream)
            q.flush()
        except cl.Error as exc:
            what = {H2D: "clEnqueueWriteBuffer", D2H: "clEnqueueReadBuffer"}.get(kind, "clEnqueueCopyBuffer")
            raise self._convert(exc, what, index, nbytes) from exc

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        with self._translate("clEnqueueFillBuffer", index, requested=nbytes):
            ev = self._cl.enqueue_fill_buffer(stream.queue, dst, np.uint8(value), dst_off, nbytes)
        self._after_enqueue(stream, ev)

    # ------------------------------------------------------------------ streams
    def _default_stream(self, index: int) -> Any:
        st = self._state(index)
        if st.default is None:
            s = self._new_stream(index)
            with st.lock:
                if st.default is None:
                    st.default = s
        return st.default

    def _stream_create(self, index: int) -> Any:
        return self._new_stream(index)

    def _stream_destroy(self, index: int, stream: Any) -> None:
        if stream is self._state(index).default:
            return
        self._stream_synchronize(index, stream)
        self._state(index).streams.discard(stream)
        stream.queue = None

    def _wait_for(self, event: Any) -> None:
        """Return once ``event`` is complete (or failed). clFinish / clWaitForEvents
        cannot be interrupted, so this polls the event while yielding the CPU for up to
        100 us (a short copy completes within that), then waits in 50 ms slices for a
        helper thread blocked in clWaitForEvents, so that Ctrl-C raises KeyboardInterrupt
        even when the event never completes."""
        until = time.perf_counter() + 1e-4
        while event.command_execution_status > 0:        # queued, submitted or running
            if time.perf_counter() > until:
                self._wait_blocking(event)
                return
            os.sched_yield()

    @staticmethod
    def _wait_blocking(event: Any) -> None:
        # Not pyopencl's Event.set_callback: it calls back on a detached C++ thread that
        # takes the GIL, and one left waiting by Ctrl-C whose event completed while the
        # interpreter was finalizing aborted the process ("terminate called without an
        # active exception"). A daemon thread in a ctypes call is ended cleanly there.
        wait = _cl_wait_for_events()
        if wait is None:                   # no loader to call: poll
            while event.command_execution_status > 0:
                time.sleep(5e-4)
            return
        done = threading.Event()
        handle = ctypes.c_void_p(event.int_ptr)

        def waiter(keep: Any = event) -> None:    # keep: the event outlives the wait
            wait(1, ctypes.byref(handle))
            done.set()

        threading.Thread(target=waiter, name="anychip-opencl-wait", daemon=True).start()
        while not done.wait(0.05):     # Ctrl-C leaves the thread waiting; it ends with the work
            pass

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        last = stream.last
        try:
            if last is not None:
                self._wait_for(last)
            stream.queue.finish()
        except self._cl.Error as exc:
            raise self._convert(exc, "clFinish", index, None) from exc
        stream.pending.clear()  # every NannyEvent is complete now; dropping them does not block
        if stream.last is not None:
            self._check_last(index, stream)

    def _check_last(self, index: int, stream: _Stream) -> None:
        last = stream.last
        if last is not None:
            status = last.command_execution_status
            if status < 0:
                raise DeviceError(f"a command on a stream of opencl:{index} failed", backend=self.name,
                                  code=status, code_name=cl_code_name(status))

    def _stream_query(self, index: int, stream: Any) -> bool:
        last = stream.last
        if last is None:
            return True
        with self._translate("clGetEventInfo", index):
            status = last.command_execution_status  # every enqueue was already flushed
        if status < 0:
            self._check_last(index, stream)
        if status == self._cl.command_execution_status.COMPLETE:
            with stream.lock:
                if stream.last is last:
                    stream.pending.clear()
                else:
                    self._prune(stream)
            return True
        return False

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        if event.marker is None:
            return
        with self._translate("clEnqueueBarrierWithWaitList", index):
            ev = self._cl.enqueue_barrier(stream.queue, wait_for=[event.marker])
        self._after_enqueue(stream, ev)

    # ------------------------------------------------------------------ events
    def _event_create(self, index: int) -> Any:
        return _Event(index)

    def _event_destroy(self, index: int, event: Any) -> None:
        event.marker = None
        event.stream = None

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        with self._translate("clEnqueueMarkerWithWaitList", index):
            marker = self._cl.enqueue_marker(stream.queue)
        event.marker = marker
        event.stream = stream
        self._after_enqueue(stream, marker)

    def _event_synchronize(self, index: int, event: Any) -> None:
        if event.marker is None:
            return
        with self._translate("clWaitForEvents", index):
            self._wait_for(event.marker)
            event.marker.wait()

    def _event_query(self, index: int, event: Any) -> bool:
        if event.marker is None:
            return True
        with self._translate("clGetEventInfo", index):
            status = event.marker.command_execution_status
        if status < 0:
            raise DeviceError(f"an event of opencl:{index} completed with an error", backend=self.name,
                              code=status, code_name=cl_code_name(status))
        return status == self._cl.command_execution_status.COMPLETE

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        if start.marker is None or end.marker is None:
            raise DeviceError("elapsed time needs two recorded events", backend=self.name)
        if not (self._event_query(index, start) and self._event_query(index, end)):
            raise DeviceError("elapsed time of events that have not completed", backend=self.name,
                              code=-7, code_name="CL_PROFILING_INFO_NOT_AVAILABLE")
        with self._translate("clGetEventProfilingInfo", index):
            return (end.marker.profile.end - start.marker.profile.end) / 1e6

    def _synchronize(self, index: int) -> None:
        st = self._state(index)
        for s in list(st.streams):
            if s.queue is not None:
                self._stream_synchronize(index, s)


# ---------------------------------------------------------------------- kernels

class OpenCLKernels(OpenCLTensorKernels):
    """The kernel set of the OpenCL backend (see docs/opencl.md for the interface).

    Every method takes the device ``index``; buffers as ``(handle, byte_offset)``
    pairs; element counts; dtypes as NumPy dtype names (``"float32"``,
    ``"float64"``, ``"int32"``, ``"int64"``); and an optional ``stream`` of that
    device (an ``anychip.Stream`` or the backend's stream handle; None = the
    default stream). Work is enqueued, not waited for.
    Outputs may alias inputs in the elementwise ops, ``fill`` and ``cast``.
    """

    dtypes: tuple[str, ...] = ("float32", "float64", "int32", "int64")
    binary_ops: tuple[str, ...] = ("add", "sub", "mul", "div")

    def __init__(self, plugin: OpenCLPlugin) -> None:
        self._plugin = plugin

    # -- public interface ----------------------------------------------------
    def supported_dtypes(self, index: int) -> tuple[str, ...]:
        from ._opencl_kernels import dtypes_for

        return dtypes_for(OpenCLPlugin._has_fp64(self._plugin._state(self._index(index)).device))

    def binary(self, index: int, op: str, out: Any, a: Any, b: Any, n: int, dtype: str,
               stream: Any = None) -> None:
        """``out[i] = a[i] <op> b[i]`` for ``i < n``; op in add / sub / mul / div
        (integer div is floor division, ``x // 0 == 0``)."""
        if op not in self.binary_ops:
            raise InvalidArgumentError(f"unknown elementwise op {op!r}; expected one of {self.binary_ops}")
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o, a, b = (self._operand(index, x, n, item, name) for x, name in ((out, "out"), (a, "a"), (b, "b")))
        if n == 0:
            return
        self._launch_1d(index, f"{op}_{dtype}", n, stream,
                        o[0], np.uint64(o[1]), a[0], np.uint64(a[1]), b[0], np.uint64(b[1]), np.uint64(n))

    def add(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "add", out, a, b, n, dtype, stream)

    def sub(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "sub", out, a, b, n, dtype, stream)

    def mul(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "mul", out, a, b, n, dtype, stream)

    def div(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "div", out, a, b, n, dtype, stream)

    def fill(self, index: int, out: Any, n: int, value: Any, dtype: str, stream: Any = None) -> None:
        """``out[i] = value`` for ``i < n`` (value converted with NumPy's rules for ``dtype``)."""
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o = self._operand(index, out, n, item, "out")
        try:
            v = np.dtype(dtype).type(value)
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"fill value {value!r} cannot be a {dtype} ({exc})") from None
        if n == 0:
            return
        self._launch_1d(index, f"fill_{dtype}", n, stream, o[0], np.uint64(o[1]), v, np.uint64(n))

    def cast(self, index: int, out: Any, out_dtype: str, x: Any, in_dtype: str, n: int,
             stream: Any = None) -> None:
        """``out[i] = (out_dtype) x[i]``: C conversion (floats to ints truncate toward
        zero; out-of-range values and NaN give unspecified results, as in NumPy)."""
        o_item, x_item = self._itemsize(out_dtype), self._itemsize(in_dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o = self._operand(index, out, n, o_item, "out")
        x = self._operand(index, x, n, x_item, "x")
        if n == 0:
            return
        if out_dtype == in_dtype:
            s = self._stream(index, stream)
            self._plugin._copy(index, o[0], o[1], x[0], x[1], n * x_item, D2D, s)
            return
        self._launch_1d(index, f"cast_{in_dtype}_to_{out_dtype}", n, stream,
                        o[0], np.uint64(o[1]), x[0], np.uint64(x[1]), np.uint64(n))

    def sum(self, index: int, out: Any, x: Any, n: int, dtype: str, stream: Any = None) -> None:
        """``out[0] = x[0] + ... + x[n-1]``, accumulated in ``dtype`` (integers wrap)
        by a two-pass tree reduction; ``n == 0`` gives 0."""
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        out = self._operand(index, out, 1, item, "out")
        x = self._operand(index, x, n, item, "x")
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, f"sum_{dtype}")
        local = self._local_size(index, f"sum_{dtype}", knl)
        groups = max(1, min(-(-n // local), 4 * local,
                            4 * int(plugin._state(index).device.max_compute_units) * 8))
        scratch = cl.LocalMemory(local * item)
        with plugin._translate("clEnqueueNDRangeKernel(sum)", index), lock:
            if groups == 1:
                ev = cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, out[0], np.uint64(out[1]), x[0], np.uint64(x[1]),
                                       np.uint64(n), scratch), (local,), (local,))
            else:
                partial = cl.Buffer(plugin._context(index), cl.mem_flags.READ_WRITE, groups * item)
                cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, partial, np.uint64(0), x[0], np.uint64(x[1]),
                                       np.uint64(n), scratch), (groups * local,), (local,))
                ev = cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, out[0], np.uint64(out[1]), partial, np.uint64(0),
                                       np.uint64(groups), scratch), (local,), (local,))
                    # OpenCL keeps `partial` alive until the kernels using it have run
        plugin._after_enqueue(s, ev)

    def matmul(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str,
               stream: Any = None) -> None:
        """``out[m, n] = a[m, k] @ b[k, n]``, all row-major and contiguous; products are
        accumulated in ``dtype`` in order of increasing k (no FMA; integers wrap)."""
        item = self._itemsize(dtype)
        m, k, n = non_negative_int(m, "m"), non_negative_int(k, "k"), non_negative_int(n, "n")
        index = self._index(index)
        out = self._operand(index, out, m * n, item, "out")
        a = self._operand(index, a, m * k, item, "a")
        b = self._operand(index, b, k * n, item, "b")
        if m == 0 or n == 0:
            return
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, f"matmul_{dtype}")
        ts = self._tile(index)
        gsize = (-(-n // ts) * ts, -(-m // ts) * ts)
        with plugin._translate("clEnqueueNDRangeKernel(matmul)", index), lock:
            ev = cl.enqueue_nd_range_kernel(
                s.queue, self._set(knl, out[0], np.uint64(out[1]), a[0], np.uint64(a[1]), b[0],
                                   np.uint64(b[1]), np.uint64(m), np.uint64(k), np.uint64(n)),
                gsize, (ts, ts))
        plugin._after_enqueue(s, ev)

    # -- internals -----------------------------------------------------------
    @staticmethod
    def _set(knl: Any, *args: Any) -> Any:
        knl.set_args(*args)
        return knl

    def _itemsize(self, dtype: str) -> int:
        if dtype not in self.dtypes:
            raise UnsupportedError(f"the OpenCL kernels support {', '.join(self.dtypes)}, not {dtype!r}")
        return np.dtype(dtype).itemsize

    def _index(self, index: Any) -> int:
        count = self._plugin.device_count()
        if type(index) is not int and not isinstance(index, np.integer):
            raise InvalidArgumentError(f"device index must be an int, got {type(index).__name__} {index!r}")
        if not 0 <= int(index) < count:
            raise InvalidArgumentError(f"there is no opencl:{index}; the OpenCL backend has {count} "
                                       f"device{'s' if count != 1 else ''} (0..{count - 1})")
        return int(index)

    def _operand(self, index: int, operand: Any, count: int, item: int, what: str) -> tuple[Any, int]:
        """(cl.Buffer, byte offset) of an operand holding ``count`` elements of ``item`` bytes.

        An operand is an ``anychip.Buffer`` of this device (checked against the
        buffer), ``(handle, offset, nbytes)``, or ``(handle, offset)`` for a raw
        allocation from ``_malloc`` (checked against the whole ``cl.Buffer``).
        """
        from ..runtime.buffer import Buffer

        if isinstance(operand, Buffer):
            dev = operand.device
            if dev.plugin is not self._plugin or dev.index != index:
                raise InvalidArgumentError(f"{what}: a buffer of {dev}, but the kernel runs on opencl:{index}")
            handle, offset, limit = operand._check().handle, operand._offset, operand.nbytes
            base = offset
        elif isinstance(operand, tuple) and len(operand) in (2, 3):
            handle, offset = operand[0], operand[1]
            offset = non_negative_int(offset, f"{what} offset")
            size = getattr(handle, "size", None)
            if not isinstance(size, int) or not isinstance(handle, self._plugin._cl.Buffer):
                raise InvalidArgumentError(f"{what}: {type(handle).__name__} is not an OpenCL buffer handle")
            limit = size if len(operand) == 2 else non_negative_int(operand[2], f"{what} nbytes")
            if len(operand) == 3 and offset + limit > size:
                raise InvalidArgumentError(f"{what}: [{offset}, {offset + limit}) lies outside its "
                                           f"{size}-byte cl.Buffer")
            base = 0 if len(operand) == 2 else offset
        else:
            raise InvalidArgumentError(f"{what} must be an anychip.Buffer, (handle, offset, nbytes) or "
                                       f"(handle, offset) of a raw allocation, got {operand!r}")
        if offset % item:
            raise InvalidArgumentError(f"{what}: offset {offset} is not a multiple of the element size {item}")
        need = count * item
        if offset - base + need > limit:
            raise InvalidArgumentError(
                f"{what}: {count} elements of {item} bytes from byte {offset - base} need {need} bytes, "
                f"past the end of its {limit}-byte allocation")
        return handle, offset

    def _stream(self, index: int, stream: Any) -> _Stream:
        """None -> the default stream; an ``anychip.Stream`` -> its handle; a handle as is."""
        if stream is None:
            return self._plugin._default_stream(index)
        live = getattr(stream, "_live", None)
        if live is not None:
            stream = live()
        if not isinstance(stream, _Stream) or stream.index != index:
            raise InvalidArgumentError(f"kernel on opencl:{index} got {stream!r}; pass a stream of opencl:{index}")
        return stream

    def _tile(self, index: int) -> int:
        wg = int(self._plugin._state(index).device.max_work_group_size)
        return 16 if wg >= 256 else 8 if wg >= 64 else 4 if wg >= 16 else 1

    def _program(self, index: int) -> Any:
        plugin = self._plugin
        st = plugin._state(index)
        if st.program is None:
            with st.lock:
                if st.program is None:
                    st.program = self._build(index, st)
        return st.program

    def _build(self, index: int, st: _DeviceState) -> Any:
        from ._opencl_kernels import build_source

        plugin = self._plugin
        cl = plugin._cl
        ctx = plugin._context(index)
        fp64 = OpenCLPlugin._has_fp64(st.device)
        options = [f"-DTS={self._tile(index)}"]
        if fp64:
            options.append("-DANYCHIP_FP64")
        try:
            if st.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
                options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        except Exception as exc:  # noqa: BLE001 - an optional query
            log.debug("CL_DEVICE_SINGLE_FP_CONFIG failed: %s", exc)
        with plugin._translate("clBuildProgram", index), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl warns whenever the build log is not empty
            program = cl.Program(ctx, build_source(fp64)).build(options=options)
        log.debug("built the OpenCL kernel set for opencl:%d (%s)", index, " ".join(options))
        return program

    def _kernel(self, index: int, name: str) -> tuple[Any, threading.Lock]:
        st = self._plugin._state(index)
        knl = st.kernels.get(name)
        if knl is None:
            program = self._program(index)
            with st.lock:
                knl = st.kernels.get(name)
                if knl is None:
                    try:
                        knl = getattr(program, name)
                    except AttributeError:
                        raise UnsupportedError(f"opencl:{index} has no kernel {name} "
                                               f"(float64 needs cl_khr_fp64)") from None
                    st.kernel_locks[name] = threading.Lock()
                    st.kernels[name] = knl
        return knl, st.kernel_locks[name]

    def _local_size(self, index: int, name: str, knl: Any) -> int:
        """Largest power of two <= 256 the kernel may run as one work-group (cached)."""
        st = self._plugin._state(index)
        local = st.local_sizes.get(name)
        if local is None:
            cl = self._plugin._cl
            wg = int(knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, st.device))
            local = 1
            while local * 2 <= min(wg, 256):
                local *= 2
            st.local_sizes[name] = local
        return local

    def _launch_1d(self, index: int, name: str, n: int, stream: Any, *args: Any) -> None:
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, name)
        local = self._local_size(index, name, knl)
        cus = int(plugin._state(index).device.max_compute_units)
        groups = max(1, min(-(-n // local), cus * 64))
        with plugin._translate(f"clEnqueueNDRangeKernel({name})", index), lock:
            knl.set_args(*args)
            ev = cl.enqueue_nd_range_kernel(s.queue, knl, (groups * local,), (local,))
        plugin._after_enqueue(s, ev)

