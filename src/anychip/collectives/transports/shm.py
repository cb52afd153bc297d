"""The shared-memory transport: every op on the C engine (csrc/ccl) on one machine.

:class:`ShmTransport` runs an op one of three ways, chosen by the device:

* ``host``  (cpu): buffers are host memory; the op runs in the calling thread (the cpu
  stream is synchronous) and the Work is complete on return;
* ``sim``   (simulated ascend / kunlun / hygon): device memory is addressable in the
  process; the op is enqueued on the simulated stream (``anychip_sim_stream_enqueue_host_fn``)
  so it is stream-ordered and asynchronous; messages of at least ``ANYCHIP_CCL_ZERO_COPY_MIN``
  bytes (default 64 KiB) carry IPC handles and are reduced zero-copy from the peers' memory;
* ``staged`` (opencl, anything without addressable memory): device -> host on the stream,
  the engine on host memory, host -> device; the calling thread waits for it.
"""
from __future__ import annotations

import collections
import pickle
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ...runtime.env import collective_check, collective_timeout, collective_timeout_set, zero_copy_min
from ...runtime.errors import CollectiveError, InvalidArgumentError
from .._engine import DTYPES as CCL_DTYPES
from .._engine import KINDS, REDOPS, STATUS, engine, error_of
from ..communicator import OpSpec, Work
from .base import Transport, same_span, sizes

if TYPE_CHECKING:
    from ...runtime.device import Device
    from ...runtime.stream import Stream

__all__ = ["ShmTransport"]

class _TaskWork(Work):
    """An engine task enqueued on a stream. The transport owns the task: it frees it once
    it has completed and this Work has taken its outcome (or is gone)."""

    def __init__(self, what: str, task: Any) -> None:
        super().__init__(what)
        self._task = task
        self._busy = False

    def _settle(self, status: int) -> bool:
        if status == STATUS["pending"]:
            return False
        ffi, lib = engine()
        exc = None
        if status != STATUS["ok"]:
            exc = error_of(status, ffi.string(lib.ccl_task_error(self._task)).decode("utf-8", "replace"))
        self._finish(exc)
        return True

    def _poll(self) -> bool:
        return self._done or self._settle(engine()[1].ccl_task_status(self._task))

    def _block(self, timeout: float | None) -> bool:
        if self._done:
            return True
        self._busy = True
        try:
            return self._settle(engine()[1].ccl_task_wait(self._task, -1.0 if timeout is None else float(timeout)))
        finally:
            self._busy = False


def _device_mode(device: Device) -> str:
    if device.backend == "cpu":
        return "host"
    plugin = device.plugin
    if getattr(plugin, "simulated", False) and getattr(plugin, "sim_lib", None) is not None:
        return "sim"
    return "staged"


class ShmTransport(Transport):
    """The shared-memory engine on one machine (see the module docstring)."""

    name = "shm"

    def __init__(self, device: Device, rank: int, size: int, comm_id: str, label: str = "world",
                 timeout: float | None = None) -> None:
        ffi, lib = engine()
        self.device = device
        self.rank, self.size = rank, size
        self.comm_id = comm_id
        self.label = label
        self.mode = _device_mode(device)
        self.name = f"shm/{self.mode}"
        self._lock = threading.Lock()
        self._tasks: collections.deque = collections.deque()     # (task, weakref to its Work), in order
        self._staging: dict[str, np.ndarray] = {}
        self._bases: dict[int, tuple] = {}
        self._lib = lib
        self._aborted: str | None = None
        self._op1 = ffi.new("ccl_op[1]")
        self._zero_op = bytes(ffi.sizeof("ccl_op"))
        zc_min = zero_copy_min()              # bad variables are refused before the segment exists
        #: seconds each op waits for the peers: the group's timeout (env.collective_timeout)
        self.own_timeout = timeout                    # the group's own (None: none), which its sub-groups inherit
        self.timeout = timeout = collective_timeout(timeout)
        out = ffi.new("ccl_comm **")
        # where ANYCHIP_COLLECTIVE_TIMEOUT applies the engine reads it itself, so that its timeout
        # errors name the variable (else the communicator's own timeout)
        rc = lib.ccl_comm_init(comm_id.encode(), rank, size, 0.0 if collective_timeout_set() else timeout, out)
        if rc:
            raise error_of(rc, f"communicator {label}: " + ffi.string(lib.ccl_init_error()).decode())
        self._comm = out[0]
        lib.ccl_comm_set_check(self._comm, int(collective_check()))
        lib.ccl_comm_set_label(self._comm, f"group {label}".encode())
        self._zc_min = zc_min
        if self.mode == "sim":
            plugin: Any = device.plugin
            sffi, slib = plugin.sim_ffi, plugin.sim_lib

            def address(f: Any, lib: Any, name: str) -> int:
                return int(f.cast("uintptr_t", f.addressof(lib, name)))

            lib.ccl_comm_set_ipc(self._comm, ffi.cast("ccl_ipc_open_fn", address(sffi, slib, "anychip_sim_ipc_open")),
                                 ffi.cast("ccl_ipc_close_fn", address(sffi, slib, "anychip_sim_ipc_close")))
            self._host_fn = sffi.cast("void (*)(void *)", address(ffi, lib, "ccl_task_run"))

    # -- interface ------------------------------------------------------------
    def submit(self, specs: list[OpSpec], stream: Stream) -> Work:
        return self.submit_prepared(self.prepare(specs), stream)

    def prepare(self, specs: list[OpSpec]) -> Any:
        """(specs, the engine's op array with addresses and, on simulated chips, IPC handles)."""
        ffi, _ = engine()
        if self.mode == "staged":
            return specs, None
        with self._lock:
            ops, _ = self._ops(specs, None)
            own = ffi.new("ccl_op[]", len(specs))
            ffi.memmove(own, ops, ffi.sizeof("ccl_op") * len(specs))
        if self.mode == "sim":
            for i, sp in enumerate(specs):
                if sp.count * sp.itemsize >= self._zc_min and sp.kind not in ("send", "recv", "barrier",
                                                                                "all_to_all"):
                    self._export(own[i].send, sp.send)
                    self._export(own[i].recv, sp.recv)
        return specs, own

    def submit_prepared(self, prepared: Any, stream: Stream, reuse: bool = False, work: Work | None = None) -> Work:
        specs, ops = prepared
        n = len(specs)
        with self._lock:
            comm = self._comm
            if comm is None or self._aborted is not None:
                self._live()
            if self.mode == "host":
                rc = self._lib.ccl_run(comm, ops, n)
                if rc:
                    self._raise(rc)
                if reuse and work is not None:   # complete on return, as every host-mode Work
                    return work
            elif self.mode == "sim":
                return self._submit_sim(specs, ops, stream, specs[0].kind if n == 1 else f"group of {n} ops")
            else:
                self._run_staged(specs, stream)
        w = Work(specs[0].kind if n == 1 else f"group of {n} ops")
        w._done = True
        return w

    def exchange(self, obj: Any) -> list[Any]:
        self._live()
        self.quiesce()
        data = pickle.dumps(obj)
        lens = np.zeros(self.size, dtype=np.int64)
        mine = np.array([len(data)], dtype=np.int64)
        self._run_host("all_gather", mine, lens, 1, "int64")
        width = int(lens.max())
        send = np.zeros(max(width, 1), dtype=np.uint8)
        send[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        recv = np.zeros(max(width, 1) * self.size, dtype=np.uint8)
        self._run_host("all_gather", send, recv, width, "uint8")
        return [pickle.loads(recv[r * width:r * width + int(lens[r])].tobytes()) for r in range(self.size)]

    def sub(self, ranks: list[int], tag: str, label: str) -> Transport:
        return ShmTransport(self.device, ranks.index(self.rank), len(ranks), f"{self.comm_id}.{tag}", label,
                            self.own_timeout)

    def abort(self, reason: str) -> None:
        if self._comm is not None:
            self._aborted = reason
            engine()[1].ccl_comm_abort(self._comm, reason.encode())

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is None:
            return
        try:
            self.quiesce(timeout=self.timeout)
        finally:
            engine()[1].ccl_comm_destroy(comm)

    def quiesce(self, timeout: float | None = None) -> None:
        """Wait for this transport's enqueued tasks (so the calling thread may run the engine)."""
        _, lib = engine()
        for task, _ in self._tasks:
            lib.ccl_task_wait(task, -1.0 if timeout is None else timeout)
        self._reap()

    def _reap(self) -> None:
        """Free completed tasks from the oldest on, handing their outcome to a live Work first."""
        _, lib = engine()
        tasks = self._tasks
        while tasks:
            task, ref = tasks[0]
            status = lib.ccl_task_status(task)
            if status == STATUS["pending"]:
                return
            work = ref()
            if work is not None and not work._done:
                if work._busy:          # another thread is waiting on it; it settles itself
                    return
                work._settle(status)
            lib.ccl_task_free(task)
            tasks.popleft()

    # -- helpers ------------------------------------------------------------------
    def _live(self) -> None:
        if self._aborted is not None:
            raise CollectiveError(f"communicator {self.label} was aborted: {self._aborted}")
        if self._comm is None:
            raise InvalidArgumentError(f"communicator {self.label} was destroyed")

    def _run(self, ops: Any, n: int) -> None:
        rc = self._lib.ccl_run(self._comm, ops, n)
        if rc:
            self._raise(rc)

    def _raise(self, rc: int) -> None:
        ffi, lib = engine()
        raise error_of(rc, ffi.string(lib.ccl_comm_error(self._comm)).decode("utf-8", "replace"))

    def _run_host(self, kind: str, send: np.ndarray | None, recv: np.ndarray | None, count: int,
                  dtype: str, op: str = "sum", root: int = -1) -> None:
        ffi, _ = engine()
        ops = ffi.new("ccl_op[1]")
        o = ops[0]
        o.kind, o.dtype, o.redop, o.root, o.count = KINDS[kind], CCL_DTYPES[dtype], REDOPS[op], root, count
        if send is not None and send.nbytes:
            o.send.ptr = send.ctypes.data
        if recv is not None and recv.nbytes:
            o.recv.ptr = recv.ctypes.data
        self._run(ops, 1)

    def _addr(self, buf: Any) -> int:
        """Address of a Buffer's first byte (segment base addresses are cached)."""
        root = buf._root if buf._root is not None else buf
        h = root._block.handle
        if type(h) is int:
            return h + buf._offset
        hit = self._bases.get(id(h))
        if hit is None or hit[0]() is not h:
            hit = (weakref.ref(h), buf.device.plugin._pointer(h, 0))
            self._bases[id(h)] = hit
        return hit[1] + buf._offset

    def _ops(self, specs: list[OpSpec], ptrs: list[tuple[int | None, int | None]] | None) -> tuple[Any, list]:
        """ccl_op array for specs; ``ptrs`` overrides the buffers' addresses (staging)."""
        ffi, _ = engine()
        if len(specs) == 1:
            ops = self._op1
            ffi.memmove(ops, self._zero_op, ffi.sizeof("ccl_op"))
        else:
            ops = ffi.new("ccl_op[]", len(specs))
        for i, sp in enumerate(specs):
            o = ops[i]
            o.kind, o.dtype, o.redop, o.root, o.count = (KINDS[sp.kind], CCL_DTYPES[sp.dtype], REDOPS[sp.op],
                                                         sp.root, sp.count)
            if ptrs is not None:
                sptr, rptr = ptrs[i]
            else:
                sptr = self._addr(sp.send) if sp.send is not None and sp.send.nbytes else None
                rptr = self._addr(sp.recv) if sp.recv is not None and sp.recv.nbytes else None
            if sptr:
                o.send.ptr = sptr
            if rptr:
                o.recv.ptr = rptr
        return ops, [specs]

    def _submit_sim(self, specs: list[OpSpec], ops: Any, stream: Stream, what: str) -> Work:
        ffi, lib = engine()
        plugin: Any = self.device.plugin
        keep = specs
        task = lib.ccl_task_new(self._comm, ops, len(specs))
        if task == ffi.NULL:
            raise CollectiveError(f"{what}: out of host memory for the task")
        work = _TaskWork(what, task)
        plugin._use(self.device.index)
        rc = plugin.sim_lib.anychip_sim_stream_enqueue_host_fn(plugin.sim_handle(stream._live()), self._host_fn, task)
        if rc:
            lib.ccl_task_free(task)
            raise CollectiveError(f"{what}: enqueueing on {stream!r} failed: {plugin.sim_detail()}")
        stream._keep_alive(keep)                  # the buffers live until the stream has run the op
        if self._tasks:
            self._reap()
        self._tasks.append((task, weakref.ref(work)))
        return work

    def _export(self, cbuf: Any, buf: Any) -> None:
        if buf is None or buf.nbytes == 0:
            return
        ffi, _ = engine()
        plugin: Any = self.device.plugin
        block = buf._check()
        base = block.handle
        sffi = plugin.sim_ffi
        h = sffi.cast("anychip_sim_ipc_handle *", int(ffi.cast("uintptr_t", ffi.addressof(cbuf, "ipc_handle"))))
        rc = plugin.sim_lib.anychip_sim_ipc_get_handle(sffi.cast("void *", base), h)
        if rc:
            raise CollectiveError(f"exporting a buffer for zero-copy failed: {plugin.sim_detail()}")
        cbuf.ipc_offset = buf._offset
        cbuf.has_ipc = 1

    def _staging_array(self, key: str, nbytes: int) -> np.ndarray:
        arr = self._staging.get(key)
        if arr is None or arr.nbytes < nbytes:
            arr = np.empty(max(nbytes, 64), dtype=np.uint8)
            self._staging[key] = arr
        return arr[:nbytes]

    def _run_staged(self, specs: list[OpSpec], stream: Stream) -> None:
        """The point-to-point ops of a group together, then each collective in order
        (a later op of the group may read what an earlier one wrote)."""
        p2p = [sp for sp in specs if sp.kind in ("send", "recv")]
        if p2p:
            self._stage(p2p, stream)
        for sp in specs:
            if sp.kind not in ("send", "recv"):
                self._stage([sp], stream)

    def _stage(self, specs: list[OpSpec], stream: Stream) -> None:
        """Device -> host on the stream, the engine on host memory, host -> device.
        Host copies of send and recv are distinct arrays (the same one when send is recv),
        so the in-place layouts need no special case."""
        from ...runtime.device import copy
        ptrs: list[tuple[int | None, int | None]] = []
        outs: list[tuple[Any, Any]] = []
        for i, sp in enumerate(specs):
            s_n, r_n = sizes(sp, self.size)
            host_s = host_r = None
            if sp.send is not None and s_n:
                host_s = self._staging_array(f"s{i}", s_n)
                copy(host_s, sp.send, s_n, stream=stream)
            if sp.recv is not None and r_n:
                same = host_s is not None and s_n == r_n and same_span(sp.send, sp.recv)
                host_r = host_s if same else self._staging_array(f"r{i}", r_n)
                if not (sp.kind == "reduce" and sp.root != self.rank):
                    outs.append((sp.recv, host_r))
            ptrs.append((host_s.ctypes.data if host_s is not None else None,
                         host_r.ctypes.data if host_r is not None else None))
        stream.synchronize()
        ops, _ = self._ops(specs, ptrs)
        self._run(ops, len(specs))
        for buf, host in outs:
            copy(buf, host, host.nbytes, stream=stream)
        stream.synchronize()

