"""The kernel cases of ``anychip plugin check``: every entry of a C plugin's kernel table
(plugin.h minor 1) and every dtype its masks claim, run on device 0 and compared with NumPy.

What is compared, and how closely:

* exactly (NaN where NumPy has NaN, signed zeros aside): binary ops (integer add / sub / mul
  wrap; float16 and bfloat16 rounded once from the exact result; comparisons into bool; max /
  min propagate NaN) over contiguous, broadcast (stride 0), reversed (negative stride) and
  transposed operands and 0-d ones; relu and neg; every cast between two claimed dtypes (C's
  conversions: floats to integers truncate, integers wrap, nonzero to bool is 1); integer sums
  (int64, wrapping) and every max (NaN propagates); fill (integers exact to 64 bits);
* within :data:`FUNCTION_ULPS` ulp of the correctly rounded result: exp, log, sqrt;
* float sums, means and GEMM within 1 ulp of the output plus the accumulation bound
  ``terms * eps * sum(|terms|)``, eps being 2^-24 for float16, bfloat16 and float32 (they
  accumulate at least in float32, plugin.h says) and 2^-52 for float64.

The set is driven through anychip's front end (``anychip.runtime.kernels_of``), as the tensor
layer drives it; fill through the set's own ``fill``.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime import kernels_of
from ..runtime.errors import AnychipError

__all__ = ["check_kernel_table", "KernelReport", "FUNCTION_ULPS"]

#: exp and log: within this many ulp of the correctly rounded value; sqrt: 1 ulp
FUNCTION_ULPS = {"exp": 2, "log": 2, "sqrt": 1}
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
_STORAGE = {"bfloat16": np.dtype(np.uint16), "bool": np.dtype(np.bool_)}
_EPS = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -24, "float32": 2.0 ** -24, "float64": 2.0 ** -52}
BINARY = ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
_NP_BINARY: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "eq": np.equal,
    "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "maximum": np.maximum, "minimum": np.minimum}


@dataclass
class KernelReport:
    """What the check found: the entries set, the (entry, op, dtype) cases and the calls run,
    and the first wrong one (None when every case agreed)."""

    entries: list[str] = field(default_factory=list)
    cases: int = 0
    calls: int = 0
    failure: str | None = None

    def summary(self) -> str:
        if self.failure:
            return f"FAIL {self.failure}"
        return (f"{len(self.entries)} entries ({', '.join(self.entries)}), {self.cases} dtype cases checked "
                f"({self.calls} calls) against NumPy: all agree")


class _Wrong(Exception):
    pass


# -- bfloat16 and dtype helpers -------------------------------------------------------------

def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float64 values rounded once to bfloat16 (nearest, ties to even): the bits, as uint16.
    Through float32 rounded to odd, which then rounds to bfloat16 as a direct rounding would."""
    shape = np.shape(x)
    x = np.asarray(x, np.float64).reshape(-1)
    with np.errstate(all="ignore"):
        f = x.astype(np.float32)
        bits = f.view(np.uint32).copy()
        inexact = np.isfinite(f) & (f.astype(np.float64) != x) & ((bits & 1) == 0)
        up = np.abs(f.astype(np.float64)) < np.abs(x)
        bits[inexact & up] += 1
        bits[inexact & ~up] -= 1
    nan = np.isnan(x)
    out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out.reshape(shape)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _storage(dtype: str) -> np.dtype:
    return _STORAGE[dtype] if dtype in _STORAGE else np.dtype(dtype)


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 / int values as the dtype's storage (rounded once for float types)."""
    with np.errstate(all="ignore"):
        if dtype == "bfloat16":
            return _bf16_bits(values)
        return np.asarray(values).astype(_storage(dtype))


def _decode(stored: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype's storage as values to compute with: float64 for floats, int64 / bool else."""
    if dtype == "bfloat16":
        return _bf16_values(stored)
    if dtype in FLOATS:
        return stored.astype(np.float64)
    return stored


def _ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of the dtype at each (finite) value."""
    v = np.abs(np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0))
    if dtype == "bfloat16":
        return np.spacing(v.astype(np.float32)).astype(np.float64) * 65536.0
    return np.spacing(v.astype(_storage(dtype))).astype(np.float64)


# -- test values --------------------------------------------------------------------------

def _values(dtype: str, count: int, rng: np.random.Generator, *, special: bool = True) -> np.ndarray:
    """``count`` values of ``dtype`` as its storage: the extremes of integers (so that add, sub,
    mul and neg wrap), and NaN, infinities and signed zeros among floats."""
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(np.bool_)
    if dtype in INTS:
        info = np.iinfo(dtype)
        v = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
        v[: min(count, 3)] = [info.max, info.min, -1 if info.min < 0 else 0][: min(count, 3)]
        return v
    v = rng.normal(0, 8, count)
    if special and count >= 8:
        v[[1, 3, 5, 6]] = [np.nan, np.inf, -np.inf, -0.0]
        v[7] = 0.0
    return _encode(v, dtype)


def _cast_values(src: str, dst: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """Values of ``src`` whose conversion to ``dst`` C defines: floats to an integer type within
    its range (and finite); integers to float16 / bfloat16 below 2^24 (exact in float32)."""
    if src in FLOATS and dst in INTS:
        info = np.iinfo(dst)
        hi = min(float(info.max), 60000.0 if src == "float16" else 1e6)
        lo = max(float(info.min), -hi)
        return _encode(rng.uniform(lo, hi, count), src)
    if src in INTS and dst in ("float16", "bfloat16"):
        info = np.iinfo(src)
        return rng.integers(max(info.min, -(1 << 24)), min(info.max, 1 << 24), count).astype(src)
    return _values(src, count, rng)


# -- the check ----------------------------------------------------------------------------

class _Checker:
    def __init__(self, device: Any) -> None:
        self.device = device
        front = kernels_of(device)
        if front is None:
            raise AnychipError(f"{device} has no kernel set to check")
        self.front = front
        self.set = device.plugin.kernels
        self.rng = np.random.default_rng(20261202)
        self.report = KernelReport(entries=[e for e, m in self.set.masks.items()
                                            if getattr(device.plugin.t.kernels, e) != device.plugin.ffi.NULL])

    # device memory ------------------------------------------------------------------
    def _put(self, host: np.ndarray) -> Any:
        buf = self.device.alloc(max(host.nbytes, 1))
        if host.nbytes:
            buf.copy_from(np.ascontiguousarray(host))
        return buf

    def _get(self, buf: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        self.device.synchronize()
        n = int(np.prod(shape)) if shape else 1
        st = _storage(dtype)
        return buf.to_numpy(st)[:n].reshape(shape)

    def _claims(self, entry: str, dtype: str) -> bool:
        return bool(self.set.masks[entry] & (1 << DTYPES.index(dtype)))

    # comparing --------------------------------------------------------------------------
    def _compare(self, what: str, got_stored: np.ndarray, want: np.ndarray, dtype: str,
                 tol: np.ndarray | None = None) -> None:
        """``want`` (float64 / int / bool values, before rounding to dtype) against the output."""
        got = _decode(got_stored, dtype)
        if dtype in FLOATS:
            want_r = _decode(_encode(want, dtype), dtype)
            with np.errstate(invalid="ignore"):
                same = (got == want_r) | (np.isnan(got) & np.isnan(want_r))
                if tol is not None:
                    finite = np.isfinite(want_r) & np.isfinite(got)
                    same |= finite & (np.abs(got - want) <= tol)
        else:
            want_r = _encode(want, dtype)
            same = got == want_r
        if not np.all(same):
            bad = np.argwhere(~np.asarray(same))
            at = tuple(int(i) for i in bad[0]) if bad.size else ()
            g, w = np.asarray(got), np.asarray(want_r)
            raise _Wrong(f"{what}: {len(bad)} of {max(np.size(same), 1)} elements wrong; first at {at}: expected "
                         f"{w[at].tolist()!r}, got {g[at].tolist()!r}"
                         + (f" (tolerance {float(np.asarray(tol)[at]):.3g})" if tol is not None and np.ndim(tol)
                            else ""))

    def _call(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except AnychipError as exc:
            raise _Wrong(f"{what}: the entry failed: {exc}") from None
        self.report.calls += 1

    # layouts of an elementwise operand ----------------------------------------------------
    def _layouts(self) -> Iterator[tuple[str, tuple[int, ...], Callable[[np.ndarray], Any]]]:
        """(name, shape, operand maker): the maker takes a host array of ``shape`` and returns
        (device operand, keep-alive) laid out so."""
        shape = (3, 5)

        def contiguous(v: np.ndarray) -> Any:
            buf = self._put(v)
            return (buf, 0, (5, 1)), buf

        def reversed_rows(v: np.ndarray) -> Any:       # negative stride: the last column first in memory
            buf = self._put(np.ascontiguousarray(v[:, ::-1]))
            return (buf, 4 * v.itemsize, (5, -1)), buf

        def transposed(v: np.ndarray) -> Any:           # stored as (5, 3)
            buf = self._put(np.ascontiguousarray(v.T))
            return (buf, 0, (1, 3)), buf

        yield "contiguous", shape, contiguous
        yield "negative stride", shape, reversed_rows
        yield "transposed", shape, transposed

    # the entries ------------------------------------------------------------------------------
    def binary(self) -> None:
        for dtype in DTYPES:
            if not self._claims("binary", dtype):
                continue
            for op in BINARY:
                if not self.set.supports(0, op, dtype):
                    continue
                self.report.cases += 1
                out_dtype = "bool" if op in COMPARISONS else dtype
                fn = _NP_BINARY[op]
                for name, shape, make in self._layouts():
                    a: np.ndarray = _values(dtype, 15, self.rng).reshape(shape)
                    b = _values(dtype, 15, self.rng).reshape(shape)
                    self._binary_case(op, dtype, out_dtype, fn, name, shape, a, make(a), b, make(b))
                a = _values(dtype, 15, self.rng).reshape(3, 5)        # b broadcast along rows (stride 0)
                row = _values(dtype, 5, self.rng, special=False)
                rb = self._put(row)
                self._binary_case(op, dtype, out_dtype, fn, "broadcast", (3, 5), a, self._contig(a),
                                  np.broadcast_to(row, (3, 5)), ((rb, 0, (0, 1)), rb))
                x, y = _values(dtype, 1, self.rng, special=False), _values(dtype, 1, self.rng, special=False)
                self._binary_case(op, dtype, out_dtype, fn, "0-d", (), x.reshape(()), self._scalar(x),
                                  y.reshape(()), self._scalar(y))

    def _contig(self, v: np.ndarray) -> Any:
        buf = self._put(v)
        return (buf, 0, tuple(s // v.itemsize for s in v.strides)), buf

    def _scalar(self, v: np.ndarray) -> Any:
        buf = self._put(v)
        return (buf, 0, ()), buf

    def _binary_case(self, op: str, dtype: str, out_dtype: str, fn: Any, layout: str, shape: tuple[int, ...],
                     a: np.ndarray, da: Any, b: np.ndarray, db: Any) -> None:
        what = f"binary {op} {dtype} [{layout}]"
        out = self.device.alloc(max(int(np.prod(shape)) * _storage(out_dtype).itemsize, 1))
        self._call(what, self.front.elementwise, op, (out, 0), da[0], db[0], shape, dtype)
        with np.errstate(all="ignore"):
            if dtype in INTS or dtype == "bool":
                want = fn(a, b)
            elif dtype in ("float16", "float32"):       # NumPy's float16 / float32 ops round once
                want = fn(a, b)
                want = want.astype(np.float64) if out_dtype != "bool" else want
            else:                                       # bfloat16 in float64, rounded once; float64
                want = fn(_decode(a, dtype), _decode(b, dtype))
        self._compare(what, self._get(out, out_dtype, shape), want, out_dtype)

    def unary(self) -> None:
        for dtype in DTYPES:
            if not self._claims("unary", dtype):
                continue
            for op in ("relu", "neg", "exp", "log", "sqrt"):
                if not self.set.supports(0, op, dtype):
                    continue
                self.report.cases += 1
                for name, shape, make in self._layouts():
                    x: np.ndarray = _values(dtype, 15, self.rng).reshape(shape)
                    if op in ("log", "sqrt"):
                        x = _encode(np.abs(_decode(x, dtype)) * np.where(self.rng.random(shape) < 0.2, -1, 1), dtype)
                    self._unary_case(op, dtype, dtype, name, shape, x, make(x))
            for to in DTYPES:                           # casts: dtype -> every claimed dtype
                if not self._claims("unary", to) or not self.set.supports(0, "copy", to):
                    continue
                self.report.cases += 1
                x = _cast_values(dtype, to, 15, self.rng).reshape(3, 5)
                for name, shape, make in itertools.islice(self._layouts(), 2):
                    self._unary_case("copy", to, dtype, name, shape, x, make(x))

    def _unary_case(self, op: str, out_dtype: str, dtype: str, layout: str, shape: tuple[int, ...], x: np.ndarray,
                    dx: Any) -> None:
        what = f"unary {op} {dtype}" + (f" -> {out_dtype}" if op == "copy" else "") + f" [{layout}]"
        out = self.device.alloc(max(int(np.prod(shape)) * _storage(out_dtype).itemsize, 1))
        self._call(what, self.front.unary, op, (out, 0), out_dtype, dx[0], dtype, shape)
        v = _decode(x, dtype)
        tol = None
        with np.errstate(all="ignore"):
            if op == "copy":
                want = v if out_dtype in FLOATS or dtype not in FLOATS else np.trunc(v)
                if out_dtype == "bool":
                    want = v != 0
                elif dtype in FLOATS and out_dtype in INTS:
                    want = np.trunc(v).astype(np.int64)
                elif dtype not in FLOATS and out_dtype in FLOATS:
                    want = v.astype(np.float32 if out_dtype == "float32" else np.float64).astype(np.float64)
            elif op == "relu":
                want = np.maximum(v, v.dtype.type(0))
            elif op == "neg":
                want = np.negative(v)
            else:
                want = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt}[op](v)
                tol = FUNCTION_ULPS[op] * _ulp(want, out_dtype)
        self._compare(what, self._get(out, out_dtype, shape), want, out_dtype, tol)

    def reduce(self) -> None:
        for dtype in DTYPES:
            if not self._claims("reduce", dtype):
                continue
            for op in ("sum", "mean", "max"):
                if not self.set.supports(0, op, dtype):
                    continue
                out_dtype = ("int64" if dtype in INTS or dtype == "bool" else dtype) if op == "sum" else \
                    ("float64" if dtype in INTS or dtype == "bool" else dtype) if op == "mean" else dtype
                if not self._claims("reduce", out_dtype):
                    continue
                self.report.cases += 1
                for outer, n, inner in ((3, 4, 5), (1, 9, 1), (2, 0, 3)):
                    if op == "max" and n == 0:
                        continue
                    x = _values(dtype, outer * n * inner, self.rng, special=op == "max").reshape(outer, n, inner)
                    self._reduce_case(op, dtype, out_dtype, x, outer, n, inner)

    def _reduce_case(self, op: str, dtype: str, out_dtype: str, x: np.ndarray, outer: int, n: int,
                     inner: int) -> None:
        what = f"reduce {op} {dtype} -> {out_dtype} [outer {outer}, n {n}, inner {inner}]"
        xb = self._put(x)
        out = self.device.alloc(max(outer * inner * _storage(out_dtype).itemsize, 1))
        self._call(what, self.front.reduce, op, (out, 0), out_dtype, (xb, 0), dtype, outer, n, inner)
        v = _decode(x, dtype)
        tol = None
        with np.errstate(all="ignore"):
            if op == "max":
                want = np.max(v, axis=1)
            elif dtype in INTS or dtype == "bool":
                total = np.sum(v.astype(np.int64), axis=1)               # wraps in int64
                want = total if op == "sum" else total.astype(np.float64) / n
            else:
                total = np.sum(v, axis=1)
                want = total if op == "sum" else total / n
                bound = np.sum(np.abs(v), axis=1) * (n * _EPS[dtype])
                tol = _ulp(want, out_dtype) + (bound if op == "sum" else bound / max(n, 1))
        self._compare(what, self._get(out, out_dtype, (outer, inner)), want, out_dtype, tol)

    def gemm(self) -> None:
        for dtype in FLOATS:
            if not self._claims("gemm", dtype) or not self.set.supports(0, "matmul", dtype):
                continue
            self.report.cases += 1
            for (m, k, n), layout in (((3, 4, 5), "contiguous"), ((4, 6, 2), "a transposed"),
                                      ((2, 3, 4), "b transposed"), ((3, 1, 3), "k = 1")):
                a = _values(dtype, m * k, self.rng, special=False).reshape(m, k)
                b = _values(dtype, k * n, self.rng, special=False).reshape(k, n)
                if layout == "a transposed":            # stored as (k, m)
                    ab = self._put(np.ascontiguousarray(a.T))
                    da = (ab, 0, (1, m))
                else:
                    ab = self._put(a)
                    da = (ab, 0, (k, 1))
                if layout == "b transposed":            # stored as (n, k)
                    bb = self._put(np.ascontiguousarray(b.T))
                    db = (bb, 0, (1, k))
                else:
                    bb = self._put(b)
                    db = (bb, 0, (n, 1))
                what = f"gemm {dtype} [{layout}, m {m}, k {k}, n {n}]"
                out = self.device.alloc(m * n * _storage(dtype).itemsize)
                self._call(what, self.front.gemm, (out, 0), da, db, m, k, n, dtype)
                va, vb = _decode(a, dtype), _decode(b, dtype)
                want = va @ vb
                tol = _ulp(want, dtype) + (np.abs(va) @ np.abs(vb)) * (k * _EPS[dtype])
                self._compare(what, self._get(out, dtype, (m, n)), want, dtype, tol)

    def fill(self) -> None:
        cases: dict[str, list[float | int]] = {
            "int8": [300, -1, -7.9], "uint8": [-1, 255, 3.99], "int32": [2**31 - 1, -(2**40) - 5, -2.5],
            "int64": [2**62 + 1, -(2**63), 1e15 + 0.5], "bool": [5, 0, 0.25],
            "float16": [0.1, float("nan"), -65519.0, 1e-7], "bfloat16": [0.1, float("-inf"), 3.0e38, 1.00390625],
            "float32": [0.1, float("nan"), 1e300, -3], "float64": [0.1, float("inf"), 2**53 + 1, -0.0]}
        for dtype, values in cases.items():
            if not self._claims("fill", dtype):
                continue
            self.report.cases += 1
            for value in values:
                n = 7
                what = f"fill {dtype} {value!r}"
                out = self.device.alloc(n * _storage(dtype).itemsize)
                stream = self.device.current_stream()
                self._call(what, self.set.fill, 0, (out, 0), n, dtype, value, stream)
                if dtype in FLOATS:
                    want = np.full(n, float(value))
                elif isinstance(value, float):                       # C: truncate, then convert
                    want = np.full(n, value != 0 if dtype == "bool" else int(value))
                else:
                    want = np.full(n, value != 0 if dtype == "bool" else
                                   (value + 2**63) % 2**64 - 2**63, dtype=object)
                    want = want.astype(np.int64)
                with np.errstate(all="ignore"):
                    self._compare(what, self._get(out, dtype, (n,)), want, dtype)


def check_kernel_table(device: Any) -> KernelReport:
    """Run every entry and claimed dtype of ``device``'s kernel table (its backend a C plugin with
    a table) and compare with NumPy; the report names the first case that disagrees."""
    checker = _Checker(device)
    try:
        for entry in ("binary", "unary", "reduce", "gemm", "fill"):
            if entry in checker.report.entries:
                getattr(checker, entry)()
    except _Wrong as exc:
        checker.report.failure = str(exc)
    return checker.report
