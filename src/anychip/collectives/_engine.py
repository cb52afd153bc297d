"""cffi binding of the shared-memory collective engine (csrc/ccl, libanychip_ccl).

Only the declarations of ``csrc/ccl/ccl.h``; the engine itself is described there.
"""
from __future__ import annotations

import threading
from typing import Any

from ..runtime._libs import dlopen, find_library, new_ffi
from ..runtime.errors import AnychipError, CollectiveError, CollectiveTimeout, InvalidArgumentError

#: nothing public: the engine binding serves the collectives package's transports
__all__: list[str] = []

# ccl_buf.ptr is declared uintptr_t here (same size and place as the header's void *),
# so addresses are assigned as Python ints without a cast per call.
CDEF = """
typedef struct ccl_buf {
    uintptr_t ptr; uint64_t ipc_offset; int32_t has_ipc; int32_t reserved; uint8_t ipc_handle[64];
} ccl_buf;
typedef struct ccl_op {
    int32_t kind; int32_t dtype; int32_t redop; int32_t root; uint64_t count; ccl_buf send; ccl_buf recv;
} ccl_op;
typedef struct ccl_comm ccl_comm;
typedef struct ccl_task ccl_task;
typedef int (*ccl_ipc_open_fn)(const void *handle, void **ptr);
typedef int (*ccl_ipc_close_fn)(void *ptr);
int ccl_comm_init(const char *id, int rank, int nranks, double timeout_s, ccl_comm **out);
const char *ccl_init_error(void);
int ccl_sweep_segments(void);
int ccl_comm_destroy(ccl_comm *comm);
int ccl_comm_rank(const ccl_comm *comm);
int ccl_comm_size(const ccl_comm *comm);
void ccl_comm_set_timeout(ccl_comm *comm, double seconds);
void ccl_comm_set_check(ccl_comm *comm, int on);
void ccl_comm_set_label(ccl_comm *comm, const char *label);
void ccl_comm_set_ipc(ccl_comm *comm, ccl_ipc_open_fn open, ccl_ipc_close_fn close);
void ccl_comm_set_thresholds(ccl_comm *comm, uint64_t small_max, uint64_t zero_copy_min);
void ccl_comm_abort(ccl_comm *comm, const char *why);
const char *ccl_comm_error(const ccl_comm *comm);
int ccl_run(ccl_comm *comm, const ccl_op *ops, int nops);
ccl_task *ccl_task_new(ccl_comm *comm, const ccl_op *ops, int nops);
void ccl_task_run(void *task);
int ccl_task_status(const ccl_task *task);
int ccl_task_wait(ccl_task *task, double timeout_s);
const char *ccl_task_error(const ccl_task *task);
void ccl_task_free(ccl_task *task);
size_t ccl_dtype_size(int dtype);
const char *ccl_status_name(int status);
int ccl_reduce_local(void *dst, const void *const *srcs, int nsrc, uint64_t n, int dtype, int redop, int divisor);
"""

#: op name -> ccl_kind
KINDS = {"all_reduce": 0, "broadcast": 1, "reduce": 2, "all_gather": 3, "reduce_scatter": 4,
         "all_to_all": 5, "send": 6, "recv": 7, "barrier": 8}
#: dtype name -> ccl_dtype
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 5, "float32": 6, "float64": 7}
#: reduce op name -> ccl_redop
REDOPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
#: ccl_status values
STATUS = {"ok": 0, "invalid": 1, "timeout": 2, "peer_dead": 3, "mismatch": 4, "aborted": 5, "system": 6,
          "ipc": 7, "pending": 8}

_lock = threading.Lock()
_engine: tuple[Any, Any] | None = None


def engine() -> tuple[Any, Any]:
    """(ffi, lib) of libanychip_ccl, loaded once."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                path = find_library("libanychip_ccl")
                if path is None:
                    raise CollectiveError("the collective engine libanychip_ccl is not built "
                                          "(run `pip install -e .` or `python setup.py build_ext --inplace`)")
                ffi = new_ffi()
                ffi.cdef(CDEF)
                _engine = (ffi, dlopen(ffi, path))
    return _engine


def sweep_segments() -> int:
    """Unlink the segments left by jobs whose ranks were all stopped while a communicator was
    being made (ccl_sweep_segments); how many. A launcher calls it once its ranks are gone."""
    try:
        return int(engine()[1].ccl_sweep_segments())
    except CollectiveError:              # the engine is not built: it made no segment either
        return 0


def error_of(status: int, message: str) -> AnychipError:
    """The error a failed engine call raises (by its ccl_status)."""
    if status == STATUS["timeout"]:
        return CollectiveTimeout(message)
    if status == STATUS["invalid"]:
        return InvalidArgumentError(message)
    return CollectiveError(message)
