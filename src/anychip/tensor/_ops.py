"""The tensor op set and its dispatch.

Each op first checks its arguments (shapes, dtypes, devices) and works out the
result's shape and dtype exactly as NumPy would. It then runs on the device's
kernel set (``device.plugin.kernels`` behind the runtime's checking front end,
``anychip.runtime.kernels_of``; see docs/tensor.md) when that set supports the op and dtype,
and otherwise through the host fallback: the inputs
are read on the device's current stream, NumPy computes, and the result is
written back on that stream. On the cpu backend the fallback is NumPy working
in place on the tensors' memory.

float16 and bfloat16 accumulate in float32 (sums, means, matmul); integer
arithmetic wraps as in NumPy.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..runtime import InvalidArgumentError, UnsupportedError, kernels_of
from . import _dtype as dt
from ._dtype import DType, _host_values
from ._factories import full, tensor
from ._layout import _axis
from ._tensor import Tensor, _new, empty

# (binary, unary, reduce, copy and where_kernels serve Tensor's methods and operators)
__all__ = ["matmul", "cast", "relu", "exp", "log", "tanh", "sqrt", "erf", "maximum", "minimum"]

BINARY: dict[str, Any] = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
          "ge": np.greater_equal, "maximum": np.maximum, "minimum": np.minimum, "pow": np.power}
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
           "gt": ">", "ge": ">=", "pow": "**"}
_erf64 = np.frompyfunc(math.erf, 1, 1)
#: Chebyshev-fitted erfc(z) = t * exp(-z*z + P(t)), t = 1 / (1 + z / 2), fractional error below
#: 1.2e-7 (Press et al., Numerical Recipes, "erfcc"): P's coefficients, constant term first
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
         -0.82215223, 0.17087277)


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise, in NumPy's result type of a float function of ``x``
    (integers give float64). float64: the C library's erf, element by element. float32 and
    narrower: computed in double precision, Taylor's series below 0.5 and 1 - erfc above,
    within 1 ulp of float32 (checked against math.erf), and vectorized."""
    out_type = np.sin(np.ones(1, x.dtype)).dtype
    if out_type == np.float64:
        return np.asarray(_erf64(x.astype(np.float64)), dtype=np.float64)
    v = x.astype(np.float64)
    out = np.empty_like(v)
    small = np.abs(v) < 0.5
    xs = v[small]
    term, total, x2 = xs.copy(), xs.copy(), xs * xs
    for n in range(1, 10):            # 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)); the 10th term < 1e-12
        term *= -x2 / n
        total += term / (2 * n + 1)
    out[small] = total * (2 / math.sqrt(math.pi))
    z = np.abs(v[~small])
    t = 1 / (1 + 0.5 * z)
    poly = np.full_like(t, _ERFC[-1])
    for c in _ERFC[-2::-1]:
        poly = poly * t + c
    out[~small] = np.sign(v[~small]) * (1 - t * np.exp(-z * z + poly))
    return out.astype(out_type)


UNARY: dict[str, Any] = {"relu": lambda x: np.maximum(x, x.dtype.type(0)), "exp": np.exp, "log": np.log,
                         "neg": np.negative, "tanh": np.tanh, "sqrt": np.sqrt, "erf": _erf}


# -- kernels ------------------------------------------------------------------------

def where_kernels(device: Any, op: str, dtype: DType) -> Any:
    """The device's checked kernels (``anychip.runtime.Kernels``) when its set runs ``op`` on
    ``dtype``, else None (host fallback)."""
    kernels = kernels_of(device)
    return kernels if kernels is not None and kernels.supports(op, dtype.name) else None


def _operand(t: Tensor) -> tuple[Any, int, tuple[int, ...]]:
    """What a kernel receives for an input: (storage, byte offset of element 0, strides in elements)."""
    return (t._buf if t._buf is not None else t._ext, t._offset, t._strides)


def _out(t: Tensor) -> tuple[Any, int]:
    return (t._buf if t._buf is not None else t._ext, t._offset)


# -- argument handling --------------------------------------------------------------

def _values(t: Tensor) -> np.ndarray:
    """Host values to compute with (bfloat16 widened to float32)."""
    v = t._read()
    return dt.from_bfloat16_bits(v) if t.dtype is dt.bfloat16 else v


def _result(values: np.ndarray, dtype: DType, device: Any) -> Tensor:
    values = _host_values(np.asarray(values), dtype)
    out = empty(values.shape, dtype=dtype, device=device)
    if values.size:
        out._write(values, owned=True)
    return out


def _scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


def _as_operand(x: Any, device: Any, what: str) -> Any:
    """A Tensor on ``device`` or a Python scalar; array-likes become tensors on ``device``."""
    if isinstance(x, Tensor):
        if x.device is not device:
            raise InvalidArgumentError(f"{what}: tensors on different devices ({device} and {x.device}); move "
                                       f"one with .to({str(device)!r})")
        return x
    if isinstance(x, np.generic) and _scalar(x):
        return tensor(np.asarray(x), device=device)     # a NumPy scalar is strong (NEP 50): a 0-d tensor
    if _scalar(x):
        return x
    try:
        return tensor(x, device=device)
    except (InvalidArgumentError, UnsupportedError):
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: cannot use {type(x).__name__} {x!r} as a tensor ({exc})") from None


@functools.lru_cache(maxsize=512)
def _probe(op: str, a: str, b: Any) -> str:
    """NumPy's result dtype of ``op`` on arrays of dtype ``a`` and ``b`` (a dtype name, or a
    Python scalar type for a weak scalar). Cached: NumPy's rules, asked once."""
    x = np.ones(1, dtype=a)
    fn: Any = BINARY.get(op) or UNARY[op]
    if op in BINARY:
        y = np.ones(1, dtype=b) if isinstance(b, str) else b(1)
        return fn(x, y).dtype.name
    return fn(x).dtype.name


def _numpy_dtype(name: str, what: str) -> DType:
    try:
        return dt.dtype(name)
    except UnsupportedError:
        raise UnsupportedError(f"{what} gives {name} in NumPy, which anychip tensors do not support") from None


_TYPES: dict[tuple[str, str, Any], tuple[DType, DType]] = {}


def _binary_types(op: str, a: DType, b: DType | type) -> tuple[DType, DType]:
    """(compute dtype, result dtype) of ``a <op> b``; worked out once per combination."""
    key = (op, a.name, b.name if isinstance(b, DType) else b)
    found = _TYPES.get(key)
    if found is None:
        found = _TYPES[key] = _binary_types_of(op, a, b)
    return found


def _binary_types_of(op: str, a: DType, b: DType | type) -> tuple[DType, DType]:
    if dt.bfloat16 in (a, b) and (isinstance(b, type) or dt.result_type(a, b) is dt.bfloat16):
        compute = dt.result_type(a, b if isinstance(b, DType) else b(0))
        return compute, (dt.bool_ if op in COMPARISONS else compute)
    bname = b.storage.name if isinstance(b, DType) else b
    name = _probe(op, dt.float32.name if a is dt.bfloat16 else a.storage.name,
                  "float32" if b is dt.bfloat16 else bname)
    result = _numpy_dtype(name, f"{a.name} {_SYMBOL.get(op, op)} {b if isinstance(b, DType) else b.__name__}")
    if op in COMPARISONS:
        return _compare_type(a, b), result
    return result, result


def _compare_type(a: DType, b: DType | type) -> DType:
    """The dtype both sides of a comparison are cast to: their promoted type, or, where NumPy
    promotes to a type tensors do not have (int8 with uint8 gives int16), the narrowest
    supported type that holds both exactly. A comparison's result is bool either way."""
    if not isinstance(b, DType):
        return dt.result_type(a, b(0))
    promoted = np.result_type(dt._np_for_promotion(a), dt._np_for_promotion(b))
    if promoted.name in dt.DTYPES:
        return dt.result_type(a, b)
    for wider in (dt.int32, dt.int64, dt.float64):
        if np.can_cast(a.storage, wider.storage) and np.can_cast(b.storage, wider.storage):
            return wider
    raise UnsupportedError(f"comparing {a.name} with {b.name} needs {promoted.name}, which anychip tensors do not "
                           "support; cast one operand first")


# -- elementwise ---------------------------------------------------------------------

def binary(op: str, a: Any, b: Any) -> Tensor:
    """``a <op> b`` elementwise with NumPy's broadcasting and type promotion; op is one of
    add, sub, mul, div (true division), eq, ne, lt, le, gt, ge, maximum, minimum, pow."""
    first = a if isinstance(a, Tensor) else b
    dev = first.device
    a = _as_operand(a, dev, op)
    b = _as_operand(b, dev, op)
    sym = _SYMBOL.get(op, op)
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        try:
            shape = a._shape if a._shape == b._shape else tuple(np.broadcast_shapes(a.shape, b.shape))
        except ValueError:
            raise InvalidArgumentError(f"{sym}: shapes {a.shape} and {b.shape} cannot be broadcast together "
                                       "(trailing dimensions must be equal or 1)") from None
        compute, result = _binary_types(op, a.dtype, b.dtype)
    else:
        t, s = (a, b) if isinstance(a, Tensor) else (b, a)
        shape = t.shape
        compute, result = _binary_types(op, t.dtype, type(s))
        if type(s) is int and compute.kind in "iu" and not _fits(s, compute):
            if op not in COMPARISONS:
                raise InvalidArgumentError(f"{sym}: the Python integer {s} is out of bounds for {compute.name} "
                                           f"(NumPy raises OverflowError); use a tensor of a wider dtype")
            # NumPy compares with the exact value (uint8 <= -2 is False); a kernel would wrap it
            with np.errstate(all="ignore"):
                return _result(BINARY[op](_host_operand(a), _host_operand(b)), result, dev)
    k = where_kernels(dev, op, compute)
    if k is not None:
        try:
            return _binary_kernel(k, op, a, b, shape, compute, result)
        except UnsupportedError:        # the kernel set cannot take this layout: host fallback
            pass
    try:
        with np.errstate(all="ignore"):
            values = BINARY[op](_host_operand(a), _host_operand(b))
    except TypeError as exc:
        raise UnsupportedError(f"{sym} is not defined for these types ({exc})") from None
    except ValueError as exc:          # NumPy: integers to negative integer powers
        raise InvalidArgumentError(f"{sym}: {exc}") from None
    return _result(values, result, dev)


def _fits(value: int, dtype: DType) -> bool:
    info = np.iinfo(dtype.storage)
    return int(info.min) <= value <= int(info.max)


def _host_operand(x: Any) -> Any:
    return _values(x) if isinstance(x, Tensor) else x


def _binary_kernel(k: Any, op: str, a: Any, b: Any, shape: tuple[int, ...], compute: DType,
                   result: DType) -> Tensor:
    dev = (a if isinstance(a, Tensor) else b).device
    a = _prepare(a, compute, dev)
    b = _prepare(b, compute, dev)
    out = _new(shape, result, dev)
    if out.size:
        k.elementwise(op, _out(out), _broadcast(a, shape), _broadcast(b, shape), shape, compute.name,
                      dev.current_stream())
    return out


def _prepare(x: Any, dtype: DType, dev: Any) -> Tensor:
    if isinstance(x, Tensor):
        return x if x.dtype is dtype else cast(x, dtype)
    return full_like_scalar(x, dtype, dev)


def full_like_scalar(value: Any, dtype: DType, dev: Any) -> Tensor:
    return full((), value, dtype=dtype, device=dev)


def _broadcast(t: Tensor, shape: tuple[int, ...]) -> tuple[Any, int, tuple[int, ...]]:
    """Operand of ``t`` read as ``shape`` (stride 0 on broadcast dimensions)."""
    if t._shape == shape:
        return _operand(t)
    lead = len(shape) - t.ndim
    strides = [0] * lead
    for n, s, want in zip(t.shape, t.strides, shape[lead:], strict=False):
        strides.append(0 if n == 1 and want != 1 else s)
    storage, off, _ = _operand(t)
    return storage, off, tuple(strides)


def maximum(a: Any, b: Any) -> Tensor:
    return binary("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    return binary("minimum", a, b)


def unary(op: str, x: Tensor) -> Tensor:
    """relu, exp, log, neg, tanh, sqrt or erf of every element (the float functions of integers
    give floats, as in NumPy)."""
    if not isinstance(x, Tensor):
        raise InvalidArgumentError(f"{op} needs a Tensor, got {type(x).__name__}")
    if x.dtype is dt.bfloat16:
        result = dt.bfloat16
    else:
        if x.dtype is dt.bool_ and op in ("neg", "relu"):
            raise UnsupportedError(f"{op} is not defined for bool tensors")
        result = _numpy_dtype(_probe(op, x.dtype.storage.name, None), f"{op}({x.dtype.name})")
    src = x if x.dtype is result else cast(x, result)
    k = where_kernels(x.device, op, result)
    if k is not None:
        out = _new(x.shape, result, x.device)
        try:
            if out.size:
                k.unary(op, _out(out), result.name, _operand(src), result.name, x.shape, x.device.current_stream())
            return out
        except UnsupportedError:
            pass
    with np.errstate(all="ignore"):
        values = UNARY[op](_values(src))
    return _result(values, result, x.device)


def relu(x: Tensor) -> Tensor:
    return unary("relu", x)


def exp(x: Tensor) -> Tensor:
    return unary("exp", x)


def log(x: Tensor) -> Tensor:
    return unary("log", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def sqrt(x: Tensor) -> Tensor:
    return unary("sqrt", x)


def erf(x: Tensor) -> Tensor:
    """The error function (as ``math.erf`` / ``scipy.special.erf``)."""
    return unary("erf", x)


def cast(x: Tensor, dtype: Any) -> Tensor:
    """The elements converted to ``dtype`` (C conversion, as NumPy's ``astype``; to
    bfloat16 rounded to nearest even). Returns ``x`` itself when the dtype is the same."""
    d = dt.dtype(dtype)
    if d is x.dtype:
        return x
    return _convert(x, d)


def copy(x: Tensor) -> Tensor:
    """A contiguous copy of ``x`` in new memory of its device."""
    return _convert(x, x.dtype)


def _convert(x: Tensor, d: DType) -> Tensor:
    k = where_kernels(x.device, "copy", x.dtype)
    if k is not None and (d is x.dtype or where_kernels(x.device, "copy", d) is not None):
        out = _new(x.shape, d, x.device)
        try:
            if out.size:
                k.unary("copy", _out(out), d.name, _operand(x), x.dtype.name, x.shape, x.device.current_stream())
            return out
        except UnsupportedError:
            pass
    values = x._read() if d is x.dtype else _values(x)
    with np.errstate(all="ignore"):
        return _result(values, d, x.device)


# -- reductions ---------------------------------------------------------------------

def _reduce_type(op: str, d: DType) -> DType:
    if op == "max":
        return d
    if d.kind in "biu":
        return dt.int64 if op == "sum" else dt.float64
    return d


def reduce(op: str, x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """sum, mean or max over ``axis`` (None: every element). Integer sums give int64 and
    integer means float64 (NumPy's types; uint8 sums are int64 where NumPy uses uint64);
    float16 and bfloat16 accumulate in float32."""
    if not isinstance(x, Tensor):
        raise InvalidArgumentError(f"{op} needs a Tensor, got {type(x).__name__}")
    axes = tuple(range(x.ndim)) if axis is None else (_axis(axis, x.ndim),) if x.ndim else ()
    if axis is not None and x.ndim == 0:
        raise InvalidArgumentError(f"{op}: axis {axis} is out of range for a 0-d tensor")
    if op == "max" and any(x.shape[a] == 0 for a in axes):
        raise InvalidArgumentError(f"max of an empty dimension (shape {x.shape}, axis {axis}): there is no "
                                   "maximum of zero elements")
    result = _reduce_type(op, x.dtype)
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else \
        tuple(n for i, n in enumerate(x.shape) if i not in axes)
    if op == "mean" and x.dtype.kind in "biu" and x.size:
        x = cast(x, dt.float64)         # NumPy accumulates integer means in float64 (an int64 sum may wrap)
    # an empty input has nothing for a kernel to read: the host gives NumPy's 0 / nan
    k = where_kernels(x.device, op, x.dtype) if x.size else None
    if k is not None:
        src = x.contiguous()
        if axis is None or x.ndim == 0:
            outer, n, inner = 1, src.size, 1
        else:
            a = axes[0]
            outer, n, inner = math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1:])
        out = _new(shape, result, x.device)
        try:
            if out.size:
                k.reduce(op, _out(out), result.name, _out(src), x.dtype.name, outer, n, inner,
                         x.device.current_stream())
            return out
        except UnsupportedError:
            pass
    v = _values(x)
    ax = None if axis is None else axes[0]
    acc = np.float32 if x.dtype in (dt.float16, dt.bfloat16) else None
    with np.errstate(all="ignore"):
        if op == "sum":
            values = np.sum(v, axis=ax, keepdims=keepdims, dtype=acc or result.numpy)
        elif op == "mean":
            values = np.mean(v, axis=ax, keepdims=keepdims, dtype=acc or result.numpy)
        else:
            values = np.max(v, axis=ax, keepdims=keepdims)
    return _result(np.asarray(values).reshape(shape), result, x.device)


# -- matmul -------------------------------------------------------------------------

def matmul(a: Any, b: Any) -> Tensor:
    """Matrix product with NumPy's rules for 1-D and 2-D operands (and batches of
    matrices through the host fallback)."""
    first = a if isinstance(a, Tensor) else b
    if not isinstance(first, Tensor):
        raise InvalidArgumentError("matmul needs at least one Tensor")
    dev = first.device
    a = _as_operand(a, dev, "matmul")
    b = _as_operand(b, dev, "matmul")
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.ndim == 0 or b.ndim == 0:
        raise InvalidArgumentError("matmul: both operands must have at least one dimension (use * for scalars)")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise InvalidArgumentError(f"matmul: shapes {a.shape} and {b.shape} do not match: the last dimension of "
                                   f"the first ({ka}) must equal the {'second-to-last' if b.ndim >= 2 else 'only'} "
                                   f"dimension of the second ({kb})")
    try:
        result = dt.result_type(a.dtype, b.dtype)
    except UnsupportedError:
        raise UnsupportedError(f"matmul of {a.dtype.name} and {b.dtype.name} gives "
                               f"{np.result_type(a.dtype.storage, b.dtype.storage).name} in NumPy, which anychip "
                               "tensors do not support; cast one operand (e.g. to int32) first") from None
    if a.ndim <= 2 and b.ndim <= 2:
        k = where_kernels(dev, "matmul", result)
        if k is not None:
            try:
                return _gemm(k, a, b, result)
            except UnsupportedError:
                pass
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise InvalidArgumentError(f"matmul: the batch dimensions of {a.shape} and {b.shape} cannot be "
                                   "broadcast together") from None
    # contiguous operands: NumPy's matmul takes its BLAS path only for those (a transposed view
    # of a batch falls to a loop many times slower)
    va, vb = np.ascontiguousarray(_values(a)), np.ascontiguousarray(_values(b))
    if result in (dt.float16, dt.bfloat16):
        va, vb = va.astype(np.float32), vb.astype(np.float32)
    elif result.kind != "b":
        va, vb = va.astype(result.numpy, copy=False), vb.astype(result.numpy, copy=False)
    return _result(np.matmul(va, vb), result, dev)


def _gemm(k: Any, a: Tensor, b: Tensor, result: DType) -> Tensor:
    dev = a.device
    a2 = a if a.ndim == 2 else a.reshape(1, a.shape[0])
    b2 = b if b.ndim == 2 else b.reshape(b.shape[0], 1)
    a2 = a2 if a2.dtype is result else cast(a2, result)
    b2 = b2 if b2.dtype is result else cast(b2, result)
    m, kk, n = a2.shape[0], a2.shape[1], b2.shape[1]
    shape = (m, n) if a.ndim == 2 and b.ndim == 2 else (n,) if a.ndim == 1 and b.ndim == 2 else \
        (m,) if b.ndim == 1 and a.ndim == 2 else ()
    out = _new(shape, result, dev)
    if out.size and kk == 0:
        # a product over an empty inner dimension is all zeros (NumPy); there is nothing for a GEMM to read
        out.buffer.memset(0, stream=dev.current_stream())
    elif out.size:
        k.gemm(_out(out), _operand(a2), _operand(b2), m, kk, n, result.name, dev.current_stream())
    return out
