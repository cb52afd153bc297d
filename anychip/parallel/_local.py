"""The per-rank tensor a DistTensor holds: device memory (an anychip Buffer) with a shape
and a dtype. Collectives work on its buffer in place; arithmetic runs on the host
(copy out, NumPy, copy back), ordered by synchronous copies on the device's stream.

This is the parallel layer's minimal stand-in for ``anychip.tensor.Tensor``: it holds
its data where a Tensor would, so that the collectives move device memory.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..runtime.buffer import Buffer


class Local:
    """A dense, contiguous array in one device's memory."""

    __slots__ = ("buffer", "shape", "dtype", "device")

    def __init__(self, buffer: Buffer, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.device = buffer.device

    @classmethod
    def from_numpy(cls, arr: Any, device: Any) -> Local:
        arr = np.ascontiguousarray(arr)
        buf = device.alloc(max(arr.nbytes, 1))
        if arr.nbytes:
            buf.copy_from(arr.reshape(-1).view(np.uint8))
        return cls(buf, arr.shape, arr.dtype)

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype: Any, device: Any) -> Local:
        dtype = np.dtype(dtype)
        return cls(device.alloc(max(math.prod(shape) * dtype.itemsize, 1)), shape, dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A host copy (synchronous)."""
        if self.size == 0:
            return np.empty(self.shape, self.dtype)
        return self.buffer.to_numpy(self.dtype, self.shape)

    def __repr__(self) -> str:
        return f"<local tensor {list(self.shape)} {self.dtype} on {self.device}>"
