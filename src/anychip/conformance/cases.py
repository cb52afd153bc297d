"""What the conformance suite checks: the collective sweep, the device API cases and
the fault cases. Everything here runs inside one rank (see :mod:`._rank`); the plan
(:func:`plan`) is computed the same way by every rank and by the runner.

Inputs give every result one exact expected value in any reduction order (see
:func:`inputs`): integer sums and products overflow and are expected wrapped; float sums and
products need rounding and are expected rounded to nearest even; so a result is right or
wrong, never "close" — except ``avg``, whose division rounds: it is compared with the
dtype's tolerance (integers: within one of the exact mean).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import semantics
from ._busy import Busy as _Busy
from ._outcomes import Failure, Skip, _comm_with, _pattern, _same, names_rank

__all__ = ["OPS", "REDUCING", "DTYPES", "REDOPS", "BUSBW_FACTOR", "DEVICE_CASES", "COMM_CASES", "FAULT_CASES",
           "CASE_NAMES",
           "Config", "Row", "plan", "parse_size", "Failure", "Skip", "collective_row", "device_cases",
           "comm_cases", "fault_cases"]

#: the collectives, in nccl-tests' order and with its names for the tables
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter", "all_to_all",
                        "sendrecv")
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})
DTYPES: tuple[str, ...] = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
REDOPS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")
_ITEM = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_STORAGE = {"bfloat16": np.dtype(np.uint16)}


def BUSBW_FACTOR(op: str, n: int) -> float:   # noqa: N802 - a table of nccl-tests' factors, read as one
    """nccl-tests' bus bandwidth factor: busbw = algbw * factor."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


DEVICE_CASES: tuple[str, ...] = ("alloc_free", "copy_h2d_d2h", "copy_d2d", "memset", "stream_order",
                                 "events_timing", "stream_query", "event_rerecord", "elapsed_time", "wait_binding",
                                 "device_synchronize", "mem_info", "copy_peer", "oom_recovery", "bad_free", "kernels")
#: collective cases beyond the tables (they run when any collective is chosen)
COMM_CASES: tuple[str, ...] = ("stream_order_ccl", "p2p_matching", "split", "group_collectives", "op_streams")
FAULT_CASES: tuple[str, ...] = ("bad_root", "mismatched_count", "timeout", "abort", "killed_rank")
#: every named case, in the order they run and are reported
CASE_NAMES: tuple[str, ...] = DEVICE_CASES + OPS + COMM_CASES + FAULT_CASES


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from nccl-tests' notation: ``8``, ``64K``, ``64M``, ``1G`` (binary units; a
    trailing ``B`` or ``iB`` is accepted)."""
    from ..runtime.errors import InvalidArgumentError
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = s[-1:] if s[-1:] in ("K", "M", "G") else ""
    digits = s[:-1] if unit else s
    if not digits.isdigit():
        raise InvalidArgumentError(f"size {text!r} is not a size; write bytes like 8, 64K, 64M or 1G")
    return int(digits) * _UNITS[unit]


@dataclass
class Config:
    """One conformance run (the CLI's flags; the defaults of ``--quick``)."""

    ranks: int = 3
    min_bytes: int = 8
    max_bytes: int = 4 << 20
    factor: int = 8
    ops: tuple[str, ...] = OPS
    dtypes: tuple[str, ...] = ("float32",)
    redops: tuple[str, ...] = ("sum",)
    roots: tuple[int, ...] | None = (0,)        # None: every rank
    iters: int = 5
    warmup: int = 1
    checks: int = 2                            # repetitions checked, each at other offsets with other data
    #: every dtype x reduce op x root at these sizes, on top of the sweep, with prime counts (per
    #: rank where the op splits): tails of every vector width, blocks that do not divide evenly
    coverage: tuple[int, ...] = (4096, 133_000)
    #: at these sizes, one element more or less than a multiple of every power-of-two chunk up to
    #: the size, for each of boundary_dtypes: the last partial chunk of a message of several
    boundary: tuple[int, ...] = (4 << 20,)
    boundary_dtypes: tuple[str, ...] = ("int8", "bfloat16", "float32", "int64")
    largest_copy: int = (8 << 20) + 11           # the device cases' copies: 1 B up to this
    faults: bool = True
    timeout: float = 60.0                      # ANYCHIP_COLLECTIVE_TIMEOUT of the run's communicators
    deadline: float = 0.0                      # seconds a case may take on a rank (0: 3/4 of timeout, >= 10)
    mode: str = "quick"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Config:
        d = dict(d)
        for k in ("ops", "dtypes", "redops", "coverage", "boundary", "boundary_dtypes"):
            if k in d:
                d[k] = tuple(d[k])
        if d.get("roots") is not None:
            d["roots"] = tuple(d["roots"])
        return cls(**d)

    def sizes(self) -> list[int]:
        out, s = [], self.min_bytes
        while s <= self.max_bytes:
            out.append(s)
            if self.factor <= 1:
                break
            s *= self.factor
        return out


@dataclass(frozen=True)
class Row:
    """One line of a collective's table."""

    op: str
    nbytes: int           # the larger buffer (nccl-tests' "size")
    count: int            # elements of that buffer
    dtype: str
    redop: str            # "none" where the op does not reduce
    root: int             # -1 where the op has no root

    def per_rank(self, n: int) -> int:
        """The count the collectives API takes (elements per rank where the op splits)."""
        return self.count // n if self.op in ("all_gather", "reduce_scatter", "all_to_all") else self.count


def _prime_at_most(k: int) -> int:
    """The largest prime <= k (2 when k < 2)."""
    for c in range(max(2, k), 1, -1):
        if c < 4 or (c % 2 and all(c % d for d in range(3, math.isqrt(c) + 1, 2))):
            return c
    return 2


def _row(op: str, size: int, dtype: str, redop: str, root: int, n: int, shape: str = "exact") -> Row:
    """The row of ``op`` near ``size`` bytes. ``shape`` picks the count (per rank for the ops that
    split by rank): ``exact`` size / item; ``prime`` the largest prime count that fits (odd, and no
    multiple of any vector width); ``plus`` / ``minus`` one element more / less than size / item
    (a multiple of every power-of-two chunk up to size, +-1)."""
    item = _ITEM[dtype]
    split = op in ("all_gather", "reduce_scatter", "all_to_all")
    base = size // (item * n) if split else size // item
    if shape == "prime":
        base = _prime_at_most(base)
    elif shape == "plus":
        base += 1
    elif shape == "minus":
        base -= 1
    base = max(1, base)
    count = base * n if split else base
    return Row(op, count * item, count, dtype, redop if op in REDUCING else "none",
               root if op in ("broadcast", "reduce") else -1)


def plan(cfg: Config) -> list[Row]:
    """Every row the run measures and checks, in order: per op, the size sweep for the chosen
    dtypes / reduce ops / roots; then at the first ``coverage`` size (prime counts) every dtype x
    reduce op (rooted ops: at the last rank) and every root (float32, sum), at the others every
    dtype (sum) and every reduce op (float32); then at the ``boundary`` sizes
    (chunk multiples +-1 element) each of ``boundary_dtypes`` (sum, root 0)."""
    n = cfg.ranks
    roots = cfg.roots if cfg.roots is not None else tuple(range(n))
    rows: list[Row] = []
    for op in cfg.ops:
        seen: set[Row] = set()
        todo: list[Row] = []
        combos = [(d, r, t) for d in cfg.dtypes for r in (cfg.redops if op in REDUCING else ("none",))
                  for t in (roots if op in ("broadcast", "reduce") else (-1,))]
        for size in cfg.sizes():
            todo += [_row(op, size, d, r, t, n) for d, r, t in combos]
        rooted = op in ("broadcast", "reduce")
        redops = REDOPS if op in REDUCING else ("none",)
        for k, size in enumerate(cfg.coverage):
            # the first size: every dtype x reduce op at the last root, and every root once; the
            # others: every dtype (sum), every reduce op (float32)
            root = n - 1 if rooted else -1
            pairs = [(d, r) for d in DTYPES for r in redops] if k == 0 else \
                [(d, redops[0]) for d in DTYPES] + [("float32", r) for r in redops[1:]]
            todo += [_row(op, size, d, r, root, n, "prime") for d, r in pairs]
            roots_once = range(n) if rooted and k == 0 else ()
            todo += [_row(op, size, "float32", redops[0], t, n, "prime") for t in roots_once]
        for size in cfg.boundary:
            todo += [_row(op, size, d, "sum", 0, n, "plus" if i % 2 == 0 else "minus")
                     for i, d in enumerate(cfg.boundary_dtypes)]
        if cfg.boundary:
            # past the first chunks: a non-sum reduction and a root other than 0, and avg of large
            # integers (exact only in the integer type: a float32 or float64 average is wrong)
            size = cfg.boundary[0]
            if op in REDUCING:
                todo += [_row(op, size, "float32", "max", n - 1, n, "minus"),
                         _row(op, size, "int64", "avg", n - 1, n, "plus")]
                if op == "all_reduce":
                    todo.append(_row(op, size, "int32", "avg", -1, n, "minus"))
            elif rooted:
                todo.append(_row(op, size, "float32", "none", n - 1, n, "minus"))
        for row in todo:
            if row not in seen:
                seen.add(row)
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# case outcomes
# ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    group: str                   # "device", "collective" or "fault"
    status: str = "passed"       # passed, failed, skipped
    detail: str = ""
    expected: str = ""
    got: str = ""
    seconds: float = 0.0
    rank: int | None = None      # the first rank where it failed
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def run_case(name: str, group: str, fn: Callable[[], Any]) -> Outcome:
    from ..runtime.errors import UnsupportedError
    out = Outcome(name, group)
    t = time.perf_counter()
    try:
        fn()
    except Skip as exc:
        out.status, out.detail = "skipped", str(exc)
    except UnsupportedError as exc:
        out.status, out.detail = "skipped", f"unsupported: {exc}"
    except Failure as exc:
        out.status, out.detail, out.expected, out.got = "failed", str(exc), exc.expected, exc.got
    except Exception as exc:  # noqa: BLE001 - any error is the case's failure, reported with its type
        out.status, out.detail = "failed", f"{type(exc).__name__}: {exc}"
        out.expected, out.got = "no error", f"{type(exc).__name__}: {exc}"
    out.seconds = time.perf_counter() - t
    return out


def expect_error(what: str, fn: Callable[[], Any], cls: type[BaseException], *needles: str) -> str:
    """Run ``fn``; it must raise ``cls`` whose message holds every needle. The message."""
    want = f"{cls.__name__} mentioning " + " and ".join(repr(n) for n in needles) if needles else cls.__name__
    try:
        fn()
    except cls as exc:
        msg = str(exc)
        missing = [n for n in needles if n not in msg]
        if missing:
            raise Failure(what, want, f"{type(exc).__name__}: {msg}") from None
        return msg
    except Exception as exc:  # noqa: BLE001 - another error is the wrong outcome
        raise Failure(what, want, f"{type(exc).__name__}: {exc}") from None
    raise Failure(what, want, "no error")


# ---------------------------------------------------------------------------------------------
# exact inputs and expected values
# ---------------------------------------------------------------------------------------------

def _storage(dtype: str) -> np.dtype:
    return _STORAGE[dtype] if dtype in _STORAGE else np.dtype(dtype)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """Values -> the dtype's bytes: integers wrap as the dtype does (modular, as NCCL's integer
    reductions); floats round to nearest even (bfloat16 too)."""
    if dtype == "bfloat16":           # (finite values: the sum below cannot overflow)
        u = np.asarray(values).astype(np.float32).view(np.uint32)
        return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    st = _storage(dtype)
    values = np.asarray(values)
    if st.kind in "iu" and values.dtype.kind == "f":
        values = values.astype(np.int64)
    return values.astype(st)


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64 if raw.dtype.kind == "f" else np.int64)


_M64 = np.uint64((1 << 64) - 1)


def _bits(count: int, key: int) -> np.ndarray:
    """``count`` random 64-bit words from ``key`` (PCG64): every rank computes every rank's values
    without communicating."""
    return np.random.PCG64(key & ((1 << 63) - 1)).random_raw(count)


#: inputs repeat with this period (a prime): the expected values are computed over one period
PERIOD = 65_537

_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
_INT_RANGE = {"int8": (-128, 256), "uint8": (0, 256), "int32": (-(1 << 31), 1 << 32),
              "int64": (-(1 << 62), 1 << 63)}


def _floats(h: np.ndarray, dtype: str, lo: int, hi: int) -> np.ndarray:
    """Random values exactly representable in the dtype: every mantissa bit it has, a sign,
    a binary exponent in [lo, hi) (built as float64 bit patterns)."""
    bits = _MANTISSA[dtype] - 1
    u64 = np.uint64
    mant = ((h >> u64(11)) & u64((1 << bits) - 1)) << u64(52 - bits)
    exp = (h >> u64(3)) % u64(hi - lo) + u64(lo + 1023)
    return ((h << u64(63)) | (exp << u64(52)) | mant).view(np.float64)


def inputs(count: int, dtype: str, redop: str, n: int, rank: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s values (float64 or int64) whose reduction over ``n`` ranks has one exact
    expected value in any summation order (:func:`reduced`), and that exercises rounding and
    overflow:

    * integers, sum and prod: anywhere in the dtype's range, so sums and products overflow and
      the expected result is the wrapped one (modular arithmetic: exact in any order);
    * floats, sum and prod: for each element two ranks (chosen per element) hold random values
      with every mantissa bit of the dtype and the others the identity (0 or 1), so the exact
      result needs rounding, and rounds once, to the same value, in any order (a + b, or a * b);
    * min and max: random values of the dtype (exact in any order);
    * avg: small integers whose sum over every rank is exact in every dtype (only the division
      rounds; compared within the dtype's tolerance).

    Past :data:`PERIOD` elements the values repeat (a prime period: a chunk of any power-of-two
    size moved to the wrong place, dropped or repeated still shows)."""
    if count > PERIOD:
        return np.resize(inputs(PERIOD, dtype, redop, n, rank, seed), count)
    key = seed * 1_000_003 + 17
    if redop == "avg":
        if dtype in _AVG_WIDE:          # sums far above 2^24 (and 2^53): exact in the integer type only
            v = _AVG_WIDE[dtype] // n
            w = _bits(count, key * 131 + rank + 1)
            return (w % np.uint64(2 * v + 1)).astype(np.int64) - v
        h = (np.arange(count, dtype=np.int64) * 2654435761 + seed * 1000003 + rank * 7919) % 2147483647
        if dtype == "uint8":
            return h % (255 // n + 1)
        v = max(1, 127 // n)
        return h % (2 * v + 1) - v
    mine = _bits(count, key * 131 + rank + 1)
    if dtype in _INT_RANGE:
        lo, span = _INT_RANGE[dtype]
        if span > 1 << 62:
            return (mine >> np.uint64(1)).astype(np.int64) * np.where((mine & np.uint64(1)) == 1, -1, 1)
        return (mine % np.uint64(span)).astype(np.int64) + lo
    if redop in ("min", "max"):
        vals = _floats(mine, dtype, -6, 7)
        # NaN: at about one element in 17 on one rank, one in 97 on every rank (see count_wrong)
        pick = _bits(count, key + 5)
        one = (pick % np.uint64(17) == 0) & ((pick >> np.uint64(20)) % np.uint64(max(1, n)) == rank)
        every = pick % np.uint64(97) == 1
        return np.where(one | every, np.nan, vals)
    # sum / prod of floats: two active ranks per element
    pick = _bits(count, key)
    a = (pick % np.uint64(n)).astype(np.int64)
    b = (a + 1 + ((pick >> np.uint64(32)) % np.uint64(max(1, n - 1))).astype(np.int64)) % n
    if redop == "prod":
        vals = _floats(mine, dtype, -1, 2)
        identity = 1.0
    else:
        vals = _floats(mine, dtype, -3, 7)
        identity = 0.0
    active = (a == rank) | (b == rank) if n > 1 else np.ones(count, bool)
    return np.where(active, vals, identity)


#: the sums of integer avg rows reach this (int32: 2^31 - 1; int64: 2^62, so the check's products fit)
_AVG_WIDE = {"int32": (1 << 31) - 1, "int64": 1 << 62}

#: min and max ignore a NaN operand here (IEEE maxNum, fmax); where any operand is NaN a NaN
#: result is right too (see count_wrong)
_REDUCE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.fmin, "max": np.fmax}
_PROPAGATE = {"min": np.minimum, "max": np.maximum}


def reduced(xs: list[np.ndarray], redop: str, propagate: bool = False) -> np.ndarray:
    """The exact reduction over ranks: int64 (modular: wraps where the dtype wraps, see
    :func:`encode`) or float64 (exact for these inputs: at most two operands differ from the
    identity, and their sum or product fits float64's 53 bits)."""
    out = np.array(xs[0], copy=True)
    fn = _PROPAGATE[redop] if propagate and redop in _PROPAGATE else _REDUCE[redop]
    with np.errstate(over="ignore", invalid="ignore"):
        for x in xs[1:]:
            fn(out, x, out=out)
    return out


_AVG_TOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-22, "float64": 2.0**-50}


def count_wrong(got: np.ndarray, expect: np.ndarray, dtype: str, redop: str, n: int) -> int:
    """Elements of ``got`` (decoded) that differ from ``expect`` (the exact results; for avg the
    exact sums): exact after rounding to nearest even (floats) or wrapping (integers), except avg,
    within the dtype's rounding."""
    if redop == "avg":
        if dtype in _AVG_WIDE:          # exactly: |got - sum / n| < 1, in integers
            return int(np.count_nonzero(np.abs(got.astype(np.int64) * n - expect.astype(np.int64)) >= n))
        mean = expect / n
        if dtype in _AVG_TOL:
            return int(np.count_nonzero(np.abs(got - mean) > _AVG_TOL[dtype] * np.maximum(1.0, np.abs(mean))))
        return int(np.count_nonzero(np.abs(got - mean) >= 1))
    return int(np.count_nonzero(got != decode(encode(expect, dtype), dtype)))


# ---------------------------------------------------------------------------------------------
# one collective row on one rank
# ---------------------------------------------------------------------------------------------

_SENTINEL = 0xA5


class _Layout:
    """A row's buffers on this rank, placed at offset ``k`` of a few (moved between repetitions)."""

    def __init__(self, comm: Any, row: Row, inplace: bool, slots: int) -> None:
        n, item = comm.size, _ITEM[row.dtype]
        self.comm, self.row, self.inplace, self.item = comm, row, inplace, item
        p = row.per_rank(n)
        self.send_n = p * n if row.op in ("reduce_scatter", "all_to_all") else p
        self.recv_n = p * n if row.op in ("all_gather", "all_to_all") else p
        self.step = 4096 + 3 * item                       # each slot starts 4 KiB + 3 elements further
        slack = self.step * (slots - 1)
        dev = comm.device
        self.send_base = dev.alloc(max(self.send_n, self.recv_n) * item + slack)
        self.recv_base = None if inplace else dev.alloc(self.recv_n * item + slack)

    def buffers(self, k: int) -> tuple[Any, Any]:
        """(send, recv) at slot k, as the op takes them in place or out of place."""
        off, item, r, p = k * self.step, self.item, self.comm.rank, self.row.per_rank(self.comm.size)
        op = self.row.op
        if self.recv_base is not None:
            return (self.send_base.view(off, self.send_n * item), self.recv_base.view(off, self.recv_n * item))
        if op == "all_gather":
            recv = self.send_base.view(off, self.recv_n * item)
            return recv.view(r * p * item, p * item), recv
        if op == "reduce_scatter":
            send = self.send_base.view(off, self.send_n * item)
            return send, send.view(r * p * item, p * item)
        send = self.send_base.view(off, self.send_n * item)
        return send, send

    def free(self) -> None:
        self.send_base.free()
        if self.recv_base is not None:
            self.recv_base.free()


def _issue(comm: Any, row: Row, send: Any, recv: Any) -> list[Any]:
    n, r, p = comm.size, comm.rank, row.per_rank(comm.size)
    kw: dict[str, Any] = {"count": p, "dtype": row.dtype}
    if row.op == "sendrecv":
        with comm.group():
            w1 = comm.send(send, (r + 1) % n, **kw)
            w2 = comm.recv(recv, (r - 1) % n, **kw)
        return [w1, w2]
    if row.op in REDUCING:
        kw["op"] = row.redop
    if row.op in ("broadcast", "reduce"):
        kw["root"] = row.root
    in_place = send is recv
    if row.op in ("all_reduce", "broadcast", "reduce", "all_to_all") and in_place:
        return [getattr(comm, row.op)(send, **kw)]
    return [getattr(comm, row.op)(send, recv, **kw)]


def _tiled(base: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of ``base`` repeated (the inputs' periodic extension)."""
    if stop <= start:
        return base[:0]
    return np.resize(np.roll(base, -(start % len(base))), stop - start)


def _expected(row: Row, bases: list[np.ndarray], rank: int, n: int, propagate: bool = False) -> np.ndarray | None:
    """This rank's exact result (unrounded), from every rank's inputs over one period (min and max:
    NaN operands ignored, or with ``propagate`` propagated)."""
    p = row.per_rank(n)
    if row.op in ("all_reduce", "reduce"):
        if row.op == "reduce" and rank != row.root:
            return None
        return _tiled(reduced(bases, row.redop, propagate), 0, p)
    if row.op == "broadcast":
        return _tiled(bases[row.root], 0, p)
    if row.op == "all_gather":
        return np.concatenate([_tiled(b, 0, p) for b in bases])
    if row.op == "reduce_scatter":
        return _tiled(reduced(bases, row.redop, propagate), rank * p, (rank + 1) * p)
    if row.op == "all_to_all":
        return np.concatenate([_tiled(b, rank * p, (rank + 1) * p) for b in bases])
    return _tiled(bases[(rank - 1) % n], 0, p)            # sendrecv: from the previous rank of the ring


def _wrong(raw: np.ndarray, expect: np.ndarray, dtype: str, redop: str, n: int,
           nan_ok: np.ndarray | None = None) -> int:
    """Wrong elements of ``raw`` (the dtype's bytes) against the exact results ``expect``; where
    ``nan_ok`` (min / max: an operand was NaN), a NaN is right too."""
    if redop == "avg":
        return count_wrong(decode(raw, dtype), expect, dtype, redop, n)
    want = encode(expect, dtype)
    bad = np.flatnonzero(raw != want)
    if bad.size and dtype.startswith(("float", "bfloat")):      # +0 and -0 are the same sum; NaN is NaN
        got, exp = decode(raw[bad], dtype), decode(want[bad], dtype)
        right = (got == exp) | (np.isnan(got) & np.isnan(exp))
        if nan_ok is not None:
            right |= np.isnan(got) & nan_ok[bad]
        bad = bad[~right]
    return int(bad.size)


def _check_once(comm: Any, row: Row, lay: _Layout, k: int, seed: int, busy: _Busy | None = None) -> int:
    """Fill slot k with fresh inputs, run the op once, count wrong elements on this rank.

    Everything is queued on the op's stream without waiting: the receive buffer's fill, the
    input's copy, the op, and the copy of the result back; a library that starts before the
    work queued ahead of it on its stream, or lets later work overtake it, reads or returns
    stale data. With ``busy``, the stream is first given work that takes a while."""
    n, r, dt = comm.size, comm.rank, row.dtype
    send, recv = lay.buffers(k)
    stream = comm.device.current_stream()
    bases = [inputs(min(lay.send_n, PERIOD), dt, row.redop, n, q, seed) for q in range(n)]
    if busy is not None:
        busy.hold(stream, 0.01)
    if lay.recv_base is not None or row.op == "all_gather":
        recv.memset(_SENTINEL, stream=stream)
    mine = encode(_tiled(bases[r], 0, lay.send_n), dt)
    send.copy_from(mine, stream=stream)
    works = _issue(comm, row, send, recv)
    raw = np.empty(lay.recv_n, _storage(dt))
    recv.copy_to(raw, stream=stream)
    stream.synchronize()
    for w in works:
        w.wait()
    expect = _expected(row, bases, r, n)
    if expect is None:       # reduce on a non-root rank: its receive buffer is not written
        if lay.recv_base is None:      # in place: the buffer still holds this rank's input
            return int(np.count_nonzero(raw.view(np.uint8) != mine.view(np.uint8)))
        return int(np.count_nonzero(raw.view(np.uint8) != _SENTINEL))
    nan_ok = None
    if row.redop in ("min", "max") and dt.startswith(("float", "bfloat")):
        propagated = _expected(row, bases, r, n, propagate=True)
        nan_ok = None if propagated is None else np.isnan(propagated)
    return _wrong(raw, expect, dt, row.redop, n, nan_ok)


def _time(comm: Any, row: Row, lay: _Layout, iters: int, warmup: int, slots: int) -> float:
    """Seconds per op, the buffers moving between ``slots`` offsets from one iteration to the next."""
    for i in range(warmup):
        for w in _issue(comm, row, *lay.buffers(i % slots)):
            w.wait()
    comm.barrier().wait()
    works: list[Any] = []
    t = time.perf_counter()
    for i in range(iters):
        works += _issue(comm, row, *lay.buffers(i % slots))
    for w in works:
        w.wait()
    comm.device.current_stream().synchronize()
    return (time.perf_counter() - t) / max(1, iters)


def sweep_rows(cfg: Config) -> set[Row]:
    """The rows of the size sweep (timed over ``iters``; the coverage and boundary rows, there
    for their checks, are timed over one op)."""
    from dataclasses import replace
    return set(plan(replace(cfg, coverage=(), boundary=())))


def collective_row(comm: Any, row: Row, cfg: Config, index: int, timed: bool = True) -> dict:
    """This rank's figures for one row: per placement ("oop", "ip") seconds and wrong
    elements, or the error that stopped it.

    Checked repetitions: one per slot (the buffers moved between them), then the last slot
    once more with the same arguments and new data (a library that skips a call repeated with
    the same pointers, count and type, or caches by receive buffer, returns stale results);
    each repetition changes the expected result and refills the receive buffer."""
    out: dict[str, Any] = {}
    placements = ("oop",) if row.op == "sendrecv" else ("oop", "ip")
    slots = max(1, cfg.checks)
    order = [*range(cfg.checks), slots - 1] if cfg.checks else []
    if not timed and cfg.checks:         # the coverage and boundary rows: one slot, then the repeat
        order = [0, 0]
    for place in placements:
        lay = _Layout(comm, row, place == "ip", slots)
        try:
            wrong = sum(_check_once(comm, row, lay, k, index * 64 + j * 2 + (place == "ip"))
                        for j, k in enumerate(order))
            iters, warmup = (cfg.iters, cfg.warmup) if timed else (min(1, cfg.iters), 0)
            secs = _time(comm, row, lay, iters, warmup, slots) if iters else 0.0
            out[place] = {"seconds": secs, "wrong": wrong}
        finally:
            lay.free()
    return out


# ---------------------------------------------------------------------------------------------
# device API cases (each rank on its own device)
# ---------------------------------------------------------------------------------------------

def _alloc_free(dev: Any, ranks_per_device: int = 1) -> None:
    from ..runtime.errors import OutOfMemoryError
    key = "allocated_bytes.all.current"
    before = dev.memory_stats()[key]
    sizes = (1, 511, 512, 4097, 1 << 20)
    bufs = [dev.alloc(s) for s in sizes]
    got = [b.nbytes for b in bufs]
    if got != list(sizes):
        raise Failure("buffer sizes", list(sizes), got)
    grew = dev.memory_stats()[key] - before
    if grew < sum(sizes):
        raise Failure("allocated_bytes.all.current after 5 allocations", f">= {sum(sizes)} more", f"{grew} more")
    for b in bufs:
        b.free()
    after = dev.memory_stats()[key]
    if after != before:
        raise Failure("allocated_bytes.all.current after freeing them", before, after)
    # free gives the memory back: allocate and free (the cache emptied) more than the device holds
    free0, total = dev.mem_info()
    if not 0 <= free0 <= total or total <= 0:
        raise Failure("mem_info() (free, total)", "0 <= free <= total, total > 0", (free0, total))
    chunk = max(1 << 20, min(1 << 30, total // (4 * max(1, ranks_per_device))))
    rounds = total // chunk + 2
    for i in range(rounds):
        try:
            b = dev.alloc(chunk)
        except OutOfMemoryError as exc:
            raise Failure(f"allocation {i + 1} of {rounds} of {chunk} bytes, each freed (and the cache emptied) "
                          f"before the next, {rounds * chunk} bytes in all of a device of {total}",
                          "every allocation succeeds: free returns the memory",
                          f"OutOfMemoryError: {exc}") from None
        if i == 0 and getattr(dev.plugin, "accelerator", True) and ranks_per_device == 1:
            free1, _ = dev.mem_info()
            if free1 > free0 - chunk + (free0 // 64):
                b.free()
                raise Failure(f"mem_info() free with {chunk} bytes allocated", f"<= {free0 - chunk} (it was {free0})",
                              free1)
        b.free()
        dev.empty_cache()
    # the memory mem_info says is free can be had: three quarters of this rank's share, in pieces
    want = 3 * min(free0, total) // (4 * max(1, ranks_per_device))
    piece = max(1 << 20, min(chunk, want // 8))
    held: list[Any] = []
    try:
        while sum(b.nbytes for b in held) + piece <= want:
            held.append(dev.alloc(piece))
    except OutOfMemoryError as exc:
        got = sum(b.nbytes for b in held)
        raise Failure(f"3/4 of the {free0} bytes mem_info() called free, in pieces of {piece}",
                      f"{want} bytes allocated", f"OutOfMemoryError after {got}: {exc}") from None
    finally:
        for b in held:
            b.free()
        dev.empty_cache()


#: copy sizes, 1 B to 64 MiB, none a multiple of a power of two above 1
_COPY_SIZES = (1, 3, 4101, 65543, (1 << 20) + 9, (8 << 20) + 11, (64 << 20) + 1)
_GUARD = 29


def _copy_h2d_d2h(dev: Any, largest: int) -> None:
    off = 13
    for n in (n for n in _COPY_SIZES if n <= largest):
        buf = dev.alloc(off + n + _GUARD).memset(0x5A)
        data = _pattern(n, n)
        buf.copy_from(data, offset=off)
        back = buf.to_numpy()
        _same(f"h2d of {n} B at offset {off}, read back", back[off:off + n], data)
        _same(f"bytes before and after the {n} B h2d", np.concatenate([back[:off], back[off + n:]]),
              np.full(off + _GUARD, 0x5A, np.uint8))
        host = np.full(n + 2 * _GUARD, 0x33, np.uint8)
        m = max(1, n - 7)
        dev.copy(host, buf, m, dst_offset=_GUARD, src_offset=off + n - m)
        _same(f"d2h of {m} B from the end of the {n} B region to host offset {_GUARD}", host[_GUARD:_GUARD + m],
              data[n - m:])
        _same(f"host bytes around the {m} B d2h", np.concatenate([host[:_GUARD], host[_GUARD + m:]]),
              np.full(n + 2 * _GUARD - m, 0x33, np.uint8))
        buf.free()


def _copy_d2d(dev: Any, largest: int) -> None:
    import anychip
    for n in (n for n in _COPY_SIZES if n <= largest):
        src = _pattern(n + 64, n + 3)
        a = dev.alloc(n + 64).copy_from(src)
        b = dev.alloc(n + 64).memset(0)
        anychip.copy(b, a, n, dst_offset=7, src_offset=29 if n + 29 <= n + 64 else 0)
        got = b.to_numpy()
        _same(f"d2d of {n} B from offset 29 to offset 7", got[7:7 + n], src[29:29 + n])
        _same(f"destination bytes outside the {n} B d2d", np.concatenate([got[:7], got[7 + n:]]),
              np.zeros(64, np.uint8))
        a.free()
        b.free()
    a = dev.alloc(5000).copy_from(_pattern(5000, 3))
    anychip.copy(a.view(1000, 100), a.view(0, 100))          # within one allocation
    _same("d2d within one allocation", a.to_numpy(np.uint8, (100,), offset=1000), _pattern(5000, 3)[:100])


def _memset(dev: Any) -> None:
    buf = dev.alloc(1000).memset(0x11)
    buf.memset(0x7F, 100, offset=33)
    expect = np.full(1000, 0x11, np.uint8)
    expect[33:133] = 0x7F
    _same("memset of 100 bytes at offset 33", buf.to_numpy(), expect)


def _stream_order(dev: Any, busy: _Busy) -> None:
    import anychip
    s = anychip.Stream(dev)
    n = 1 << 18
    data = _pattern(n, 11)
    a, b = dev.alloc(n, stream=s), dev.alloc(n, stream=s)
    host = np.zeros(n, np.uint8)
    a.copy_from(data, stream=s)
    anychip.copy(b, a, stream=s)
    a.memset(0, stream=s)
    b.copy_to(host, stream=s)
    s.synchronize()
    if not s.query():
        raise Failure("stream.query() after synchronize()", True, False)
    _same("h2d, d2d, memset, d2h queued on one stream", host, data)
    _same("the memset queued after the d2d", a.to_numpy(), np.zeros(n, np.uint8))
    # a stream with work that cannot be done yet is not done
    t0, least = busy.hold(s)
    mark = s.record_event()
    q, eq = s.query(), mark.query()
    seconds = time.perf_counter() - t0
    if seconds < least and (q or eq):
        raise Failure(f"stream.query() and event.query() {seconds * 1e3:.1f} ms after queueing memsets that take at "
                      f"least {least * 1e3:.0f} ms", "False, False", f"{q}, {eq}")
    s.synchronize()
    if not (s.query() and mark.query()):
        raise Failure("stream.query() and event.query() after synchronize()", "True, True",
                      f"{s.query()}, {mark.query()}")
    s.destroy()


def _events_timing(dev: Any, busy: _Busy) -> None:
    import anychip
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    n = 1 << 20
    a, b = dev.alloc(n).memset(1), dev.alloc(n).memset(2)
    t_start = time.perf_counter()
    start = anychip.Event(dev).record(s1)
    _, least = busy.hold(s1)                         # stream 1 is busy for at least `least` s
    a.memset(5, stream=s1)
    done = s1.record_event()
    s2.wait_event(done)
    anychip.copy(b, a, stream=s2)
    end = s2.record_event()
    end.synchronize()
    t_end = time.perf_counter()
    got = b.to_numpy()
    if got[0] == 1:
        raise Failure("copy on stream 2 queued after waiting for stream 1's event (stream 1 busy)",
                      "stream 1's memset (5)", "the bytes from before it (1): stream_wait_event was ignored")
    _same("copy on stream 2 after waiting for stream 1's event", got, np.full(n, 5, np.uint8))
    if not (done.query() and end.query()):
        raise Failure("event.query() after the later event synchronized", "True, True",
                      f"{done.query()}, {end.query()}")
    ms = start.elapsed_ms(done)
    host_ms = (t_end - t_start) * 1e3
    lo, hi = least * 1e3 / 4, host_ms * 1.1 + 20.0           # (a margin for the held work's estimate)
    if not lo <= ms <= hi:
        raise Failure(f"elapsed_ms(start, done) around {least * 1e3:.0f}+ ms of queued memsets (the host saw "
                      f"{host_ms:.0f} ms)", f"{lo:.1f} <= ms <= {hi:.1f}", ms)
    for x in (a, b):
        x.free()
    s1.destroy()
    s2.destroy()


def _oom_recovery(dev: Any) -> None:
    from ..runtime.errors import OutOfMemoryError
    free, total = dev.mem_info()
    expect_error(f"alloc({total * 4}) (4 x total memory)", lambda: dev.alloc(total * 4), OutOfMemoryError,
                 "out of memory", dev.name)
    buf = dev.alloc(4096).copy_from(np.ones(4096, np.uint8))
    got = int(buf.to_numpy().sum())
    if got != 4096:
        raise Failure("a 4 KiB buffer after the out-of-memory error, sum of its bytes", 4096, got)


def _bad_free(dev: Any) -> None:
    from ..runtime.errors import AnychipError, InvalidArgumentError
    buf = dev.alloc(100)
    buf.free()
    expect_error("second free() of a buffer", buf.free, InvalidArgumentError, "double free")
    expect_error("copy into a freed buffer", lambda: buf.copy_from(b"abc"), InvalidArgumentError,
                 "use of a freed buffer")
    # the backend's own free, under the caching allocator: a handle freed once is no live allocation
    plugin, index = dev.plugin, dev.index
    handle = plugin._malloc(index, 4096)
    plugin._free(index, handle)
    expect_error(f"{plugin.name}'s free of an allocation it freed already", lambda: plugin._free(index, handle),
                 AnychipError)
    again = dev.alloc(100).copy_from(_pattern(100, 1))
    _same("a buffer allocated after the bad free", again.to_numpy(), _pattern(100, 1))


def _kernels(dev: Any) -> None:
    """The backend's kernel set, every entry and claimed dtype against NumPy (kernel_table.py)."""
    from ..runtime import kernels_of
    from .kernel_table import check_kernel_table
    if kernels_of(dev) is None:
        raise Skip(f"{dev.backend} has no kernel set: every tensor op runs on the host")
    report = check_kernel_table(dev)
    if report.failure:
        head, found, tail = report.failure.rpartition("; first at ")
        if found:
            at, _, values = tail.partition(": expected ")
            expected, _, got = values.partition(", got ")
            raise Failure(f"{head}; first at {at}", expected, got)
        what, _, error = report.failure.partition(": the entry failed: ")
        raise Failure(what, "no error", error or report.failure)


def device_cases(dev: Any, names: tuple[str, ...] = DEVICE_CASES, ranks_per_device: int = 1,
                 largest_copy: int = 64 << 20) -> list[Outcome]:
    """The device API cases on ``dev`` (``ranks_per_device``: how many ranks share it, so that
    memory the case allocates leaves room for the others; copies up to ``largest_copy`` bytes)."""

    def with_busy(fn: Callable[[Any, _Busy], None]) -> Callable[[], None]:
        return lambda: fn(dev, _Busy.of(dev, ranks_per_device))

    fns: dict[str, Callable[[], None]] = {
        "alloc_free": lambda: _alloc_free(dev, ranks_per_device),
        "copy_h2d_d2h": lambda: _copy_h2d_d2h(dev, largest_copy),
        "copy_d2d": lambda: _copy_d2d(dev, largest_copy),
        "memset": lambda: _memset(dev),
        "stream_order": with_busy(_stream_order),
        "events_timing": with_busy(_events_timing),
        "stream_query": with_busy(semantics.stream_query),
        "event_rerecord": with_busy(semantics.event_rerecord),
        "elapsed_time": lambda: semantics.elapsed_time(dev),
        "wait_binding": with_busy(semantics.wait_binding),
        "device_synchronize": with_busy(semantics.device_synchronize),
        "mem_info": lambda: semantics.mem_info(dev, ranks_per_device),
        "copy_peer": with_busy(semantics.copy_peer),
        "oom_recovery": lambda: _oom_recovery(dev),
        "bad_free": lambda: _bad_free(dev),
        "kernels": lambda: _kernels(dev),
    }
    return [run_case(name, "device", fns[name]) for name in names]


# ---------------------------------------------------------------------------------------------
# collective cases beyond the tables
# ---------------------------------------------------------------------------------------------

def _stream_order_ccl(comm: Any, cfg: Config, ranks_per_device: int) -> None:
    """Each collective queued behind work that takes a while, then its input's copy, then it, then
    the copy of its result: it must see the input and its result must be complete before the copy."""
    busy = _Busy.of(comm.device, ranks_per_device)
    bad = []
    for i, op in enumerate(o for o in OPS if o in cfg.ops):
        row = _row(op, 133_000, "float32", "sum", comm.size - 1, comm.size, "prime")
        lay = _Layout(comm, row, False, 1)
        try:
            w = _check_once(comm, row, lay, 0, 50_000 + i, busy)
        finally:
            lay.free()
        if w:
            bad.append((op, w))
    if bad:
        raise Failure(f"{', '.join(op for op, _ in bad)} queued on a stream behind memsets, then its input's copy "
                      "(not waited for), then the copy of its result", "#wrong 0",
                      ", ".join(f"{op} #wrong {w}" for op, w in bad))


def _payload(count: int, src: int, dst: int, m: int) -> np.ndarray:
    return (np.arange(count, dtype=np.int32) * 7 + src * 1_000_003 + dst * 10_007 + m * 101).astype(np.int32)


def _p2p_matching(comm: Any) -> None:
    """In one group every rank sends two distinct messages to every other rank and receives them
    in another order: each receive gets its own peer's message, messages to one peer arrive in
    the order sent."""
    n, r = comm.size, comm.rank
    if n < 2:
        raise Skip("needs at least 2 ranks")
    count, per = 4099, 2
    dev = comm.device
    peers = [(r + k) % n for k in range(1, n)]
    sends, recvs = [], []
    for dst in peers:
        for m in range(per):
            sends.append((dev.alloc(count * 4).copy_from(_payload(count, r, dst, m)), dst))
    for src in reversed(peers):
        for m in range(per):
            recvs.append((dev.alloc(count * 4).memset(_SENTINEL), src, m))
    works = []
    with comm.group():
        for buf, dst in sends:
            works.append(comm.send(buf, dst, count=count, dtype="int32"))
        for buf, src, _ in recvs:
            works.append(comm.recv(buf, src, count=count, dtype="int32"))
    for w in works:
        w.wait()
    for buf, src, m in recvs:
        got = buf.to_numpy(np.int32)
        want = _payload(count, src, r, m)
        if not np.array_equal(got, want):
            came = next((f"rank {q}'s message {k}" for q in range(n) for k in range(per)
                         if np.array_equal(got, _payload(count, q, r, k))), "other data")
            raise Failure(f"recv from rank {src} (message {m}) in a group receiving from {n - 1} peers",
                          f"rank {src}'s message {m}", came)
    for buf, *_ in sends + recvs:
        buf.free()


def comm_cases(comm: Any, cfg: Config, ranks_per_device: int = 1,
               names: tuple[str, ...] = COMM_CASES) -> list[Outcome]:
    fns: dict[str, Callable[[], None]] = {"stream_order_ccl": lambda: _stream_order_ccl(comm, cfg, ranks_per_device),
                                          "p2p_matching": lambda: _p2p_matching(comm),
                                          "split": lambda: semantics.split(comm),
                                          "group_collectives": lambda: semantics.group_collectives(comm),
                                          "op_streams": lambda: semantics.op_streams(
                                              comm, _Busy.of(comm.device, ranks_per_device))}
    return [run_case(name, "collective", fns[name]) for name in names]


# ---------------------------------------------------------------------------------------------
# fault cases run inside the job (the killed rank runs in a job of its own: see runner)
# ---------------------------------------------------------------------------------------------

def _bad_root(comm: Any) -> None:
    from ..runtime.errors import InvalidArgumentError
    n = comm.size
    buf = comm.device.alloc(64)
    expect_error(f"broadcast(root={n}) in a group of {n}", lambda: comm.broadcast(buf, count=4, root=n),
                 InvalidArgumentError, f"root={n} is out of range", f"ranks 0..{n - 1}")
    expect_error("reduce(root=-1)", lambda: comm.reduce(buf, count=4, root=-1), InvalidArgumentError,
                 "root=-1 is out of range")
    comm.barrier().wait()             # the communicator still works: nothing was enqueued


def _mismatched_count(comm: Any) -> None:
    from ..runtime.errors import CollectiveError
    n, r = comm.size, comm.rank
    c = _comm_with({"ANYCHIP_COLLECTIVE_CHECK": "1", "ANYCHIP_COLLECTIVE_TIMEOUT": "20"})
    try:
        buf = c.device.alloc(4 * (10 + n))
        expect_error(f"all_reduce with count {10 + r} on rank {r} under ANYCHIP_COLLECTIVE_CHECK=1",
                     lambda: c.all_reduce(buf, count=10 + r).wait(timeout=30), CollectiveError,
                     "mismatched collective", "rank 0 called all_reduce(count=10, float32, sum)",
                     "rank 1 called all_reduce(count=11, float32, sum)")
    finally:
        c.destroy()
    comm.barrier().wait()


def _timeout(comm: Any) -> None:
    from ..runtime.errors import CollectiveTimeout
    n, r = comm.size, comm.rank
    c = _comm_with({"ANYCHIP_COLLECTIVE_TIMEOUT": "0.5"})
    try:
        if r != n - 1:                # the last rank never joins
            buf = c.device.alloc(64)
            t = time.perf_counter()
            msg = expect_error(f"all_reduce that rank {n - 1} never calls, ANYCHIP_COLLECTIVE_TIMEOUT=0.5",
                               lambda: c.all_reduce(buf, count=16).wait(timeout=30), CollectiveTimeout)
            if not names_rank(msg, n - 1):
                raise Failure(f"the CollectiveTimeout of an all_reduce that rank {n - 1} never calls",
                              f"a message naming rank {n - 1}", msg)
            secs = time.perf_counter() - t
            if not 0.4 < secs < 10:
                raise Failure("seconds until CollectiveTimeout", "0.4 < s < 10", round(secs, 2))
    finally:
        comm.barrier().wait()
        c.destroy()


def _abort(comm: Any) -> None:
    from .semantics import abort
    abort(comm)


_FAULT_FNS: dict[str, Callable[[Any], None]] = {"bad_root": _bad_root, "mismatched_count": _mismatched_count,
                                                "timeout": _timeout, "abort": _abort}


def fault_cases(comm: Any, names: tuple[str, ...] = tuple(_FAULT_FNS)) -> list[Outcome]:
    if comm.size < 2:
        return [Outcome(name, "fault", "skipped", "needs at least 2 ranks") for name in names]
    return [run_case(name, "fault", lambda f=_FAULT_FNS[name]: f(comm)) for name in names]  # type: ignore[misc]


def busbw(row: Row, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (nccl-tests: size / time, times the op's factor)."""
    if seconds <= 0 or math.isnan(seconds):
        return 0.0, 0.0
    alg = row.nbytes / seconds / 1e9
    return alg, alg * BUSBW_FACTOR(row.op, n)
