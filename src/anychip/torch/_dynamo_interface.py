"""dynamo's device interface for the ``anychip`` device (``torch._dynamo.device_interface``).

Registered when ``torch._dynamo.device_interface`` is first imported (``anychip.torch`` puts an
import hook for it on ``sys.meta_path``), or at ``import anychip.torch`` when it already is:
importing dynamo costs about 1.8 s, which a program that never compiles should not pay.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import (
    DeviceInterface,
    caching_worker_current_devices,
    caching_worker_device_properties,
    register_interface_for_device,
)

#: the device module (anychip.torch), given by register()
dev: Any = None


def raw_stream(device_idx: int | None = None) -> int:
    """The plugin's handle of the device's current stream (what inductor's wrappers pass kernels)."""
    idx = dev._index(device_idx)
    s = dev._state.streams[idx][int(dev._C.current_stream_id(idx))]
    return int(dev._native(dev._state.devices[idx], s._handle))


def _interface(m: Any) -> type[DeviceInterface]:
    NAME = m.NAME
    current_device, set_device, device_count, get_device_properties = (
        m.current_device, m.set_device, m.device_count, m.get_device_properties)
    _index, set_stream = m._index, m.set_stream

    class AnychipInterface(DeviceInterface):
        """The device as dynamo and inductor query it (``torch.cuda``'s counterparts in ``torch.anychip``)."""

        device = m.device
        Event = m.Event
        Stream = m.Stream

        class Worker:
            """What inductor's compile workers ask, answered without touching the device again."""

            @staticmethod
            def set_device(device: int) -> None:
                caching_worker_current_devices[NAME] = device

            @staticmethod
            def current_device() -> int:
                if NAME in caching_worker_current_devices:
                    return caching_worker_current_devices[NAME]
                return current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                idx = AnychipInterface.Worker.current_device() if device is None else _index(device)
                props = caching_worker_device_properties.setdefault(NAME, [])
                if not props:
                    props.extend(get_device_properties(i) for i in range(device_count()))
                return props[idx]

        current_device = staticmethod(m.current_device)
        set_device = staticmethod(m.set_device)
        device_count = staticmethod(m.device_count)
        is_available = staticmethod(m.is_available)
        stream = staticmethod(m.stream)
        current_stream = staticmethod(m.current_stream)
        set_stream = staticmethod(m.set_stream)
        synchronize = staticmethod(m.synchronize)
        get_raw_stream = staticmethod(raw_stream)
        memory_allocated = staticmethod(m.memory_allocated)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            prev = current_device()
            if device >= 0 and device != prev:
                set_device(device)
            return prev

        exchange_device = maybe_exchange_device

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @classmethod
        def get_device_properties(cls, device: Any = None) -> Any:
            return get_device_properties(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> int:
            """major * 10 + minor, as the backend reports them (0 where it reports none)."""
            p = get_device_properties(device)
            return p.major * 10 + p.minor

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

    return AnychipInterface


def register(module: Any) -> None:
    """Register the interface of the device module ``module`` (anychip.torch)."""
    global dev
    dev = module
    iface = _interface(module)
    register_interface_for_device(module.NAME, iface)
    for i in range(module.device_count()):
        register_interface_for_device(f"{module.NAME}:{i}", iface)
