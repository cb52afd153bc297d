"""The tensor-layer interface of the OpenCL kernel set (mixed into OpenCLKernels).

The OpenCL kernels (``_opencl_kernels.py``) work on contiguous operands of
float32 / float64 / int32 / int64. These methods take the tensor layer's strided
operands (see docs/tensor.md) and run the kernels when the layout fits: same-shape
contiguous operands for elementwise ops, casts and copies, full sums, contiguous
GEMM. Otherwise they raise ``UnsupportedError`` before enqueuing anything, and the
tensor layer uses its host fallback.
"""
from __future__ import annotations

import math
from typing import Any

from ..runtime.errors import UnsupportedError

__all__ = ["OpenCLTensorKernels"]

_OPS = frozenset({"add", "sub", "mul", "div", "copy", "sum", "matmul"})


def _contiguous(strides: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    expect = 1
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


class OpenCLTensorKernels:
    """Adapter from the tensor layer's calls to the contiguous OpenCL kernels."""

    # provided by OpenCLKernels
    def supported_dtypes(self, index: int) -> tuple[str, ...]:
        raise NotImplementedError

    def binary(self, index: int, op: str, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        raise NotImplementedError

    def cast(self, index: int, out: Any, out_dtype: str, x: Any, in_dtype: str, n: int, stream: Any = None) -> None:
        raise NotImplementedError

    def sum(self, index: int, out: Any, x: Any, n: int, dtype: str, stream: Any = None) -> None:
        raise NotImplementedError

    def matmul(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str,
               stream: Any = None) -> None:
        raise NotImplementedError

    # -- the tensor layer's interface --------------------------------------------------
    def supports(self, index: int, op: str, dtype: str) -> bool:
        return op in _OPS and dtype in self.supported_dtypes(index)

    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        if op not in ("add", "sub", "mul", "div"):
            raise UnsupportedError(f"the OpenCL kernels have no {op}")
        n = math.prod(shape)
        for operand, what in ((a, "a"), (b, "b")):
            if not _contiguous(operand[2], shape):
                raise UnsupportedError(f"the OpenCL kernels take contiguous operands; {what} has strides {operand[2]}")
        self.binary(index, op, _sub(out), _sub(a), _sub(b), n, dtype, stream)

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        if op != "copy" or out_dtype not in self.supported_dtypes(index):
            raise UnsupportedError(f"the OpenCL kernels have no {op} from {dtype} to {out_dtype}")
        if not _contiguous(x[2], shape):
            raise UnsupportedError(f"the OpenCL kernels take contiguous operands; x has strides {x[2]}")
        self.cast(index, _sub(out), out_dtype, _sub(x), dtype, math.prod(shape), stream)

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        if op != "sum" or out_dtype != dtype or outer != 1 or inner != 1:
            raise UnsupportedError("the OpenCL kernels sum whole tensors into their own dtype only")
        self.sum(index, _sub(out), _sub(x), n, dtype, stream)

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        if not (_contiguous(a[2], (m, k)) and _contiguous(b[2], (k, n))):
            raise UnsupportedError("the OpenCL matmul kernel takes contiguous matrices")
        self.matmul(index, _sub(out), _sub(a), _sub(b), m, k, n, dtype, stream)


def _nbytes(storage: Any, offset: int) -> int:
    return int(storage.nbytes) - offset


def _sub(operand: Any) -> tuple[Any, int, int]:
    """(cl.Buffer handle, absolute byte offset, bytes available) of a tensor-layer operand."""
    storage, offset = operand[0], operand[1]
    return (storage.handle, storage.offset + offset, storage.nbytes - offset)
