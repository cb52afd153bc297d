"""What every transport shares: the :class:`Transport` interface and the sizes of an op.

:class:`Transport` is the interface a communicator talks to; every transport of this
package implements it:

* ``rank`` / ``size`` / ``name``;
* ``submit(specs, stream) -> Work``: enqueue a list of checked :class:`OpSpec` (one op,
  or a whole ``comm.group()``: its point-to-point ops progress together, then its
  collectives in order) on ``stream``; errors known at once are raised, errors of
  enqueued work come from ``Work.wait``;
* ``prepare(specs)`` / ``submit_prepared(prepared, stream, reuse=False, work=None)``: optional,
  a cheaper path for an op submitted again and again (a :class:`~..communicator.PreparedOp`);
  with ``reuse``, ``work`` is the Work this transport returned for the previous launch of the
  same prepared op (None at the first), which it may re-arm and return instead of making a new
  one;
* ``exchange(obj) -> list``: all-gather of a small picklable object, in call order with
  the ops (bootstrap of native libraries, ``split``);
* ``sub(ranks, tag, label) -> Transport``: a transport for the listed ranks (new rank =
  position in the list), called by exactly those ranks;
* ``abort(reason)`` and ``close()``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...runtime.stream import Stream
    from ..communicator import OpSpec, Work

__all__ = ["Transport", "sizes", "same_span"]


class Transport:
    """Interface of a collective transport (see the module docstring)."""

    name: str = "?"
    rank: int = 0
    size: int = 1

    def submit(self, specs: list[OpSpec], stream: Stream) -> Work:
        raise NotImplementedError

    def prepare(self, specs: list[OpSpec]) -> tuple[list[OpSpec], Any]:
        """(specs, native): ``native`` is whatever makes repeated submits of the same checked ops
        cheaper (default None). It must not hold the buffers (the communicator caches it and
        rebuilds the specs around it); it stays valid while the buffers are alive and not freed."""
        return specs, None

    def submit_prepared(self, prepared: tuple[list[OpSpec], Any], stream: Stream, reuse: bool = False,
                        work: Work | None = None) -> Work:
        return self.submit(prepared[0], stream)

    def exchange(self, obj: Any) -> list[Any]:
        raise NotImplementedError

    def sub(self, ranks: list[int], tag: str, label: str) -> Transport:
        raise NotImplementedError

    def abort(self, reason: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def sizes(sp: OpSpec, size: int) -> tuple[int, int]:
    """Bytes the op reads from send and writes to recv (in a group of ``size`` ranks)."""
    n = sp.count * sp.itemsize
    send_mult = {"reduce_scatter": size, "all_to_all": size, "recv": 0, "barrier": 0}.get(sp.kind, 1)
    recv_mult = {"all_gather": size, "all_to_all": size, "send": 0, "barrier": 0}.get(sp.kind, 1)
    return n * send_mult, n * recv_mult


def same_span(a: Any, b: Any) -> bool:
    """Whether two Buffers start at the same byte of the same allocation."""
    ra = a._root if a._root is not None else a
    rb = b._root if b._root is not None else b
    return ra is rb and a._offset == b._offset
