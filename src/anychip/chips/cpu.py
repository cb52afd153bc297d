"""The host CPU as a device: real host memory, always available.

It is the reference every other backend is compared against. Work runs
synchronously in the calling thread, so a stream is always idle and an event
completes when it is recorded (as PyTorch's CPU device). Handles are NumPy
``uint8`` arrays owning the memory.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Any

import numpy as np

from ..runtime.errors import DeviceError, OutOfMemoryError
from ..runtime.plugin import D2D, D2H, H2D, DevicePlugin

__all__ = ["CPUPlugin"]


class _Stream:
    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id


class _Event:
    __slots__ = ("t_ns",)

    def __init__(self) -> None:
        self.t_ns: int | None = None


def _meminfo() -> tuple[int, int]:
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.count(":") == 1}
        return fields.get("MemAvailable", fields["MemFree"]), fields["MemTotal"]
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return free, total


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CPUPlugin(DevicePlugin):
    name = "cpu"
    api_version = (1, 0)
    priority = 0
    accelerator = False

    def __init__(self) -> None:
        self._default = _Stream(0)
        self._next_stream = 1
        self._live: set[int] = set()       # id() of every allocation not freed yet

    def available(self) -> tuple[bool, str]:
        return True, "host memory"

    def device_count(self) -> int:
        return 1

    def properties(self, index: int) -> dict:
        free, total = _meminfo()
        return {"name": _cpu_name(), "total_memory": total, "cores": os.cpu_count(),
                "machine": platform.machine(), "simulated": False}

    # -- memory ---------------------------------------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        try:
            arr = np.empty(max(nbytes, 1), dtype=np.uint8)
        except MemoryError:
            free, total = _meminfo()
            raise OutOfMemoryError(nbytes, free, total, backend="cpu", device="cpu:0",
                                   detail="the host refused the allocation") from None
        self._live.add(id(arr))
        return arr

    def _free(self, index: int, handle: Any) -> None:
        if not isinstance(handle, np.ndarray):
            raise DeviceError(f"free of something that is not a cpu allocation: {handle!r}", backend="cpu")
        try:
            self._live.remove(id(handle))
        except KeyError:
            raise DeviceError(f"free of a cpu allocation of {handle.nbytes} bytes that is not live (freed already?)",
                              backend="cpu") from None
        # the memory goes back to the host when the last reference to the array goes

    def _mem_info(self, index: int) -> tuple[int, int]:
        return _meminfo()

    def _pointer(self, handle: Any, offset: int) -> int:
        return handle.ctypes.data + offset

    # -- copies ---------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        if kind not in (H2D, D2H, D2D):
            raise DeviceError(f"unknown copy kind {kind!r}", backend="cpu")
        dst[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        dst[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        dst[dst_off:dst_off + nbytes] = value

    # -- streams and events --------------------------------------------
    def _default_stream(self, index: int) -> Any:
        return self._default

    def _stream_create(self, index: int) -> Any:
        self._next_stream += 1
        return _Stream(self._next_stream)

    def _stream_destroy(self, index: int, stream: Any) -> None:
        pass

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        pass

    def _stream_query(self, index: int, stream: Any) -> bool:
        return True

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        pass

    def _event_create(self, index: int) -> Any:
        return _Event()

    def _event_destroy(self, index: int, event: Any) -> None:
        pass

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        event.t_ns = time.perf_counter_ns()

    def _event_synchronize(self, index: int, event: Any) -> None:
        pass

    def _event_query(self, index: int, event: Any) -> bool:
        return True

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        if start.t_ns is None or end.t_ns is None:
            raise DeviceError("elapsed time of an event that was never recorded", backend="cpu")
        return (end.t_ns - start.t_ns) / 1e6

    def _synchronize(self, index: int) -> None:
        pass
