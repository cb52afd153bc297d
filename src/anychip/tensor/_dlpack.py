"""DLPack both ways (``__dlpack__`` / ``__dlpack_device__`` / :func:`from_dlpack`).

Host memory (the cpu backend) is exchanged zero-copy through NumPy's DLPack
support, CUDA memory zero-copy through CuPy's; torch consumes and produces
either. Memory of other backends (OpenCL, the vendor chips) has no DLPack
consumer that could read it: exporting it with ``dl_device=(1, 0)`` (kDLCPU)
or ``copy=True`` hands out a host copy; otherwise it raises.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime import UnsupportedError
from ..runtime import device as _lookup_device
from . import _dtype as dt
from ._tensor import Tensor, _HostRef, _span_of

__all__ = ["from_dlpack", "DLPackError"]     # device_of / export serve Tensor's __dlpack__ methods

kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLROCM, kDLExtDev = 1, 2, 3, 4, 10, 12
_BACKEND_TYPES = {"cuda": kDLCUDA, "opencl": kDLOpenCL, "hygon": kDLROCM}


class DLPackError(UnsupportedError, BufferError):
    """A tensor cannot be exchanged through DLPack as asked (a BufferError, as the
    DLPack protocol specifies, and an anychip UnsupportedError)."""


def device_of(t: Tensor) -> tuple[int, int]:
    """(DLDeviceType, device id) of the tensor's memory."""
    if t._host_base() is not None:
        return (kDLCPU, 0)
    return (_BACKEND_TYPES.get(t.device.backend, kDLExtDev), t.device.index)


def _kwargs(**kw: Any) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


def export(t: Tensor, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: bool | None = None) -> Any:
    here = device_of(t)
    if dl_device is not None and tuple(dl_device) != here:
        if tuple(dl_device) != (kDLCPU, 0):
            raise DLPackError(f"a tensor on {t.device} can be exported on its own device {here} or copied to "
                              f"the host (kDLCPU, 0), not to {tuple(dl_device)}")
        if copy is False:
            raise DLPackError(f"a tensor on {t.device} reaches the host only through a copy, and copy=False "
                              "forbids one")
        t = t.to("cpu") if t._host_base() is None else t
        copy = None
    if t.dtype is dt.bfloat16:
        raise DLPackError("bfloat16 tensors cannot be exported through NumPy's DLPack; cast first "
                          "(t.cast('float32'))")
    if here[0] == kDLCUDA and t._host_base() is None:
        return _cuda_array(t).__dlpack__(**_kwargs(stream=stream))
    if t._host_base() is None:
        if not copy:
            raise DLPackError(f"memory of {t.device} cannot be read through DLPack by other libraries; "
                              "export a host copy with __dlpack__(dl_device=(1, 0)) or copy=True, or use .to('cpu')")
        t = t.to("cpu")
    view = t._host_view(writable=True)
    assert view is not None
    if copy:
        view = view.copy()
    return view.__dlpack__(**_kwargs(stream=stream, max_version=max_version))


def _cuda_array(t: Tensor) -> Any:
    import cupy

    t.device.current_stream().synchronize()     # the consumer's stream sees our finished work
    lo, hi = _span_of(t)
    if t._buf is not None:
        base = t._buf.ptr or 0
        mem = cupy.cuda.UnownedMemory(base + lo, max(hi - lo, 1), t, device_id=t.device.index)
        ptr = cupy.cuda.MemoryPointer(mem, -lo)
    else:
        ptr = t._ext.data + t._offset
    strides = tuple(s * t.dtype.itemsize for s in t.strides)
    return cupy.ndarray(t.shape, dtype=t.dtype.storage, memptr=ptr, strides=strides)


def _flat_from(arr: Any, lib: Any) -> tuple[Any, int, tuple[int, ...]]:
    """(flat uint8 storage covering ``arr``, byte offset of element 0 in it, element strides)."""
    item = arr.dtype.itemsize
    if any(s % item for s in arr.strides):
        raise DLPackError(f"strides {arr.strides} are not whole elements of {item} bytes")
    lo = hi = 0
    if arr.size:
        for n, s in zip(arr.shape, arr.strides, strict=False):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        hi += item
    if lib is np:
        ptr = arr.ctypes.data + lo
        flat = np.asarray(_HostRef(arr, ptr, (hi - lo,), (1,), "|u1", not arr.flags.writeable))
    else:
        flat = lib.ndarray((hi - lo,), dtype=lib.uint8, memptr=arr.data + lo)
    return flat, -lo, tuple(s // item for s in arr.strides)


def from_dlpack(obj: Any, *, device: Any = None, copy: bool | None = None) -> Tensor:
    """A Tensor sharing the memory of ``obj`` (anything with ``__dlpack__``: a NumPy array,
    a torch tensor, a CuPy array). Host memory becomes a cpu tensor, CUDA memory a cuda
    tensor, without a copy; ``copy=True`` copies, and ``device=`` moves the result."""
    if isinstance(obj, Tensor):
        out = obj
    else:
        if not hasattr(obj, "__dlpack__"):
            raise UnsupportedError(f"from_dlpack needs an object with __dlpack__ (NumPy, torch, CuPy...), got "
                                   f"{type(obj).__name__}")
        kind, index = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (kDLCPU, 0)
        out = _import(obj, int(kind), int(index))
    if copy:
        out = out.clone()
    return out if device is None else out.to(device)


def _import(obj: Any, kind: int, index: int) -> Tensor:
    if kind in (kDLCPU, kDLCUDAHost):
        lib: Any = np
        try:
            arr = np.from_dlpack(obj)
        except (BufferError, TypeError, RuntimeError) as exc:
            raise DLPackError(f"NumPy cannot import this {type(obj).__name__} through DLPack ({exc})") from None
        dev = _lookup_device("cpu")
    elif kind == kDLCUDA:
        try:
            import cupy
        except ImportError:
            raise DLPackError("importing CUDA memory through DLPack needs CuPy") from None
        lib = cupy
        arr = lib.from_dlpack(obj)
        dev = _lookup_device(f"cuda:{index}")
    else:
        raise DLPackError(f"DLPack device type {kind} is not supported; anychip imports host memory "
                          f"(kDLCPU) and CUDA memory (kDLCUDA)")
    d = dt.dtype(np.dtype(arr.dtype))
    flat, offset, strides = _flat_from(arr, lib)
    return Tensor(None, tuple(arr.shape), d, strides=strides, offset=offset, device=dev, ext=flat)
