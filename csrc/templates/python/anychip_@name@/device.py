"""The @name@ device as an anychip backend (a DevicePlugin subclass).

As generated, "device memory" is host memory, but everything else behaves as a chip:
* memory: a capacity per device (``@NAME@_MEMORY_MB``, default 1024) and a table of live
  allocations: running out is an OutOfMemoryError, freeing a bad handle a DeviceError;
* streams: one worker thread each, running queued copies, fills, event records and event
  waits in order, so work really is asynchronous;
* events: a recorded generation and a completion timestamp.
Devices: ``@NAME@_DEVICES`` (default 4).

The methods marked DRIVER are the ones to replace with calls into your chip's runtime
(README.md lists them). Collectives: the host transport serves (``native_ccl`` returns None).
"""
from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from anychip import DeviceError, DevicePlugin, OutOfMemoryError
from anychip.runtime.plugin import D2D, D2H, H2D

__all__ = ["@Name@Plugin"]


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    try:
        value = int(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if lo <= value <= hi else default


class _Stream:
    """A queue of work run in order by one worker thread."""

    def __init__(self, device: int) -> None:
        self.device = device
        self._cond = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._enqueued = self._completed = 0
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"@name@-stream-{device}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    return
                fn = self._queue[0]
            try:
                fn()                                  # DRIVER: what the chip does per command
            except BaseException as exc:  # noqa: BLE001 - reported by the next synchronize
                self._error = exc
            with self._cond:
                self._queue.popleft()
                self._completed += 1
                self._cond.notify_all()

    def enqueue(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._queue.append(fn)
            self._enqueued += 1
            self._cond.notify_all()

    def synchronize(self) -> None:
        with self._cond:
            target = self._enqueued
            while self._completed < target:
                self._cond.wait()
        err, self._error = self._error, None
        if err is not None:
            raise DeviceError(f"work on a stream of @name@:{self.device} failed: {err}", backend="@name@")

    def idle(self) -> bool:
        with self._cond:
            return self._completed == self._enqueued

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


class _Event:
    def __init__(self, device: int) -> None:
        self.device = device
        self.cond = threading.Condition()
        self.recorded = 0            # generation of the last record
        self.completed = 0           # generation the stream has reached
        self.when_ns = 0             # when the last completed record ran

    def complete(self, generation: int) -> None:
        with self.cond:
            if generation > self.completed:
                self.completed = generation
                self.when_ns = time.perf_counter_ns()
            self.cond.notify_all()

    def wait(self, generation: int) -> None:
        with self.cond:
            while self.completed < generation:
                self.cond.wait()


class _Memory:
    """One device's memory: a capacity and the live allocations (handle -> array)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.lock = threading.Lock()
        self.live: dict[int, np.ndarray] = {}


class @Name@Plugin(DevicePlugin):
    name = "@name@"
    api_version = (1, 0)
    simulated = True                 # a host-memory stand-in: set False once calls reach the chip

    def __init__(self) -> None:
        self._count = _env_int("@NAME@_DEVICES", 4, 0, 64)         # DRIVER: count the chips
        capacity = _env_int("@NAME@_MEMORY_MB", 1024, 1, 1 << 20) << 20
        self._mem = [_Memory(capacity) for _ in range(self._count)]
        self._lock = threading.Lock()
        self._defaults: dict[int, _Stream] = {}
        self._streams: dict[int, set[_Stream]] = {}

    # -- identity -------------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        return True, f"@name@ plugin (Python, host memory); {self._count} device(s)"

    def device_count(self) -> int:
        return self._count

    def properties(self, index: int) -> dict:
        return {"name": f"@name@ device {index} (host memory)", "total_memory": self._mem[index].capacity}

    # -- memory (DRIVER: the chip's malloc / free / memory query) --------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        mem = self._mem[index]
        size = max(256, (nbytes + 255) & ~255)
        with mem.lock:
            if size > mem.capacity - mem.used:
                raise OutOfMemoryError(nbytes, mem.capacity - mem.used, mem.capacity, backend=self.name,
                                       device=f"{self.name}:{index}", detail="device memory is full")
            arr = np.empty(size, dtype=np.uint8)
            handle = arr.ctypes.data
            mem.live[handle] = arr
            mem.used += size
        return handle

    def _free(self, index: int, handle: Any) -> None:
        mem = self._mem[index]
        with mem.lock:
            arr = mem.live.pop(handle, None)
            if arr is None:
                raise DeviceError(f"free of {handle!r}, which is not a live allocation of {self.name}:{index}",
                                  backend=self.name)
            mem.used -= arr.size

    def _mem_info(self, index: int) -> tuple[int, int]:
        mem = self._mem[index]
        with mem.lock:
            return mem.capacity - mem.used, mem.capacity

    def _pointer(self, handle: Any, offset: int) -> int:
        return handle + offset

    def _array(self, index: int, handle: Any) -> np.ndarray:
        mem = self._mem[index]
        with mem.lock:
            arr = mem.live.get(handle)
        if arr is None:
            raise DeviceError(f"{handle!r} is not a live allocation of {self.name}:{index}", backend=self.name)
        return arr

    # -- copies (DRIVER: the chip's asynchronous memcpy / memset) ------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        if kind == H2D:
            d, s = self._array(index, dst), src
        elif kind == D2H:
            d, s = dst, self._array(index, src)
        elif kind == D2D:
            d, s = self._array(index, dst), self._array(index, src)
        else:
            raise DeviceError(f"unknown copy kind {kind!r}", backend=self.name)

        def run() -> None:
            d[dst_off:dst_off + nbytes] = s[src_off:src_off + nbytes]
        stream.enqueue(run)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        d = self._array(index, dst)

        def run() -> None:
            d[dst_off:dst_off + nbytes] = value
        stream.enqueue(run)

    # -- streams (DRIVER: the chip's queues) ------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        with self._lock:
            s = self._defaults.get(index)
            if s is None:
                s = self._defaults[index] = _Stream(index)
            return s

    def _stream_create(self, index: int) -> Any:
        s = _Stream(index)
        with self._lock:
            self._streams.setdefault(index, set()).add(s)
        return s

    def _stream_destroy(self, index: int, stream: Any) -> None:
        with self._lock:
            self._streams.get(index, set()).discard(stream)
        stream.close()

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        stream.synchronize()

    def _stream_query(self, index: int, stream: Any) -> bool:
        return bool(stream.idle())

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        generation = event.recorded
        if generation:
            stream.enqueue(lambda: event.wait(generation))

    # -- events (DRIVER: the chip's events) --------------------------------------------------
    def _event_create(self, index: int) -> Any:
        return _Event(index)

    def _event_destroy(self, index: int, event: Any) -> None:
        pass

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        with event.cond:
            event.recorded += 1
            generation = event.recorded
        stream.enqueue(lambda: event.complete(generation))

    def _event_synchronize(self, index: int, event: Any) -> None:
        event.wait(event.recorded)

    def _event_query(self, index: int, event: Any) -> bool:
        with event.cond:
            return bool(event.completed >= event.recorded)

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        for ev in (start, end):
            if not ev.recorded:
                raise DeviceError("elapsed time of an event that was never recorded", backend=self.name)
            if ev.completed < ev.recorded:
                raise DeviceError("elapsed time of an event that has not completed", backend=self.name)
        return float((end.when_ns - start.when_ns) / 1e6)

    def _synchronize(self, index: int) -> None:
        with self._lock:
            streams = [*(s for s in (self._defaults.get(index),) if s is not None), *self._streams.get(index, ())]
        for s in streams:
            s.synchronize()

    def _after_fork_in_child(self) -> None:
        # the worker threads stayed in the parent: the child starts with fresh streams
        self._lock = threading.Lock()
        self._defaults, self._streams = {}, {}
