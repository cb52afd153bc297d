"""Huawei Ascend NPUs through the AscendCL runtime (libascendcl.so), bound with cffi.

Without CANN installed (and ``ANYCHIP_SIMULATE`` not ``never``) the simulator
library ``libascend_sim`` stands in: it exports the same ``aclrt*`` symbols, so
the code below is the same for a real and a simulated chip.

Handles: device memory is an integer address; streams and events are the
``aclrtStream`` / ``aclrtEvent`` values ACL returns; the default stream is NULL
(ACL's default stream of the thread's current device).
"""
from __future__ import annotations

import threading
from typing import Any

from ..runtime.errors import DeviceError
from ..runtime.plugin import D2D, D2H, H2D
from ._vendor import VendorPlugin, roots

__all__ = ["AscendPlugin"]

CDEF = """
typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void (*aclrtCallback)(void *userData);
typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_DEVICE_TO_DEVICE, ACL_MEMCPY_DEFAULT
} aclrtMemcpyKind;
typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY,
    ACL_MEM_MALLOC_HUGE_FIRST_P2P, ACL_MEM_MALLOC_HUGE_ONLY_P2P, ACL_MEM_MALLOC_NORMAL_ONLY_P2P
} aclrtMemMallocPolicy;
typedef enum aclrtMemAttr {
    ACL_DDR_MEM, ACL_HBM_MEM, ACL_DDR_MEM_HUGE, ACL_DDR_MEM_NORMAL, ACL_HBM_MEM_HUGE, ACL_HBM_MEM_NORMAL,
    ACL_DDR_MEM_P2P_HUGE, ACL_DDR_MEM_P2P_NORMAL, ACL_HBM_MEM_P2P_HUGE, ACL_HBM_MEM_P2P_NORMAL
} aclrtMemAttr;
typedef enum aclrtEventRecordedStatus {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0, ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
} aclrtEventRecordedStatus;
typedef enum aclrtStreamStatus {
    ACL_STREAM_STATUS_COMPLETE = 0, ACL_STREAM_STATUS_NOT_READY = 1, ACL_STREAM_STATUS_RESERVED = 0xFFFF
} aclrtStreamStatus;
typedef enum aclrtCallbackBlockType { ACL_CALLBACK_NO_BLOCK, ACL_CALLBACK_BLOCK } aclrtCallbackBlockType;

aclError aclInit(const char *configPath);
aclError aclFinalize(void);
const char *aclGetRecentErrMsg(void);
const char *aclrtGetSocName(void);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtSynchronizeDevice(void);
aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId);
aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream);
aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count);
aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);
aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType,
                             aclrtStream stream);
aclError aclrtCreateEvent(aclrtEvent *event);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtSynchronizeEvent(aclrtEvent event);
aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status);
aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent);
"""

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_HBM_MEM = 1

#: aclError values (acl/acl_base.h and acl/error_codes/rt_error_codes.h)
CODE_NAMES: dict[int, str] = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    200001: "ACL_ERROR_API_NOT_SUPPORT",
    200002: "ACL_ERROR_INVALID_DEVICE",
    200003: "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
    200004: "ACL_ERROR_RESOURCE_NOT_MATCH",
    200005: "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    200006: "ACL_ERROR_FEATURE_UNSUPPORTED",
    300000: "ACL_ERROR_STORAGE_OVER_LIMIT",
    500000: "ACL_ERROR_INTERNAL_ERROR",
    500001: "ACL_ERROR_FAILURE",
    500003: "ACL_ERROR_RT_FAILURE",
    500004: "ACL_ERROR_DRV_FAILURE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",
    107006: "ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID",
    107007: "ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL",
    107008: "ACL_ERROR_RT_ADDR_UNALIGNED",
    107016: "ACL_ERROR_RT_INVALID_MEMORY_TYPE",
    107017: "ACL_ERROR_RT_INVALID_HANDLE",
    107018: "ACL_ERROR_RT_INVALID_MALLOC_TYPE",
    207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207002: "ACL_ERROR_RT_MEMORY_FREE",
    207004: "ACL_ERROR_RT_NO_DEVICE",
    207005: "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL",
    207007: "ACL_ERROR_RT_NO_EVENT_RESOURCE",
    207008: "ACL_ERROR_RT_NO_STREAM_RESOURCE",
    507000: "ACL_ERROR_RT_INTERNAL_ERROR",
    507004: "ACL_ERROR_RT_STREAM_NOT_COMPLETE",
    507006: "ACL_ERROR_RT_EVENT_NOT_COMPLETE",
    507013: "ACL_ERROR_RT_SYS_DMA",
    507033: "ACL_ERROR_RT_DEV_SETUP_ERROR",
    507053: "ACL_ERROR_RT_DEVICE_MEM_ERROR",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}

_KIND = {H2D: 1, D2H: 2, D2D: 3}      # aclrtMemcpyKind


class AscendPlugin(VendorPlugin):
    name = "ascend"
    priority = 30
    vendor_libraries = ("libascendcl.so",)
    simulator_library = "libascend_sim"
    api_label = "Ascend ACL runtime"
    cdef = CDEF
    code_names = CODE_NAMES
    oom_codes = frozenset({207001, 200000})     # ACL_ERROR_RT_MEMORY_ALLOCATION, ACL_ERROR_BAD_ALLOC

    def __init__(self) -> None:
        super().__init__()
        self._peers: set[tuple[int, int]] = set()
        self._peer_lock = threading.Lock()

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"), ("/usr/local/Ascend/ascend-toolkit/latest",)):
            dirs += [f"{root}/lib64", f"{root}/runtime/lib64", f"{root}/acllib/lib64", f"{root}/lib"]
        return dirs

    def _open(self) -> int:
        rc = self.lib.aclInit(self.ffi.NULL)
        if rc not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
            raise self._error(rc, "aclInit")
        count = self.ffi.new("uint32_t *")
        rc = self.lib.aclrtGetDeviceCount(count)
        if rc:
            raise self._error(rc, "aclrtGetDeviceCount")
        return int(count[0])

    def _bind(self) -> None:
        lib, ffi = self.lib, self.ffi
        self._cast = ffi.cast
        self._from_buffer = ffi.from_buffer
        self._memcpy_async = lib.aclrtMemcpyAsync
        self._sync_stream = lib.aclrtSynchronizeStream
        self._stream_query_fn = self._sym("aclrtStreamQuery")
        self._soc_name = self._sym("aclrtGetSocName")

    def _set_device(self, index: int) -> None:
        rc = self.lib.aclrtSetDevice(index)
        if rc:
            raise self._error(rc, f"aclrtSetDevice({index})")

    def _vendor_message(self, code: int) -> str:
        p = self.lib.aclGetRecentErrMsg()
        return self.ffi.string(p).decode("utf-8", "replace").strip() if p != self.ffi.NULL else ""

    def properties(self, index: int) -> dict:
        props = super().properties(index)
        self._use(index)
        if self._soc_name is not None:
            p = self._soc_name()
            if p != self.ffi.NULL:
                props["name"] = self.ffi.string(p).decode()
        free, total = self._mem_info(index)
        props["total_memory"] = total
        return props

    # -- memory ---------------------------------------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        self._use(index)
        out = self.ffi.new("void **")
        rc = self.lib.aclrtMalloc(out, max(nbytes, 1), 0)      # ACL_MEM_MALLOC_HUGE_FIRST
        if rc:
            raise self._oom(rc, index, nbytes, "aclrtMalloc")
        return int(self._cast("uintptr_t", out[0]))

    def _free(self, index: int, handle: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtFree(self._cast("void *", handle))
        if rc:
            raise self._error(rc, "aclrtFree")

    def _mem_info(self, index: int) -> tuple[int, int]:
        self._use(index)
        free = self.ffi.new("size_t *")
        total = self.ffi.new("size_t *")
        rc = self.lib.aclrtGetMemInfo(ACL_HBM_MEM, free, total)
        if rc:
            raise self._error(rc, "aclrtGetMemInfo")
        return int(free[0]), int(total[0])

    # -- copies ---------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        if self._tls.dev != index:
            self._use(index)
        if kind == H2D:
            d = self._cast("void *", dst + dst_off)
            s = self._from_buffer(src) + src_off
        elif kind == D2H:
            d = self._from_buffer(dst) + dst_off
            s = self._cast("void *", src + src_off)
        elif kind == D2D:
            d = self._cast("void *", dst + dst_off)
            s = self._cast("void *", src + src_off)
        else:
            raise DeviceError(f"unknown copy kind {kind!r}", backend=self.name)
        rc = self._memcpy_async(d, nbytes, s, nbytes, _KIND[kind], stream)
        if rc:
            raise self._error(rc, "aclrtMemcpyAsync")

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        self._use(src_index)
        pair = (src_index, dst_index)
        if src_index != dst_index and pair not in self._peers:
            with self._peer_lock:
                rc = self.lib.aclrtDeviceEnablePeerAccess(dst_index, 0)
                if rc:
                    raise self._error(rc, f"aclrtDeviceEnablePeerAccess({dst_index})")
                self._peers.add(pair)
        rc = self._memcpy_async(self._cast("void *", dst + dst_off), nbytes, self._cast("void *", src + src_off),
                                nbytes, 3, stream)
        if rc:
            raise self._error(rc, "aclrtMemcpyAsync (peer)")

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtMemsetAsync(self._cast("void *", dst + dst_off), nbytes, value, nbytes, stream)
        if rc:
            raise self._error(rc, "aclrtMemsetAsync")

    # -- streams --------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        return self.ffi.NULL

    def _stream_create(self, index: int) -> Any:
        self._use(index)
        out = self.ffi.new("aclrtStream *")
        rc = self.lib.aclrtCreateStream(out)
        if rc:
            raise self._error(rc, "aclrtCreateStream")
        return out[0]

    def _stream_destroy(self, index: int, stream: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtDestroyStream(stream)
        if rc:
            raise self._error(rc, "aclrtDestroyStream")

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        if self._tls.dev != index:
            self._use(index)
        rc = self._sync_stream(stream)
        if rc:
            raise self._error(rc, "aclrtSynchronizeStream")

    def _stream_query(self, index: int, stream: Any) -> bool:
        self._use(index)
        if self._stream_query_fn is not None:
            status = self.ffi.new("aclrtStreamStatus *")
            rc = self._stream_query_fn(stream, status)
            if rc:
                raise self._error(rc, "aclrtStreamQuery")
            return int(status[0]) == 0          # ACL_STREAM_STATUS_COMPLETE
        # older CANN has no aclrtStreamQuery: record an event and ask it
        ev = self._event_create(index)
        try:
            self._event_record(index, ev, stream)
            return self._event_query(index, ev)
        finally:
            self._event_destroy(index, ev)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtStreamWaitEvent(stream, event)
        if rc:
            raise self._error(rc, "aclrtStreamWaitEvent")

    # -- events ---------------------------------------------------------
    def _event_create(self, index: int) -> Any:
        self._use(index)
        out = self.ffi.new("aclrtEvent *")
        rc = self.lib.aclrtCreateEvent(out)
        if rc:
            raise self._error(rc, "aclrtCreateEvent")
        return out[0]

    def _event_destroy(self, index: int, event: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtDestroyEvent(event)
        if rc:
            raise self._error(rc, "aclrtDestroyEvent")

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtRecordEvent(event, stream)
        if rc:
            raise self._error(rc, "aclrtRecordEvent")

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._use(index)
        rc = self.lib.aclrtSynchronizeEvent(event)
        if rc:
            raise self._error(rc, "aclrtSynchronizeEvent")

    def _event_query(self, index: int, event: Any) -> bool:
        self._use(index)
        status = self.ffi.new("aclrtEventRecordedStatus *")
        rc = self.lib.aclrtQueryEventStatus(event, status)
        if rc:
            raise self._error(rc, "aclrtQueryEventStatus")
        return int(status[0]) == 1              # ACL_EVENT_RECORDED_STATUS_COMPLETE

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        self._use(index)
        ms = self.ffi.new("float *")
        rc = self.lib.aclrtEventElapsedTime(ms, start, end)
        if rc:
            raise self._error(rc, "aclrtEventElapsedTime")
        return float(ms[0])

    def _synchronize(self, index: int) -> None:
        self._use(index)
        rc = self.lib.aclrtSynchronizeDevice()
        if rc:
            raise self._error(rc, "aclrtSynchronizeDevice")
