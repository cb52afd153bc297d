"""BKCL, Kunlun's collective library (``libbkcl.so``), as the kunlun backend's ``native_ccl()``.

The declarations are the vendor's (csrc/include/bkcl); the simulator library exports the
same API (csrc/sim/bkcl.c) plus ``anychip_sim_bkcl_async_error`` (BKCL publishes no such
call), so the same binding serves the real chip and the simulator.
"""
from __future__ import annotations

from typing import Any

from ..runtime.native_ccl import NativeLibrary
from ._headers import Declarations

__all__ = ["Bkcl"]


_BKCL_CDEF = Declarations("bkcl/bkcl.h")      # csrc/include


class Bkcl(NativeLibrary):
    api = "BKCL"
    backend = "kunlun"
    real_names = ("libbkcl.so",)
    extra_roots = (("BKCL_HOME", "XCCL_HOME"), ("/usr/local/xccl", "/usr/local/bkcl"))
    cdef = _BKCL_CDEF
    id_type = "BKCLUniqueId"
    probe = "bkcl_init_rank"
    codes = {0: "BKCL_SUCCESS", 1: "BKCL_INVALID_ARGUMENT", 2: "BKCL_RUNTIME_ERROR", 3: "BKCL_SYSTEM_ERROR",
             4: "BKCL_INTERNAL_ERROR"}
    invalid_codes = frozenset({1})
    dtypes = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "uint8": 4, "int32": 5, "int64": 6}
    byte = 4                                    # BKCL_UINT8
    redops = {"sum": 0, "prod": 1, "min": 2, "max": 3}
    calls = {"all_reduce": ("bkcl_all_reduce", "comm send recv count dtype redop stream"),
             "broadcast": ("bkcl_broadcast", "comm send recv count dtype root stream"),
             "reduce": ("bkcl_reduce", "comm send recv count dtype redop root stream"),
             "all_gather": ("bkcl_all_gather", "comm send count recv dtype stream"),
             "reduce_scatter": ("bkcl_reduce_scatter", "comm send recv count dtype redop stream"),
             "all_to_all": ("bkcl_all_to_all", "comm send count recv dtype stream"),
             "send": ("bkcl_send", "comm send count root dtype stream"),
             "recv": ("bkcl_recv", "comm recv count root dtype stream")}

    def _get_id(self, uid: Any) -> int:
        return self.lib.bkcl_get_unique_id(uid)

    def _init(self, out: Any, nranks: int, uid: Any, rank: int) -> int:
        return self.lib.bkcl_init_rank(self.ffi.cast("BKCLContext_t *", out), rank, nranks, uid)

    def destroy(self, comm: Any) -> int:
        return self.lib.bkcl_destroy_context(comm)

    def abort(self, comm: Any) -> int:
        return self.lib.bkcl_comm_abort(comm)

    def async_error(self, comm: Any) -> int:
        if not self.simulated:
            return 0                            # the real BKCL reports failures through the stream
        err = self.ffi.new("BKCLResult_t *")
        rc = self.lib.anychip_sim_bkcl_async_error(comm, err)
        return rc or int(err[0])

    def group_start(self) -> int:
        return self.lib.bkcl_group_start()

    def group_end(self) -> int:
        return self.lib.bkcl_group_end()
