"""Tensors over anychip Buffers: shape, dtype, strided views, DLPack and a small op set.

    >>> import anychip
    >>> x = anychip.tensor([[1.0, 2.0], [3.0, 4.0]], device="cpu")
    >>> (x @ x.T + 1).sum(axis=0).numpy()
    array([18., 38.], dtype=float32)

Ops run on the device's kernel set where it has one and otherwise through a host
fallback ordered on the device's current stream. See docs/tensor.md.
"""
from __future__ import annotations

from . import _dlpack, _ops, _tensor
from ._dlpack import DLPackError, from_dlpack
from ._dtype import (
    DTYPES,
    DType,
    bfloat16,
    bool_,
    dtype,
    float16,
    float32,
    float64,
    int8,
    int32,
    int64,
    uint8,
)
from ._factories import arange, as_tensor, full, ones, tensor, zeros
from ._ops import cast, erf, exp, log, matmul, maximum, minimum, relu, sqrt, tanh
from ._tensor import Tensor, empty

_tensor.install(_ops, _dlpack)     # Tensor's op and DLPack methods (see _tensor.py)

__all__ = [
    "Tensor", "tensor", "as_tensor", "empty", "zeros", "ones", "full", "arange", "from_dlpack", "DLPackError",
    "matmul", "cast", "relu", "exp", "log", "tanh", "sqrt", "erf", "maximum", "minimum",
    "DType", "dtype", "DTYPES", "bool_", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
    "float64",
]
