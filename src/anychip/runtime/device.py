"""Devices: the selected list, the current device, and the front-end checks
that every backend relies on (sizes, offsets, devices, freed buffers).
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np

from . import env as environment
from . import registry
from ._checks import non_negative_int
from .allocator import make_allocator
from .buffer import Buffer
from .errors import InvalidArgumentError, SelectionError, UnsupportedError
from .plugin import D2D, D2H, H2D
from .selection import select
from .stream import Event, Stream, _tls, set_device_lookup

__all__ = ["Device", "devices", "device", "set_device", "current_device", "default_device", "copy"]

_lock = threading.RLock()
_instances: dict[tuple[str, int], Device] = {}
_selected: list[Device] | None = None
_selected_env: str | None = None


class Device:
    """One device of one backend, e.g. ``ascend:0``. One instance per device;
    get it with :func:`anychip.device`. Also a context manager that makes it the
    current device on this thread."""

    def __init__(self, info: registry.BackendInfo, index: int) -> None:
        assert info.plugin is not None
        self.backend: str = info.name
        self.index: int = index
        self.plugin = info.plugin
        self.name = f"{info.name}:{index}"
        self._info = info
        self._lock = threading.Lock()
        self._allocator: Any = None
        self._default: Stream | None = None
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._properties: dict | None = None

    # -- identity -------------------------------------------------------
    @property
    def simulated(self) -> bool:
        """True when a simulator stands in for the vendor's library."""
        return bool(self.plugin.simulated)

    @property
    def properties(self) -> dict:
        if self._properties is None:
            props = dict(self.plugin.properties(self.index))
            props.setdefault("backend", self.backend)
            props.setdefault("index", self.index)
            props.setdefault("simulated", self.simulated)
            self._properties = props
        return dict(self._properties)

    @property
    def default_stream(self) -> Stream:
        s = self._default
        if s is None:
            with self._lock:
                if self._default is None:
                    self._default = Stream._wrap_default(self)
                s = self._default
        return s

    def current_stream(self) -> Stream:
        s = _tls.streams.get(self)
        return s if s is not None else self.default_stream

    def __repr__(self) -> str:
        return f"device({self.name!r})"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> Any:
        return (device, (self.name,))

    def __enter__(self) -> Device:
        _tls.device_stack.append(_tls.device)
        _tls.device = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.device = _tls.device_stack.pop()

    def _forget_parent(self) -> None:
        """In a forked child: a fresh front end for this device (see _after_fork_in_child)."""
        self._lock = threading.Lock()
        old = self._allocator
        self._allocator = None
        if old is not None:
            try:      # a parent's buffer freed here never reaches the new cache
                old.name = f"{self.name} of the parent process (before fork())"
                lock = getattr(old, "_lock", None)
                if lock is not None:    # another parent thread may have held it at the fork
                    old._lock = threading.RLock() if isinstance(lock, type(threading.RLock())) else threading.Lock()
                self._allocator = self._make_allocator()
            except Exception:  # noqa: BLE001 - never raise in a fork hook; made on first use instead
                pass
        for s in list(self._streams):
            s._destroyed = True          # the parent's streams do not exist in the child
            s._keep.clear()
        self._streams = weakref.WeakSet()
        self._default = None

    # -- memory ---------------------------------------------------------
    @property
    def allocator(self) -> Any:
        a = self._allocator
        if a is None:
            with self._lock:
                if self._allocator is None:
                    self._allocator = self._make_allocator()
                a = self._allocator
        return a

    def _make_allocator(self) -> Any:
        plugin, index = self.plugin, self.index

        def event_record(stream: Stream) -> Any:
            ev = plugin._event_create_untimed(index)
            plugin._event_record(index, ev, stream._handle)
            return ev

        return make_allocator(
            lambda n: plugin._malloc(index, n),
            lambda h: plugin._free(index, h),
            mem_info=lambda: plugin._mem_info(index),
            event_record=event_record,
            event_query=lambda ev: plugin._event_query(index, ev),
            event_synchronize=lambda ev: plugin._event_synchronize(index, ev),
            event_destroy=lambda ev: plugin._event_destroy(index, ev),
            name=self.name,
        )

    def alloc(self, nbytes: int, stream: Stream | None = None) -> Buffer:
        """``nbytes`` of device memory from the caching allocator, usable at once on
        ``stream`` (default: the current stream)."""
        if type(nbytes) is not int or nbytes < 0:
            nbytes = non_negative_int(nbytes, "nbytes")
        if stream is None:
            stream = _tls.streams.get(self) or self._default or self.default_stream
        elif stream.__class__ is not Stream or stream.device is not self:
            raise InvalidArgumentError(f"alloc on {self} got {stream!r}; pass a Stream of {self}")
        if stream._destroyed:
            raise InvalidArgumentError(f"alloc on {self} got {stream!r}; pass a live Stream of {self}")
        return (self._allocator or self.allocator).buffer(self, nbytes, stream)

    def _record_stream(self, block: Any, stream: Stream) -> None:
        if not isinstance(stream, Stream) or stream.device is not self:
            raise InvalidArgumentError(f"record_stream needs a Stream of {self}, got {stream!r}")
        stream._live()
        self._allocator.record_stream(block, stream)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory as the backend reports them."""
        free, total = self.plugin._mem_info(self.index)
        return int(free), int(total)

    def memory_stats(self) -> dict[str, int]:
        """Allocator statistics with PyTorch's dotted names (``allocated_bytes.all.current``...)."""
        return self.allocator.memory_stats()

    def reset_peak_memory_stats(self) -> None:
        self.allocator.reset_peak_stats()

    def empty_cache(self) -> None:
        """Return cached, unused memory to the backend."""
        self.allocator.empty_cache()

    def synchronize(self) -> None:
        """Wait for all work on every stream of this device. Ctrl-C interrupts the wait
        (KeyboardInterrupt) on every backend; the work itself goes on."""
        points = [(s, s._seq) for s in list(self._streams)]
        self.plugin._synchronize(self.index)
        for s, upto in points:
            if s._keep:
                s._release(upto)
        if self._allocator is not None:      # the device is idle: blocks waiting on events can be reused
            self._allocator.synchronize_and_free_events()

    # -- copies and memset ---------------------------------------------
    def copy(self, dst: Any, src: Any, nbytes: int | None = None, *, dst_offset: int = 0,
             src_offset: int = 0, stream: Stream | None = None, _sync: bool | None = None) -> None:
        """Copy between host arrays and Buffers (see :func:`anychip.copy`)."""
        copy(dst, src, nbytes, dst_offset=dst_offset, src_offset=src_offset, stream=stream, _sync=_sync)

    def memset(self, buf: Buffer, value: int, nbytes: int | None = None, *, offset: int = 0,
               stream: Stream | None = None) -> None:
        """Set ``nbytes`` bytes of ``buf`` from ``offset`` to ``value`` (0..255).
        Synchronous unless ``stream`` is given."""
        if not isinstance(buf, Buffer):
            raise InvalidArgumentError(f"memset needs an anychip.Buffer, got {type(buf).__name__}")
        if buf.device is not self:
            raise InvalidArgumentError(f"memset on {self} got a buffer of {buf.device}")
        block = buf._check()
        if type(value) is not int and not isinstance(value, np.integer):
            raise InvalidArgumentError(f"memset value must be an int 0..255, got {value!r}")
        if not 0 <= int(value) <= 255:
            raise InvalidArgumentError(f"memset value must be a byte 0..255, got {value}")
        offset = non_negative_int(offset, "offset")
        nbytes = buf.nbytes - offset if nbytes is None else non_negative_int(nbytes, "nbytes")
        _check_range(buf, offset, nbytes, "memset")
        s, sync = self._stream_for(stream)
        if nbytes:
            self.plugin._memset(self.index, block.handle, buf._offset + offset, int(value), nbytes, s._live())
        if sync:
            s.synchronize()

    def _stream_for(self, stream: Stream | None) -> tuple[Stream, bool]:
        if stream is None:
            return self.current_stream(), True
        if not isinstance(stream, Stream):
            raise InvalidArgumentError(f"stream must be an anychip.Stream, got {type(stream).__name__}")
        if stream.device is not self:
            raise InvalidArgumentError(f"{stream!r} cannot run work of {self}; pass a Stream of {self}")
        return stream, False


def _check_range(buf: Buffer, offset: int, nbytes: int, what: str) -> None:
    if offset + nbytes > buf.nbytes:
        raise InvalidArgumentError(
            f"{what}: range [{offset}, {offset + nbytes}) runs past the end of a {buf.nbytes}-byte buffer")


_U8 = np.dtype(np.uint8)


def _host_bytes(obj: Any, writable: bool, side: str) -> np.ndarray:
    """A 1-D uint8 view of host memory (copied to contiguous form when a source needs it)."""
    if not isinstance(obj, np.ndarray):
        try:
            mv = memoryview(obj)
        except TypeError:
            raise InvalidArgumentError(
                f"the {side} must be an anychip.Buffer or a host array (NumPy array or bytes-like), "
                f"got {type(obj).__name__}") from None
        if writable and mv.readonly:
            raise InvalidArgumentError(f"the {side} host object is read-only")
        if "O" in mv.format:
            raise InvalidArgumentError(f"the {side} holds Python objects (format {mv.format!r}); "
                                       "only plain data can be copied to or from a device")
        if mv.c_contiguous:
            return np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)
        if writable:
            raise InvalidArgumentError(f"the {side} host object must be C-contiguous")
        try:
            obj = np.asarray(mv)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise InvalidArgumentError(f"the {side} host object is not C-contiguous and NumPy cannot read it "
                                       f"({exc}); pass a C-contiguous copy") from None
    arr = obj
    if arr.dtype.hasobject:
        raise InvalidArgumentError(f"the {side} array holds Python objects (dtype {arr.dtype}); "
                                   "only plain data can be copied to or from a device")
    if not arr.flags.c_contiguous:
        if writable:
            raise InvalidArgumentError(f"the {side} host array must be C-contiguous "
                                       "(use numpy.ascontiguousarray)")
        arr = np.ascontiguousarray(arr)
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"the {side} host array is read-only")
    return arr.ravel().view(_U8)        # (ravel of a C-contiguous array is a view, and fast)


def _copy_size(nbytes: Any, src_offset: int, ssize: int, dst_offset: int, dsize: int) -> int:
    """The byte count of a copy (default: the rest of the source), checked against both ends."""
    if nbytes is None:
        if src_offset > ssize:
            raise InvalidArgumentError(f"src_offset {src_offset} is past the end of the {ssize}-byte source")
        nbytes = ssize - src_offset
    else:
        nbytes = non_negative_int(nbytes, "nbytes")
    if src_offset + nbytes > ssize:
        raise InvalidArgumentError(
            f"copy of {nbytes} bytes from offset {src_offset} runs past the end of the {ssize}-byte source")
    if dst_offset + nbytes > dsize:
        raise InvalidArgumentError(
            f"copy of {nbytes} bytes to offset {dst_offset} runs past the end of the {dsize}-byte destination")
    return int(nbytes)


def copy(dst: Any, src: Any, nbytes: int | None = None, *, dst_offset: int = 0, src_offset: int = 0,
         stream: Stream | None = None, _sync: bool | None = None) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst``; each is a Buffer or a host array.

    Without ``stream`` the copy is synchronous: it is enqueued on the current
    stream of the device doing it (the source's for device-to-*), which is then
    synchronized. With ``stream`` (a stream of that device) it is only enqueued;
    host memory is kept alive until the copy is known to be complete, and the
    caller must not read a destination host array before then. Copies between devices
    of different backends stage through host memory.
    """
    dbuf, sbuf = isinstance(dst, Buffer), isinstance(src, Buffer)
    if not (dbuf or sbuf):
        raise InvalidArgumentError("copy needs at least one anychip.Buffer (use numpy for host-to-host copies)")
    dst_offset = non_negative_int(dst_offset, "dst_offset")
    src_offset = non_negative_int(src_offset, "src_offset")
    if sbuf:
        sblock = src._check()
        ssize = src.nbytes
    else:
        src = _host_bytes(src, False, "source")
        ssize = src.nbytes
    if dbuf:
        dblock = dst._check()
        dsize = dst.nbytes
    else:
        dst = _host_bytes(dst, True, "destination")
        dsize = dst.nbytes
    nbytes = _copy_size(nbytes, src_offset, ssize, dst_offset, dsize)

    dev: Device = src.device if sbuf else dst.device
    s, sync = dev._stream_for(stream)
    if _sync is not None:
        sync = _sync or sync
    if nbytes == 0:
        return
    plugin, index = dev.plugin, dev.index
    if sbuf and dbuf:
        if dst.device is dev:
            plugin._copy(index, dblock.handle, dst._offset + dst_offset, sblock.handle, src._offset + src_offset,
                         nbytes, D2D, s._live())
        else:
            _copy_between_devices(dst, dblock, dst_offset, src, sblock, src_offset, nbytes, s, sync)
            return
    elif dbuf:
        plugin._copy(index, dblock.handle, dst._offset + dst_offset, src, src_offset, nbytes, H2D, s._live())
        if not sync:
            s._keep_alive(src)
    else:
        plugin._copy(index, dst, dst_offset, sblock.handle, src._offset + src_offset, nbytes, D2H, s._live())
        if not sync:
            s._keep_alive(dst)
    if sync:
        s.synchronize()


def _copy_between_devices(dst: Buffer, dblock: Any, dst_offset: int, src: Buffer, sblock: Any,
                          src_offset: int, nbytes: int, s: Stream, sync: bool) -> None:
    sdev, ddev = src.device, dst.device
    if sdev.plugin is ddev.plugin:
        try:
            sdev.plugin._copy_peer(ddev.index, dblock.handle, dst._offset + dst_offset, sdev.index, sblock.handle,
                                   src._offset + src_offset, nbytes, s._live())
        except UnsupportedError:
            pass
        else:
            if sync:
                s.synchronize()
            return
    # stage through host memory: device-to-host on the source stream, then host-to-device
    staging = np.empty(nbytes, dtype=np.uint8)
    sdev.plugin._copy(sdev.index, staging, 0, sblock.handle, src._offset + src_offset, nbytes, D2H, s._live())
    s.synchronize()
    ds = ddev.current_stream()
    ddev.plugin._copy(ddev.index, dblock.handle, dst._offset + dst_offset, staging, 0, nbytes, H2D, ds._live())
    if sync:
        ds.synchronize()
    else:
        ds._keep_alive(staging)


# -- selection and the current device --------------------------------------

def _reset_selection() -> None:
    global _selected, _selected_env
    with _lock:
        _selected = None
        _selected_env = None


registry.on_change(_reset_selection)


def _selection() -> list[Device]:
    global _selected, _selected_env
    env = environment.devices()
    sel = _selected
    if sel is not None and env == _selected_env:
        return sel
    with _lock:
        infos = registry.backends()
        chosen = select(env, infos)
        by_name = {b.name: b for b in infos}
        result = []
        for name, index in chosen:
            key = (name, index)
            dev = _instances.get(key)
            if dev is None or dev.plugin is not by_name[name].plugin:
                dev = _instances[key] = Device(by_name[name], index)
            result.append(dev)
        _selected, _selected_env = result, env
        return result


def _after_fork_in_child() -> None:
    """A forked child starts with a fresh front end, as the simulator starts it with
    fresh devices: new locks (another parent thread may have held one at the fork),
    empty allocators, no streams, the selection recomputed. Device objects stay the
    same; the parent's buffers, streams and events are not usable in the child."""
    global _lock
    _lock = threading.RLock()
    for dev in list(_instances.values()):
        dev._forget_parent()
    _tls.streams = {}
    _reset_selection()


os.register_at_fork(after_in_child=_after_fork_in_child)


def devices(backend: str | None = None) -> list[Device]:
    """The selected devices (``ANYCHIP_DEVICES``) in priority order, optionally of one backend."""
    sel = _selection()
    if backend is None:
        return list(sel)
    backend = _backend_name(backend)
    if registry.backend(backend) is None:
        raise SelectionError(f"unknown backend {backend!r}; known: {', '.join(b.name for b in registry.backends())}")
    return [d for d in sel if d.backend == backend]


def _find(sel: list[Device], backend: str, index: int | None) -> Device | None:
    """The first selected device of ``backend`` (with ``index`` when given), or None."""
    for d in sel:
        if d.backend == backend and (index is None or d.index == index):
            return d
    return None


def _backend_name(name: str) -> str:
    """The registered spelling of a backend name (names match in any case, as in ANYCHIP_DEVICES)."""
    for b in registry.backends(load=False):
        if b.name.lower() == name.lower():
            return b.name
    return name


def default_device() -> Device:
    """The first selected device."""
    return _selection()[0]


def device(spec: Any = None) -> Device:
    """Look up a device: ``"ascend:1"``, ``"cpu"`` (first selected device of that
    backend), a Device, or None for the current device. Use as ``with anychip.device("cpu:0"):``."""
    if spec is None:
        return current_device()
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"a device is named by a string like 'cpu:0', got {type(spec).__name__} {spec!r}")
    name, colon, idx = spec.partition(":")
    name, idx = name.strip(), idx.strip()
    if colon and not (idx.isascii() and idx.isdigit()):
        raise SelectionError(f"bad device name {spec!r}: expected 'backend:N' with N in ASCII digits, e.g. 'cpu:0'")
    sel = _selection()
    index = int(idx) if colon else None
    found = _find(sel, name, index)
    if found is None and _backend_name(name) != name:    # names match in any case
        name = _backend_name(name)
        found = _find(sel, name, index)
    if found is not None:
        return found
    info = registry.backend(name)
    if info is None:
        known = ", ".join(b.name for b in registry.backends())
        raise SelectionError(f"unknown backend {name!r} in device name {spec!r}; known backends: {known}")
    if not info.available:
        raise SelectionError(f"device {spec!r}: backend {name!r} is unavailable: {info.reason}")
    env = environment.devices()
    if colon and int(idx) >= info.device_count:
        raise SelectionError(f"device {spec!r} does not exist: {name} has {info.device_count} device(s)")
    selected = ", ".join(d.name for d in sel)
    raise SelectionError(f"device {spec!r} is not selected by ANYCHIP_DEVICES={env!r}; selected: {selected}")


def current_device() -> Device:
    """This thread's current device (default: the first selected device)."""
    d = _tls.device
    return d if d is not None else default_device()


def set_device(spec: Any) -> Device:
    """Make a device current on this thread and return it."""
    d = device(spec)
    _tls.device = d
    return d


__all__ += ["Event", "Stream"]


set_device_lookup(device)       # streams and events resolve their device argument with it
