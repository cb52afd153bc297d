"""Transports over a chip's own collective library.

* :class:`NativeTransport` calls HCCL (Ascend), BKCL (Kunlun) or RCCL (Hygon) through
  the chips' plugin.h adapters (csrc/adapters/*/plugin_*.c), exactly as it calls
  the real ``libhccl.so`` / ``libbkcl.so`` / ``librccl.so``. The library follows the
  device's runtime: when the backend runs on the vendor's runtime, the vendor's
  collective library is looked up in the same places (it must be installed beside it);
  when the backend runs on the simulator, the simulator library itself exports the
  collective API (csrc/sim/hccl.c, bkcl.c, rccl.c), so the code path is the same and
  only the library differs.
* :class:`NcclTransport` does the same for CUDA through ``cupy.cuda.nccl``.

Both are made by the chooser (:mod:`.choose`), from what the device's plugin gives
through ``DevicePlugin.native_ccl()``: a
:class:`~anychip.runtime.native_ccl.NativeLibrary` (the HCCL / BKCL / RCCL bindings in
anychip/chips, a C or Paddle plugin's collectives) drives a :class:`NativeTransport`,
``cupy.cuda.nccl`` an :class:`NcclTransport`; None (the reason is the plugin's
``native_ccl_problem()``) leaves the shared-memory engine.
``ANYCHIP_COLLECTIVE_TRANSPORT`` overrides: ``auto`` (default), ``native`` (an error when
the device has no native library), ``host`` (always the engine).

Bootstrap: the communicator's engine transport (shared memory, one host) stays beside
the native one; rank 0's unique id travels through its ``exchange``, and so does
``split``. It also runs what a library lacks, in order on the same stream:

=============  ==================================================================
HCCL           no ``avg`` (sum, then scale, needs a device kernel): the engine
BKCL           no ``int8`` reductions and no ``avg``, no barrier: the engine
RCCL / NCCL    no barrier: the engine (NCCL: an all-reduce of one element);
               ``cupy`` has no all-to-all: send / recv pairs in one group
=============  ==================================================================

Data movement (broadcast, all-gather, all-to-all, send / recv) goes as bytes, so every
dtype takes the native path. A group (``comm.group()``) with any op the library lacks
runs wholly on the engine.

Completion: an event recorded after the op on its stream; when it has passed, the
library's asynchronous error (``HcclGetCommAsyncError``, ``ncclCommGetAsyncError``)
says whether the op failed. The simulator's BKCL reports it through
``anychip_sim_bkcl_async_error`` (BKCL publishes no such call).

Deadline: each transport has its group's timeout (``timeout``: a ``torch.distributed``
group's own, else ``ANYCHIP_COLLECTIVE_TIMEOUT``, which overrides it when set). A library
that takes a timeout per communicator (a plugin's ``comm_init_rank_timeout``, plugin.h
minor 3: the simulator's HCCL / BKCL / RCCL, the C plugin template) is given it, so its
waits for peers fail at that timeout naming the peer; the vendors' libraries have none.
Where ``ANYCHIP_COLLECTIVE_TIMEOUT`` is set the library is given none (plain
``comm_init_rank``) and reads the variable itself, so that its errors name it. Every timeout
error says which timeout applied (``env.collective_timeout_from``).
A library times out only where it waits for its peers, and NCCL not even there,
so an op whose work never ends (a stuck kernel, a peer that never arrives at NCCL) would
hang every rank. As ProcessGroupNCCL's watchdog does (``TORCH_NCCL_ASYNC_ERROR_HANDLING``),
one thread per process (:func:`_watchdog`) looks at the native transports' Works: one
still running its transport's timeout (plus :data:`_GRACE_S`, so that a
library that times out itself reports first, naming the peer it waited for) after it was
enqueued fails with a :class:`CollectiveTimeout` naming the op and the rank, and its
communicator is aborted (the Works still pending fail, later calls raise); ``Work.wait``
waits in slices, so it raises at once. When the op's work still runs :data:`_STUCK_S`
seconds after the abort, nothing can end it and every wait for its stream (a copy to the
host, the next op) hangs: the watchdog says so on stderr and ends the process (exit code 1),
as ProcessGroupNCCL does, so that the program, or its launcher, ends. The same applies to
CUDA (:class:`NcclTransport`, ``ncclCommAbort``).
"""
from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, cast

from ...runtime.env import NEVER_S, collective_timeout, collective_timeout_from, collective_timeout_set, zero_copy_min
from ...runtime.errors import AnychipError, CollectiveError, CollectiveTimeout, InvalidArgumentError, UnsupportedError
from ...runtime.native_ccl import NativeLibrary
from ...runtime.stream import Event, Stream
from ..communicator import OpSpec, Work
from .base import Transport
from .shm import ShmTransport

if TYPE_CHECKING:
    from ...runtime.device import Device

__all__ = ["NativeTransport", "NcclTransport", "native_library", "why_no_library"]

_log = logging.getLogger("anychip")

#: how the simulator's libraries name their communicators in messages (csrc/sim/collective.c)
_LABEL = re.compile(r"\b(?:hccl|nccl|bkcl) communicator [\w.-]+")
#: longest stretch a Work.wait waits without looking whether the watchdog failed it
_SLICE_S = 0.05
#: seconds past the transport's timeout before the watchdog fails an op
_GRACE_S = 1.0
#: seconds an op's work may still run after the watchdog aborted its communicator before the
#: watchdog ends the process
_STUCK_S = 10.0


class _EventWork(Work):
    """Complete when an event recorded after the op has passed and the library reports
    no asynchronous error; or failed at once when its communicator is aborted."""

    def __init__(self, what: str, transport: Any, event: Any, keep: Any, reusable: bool = False) -> None:
        super().__init__(what)
        self._transport = transport
        self._event = event
        self._keep = keep
        self._since = time.monotonic()        # when it was enqueued (the watchdog's deadline)
        self._passed = False                  # the watchdog saw its event pass (nobody settled it yet)
        self._reusable = reusable             # a prepared op's: re-armed by each launch, keeps its event
        self._ref = weakref.ref(self)
        transport._pending[id(self)] = self._ref

    def _rearm(self, stream: Stream, keep: Any) -> None:
        """Track the op just enqueued on ``stream`` (a prepared op's next launch): its own event
        recorded again, the outcome reset."""
        event = self._event
        if event is None:                     # abandoned by an abort: the communicator is dead by now
            raise self._transport._dead()
        event.record(stream)
        self._keep = keep
        self._since = time.monotonic()
        self._passed = False
        self._exc = None
        self._done = False
        self._transport._pending[id(self)] = self._ref

    def __del__(self) -> None:
        # dropped before it settled: nobody can wait for its event any more, and the event's
        # next record supersedes this one, so it may serve the next op (saves a create/destroy)
        event = self._event
        if event is not None:
            self._transport._pending.pop(id(self), None)
            pool = self._transport._events
            if len(pool) < 64:
                pool.append(event)

    def _settle(self) -> bool:
        with self._transport._lock:           # the watchdog's thread may settle or fail it too
            if self._done:                    # failed by an abort meanwhile
                return True
            exc = self._transport._async_failure(self._what)
            self._finish(exc)
            self._transport._pending.pop(id(self), None)
            self._keep = None
            if self._reusable:
                return True                   # its event serves its next launch
            pool = self._transport._events
            if len(pool) < 64:
                pool.append(self._event)      # passed: it may be recorded again
            self._event = None
        return True

    def _abandon(self, exc: BaseException) -> None:
        """Fail now: the communicator was aborted under the op (its event, which may still
        pass later, is not reused)."""
        with self._transport._lock:
            if not self._done:
                self._finish(exc)
                self._event = self._keep = None
            self._transport._pending.pop(id(self), None)

    def _poll(self) -> bool:
        event = self._event
        if self._done or event is None:
            return True
        return event.query() and self._settle()

    def _block(self, timeout: float | None) -> bool:
        event = self._event
        if self._done or event is None:
            return True
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            # in slices: the watchdog may fail it meanwhile (its work never ends)
            if event._wait(min(max(left, 0.0), _SLICE_S)):
                return self._settle()
            if self._done:
                return True
            if left <= 0:
                return False


class _Outcomes:
    """What a native transport needs so that every Work learns how its op ended: the Works
    not settled yet, and why the communicator was aborted. ``close`` settles them while the
    library can still report their failures (a Work failed by a dead peer keeps its error
    after ``destroy``); ``abort`` fails those still running at once."""

    label: str
    rank: int
    _comm: Any

    def _init_outcomes(self, timeout: float | None) -> None:
        # id -> the Work, weakly (a dict of weak references costs half a WeakSet per op)
        self._pending: dict[int, weakref.ref[_EventWork]] = {}
        self._aborted: str | None = None
        self._timed_out = False               # aborted by the watchdog
        # the Works' settling and the communicator's abort or close, which the watchdog's
        # thread may run beside the rank's own
        self._lock = threading.RLock()
        self._timeout = collective_timeout(timeout)     # the group's (env.collective_timeout)
        self._timeout_from = collective_timeout_from(timeout)   # which one, for the timeout's message
        self._own_timeout = timeout                   # the group's own (None: none), which its sub-groups inherit
        self._stuck: tuple[Any, float, str] | None = None   # (event, when aborted, why): see _expire
        if self._timeout < NEVER_S:
            _watch(self)

    def _unsettled(self) -> list[_EventWork]:
        return [w for w in (r() for r in self._pending.copy().values()) if w is not None]

    def _aborted_error(self, what: str) -> CollectiveError:
        kind = CollectiveTimeout if self._timed_out else CollectiveError
        return kind(f"{what} (group {self.label}) aborted: {self._aborted}")

    def abort(self, reason: str) -> None:
        raise NotImplementedError

    def _expire(self, now: float) -> None:
        """The watchdog's look (its thread): the oldest Work still running past the collective
        timeout fails, naming the op and the rank, and the communicator is aborted; if its
        work still runs _STUCK_S later, the process ends."""
        if self._stuck is not None:
            event, since, reason = self._stuck
            if event.query():
                self._stuck = None
            elif now - since > _STUCK_S:
                _end_process(f"{reason}, and its work on {getattr(self, 'device', '?')} still runs {_STUCK_S:g} s "
                             "after the abort: nothing can end it; ending the process")
            return
        if self._comm is None:
            return
        for work in self._unsettled():
            event = work._event
            if (work._done or work._passed or event is None or
                    now - work._since <= self._timeout + _GRACE_S):
                continue
            if event.query() or work._done:   # complete; nobody has waited for it yet
                work._passed = True
                continue
            reason = (f"{work._what} (group {self.label}) did not complete within {self._timeout:g} s on rank "
                      f"{self.rank} ({self._timeout_from}); the communicator was aborted")
            with self._lock:
                if work._done or self._comm is None:
                    return
                self._timed_out = True
                work._abandon(CollectiveTimeout(reason))
            self._stuck = (event, time.monotonic(), f"rank {self.rank}: {work._what} (group {self.label}) did not "
                           f"complete within {self._timeout:g} s ({self._timeout_from})")
            self.abort(reason)
            return

    def _settle_pending(self) -> None:
        """Wait for the enqueued ops and settle their Works (before the library's destroy)."""
        for work in self._unsettled():
            try:
                work._block(None)
            except AnychipError as exc:        # the stream itself failed
                work._abandon(exc)
        self._pending.clear()

    def _fail_pending(self, reason: str) -> None:
        """Settle the Works whose op has completed; fail the others with ``reason``."""
        for work in self._unsettled():
            try:
                work._poll()
            except AnychipError as exc:
                work._abandon(exc)
        self._aborted = reason
        for work in self._unsettled():
            work._abandon(self._aborted_error(work._what))
        self._pending.clear()

    def _dead(self) -> AnychipError:
        if self._aborted is not None:
            return CollectiveError(f"communicator {self.label} was aborted: {self._aborted}")
        return InvalidArgumentError(f"communicator {self.label} was destroyed")


class NativeTransport(_Outcomes, Transport):
    """HCCL / BKCL / RCCL for one group of ranks (see the module docstring)."""

    def __init__(self, device: Device, rank: int, size: int, comm_id: str, label: str = "world",
                 boot: Transport | None = None, library: NativeLibrary | None = None,
                 timeout: float | None = None) -> None:
        if library is None:
            library, why = native_library(device)
            if library is None:
                raise UnsupportedError(f"{device} has no native collective library: {why}")
        self.device = device
        self.rank, self.size, self.label = rank, size, label
        self.lib = library
        # as ShmTransport's modes: "sim" = ops enqueued on a simulated stream
        self.mode = "sim" if library.simulated else "device"
        self.name = f"native/{library.api}" + (" (simulated)" if library.simulated else "")
        self._boot: Transport = boot if boot is not None else ShmTransport(device, rank, size, comm_id, label,
                                                                           timeout)
        self._events: list[Event] = []          # completion events free for reuse
        self._last_stream: tuple[Any, Any] | None = None     # (raw stream, the library's handle)
        self._side: tuple[Stream, Event, Event] | None = None   # see _side_enter
        self._copy_side: Stream | None = None   # a broadcast root's copy beside the op (see _issue)
        self._comm: Any = None
        self._plugin: Any = cast(Any, device.plugin)
        self._init_outcomes(timeout)
        try:
            uid = library.unique_id() if rank == 0 else None
            uid = self._boot.exchange(uid)[0]
            library.use_device(self._plugin, device.index)
            if collective_timeout_set():        # the library reads the variable where it has a timeout
                self._comm = library.init(size, uid, rank)
            else:                               # the group's own timeout, or the default
                self._comm = library.init_with_timeout(size, uid, rank, self._timeout)
        except BaseException:
            if boot is None:
                self._boot.close()
            raise

    # -- interface ------------------------------------------------------------------------
    def submit(self, specs: list[OpSpec], stream: Stream) -> Work:
        self._live()
        if not all(self.lib.supports(sp) for sp in specs):
            return self._boot.submit(specs, stream)
        what = specs[0].kind if len(specs) == 1 else f"group of {len(specs)} ops"
        plugin = self._plugin
        lib = self.lib
        lib.use_device(plugin, self.device.index)
        on = self._side_enter(stream)
        handle = lib.stream_handle(plugin, on._live())
        grouped = len(specs) > 1
        if grouped:
            lib.check(lib.group_start(), f"{lib.api} group start")
        try:
            for sp in specs:
                self._issue(sp, handle, on)
        finally:
            try:
                if grouped:
                    lib.check(lib.group_end(), f"{what}: {lib.api} group end")
            finally:
                self._side_leave(on, stream)
        event = self._events.pop() if self._events else Event(self.device)
        event.record(stream)
        stream._keep_alive(specs)
        return _EventWork(what, self, event, specs)

    def prepare(self, specs: list[OpSpec]) -> tuple[list[OpSpec], Any]:
        """(specs, the op bound to its converted arguments): a repeated op skips the dtype / op
        lookups, the pointer conversions and the choice of the library function."""
        if len(specs) != 1 or self._comm is None or not self.lib.supports(specs[0]):
            return specs, None
        sp = specs[0]
        send, recv, count, dtype, redop, root, copy_first = self._arguments(sp)
        if copy_first:
            return specs, None
        call = self.lib.bind(self._comm, sp.kind, send, recv, count, dtype, redop, root)
        return specs, (call, sp.kind, f"{sp.kind} ({self.lib.api}, group {self.label})")

    def submit_prepared(self, prepared: tuple[list[OpSpec], Any], stream: Stream, reuse: bool = False,
                        work: Work | None = None) -> Work:
        specs, native = prepared
        if native is None:
            return self.submit(specs, stream)
        if self._comm is None:
            raise self._dead()
        call, what, where = native
        lib, plugin = self.lib, self._plugin
        lib.use_device(plugin, self.device.index)
        on = stream if lib.null_stream or not stream._default else self._side_enter(stream)
        raw = on._live()
        last = self._last_stream
        if last is not None and last[0] is raw:
            handle = last[1]
        else:
            handle = lib.stream_handle(plugin, raw)
            self._last_stream = (raw, handle)
        try:
            rc = call(handle)
        finally:
            self._side_leave(on, stream)
        if rc:
            raise lib.error(rc, where)
        stream._keep_alive(specs)
        if not reuse:
            event = self._events.pop() if self._events else Event(self.device)
            event.record(stream)
            return _EventWork(what, self, event, specs)
        if type(work) is _EventWork and work._transport is self and work._reusable:
            work._rearm(stream, specs)
            return work
        return _EventWork(what, self, Event(self.device).record(stream), specs, reusable=True)

    def handle(self) -> tuple[int, str, bool] | None:
        """For a caller that enqueues this group's ops itself, in C, through the library
        (the PyTorch device's c10d backend, csrc/torch/c10d.cpp): the communicator as an
        integer, the path of the library that made it, and whether the library takes the NULL
        stream; None once it is destroyed or aborted. The caller reads the failures of its ops
        back through ``failure``."""
        if self._comm is None:
            return None
        return int(self.lib.ffi.cast("uintptr_t", self._comm)), self.lib.path, self.lib.null_stream

    def failure(self, what: str) -> str | None:
        """The communicator's asynchronous failure as this transport's own Works report it
        (naming the rank that failed or did not join); None: there is none."""
        exc = self._async_failure(what)
        return None if exc is None else str(exc)

    def exchange(self, obj: Any) -> list[Any]:
        self._live()
        return self._boot.exchange(obj)

    def sub(self, ranks: list[int], tag: str, label: str) -> Transport:
        boot = self._boot.sub(ranks, tag, label)
        try:
            return NativeTransport(self.device, boot.rank, boot.size, "", label, boot=boot, library=self.lib,
                                   timeout=self._own_timeout)
        except BaseException:
            boot.close()
            raise

    def abort(self, reason: str) -> None:
        rc = 0
        with self._lock:
            comm = self._comm
            if comm is not None:
                self._fail_pending(reason)
                self._comm = None
        if comm is not None:
            rc = self.lib.abort_with_reason(comm, reason)
        self._boot.abort(reason)
        self.lib.check(rc, f"{self.lib.api} communicator abort")

    def close(self) -> None:
        try:
            if self._comm is not None:
                self._settle_pending()        # (the watchdog may abort it meanwhile)
            with self._lock:
                comm, self._comm = self._comm, None
            if comm is not None:
                self.lib.use_device(self._plugin, self.device.index)
                self.lib.check(self.lib.destroy(comm), f"{self.lib.api} communicator destroy")
        finally:
            self._comm = None
            side, self._side = self._side, None
            copy_side, self._copy_side = self._copy_side, None
            try:
                if side is not None:
                    side[0].synchronize()
                    side[0].destroy()
                if copy_side is not None:
                    copy_side.destroy()
            finally:
                self._boot.close()

    # -- helpers ----------------------------------------------------------------------------
    def _side_enter(self, stream: Stream) -> Stream:
        """The stream the library gets for ``stream``. A library that refuses the NULL stream
        (HCCL: HCCL_E_PTR) gets, for a device's default stream (NULL on ACL), a stream of this
        transport's own that first waits for the default stream's work (_side_leave makes the
        default stream wait for the ops in turn)."""
        if self.lib.null_stream or not stream._default:
            return stream
        if self._side is None:
            self._side = (Stream(self.device), Event(self.device), Event(self.device))
        side, before, _ = self._side
        side.wait_event(before.record(stream))
        return side

    def _side_leave(self, on: Stream, stream: Stream) -> None:
        if on is not stream and self._side is not None:
            stream.wait_event(self._side[2].record(on))

    def _live(self) -> None:
        if self._comm is None:
            raise self._dead()

    def _arguments(self, sp: OpSpec) -> tuple[Any, Any, int, int, int, int, bool]:
        """The library's arguments for ``sp`` (send, recv, count, dtype, redop, root) and whether
        the root's send must first be copied to its recv (HCCL broadcasts in place)."""
        lib, ffi = self.lib, self.lib.ffi
        reducing = sp.kind in ("all_reduce", "reduce", "reduce_scatter")
        if reducing:
            count, dtype, redop = sp.count, lib.dtypes[sp.dtype], lib.redops[sp.op]
        else:
            count, dtype, redop = sp.count * sp.itemsize, lib.byte, 0
        send = ffi.cast("void *", (sp.send.ptr or 0) if sp.send is not None else 0)
        recv = ffi.cast("void *", (sp.recv.ptr or 0) if sp.recv is not None else 0)
        copy_first = bool(sp.kind == "broadcast" and lib.broadcast_in_place and sp.root == self.rank and
                          send != recv and count)
        root = sp.root if sp.root >= 0 else 0
        return send, recv, count, dtype, redop, root, copy_first

    def _issue(self, sp: OpSpec, stream_handle: Any, stream: Stream) -> None:
        lib = self.lib
        send, recv, count, dtype, redop, root, copy_first = self._arguments(sp)
        if copy_first:
            self._broadcast_out_of_place(sp, send, count, dtype, stream_handle, stream)
            return
        lib.check(lib.op(self._comm, sp.kind, send, recv, count, dtype, redop, root, stream_handle),
                  f"{sp.kind} ({lib.api}, group {self.label})")

    def _broadcast_out_of_place(self, sp: OpSpec, send: Any, nbytes: int, dtype: int, stream_handle: Any,
                                stream: Stream) -> None:
        """The root of an out-of-place broadcast on a library that broadcasts in place (HCCL):
        the root only reads its buffer, so the peers are broadcast its send buffer, and the copy
        of send to recv goes beside that rather than before it (a copy first would make the
        peers wait for it: two copies' time instead of one). From the zero-copy size on, the
        peers read the root's buffer while the op runs, so the copy runs on a second stream
        (forked from and joined back into ``stream``); below it the op returns once the peers
        have arrived and the copy that follows it on ``stream`` overlaps their reads."""
        from ...runtime.device import copy
        lib = self.lib
        where = f"broadcast ({lib.api}, group {self.label})"
        if nbytes < zero_copy_min():
            lib.check(lib.op(self._comm, "broadcast", send, send, nbytes, dtype, 0, sp.root, stream_handle), where)
            copy(sp.recv, sp.send, nbytes, stream=stream)
            return
        side = self._side_stream()
        side.wait_event(Event(self.device).record(stream))
        copy(sp.recv, sp.send, nbytes, stream=side)
        lib.check(lib.op(self._comm, "broadcast", send, send, nbytes, dtype, 0, sp.root, stream_handle), where)
        stream.wait_event(Event(self.device).record(side))

    def _side_stream(self) -> Stream:
        if self._copy_side is None:
            self._copy_side = Stream(self.device)
        return self._copy_side

    def _async_failure(self, what: str) -> CollectiveError | None:
        if self._comm is None:
            return self._aborted_error(what) if self._aborted is not None else None
        code = self.lib.async_error(self._comm)
        if not code:
            return None
        detail = self.lib.comm_detail(self._comm)
        if detail:
            msg = _LABEL.sub(lambda m: f"group {self.label}", detail)
        else:
            msg = f"{what} (group {self.label}) failed: {self.lib.api} reported {self.lib.code_name(code)}"
        timed_out = code in self.lib.timeout_codes or " timed out after " in detail
        return CollectiveTimeout(msg) if timed_out else CollectiveError(msg)


# ---------------------------------------------------------------------------------------------
# NCCL through CuPy
# ---------------------------------------------------------------------------------------------

_NCCL_DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
                "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16", "float32": "NCCL_FLOAT32",
                "float64": "NCCL_FLOAT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}
#: op kind -> cupy's NcclCommunicator method and its arguments in order (movement ops in bytes);
#: all_to_all (send / recv pairs) and barrier (an all-reduce of one element) are written out
_NCCL_CALLS = {"all_reduce": ("allReduce", "send recv count dtype redop stream"),
               "reduce": ("reduce", "send recv count dtype redop root stream"),
               "reduce_scatter": ("reduceScatter", "send recv count dtype redop stream"),
               "broadcast": ("broadcast", "send recv count dtype root stream"),
               "all_gather": ("allGather", "send recv count dtype stream"),
               "send": ("send", "send count dtype root stream"),
               "recv": ("recv", "recv count dtype root stream")}


class NcclTransport(_Outcomes, Transport):
    """NCCL for CUDA devices through ``cupy.cuda.nccl`` (``nccl`` is that module, or a
    stand-in with the same names in tests). Unique ids are what ``get_unique_id``
    returns (bytes from CuPy 14, a tuple of 128 ints before), passed through unchanged.
    ``cupy.cuda.nccl`` has no all-to-all: it is a group of send / recv pairs, as
    torch.distributed does it; barrier is an all-reduce of one element."""

    mode = "device"

    def __init__(self, device: Device, rank: int, size: int, comm_id: str, label: str = "world",
                 nccl: Any = None, boot: Transport | None = None, timeout: float | None = None) -> None:
        if nccl is None:
            nccl = device.plugin.native_ccl()
            if nccl is None:
                raise UnsupportedError(f"{device}: cupy.cuda.nccl is not available")
        self.device, self.rank, self.size, self.label = device, rank, size, label
        self.nccl = nccl
        self.name = "native/NCCL"
        self._boot: Transport = boot if boot is not None else ShmTransport(device, rank, size, comm_id, label,
                                                                           timeout)
        self.dtypes = {k: getattr(nccl, v) for k, v in _NCCL_DTYPES.items() if hasattr(nccl, v)}
        self.redops = {k: getattr(nccl, v) for k, v in _NCCL_OPS.items() if hasattr(nccl, v)}
        self._scratch: Any = None
        self._events: list[Event] = []
        self._comm: Any = None
        self._init_outcomes(timeout)        # (NCCL takes no timeout: the watchdog applies it)
        try:
            uid = nccl.get_unique_id() if rank == 0 else None
            uid = self._boot.exchange(uid)[0]
            self._comm = nccl.NcclCommunicator(size, uid, rank)
        except BaseException:
            if boot is None:
                self._boot.close()
            raise

    def supports(self, spec: OpSpec) -> bool:
        if spec.kind in ("all_reduce", "reduce", "reduce_scatter"):
            return spec.dtype in self.dtypes and spec.op in self.redops
        return True

    def submit(self, specs: list[OpSpec], stream: Stream) -> Work:
        if self._comm is None:
            raise self._dead()
        if not all(self.supports(sp) for sp in specs):
            return self._boot.submit(specs, stream)
        what = specs[0].kind if len(specs) == 1 else f"group of {len(specs)} ops"
        handle = stream._live()
        sptr = int(getattr(handle, "ptr", 0) or 0)         # a CUDA stream handle carries the cudaStream_t
        nccl = self.nccl
        grouped = len(specs) > 1 or any(sp.kind == "all_to_all" for sp in specs)
        if grouped:
            nccl.groupStart()
        try:
            for sp in specs:
                self._issue(sp, sptr)
        finally:
            if grouped:
                nccl.groupEnd()
        event = self._events.pop() if self._events else Event(self.device)
        event.record(stream)
        stream._keep_alive(specs)
        return _EventWork(what, self, event, specs)

    def _issue(self, sp: OpSpec, stream: int) -> None:
        c, nccl = self._comm, self.nccl
        s = sp.send.ptr if sp.send is not None and sp.send.ptr else 0
        r = sp.recv.ptr if sp.recv is not None and sp.recv.ptr else 0
        if sp.kind in ("all_reduce", "reduce", "reduce_scatter"):
            count, dtype, redop = sp.count, self.dtypes[sp.dtype], self.redops[sp.op]
        else:
            count, dtype, redop = sp.count * sp.itemsize, nccl.NCCL_UINT8, 0
        if sp.kind == "all_to_all":
            for peer in range(self.size):
                c.send(s + peer * count, count, dtype, peer, stream)
                c.recv(r + peer * count, count, dtype, peer, stream)
        elif sp.kind == "barrier":
            if self._scratch is None:
                self._scratch = self.device.alloc(4)
            p = self._scratch.ptr
            c.allReduce(p, p, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)
        else:
            method, args = _NCCL_CALLS[sp.kind]
            given = {"send": s, "recv": r, "count": count, "dtype": dtype, "redop": redop, "root": sp.root,
                     "stream": stream}
            getattr(c, method)(*(given[a] for a in args.split()))

    def _async_failure(self, what: str) -> CollectiveError | None:
        if self._comm is None:
            return self._aborted_error(what) if self._aborted is not None else None
        try:
            self._comm.check_async_error()
        except Exception as exc:  # noqa: BLE001 - cupy's NcclError
            return CollectiveError(f"{what} (group {self.label}) failed: NCCL: {exc}")
        return None

    def exchange(self, obj: Any) -> list[Any]:
        return self._boot.exchange(obj)

    def sub(self, ranks: list[int], tag: str, label: str) -> Transport:
        boot = self._boot.sub(ranks, tag, label)
        return NcclTransport(self.device, boot.rank, boot.size, "", label, nccl=self.nccl, boot=boot,
                             timeout=self._own_timeout)

    def abort(self, reason: str) -> None:
        with self._lock:
            comm = self._comm
            if comm is not None:
                self._fail_pending(reason)
                self._comm = None
        if comm is not None:
            comm.abort()
        self._boot.abort(reason)

    def close(self) -> None:
        try:
            if self._comm is not None:
                self._settle_pending()        # (the watchdog may abort it meanwhile)
            with self._lock:
                comm, self._comm = self._comm, None
            if comm is not None:
                comm.destroy()
        finally:
            self._comm = None
            self._boot.close()


# ---------------------------------------------------------------------------------------------
# the watchdog
# ---------------------------------------------------------------------------------------------

#: the native transports of this process whose ops have a deadline
_watched: weakref.WeakSet[_Outcomes] = weakref.WeakSet()
_watcher: threading.Thread | None = None
_watcher_lock = threading.Lock()


def _watch(transport: _Outcomes) -> None:
    """Put ``transport`` under the watchdog (started with the first one)."""
    global _watcher
    with _watcher_lock:
        _watched.add(transport)
        if _watcher is None:
            _watcher = threading.Thread(target=_watchdog, name="anychip collective watchdog", daemon=True)
            _watcher.start()


def _watchdog() -> None:
    """Every tenth of the shortest timeout (at most every second), each watched transport
    fails its Works that are past their deadline (:meth:`_Outcomes._expire`)."""
    while True:
        with _watcher_lock:
            period = min([1.0, *(t._timeout / 10 for t in _watched)])
        time.sleep(period)                    # (holding no transport: a dropped one goes meanwhile)
        _look(time.monotonic())


def _look(now: float) -> None:
    with _watcher_lock:
        transports = list(_watched)
    for t in transports:
        try:
            t._expire(now)
        except Exception as exc:  # noqa: BLE001 - a failed abort must not end the watchdog
            _log.warning("anychip: collective watchdog: %s", exc)


def _end_process(message: str) -> None:
    """What ProcessGroupNCCL's watchdog does with TORCH_NCCL_ASYNC_ERROR_HANDLING: say why on
    stderr and end the process, whose threads may be stuck in waits for the device."""
    try:
        sys.stderr.write(f"anychip: {message}\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(1)


def _forget_watchdog_in_child() -> None:
    global _watcher, _watcher_lock
    _watcher = None                       # a forked child has no watchdog thread (nor its parent's ranks)
    _watcher_lock = threading.Lock()      # (the thread may have held it at the fork)
    _watched.clear()


os.register_at_fork(after_in_child=_forget_watchdog_in_child)


# ---------------------------------------------------------------------------------------------
# what the plugin gives
# ---------------------------------------------------------------------------------------------

def why_no_library(plugin: Any, lib: Any) -> str:
    """Why ``lib`` (what ``plugin.native_ccl()`` gave) drives no native transport."""
    if lib is None:
        return str(plugin.native_ccl_problem())
    return f"{plugin.name}'s native_ccl() gave a {type(lib).__name__}, neither a NativeLibrary nor cupy.cuda.nccl"


def native_library(device: Device) -> tuple[NativeLibrary | None, str]:
    """The :class:`NativeLibrary` ``device``'s plugin gives through ``native_ccl()``, or
    (None, why not)."""
    lib = device.plugin.native_ccl()
    if isinstance(lib, NativeLibrary):
        return lib, ""
    return None, why_no_library(device.plugin, lib)
