"""Placements: how a tensor lies along one axis of a ProcessMesh.

``Shard(dim)``: each rank of the axis holds one chunk of tensor dimension ``dim``
(``torch.chunk`` sizes: ceil(n / k) elements per rank, the last ranks' chunks
shorter or empty). ``Replicate()``: every rank holds the whole tensor.
``Partial(op)``: every rank holds a tensor of the full shape; the value is the
reduction (``op``) of them over the axis.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime.errors import InvalidArgumentError

__all__ = ["Placement", "Shard", "Replicate", "Partial"]

#: reduce ops a Partial placement may carry (those the collectives reduce with)
PARTIAL_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base class of Shard, Replicate and Partial."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicated(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


@dataclass(frozen=True)
class Shard(Placement):
    """Tensor dimension ``dim`` split in chunks over the mesh axis (torch.chunk sizes)."""
    dim: int

    def __post_init__(self) -> None:
        if type(self.dim) is not int:
            raise InvalidArgumentError(f"Shard: dim must be an int, got {self.dim!r}")

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """The whole tensor on every rank of the mesh axis."""

    def is_replicated(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial(Placement):
    """Full-shape tensors on every rank whose reduction (``op``) over the axis is the value."""
    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in PARTIAL_OPS:
            raise InvalidArgumentError(f"Partial: reduce op {self.op!r} is not supported; use one of "
                                       f"{', '.join(PARTIAL_OPS)}")

    def is_partial(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Partial(op={self.op!r})"
