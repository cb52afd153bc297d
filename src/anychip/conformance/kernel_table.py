"""The kernel cases of ``anychip conformance`` (the ``kernels`` case) and ``anychip plugin check``:
every entry of a backend's kernel set (a C plugin's table, plugin.h minor 1, or a built-in
set such as the simulated chips') and every dtype it claims, run on the device and compared
with NumPy.

The operands: contiguous, broadcast (stride 0) along each dimension in turn, of either operand
and of both at once, reversed (negative stride), permuted (transposed), sliced (every other
element, from an offset), 0-d, in three and four dimensions; element counts prime and above
64 (67, and 65537 = 2^16 + 1 in one dimension), so that a blocked or tiled kernel of any block
size up to 64 (or a 16-bit launch dimension) ends in a partial block; reductions over 67 and
131 rows, GEMM of 67 x 67 x 67. The values: integers at their extremes (they wrap), NaN,
infinities, signed zeros and subnormals among floats (a kernel that flushes subnormals to zero
is wrong), booleans checked byte for byte (true is 1, not 0xFF). Last, one call of each entry
queued behind held work, its inputs' copies and followed by the copy of its result on the same
stream, read after one synchronize at the end: a kernel that runs when it is launched, not in
stream order, reads its inputs before they have arrived.

What is compared, and how closely:

* exactly (NaN where NumPy has NaN, signed zeros aside): binary ops (integer add / sub / mul
  wrap; float16 and bfloat16 rounded once from the exact result; comparisons into bool; max /
  min propagate NaN); relu and neg; every cast between two claimed dtypes (C's conversions:
  floats to integers truncate, integers wrap, nonzero to bool is 1); integer sums (int64,
  wrapping) and every max (NaN propagates); fill (integers exact to 64 bits);
* within :data:`FUNCTION_ULPS` ulp of the correctly rounded result: exp, log, sqrt;
* float sums, means and GEMM within 1 ulp of the output plus the accumulation bound
  ``terms * eps * sum(|terms|)``, eps being 2^-24 for float16, bfloat16 and float32 (they
  accumulate at least in float32, plugin.h says) and 2^-52 for float64.

The set is driven through anychip's front end (``anychip.runtime.kernels_of``), as the tensor
layer drives it; fill (C plugins only) through the set's own ``fill``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..runtime import kernels_of
from ..runtime.errors import AnychipError, UnsupportedError

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
    refused: int = 0
    failure: str | None = None

    def summary(self) -> str:
        if self.failure:
            return f"FAIL {self.failure}"
        return (f"{len(self.entries)} entries ({', '.join(self.entries)}), {self.cases} dtype cases checked "
                f"({self.calls} calls) against NumPy: all agree"
                + (f"; {self.refused} calls refused (UnsupportedError: run on the host)" if self.refused else ""))


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

#: the least positive subnormal of each float dtype
_TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 2.0 ** -1074}


def _values(dtype: str, count: int, rng: np.random.Generator, *, special: bool = True) -> np.ndarray:
    """``count`` values of ``dtype`` as its storage: the extremes of integers (so that add, sub,
    mul and neg wrap), and NaN, infinities, signed zeros and subnormals among floats."""
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
    if special and count >= 13:          # subnormals (the same places in both operands: their sums are too)
        tiny = _TINY[dtype]
        v[9:13] = [tiny, -3 * tiny, 1000 * tiny, -77 * tiny]
    return _encode(v, dtype)


def _cast_values(src: str, dst: str, count: int, *, rng: np.random.Generator) -> np.ndarray:
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


# -- operand layouts ----------------------------------------------------------------------------

#: the shape of the elementwise cases: three dimensions, the last prime and above 64
SHAPE = (3, 5, 67)
#: (name, storage shape for a logical shape, the view of it): every layout an operand comes in
Layout = tuple[str, Callable[[tuple[int, ...]], tuple[int, ...]], Callable[[np.ndarray], np.ndarray]]


def _broadcast(dim: int) -> Layout:
    def storage(shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(1 if d == dim else n for d, n in enumerate(shape))
    return (f"broadcast along dim {dim}", storage, lambda st: st)     # the view is broadcast by the caller


LAYOUTS: dict[str, Layout] = {
    "contiguous": ("contiguous", lambda shape: shape, lambda st: st),
    "reversed": ("reversed (negative stride)", lambda shape: shape, lambda st: st[..., ::-1]),
    "permuted": ("permuted (transposed)", lambda shape: shape[::-1], lambda st: st.transpose()),
    "sliced": ("sliced (every other element, from an offset)", lambda shape: shape[:-1] + (2 * shape[-1] + 3,),
               lambda st: st[..., 3::2]),
    **{f"broadcast{d}": _broadcast(d) for d in range(len(SHAPE))},
}


def _element_strides(view: np.ndarray, storage: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """(byte offset into ``storage``, strides in elements) of ``view``, a view of it."""
    offset = view.__array_interface__["data"][0] - storage.__array_interface__["data"][0]
    return offset, tuple(int(st) // storage.itemsize for st in view.strides)


# -- the check ----------------------------------------------------------------------------

class _Checker:
    def __init__(self, device: Any, ordered: bool) -> None:
        self.device = device
        front = kernels_of(device)
        if front is None:
            raise AnychipError(f"{device} has no kernel set to check")
        self.front = front
        self.set = front.set
        self.ordered = ordered
        self.rng = np.random.default_rng(20261202)
        plugin_table = getattr(self.set, "masks", None)
        self.masks = dict(plugin_table) if isinstance(plugin_table, dict) else None
        ops = {"binary": BINARY, "unary": ("relu", "neg", "exp", "log", "sqrt", "copy"),
               "reduce": ("sum", "mean", "max"), "gemm": ("matmul",)}
        entries = [e for e, names in ops.items() if any(self._supports(op, dt) for op in names for dt in DTYPES)]
        if self.masks is not None and self.masks.get("fill") and hasattr(self.set, "fill"):
            entries.append("fill")
        self.report = KernelReport(entries=entries)

    def _supports(self, op: str, dtype: str) -> bool:
        return self.front.supports(op, dtype)

    # device memory ------------------------------------------------------------------
    def _put(self, host: np.ndarray) -> Any:
        buf = self.device.alloc(max(host.nbytes, 1))
        if host.nbytes:
            buf.copy_from(np.ascontiguousarray(host))
        return buf

    def _get(self, buf: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        self.device.synchronize()
        n = int(np.prod(shape)) if shape else 1
        return buf.to_numpy(_storage(dtype))[:n].reshape(shape)

    def _claims(self, entry: str, dtype: str) -> bool:
        if self.masks is not None:
            return bool(self.masks.get(entry, 0) & (1 << DTYPES.index(dtype)))
        return True

    def _operand(self, layout: str, dtype: str, shape: tuple[int, ...], *, special: bool = True,
                 values: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, Any]:
        """(the logical values, (device operand, keep-alive)) of an operand of ``shape`` laid out so."""
        _, storage_shape, view_of = LAYOUTS[layout]
        st_shape = storage_shape(shape)
        count = int(np.prod(st_shape))
        st = (values(count) if values else _values(dtype, count, self.rng, special=special)).reshape(st_shape)
        view = np.broadcast_to(view_of(st), shape)
        offset, strides = _element_strides(view, st)
        buf = self._put(st)
        return np.array(view), ((buf, offset, strides), buf)

    # comparing --------------------------------------------------------------------------
    def _compare(self, what: str, got_stored: np.ndarray, want: np.ndarray, dtype: str,
                 tol: np.ndarray | None = None) -> None:
        """``want`` (float64 / int / bool values, before rounding to dtype) against the output."""
        if dtype == "bool":                                  # byte for byte: true is 1
            got = np.asarray(got_stored).view(np.uint8)
            want_r = np.asarray(want).astype(np.bool_).astype(np.uint8)
            same = got == want_r
        elif dtype in FLOATS:
            got = _decode(got_stored, dtype)
            want_r = _decode(_encode(want, dtype), dtype)
            with np.errstate(invalid="ignore"):
                same = (got == want_r) | (np.isnan(got) & np.isnan(want_r))
                if tol is not None:
                    finite = np.isfinite(want_r) & np.isfinite(got)
                    same |= finite & (np.abs(got - want) <= tol)
        else:
            got = _decode(got_stored, dtype)
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

    def _call(self, what: str, fn: Callable[..., None], *args: Any, **kwargs: Any) -> bool:
        """Run the entry; False when the set refuses the case (UnsupportedError: a layout it does
        not take, which the tensor layer then runs on the host), an error a failure."""
        try:
            fn(*args, **kwargs)
        except UnsupportedError:
            self.report.refused += 1
            return False
        except AnychipError as exc:
            raise _Wrong(f"{what}: the entry failed: {exc}") from None
        self.report.calls += 1
        return True

    # the entries ------------------------------------------------------------------------------
    #: (layout of a, layout of b) of every binary case: each layout of each operand, broadcast
    #: along every dimension of either, and both broadcast at once (an outer product)
    PAIRS = (("contiguous", "contiguous"), ("reversed", "contiguous"), ("contiguous", "permuted"),
             ("sliced", "reversed"), ("contiguous", "broadcast0"), ("contiguous", "broadcast1"),
             ("contiguous", "broadcast2"), ("broadcast0", "contiguous"), ("broadcast2", "permuted"),
             ("broadcast2", "broadcast0"))

    def binary(self) -> None:
        for dtype in DTYPES:
            if not self._claims("binary", dtype):
                continue
            for op in BINARY:
                if not self._supports(op, dtype) or (op == "div" and dtype not in FLOATS):
                    continue                # (division is true division of floats: int / int is float64)
                self.report.cases += 1
                out_dtype = "bool" if op in COMPARISONS else dtype
                for la, lb in self.PAIRS:
                    a, da = self._operand(la, dtype, SHAPE)
                    b, db = self._operand(lb, dtype, SHAPE)
                    self._binary_case(op, dtype, out_dtype, f"{la}, {lb}", SHAPE, a, da, b, db)
                x, dx = self._operand("contiguous", dtype, (), special=False)
                y, dy = self._operand("contiguous", dtype, (), special=False)
                self._binary_case(op, dtype, out_dtype, "0-d", (), x, dx, y, dy)
        for dtype in ("float32", "int8"):              # one dimension past 2^16 elements
            if self._claims("binary", dtype) and self._supports("add", dtype):
                shape = ((1 << 16) + 1,)
                a, da = self._operand("contiguous", dtype, shape)
                b, db = self._operand("contiguous", dtype, shape)
                self._binary_case("add", dtype, dtype, "65537 elements", shape, a, da, b, db)

    def _binary_case(self, op: str, dtype: str, out_dtype: str, layout: str, shape: tuple[int, ...],
                     a: np.ndarray, da: Any, b: np.ndarray, db: Any) -> None:
        what = f"binary {op} {dtype} [{layout}, shape {shape}]"
        out = self.device.alloc(max(int(np.prod(shape)) * _storage(out_dtype).itemsize, 1))
        if not self._call(what, self.front.elementwise, op, (out, 0), da[0], db[0], shape, dtype):
            return
        self._compare(what, self._get(out, out_dtype, shape), _binary_want(op, dtype, out_dtype, a, b), out_dtype)
        out.free()

    UNARY_LAYOUTS = ("contiguous", "reversed", "permuted", "sliced", "broadcast1")

    def unary(self) -> None:
        for dtype in DTYPES:
            if not self._claims("unary", dtype):
                continue
            for op in ("relu", "neg", "exp", "log", "sqrt"):
                if not self._supports(op, dtype):
                    continue
                self.report.cases += 1
                for layout in self.UNARY_LAYOUTS:
                    def vals(count: int, op: str = op, dtype: str = dtype) -> np.ndarray:
                        x = _values(dtype, count, self.rng)
                        if op in ("log", "sqrt"):          # mostly in the domain, a fifth outside
                            sign = np.where(self.rng.random(count) < 0.2, -1, 1)
                            x = _encode(np.abs(_decode(x, dtype)) * sign, dtype)
                        return x
                    x, dx = self._operand(layout, dtype, SHAPE, values=vals)
                    self._unary_case(op, dtype, dtype, layout, SHAPE, x, dx)
            for to in DTYPES:                           # casts: dtype -> every claimed dtype
                if not self._claims("unary", to) or not self._supports("copy", to):
                    continue
                self.report.cases += 1
                for layout in ("contiguous", "sliced"):
                    cast_values = partial(_cast_values, dtype, to, rng=self.rng)
                    x, dx = self._operand(layout, dtype, SHAPE, values=cast_values)
                    self._unary_case("copy", to, dtype, layout, SHAPE, x, dx)

    def _unary_case(self, op: str, out_dtype: str, dtype: str, layout: str, shape: tuple[int, ...], x: np.ndarray,
                    dx: Any) -> None:
        what = f"unary {op} {dtype}" + (f" -> {out_dtype}" if op == "copy" else "") + f" [{layout}, shape {shape}]"
        out = self.device.alloc(max(int(np.prod(shape)) * _storage(out_dtype).itemsize, 1))
        if not self._call(what, self.front.unary, op, (out, 0), out_dtype, dx[0], dtype, shape):
            return
        want, tol = _unary_want(op, dtype, out_dtype, x)
        self._compare(what, self._get(out, out_dtype, shape), want, out_dtype, tol)
        out.free()

    #: (outer, n, inner): rows past every block size up to 64 (67, 131: prime), one row, none
    REDUCE_SHAPES = ((3, 67, 5), (1, 131, 1), (2, 1, 3), (2, 0, 3))

    def reduce(self) -> None:
        for dtype in DTYPES:
            if not self._claims("reduce", dtype):
                continue
            for op in ("sum", "mean", "max"):
                if not self._supports(op, dtype):
                    continue
                out_dtype = _reduce_out(op, dtype)
                if not self._claims("reduce", out_dtype):
                    continue
                self.report.cases += 1
                for outer, n, inner in self.REDUCE_SHAPES:
                    if op == "max" and n == 0:
                        continue
                    x = _values(dtype, outer * n * inner, self.rng, special=op == "max").reshape(outer, n, inner)
                    self._reduce_case(op, dtype, out_dtype, x, outer, n, inner)

    def _reduce_case(self, op: str, dtype: str, out_dtype: str, x: np.ndarray, outer: int, n: int,
                     inner: int) -> None:
        what = f"reduce {op} {dtype} -> {out_dtype} [outer {outer}, n {n}, inner {inner}]"
        xb = self._put(x)
        out = self.device.alloc(max(outer * inner * _storage(out_dtype).itemsize, 1))
        if not self._call(what, self.front.reduce, op, (out, 0), out_dtype, (xb, 0), dtype, outer, n, inner):
            return
        want, tol = _reduce_want(op, dtype, out_dtype, x)
        self._compare(what, self._get(out, out_dtype, (outer, inner)), want, out_dtype, tol)
        xb.free()
        out.free()

    GEMM_CASES = (((67, 67, 67), "contiguous"), ((4, 6, 2), "a transposed"), ((2, 3, 4), "b transposed"),
                  ((3, 1, 3), "k = 1"), ((65, 66, 1), "n = 1"))

    def gemm(self) -> None:
        for dtype in FLOATS:
            if not self._claims("gemm", dtype) or not self._supports("matmul", dtype):
                continue
            self.report.cases += 1
            for (m, k, n), layout in self.GEMM_CASES:
                a, da = self._operand("permuted" if layout == "a transposed" else "contiguous", dtype, (m, k),
                                      special=False)
                b, db = self._operand("permuted" if layout == "b transposed" else "contiguous", dtype, (k, n),
                                      special=False)
                what = f"gemm {dtype} [{layout}, m {m}, k {k}, n {n}]"
                out = self.device.alloc(m * n * _storage(dtype).itemsize)
                if not self._call(what, self.front.gemm, (out, 0), da[0], db[0], m, k, n, dtype):
                    continue
                want, tol = _gemm_want(dtype, a, b)
                self._compare(what, self._get(out, dtype, (m, n)), want, dtype, tol)
                out.free()

    def fill(self) -> None:
        cases: dict[str, list[float | int]] = {
            "int8": [300, -1, -7.9], "uint8": [-1, 255, 3.99], "int32": [2**31 - 1, -(2**40) - 5, -2.5],
            "int64": [2**62 + 1, -(2**63), 1e15 + 0.5], "bool": [5, 0, 0.25],
            "float16": [0.1, float("nan"), -65519.0, 1e-7], "bfloat16": [0.1, float("-inf"), 3.0e38, 1.00390625],
            "float32": [0.1, float("nan"), 1e300, -3, 1e-40], "float64": [0.1, float("inf"), 2**53 + 1, -0.0]}
        for dtype, values in cases.items():
            if not self._claims("fill", dtype):
                continue
            self.report.cases += 1
            for value in values:
                n = 67
                what = f"fill {dtype} {value!r}"
                out = self.device.alloc(n * _storage(dtype).itemsize)
                stream = self.device.current_stream()
                if not self._call(what, self.set.fill, self.device.index, (out, 0), n, dtype, value, stream):
                    continue
                with np.errstate(all="ignore"):
                    self._compare(what, self._get(out, dtype, (n,)), _fill_want(dtype, value, n), dtype)
                out.free()

    # stream order ---------------------------------------------------------------------------
    def in_stream_order(self) -> None:
        """One call of each entry on a new stream behind held work (_busy.py), its inputs
        copied in and its output copied out on that stream, one synchronize at the end."""
        import anychip

        from ._busy import Busy
        busy = Busy.of(self.device, 1)
        stream = anychip.Stream(self.device)
        try:
            for entry in self.report.entries:
                dtype = next((dt for dt in ("float32", "float64", "float16", "int32", "int64") if
                              self._claims(entry, dt) and (entry == "fill" or self._supports(
                                  {"binary": "add", "unary": "neg", "reduce": "sum", "gemm": "matmul"}[entry], dt))),
                             None)
                if dtype is not None:
                    self._ordered(entry, dtype, stream, busy)
        finally:
            stream.synchronize()
            stream.destroy()

    def _ordered(self, entry: str, dtype: str, stream: Any, busy: Any) -> None:
        what = f"{entry} {dtype} queued behind held work and its inputs' copies on one stream, read after it"
        shape = {"binary": SHAPE, "unary": SHAPE, "reduce": (3, 67, 5), "gemm": (67, 67), "fill": (67,)}[entry]
        hosts = [_values(dtype, int(np.prod(shape)), self.rng, special=False).reshape(shape) for _ in range(2)]
        bufs = [self.device.alloc(h.nbytes).memset(0xA5) for h in hosts]      # stale: not the inputs
        out_dtype = _reduce_out("sum", dtype) if entry == "reduce" else dtype
        out_shape = {"reduce": (3, 5)}.get(entry, shape)
        out = self.device.alloc(int(np.prod(out_shape)) * _storage(out_dtype).itemsize)
        got = np.zeros(out_shape, _storage(out_dtype))
        self.device.synchronize()
        busy.hold(stream)
        out.memset(0xA5, stream=stream)                 # a kernel run before it is overwritten
        for h, b in zip(hosts, bufs, strict=True):
            b.copy_from(np.ascontiguousarray(h), stream=stream)
        a, b = hosts
        strides = tuple(int(st) // a.itemsize for st in a.strides)
        tol = None
        ran = True
        if entry == "binary":
            ran = self._call(what, self.front.elementwise, "add", (out, 0), (bufs[0], 0, strides),
                             (bufs[1], 0, strides), shape, dtype, stream=stream)
            want = _binary_want("add", dtype, dtype, a, b)
        elif entry == "unary":
            ran = self._call(what, self.front.unary, "neg", (out, 0), dtype, (bufs[0], 0, strides), dtype, shape,
                       stream=stream)
            want, tol = _unary_want("neg", dtype, dtype, a)
        elif entry == "reduce":
            ran = self._call(what, self.front.reduce, "sum", (out, 0), out_dtype, (bufs[0], 0), dtype, *shape,
                             stream=stream)
            want, tol = _reduce_want("sum", dtype, out_dtype, a)
        elif entry == "gemm":
            ran = self._call(what, self.front.gemm, (out, 0), (bufs[0], 0, strides), (bufs[1], 0, strides), *shape,
                       shape[1], dtype, stream=stream)
            want, tol = _gemm_want(dtype, a, b)
        else:
            ran = self._call(what, self.set.fill, self.device.index, (out, 0), shape[0], dtype, 3, stream)
            want = _fill_want(dtype, 3, shape[0])
        out.copy_to(got, stream=stream)
        stream.synchronize()
        if ran:
            self._compare(what, got, want, out_dtype, tol)
        for x in (*bufs, out):
            x.free()


# -- NumPy's results ------------------------------------------------------------------------------

def _binary_want(op: str, dtype: str, out_dtype: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = _NP_BINARY[op]
    with np.errstate(all="ignore"):
        if dtype in INTS or dtype == "bool":
            return fn(a, b)
        if dtype in ("float16", "float32"):             # NumPy's float16 / float32 ops round once
            want = fn(a, b)
            return want.astype(np.float64) if out_dtype != "bool" else want
        return fn(_decode(a, dtype), _decode(b, dtype))  # bfloat16 in float64, rounded once; float64


def _unary_want(op: str, dtype: str, out_dtype: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
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
    return want, tol


def _reduce_out(op: str, dtype: str) -> str:
    whole = dtype in INTS or dtype == "bool"
    return ("int64" if whole else dtype) if op == "sum" else ("float64" if whole else dtype) if op == "mean" else dtype


def _reduce_want(op: str, dtype: str, out_dtype: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    v = _decode(x, dtype)
    n = x.shape[1]
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
    return want, tol


def _gemm_want(dtype: str, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    va, vb = _decode(a, dtype), _decode(b, dtype)
    want = va @ vb
    return want, _ulp(want, dtype) + (np.abs(va) @ np.abs(vb)) * (a.shape[1] * _EPS[dtype])


def _fill_want(dtype: str, value: float | int, n: int) -> np.ndarray:
    if dtype in FLOATS:
        return np.full(n, float(value))
    if isinstance(value, float):                       # C: truncate, then convert
        return np.full(n, value != 0 if dtype == "bool" else int(value))
    want = np.full(n, value != 0 if dtype == "bool" else (value + 2**63) % 2**64 - 2**63, dtype=object)
    return want.astype(np.int64)


def check_kernel_table(device: Any, ordered: bool = True) -> KernelReport:
    """Run every entry and claimed dtype of ``device``'s kernel set and compare with NumPy (and,
    with ``ordered``, each entry once in stream order behind copies); the report names the
    first case that disagrees."""
    checker = _Checker(device, ordered)
    try:
        for entry in ("binary", "unary", "reduce", "gemm", "fill"):
            if entry in checker.report.entries:
                getattr(checker, entry)()
        if ordered:
            checker.in_stream_order()
    except _Wrong as exc:
        checker.report.failure = str(exc)
    return checker.report
