"""The base of every native collective library binding (``DevicePlugin.native_ccl()``).

A backend whose chip has its own collective library (HCCL, BKCL, RCCL, a C plugin's
collective entries, a Paddle plugin's ``xccl_*``) returns an instance of a
:class:`NativeLibrary` subclass from ``native_ccl()``; the collectives layer drives every
one of them the same way, as a native transport (anychip/collectives/transports/native.py). A
subclass gives the library's enum values, status names and argument orders; the
checks, the error translation and the unique-id / init protocol are written here once.

This module belongs to the runtime's interfaces, beside :class:`DevicePlugin`: backends
(anychip/chips) implement it and the collectives layer calls it, and neither imports
the other.
"""
from __future__ import annotations

import functools
from typing import Any, ClassVar, Protocol

from .errors import AnychipError, CollectiveError
from .status import StatusCodes

__all__ = ["NativeLibrary", "OpLike"]

#: the argument names a ``calls`` entry may list (the stream last), in the order ``op`` takes them
_GIVEN = ("comm", "send", "recv", "count", "dtype", "redop", "root")
_ARGUMENTS = frozenset({*_GIVEN, "stream"})


class OpLike(Protocol):
    """What :meth:`NativeLibrary.supports` reads of an op (``collectives.OpSpec`` has it)."""

    kind: str
    dtype: str
    op: str


class NativeLibrary:
    """One vendor collective library, loaded with cffi. Subclasses give the cdef, the
    enum values and the argument orders; everything else is shared."""

    api: ClassVar[str] = ""                       # "HCCL"
    backend: ClassVar[str] = ""                   # device backend it serves
    real_names: ClassVar[tuple[str, ...]] = ()    # the vendor's library files
    extra_roots: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())
    cdef: ClassVar[str] = ""
    id_type: ClassVar[str] = ""
    codes: ClassVar[dict[int, str]] = {}
    timeout_codes: ClassVar[frozenset[int]] = frozenset()
    invalid_codes: ClassVar[frozenset[int]] = frozenset()
    #: anychip dtype -> the library's value (reductions); movement goes as BYTE
    dtypes: ClassVar[dict[str, int]] = {}
    byte: ClassVar[int] = 0
    redops: ClassVar[dict[str, int]] = {}
    #: (reduce op, dtype) pairs refused although both are in ``dtypes`` and ``redops`` (HCCL: PROD
    #: of bfloat16)
    refused: ClassVar[frozenset[tuple[str, str]]] = frozenset()
    #: op kind -> (the library's function, the names of its arguments in order, from send, recv,
    #: count, dtype, redop, root, comm and stream, which comes last); see :meth:`op`
    calls: ClassVar[dict[str, tuple[str, str]]] = {}
    #: the kinds the library has (default: those of ``calls``)
    kinds: ClassVar[frozenset[str]] = frozenset()
    probe: ClassVar[str] = ""                     # a function the library must export
    #: the library broadcasts in place (HCCL): the root's send is first copied to its recv
    broadcast_in_place: ClassVar[bool] = False
    #: the library takes the NULL stream (the device's default stream); HCCL does not
    null_stream: ClassVar[bool] = True

    #: what ``calls`` becomes: kind -> (function name, the positions in _GIVEN of the arguments
    #: before the stream)
    _orders: ClassVar[dict[str, tuple[str, tuple[int, ...]]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "calls" not in cls.__dict__:
            return
        orders = {}
        for kind, (name, args) in cls.calls.items():
            names = tuple(args.split())
            unknown = set(names) - _ARGUMENTS
            if unknown or names[-1:] != ("stream",):
                raise TypeError(f"{cls.__name__}.calls[{kind!r}]: {args!r} must name arguments of "
                                f"{', '.join(sorted(_ARGUMENTS))} and end with stream")
            orders[kind] = (name, tuple(_GIVEN.index(a) for a in names[:-1]))
        cls._orders = orders
        if "kinds" not in cls.__dict__:
            cls.kinds = frozenset(cls.calls)

    def __init__(self, ffi: Any, lib: Any, path: str, simulated: bool) -> None:
        self.ffi, self.lib, self.path, self.simulated = ffi, lib, path, simulated
        self._bound: dict[str, tuple[Any, tuple[int, ...]]] = {}     # kind -> (function, positions)
        self._last_error = getattr(lib, "anychip_sim_last_error", None) if simulated else None

    # -- what it can do ------------------------------------------------------------
    def supports(self, spec: OpLike) -> bool:
        if spec.kind not in self.kinds:
            return False
        if spec.kind in ("all_reduce", "reduce", "reduce_scatter"):
            return spec.dtype in self.dtypes and spec.op in self.redops and (spec.op, spec.dtype) not in self.refused
        return True

    # -- errors ----------------------------------------------------------------------
    def code_name(self, code: int) -> str:
        return self.codes.get(code, f"status {code}")

    def detail(self) -> str:
        """The simulator's message for the calling thread's last failure ("" on real libraries)."""
        if self._last_error is None:
            return ""
        p = self._last_error()
        return self.ffi.string(p).decode("utf-8", "replace") if p != self.ffi.NULL else ""

    def text(self, code: int) -> str:
        """What a failure's message says after ``<call> failed:``: the code's name and the
        library's detail."""
        detail = self.detail()
        return f"{self.api} returned {self.code_name(code)}" + (f": {detail}" if detail else "")

    @property
    def status(self) -> StatusCodes:
        """The library's codes (``invalid_codes``: InvalidArgumentError, ``timeout_codes``:
        CollectiveTimeout, any other failure: CollectiveError)."""
        found = self.__dict__.get("_status")
        if found is None:
            found = self.__dict__["_status"] = StatusCodes(
                None, name=self.code_name, text=self.text, invalid=self.invalid_codes, timeout=self.timeout_codes,
                failure=CollectiveError)
        return found

    def error(self, code: int, what: str) -> AnychipError:
        return self.status.error(code, what)

    def comm_detail(self, comm: Any) -> str:
        """The library's message for a failure of ``comm``'s enqueued work."""
        return self.detail()

    def check(self, code: int, what: str) -> None:
        if code:
            raise self.error(code, what)

    # -- calls (subclasses) --------------------------------------------------------------
    def unique_id(self) -> bytes:
        uid = self.ffi.new(f"{self.id_type} *")
        self.check(self._get_id(uid), f"{self.api} unique id")
        return bytes(self.ffi.buffer(uid))

    def init(self, nranks: int, uid: bytes, rank: int) -> Any:
        out = self.ffi.new("void **")
        idp = self.ffi.new(f"{self.id_type} *")
        self.ffi.memmove(idp, uid, self.ffi.sizeof(self.id_type))
        self.check(self._init(out, nranks, idp, rank), f"{self.api} communicator init (rank {rank} of {nranks})")
        return out[0]

    def init_with_timeout(self, nranks: int, uid: bytes, rank: int, timeout: float) -> Any:
        """``init`` for a group whose ops may wait ``timeout`` seconds for their peers. A library
        that takes a timeout per communicator overrides this (a C plugin's
        ``comm_init_rank_timeout``); the others (the vendors' libraries have none) make the
        communicator with ``init``, and the native transport's watchdog applies the timeout."""
        return self.init(nranks, uid, rank)

    def async_error(self, comm: Any) -> int:
        raise NotImplementedError

    def _get_id(self, uid: Any) -> int:
        raise NotImplementedError

    def _init(self, out: Any, nranks: int, uid: Any, rank: int) -> int:
        raise NotImplementedError

    def destroy(self, comm: Any) -> int:
        raise NotImplementedError

    def abort(self, comm: Any) -> int:
        """The vendor's abort (HCCL has none: destroy, which waits for the enqueued work)."""
        return self.destroy(comm)

    def abort_with_reason(self, comm: Any, reason: str) -> int:
        """Abort ``comm`` at once; the simulator's libraries also tell the other ranks why."""
        sim_abort = getattr(self.lib, "anychip_sim_ccl_abort", None) if self.simulated else None
        if sim_abort is not None:
            return sim_abort(comm, reason.encode("utf-8", "replace"))
        return self.abort(comm)

    def group_start(self) -> int:
        raise NotImplementedError

    def group_end(self) -> int:
        raise NotImplementedError

    def op(self, comm: Any, kind: str, send: Any, recv: Any, count: int, dtype: int, redop: int, root: int,
           stream: Any) -> int:
        """Issue one op (count in elements of dtype; movement ops in bytes): the function
        ``calls`` names for ``kind``, given the arguments in the order listed there. A library
        whose ops need more than one call overrides this."""
        fn, where = self._bound.get(kind) or self._bind_kind(kind)
        given = (comm, send, recv, count, dtype, redop, root)
        return fn(*[given[i] for i in where], stream)

    def bind(self, comm: Any, kind: str, send: Any, recv: Any, count: int, dtype: int, redop: int,
             root: int) -> Any:
        """``op`` with everything but the stream fixed: a callable ``(stream) -> status``."""
        if type(self).op is not NativeLibrary.op:            # the subclass writes its ops out
            op = self.op
            return lambda stream: op(comm, kind, send, recv, count, dtype, redop, root, stream)
        fn, where = self._bound.get(kind) or self._bind_kind(kind)
        given = (comm, send, recv, count, dtype, redop, root)
        return functools.partial(fn, *[given[i] for i in where])

    def _bind_kind(self, kind: str) -> tuple[Any, tuple[int, ...]]:
        name, where = self._orders[kind]
        self._bound[kind] = hit = (self.function(name), where)
        return hit

    def function(self, name: str) -> Any:
        """The library's function ``name`` (a C plugin's: the entry of its table)."""
        return getattr(self.lib, name)

    # -- how the device plugin's objects reach the library (override for non-vendor plugins) --
    def use_device(self, plugin: Any, index: int) -> None:
        """Make device ``index`` current on the calling thread before a library call."""
        use = getattr(plugin, "_use", None)
        if use is not None:
            use(index)

    def stream_handle(self, plugin: Any, raw: Any) -> Any:
        """The library's stream argument for the plugin's raw stream ``raw`` (None: default stream)."""
        if raw is None:
            return self.ffi.cast("void *", 0)
        if isinstance(raw, int):
            return self.ffi.cast("void *", raw)
        return self.ffi.cast("void *", int(plugin.ffi.cast("uintptr_t", raw)))
