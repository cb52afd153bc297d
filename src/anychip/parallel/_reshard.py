"""Executing a reshard plan: one collective per step on the mesh axis' communicator.

all_gather and reduce_scatter need equal counts on every rank, so uneven chunks are
padded to the full chunk size ceil(n / k) before and cut after, as DTensor does.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError
from ._local import empty, host, upload, whole
from ._plan import Step
from ._sharding import chunk, chunk_size, local_box
from .mesh import ProcessMesh
from .placement import Partial, Placement

#: collectives issued by reshard in this process, by kind (benchmarks read it)
counts: dict[str, int] = {}
#: seconds spent in them (issue to completion)
seconds: dict[str, float] = {}


#: the collective's reduction of a Partial op (any / all of 0 / 1 values are max / min)
COLLECTIVE_OP = {"any": "max", "all": "min"}


def collective_op(op: str) -> str:
    return COLLECTIVE_OP.get(op, op)


def to_partial_block(x: np.ndarray, op: str, first: bool) -> np.ndarray:
    """This rank's part of a replicated value made Partial(op): the rank at coordinate 0 keeps
    the value; the others hold the op's identity for sum (0) and prod (1), the value itself for
    avg, max, min, any and all (reducing copies of it gives it back)."""
    if first or op not in ("sum", "prod"):
        return x
    return np.zeros_like(x) if op == "sum" else np.ones_like(x)


def _pad(x: np.ndarray, dim: int, length: int) -> np.ndarray:
    if x.shape[dim] == length:
        return x
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, length - x.shape[dim])
    return np.pad(x, widths)


def _run(kind: str, comm: Any, x: np.ndarray, recv_shape: tuple[int, ...], **kw: Any) -> np.ndarray:
    """Run one collective on device copies of ``x``; the host copy of the result."""
    import time
    dev = comm.device
    send = upload(x, dev)
    t0 = time.perf_counter()
    if kind == "all_reduce":
        comm.all_reduce(whole(send), count=x.size, dtype=x.dtype, op=kw["op"]).wait()
        recv = send
    else:
        recv = empty(recv_shape, x.dtype, dev)
        count = kw["count"]
        getattr(comm, kind)(whole(send), whole(recv), count=count, dtype=x.dtype, **kw.get("extra", {})).wait()
    seconds[kind] = seconds.get(kind, 0.0) + time.perf_counter() - t0
    counts[kind] = counts.get(kind, 0) + 1
    return np.array(host(recv))


def all_reduce_in_place(steps: Sequence[Step], local: Any, mesh: ProcessMesh) -> Any:
    """A plan of all_reduce steps only (Partial -> Replicate on each axis, the gradients' path)
    run on a device copy of the block, with no trip through the host."""
    import time
    out = local.clone()
    mesh.device.synchronize()          # the work queued before counts as compute, not collective time
    for step in steps:
        comm = mesh.axis_comm(step.axis)
        if mesh.shape[step.axis] == 1 or comm is None:
            continue
        src: Any = step.src                          # a Partial: all_reduce steps start from one
        t0 = time.perf_counter()
        comm.all_reduce(whole(out), count=out.size, dtype=out.dtype.name, op=collective_op(src.op)).wait()
        seconds["all_reduce"] = seconds.get("all_reduce", 0.0) + time.perf_counter() - t0
        counts["all_reduce"] = counts.get("all_reduce", 0) + 1
    return out


def run_step(step: Step, x: np.ndarray, shape: Sequence[int], cur: Sequence[Placement],
             mesh: ProcessMesh) -> np.ndarray:
    """The local block after ``step`` (cur: the placements before it)."""
    a = step.axis
    src: Any = step.src
    dst: Any = step.dst
    k = mesh.shape[a]
    coord = mesh.coordinate
    assert coord is not None
    i = coord[a]
    parent = local_box(shape, cur[:a], mesh.shape[:a], coord[:a])[1]
    comm = mesh.axis_comm(a)
    if step.kind == "to_partial":
        return to_partial_block(x, dst.op, i == 0)
    if k == 1 or comm is None:                        # an axis of one rank moves nothing
        return x
    if step.kind == "all_reduce":
        return _run("all_reduce", comm, x, x.shape, op=collective_op(src.op))
    if step.kind == "slice":
        d = dst.dim
        off, size = chunk(parent[d], k, i)
        return np.ascontiguousarray(np.take(x, range(off, off + size), axis=d))
    if step.kind == "all_gather":
        d = src.dim
        n, c = parent[d], chunk_size(parent[d], k)
        send = np.moveaxis(_pad(x, d, c), d, 0)
        rest = send.shape[1:]
        out = _run("all_gather", comm, send, (k * c, *rest), count=send.size)
        return np.ascontiguousarray(np.moveaxis(out[:n], 0, d))
    if step.kind == "reduce_scatter":
        d = dst.dim
        n, c = parent[d], chunk_size(parent[d], k)
        send = np.moveaxis(_pad(x, d, k * c), d, 0)
        rest = send.shape[1:]
        out = _run("reduce_scatter", comm, send, (c, *rest), count=c * int(np.prod(rest)),
                   extra={"op": collective_op(src.op)})
        return np.ascontiguousarray(np.moveaxis(out[:chunk(n, k, i)[1]], 0, d))
    if step.kind == "all_to_all":
        return _all_to_all(comm, x, src.dim, dst.dim, parent, k, i)
    raise InvalidArgumentError(f"reshard: unknown step {step.kind!r}")


def _all_to_all(comm: Any, x: np.ndarray, d1: int, d2: int, parent: Sequence[int], k: int, i: int) -> np.ndarray:
    """Shard(d1) -> Shard(d2): block j of my d1-chunk, cut along d2, goes to rank j."""
    n1, n2 = parent[d1], parent[d2]
    c1, c2 = chunk_size(n1, k), chunk_size(n2, k)
    padded = _pad(_pad(x, d1, c1), d2, k * c2)
    moved = np.moveaxis(padded, d2, 0)                       # (k * c2, ...)
    send = moved.reshape(k, c2, *moved.shape[1:])
    out = _run("all_to_all", comm, send, send.shape, count=send.size // k)
    pieces = [np.moveaxis(out[j], 0, d2) for j in range(k)]   # rank j's d1-chunk of my d2-chunk
    whole = np.concatenate(pieces, axis=d1)
    whole = np.take(whole, range(n1), axis=d1)
    return np.ascontiguousarray(np.take(whole, range(chunk(n2, k, i)[1]), axis=d2))


def is_partial(placements: Sequence[Placement]) -> bool:
    return any(isinstance(p, Partial) for p in placements)
