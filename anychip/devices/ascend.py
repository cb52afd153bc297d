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
from ._headers import Declarations
from ._vendor import VendorPlugin, roots
from .hccl import Hccl

__all__ = ["AscendPlugin"]


ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_RT_NO_DEVICE = 207004
ACL_HBM_MEM = 1

#: aclError values (acl/acl_base.h and acl/error_codes/rt_error_codes.h)
CODE_NAMES: dict[int, str] = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100033: "ACL_ERROR_REPEAT_SUBSCRIBE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    100042: "ACL_ERROR_PROF_ALREADY_RUN",
    100043: "ACL_ERROR_PROF_NOT_RUN",
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
    107011: "ACL_ERROR_RT_STREAM_SUBSCRIBE",
    107012: "ACL_ERROR_RT_THREAD_SUBSCRIBE",
    107015: "ACL_ERROR_RT_STREAM_NO_CB_REG",
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
    507012: "ACL_ERROR_RT_REPORT_TIMEOUT",
    507013: "ACL_ERROR_RT_SYS_DMA",
    507033: "ACL_ERROR_RT_DEV_SETUP_ERROR",
    507053: "ACL_ERROR_RT_DEVICE_MEM_ERROR",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
}



class AscendPlugin(VendorPlugin):
    name = "ascend"
    ccl_library = Hccl
    priority = 30
    vendor_libraries = ("libascendcl.so",)
    simulator_library = "libascend_sim"
    api_label = "Ascend ACL runtime"
    cdef = Declarations("acl/acl.h")        # csrc/include/acl/acl.h
    code_names = CODE_NAMES
    oom_codes = frozenset({207001, 200000})     # ACL_ERROR_RT_MEMORY_ALLOCATION, ACL_ERROR_BAD_ALLOC
    copy_kinds = {H2D: 1, D2H: 2, D2D: 3}      # aclrtMemcpyKind
    stream_type = "aclrtStream"
    event_type = "aclrtEvent"

    SET_DEVICE = "aclrtSetDevice"
    GET_DEVICE = "aclrtGetDevice"
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
            raise self.status.error(rc, "aclInit")
        count = self.ffi.new("uint32_t *")
        rc = self.lib.aclrtGetDeviceCount(count)
        if rc == ACL_ERROR_RT_NO_DEVICE:            # e.g. ASCEND_RT_VISIBLE_DEVICES rejected
            self._note = self._message(rc)
            return 0
        if rc:
            raise self.status.error(rc, "aclrtGetDeviceCount")
        return int(count[0])

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
