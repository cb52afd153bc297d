"""Streams and events: the ordering primitives of every backend.

A ``Stream`` is an in-order queue of device work (copies, memsets, kernels,
collectives); an ``Event`` marks a point in a stream. Both wrap a raw handle of
the device's backend; all checks happen here, once.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .device import Device

__all__ = ["Stream", "Event", "current_stream"]

#: host memory a stream keeps alive for enqueued copies before enqueuing waits for it
_KEEP_LIMIT_BYTES = 256 << 20


class _State(threading.local):
    """Per-thread current device and current stream of each device."""

    def __init__(self) -> None:
        self.device: Device | None = None
        self.device_stack: list = []
        self.streams: dict = {}        # Device -> Stream
        self.stream_stack: list = []


_tls = _State()


def _no_front_end(device: Any) -> Device:
    raise RuntimeError("anychip.runtime.device is not loaded: import anychip first")


#: None, a name or a Device -> the Device (None: the current device). Streams sit below the
#: device front end, which installs its lookup here (runtime/device.py: set_device_lookup)
_resolve_device: Callable[[Any], Device] = _no_front_end


def set_device_lookup(lookup: Callable[[Any], Device]) -> None:
    """Install the front end's device lookup (called once, by anychip.runtime.device)."""
    global _resolve_device
    _resolve_device = lookup


class Stream:
    """An in-order queue of work on one device.

    ``Stream(device)`` creates a new stream; ``device.default_stream`` is the one
    used when no stream is given. ``with stream:`` makes it the current stream
    (and its device the current device) on this thread.
    """

    # Host memory used by enqueued copies is kept alive per op: each kept object is
    # tagged with its op's position in the stream (_seq counts the objects kept), and is
    # released only once work up to that position is known complete: by a synchronize
    # or query that began after it was enqueued, or by an event recorded after it.
    # Objects of ops enqueued later (say by another thread) are never released early.
    __slots__ = ("device", "_handle", "_keep", "_seq", "_kept_bytes", "_keep_lock", "_default", "_destroyed",
                 "__weakref__")

    def __init__(self, device: Any = None) -> None:
        dev = _resolve_device(device)
        self.device = dev
        self._init_keep(False)
        self._handle = dev.plugin._stream_create(dev.index)
        dev._streams.add(self)

    @classmethod
    def _wrap_default(cls, dev: Device) -> Stream:
        s = cls.__new__(cls)
        s.device = dev
        s._init_keep(True)
        s._handle = dev.plugin._default_stream(dev.index)
        dev._streams.add(s)
        return s

    def _init_keep(self, default: bool) -> None:
        self._default = default
        self._destroyed = False
        self._keep: deque = deque()     # (position, host object), in position order
        self._seq = 0                   # position of the next kept object
        self._kept_bytes = 0
        self._keep_lock = threading.Lock()

    # -- checks ---------------------------------------------------------
    def _live(self) -> Any:
        if self._destroyed:
            raise InvalidArgumentError(f"{self!r} was destroyed; create a new anychip.Stream")
        return self._handle

    # -- operations -----------------------------------------------------
    def synchronize(self) -> None:
        """Wait until all work enqueued on this stream is done. Ctrl-C interrupts the
        wait (KeyboardInterrupt) on every backend; the work itself goes on."""
        dev = self.device
        upto = self._seq
        dev.plugin._stream_synchronize(dev.index, self._live())
        if self._keep:
            self._release(upto)

    def query(self) -> bool:
        """True when all work enqueued on this stream is done (never blocks)."""
        dev = self.device
        upto = self._seq
        done = bool(dev.plugin._stream_query(dev.index, self._live()))
        if done and self._keep:
            self._release(upto)
        return done

    def wait_event(self, event: Event) -> None:
        """Make work enqueued on this stream from now on wait for ``event``."""
        if not isinstance(event, Event):
            raise InvalidArgumentError(f"wait_event expects an anychip.Event, got {type(event).__name__}")
        if event.device is not self.device:
            raise InvalidArgumentError(f"{event!r} belongs to {event.device}, this stream to {self.device}; "
                                       "cross-device waits need an event of the same device")
        if not event._recorded:
            return                      # as CUDA: waiting on a never-recorded event is a no-op
        dev = self.device
        dev.plugin._stream_wait_event(dev.index, self._live(), event._live())

    def wait_stream(self, other: Stream) -> None:
        """Make this stream wait for all work enqueued so far on ``other``."""
        self.wait_event(other.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one when None) on this stream and return it."""
        event = Event(self.device) if event is None else event
        event.record(self)
        return event

    def _keep_alive(self, obj: Any) -> None:
        """Hold a host object until the op just enqueued on this stream has completed.

        Host memory held this way is bounded: past _KEEP_LIMIT_BYTES the caller waits
        for the stream (as a CUDA copy to pageable memory waits), so a thread that only
        enqueues cannot pile up completed copies faster than they are released."""
        with self._keep_lock:
            self._keep.append((self._seq, obj))
            self._seq += 1
            self._kept_bytes += getattr(obj, "nbytes", 0)
            check = self._seq % 64 == 0
            full = self._kept_bytes > _KEEP_LIMIT_BYTES
        if full:
            self.synchronize()
        elif check:
            self.query()

    def _release(self, upto: int) -> None:
        """Let go of the host objects of ops before position ``upto`` (known complete)."""
        keep = self._keep
        with self._keep_lock:
            while keep and keep[0][0] < upto:
                self._kept_bytes -= getattr(keep.popleft()[1], "nbytes", 0)

    def destroy(self) -> None:
        """Wait for the stream's work, then release it. The memory the device's
        allocator cached for it becomes usable on every stream. The default stream
        cannot be destroyed."""
        if self._default:
            raise InvalidArgumentError("the default stream of a device cannot be destroyed")
        if self._destroyed:
            return
        dev = self.device
        dev.plugin._stream_synchronize(dev.index, self._handle)
        if dev._allocator is not None:
            dev._allocator.retire_stream(self)
        self._destroyed = True
        dev.plugin._stream_destroy(dev.index, self._handle)
        self._keep.clear()
        dev._streams.discard(self)

    # -- context manager ------------------------------------------------
    def __enter__(self) -> Stream:
        self._live()
        dev = self.device
        _tls.stream_stack.append((dev, _tls.streams.get(dev), _tls.device))
        _tls.streams[dev] = self
        _tls.device = dev
        return self

    def __exit__(self, *exc: Any) -> None:
        dev, previous, prev_device = _tls.stream_stack.pop()
        if previous is None:
            _tls.streams.pop(dev, None)
        else:
            _tls.streams[dev] = previous
        _tls.device = prev_device

    def __del__(self) -> None:
        try:
            if not self._default and not self._destroyed:
                self.destroy()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        kind = "default stream" if self._default else "stream"
        state = " (destroyed)" if self._destroyed else ""
        return f"<anychip {kind} of {self.device}{state}>"


def current_stream(device: Any = None) -> Stream:
    """The current stream of ``device`` (default: the current device) on this thread."""
    dev = _resolve_device(device)
    s = _tls.streams.get(dev)
    return s if s is not None else dev.default_stream


class Event:
    """A point in a stream: record it, wait for it, time between two of them."""

    __slots__ = ("device", "_handle", "_recorded", "_destroyed", "_point", "__weakref__")

    def __init__(self, device: Any = None) -> None:
        dev = _resolve_device(device)
        self.device = dev
        self._recorded = False
        self._destroyed = False
        self._point: tuple[Stream, int] | None = None   # (stream, keep position) of the last record
        self._handle = dev.plugin._event_create(dev.index)

    def _live(self) -> Any:
        if self._destroyed:
            raise InvalidArgumentError(f"{self!r} was destroyed")
        return self._handle

    def record(self, stream: Stream | None = None) -> Event:
        """Record on ``stream`` (default: the current stream of the event's device)."""
        dev = self.device
        if stream is None:
            stream = current_stream(dev)
        elif not isinstance(stream, Stream):
            raise InvalidArgumentError(f"record expects an anychip.Stream, got {type(stream).__name__}")
        elif stream.device is not dev:
            raise InvalidArgumentError(f"{self!r} cannot be recorded on {stream!r}: different devices")
        point = (stream, stream._seq)
        dev.plugin._event_record(dev.index, self._live(), stream._live())
        self._recorded = True
        self._point = point
        return self

    def _completed(self, point: tuple[Stream, int] | None) -> None:
        if point is not None and point[0]._keep:
            point[0]._release(point[1])

    def synchronize(self) -> None:
        """Wait until the work before the record point is done (no-op if never recorded).
        Ctrl-C interrupts the wait (KeyboardInterrupt) on every backend."""
        if self._recorded:
            point = self._point
            self.device.plugin._event_synchronize(self.device.index, self._live())
            self._completed(point)

    def _wait(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for the recorded work; True when it is done (a wait in
        slices, for a caller that must also notice something else meanwhile)."""
        if not self._recorded:
            return True
        point = self._point
        done = bool(self.device.plugin._event_wait(self.device.index, self._live(), seconds))
        if done:
            self._completed(point)
        return done

    def query(self) -> bool:
        """True when the recorded work is done (an event never recorded counts as done)."""
        if not self._recorded:
            return True
        point = self._point
        done = bool(self.device.plugin._event_query(self.device.index, self._live()))
        if done:
            self._completed(point)
        return done

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` (default: the current stream) wait for this event."""
        (stream if stream is not None else current_stream(self.device)).wait_event(self)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds between this event and ``end``; waits for ``end`` to complete."""
        if not isinstance(end, Event):
            raise InvalidArgumentError(f"elapsed_ms expects an anychip.Event, got {type(end).__name__}")
        if end.device is not self.device:
            raise InvalidArgumentError("elapsed_ms needs two events of the same device")
        if not (self._recorded and end._recorded):
            raise InvalidArgumentError("elapsed_ms needs both events recorded first (Event.record)")
        end.synchronize()
        self.synchronize()
        dev = self.device
        return float(dev.plugin._event_elapsed_ms(dev.index, self._live(), end._live()))

    def destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            self.device.plugin._event_destroy(self.device.index, self._handle)

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else ("recorded" if self._recorded else "not recorded")
        return f"<anychip event of {self.device} ({state})>"
