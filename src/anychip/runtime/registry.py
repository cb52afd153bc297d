"""Backend discovery: built-ins, the ``anychip.plugins`` entry-point group, C plugin
libraries (the ``anychip.plugin_libraries`` entry-point group and every shared library
in ``ANYCHIP_PLUGIN_PATH``), and plugins registered at run time with :func:`register_plugin`.

A library is dispatched by the init symbol it exports, through :data:`LIBRARY_KINDS`
(``anychip_plugin_init`` -> the ``anychip/plugin.h`` loader); a loader for another
plugin ABI adds one entry there. A library that is refused (it cannot be opened,
exports no known init symbol, its loader rejects it, its name is taken) is reported
with a warning naming the library and the reason, and kept in :func:`refused`; the
other backends load as usual.

Nothing is imported until a backend is first needed. A backend that cannot be
imported or constructed, or whose ``available()`` says no, is still listed
(:func:`backends`) with the reason; it never breaks ``import anychip``.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import env
from .errors import PluginError, SelectionError
from .plugin import DevicePlugin, contract_problem

__all__ = ["BackendInfo", "backends", "backend", "register_plugin", "BUILTIN_BACKENDS", "reset", "refused",
           "find_library",
           "library_files", "LIBRARY_KINDS", "PLUGIN_PATH_ENV", "LIBRARY_ENTRY_POINT_GROUP"]

log = logging.getLogger("anychip")

#: name -> "module:Class" of the backends shipped with anychip
BUILTIN_BACKENDS: dict[str, str] = {
    "cuda": "anychip.chips.cuda:CUDAPlugin",
    "opencl": "anychip.chips.opencl:OpenCLPlugin",
    "ascend": "anychip.chips.ascend:AscendPlugin",
    "kunlun": "anychip.chips.kunlun:KunlunPlugin",
    "hygon": "anychip.chips.hygon:HygonPlugin",
    "cpu": "anychip.chips.cpu:CPUPlugin",
}

ENTRY_POINT_GROUP = "anychip.plugins"

#: entry points whose value (a path, a list of paths, or a function returning either) names C plugin libraries
LIBRARY_ENTRY_POINT_GROUP = "anychip.plugin_libraries"
#: directories (every shared library in them) and library files, os.pathsep-separated
PLUGIN_PATH_ENV = "ANYCHIP_PLUGIN_PATH"

#: init symbol a plugin library exports -> "module:function" that probes such a library:
#: ``probe(path) -> (backend name, loader)``, raising PluginError with the reason to refuse it
LIBRARY_KINDS: dict[str, str] = {
    "anychip_plugin_init": "anychip.chips.cplugin:probe",
    "InitPlugin": "anychip.chips.paddle:probe",           # Paddle CustomDevice plugins (docs/paddle.md)
}
#: how a backend's source names a library of each kind
LIBRARY_LABELS: dict[str, str] = {"anychip_plugin_init": "C library", "InitPlugin": "Paddle CustomDevice plugin"}
#: Paddle's plugin directory: every shared library in it is probed too
PADDLE_ROOT_ENV = "CUSTOM_DEVICE_ROOT"

_LIBRARY_SUFFIXES = (".so", ".dylib")


@dataclass
class BackendInfo:
    """What the registry knows about one backend."""

    name: str
    source: str                      # "built-in (anychip.chips.cpu)", "entry point mypkg.chip:Plugin", ...
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
_refusals: list[tuple[str, str]] = []


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


def _refuse(what: str, reason: str) -> None:
    """Report a plugin that is not loaded (a warning, and :func:`refused` keeps it)."""
    _refusals.append((what, reason))
    warnings.warn(f"anychip: {what} refused: {reason}", RuntimeWarning, stacklevel=4)


def _entry_points(group: str) -> list[Any]:
    try:
        from importlib.metadata import entry_points
        return sorted(entry_points(group=group), key=lambda e: (e.name, e.value))
    except Exception as exc:  # noqa: BLE001
        log.warning("anychip: could not read entry points of %s: %s", group, exc)
        return []


def _ep_source(ep: Any) -> str:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    return f"entry point {ep.value}" + (f" (package {dist})" if dist else "")


def library_paths_from(obj: Any) -> list[str]:
    """The library paths an ``anychip.plugin_libraries`` entry point gave: a path, a callable
    returning one, or a list of either."""
    if callable(obj):
        obj = obj()
    items = obj if isinstance(obj, (list, tuple)) else [obj]
    out = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise PluginError(f"gave {item!r}; want a library path (str or os.PathLike), a list of them, "
                              "or a function returning one")
        out.append(os.fspath(item))
    return out


def library_files(spec: str) -> list[str]:
    """The plugin libraries an ``ANYCHIP_PLUGIN_PATH`` value names: every shared library
    (``*.so``, ``*.so.N``, ``*.dylib``) in each directory, in name order, and each file named."""
    out: list[str] = []
    for entry in spec.split(os.pathsep):
        entry = os.path.expanduser(entry.strip())
        if not entry:
            continue
        if os.path.isdir(entry):
            for name in sorted(os.listdir(entry)):
                path = os.path.join(entry, name)
                if os.path.isfile(path) and (name.endswith(_LIBRARY_SUFFIXES) or ".so." in name):
                    out.append(os.path.abspath(path))
        elif os.path.isfile(entry):
            out.append(os.path.abspath(entry))
        else:
            _refuse(f"{PLUGIN_PATH_ENV} entry {entry}", "no such file or directory")
    return out


def _library_probe(path: str) -> tuple[str, Callable[[str], tuple[str, Callable[[], Any]]]]:
    """(init symbol, the probe of the plugin ABI ``path`` implements), chosen by the init symbol it exports."""
    import ctypes
    try:
        handle = ctypes.CDLL(path)
    except OSError as exc:
        raise PluginError(f"cannot be loaded: {exc}") from None
    for symbol, target in LIBRARY_KINDS.items():
        if hasattr(handle, symbol):
            return symbol, _import_target(target)()
    raise PluginError(f"exports none of the init symbols {', '.join(LIBRARY_KINDS)} "
                      "(not an anychip plugin, or a plugin for another ABI)")


def _plugin_libraries() -> list[tuple[str, str]]:
    """(path, how it was found) of every plugin library, each library once."""
    found: list[tuple[str, str]] = []
    for ep in _entry_points(LIBRARY_ENTRY_POINT_GROUP):
        try:
            paths = library_paths_from(ep.load())
        except Exception as exc:  # noqa: BLE001 - a broken package must not stop the others
            _refuse(f"plugin library of {_ep_source(ep)}", f"{type(exc).__name__}: {exc}")
            continue
        found += [(p, _ep_source(ep)) for p in paths]
    spec = env.plugin_path()
    found += [(p, PLUGIN_PATH_ENV) for p in library_files(spec)]
    root = os.environ.get(PADDLE_ROOT_ENV, "").strip()
    if root and os.path.isdir(os.path.expanduser(root)):
        found += [(p, PADDLE_ROOT_ENV) for p in library_files(root)]
    seen: set[str] = set()
    unique = []
    for path, how in found:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append((path, how))
    return unique


def find_library(name: str) -> tuple[str, str]:
    """(path, how it was found) of the C plugin library of the backend ``name``, found as anychip
    finds it, without running any library's code: the ``anychip.plugin_libraries`` entry point
    called ``name`` (the one ``pip install`` of a scaffold project adds), else the file
    ``lib<name>.so`` among the libraries ``ANYCHIP_PLUGIN_PATH`` names. Raises PluginError
    saying what was looked at, or that ``name`` is a built-in or a Python plugin."""
    if name in BUILTIN_BACKENDS:
        raise PluginError(f"{name} is anychip's built-in backend, not a C plugin library")
    for ep in _entry_points(LIBRARY_ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                paths = library_paths_from(ep.load())
            except Exception as exc:  # noqa: BLE001 - the package is broken: say so
                raise PluginError(f"{_ep_source(ep)} failed: {type(exc).__name__}: {exc}") from None
            if len(paths) != 1:
                raise PluginError(f"{_ep_source(ep)} names {len(paths)} libraries ({', '.join(paths)}); "
                                  "pass the path of one")
            if not os.path.isfile(paths[0]):
                raise PluginError(f"{_ep_source(ep)} names {paths[0]}, which does not exist (reinstall the package)")
            return paths[0], _ep_source(ep)
    files = [p for p in library_files(env.plugin_path()) if os.path.basename(p) in (f"lib{name}.so", f"{name}.so")]
    if files:
        return files[0], PLUGIN_PATH_ENV
    python = [ep for ep in _entry_points(ENTRY_POINT_GROUP) if ep.name == name]
    if python:
        raise PluginError(f"{name} is a Python plugin ({_ep_source(python[0])}), not a C plugin library "
                          "(anychip/plugin.h)")
    raise PluginError(f"no C plugin library called {name}: no {LIBRARY_ENTRY_POINT_GROUP} entry point {name} "
                      f"(is its package installed? `pip install ./{name}`) and no lib{name}.so in "
                      f"{PLUGIN_PATH_ENV}; or pass the library's path")


def _selection_excludes_libraries() -> bool:
    """True when ``ANYCHIP_DEVICES`` accepts only built-in backends by name: plugin
    libraries then stay unopened (their init runs code that the program did not ask for)."""
    raw = (env.devices() or "").strip()
    if not raw:
        return False
    from .selection import parse
    try:
        terms = parse(raw)
    except SelectionError:
        return False                  # reported where the selection is made
    accepting = [t for t in terms if not t.discard]
    return bool(accepting) and all(t.backend in BUILTIN_BACKENDS for t in accepting)


def initialise_named(path: str, probe: Callable[[str], Any]) -> Any:
    """``probe(path)``, which runs the library's init, such that a crash inside it names the
    library: for the call, faulthandler (when not already on) prints the Python stack of a
    fatal signal, and the outermost frame of the call is named after the library."""
    import faulthandler
    enabled = faulthandler.is_enabled()
    if not enabled and sys.__stderr__ is not None:
        try:
            faulthandler.enable(file=sys.__stderr__)
        except (ValueError, OSError, AttributeError, RuntimeError):
            enabled = True            # no usable stderr: nothing to print on
    scope: dict[str, Any] = {"probe": probe, "path": path}
    try:
        exec(compile("result = probe(path)", f"<anychip: initialising plugin library {path}>", "exec"), scope)
    finally:
        if not enabled:
            faulthandler.disable()
    return scope["result"]


def _discover() -> dict[str, BackendInfo]:
    found: dict[str, BackendInfo] = {}
    _refusals.clear()

    def add(name: str, source: str, loader: Callable[[], Any]) -> None:
        if name in found:
            _refuse(f"backend {name!r} from {source}", f"the name is already taken by {found[name].source}")
            return
        found[name] = BackendInfo(name=name, source=source, loader=loader)

    for name, target in BUILTIN_BACKENDS.items():
        add(name, f"built-in ({target.partition(':')[0]})", _import_target(target))
    for ep in _entry_points(ENTRY_POINT_GROUP):
        add(ep.name, _ep_source(ep), ep.load)
    for path, how in ([] if _selection_excludes_libraries() else _plugin_libraries()):
        try:
            symbol, probe = _library_probe(path)
            name, loader = initialise_named(path, probe)
        except PluginError as exc:
            _refuse(f"plugin library {path} (from {how})", str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - a broken library must not stop the others
            _refuse(f"plugin library {path} (from {how})", f"{type(exc).__name__}: {exc}")
            continue
        add(name, f"{LIBRARY_LABELS.get(symbol, 'library')} {path} (from {how})", loader)
    for name, source, loader in _runtime_registered:
        add(name, source, loader)
    return found


def refused() -> list[tuple[str, str]]:
    """(what, why) of every plugin discovery refused (a library, an entry point, a name taken)."""
    with _lock:
        _all()
        return list(_refusals)


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


#: called when the set of backends changes (the device front end drops its selection); the
#: registry sits below the front end, which registers here (runtime/device.py)
_on_change: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever a backend is registered, unregistered or rediscovered."""
    _on_change.append(callback)


def _invalidate_selection() -> None:
    for callback in _on_change:
        callback()


def reset() -> None:
    """Forget everything discovered (tests; after changing the environment)."""
    global _backends
    with _lock:
        _backends = None
        _invalidate_selection()


env.set_backend_lookup(backends)
