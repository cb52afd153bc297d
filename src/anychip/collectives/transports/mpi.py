"""MPI transport: collectives over mpi4py, on host memory.

Used between hosts (see :mod:`anychip.collectives.transports.choose`) and, with
``ANYCHIP_HOST_TRANSPORT=mpi``, for every rank. Install with ``pip install anychip[mpi]``
(mpi4py and the ``mpich`` wheel, whose ``mpiexec`` launches the job).

Each communicator works on its own duplicate of the MPI communicator, so anychip's
traffic never matches the application's own MPI messages. Ops are MPI's nonblocking
collectives, polled until done or until ``ANYCHIP_COLLECTIVE_TIMEOUT``: then every
waiting rank raises :class:`CollectiveTimeout`, naming the ranks that have not called the
op (they did not answer its question, see ``_who_is_missing``), and the communicator accepts no more ops
(MPI cannot cancel a started collective). A rank that dies is the launcher's business:
mpiexec ends the job's other ranks. A rank that hangs is not: MPI_Finalize would wait for
the abandoned collective forever, so a process that exits with one still incomplete
calls ``MPI_Abort`` instead (after saying why on stderr), which makes mpiexec end the job.

MPI has no float16 / bfloat16 arithmetic and no average: half types are widened to
float32, summed by MPI and rounded once (as the engine does, so every rank gets the
same bits); avg is a sum divided once at the end (int8 / uint8 / int32 summed in
int64, so the average of the true sum is taken, truncated toward zero).

Small messages (up to :data:`PERSISTENT_MAX` bytes, cpu buffers, an op MPI does itself)
go through MPI 4's persistent collectives (``MPI_Allreduce_init`` ... ``MPI_Start``): one
request per op signature (kind, count, dtype, op, root), made the first time the signature
comes, with buffers of its own that the op's data is copied into and out of. A nonblocking
collective (``MPI_Iallreduce``) costs MPICH a schedule built at every call, several times
its blocking call's time at 8 bytes; a started persistent request costs about the blocking
call. The requests are keyed by signature, not by buffers, because MPI matches persistent
collectives by the order of their init calls: every rank calls the same ops with the same
signatures in the same order, so every rank makes each request at the same op.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...runtime.env import collective_check
from ...runtime.errors import CollectiveTimeout, InvalidArgumentError, UnsupportedError
from ..communicator import Work
from .base import sizes
from .staged import DTYPE_BYTES, NP_TYPES, Item, StagedTransport, finish_avg, from_acc, to_acc

if TYPE_CHECKING:
    from ...runtime.device import Device
    from ...runtime.stream import Stream
    from .._bootstrap import World
    from ..communicator import OpSpec

__all__ = ["MpiTransport", "load_mpi"]

_P2P_TAG = 0x2A17
#: "I gave up waiting in op #k": sent by a rank that timed out to the op's other ranks
_GAVE_UP_TAG = 0x2A18
#: the answer of a rank that is waiting on the same communicator: "I am in op #j"
_HERE_TAG = 0x2A19
#: how long a rank that timed out waits for the answers (at most the collective timeout)
_ANSWER_WAIT_S = 1.0
#: polls, once a wait yields the CPU, between looks for a peer that gave up
_POLLS_PER_LOOK = 64
#: polls before a wait yields the CPU between polls (MPICH's MPIR_CVAR_POLLS_BEFORE_YIELD default)
_POLLS_BEFORE_YIELD = 1000
#: largest message (bytes a rank sends or receives) that takes a persistent request (see the docstring)
PERSISTENT_MAX = 64 << 10
#: persistent requests a communicator keeps; past it they are all freed (every rank at the same op)
_PERSISTENT_KEEP = 64
#: the kinds with a persistent form: MPI's init call on mpi4py's communicator
_INIT_CALLS = {"all_reduce": "Allreduce_init", "broadcast": "Bcast_init", "reduce": "Reduce_init",
               "all_gather": "Allgather_init", "reduce_scatter": "Reduce_scatter_block_init",
               "all_to_all": "Alltoall_init"}
_memmove = ctypes.memmove


#: (requests, what) of the collectives abandoned by a timeout, while they are incomplete
_abandoned: list[tuple[list[Any], str]] = []
_abandoned_lock = threading.Lock()


def _abandon(MPI: Any, reqs: list[Any], what: str) -> None:
    with _abandoned_lock:
        if not _abandoned:
            atexit.register(_end_abandoned, MPI)      # runs before mpi4py finalizes MPI
        _abandoned.append((reqs, what))


def _end_abandoned(MPI: Any) -> None:
    """At exit: an abandoned collective still incomplete would block MPI_Finalize for
    ever (a rank that hangs never joins it), and mpiexec would wait for this process:
    abort the job instead. Ones that completed meanwhile (the peer came late) are fine."""
    if MPI.Is_finalized():
        return
    deadline = time.monotonic() + 0.2
    while True:
        stuck = [what for reqs, what in _abandoned if not _tester(MPI, reqs)()]
        if not stuck or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if stuck:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"anychip: rank {rank} is exiting with {len(stuck)} collective(s) that timed out still "
                         f"incomplete ({stuck[0]}): MPI cannot finalize with them pending, so it aborts the job "
                         "(MPI_Abort)\n")
        sys.stderr.flush()
        # mpiexec's proxy forwards a rank's output from a pipe it polls, and MPI_Abort tears
        # the job down at once: give it a moment to read the line, or the reason is lost
        time.sleep(0.25)
        _unlink_mpi_segments()
        MPI.COMM_WORLD.Abort(1)


def _tester(MPI: Any, reqs: list[Any]) -> Any:
    """A function of nothing that tests ``reqs`` (True: all complete). One request is tested
    by its own ``Test``: mpi4py's ``Testall`` fails on a started persistent request."""
    if len(reqs) == 1:
        return reqs[0].Test
    Testall = MPI.Request.Testall
    return lambda: Testall(reqs)


#: The MPI libraries' own shared-memory segments: MPICH's and Open MPI's.
MPI_SEGMENTS = ("mpich_shm_", "sm_segment.")


def _unlink_mpi_segments() -> None:
    """Remove the names of the MPI library's shared-memory segments this rank maps, which an
    aborted job leaves in /dev/shm (MPI removes them only when it finalizes). Every rank of the
    host mapped them at MPI_Init, so the memory stays theirs until they exit."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return
    names = {line.split("/dev/shm/", 1)[1].split()[0] for line in maps.splitlines() if "/dev/shm/" in line}
    for name in sorted(n for n in names if n.startswith(MPI_SEGMENTS)):
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass


def load_mpi() -> Any:
    """mpi4py's MPI module (importing it initialises MPI), or a clear error."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise UnsupportedError("the MPI transport needs mpi4py and an MPI library: pip install 'anychip[mpi]' "
                               f"(mpi4py and the mpich wheel) ({e})") from None
    return MPI


_TYPES: dict[np.dtype, Any] = {}
_OPS: dict[str, Any] = {}


def _mpi_type(MPI: Any, dtype: np.dtype) -> Any:
    if not _TYPES:
        _TYPES.update({np.dtype(np.int8): MPI.INT8_T, np.dtype(np.uint8): MPI.UINT8_T,
                       np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
                       np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE})
    return _TYPES[dtype]


#: the element types MPI reduces itself (the others are widened: see the module docstring)
_MPI_NUMERIC = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64, np.float32, np.float64))


def _mpi_op(MPI: Any, op: str) -> Any:
    if not _OPS:
        _OPS.update(sum=MPI.SUM, avg=MPI.SUM, prod=MPI.PROD, min=MPI.MIN, max=MPI.MAX)
    return _OPS[op]


class MpiTransport(StagedTransport):
    """Every op over one MPI communicator (mpi4py), on host memory."""

    name = "mpi"

    @classmethod
    def world(cls, device: Device, world: World, label: str = "world", timeout: float | None = None) -> MpiTransport:
        """The transport of every rank of the job (collective over MPI_COMM_WORLD)."""
        MPI = load_mpi()
        size = MPI.COMM_WORLD.Get_size()
        if size != world.size:
            raise InvalidArgumentError(
                f"MPI sees {size} rank(s) but the launcher ({world.launcher}) says {world.size}: the MPI transport "
                "needs the job started by mpiexec (or set ANYCHIP_HOST_TRANSPORT=shm on one host)")
        return cls(device, MPI.COMM_WORLD.Dup(), label, timeout)

    def __init__(self, device: Device, comm: Any, label: str, timeout: float | None = None) -> None:
        super().__init__(device, label, timeout)
        self.MPI = load_mpi()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._opno = 0                              # ops this rank has waited for
        self._where: dict[int, tuple[int, str]] = {}  # rank -> (op #, op) it said it was in
        self._sends: list[Any] = []                 # those messages, kept until MPI_Finalize
        # signature -> (persistent request, its send array's address, its recv array's address,
        # the arrays); see the module docstring
        self._persistent: dict[tuple, tuple[Any, int, int, Any]] = {}
        self._has_persistent = hasattr(comm, "Allreduce_init")

    # -- interface ------------------------------------------------------------
    def exchange(self, obj: Any) -> list[Any]:
        self._live()
        return self.comm.allgather(obj)

    def sub(self, ranks: list[int], tag: str, label: str) -> MpiTransport:
        group = self.comm.Get_group().Incl(ranks)
        comm = self.comm.Create_group(group, zlib.crc32(tag.encode()) & 0x7FFF)
        group.Free()
        return MpiTransport(self.device, comm, label, self.own_timeout)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        MPI = self.MPI
        if not MPI.Is_finalized():
            self._free_persistent()
        if comm is not None and comm != MPI.COMM_WORLD and not MPI.Is_finalized():
            comm.Free()

    # -- small messages: persistent requests ---------------------------------------
    def prepare(self, specs: list[OpSpec]) -> tuple[list[OpSpec], Any]:
        """(specs, None), or for one small op on cpu buffers that MPI runs itself: (specs, its
        signature, the buffers' addresses and the bytes to copy in and out)."""
        if len(specs) != 1 or not self._has_persistent or self.device.backend != "cpu" or collective_check():
            return specs, None
        sp = specs[0]
        if sp.kind not in _INIT_CALLS or sp.count == 0:
            return specs, None
        if sp.kind in ("all_reduce", "reduce", "reduce_scatter") and (
                sp.op == "avg" or np.dtype(NP_TYPES[sp.dtype]) not in _MPI_NUMERIC or sp.dtype == "bfloat16"):
            return specs, None
        s_n, r_n = sizes(sp, self.size)
        if max(s_n, r_n) > PERSISTENT_MAX:
            return specs, None
        if sp.kind == "reduce" and sp.root != self.rank:
            r_n = 0                                 # recv is written on the root only
        if sp.kind == "broadcast":
            s_n = s_n if sp.root == self.rank else 0
        saddr = sp.send.ptr if s_n and sp.send is not None else 0
        raddr = sp.recv.ptr if r_n and sp.recv is not None else 0
        return specs, (sp.signature(), saddr or 0, raddr or 0, s_n, r_n, sp.kind)

    def submit_prepared(self, prepared: tuple[list[OpSpec], Any], stream: Stream, reuse: bool = False,
                        work: Work | None = None) -> Work:
        specs, native = prepared
        if native is None:
            return self.submit(specs, stream)
        if self._failed is not None or self.comm is None:
            self._live()
        key, saddr, raddr, s_n, r_n, what = native
        entry = self._persistent.get(key)
        if entry is None:
            entry = self._new_persistent(specs[0])
        req, sbuf, rbuf, _ = entry
        if s_n:
            _memmove(sbuf, saddr, s_n)
        req.Start()
        if req.Test():
            self._opno += 1
        else:
            self._wait([req], what)
        if r_n:
            _memmove(raddr, rbuf, r_n)
        if reuse and work is not None:
            return work
        w = Work(what)
        w._done = True
        return w

    def _new_persistent(self, sp: OpSpec) -> tuple[Any, int, int, Any]:
        """The persistent request of ``sp``'s signature, on arrays of its own (each rank makes
        it at the same op: the first of that signature since the last clear)."""
        if len(self._persistent) >= _PERSISTENT_KEEP:
            self._free_persistent()
        MPI = self.MPI
        s_n, r_n = sizes(sp, self.size)
        if sp.kind == "broadcast":
            s_n = 0                                 # in place on its own array
        sarr = np.zeros(max(s_n, 1), np.uint8)
        rarr = np.zeros(max(r_n, 1), np.uint8)
        init = getattr(self.comm, _INIT_CALLS[sp.kind])
        if sp.kind in ("all_reduce", "reduce", "reduce_scatter"):
            t = _mpi_type(MPI, np.dtype(NP_TYPES[sp.dtype]))
            op = _mpi_op(MPI, sp.op)
            if sp.kind == "reduce":
                req = init([sarr, t], [rarr, t], op, sp.root)
            else:
                req = init([sarr, t], [rarr, t], op)
        elif sp.kind == "broadcast":
            req = init([rarr, MPI.BYTE], sp.root)
        else:
            req = init([sarr, MPI.BYTE], [rarr, MPI.BYTE])
        sbuf = sarr.ctypes.data if sp.kind != "broadcast" else rarr.ctypes.data
        entry = (req, sbuf, rarr.ctypes.data, (sarr, rarr))
        self._persistent[sp.signature()] = entry
        return entry

    def _free_persistent(self) -> None:
        entries, self._persistent = self._persistent, {}
        for req, *_ in entries.values():
            try:
                req.Free()
            except Exception:  # noqa: BLE001 - an abandoned (still active) request stays MPI's
                pass

    def _live(self) -> None:
        super()._live()
        if self.comm is None:
            raise InvalidArgumentError(f"communicator {self.label} was destroyed")

    # -- waiting ----------------------------------------------------------------
    def _wait(self, reqs: list[Any], what: str, peers: list[int] | None = None) -> None:
        """Poll until done or until the communicator's timeout. MPI progresses only while
        polled: this spins, then yields the CPU between polls, as MPICH's blocking calls do.
        ``peers``: the ranks the op waits for (default: all)."""
        self._opno += 1
        done = _tester(self.MPI, reqs)
        if done():
            return
        deadline = time.monotonic() + self.timeout
        polls = 0
        while not done():
            polls += 1
            if polls > _POLLS_BEFORE_YIELD:
                os.sched_yield()
                if polls % _POLLS_PER_LOOK == 0:
                    self._answer(what)
            if time.monotonic() > deadline:
                self._failed = f"{what} timed out"
                _abandon(self.MPI, reqs, f"{what} on group {self.label}")
                raise CollectiveTimeout(
                    f"{what} (op #{self._opno}) on group {self.label} (MPI) did not complete within "
                    f"{self.timeout:g} s on rank {self.rank} ({self.timeout_from}): "
                    + self._who_is_missing(what, peers))

    # -- naming the missing ranks of a timed-out op ------------------------------------
    # MPI does not say which rank a collective waits for. A rank that times out tells the
    # op's other ranks (_GAVE_UP_TAG); every rank still waiting on this communicator answers
    # where it is (_HERE_TAG), as do the ranks that timed out before (their own message);
    # the ranks that say nothing within _ANSWER_WAIT_S are not in any op of this communicator.
    def _send(self, rank: int, tag: int, where: tuple[int, str]) -> None:
        self._sends.append(self.comm.isend(where, rank, tag))

    def _receive(self, tag: int) -> int | None:
        """Take one waiting message with ``tag`` into _where; its sender, or None."""
        status = self.MPI.Status()
        if not self.comm.Iprobe(self.MPI.ANY_SOURCE, tag, status):
            return None
        rank = status.Get_source()
        self._where[rank] = self.comm.recv(source=rank, tag=tag)
        return rank

    def _answer(self, what: str) -> None:
        """Tell each rank that gave up since the last look where this one is."""
        while (rank := self._receive(_GAVE_UP_TAG)) is not None:
            self._send(rank, _HERE_TAG, (self._opno, what))

    def _who_is_missing(self, what: str, peers: list[int] | None) -> str:
        here = (self._opno, what)
        others = [r for r in (range(self.size) if peers is None else sorted(set(peers))) if r != self.rank]
        for r in others:
            self._send(r, _GAVE_UP_TAG, here)
        wait_s = min(_ANSWER_WAIT_S, self.timeout)
        end = time.monotonic() + wait_s
        while any(r not in self._where for r in others) and time.monotonic() < end:
            if self._receive(_HERE_TAG) is None and self._receive(_GAVE_UP_TAG) is None:
                time.sleep(0.001)
        missing = [r for r in others if r not in self._where]
        parts = []
        if missing:
            names = ", ".join(map(str, missing))
            parts.append(f"rank {names} has not called it" if len(missing) == 1 else
                         f"ranks {names} have not called it")
            parts[-1] += f" (no answer in {wait_s:g} s: busy elsewhere, or stuck outside MPI)"
        for r in others:
            # (each rank numbers its send/recv groups by its own count: only the kind is compared)
            if r in self._where and self._where[r] != here and (peers is None or self._where[r][1] != what):
                opno, op = self._where[r]
                parts.append(f"rank {r} is in op #{opno} ({op})")
        return "; ".join(parts) if parts else "every rank is in it: MPI did not complete it"

    # -- array-level ops (also the cross-host steps of the hierarchical transport) --------
    def reduce_array(self, buf: np.ndarray, op: str, root: int | None = None) -> None:
        """In place: buf = op over ranks (all ranks, or only ``root`` when given)."""
        MPI = self.MPI
        spec = [buf, _mpi_type(MPI, buf.dtype)]
        if root is None:
            req = self.comm.Iallreduce(MPI.IN_PLACE, spec, _mpi_op(MPI, op))
        else:
            send = MPI.IN_PLACE if self.rank == root else spec
            req = self.comm.Ireduce(send, spec if self.rank == root else None, _mpi_op(MPI, op), root)
        self._wait([req], "all_reduce" if root is None else "reduce")

    def reduce_scatter_array(self, src: np.ndarray, out: np.ndarray, op: str) -> None:
        """out (n elements) = op over ranks of block ``rank`` of src (size * n elements)."""
        MPI = self.MPI
        t = _mpi_type(MPI, src.dtype)
        req = self.comm.Ireduce_scatter_block([src, t], [out, t], _mpi_op(MPI, op))
        self._wait([req], "reduce_scatter")

    def gather_bytes(self, src: np.ndarray, out: np.ndarray, in_place: bool = False) -> None:
        MPI = self.MPI
        send = MPI.IN_PLACE if in_place else [src, MPI.BYTE]
        self._wait([self.comm.Iallgather(send, [out, MPI.BYTE])], "all_gather")

    def bcast_bytes(self, buf: np.ndarray, root: int) -> None:
        self._wait([self.comm.Ibcast([buf, self.MPI.BYTE], root)], "broadcast")

    # -- ops ----------------------------------------------------------------------
    def _all_reduce(self, it: Item) -> None:
        if it.count == 0:
            return
        acc, fresh = to_acc(it.src, it.dtype, it.op)
        if fresh or np.may_share_memory(it.src, it.dst):
            self.reduce_array(acc if fresh else it.dst.view(acc.dtype), it.op)
            buf = acc if fresh else it.dst.view(acc.dtype)
        else:
            MPI = self.MPI
            t = _mpi_type(MPI, acc.dtype)
            self._wait([self.comm.Iallreduce([acc, t], [it.dst, t], _mpi_op(MPI, it.op))], "all_reduce")
            if it.op != "avg":
                return
            buf = it.dst.view(acc.dtype)
        finish_avg(buf, it.op, self.size)
        from_acc(buf, it.dtype, it.dst)

    def _reduce(self, it: Item) -> None:
        if it.count == 0:
            return
        acc, fresh = to_acc(it.src, it.dtype, it.op)
        root = self.rank == it.root
        if root and not fresh and not np.may_share_memory(it.src, it.dst):
            MPI = self.MPI
            t = _mpi_type(MPI, acc.dtype)
            self._wait([self.comm.Ireduce([acc, t], [it.dst, t], _mpi_op(MPI, it.op), it.root)], "reduce")
            buf = it.dst.view(acc.dtype)
        else:
            buf = acc if fresh or not root else it.dst.view(acc.dtype)
            self.reduce_array(buf, it.op, root=it.root)
        if root:
            finish_avg(buf, it.op, self.size)
            from_acc(buf, it.dtype, it.dst)

    def _reduce_scatter(self, it: Item) -> None:
        if it.count == 0:
            return
        acc, fresh = to_acc(it.src, it.dtype, it.op)
        if not fresh and np.may_share_memory(it.src, it.dst):
            acc = acc.copy()
        out = it.dst.view(acc.dtype) if acc.dtype.itemsize == DTYPE_BYTES[it.dtype] else np.empty(it.count, acc.dtype)
        self.reduce_scatter_array(acc, out, it.op)
        finish_avg(out, it.op, self.size)
        from_acc(out, it.dtype, it.dst)

    def _broadcast(self, it: Item) -> None:
        if it.count == 0:
            return
        if self.rank == it.root and not np.may_share_memory(it.src, it.dst):
            it.dst[:] = it.src
        self.bcast_bytes(it.dst, it.root)

    def _all_gather(self, it: Item) -> None:
        if it.count == 0:
            return
        nb = it.src.nbytes
        in_place = it.src.ctypes.data == it.dst.ctypes.data + self.rank * nb
        self.gather_bytes(it.src, it.dst, in_place=in_place)

    def _all_to_all(self, it: Item) -> None:
        if it.count == 0:
            return
        MPI = self.MPI
        send = MPI.IN_PLACE if np.may_share_memory(it.src, it.dst) else [it.src, MPI.BYTE]
        self._wait([self.comm.Ialltoall(send, [it.dst, MPI.BYTE])], "all_to_all")

    def _barrier(self, it: Item) -> None:
        self._wait([self.comm.Ibarrier()], "barrier")

    def _p2p(self, items: list[Item]) -> None:
        MPI = self.MPI
        reqs = []
        for it in items:
            if it.count == 0:
                continue
            if it.kind == "send":
                reqs.append(self.comm.Isend([it.src, MPI.BYTE], it.root, _P2P_TAG))
            else:
                reqs.append(self.comm.Irecv([it.dst, MPI.BYTE], it.root, _P2P_TAG))
        if reqs:
            self._wait(reqs, "send/recv", [it.root for it in items if it.count])
