"""Baidu Kunlun XPUs through the XPU runtime (libxpurt.so), bound with cffi.

Without the XPU runtime installed (and ``ANYCHIP_SIMULATE`` not ``never``) the
simulator library ``libkunlun_sim`` stands in with the same ``xpu_*`` symbols.

The XPU runtime has no memset, no event timing, no stream query, no device-wide
synchronize and no free-memory query. This backend builds them from what the
runtime has: memset from host-to-device copies of a filled host buffer, stream
query from an event, device synchronize from the streams it created, free memory
from the capacity minus its own allocations. The simulator also offers memset,
event timing and memory information as ``anychip_sim_xpu_*`` extensions; they are
used when the loaded library has them (only the simulator does), and event timing
is reported unsupported otherwise.

Handles: device memory is an integer address; streams and events are the
``XPUStream`` / ``XPUEvent`` values the runtime returns; the default stream is NULL.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..runtime.errors import UnsupportedError
from ..runtime.plugin import D2D, D2H, H2D
from ._headers import Declarations
from ._vendor import VendorPlugin, roots
from .bkcl import Bkcl

__all__ = ["KunlunPlugin"]


XPU_SUCCESS = 0
XPUERR_BUSY = 716

#: XPUError_t (xpu/defs.h): XPU_ERRNO_BASE 700 + n
CODE_NAMES: dict[int, str] = {
    0: "XPU_SUCCESS",
    701: "XPUERR_INVALID_DEVICE",
    702: "XPUERR_UNINIT",
    703: "XPUERR_NODEV",
    704: "XPUERR_VERSION",
    705: "XPUERR_NOMEM",
    706: "XPUERR_NOCPUMEM",
    707: "XPUERR_INVALID_PARAM",
    708: "XPUERR_NOXPUFUNC",
    709: "XPUERR_LDSO",
    710: "XPUERR_LDSYM",
    711: "XPUERR_SIMULATOR",
    712: "XPUERR_NOSUPPORT",
    713: "XPUERR_ABNORMAL",
    714: "XPUERR_KEXCEPTION",
    715: "XPUERR_TIMEOUT",
    716: "XPUERR_BUSY",
    717: "XPUERR_USEAFCLOSE",
    718: "XPUERR_UCECC",
    719: "XPUERR_OVERHEAT",
    800: "XPUERR_UNEXPECT",
    801: "XPUERR_DEVRESET",
    802: "XPUERR_HWEXCEPTION",
    803: "XPUERR_HBM_INIT",
    804: "XPUERR_DEVINIT",
    805: "XPUERR_PEERRESET",
    806: "XPUERR_MAXDEV",
    807: "XPUERR_NOIOC",
    808: "XPUERR_DMATIMEOUT",
    809: "XPUERR_DMAABORT",
    810: "XPUERR_MCUUNINIT",
    811: "XPUERR_OLDFW",
    812: "XPUERR_PCIE",
    813: "XPUERR_FAULT",
    814: "XPUERR_INTERRUPTED",
}

#: short descriptions (the runtime's xpu_strerror is an inline function in its header, not an export)
MESSAGES: dict[int, str] = {
    701: "invalid XPU device",
    702: "XPU runtime not initialized",
    703: "no XPU device available",
    705: "device memory exhausted",
    706: "host memory exhausted",
    707: "invalid parameter",
    712: "operation not supported",
    713: "device in an abnormal state after an earlier error",
    716: "resource busy",
    717: "stream used after it was destroyed",
    800: "unexpected error",
    808: "DMA timed out",
    809: "DMA aborted (bad device or host address)",
}

_FILL_CHUNK = 1 << 20                     # host fill buffer for the memset fallback


class KunlunPlugin(VendorPlugin):
    name = "kunlun"
    ccl_library = Bkcl
    priority = 20
    vendor_libraries = ("libxpurt.so",)
    simulator_library = "libkunlun_sim"
    api_label = "Kunlun XPU runtime"
    cdef = Declarations("xpu/runtime.h")     # csrc/include/xpu/runtime.h
    code_names = CODE_NAMES
    oom_codes = frozenset({705})                  # XPUERR_NOMEM
    copy_kinds = {D2H: 0, H2D: 1, D2D: 2}         # XPUMemcpyKind: device-to-host comes first
    stream_type = "XPUStream"
    event_type = "XPUEvent"

    SET_DEVICE = "xpu_set_device"
    GET_DEVICE = "xpu_current_device"
    MALLOC = "xpu_malloc"
    FREE = "xpu_free"
    MEMCPY_ASYNC = "xpu_memcpy_async"
    STREAM_CREATE = "xpu_stream_create"
    STREAM_DESTROY = "xpu_stream_destroy"
    STREAM_SYNCHRONIZE = "xpu_wait"
    STREAM_WAIT_EVENT = "xpu_stream_wait_event"
    EVENT_CREATE = "xpu_event_create"
    EVENT_DESTROY = "xpu_event_destroy"
    EVENT_RECORD = "xpu_event_record"
    EVENT_SYNCHRONIZE = "xpu_event_wait"
    EVENT_ELAPSED = "anychip_sim_xpu_event_elapsed_time"      # simulator only (see _bind)
    DEVICE_SYNCHRONIZE = ""             # none: the default stream and the streams created here

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}          # address -> bytes, for free memory without a runtime query
        self._allocated: dict[int, int] = {}      # device -> bytes allocated here
        self._fill: dict[int, np.ndarray] = {}    # byte value -> host buffer (memset fallback)

    def search_dirs(self) -> list[str]:
        dirs = []
        for root in roots(("XPU_HOME", "XPURT_HOME"), ("/usr/local/xpu", "/opt/xpu", "/usr/local/xpurt")):
            dirs += [f"{root}/lib64", f"{root}/lib", f"{root}/so", f"{root}/xre/so", f"{root}/runtime/lib64"]
        return dirs

    def _open(self) -> int:
        return int(self._out("int", "xpu_device_count"))

    def _bind(self) -> None:
        self._ext_memset = self._sym("anychip_sim_xpu_memset_async")
        self._ext_elapsed = self._sym("anychip_sim_xpu_event_elapsed_time")
        self._ext_mem_info = self._sym("anychip_sim_xpu_mem_info")

    def use_runtime_only(self) -> None:
        """Ignore the simulator's extensions and use only the XPU runtime's own API
        (what a real libxpurt.so offers); the tests use this to exercise the fallbacks."""
        self.available()
        self._ext_memset = self._ext_elapsed = self._ext_mem_info = None
        self._timed_stream_wait = self._timed_event_wait = self._timed_device_wait = None

    def code_name(self, code: int) -> str:
        return self.code_names.get(abs(code), f"status {code}")   # some releases return -code

    def _vendor_message(self, code: int) -> str:
        return MESSAGES.get(abs(code), "")

    def _attr(self, index: int, attr: int) -> int:
        v = self.ffi.new("uint64_t *")
        self._call("xpu_device_get_attr", v, attr, index)
        return int(v[0])

    def properties(self, index: int) -> dict:
        props = super().properties(index)
        model = self._attr(index, 4)                      # XPUATTR_MODEL
        gen = "KL1" if model <= 1 else "KL2" if model < 300 else "KL3"
        props["name"] = f"Kunlun {gen} (model {model})"
        props["model"] = model
        props["total_memory"] = self._attr(index, 5)      # XPUATTR_MEM_MAIN_CAPACITY
        return props

    # -- memory ---------------------------------------------------------
    def _malloc_args(self, out: Any, nbytes: int) -> tuple:
        return out, nbytes, 0                             # XPU_MEM_MAIN

    def _malloc(self, index: int, nbytes: int) -> Any:
        addr = super()._malloc(index, nbytes)
        with self._lock:
            self._sizes[addr] = nbytes
            self._allocated[index] = self._allocated.get(index, 0) + nbytes
        return addr

    def _free(self, index: int, handle: Any) -> None:
        super()._free(index, handle)
        with self._lock:
            n = self._sizes.pop(handle, 0)
            self._allocated[index] = self._allocated.get(index, 0) - n

    def _mem_info(self, index: int) -> tuple[int, int]:
        self._use(index)
        if self._ext_mem_info is not None:
            free = self.ffi.new("uint64_t *")
            total = self.ffi.new("uint64_t *")
            self._call("anychip_sim_xpu_mem_info", free, total)
            return int(free[0]), int(total[0])
        total = self._attr(index, 5)
        with self._lock:
            used = self._allocated.get(index, 0)
        return max(total - used, 0), total          # what this process allocated; others are not seen

    # -- copies ---------------------------------------------------------
    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        # xpu_memcpy_peer is synchronous: order it after the stream's work, then copy
        self._stream_synchronize(src_index, stream)
        self._call("xpu_memcpy_peer", dst_index, self._cast("void *", dst + dst_off), src_index,
                   self._cast("void *", src + src_off), nbytes)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        self._use(index)
        if self._ext_memset is not None:
            self._call("anychip_sim_xpu_memset_async", self._cast("void *", dst + dst_off), value, nbytes, stream)
            return
        # the runtime has no memset: copy from a host buffer holding the byte, which stays
        # alive (and unchanged) for the life of the plugin, so the copies may run later
        with self._lock:
            fill = self._fill.get(value)
            if fill is None:
                fill = self._fill[value] = np.full(_FILL_CHUNK, value, dtype=np.uint8)
        for done in range(0, nbytes, _FILL_CHUNK):
            n = min(_FILL_CHUNK, nbytes - done)
            self._copy(index, dst, dst_off + done, fill, 0, n, H2D, stream)

    # -- streams and events ----------------------------------------------
    def _stream_done(self, stream: Any) -> bool:
        return self._stream_done_by_event(stream)        # the runtime has no stream query

    def _event_done(self, event: Any) -> bool:
        rc = self.lib.xpu_event_query(event)
        if rc and abs(rc) != XPUERR_BUSY:
            raise self.status.error(rc, "xpu_event_query")
        return rc == XPU_SUCCESS

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        if self._ext_elapsed is None:
            raise UnsupportedError("the Kunlun XPU runtime has no event timing")
        return super()._event_elapsed_ms(index, start, end)
