"""Which part of a global tensor a rank holds: torch.chunk sizes, nested over mesh axes.

Shard(d) on a mesh axis of k ranks splits a dimension of n elements in chunks of
ceil(n / k): rank i holds [i * c, min((i + 1) * c, n)), so the last ranks' chunks
may be shorter or empty (PyTorch DTensor's rule; Paddle's BalancedSplit gives the
same sizes whenever only the last chunk is short). When several mesh axes shard the
same dimension they apply in mesh-axis order: axis 0 splits the dimension, axis 1
splits axis 0's chunk, and so on.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..runtime.errors import InvalidArgumentError
from .placement import Partial, Placement, Replicate, Shard


def chunk(n: int, k: int, i: int) -> tuple[int, int]:
    """(offset, size) of chunk i of n elements split over k ranks."""
    c = -(-n // k)
    start = min(i * c, n)
    return start, max(0, min(c, n - start))


def chunk_size(n: int, k: int) -> int:
    """The padded chunk: what every rank contributes to an all_gather / reduce_scatter."""
    return -(-n // k)


def local_box(shape: Sequence[int], placements: Sequence[Placement], mesh_shape: Sequence[int],
              coord: Sequence[int]) -> tuple[list[int], list[int]]:
    """(offsets, sizes) of the block of the global tensor that the rank at ``coord`` holds."""
    offsets = [0] * len(shape)
    sizes = list(shape)
    for a, p in enumerate(placements):
        if isinstance(p, Shard):
            off, size = chunk(sizes[p.dim], mesh_shape[a], coord[a])
            offsets[p.dim] += off
            sizes[p.dim] = size
    return offsets, sizes


def normalize(placements: Sequence[Placement], ndim: int, mesh_ndim: int, what: str) -> tuple[Placement, ...]:
    """Checked placements, one per mesh axis, with negative Shard dims made positive."""
    if isinstance(placements, Placement):
        placements = [placements]
    elif isinstance(placements, (list, tuple)):
        placements = list(placements)
    else:
        raise InvalidArgumentError(f"{what}: placements must be a list of Shard(dim), Replicate() or Partial(op), "
                                   f"one per mesh dimension, got {placements!r}")
    if len(placements) > mesh_ndim:
        raise InvalidArgumentError(f"{what}: {len(placements)} placements given for a {mesh_ndim}-d mesh; "
                                   f"give one per mesh dimension")
    placements += [Replicate()] * (mesh_ndim - len(placements))
    out: list[Placement] = []
    for p in placements:
        if not isinstance(p, Placement):
            raise InvalidArgumentError(f"{what}: placements must be Shard(dim), Replicate() or Partial(op), "
                                       f"got {p!r}")
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise InvalidArgumentError(f"{what}: {p!r} is out of range for a {ndim}-d tensor")
            p = Shard(p.dim % ndim)
        out.append(p)
    return tuple(out)


def partial_op(placements: Sequence[Placement]) -> str | None:
    ops = {p.op for p in placements if isinstance(p, Partial)}
    return ops.pop() if len(ops) == 1 else None
