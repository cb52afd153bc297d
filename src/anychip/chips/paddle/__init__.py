"""Existing PaddlePaddle CustomDevice plugins as anychip backends (see docs/paddle.md).

A CustomDevice plugin is a shared library exporting ``void InitPlugin(CustomRuntimeParams *)``
that fills a ``C_DeviceInterface`` of function pointers (Paddle's
``paddle/phi/backends/device_ext.h``). anychip loads it unchanged, as Paddle does:

* libraries: every ``*.so`` in the directory ``CUSTOM_DEVICE_ROOT``, and every library in
  the directories of ``ANYCHIP_PLUGIN_PATH`` that exports ``InitPlugin``;
* the core zeroes both structs, writes their sizes, calls ``InitPlugin`` and then checks
  what the plugin wrote: a ``device_type`` (NULL means the plugin's size check refused
  anychip's structs: it was built against another header), a runtime version of at least
  0.1.1 with major 0, NULL reserved slots (a plugin that writes there was built against
  another member order), and every entry Paddle requires;
* one backend per plugin, named by its ``device_type``; ``initialize`` and ``init_device``
  run when the backend is first used, and a failure there refuses it with the reason.

The mirror below is written from Paddle 3.x's header (C_DeviceInterface 1128 bytes,
CustomRuntimeParams 96 on LP64); Paddle 2.6's (912 / 88) is refused by its size check.

One file per concept, as every split backend: ``loader.py`` (finding and initializing
the library), ``device.py``, ``stream.py``, ``memory.py``, ``event.py``, ``ccl.py`` (the
``xccl_*`` collectives); the plugin class below is their sum.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from .ccl import PaddleXccl
from .event import PaddleEvents
from .loader import HEADER, REQUIRED, RUNTIME_VERSION, _init_plugin, _Params, _params_cache, ffi, root_libraries
from .memory import PaddleMemory

__all__ = ["HEADER", "PaddlePlugin", "PaddleXccl", "REQUIRED", "RUNTIME_VERSION", "ffi", "probe", "root_libraries"]


class PaddlePlugin(PaddleMemory, PaddleEvents):
    """One Paddle CustomDevice plugin (a subclass per ``device_type`` is made by :func:`probe`)."""

    api_version = (1, 0)
    priority = -10


#: realpath -> the plugin made from what InitPlugin filled (one per library and process)
_instances: dict[str, Any] = {}
_classes: dict[str, type] = {}
_instances_lock = threading.Lock()


def probe(path: str) -> tuple[str, Any]:
    """Open the Paddle plugin at ``path`` (the registry's probe for libraries exporting
    ``InitPlugin``): (backend name, loader). Raises PluginError with the reason to refuse it."""
    key = os.path.realpath(path)
    with _instances_lock:
        params = _params_cache.get(key)
        if params is None:
            params = _params_cache[key] = _init_plugin(path)
        name = params.device_type
        cls = _classes.get(name)
        if cls is None:
            cls = _classes[name] = type(f"PaddlePlugin_{name}", (PaddlePlugin,), {"name": name,
                                                                                "__module__": __name__})
    return name, _Loader(cls, params)


class _Loader:
    def __init__(self, cls: type, params: _Params) -> None:
        self.cls, self.params = cls, params

    def __call__(self) -> PaddlePlugin:
        key = os.path.realpath(self.params.path)
        with _instances_lock:
            plugin = _instances.get(key)
            if plugin is None or plugin._pid != os.getpid():
                plugin = _instances[key] = self.cls(self.params)
            return plugin


