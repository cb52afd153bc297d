"""CUDA backend on CuPy.

One file per concept, as every split backend: ``device.py`` (discovery, properties,
errors), ``stream.py``, ``memory.py``, ``event.py``, ``kernels.py`` (the kernel set on
CuPy), ``interop.py`` (CuPy's allocator and NCCL bridges); the plugin class below is
their sum.

CuPy is imported lazily, inside :meth:`CUDAPlugin.available`; a machine
without CuPy, without a working CUDA runtime or without a GPU gets the backend
listed as unavailable with the reason, never an import error.

Devices
    ``cuda:N`` is CUDA runtime device N, i.e. the N-th device that
    ``CUDA_VISIBLE_DEVICES`` leaves visible. The CUDA runtime reads that
    variable once, at its first call in the process, so it must be set before
    anything touches CUDA (anychip, CuPy, PyTorch...); changing it later has no
    effect, and anychip logs a warning when it sees that it changed.

Memory
    Raw allocations are ``cudaMalloc`` / ``cudaFree`` (``cupy.cuda.runtime``)
    under anychip's caching allocator; handles are integer device pointers.
    :func:`use_anychip_allocator_for_cupy` makes CuPy allocate through that
    same caching allocator, so CuPy arrays and anychip buffers share one pool.

Copies
    ``cudaMemcpyAsync`` on the stream. Host arrays are passed as they are:
    pageable memory is correct with ``cudaMemcpyAsync`` (the driver stages
    host-to-device copies before returning, and device-to-host copies into
    pageable memory return only when the data has arrived), it is only not
    overlapped with the host. Arrays from :meth:`CUDAPlugin.pinned_empty`
    (page-locked, ``cupy.cuda.alloc_pinned_memory``) are copied by DMA fully
    asynchronously; the front end keeps them alive until the stream is
    synchronized.

Streams and events
    The default stream of a device is CUDA's legacy default stream (the one
    CuPy uses unless told otherwise), so work anychip does on it is ordered
    with a user's CuPy work. ``Stream(device)`` creates
    ``cupy.cuda.Stream(non_blocking=True)``. Events are ``cupy.cuda.Event()``
    (timing enabled), or ``Event(disable_timing=True)`` from
    ``_event_create_untimed`` (for the caching allocator). Queries call
    ``cudaStreamQuery`` / ``cudaEventQuery`` themselves: CuPy's ``done``
    reads an error as "not done".

Current device
    Each call runs with its device current (``cudaSetDevice``) and makes the
    thread's previous device current again afterwards, unless that thread
    had no CUDA context yet: restoring would create GPU 0's context (hundreds
    of MiB, or an error on an EXCLUSIVE_PROCESS GPU) in every process.
"""
from __future__ import annotations

from typing import Any

from .device import (
    CUDA_ERROR_NAMES,
    FORK_REASON,
    cuda_error_name,
    parse_cuda_visible_devices,
    translate_cuda_error,
)
from .event import CUDAEvents
from .interop import nccl_unique_id_for_cupy, normalize_nccl_unique_id, use_anychip_allocator_for_cupy
from .memory import CUDAMemory

__all__ = [
    "CUDAPlugin",
    "CUDA_ERROR_NAMES",
    "FORK_REASON",
    "cuda_error_name",
    "nccl_unique_id_for_cupy",
    "normalize_nccl_unique_id",
    "parse_cuda_visible_devices",
    "translate_cuda_error",
    "use_anychip_allocator_for_cupy",
]


class CUDAPlugin(CUDAMemory, CUDAEvents):
    """anychip backend for NVIDIA GPUs through CuPy."""

    name = "cuda"
    api_version = (1, 0)
    priority = 100
    accelerator = True

    @property
    def kernels(self) -> Any:
        """The tensor kernels (CuPy's, over anychip memory: chips/cuda/kernels.py) once CuPy is loaded."""
        if self._cupy is None:
            return None
        k = self.__dict__.get("_tensor_kernels")
        if k is None:
            from .kernels import CudaKernels
            k = self.__dict__["_tensor_kernels"] = CudaKernels(self)
        return k

