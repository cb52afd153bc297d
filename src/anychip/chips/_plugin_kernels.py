"""The tensor kernel set of a C plugin: the kernel table of ``anychip/plugin.h`` (minor 1).

A plugin of minor version 1 or later may point ``kernels`` at an ``anychip_kernels`` table:
five entries (binary, unary, reduce, gemm, fill), each with a dtype mask. :func:`table_problem`
says whether anychip uses the table; :class:`PluginKernels` is the set the tensor layer runs
through (``CPlugin.kernels``), an ``anychip.runtime.KernelSet``: it offers exactly the ops and
dtypes the entries and masks allow under the header's rules, and the tensor layer takes the
host fallback for the rest.

The runtime's front end (``anychip.runtime.Kernels``) has checked every argument before a
call reaches the set; the set turns names into the header's codes, raises UnsupportedError
before enqueuing anything for a call the table cannot take (a dtype outside a mask, more than
ANYCHIP_KERNEL_MAX_DIMS dimensions), and turns a failed entry into the plugin's DeviceError
(its code, its text for it and the thread's last-error detail).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from ..runtime.errors import UnsupportedError

__all__ = ["PluginKernels", "table_problem", "KERNEL_DTYPES", "BINARY_OPS", "UNARY_OPS", "REDUCE_OPS",
           "KERNELS_VERSION", "MAX_DIMS", "ENTRIES", "FLOAT_DTYPES", "allowed"]

#: anychip_dtype order (plugin.h); bool is 8
KERNEL_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")
_DT = {name: i for i, name in enumerate(KERNEL_DTYPES)}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
#: the runtime's op names -> anychip_binary_op / anychip_unary_op / anychip_reduce_op
BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "eq": 4, "ne": 5, "lt": 6, "le": 7, "gt": 8, "ge": 9,
              "maximum": 10, "minimum": 11}
UNARY_OPS = {"copy": 0, "relu": 1, "exp": 2, "log": 3, "neg": 4, "sqrt": 5}
REDUCE_OPS = {"sum": 0, "mean": 1, "max": 2}
#: the table's entries and their masks
ENTRIES = ("binary", "unary", "reduce", "gemm", "fill")
KERNELS_VERSION = 1
MAX_DIMS = 16
_KNOWN_BITS = (1 << len(KERNEL_DTYPES)) - 1
_FLOAT_ONLY = frozenset({"div", "exp", "log", "sqrt", "matmul"})     # div, exp, log, sqrt, gemm
_NO_BOOL = frozenset({"add", "sub", "mul", "neg", "relu", "exp", "log"})
_ONE = (1,)         # what a 0-d operand passes for its shape and strides (never read)


def table_problem(plugin: Any) -> str | None:
    """Why the kernel table of C plugin ``plugin`` is not used, or None when it is (also when
    the plugin has none: then every op runs on the host, as the header says)."""
    t, ffi = plugin.t, plugin.ffi
    if plugin.abi[1] < 1 or t.kernels == ffi.NULL:
        return None
    k = t.kernels
    if int(k.version) != KERNELS_VERSION:
        return (f"{plugin.name}: its kernel table has version {int(k.version)}; this anychip knows version "
                f"{KERNELS_VERSION} (ANYCHIP_KERNELS_VERSION of plugin.h): rebuild the plugin against this "
                "anychip's header (anychip plugin cflags) or upgrade anychip")
    for entry in ENTRIES:
        mask = int(getattr(k, f"{entry}_dtypes"))
        if mask & ~_KNOWN_BITS:
            return (f"{plugin.name}: the kernel table's {entry}_dtypes 0x{mask:x} sets bits beyond ANYCHIP_BOOL "
                    f"(1 << 8), which name no dtype: want bits of anychip_dtype only (at most 0x{_KNOWN_BITS:x})")
    return None


def has_table(plugin: Any) -> bool:
    """Whether the plugin's table is there and usable."""
    return plugin.abi[1] >= 1 and plugin.t.kernels != plugin.ffi.NULL and table_problem(plugin) is None


def allowed(entry: str, op: str, dtype: str) -> bool:
    """Whether plugin.h lets ``entry`` take ``op`` on ``dtype`` at all (masks aside)."""
    if dtype not in _DT:
        return False
    if op in _FLOAT_ONLY and dtype not in FLOAT_DTYPES:
        return False
    if entry == "gemm" and dtype not in FLOAT_DTYPES:
        return False
    return not (op in _NO_BOOL and dtype == "bool")


def _entry_of(op: str) -> str | None:
    if op in BINARY_OPS:
        return "binary"
    if op in UNARY_OPS:
        return "unary"
    if op in REDUCE_OPS:
        return "reduce"
    return "gemm" if op == "matmul" else None


class PluginKernels:
    """The kernel table of one C plugin as an ``anychip.runtime.KernelSet`` (see the module
    docstring). ``launches`` counts the calls enqueued per entry (statistics: "binary", ...)."""

    def __init__(self, plugin: Any) -> None:
        self._plugin = plugin
        self._ffi = plugin.ffi
        self._k = plugin.t.kernels
        k, ffi = self._k, self._ffi
        #: entry -> its dtype mask (0 where the entry is NULL)
        self.masks = {e: int(getattr(k, f"{e}_dtypes")) if getattr(k, e) != ffi.NULL else 0 for e in ENTRIES}
        self.launches: Counter[str] = Counter()
        self._supported: dict[tuple[str, str], bool] = {}

    def __repr__(self) -> str:
        return f"<PluginKernels of {self._plugin.name}: " + ", ".join(
            f"{e} 0x{m:x}" for e, m in self.masks.items()) + ">"

    def _takes(self, entry: str, dtype: str) -> bool:
        bit = _DT.get(dtype)
        return bit is not None and bool(self.masks[entry] & (1 << bit))

    # -- what runs here --------------------------------------------------------------
    def supports(self, index: int, op: str, dtype: str) -> bool:
        key = (op, dtype)
        ok = self._supported.get(key)
        if ok is None:
            entry = _entry_of(op)
            ok = self._supported[key] = (entry is not None and self._takes(entry, dtype)
                                         and allowed(entry, op, dtype))
        return ok

    def supports_fill(self, dtype: str) -> bool:
        """Whether ``fill`` runs on ``dtype`` here."""
        return self._takes("fill", dtype)

    # -- kernels -----------------------------------------------------------------------
    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        """``out = a <op> b`` over ``shape`` (inputs strided, of ``dtype``; out contiguous,
        of ``dtype`` or bool for comparisons)."""
        self._check(index, "binary", op, dtype)
        nd = self._ndim(shape)
        self._run(index, "binary", stream, BINARY_OPS[op], _DT[dtype], nd, tuple(shape) or _ONE,
                  self._ptr(out), self._ptr(a), tuple(a[2]) or _ONE, self._ptr(b), tuple(b[2]) or _ONE)

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        """``out = op(x)`` over ``shape``; ``copy`` converts ``dtype`` to ``out_dtype`` (a cast)."""
        self._check(index, "unary", op, dtype, out_dtype)
        nd = self._ndim(shape)
        self._run(index, "unary", stream, UNARY_OPS[op], _DT[out_dtype], _DT[dtype], nd, tuple(shape) or _ONE,
                  self._ptr(out), self._ptr(x), tuple(x[2]) or _ONE)

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        """``out[o, i] = op over r of x[o, r, i]`` for contiguous x of shape (outer, n, inner)."""
        self._check(index, "reduce", op, dtype, out_dtype)
        if op == "max" and n == 0 and outer * inner:
            raise UnsupportedError("the kernel table's reduce takes no max over zero elements")
        self._run(index, "reduce", stream, REDUCE_OPS[op], _DT[out_dtype], _DT[dtype], outer, n, inner,
                  self._ptr(out), self._ptr(x))

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        """``out[m, n] = a[m, k] @ b[k, n]`` (a and b strided; out contiguous)."""
        self._check(index, "gemm", "matmul", dtype)
        (as0, as1), (bs0, bs1) = a[2], b[2]
        self._run(index, "gemm", stream, _DT[dtype], m, k, n, self._ptr(out), self._ptr(a), as0, as1,
                  self._ptr(b), bs0, bs1)

    def fill(self, index: int, out: Any, n: int, dtype: str, value: float | int, stream: Any) -> None:
        """``out[0:n] = value`` converted to ``dtype`` as a C cast would (an int is exact to 64
        bits on integer dtypes). Not part of KernelSet: the framework providers' fill."""
        if not self._takes("fill", dtype):
            raise UnsupportedError(f"{self._plugin.name}'s kernel table does not fill {dtype}")
        is_float = isinstance(value, float)
        self._run(index, "fill", stream, _DT[dtype], n, self._ptr(out), float(value),
                  0 if is_float else int(value), int(is_float))

    # -- internals -----------------------------------------------------------------------
    def _check(self, index: int, entry: str, op: str, dtype: str, out_dtype: str | None = None) -> None:
        """UnsupportedError (nothing enqueued) for what the table does not take."""
        if not self.supports(index, op, dtype):
            raise UnsupportedError(f"{self._plugin.name}'s kernel table does not run {op} on {dtype}")
        if out_dtype is not None and out_dtype != dtype and not self._takes(entry, out_dtype):
            raise UnsupportedError(f"{self._plugin.name}'s kernel table does not {op} into {out_dtype}")

    @staticmethod
    def _ndim(shape: tuple[int, ...]) -> int:
        if len(shape) > MAX_DIMS:
            raise UnsupportedError(f"the kernel table takes at most {MAX_DIMS} dimensions, got {len(shape)}")
        return len(shape)

    def _ptr(self, operand: Any) -> Any:
        """The device address of an operand's (storage, byte offset, ...), checked by the front end."""
        return self._ffi.cast("void *", (operand[0].ptr or 0) + operand[1])

    def _run(self, index: int, entry: str, stream: Any, *args: Any) -> None:
        plugin = self._plugin
        plugin._use(index)
        handle = stream._live() if hasattr(stream, "_live") else stream
        rc = getattr(self._k, entry)(index, handle, *args)
        if rc:
            raise plugin.status.error(rc, f"kernels.{entry}")
        self.launches[entry] += 1
