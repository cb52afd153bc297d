"""Buffer: a range of device memory handed out by a device's allocator.

A Buffer is (segment handle, offset, nbytes, device). Freed explicitly with
``free()`` or when the last reference goes. ``view(offset, nbytes)`` gives a
sub-range that shares the memory (and keeps its parent alive).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ._checks import non_negative_int
from .allocator import BufferBase, register_buffer
from .allocator import view as _view
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream

__all__ = ["Buffer"]


class Buffer(BufferBase):
    """Device memory from ``device.alloc(nbytes)``. Its storage (``device``,
    ``nbytes``, the allocator block, offset and viewed buffer), ``free()`` and the
    free when the last reference goes are compiled with the allocator's core
    (``BufferBase``); ``anychip.Buffer()`` raises InvalidArgumentError."""

    __slots__ = ()

    device: Device
    nbytes: int

    # -- identity -------------------------------------------------------
    def _check(self) -> Any:
        """The allocator block, or an error if the memory was freed."""
        root = self._root
        block = self._block if root is None else root._block
        if block is None:
            raise InvalidArgumentError(f"use of a freed buffer ({self.nbytes} bytes on {self.device})")
        return block

    @property
    def handle(self) -> Any:
        """The backend's segment handle (a pointer, a cl.Buffer, a host array...)."""
        return self._check().handle

    @property
    def offset(self) -> int:
        """Byte offset of this buffer inside its segment."""
        self._check()
        return self._offset

    @property
    def ptr(self) -> int | None:
        """Integer device address where the backend has one, else None."""
        block = self._check()
        if block.handle is None:        # a zero-byte buffer owns no memory
            return None
        return self.device.plugin._pointer(block.handle, self._offset)

    @property
    def freed(self) -> bool:
        root = self._root if self._root is not None else self
        return root._block is None

    # -- memory ---------------------------------------------------------
    def record_stream(self, stream: Stream) -> None:
        """Tell the allocator this memory is also used on ``stream``: after free it is
        reused only once the work enqueued so far on ``stream`` is done."""
        root = self._root if self._root is not None else self
        self.device._record_stream(root._check(), stream)

    def view(self, offset: int, nbytes: int | None = None) -> Buffer:
        """The sub-range [offset, offset + nbytes) sharing this buffer's memory."""
        self._check()
        offset = non_negative_int(offset, "offset")
        if nbytes is None:
            nbytes = self.nbytes - offset
        nbytes = non_negative_int(nbytes, "nbytes")
        if offset + nbytes > self.nbytes:
            raise InvalidArgumentError(
                f"view [{offset}, {offset + nbytes}) lies outside the buffer of {self.nbytes} bytes")
        return _view(self.device, nbytes, self._offset + offset, self._root if self._root is not None else self)

    # -- copies ---------------------------------------------------------
    def copy_from(self, src: Any, nbytes: int | None = None, *, offset: int = 0, src_offset: int = 0,
                  stream: Stream | None = None) -> Buffer:
        """Copy from a host array (any C-contiguous NumPy array or bytes-like) or
        another Buffer into this one at ``offset``. Synchronous unless a stream is given."""
        self.device.copy(self, src, nbytes, dst_offset=offset, src_offset=src_offset, stream=stream)
        return self

    def copy_to(self, dst: Any, nbytes: int | None = None, *, offset: int = 0, dst_offset: int = 0,
                stream: Stream | None = None) -> Any:
        """Copy this buffer (from ``offset``) into a writable host array or Buffer."""
        self.device.copy(dst, self, nbytes, dst_offset=dst_offset, src_offset=offset, stream=stream)
        return dst

    def to_numpy(self, dtype: Any = np.uint8, shape: Any = None, *, offset: int = 0,
                 stream: Stream | None = None) -> np.ndarray:
        """A new host array with the buffer's contents (synchronous)."""
        dt = _plain_dtype(dtype)
        offset = non_negative_int(offset, "offset")
        if offset > self.nbytes:
            raise InvalidArgumentError(f"to_numpy: offset {offset} is past the end of the {self.nbytes}-byte buffer")
        avail = self.nbytes - offset
        if shape is None:
            if avail % dt.itemsize:
                raise InvalidArgumentError(
                    f"to_numpy: the {avail} bytes from offset {offset} are not a whole number of {dt} "
                    f"({dt.itemsize} bytes each); pass shape=")
            shape = (avail // dt.itemsize,)
        else:
            shape = _shape(shape)
            need = dt.itemsize * math.prod(shape)
            if need > avail:
                raise InvalidArgumentError(
                    f"to_numpy: shape {shape} of {dt} needs {need} bytes, but the buffer has {avail} bytes "
                    f"from offset {offset}")
        out = np.empty(shape, dtype=dt)
        self.device.copy(out, self, out.nbytes, src_offset=offset, stream=stream, _sync=True)
        return out

    def memset(self, value: int, nbytes: int | None = None, *, offset: int = 0,
               stream: Stream | None = None) -> Buffer:
        """Set bytes to ``value`` (0..255). Synchronous unless a stream is given."""
        self.device.memset(self, value, nbytes, offset=offset, stream=stream)
        return self

    # -- lifetime -------------------------------------------------------
    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        if self.freed:
            return f"<anychip.Buffer {self.nbytes} bytes on {self.device} (freed)>"
        kind = " view" if self._root is not None else ""
        return f"<anychip.Buffer{kind} {self.nbytes} bytes on {self.device} at offset {self._offset}>"


register_buffer(Buffer, InvalidArgumentError)


def _shape(value: Any) -> tuple[int, ...]:
    """A shape (an int or a sequence of ints >= 0) as a tuple, or a clear error."""
    if isinstance(value, (int, np.integer)):
        return (non_negative_int(value, "shape"),)
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgumentError(f"shape must be an int or a sequence of ints, got {value!r}") from None
    return tuple(non_negative_int(v, f"shape {value!r}: every dimension") for v in items)


def _plain_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype of plain data (no Python objects, non-zero size), or a clear error."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"dtype {dtype!r} is not a NumPy dtype ({exc})") from None
    if dt.hasobject:
        raise InvalidArgumentError(f"dtype {dt} holds Python object references, which device memory cannot hold; "
                                   "use a numeric or other plain-data dtype")
    if dt.itemsize == 0:
        raise InvalidArgumentError(f"dtype {dt.str!r} has size 0; pass a dtype with a size (e.g. 'V8', np.float32)")
    return dt
