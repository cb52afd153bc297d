"""RCCL, Hygon's collective library (``librccl.so``, NCCL's API), as the hygon backend's ``native_ccl()``.

The declarations are the vendor's (csrc/include/rccl); the simulator library exports the
same API (csrc/sim/rccl.c), so the same binding serves the real chip and the simulator.
"""
from __future__ import annotations

from typing import Any

from ..runtime.native_ccl import NativeLibrary
from ._headers import Declarations

__all__ = ["Rccl"]


_NCCL_CDEF = Declarations("rccl/rccl.h")      # csrc/include


class Rccl(NativeLibrary):
    api = "RCCL"
    backend = "hygon"
    real_names = ("librccl.so", "librccl.so.1")
    cdef = _NCCL_CDEF
    id_type = "ncclUniqueId"
    probe = "ncclCommInitRank"
    codes = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
             4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
    invalid_codes = frozenset({4})
    dtypes = {"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8,
              "bfloat16": 9}
    byte = 1                                    # ncclUint8
    redops = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
    calls = {"all_reduce": ("ncclAllReduce", "send recv count dtype redop comm stream"),
             "broadcast": ("ncclBroadcast", "send recv count dtype root comm stream"),
             "reduce": ("ncclReduce", "send recv count dtype redop root comm stream"),
             "all_gather": ("ncclAllGather", "send recv count dtype comm stream"),
             "reduce_scatter": ("ncclReduceScatter", "send recv count dtype redop comm stream"),
             "all_to_all": ("ncclAllToAll", "send recv count dtype comm stream"),
             "send": ("ncclSend", "send count dtype root comm stream"),
             "recv": ("ncclRecv", "recv count dtype root comm stream")}

    def _get_id(self, uid: Any) -> int:
        return self.lib.ncclGetUniqueId(uid)

    def _init(self, out: Any, nranks: int, uid: Any, rank: int) -> int:
        comm = self.ffi.cast("ncclComm_t *", out)
        return self.lib.ncclCommInitRank(comm, nranks, uid[0], rank)          # the id by value

    def destroy(self, comm: Any) -> int:
        return self.lib.ncclCommDestroy(comm)

    def abort(self, comm: Any) -> int:
        return self.lib.ncclCommAbort(comm)

    def async_error(self, comm: Any) -> int:
        err = self.ffi.new("ncclResult_t *")
        rc = self.lib.ncclCommGetAsyncError(comm, err)
        return rc or int(err[0])

    def comm_detail(self, comm: Any) -> str:
        p = self.lib.ncclGetLastError(comm)
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def group_start(self) -> int:
        return self.lib.ncclGroupStart()

    def group_end(self) -> int:
        return self.lib.ncclGroupEnd()
