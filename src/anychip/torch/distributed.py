"""The c10d backend ``anychip``: torch.distributed over anychip's collectives (docs/torch.md).

    >>> import torch.distributed as dist, anychip.torch.distributed    # registers "anychip"
    >>> dist.init_process_group("anychip")                              # under anychip launch / torchrun

A Python process group (a ``torch.distributed.ProcessGroup`` subclass, the way c10d takes
third-party backends written in Python): each group is one anychip ``Communicator`` on the
process's ``anychip`` device, and every op is enqueued on that device's current torch
stream, which is an anychip Stream, so it runs with the chip's own library (HCCL / BKCL /
RCCL on the simulated chips, a C plugin's collectives) or anychip's engine, asynchronously
and in order with the stream's other work. ``Work.wait()`` blocks until the op is done and
raises its error (``torch.distributed.DistBackendError`` with anychip's message, which
names the rank); ``is_completed()``, ``exception()`` and ``get_future()`` report the real
state.

The device of rank r is ``anychip:<local rank>`` (anychip launch's ``ANYCHIP_LOCAL_RANK`` or
torchrun's ``LOCAL_RANK``, modulo the device count). Each group's ``timeout``
(``init_process_group(timeout=...)``, ``new_group(timeout=...)``) is its communicator's own:
its ops wait that long for their peers, whatever the other groups of the process have;
``ANYCHIP_COLLECTIVE_TIMEOUT``, when set, overrides it for every group. The environment is
not written. CPU tensors are staged through the device (the op then completes before the
call returns).
"""
from __future__ import annotations

import functools
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from ..collectives import Communicator, World
from ..collectives.transports.choose import choose
from ..collectives.transports.native import NativeTransport
from ..runtime.env import NEVER_S, collective_timeout, collective_timeout_from, launcher_int, torch_c10d_direct
from ..runtime.errors import AnychipError, CollectiveTimeout
from . import _C, NAME, _state, _storage_buffer, anychip_device, device_count

__all__ = ["BACKEND", "ProcessGroupAnychip", "WorkAnychip"]

#: the name to give init_process_group
BACKEND = "anychip"

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64", torch.int8: "int8",
           torch.uint8: "uint8", torch.bool: "uint8"}
_REDUCE = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
           dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "avg"}
def _op_code(op: Any) -> int:
    """c10d's RedOpType code of a ReduceOp (or of a RedOpType, which dist.ReduceOp.SUM is)."""
    return int(getattr(op, "op", op).value)


_SUM = dist.ReduceOp.SUM
#: the dtypes an all_reduce takes as they are (bool's reductions are remapped: the general path)
_DIRECT = {k: v for k, v in _DTYPES.items() if k is not torch.bool}
#: the native reductions by c10d's RedOpType code
_NATIVE: dict[int, str] = {_op_code(k): v for k, v in _REDUCE.items()}
#: bitwise reductions: anychip's collectives have none; they run as an all_gather and a local reduction
_BITWISE = {dist.ReduceOp.BAND: torch.bitwise_and, dist.ReduceOp.BOR: torch.bitwise_or,
            dist.ReduceOp.BXOR: torch.bitwise_xor}


def _local_rank() -> int:
    for name in ("ANYCHIP_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"):
        if name in os.environ:
            return launcher_int(name)
    return 0


_work_init = dist.Work.__init__
_buffer_of, _current_stream_id = _C.buffer_of, _C.current_stream_id
#: guards the lazy making of a Work's lock (one lock per Work, made by its first wait: the
#: user's wait and the futures' thread may settle the same Work at once)
_LOCK_MAKING = threading.Lock()


class WorkAnychip(dist.Work):
    """The Work of one c10d op: anychip Works, then an event after the op's trailing copies.

    ``wait(timeout)`` blocks at most ``timeout`` (a ``timedelta``; None or zero: no limit, as
    c10d's ``kNoTimeout``) and raises ``DistBackendError`` naming the op, the rank and the
    group when the op is still running then (the op stays pending: a later ``wait`` may
    still see it complete) or when it failed."""

    # (class-level defaults: an op's Work sets only what differs, since one is made per call)
    _after: Callable[[], None] | None = None
    _event: torch.Event | None = None
    _exc: BaseException | None = None
    _done = False
    _lock: threading.Lock | None = None       # made by the first wait (_finish)

    def __init__(self, pg: ProcessGroupAnychip, what: str, works: Sequence[Any], result: Any,
                 after: Callable[[], None] | None = None, trailing: bool = False) -> None:
        _work_init(self)
        self._pg = pg
        self._what = what
        self._works = works
        self._result = result
        if after is not None:
            self._after = after
        if trailing:        # device work enqueued after the collectives (copies out): an event after it
            self._event = event = torch.Event(device=pg.device)
            event.record(torch.accelerator.current_stream(pg.device.index))

    def _error(self, exc: BaseException | str) -> dist.DistBackendError:
        err = dist.DistBackendError(f"anychip c10d {self._what} (rank {self._pg.rank()} of {self._pg.size()}, "
                                    f"group {self._pg._name}): {exc}")
        if isinstance(exc, BaseException):
            err.__cause__ = exc
        return err

    def _finish(self, deadline: float | None = None) -> bool:
        """Wait for the op (until ``deadline``, a time.monotonic(); None: no limit) and settle
        it; False when the deadline passed first."""
        if self._done:
            return True
        lock = self._lock
        if lock is None:
            with _LOCK_MAKING:
                lock = self._lock
                if lock is None:
                    lock = self._lock = threading.Lock()
        if not lock.acquire(timeout=-1 if deadline is None else max(deadline - time.monotonic(), 0)):
            return False
        try:
            if self._done:
                return True
            try:
                for w in self._works:
                    if deadline is None:
                        w.wait()
                    elif not _wait_until(w, deadline):
                        return False
                if self._event is not None:
                    if deadline is None:
                        self._event.synchronize()
                    else:
                        while not self._event.query():
                            if time.monotonic() >= deadline:
                                return False
                            time.sleep(0.0005)
                if self._after is not None:
                    self._after()
            except (AnychipError, RuntimeError) as exc:
                self._exc = self._error(exc)
            self._done = True
            return True
        finally:
            lock.release()

    def wait(self, timeout: timedelta | None = None) -> bool:
        deadline = None
        if timeout is not None:
            if not isinstance(timeout, timedelta) or timeout < timedelta(0):
                raise ValueError(f"anychip c10d Work.wait: timeout must be a datetime.timedelta >= 0 or None, "
                                 f"got {timeout!r}")
            if timeout > timedelta(0):          # zero is c10d's kNoTimeout
                deadline = time.monotonic() + timeout.total_seconds()
        if not self._finish(deadline):
            assert timeout is not None
            raise self._error(f"Work.wait timed out after {timeout.total_seconds():g} s; the op has not "
                              "completed (it is still pending)")
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if all(w.is_completed() for w in self._works) and (self._event is None or self._event.query()):
            return self._finish()
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc if self.is_completed() else None

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> Future:
        fut: Future = Future()
        if self.is_completed():
            _settle(self, fut)
        else:
            self._pg._completions().put((self, fut))
        return fut


def _wait_until(work: Any, deadline: float) -> bool:
    """Wait for an anychip Work until ``deadline``: False when it is still running then (its
    own failure, a peer's timeout included, is raised)."""
    try:
        return work.wait(max(deadline - time.monotonic(), 0.0))
    except CollectiveTimeout:
        if work.is_completed():
            raise                          # the op failed: a peer did not join in time
        return False


def _settle(work: WorkAnychip, fut: Future) -> None:
    work._finish()
    if work._exc is not None:
        fut.set_exception(work._exc)
    else:
        fut.set_result(work._result)


class ProcessGroupAnychip(dist.ProcessGroup):
    """One anychip Communicator as a c10d process group."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta | None = None,
                 name: str = "default") -> None:
        super().__init__(rank, size)
        self._name = name
        #: seconds each op of the group may wait for its peers: ANYCHIP_COLLECTIVE_TIMEOUT when set,
        #: else the group's timeout (c10d gives every group one; its default is c10d's)
        own = None if timeout is None else max(timeout.total_seconds(), 0.001)
        self.timeout = collective_timeout(own)
        self._timeout_from = collective_timeout_from(own)     # which one, for the timeout's message
        count = device_count()
        if count == 0:
            raise AnychipError("the anychip c10d backend needs an anychip device; none is available here")
        index = _local_rank() % count
        torch.accelerator.set_device_index(index)
        self.device = torch.device(NAME, index)
        self._index = index
        self._streams = _state.streams[index]     # the device's anychip Streams by torch stream id
        self._adev = anychip_device(index)
        key = "anychip_c10d_job"
        if rank == 0:
            store.set(key, f"torch-{uuid.uuid4().hex[:16]}")
        job = store.get(key).decode()
        world = World(rank, size, rank, size, job, "torch")
        comm_id = f"{job}.{name}"
        transport = choose(self._adev, world, comm_id, name, own)    # (it applies the variable, naming it)
        self.comm = Communicator(transport, self._adev, name)
        self._direct = self._make_direct(transport)
        self._trail = False           # set by an op that enqueues device work after its collectives
        self._queue: queue.Queue | None = None

    def _make_direct(self, transport: Any) -> Any:
        """The C++ side of the hot ops (csrc/torch/c10d.cpp), where the group's transport is
        the device library's own collectives and that library is the device's: a one-tensor
        all_reduce or broadcast, all_gather_into_tensor and reduce_scatter_tensor are then
        enqueued in C++, straight to the library. None where it is not (or
        ``ANYCHIP_TORCH_C10D_DIRECT=0``): every op then runs through the communicator. Its
        watchdog aborts the transport when one of its ops is pending past the group's timeout."""
        if not (torch_c10d_direct() and isinstance(transport, NativeTransport) and _C.c10d_direct_available()):
            return None
        handle = transport.handle()
        if handle is None or os.path.realpath(handle[1]) != os.path.realpath(_state.library):
            return None
        comm, _, null_stream = handle
        timeout = self.timeout                # the group's, as the transport's watchdog has it
        return _C.C10dDirect(comm, self._index, self.rank(), self.size(), self._name, not null_stream,
                             transport.failure, transport.abort, timeout if timeout < NEVER_S else 0.0,
                             self._timeout_from)

    # -- c10d bookkeeping ------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    @property
    def group_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"ProcessGroupAnychip(rank {self.rank()} of {self.size()} on {self.device}, {self._adev.name})"

    def _completions(self) -> queue.Queue:
        if self._queue is None:
            self._queue = queue.Queue()
            threading.Thread(target=self._complete, name=f"anychip-c10d-{self._name}", daemon=True).start()
        return self._queue

    def _complete(self) -> None:
        q = self._queue
        assert q is not None
        while True:
            work, fut = q.get()
            # in slices, never blocked inside the library for long: an interpreter that exits
            # meanwhile stops this (daemon) thread in Python, not in a native wait
            while not work._finish(time.monotonic() + 0.05):
                pass
            _settle(work, fut)

    def set_timeout(self, timeout: timedelta) -> None:
        """Refused: a group's timeout is its communicator's, fixed when the group is made (the
        libraries take it at their communicator's init and have no call to change it)."""
        raise NotImplementedError(
            f"anychip c10d: the timeout of process group {self._name} ({self.timeout:g} s, {self._timeout_from}) "
            f"is fixed when the group is made, for its communicator's waits for its peers; make a group with "
            f"the timeout wanted (torch.distributed.new_group(ranks, timeout=...)), or set "
            f"ANYCHIP_COLLECTIVE_TIMEOUT before the groups are made; got set_timeout({timeout!r})")

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self.set_timeout(timeout)

    def shutdown(self) -> None:
        if self._direct is not None:
            self._direct.close()       # its pending ops settle first; then it no longer uses the communicator
        self.comm.destroy()

    def abort(self) -> None:
        if self._direct is not None:
            self._direct.abort()
        self.comm.abort("torch.distributed abort")

    # -- arguments ---------------------------------------------------------------------
    def _dtype(self, t: torch.Tensor, what: str) -> str:
        name = _DTYPES.get(t.dtype)
        if name is None:
            raise TypeError(f"anychip c10d {what}: dtype {t.dtype} is not supported; it takes "
                            f"{', '.join(str(d).replace('torch.', '') for d in _DTYPES)}")
        return name

    def _redop(self, op: Any, t: torch.Tensor, what: str) -> str:
        if t.dtype == torch.bool:        # as NCCL: sum is any (max), product is all (min)
            if op == dist.ReduceOp.SUM:
                return "max"
            if op == dist.ReduceOp.PRODUCT:
                return "min"
            if op == dist.ReduceOp.AVG:
                raise TypeError(f"anychip c10d {what}: AVG of bool tensors is not defined")
        for k, v in _REDUCE.items():
            if op == k:
                return v
        raise ValueError(f"anychip c10d {what}: reduce op {op} is not supported; it takes SUM, PRODUCT, MIN, MAX, "
                         "AVG, BAND, BOR, BXOR")

    def _buf(self, t: torch.Tensor, what: str) -> Any:
        if t.device != self.device:
            raise ValueError(f"anychip c10d {what}: rank {self.rank()} runs on {self.device}, got a tensor on "
                             f"{t.device}; move it there (CPU tensors are staged by the op itself)")
        if not t.is_contiguous():
            raise ValueError(f"anychip c10d {what}: tensors must be contiguous (got shape {tuple(t.shape)}, "
                             f"strides {t.stride()}); call .contiguous()")
        return self._device_buf(t)

    @staticmethod
    def _device_buf(t: torch.Tensor) -> Any:
        """The Buffer of a contiguous tensor of this rank's device: its storage's own Buffer (the
        same object at every call: the communicator reuses the checked, prepared form of a
        repeated op; counts are passed explicitly), or for a tensor that starts inside its
        storage a view of it (which the communicator's cache knows by its storage and range)."""
        buf, offset = _storage_buffer(t)
        return buf if offset == 0 else buf.view(offset, t.numel() * t.element_size())

    def _stage(self, tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], Callable[[], None] | None]:
        """Device tensors for the op; CPU tensors are copied to the device and back afterwards."""
        staged, back = [], []
        for t in tensors:
            if t.device.type == "cpu":
                d = t.to(self.device)
                staged.append(d)
                back.append((t, d))
            else:
                staged.append(t)
        if not back:
            return staged, None

        def copy_back() -> None:
            for host, dev in back:
                host.copy_(dev)
        return staged, copy_back

    def _run(self, what: str, tensors: Sequence[torch.Tensor], issue: Callable[[list[torch.Tensor], Any], list],
             result: Any) -> WorkAnychip:
        staged, back = self._stage(tensors)
        stream = self._streams[_current_stream_id(self._index)]
        self._trail = False
        try:
            works = issue(staged, stream)
        except (AnychipError, RuntimeError) as exc:
            raise dist.DistBackendError(f"anychip c10d {what} (rank {self.rank()} of {self.size()}, group "
                                        f"{self._name}): {exc}") from exc
        work = WorkAnychip(self, what, works, result, back, self._trail)
        if back is not None:
            work.wait()
        return work

    # -- all_reduce, broadcast, reduce -------------------------------------------------
    def _all_reduce_one(self, t: torch.Tensor, op: Any, stream: Any) -> list:
        if t.numel() == 0:
            return []
        bitwise = next((f for k, f in _BITWISE.items() if op == k), None)
        if bitwise is not None:
            if t.is_floating_point():
                raise TypeError(f"anychip c10d all_reduce: {op} needs an integer or bool tensor, got {t.dtype}")
            gathered = torch.empty((self.size(), *t.shape), dtype=t.dtype, device=t.device)
            w = self.comm.all_gather(self._buf(t, "all_reduce"), self._buf(gathered, "all_reduce"),
                                     dtype="uint8", count=t.numel() * t.element_size(), stream=stream)
            t.copy_(functools.reduce(bitwise, gathered.unbind(0)))    # after the gather, on the same stream
            self._trail = True
            return [w]
        return [self.comm.all_reduce(self._buf(t, "all_reduce"), count=t.numel(), dtype=self._dtype(t, "all_reduce"),
                                     op=self._redop(op, t, "all_reduce"), stream=stream)]

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        direct = self._direct
        if direct is not None and type(tensors) is list:   # in C++ (c10d.cpp) where it takes the op
            work = direct.all_reduce(tensors, opts)
            if work is not None:
                return work
        op = opts.reduceOp if opts is not None else _SUM
        if type(tensors) is list and len(tensors) == 1:
            # the common case (DDP's buckets, a training loop's all_reduce): one contiguous tensor
            # of this rank's device and a reduction the collectives have, issued straight to the
            # communicator (the general path's staging and closures cost more than the op's
            # issue on a small tensor); anything else takes the general path below
            t = tensors[0]
            red = "sum" if op == _SUM else _NATIVE.get(_op_code(op))
            dtype = _DIRECT.get(t.dtype)
            if red is not None and dtype is not None and t.get_device() == self._index and t.is_contiguous():
                count = t.numel()
                if count:
                    try:
                        buf, offset = _buffer_of(t)        # as _device_buf, inline
                        if offset:
                            buf = buf.view(offset, count * t.element_size())
                        w = self.comm.all_reduce(buf, None, count, dtype, red,
                                                 self._streams[_current_stream_id(self._index)])
                    except (AnychipError, RuntimeError) as exc:
                        raise dist.DistBackendError(f"anychip c10d all_reduce (rank {self.rank()} of {self.size()}, "
                                                    f"group {self._name}): {exc}") from exc
                    return WorkAnychip(self, "all_reduce", [w], tensors)
        tensors = _as_list(tensors)

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            works: list = []
            for t in ts:
                works += self._all_reduce_one(t, op, stream)
            return works
        return self._run("all_reduce", tensors, issue, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> WorkAnychip:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        direct = self._direct
        if direct is not None and type(tensors) is list:
            work = direct.broadcast(tensors, opts)
            if work is not None:
                return work
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "broadcast", "src")
        tensors = _as_list(tensors)

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return [self.comm.broadcast(self._buf(t, "broadcast"), dtype="uint8", count=t.numel() * t.element_size(),
                                        root=root, stream=stream) for t in ts if t.numel()]
        return self._run("broadcast", tensors, issue, tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> WorkAnychip:
        root = opts.rootRank if opts is not None else 0
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        self._check_rank(root, "reduce", "dst")
        tensors = _as_list(tensors)

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            works: list = []
            for t in ts:
                if not t.numel():
                    continue
                if any(op == k for k in _BITWISE):
                    keep = t.clone() if self.rank() != root else None     # only the root's tensor changes
                    works += self._all_reduce_one(t, op, stream)
                    if keep is not None:
                        t.copy_(keep)
                        self._trail = True
                    continue
                works.append(self.comm.reduce(self._buf(t, "reduce"), count=t.numel(), dtype=self._dtype(t, "reduce"),
                                              op=self._redop(op, t, "reduce"), root=root, stream=stream))
            return works
        return self._run("reduce", tensors, issue, tensors)

    # -- gathers and scatters -------------------------------------------------------------
    def _gather_into(self, out: torch.Tensor, inp: torch.Tensor, stream: Any) -> list:
        nbytes = inp.numel() * inp.element_size()
        if out.numel() * out.element_size() != nbytes * self.size():
            raise ValueError(f"anychip c10d all_gather: the output holds {out.numel()} elements; it must hold "
                             f"world size x input = {self.size()} x {inp.numel()}")
        if not nbytes:
            return []
        return [self.comm.all_gather(self._buf(inp, "all_gather"), self._buf(out, "all_gather"), dtype="uint8",
                                     count=nbytes, stream=stream)]

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        direct = self._direct
        if direct is not None:
            work = direct.all_gather(output, input)
            if work is not None:
                return work

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return self._gather_into(ts[0], ts[1], stream)
        return self._run("all_gather_into_tensor", [output, input], issue, [output])

    _allgather_base = all_gather_single

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> WorkAnychip:
        inputs = _as_list(inputs)
        if len(outputs) != len(inputs):
            raise ValueError(f"anychip c10d all_gather: {len(outputs)} output lists for {len(inputs)} inputs")
        flat_out = [t for lst in outputs for t in lst]
        for lst in outputs:
            if len(lst) != self.size():
                raise ValueError(f"anychip c10d all_gather: the output list has {len(lst)} tensors; want world "
                                 f"size {self.size()}")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            ins, outs = ts[:len(inputs)], ts[len(inputs):]
            works: list = []
            for i, inp in enumerate(ins):
                inp = inp.contiguous()
                gathered = torch.empty((self.size(), *inp.shape), dtype=inp.dtype, device=self.device)
                works += self._gather_into(gathered, inp, stream)
                for r in range(self.size()):      # copied out on the stream, after the gather
                    outs[i * self.size() + r].copy_(gathered[r])
                self._trail = True
            return works
        return self._run("all_gather", [*inputs, *flat_out], issue, outputs)

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> WorkAnychip:
        return self.allgather(outputs, inputs, opts)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> WorkAnychip:
        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            n = len(ts) // 2
            works: list = []
            for out, inp in zip(ts[:n], ts[n:], strict=True):
                works += self._gather_into(out, inp, stream)
            return works
        return self._run("all_gather_into_tensor_coalesced", [*outputs, *inputs], issue, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _scatter_reduce(self, out: torch.Tensor, inp: torch.Tensor, op: Any, stream: Any) -> list:
        if inp.numel() != out.numel() * self.size():
            raise ValueError(f"anychip c10d reduce_scatter: the input holds {inp.numel()} elements; it must hold "
                             f"world size x output = {self.size()} x {out.numel()}")
        if not out.numel():
            return []
        if any(op == k for k in _BITWISE):
            full = inp.clone()
            works = self._all_reduce_one(full, op, stream)
            out.copy_(full.reshape(self.size(), -1)[self.rank()].reshape(out.shape))
            self._trail = True
            return works
        return [self.comm.reduce_scatter(self._buf(inp, "reduce_scatter"), self._buf(out, "reduce_scatter"),
                                         count=out.numel(), dtype=self._dtype(out, "reduce_scatter"),
                                         op=self._redop(op, out, "reduce_scatter"), stream=stream)]

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        direct = self._direct
        if direct is not None:
            work = direct.reduce_scatter(output, input, opts)
            if work is not None:
                return work
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return self._scatter_reduce(ts[0], ts[1], op, stream)
        return self._run("reduce_scatter_tensor", [output, input], issue, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> WorkAnychip:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        outputs = _as_list(outputs)
        for lst in inputs:
            if len(lst) != self.size():
                raise ValueError(f"anychip c10d reduce_scatter: the input list has {len(lst)} tensors; want world "
                                 f"size {self.size()}")
        flat_in = [t for lst in inputs for t in lst]

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            outs, ins = ts[:len(outputs)], ts[len(outputs):]
            works: list = []
            for i, out in enumerate(outs):
                parts = ins[i * self.size():(i + 1) * self.size()]
                full = torch.cat([p.reshape(-1) for p in parts])      # on the device, on the stream
                res = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
                works += self._scatter_reduce(res, full, op, stream)
                if res is not out:
                    out.copy_(res)
                    self._trail = True
            return works
        return self._run("reduce_scatter", [*outputs, *flat_in], issue, outputs)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> WorkAnychip:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            n = len(ts) // 2
            works: list = []
            for out, inp in zip(ts[:n], ts[n:], strict=True):
                works += self._scatter_reduce(out, inp, op, stream)
            return works
        return self._run("reduce_scatter_tensor_coalesced", [*outputs, *inputs], issue, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- all_to_all ----------------------------------------------------------------------------
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> WorkAnychip:
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(f"anychip c10d all_to_all_single: input ({input.numel()} elements) and output "
                                 f"({output.numel()}) must be equal and divisible by world size {n}")

            def even(ts: list[torch.Tensor], stream: Any) -> list:
                out, inp = ts
                if not inp.numel():
                    return []
                return [self.comm.all_to_all(self._buf(inp, "all_to_all_single"), self._buf(out, "all_to_all_single"),
                                             dtype="uint8", count=inp.numel() * inp.element_size() // n,
                                             stream=stream)]
            return self._run("all_to_all_single", [output, input], even, [output])
        rows_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        rows_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        in_sizes = list(input_split_sizes) or [input.shape[0] // n] * n
        out_sizes = list(output_split_sizes) or [output.shape[0] // n] * n
        if len(in_sizes) != n or len(out_sizes) != n or sum(in_sizes) != input.shape[0] or \
                sum(out_sizes) != output.shape[0]:
            raise ValueError(f"anychip c10d all_to_all_single: split sizes {input_split_sizes} / {output_split_sizes} "
                             f"do not split input ({input.shape[0]} rows) and output ({output.shape[0]} rows) "
                             f"into {n} parts")

        def uneven(ts: list[torch.Tensor], stream: Any) -> list:
            out, inp = ts
            sends = list(inp.reshape(-1).split([s * rows_in for s in in_sizes]))
            recvs = list(out.reshape(-1).split([s * rows_out for s in out_sizes]))
            return self._exchange(sends, recvs, stream, "all_to_all_single")
        return self._run("all_to_all_single", [output, input], uneven, [output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> WorkAnychip:
        n = self.size()
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(f"anychip c10d all_to_all: {len(inputs)} inputs and {len(outputs)} outputs; want world "
                             f"size {n} of each")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            outs, ins = ts[:n], ts[n:]
            sends = [t.contiguous().reshape(-1) for t in ins]
            recvs = [t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
                     for t in outs]
            works = self._exchange(sends, [r.reshape(-1) for r in recvs], stream, "all_to_all")
            for r, o in zip(recvs, outs, strict=True):
                if r is not o:
                    o.copy_(r)
                    self._trail = True
            return works
        return self._run("all_to_all", [*outputs, *inputs], issue, outputs)

    def _exchange(self, sends: list[torch.Tensor], recvs: list[torch.Tensor], stream: Any, what: str) -> list:
        """Block j of ``sends`` to rank j, block j of ``recvs`` from rank j: one group of sends and receives."""
        me = self.rank()
        works: list = []
        recvs[me].copy_(sends[me])
        with self.comm.group():
            for peer in range(self.size()):
                if peer == me:
                    continue
                if sends[peer].numel():
                    works.append(self.comm.send(self._buf(sends[peer], what), peer, dtype="uint8",
                                                count=sends[peer].numel() * sends[peer].element_size(), stream=stream))
                if recvs[peer].numel():
                    works.append(self.comm.recv(self._buf(recvs[peer], what), peer, dtype="uint8",
                                                count=recvs[peer].numel() * recvs[peer].element_size(), stream=stream))
        if not works:           # only the local block moved: its copy is what the Work waits for
            self._trail = True
        return works

    # -- gather / scatter ---------------------------------------------------------------------------
    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> WorkAnychip:
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "gather", "dst")
        inp = _as_list(inputs)[0]
        outs = outputs[0] if outputs else []
        if self.rank() == root and len(outs) != self.size():
            raise ValueError(f"anychip c10d gather: the root's gather_list has {len(outs)} tensors; want world size "
                             f"{self.size()}")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            inp, targets = ts[0], ts[1:]
            gathered = torch.empty((self.size(), *inp.shape), dtype=inp.dtype, device=self.device)
            works = self._gather_into(gathered, inp.contiguous(), stream)
            for r, o in enumerate(targets):
                o.copy_(gathered[r])
            self._trail = True
            return works
        return self._run("gather", [inp, *outs], issue, outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> WorkAnychip:
        root = opts.rootRank if opts is not None else 0
        self._check_rank(root, "scatter", "src")
        out = _as_list(outputs)[0]
        parts = inputs[0] if inputs else []
        if self.rank() == root and len(parts) != self.size():
            raise ValueError(f"anychip c10d scatter: the root's scatter_list has {len(parts)} tensors; want world "
                             f"size {self.size()}")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            out, src = ts[0], ts[1:]
            full = torch.cat([p.reshape(-1) for p in src]) if src else torch.empty(
                out.numel() * self.size(), dtype=out.dtype, device=self.device)
            works = [self.comm.broadcast(self._buf(full, "scatter"), dtype="uint8",
                                         count=full.numel() * full.element_size(), root=root, stream=stream)]
            out.copy_(full.reshape(self.size(), -1)[self.rank()].reshape(out.shape))
            self._trail = True
            return works
        return self._run("scatter", [out, *parts], issue, outputs)

    # -- point to point, barrier ----------------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> WorkAnychip:
        self._check_rank(dst, "send", "dst")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return [self.comm.send(self._buf(t, "send"), dst, dtype="uint8", count=t.numel() * t.element_size(),
                                   stream=stream) for t in ts if t.numel()]
        return self._run("send", _as_list(tensors), issue, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> WorkAnychip:
        self._check_rank(src, "recv", "src")

        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return [self.comm.recv(self._buf(t, "recv"), src, dtype="uint8", count=t.numel() * t.element_size(),
                                   stream=stream) for t in ts if t.numel()]
        return self._run("recv", _as_list(tensors), issue, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> WorkAnychip:
        raise ValueError("anychip c10d recv: a receive from any source is not supported; pass src")

    def barrier(self, opts: Any = None) -> WorkAnychip:
        def issue(ts: list[torch.Tensor], stream: Any) -> list:
            return [self.comm.barrier(stream=stream)]
        return self._run("barrier", [], issue, [])

    def _check_rank(self, r: int, what: str, arg: str) -> None:
        if not 0 <= r < self.size():
            raise ValueError(f"anychip c10d {what}: {arg}={r} is not a rank of the group (0..{self.size() - 1})")


def _as_list(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _create(opts: Any, backend_options: Any = None) -> ProcessGroupAnychip:
    return ProcessGroupAnychip(opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id))


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[NAME, "cpu"])
