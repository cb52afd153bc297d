"""A stand-in for the parts of CuPy that anychip's CUDA backend calls (tests only).

``tests/devices/test_cuda.py`` runs this file as the module ``cupy`` (in process, or as
``cupy/__init__.py`` in a temporary directory for subprocesses). It follows
CuPy 13 / 14 wherever the backend depends on it, and ``test_cuda.py`` checks
its names and signatures against the real classes when CuPy is importable:

* ``runtime.streamQuery`` / ``eventQuery`` return the status (0, 600 not
  ready, or an error such as 700) instead of raising; ``Stream.done`` /
  ``Event.done`` are ``... == 0``, as in ``cupy/cuda/stream.pyx``;
* ``Stream.device_id`` (-1 for ``Stream.null``), ``Stream.is_non_blocking``;
  ``Event(block, disable_timing, interprocess)`` has ``ptr`` and no device;
* ``UnownedMemory(ptr, size, owner, device_id=-1)`` keeps the owner as
  ``_owner``; ``set_allocator(None)`` installs the unpooled ``_malloc``;
  ``cupy.cuda.memory.OutOfMemoryError(size, total, limit=0)``;
* ``getDeviceProperties()['uuid']`` is what Cython makes of ``char[16]``:
  the bytes up to the first zero byte, which may run on into ``luid``;
* the current device is per thread (0 in a new thread) and a device's
  primary context is created by the first call that needs it
  (``setDevice``, ``malloc``, ...); ``driver.ctxGetCurrent()`` is 0 in a
  thread that has none; a device in ``runtime.exclusive`` refuses a new
  context (EXCLUSIVE_PROCESS mode, held by another process);
* ``cupy.cuda.nccl`` is imported lazily and warns when NCCL is missing.

"Device memory" is host memory (ctypes), so copies really move bytes.
Knobs: COUNT, CAPACITY (env FAKE_CUPY_CAPACITY), UUIDS, LUID, NCCL_AVAILABLE,
runtime.fail_count, runtime.query_status, runtime.exclusive.
"""
import ctypes
import itertools
import os
import sys
import threading
import types
import warnings

__version__ = "14.2.0"
COUNT = 2
CAPACITY = int(os.environ.get("FAKE_CUPY_CAPACITY", 1 << 24))
UUIDS = [bytes.fromhex("8f2a1c3eaa55bb66cc77dd88ee99ff%02x" % (d + 1)) for d in range(8)]
LUID = bytes(8)                 # what follows uuid in cudaDeviceProp
NCCL_AVAILABLE = False

_NAMES = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 46: "cudaErrorDevicesUnavailable",
          100: "cudaErrorNoDevice", 101: "cudaErrorInvalidDevice", 400: "cudaErrorInvalidResourceHandle",
          600: "cudaErrorNotReady", 700: "cudaErrorIllegalAddress", 719: "cudaErrorLaunchFailure"}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__(f"{_NAMES.get(status, 'cudaErrorUnknown')}: stand-in error {status}")


class _Runtime(types.ModuleType):
    #: what tests set or read; everything else is a name of cupy.cuda.runtime
    KNOBS = {"KNOBS", "current", "contexts", "exclusive", "allocs", "streams", "events", "query_status",
             "used", "calls", "fail_count", "context_handle"}
    streamDefault, streamNonBlocking, streamLegacy, streamPerThread = 0, 1, 1, 2
    eventDefault, eventBlockingSync, eventDisableTiming, eventInterprocess = 0, 1, 2, 4
    hostAllocPortable = 1

    def __init__(self):
        super().__init__("cupy.cuda.runtime")
        self.CUDARuntimeError = CUDARuntimeError
        self._tls = threading.local()
        self.contexts = set()     # devices whose primary context exists in this process
        self.exclusive = set()    # devices that refuse a new context
        self.allocs = {}          # ptr -> (ctypes buffer, device, size)
        self.streams = {}         # ptr -> (device, flags)
        self.events = {}          # ptr -> {"device", "flags", "time"}
        self.query_status = {}    # stream or event ptr -> what streamQuery / eventQuery return
        self.used = [0] * COUNT
        self.calls = []
        self.fail_count = None    # an exception for getDeviceCount to raise
        self._handles = itertools.count(0x1000, 0x10)
        self._clock = 0.0

    # -- devices and contexts
    @property
    def current(self):
        return getattr(self._tls, "device", 0)

    def getDeviceCount(self):
        if self.fail_count is not None:
            raise self.fail_count
        return COUNT

    def _check_device(self, d):
        if not 0 <= d < COUNT:
            raise CUDARuntimeError(101)

    def _bind(self, d):
        if d not in self.contexts:
            if d in self.exclusive:
                raise CUDARuntimeError(46)
            self.contexts.add(d)
            self.calls.append(("contextCreate", d))
        self._tls.device = d
        self._tls.context = d

    def _context(self):
        """The current device's context, created on first use (as cudart does)."""
        self._bind(self.current)
        return self.current

    def context_handle(self):
        c = getattr(self._tls, "context", None)
        return 0 if c is None else 0xC000 + c

    def getDevice(self):
        return self.current

    def setDevice(self, d):
        self._check_device(d)
        self._bind(d)

    def getDeviceProperties(self, d):
        self._check_device(d)
        uuid = (UUIDS[d] + LUID + b"\0").split(b"\0", 1)[0]    # Cython's char[] -> bytes
        return {"name": b"Fake GPU %d" % d, "totalGlobalMem": CAPACITY, "major": 9, "minor": 0,
                "multiProcessorCount": 132, "pciBusID": 0x10 + d, "pciDeviceID": 0, "pciDomainID": 0,
                "uuid": uuid}

    def runtimeGetVersion(self):
        return 12040

    def driverGetVersion(self):
        return 12040

    def deviceSynchronize(self):
        self.calls.append(("deviceSynchronize", self._context()))

    # -- memory
    def memGetInfo(self):
        d = self._context()
        return CAPACITY - self.used[d], CAPACITY

    def malloc(self, n):
        d = self._context()
        if self.used[d] + n > CAPACITY:
            raise CUDARuntimeError(2)
        buf = ctypes.create_string_buffer(max(n, 1))
        ptr = ctypes.addressof(buf)
        self.allocs[ptr] = (buf, d, n)
        self.used[d] += n
        self.calls.append(("malloc", d, n))
        return ptr

    def free(self, ptr):
        d = self._context()
        if ptr not in self.allocs:
            raise CUDARuntimeError(1)
        assert self.allocs[ptr][1] == d, "cudaFree with another device current"
        _, d, n = self.allocs.pop(ptr)
        self.used[d] -= n
        self.calls.append(("free", d, n))

    def hostAlloc(self, n, flags):
        self.calls.append(("hostAlloc", self._context(), n, flags))
        return bytearray(n)

    def _check_range(self, ptr, n, device):
        for base, (_, d, size) in self.allocs.items():
            if base <= ptr and ptr + n <= base + size:
                assert d == device, f"pointer of device {d} used on device {device}"
                return
        raise CUDARuntimeError(1)

    def _check_stream(self, stream):
        d = self._context()
        if stream in self.streams:
            assert self.streams[stream][0] == d, "stream of another device used"
        elif stream not in (0, self.streamLegacy, self.streamPerThread):
            raise CUDARuntimeError(400)
        return d

    def memcpyAsync(self, dst, src, n, kind, stream):
        d = self._check_stream(stream)
        if kind in (1, 3):
            self._check_range(dst, n, d)
        if kind in (2, 3):
            self._check_range(src, n, d)
        self.calls.append(("memcpyAsync", kind, n, stream))
        ctypes.memmove(dst, src, n)

    def memcpyPeerAsync(self, dst, dst_dev, src, src_dev, n, stream):
        self._check_stream(stream)
        self._check_range(dst, n, dst_dev)
        self._check_range(src, n, src_dev)
        self.calls.append(("memcpyPeerAsync", dst_dev, src_dev, n))
        ctypes.memmove(dst, src, n)

    def memsetAsync(self, ptr, value, n, stream):
        self._check_range(ptr, n, self._check_stream(stream))
        ctypes.memset(ptr, value, n)

    # -- streams
    def streamCreateWithPriority(self, flags, priority):
        ptr = next(self._handles)
        self.streams[ptr] = (self._context(), flags)
        return ptr

    def streamDestroy(self, ptr):
        self.streams.pop(ptr, None)

    def _status(self, ptr, table):
        if ptr not in table and ptr not in (0, self.streamLegacy, self.streamPerThread):
            return 400
        return self.query_status.get(ptr, 0)

    def streamQuery(self, ptr):
        return self._status(ptr, self.streams)          # no raise: CuPy returns the status

    def streamSynchronize(self, ptr):
        self.calls.append(("streamSynchronize", ptr))
        if self._status(ptr, self.streams) not in (0, 600):
            raise CUDARuntimeError(self._status(ptr, self.streams))

    def streamWaitEvent(self, stream, event, flags=0):
        self.calls.append(("streamWaitEvent", stream, event))

    # -- events
    def eventCreateWithFlags(self, flags):
        ptr = next(self._handles)
        self.events[ptr] = {"device": self._context(), "flags": flags, "time": None}
        return ptr

    def eventDestroy(self, ptr):
        self.events.pop(ptr, None)

    def eventRecord(self, event, stream):
        d = self._check_stream(stream)
        if self.events[event]["device"] != d:
            raise CUDARuntimeError(400)
        self._clock += 1.5
        self.events[event]["time"] = self._clock

    def eventQuery(self, ptr):
        return self._status(ptr, self.events)           # no raise: CuPy returns the status

    def eventSynchronize(self, ptr):
        if self._status(ptr, self.events) not in (0, 600):
            raise CUDARuntimeError(self._status(ptr, self.events))

    def eventElapsedTime(self, start, end):
        a, b = self.events[start], self.events[end]
        if (a["flags"] | b["flags"]) & self.eventDisableTiming:
            raise CUDARuntimeError(400)
        return b["time"] - a["time"]


runtime = _Runtime()

driver = types.ModuleType("cupy.cuda.driver")
driver.ctxGetCurrent = runtime.context_handle


class Stream:
    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        if null:
            self.ptr, self.device_id = 0, -1
        elif ptds:
            self.ptr, self.device_id = runtime.streamPerThread, -1
        else:
            flags = runtime.streamNonBlocking if non_blocking else runtime.streamDefault
            self.ptr = runtime.streamCreateWithPriority(flags, priority or 0)
            self.device_id = runtime.getDevice()

    def __del__(self):
        if self.ptr not in (0, runtime.streamLegacy, runtime.streamPerThread):
            runtime.streamDestroy(self.ptr)

    @property
    def is_non_blocking(self):
        return bool(runtime.streams.get(self.ptr, (0, 0))[1] & runtime.streamNonBlocking)

    @property
    def done(self):
        return runtime.streamQuery(self.ptr) == 0

    def synchronize(self):
        runtime.streamSynchronize(self.ptr)

    def wait_event(self, event):
        runtime.streamWaitEvent(self.ptr, event.ptr)


Stream.null = Stream(null=True)


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = 0
        if interprocess and not disable_timing:
            raise ValueError("Timing must be disabled for interprocess events")
        flags = ((block and runtime.eventBlockingSync) | (disable_timing and runtime.eventDisableTiming)
                 | (interprocess and runtime.eventInterprocess))
        self.ptr = runtime.eventCreateWithFlags(flags)

    def __del__(self):
        if self.ptr:
            runtime.eventDestroy(self.ptr)

    @property
    def done(self):
        return runtime.eventQuery(self.ptr) == 0

    def record(self, stream=None):
        runtime.eventRecord(self.ptr, (stream or Stream.null).ptr)

    def synchronize(self):
        runtime.eventSynchronize(self.ptr)


def get_elapsed_time(start_event, end_event):
    return runtime.eventElapsedTime(start_event.ptr, end_event.ptr)


def alloc_pinned_memory(size):
    return runtime.hostAlloc(size, runtime.hostAllocPortable)


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes).")


class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self._owner = ptr, size, owner
        self.device_id = runtime.getDevice() if device_id < 0 else device_id


class Memory:
    def __init__(self, size):
        self.size, self.device_id = size, runtime.getDevice()
        self.ptr = runtime.malloc(size) if size else 0

    def __del__(self):
        if self.ptr:
            runtime.free(self.ptr)


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id


class MemoryPool:
    def malloc(self, size):
        return MemoryPointer(Memory(size), 0)


def _malloc(size):
    return MemoryPointer(Memory(size), 0)


_current_allocator = MemoryPool().malloc


def set_allocator(allocator=None):
    global _current_allocator
    _current_allocator = _malloc if allocator is None else allocator


def get_allocator():
    return _current_allocator


memory = types.ModuleType("cupy.cuda.memory")
for _name in ("OutOfMemoryError", "UnownedMemory", "Memory", "MemoryPointer", "MemoryPool", "_malloc",
              "set_allocator", "get_allocator"):
    setattr(memory, _name, globals()[_name])


def _load_nccl():
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = NCCL_AVAILABLE
    if not NCCL_AVAILABLE:   # what CuPy's _environment._preload_warning prints
        warnings.warn("\nnccl library could not be loaded.\n\n"
                      "Reason: ImportError (libnccl.so.2: cannot open shared object file: No such file or directory)"
                      "\n\nYou can install the library by:\n  $ pip install \"nvidia-nccl-cu12>=2.18.1,<3\"\n",
                      stacklevel=3)
    sys.modules["cupy.cuda.nccl"] = nccl
    cuda.nccl = nccl
    return nccl


def _cuda_getattr(name):
    if name == "nccl":            # imported on first use, as in CuPy
        return _load_nccl()
    raise AttributeError(f"module 'cupy.cuda' has no attribute {name!r}")


cuda = types.ModuleType("cupy.cuda")
cuda.__getattr__ = _cuda_getattr
for _name in ("runtime", "driver", "memory", "Stream", "Event", "get_elapsed_time", "alloc_pinned_memory",
              "UnownedMemory", "MemoryPointer", "set_allocator", "get_allocator"):
    setattr(cuda, _name, globals()[_name])
sys.modules.update({"cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy.cuda.driver": driver,
                    "cupy.cuda.memory": memory})
