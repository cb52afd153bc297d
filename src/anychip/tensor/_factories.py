"""Making tensors from values: ``tensor``, ``as_tensor``, ``full``, ``zeros``, ``ones``,
``arange`` (``empty`` is with Tensor, in _tensor.py), and ``fill``."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import InvalidArgumentError
from . import _dtype as dt
from ._dtype import _host_values
from ._layout import _shape_arg
from ._tensor import Tensor, _resolve, empty

__all__ = ["tensor", "zeros", "ones", "full", "arange", "as_tensor"]


def full(shape: Any, value: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A tensor of ``shape`` with every element ``value`` (dtype: from the value when not given)."""
    if dtype is None:
        dtype = dt.bool_ if isinstance(value, (bool, np.bool_)) else (
            dt.int64 if isinstance(value, (int, np.integer)) else dt.float32)
    t = empty(_shape_arg(shape), dtype=dtype, device=device)
    fill(t, value)
    return t


def zeros(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    dims = _shape_arg(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape)
    t = empty(dims, dtype=dtype, device=device)
    if t.nbytes:
        t._buf.memset(0, stream=t.device.current_stream())     # type: ignore[union-attr]
    return t


def ones(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    dims = _shape_arg(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape)
    return full(dims, 1, dtype=dtype, device=device)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, device: Any = None) -> Tensor:
    """Evenly spaced values in [start, stop), as ``numpy.arange`` (dtype int64 for ints,
    float32 when any bound is a float, unless given)."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dtype = dt.int64 if ints else dt.float32
    d = dt.dtype(dtype)
    values = np.arange(start, stop, step, dtype=d.numpy)
    return tensor(values, dtype=d, device=device)


def tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """A new tensor on ``device`` (default: the current device) holding a copy of ``data``:
    a NumPy array, nested sequences of numbers, a scalar, or another Tensor."""
    if isinstance(data, Tensor):
        out = data.to(device=device if device is not None else data.device)
        out = out.cast(dtype) if dtype is not None else out
        return out.clone() if out is data else out
    arr = np.asarray(data)
    if arr.dtype.name == "bfloat16":
        src = dt.bfloat16
    elif arr.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)) and dtype is None:
        src = dt.float32          # Python floats make float32 tensors (as torch.tensor)
        arr = arr.astype(np.float32)
    else:
        src = dt.dtype(arr.dtype)
    d = src if dtype is None else dt.dtype(dtype)
    values = _host_values(arr, d)
    t = empty(arr.shape, dtype=d, device=device)
    if values.size:
        t._write(values)
    return t


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """``data`` itself when it is already a Tensor of that device and dtype; else :func:`tensor`."""
    if isinstance(data, Tensor) and (device is None or _resolve(device) is data.device) and \
            (dtype is None or dt.dtype(dtype) is data.dtype):
        return data
    return tensor(data, dtype=dtype, device=device)


def fill(t: Tensor, value: Any) -> None:
    """Set every element of ``t`` to ``value``."""
    try:
        v = _host_values(np.asarray(value), t.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"fill value {value!r} cannot be a {t.dtype.name} ({exc})") from None
    if v.ndim:
        raise InvalidArgumentError(f"fill value must be a scalar, got shape {v.shape}")
    if t.size:
        t._write(np.broadcast_to(v, t.shape))
