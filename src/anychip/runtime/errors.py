"""One exception hierarchy for all of anychip.

Native status codes are translated at the boundary (in each backend) into these
classes; the vendor's own name for the code travels with the exception.
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "AnychipError",
    "DeviceError",
    "OutOfMemoryError",
    "InvalidArgumentError",
    "UnsupportedError",
    "PluginError",
    "SelectionError",
    "CollectiveError",
    "CollectiveTimeout",
]


class AnychipError(Exception):
    """Base class of every error anychip raises."""


class DeviceError(AnychipError):
    """A backend call failed.

    ``backend`` is the backend name, ``code`` the native status code (when there
    is one) and ``code_name`` the vendor's name for it, e.g. ``ACL_ERROR_BAD_ALLOC``.
    """

    def __init__(self, message: str, *, backend: str | None = None,
                 code: int | None = None, code_name: str | None = None) -> None:
        self.backend = backend
        self.code = code
        self.code_name = code_name
        parts = []
        if backend:
            parts.append(f"[{backend}]")
        parts.append(message)
        if code_name is not None or code is not None:
            parts.append(f"({code_name or 'status'} = {code})" if code is not None else f"({code_name})")
        super().__init__(" ".join(parts))

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    obj: BaseException = BaseException.__new__(cls)     # (cls.__new__ is refused by MemoryError subclasses)
    BaseException.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


class InvalidArgumentError(AnychipError, ValueError):
    """An argument was rejected by the front-end checks (size, offset, device, freed buffer...)."""


class OutOfMemoryError(DeviceError, MemoryError):
    """Device memory is exhausted even after the cache was emptied.

    Carries ``requested`` (bytes), ``free`` and ``total`` (bytes, as the device
    reported them, or None) and ``stats`` (a dict of allocator statistics).
    Picklable, so it can cross process boundaries.
    """

    def __init__(self, requested: int, free: int | None = None, total: int | None = None,
                 stats: dict | None = None, *, backend: str | None = None, device: str | None = None,
                 code: int | None = None, code_name: str | None = None, detail: str = "") -> None:
        self.requested = requested
        self.free = free
        self.total = total
        self.stats = dict(stats or {})
        self.device = device

        def mib(n: int | None) -> str:
            return "unknown" if n is None else f"{n / 2**20:.2f} MiB"

        msg = f"out of memory on {device or backend or 'device'}: tried to allocate {mib(requested)}"
        if total is not None:
            msg += f" ({mib(free)} free of {mib(total)} total"
            if stats:
                msg += (f"; {mib(stats.get('allocated_bytes.all.current', 0))} allocated, "
                        f"{mib(stats.get('reserved_bytes.all.current', 0))} reserved by the caching allocator")
            msg += ")"
        if detail:
            msg += f": {detail}"
        DeviceError.__init__(self, msg, backend=None, code=code, code_name=code_name)
        self.backend = backend


class UnsupportedError(AnychipError, NotImplementedError):
    """The backend or device does not support the requested operation."""


class PluginError(AnychipError):
    """A plugin could not be loaded or was refused (bad ABI version, missing entries...)."""


class SelectionError(AnychipError, ValueError):
    """``ANYCHIP_DEVICES`` (or a device string) could not be understood or matched nothing."""


class CollectiveError(AnychipError):
    """A collective operation failed (mismatch between ranks, dead rank, transport error)."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective operation did not complete within its timeout."""
