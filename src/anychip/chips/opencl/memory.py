"""OpenCL memory: ``cl.Buffer`` segments with anychip's own accounting, copies and fills."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime.errors import DeviceError, InvalidArgumentError, OutOfMemoryError
from ...runtime.plugin import D2D, D2H, H2D
from .device import _CL_ALLOCATION_FAILURE, _CL_INVALID_BUFFER_SIZE, _mib
from .stream import OpenCLStreams

__all__ = ["OpenCLMemory"]


class OpenCLMemory(OpenCLStreams):
    """Allocations, copies and fills on the streams of the OpenCL devices."""

    # ------------------------------------------------------------------ memory
    def _malloc(self, index: int, nbytes: int) -> Any:
        st = self._state(index)
        cl = self._cl
        d = st.device
        max_alloc = int(d.max_mem_alloc_size)
        total = int(d.global_mem_size)
        size = max(int(nbytes), 1)  # clCreateBuffer refuses size 0
        if size > max_alloc:
            raise OutOfMemoryError(nbytes, *self._mem_info(index), backend=self.name, device=f"opencl:{index}",
                                   code=_CL_INVALID_BUFFER_SIZE, code_name="CL_INVALID_BUFFER_SIZE",
                                   detail=f"one buffer may hold at most {_mib(max_alloc)} on this device "
                                          f"(CL_DEVICE_MAX_MEM_ALLOC_SIZE)")
        with st.lock:
            if st.allocated + size > total:
                raise OutOfMemoryError(nbytes, max(total - st.allocated, 0), total, backend=self.name,
                                       device=f"opencl:{index}", code=_CL_ALLOCATION_FAILURE,
                                       code_name="CL_MEM_OBJECT_ALLOCATION_FAILURE",
                                       detail=f"anychip already holds {_mib(st.allocated)} of the "
                                              f"{_mib(total)} CL_DEVICE_GLOBAL_MEM_SIZE")
            st.allocated += size
        try:
            ctx = self._context(index)
            with self._translate("clCreateBuffer", index, requested=nbytes):
                buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size)
                # buffers are allocated lazily; touch one byte so a failure shows here. On a
                # queue of its own, so the wait does not queue behind the streams' work.
                if st.touch_queue is None:
                    st.touch_queue = cl.CommandQueue(ctx, st.device)
                cl.enqueue_fill_buffer(st.touch_queue, buf, np.uint8(0), 0, 1).wait()
        except BaseException:
            with st.lock:
                st.allocated -= size
            raise
        with st.lock:
            st.live.add(id(buf))
        return buf

    def _free(self, index: int, handle: Any) -> None:
        st = self._state(index)
        with st.lock:
            if id(handle) not in st.live:
                raise DeviceError(f"free of an OpenCL buffer that is not a live allocation of opencl:{index} "
                                  "(released already?)", backend=self.name)
            st.live.discard(id(handle))
        size = max(int(handle.size), 1)
        with self._translate("clReleaseMemObject", index):
            # OpenCL defers the actual release until enqueued commands using it finish
            handle.release()
        with st.lock:
            st.allocated -= size

    # ------------------------------------------------------------------ copies
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int,
              nbytes: int, kind: str, stream: Any) -> None:
        # hot path: no context managers, one dispatch, the bookkeeping inlined
        if nbytes == 0:
            return
        cl = self._cl
        q = stream.queue
        try:
            if kind == H2D:
                host = src[src_off:src_off + nbytes] if (src_off or src.size != nbytes) else src
                ev = cl.enqueue_copy(q, dst, host, dst_offset=dst_off, is_blocking=False)
                nanny = True
            elif kind == D2H:
                host = dst[dst_off:dst_off + nbytes] if (dst_off or dst.size != nbytes) else dst
                ev = cl.enqueue_copy(q, host, src, src_offset=src_off, is_blocking=False)
                nanny = True
            elif kind == D2D:
                ev = cl.enqueue_copy(q, dst, src, src_offset=src_off, dst_offset=dst_off, byte_count=nbytes)
                nanny = False
            else:
                raise InvalidArgumentError(f"unknown copy kind {kind!r}")
            stream.last = ev
            if nanny:
                pending = stream.pending
                pending.append(ev)
                if len(pending) % 64 == 0:
                    with stream.lock:
                        self._prune(stream)
            q.flush()
        except cl.Error as exc:
            what = {H2D: "clEnqueueWriteBuffer", D2H: "clEnqueueReadBuffer"}.get(kind, "clEnqueueCopyBuffer")
            raise self._convert(exc, what, index, nbytes) from exc

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        if nbytes == 0:
            return
        with self._translate("clEnqueueFillBuffer", index, requested=nbytes):
            ev = self._cl.enqueue_fill_buffer(stream.queue, dst, np.uint8(value), dst_off, nbytes)
        self._after_enqueue(stream, ev)

