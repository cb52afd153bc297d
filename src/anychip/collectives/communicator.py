"""The collective front end: ``Communicator``, ``Work`` and the argument checks.

A Communicator is one rank of a group of processes, bound to one device. Every op
is checked here, once, before anything is enqueued; it is then described as an
:class:`OpSpec` and handed to the communicator's :class:`~.transport.Transport`
(the shared-memory engine, a chip's native library, MPI...), which enqueues it on
the stream and returns a :class:`Work`.

NCCL semantics: ops are enqueued on ``stream`` (default: the device's current
stream) in the order they are called; every rank must call the same collectives in
the same order. Inside ``with comm.group():`` ops are only collected; they are
issued together when the block ends (point-to-point ops of one group progress
together, so a ring of send/recv cannot deadlock), and every Work returned inside
the block completes with the group.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime._checks import non_negative_int
from ..runtime.buffer import Buffer
from ..runtime.errors import CollectiveError, CollectiveTimeout, InvalidArgumentError
from ..runtime.stream import Stream

if TYPE_CHECKING:
    from ..runtime.device import Device
    from .transports.base import Transport

__all__ = ["Communicator", "PreparedOp", "Work", "OpSpec", "DTYPES", "REDUCE_OPS", "dtype_name"]

#: supported element types: name -> bytes per element
DTYPES: dict[str, int] = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
                          "float32": 4, "float64": 8}
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
                  "fp16": "float16", "fp32": "float32", "fp64": "float64", "int": "int32", "long": "int64"}
#: supported reduce ops
REDUCE_OPS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")


def dtype_name(dtype: Any) -> str | None:
    """The canonical name of ``dtype`` (a name, a NumPy dtype or type), or None when unsupported."""
    if dtype is None:
        return None                       # not NumPy's float64: callers decide what None means
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        name = _DTYPE_ALIASES.get(name, name)
        return name if name in DTYPES else None
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return None
    return name if name in DTYPES else None


@dataclass(slots=True)
class OpSpec:
    """One checked op, as a transport receives it.

    ``count`` is in elements, as the vendor APIs count: all_reduce / broadcast / reduce:
    elements of send and recv; all_gather: elements each rank sends (recv holds
    size * count); reduce_scatter: elements each rank receives (send holds size * count);
    all_to_all: elements per peer (send and recv hold size * count); send / recv: elements.
    ``root`` is the root (broadcast, reduce) or the peer (send, recv), else -1.
    ``send`` / ``recv`` are Buffers (views included) or None where the op has none
    (barrier; broadcast's send on non-root ranks is the recv buffer).
    """
    kind: str
    send: Buffer | None
    recv: Buffer | None
    count: int
    dtype: str
    op: str
    root: int

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    def signature(self) -> tuple:
        return (self.kind, self.count, self.dtype, self.op, self.root)


class Work:
    """Handle of an enqueued op (or group).

    ``wait(timeout=None)`` blocks until it is done and raises its error (a
    :class:`CollectiveError`, :class:`CollectiveTimeout` when ``timeout`` seconds pass
    first); ``is_completed()`` never blocks; ``exception()`` is the error or None.
    Transports subclass it and implement ``_poll`` and ``_block``.
    """

    def __init__(self, what: str = "op") -> None:
        self._what = what
        self._done = False
        self._exc: BaseException | None = None

    # -- to implement -----------------------------------------------------
    def _poll(self) -> bool:
        """True when finished (then _done / _exc are set)."""
        return self._done

    def _block(self, timeout: float | None) -> bool:
        """Wait at most ``timeout`` seconds (None: no limit); True when finished."""
        return self._done

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        self._done = True

    # -- public -------------------------------------------------------------
    def is_completed(self) -> bool:
        return self._done or self._poll()

    def exception(self) -> BaseException | None:
        if not self.is_completed():
            return None
        return self._exc

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or
                                    not timeout >= 0):
            raise InvalidArgumentError(f"Work.wait: timeout must be a number of seconds >= 0 or None, "
                                       f"got {timeout!r}")
        if not (self._done or self._poll() or self._block(timeout)):
            raise CollectiveTimeout(f"{self._what} did not complete within {timeout} s (it is still running)")
        if self._exc is not None:
            raise self._exc
        return True

    def __repr__(self) -> str:
        state = "failed" if self._done and self._exc else ("done" if self._done else "pending")
        return f"<anychip Work {self._what} ({state})>"


class _GroupWork(Work):
    """A Work handed out inside ``comm.group()``: bound to the group's Work at its end."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self._inner: Work | None = None

    def _poll(self) -> bool:
        if self._inner is None:
            return False
        if self._inner.is_completed():
            self._finish(self._inner.exception())
        return self._done

    def _block(self, timeout: float | None) -> bool:
        if self._inner is None:
            raise InvalidArgumentError(f"{self._what} was issued inside comm.group() and the group has not "
                                       "ended yet; wait after the `with comm.group():` block")
        try:
            self._inner.wait(timeout)
        except CollectiveTimeout:
            if not self._inner.is_completed():
                return False
        except CollectiveError:
            pass
        return self._poll()


class _Group:
    __slots__ = ("specs", "works", "stream")

    def __init__(self) -> None:
        self.specs: list[OpSpec] = []
        self.works: list[_GroupWork] = []
        self.stream: Stream | None = None


class Communicator:
    """One rank of a group of processes, on one device. Made by
    :func:`anychip.collectives.init` or :meth:`split`."""

    def __init__(self, transport: Transport, device: Device, label: str = "world") -> None:
        self._transport = transport
        self.device: Device = device
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.label = label
        self._tls = threading.local()
        self._closed = False
        self._pid = os.getpid()
        self._forked = False                 # this process is a fork() of the one that made it
        self._splits = 0
        self._prepared: dict[tuple, PreparedOp] = {}     # the repeated calls' prepared ops (see _submit)
        self._group_prepared: dict[tuple, tuple] = {}     # the comm.group() blocks' prepared forms
        _communicators.add(self)

    # -- identity -----------------------------------------------------------
    @property
    def transport(self) -> Transport:
        return self._transport

    def __repr__(self) -> str:
        return (f"<anychip Communicator {self.label}: rank {self.rank} of {self.size} on {self.device} "
                f"via {self._transport.name}>")

    # -- ops ----------------------------------------------------------------
    def all_reduce(self, send: Buffer, recv: Buffer | None = None, count: int | None = None,
                   dtype: Any = "float32", op: str = "sum", stream: Stream | None = None) -> Work:
        """recv[i] = op over ranks of send[i], on every rank (in place when recv is None or send)."""
        return self._submit("all_reduce", send, recv, count, dtype, op, -1, stream, send_mult=1, recv_mult=1)

    def broadcast(self, send: Buffer, recv: Buffer | None = None, count: int | None = None,
                  dtype: Any = "float32", root: int = 0, stream: Stream | None = None) -> Work:
        """recv = root's send, on every rank (in place when recv is None or send)."""
        return self._submit("broadcast", send, recv, count, dtype, None, root, stream, send_mult=1, recv_mult=1)

    def reduce(self, send: Buffer, recv: Buffer | None = None, count: int | None = None,
               dtype: Any = "float32", op: str = "sum", root: int = 0, stream: Stream | None = None) -> Work:
        """root's recv = op over ranks of send (recv is only written on the root)."""
        return self._submit("reduce", send, recv, count, dtype, op, root, stream, send_mult=1, recv_mult=1)

    def all_gather(self, send: Buffer, recv: Buffer, count: int | None = None, dtype: Any = "float32",
                   stream: Stream | None = None) -> Work:
        """recv = the concatenation of every rank's send (count elements each), in rank order."""
        return self._submit("all_gather", send, recv, count, dtype, None, -1, stream, send_mult=1,
                            recv_mult=self.size)

    def reduce_scatter(self, send: Buffer, recv: Buffer, count: int | None = None, dtype: Any = "float32",
                       op: str = "sum", stream: Stream | None = None) -> Work:
        """recv (count elements) = op over ranks of block ``rank`` of send (size * count elements)."""
        return self._submit("reduce_scatter", send, recv, count, dtype, op, -1, stream, send_mult=self.size,
                            recv_mult=1)

    def all_to_all(self, send: Buffer, recv: Buffer | None = None, count: int | None = None,
                   dtype: Any = "float32", stream: Stream | None = None) -> Work:
        """Block j of send (count elements) goes to rank j; block j of recv comes from rank j."""
        return self._submit("all_to_all", send, recv, count, dtype, None, -1, stream, send_mult=self.size,
                            recv_mult=self.size)

    def send(self, buf: Buffer, peer: int, count: int | None = None, dtype: Any = "float32",
             stream: Stream | None = None) -> Work:
        """Send count elements of buf to ``peer`` (which calls recv)."""
        return self._submit("send", buf, None, count, dtype, None, peer, stream, send_mult=1, recv_mult=0)

    def recv(self, buf: Buffer, peer: int, count: int | None = None, dtype: Any = "float32",
             stream: Stream | None = None) -> Work:
        """Receive count elements from ``peer`` (which calls send) into buf."""
        return self._submit("recv", None, buf, count, dtype, None, peer, stream, send_mult=0, recv_mult=1)

    def barrier(self, stream: Stream | None = None) -> Work:
        """Completes once every rank has reached it (on the stream, like the other ops)."""
        return self._submit("barrier", None, None, 0, "uint8", None, -1, stream, send_mult=0, recv_mult=0)

    # -- groups ---------------------------------------------------------------
    @contextmanager
    def group(self) -> Iterator[Communicator]:
        """Collect the ops called inside the block and issue them together at its end
        (NCCL's ncclGroupStart / ncclGroupEnd). Groups nest; the outermost issues."""
        outer = getattr(self._tls, "group", None)
        if outer is not None:
            yield self
            return
        g = _Group()
        self._tls.group = g
        try:
            yield self
        except BaseException:
            self._tls.group = None
            raise
        self._tls.group = None
        if not g.specs:
            return
        stream = g.stream or self.device.current_stream()
        work = self._transport.submit_prepared(self._prepare_group(g.specs, stream), stream)
        for w in g.works:
            w._inner = work

    def _prepare_group(self, specs: list[OpSpec], stream: Stream) -> tuple[list[OpSpec], Any]:
        """The transport's prepared form of a group, reused when the same ops on the same
        buffers and stream come again (a send / recv ring issued every step)."""
        key = (id(stream), *((sp.signature(), _ident(sp.send), _ident(sp.recv)) for sp in specs))
        hit = self._group_prepared.get(key)
        if hit is not None and hit[0]() is stream and len(hit[1]) == len(specs) and all(
                rs() is _owner(sp.send) and rr() is _owner(sp.recv)
                for (rs, rr), sp in zip(hit[1], specs, strict=True)):
            return specs, hit[2]
        specs, native = self._transport.prepare(specs)
        if len(self._group_prepared) >= 64:
            self._group_prepared.clear()
        self._group_prepared[key] = (weakref.ref(stream), [(_ref(_owner(sp.send)), _ref(_owner(sp.recv)))
                                                           for sp in specs], native)
        return specs, native

    # -- sub-groups -------------------------------------------------------------
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """A communicator of the ranks that pass the same ``color``, ordered by
        (key, rank). Every rank must call it; a rank passing None gets None."""
        self._live()
        if color is not None and (type(color) is not int or color < 0):
            raise InvalidArgumentError(f"split: color must be an int >= 0 or None, got {color!r}")
        if type(key) is not int:
            raise InvalidArgumentError(f"split: key must be an int, got {key!r}")
        entries = self._transport.exchange((color, key))
        self._splits += 1
        if color is None:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(entries) if c == color)
        ranks = [r for _, r in members]
        label = f"{self.label}.split{self._splits}(color={color})"
        sub = self._transport.sub(ranks, f"s{self._splits}c{color}", label)
        return Communicator(sub, self.device, label)

    def exchange(self, obj: Any) -> list[Any]:
        """All-gather of a small picklable object (bootstrap, unique ids): the list of every rank's."""
        self._live()
        return self._transport.exchange(obj)

    def destroy(self) -> None:
        """Release the communicator (its shared memory, its native communicator). In a forked
        child it only forgets the parent's communicator: the parent's rank stays a member."""
        if not self._closed:
            self._closed = True
            self._transport.close()

    def abort(self, reason: str = "aborted by the user") -> None:
        """Make every rank's pending and future ops of this communicator fail."""
        if self._forked:
            raise self._fork_error("abort")
        self._transport.abort(reason)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    # -- checks ---------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            if self._forked:
                raise self._fork_error("this call")
            raise InvalidArgumentError(f"{self!r} was destroyed")

    def _fork_error(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{what}: {self!r} belongs to process {self._pid}; this process ({os.getpid()}) is a fork() of it and "
            "cannot take part as that rank. Make the communicator in the child (anychip.collectives.init) or "
            "start workers with the 'spawn' method")

    def _buffer(self, name: str, what: str, buf: Any) -> Buffer:
        if not isinstance(buf, Buffer):
            raise InvalidArgumentError(f"{name}: {what} must be an anychip.Buffer on {self.device}, "
                                       f"got {type(buf).__name__}")
        if buf.device is not self.device:
            raise InvalidArgumentError(f"{name}: {what} is on {buf.device}; this communicator's rank "
                                       f"{self.rank} works on {self.device}")
        if buf.freed:
            raise InvalidArgumentError(f"{name}: {what} was freed")
        return buf

    def _submit(self, kind: str, send: Any, recv: Any, count: Any, dtype: Any, op: Any, root: Any,
                stream: Stream | None, *, send_mult: int, recv_mult: int) -> Work:
        if self._closed:
            self._live()
        if hasattr(send, "__anychip_buffer__") or hasattr(recv, "__anychip_buffer__"):
            send, recv, dtype = _from_tensors(kind, send, recv, dtype)
        stream = self._stream(kind, stream)
        # a call repeated with the same buffers and arguments launches the prepared op made by
        # its first call (held with its buffers weakly, so they are released as usual); a view
        # (made afresh at each call, as a framework's tensor inside its storage is) is known by
        # the buffer it views and its range
        key = (kind, _ident(send), _ident(recv), count, dtype, op, root)
        try:
            prepared = self._prepared.get(key)
            hashable = True
        except TypeError:                 # an unhashable argument: the checks below say what is wrong
            prepared, hashable = None, False
        if prepared is None or not prepared._binds(send, recv):
            spec = self._check(kind, send, recv, count, dtype, op, root, send_mult, recv_mult)
            prepared = PreparedOp(self, spec, (send, recv) if hashable else None)
            if hashable:
                if len(self._prepared) >= 64:
                    self._prepared.clear()
                self._prepared[key] = prepared
        return prepared._launch_with(send, recv, stream)

    def prepare(self, kind: str, buf: Any, count: Any = None, dtype: Any = "float32", op: Any = "sum", *,
                recv: Any = None, root: Any = None, peer: Any = None) -> PreparedOp:
        """An op checked once and bound to its buffers (MPI's ``MPI_Allreduce_init`` / ``MPI_Start``
        model): ``op = comm.prepare("all_reduce", buf, count, dtype, "sum")``, then
        ``op.launch(stream)`` issues it, as often as wanted, at the cost of one call.

        ``kind``: all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, send,
        recv or barrier. ``buf`` is the send buffer (recv's receive buffer; None for a barrier);
        ``recv`` the receive buffer where the op has one (default: in place, ``buf``, for
        all_reduce / broadcast / reduce / all_to_all); ``count`` and ``dtype`` as the op's own call
        takes them; ``op`` the reduction (reducing ops only); ``root`` (broadcast, reduce; default
        0) or ``peer`` (send, recv). The op holds its buffers: a launch after one was freed is
        refused. Its Work is one object, re-armed by every launch (see :meth:`PreparedOp.launch`)."""
        self._live()
        if kind not in _KINDS:
            raise InvalidArgumentError(f"prepare: kind {kind!r} is not a collective; use one of {', '.join(_KINDS)}")
        send_mult, recv_mult = _KINDS[kind](self.size)
        reducing = kind in ("all_reduce", "reduce", "reduce_scatter")
        if not reducing and op not in ("sum", None):
            raise InvalidArgumentError(f"prepare: {kind} takes no reduce op (got op={op!r})")
        root = _prepare_root(kind, root, peer)
        send, recv = _prepare_buffers(kind, buf, recv)
        if kind == "barrier":
            count, dtype = 0, "uint8"
        if hasattr(send, "__anychip_buffer__") or hasattr(recv, "__anychip_buffer__"):
            send, recv, dtype = _from_tensors(kind, send, recv, dtype)
        spec = self._check(kind, send, recv, count, dtype, op if reducing else None, root, send_mult, recv_mult)
        return PreparedOp(self, spec, None)

    def _group_add(self, g: _Group, kind: str, spec: OpSpec, stream: Stream) -> Work:
        if g.stream is not None and g.stream is not stream:
            raise InvalidArgumentError(f"{kind}: every op of one comm.group() must use the same stream; "
                                       f"the group uses {g.stream!r}, this op {stream!r}")
        g.stream = stream
        g.specs.append(spec)
        w = _GroupWork(f"{kind} (in a group)")
        g.works.append(w)
        return w

    def _stream(self, kind: str, stream: Any) -> Stream:
        if stream is None:
            return self.device.current_stream()
        if not isinstance(stream, Stream):
            raise InvalidArgumentError(f"{kind}: stream must be an anychip.Stream of {self.device}, "
                                       f"got {type(stream).__name__}")
        if stream.device is not self.device:
            raise InvalidArgumentError(f"{kind}: stream is a stream of {stream.device}; this communicator "
                                       f"works on {self.device}")
        stream._live()
        return stream

    def _check(self, kind: str, send: Any, recv: Any, count: Any, dtype: Any, op: Any, root: Any,
               send_mult: int, recv_mult: int) -> OpSpec:
        name = "float32" if dtype is None else dtype_name(dtype)     # None: the default (np.dtype(None) is float64)
        if name is None:
            raise InvalidArgumentError(f"{kind}: dtype {dtype!r} is not supported; use one of "
                                       f"{', '.join(DTYPES)} (by name or as a NumPy dtype)")
        item = DTYPES[name]
        if op is not None:
            op = _op_name(kind, op)
        if kind in ("broadcast", "reduce", "send", "recv"):
            root = _rank_arg(kind, "peer" if kind in ("send", "recv") else "root", root, self.size)
        if send_mult:
            send = self._buffer(kind, "buf" if kind == "send" else "send", send)
        if recv_mult:
            if recv is None and kind in ("all_reduce", "broadcast", "reduce", "all_to_all"):
                recv = send
            recv = self._buffer(kind, "buf" if kind == "recv" else "recv", recv)
        count = self._count(kind, count, send, recv, item, send_mult, recv_mult)
        for buf, mult, what in ((send, send_mult, "send"), (recv, recv_mult, "recv")):
            if not mult:
                continue
            need = count * mult * item
            if buf.nbytes < need:
                label = "buf" if kind in ("send", "recv") else what
                fits = buf.nbytes // (mult * item)
                raise InvalidArgumentError(
                    f"{kind}: {label} holds {buf.nbytes} bytes but count={count} {name} needs {need} bytes"
                    + (f" ({mult} ranks x {count} x {item} bytes)" if mult > 1 else "")
                    + f"; it fits count <= {fits}")
        if send_mult and recv_mult:
            _check_overlap(kind, send, recv, count, item, self.rank, self.size)
        return OpSpec(kind, send, recv, count, name, op or "sum", root if root is not None else -1)

    def _count(self, kind: str, count: Any, send: Buffer | None, recv: Buffer | None, item: int,
               send_mult: int, recv_mult: int) -> int:
        if count is None:
            if kind == "barrier":
                return 0
            if kind == "reduce_scatter":
                buf, mult = recv, 1
            elif send_mult:
                buf, mult = send, send_mult
            else:
                buf, mult = recv, recv_mult
            assert buf is not None
            if buf.nbytes % (item * mult):
                raise InvalidArgumentError(
                    f"{kind}: count not given and the {buf.nbytes}-byte buffer is not a whole number of "
                    f"{mult * item}-byte units ({mult} x {item}-byte elements); pass count=")
            return buf.nbytes // (item * mult)
        return non_negative_int(count, f"{kind}: count")


#: op kind -> (send_mult, recv_mult) in a group of ``size`` ranks: the multiples of count that
#: send and recv hold (0: the op has no such buffer)
_KINDS: dict[str, Any] = {
    "all_reduce": lambda n: (1, 1), "broadcast": lambda n: (1, 1), "reduce": lambda n: (1, 1),
    "all_gather": lambda n: (1, n), "reduce_scatter": lambda n: (n, 1), "all_to_all": lambda n: (n, n),
    "send": lambda n: (1, 0), "recv": lambda n: (0, 1), "barrier": lambda n: (0, 0)}


_UNPREPARED = object()


class PreparedOp:
    """An op checked once and bound to its buffers: :meth:`Communicator.prepare` makes it,
    :meth:`launch` issues it. The transport's prepared form (the engine's op array, the
    library call with its arguments converted) is made once, at prepare.

    The communicator makes these too, for its own repeated calls (``comm.all_reduce(x)`` in a
    loop): those hold their buffers weakly (a dropped buffer is released as usual and its
    entry misses) and give each call a Work of its own."""

    __slots__ = ("_comm", "_transport", "kind", "_fields", "_native", "_specs", "_last", "_refs", "_has_recv",
                 "_work", "__weakref__")

    def __init__(self, comm: Communicator, spec: OpSpec, call: tuple[Any, Any] | None) -> None:
        """``call``: for the communicator's own entries, the (send, recv) its call passed (held
        weakly); None: a prepared op that holds its buffers."""
        self._comm = comm
        self._transport = comm._transport
        self.kind = spec.kind
        # the transport's form: made here for a prepared op, at the first launch outside a group
        # for an entry (a group's ops are prepared together, at the group's end)
        specs, native = comm._transport.prepare([spec]) if call is None else ([spec], _UNPREPARED)
        self._native: Any = native
        self._fields = (spec.kind, spec.count, spec.dtype, spec.op, spec.root)
        self._has_recv = spec.recv is not None
        self._work: Work | None = None
        self._last: Any = None
        if call is not None:
            self._specs: _Specs | None = None
            self._refs: tuple[Any, Any] | None = (_ref(_owner(call[0])), _ref(_owner(call[1])))
        else:
            self._specs = _Specs(specs)
            self._refs = None

    def launch(self, stream: Stream | None = None) -> Work:
        """Issue the op on ``stream`` (default: the device's current stream), as the op's own
        call would; inside ``with comm.group():`` it joins the group. Returns the op's Work:
        one object, re-armed by each launch, so that a launch allocates nothing; it tracks the
        latest launch (on one stream, waiting for it waits for every earlier one)."""
        comm = self._comm
        if comm._closed:
            comm._live()
        specs = self._specs
        assert specs is not None, "the communicator's own entries are launched through its calls"
        sp = specs[0]
        if (sp.send is not None and sp.send.freed) or (sp.recv is not None and sp.recv.freed):
            which = "send" if sp.send is not None and sp.send.freed else "recv"
            raise InvalidArgumentError(f"{self.kind}: the prepared op's {which} buffer was freed; prepare the op "
                                       "again with live buffers")
        stream = comm._stream(self.kind, stream)
        g = getattr(comm._tls, "group", None)
        if g is not None:
            return comm._group_add(g, self.kind, sp, stream)
        work = self._transport.submit_prepared((specs, self._native), stream, True, self._work)
        self._work = work
        return work

    # -- the communicator's own entries ------------------------------------------------
    def _binds(self, send: Any, recv: Any) -> bool:
        """Whether a call on ``send`` / ``recv`` is this entry's op: the same buffers (or views of
        the same ones), none of them freed."""
        refs = self._refs
        return (refs is not None and refs[0]() is _owner(send) and refs[1]() is _owner(recv) and
                not (send is not None and send.freed) and not (recv is not None and recv.freed))

    def _launch_with(self, send: Any, recv: Any, stream: Stream) -> Work:
        """Issue the op for a call on ``send`` / ``recv``. The spec list last issued is held weakly
        and reused while a stream (or a Work) still holds it, so that back-to-back calls do not
        each leave a new spec and list behind them (objects held until their op completes age into
        the collector's oldest generation, whose full collections cost milliseconds)."""
        last = self._last
        specs = last() if last is not None else self._specs
        if specs is None:
            k, c, d, o, r = self._fields
            specs = _Specs([OpSpec(k, send, recv if recv is not None or not self._has_recv else send, c, d, o, r)])
            self._last = weakref.ref(specs)
        g = getattr(self._comm._tls, "group", None)
        if g is not None:
            return self._comm._group_add(g, self.kind, specs[0], stream)
        if self._native is _UNPREPARED:
            self._native = self._transport.prepare(specs)[1]
        return self._transport.submit_prepared((specs, self._native), stream)

    def __repr__(self) -> str:
        kind, count, dtype, op, root = self._fields
        return f"<anychip PreparedOp {kind}(count={count}, {dtype}, op={op}, root={root}) of {self._comm!r}>"


def _prepare_root(kind: str, root: Any, peer: Any) -> Any:
    """``prepare``'s root argument: the root (broadcast, reduce; default 0), the peer (send,
    recv), else -1; a root or peer given to an op that has none is refused."""
    if kind in ("send", "recv"):
        if root is not None:
            raise InvalidArgumentError(f"prepare: {kind} takes peer=, not root=")
        if peer is None:
            raise InvalidArgumentError(f"prepare: {kind} needs peer= (the rank it exchanges with)")
        return peer
    if peer is not None:
        raise InvalidArgumentError(f"prepare: {kind} takes no peer= (send and recv do)")
    if kind in ("broadcast", "reduce"):
        return 0 if root is None else root
    if root is not None:
        raise InvalidArgumentError(f"prepare: {kind} takes no root= (broadcast and reduce do)")
    return -1


def _prepare_buffers(kind: str, buf: Any, recv: Any) -> tuple[Any, Any]:
    """``prepare``'s (send, recv) from its ``buf`` and ``recv`` arguments."""
    if kind == "recv":
        if recv is not None:
            raise InvalidArgumentError("prepare: recv receives into buf; it takes no recv=")
        return None, buf
    if kind == "barrier":
        if buf is not None or recv is not None:
            raise InvalidArgumentError("prepare: barrier takes no buffers (pass None)")
        return None, None
    if kind == "send" and recv is not None:
        raise InvalidArgumentError("prepare: send takes no recv=")
    if kind in ("all_gather", "reduce_scatter") and recv is None:
        raise InvalidArgumentError(f"prepare: {kind} needs recv= (its receive buffer)")
    return buf, recv


#: every communicator of this process, for the fork hook
_communicators: weakref.WeakSet[Communicator] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing task) inherits its parent's
    communicators, shared memory and native handles included. It must not act as the
    parent's rank: every call raises, and destroy forgets them without telling the peers."""
    for comm in list(_communicators):
        comm._forked = True
        comm._closed = True
        comm._prepared, comm._group_prepared = {}, {}


os.register_at_fork(after_in_child=_after_fork_in_child)


def _none() -> None:
    return None


def _from_tensors(kind: str, send: Any, recv: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """Tensors (anything with ``__anychip_buffer__() -> (Buffer, dtype name)``) as Buffers and
    their dtype. A dtype left at its default ("float32") takes the tensors'; one given
    explicitly must match them."""
    dtypes = []
    out = []
    for x in (send, recv):
        if hasattr(x, "__anychip_buffer__"):
            buf, name = x.__anychip_buffer__()
            dtypes.append(name)
            out.append(buf)
        else:
            out.append(x)
    if len(set(dtypes)) > 1:
        raise InvalidArgumentError(f"{kind}: send and recv tensors have different dtypes ({' and '.join(dtypes)})")
    if dtype is not None and dtype != "float32" and dtype_name(dtype) != dtypes[0]:
        raise InvalidArgumentError(f"{kind}: dtype={dtype!r} but the tensor holds {dtypes[0]}; leave dtype out "
                                   "when passing tensors")
    return out[0], out[1], dtypes[0]


class _Specs(list):
    """The spec list of a prepared call. The communicator's cache refers to it weakly: while
    a stream (or a Work) still holds it for an earlier op, a repeated call submits the same
    list, so back-to-back ops do not each leave a new spec and list behind them (objects held
    until their op completes age into the collector's oldest generation, whose full
    collections cost milliseconds)."""

    __slots__ = ("__weakref__",)


def _ref(obj: Any) -> Any:
    return _none if obj is None else weakref.ref(obj)


def _viewed(buf: Any) -> Buffer | None:
    """The buffer that ``buf`` views, or None (not a view, not a Buffer)."""
    return buf._root if isinstance(buf, Buffer) else None


def _owner(buf: Any) -> Any:
    """The object whose identity the prepared-op caches check for ``buf``: the buffer a view
    views (held weakly there, so a dropped or freed one misses), else ``buf`` itself."""
    root = _viewed(buf)
    return buf if root is None else root


def _ident(buf: Any) -> Any:
    """``buf``'s part of a prepared-op cache key: its id, or for a view the id of the buffer
    it views and the view's range (the memory it names, whichever view object names it)."""
    root = _viewed(buf)
    return id(buf) if root is None else (id(root), buf._offset, buf.nbytes)


def _op_name(kind: str, op: Any) -> str:
    if op in REDUCE_OPS:
        return op
    name = op.strip().lower() if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(name, str):
        name = name.lower()
    if name not in REDUCE_OPS:
        raise InvalidArgumentError(f"{kind}: reduce op {op!r} is not supported; use one of {', '.join(REDUCE_OPS)}")
    return name


def _rank_arg(kind: str, what: str, value: Any, size: int) -> int:
    if type(value) is not int and not isinstance(value, np.integer):
        raise InvalidArgumentError(f"{kind}: {what} must be an int rank in [0, {size}), got {value!r}")
    value = int(value)
    if not 0 <= value < size:
        raise InvalidArgumentError(f"{kind}: {what}={value} is out of range; the group has ranks 0..{size - 1}")
    return value


def _span(buf: Buffer, nbytes: int) -> tuple[int, int, int]:
    """(identity of the allocation, start, end) with offsets from the start of the allocation."""
    root = buf._root if buf._root is not None else buf
    start = buf._offset - root._offset
    return id(root), start, start + nbytes


def _check_overlap(kind: str, send: Buffer, recv: Buffer, count: int, item: int, rank: int, size: int) -> None:
    """send and recv are either disjoint or the op's in-place layout."""
    if send is recv and kind not in ("all_gather", "reduce_scatter"):
        return
    mult_s = size if kind in ("reduce_scatter", "all_to_all") else 1
    mult_r = size if kind in ("all_gather", "all_to_all") else 1
    rs, s0, s1 = _span(send, count * mult_s * item)
    rr, r0, r1 = _span(recv, count * mult_r * item)
    if rs != rr or s1 <= r0 or r1 <= s0 or count == 0:
        return
    if kind == "all_gather" and s0 == r0 + rank * count * item:
        return
    if kind == "reduce_scatter" and r0 == s0 + rank * count * item:
        return
    if s0 == r0 and mult_s == mult_r:
        return
    where = {"all_gather": f"send at recv + rank*count*{item} bytes",
             "reduce_scatter": f"recv at send + rank*count*{item} bytes"}.get(kind, "send is recv")
    raise InvalidArgumentError(f"{kind}: send [{s0}, {s1}) and recv [{r0}, {r1}) overlap without being the "
                               f"in-place layout ({where}); use disjoint buffers or the in-place layout")
