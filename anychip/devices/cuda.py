"""CUDA backend on CuPy.

CuPy is imported lazily, inside :meth:`CUDAPlugin.available`; a machine
without CuPy, without a working CUDA runtime or without a GPU gets the backend
listed as unavailable with the reason, never an import error.

Devices
    ``cuda:N`` is CUDA runtime device N, i.e. the N-th device that
    ``CUDA_VISIBLE_DEVICES`` leaves visible. The CUDA runtime reads that
    variable once, at its first call in the process, so it must be set before
    anything touches CUDA (anychip, CuPy, PyTorch...); changing it later has no
    effect, and anychip logs a warning when it sees that it changed.

Memory
    Raw allocations are ``cudaMalloc`` / ``cudaFree`` (``cupy.cuda.runtime``)
    under anychip's caching allocator; handles are integer device pointers.
    :func:`use_anychip_allocator_for_cupy` makes CuPy allocate through that
    same caching allocator, so CuPy arrays and anychip buffers share one pool.

Copies
    ``cudaMemcpyAsync`` on the stream. Host arrays are passed as they are:
    pageable memory is correct with ``cudaMemcpyAsync`` (the driver stages
    host-to-device copies before returning, and device-to-host copies into
    pageable memory return only when the data has arrived), it is only not
    overlapped with the host. Arrays from :meth:`CUDAPlugin.pinned_empty`
    (page-locked, ``cupy.cuda.alloc_pinned_memory``) are copied by DMA fully
    asynchronously; the front end keeps them alive until the stream is
    synchronized.

Streams and events
    The default stream of a device is CUDA's legacy default stream (the one
    CuPy uses unless told otherwise), so work anychip does on it is ordered
    with a user's CuPy work. ``Stream(device)`` creates
    ``cupy.cuda.Stream(non_blocking=True)``. Events are ``cupy.cuda.Event()``
    (timing enabled), or ``Event(disable_timing=True)`` from
    ``_event_create_untimed`` (for the caching allocator). Queries call
    ``cudaStreamQuery`` / ``cudaEventQuery`` themselves: CuPy's ``done``
    reads an error as "not done".

Current device
    Each call runs with its device current (``cudaSetDevice``) and makes the
    thread's previous device current again afterwards, unless that thread
    had no CUDA context yet: restoring would create GPU 0's context (hundreds
    of MiB, or an error on an EXCLUSIVE_PROCESS GPU) in every process.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from ..runtime.errors import DeviceError, InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ..runtime.plugin import D2D, D2H, H2D, DevicePlugin

__all__ = [
    "CUDAPlugin",
    "CUDA_ERROR_NAMES",
    "cuda_error_name",
    "nccl_unique_id_for_cupy",
    "normalize_nccl_unique_id",
    "parse_cuda_visible_devices",
    "use_anychip_allocator_for_cupy",
]

log = logging.getLogger("anychip")

#: cudaError_t values of the CUDA runtime (CUDA 12) and their names
CUDA_ERROR_NAMES: dict[int, str] = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading",
    5: "cudaErrorProfilerDisabled",
    9: "cudaErrorInvalidConfiguration",
    12: "cudaErrorInvalidPitchValue",
    13: "cudaErrorInvalidSymbol",
    17: "cudaErrorInvalidDevicePointer",
    21: "cudaErrorInvalidMemcpyDirection",
    34: "cudaErrorStubLibrary",
    35: "cudaErrorInsufficientDriver",
    36: "cudaErrorCallRequiresNewerDriver",
    46: "cudaErrorDevicesUnavailable",
    98: "cudaErrorInvalidDeviceFunction",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    102: "cudaErrorDeviceNotLicensed",
    127: "cudaErrorStartupFailure",
    200: "cudaErrorInvalidKernelImage",
    201: "cudaErrorDeviceUninitialized",
    209: "cudaErrorNoKernelImageForDevice",
    214: "cudaErrorECCUncorrectable",
    216: "cudaErrorDeviceAlreadyInUse",
    217: "cudaErrorPeerAccessUnsupported",
    222: "cudaErrorUnsupportedPtxVersion",
    304: "cudaErrorOperatingSystem",
    400: "cudaErrorInvalidResourceHandle",
    401: "cudaErrorIllegalState",
    500: "cudaErrorSymbolNotFound",
    600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",
    702: "cudaErrorLaunchTimeout",
    704: "cudaErrorPeerAccessAlreadyEnabled",
    705: "cudaErrorPeerAccessNotEnabled",
    708: "cudaErrorSetOnActiveProcess",
    709: "cudaErrorContextIsDestroyed",
    710: "cudaErrorAssert",
    712: "cudaErrorHostMemoryAlreadyRegistered",
    713: "cudaErrorHostMemoryNotRegistered",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    800: "cudaErrorNotPermitted",
    801: "cudaErrorNotSupported",
    802: "cudaErrorSystemNotReady",
    803: "cudaErrorSystemDriverMismatch",
    804: "cudaErrorCompatNotSupportedOnDevice",
    911: "cudaErrorExternalDevice",
    999: "cudaErrorUnknown",
}

_OOM_STATUS = 2  # cudaErrorMemoryAllocation
_NOT_READY = 600  # cudaErrorNotReady: what a query returns while work is pending
#: errors after which the CUDA context is unusable until the process exits
#: (the runtime's documentation: "the process must be terminated and relaunched")
_STICKY = {700, 702, 710, 714, 715, 716, 717, 718, 719, 911}

_NCCL_UNIQUE_ID_BYTES = 128


def cuda_error_name(status: int, message: str | None = None) -> str:
    """The CUDA runtime's name for ``status`` (``2`` -> ``"cudaErrorMemoryAllocation"``).

    Uses the table, then the name CuPy put at the start of its message
    (``"cudaErrorXxx: text"``), then a generic ``cudaError<N>``.
    """
    name = CUDA_ERROR_NAMES.get(status)
    if name is None and message:
        head = message.split(":", 1)[0].strip()
        if head.startswith("cudaError") and head.isidentifier():
            name = head
    return name or f"cudaError{status}"


def translate_cuda_error(exc: BaseException, what: str, *, device: str | None = None,
                         requested: int | None = None, mem_info: tuple[int, int] | None = None) -> DeviceError:
    """An anychip error for a ``CUDARuntimeError`` (anything with an int ``.status``)."""
    status = getattr(exc, "status", None)
    if not isinstance(status, int):
        return DeviceError(f"{what} failed: {exc}", backend="cuda")
    name = cuda_error_name(status, str(exc))
    if status == _OOM_STATUS:
        free, total = mem_info if mem_info is not None else (None, None)
        return OutOfMemoryError(requested or 0, free, total, backend="cuda", device=device,
                                code=status, code_name=name, detail=f"{what} failed")
    where = f" on {device}" if device else ""
    msg = f"{what} failed{where}: {exc}"
    if status in _STICKY:
        msg += " (the CUDA context is now unusable; restart the process)"
    return DeviceError(msg, backend="cuda", code=status, code_name=name)


def parse_cuda_visible_devices(value: str | None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that the CUDA runtime honours.

    None when the variable is unset (every GPU visible). Otherwise the list of
    accepted entries in order: non-negative indices (as strings) and
    ``GPU-``/``MIG-`` UUIDs. As in the runtime, the list ends at the first
    entry that is neither (``-1``, garbage) and duplicates end it as well, so
    ``""`` and ``"-1"`` hide every GPU and ``"0,2,-1,1"`` shows devices 0 and 2.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if item.isdigit():
            item = str(int(item))
        elif not (item.startswith(("GPU-", "MIG-")) and len(item) > 4):
            break
        if item in out:
            break
        out.append(item)
    return out


def normalize_nccl_unique_id(uid: Any) -> bytes:
    """NCCL's unique id as 128 bytes, whatever shape CuPy returned it in.

    ``cupy.cuda.nccl.get_unique_id()`` returns ``bytes`` from CuPy 14 on and a
    tuple of 128 C ``char`` values (signed, -128..127) before.
    """
    if isinstance(uid, (bytes, bytearray, memoryview)):
        data = bytes(uid)
    elif isinstance(uid, (tuple, list)):
        if not all(isinstance(v, (int, np.integer)) for v in uid):
            raise InvalidArgumentError("an NCCL unique id tuple must hold integers")
        if any(not -128 <= int(v) <= 255 for v in uid):
            raise InvalidArgumentError("an NCCL unique id tuple holds values outside a byte")
        data = bytes(int(v) & 0xFF for v in uid)
    else:
        raise InvalidArgumentError(f"an NCCL unique id is bytes or a tuple of ints, got {type(uid).__name__}")
    if len(data) != _NCCL_UNIQUE_ID_BYTES:
        raise InvalidArgumentError(f"an NCCL unique id has {_NCCL_UNIQUE_ID_BYTES} bytes, got {len(data)}")
    return data


def nccl_unique_id_for_cupy(data: bytes, like: Any = None, cupy_version: str | None = None) -> Any:
    """Turn 128 id bytes back into what ``cupy.cuda.nccl.NcclCommunicator`` takes.

    The shape follows ``like`` (a value ``get_unique_id()`` returned) when given,
    else the CuPy version (``cupy_version``, default: the installed one):
    bytes from 14 on, a tuple of signed ints before.
    """
    data = normalize_nccl_unique_id(data)
    if like is not None:
        as_bytes = isinstance(like, (bytes, bytearray))
    else:
        if cupy_version is None:
            import cupy  # the caller is about to use CuPy's NCCL anyway

            cupy_version = cupy.__version__
        try:
            major = int(str(cupy_version).split(".", 1)[0])
        except ValueError:
            major = 14
        as_bytes = major >= 14
    if as_bytes:
        return data
    return tuple(b - 256 if b > 127 else b for b in data)


class _CudaStream:
    """A stream handle: the CuPy stream and the device it belongs to."""

    __slots__ = ("cupy_stream", "index", "ptr")

    def __init__(self, cupy_stream: Any, index: int) -> None:
        self.cupy_stream = cupy_stream
        self.index = index
        self.ptr = int(cupy_stream.ptr)

    def __repr__(self) -> str:
        return f"<cuda stream 0x{self.ptr:x} of device {self.index}>"


FORK_REASON = ("CUDA was initialized in the parent process before fork(), and CUDA cannot be re-initialized "
               "in a forked child; to use CUDA with multiprocessing, use the 'spawn' start method: "
               "multiprocessing.get_context('spawn') or multiprocessing.set_start_method('spawn')")


class CUDAPlugin(DevicePlugin):
    """anychip backend for NVIDIA GPUs through CuPy."""

    name = "cuda"
    api_version = (1, 0)
    priority = 100
    accelerator = True

    def __init__(self) -> None:
        self._cupy: Any = None
        self._rt: Any = None
        self._driver: Any = None
        self._nccl: Any = None
        self._nccl_reason = "not probed"
        self._count = 0
        self._reason = "not probed"
        self._probed = False
        self._lock = threading.Lock()
        self._defaults: dict[int, _CudaStream] = {}
        self._props: dict[int, dict] = {}
        self._visible_at_init: str | None = None
        self._warned_visibility = False
        self._forked = False

    # ------------------------------------------------------------------ identity
    def _probe(self) -> None:
        with self._lock:
            if self._probed:
                return
            self._probed = True
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            self._visible_at_init = visible
            try:
                import cupy
            except ImportError as exc:
                self._reason = f"CuPy is not installed ({exc}); pip install 'anychip[cuda]'"
                return
            except Exception as exc:  # noqa: BLE001 - e.g. OSError: libcudart.so.12 missing
                self._reason = f"CuPy failed to load: {type(exc).__name__}: {exc}"
                return
            try:
                rt = cupy.cuda.runtime
                count = int(rt.getDeviceCount())
            except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or a missing driver library
                status = getattr(exc, "status", None)
                name = f" ({cuda_error_name(status, str(exc))})" if isinstance(status, int) else ""
                self._reason = f"CuPy found no usable CUDA GPU{name}: {exc}" + _visibility_note(visible)
                return
            if count <= 0:
                self._reason = "CuPy found no CUDA GPU" + _visibility_note(visible)
                return
            self._cupy, self._rt, self._driver, self._count = cupy, rt, cupy.cuda.driver, count
            self._reason = ""
            self._nccl, self._nccl_reason = _load_nccl()

    def _after_fork_in_child(self) -> None:
        # CUDA cannot be re-initialized in a forked child (PyTorch says so too): once
        # the parent initialized it (the probe's getDeviceCount does), the backend is
        # listed unavailable in the child with the fix.
        self._lock = threading.Lock()
        if self._cupy is not None:
            self._forked = True

    def available(self) -> tuple[bool, str]:
        if self._forked:
            return False, FORK_REASON
        try:
            self._probe()
        except Exception as exc:  # noqa: BLE001 - available() never raises
            return False, f"CUDA probe failed: {type(exc).__name__}: {exc}"
        if self._cupy is None:
            return False, self._reason
        names = []
        for i in range(self._count):
            try:
                names.append(self.properties(i)["name"])
            except Exception as exc:  # noqa: BLE001
                names.append(f"? ({exc})")
        nccl = "NCCL available" if self._nccl is not None else f"NCCL unavailable: {self._nccl_reason}"
        return True, f"{self._count} CUDA GPU{'s' if self._count != 1 else ''} via CuPy " \
                     f"{self._cupy.__version__}: " + "; ".join(names) + f"; {nccl}"

    def device_count(self) -> int:
        self._probe()
        self._check_visibility()
        return self._count

    def _check_visibility(self) -> None:
        now = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self._probed and now != self._visible_at_init and not self._warned_visibility:
            self._warned_visibility = True
            log.warning("CUDA_VISIBLE_DEVICES changed from %r to %r after CUDA was initialized; the change has "
                        "no effect in this process (set it before the first CUDA call)",
                        self._visible_at_init, now)

    def _ready(self) -> Any:
        if self._rt is None:
            self._probe()
            if self._rt is None:
                raise UnsupportedError(f"CUDA is unavailable: {self._reason}")
        return self._rt

    def properties(self, index: int) -> dict:
        props = self._props.get(index)
        if props is None:
            rt = self._ready()
            # no context is created here (that costs memory on every GPU): no memGetInfo
            with self._translate("cudaGetDeviceProperties", index):
                p = rt.getDeviceProperties(index)
            name = p.get("name", b"")
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            props = {
                "name": name.strip("\x00 "),
                "total_memory": int(p.get("totalGlobalMem", 0)),
                "compute_capability": f"{p.get('major', '?')}.{p.get('minor', '?')}",
                "multiprocessors": p.get("multiProcessorCount"),
                "pci_bus_id": f"{p.get('pciDomainID', 0):04x}:{p.get('pciBusID', 0):02x}:"
                              f"{p.get('pciDeviceID', 0):02x}",
                "uuid": _format_uuid(p.get("uuid")),
                "cuda_visible_devices": self._visible_at_init,
                "runtime_version": _safe(lambda: rt.runtimeGetVersion()),
                "driver_version": _safe(lambda: rt.driverGetVersion()),
                "cupy_version": self._cupy.__version__,
                "nccl_available": self.nccl_available(),
            }
            self._props[index] = props
        return dict(props)

    def nccl_available(self) -> bool:
        """Whether CuPy's NCCL binding (``cupy.cuda.nccl``) is usable."""
        self._probe()
        return self._nccl is not None

    @property
    def kernels(self) -> Any:
        """The tensor kernels (CuPy's, over anychip memory: devices/_cuda_kernels.py) once CuPy is loaded."""
        if self._cupy is None:
            return None
        k = self.__dict__.get("_tensor_kernels")
        if k is None:
            from ._cuda_kernels import CudaKernels
            k = self.__dict__["_tensor_kernels"] = CudaKernels(self)
        return k

    def native_ccl(self) -> Any:
        """``cupy.cuda.nccl`` when NCCL loaded, else None (the reason is in ``available()``)."""
        self._probe()
        return self._nccl

    def native_ccl_problem(self) -> str:
        return "cupy.cuda.nccl is not available"

    # ------------------------------------------------------------------ helpers
    @contextmanager
    def _translate(self, what: str, index: int | None = None, requested: int | None = None) -> Iterator[None]:
        """For cold paths: CUDARuntimeError inside -> anychip error."""
        try:
            yield
        except DeviceError:
            raise
        except Exception as exc:
            if not isinstance(getattr(exc, "status", None), int):
                raise
            raise self._error(exc, what, index, requested) from exc

    def _error(self, exc: BaseException, what: str, index: int | None, requested: int | None) -> DeviceError:
        info = None
        if getattr(exc, "status", None) == _OOM_STATUS and index is not None:
            try:
                info = self._mem_info(index)
            except Exception:  # noqa: BLE001 - best effort for the message
                info = None
        return translate_cuda_error(exc, what, device=None if index is None else f"cuda:{index}",
                                    requested=requested, mem_info=info)

    def _call(self, index: int, what: str, fn: Any, *args: Any, requested: int | None = None) -> Any:
        """``fn(*args)`` with device ``index`` current, CUDA errors translated.

        The thread's previous device is made current again after, but only if
        the thread had a context: in a new thread ``cudaGetDevice`` says 0
        without any context, and ``cudaSetDevice(0)`` would create GPU 0's.
        The hot path: no context managers, no switch when ``index`` is current."""
        rt = self._rt
        if rt is None:
            rt = self._ready()
        prev = rt.getDevice()
        restore = False
        try:
            if prev != index:
                restore = self._driver.ctxGetCurrent() != 0
                rt.setDevice(index)
            return fn(*args)
        except DeviceError:
            raise
        except Exception as exc:
            if not isinstance(getattr(exc, "status", None), int):
                raise
            raise self._error(exc, what, index, requested) from exc
        finally:
            if restore:
                self._restore_device(prev, what)

    def _restore_device(self, prev: int, what: str) -> None:
        try:
            self._rt.setDevice(prev)
        except Exception as exc:  # noqa: BLE001 - the call's own result or error wins
            log.warning("cuda: could not make cuda:%d current again after %s: %s", prev, what, exc)

    def _query(self, index: int, what: str, fn: Any, ptr: int) -> bool:
        """cudaStreamQuery / cudaEventQuery: 0 done, 600 not ready, anything else raised
        (CuPy's ``done`` would read a sticky error as "not done" forever)."""
        status = self._call(index, what, fn, ptr)
        if status == 0:
            return True
        if status == _NOT_READY:
            return False
        raise self._error(self._rt.CUDARuntimeError(status), what, index, None)

    # ------------------------------------------------------------------ memory
    def _malloc(self, index: int, nbytes: int) -> int:
        rt = self._ready()
        return int(self._call(index, "cudaMalloc", rt.malloc, nbytes, requested=nbytes))

    def _free(self, index: int, handle: Any) -> None:
        self._call(index, "cudaFree", self._ready().free, handle)

    def _mem_info(self, index: int) -> tuple[int, int]:
        free, total = self._call(index, "cudaMemGetInfo", self._ready().memGetInfo)
        return int(free), int(total)

    def _pointer(self, handle: Any, offset: int) -> int:
        return int(handle) + offset

    def pinned_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """A page-locked host array (uint8) for fully asynchronous copies, allocated
        with GPU ``index`` current (CuPy's pinned memory is portable: any GPU may use it)."""
        self._ready()
        mem = self._call(index, "cudaHostAlloc", self._cupy.cuda.alloc_pinned_memory, nbytes, requested=nbytes)
        return np.frombuffer(mem, dtype=np.uint8, count=nbytes)

    # ------------------------------------------------------------------ copies
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int,
              nbytes: int, kind: str, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        if kind == H2D:
            d, s, k, what = int(dst) + dst_off, src.ctypes.data + src_off, 1, "cudaMemcpyAsync(H2D)"
        elif kind == D2H:
            d, s, k, what = dst.ctypes.data + dst_off, int(src) + src_off, 2, "cudaMemcpyAsync(D2H)"
        elif kind == D2D:
            d, s, k, what = int(dst) + dst_off, int(src) + src_off, 3, "cudaMemcpyAsync(D2D)"
        else:
            raise InvalidArgumentError(f"unknown copy kind {kind!r}")
        self._call(index, what, rt.memcpyAsync, d, s, nbytes, k, stream.ptr)

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any,
                   src_off: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        self._call(src_index, "cudaMemcpyPeerAsync", rt.memcpyPeerAsync,
                   int(dst) + dst_off, dst_index, int(src) + src_off, src_index, nbytes, stream.ptr)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        self._call(index, "cudaMemsetAsync", rt.memsetAsync, int(dst) + dst_off, int(value), nbytes, stream.ptr)

    # ------------------------------------------------------------------ streams
    def _default_stream(self, index: int) -> Any:
        s = self._defaults.get(index)
        if s is None:
            self._ready()
            s = self._defaults.setdefault(index, _CudaStream(self._cupy.cuda.Stream.null, index))
        return s

    def _stream_create(self, index: int) -> Any:
        self._ready()
        cs = self._call(index, "cudaStreamCreateWithFlags", partial(self._cupy.cuda.Stream, non_blocking=True))
        return _CudaStream(cs, index)

    def _stream_destroy(self, index: int, stream: Any) -> None:
        if stream is self._defaults.get(index):
            return
        self._stream_synchronize(index, stream)
        stream.cupy_stream = None  # CuPy destroys the stream when the object goes

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._call(index, "cudaStreamSynchronize", stream.cupy_stream.synchronize)

    def _stream_query(self, index: int, stream: Any) -> bool:
        return self._query(index, "cudaStreamQuery", self._rt.streamQuery, stream.ptr)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._call(index, "cudaStreamWaitEvent", stream.cupy_stream.wait_event, event)

    # ------------------------------------------------------------------ events
    def _event_create(self, index: int) -> Any:
        self._ready()
        return self._call(index, "cudaEventCreate", self._cupy.cuda.Event)

    def _event_create_untimed(self, index: int) -> Any:
        """An event without timing (``cudaEventDisableTiming``), cheaper to record and
        query: what the caching allocator needs for stream-ordered reuse."""
        self._ready()
        return self._call(index, "cudaEventCreateWithFlags", partial(self._cupy.cuda.Event, disable_timing=True))

    def _event_destroy(self, index: int, event: Any) -> None:
        pass  # CuPy destroys the event when the object goes

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._call(index, "cudaEventRecord", event.record, stream.cupy_stream)

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._call(index, "cudaEventSynchronize", event.synchronize)

    def _event_query(self, index: int, event: Any) -> bool:
        return self._query(index, "cudaEventQuery", self._rt.eventQuery, event.ptr)

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        return float(self._call(index, "cudaEventElapsedTime", self._cupy.cuda.get_elapsed_time, start, end))

    def _synchronize(self, index: int) -> None:
        rt = self._ready()
        self._call(index, "cudaDeviceSynchronize", rt.deviceSynchronize)


def _visibility_note(visible: str | None) -> str:
    if visible is None:
        return ""
    entries = parse_cuda_visible_devices(visible)
    if not entries:
        return f" (CUDA_VISIBLE_DEVICES={visible!r} hides every GPU)"
    return f" (CUDA_VISIBLE_DEVICES={visible!r})"


def _format_uuid(raw: Any) -> str | None:
    """``GPU-xxxxxxxx-xxxx-...`` from ``getDeviceProperties()['uuid']``, or None.

    CuPy hands over ``char uuid[16]`` as Cython converts a ``char[]``: the bytes
    up to the first zero byte, running on into the next field when there is
    none. So 16 or more bytes hold the whole UUID; fewer mean it contained a
    zero byte and the rest is lost (``nvidia-smi -L`` shows it)."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) < 16:
        return None
    h = bytes(raw[:16]).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _load_nccl() -> tuple[Any, str]:
    """``cupy.cuda.nccl`` (or None) and why it is unusable.

    When libnccl is missing, CuPy warns on import with a multi-line message;
    it is kept out of the output here and condensed into the reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            from cupy.cuda import nccl
        except Exception as exc:  # noqa: BLE001 - any failure means no NCCL
            return None, f"cupy.cuda.nccl failed to import: {type(exc).__name__}: {exc}"
    if getattr(nccl, "available", False):
        return nccl, ""
    text = "\n".join(str(w.message) for w in caught)
    reason = re.search(r"^Reason: (.+)$", text, re.M)
    fix = re.search(r"^\s*\$ (.+)$", text, re.M)
    why = reason.group(1) if reason else "cupy.cuda.nccl.available is False"
    return None, why + (f"; install it with: {fix.group(1)}" if fix else "")


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - optional information
        return None


# ---------------------------------------------------------------------- CuPy bridge

def use_anychip_allocator_for_cupy(device: Any = None) -> Any:
    """Make CuPy allocate device memory through anychip's caching allocator.

    After this call CuPy arrays and anychip buffers share one pool per GPU:
    ``cupy.cuda.set_allocator`` gets a function that takes a Buffer from
    ``anychip.device("cuda:N").alloc(size)`` and hands CuPy a
    ``MemoryPointer`` over it; the Buffer is the memory's owner, so it goes
    back to anychip's cache when CuPy drops the array.

    ``device`` (``"cuda:1"``, a Device, or an int) pins every allocation to
    that GPU; None (the default) allocates on CuPy's current device.
    Out of memory raises ``cupy.cuda.memory.OutOfMemoryError`` (what CuPy and
    its users catch) with anychip's message; anychip's error is its ``__cause__``.
    Returns the allocator CuPy had before, for ``cupy.cuda.set_allocator``.
    """
    import cupy

    from ..runtime.device import device as lookup

    fixed = None
    if device is not None:
        fixed = lookup(f"cuda:{device}" if isinstance(device, int) else device)
        if fixed.backend != "cuda":
            raise InvalidArgumentError(f"use_anychip_allocator_for_cupy needs a cuda device, got {fixed}")
    cache: dict[int, Any] = {}

    def allocate(size: int) -> Any:
        dev = fixed
        if dev is None:
            idx = cupy.cuda.runtime.getDevice()
            dev = cache.get(idx)
            if dev is None:
                dev = cache[idx] = lookup(f"cuda:{idx}")
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev.index), 0)
        try:
            buf = dev.alloc(size)
        except OutOfMemoryError as exc:
            # CuPy (cub's fallbacks, ...) and its users catch CuPy's class
            err = cupy.cuda.memory.OutOfMemoryError(size, exc.stats.get("allocated_bytes.all.current", -1))
            err.args = (str(exc),)
            raise err from exc
        mem = cupy.cuda.UnownedMemory(buf.ptr, size, buf, dev.index)
        return cupy.cuda.MemoryPointer(mem, 0)

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(allocate)
    return previous
