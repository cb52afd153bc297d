"""Staging collectives through host memory: the base of the host-memory transports.

:class:`StagedTransport` copies the specs' device buffers to host arrays (cpu buffers
are used in place), runs the group on the calling thread through ``_p2p`` and
``_<kind>`` methods that a subclass gives (MPI, the hierarchical transport), and copies
the results back; the Work is complete on return. The helpers below turn raw bytes into
the type a reduction accumulates in and back, with the engine's rounding, so every
transport gives identical bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...runtime.env import collective_check, collective_timeout, collective_timeout_from
from ...runtime.errors import CollectiveError
from ..communicator import OpSpec, Work
from .base import Transport, same_span, sizes

if TYPE_CHECKING:
    from ...runtime.device import Device
    from ...runtime.stream import Stream

__all__ = ["StagedTransport", "Item", "NP_TYPES", "DTYPE_BYTES", "acc_type", "to_acc", "from_acc", "finish_avg",
           "host_view"]

#: storage type of each dtype on the host (bfloat16 as its bits)
NP_TYPES: dict[str, Any] = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64,
                            "float16": np.float16, "bfloat16": np.uint16, "float32": np.float32,
                            "float64": np.float64}


DTYPE_BYTES = {name: np.dtype(t).itemsize for name, t in NP_TYPES.items()}


@dataclass
class Item:
    """An OpSpec on host memory: raw byte arrays for send / recv (empty where absent)."""
    kind: str
    src: np.ndarray
    dst: np.ndarray
    count: int
    dtype: str
    op: str
    root: int


class _Memory:
    """Exposes raw host memory to NumPy (the array keeps the Buffer alive)."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, ptr: int, nbytes: int, owner: Any) -> None:
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        self.owner = owner


def host_view(buf: Any, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of a host-addressable Buffer as a writable byte array."""
    ptr = buf.ptr if nbytes else None
    if not ptr:
        return np.empty(0, dtype=np.uint8)
    return np.asarray(_Memory(ptr, nbytes, buf))


def acc_type(dtype: str, op: str) -> Any:
    """The type a reduction accumulates in (the engine's choice)."""
    if dtype in ("float16", "bfloat16"):
        return np.float32
    if op == "avg" and dtype in ("int8", "uint8", "int32"):
        return np.int64
    return NP_TYPES[dtype]


def to_acc(raw: np.ndarray, dtype: str, op: str) -> tuple[np.ndarray, bool]:
    """``raw`` (bytes) as the accumulation type; True when that is a new array."""
    acc = acc_type(dtype, op)
    if dtype == "bfloat16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32), True
    if acc is NP_TYPES[dtype]:
        return raw.view(acc), False
    return raw.view(NP_TYPES[dtype]).astype(acc), True


def from_acc(acc: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """Round / narrow ``acc`` into ``out`` (bytes of dtype), as the engine does."""
    target = out.view(NP_TYPES[dtype])
    if dtype == "bfloat16":
        x = acc.view(np.uint32)
        nan = (x & 0x7FFFFFFF) > 0x7F800000
        rounded = ((x + (0x7FFF + ((x >> 16) & 1))) >> 16).astype(np.uint16)
        np.copyto(target, np.where(nan, ((x >> 16) | 0x40).astype(np.uint16), rounded))
    elif not (acc.dtype == target.dtype and acc.ctypes.data == target.ctypes.data):
        np.copyto(target, acc, casting="unsafe")


def finish_avg(acc: np.ndarray, op: str, divisor: int) -> None:
    """avg: divide the sum in place (integers truncate toward zero, as C does)."""
    if op != "avg":
        return
    if acc.dtype.kind == "f":
        acc /= acc.dtype.type(divisor)
    else:
        acc -= np.fmod(acc, divisor)
        acc //= divisor


class StagedTransport(Transport):
    """Base of the host-memory transports: stages the specs' buffers to host arrays,
    runs the group (point-to-point ops together, then the collectives in order) through
    ``_p2p`` and ``_<kind>`` methods, and copies results back."""

    label = "world"

    def __init__(self, device: Device, label: str, timeout: float | None = None) -> None:
        self.device = device
        self.label = label
        self.timeout = collective_timeout(timeout)      # the group's (env.collective_timeout)
        self.timeout_from = collective_timeout_from(timeout)    # which one, for the timeout's message
        self.own_timeout = timeout                  # the group's own (None: none), which its sub-groups inherit
        self._failed: str | None = None
        self._staging: dict[str, np.ndarray] = {}

    # -- interface --------------------------------------------------------
    def submit(self, specs: list[OpSpec], stream: Stream) -> Work:
        self._live()
        what = specs[0].kind if len(specs) == 1 else f"group of {len(specs)} ops"
        if collective_check():
            self._check_signatures(specs)
        items, back = self._stage(specs, stream)
        try:
            self._execute(items)
        except Exception as e:
            if type(e).__module__.startswith("mpi4py"):
                self._failed = f"{what}: MPI failed: {e}"
                raise CollectiveError(f"{what} on group {self.label}: MPI failed: {e}") from e
            raise
        if back:
            from ...runtime.device import copy
            for buf, host in back:
                copy(buf, host, host.nbytes, stream=stream)
            stream.synchronize()
        w = Work(what)
        w._finish(None)
        return w

    def abort(self, reason: str) -> None:
        self._failed = self._failed or reason

    def _p2p(self, items: list[Item]) -> None:
        """Run the point-to-point ops of a group together (subclasses)."""
        raise NotImplementedError

    def _execute(self, items: list[Item]) -> None:
        p2p = [it for it in items if it.kind in ("send", "recv")]
        if p2p:
            self._p2p(p2p)
        for it in items:
            if it.kind not in ("send", "recv"):
                getattr(self, "_" + it.kind)(it)

    # -- helpers ------------------------------------------------------------
    def _live(self) -> None:
        if self._failed is not None:
            raise CollectiveError(f"communicator {self.label} failed earlier and accepts no more ops: {self._failed}")

    def _check_signatures(self, specs: list[OpSpec]) -> None:
        mine = [sp.signature() for sp in specs if sp.kind not in ("send", "recv")]
        every = self.exchange(mine)
        if any(s != mine for s in every):
            calls = "; ".join(f"rank {r}: " + (", ".join(_describe(s) for s in sigs) or "no collective")
                              for r, sigs in enumerate(every))
            raise CollectiveError(f"check mode: the ranks of group {self.label} called different collectives: {calls}")

    def _host_array(self, key: str, nbytes: int) -> np.ndarray:
        arr = self._staging.get(key)
        if arr is None or arr.nbytes < nbytes:
            arr = np.empty(max(nbytes, 64), dtype=np.uint8)
            self._staging[key] = arr
        return arr[:nbytes]

    def _stage(self, specs: list[OpSpec], stream: Stream) -> tuple[list[Item], list[tuple[Any, np.ndarray]]]:
        """Host arrays for every spec: cpu buffers in place; others copied device -> host
        on the stream (send and recv of the same span share one array)."""
        items: list[Item] = []
        back: list[tuple[Any, np.ndarray]] = []
        staged = self.device.backend != "cpu"
        from ...runtime.device import copy
        for i, sp in enumerate(specs):
            s_n, r_n = sizes(sp, self.size)
            src = dst = _EMPTY
            if sp.send is not None and s_n:
                src = self._host_array(f"s{i}", s_n) if staged else host_view(sp.send, s_n)
                if staged:
                    copy(src, sp.send, s_n, stream=stream)
            if sp.recv is not None and r_n:
                if not staged:
                    dst = host_view(sp.recv, r_n)
                elif src.nbytes and s_n == r_n and same_span(sp.send, sp.recv):
                    dst = src
                else:
                    dst = self._host_array(f"r{i}", r_n)
                if staged and not (sp.kind == "reduce" and sp.root != self.rank):
                    back.append((sp.recv, dst))
            items.append(Item(sp.kind, src, dst, sp.count, sp.dtype, sp.op, sp.root))
        if staged:
            stream.synchronize()
        return items, back


def _describe(sig: tuple) -> str:
    kind, count, dtype, op, root = sig
    return f"{kind}(count={count}, dtype={dtype}, op={op}, root={root})"


_EMPTY = np.empty(0, dtype=np.uint8)
