"""Shape and stride arithmetic of tensors: contiguous strides, axes, reshape targets and basic
indexing (which gives views)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..runtime import InvalidArgumentError, UnsupportedError

__all__: list[str] = []


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(int(s.__index__()) for s in shape)
    except (AttributeError, TypeError):
        raise InvalidArgumentError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"shape {dims} has a negative dimension")
    return dims


def _axis(axis: Any, ndim: int) -> int:
    try:
        a = int(axis.__index__())
    except (AttributeError, TypeError):
        raise InvalidArgumentError(f"axis must be an int, got {axis!r}") from None
    if not -ndim <= a < ndim:
        raise InvalidArgumentError(f"axis {a} is out of range for a tensor of {ndim} dimension(s)")
    return a % ndim


def _reshape_target(shape: tuple, size: int, old: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        dims = [int(s.__index__()) for s in shape]
    except (AttributeError, TypeError):
        raise InvalidArgumentError(f"reshape takes ints, got {shape!r}") from None
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1 or any(d < -1 for d in dims):
        raise InvalidArgumentError(f"bad shape {tuple(dims)}: dimensions are >= 0, and at most one is -1")
    known = math.prod(d for d in dims if d != -1)
    if unknown:
        if known == 0 or size % known:
            raise InvalidArgumentError(f"cannot reshape a tensor of shape {old} ({size} elements) into "
                                       f"{tuple(dims)}")
        dims[unknown[0]] = size // known
    if math.prod(dims) != size:
        raise InvalidArgumentError(f"cannot reshape a tensor of shape {old} ({size} elements) into {tuple(dims)} "
                                   f"({math.prod(dims)} elements)")
    return tuple(dims)


def _index(key: Any, shape: tuple[int, ...], strides: tuple[int, ...],
           item: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, byte offset) of basic indexing: ints, slices, None and Ellipsis."""
    keys = list(key) if isinstance(key, tuple) else [key]
    if sum(k is Ellipsis for k in keys) > 1:
        raise InvalidArgumentError("an index can have only one Ellipsis (...)")
    used = sum(1 for k in keys if k is not None and k is not Ellipsis)
    if used > len(shape):
        raise InvalidArgumentError(f"too many indices: {used} for a tensor of {len(shape)} dimension(s)")
    if Ellipsis in keys:
        i = keys.index(Ellipsis)
        keys[i:i + 1] = [slice(None)] * (len(shape) - used)
    else:
        keys += [slice(None)] * (len(shape) - used)
    out_shape: list[int] = []
    out_strides: list[int] = []
    offset, dim = 0, 0
    for k in keys:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n, s = shape[dim], strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            count = len(range(start, stop, step))
            offset += start * s * item if count else 0
            out_shape.append(count)
            out_strides.append(s * step)
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            i = int(k)
            if not -n <= i < n:
                raise InvalidArgumentError(f"index {i} is out of range for dimension {dim} of size {n}")
            offset += (i % n) * s * item
        else:
            raise UnsupportedError(f"index {k!r} ({type(k).__name__}) is not supported: tensors take ints, "
                                   "slices, None and ... (basic indexing, which gives views)")
        dim += 1
    return tuple(out_shape), tuple(out_strides), offset
