"""The CUDA devices: discovery through CuPy, properties, CUDA_VISIBLE_DEVICES, fork
handling, and the translation of the CUDA runtime's status codes into anychip's errors."""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...runtime.errors import DeviceError, OutOfMemoryError, UnsupportedError
from ...runtime.plugin import DevicePlugin
from .interop import _load_nccl

__all__ = ["CUDADevice", "CUDA_ERROR_NAMES", "FORK_REASON", "cuda_error_name", "parse_cuda_visible_devices",
           "translate_cuda_error"]

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


FORK_REASON = ("CUDA was initialized in the parent process before fork(), and CUDA cannot be re-initialized "
               "in a forked child; to use CUDA with multiprocessing, use the 'spawn' start method: "
               "multiprocessing.get_context('spawn') or multiprocessing.set_start_method('spawn')")



class CUDADevice(DevicePlugin):
    """Devices, their state and the checked call; the streams, memory, events and kernels build on it."""

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
        self._defaults: dict[int, Any] = {}             # index -> its default stream (stream.py)
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

    def _mem_info(self, index: int) -> tuple[int, int]:
        free, total = self._call(index, "cudaMemGetInfo", self._ready().memGetInfo)
        return int(free), int(total)

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


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - optional information
        return None


