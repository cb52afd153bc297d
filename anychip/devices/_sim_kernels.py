"""The tensor kernel set of the simulated chips (ascend, kunlun, hygon on the simulator).

The kernels are C functions of the simulator library (csrc/sim/kernels.c). Each
call is checked there against the allocation table and enqueued on a simulated
stream, whose worker thread runs it over the device memory itself, in order with
the stream's copies and collectives: no staging through the host.

GEMM of float32 / float64 calls the CBLAS of NumPy's bundled OpenBLAS when it can
be found (handed to the simulator once, as a chip's runtime links its BLAS
library); otherwise a loop in C runs it.

The set implements ``anychip.runtime.KernelSet``; the runtime's front end
(``anychip.runtime.Kernels``) has checked every argument before a call reaches it,
and the simulator checks every operand range again against its allocation table.
"""
from __future__ import annotations

import glob
import logging
import os
import threading
from typing import Any

import numpy as np

from ..runtime.errors import DeviceError, UnsupportedError

__all__ = ["SimKernels", "CDEF"]

log = logging.getLogger("anychip")

CDEF = """
int anychip_simk_elementwise(void *stream, int op, int dtype, int ndim, const int64_t *shape, void *out,
                             const void *a, const int64_t *as, const void *b, const int64_t *bs);
int anychip_simk_unary(void *stream, int op, int out_dtype, int in_dtype, int ndim, const int64_t *shape,
                       void *out, const void *x, const int64_t *xs);
int anychip_simk_reduce(void *stream, int op, int out_dtype, int in_dtype, int64_t outer, int64_t n,
                        int64_t inner, void *out, const void *x);
int anychip_simk_gemm(void *stream, int dtype, int64_t m, int64_t k, int64_t n, void *out, const void *a,
                      int64_t as0, int64_t as1, const void *b, int64_t bs0, int64_t bs1);
void anychip_simk_set_blas(void *sgemm, void *dgemm);
const char *anychip_sim_last_error(void);
"""

DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
_DT = {name: i for i, name in enumerate(DTYPES)}
ELEMENTWISE = ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum")
_EW = {name: i for i, name in enumerate(ELEMENTWISE)}
UNARY = ("copy", "relu", "exp", "log", "neg", "sqrt")     # csrc/sim/kernels.h's U_* order
_UN = {name: i for i, name in enumerate(UNARY)}
REDUCE = ("sum", "mean", "max")
_RED = {name: i for i, name in enumerate(REDUCE)}
MAX_DIMS = 16
_ONE = (1,)         # what a 0-d operand passes for its shape and strides (never read)

_blas_lock = threading.Lock()
_blas_given: set[str] = set()


def _numpy_blas() -> tuple[str, str, str] | None:
    """(library path, sgemm symbol, dgemm symbol) of the CBLAS bundled with NumPy, if any."""
    root = os.path.dirname(os.path.dirname(np.__file__))
    for path in sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas64_*.so"))):
        return path, "scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_"
    return None


class SimKernels:
    """Tensor kernels of one simulator library: an ``anychip.runtime.KernelSet`` (see the module docstring)."""

    def __init__(self, plugin: Any) -> None:
        import cffi  # type: ignore[import-untyped]

        self._plugin = plugin
        self._ffi = cffi.FFI()
        self._ffi.cdef(CDEF)
        self._lib = self._ffi.dlopen(plugin.library_path)     # the same library, loaded once by the process
        self._blas = False
        self._give_blas()

    def _give_blas(self) -> None:
        found = _numpy_blas()
        if found is None:
            log.debug("%s: no CBLAS found beside NumPy; the simulator's GEMM runs its own loop", self._plugin.name)
            return
        path, s_name, d_name = found
        with _blas_lock:
            key = os.path.realpath(self._plugin.library_path)
            if key in _blas_given:
                self._blas = True
                return
            ffi = cffi_for_blas(s_name, d_name)
            try:
                blas = ffi.dlopen(path)
                sgemm, dgemm = getattr(blas, s_name), getattr(blas, d_name)
            except (OSError, AttributeError) as exc:
                log.debug("%s: NumPy's BLAS %s is not usable (%s)", self._plugin.name, path, exc)
                return
            self._lib.anychip_simk_set_blas(ffi.cast("void *", sgemm), ffi.cast("void *", dgemm))
            self._blas_keep = (ffi, blas)
            _blas_given.add(key)
            self._blas = True

    # -- what runs here --------------------------------------------------------------
    def supports(self, index: int, op: str, dtype: str) -> bool:
        if dtype not in _DT:
            return False
        if op in ("add", "sub", "mul", "neg", "relu", "exp", "log", "sqrt") and dtype == "bool":
            return False
        if op in ("exp", "log", "sqrt") and dtype not in ("float16", "bfloat16", "float32", "float64"):
            return False
        if op == "div" and dtype not in ("float16", "bfloat16", "float32", "float64"):
            return False
        return op in _EW or op in _UN or op in _RED or op == "matmul"

    # -- kernels -----------------------------------------------------------------------
    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        """``out = a <op> b`` over ``shape`` (inputs strided, of ``dtype``; out contiguous,
        of ``dtype`` or bool for comparisons)."""
        nd = self._ndim(shape)
        ptr_o = self._ptr(index, out[0], out[1], "out")
        ptr_a = self._ptr(index, a[0], a[1], "a")
        ptr_b = self._ptr(index, b[0], b[1], "b")
        # tuples of ints go to the int64_t * parameters as temporary arrays (cffi)
        self._run(index, "elementwise", self._lib.anychip_simk_elementwise, stream, _EW[op], _DT[dtype], nd,
                  tuple(shape) or _ONE, ptr_o, ptr_a, tuple(a[2]) or _ONE, ptr_b, tuple(b[2]) or _ONE)

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        """``out = op(x)`` over ``shape``; ``copy`` converts ``dtype`` to ``out_dtype`` (a cast)."""
        nd = self._ndim(shape)
        self._run(index, "unary", self._lib.anychip_simk_unary, stream, _UN[op], _DT[out_dtype], _DT[dtype], nd,
                  tuple(shape) or _ONE, self._ptr(index, out[0], out[1], "out"),
                  self._ptr(index, x[0], x[1], "x"), tuple(x[2]) or _ONE)

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        """``out[o, i] = op over r of x[o, r, i]`` for contiguous x of shape (outer, n, inner)."""
        self._run(index, "reduce", self._lib.anychip_simk_reduce, stream, _RED[op], _DT[out_dtype], _DT[dtype],
                  outer, n, inner, self._ptr(index, out[0], out[1], "out"), self._ptr(index, x[0], x[1], "x"))

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        """``out[m, n] = a[m, k] @ b[k, n]`` (a and b strided; out contiguous)."""
        (as0, as1), (bs0, bs1) = a[2], b[2]
        self._run(index, "gemm", self._lib.anychip_simk_gemm, stream, _DT[dtype], m, k, n,
                  self._ptr(index, out[0], out[1], "out"), self._ptr(index, a[0], a[1], "a"), as0, as1,
                  self._ptr(index, b[0], b[1], "b"), bs0, bs1)

    # -- internals -----------------------------------------------------------------------
    @staticmethod
    def _ndim(shape: tuple[int, ...]) -> int:
        if len(shape) > MAX_DIMS:
            raise UnsupportedError(f"the simulator's kernels take at most {MAX_DIMS} dimensions, got {len(shape)}")
        return len(shape)

    def _ptr(self, index: int, storage: Any, offset: int, what: str) -> Any:
        """The device address of ``offset`` into ``storage`` (a Buffer of this device, checked by the front end)."""
        return self._ffi.cast("void *", (storage.ptr or 0) + offset)

    def _run(self, index: int, what: str, fn: Any, stream: Any, *args: Any) -> None:
        plugin = self._plugin
        plugin._use(index)
        handle = stream._live() if hasattr(stream, "_live") else stream
        rc = fn(self._ffi.cast("void *", handle) if handle is not None else self._ffi.NULL, *args)
        if rc:
            msg = self._ffi.string(self._lib.anychip_sim_last_error()).decode("utf-8", "replace")
            raise DeviceError(f"{what} kernel failed: {msg}", backend=plugin.name, code=rc)


def cffi_for_blas(s_name: str, d_name: str) -> Any:
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(f"""
    void {s_name}(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                  float, float *, int64_t);
    void {d_name}(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t, const double *,
                  int64_t, double, double *, int64_t);
    """)
    return ffi
