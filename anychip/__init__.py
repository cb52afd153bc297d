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


def _use_the_built_anychip() -> None:
    """A source checkout whose C parts were never built (``git clone``, then ``python -m ...``
    or ``python -c ...`` in its root: the current directory comes first on ``sys.path``) is
    never imported in place of a built anychip further down ``sys.path``: that one is loaded
    instead. Where no built one exists, the error says what to run."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    def built(pkg: str) -> bool:
        lib = os.path.join(pkg, "_lib")
        names = os.listdir(lib) if os.path.isdir(lib) else []
        return any(n.startswith("_alloc.") and n.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
                   for n in names)

    here = os.path.dirname(os.path.abspath(__file__))
    if built(here):
        return
    for entry in sys.path:
        pkg = os.path.join(os.path.abspath(entry or os.curdir), "anychip")
        if os.path.isfile(os.path.join(pkg, "__init__.py")) and not os.path.samefile(pkg, here) and built(pkg):
            spec = importlib.util.spec_from_file_location(
                "anychip", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            for name in [m for m in sys.modules if m.startswith("anychip.")]:
                del sys.modules[name]
            sys.modules["anychip"] = module
            spec.loader.exec_module(module)
            # `import anychip` returns sys.modules["anychip"]: the built one. The rest of this
            # file then only binds that package's names in this discarded module.
            return
    raise ImportError(
        f"anychip at {here} is a source tree whose C parts are not built (no compiled allocator core in "
        f"{os.path.join(here, '_lib')}) and no built anychip is installed; run `pip install {os.path.dirname(here)}` "
        f"(or `pip install -e {os.path.dirname(here)}` to build it in place)")


_use_the_built_anychip()

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
