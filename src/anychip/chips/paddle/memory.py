"""A Paddle plugin's memory: device, pinned and unified allocations, copies and fills."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime._libs import copy_pointers
from ...runtime.errors import InvalidArgumentError, UnsupportedError
from .stream import PaddleStreams

__all__ = ["PaddleMemory"]


class _Owned(np.ndarray):
    """A uint8 array that keeps the plugin memory it views alive."""

    _owner: Any = None

    def __new__(cls, arr: np.ndarray, owner: Any) -> _Owned:
        obj = arr.view(cls)
        obj._owner = owner
        return obj



class PaddleMemory(PaddleStreams):
    """Allocations, copies and fills of a plugin's devices."""

    # -- memory -----------------------------------------------------------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        self._use(index)
        out = self.ffi.new("void **")
        n = max(nbytes, 1)
        rc = self.iface.device_memory_allocate(self._dev(index), out, n)
        if rc and rc != 1 or out[0] == self.ffi.NULL:
            what = "device_memory_allocate" if rc else "device_memory_allocate gave NULL"
            raise self.status.oom_error(rc, what, nbytes, f"{self.name}:{index}", lambda: self._mem_info(index))
        ptr = int(self.ffi.cast("uintptr_t", out[0]))
        with self._lock:
            self._sizes[ptr] = n
        return ptr

    def _free(self, index: int, handle: Any) -> None:
        self._use(index)
        with self._lock:
            size = self._sizes.pop(handle, 0)
        self._call("device_memory_deallocate", self._dev(index), self.ffi.cast("void *", handle), size)

    def _mem_info(self, index: int) -> tuple[int, int]:
        total, free = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        self._call("device_memory_stats", self._dev(index), total, free)
        return int(free[0]), int(total[0])

    def _pointer(self, handle: Any, offset: int) -> int:
        return int(handle) + offset

    def _host_alloc(self, entry: str, free_entry: str, nbytes: int, index: int) -> np.ndarray:
        if not self._has(entry):
            raise UnsupportedError(f"{self.name}: the plugin has no {entry} entry")
        self._use(index)
        out = self.ffi.new("void **")
        self._call(entry, self._dev(index), out, max(nbytes, 1))
        raw = self.ffi.gc(out[0], lambda p: getattr(self.iface, free_entry)(self._dev(index), p, max(nbytes, 1)))
        arr = np.frombuffer(self.ffi.buffer(raw, nbytes), dtype=np.uint8)
        return _Owned(arr, raw)

    def pinned_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """Host memory from the plugin's ``host_memory_allocate`` (freed with the array)."""
        return self._host_alloc("host_memory_allocate", "host_memory_deallocate", nbytes, index)

    def unified_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """Unified memory from the plugin's ``unified_memory_allocate`` (freed with the array)."""
        return self._host_alloc("unified_memory_allocate", "unified_memory_deallocate", nbytes, index)

    # -- copies -----------------------------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int, kind: str,
              stream: Any) -> None:
        if nbytes == 0:
            return
        self._use(index)
        f = self.ffi
        ptrs = copy_pointers(f, kind, dst, dst_off, src, src_off)
        if ptrs is None:
            raise InvalidArgumentError(f"unknown copy kind {kind!r}")
        d, s = ptrs
        dev = self._dev(index)
        async_entry = f"async_memory_copy_{kind}"
        if self._has(async_entry):
            self._call(async_entry, dev, stream.raw, d, s, nbytes)
        else:                                   # the synchronous form, after the stream's earlier work
            self._call("synchronize_stream", dev, stream.raw)
            self._call(f"memory_copy_{kind}", dev, d, s, nbytes)

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any, src_off: int,
                   nbytes: int, stream: Any) -> None:
        f = self.ffi
        d, s = f.cast("void *", dst + dst_off), f.cast("void *", src + src_off)
        ddev, sdev = self._dev(dst_index), self._dev(src_index)
        self._use(src_index)
        if self._has("async_memory_copy_p2p"):
            self._call("async_memory_copy_p2p", ddev, sdev, stream.raw, d, s, nbytes)
        elif self._has("memory_copy_p2p"):
            self._call("synchronize_stream", sdev, stream.raw)
            self._call("memory_copy_p2p", ddev, sdev, d, s, nbytes)
        else:
            raise UnsupportedError(f"{self.name}: the plugin has no memory_copy_p2p entry")

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        self._use(index)
        dev = self._dev(index)
        self._call("synchronize_stream", dev, stream.raw)     # device_memory_set is synchronous
        ptr = self.ffi.cast("void *", dst + dst_off)
        if self._has("device_memory_set"):
            self._call("device_memory_set", dev, ptr, value, nbytes)
        else:                                   # fallback: a host buffer of the value, copied synchronously
            host = np.full(nbytes, value, dtype=np.uint8)
            self._call("memory_copy_h2d", dev, ptr, self.ffi.from_buffer(host), nbytes)

