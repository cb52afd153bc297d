"""anychip's chips as a PyTorch device (PrivateUse1, named ``anychip``; see docs/torch.md).

    >>> import torch, anychip.torch
    >>> x = torch.ones(4, device="anychip")         # on the simulated Ascend by default
    >>> (x * 3).cpu()
    tensor([3., 3., 3., 3.])

PyTorch has one PrivateUse1 slot per process, so one anychip backend is the ``anychip``
device of a process: ``ANYCHIP_TORCH`` names it (``ascend``, ``kunlun``, ``hygon`` or a C
plugin's device type); unset, the backend of ``anychip launch --device`` (its
``ANYCHIP_LAUNCH_DEVICE``), else the first backend anychip finds that has an
``anychip/plugin.h`` face. ``anychip.torch.backend()`` says which one this process has.
Device ``anychip:N`` is the backend's device N.

Memory comes from the backend's anychip caching allocator (the pool anychip's own Buffers
use; ``torch.anychip.memory_stats()`` is ``anychip.Device.memory_stats()``), streams are
anychip Streams, events the plugin's events. This module is also ``torch.anychip``.
"""
from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ..runtime.device import Device
from ..runtime.device import device as _anychip_device
from ..runtime.env import launch_device, mark_torch_autoload, torch_backend, torch_kernels
from ..runtime.errors import InvalidArgumentError
from ..runtime.registry import backends as _backends
from ..runtime.stream import Stream as _AnychipStream
from ._build import load_extension

__all__ = ["NAME", "ENV", "backend", "is_available", "device_count", "current_device", "set_device", "synchronize",
           "current_stream", "default_stream", "anychip_device", "anychip_stream", "buffer_of", "memory_stats",
           "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
           "reset_peak_memory_stats", "empty_cache", "mem_get_info", "plugin_library", "get_rng_state",
           "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed", "manual_seed_all", "seed",
           "seed_all", "initial_seed"]

#: the torch device type: torch.device("anychip", N)
NAME = "anychip"
#: the variable naming the anychip backend this process's PrivateUse1 device is
ENV = "ANYCHIP_TORCH"
_PRIVATEUSE1 = 20      # c10::DeviceType::PrivateUse1


def plugin_library(name: str) -> tuple[str | None, str]:
    """(the anychip/plugin.h library serving backend ``name``, why not when None)."""
    info = next((b for b in _backends() if b.name == name), None)
    if info is None:
        known = ", ".join(b.name for b in _backends())
        return None, f"anychip has no backend {name!r} (it has {known})"
    if not info.available or info.plugin is None:
        return None, f"backend {name} is unavailable: {info.reason}"
    path = getattr(info.plugin, "path", None) or getattr(info.plugin, "library_path", None)
    if not isinstance(path, str):
        return None, (f"backend {name} is served by a Python binding, not an anychip/plugin.h library "
                      "(the PrivateUse1 device drives plugin.h faces: the simulated chips and C plugins)")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        return None, f"{path} cannot be opened ({exc})"
    if not hasattr(lib, "anychip_plugin_init"):
        return None, (f"backend {name} is served by {path}, which has no anychip/plugin.h face "
                      "(anychip_plugin_init)")
    return path, ""


def _choose() -> tuple[str, str]:
    raw = torch_backend()
    if raw:
        name = raw.split(":")[0].lower()
        path, why = plugin_library(name)
        if path is None:
            raise InvalidArgumentError(f"{ENV}={raw}: {why}; set {ENV} to one of "
                                       f"{', '.join(_candidates()) or '(none here)'}")
        return name, path
    launch = launch_device().split(":")[0].strip().lower()
    if launch:
        path, why = plugin_library(launch)
        if path is None:
            raise InvalidArgumentError(f"ANYCHIP_LAUNCH_DEVICE={launch}: {why}; set {ENV} to one of "
                                       f"{', '.join(_candidates()) or '(none here)'}")
        return launch, path
    for name in _candidates():
        path, _ = plugin_library(name)
        if path is not None:
            return name, path
    raise InvalidArgumentError("anychip.torch: no anychip backend with an anychip/plugin.h face is available here "
                               f"({_why_no_simulated_chip()})")


def _why_no_simulated_chip() -> str:
    """Why the simulated chips cannot serve the device (none has a device, or they were not built)."""
    sims = [b for b in _backends() if b.simulated]
    if not sims:
        return "the simulated chips need anychip's built simulator libraries"
    empty = [b.name for b in sims if b.device_count == 0]
    if len(empty) == len(sims):
        raw = os.environ.get("ANYCHIP_SIM_DEVICES")
        return (f"the simulated chips ({', '.join(empty)}) have 0 devices"
                + (f": ANYCHIP_SIM_DEVICES={raw}" if raw is not None else ""))
    return "; ".join(f"{b.name}: {b.reason}" for b in sims if not b.available)


def _candidates() -> list[str]:
    return [b.name for b in _backends() if b.available and plugin_library(b.name)[0] is not None]


def _native(dev: Device, handle: Any) -> int:
    """A stream handle as the integer the plugin takes."""
    if handle is None:
        return 0
    if isinstance(handle, int):
        return handle
    ffi: Any = dev.plugin.ffi  # type: ignore[attr-defined]  # (the cffi backends have one)
    return int(ffi.cast("uintptr_t", handle))


class _State:
    def __init__(self) -> None:
        self.backend, self.library = _choose()
        info = next(b for b in _backends() if b.name == self.backend)
        self.devices = [_anychip_device(f"{self.backend}:{i}") for i in range(info.device_count)]
        self.streams: list[list[_AnychipStream]] = [[d.default_stream] for d in self.devices]
        self.lock = threading.Lock()

    def alloc(self, index: int, nbytes: int, sid: int) -> tuple[int, Any]:
        buf = self.devices[index].alloc(nbytes, stream=self.streams[index][sid])
        return buf.ptr or 0, buf

    def record(self, buffer: Any, index: int, sid: int) -> None:
        buffer.record_stream(self.streams[index][sid])

    def new_stream(self, index: int) -> tuple[int, int]:
        dev = self.devices[index]
        s = _AnychipStream(dev)
        with self.lock:
            self.streams[index].append(s)
            sid = len(self.streams[index]) - 1
        return sid, _native(dev, s._handle)

    def stats(self, index: int, what: str) -> Any:
        dev = self.devices[index]
        if what == "stats":
            return dev.memory_stats()
        if what == "empty_cache":
            dev.empty_cache()
        elif what == "reset_peak":
            dev.reset_peak_memory_stats()
        elif what == "reset_accumulated":
            dev.allocator.reset_accumulated_stats()
        return None


_state = _State()
_C = load_extension()
_C._init(_state.library, _state.backend, len(_state.devices),
         [_native(d, s[0]._handle) for d, s in zip(_state.devices, _state.streams, strict=True)],
         _state.alloc, _state.record, _state.new_stream, _state.stats, torch_kernels(), _state.devices,
         _state.streams)

torch.utils.rename_privateuse1_backend(NAME)
torch._register_device_module(NAME, sys.modules[__name__])
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_packed_sequence=True,
                                                     for_storage=True)
# the processes this one starts (DataLoader workers, torch.multiprocessing) have the device after
# their own `import torch` (the autoload entry point, anychip/_torch_autoload.py)
mark_torch_autoload()


# ---- torch.anychip ---------------------------------------------------------------------------

def backend() -> str:
    """The anychip backend this process's ``anychip`` device is (``ascend``, ...)."""
    return _state.backend


def is_available() -> bool:
    return len(_state.devices) > 0


def device_count() -> int:
    return len(_state.devices)


def _index(device: Any = None) -> int:
    if device is None:
        return int(_C.current_device())
    if isinstance(device, int):
        idx = device
    else:
        d = torch.device(device)
        if d.type != NAME:
            raise InvalidArgumentError(f"want an {NAME} device, got {d}")
        idx = int(_C.current_device()) if d.index is None else d.index
    if not 0 <= idx < len(_state.devices):
        raise InvalidArgumentError(f"{NAME}:{idx} does not exist: {_state.backend} has {len(_state.devices)} "
                                   f"device(s) here ({NAME}:0..{len(_state.devices) - 1})")
    return idx


def current_device() -> int:
    return int(_C.current_device())


def set_device(device: Any) -> None:
    torch.accelerator.set_device_index(_index(device))


def synchronize(device: Any = None) -> None:
    """Wait for every stream of the device (every anychip Stream made on it)."""
    _state.devices[_index(device)].synchronize()


def current_stream(device: Any = None) -> Stream:
    return Stream._of(torch.accelerator.current_stream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    return Stream(stream_id=0, device_index=_index(device), device_type=_PRIVATEUSE1)


def anychip_device(device: Any = None) -> Device:
    """The anychip Device behind ``anychip:N``."""
    return _state.devices[_index(device)]


def anychip_stream(stream: Any = None) -> _AnychipStream:
    """The anychip Stream behind a torch.Stream of the device (default: the current stream)."""
    if stream is None:
        idx = current_device()
        return _state.streams[idx][int(_C.current_stream_id(idx))]
    if stream.device.type != NAME:
        raise InvalidArgumentError(f"want a torch.Stream of the {NAME} device, got {stream}")
    return _state.streams[stream.device_index][stream.stream_id]


def buffer_of(tensor: torch.Tensor) -> Any:
    """The anychip Buffer view holding a dense tensor's elements (shares its memory)."""
    buf, offset = _C.buffer_of(tensor)
    return buf.view(offset, tensor.numel() * tensor.element_size())


def _storage_buffer(tensor: torch.Tensor) -> tuple[Any, int]:
    """(the anychip Buffer of a device tensor's storage, the tensor's byte offset in it)."""
    buf, offset = _C.buffer_of(tensor)
    return buf, int(offset)


def memory_stats(device: Any = None) -> dict[str, int]:
    """anychip's allocator statistics, with PyTorch's names (``allocated_bytes.all.current``...)."""
    return _state.devices[_index(device)].memory_stats()


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    _state.devices[_index(device)].reset_peak_memory_stats()


def empty_cache() -> None:
    for d in _state.devices:
        d.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return _state.devices[_index(device)].mem_info()


_forked = False


def _after_fork_in_child() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_in_bad_fork() -> bool:
    """True in a process forked from this one: the device does not survive fork() (every use of it
    there is refused, saying to use the 'spawn' start method), as torch.cuda says of CUDA."""
    return _forked


# ---- what torch's own code calls on a device module (torch.cuda's names) -----------------------------
# (autocast, torch.utils.checkpoint, torch.load's map_location, DeviceMesh, FSDP2, DCP, DTensor)

#: (what torch.utils.checkpoint reads before it saves the device's random state)
_initialized = True


def is_initialized() -> bool:
    """True: the device is set up when anychip.torch is imported."""
    return True


def init() -> None:
    """Nothing to do in the process that imported anychip.torch (the device is set up then); in a
    process forked from it, a RuntimeError, as ``torch.cuda.init()`` raises in a forked child."""
    _lazy_init()


def _lazy_init() -> None:
    if _forked:
        raise RuntimeError(f"Cannot re-initialize {NAME} in forked subprocess. To use {NAME} with multiprocessing, "
                           "you must use the 'spawn' start method (the device's memory and streams do not survive "
                           "fork())")


class device:
    """Context manager making ``anychip:N`` the current device (as ``torch.cuda.device``);
    ``None`` or a negative index changes nothing."""

    def __init__(self, device: Any) -> None:
        negative = device is None or (isinstance(device, int) and device < 0)
        self.idx = -1 if negative else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            self.prev_idx = current_device()
            set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx >= 0:
            set_device(self.prev_idx)


class device_of(device):
    """Context manager making the device of a tensor (or storage) current; a CPU one changes nothing."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.get_device() if obj.device.type == NAME else None)


class Stream(torch.Stream):
    """A stream of the device (a ``torch.Stream``; an anychip Stream underneath, see ``anychip_stream``):
    ``Stream()`` makes a new one on the current device, ``Stream(device, priority=p)`` on another."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:      # (stream_id, device_index, device_type): an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device(NAME, _index(device)), priority=priority)

    @classmethod
    def _of(cls, stream: torch.Stream) -> Stream:
        return cls(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


class Event(torch.Event):
    """An event of the device (a ``torch.Event``; the plugin's event underneath)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                device: Any = None) -> Event:
        return super().__new__(cls, device=torch.device(NAME, _index(device)), enable_timing=enable_timing,
                               blocking=blocking, interprocess=interprocess)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device (and its device the current one)."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager making ``stream`` current (on its device, and that device current), then
    restoring both; ``None`` changes nothing (as ``torch.cuda.StreamContext``)."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.src_prev_stream: torch.Stream | None = None
        self.dst_prev_stream: torch.Stream | None = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device_index != self.stream.device_index:
            self.dst_prev_stream = current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        if self.dst_prev_stream is not None:
            torch.accelerator.set_stream(self.dst_prev_stream)
        assert self.src_prev_stream is not None
        torch.accelerator.set_stream(self.src_prev_stream)


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.anychip.stream(s):`` runs the block's work on ``s``."""
    return StreamContext(stream)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes ``torch.autocast("anychip", dtype=...)`` takes."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled(NAME)


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled(NAME, enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype(NAME)


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype(NAME, dtype)


@dataclass(frozen=True)
class _DeviceProperties:
    """What ``get_device_properties`` gives (``torch.cuda``'s names where they apply)."""
    name: str
    backend: str
    index: int
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    simulated: bool


def get_device_properties(device: Any = None) -> _DeviceProperties:
    dev = _state.devices[_index(device)]
    props = dev.properties
    major, minor = _capability(props)
    return _DeviceProperties(name=str(props.get("name") or dev.name), backend=dev.backend, index=dev.index,
                             total_memory=int(props.get("total_memory") or dev.mem_info()[1]), major=major,
                             minor=minor, multi_processor_count=int(props.get("multi_processor_count") or 0),
                             simulated=bool(props.get("simulated")))


def _capability(props: dict) -> tuple[int, int]:
    cap = props.get("compute_capability") or props.get("capability")
    if isinstance(cap, str) and "." in cap:
        major, _, minor = cap.partition(".")
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    if isinstance(cap, (tuple, list)) and len(cap) == 2:
        return int(cap[0]), int(cap[1])
    return int(props.get("major") or 0), int(props.get("minor") or 0)


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) as the backend reports them; (0, 0) where it reports none."""
    p = get_device_properties(device)
    return p.major, p.minor


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """The allocator statistics as a table: each metric's current, peak, allocated and freed totals."""
    idx = _index(device)
    stats = memory_stats(idx)
    rows = []
    for metric in sorted({k.split(".")[0] for k in stats if k.count(".") == 2}):
        values = [stats.get(f"{metric}.all.{what}", 0) for what in ("current", "peak", "allocated", "freed")]
        rows.append(f"{metric:<24}" + "".join(f"{v:>16,}" for v in values))
    if not abbreviated:
        rows += [f"{k:<24}{v:>16,}" for k, v in sorted(stats.items()) if k.count(".") != 2 and isinstance(v, int)]
    title = f"{NAME}:{idx} ({_state.backend})"
    head = f"{title:<24}" + "".join(f"{what:>16}" for what in ("current", "peak", "allocated", "freed"))
    return "\n".join([head, "-" * len(head), *rows])


# ---- torch.compile: dynamo's device interface, inductor's backend (registered when torch needs them) -----

#: what inductor's init_backend_registration asks the device module for (anychip/torch/_inductor.py)
_INDUCTOR_CODEGENS = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def __getattr__(name: str) -> Any:
    if name in _INDUCTOR_CODEGENS:
        from ._inductor import setup
        return setup(sys.modules[__name__])[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _host_kernel_wait(device_idx: int | None) -> None:
    """What inductor's wrapper of a graph on the device calls before each C++ kernel the host runs on
    the device's memory: wait for the device's current stream."""
    torch.accelerator.current_stream(device_idx).synchronize()


class _RegisterDynamoInterface(importlib.abc.MetaPathFinder):
    """Registers the device's dynamo interface (anychip/torch/_dynamo_interface.py) right after
    ``torch._dynamo.device_interface`` is first imported: importing it here would cost ~1.8 s."""

    MODULE = "torch._dynamo.device_interface"

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, module_spec: Any) -> Any:
                return loader.create_module(module_spec)

            def exec_module(self, module: Any) -> None:
                module.__spec__.loader = module.__loader__ = loader
                loader.exec_module(module)
                from ._dynamo_interface import register
                register(sys.modules[__name__])

        spec.loader = _Loader()
        return spec


#: what torch.compile's default backend says, once, when it runs a graph on a device whose memory is
#: not host memory through aot_eager
NOT_HOST_MEMORY_FALLBACK = (
    "torch.compile on the {name} device ({backend}): its memory is not host memory (the plugin does not set "
    "ANYCHIP_PLUGIN_HOST_MEMORY), so the host cannot run inductor's generated kernels on it; the graphs on the "
    "device run through backend='aot_eager' instead (the device's own kernels, unfused)")


def _host_memory() -> bool:
    """Whether every device of the backend has host memory (plugin.h's ANYCHIP_PLUGIN_HOST_MEMORY)."""
    return all(bool(getattr(d.plugin, "host_memory", False)) for d in _state.devices)


def _inductor_falls_back_to_aot_eager() -> None:
    """torch.compile's default backend (inductor) runs each graph that has an input on the device through
    aot_eager instead, with one warning: for a device whose memory is not host memory."""
    wrapper: Any = torch._TorchCompileInductorWrapper
    inductor = wrapper.__call__
    warned: list[bool] = []

    def __call__(self: Any, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
        if not any(isinstance(t, torch.Tensor) and t.device.type == NAME for t in inputs_):
            return inductor(self, model_, inputs_, **kwargs)
        if not warned:
            warned.append(True)
            warnings.warn(NOT_HOST_MEMORY_FALLBACK.format(name=NAME, backend=_state.backend), RuntimeWarning,
                          stacklevel=2)
        from torch._dynamo.backends.debugging import aot_eager
        return aot_eager(model_, inputs_)

    wrapper.__call__ = __call__


if not _host_memory():
    _inductor_falls_back_to_aot_eager()
if _RegisterDynamoInterface.MODULE in sys.modules:
    from ._dynamo_interface import register as _register_dynamo_interface
    _register_dynamo_interface(sys.modules[__name__])
else:
    sys.meta_path.insert(0, _RegisterDynamoInterface())


# ---- random numbers: each device's own generator (a Philox seed and offset, as CUDA's) -------------

#: each device's default generator (``torch.Generator("anychip:N")`` makes more)
default_generators: tuple[torch.Generator, ...] = tuple(_C.default_generator(i) for i in range(len(_state.devices)))


def _get_generator(device: Any = None) -> torch.Generator:
    return default_generators[_index(device)]


def get_rng_state(device: Any = None) -> torch.Tensor:
    """The device's generator state: 16 bytes, the seed then the offset (CUDA's layout)."""
    return default_generators[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    default_generators[_index(device)].set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for g, state in zip(default_generators, new_states, strict=True):
        g.set_state(state)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (its offset back to 0)."""
    default_generators[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    default_generators[current_device()].seed()


def seed_all() -> None:
    first = default_generators[0].seed()
    for g in default_generators[1:]:
        g.manual_seed(first)


def initial_seed() -> int:
    return default_generators[current_device()].initial_seed()
