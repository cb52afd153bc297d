"""OpenCL streams: in-order, profiling command queues, and the waits on them."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from typing import Any

from ...runtime.errors import DeviceError
from .device import OpenCLDevice, cl_code_name

__all__ = ["OpenCLStreams"]

_wait_lib: list[Any] = []      # [clWaitForEvents of the loaded ICD loader, or None]


def _open_wait(names: list[str]) -> Any:
    for name in names:
        try:
            fn = ctypes.CDLL(name).clWaitForEvents
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = ctypes.c_int32
        return fn
    return None


def _cl_wait_for_events() -> Any:
    """clWaitForEvents of the OpenCL ICD loader pyopencl uses (its wheels bundle one
    under pyopencl/.libs), through ctypes, which releases the GIL during the call and
    takes it back in plain C; None when no loader can be opened."""
    if not _wait_lib:
        import glob

        import pyopencl

        libs = sorted(glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*")))
        fn = _open_wait(libs + ["libOpenCL.so.1"])
        if fn is None:    # find_library runs ldconfig in a child: only where nothing else opened
            found = ctypes.util.find_library("OpenCL")
            fn = _open_wait([found] if found else [])
        _wait_lib.append(fn)
    return _wait_lib[0]



class _Stream:
    """A stream handle: an in-order, profiling command queue of one device.

    ``last`` is the event of the most recent command (for ``query``);
    ``pending`` holds the ``NannyEvent``s of host copies not yet known complete.
    """

    __slots__ = ("__weakref__", "index", "last", "lock", "pending", "queue")

    def __init__(self, queue: Any, index: int) -> None:
        self.queue = queue
        self.index = index
        self.last: Any = None
        self.pending: list[Any] = []
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<opencl stream of device {self.index}>"




class OpenCLStreams(OpenCLDevice):
    """Streams (command queues) of the OpenCL devices."""

    def _after_enqueue(self, stream: _Stream, event: Any, nanny: bool = False) -> None:
        stream.last = event
        if nanny:
            pending = stream.pending
            pending.append(event)  # list.append is atomic; only pruning takes the lock
            if len(pending) % 64 == 0:
                with stream.lock:
                    self._prune(stream)
        stream.queue.flush()

    def _prune(self, stream: _Stream) -> None:
        """Drop NannyEvents already complete (the caller holds ``stream.lock``)."""
        complete = self._cl.command_execution_status.COMPLETE
        pending = stream.pending
        if pending and pending[-1].command_execution_status == complete:
            pending.clear()
            return
        done = 0
        for ev in pending:
            if ev.command_execution_status != complete:
                break
            done += 1
        del pending[:done]

    def _new_stream(self, index: int) -> _Stream:
        cl = self._cl
        ctx = self._context(index)
        st = self._state(index)
        with self._translate("clCreateCommandQueue", index):
            q = cl.CommandQueue(ctx, st.device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        s = _Stream(q, index)
        st.streams.add(s)
        return s

    # ------------------------------------------------------------------ memory
    # ------------------------------------------------------------------ streams
    def _default_stream(self, index: int) -> Any:
        st = self._state(index)
        if st.default is None:
            s = self._new_stream(index)
            with st.lock:
                if st.default is None:
                    st.default = s
        return st.default

    def _stream_create(self, index: int) -> Any:
        return self._new_stream(index)

    def _stream_destroy(self, index: int, stream: Any) -> None:
        if stream is self._state(index).default:
            return
        self._stream_synchronize(index, stream)
        self._state(index).streams.discard(stream)
        stream.queue = None

    def _wait_for(self, event: Any) -> None:
        """Return once ``event`` is complete (or failed). clFinish / clWaitForEvents
        cannot be interrupted, so this polls the event while yielding the CPU for up to
        100 us (a short copy completes within that), then waits in 50 ms slices for a
        helper thread blocked in clWaitForEvents, so that Ctrl-C raises KeyboardInterrupt
        even when the event never completes."""
        until = time.perf_counter() + 1e-4
        while event.command_execution_status > 0:        # queued, submitted or running
            if time.perf_counter() > until:
                self._wait_blocking(event)
                return
            os.sched_yield()

    @staticmethod
    def _wait_blocking(event: Any) -> None:
        # Not pyopencl's Event.set_callback: it calls back on a detached C++ thread that
        # takes the GIL, and one left waiting by Ctrl-C whose event completed while the
        # interpreter was finalizing aborted the process ("terminate called without an
        # active exception"). A daemon thread in a ctypes call is ended cleanly there.
        wait = _cl_wait_for_events()
        if wait is None:                   # no loader to call: poll
            while event.command_execution_status > 0:
                time.sleep(5e-4)
            return
        done = threading.Event()
        handle = ctypes.c_void_p(event.int_ptr)

        def waiter(keep: Any = event) -> None:    # keep: the event outlives the wait
            wait(1, ctypes.byref(handle))
            done.set()

        threading.Thread(target=waiter, name="anychip-opencl-wait", daemon=True).start()
        while not done.wait(0.05):     # Ctrl-C leaves the thread waiting; it ends with the work
            pass

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        last = stream.last
        try:
            if last is not None:
                self._wait_for(last)
            stream.queue.finish()
        except self._cl.Error as exc:
            raise self._convert(exc, "clFinish", index, None) from exc
        stream.pending.clear()  # every NannyEvent is complete now; dropping them does not block
        if stream.last is not None:
            self._check_last(index, stream)

    def _check_last(self, index: int, stream: _Stream) -> None:
        last = stream.last
        if last is not None:
            status = last.command_execution_status
            if status < 0:
                raise DeviceError(f"a command on a stream of opencl:{index} failed", backend=self.name,
                                  code=status, code_name=cl_code_name(status))

    def _stream_query(self, index: int, stream: Any) -> bool:
        last = stream.last
        if last is None:
            return True
        with self._translate("clGetEventInfo", index):
            status = last.command_execution_status  # every enqueue was already flushed
        if status < 0:
            self._check_last(index, stream)
        if status == self._cl.command_execution_status.COMPLETE:
            with stream.lock:
                if stream.last is last:
                    stream.pending.clear()
                else:
                    self._prune(stream)
            return True
        return False

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        if event.marker is None:
            return
        with self._translate("clEnqueueBarrierWithWaitList", index):
            ev = self._cl.enqueue_barrier(stream.queue, wait_for=[event.marker])
        self._after_enqueue(stream, ev)

    # ------------------------------------------------------------------ events
