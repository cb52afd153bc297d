"""A Paddle plugin's devices: opening it (``initialize``, ``init_device``), its properties,
and the one checked way to call its entries."""
from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from ...runtime.errors import PluginError
from ...runtime.plugin import DevicePlugin
from ...runtime.status import StatusCodes
from .ccl import PaddleXccl
from .loader import _Params, _returned, ffi, status_text

__all__ = ["PaddleDevice"]

log = logging.getLogger("anychip")


class PaddleDevice(DevicePlugin):
    """Devices of one plugin; the streams, memory and events build on it."""

    def __init__(self, params: _Params) -> None:
        self.p = params
        self.ffi = ffi()
        self.iface = params.iface
        self.library_path = params.path
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self._defaults: dict[int, Any] = {}           # index -> its default stream (stream.py)
        self._streams: dict[int, set[Any]] = {}
        self._xccl: PaddleXccl | None = None
        self._pid = os.getpid()
        #: Paddle's C_Status codes (C_WARNING is done, perhaps not as asked): every call's status goes through it
        self.status = StatusCodes(self.name, name=lambda rc: status_text(rc)[0], text=_returned, success=(0, 1),
                                  oom_unnamed=True)
        self._ids = self._open()

    # -- loading ----------------------------------------------------------------------------
    def _has(self, entry: str) -> bool:
        return bool(getattr(self.iface, entry) != self.ffi.NULL)

    def _open(self) -> list[int]:
        f, iface = self.ffi, self.iface
        if self._has("initialize"):
            self.status.check(iface.initialize(), "initialize", failure=PluginError)
        count = f.new("size_t *")
        self.status.check(iface.get_device_count(count), "get_device_count", failure=PluginError)
        ids = f.new("size_t[]", max(int(count[0]), 1))
        self.status.check(iface.get_device_list(ids), "get_device_list", failure=PluginError)
        phys = [int(ids[i]) for i in range(int(count[0]))]
        if self._has("init_device"):
            for p in phys:
                self.status.check(iface.init_device(f.new("struct C_Device_st *", {"id": p})), f"init_device({p})",
                                  failure=PluginError)
        atexit.register(self._close)
        return phys

    def _close(self) -> None:
        if os.getpid() != self._pid:
            return
        f, iface = self.ffi, self.iface
        try:
            for i in range(len(self._ids)):
                self._synchronize(i)
            if self._has("deinit_device"):
                for p in self._ids:
                    iface.deinit_device(f.new("struct C_Device_st *", {"id": p}))
            if self._has("finalize"):
                iface.finalize()
        except Exception as exc:  # noqa: BLE001 - at exit: report, never raise
            log.warning("anychip: %s: shutting the plugin down failed: %s", self.name, exc)

    # -- identity ---------------------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        if os.getpid() != self._pid:
            return False, (f"Paddle CustomDevice plugin {self.p.path} was initialized in the parent process and "
                           "cannot be used after fork() (its runtime threads did not survive); start processes "
                           "with spawn or `anychip launch`")
        v = self.p.version
        return True, (f"Paddle CustomDevice plugin {self.p.path} (device_type {self.p.device_type}, runtime "
                      f"{v[0]}.{v[1]}.{v[2]}); {len(self._ids)} device(s)")

    def device_count(self) -> int:
        return len(self._ids)

    def _dev(self, index: int) -> Any:
        return self.ffi.new("struct C_Device_st *", {"id": self._ids[index]})

    def _size_query(self, entry: str, index: int) -> int | None:
        if not self._has(entry):
            return None
        out = self.ffi.new("size_t *")
        self._call(entry, self._dev(index), out)
        return int(out[0])

    def properties(self, index: int) -> dict:
        free, total = self._mem_info(index)
        props: dict[str, Any] = {
            "name": f"{self.p.device_type}" + (f" ({self.p.sub_device_type})" if self.p.sub_device_type else ""),
            "total_memory": total, "physical_id": self._ids[index], "library": self.p.path,
            "runtime_version": ".".join(map(str, self.p.version)), "api": "Paddle CustomDevice",
            "host_memory": self._has("host_memory_allocate"), "unified_memory": self._has("unified_memory_allocate"),
            "collectives": "xccl" if self.native_ccl() is not None else "host transport",
        }
        for key, entry in (("min_chunk_size", "device_min_chunk_size"), ("max_chunk_size", "device_max_chunk_size"),
                           ("max_alloc_size", "device_max_alloc_size"),
                           ("compute_capability", "get_compute_capability"),
                           ("driver_version", "get_driver_version"), ("plugin_runtime_version", "get_runtime_version")):
            value = self._size_query(entry, index)
            if value is not None:
                props[key] = value
        return props

    # -- calling the plugin -------------------------------------------------------------------
    def _call(self, entry: str, *args: Any) -> None:
        rc = getattr(self.iface, entry)(*args)
        if rc and rc != 1:                      # C_WARNING: done, perhaps not as asked (e.g. synchronously)
            raise self.status.error(rc, entry)

    def _use(self, index: int) -> None:
        if getattr(self._tls, "dev", -1) != index:
            self._call("set_device", self._dev(index))
            self._tls.dev = index

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._tls = threading.local()

    # -- collectives -------------------------------------------------------------------------
    def native_ccl(self) -> Any:
        if self._xccl is None and all(self._has(e) for e in PaddleXccl.needed):
            self._xccl = PaddleXccl(self)
        return self._xccl


