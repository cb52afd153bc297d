"""The interface every backend implements.

A backend owns only the raw calls, all prefixed with ``_``. The front end
(:mod:`anychip.runtime.device`, ``stream``, ``buffer``) owns argument checks,
accounting and caching, so a backend may assume:

* ``index`` is in ``range(device_count())``;
* sizes and offsets are non-negative ints and lie inside the allocations;
* ``stream`` / ``event`` arguments are handles this backend returned for the
  same device and that were not destroyed;
* host memory is passed as a C-contiguous 1-D ``numpy.uint8`` array (writable
  when it is the destination); the front end keeps it alive until the copy
  that used it is known to be complete.

Raw calls translate native failures into :mod:`anychip.runtime.errors`
exceptions (``DeviceError`` with the vendor's code name; ``OutOfMemoryError``
from ``_malloc`` when the device has no room).

Copies and memsets are always enqueued on a stream (``_default_stream(index)``
gives the one used when the user names none); the front end synchronizes when
the user asked for a synchronous copy.

The contract is versioned (``API_VERSION``, major.minor, as PJRT's C API): a
plugin declares the version it was written against in ``api_version``. Minor
versions only add optional methods, so any minor of a supported major loads; a
different major is refused. A plugin must override every method in
``REQUIRED_METHODS``. :func:`contract_problem` checks both when a backend loads;
a plugin that fails is listed unavailable with the reason, never half-usable.
"""
from __future__ import annotations

import time
from typing import Any, ClassVar

__all__ = ["DevicePlugin", "H2D", "D2H", "D2D", "API_VERSION", "REQUIRED_METHODS", "contract_problem"]

#: the plugin API this runtime implements: (major, minor)
API_VERSION: tuple[int, int] = (1, 0)

#: what every plugin must implement (the raw calls the front end makes)
REQUIRED_METHODS: tuple[str, ...] = (
    "available", "device_count", "properties",
    "_malloc", "_free", "_mem_info", "_copy", "_memset",
    "_default_stream", "_stream_create", "_stream_destroy", "_stream_synchronize", "_stream_query",
    "_stream_wait_event",
    "_event_create", "_event_destroy", "_event_record", "_event_synchronize", "_event_query",
    "_event_elapsed_ms", "_synchronize",
)

H2D = "h2d"
D2H = "d2h"
D2D = "d2d"


class DevicePlugin:
    #: backend name used in ANYCHIP_DEVICES and device strings ("cuda", "opencl", ...)
    name: ClassVar[str] = ""
    #: among backends of the same tier (real accelerator / simulated / host), higher comes first
    priority: ClassVar[int] = 0
    #: False for backends that run on the host CPU (cpu; OpenCL when its only devices are CPUs):
    #: they come after real and simulated accelerators in the default order (may be set per instance)
    accelerator: bool = True
    #: True when a simulator stands in for the vendor library (set by ``available()``)
    simulated: bool = False
    #: optional kernel set the tensor layer may use: an anychip.runtime.KernelSet (None = host fallback)
    kernels: Any = None
    #: the plugin API version this plugin was written against, (major, minor);
    #: every plugin declares it (e.g. ``api_version = (1, 0)``)
    api_version: ClassVar[tuple[int, int] | None] = None

    # -- identity -------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        """(True, description) or (False, the reason it cannot be used). Must not raise."""
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def properties(self, index: int) -> dict:
        """At least ``name`` and ``total_memory``; anything else the backend knows."""
        raise NotImplementedError

    # -- memory ---------------------------------------------------------
    def _malloc(self, index: int, nbytes: int) -> Any:
        raise NotImplementedError

    def _free(self, index: int, handle: Any) -> None:
        raise NotImplementedError

    def _mem_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        raise NotImplementedError

    def _pointer(self, handle: Any, offset: int) -> int | None:
        """Integer address of ``handle + offset`` when handles are pointers, else None."""
        return None

    # -- copies ---------------------------------------------------------
    def _copy(self, index: int, dst: Any, dst_off: int, src: Any, src_off: int,
              nbytes: int, kind: str, stream: Any) -> None:
        """Enqueue a copy of ``nbytes`` on ``stream``.

        ``kind`` is ``H2D`` (src is a host array), ``D2H`` (dst is a host array)
        or ``D2D`` (both are handles of device ``index``).
        """
        raise NotImplementedError

    def _copy_peer(self, dst_index: int, dst: Any, dst_off: int, src_index: int, src: Any,
                   src_off: int, nbytes: int, stream: Any) -> None:
        """Device-to-device copy between two devices of this backend, enqueued on
        ``stream`` (a stream of ``src_index``). Optional: the front end stages through
        host memory when this raises ``UnsupportedError``."""
        from .errors import UnsupportedError
        raise UnsupportedError(f"{self.name} has no peer-to-peer copy")

    def _memset(self, index: int, dst: Any, dst_off: int, value: int, nbytes: int, stream: Any) -> None:
        """Set ``nbytes`` bytes to the byte ``value`` (0..255), enqueued on ``stream``."""
        raise NotImplementedError

    # -- streams --------------------------------------------------------
    def _default_stream(self, index: int) -> Any:
        raise NotImplementedError

    def _stream_create(self, index: int) -> Any:
        raise NotImplementedError

    def _stream_destroy(self, index: int, stream: Any) -> None:
        raise NotImplementedError

    def _stream_synchronize(self, index: int, stream: Any) -> None:
        raise NotImplementedError

    def _stream_query(self, index: int, stream: Any) -> bool:
        """True when all work enqueued on ``stream`` is complete."""
        raise NotImplementedError

    def _stream_wait_event(self, index: int, stream: Any, event: Any) -> None:
        """Work enqueued on ``stream`` after this call waits for ``event``."""
        raise NotImplementedError

    # -- events ---------------------------------------------------------
    def _event_create(self, index: int) -> Any:
        raise NotImplementedError

    def _event_create_untimed(self, index: int) -> Any:
        """An event used only for ordering (never timed): the caching allocator's. Backends whose
        untimed events are cheaper override this (CUDA: ``disable_timing=True``)."""
        return self._event_create(index)

    def _event_destroy(self, index: int, event: Any) -> None:
        raise NotImplementedError

    def _event_record(self, index: int, event: Any, stream: Any) -> None:
        raise NotImplementedError

    def _event_synchronize(self, index: int, event: Any) -> None:
        raise NotImplementedError

    def _event_query(self, index: int, event: Any) -> bool:
        raise NotImplementedError

    def _event_wait(self, index: int, event: Any, seconds: float) -> bool:
        """Wait at most ``seconds`` for ``event``'s work; True when it is complete. Default:
        ``_event_query`` in a loop that spins 50 us, then sleeps in steps growing to 1 ms
        (backends with a timed wait of their own override it)."""
        now = time.perf_counter()
        spin_until, deadline, delay = now + 50e-6, now + seconds, 1e-5
        while not self._event_query(index, event):
            now = time.perf_counter()
            if now >= deadline:
                return False
            if now > spin_until:
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 1e-3)
        return True

    def _event_elapsed_ms(self, index: int, start: Any, end: Any) -> float:
        raise NotImplementedError

    def _synchronize(self, index: int) -> None:
        """Wait for all work on every stream of device ``index``."""
        raise NotImplementedError

    # -- optional -------------------------------------------------------
    def native_ccl(self) -> Any:
        """The chip's own collective library, or None (the host transport serves).

        Every backend with one returns an :class:`anychip.runtime.native_ccl.NativeLibrary`
        instance (ascend: HCCL, kunlun: BKCL, hygon: RCCL, a C plugin's collective
        entries, a Paddle plugin's ``xccl_*``), which the collectives layer drives as a
        native transport; cuda returns ``cupy.cuda.nccl``. The collectives layer never
        picks a library by the backend's name: this method is the one way to it."""
        return None

    def native_ccl_problem(self) -> str:
        """Why :meth:`native_ccl` returns None, in words (asked only then)."""
        return f"{self.name} has no native collective library"

    def _after_fork_in_child(self) -> None:
        """Called in a child process right after ``fork()``, before anything else
        runs there: drop process-local state the child cannot use (locks held by
        other parent threads, queues whose worker threads did not survive), or
        make :meth:`available` say why the backend cannot be used in the child.
        Must not block or raise."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def contract_problem(plugin: DevicePlugin) -> str | None:
    """Why ``plugin`` does not meet the plugin contract, or None when it does."""
    version = getattr(plugin, "api_version", None)
    major, minor = API_VERSION
    if version is None:
        return (f"declares no api_version; set the class attribute api_version = ({major}, {minor}) "
                f"(this anychip implements plugin API {major}.{minor})")
    if (not isinstance(version, tuple) or len(version) != 2
            or not all(type(v) is int and v >= 0 for v in version)):
        return f"api_version must be a (major, minor) tuple of non-negative ints, got {version!r}"
    if version[0] != major:
        return (f"is written for plugin API {version[0]}.{version[1]}; this anychip implements "
                f"{major}.{minor} and loads only plugins of major version {major}")
    cls = type(plugin)
    missing = [m for m in REQUIRED_METHODS
               if getattr(cls, m, None) is getattr(DevicePlugin, m) or not callable(getattr(cls, m, None))]
    if missing:
        return (f"does not implement the required method{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} (plugin API {major}.{minor})")
    return None
