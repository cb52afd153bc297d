"""Device work that provably takes a while (the conformance cases' held streams)."""
from __future__ import annotations

import math
import time
from typing import Any


class Busy:
    """Device work that provably takes a while: memsets of a scratch buffer queued on a stream.

    The time of one memset is measured first (the fastest of four rounds, queued back to
    back); ``hold`` queues enough of them that, even at four times that speed, they take
    ``seconds``. Until
    then the stream cannot be done, an event recorded after them cannot have completed, and a
    stream waiting for that event cannot have moved. (The device API has no host function a test
    could block a stream with; this needs nothing beyond memset.)"""

    def __init__(self, dev: Any, ranks_per_device: int) -> None:
        import anychip
        self.dev = dev
        _, total = dev.mem_info()
        cap = max(1 << 20, min(1 << 30, total // (16 * max(1, ranks_per_device))))
        nbytes = min(16 << 20, cap)
        stream = anychip.Stream(dev)
        while True:
            self.buf = dev.alloc(nbytes)
            self.per = min(self._measure(stream) for _ in range(4))
            if self.per >= 1e-3 or nbytes * 4 > cap:
                break
            self.buf.free()
            nbytes *= 4
        stream.destroy()
        self.value = 0

    def _measure(self, stream: Any) -> float:
        t = time.perf_counter()
        for v in (1, 2):
            self.buf.memset(v, stream=stream)
        stream.synchronize()
        return (time.perf_counter() - t) / 2

    @classmethod
    def of(cls, dev: Any, ranks_per_device: int) -> Busy:
        """The device's one scratch buffer and its measured speed (made on first use, kept)."""
        if dev.name not in _BUSY:
            _BUSY[dev.name] = cls(dev, ranks_per_device)
        return _BUSY[dev.name]

    def hold(self, stream: Any, seconds: float = 0.03) -> tuple[float, float]:
        """Queue the work on ``stream``; (when the first memset was queued, the least seconds
        the queued work takes)."""
        k = max(4, min(40_000, math.ceil(4 * seconds / max(self.per, 1e-7))))
        t0 = time.perf_counter()
        for _ in range(k):
            self.value = self.value % 250 + 1
            self.buf.memset(self.value, stream=stream)
        return t0, k * self.per / 4



_BUSY: dict[str, Busy] = {}
