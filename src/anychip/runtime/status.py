"""Status codes of a C API, translated at the boundary into anychip's errors, in one place.

Every binding of a C ABI (the C plugins of ``anychip/plugin.h``, the built-in chips'
adapters among them, Paddle's CustomDevice plugins, the chips' collective libraries)
describes its API's codes once as a :class:`StatusCodes` and checks each call's status
through it::

    codes = StatusCodes("ascend", name=lambda c: ACL_NAMES.get(c, f"status {c}"), text=acl_message,
                        oom={207001})
    codes.check(table.set_device(0), "set_device")      # raises DeviceError(..., code_name=...)

The error carries the backend, the native code and the vendor's name for it; the message is
``"<call> failed: <the library's text>"``. Which class is raised follows the code: an
out-of-memory code from an allocation gives ``OutOfMemoryError``, a code the API uses for
bad arguments ``InvalidArgumentError``, a timeout ``CollectiveTimeout``, anything else the
binding's failure class (``DeviceError`` for device APIs, ``CollectiveError`` for
collective libraries).
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from .errors import AnychipError, CollectiveTimeout, DeviceError, InvalidArgumentError, OutOfMemoryError

__all__ = ["StatusCodes"]


def _no_text(code: int) -> str:
    return "no detail available"


class StatusCodes:
    """The codes of one C API and how each becomes an anychip error.

    ``name(code)``: the vendor's name for a code (None where the API names none);
    ``text(code)``: the library's own text for a failure (asked only when one happened);
    ``success``: the codes that mean done (0, and e.g. Paddle's C_WARNING);
    ``not_ready``: the code a query returns for work still running;
    ``oom`` / ``invalid`` / ``timeout``: the codes raised as OutOfMemoryError (from
    allocations), InvalidArgumentError and CollectiveTimeout; ``oom_unnamed``: the API names
    no out-of-memory code, so every failure of an allocation is one; ``failure``: the class
    of every other failure.
    """

    __slots__ = ("backend", "name", "text", "success", "not_ready", "oom", "oom_unnamed", "invalid", "timeout",
                 "failure")

    def __init__(self, backend: str | None, *, name: Callable[[int], str | None] | None = None,
                 text: Callable[[int], str] = _no_text, success: Collection[int] = (0,),
                 not_ready: int | None = None, oom: Collection[int] = (), oom_unnamed: bool = False,
                 invalid: Collection[int] = (), timeout: Collection[int] = (),
                 failure: type[AnychipError] = DeviceError) -> None:
        self.backend = backend
        self.name: Callable[[int], str | None] = name or (lambda code: None)
        self.text = text
        self.success = frozenset(success)
        self.not_ready = not_ready
        self.oom = frozenset(oom)
        self.oom_unnamed = oom_unnamed
        self.invalid = frozenset(invalid)
        self.timeout = frozenset(timeout)
        self.failure = failure

    def error(self, code: int, what: str, *, failure: type[AnychipError] | None = None) -> AnychipError:
        """The error for ``what`` having returned ``code`` (``failure`` overrides the class of
        codes that are not invalid / timeout ones, e.g. PluginError while a plugin loads)."""
        message = f"{what} failed: {self.text(code)}"
        if code in self.invalid:
            cls: type[AnychipError] = InvalidArgumentError
        elif code in self.timeout:
            cls = CollectiveTimeout
        else:
            cls = failure or self.failure
        if issubclass(cls, DeviceError):
            return cls(message, backend=self.backend, code=code, code_name=self.name(code))
        return cls(message)

    def oom_error(self, code: int, what: str, nbytes: int, device: str,
                  mem_info: Callable[[], tuple[int, int]] | None = None) -> DeviceError:
        """The error of an allocation of ``nbytes`` that returned ``code``: OutOfMemoryError
        (with the device's free and total memory from ``mem_info`` where it can say) for an
        out-of-memory code, else the failure naming the size."""
        if not (self.oom_unnamed or code in self.oom):
            err = self.error(code, f"{what} of {nbytes} bytes")
            assert isinstance(err, DeviceError)
            return err
        free = total = None
        if mem_info is not None:
            try:
                free, total = mem_info()
            except Exception:  # noqa: BLE001 - the allocation failure matters more than the numbers
                pass
        return OutOfMemoryError(nbytes, free, total, backend=self.backend, device=device, code=code,
                                code_name=self.name(code), detail=f"{what}: {self.text(code)}")

    def check(self, code: int, what: str, *, failure: type[AnychipError] | None = None) -> None:
        """Raise the error of ``code`` unless it means success."""
        if code not in self.success:
            raise self.error(code, what, failure=failure)

    def call(self, fn: Callable[..., int], what: str, *args: Any) -> None:
        """``fn(*args)``, its status checked."""
        code = fn(*args)
        if code not in self.success:
            raise self.error(code, what)

    def done(self, code: int, what: str) -> bool:
        """A query's status: True for done, False for ``not_ready``, the error otherwise."""
        if code in self.success:
            return True
        if code == self.not_ready and code is not None:
            return False
        raise self.error(code, what)
