"""DistTensor: a global tensor laid out over a ProcessMesh, reshard, and a reverse-mode
autograd whose gradient communication follows placements.

The ops (matmul, elementwise, reductions, softmax, ...) live in ``_ops.py``, which imports
this module; DistTensor's operator methods reach them through ``install`` (the package
calls it once when it loads), as the tensor layer's Tensor does with its ops.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError, UnsupportedError
from ..tensor import Tensor
from . import _reshard
from ._local import host, upload
from ._plan import plan
from ._sharding import local_box, normalize
from .mesh import ProcessMesh
from .placement import Partial, Placement, Replicate, Shard

__all__ = ["Parameter", "DistTensor", "shard_tensor", "reshard", "dtensor_from_local", "dtensor_to_local",
           "dtensor_from_fn", "unshard_dtensor", "no_grad"]

_ops: Any = None


def install(ops: Any) -> None:
    """Give DistTensor's operator methods the ops module (the package does, once)."""
    global _ops
    _ops = ops

_grad_enabled = True


class no_grad:
    """Context manager: operations inside record no autograd graph."""

    def __enter__(self) -> None:
        global _grad_enabled
        self._prev, _grad_enabled = _grad_enabled, False

    def __exit__(self, *exc: Any) -> None:
        global _grad_enabled
        _grad_enabled = self._prev


class Parameter:
    """A parameter before it is placed on a mesh: host data. ``shard_tensor`` of it (or
    ``shard_layer``) gives a DistTensor that requires a gradient."""

    def __init__(self, data: Any) -> None:
        self.data = np.array(data)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def stop_gradient(self) -> bool:
        """False: a parameter is trained (Paddle's flag)."""
        return False

    def numpy(self) -> np.ndarray:
        return self.data


class DistTensor:
    """A tensor of shape ``shape`` over ``mesh``; this rank holds ``local_tensor()``, the
    block its ``placements`` (one per mesh axis) give it."""

    def __init__(self, local: Tensor, shape: Sequence[int], mesh: ProcessMesh, placements: Sequence[Placement],
                 *, requires_grad: bool = False) -> None:
        self._local = local
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        self.mesh = mesh
        self.placements: tuple[Placement, ...] = tuple(placements)
        self.requires_grad = requires_grad
        self.grad: DistTensor | None = None
        self._ctx: tuple[tuple[DistTensor, ...], Callable] | None = None

    # -- data --------------------------------------------------------------------
    @property
    def dtype(self) -> Any:
        """The element type (an ``anychip.tensor.DType``)."""
        return self._local.dtype

    @property
    def _npdtype(self) -> np.dtype:
        return np.dtype(self._local.dtype.numpy)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def process_mesh(self) -> ProcessMesh:
        """The mesh (Paddle's name; ``mesh`` is the same)."""
        return self.mesh

    @property
    def stop_gradient(self) -> bool:
        """Paddle's flag: the opposite of ``requires_grad``."""
        return not self.requires_grad

    @stop_gradient.setter
    def stop_gradient(self, value: bool) -> None:
        self.requires_grad = not value

    def is_dist(self) -> bool:
        return True

    def local_tensor(self) -> Tensor:
        """This rank's block (device memory)."""
        return self._local

    def _np(self) -> np.ndarray:
        return host(self._local)

    def numpy(self) -> np.ndarray:
        """The whole tensor on every rank (collective: gathers and reduces as needed)."""
        return reshard(self, self.mesh, [Replicate()] * self.mesh.ndim)._np()

    def item(self) -> float:
        return self.numpy().item()

    def _new(self, arr: np.ndarray, shape: Sequence[int], placements: Sequence[Placement]) -> DistTensor:
        return DistTensor(upload(arr, self.mesh.device), shape, self.mesh, placements)

    def _wrap(self, local: Tensor, shape: Sequence[int], placements: Sequence[Placement]) -> DistTensor:
        return DistTensor(local, shape, self.mesh, placements)

    def __repr__(self) -> str:
        return (f"DistTensor(shape={list(self.shape)}, dtype={self.dtype}, placements={list(self.placements)}, "
                f"mesh={self.mesh}, local={list(self._local.shape)})")

    # -- autograd ------------------------------------------------------------------
    def backward(self, grad: DistTensor | None = None) -> None:
        """Reverse-mode gradients of this tensor (a scalar unless ``grad`` is given), added to the
        ``.grad`` of every leaf that requires one. A gradient keeps its Partial(sum) axes (data
        parallelism's gradients stay unreduced until the optimizer reshards them, once per step
        however many backward passes were accumulated); its other axes are resharded to the
        leaf's placements."""
        if grad is None:
            if self.shape != ():
                raise InvalidArgumentError(f"backward: {list(self.shape)}-shaped tensor; call it on a scalar "
                                           "(e.g. a loss) or pass grad=")
            ones = np.ones((), self._npdtype)
            grad = self._new(ones, (), [Replicate()] * self.mesh.ndim)
        order = _topological(self)
        grads: dict[int, DistTensor] = {id(self): grad}
        with no_grad():
            for t in order:
                g = grads.pop(id(t), None)
                if g is None:
                    continue
                if t._ctx is None:
                    if t.requires_grad:
                        g = reshard(g, t.mesh, leaf_grad_placements(g, t.placements))
                        t.grad = g if t.grad is None else t.grad + g
                    continue
                parents, fn = t._ctx
                for p, pg in zip(parents, fn(g), strict=True):
                    if pg is None or not (p.requires_grad or p._ctx is not None):
                        continue
                    grads[id(p)] = pg if id(p) not in grads else grads[id(p)] + pg

    def detach(self) -> DistTensor:
        return DistTensor(self._local, self.shape, self.mesh, self.placements)

    # -- operators (see _ops) ---------------------------------------------------------
    __array_ufunc__ = None          # NumPy defers: ``array @ dt`` and ``array + dt`` reach __rmatmul__ / __radd__

    def __matmul__(self, other: Any) -> DistTensor:
        return _ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> DistTensor:
        return _ops.matmul(other, self)

    def matmul(self, other: Any, transpose_x: bool = False, transpose_y: bool = False) -> DistTensor:
        return _ops.matmul(self, other, transpose_x, transpose_y)

    def __add__(self, other: Any) -> DistTensor:
        return _ops.binary("add", self, other)

    def __radd__(self, other: Any) -> DistTensor:
        return _ops.binary("add", other, self)

    def __sub__(self, other: Any) -> DistTensor:
        return _ops.binary("sub", self, other)

    def __rsub__(self, other: Any) -> DistTensor:
        return _ops.binary("sub", other, self)

    def __mul__(self, other: Any) -> DistTensor:
        return _ops.binary("mul", self, other)

    def __rmul__(self, other: Any) -> DistTensor:
        return _ops.binary("mul", other, self)

    def __truediv__(self, other: Any) -> DistTensor:
        return _ops.binary("div", self, other)

    def __rtruediv__(self, other: Any) -> DistTensor:
        return _ops.binary("div", other, self)

    def __neg__(self) -> DistTensor:
        return _ops.neg(self)

    def __pow__(self, exponent: Any) -> DistTensor:
        return _ops.pow(self, exponent)

    def relu(self) -> DistTensor:
        return _ops.relu(self)

    def exp(self) -> DistTensor:
        return _ops.exp(self)

    def tanh(self) -> DistTensor:
        return _ops.tanh(self)

    def sum(self, axis: int | None = None, keepdim: bool = False) -> DistTensor:
        return _ops.sum(self, axis, keepdim)

    def mean(self, axis: int | None = None, keepdim: bool = False) -> DistTensor:
        return _ops.mean(self, axis, keepdim)

    def reshape(self, *shape: Any) -> DistTensor:
        return _ops.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape)

    def transpose(self, perm: Sequence[int] | None = None) -> DistTensor:
        return _ops.transpose(self, perm)

    @property
    def T(self) -> DistTensor:       # noqa: N802  (the NumPy name)
        return _ops.transpose(self)


def _topological(root: DistTensor) -> list[DistTensor]:
    order: list[DistTensor] = []
    seen: set[int] = set()
    stack: list[tuple[DistTensor, bool]] = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t._ctx is not None:
            stack.extend((p, False) for p in t._ctx[0])
    return order[::-1]


def _record(out: DistTensor, parents: Sequence[DistTensor], fn: Callable) -> DistTensor:
    if _grad_enabled and any(p.requires_grad or p._ctx is not None for p in parents):
        out._ctx = (tuple(parents), fn)
    return out


# -- construction and reshard ---------------------------------------------------------------

def _check_member(mesh: ProcessMesh, what: str) -> tuple[int, ...]:
    if not isinstance(mesh, ProcessMesh):
        raise InvalidArgumentError(f"{what}: mesh must be a ProcessMesh, got {type(mesh).__name__}")
    if mesh.coordinate is None:
        raise InvalidArgumentError(f"{what}: rank {mesh.rank} is not in {mesh}")
    return mesh.coordinate


def shard_tensor(data: Any, mesh: ProcessMesh, placements: Sequence[Placement], dtype: Any = None,
                 place: Any = None, stop_gradient: bool | None = None, *,
                 requires_grad: bool | None = None) -> DistTensor:
    """A DistTensor of the global ``data`` (the same array on every rank): this rank keeps
    its block. ``Partial(op)``: the rank at coordinate 0 of that axis keeps the value and
    the others hold the op's identity (sum: zeros, prod: ones) or the value too (avg, max,
    min, any, all). Paddle's signature: ``stop_gradient=False`` (or ``requires_grad=True``)
    makes a leaf that gets a gradient; a ``Parameter`` always does. ``place`` is accepted
    and must be None: the block lives on the mesh's device."""
    coord = _check_member(mesh, "shard_tensor")
    if isinstance(data, DistTensor):
        raise InvalidArgumentError("shard_tensor: data is already a DistTensor; use reshard to move it")
    if place is not None:
        raise InvalidArgumentError(f"shard_tensor: place={place!r}; the block lives on the mesh's device "
                                   f"({mesh.device}), pass place=None")
    if stop_gradient is not None and requires_grad is not None and stop_gradient == requires_grad:
        raise InvalidArgumentError(f"shard_tensor: stop_gradient={stop_gradient} contradicts "
                                   f"requires_grad={requires_grad}; give one of them")
    wants = bool(requires_grad) if requires_grad is not None else stop_gradient is False
    requires_grad = wants or isinstance(data, Parameter)
    arr = np.asarray(data.numpy() if hasattr(data, "numpy") else data, dtype=dtype)
    if arr.dtype == object:
        raise InvalidArgumentError("shard_tensor: data must be a numeric array-like")
    pl = normalize(placements, arr.ndim, mesh.ndim, "shard_tensor")
    off, size = local_box(arr.shape, pl, mesh.shape, coord)
    block = arr[tuple(slice(o, o + s) for o, s in zip(off, size, strict=True))]
    for a, p in enumerate(pl):
        if isinstance(p, Partial):
            block = _reshard.to_partial_block(block, p.op, coord[a] == 0)
    return DistTensor(upload(block, mesh.device), arr.shape, mesh, pl, requires_grad=requires_grad)


def dtensor_from_local(local: Any, mesh: ProcessMesh, placements: Sequence[Placement],
                       shape: Sequence[int] | None = None) -> DistTensor:
    """A DistTensor whose block on this rank is ``local`` (no communication). The global
    ``shape`` is, when not given, the block's with each sharded dimension times the ranks
    on the axes that shard it (Paddle's rule: even shards); give ``shape`` for uneven ones."""
    coord = _check_member(mesh, "dtensor_from_local")
    arr = np.asarray(local.numpy() if isinstance(local, Tensor) else local)
    pl = normalize(placements, arr.ndim, mesh.ndim, "dtensor_from_local")
    if shape is None:
        dims = list(arr.shape)
        for a, p in enumerate(pl):
            if isinstance(p, Shard):
                dims[p.dim] *= mesh.shape[a]
        shape = dims
    elif len(shape) != arr.ndim:
        raise InvalidArgumentError(f"dtensor_from_local: a {list(shape)} tensor has {len(shape)} dimensions, "
                                   f"the block {list(arr.shape)} has {arr.ndim}")
    want = tuple(local_box(shape, pl, mesh.shape, coord)[1])
    if arr.shape != want:
        raise InvalidArgumentError(f"dtensor_from_local: rank {mesh.rank}'s block of a {list(shape)} tensor "
                                   f"placed {list(pl)} is {list(want)}, got {list(arr.shape)}")
    return DistTensor(upload(arr, mesh.device), shape, mesh, pl)


def dtensor_from_fn(fn: Callable[..., Any], mesh: ProcessMesh, placements: Sequence[Placement], *args: Any,
                    **kwargs: Any) -> DistTensor:
    """``shard_tensor(fn(*args, **kwargs), mesh, placements)`` (Paddle's ``dist.dtensor_from_fn``,
    e.g. ``dtensor_from_fn(np.ones, mesh, [Shard(0)], (4, 2))``)."""
    return shard_tensor(fn(*args, **kwargs), mesh, placements)


def dtensor_to_local(dist_tensor: DistTensor, mesh: ProcessMesh | None = None,
                     placements: Sequence[Placement] | None = None) -> Tensor:
    """This rank's block (Paddle's name; the same as ``local_tensor()``). ``mesh`` and
    ``placements``, when given, must be the tensor's own."""
    if not isinstance(dist_tensor, DistTensor):
        raise InvalidArgumentError(f"dtensor_to_local: expected a DistTensor, got {type(dist_tensor).__name__}")
    if mesh is not None and mesh != dist_tensor.mesh or placements is not None and \
            normalize(placements, dist_tensor.ndim, dist_tensor.mesh.ndim, "dtensor_to_local") != \
            dist_tensor.placements:
        raise InvalidArgumentError(f"dtensor_to_local: the tensor is placed {list(dist_tensor.placements)} on "
                                   f"{dist_tensor.mesh}; reshard it first to take another block")
    return dist_tensor.local_tensor()


def unshard_dtensor(dist_tensor: DistTensor) -> Tensor:
    """The whole tensor as a dense ``anychip.tensor.Tensor`` on this rank's device (collective:
    gathers and reduces what the placements split)."""
    if not isinstance(dist_tensor, DistTensor):
        raise InvalidArgumentError(f"unshard_dtensor: expected a DistTensor, got {type(dist_tensor).__name__}")
    whole = reshard(dist_tensor, dist_tensor.mesh, [Replicate()] * dist_tensor.mesh.ndim)
    return whole.local_tensor()


def reshard(dt: DistTensor, mesh: ProcessMesh, placements: Sequence[Placement]) -> DistTensor:
    """``dt`` laid out as ``placements`` (collective over the mesh axes that change)."""
    if not isinstance(dt, DistTensor):
        raise InvalidArgumentError(f"reshard: expected a DistTensor, got {type(dt).__name__}")
    if mesh != dt.mesh:
        raise UnsupportedError(f"reshard: moving between meshes is not supported ({dt.mesh} -> {mesh}); "
                               "reshard within the tensor's mesh")
    _check_member(mesh, "reshard")
    pl = normalize(placements, dt.ndim, mesh.ndim, "reshard")
    if pl == dt.placements:
        return dt
    cur = list(dt.placements)
    steps = plan(cur, pl)
    if all(step.kind == "all_reduce" for step in steps):
        out = DistTensor(_reshard.all_reduce_in_place(steps, dt._local, mesh), dt.shape, mesh, pl)
    else:
        x = dt._np()
        for step in steps:
            x = _reshard.run_step(step, x, dt.shape, cur, mesh)
            cur[step.axis] = step.dst
        out = dt._new(x, dt.shape, pl)
    src = dt.placements
    return _record(out, [dt], lambda g: [_back_to(g, src)])


def leaf_grad_placements(g: DistTensor, placements: Sequence[Placement]) -> list[Placement]:
    """Where a leaf's gradient is kept: Partial(sum) axes as they come (reduced by the
    optimizer), every other axis as the leaf is placed."""
    return [gp if isinstance(gp, Partial) and gp.op == "sum" else p for p, gp in zip(placements, g.placements,
                                                                                    strict=True)]


def _back_to(g: DistTensor, src: Sequence[Placement]) -> DistTensor:
    """The gradient of a reshard's input: Shard axes as the input was; Replicate and Partial
    axes take the gradient as it comes (Replicate, or Partial(sum) left for later)."""
    want: list[Placement] = []
    for s, gp in zip(src, g.placements, strict=True):
        if isinstance(s, Shard):
            want.append(s)
        else:
            want.append(gp if isinstance(gp, (Replicate, Partial)) and getattr(gp, "op", "sum") == "sum"
                        else Replicate())
    return reshard(g, g.mesh, want)


