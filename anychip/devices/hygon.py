"""Hygon DCUs through HIP (libamdhip64.so, or libgalaxyhip.so from Hygon's DTK), bound with cffi.

Without a HIP runtime installed (and ``ANYCHIP_SIMULATE`` not ``never``) the
simulator library ``libhygon_sim`` stands in with the same ``hip*`` symbols.

Handles: device memory is an integer address; streams and events are the
``hipStream_t`` / ``hipEvent_t`` values HIP returns; the default stream is the
null stream.
"""
from __future__ import annotations

from typing import Any

from ..runtime.plugin import D2D, D2H, H2D
from ._headers import Declarations
from ._vendor import VendorPlugin, roots
from .rccl import Rccl

__all__ = ["HygonPlugin"]


hipSuccess = 0
hipErrorNotReady = 600
hipErrorNoDevice = 100
hipErrorPeerAccessAlreadyEnabled = 704
hipStreamNonBlocking = 1

#: hipError_t values (hip/hip_runtime_api.h)
CODE_NAMES: dict[int, str] = {
    0: "hipSuccess",
    1: "hipErrorInvalidValue",
    2: "hipErrorOutOfMemory",
    3: "hipErrorNotInitialized",
    4: "hipErrorDeinitialized",
    17: "hipErrorInvalidDevicePointer",
    21: "hipErrorInvalidMemcpyDirection",
    35: "hipErrorInsufficientDriver",
    98: "hipErrorInvalidDeviceFunction",
    100: "hipErrorNoDevice",
    101: "hipErrorInvalidDevice",
    200: "hipErrorInvalidImage",
    201: "hipErrorInvalidContext",
    400: "hipErrorInvalidHandle",
    401: "hipErrorIllegalState",
    500: "hipErrorNotFound",
    600: "hipErrorNotReady",
    700: "hipErrorIllegalAddress",
    701: "hipErrorLaunchOutOfResources",
    704: "hipErrorPeerAccessAlreadyEnabled",
    705: "hipErrorPeerAccessNotEnabled",
    709: "hipErrorContextIsDestroyed",
    719: "hipErrorLaunchFailure",
    801: "hipErrorNotSupported",
    999: "hipErrorUnknown",
}



class HygonPlugin(VendorPlugin):
    name = "hygon"
    ccl_library = Rccl
    priority = 10
    vendor_libraries = ("libamdhip64.so", "libgalaxyhip.so")
    simulator_library = "libhygon_sim"
    api_label = "HIP runtime"
    cdef = Declarations("hip/hip_runtime_api.h")     # csrc/include/hip/hip_runtime_api.h
    code_names = CODE_NAMES
    oom_codes = frozenset({2})                    # hipErrorOutOfMemory
    copy_kinds = {H2D: 1, D2H: 2, D2D: 3}         # hipMemcpyKind
    stream_type = "hipStream_t"
    event_type = "hipEvent_t"

    SET_DEVICE = "hipSetDevice"
    GET_DEVICE = "hipGetDevice"
    MALLOC = "hipMalloc"
    FREE = "hipFree"
    MEMCPY_ASYNC = "hipMemcpyAsync"
    STREAM_CREATE = "hipStreamCreateWithFlags"
    STREAM_DESTROY = "hipStreamDestroy"
    STREAM_SYNCHRONIZE = "hipStreamSynchronize"
    EVENT_CREATE = "hipEventCreate"
    EVENT_DESTROY = "hipEventDestroy"
    EVENT_RECORD = "hipEventRecord"
    EVENT_SYNCHRONIZE = "hipEventSynchronize"
    EVENT_ELAPSED = "hipEventElapsedTime"
    DEVICE_SYNCHRONIZE = "hipDeviceSynchronize"

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("ROCM_PATH", "HIP_PATH", "DTK_HOME"), ("/opt/dtk", "/opt/rocm")):
            dirs += [f"{root}/lib", f"{root}/lib64", f"{root}/hip/lib"]
        return dirs

    def _open(self) -> int:
        self.lib.hipInit(0)
        count = self.ffi.new("int *")
        rc = self.lib.hipGetDeviceCount(count)
        if rc == hipErrorNoDevice:
            self.lib.hipGetLastError()           # not an error here: zero devices
            return 0
        if rc:
            raise self.status.error(rc, "hipGetDeviceCount")
        return int(count[0])

    def _new_stream(self) -> Any:
        """A ``hipStreamNonBlocking`` stream: anychip orders its streams (the null stream
        included) only through events and synchronizes, as on CUDA; the legacy null
        stream's implicit waits on and for blocking streams would only serialize them."""
        out = self.ffi.new("hipStream_t *")
        self._call(self.STREAM_CREATE, out, hipStreamNonBlocking)
        return out[0]

    def _vendor_message(self, code: int) -> str:
        p = self.lib.hipGetErrorString(code)
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def properties(self, index: int) -> dict:
        props = super().properties(index)
        name = self.ffi.new("char[256]")
        self._call("hipDeviceGetName", name, 256, index)
        total = self.ffi.new("size_t *")
        self._call("hipDeviceTotalMem", total, index)
        props["name"] = self.ffi.string(name).decode("utf-8", "replace")
        props["total_memory"] = int(total[0])
        return props

    def _mem_info(self, index: int) -> tuple[int, int]:
        self._use(index)
        return self._mem_info_call("hipMemGetInfo")

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        self._use(src_index)
        self._enable_peer(src_index, dst_index, "hipDeviceEnablePeerAccess", hipErrorPeerAccessAlreadyEnabled)
        self.lib.hipGetLastError()                   # "already enabled" is not an error
        self._call("hipMemcpyPeerAsync", self._cast("void *", dst + dst_off), dst_index,
                   self._cast("void *", src + src_off), src_index, nbytes, stream)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        self._use(index)
        self._call("hipMemsetAsync", self._cast("void *", dst + dst_off), value, nbytes, stream)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        self._call("hipStreamWaitEvent", stream, event, 0)

    def _ready(self, name: str, handle: Any) -> bool:
        """hipStreamQuery / hipEventQuery: hipSuccess or hipErrorNotReady."""
        rc = self._fn(name)(handle)
        if rc and rc != hipErrorNotReady:
            raise self.status.error(rc, name)
        return rc == hipSuccess

    def _stream_done(self, stream: Any) -> bool:
        return self._ready("hipStreamQuery", stream)

    def _event_done(self, event: Any) -> bool:
        return self._ready("hipEventQuery", event)
