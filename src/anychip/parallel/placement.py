"""Placements: how a tensor lies along one axis of a ProcessMesh.

``Shard(dim)``: each rank of the axis holds one chunk of tensor dimension ``dim``
(``torch.chunk`` sizes: ceil(n / k) elements per rank, the last ranks' chunks
shorter or empty). ``Replicate()``: every rank holds the whole tensor.
``Partial(op)``: every rank holds a tensor of the full shape; the value is the
reduction (``op``) of them over the axis.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..runtime.errors import InvalidArgumentError

__all__ = ["Placement", "Shard", "Replicate", "Partial", "ReduceType"]

#: reduce ops a Partial placement may carry: those the collectives reduce with, and any / all
#: (of 0 / 1 values: reduced as max / min)
PARTIAL_OPS = ("sum", "avg", "max", "min", "prod", "any", "all")


class ReduceType(enum.Enum):
    """Paddle's names of the reductions a ``Partial`` may carry (``Partial(ReduceType.kRedMax)``);
    each value is the op's name (``Partial("max")`` is the same placement)."""
    kRedSum = "sum"      # noqa: N815  (Paddle's spelling)
    kRedAvg = "avg"      # noqa: N815
    kRedMax = "max"      # noqa: N815
    kRedMin = "min"      # noqa: N815
    kRedProd = "prod"    # noqa: N815
    kRedAny = "any"      # noqa: N815
    kRedAll = "all"      # noqa: N815


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

    def get_dim(self) -> int:
        """The tensor dimension this placement splits (Paddle's accessor)."""
        return self.dim

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """The whole tensor on every rank of the mesh axis."""

    def is_replicated(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True, init=False)
class Partial(Placement):
    """Full-shape tensors on every rank whose reduction (``op``) over the axis is the value.
    ``Partial("max")``, ``Partial(reduce_type=ReduceType.kRedMax)`` and ``Partial(op="max")`` are
    the same placement."""
    op: str

    def __init__(self, reduce_type: Any = "sum", *, op: str | None = None) -> None:
        name = op if op is not None else reduce_type.value if isinstance(reduce_type, ReduceType) else reduce_type
        if name not in PARTIAL_OPS:
            raise InvalidArgumentError(f"Partial: reduce op {name!r} is not supported; use one of "
                                       f"{', '.join(PARTIAL_OPS)} (or a ReduceType)")
        object.__setattr__(self, "op", name)

    @property
    def reduce_type(self) -> ReduceType:
        return ReduceType(self.op)

    def is_partial(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Partial(op={self.op!r})"
