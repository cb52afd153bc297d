"""OpenCL events: markers on a command queue, waited on with barriers and timed by profiling."""
from __future__ import annotations

from typing import Any

from ...runtime.errors import DeviceError
from .device import cl_code_name
from .stream import OpenCLStreams, _Stream

__all__ = ["OpenCLEvents"]

class _Event:
    """An event handle: the marker of its last ``record`` (None before the first)."""

    __slots__ = ("index", "marker", "stream")

    def __init__(self, index: int) -> None:
        self.index = index
        self.marker: Any = None
        self.stream: _Stream | None = None

    def __repr__(self) -> str:
        return f"<opencl event of device {self.index}{' (unrecorded)' if self.marker is None else ''}>"




class OpenCLEvents(OpenCLStreams):
    """Events of the OpenCL devices."""

    # ------------------------------------------------------------------ events
    def _event_create(self, index: int) -> Any:
        return _Event(index)

    def _event_destroy(self, index: int, event: Any) -> None:
        event.marker = None
        event.stream = None

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        with self._translate("clEnqueueMarkerWithWaitList", index):
            marker = self._cl.enqueue_marker(stream.queue)
        event.marker = marker
        event.stream = stream
        self._after_enqueue(stream, marker)

    def _event_synchronize(self, index: int, event: Any) -> None:
        if event.marker is None:
            return
        with self._translate("clWaitForEvents", index):
            self._wait_for(event.marker)
            event.marker.wait()

    def _event_query(self, index: int, event: Any) -> bool:
        if event.marker is None:
            return True
        with self._translate("clGetEventInfo", index):
            status = event.marker.command_execution_status
        if status < 0:
            raise DeviceError(f"an event of opencl:{index} completed with an error", backend=self.name,
                              code=status, code_name=cl_code_name(status))
        return status == self._cl.command_execution_status.COMPLETE

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        if start.marker is None or end.marker is None:
            raise DeviceError("elapsed time needs two recorded events", backend=self.name)
        if not (self._event_query(index, start) and self._event_query(index, end)):
            raise DeviceError("elapsed time of events that have not completed", backend=self.name,
                              code=-7, code_name="CL_PROFILING_INFO_NOT_AVAILABLE")
        with self._translate("clGetEventProfilingInfo", index):
            return (end.marker.profile.end - start.marker.profile.end) / 1e6

    def _synchronize(self, index: int) -> None:
        st = self._state(index)
        for s in list(st.streams):
            if s.queue is not None:
                self._stream_synchronize(index, s)

