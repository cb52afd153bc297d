"""ProcessMesh: an n-dimensional array of ranks, one communicator per mesh axis."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import collectives
from ..collectives import Communicator
from ..runtime.errors import InvalidArgumentError

__all__ = ["ProcessMesh", "world", "set_mesh", "get_mesh"]

_world: Communicator | None = None
_mesh: ProcessMesh | None = None


def set_mesh(mesh: ProcessMesh) -> None:
    """Remember ``mesh`` as the job's mesh (Paddle's ``dist.set_mesh``); ``get_mesh()`` returns it."""
    global _mesh
    if not isinstance(mesh, ProcessMesh):
        raise InvalidArgumentError(f"set_mesh: expected a ProcessMesh, got {type(mesh).__name__}")
    _mesh = mesh


def get_mesh() -> ProcessMesh | None:
    """The mesh given to ``set_mesh`` (None before)."""
    return _mesh


def world() -> Communicator:
    """The job's world communicator, made on first use with ``collectives.init()`` (collective)."""
    global _world
    if _world is None:
        _world = collectives.init()
    return _world


class ProcessMesh:
    """Ranks of the job arranged as an n-dimensional array, as Paddle's ``ProcessMesh``::

        mesh = ProcessMesh([[0, 1], [2, 3]], dim_names=["x", "y"])

    Axis ``a`` of the mesh gets a communicator of the ranks that differ only in their
    coordinate on ``a`` (made with ``Communicator.split``; its rank is the coordinate).
    Building a mesh of more than one rank is collective: every rank of ``comm`` (default:
    :func:`world`) builds the same meshes in the same order, members or not. A mesh of one
    rank communicates with no one and needs no communicator.
    """

    def __init__(self, mesh: Any, dim_names: Sequence[str] | None = None, *,
                 comm: Communicator | None = None) -> None:
        arr = _rank_array(mesh)
        if dim_names is None:
            dim_names = [f"d{i}" for i in range(arr.ndim)]
        dim_names = list(dim_names)
        if len(dim_names) != arr.ndim or not all(isinstance(n, str) for n in dim_names):
            raise InvalidArgumentError(f"ProcessMesh: dim_names must be {arr.ndim} strings, one per mesh "
                                       f"dimension of shape {list(arr.shape)}; got {dim_names!r}")
        if len(set(dim_names)) != len(dim_names):
            raise InvalidArgumentError(f"ProcessMesh: dim_names must be distinct, got {dim_names!r}")
        self._ranks = arr
        self.shape: tuple[int, ...] = tuple(int(s) for s in arr.shape)
        self.ndim: int = arr.ndim
        self.dim_names: list[str] = dim_names
        self.process_ids: list[int] = [int(r) for r in arr.reshape(-1)]
        comm = comm if comm is not None else world()
        if max(self.process_ids) >= comm.size:
            raise InvalidArgumentError(f"ProcessMesh: rank {max(self.process_ids)} is not in the job, whose "
                                       f"ranks are 0..{comm.size - 1}")
        self.comm = comm
        self.rank: int = comm.rank
        self.device = comm.device
        where = np.argwhere(arr == comm.rank)
        self.coordinate: tuple[int, ...] | None = tuple(int(c) for c in where[0]) if len(where) else None
        self._axis_comms: list[Communicator | None] = [self._split(a) for a in range(self.ndim)] \
            if arr.size > 1 else [None] * self.ndim

    def _split(self, axis: int) -> Communicator | None:
        """Every rank of comm calls split once per axis; members color by their other coordinates."""
        if self.coordinate is None:
            self.comm.split(None)
            return None
        rest = [c for i, c in enumerate(self.coordinate) if i != axis]
        rest_shape = [s for i, s in enumerate(self.shape) if i != axis]
        color = int(np.ravel_multi_index(rest, rest_shape)) if rest else 0
        sub = self.comm.split(color, key=self.coordinate[axis])
        return sub

    # -- queries --------------------------------------------------------------------
    def axis(self, dim: int | str) -> int:
        """The index of a mesh dimension given by name or index."""
        if isinstance(dim, str):
            if dim not in self.dim_names:
                raise InvalidArgumentError(f"ProcessMesh: no dimension named {dim!r}; the mesh has "
                                           f"{self.dim_names}")
            return self.dim_names.index(dim)
        if type(dim) is not int or not -self.ndim <= dim < self.ndim:
            raise InvalidArgumentError(f"ProcessMesh: dimension {dim!r} is out of range for a "
                                       f"{self.ndim}-d mesh")
        return dim % self.ndim

    def get_dim_size(self, dim: int | str) -> int:
        return self.shape[self.axis(dim)]

    def axis_comm(self, dim: int | str) -> Communicator | None:
        """This rank's communicator along a mesh dimension (None off the mesh or for a 1-rank mesh)."""
        return self._axis_comms[self.axis(dim)]

    @property
    def size(self) -> int:
        return len(self.process_ids)

    def __contains__(self, rank: int) -> bool:
        return rank in self.process_ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessMesh) and self.shape == other.shape and \
            self.process_ids == other.process_ids and self.dim_names == other.dim_names

    def __hash__(self) -> int:
        return hash((self.shape, tuple(self.process_ids), tuple(self.dim_names)))

    def __repr__(self) -> str:
        return f"ProcessMesh(shape={list(self.shape)}, process_ids={self.process_ids}, dim_names={self.dim_names})"


def _rank_array(mesh: Any) -> np.ndarray:
    try:
        arr = np.asarray(mesh)
    except ValueError:
        arr = None
    if arr is None or arr.dtype == object or arr.ndim == 0 or arr.size == 0 or \
            not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(f"ProcessMesh: mesh must be a non-empty (nested) list of int ranks with "
                                   f"a rectangular shape, got {mesh!r}")
    if (arr < 0).any() or len(np.unique(arr)) != arr.size:
        raise InvalidArgumentError(f"ProcessMesh: ranks must be distinct and >= 0, got {arr.tolist()}")
    return arr.astype(np.int64)
