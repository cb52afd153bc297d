"""Tensor: a strided view of an anychip Buffer with a shape and an element type.

Memory comes from the device's caching allocator (``device.alloc``) and work is
ordered on the device's current stream, as copies are. Strides are counted in
elements (as in PyTorch and DLPack); a view (slice, transpose, reshape of a
contiguous tensor) shares its parent's Buffer.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..runtime import Buffer, Device, InvalidArgumentError, UnsupportedError
from ..runtime import copy as _copy
from ..runtime import device as _lookup_device
from . import _dtype as dt
from ._dtype import DType, _host_values
from ._layout import _axis, _c_strides, _index, _reshape_target, _shape_arg

__all__ = ["Tensor", "empty"]

# A Tensor's op methods (t + u, t.sum(), t.cast(...)) call the ops (_ops.py) and its
# DLPack methods the exchange (_dlpack.py). Both are written over Tensor and import this
# module; this module imports neither: the package (anychip/tensor/__init__.py) hands them
# over with install() when it loads.
_ops: Any = None
_dlpack: Any = None


def install(ops: Any, dlpack: Any) -> None:
    """Give Tensor's methods the ops module and the DLPack module (the package does, once)."""
    global _ops, _dlpack
    _ops, _dlpack = ops, dlpack


def _resolve(device: Any) -> Device:
    if isinstance(device, Device):
        return device
    return _lookup_device(device)


class _HostRef:
    """Hands NumPy a view of a tensor's host memory while keeping the tensor alive."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, owner: Any, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], typestr: str,
                 readonly: bool) -> None:
        self._owner = owner
        self.__array_interface__ = {"data": (ptr, readonly), "shape": shape, "strides": strides,
                                    "typestr": typestr, "version": 3}


class Tensor:
    """An n-dimensional array on an anychip device. Make one with :func:`anychip.tensor`,
    :func:`empty`, :func:`zeros`, :func:`ones`, :func:`full` or :func:`arange`."""

    __slots__ = ("_buf", "_ext", "_shape", "_strides", "_offset", "_dtype", "_device", "__weakref__")

    # DLPack-imported memory has no Buffer: _ext holds the foreign flat array (NumPy
    # uint8 on the host, a CuPy array on CUDA) and _buf is None.
    def __init__(self, buf: Buffer | None, shape: tuple[int, ...], dtype: DType, *,
                 strides: tuple[int, ...] | None = None, offset: int = 0, device: Device | None = None,
                 ext: Any = None) -> None:
        self._buf = buf
        self._ext = ext
        self._shape = tuple(int(s) for s in shape)
        self._strides = _c_strides(self._shape) if strides is None else tuple(int(s) for s in strides)
        self._offset = int(offset)          # bytes from the start of the storage to element [0, ..., 0]
        self._dtype = dtype
        self._device = device if device is not None else buf.device   # type: ignore[union-attr]

    # -- identity ----------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (PyTorch's and DLPack's convention, not NumPy's bytes)."""
        return self._strides

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    def numel(self) -> int:
        return self.size

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def offset(self) -> int:
        """Byte offset of element [0, ..., 0] inside :attr:`buffer`."""
        return self._offset

    @property
    def buffer(self) -> Buffer:
        """The Buffer holding the elements (shared by every view of it)."""
        if self._buf is None:
            raise UnsupportedError("this tensor wraps memory imported through DLPack, which has no anychip "
                                   "Buffer; use .clone() for a copy in anychip memory")
        return self._buf

    def __anychip_buffer__(self) -> tuple[Buffer, str]:
        """(a Buffer of exactly this tensor's elements, dtype name): how collectives take tensors.
        The tensor must be contiguous and of a dtype the collectives support."""
        if not self.is_contiguous():
            raise InvalidArgumentError(f"collectives need a contiguous tensor; this one has shape {self._shape} and "
                                       f"strides {self._strides} (use .contiguous())")
        if self._dtype.name == "bool":
            raise UnsupportedError("collectives do not reduce bool tensors; cast to uint8 first")
        return self.buffer.view(self._offset, self.nbytes), self._dtype.name

    def is_contiguous(self) -> bool:
        """True when the elements are laid out in C order without gaps."""
        expect = 1
        for n, s in zip(reversed(self._shape), reversed(self._strides), strict=False):
            if n == 0:
                return True
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def __repr__(self) -> str:
        try:
            body = np.array2string(self._values_for_repr(), separator=", ", threshold=64)
        except Exception as exc:  # noqa: BLE001 - a repr must not raise (freed buffer...)
            body = f"<unreadable: {exc}>"
        return f"tensor({body}, device='{self._device}', dtype={self._dtype.name})"

    def _values_for_repr(self) -> np.ndarray:
        v = self._read()
        return dt.from_bfloat16_bits(v) if self._dtype is dt.bfloat16 else v

    # -- memory access -----------------------------------------------------------
    def _host_base(self) -> tuple[np.ndarray, int] | None:
        """(host uint8 array, byte position of element 0 in it) when the memory is host memory."""
        if self._buf is None:
            return (self._ext, self._offset) if isinstance(self._ext, np.ndarray) else None
        handle = self._buf.handle
        if isinstance(handle, np.ndarray):
            return handle, self._buf.offset + self._offset
        return None

    def _span(self) -> tuple[int, int]:
        """[lo, hi) byte range of the storage this view touches (relative to the storage start)."""
        item = self._dtype.itemsize
        if self.size == 0:
            return self._offset, self._offset
        lo = hi = self._offset
        for n, s in zip(self._shape, self._strides, strict=False):
            if s < 0:
                lo += (n - 1) * s * item
            else:
                hi += (n - 1) * s * item
        return lo, hi + item

    def _byte_strides(self) -> tuple[int, ...]:
        return tuple(s * self._dtype.itemsize for s in self._strides)

    def _host_view(self, writable: bool = False) -> np.ndarray | None:
        """A NumPy view of host memory (storage dtype), keeping the tensor alive; None if device memory."""
        base = self._host_base()
        if base is None:
            return None
        arr, pos = base
        ptr = arr.ctypes.data + pos
        ref = _HostRef(self, ptr, self._shape, self._byte_strides(), self._dtype.storage.str, not writable)
        return np.asarray(ref)

    def _read(self) -> np.ndarray:
        """The elements as a host array of the storage dtype (a view for host memory, else a copy).
        Synchronous: waits for the work queued on the device's current stream."""
        view = self._host_view()
        if view is not None:
            return view
        if self._ext is not None:          # CUDA memory imported from CuPy
            return self._ext_to_host()
        lo, hi = self._span()
        host = np.empty(hi - lo, dtype=np.uint8)
        if hi > lo:
            _copy(host, self._buf, hi - lo, src_offset=lo)
        return _strided(host, self._offset - lo, self._shape, self._byte_strides(), self._dtype.storage)

    def _ext_to_host(self) -> np.ndarray:
        cp = _cupy()
        lo, hi = self._span()
        flat = self._ext[lo:hi]
        host = cp.asnumpy(flat) if hi > lo else np.empty(0, np.uint8)
        return _strided(host, self._offset - lo, self._shape, self._byte_strides(), self._dtype.storage)

    def _write(self, values: np.ndarray, owned: bool = False) -> None:
        """Store host ``values`` (storage dtype, this tensor's shape) into this tensor's elements.
        Device memory is written by a copy queued on the current stream: unless ``owned`` (a
        fresh array nobody else holds), ``values`` is copied first, so that the caller may
        change its array as soon as this returns."""
        view = self._host_view(writable=True)
        if view is not None:
            np.copyto(view, values, casting="unsafe")
            return
        if not self.is_contiguous():
            raise UnsupportedError("writing into a non-contiguous view of device memory is not supported; "
                                   "write into a contiguous tensor")
        data = np.ascontiguousarray(values, dtype=self._dtype.storage)
        if not owned and np.may_share_memory(data, values):
            data = data.copy()
        if data.nbytes == 0:
            return
        if self._ext is not None:
            self._ext[self._offset:self._offset + data.nbytes].set(data.reshape(-1).view(np.uint8))
            return
        stream = self._device.current_stream()
        _copy(self._buf, data.reshape(-1).view(np.uint8), data.nbytes, dst_offset=self._offset, stream=stream)

    # -- conversion --------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The elements as a NumPy array. Host memory (cpu) is shared, as PyTorch's
        ``Tensor.numpy()`` shares it; device memory is copied (after the work queued on
        the current stream). bfloat16 needs the ``ml_dtypes`` package."""
        view = self._host_view(writable=True)
        values = view if view is not None else self._read()
        if self._dtype is dt.bfloat16:
            return values.view(_ml_bfloat16())
        return values

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        values = self.numpy()
        if copy:
            values = values.copy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def tolist(self) -> Any:
        return self._values_for_repr().tolist()

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        if self.size != 1:
            raise InvalidArgumentError(f"item() needs a tensor with one element, this one has shape {self._shape} "
                                       f"({self.size} elements)")
        return self._values_for_repr().reshape(()).item()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, not {self._dtype.name}")
        return int(self.item())

    def to(self, device: Any = None, dtype: Any = None) -> Tensor:
        """This tensor on ``device`` (any backend to any other) and/or as ``dtype``;
        ``self`` when nothing changes."""
        out = self
        if dtype is not None and dt.dtype(dtype) is not self._dtype:
            out = out.cast(dtype)
        if device is not None:
            target = _resolve(device)
            if target is not out._device:
                out = out._move(target)
        return out

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def _move(self, target: Device) -> Tensor:
        result = empty(self._shape, dtype=self._dtype, device=target)
        if self.size == 0:
            return result
        if self._buf is not None and self.is_contiguous():
            _copy(result._buf, self._buf, self.nbytes, src_offset=self._offset)
        else:
            result._write(self._read())
        return result

    def clone(self) -> Tensor:
        """A contiguous copy in new memory of the same device."""
        return _ops.copy(self)

    def contiguous(self) -> Tensor:
        """``self`` when already contiguous, else a contiguous copy."""
        return self if self.is_contiguous() else self.clone()

    # -- views -------------------------------------------------------------------
    def reshape(self, *shape: Any) -> Tensor:
        """The same elements with another shape (one dimension may be -1). A view of a
        contiguous tensor; a non-contiguous one is copied first."""
        new = _reshape_target(shape, self.size, self._shape)
        src = self.contiguous()
        return Tensor(src._buf, new, src._dtype, offset=src._offset, device=src._device, ext=src._ext)

    view = reshape

    def flatten(self) -> Tensor:
        return self.reshape(-1)

    def transpose(self, dim0: int = 0, dim1: int = 1) -> Tensor:
        """A view with dimensions ``dim0`` and ``dim1`` swapped (2-D: the matrix transpose)."""
        if self.ndim < 2:
            if self.ndim == 1 and dim0 == 0 and dim1 == 1:
                return self
            raise InvalidArgumentError(f"transpose needs at least 2 dimensions, this tensor has shape {self._shape}")
        d0, d1 = _axis(dim0, self.ndim), _axis(dim1, self.ndim)
        shape, strides = list(self._shape), list(self._strides)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return Tensor(self._buf, tuple(shape), self._dtype, strides=tuple(strides), offset=self._offset,
                      device=self._device, ext=self._ext)

    @property
    def T(self) -> Tensor:
        if self.ndim > 2:
            raise InvalidArgumentError(f".T is the transpose of a 2-D tensor; this one has shape {self._shape} "
                                       "(use transpose(dim0, dim1))")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def __getitem__(self, key: Any) -> Tensor:
        shape, strides, offset = _index(key, self._shape, self._strides, self._dtype.itemsize)
        return Tensor(self._buf, shape, self._dtype, strides=strides, offset=self._offset + offset,
                      device=self._device, ext=self._ext)

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self[key]
        if isinstance(value, Tensor):
            if value.device is not self._device:
                raise InvalidArgumentError(f"cannot assign a tensor on {value.device} into a tensor on "
                                           f"{self._device}; move it with .to({str(self._device)!r})")
            values = value.cast(self._dtype)._read()
        else:
            values = _host_values(np.asarray(value), self._dtype)
        try:
            values = np.broadcast_to(values, target.shape)
        except ValueError:
            raise InvalidArgumentError(f"cannot assign a value of shape {np.shape(values)} to a slice of shape "
                                       f"{target.shape}") from None
        target._write(values)

    # -- ops (see _ops) ----------------------------------------------------------
    def cast(self, dtype: Any) -> Tensor:
        return _ops.cast(self, dtype)

    astype = cast

    def float(self) -> Tensor:
        return self.cast(dt.float32)

    def sum(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        return _ops.reduce("sum", self, axis, keepdims)

    def mean(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        return _ops.reduce("mean", self, axis, keepdims)

    def max(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        return _ops.reduce("max", self, axis, keepdims)

    def relu(self) -> Tensor:
        return _ops.unary("relu", self)

    def exp(self) -> Tensor:
        return _ops.unary("exp", self)

    def log(self) -> Tensor:
        return _ops.unary("log", self)

    def tanh(self) -> Tensor:
        return _ops.unary("tanh", self)

    def sqrt(self) -> Tensor:
        return _ops.unary("sqrt", self)

    def erf(self) -> Tensor:
        return _ops.unary("erf", self)

    def matmul(self, other: Any) -> Tensor:
        return _ops.matmul(self, other)

    def __matmul__(self, other: Any) -> Tensor:
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _ops.matmul(other, self)

    def __neg__(self) -> Tensor:
        return _ops.unary("neg", self)

    def __pos__(self) -> Tensor:
        return self

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        return _dlpack.export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _dlpack.device_of(self)


def _binary_method(op: str, reflected: bool = False) -> Any:
    def method(self: Tensor, other: Any) -> Tensor:
        return _ops.binary(op, other, self) if reflected else _ops.binary(op, self, other)
    method.__name__ = f"__{'r' if reflected else ''}{op}__"
    return method


for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("pow", "pow")):
    setattr(Tensor, f"__{_name}__", _binary_method(_op))
    setattr(Tensor, f"__r{_name}__", _binary_method(_op, reflected=True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Tensor, f"__{_name}__", _binary_method(_name))
setattr(Tensor, "__hash__", object.__hash__)    # == is elementwise; tensors hash by identity


# -- helpers ---------------------------------------------------------------------

def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise UnsupportedError(f"CUDA tensors need CuPy ({exc})") from None
    return cupy


def _ml_bfloat16() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        raise UnsupportedError("NumPy has no bfloat16: install ml_dtypes for bfloat16 arrays, or convert "
                               "first with .cast('float32')") from None
    return ml_dtypes.bfloat16


def _strided(host: np.ndarray, pos: int, shape: tuple[int, ...], byte_strides: tuple[int, ...],
             storage: np.dtype) -> np.ndarray:
    """A read-only strided view of ``host`` (uint8) with element 0 at byte ``pos``."""
    if math.prod(shape) == 0:
        return np.empty(shape, dtype=storage)
    ref = _HostRef(host, host.ctypes.data + pos, shape, byte_strides, storage.str, True)
    return np.asarray(ref)


# -- factories -------------------------------------------------------------------

def empty(*shape: Any, dtype: Any = "float32", device: Any = None) -> Tensor:
    """An uninitialized tensor of ``shape`` on ``device`` (default: the current device)."""
    dims = _shape_arg(shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape)
    d = dt.dtype(dtype)
    dev = _resolve(device)
    buf = dev.alloc(math.prod(dims) * d.itemsize)
    return Tensor(buf, dims, d)


def _new(shape: tuple[int, ...], d: DType, dev: Device) -> Tensor:
    """:func:`empty` for the ops, which pass a shape tuple of ints, a DType and a Device."""
    return Tensor(dev.alloc(math.prod(shape) * d.itemsize), shape, d)


def _span_of(t: Tensor) -> tuple[int, int]:
    """[lo, hi) bytes relative to element 0 that the tensor touches."""
    lo, hi = t._span()
    return lo - t._offset, hi - t._offset
