"""Huawei Ascend NPUs through the AscendCL runtime (libascendcl.so), bound with cffi.

Without CANN installed (and ``ANYCHIP_SIMULATE`` not ``never``) the simulator
library ``libascend_sim`` stands in: it exports the same ``aclrt*`` symbols, so
the code below is the same for a real and a simulated chip.

Handles: device memory is an integer address; streams and events are the
``aclrtStream`` / ``aclrtEvent`` values ACL returns; the default stream is NULL
(ACL's default stream of the thread's current device).
"""
from __future__ import annotations

from typing import Any

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



class AscendPlugin(VendorPlugin):
    name = "ascend"
    priority = 30
    vendor_libraries = ("libascendcl.so",)
    simulator_library = "libascend_sim"
    api_label = "Ascend ACL runtime"
    cdef = CDEF
    code_names = CODE_NAMES
    oom_codes = frozenset({207001, 200000})     # ACL_ERROR_RT_MEMORY_ALLOCATION, ACL_ERROR_BAD_ALLOC
    copy_kinds = {H2D: 1, D2H: 2, D2D: 3}      # aclrtMemcpyKind
    stream_type = "aclrtStream"
    event_type = "aclrtEvent"

    SET_DEVICE = "aclrtSetDevice"
    MALLOC = "aclrtMalloc"
    FREE = "aclrtFree"
    MEMCPY_ASYNC = "aclrtMemcpyAsync"
    copy_dest_max = True
    STREAM_CREATE = "aclrtCreateStream"
    STREAM_DESTROY = "aclrtDestroyStream"
    STREAM_SYNCHRONIZE = "aclrtSynchronizeStream"
    STREAM_WAIT_EVENT = "aclrtStreamWaitEvent"
    EVENT_CREATE = "aclrtCreateEvent"
    EVENT_DESTROY = "aclrtDestroyEvent"
    EVENT_RECORD = "aclrtRecordEvent"
    EVENT_SYNCHRONIZE = "aclrtSynchronizeEvent"
    EVENT_ELAPSED = "aclrtEventElapsedTime"
    DEVICE_SYNCHRONIZE = "aclrtSynchronizeDevice"

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"), ("/usr/local/Ascend/ascend-toolkit/latest",)):
            dirs += [f"{root}/lib64", f"{root}/runtime/lib64", f"{root}/acllib/lib64", f"{root}/lib"]
        return dirs

    def _open(self) -> int:
        rc = self.lib.aclInit(self.ffi.NULL)
        if rc not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
            raise self._error(rc, "aclInit")
        return int(self._out("uint32_t", "aclrtGetDeviceCount"))

    def _vendor_message(self, code: int) -> str:
        p = self.lib.aclGetRecentErrMsg()
        return self.ffi.string(p).decode("utf-8", "replace").strip() if p != self.ffi.NULL else ""

    def properties(self, index: int) -> dict:
        props = super().properties(index)
        self._use(index)
        soc = self._sym("aclrtGetSocName")
        p = soc() if soc is not None else self.ffi.NULL
        if p != self.ffi.NULL:
            props["name"] = self.ffi.string(p).decode()
        props["total_memory"] = self._mem_info(index)[1]
        return props

    def _malloc_args(self, out: Any, nbytes: int) -> tuple:
        return out, nbytes, 0                    # ACL_MEM_MALLOC_HUGE_FIRST

    def _mem_info(self, index: int) -> tuple[int, int]:
        self._use(index)
        return self._mem_info_call("aclrtGetMemInfo", ACL_HBM_MEM)

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        self._use(src_index)
        self._enable_peer(src_index, dst_index, "aclrtDeviceEnablePeerAccess")
        self._copy(src_index, dst, dst_off, src, src_off, nbytes, D2D, stream)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        self._use(index)
        self._call("aclrtMemsetAsync", self._cast("void *", dst + dst_off), nbytes, value, nbytes, stream)

    def _stream_done(self, stream: Any) -> bool:
        if self._sym("aclrtStreamQuery") is None:    # older CANN: ask an event
            return self._stream_done_by_event(stream)
        return int(self._out("aclrtStreamStatus", "aclrtStreamQuery", stream)) == 0   # COMPLETE

    def _event_done(self, event: Any) -> bool:
        return int(self._out("aclrtEventRecordedStatus", "aclrtQueryEventStatus", event)) == 1   # COMPLETE
