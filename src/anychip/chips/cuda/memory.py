"""CUDA memory: cudaMalloc / cudaFree under the caching allocator, pinned host arrays,
copies and fills on a stream."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime.errors import InvalidArgumentError
from ...runtime.plugin import D2D, D2H, H2D
from .stream import CUDAStreams

__all__ = ["CUDAMemory"]


class CUDAMemory(CUDAStreams):
    """Allocations, copies and fills of the CUDA devices."""

    # ------------------------------------------------------------------ memory
    def _malloc(self, index: int, nbytes: int) -> int:
        rt = self._ready()
        return int(self._call(index, "cudaMalloc", rt.malloc, nbytes, requested=nbytes))

    def _free(self, index: int, handle: Any) -> None:
        self._call(index, "cudaFree", self._ready().free, handle)

    def _pointer(self, handle: Any, offset: int) -> int:
        return int(handle) + offset

    def pinned_empty(self, nbytes: int, index: int = 0) -> np.ndarray:
        """A page-locked host array (uint8) for fully asynchronous copies, allocated
        with GPU ``index`` current (CuPy's pinned memory is portable: any GPU may use it)."""
        self._ready()
        mem = self._call(index, "cudaHostAlloc", self._cupy.cuda.alloc_pinned_memory, nbytes, requested=nbytes)
        return np.frombuffer(mem, dtype=np.uint8, count=nbytes)

    # ------------------------------------------------------------------ copies
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int,
              nbytes: int, kind: str, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        if kind == H2D:
            d, s, k, what = int(dst) + dst_off, src.ctypes.data + src_off, 1, "cudaMemcpyAsync(H2D)"
        elif kind == D2H:
            d, s, k, what = dst.ctypes.data + dst_off, int(src) + src_off, 2, "cudaMemcpyAsync(D2H)"
        elif kind == D2D:
            d, s, k, what = int(dst) + dst_off, int(src) + src_off, 3, "cudaMemcpyAsync(D2D)"
        else:
            raise InvalidArgumentError(f"unknown copy kind {kind!r}")
        self._call(index, what, rt.memcpyAsync, d, s, nbytes, k, stream.ptr)

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any,
                   src_off: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        self._call(src_index, "cudaMemcpyPeerAsync", rt.memcpyPeerAsync,
                   int(dst) + dst_off, dst_index, int(src) + src_off, src_index, nbytes, stream.ptr)

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        rt = self._rt or self._ready()
        self._call(index, "cudaMemsetAsync", rt.memsetAsync, int(dst) + dst_off, int(value), nbytes, stream.ptr)

