"""A Paddle plugin's events (``C_Event``), timed with stream callbacks."""
from __future__ import annotations

import time
from typing import Any

from ...runtime.errors import DeviceError, InvalidArgumentError
from .loader import ffi
from .stream import PaddleStreams

__all__ = ["PaddleEvents"]


class _Mark:
    __slots__ = ("ns", "handle")

    def __init__(self) -> None:
        self.ns: int | None = None
        self.handle: Any = None


class _Event:
    __slots__ = ("raw", "timed", "mark")

    def __init__(self, raw: Any, timed: bool) -> None:
        self.raw, self.timed = raw, timed
        self.mark: _Mark | None = None


_callback: Any = None


def _timing_callback() -> Any:
    """The C_Callback that stamps a timed event's mark (run on the plugin's stream)."""
    global _callback
    if _callback is None:
        f = ffi()

        @f.callback("void(C_Device, C_Stream, void *, C_Status *)")
        def stamp(device: Any, stream: Any, user_data: Any, status: Any) -> None:
            f.from_handle(user_data).ns = time.perf_counter_ns()
            if status != f.NULL:
                status[0] = 0
        _callback = stamp
    return _callback



class PaddleEvents(PaddleStreams):
    """Events of a plugin's devices."""

    # -- events -----------------------------------------------------------------------------
    def _new_event(self, index: int, timed: bool) -> _Event:
        self._use(index)
        out = self.ffi.new("C_Event *")
        self._call("create_event", self._dev(index), out)
        return _Event(out[0], timed)

    def _event_create(self, index: int) -> Any:
        return self._new_event(index, True)

    def _event_create_untimed(self, index: int) -> Any:
        return self._new_event(index, False)

    def _event_destroy(self, index: int, event: Any) -> None:
        self._use(index)
        self._call("destroy_event", self._dev(index), event.raw)

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._use(index)
        dev = self._dev(index)
        if event.timed:
            mark = _Mark()
            if self._has("stream_add_callback"):
                # the stamp runs on the stream just before the event's point: when the event
                # has completed, the stamp has been taken
                mark.handle = self.ffi.new_handle(mark)
                self._call("stream_add_callback", dev, stream.raw, _timing_callback(), mark.handle)
            else:
                # fallback: drain the stream, then stamp (the time of the work before the point)
                self._call("synchronize_stream", dev, stream.raw)
                mark.ns = time.perf_counter_ns()
            event.mark = mark
        self._call("record_event", dev, stream.raw, event.raw)

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._use(index)
        self._call("synchronize_event", self._dev(index), event.raw)

    def _event_query(self, index: int, event: Any) -> bool:
        self._use(index)
        if not self._has("query_event"):
            self._event_synchronize(index, event)
            return True
        return bool(self.iface.query_event(self._dev(index), event.raw) == 0)

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        for ev in (start, end):
            if not ev.timed:
                raise InvalidArgumentError("elapsed_ms needs timed events")
            self._event_synchronize(index, ev)
        a, b = start.mark, end.mark
        if a is None or b is None or a.ns is None or b.ns is None:
            raise DeviceError("the plugin completed an event without running the stream callback queued before "
                              "it", backend=self.name)
        return (b.ns - a.ns) / 1e6

    def _synchronize(self, index: int) -> None:
        self._use(index)
        if self._has("synchronize_device"):
            self._call("synchronize_device", self._dev(index))
            return
        with self._lock:
            streams = list(self._streams.get(index, ()))
        for s in streams:
            self._call("synchronize_stream", self._dev(index), s.raw)

