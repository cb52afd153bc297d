"""A Paddle plugin's streams (``C_Stream``)."""
from __future__ import annotations

from typing import Any

from .device import PaddleDevice

__all__ = ["PaddleStreams"]


class _Stream:
    __slots__ = ("raw", "index", "__weakref__")

    def __init__(self, raw: Any, index: int) -> None:
        self.raw, self.index = raw, index



class PaddleStreams(PaddleDevice):
    """Streams of a plugin's devices."""

    # -- streams ----------------------------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        s = self._defaults.get(index)
        if s is None:
            s = self._defaults[index] = self._stream_create(index)
        return s

    def _stream_create(self, index: int) -> Any:
        self._use(index)
        out = self.ffi.new("C_Stream *")
        self._call("create_stream", self._dev(index), out)
        s = _Stream(out[0], index)
        with self._lock:
            self._streams.setdefault(index, set()).add(s)
        return s

    def _stream_destroy(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call("destroy_stream", self._dev(index), stream.raw)
        with self._lock:
            self._streams.get(index, set()).discard(stream)

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._use(index)
        self._call("synchronize_stream", self._dev(index), stream.raw)

    def _stream_query(self, index: int, stream: Any) -> bool:
        self._use(index)
        if not self._has("query_stream"):       # Paddle's fallback: synchronize, then done
            self._stream_synchronize(index, stream)
            return True
        return bool(self.iface.query_stream(self._dev(index), stream.raw) == 0)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._use(index)
        self._call("stream_wait_event", self._dev(index), stream.raw, event.raw)

