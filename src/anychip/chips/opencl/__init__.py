"""OpenCL backend on pyopencl.

One file per concept, as every split backend: ``device.py`` (discovery, properties,
errors), ``stream.py`` (command queues), ``memory.py`` (buffers, copies, fills),
``event.py`` (markers), ``kernels.py`` (the kernel set); the plugin class below is
their sum.

Devices
    One anychip device per OpenCL device of every platform: platforms in the
    order ``pyopencl.get_platforms()`` returns them (the ICD loader's order),
    devices in the order each platform lists them (all device types).
    ``opencl:0`` is therefore the first device of the first platform. No
    ``PYOPENCL_CTX`` is needed or read.

Memory
    A raw allocation is one ``cl.Buffer`` segment; the caching allocator
    sub-allocates it by offset, so every copy, fill and kernel takes a byte
    offset into the segment. OpenCL allocates buffers lazily, so ``_malloc``
    runs a one-byte fill to make the allocation real; CPU implementations such
    as PoCL never fail there (Linux over-commits), so this backend also keeps
    its own count of the bytes it holds per device and refuses allocations
    beyond ``CL_DEVICE_GLOBAL_MEM_SIZE``. Single buffers larger than
    ``CL_DEVICE_MAX_MEM_ALLOC_SIZE`` are refused up front.

Streams and events
    A stream is an in-order command queue with profiling enabled. An event is
    a marker enqueued on the queue it is recorded on; waiting on it is a
    barrier with the marker in its wait list; elapsed time comes from the
    markers' profiling timestamps. Every enqueue is followed by a flush so
    work starts at once, as on CUDA.

Host arrays
    pyopencl returns a ``NannyEvent`` for copies that touch host memory; it
    keeps the array alive and its destructor *blocks* until the copy has
    finished. The stream object therefore holds those events until the stream
    is synchronized (or they are seen complete), which keeps copies
    asynchronous.
"""
from __future__ import annotations

from .device import FORK_REASON, cl_code_name
from .event import OpenCLEvents
from .kernels import ClKernels, OpenCLKernels
from .memory import OpenCLMemory

__all__ = ["FORK_REASON", "OpenCLKernels", "OpenCLPlugin", "cl_code_name"]


class OpenCLPlugin(OpenCLMemory, OpenCLEvents):
    """anychip backend for every OpenCL device pyopencl can see."""

    name = "opencl"
    api_version = (1, 0)
    priority = 10
    accelerator = True

    def __init__(self) -> None:
        super().__init__()
        #: the backend's own kernels on contiguous cl.Buffer operands (docs/opencl.md)
        self.cl_kernels = ClKernels(self)
        #: the anychip.runtime.KernelSet the tensor layer runs
        self.kernels = OpenCLKernels(self.cl_kernels)
