"""anychip: one runtime API — devices, a caching allocator, streams and events,
copies, collectives — over CUDA, OpenCL, vendor chips (real or simulated) and
the host CPU.

    >>> import anychip, numpy as np
    >>> dev = anychip.device("cpu:0")
    >>> buf = dev.alloc(16).copy_from(np.arange(4, dtype=np.int32))
    >>> buf.to_numpy(np.int32)
    array([0, 1, 2, 3], dtype=int32)
"""
from __future__ import annotations

from ._data import get_include
from ._version import __version__
from .runtime.buffer import Buffer
from .runtime.device import (
    Device,
    copy,
    current_device,
    default_device,
    device,
    devices,
    set_device,
)
from .runtime.errors import (
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
from .runtime.plugin import DevicePlugin
from .runtime.registry import BackendInfo, backends, register_plugin, unregister_plugin
from .runtime.stream import Event, Stream, current_stream

# The package anychip/tensor shares its name with the function anychip.tensor(): import
# the package first, then bind
# the function (``from anychip.tensor import Tensor`` keeps working through sys.modules).
from . import tensor as _tensor_package  # noqa: F401  (isort: skip)
from .tensor import (  # noqa: E402  (isort: skip)
    DLPackError,
    DType,
    Tensor,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int32,
    int64,
    uint8,
    arange,
    as_tensor,
    cast,
    empty,
    erf,
    exp,
    from_dlpack,
    full,
    log,
    matmul,
    maximum,
    minimum,
    ones,
    relu,
    sqrt,
    tanh,
    tensor,
    zeros,
)

__all__ = [
    "__version__",
    # devices
    "Device", "devices", "device", "default_device", "current_device", "set_device",
    # memory, copies, ordering
    "Buffer", "copy", "Stream", "Event", "current_stream",
    # backends
    "DevicePlugin", "BackendInfo", "backends", "register_plugin", "unregister_plugin",
    # errors
    "AnychipError", "DeviceError", "OutOfMemoryError", "InvalidArgumentError", "UnsupportedError",
    "PluginError", "SelectionError", "CollectiveError", "CollectiveTimeout",
    # tensors
    "Tensor", "tensor", "as_tensor", "empty", "zeros", "ones", "full", "arange", "from_dlpack", "DLPackError",
    "matmul", "maximum", "minimum", "cast", "relu", "exp", "log", "tanh", "sqrt", "erf",
    "DType", "bool_", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    # plugin authors
    "get_include",
]
