"""What the conformance suite checks: the collective sweep, the device API cases and
the fault cases. Everything here runs inside one rank (see :mod:`._rank`); the plan
(:func:`plan`) is computed the same way by every rank and by the runner.

Inputs make every expected value exact: small integers (sums and products of them
stay within what int8, uint8, float16 and bfloat16 hold exactly), so a result is
right or wrong, never "close" — except ``avg``, whose division rounds: it is compared
with the dtype's tolerance (integers: within one of the exact mean).
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["OPS", "REDUCING", "DTYPES", "REDOPS", "BUSBW_FACTOR", "DEVICE_CASES", "FAULT_CASES", "CASE_NAMES",
           "Config", "Row", "plan", "parse_size", "Failure", "Skip", "collective_row", "device_cases",
           "fault_cases"]

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
                                 "events_timing", "oom_recovery", "bad_free")
FAULT_CASES: tuple[str, ...] = ("bad_root", "mismatched_count", "timeout", "killed_rank")
#: every named case, in the order they run and are reported
CASE_NAMES: tuple[str, ...] = DEVICE_CASES + OPS + FAULT_CASES


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

    ranks: int = 2
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
    #: every dtype x reduce op x root at these sizes, on top of the sweep (the second one is
    #: uneven on purpose: per-rank blocks and chunks that do not divide evenly)
    coverage: tuple[int, ...] = (4096, 133_000)
    faults: bool = True
    timeout: float = 60.0                      # ANYCHIP_COLLECTIVE_TIMEOUT of the run's communicators
    mode: str = "quick"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Config:
        d = dict(d)
        for k in ("ops", "dtypes", "redops", "coverage"):
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


def _row(op: str, size: int, dtype: str, redop: str, root: int, n: int) -> Row:
    item = _ITEM[dtype]
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(1, size // (item * n)) * n
    else:
        count = max(1, size // item)
    return Row(op, count * item, count, dtype, redop if op in REDUCING else "none",
               root if op in ("broadcast", "reduce") else -1)


def plan(cfg: Config) -> list[Row]:
    """Every row the run measures and checks, in order: per op, the size sweep for the chosen
    dtypes / reduce ops / roots, then (``coverage`` sizes) every dtype x reduce op x root once."""
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
        for size in cfg.coverage:
            todo += [_row(op, size, d, r, t, n) for d in DTYPES
                     for r in (REDOPS if op in REDUCING else ("none",))
                     for t in (range(n) if op in ("broadcast", "reduce") else (-1,))]
        for row in todo:
            if row not in seen:
                seen.add(row)
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# case outcomes
# ---------------------------------------------------------------------------------------------

class Failure(Exception):
    """A case failed: what was expected and what came."""

    def __init__(self, what: str, expected: Any, got: Any) -> None:
        super().__init__(f"{what}: expected {expected}, got {got}")
        self.what, self.expected, self.got = what, str(expected), str(got)


class Skip(Exception):
    """The backend does not support what the case checks (the reason is the message)."""


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
    """Integer values (int64) -> the dtype's bytes; integers wrap as the dtype does."""
    if dtype == "bfloat16":
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)   # exact for these values
    return values.astype(_storage(dtype))


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64 if raw.dtype.kind == "f" else np.int64)


def inputs(count: int, dtype: str, redop: str, n: int, rank: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s values (int32): prod takes factors of +-1 and +-2 (every product is a
    power of two, exact in every float type); the rest lie in a range whose sum over ``n``
    ranks fits int8 (uint8: 0..255), so every dtype holds every partial sum exactly."""
    h = (np.arange(count, dtype=np.int64) * 2654435761 + seed * 1000003 + rank * 7919) % 2147483647
    if redop == "prod":
        table = np.array([1, 2] if dtype == "uint8" else [-2, -1, 1, 2], np.int32)
        return table[h % len(table)]
    if dtype == "uint8":
        return (h % (255 // n + 1)).astype(np.int32)
    v = max(1, 127 // n)
    return (h % (2 * v + 1) - v).astype(np.int32)


_REDUCE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def reduced(xs: list[np.ndarray], redop: str) -> np.ndarray:
    """The reduction over ranks, in int64 (exact for these inputs)."""
    out = xs[0].astype(np.int64)
    for x in xs[1:]:
        _REDUCE[redop](out, x, out=out)
    return out


_AVG_TOL = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-22, "float64": 2.0**-50}


def count_wrong(got: np.ndarray, expect: np.ndarray, dtype: str, redop: str, n: int) -> int:
    """Elements of ``got`` (decoded) that differ from ``expect`` (exact int64 values; for avg
    the exact sums): exact, except avg within the dtype's rounding."""
    if redop == "avg":
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


def _expected(row: Row, xs: list[np.ndarray], rank: int, n: int) -> np.ndarray | None:
    p = row.per_rank(n)
    if row.op in ("all_reduce",):
        return reduced(xs, row.redop)
    if row.op == "reduce":
        return reduced(xs, row.redop) if rank == row.root else None
    if row.op == "broadcast":
        return xs[row.root]
    if row.op == "all_gather":
        return np.concatenate(xs)
    if row.op == "reduce_scatter":
        return reduced([x[rank * p:(rank + 1) * p] for x in xs], row.redop)
    if row.op == "all_to_all":
        return np.concatenate([x[rank * p:(rank + 1) * p] for x in xs])
    return xs[(rank - 1) % n]             # sendrecv: from the previous rank of the ring


def _check_once(comm: Any, row: Row, lay: _Layout, k: int, seed: int) -> int:
    """Fill slot k with fresh inputs, run the op once, count wrong elements on this rank."""
    n, r, dt = comm.size, comm.rank, row.dtype
    send, recv = lay.buffers(k)
    xs = [inputs(lay.send_n, dt, row.redop, n, q, seed) for q in range(n)]
    if lay.recv_base is not None:
        recv.memset(_SENTINEL)
    elif row.op == "all_gather":
        recv.memset(_SENTINEL)
    send.copy_from(encode(xs[r], dt))
    for w in _issue(comm, row, send, recv):
        w.wait()
    expect = _expected(row, xs, r, n)
    raw = recv.to_numpy(_storage(dt), (lay.recv_n,))
    if expect is None:       # reduce on a non-root rank: an out-of-place recv stays untouched
        if lay.recv_base is None:
            return 0
        return int(np.count_nonzero(raw.view(np.uint8) != _SENTINEL))
    return count_wrong(decode(raw, dt), expect, dt, row.redop, n)


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


def collective_row(comm: Any, row: Row, cfg: Config, index: int) -> dict:
    """This rank's figures for one row: per placement ("oop", "ip") seconds and wrong
    elements, or the error that stopped it."""
    out: dict[str, Any] = {}
    placements = ("oop",) if row.op == "sendrecv" else ("oop", "ip")
    slots = max(1, cfg.checks)
    for place in placements:
        lay = _Layout(comm, row, place == "ip", slots)
        try:
            wrong = sum(_check_once(comm, row, lay, k, index * 64 + k * 2 + (place == "ip"))
                        for k in range(cfg.checks))
            secs = _time(comm, row, lay, cfg.iters, cfg.warmup, slots) if cfg.iters else 0.0
            out[place] = {"seconds": secs, "wrong": wrong}
        finally:
            lay.free()
    return out


# ---------------------------------------------------------------------------------------------
# device API cases (each rank on its own device)
# ---------------------------------------------------------------------------------------------

def _same(what: str, got: np.ndarray, expect: np.ndarray) -> None:
    if got.shape != expect.shape or not np.array_equal(got, expect):
        bad = np.flatnonzero(got != expect) if got.shape == expect.shape else np.array([0])
        i = int(bad[0])
        raise Failure(f"{what} ({len(bad)} bytes differ, first at {i})", f"byte {int(expect.flat[i])}",
                      f"byte {int(got.flat[i])}" if got.size > i else f"{got.size} bytes")


def _alloc_free(dev: Any) -> None:
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


def _pattern(n: int, salt: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 31 + salt) % 251).astype(np.uint8)


def _copy_h2d_d2h(dev: Any) -> None:
    n, off = 70_001, 13
    buf = dev.alloc(n + 2 * off).memset(0x5A)
    data = _pattern(n, 7)
    buf.copy_from(data, offset=off)
    _same("h2d at offset 13, read back", buf.to_numpy(np.uint8, (n,), offset=off), data)
    _same("bytes before the offset", buf.to_numpy(np.uint8, (off,)), np.full(off, 0x5A, np.uint8))
    host = np.zeros(n + 5, np.uint8)
    dev.copy(host, buf, n - 100, dst_offset=5, src_offset=off + 100)
    _same("d2h from offset 113 to host offset 5", host[5:n - 95], data[100:])


def _copy_d2d(dev: Any) -> None:
    import anychip
    n = 50_000
    a = dev.alloc(n + 64).copy_from(_pattern(n + 64, 3))
    b = dev.alloc(n + 64).memset(0)
    anychip.copy(b, a, n, dst_offset=7, src_offset=29)
    got = b.to_numpy()
    _same("d2d from offset 29 to offset 7", got[7:7 + n], _pattern(n + 64, 3)[29:29 + n])
    _same("destination bytes outside the copy", np.concatenate([got[:7], got[7 + n:]]), np.zeros(64, np.uint8))
    anychip.copy(a.view(1000, 100), a.view(0, 100))          # within one allocation
    _same("d2d within one allocation", a.to_numpy(np.uint8, (100,), offset=1000), _pattern(n + 64, 3)[:100])


def _memset(dev: Any) -> None:
    buf = dev.alloc(1000).memset(0x11)
    buf.memset(0x7F, 100, offset=33)
    expect = np.full(1000, 0x11, np.uint8)
    expect[33:133] = 0x7F
    _same("memset of 100 bytes at offset 33", buf.to_numpy(), expect)


def _stream_order(dev: Any) -> None:
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


def _events_timing(dev: Any) -> None:
    import anychip
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    n = 1 << 20
    a, b = dev.alloc(n), dev.alloc(n)
    start = anychip.Event(dev).record(s1)
    a.copy_from(np.full(n, 5, np.uint8), stream=s1)
    done = s1.record_event()
    s2.wait_event(done)
    anychip.copy(b, a, stream=s2)
    end = s2.record_event()
    end.synchronize()
    if not (done.query() and end.query()):
        raise Failure("event.query() after the later event synchronized", "True, True",
                      f"{done.query()}, {end.query()}")
    _same("copy on stream 2 after waiting for stream 1's event", b.to_numpy(), np.full(n, 5, np.uint8))
    ms = start.elapsed_ms(done)
    if not 0.0 <= ms < 60_000:
        raise Failure("elapsed_ms(start, done) of a 1 MiB copy", "0 <= ms < 60000", ms)


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
    from ..runtime.errors import InvalidArgumentError
    buf = dev.alloc(100)
    buf.free()
    expect_error("second free() of a buffer", buf.free, InvalidArgumentError, "double free")
    expect_error("copy into a freed buffer", lambda: buf.copy_from(b"abc"), InvalidArgumentError,
                 "use of a freed buffer")
    again = dev.alloc(100).copy_from(_pattern(100, 1))
    _same("a buffer allocated after the bad free", again.to_numpy(), _pattern(100, 1))


_DEVICE_FNS: dict[str, Callable[[Any], None]] = {
    "alloc_free": _alloc_free, "copy_h2d_d2h": _copy_h2d_d2h, "copy_d2d": _copy_d2d, "memset": _memset,
    "stream_order": _stream_order, "events_timing": _events_timing, "oom_recovery": _oom_recovery,
    "bad_free": _bad_free,
}


def device_cases(dev: Any, names: tuple[str, ...] = DEVICE_CASES) -> list[Outcome]:
    return [run_case(name, "device", lambda f=_DEVICE_FNS[name]: f(dev)) for name in names]  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# fault cases run inside the job (the killed rank runs in a job of its own: see runner)
# ---------------------------------------------------------------------------------------------

def _comm_with(env: dict[str, str]) -> Any:
    """A new communicator of every rank, made while ``env`` is in effect."""
    from .. import collectives
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return collectives.init()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
            expect_error(f"all_reduce that rank {n - 1} never calls, ANYCHIP_COLLECTIVE_TIMEOUT=0.5",
                         lambda: c.all_reduce(buf, count=16).wait(timeout=30), CollectiveTimeout,
                         "timed out after 0.5 s", f"waiting for rank {n - 1}")
            secs = time.perf_counter() - t
            if not 0.4 < secs < 10:
                raise Failure("seconds until CollectiveTimeout", "0.4 < s < 10", round(secs, 2))
    finally:
        comm.barrier().wait()
        c.destroy()


_FAULT_FNS: dict[str, Callable[[Any], None]] = {"bad_root": _bad_root, "mismatched_count": _mismatched_count,
                                                "timeout": _timeout}


def fault_cases(comm: Any) -> list[Outcome]:
    if comm.size < 2:
        return [Outcome(name, "fault", "skipped", "needs at least 2 ranks") for name in _FAULT_FNS]
    return [run_case(name, "fault", lambda f=fn: f(comm)) for name, fn in _FAULT_FNS.items()]  # type: ignore[misc]


def busbw(row: Row, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (nccl-tests: size / time, times the op's factor)."""
    if seconds <= 0 or math.isnan(seconds):
        return 0.0, 0.0
    alg = row.nbytes / seconds / 1e9
    return alg, alg * BUSBW_FACTOR(row.op, n)
