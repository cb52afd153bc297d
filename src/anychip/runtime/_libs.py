"""Locate the shared libraries that setup.py builds into ``anychip/_lib``."""
from __future__ import annotations

import importlib.machinery
import os
import threading
import weakref
from typing import Any

_LIB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_lib")


def find_library(name: str) -> str | None:
    """Path of the built library ``name`` (e.g. ``"libacl_sim"``), or None when it was not built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = os.path.join(_LIB_DIR, name + suffix)
        if os.path.exists(path):
            return path
    return None


_ffis: weakref.WeakSet[Any] = weakref.WeakSet()


def new_ffi() -> Any:
    """A ``cffi.FFI`` that a forked child can use.

    cffi parses a C type the first time a string names it (``ffi.new("void **")``,
    ``ffi.cast("uintptr_t", p)``) and holds two locks meanwhile: the FFI's and the one
    its C parser shares with every FFI. A thread of the parent may be doing that at the
    fork; the child would then wait for them forever at its own first parse. The child
    gets fresh locks instead: a parse starts the parser over, and a type enters the
    caches only once it is parsed."""
    import cffi  # type: ignore[import-untyped]
    ffi = cffi.FFI()
    _ffis.add(ffi)
    return ffi


def _after_fork_in_child() -> None:
    if not _ffis:
        return
    from cffi import cparser
    if getattr(cparser, "lock", None) is not None:
        cparser.lock = threading.Lock()
    for ffi in list(_ffis):
        ffi._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def dlopen(ffi: Any, path: str) -> Any:
    """``ffi.dlopen(path)`` for a library that is never unloaded.

    cffi closes a library when its ``lib`` object is collected, which at interpreter exit
    can happen while threads that library started (a stream's worker, a runtime's event
    thread) are still parked in its code; they then wake into unmapped memory and the
    process dies with SIGSEGV after its work is done. Device runtimes, plugins and the
    collective engine own such threads, so they are opened with RTLD_NODELETE: dlclose
    leaves them mapped, as a CUDA driver stays mapped for the life of a process.
    """
    return ffi.dlopen(path, ffi.RTLD_NODELETE)


def copy_pointers(ffi: Any, kind: str, dst: Any, dst_off: int, src: Any, src_off: int) -> tuple[Any, Any] | None:
    """The C pointers of a raw copy's operands (``dst``, ``src``): device memory is an int
    address, host memory a 1-D uint8 array; None for a kind that is none of h2d, d2h, d2d."""
    if kind == "h2d":
        return ffi.cast("void *", dst + dst_off), ffi.from_buffer(src) + src_off
    if kind == "d2h":
        return ffi.from_buffer(dst) + dst_off, ffi.cast("void *", src + src_off)
    if kind == "d2d":
        return ffi.cast("void *", dst + dst_off), ffi.cast("void *", src + src_off)
    return None
