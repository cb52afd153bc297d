"""Backend discovery: built-ins, the ``anychip.plugins`` entry-point group, and
plugins registered at run time with :func:`register_plugin`.

Nothing is imported until a backend is first needed. A backend that cannot be
imported or constructed, or whose ``available()`` says no, is still listed
(:func:`backends`) with the reason; it never breaks ``import anychip``.
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import PluginError
from .plugin import DevicePlugin, contract_problem

__all__ = ["BackendInfo", "backends", "backend", "register_plugin", "BUILTIN_BACKENDS", "reset"]

log = logging.getLogger("anychip")

#: name -> "module:Class" of the backends shipped with anychip
BUILTIN_BACKENDS: dict[str, str] = {
    "cuda": "anychip.devices.cuda:CUDAPlugin",
    "opencl": "anychip.devices.opencl:OpenCLPlugin",
    "ascend": "anychip.devices.ascend:AscendPlugin",
    "kunlun": "anychip.devices.kunlun:KunlunPlugin",
    "hygon": "anychip.devices.hygon:HygonPlugin",
    "cpu": "anychip.devices.cpu:CPUPlugin",
}

ENTRY_POINT_GROUP = "anychip.plugins"

#: discoverers of backends in shared libraries ("module:function" returning (name, source, loader)
#: triples): Paddle CustomDevice plugins (InitPlugin) from CUSTOM_DEVICE_ROOT and ANYCHIP_PLUGIN_PATH
LIBRARY_DISCOVERERS: tuple[str, ...] = ("anychip.devices.paddle:discover",)


@dataclass
class BackendInfo:
    """What the registry knows about one backend."""

    name: str
    source: str                      # "built-in (anychip.devices.cpu)", "entry point mypkg.chip:Plugin", ...
    loader: Callable[[], Any] = field(repr=False)
    plugin: DevicePlugin | None = None
    available: bool = False
    reason: str = "not loaded yet"
    device_count: int = 0
    loaded: bool = False
    _recheck: bool = field(default=False, repr=False)

    @property
    def simulated(self) -> bool:
        return bool(self.plugin is not None and self.plugin.simulated)

    @property
    def tier(self) -> int:
        """0 real accelerators, 1 simulated chips, 2 host backends."""
        p = self.plugin
        if p is None or not p.accelerator:
            return 2
        return 1 if p.simulated else 0

    def load(self) -> None:
        if self.loaded:
            if self._recheck and self.plugin is not None:
                self._recheck = False
                self._check(self.plugin)
            return
        self.loaded = True
        try:
            obj = self.loader()
            plugin = obj() if isinstance(obj, type) else obj
            if not isinstance(plugin, DevicePlugin):
                raise PluginError(f"{self.source} gave {type(plugin).__name__}, not a DevicePlugin subclass")
            if plugin.name != self.name:
                raise PluginError(f"{self.source} declares name {plugin.name!r}, registered as {self.name!r}")
            problem = contract_problem(plugin)
            if problem:
                raise PluginError(f"{type(plugin).__qualname__} {problem}")
            self.plugin = plugin
        except PluginError as exc:
            self.reason = f"refused ({self.source}): {exc}"
            log.warning("anychip: backend %s %s", self.name, self.reason)
            return
        except Exception as exc:  # noqa: BLE001 - any failure makes the backend unavailable, with the reason
            self.reason = f"failed to load from {self.source}: {type(exc).__name__}: {exc}"
            log.debug("backend %s unavailable: %s", self.name, self.reason)
            return
        self._check(plugin)
        if self.available and plugin.simulated:
            log.info("backend %s runs on the simulator (%s)", self.name, self.reason)

    def _check(self, plugin: DevicePlugin) -> None:
        self.device_count = 0
        try:
            ok, reason = plugin.available()
            self.available, self.reason = bool(ok), str(reason)
            if self.available:
                self.device_count = int(plugin.device_count())
                if self.device_count <= 0:
                    self.available, self.reason = False, f"no devices ({reason})" if reason else "no devices"
        except Exception as exc:  # noqa: BLE001
            self.available, self.reason = False, f"availability check failed: {type(exc).__name__}: {exc}"

    def _after_fork_in_child(self) -> None:
        """Let the plugin drop what cannot cross fork(), then ask it again whether it is usable."""
        plugin = self.plugin
        if plugin is None:
            return
        try:
            plugin._after_fork_in_child()
        except Exception as exc:  # noqa: BLE001 - never raise in the child's fork hook
            self.available, self.device_count = False, 0
            self.reason = f"unusable after fork(): {type(exc).__name__}: {exc}"
            return
        self._recheck = True           # available() is asked again on the next lookup, not in the hook


_lock = threading.RLock()
_backends: dict[str, BackendInfo] | None = None
_runtime_registered: list[tuple[str, str, Callable[[], Any]]] = []


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.RLock()          # another parent thread may have held it at the fork
    for info in list((_backends or {}).values()):
        info._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _import_target(target: str) -> Callable[[], Any]:
    def load() -> Any:
        module, _, attr = target.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        return obj
    return load


def _discover() -> dict[str, BackendInfo]:
    found: dict[str, BackendInfo] = {}

    def add(name: str, source: str, loader: Callable[[], Any]) -> None:
        if name in found:
            msg = (f"anychip: backend {name!r} from {source} refused: the name is already taken by "
                   f"{found[name].source}")
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            return
        found[name] = BackendInfo(name=name, source=source, loader=loader)

    for name, target in BUILTIN_BACKENDS.items():
        add(name, f"built-in ({target.partition(':')[0]})", _import_target(target))
    eps: list[Any] = []
    try:
        from importlib.metadata import entry_points
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # noqa: BLE001
        log.warning("anychip: could not read entry points: %s", exc)
    for ep in sorted(eps, key=lambda e: (e.name, e.value)):
        dist = getattr(getattr(ep, "dist", None), "name", None)
        add(ep.name, f"entry point {ep.value}" + (f" (package {dist})" if dist else ""), ep.load)
    for target in LIBRARY_DISCOVERERS:
        try:
            for name, source, loader in _import_target(target)()():
                add(name, source, loader)
        except Exception as exc:  # noqa: BLE001 - a discoverer never breaks the others
            log.warning("anychip: %s failed: %s: %s", target, type(exc).__name__, exc)
    for name, source, loader in _runtime_registered:
        add(name, source, loader)
    return found


def _all() -> dict[str, BackendInfo]:
    global _backends
    with _lock:
        if _backends is None:
            _backends = _discover()
        return _backends


def register_plugin(plugin: type[DevicePlugin] | DevicePlugin, *, source: str | None = None) -> BackendInfo:
    """Register a backend at run time (a DevicePlugin subclass or instance).

    A name that is already registered is refused with a warning naming both
    sources, and the existing backend is returned.
    """
    name = plugin.name
    if not name or not isinstance(name, str):
        raise PluginError(f"{plugin!r} has no backend name (set the class attribute `name`)")
    src = source or f"register_plugin({getattr(plugin, '__qualname__', type(plugin).__qualname__)})"
    with _lock:
        found = _all()
        if name in found:
            msg = f"anychip: backend {name!r} from {src} refused: the name is already taken by {found[name].source}"
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            return found[name]
        entry = (name, src, lambda: plugin)
        _runtime_registered.append(entry)
        info = found[name] = BackendInfo(name=name, source=src, loader=entry[2])
        _invalidate_selection()
        return info


def unregister_plugin(name: str) -> None:
    """Remove a backend registered with :func:`register_plugin` (tests, plugin reloads)."""
    with _lock:
        _runtime_registered[:] = [e for e in _runtime_registered if e[0] != name]
        if _backends is not None and name in _backends and not _backends[name].source.startswith(("built-in",
                                                                                                    "entry point")):
            del _backends[name]
        _invalidate_selection()


def backends(load: bool = True) -> list[BackendInfo]:
    """Every known backend, in default priority order (real accelerators, simulated chips, host)."""
    with _lock:
        infos = list(_all().values())
        if load:
            for info in infos:
                info.load()
    order = {name: i for i, name in enumerate(BUILTIN_BACKENDS)}
    return sorted(infos, key=lambda b: (not b.available, b.tier,
                                        -(type(b.plugin).priority if b.plugin else 0),
                                        order.get(b.name, len(order)), b.name))


def backend(name: str) -> BackendInfo | None:
    """The backend called ``name`` (loaded), or None when no such backend is known."""
    with _lock:
        info = _all().get(name)
        if info is not None:
            info.load()
        return info


def _invalidate_selection() -> None:
    from .device import _reset_selection  # (not `from . import device`: that name is the function)
    _reset_selection()


def reset() -> None:
    """Forget everything discovered (tests; after changing the environment)."""
    global _backends
    with _lock:
        _backends = None
        _invalidate_selection()
