"""CUDA streams: CuPy streams (the legacy default stream, or non-blocking ones)."""
from __future__ import annotations

from functools import partial
from typing import Any

from .device import CUDADevice

__all__ = ["CUDAStreams"]


class _CudaStream:
    """A stream handle: the CuPy stream and the device it belongs to."""

    __slots__ = ("cupy_stream", "index", "ptr")

    def __init__(self, cupy_stream: Any, index: int) -> None:
        self.cupy_stream = cupy_stream
        self.index = index
        self.ptr = int(cupy_stream.ptr)

    def __repr__(self) -> str:
        return f"<cuda stream 0x{self.ptr:x} of device {self.index}>"



class CUDAStreams(CUDADevice):
    """Streams of the CUDA devices."""

    # ------------------------------------------------------------------ streams
    def _default_stream(self, index: int) -> Any:
        s = self._defaults.get(index)
        if s is None:
            self._ready()
            s = self._defaults.setdefault(index, _CudaStream(self._cupy.cuda.Stream.null, index))
        return s

    def _stream_create(self, index: int) -> Any:
        self._ready()
        cs = self._call(index, "cudaStreamCreateWithFlags", partial(self._cupy.cuda.Stream, non_blocking=True))
        return _CudaStream(cs, index)

    def _stream_destroy(self, index: int, stream: Any) -> None:
        if stream is self._defaults.get(index):
            return
        self._stream_synchronize(index, stream)
        stream.cupy_stream = None  # CuPy destroys the stream when the object goes

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        self._call(index, "cudaStreamSynchronize", stream.cupy_stream.synchronize)

    def _stream_query(self, index: int, stream: Any) -> bool:
        return self._query(index, "cudaStreamQuery", self._rt.streamQuery, stream.ptr)

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        self._call(index, "cudaStreamWaitEvent", stream.cupy_stream.wait_event, event)

