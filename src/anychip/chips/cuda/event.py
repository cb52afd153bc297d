"""CUDA events: CuPy events, timed or not."""
from __future__ import annotations

from functools import partial
from typing import Any

from .stream import CUDAStreams

__all__ = ["CUDAEvents"]


class CUDAEvents(CUDAStreams):
    """Events of the CUDA devices."""

    # ------------------------------------------------------------------ events
    def _event_create(self, index: int) -> Any:
        self._ready()
        return self._call(index, "cudaEventCreate", self._cupy.cuda.Event)

    def _event_create_untimed(self, index: int) -> Any:
        """An event without timing (``cudaEventDisableTiming``), cheaper to record and
        query: what the caching allocator needs for stream-ordered reuse."""
        self._ready()
        return self._call(index, "cudaEventCreateWithFlags", partial(self._cupy.cuda.Event, disable_timing=True))

    def _event_destroy(self, index: int, event: Any) -> None:
        pass  # CuPy destroys the event when the object goes

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        self._call(index, "cudaEventRecord", event.record, stream.cupy_stream)

    def _event_synchronize(self, index: int, event: Any) -> None:
        self._call(index, "cudaEventSynchronize", event.synchronize)

    def _event_query(self, index: int, event: Any) -> bool:
        return self._query(index, "cudaEventQuery", self._rt.eventQuery, event.ptr)

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        return float(self._call(index, "cudaEventElapsedTime", self._cupy.cuda.get_elapsed_time, start, end))

