"""CUDA's bridges to CuPy: CuPy allocating through anychip's caching allocator, CuPy's NCCL
binding (loading it, and the shapes of its unique id)."""
from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np

from ...runtime.errors import InvalidArgumentError, OutOfMemoryError

__all__ = ["nccl_unique_id_for_cupy", "normalize_nccl_unique_id", "use_anychip_allocator_for_cupy"]

_NCCL_UNIQUE_ID_BYTES = 128


def normalize_nccl_unique_id(uid: Any) -> bytes:
    """NCCL's unique id as 128 bytes, whatever shape CuPy returned it in.

    ``cupy.cuda.nccl.get_unique_id()`` returns ``bytes`` from CuPy 14 on and a
    tuple of 128 C ``char`` values (signed, -128..127) before.
    """
    if isinstance(uid, (bytes, bytearray, memoryview)):
        data = bytes(uid)
    elif isinstance(uid, (tuple, list)):
        if not all(isinstance(v, (int, np.integer)) for v in uid):
            raise InvalidArgumentError("an NCCL unique id tuple must hold integers")
        if any(not -128 <= int(v) <= 255 for v in uid):
            raise InvalidArgumentError("an NCCL unique id tuple holds values outside a byte")
        data = bytes(int(v) & 0xFF for v in uid)
    else:
        raise InvalidArgumentError(f"an NCCL unique id is bytes or a tuple of ints, got {type(uid).__name__}")
    if len(data) != _NCCL_UNIQUE_ID_BYTES:
        raise InvalidArgumentError(f"an NCCL unique id has {_NCCL_UNIQUE_ID_BYTES} bytes, got {len(data)}")
    return data


def nccl_unique_id_for_cupy(data: bytes, like: Any = None, cupy_version: str | None = None) -> Any:
    """Turn 128 id bytes back into what ``cupy.cuda.nccl.NcclCommunicator`` takes.

    The shape follows ``like`` (a value ``get_unique_id()`` returned) when given,
    else the CuPy version (``cupy_version``, default: the installed one):
    bytes from 14 on, a tuple of signed ints before.
    """
    data = normalize_nccl_unique_id(data)
    if like is not None:
        as_bytes = isinstance(like, (bytes, bytearray))
    else:
        if cupy_version is None:
            import cupy  # the caller is about to use CuPy's NCCL anyway

            cupy_version = cupy.__version__
        try:
            major = int(str(cupy_version).split(".", 1)[0])
        except ValueError:
            major = 14
        as_bytes = major >= 14
    if as_bytes:
        return data
    return tuple(b - 256 if b > 127 else b for b in data)


def _load_nccl() -> tuple[Any, str]:
    """``cupy.cuda.nccl`` (or None) and why it is unusable.

    When libnccl is missing, CuPy warns on import with a multi-line message;
    it is kept out of the output here and condensed into the reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            from cupy.cuda import nccl
        except Exception as exc:  # noqa: BLE001 - any failure means no NCCL
            return None, f"cupy.cuda.nccl failed to import: {type(exc).__name__}: {exc}"
    if getattr(nccl, "available", False):
        return nccl, ""
    text = "\n".join(str(w.message) for w in caught)
    reason = re.search(r"^Reason: (.+)$", text, re.M)
    fix = re.search(r"^\s*\$ (.+)$", text, re.M)
    why = reason.group(1) if reason else "cupy.cuda.nccl.available is False"
    return None, why + (f"; install it with: {fix.group(1)}" if fix else "")


# ---------------------------------------------------------------------- CuPy bridge

def use_anychip_allocator_for_cupy(device: Any = None) -> Any:
    """Make CuPy allocate device memory through anychip's caching allocator.

    After this call CuPy arrays and anychip buffers share one pool per GPU:
    ``cupy.cuda.set_allocator`` gets a function that takes a Buffer from
    ``anychip.device("cuda:N").alloc(size)`` and hands CuPy a
    ``MemoryPointer`` over it; the Buffer is the memory's owner, so it goes
    back to anychip's cache when CuPy drops the array.

    ``device`` (``"cuda:1"``, a Device, or an int) pins every allocation to
    that GPU; None (the default) allocates on CuPy's current device.
    Out of memory raises ``cupy.cuda.memory.OutOfMemoryError`` (what CuPy and
    its users catch) with anychip's message; anychip's error is its ``__cause__``.
    Returns the allocator CuPy had before, for ``cupy.cuda.set_allocator``.
    """
    import cupy

    from ...runtime.device import device as lookup

    fixed = None
    if device is not None:
        fixed = lookup(f"cuda:{device}" if isinstance(device, int) else device)
        if fixed.backend != "cuda":
            raise InvalidArgumentError(f"use_anychip_allocator_for_cupy needs a cuda device, got {fixed}")
    cache: dict[int, Any] = {}

    def allocate(size: int) -> Any:
        dev = fixed
        if dev is None:
            idx = cupy.cuda.runtime.getDevice()
            dev = cache.get(idx)
            if dev is None:
                dev = cache[idx] = lookup(f"cuda:{idx}")
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev.index), 0)
        try:
            buf = dev.alloc(size)
        except OutOfMemoryError as exc:
            # CuPy (cub's fallbacks, ...) and its users catch CuPy's class
            err = cupy.cuda.memory.OutOfMemoryError(size, exc.stats.get("allocated_bytes.all.current", -1))
            err.args = (str(exc),)
            raise err from exc
        mem = cupy.cuda.UnownedMemory(buf.ptr, size, buf, dev.index)
        return cupy.cuda.MemoryPointer(mem, 0)

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(allocate)
    return previous

