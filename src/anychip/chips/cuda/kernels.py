"""The tensor kernel set of the CUDA backend: CuPy's kernels over anychip's memory.

Each operand becomes a CuPy array over the device memory it names (no copy:
``cupy.cuda.UnownedMemory`` around the Buffer's address, or the CuPy array a
DLPack import wrapped), and the CuPy op runs on the anychip stream's CuPy stream
(``with stream:``), so it is ordered with anychip's copies and collectives.

float16 sums and matmuls accumulate in float32 (CuPy's own rule); bfloat16 has no
CuPy dtype, so its ops stay with the tensor layer's host fallback.

The set implements ``anychip.runtime.KernelSet``; the runtime's front end
(``anychip.runtime.Kernels``) has checked every argument before a call reaches it.
"""
from __future__ import annotations

from typing import Any

from ...runtime.buffer import Buffer

__all__ = ["CudaKernels"]

_DTYPES = frozenset({"bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64"})
_FLOATS = frozenset({"float16", "float32", "float64"})
_ELEMENTWISE = {"add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide", "eq": "equal",
                "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
                "maximum": "maximum", "minimum": "minimum"}
_OPS = frozenset({*_ELEMENTWISE, "copy", "relu", "exp", "log", "neg", "sum", "mean", "max", "matmul"})


class CudaKernels:
    """Tensor kernels of the CUDA backend: an ``anychip.runtime.KernelSet``."""

    def __init__(self, plugin: Any) -> None:
        self._plugin = plugin

    def supports(self, index: int, op: str, dtype: str) -> bool:
        if op not in _OPS or dtype not in _DTYPES:
            return False
        if dtype == "bool" and op in ("add", "sub", "mul", "neg", "relu", "sum", "mean"):
            return False
        return dtype in _FLOATS or op not in ("div", "exp", "log")

    # -- kernels -----------------------------------------------------------------------
    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        cp = self._plugin._cupy
        out_dtype = "bool" if op in ("eq", "ne", "lt", "le", "gt", "ge") else dtype
        with self._on(index, stream):
            o = self._array(index, out[0], out[1], None, shape, out_dtype)
            x = self._array(index, a[0], a[1], a[2], shape, dtype)
            y = self._array(index, b[0], b[1], b[2], shape, dtype)
            getattr(cp, _ELEMENTWISE[op])(x, y, out=o)

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        cp = self._plugin._cupy
        with self._on(index, stream):
            o = self._array(index, out[0], out[1], None, shape, out_dtype)
            v = self._array(index, x[0], x[1], x[2], shape, dtype)
            if op == "copy":
                o[...] = v.astype(out_dtype, copy=False)
            elif op == "relu":
                cp.maximum(v, v.dtype.type(0), out=o)
            elif op == "neg":
                cp.negative(v, out=o)
            else:
                getattr(cp, op)(v, out=o)

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        cp = self._plugin._cupy
        with self._on(index, stream):
            o = self._array(index, out[0], out[1], None, (outer, inner), out_dtype)
            v = self._array(index, x[0], x[1], None, (outer, n, inner), dtype)
            if op == "max":
                cp.max(v, axis=1, out=o)
            else:
                acc = "float32" if dtype == "float16" else out_dtype
                r = getattr(cp, op)(v, axis=1, dtype=acc)
                o[...] = r.astype(out_dtype, copy=False)

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        cp = self._plugin._cupy
        with self._on(index, stream):
            o = self._array(index, out[0], out[1], None, (m, n), dtype)
            x = self._array(index, a[0], a[1], a[2], (m, k), dtype)
            y = self._array(index, b[0], b[1], b[2], (k, n), dtype)
            cp.matmul(x, y, out=o)

    # -- internals -----------------------------------------------------------------------
    def _on(self, index: int, stream: Any) -> Any:
        """``with`` block: the device of ``index`` and the CuPy stream of an anychip stream."""
        cp = self._plugin._cupy
        handle = stream._live() if hasattr(stream, "_live") else stream
        if handle is None:
            handle = self._plugin._default_stream(index)
        dev = cp.cuda.Device(index)
        return _Both(dev, handle.cupy_stream)

    def _array(self, index: int, storage: Any, offset: int, strides: Any, shape: tuple[int, ...],
               dtype: str) -> Any:
        cp = self._plugin._cupy
        item = cp.dtype(dtype).itemsize
        if strides is None:
            strides = _c_strides(shape)
        lo = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0 and n > 0)
        hi = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0 and n > 0) + 1
        if isinstance(storage, Buffer):
            base = int(storage.ptr or 0) + offset
            mem = cp.cuda.UnownedMemory(base + lo * item, max((hi - lo) * item, 1), storage, device_id=index)
            ptr = cp.cuda.MemoryPointer(mem, -lo * item)
        else:                                   # the CuPy array of a DLPack import
            ptr = storage.data + offset
        return cp.ndarray(shape, dtype=dtype, memptr=ptr, strides=tuple(s * item for s in strides))


class _Both:
    def __init__(self, dev: Any, stream: Any) -> None:
        self._dev, self._stream = dev, stream

    def __enter__(self) -> None:
        self._dev.__enter__()
        self._stream.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._stream.__exit__(*exc)
        self._dev.__exit__(*exc)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))
