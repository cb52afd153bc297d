"""Device-agnostic runtime policy: registry, selection, devices, streams, buffers, allocator."""
from .buffer import Buffer
from .device import Device, copy, current_device, default_device, device, devices, set_device
from .errors import (
    AnychipError,
    CollectiveError,
    CollectiveTimeout,
    DeviceError,
    InvalidArgumentError,
    OutOfMemoryError,
    PluginError,
    SelectionError,
    UnsupportedError,
)
from .kernels import Kernels, KernelSet, kernels_of
from .native_ccl import NativeLibrary
from .plugin import DevicePlugin
from .registry import BackendInfo, backends, register_plugin, unregister_plugin
from .status import StatusCodes
from .stream import Event, Stream, current_stream

__all__ = [
    "AnychipError", "BackendInfo", "Buffer", "CollectiveError", "CollectiveTimeout", "Device", "DeviceError",
    "DevicePlugin", "Event", "InvalidArgumentError", "KernelSet", "Kernels", "NativeLibrary", "OutOfMemoryError",
    "PluginError", "SelectionError", "StatusCodes", "Stream", "UnsupportedError", "backends", "copy", "current_device",
    "current_stream", "default_device", "device", "devices", "kernels_of", "register_plugin", "set_device",
    "unregister_plugin",
]
