"""DistTensor: a global tensor laid out over a ProcessMesh, with placement propagation
and a minimal reverse-mode autograd whose gradient communication follows placements."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError, UnsupportedError
from ..tensor import Tensor
from ..tensor import full as _full
from ..tensor import zeros as _zeros
from . import _reshard
from ._local import apply, host, upload
from ._local import matmul as _lmatmul
from ._plan import plan
from ._sharding import local_box, normalize
from .mesh import ProcessMesh
from .placement import Partial, Placement, Replicate, Shard

__all__ = ["Parameter", "DistTensor", "shard_tensor", "reshard", "dtensor_from_local", "no_grad"]

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
        """Reverse-mode gradients of this tensor (a scalar unless ``grad`` is given) into the
        ``.grad`` of every leaf that requires one, resharded to the leaf's placements."""
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
                        g = reshard(g, t.mesh, t.placements)
                        t.grad = g if t.grad is None else t.grad + g
                    continue
                parents, fn = t._ctx
                for p, pg in zip(parents, fn(g), strict=True):
                    if pg is None or not (p.requires_grad or p._ctx is not None):
                        continue
                    grads[id(p)] = pg if id(p) not in grads else grads[id(p)] + pg

    def detach(self) -> DistTensor:
        return DistTensor(self._local, self.shape, self.mesh, self.placements)

    # -- operators -------------------------------------------------------------------
    def __matmul__(self, other: DistTensor) -> DistTensor:
        return matmul(self, other)

    def __add__(self, other: Any) -> DistTensor:
        return _binary("add", self, other)

    def __radd__(self, other: Any) -> DistTensor:
        return _binary("add", other, self)

    def __sub__(self, other: Any) -> DistTensor:
        return _binary("sub", self, other)

    def __rsub__(self, other: Any) -> DistTensor:
        return _binary("sub", other, self)

    def __mul__(self, other: Any) -> DistTensor:
        return _binary("mul", self, other)

    def __rmul__(self, other: Any) -> DistTensor:
        return _binary("mul", other, self)

    def relu(self) -> DistTensor:
        return relu(self)

    def mean(self) -> DistTensor:
        return mean(self)

    def sum(self, axis: int) -> DistTensor:
        return sum_axis(self, axis)

    def transpose(self) -> DistTensor:
        return transpose(self)

    @property
    def T(self) -> DistTensor:       # noqa: N802  (the NumPy name)
        return transpose(self)


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


def shard_tensor(data: Any, mesh: ProcessMesh, placements: Sequence[Placement], *, dtype: Any = None,
                 requires_grad: bool = False) -> DistTensor:
    """A DistTensor of the global ``data`` (the same array on every rank): this rank keeps
    its block. ``Partial(op)``: the rank at coordinate 0 of that axis keeps the value and
    the others hold zeros (sum) or the value too (avg, max, min)."""
    coord = _check_member(mesh, "shard_tensor")
    if isinstance(data, DistTensor):
        raise InvalidArgumentError("shard_tensor: data is already a DistTensor; use reshard to move it")
    if isinstance(data, Parameter):
        requires_grad = True
    arr = np.asarray(data.numpy() if hasattr(data, "numpy") else data, dtype=dtype)
    if arr.dtype == object:
        raise InvalidArgumentError("shard_tensor: data must be a numeric array-like")
    pl = normalize(placements, arr.ndim, mesh.ndim, "shard_tensor")
    off, size = local_box(arr.shape, pl, mesh.shape, coord)
    block = arr[tuple(slice(o, o + s) for o, s in zip(off, size, strict=True))]
    if any(isinstance(p, Partial) and p.op == "sum" and coord[a] != 0 for a, p in enumerate(pl)):
        block = np.zeros_like(block)
    return DistTensor(upload(block, mesh.device), arr.shape, mesh, pl, requires_grad=requires_grad)


def dtensor_from_local(local: Any, mesh: ProcessMesh, placements: Sequence[Placement],
                       shape: Sequence[int]) -> DistTensor:
    """A DistTensor of global ``shape`` whose block on this rank is ``local`` (no communication)."""
    coord = _check_member(mesh, "dtensor_from_local")
    arr = np.asarray(local.numpy() if isinstance(local, Tensor) else local)
    pl = normalize(placements, len(shape), mesh.ndim, "dtensor_from_local")
    want = tuple(local_box(shape, pl, mesh.shape, coord)[1])
    if arr.shape != want:
        raise InvalidArgumentError(f"dtensor_from_local: rank {mesh.rank}'s block of a {list(shape)} tensor "
                                   f"placed {list(pl)} is {list(want)}, got {list(arr.shape)}")
    return DistTensor(upload(arr, mesh.device), shape, mesh, pl)


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


# -- ops ---------------------------------------------------------------------------------------

def _as_dist(x: Any, like: DistTensor) -> DistTensor:
    if isinstance(x, DistTensor):
        if x.mesh != like.mesh:
            raise UnsupportedError(f"operands on different meshes: {x.mesh} and {like.mesh}")
        return x
    arr = np.asarray(x, dtype=like._npdtype)
    return shard_tensor(arr, like.mesh, [Replicate()] * like.mesh.ndim)


def _reduce_partial(x: DistTensor, axes: Sequence[int]) -> DistTensor:
    pl = list(x.placements)
    for a in axes:
        pl[a] = Replicate()
    return reshard(x, x.mesh, pl)


def matmul(a: DistTensor, b: DistTensor) -> DistTensor:
    """2-D ``a @ b`` with placement propagation, per mesh axis:
    (Shard(0), R) -> Shard(0); (R, Shard(1)) -> Shard(1) (column parallel);
    (Shard(1), Shard(0)) -> Partial(sum) (row parallel); (Partial, R) / (R, Partial) -> Partial.
    Other pairs are first resharded to the nearest of these (a local slice where one suffices)."""
    return _matmul(a, _as_dist(b, a), False, False)


def _swap(pl: Sequence[Placement], flip: bool) -> list[Placement]:
    """Placements of a 2-D tensor seen transposed (when ``flip``)."""
    return [Shard(1 - p.dim) if flip and isinstance(p, Shard) else p for p in pl]


def _matmul(a: DistTensor, b: DistTensor, ta: bool, tb: bool) -> DistTensor:
    """``op(a) @ op(b)``, op = transpose where ``ta`` / ``tb``, without materialising a transpose."""
    if a.ndim != 2 or b.ndim != 2:
        raise UnsupportedError(f"matmul: 2-D operands only, got {list(a.shape)} @ {list(b.shape)}")
    sa, sb = a.shape[::-1] if ta else a.shape, b.shape[::-1] if tb else b.shape
    if sa[1] != sb[0]:
        raise InvalidArgumentError(f"matmul: shapes {list(sa)} and {list(sb)} do not fit ({sa[1]} != {sb[0]})")
    pa, pb, out = [], [], []
    for x, y in zip(_swap(a.placements, ta), _swap(b.placements, tb), strict=True):
        nx, ny, o = _matmul_axis(x, y)
        pa.append(nx)
        pb.append(ny)
        out.append(o)
    a2, b2 = reshard(a, a.mesh, _swap(pa, ta)), reshard(b, b.mesh, _swap(pb, tb))
    la, lb = a2._local, b2._local
    res = a._wrap(_lmatmul(la.T if ta else la, lb.T if tb else lb), (sa[0], sb[1]), out)

    def back(g: DistTensor) -> list[DistTensor | None]:
        # d(op(a)) = g @ op(b).T, d(op(b)) = op(a).T @ g; transposed back where op transposed
        ga = (_matmul(b2, g, tb, True) if ta else _matmul(g, b2, False, not tb)) if _needs(a) else None
        gb = (_matmul(g, a2, True, ta) if tb else _matmul(a2, g, not ta, False)) if _needs(b) else None
        return [ga, gb]
    return _record(res, [a2, b2], back)


def _needs(t: DistTensor) -> bool:
    return t.requires_grad or t._ctx is not None


def _matmul_axis(x: Placement, y: Placement) -> tuple[Placement, Placement, Placement]:
    r = Replicate()
    if isinstance(x, Partial) and (x.op != "sum" or not isinstance(y, Replicate)):
        x = r
    if isinstance(y, Partial) and (y.op != "sum" or not isinstance(x, Replicate)):
        y = r
    table: dict[tuple, tuple[Placement, Placement, Placement]] = {
        (r, r): (r, r, r),
        (Shard(0), r): (Shard(0), r, Shard(0)),
        (r, Shard(1)): (r, Shard(1), Shard(1)),
        (Shard(1), Shard(0)): (Shard(1), Shard(0), Partial()),
        (Shard(1), r): (Shard(1), Shard(0), Partial()),        # slice b's rows locally
        (r, Shard(0)): (Shard(1), Shard(0), Partial()),        # slice a's columns locally
        (Shard(0), Shard(0)): (Shard(0), r, Shard(0)),         # gather b
        (Shard(0), Shard(1)): (Shard(0), r, Shard(0)),
        (Shard(1), Shard(1)): (r, Shard(1), Shard(1)),         # gather a
    }
    if isinstance(x, Partial):
        return (x, y, Partial())
    if isinstance(y, Partial):
        return (x, y, Partial())
    return table[(x, y)]


def transpose(x: DistTensor) -> DistTensor:
    """2-D transpose: Shard(0) and Shard(1) swap."""
    if x.ndim != 2:
        raise UnsupportedError(f"transpose: 2-D tensors only, got {list(x.shape)}")
    pl = [Shard(1 - p.dim) if isinstance(p, Shard) else p for p in x.placements]
    lshape = x._local.shape[::-1]
    out = x._wrap(apply(lambda t: t.T.contiguous(), lshape, x._local), (x.shape[1], x.shape[0]), pl)
    return _record(out, [x], lambda g: [transpose(g)])


_LINEAR_IN_PARTIAL = {"add": "both", "sub": "both", "mul": "one", "relu_grad": "second"}


def _binary(op: str, a: Any, b: Any) -> DistTensor:
    """Elementwise ``op`` with NumPy broadcasting; operands are resharded to one placement per
    mesh axis first (a Replicate operand is sliced locally to match a Shard one; Partial(sum)
    stays where the op is linear in it, else it is reduced)."""
    like = a if isinstance(a, DistTensor) else b
    a, b = _as_dist(a, like), _as_dist(b, like)
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise InvalidArgumentError(f"{op}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
    pa, pb, out = list(a.placements), list(b.placements), []
    for ax in range(a.mesh.ndim):
        na, nb, o = _binary_axis(op, pa[ax], pb[ax], a, b, shape)
        pa[ax], pb[ax] = na, nb
        out.append(o)
    a2, b2 = reshard(a, a.mesh, pa), reshard(b, b.mesh, pb)
    fns: dict[str, Callable[[Any, Any], Any]] = {
        "add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q,
        "relu_grad": lambda m, g: g * (m > 0).cast(g.dtype)}
    local = np.broadcast_shapes(a2._local.shape, b2._local.shape)
    res = a._wrap(apply(fns[op], local, a2._local, b2._local), shape, out)

    def back(g: DistTensor) -> list[DistTensor | None]:
        if op == "add":
            return [_unbroadcast(g, a2.shape), _unbroadcast(g, b2.shape)]
        if op == "sub":
            return [_unbroadcast(g, a2.shape), _unbroadcast(g * -1.0, b2.shape)]
        if op == "mul":
            return [_unbroadcast(g * b2.detach(), a2.shape), _unbroadcast(g * a2.detach(), b2.shape)]
        return [None, _binary("relu_grad", a2.detach(), g)]
    return _record(res, [a2, b2], back)


def _operand_dim(t: DistTensor, out_dim: int, shape: Sequence[int]) -> int | None:
    """The dimension of ``t`` that output dimension ``out_dim`` reads, None when broadcast."""
    d = out_dim - (len(shape) - t.ndim)
    if d < 0 or (t.shape[d] == 1 and shape[out_dim] != 1):
        return None
    return d


def _binary_axis(op: str, x: Placement, y: Placement, a: DistTensor, b: DistTensor,
                 shape: Sequence[int]) -> tuple[Placement, Placement, Placement]:
    r = Replicate()
    off_a, off_b = len(shape) - a.ndim, len(shape) - b.ndim
    # a Shard of a broadcast dimension cannot be kept: gather it
    if isinstance(x, Shard) and _operand_dim(a, x.dim + off_a, shape) is None:
        x = r
    if isinstance(y, Shard) and _operand_dim(b, y.dim + off_b, shape) is None:
        y = r
    px, py = isinstance(x, Partial) and x.op == "sum", isinstance(y, Partial) and y.op == "sum"
    linear = _LINEAR_IN_PARTIAL[op]
    if px and py and linear == "both":
        return x, y, Partial()
    if (px and isinstance(y, Replicate) and linear in ("one",)) or \
            (py and isinstance(x, Replicate) and linear in ("one", "second")):
        return x, y, Partial()
    if isinstance(x, Partial):
        x = r
    if isinstance(y, Partial):
        y = r
    if isinstance(x, Shard):
        out_dim = x.dim + off_a
    elif isinstance(y, Shard):
        out_dim = y.dim + off_b
    else:
        return r, r, r
    da, db = _operand_dim(a, out_dim, shape), _operand_dim(b, out_dim, shape)
    nx = Shard(da) if da is not None else r
    ny = Shard(db) if db is not None else r
    return nx, ny, Shard(out_dim)


def _unbroadcast(g: DistTensor, shape: Sequence[int]) -> DistTensor:
    """Sum a gradient over the dimensions its operand was broadcast along."""
    while g.ndim > len(shape):
        g = sum_axis(g, 0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            raise UnsupportedError("elementwise ops: the gradient of an operand broadcast along a size-1 "
                                   "dimension is not supported; broadcast along leading dimensions")
    return g


def relu(x: DistTensor) -> DistTensor:
    x = _reduce_partial(x, [a for a, p in enumerate(x.placements) if isinstance(p, Partial)])
    out = x._wrap(apply(lambda t: t.relu(), x._local.shape, x._local), x.shape, x.placements)
    return _record(out, [x], lambda g: [_binary("relu_grad", x.detach(), g)])


def sum_axis(x: DistTensor, axis: int) -> DistTensor:
    """Sum over one dimension; a dimension sharded on a mesh axis becomes Partial(sum) there."""
    if not -x.ndim <= axis < x.ndim:
        raise InvalidArgumentError(f"sum: axis {axis} is out of range for a {x.ndim}-d tensor")
    axis %= x.ndim
    x = _reduce_partial(x, [a for a, p in enumerate(x.placements) if isinstance(p, Partial) and p.op != "sum"])
    pl: list[Placement] = []
    for p in x.placements:
        if isinstance(p, Shard) and p.dim == axis:
            pl.append(Partial())
        elif isinstance(p, Shard) and p.dim > axis:
            pl.append(Shard(p.dim - 1))
        else:
            pl.append(p)
    shape = x.shape[:axis] + x.shape[axis + 1:]
    lshape = x._local.shape[:axis] + x._local.shape[axis + 1:]
    out = x._wrap(apply(lambda t: t.sum(axis=axis), lshape, x._local), shape, pl)

    def back(g: DistTensor) -> list[DistTensor]:
        # the summed dimension comes back whole on the axes that sharded it
        g = _reduce_partial(g, [a for a, p in enumerate(x.placements)
                                if p == Shard(axis) and isinstance(g.placements[a], Partial)])
        want = [p if isinstance(p, Shard) else g.placements[a] for a, p in enumerate(x.placements)]
        lg: Any = g._local
        full = _zeros(x._local.shape, dtype=lg.dtype, device=lg.device) + \
            lg.reshape(*lg.shape[:axis], 1, *lg.shape[axis:])
        return [g._wrap(full, x.shape, want)]
    return _record(out, [x], back)


def mean(x: DistTensor) -> DistTensor:
    """Mean of every element: a scalar, Partial(sum) on the mesh axes that shard ``x``."""
    x = _reduce_partial(x, [a for a, p in enumerate(x.placements) if isinstance(p, Partial) and p.op != "sum"])
    n = math.prod(x.shape)
    pl = [Partial() if isinstance(p, Shard) else p for p in x.placements]
    out = x._wrap(apply(lambda t: t.sum() * (1.0 / n), (), x._local), (), pl)

    def back(g: DistTensor) -> list[DistTensor]:
        # Shard axes need the whole scalar; Replicate / Partial axes take it as it is
        g = _reduce_partial(g, [a for a, p in enumerate(x.placements)
                                if isinstance(p, Shard) and isinstance(g.placements[a], Partial)])
        want = [p if isinstance(p, Shard) else g.placements[a] for a, p in enumerate(x.placements)]
        box = x._local.shape
        value = g._np().item() / n          # this rank's part: g may still be Partial on some axes
        return [g._wrap(_full(box, value, dtype=x.dtype, device=x.mesh.device), x.shape, want)]
    return _record(out, [x], back)
