"""The kernel-set interface: what a backend's tensor kernels implement, and the front end
that checks every call once before handing it to them.

A backend may hand the tensor layer a kernel set as ``DevicePlugin.kernels`` (None: every
op takes the host fallback). The set implements :class:`KernelSet`; the tensor layer never
calls it directly but through :func:`kernels_of`, whose :class:`Kernels` checks the op,
the dtypes, the shapes, every operand's storage and byte range, and the stream, and raises
``InvalidArgumentError`` (the same message whatever the backend) before the backend sees
the call. A backend's set may therefore assume its arguments valid; it raises
``UnsupportedError`` before enqueuing anything when it cannot take an operand layout (the
tensor layer then falls back to the host), and ``DeviceError`` when the device fails.

Argument contract (every method of a kernel set):

* ``index``: the device index of the backend;
* an input is ``(storage, byte offset of element 0, strides in elements)`` (stride 0 on
  broadcast dimensions, negative strides allowed), an output ``(storage, byte offset)``
  and contiguous; ``storage`` is an ``anychip.Buffer`` of that device, or the foreign array
  a DLPack import wrapped (a CuPy array on cuda);
* dtypes are names of :data:`DTYPES`; ops are names of the tuples below;
* ``stream`` is an ``anychip.Stream`` of that device; work is enqueued on it, not waited for.
"""
from __future__ import annotations

import inspect
import math
import threading
from typing import Any, Protocol, runtime_checkable

from ._checks import non_negative_int
from .buffer import Buffer
from .errors import InvalidArgumentError, PluginError

__all__ = ["KernelSet", "Kernels", "kernels_of", "kernel_set_problem", "ELEMENTWISE_OPS", "UNARY_OPS",
           "REDUCE_OPS", "DTYPES"]

#: ``elementwise`` ops; comparisons write bool
ELEMENTWISE_OPS = ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum", "pow")
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
#: ``unary`` ops; ``copy`` converts the input dtype to the output dtype (a cast when they differ)
UNARY_OPS = ("copy", "relu", "exp", "log", "neg", "tanh", "sqrt", "erf")
#: ``reduce`` ops, over the middle axis of (outer, n, inner)
REDUCE_OPS = ("sum", "mean", "max")
#: what ``supports`` may be asked: every op above and ``matmul`` (``gemm``)
OPS = frozenset({*ELEMENTWISE_OPS, *UNARY_OPS, *REDUCE_OPS, "matmul"})
_DL_CPU, _DL_CUDA_HOST = 1, 3      # DLPack's host memory types: no kernel set runs on them
#: dtype name -> bytes per element
DTYPES = {"bool": 1, "int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4,
          "float64": 8}


@runtime_checkable
class KernelSet(Protocol):
    """The methods every backend's kernel set implements (the contract in the module docstring)."""

    def supports(self, index: int, op: str, dtype: str) -> bool:
        """Whether ``op`` runs on ``dtype`` here (the other ops take the host fallback)."""

    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        """``out = a <op> b`` over ``shape``: inputs of ``dtype``, out of ``dtype`` (bool for comparisons)."""

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        """``out = op(x)`` over ``shape``; ``copy`` converts ``dtype`` to ``out_dtype``."""

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        """``out[o, i] = op over r of x[o, r, i]``; x contiguous of shape (outer, n, inner)."""

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        """``out[m, n] = a[m, k] @ b[k, n]`` (a and b strided, out contiguous)."""


_METHODS = {name: list(inspect.signature(getattr(KernelSet, name)).parameters)
            for name in ("supports", "elementwise", "unary", "reduce", "gemm")}


def kernel_set_problem(kernels: Any) -> str | None:
    """Why ``kernels`` (a kernel set or its class) does not implement :class:`KernelSet`, or None:
    a method missing, or one whose parameters are not the protocol's (names and order)."""
    for name, params in _METHODS.items():
        fn = getattr(kernels, name, None)
        if not callable(fn):
            return f"{type(kernels).__name__ if not isinstance(kernels, type) else kernels.__name__} has no {name}()"
        got = list(inspect.signature(fn).parameters)
        if not isinstance(kernels, type) or isinstance(inspect.getattr_static(kernels, name), staticmethod):
            want = params[1:]
        else:
            want = params
        if got != want:
            return f"{name}({', '.join(got)}) should take ({', '.join(want)})"
    return None


# -- the front end -------------------------------------------------------------------

def _op(op: Any, ops: tuple[str, ...], what: str) -> str:
    if op not in ops:
        raise InvalidArgumentError(f"{what}: unknown op {op!r}; expected one of {', '.join(ops)}")
    return op


def _dtype(dtype: Any, what: str) -> int:
    item = DTYPES.get(dtype) if isinstance(dtype, str) else None
    if item is None:
        raise InvalidArgumentError(f"{what}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return item


def _count(value: Any, what: str, name: str) -> int:
    """``value`` as an int >= 0 (the message is only made for a bad one)."""
    if type(value) is int and value >= 0:
        return value
    return non_negative_int(value, f"{what}: {name}" if what else name)


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, tuple):
        raise InvalidArgumentError(f"{what}: shape must be a tuple of ints, got {type(shape).__name__} {shape!r}")
    for n in shape:
        if type(n) is not int or n < 0:
            return tuple(_count(n, what, f"shape[{i}]") for i, n in enumerate(shape))
    return shape


class Kernels:
    """One device's kernel set behind the checks. Get it with :func:`kernels_of`; every
    method is the :class:`KernelSet` method of the same name without ``index``, and
    ``stream`` defaults to the device's current stream."""

    __slots__ = ("device", "set")

    def __init__(self, device: Any, kernel_set: Any) -> None:
        self.device = device
        self.set = kernel_set

    def __repr__(self) -> str:
        return f"<anychip kernels of {self.device}: {type(self.set).__name__}>"

    def supports(self, op: str, dtype: str) -> bool:
        """Whether the set runs ``op`` on ``dtype``; a set that cannot answer is not used."""
        try:
            return bool(self.set.supports(self.device.index, op, dtype))
        except Exception:  # noqa: BLE001 - a kernel set that cannot answer is not used
            return False

    def elementwise(self, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any = None) -> None:
        what = "elementwise"
        _op(op, ELEMENTWISE_OPS, what)
        item = _dtype(dtype, what)
        shape = _shape(shape, what)
        out = self._out(out, math.prod(shape) * (1 if op in COMPARISONS else item), "out", what)
        a = self._input(a, shape, item, "a", what)
        b = self._input(b, shape, item, "b", what)
        self.set.elementwise(self.device.index, op, out, a, b, shape, dtype, self._stream(stream, what))

    def unary(self, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any = None) -> None:
        what = "unary"
        _op(op, UNARY_OPS, what)
        out_item, item = _dtype(out_dtype, what), _dtype(dtype, what)
        if op != "copy" and out_dtype != dtype:
            raise InvalidArgumentError(f"{what}: {op} writes its input's dtype; got {dtype} in and {out_dtype} out "
                                       "(only copy converts)")
        shape = _shape(shape, what)
        out = self._out(out, math.prod(shape) * out_item, "out", what)
        x = self._input(x, shape, item, "x", what)
        self.set.unary(self.device.index, op, out, out_dtype, x, dtype, shape, self._stream(stream, what))

    def reduce(self, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int, inner: int,
               stream: Any = None) -> None:
        what = "reduce"
        _op(op, REDUCE_OPS, what)
        out_item, item = _dtype(out_dtype, what), _dtype(dtype, what)
        outer, n, inner = _count(outer, what, "outer"), _count(n, what, "n"), _count(inner, what, "inner")
        out = self._out(out, outer * inner * out_item, "out", what)
        x = self._out(x, outer * n * inner * item, "x", what)
        self.set.reduce(self.device.index, op, out, out_dtype, x, dtype, outer, n, inner,
                        self._stream(stream, what))

    def gemm(self, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any = None) -> None:
        what = "gemm"
        item = _dtype(dtype, what)
        m, k, n = _count(m, what, "m"), _count(k, what, "k"), _count(n, what, "n")
        out = self._out(out, m * n * item, "out", what)
        a = self._input(a, (m, k), item, "a", what)
        b = self._input(b, (k, n), item, "b", what)
        self.set.gemm(self.device.index, out, a, b, m, k, n, dtype, self._stream(stream, what))

    # -- checks ----------------------------------------------------------------------
    def _storage(self, storage: Any, offset: Any, name: str, what: str) -> tuple[int, int]:
        """(byte offset, bytes the storage holds) of an operand's storage, checked."""
        if isinstance(storage, Buffer):
            if storage.device is not self.device:
                raise InvalidArgumentError(f"{what} {name}: a buffer of {storage.device}, but the kernel runs on "
                                           f"{self.device}")
            storage._check()
            limit: Any = storage.nbytes
        else:                   # the array of a DLPack import (CuPy's on cuda): device memory of this index
            limit = getattr(storage, "nbytes", None)
            try:
                kind, index = storage.__dlpack_device__()
            except Exception:  # noqa: BLE001 - not a DLPack array at all
                kind = index = None
            if type(limit) is not int or kind in (None, _DL_CPU, _DL_CUDA_HOST) or index != self.device.index:
                raise InvalidArgumentError(f"{what} {name}: storage must be an anychip.Buffer of {self.device} or the "
                                           f"array of a DLPack import on it, got {type(storage).__name__}")
        return _count(offset, "", f"{what} {name} offset"), limit

    def _out(self, out: Any, nbytes: int, name: str, what: str) -> tuple[Any, int]:
        if not isinstance(out, tuple) or len(out) != 2:
            raise InvalidArgumentError(f"{what} {name} must be (storage, byte offset), got {out!r}")
        offset, limit = self._storage(out[0], out[1], name, what)
        if nbytes and offset + nbytes > limit:
            raise InvalidArgumentError(f"{what} {name}: {nbytes} bytes from byte {offset} run past the end of its "
                                       f"{limit}-byte storage")
        return (out[0], offset)

    def _input(self, x: Any, shape: tuple[int, ...], item: int, name: str,
               what: str) -> tuple[Any, int, tuple[int, ...]]:
        if not isinstance(x, tuple) or len(x) != 3:
            raise InvalidArgumentError(f"{what} {name} must be (storage, byte offset, strides), got {x!r}")
        offset, limit = self._storage(x[0], x[1], name, what)
        strides = x[2]
        ok = isinstance(strides, tuple) and len(strides) == len(shape)
        lo = hi = 0
        empty = False
        if ok:
            for d, st in zip(shape, strides, strict=True):      # one pass: the types and the extent read
                if type(st) is not int:
                    ok = False
                    break
                if d == 0:
                    empty = True
                elif st > 0:
                    hi += (d - 1) * st
                else:
                    lo += (d - 1) * st
        if not ok:
            raise InvalidArgumentError(f"{what} {name}: strides must be a tuple of {len(shape)} ints (one per "
                                       f"dimension of {shape}), got {strides!r}")
        if not empty:
            first, end = offset + lo * item, offset + (hi + 1) * item
            if first < 0 or end > limit:
                raise InvalidArgumentError(f"{what} {name}: shape {shape} with strides {strides} reads bytes "
                                           f"[{first}, {end}), outside its {limit}-byte storage")
        return (x[0], offset, strides)

    def _stream(self, stream: Any, what: str) -> Any:
        if stream is None:
            return self.device.current_stream()
        if getattr(stream, "device", None) is not self.device or not hasattr(stream, "_live"):
            raise InvalidArgumentError(f"{what}: stream must be an anychip.Stream of {self.device}, got {stream!r}")
        return stream


_fronts: dict[Any, Kernels] = {}
_fronts_lock = threading.Lock()


def kernels_of(device: Any) -> Kernels | None:
    """The checked kernels of ``device`` (an ``anychip.Device``), or None when its backend has
    no kernel set (now: a backend may make its set on first use, as cuda once CuPy is loaded).
    A set that does not implement :class:`KernelSet` raises PluginError."""
    kernel_set = getattr(device.plugin, "kernels", None)
    if kernel_set is None:
        return None
    front = _fronts.get(device)
    if front is not None and front.set is kernel_set:
        return front
    problem = kernel_set_problem(kernel_set)
    if problem is not None:
        raise PluginError(f"the kernel set of {device} ({type(kernel_set).__name__}) does not implement "
                          f"anychip.runtime.KernelSet: {problem}")
    with _fronts_lock:
        front = _fronts[device] = Kernels(device, kernel_set)
    return front
