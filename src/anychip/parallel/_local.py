"""Moving a rank's block between anychip.tensor Tensors and host arrays.

A DistTensor's block is an ``anychip.tensor.Tensor`` in the device's memory; its ops run
through the tensor layer (the device's kernels where it has them). Reshard lays the
data of a step out on the host (pad, move the sharded dimension to the front, cut) and
runs the collective on device copies of it.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..tensor import Tensor
from ..tensor import empty as _empty
from ..tensor import tensor as _tensor
from ..tensor import zeros as _zeros


def upload(arr: Any, device: Any) -> Tensor:
    """A new contiguous tensor on ``device`` holding ``arr`` (its dtype kept)."""
    a = np.asarray(arr)            # (np.ascontiguousarray would make a 0-d array 1-d)
    return _tensor(a if a.flags.c_contiguous else a.copy(order="C"), device=device)


def empty(shape: tuple[int, ...], dtype: Any, device: Any) -> Tensor:
    return _empty(shape, dtype=np.dtype(dtype).name, device=device)


def host(t: Tensor) -> np.ndarray:
    """The elements on the host (may share the memory of a cpu tensor: read only)."""
    return t.numpy()


def whole(t: Tensor) -> Any:
    """The Buffer of a contiguous tensor, from its first element (what a collective takes)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t.buffer if t.offset == 0 else t.buffer.view(t.offset, t.nbytes)


def matmul(a: Any, b: Any) -> Tensor:
    """``a @ b`` of blocks (batched as NumPy's matmul). A batch of matrices times one matrix
    runs as one 2-D product (the device's GEMM) over the rows of every batch."""
    if a.ndim > 2 and b.ndim == 2:
        rows = a.contiguous().reshape(math.prod(a.shape[:-1]), a.shape[-1])
        return (rows @ b).reshape(*a.shape[:-1], b.shape[-1])
    return a @ b


def apply(fn: Any, shape: tuple[int, ...], *ts: Any) -> Tensor:
    """``fn(*ts)``, or zeros of ``shape`` when a block is empty (a short last chunk): the
    result of an op over no elements, computed without a kernel launch on them."""
    if any(t.size == 0 for t in ts):
        return _zeros(shape, dtype=ts[0].dtype, device=ts[0].device)
    return fn(*ts)
