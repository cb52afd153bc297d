"""HCCL, Ascend's collective library (``libhccl.so``), as the ascend backend's ``native_ccl()``.

The declarations are the vendor's (csrc/include/hccl); the simulator library exports the
same API (csrc/sim/hccl.c), so the same binding serves the real chip and the simulator.
"""
from __future__ import annotations

from typing import Any

from ..runtime.native_ccl import NativeLibrary
from ._headers import Declarations

__all__ = ["Hccl"]


_HCCL_CDEF = Declarations("hccl/hccl_types.h", "hccl/hccl.h")      # csrc/include


class Hccl(NativeLibrary):
    api = "HCCL"
    backend = "ascend"
    real_names = ("libhccl.so",)
    cdef = _HCCL_CDEF
    id_type = "HcclRootInfo"
    probe = "HcclCommInitRootInfo"
    codes = {0: "HCCL_SUCCESS", 1: "HCCL_E_PARA", 2: "HCCL_E_PTR", 3: "HCCL_E_MEMORY", 4: "HCCL_E_INTERNAL",
             5: "HCCL_E_NOT_SUPPORT", 6: "HCCL_E_NOT_FOUND", 7: "HCCL_E_UNAVAIL", 8: "HCCL_E_SYSCALL",
             9: "HCCL_E_TIMEOUT", 15: "HCCL_E_RUNTIME", 19: "HCCL_E_NETWORK", 20: "HCCL_E_AGAIN",
             21: "HCCL_E_REMOTE", 22: "HCCL_E_SUSPENDING", 24: "HCCL_E_OOM"}
    timeout_codes = frozenset({9})
    invalid_codes = frozenset({1, 2, 5})         # PARA, PTR, NOT_SUPPORT (an unknown type or op)
    dtypes = {"int8": 0, "int32": 2, "float16": 3, "float32": 4, "int64": 5, "uint8": 7, "float64": 10,
              "bfloat16": 11}
    byte = 7                                    # HCCL_DATA_TYPE_UINT8
    redops = {"sum": 0, "prod": 1, "max": 2, "min": 3}
    calls = {"all_reduce": ("HcclAllReduce", "send recv count dtype redop comm stream"),
             "broadcast": ("HcclBroadcast", "recv count dtype root comm stream"),        # in place (see _issue)
             "reduce": ("HcclReduce", "send recv count dtype redop root comm stream"),
             "all_gather": ("HcclAllGather", "send recv count dtype comm stream"),
             "reduce_scatter": ("HcclReduceScatter", "send recv count dtype redop comm stream"),
             "all_to_all": ("HcclAlltoAll", "send count dtype recv count dtype comm stream"),
             "send": ("HcclSend", "send count dtype root comm stream"),
             "recv": ("HcclRecv", "recv count dtype root comm stream"),
             "barrier": ("HcclBarrier", "comm stream")}
    broadcast_in_place = True
    null_stream = False                         # HCCL_E_PTR (CANN param_check.cc, HcomCheckOpParam)

    def supports(self, spec: Any) -> bool:
        # CANN on 910B / 910_93 refuses PROD of bf16 (param_check.cc, HcomCheckReduceDataType):
        # the engine does that one
        if spec.dtype == "bfloat16" and spec.op == "prod" and spec.kind in ("all_reduce", "reduce", "reduce_scatter"):
            return False
        return NativeLibrary.supports(self, spec)

    def _get_id(self, uid: Any) -> int:
        return self.lib.HcclGetRootInfo(uid)

    def _init(self, out: Any, nranks: int, uid: Any, rank: int) -> int:
        return self.lib.HcclCommInitRootInfo(nranks, uid, rank, out)

    def destroy(self, comm: Any) -> int:
        return self.lib.HcclCommDestroy(comm)

    def async_error(self, comm: Any) -> int:
        err = self.ffi.new("HcclResult *")
        rc = self.lib.HcclGetCommAsyncError(comm, err)
        return rc or int(err[0])

    def group_start(self) -> int:
        return self.lib.HcclGroupStart()

    def group_end(self) -> int:
        return self.lib.HcclGroupEnd()
