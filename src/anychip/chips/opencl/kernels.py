"""The OpenCL kernel set.

:class:`ClKernels` are the backend's own kernels (``plugin.cl_kernels``): contiguous
float32 / float64 / int32 / int64 operands given as ``cl.Buffer`` handles and byte
offsets, every range checked against the allocation (docs/opencl.md). The OpenCL C
source they run is generated in ``_source.py``.

:class:`OpenCLKernels` is the backend's ``anychip.runtime.KernelSet`` (``plugin.kernels``,
what the tensor layer runs, through the runtime's checking front end): it takes the
tensor layer's strided operands and runs the contiguous kernels when the layout fits:
same-shape contiguous operands for elementwise ops, casts and copies, full sums,
contiguous GEMM.
"""
from __future__ import annotations

import logging
import math
import threading
import warnings
from typing import Any

import numpy as np

from ...runtime._checks import non_negative_int
from ...runtime.errors import InvalidArgumentError, UnsupportedError
from ...runtime.plugin import D2D
from .device import OpenCLDevice, _DeviceState
from .memory import OpenCLMemory
from .stream import _Stream

__all__ = ["ClKernels", "OpenCLKernels"]

log = logging.getLogger("anychip")

class ClKernels:
    """The OpenCL kernels on contiguous operands (``plugin.cl_kernels``; docs/opencl.md).

    Every method takes the device ``index``; buffers as ``(handle, byte_offset)``
    pairs; element counts; dtypes as NumPy dtype names (``"float32"``,
    ``"float64"``, ``"int32"``, ``"int64"``); and an optional ``stream`` of that
    device (an ``anychip.Stream`` or the backend's stream handle; None = the
    default stream). Work is enqueued, not waited for.
    Outputs may alias inputs in the elementwise ops, ``fill`` and ``cast``.
    """

    dtypes: tuple[str, ...] = ("float32", "float64", "int32", "int64")
    binary_ops: tuple[str, ...] = ("add", "sub", "mul", "div")

    def __init__(self, plugin: OpenCLMemory) -> None:
        self._plugin = plugin

    # -- public interface ----------------------------------------------------
    def supported_dtypes(self, index: int) -> tuple[str, ...]:
        from ._source import dtypes_for

        return dtypes_for(OpenCLDevice._has_fp64(self._plugin._state(self._index(index)).device))

    def binary(self, index: int, op: str, out: Any, a: Any, b: Any, n: int, dtype: str,
               stream: Any = None) -> None:
        """``out[i] = a[i] <op> b[i]`` for ``i < n``; op in add / sub / mul / div
        (integer div is floor division, ``x // 0 == 0``)."""
        if op not in self.binary_ops:
            raise InvalidArgumentError(f"unknown elementwise op {op!r}; expected one of {self.binary_ops}")
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o, a, b = (self._operand(index, x, n, item, name) for x, name in ((out, "out"), (a, "a"), (b, "b")))
        if n == 0:
            return
        self._launch_1d(index, f"{op}_{dtype}", n, stream,
                        o[0], np.uint64(o[1]), a[0], np.uint64(a[1]), b[0], np.uint64(b[1]), np.uint64(n))

    def add(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "add", out, a, b, n, dtype, stream)

    def sub(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "sub", out, a, b, n, dtype, stream)

    def mul(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "mul", out, a, b, n, dtype, stream)

    def div(self, index: int, out: Any, a: Any, b: Any, n: int, dtype: str, stream: Any = None) -> None:
        self.binary(index, "div", out, a, b, n, dtype, stream)

    def fill(self, index: int, out: Any, n: int, value: Any, dtype: str, stream: Any = None) -> None:
        """``out[i] = value`` for ``i < n`` (value converted with NumPy's rules for ``dtype``)."""
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o = self._operand(index, out, n, item, "out")
        try:
            v = np.dtype(dtype).type(value)
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"fill value {value!r} cannot be a {dtype} ({exc})") from None
        if n == 0:
            return
        self._launch_1d(index, f"fill_{dtype}", n, stream, o[0], np.uint64(o[1]), v, np.uint64(n))

    def cast(self, index: int, out: Any, out_dtype: str, x: Any, in_dtype: str, n: int,
             stream: Any = None) -> None:
        """``out[i] = (out_dtype) x[i]``: C conversion (floats to ints truncate toward
        zero; out-of-range values and NaN give unspecified results, as in NumPy)."""
        o_item, x_item = self._itemsize(out_dtype), self._itemsize(in_dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        o = self._operand(index, out, n, o_item, "out")
        x = self._operand(index, x, n, x_item, "x")
        if n == 0:
            return
        if out_dtype == in_dtype:
            s = self._stream(index, stream)
            self._plugin._copy(index, o[0], o[1], x[0], x[1], n * x_item, D2D, s)
            return
        self._launch_1d(index, f"cast_{in_dtype}_to_{out_dtype}", n, stream,
                        o[0], np.uint64(o[1]), x[0], np.uint64(x[1]), np.uint64(n))

    def sum(self, index: int, out: Any, x: Any, n: int, dtype: str, stream: Any = None) -> None:
        """``out[0] = x[0] + ... + x[n-1]``, accumulated in ``dtype`` (integers wrap)
        by a two-pass tree reduction; ``n == 0`` gives 0."""
        item = self._itemsize(dtype)
        n = non_negative_int(n, "n")
        index = self._index(index)
        out = self._operand(index, out, 1, item, "out")
        x = self._operand(index, x, n, item, "x")
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, f"sum_{dtype}")
        local = self._local_size(index, f"sum_{dtype}", knl)
        groups = max(1, min(-(-n // local), 4 * local,
                            4 * int(plugin._state(index).device.max_compute_units) * 8))
        scratch = cl.LocalMemory(local * item)
        with plugin._translate("clEnqueueNDRangeKernel(sum)", index), lock:
            if groups == 1:
                ev = cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, out[0], np.uint64(out[1]), x[0], np.uint64(x[1]),
                                       np.uint64(n), scratch), (local,), (local,))
            else:
                partial = cl.Buffer(plugin._context(index), cl.mem_flags.READ_WRITE, groups * item)
                cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, partial, np.uint64(0), x[0], np.uint64(x[1]),
                                       np.uint64(n), scratch), (groups * local,), (local,))
                ev = cl.enqueue_nd_range_kernel(
                    s.queue, self._set(knl, out[0], np.uint64(out[1]), partial, np.uint64(0),
                                       np.uint64(groups), scratch), (local,), (local,))
                    # OpenCL keeps `partial` alive until the kernels using it have run
        plugin._after_enqueue(s, ev)

    def matmul(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str,
               stream: Any = None) -> None:
        """``out[m, n] = a[m, k] @ b[k, n]``, all row-major and contiguous; products are
        accumulated in ``dtype`` in order of increasing k (no FMA; integers wrap)."""
        item = self._itemsize(dtype)
        m, k, n = non_negative_int(m, "m"), non_negative_int(k, "k"), non_negative_int(n, "n")
        index = self._index(index)
        out = self._operand(index, out, m * n, item, "out")
        a = self._operand(index, a, m * k, item, "a")
        b = self._operand(index, b, k * n, item, "b")
        if m == 0 or n == 0:
            return
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, f"matmul_{dtype}")
        ts = self._tile(index)
        gsize = (-(-n // ts) * ts, -(-m // ts) * ts)
        with plugin._translate("clEnqueueNDRangeKernel(matmul)", index), lock:
            ev = cl.enqueue_nd_range_kernel(
                s.queue, self._set(knl, out[0], np.uint64(out[1]), a[0], np.uint64(a[1]), b[0],
                                   np.uint64(b[1]), np.uint64(m), np.uint64(k), np.uint64(n)),
                gsize, (ts, ts))
        plugin._after_enqueue(s, ev)

    # -- internals -----------------------------------------------------------
    @staticmethod
    def _set(knl: Any, *args: Any) -> Any:
        knl.set_args(*args)
        return knl

    def _itemsize(self, dtype: str) -> int:
        if dtype not in self.dtypes:
            raise UnsupportedError(f"the OpenCL kernels support {', '.join(self.dtypes)}, not {dtype!r}")
        return np.dtype(dtype).itemsize

    def _index(self, index: Any) -> int:
        count = self._plugin.device_count()
        if type(index) is not int and not isinstance(index, np.integer):
            raise InvalidArgumentError(f"device index must be an int, got {type(index).__name__} {index!r}")
        if not 0 <= int(index) < count:
            raise InvalidArgumentError(f"there is no opencl:{index}; the OpenCL backend has {count} "
                                       f"device{'s' if count != 1 else ''} (0..{count - 1})")
        return int(index)

    def _operand(self, index: int, operand: Any, count: int, item: int, what: str) -> tuple[Any, int]:
        """(cl.Buffer, byte offset) of an operand holding ``count`` elements of ``item`` bytes.

        An operand is an ``anychip.Buffer`` of this device (checked against the
        buffer), ``(handle, offset, nbytes)``, or ``(handle, offset)`` for a raw
        allocation from ``_malloc`` (checked against the whole ``cl.Buffer``).
        """
        from ...runtime.buffer import Buffer

        if isinstance(operand, Buffer):
            dev = operand.device
            if dev.plugin is not self._plugin or dev.index != index:
                raise InvalidArgumentError(f"{what}: a buffer of {dev}, but the kernel runs on opencl:{index}")
            handle, offset, limit = operand._check().handle, operand._offset, operand.nbytes
            base = offset
        elif isinstance(operand, tuple) and len(operand) in (2, 3):
            handle, offset = operand[0], operand[1]
            offset = non_negative_int(offset, f"{what} offset")
            size = getattr(handle, "size", None)
            if not isinstance(size, int) or not isinstance(handle, self._plugin._cl.Buffer):
                raise InvalidArgumentError(f"{what}: {type(handle).__name__} is not an OpenCL buffer handle")
            limit = size if len(operand) == 2 else non_negative_int(operand[2], f"{what} nbytes")
            if len(operand) == 3 and offset + limit > size:
                raise InvalidArgumentError(f"{what}: [{offset}, {offset + limit}) lies outside its "
                                           f"{size}-byte cl.Buffer")
            base = 0 if len(operand) == 2 else offset
        else:
            raise InvalidArgumentError(f"{what} must be an anychip.Buffer, (handle, offset, nbytes) or "
                                       f"(handle, offset) of a raw allocation, got {operand!r}")
        if offset % item:
            raise InvalidArgumentError(f"{what}: offset {offset} is not a multiple of the element size {item}")
        need = count * item
        if offset - base + need > limit:
            raise InvalidArgumentError(
                f"{what}: {count} elements of {item} bytes from byte {offset - base} need {need} bytes, "
                f"past the end of its {limit}-byte allocation")
        return handle, offset

    def _stream(self, index: int, stream: Any) -> _Stream:
        """None -> the default stream; an ``anychip.Stream`` -> its handle; a handle as is."""
        if stream is None:
            return self._plugin._default_stream(index)
        live = getattr(stream, "_live", None)
        if live is not None:
            stream = live()
        if not isinstance(stream, _Stream) or stream.index != index:
            raise InvalidArgumentError(f"kernel on opencl:{index} got {stream!r}; pass a stream of opencl:{index}")
        return stream

    def _tile(self, index: int) -> int:
        wg = int(self._plugin._state(index).device.max_work_group_size)
        return 16 if wg >= 256 else 8 if wg >= 64 else 4 if wg >= 16 else 1

    def _program(self, index: int) -> Any:
        plugin = self._plugin
        st = plugin._state(index)
        if st.program is None:
            with st.lock:
                if st.program is None:
                    st.program = self._build(index, st)
        return st.program

    def _build(self, index: int, st: _DeviceState) -> Any:
        from ._source import build_source

        plugin = self._plugin
        cl = plugin._cl
        ctx = plugin._context(index)
        fp64 = OpenCLDevice._has_fp64(st.device)
        options = [f"-DTS={self._tile(index)}"]
        if fp64:
            options.append("-DANYCHIP_FP64")
        try:
            if st.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
                options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        except Exception as exc:  # noqa: BLE001 - an optional query
            log.debug("CL_DEVICE_SINGLE_FP_CONFIG failed: %s", exc)
        with plugin._translate("clBuildProgram", index), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyopencl warns whenever the build log is not empty
            program = cl.Program(ctx, build_source(fp64)).build(options=options)
        log.debug("built the OpenCL kernel set for opencl:%d (%s)", index, " ".join(options))
        return program

    def _kernel(self, index: int, name: str) -> tuple[Any, threading.Lock]:
        st = self._plugin._state(index)
        knl = st.kernels.get(name)
        if knl is None:
            program = self._program(index)
            with st.lock:
                knl = st.kernels.get(name)
                if knl is None:
                    try:
                        knl = getattr(program, name)
                    except AttributeError:
                        raise UnsupportedError(f"opencl:{index} has no kernel {name} "
                                               f"(float64 needs cl_khr_fp64)") from None
                    st.kernel_locks[name] = threading.Lock()
                    st.kernels[name] = knl
        return knl, st.kernel_locks[name]

    def _local_size(self, index: int, name: str, knl: Any) -> int:
        """Largest power of two <= 256 the kernel may run as one work-group (cached)."""
        st = self._plugin._state(index)
        local = st.local_sizes.get(name)
        if local is None:
            cl = self._plugin._cl
            wg = int(knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, st.device))
            local = 1
            while local * 2 <= min(wg, 256):
                local *= 2
            st.local_sizes[name] = local
        return local

    def _launch_1d(self, index: int, name: str, n: int, stream: Any, *args: Any) -> None:
        plugin = self._plugin
        cl = plugin._cl
        s = self._stream(index, stream)
        knl, lock = self._kernel(index, name)
        local = self._local_size(index, name, knl)
        cus = int(plugin._state(index).device.max_compute_units)
        groups = max(1, min(-(-n // local), cus * 64))
        with plugin._translate(f"clEnqueueNDRangeKernel({name})", index), lock:
            knl.set_args(*args)
            ev = cl.enqueue_nd_range_kernel(s.queue, knl, (groups * local,), (local,))
        plugin._after_enqueue(s, ev)



_OPS = frozenset({"add", "sub", "mul", "div", "copy", "sum", "matmul"})


def _contiguous(strides: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    expect = 1
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


class OpenCLKernels:
    """The OpenCL backend's ``anychip.runtime.KernelSet`` (``plugin.kernels``): runs the
    contiguous kernels of :class:`ClKernels` where the layout fits, and otherwise raises
    ``UnsupportedError`` before enqueuing anything (the tensor layer then uses its host
    fallback). The runtime's front end has checked every argument before a call reaches it."""

    def __init__(self, cl_kernels: ClKernels) -> None:
        self._cl = cl_kernels

    def supports(self, index: int, op: str, dtype: str) -> bool:
        return op in _OPS and dtype in self._cl.supported_dtypes(index)

    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: tuple[int, ...], dtype: str,
                    stream: Any) -> None:
        if op not in ("add", "sub", "mul", "div"):
            raise UnsupportedError(f"the OpenCL kernels have no {op}")
        n = math.prod(shape)
        for operand, what in ((a, "a"), (b, "b")):
            if not _contiguous(operand[2], shape):
                raise UnsupportedError(f"the OpenCL kernels take contiguous operands; {what} has strides {operand[2]}")
        self._cl.binary(index, op, _sub(out), _sub(a), _sub(b), n, dtype, stream)

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: tuple[int, ...],
              stream: Any) -> None:
        if op != "copy" or out_dtype not in self._cl.supported_dtypes(index):
            raise UnsupportedError(f"the OpenCL kernels have no {op} from {dtype} to {out_dtype}")
        if not _contiguous(x[2], shape):
            raise UnsupportedError(f"the OpenCL kernels take contiguous operands; x has strides {x[2]}")
        self._cl.cast(index, _sub(out), out_dtype, _sub(x), dtype, math.prod(shape), stream)

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None:
        if op != "sum" or out_dtype != dtype or outer != 1 or inner != 1:
            raise UnsupportedError("the OpenCL kernels sum whole tensors into their own dtype only")
        self._cl.sum(index, _sub(out), _sub(x), n, dtype, stream)

    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, k: int, n: int, dtype: str, stream: Any) -> None:
        if not (_contiguous(a[2], (m, k)) and _contiguous(b[2], (k, n))):
            raise UnsupportedError("the OpenCL matmul kernel takes contiguous matrices")
        self._cl.matmul(index, _sub(out), _sub(a), _sub(b), m, k, n, dtype, stream)


def _nbytes(storage: Any, offset: int) -> int:
    return int(storage.nbytes) - offset


def _sub(operand: Any) -> tuple[Any, int, int]:
    """(cl.Buffer handle, absolute byte offset, bytes available) of a tensor-layer operand."""
    storage, offset = operand[0], operand[1]
    return (storage.handle, storage.offset + offset, storage.nbytes - offset)
