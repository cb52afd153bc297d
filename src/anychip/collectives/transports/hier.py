"""The hierarchical transport: shared memory within each host, MPI between hosts.

:class:`HierTransport` (L ranks on each of H hosts): within a host the shared-memory
engine on host memory, between hosts MPI, so the network carries one host's share:

* all_reduce: reduce-scatter within the host (local rank i keeps block i), all_reduce
  of block i across hosts among the ranks of local index i, all-gather within the host;
  messages under 8 KiB skip the scatter (all_reduce within, then across);
* reduce_scatter: the blocks reordered by (local index, host), reduce-scatter within the
  host, reduce-scatter across hosts;
* all_gather: all-gather across hosts (each rank its own block), all-gather within the
  host, reordered by world rank;
* broadcast / reduce: across hosts among the ranks of the root's local index, and
  within each host from / to that rank;
* all_to_all, send / recv, barrier: flat MPI.

Half types accumulate in float32 and small integers take int64 for ``avg``, as in the
engine, so every rank gets identical bits; avg divides the whole sum once at the end.

Data is staged: device -> host on the stream, the op on host memory, host -> device
(cpu buffers are used in place). Ops run on the calling thread; the Work is complete
on return.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...runtime.errors import CollectiveError, InvalidArgumentError
from .._engine import DTYPES as CCL_DTYPES
from .._engine import KINDS, REDOPS, engine, error_of
from .base import Transport
from .mpi import MpiTransport
from .staged import DTYPE_BYTES, Item, StagedTransport, finish_avg, from_acc, to_acc

if TYPE_CHECKING:
    from ...runtime.device import Device

__all__ = ["HierTransport"]

#: messages below this many bytes take the two-step all_reduce
SMALL_BYTES = 8192

#: how a sub-group's ranks get their transport (the chooser's ``over_mpi``): the device, the
#: flat MPI transport of those ranks and the group's label
Regroup = Callable[["Device", MpiTransport, str], Transport]

def _ptr(arr: np.ndarray) -> int:
    return arr.ctypes.data if arr.nbytes else 0


class _ShmHost:
    """The shared-memory engine on host arrays (the ranks of one host)."""

    def __init__(self, comm_id: str, rank: int, size: int, label: str, timeout: float) -> None:
        ffi, lib = engine()
        out = ffi.new("ccl_comm **")
        rc = lib.ccl_comm_init(comm_id.encode(), rank, size, timeout, out)
        if rc:
            raise CollectiveError(f"communicator {label} (within the host): "
                                  + ffi.string(lib.ccl_init_error()).decode("utf-8", "replace"))
        self._comm = out[0]
        lib.ccl_comm_set_label(self._comm, f"group {label} (within host)".encode())
        self.rank, self.size = rank, size

    def run(self, *ops: tuple) -> None:
        """Run a group of (kind, send, recv, count, dtype name or np type, op, root)."""
        ffi, lib = engine()
        cops = ffi.new("ccl_op[]", len(ops))
        for c, (kind, send, recv, count, dtype, op, root) in zip(cops, ops, strict=True):
            c.kind, c.dtype, c.redop = KINDS[kind], CCL_DTYPES[_ccl_name(dtype)], REDOPS[op]
            c.root, c.count = root, count
            c.send.ptr = _ptr(send)          # (declared uintptr_t in the binding)
            c.recv.ptr = _ptr(recv)
        rc = lib.ccl_run(self._comm, cops, len(ops))
        if rc:
            msg = ffi.string(lib.ccl_comm_error(self._comm)).decode("utf-8", "replace")
            raise error_of(rc, msg)

    def abort(self, reason: str) -> None:
        if self._comm is not None:
            engine()[1].ccl_comm_abort(self._comm, reason.encode())

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            engine()[1].ccl_comm_destroy(comm)


def _ccl_name(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name



class HierTransport(StagedTransport):
    """Shared memory within each host, MPI between hosts (see the module docstring)."""

    name = "host/shm+mpi"

    def __init__(self, device: Device, flat: MpiTransport, members: list[list[int]], token: str,
                 label: str, regroup: Regroup) -> None:
        super().__init__(device, label, flat.own_timeout)
        self.flat = flat
        self._regroup = regroup
        self.rank, self.size = flat.rank, flat.size
        self.hosts = members                                   # world ranks of each host, in order
        self.host = next(h for h, m in enumerate(members) if self.rank in m)
        self.local_rank = members[self.host].index(self.rank)
        self.L, self.H = len(members[0]), len(members)
        self.local = _ShmHost(f"mpi{token}.h{self.host}", self.local_rank, self.L, label, self.timeout)
        cross = flat.comm.Split(self.local_rank, self.host)    # same local index, ordered by host
        self.cross = MpiTransport(device, cross, f"{label} (across hosts)", self.own_timeout)
        self.token = token
        #: position (local index * H + host) -> world rank
        self.order = np.array([members[h][i] for i in range(self.L) for h in range(self.H)], dtype=np.intp)

    def exchange(self, obj: Any) -> list[Any]:
        self._live()
        return self.flat.exchange(obj)

    def sub(self, ranks: list[int], tag: str, label: str) -> Transport:
        return self._regroup(self.device, self.flat.sub(ranks, tag, label), label)

    def abort(self, reason: str) -> None:
        super().abort(reason)
        self.local.abort(reason)

    def close(self) -> None:
        self.local.close()
        self.cross.close()
        self.flat.close()

    # -- ops ------------------------------------------------------------------
    def _p2p(self, items: list[Item]) -> None:
        self.flat._p2p(items)

    def _all_to_all(self, it: Item) -> None:
        self.flat._all_to_all(it)

    def _barrier(self, it: Item) -> None:
        self.flat._barrier(it)

    def _all_reduce(self, it: Item) -> None:
        n = it.count
        if n == 0:
            return
        red = "sum" if it.op == "avg" else it.op
        acc, _ = to_acc(it.src, it.dtype, it.op)
        item = acc.itemsize
        q = 0 if n * item < SMALL_BYTES else n // self.L
        tail = n - self.L * q
        blk = np.empty(q + tail, dtype=acc.dtype)
        ops = []
        if q:
            ops.append(("reduce_scatter", acc[:self.L * q], blk[:q], q, acc.dtype, red, -1))
        if tail:
            ops.append(("all_reduce", acc[self.L * q:], blk[q:], tail, acc.dtype, red, -1))
        self.local.run(*ops)
        self.cross.reduce_array(blk, red)
        finish_avg(blk, it.op, self.size)
        es = DTYPE_BYTES[it.dtype]
        out = np.empty(blk.size * es, dtype=np.uint8)
        from_acc(blk, it.dtype, out)
        dst = it.dst
        if q:
            self.local.run(("all_gather", out[:q * es], dst[:self.L * q * es], q * es, "uint8", "sum", -1))
        if tail:
            dst[self.L * q * es:] = out[q * es:]

    def _reduce_scatter(self, it: Item) -> None:
        n = it.count
        if n == 0:
            return
        red = "sum" if it.op == "avg" else it.op
        acc, _ = to_acc(it.src, it.dtype, it.op)
        perm = acc.reshape(self.size, n)[self.order]          # blocks by (local index, host)
        mine = np.empty(self.H * n, dtype=acc.dtype)
        self.local.run(("reduce_scatter", perm, mine, self.H * n, acc.dtype, red, -1))
        out = np.empty(n, dtype=acc.dtype)
        self.cross.reduce_scatter_array(mine, out, red)
        finish_avg(out, it.op, self.size)
        from_acc(out, it.dtype, it.dst)

    def _all_gather(self, it: Item) -> None:
        nb = it.count * DTYPE_BYTES[it.dtype]
        if nb == 0:
            return
        across = np.empty(self.H * nb, dtype=np.uint8)
        self.cross.gather_bytes(it.src, across)
        both = np.empty(self.L * self.H * nb, dtype=np.uint8)
        self.local.run(("all_gather", across, both, self.H * nb, "uint8", "sum", -1))
        it.dst.reshape(self.size, nb)[self.order] = both.reshape(self.size, nb)

    def _broadcast(self, it: Item) -> None:
        nb = it.count * DTYPE_BYTES[it.dtype]
        if nb == 0:
            return
        rhost, rlocal = self._where(it.root)
        if self.rank == it.root and not np.may_share_memory(it.src, it.dst):
            it.dst[:] = it.src
        if self.local_rank == rlocal:
            self.cross.bcast_bytes(it.dst, rhost)
        self.local.run(("broadcast", it.dst, it.dst, nb, "uint8", "sum", rlocal))

    def _reduce(self, it: Item) -> None:
        n = it.count
        if n == 0:
            return
        red = "sum" if it.op == "avg" else it.op
        rhost, rlocal = self._where(it.root)
        acc, _ = to_acc(it.src, it.dtype, it.op)
        part = np.empty(n, dtype=acc.dtype)
        self.local.run(("reduce", acc, part, n, acc.dtype, red, rlocal))
        if self.local_rank == rlocal:
            self.cross.reduce_array(part, red, root=rhost)
        if self.rank == it.root:
            finish_avg(part, it.op, self.size)
            from_acc(part, it.dtype, it.dst)

    def _where(self, rank: int) -> tuple[int, int]:
        for h, m in enumerate(self.hosts):
            if rank in m:
                return h, m.index(rank)
        raise InvalidArgumentError(f"rank {rank} is not in group {self.label}")
