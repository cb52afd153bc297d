"""The DistTensor ops: each works out the operands' placements per mesh axis (its sharding
rule), reshards the operands to them (where a collective is derived), computes on the
blocks through the tensor layer, and records its gradient for ``backward``.

Rules in short (per mesh axis; docs/parallel.md has the tables):
- elementwise ops keep equal placements, slice a Replicate operand to meet a Shard one and
  keep Partial(sum) where the op is linear in it;
- pointwise functions (exp, tanh, gelu, ...) keep Shard / Replicate and reduce a Partial
  first (neg and scalar multiples keep it); softmax and layer_norm also gather the
  dimension they normalize over when it is sharded;
- matmul (batched, NumPy's broadcasting of batch dimensions): a sharded batch or row
  dimension stays sharded, a sharded output column dimension is column parallel, a sharded
  contraction dimension gives Partial(sum) (row parallel);
- sums turn a sharded summed dimension into Partial(sum); reshape and transpose move a Shard
  to the dimension that holds its chunks (gathering where a reshape would split them).
"""
from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError, UnsupportedError
from ..tensor import Tensor
from ..tensor import zeros as _zeros
from ._local import apply, host, upload
from ._local import matmul as _lmatmul
from ._sharding import local_box
from .dtensor import DistTensor, _record, reshard, shard_tensor
from .placement import Partial, Placement, Replicate, Shard

__all__ = ["matmul", "transpose", "reshape", "relu", "exp", "tanh", "gelu", "softmax", "layer_norm", "sum", "mean",
           "embedding", "cross_entropy"]

R = Replicate()


# -- helpers -----------------------------------------------------------------------------------

def _as_dist(x: Any, like: DistTensor) -> DistTensor:
    """A DistTensor on ``like``'s mesh: a dense array-like (or Tensor) is taken as replicated."""
    if isinstance(x, DistTensor):
        if x.mesh != like.mesh:
            raise UnsupportedError(f"operands on different meshes: {x.mesh} and {like.mesh}")
        return x
    try:
        arr = np.asarray(x.numpy() if isinstance(x, Tensor) else x, dtype=like._npdtype)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"cannot use {type(x).__name__} as an operand of a DistTensor op "
                                   "(give a DistTensor, an array-like or a number)") from None
    return shard_tensor(arr, like.mesh, [R] * like.mesh.ndim)


def _first_dist(*xs: Any) -> DistTensor:
    for x in xs:
        if isinstance(x, DistTensor):
            return x
    raise InvalidArgumentError("a DistTensor op needs at least one DistTensor operand")


def _replicate_axes(x: DistTensor, axes: Sequence[int]) -> DistTensor:
    """``x`` with the mesh ``axes`` made Replicate (all_reduce / all_gather where they are not)."""
    pl = list(x.placements)
    for a in axes:
        pl[a] = R
    return reshard(x, x.mesh, pl)


def _is_sum(p: Placement) -> bool:
    return isinstance(p, Partial) and p.op == "sum"


def _grad_like(g: DistTensor, placements: Sequence[Placement]) -> DistTensor:
    """``g`` resharded for an op whose output is placed ``placements``: Shard axes as the
    output; elsewhere a Replicate or Partial(sum) gradient is taken as it comes (the ops'
    gradients are linear in it)."""
    want = [p if isinstance(p, Shard) else (gp if isinstance(gp, Replicate) or _is_sum(gp) else R)
            for p, gp in zip(placements, g.placements, strict=True)]
    return reshard(g, g.mesh, want)


def _needs(t: DistTensor) -> bool:
    return t.requires_grad or t._ctx is not None


# -- elementwise (binary) ------------------------------------------------------------------------

#: where a Partial(sum) operand may stay: "both" operands (add, sub), "one" of them against a
#: Replicate (mul), only the "first" against a Replicate divisor (div)
_LINEAR_IN_PARTIAL = {"add": "both", "sub": "both", "mul": "one", "div": "first"}
_LOCAL: dict[str, Callable[[Any, Any], Any]] = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q,
                                                "mul": lambda p, q: p * q, "div": lambda p, q: p / q}


def binary(op: str, a: Any, b: Any) -> DistTensor:
    """Elementwise ``op`` (add, sub, mul, div) with NumPy broadcasting; operands are resharded
    to one placement per mesh axis first (a Replicate operand is sliced locally to match a
    Shard one; Partial(sum) stays where the op is linear in it, else it is reduced)."""
    like = _first_dist(a, b)
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
    local = np.broadcast_shapes(a2._local.shape, b2._local.shape)
    res = a._wrap(apply(_LOCAL[op], local, a2._local, b2._local), shape, out)

    def back(g: DistTensor) -> list[DistTensor | None]:
        if op == "add":
            return [_unbroadcast(g, a2.shape), _unbroadcast(g, b2.shape)]
        if op == "sub":
            return [_unbroadcast(g, a2.shape), _unbroadcast(neg(g), b2.shape)]
        if op == "mul":
            return [_unbroadcast(g * b2.detach(), a2.shape) if _needs(a2) else None,
                    _unbroadcast(g * a2.detach(), b2.shape) if _needs(b2) else None]
        ga = _unbroadcast(g / b2.detach(), a2.shape) if _needs(a2) else None
        gb = _unbroadcast(neg(g * a2.detach() / (b2.detach() * b2.detach())), b2.shape) if _needs(b2) else None
        return [ga, gb]
    return _record(res, [a2, b2], back)


def _operand_dim(t: DistTensor, out_dim: int, shape: Sequence[int]) -> int | None:
    """The dimension of ``t`` that output dimension ``out_dim`` reads, None when broadcast."""
    d = out_dim - (len(shape) - t.ndim)
    if d < 0 or (t.shape[d] == 1 and shape[out_dim] != 1):
        return None
    return d


def _binary_axis(op: str, x: Placement, y: Placement, a: DistTensor, b: DistTensor,
                 shape: Sequence[int]) -> tuple[Placement, Placement, Placement]:
    off_a, off_b = len(shape) - a.ndim, len(shape) - b.ndim
    # a Shard of a broadcast dimension cannot be kept: gather it
    if isinstance(x, Shard) and _operand_dim(a, x.dim + off_a, shape) is None:
        x = R
    if isinstance(y, Shard) and _operand_dim(b, y.dim + off_b, shape) is None:
        y = R
    px, py = _is_sum(x), _is_sum(y)
    linear = _LINEAR_IN_PARTIAL[op]
    if px and py and linear == "both":
        return x, y, Partial()
    if (px and isinstance(y, Replicate) and linear in ("one", "first")) or \
            (py and isinstance(x, Replicate) and linear == "one"):
        return x, y, Partial()
    if isinstance(x, Partial):
        x = R
    if isinstance(y, Partial):
        y = R
    if isinstance(x, Shard):
        out_dim = x.dim + off_a
    elif isinstance(y, Shard):
        out_dim = y.dim + off_b
    else:
        return R, R, R
    da, db = _operand_dim(a, out_dim, shape), _operand_dim(b, out_dim, shape)
    return (Shard(da) if da is not None else R), (Shard(db) if db is not None else R), Shard(out_dim)


def _unbroadcast(g: DistTensor, shape: Sequence[int]) -> DistTensor:
    """Sum a gradient over the dimensions its operand was broadcast along."""
    while g.ndim > len(shape):
        g = sum(g, 0)
    for d, n in enumerate(shape):
        if n == 1 and g.shape[d] != 1:
            g = sum(g, d, keepdim=True)
    return g


# -- pointwise functions ----------------------------------------------------------------------------

def _pointwise(x: DistTensor, fwd: Callable[[Any], Any], bwd: Callable[[Any, Any, Any], Any], *, linear: bool = False,
               whole: Sequence[int] = ()) -> DistTensor:
    """An op computed block by block with the placements kept: ``fwd(x)`` forward and
    ``bwd(x, y, g)`` (linear in ``g``) for the gradient. A Partial is reduced first unless the
    op is ``linear``; a mesh axis sharding one of the ``whole`` dimensions is gathered."""
    axes = [a for a, p in enumerate(x.placements)
            if (isinstance(p, Partial) and not (linear and p.op == "sum")) or (isinstance(p, Shard) and p.dim in whole)]
    x = _replicate_axes(x, axes)
    xl = x._local
    yl = apply(fwd, xl.shape, xl)
    out = x._wrap(yl, x.shape, x.placements)

    def back(g: DistTensor) -> list[DistTensor]:
        g = _grad_like(g, out.placements)
        return [g._wrap(apply(bwd, xl.shape, xl, yl, g._local), x.shape, g.placements)]
    return _record(out, [x], back)


def neg(x: DistTensor) -> DistTensor:
    return _pointwise(x, lambda t: -t, lambda t, y, g: -g, linear=True)


def pow(x: DistTensor, exponent: Any) -> DistTensor:   # noqa: A001  (``x ** p``; Paddle's paddle.pow)
    """``x ** exponent`` for a Python number ``exponent``."""
    if isinstance(exponent, (DistTensor, Tensor, np.ndarray)) or not isinstance(exponent, (int, float)):
        raise UnsupportedError(f"DistTensor ** {type(exponent).__name__}: the exponent must be a Python number")
    p = exponent
    return _pointwise(x, lambda t: t ** p, lambda t, y, g: g * (t ** (p - 1)) * p)


def relu(x: DistTensor) -> DistTensor:
    return _pointwise(x, lambda t: t.relu(), lambda t, y, g: g * (t > 0).cast(g.dtype))


def exp(x: DistTensor) -> DistTensor:
    return _pointwise(x, lambda t: t.exp(), lambda t, y, g: g * y)


def tanh(x: DistTensor) -> DistTensor:
    return _pointwise(x, lambda t: t.tanh(), lambda t, y, g: g * (1 - y * y))


_SQRT1_2 = 1 / math.sqrt(2)
_SQRT2_PI = math.sqrt(2 / math.pi)


def gelu(x: DistTensor, approximate: bool = False) -> DistTensor:
    """Paddle's ``F.gelu``: x * Phi(x) with the erf (default) or the tanh approximation."""
    if approximate:
        def fwd(t: Any) -> Any:
            return t * 0.5 * (1 + ((t + t * t * t * 0.044715) * _SQRT2_PI).tanh())

        def bwd(t: Any, y: Any, g: Any) -> Any:
            th = ((t + t * t * t * 0.044715) * _SQRT2_PI).tanh()
            return g * (0.5 * (1 + th) + t * 0.5 * (1 - th * th) * _SQRT2_PI * (1 + t * t * (3 * 0.044715)))
    else:
        def fwd(t: Any) -> Any:
            return t * 0.5 * (1 + (t * _SQRT1_2).erf())

        def bwd(t: Any, y: Any, g: Any) -> Any:
            return g * (0.5 * (1 + (t * _SQRT1_2).erf()) + t * (t * t * -0.5).exp() * (1 / math.sqrt(2 * math.pi)))
    return _pointwise(x, fwd, bwd)


def _axis(axis: int, ndim: int, what: str) -> int:
    if type(axis) is not int or not -ndim <= axis < ndim:
        raise InvalidArgumentError(f"{what}: axis {axis!r} is out of range for a {ndim}-d tensor")
    return axis % ndim


def softmax(x: DistTensor, axis: int = -1) -> DistTensor:
    """Softmax along ``axis`` (a mesh axis sharding it is gathered first)."""
    ax = _axis(axis, x.ndim, "softmax")

    def fwd(t: Any) -> Any:
        e = (t - t.max(axis=ax, keepdims=True)).exp()
        return e / e.sum(axis=ax, keepdims=True)

    def bwd(t: Any, y: Any, g: Any) -> Any:
        gy = g * y
        return gy - y * gy.sum(axis=ax, keepdims=True)
    return _pointwise(x, fwd, bwd, whole=(ax,))


def layer_norm(x: DistTensor, normalized_shape: Any, weight: Any = None, bias: Any = None,
               epsilon: float = 1e-05) -> DistTensor:
    """Paddle's ``F.layer_norm`` over the last dimension: (x - mean) / sqrt(var + epsilon),
    then ``* weight + bias`` (broadcast DistTensors of that dimension's size, or None)."""
    n = normalized_shape if isinstance(normalized_shape, int) else list(normalized_shape)
    if isinstance(n, list):
        if len(n) != 1:
            raise UnsupportedError(f"layer_norm: normalized_shape {n}: only the last dimension is normalized "
                                   "here; reshape to merge the dimensions first")
        n = n[0]
    if not x.ndim or x.shape[-1] != n:
        raise InvalidArgumentError(f"layer_norm: normalized_shape {normalized_shape!r} does not match the last "
                                   f"dimension of a {list(x.shape)} tensor")
    last = x.ndim - 1

    def norm(t: Any) -> tuple[Any, Any]:
        xc = t - t.mean(axis=last, keepdims=True)
        rstd = 1 / ((xc * xc).mean(axis=last, keepdims=True) + epsilon).sqrt()
        return xc * rstd, rstd

    def bwd(t: Any, y: Any, g: Any) -> Any:
        _, rstd = norm(t)
        return (g - g.mean(axis=last, keepdims=True) - y * (g * y).mean(axis=last, keepdims=True)) * rstd
    y = _pointwise(x, lambda t: norm(t)[0], bwd, whole=(last,))
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


# -- reductions ------------------------------------------------------------------------------------

def sum(x: DistTensor, axis: int | None = None, keepdim: bool = False) -> DistTensor:  # noqa: A001
    """Sum over ``axis`` (None: every element). A summed dimension that a mesh axis shards
    becomes Partial(sum) on that axis; a Partial(sum) input stays Partial."""
    x = _replicate_axes(x, [a for a, p in enumerate(x.placements) if isinstance(p, Partial) and p.op != "sum"])
    axes = list(range(x.ndim)) if axis is None else [_axis(axis, x.ndim, "sum")]
    pl: list[Placement] = []
    for p in x.placements:
        if isinstance(p, Shard) and p.dim in axes:
            pl.append(Partial())
        elif isinstance(p, Shard) and not keepdim:
            pl.append(Shard(p.dim - builtins.sum(1 for a in axes if a < p.dim)))
        else:
            pl.append(p)
    shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdim else \
        tuple(n for d, n in enumerate(x.shape) if d not in axes)
    xl = x._local
    lshape = tuple(1 if d in axes else n for d, n in enumerate(xl.shape)) if keepdim else \
        tuple(n for d, n in enumerate(xl.shape) if d not in axes)
    ax = None if axis is None else axes[0]
    out = x._wrap(apply(lambda t: t.sum(axis=ax, keepdims=keepdim), lshape, xl), shape, pl)

    def back(g: DistTensor) -> list[DistTensor]:
        # the summed dimensions come back whole on the axes that sharded them
        g = _replicate_axes(g, [a for a, p in enumerate(x.placements)
                                if isinstance(p, Shard) and p.dim in axes and isinstance(g.placements[a], Partial)])
        g = _grad_like(g, pl)
        want = [p if isinstance(p, Shard) else g.placements[a] for a, p in enumerate(x.placements)]
        lg: Any = g._local
        if not keepdim and ax is not None:
            lg = lg.reshape(*lg.shape[:ax], 1, *lg.shape[ax:])
        return [g._wrap(_zeros(xl.shape, dtype=lg.dtype, device=lg.device) + lg, x.shape, want)]
    return _record(out, [x], back)


def mean(x: DistTensor, axis: int | None = None, keepdim: bool = False) -> DistTensor:
    """Mean over ``axis`` (None: every element): ``sum`` divided by the count, placed as ``sum``."""
    n = math.prod(x.shape) if axis is None else x.shape[_axis(axis, x.ndim, "mean")]
    return sum(x, axis, keepdim) * (1.0 / n if n else math.nan)


# -- shape ops -----------------------------------------------------------------------------------------

def _permute(t: Tensor, perm: Sequence[int]) -> Tensor:
    """A contiguous copy of ``t`` with its dimensions in ``perm`` order."""
    order = list(range(t.ndim))
    for i, want in enumerate(perm):
        j = order.index(want)
        if j != i:
            t = t.transpose(i, j)
            order[i], order[j] = order[j], order[i]
    return t.contiguous()


def transpose(x: DistTensor, perm: Sequence[int] | None = None) -> DistTensor:
    """Dimensions permuted (``perm``; default: reversed, the matrix transpose for 2-D).
    Shard(d) becomes Shard(perm.index(d)); no communication."""
    p = list(range(x.ndim))[::-1] if perm is None else [int(d) for d in perm]
    if len(p) != x.ndim or any(not -x.ndim <= d < x.ndim for d in p) or \
            sorted(d % x.ndim for d in p) != list(range(x.ndim)):
        raise InvalidArgumentError(f"transpose: perm {p} is not a permutation of the {x.ndim} dimensions")
    p = [d % x.ndim for d in p]
    pl = [Shard(p.index(q.dim)) if isinstance(q, Shard) else q for q in x.placements]
    out = x._wrap(_permute(x._local, p), tuple(x.shape[d] for d in p), pl)
    inverse = [p.index(d) for d in range(x.ndim)]
    return _record(out, [x], lambda g: [transpose(g, inverse)])


def _target_shape(shape: Sequence[Any], old: Sequence[int], size: int) -> tuple[int, ...]:
    """Paddle's reshape target: 0 copies the input's dimension, one -1 is inferred."""
    try:
        dims = [int(s) for s in shape]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"reshape takes ints, got {list(shape)!r}") from None
    dims = [old[i] if d == 0 and i < len(old) else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise InvalidArgumentError(f"reshape: bad shape {dims}: dimensions are >= 0, and at most one is -1")
    known = math.prod(d for d in dims if d != -1)
    if -1 in dims:
        if known == 0 or size % known:
            raise InvalidArgumentError(f"reshape: cannot reshape a {list(old)} tensor into {dims}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise InvalidArgumentError(f"reshape: cannot reshape a {list(old)} tensor ({size} elements) into {dims}")
    return tuple(dims)


def _groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Runs of input and output dimensions with equal products (size-1 dimensions alone)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        if i < len(old) and old[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(new) and new[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        gi, gj = [i], [j]
        pi, pj = old[i], new[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= old[i]
                i += 1
            else:
                gj.append(j)
                pj *= new[j]
                j += 1
        groups.append((gi, gj))
    return groups


def reshape(x: DistTensor, shape: Sequence[Any]) -> DistTensor:
    """The same elements in another shape. Shard(d) moves to the output dimension that holds
    d's chunks whole: the first of the dimensions d splits into when that one divides evenly
    over the mesh axis, or the dimension d leads into a merge when d divides evenly. A Shard
    that a reshape would cut across (a trailing merged dimension, uneven chunks, a dimension
    sharded on two mesh axes) is gathered first. Partial stays (reshape is linear)."""
    new = _target_shape(shape, x.shape, math.prod(x.shape))
    if 0 in new or 0 in x.shape:
        groups: list[tuple[list[int], list[int]]] = []
    else:
        groups = _groups(x.shape, new)
    where = {d: g for g in groups for d in g[0]}
    shard_count: dict[int, int] = {}
    for p in x.placements:
        if isinstance(p, Shard):
            shard_count[p.dim] = shard_count.get(p.dim, 0) + 1
    gather: list[int] = []
    pl: list[Placement] = []
    for a, p in enumerate(x.placements):
        if not isinstance(p, Shard):
            pl.append(p)
            continue
        k = x.mesh.shape[a]
        ins, outs = where.get(p.dim, ([], []))
        target = None
        if outs and ins and ins[0] == p.dim and shard_count[p.dim] == 1:
            if len(ins) == 1 and new[outs[0]] % k == 0:
                target = outs[0]
            elif len(outs) == 1 and x.shape[p.dim] % k == 0:
                target = outs[0]
        if target is None:
            gather.append(a)
            pl.append(R)
        else:
            pl.append(Shard(target))
    x = _replicate_axes(x, gather)
    assert x.mesh.coordinate is not None
    lshape = local_box(new, pl, x.mesh.shape, x.mesh.coordinate)[1]
    out = x._wrap(x._local.reshape(*lshape), new, pl)
    old = x.shape
    return _record(out, [x], lambda g: [reshape(g, old)])


# -- matmul ----------------------------------------------------------------------------------------------

def matmul(x: Any, y: Any, transpose_x: bool = False, transpose_y: bool = False) -> DistTensor:
    """``x @ y`` (Paddle's ``matmul``): 2-D or batched (batch dimensions broadcast as NumPy's),
    the last two dimensions of an operand swapped first where ``transpose_x`` / ``transpose_y``.
    A dense operand (a NumPy array, an anychip Tensor) is taken as replicated. Per mesh axis:
    a sharded batch or row dimension of x stays sharded (the batch dimension of y is sliced to
    match, the rest of y gathered); a sharded column dimension of y is column parallel; a
    sharded contraction dimension gives Partial(sum), the other operand sliced to match (row
    parallel); a Partial(sum) operand against a Replicate one stays Partial."""
    like = _first_dist(x, y)
    return _matmul(_as_dist(x, like), _as_dist(y, like), bool(transpose_x), bool(transpose_y))


def _vdim(d: int, ndim: int, flip: bool) -> int:
    """Dimension ``d`` of an operand seen with its last two dimensions swapped (when ``flip``)."""
    if flip and d >= ndim - 2:
        return 2 * ndim - 3 - d
    return d


def _matmul_layout(a: DistTensor, b: DistTensor, ta: bool,
                   tb: bool) -> tuple[list[Placement], list[Placement], list[Placement], tuple[int, ...]]:
    """(a's, b's, the result's placements, the result's shape) of ``op(a) @ op(b)``."""
    if a.ndim < 2 or b.ndim < 2:
        raise UnsupportedError(f"matmul: operands of 2 or more dimensions, got {list(a.shape)} @ {list(b.shape)}; "
                               "reshape a vector to a matrix")
    sa = list(a.shape)
    sb = list(b.shape)
    if ta:
        sa[-2:] = sa[-1], sa[-2]
    if tb:
        sb[-2:] = sb[-1], sb[-2]
    if sa[-1] != sb[-2]:
        raise InvalidArgumentError(f"matmul: shapes {sa} and {sb} do not fit ({sa[-1]} != {sb[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
    except ValueError:
        raise InvalidArgumentError(f"matmul: the batch dimensions of {sa} and {sb} do not broadcast") from None
    shape = (*batch, sa[-2], sb[-1])
    pa: list[Placement] = []
    pb: list[Placement] = []
    out: list[Placement] = []
    for x, y in zip(a.placements, b.placements, strict=True):
        vx = Shard(_vdim(x.dim, a.ndim, ta)) if isinstance(x, Shard) else x
        vy = Shard(_vdim(y.dim, b.ndim, tb)) if isinstance(y, Shard) else y
        nx, ny, o = _matmul_axis(vx, vy, sa, sb, shape)
        pa.append(Shard(_vdim(nx.dim, a.ndim, ta)) if isinstance(nx, Shard) else nx)
        pb.append(Shard(_vdim(ny.dim, b.ndim, tb)) if isinstance(ny, Shard) else ny)
        out.append(o)
    return pa, pb, out, shape


def _matmul(a: DistTensor, b: DistTensor, ta: bool, tb: bool) -> DistTensor:
    pa, pb, out, shape = _matmul_layout(a, b, ta, tb)
    a2, b2 = reshard(a, a.mesh, pa), reshard(b, b.mesh, pb)
    la, lb = a2._local, b2._local
    res = a._wrap(_lmatmul(la.transpose(-2, -1) if ta else la, lb.transpose(-2, -1) if tb else lb), shape, out)

    def back(g: DistTensor) -> list[DistTensor | None]:
        # d(op(a)) = g @ op(b)^T, d(op(b)) = op(a)^T @ g; swapped back where op swapped; summed
        # over the batch dimensions an operand was broadcast along
        ga = gb = None
        if _needs(a2):
            ga = _unbroadcast(_matmul(b2, g, tb, True) if ta else _matmul(g, b2, False, not tb), a2.shape)
        if _needs(b2):
            if b2.ndim == 2 and a2.ndim > 2 and a2.shape[:-2] == g.shape[:-2]:
                gb = _weight_grad(a2, g, ta)
                gb = transpose(gb) if tb else gb
            else:
                gb = _unbroadcast(_matmul(g, a2, True, ta) if tb else _matmul(a2, g, not ta, False), b2.shape)
        return [ga, gb]
    return _record(res, [a2, b2], back)


def _weight_grad(a: DistTensor, g: DistTensor, ta: bool) -> DistTensor:
    """The sum over the batch of ``op(a)^T @ g`` (the gradient of a 2-D weight applied to a batch
    of matrices ``op(a)``) as one 2-D product over the merged rows of every batch, placed as the
    batched product summed over its batch dimensions would be (a sharded batch: Partial)."""
    pa, pg, out, shape = _matmul_layout(a, g, not ta, False)
    a2, g2 = reshard(a, a.mesh, pa), reshard(g, g.mesh, pg)
    rows = a2._local if not ta else a2._local.transpose(-2, -1)        # op(a): [..., M, K]
    k, n = rows.shape[-1], g2._local.shape[-1]
    left = rows.contiguous().reshape(math.prod(rows.shape[:-1]), k).T
    right = g2._local.contiguous().reshape(math.prod(g2._local.shape[:-1]), n)
    nd = len(shape)
    pl = [Partial() if isinstance(o, Shard) and o.dim < nd - 2 else Shard(o.dim - (nd - 2)) if isinstance(o, Shard)
          else o for o in out]
    return a._wrap(_lmatmul(left, right), shape[-2:], pl)      # (computed under no_grad: a leaf)


def _matmul_axis(x: Placement, y: Placement, sa: Sequence[int], sb: Sequence[int],
                 shape: Sequence[int]) -> tuple[Placement, Placement, Placement]:
    """(a's, b's, the result's) placement on one mesh axis, in the operands' transposed view."""
    na, nb = len(sa), len(sb)
    if isinstance(x, Partial) and not (x.op == "sum" and isinstance(y, Replicate)):
        x = R
    if isinstance(y, Partial) and not (y.op == "sum" and isinstance(x, Replicate)):
        y = R
    if isinstance(x, Partial) or isinstance(y, Partial):
        return x, y, Partial()
    ra, rb = _role(x, sa, shape, ("row", "k")), _role(y, sb, shape, ("k", "col"))
    if ra is not None and ra[0] == "k" and rb is not None and rb[0] == "col":
        ra = None                          # gather a: the column-parallel layout stays
    if ra is not None:
        kind, o = ra
        if kind == "k":
            return x, Shard(nb - 2), Partial()
        if kind == "row":
            return x, R, Shard(o)
        d = _batch_dim(sb, o, shape)
        return x, (Shard(d) if d is not None else R), Shard(o)
    if rb is not None:
        kind, o = rb
        if kind == "k":
            return Shard(na - 1), y, Partial()
        if kind == "col":
            return R, y, Shard(o)
        d = _batch_dim(sa, o, shape)
        return (Shard(d) if d is not None else R), y, Shard(o)
    return R, R, R


def _batch_dim(s: Sequence[int], o: int, shape: Sequence[int]) -> int | None:
    """The operand's dimension (of shape ``s``) read by output batch dimension ``o``, None
    when the operand is broadcast along it."""
    d = o - (len(shape) - len(s))
    return d if d >= 0 and (s[d] != 1 or shape[o] == 1) else None


def _role(p: Placement, s: Sequence[int], shape: Sequence[int], last_two: tuple[str, str]) -> tuple[str, int] | None:
    """What a Shard of a matmul operand (of shape ``s``) splits: ("batch", output dim), or the
    roles of its last two dimensions (a: row, k; b: k, col) with the output dim; None for a
    Replicate or a Shard of a broadcast batch dimension."""
    if not isinstance(p, Shard):
        return None
    nd, n = len(shape), len(s)
    if p.dim >= n - 2:
        kind = last_two[p.dim - (n - 2)]
        return (kind, nd - 2 if kind == "row" else nd - 1 if kind == "col" else -1)
    o = p.dim + nd - n
    return ("batch", o) if _batch_dim(s, o, shape) is not None else None


# -- embedding and cross-entropy -----------------------------------------------------------------

def _labels_like(labels: Any, like: DistTensor, rows: Sequence[Placement], what: str) -> DistTensor:
    """Integer ``labels`` as a DistTensor placed ``rows``."""
    if not isinstance(labels, DistTensor):
        arr = np.asarray(labels.numpy() if isinstance(labels, Tensor) else labels)
        if arr.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{what}: indices must be integers, got {arr.dtype}")
        labels = shard_tensor(arr, like.mesh, [R] * like.mesh.ndim)
    elif labels._npdtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: indices must be integers, got {labels.dtype}")
    return reshard(labels, like.mesh, rows)


def embedding(x: Any, weight: DistTensor, padding_idx: int | None = None) -> DistTensor:
    """Rows of ``weight`` [V, H] at the integer indices ``x`` (Paddle's ``F.embedding``). Per mesh
    axis: indices sharded with a replicated weight give a sharded result; a weight sharded on H
    (Shard(1)) gives a result sharded on its last dimension; a weight sharded on V (Shard(0),
    vocabulary parallel) gives Partial(sum): each rank looks up the rows it holds, zeros for the
    others. Where an index is ``padding_idx`` the result is zeros and the weight gets no gradient
    (Paddle's rule). The lookup runs on the host."""
    if not isinstance(weight, DistTensor) or weight.ndim != 2:
        raise InvalidArgumentError("embedding: weight must be a 2-D DistTensor [num_embeddings, embedding_dim]")
    ids0 = x if isinstance(x, DistTensor) else None
    nd = (ids0.ndim if ids0 is not None else np.ndim(x))
    w_pl: list[Placement] = list(weight.placements)
    id_pl: list[Placement] = []
    out: list[Placement] = []
    for a, p in enumerate(weight.placements):
        q = ids0.placements[a] if ids0 is not None else R
        if isinstance(q, Partial):
            q = R
        if isinstance(p, Partial):
            p = w_pl[a] = R
        if isinstance(q, Shard):
            w_pl[a] = R
            id_pl.append(q)
            out.append(Shard(q.dim))
        elif isinstance(p, Shard):
            id_pl.append(R)
            out.append(Shard(nd) if p.dim == 1 else Partial())
        else:
            id_pl.append(R)
            out.append(R)
    ids = _labels_like(x, weight, id_pl, "embedding")
    w = reshard(weight, weight.mesh, w_pl)
    assert w.mesh.coordinate is not None
    off, size = local_box(w.shape, w_pl, w.mesh.shape, w.mesh.coordinate)
    idx = np.asarray(host(ids._local)).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= w.shape[0]):
        raise InvalidArgumentError(f"embedding: index {int(idx.min() if idx.min() < 0 else idx.max())} is out of "
                                   f"range for {w.shape[0]} embeddings")
    mine = (idx >= off[0]) & (idx < off[0] + size[0])
    if padding_idx is not None:                 # Paddle: zeros at padding_idx, and no gradient
        mine &= idx != padding_idx % w.shape[0]
    rows = np.where(mine, idx - off[0], 0)
    table = np.asarray(host(w._local))
    values = table[rows] * mine[..., None] if table.shape[0] else np.zeros((*idx.shape, size[1]), table.dtype)
    res = w._wrap(upload(values.astype(table.dtype), w.mesh.device), (*ids.shape, w.shape[1]), out)

    def back(g: DistTensor) -> list[DistTensor]:
        # the weight's gradient: its own Shard axes; Partial(sum) where the indices are sharded
        # (each rank adds the rows of its part of the batch) or the gradient comes Partial
        g = reshard(g, g.mesh, [o if isinstance(o, Shard) else R if isinstance(o, Partial) else
                                (gp if isinstance(gp, Replicate) or _is_sum(gp) else R)
                                for o, gp in zip(out, g.placements, strict=True)])
        gh = np.asarray(host(g._local))
        grad = np.zeros(table.shape, gh.dtype)
        np.add.at(grad, rows[mine], gh[mine])
        gpl = [Partial() if isinstance(q, Shard) or _is_sum(gp) else p
               for p, q, gp in zip(w_pl, id_pl, g.placements, strict=True)]
        return [w._wrap(upload(grad, w.mesh.device), w.shape, gpl)]
    return _record(res, [w], back)


def cross_entropy(input: DistTensor, label: Any, ignore_index: int = -100,  # noqa: A002  (Paddle's name)
                  reduction: str = "mean", axis: int = -1) -> DistTensor:
    """Paddle's ``F.cross_entropy`` of logits ``input`` [..., C] and integer labels [...] (or
    [..., 1]): -log softmax at the label, rows whose label is ``ignore_index`` left out, then
    ``reduction`` "mean", "sum" or "none". "mean" is Paddle's: over the rows kept when
    ``ignore_index`` >= 0, over every row (the ignored ones counting 0) when it is negative, as
    the default -100 is. The class dimension is gathered when sharded; sharded rows stay sharded,
    so "mean" / "sum" are Partial(sum) on those axes ("mean" with ignore_index >= 0 all-reduces
    the count of the rows kept there: one scalar)."""
    x = input
    if not isinstance(x, DistTensor):
        raise InvalidArgumentError("cross_entropy: input must be a DistTensor of logits")
    if reduction not in ("mean", "sum", "none"):
        raise InvalidArgumentError(f"cross_entropy: reduction {reduction!r}; use 'mean', 'sum' or 'none'")
    if _axis(axis, x.ndim, "cross_entropy") != x.ndim - 1:
        raise UnsupportedError("cross_entropy: the classes must be the last dimension (axis=-1)")
    last = x.ndim - 1
    x = _replicate_axes(x, [a for a, p in enumerate(x.placements)
                            if isinstance(p, Partial) or (isinstance(p, Shard) and p.dim == last)])
    lab = label
    if isinstance(lab, DistTensor) and lab.ndim == x.ndim and lab.shape[-1] == 1:
        lab = reshape(lab, lab.shape[:-1])
    elif not isinstance(lab, DistTensor) and np.ndim(lab) == x.ndim and np.shape(lab)[-1] == 1:
        lab = np.asarray(lab).reshape(np.shape(lab)[:-1])
    shape_l = lab.shape if isinstance(lab, DistTensor) else np.shape(lab)
    if tuple(shape_l) != x.shape[:-1]:
        raise InvalidArgumentError(f"cross_entropy: labels of shape {list(shape_l)} for logits of shape "
                                   f"{list(x.shape)}; give one label per row ({list(x.shape[:-1])})")
    lab = _labels_like(lab, x, list(x.placements), "cross_entropy")
    labels = np.asarray(host(lab._local)).astype(np.int64)
    classes = x.shape[-1]
    valid = labels != ignore_index
    if valid.any() and (labels[valid].min() < 0 or labels[valid].max() >= classes):
        raise InvalidArgumentError(f"cross_entropy: a label is out of range for {classes} classes "
                                   f"(ignore_index={ignore_index})")
    onehot = upload((np.arange(classes) == np.where(valid, labels, -1)[..., None]).astype(x._npdtype),
                    x.mesh.device)
    xl = x._local

    def log_softmax(t: Any) -> Any:
        z = t - t.max(axis=last, keepdims=True)
        return z - z.exp().sum(axis=last, keepdims=True).log()
    nll = apply(lambda t, oh: -((log_softmax(t) * oh).sum(axis=last)), labels.shape, xl, onehot)
    rows = x._wrap(nll, x.shape[:-1], x.placements)
    if reduction == "none":
        out, scale = rows, None
    else:
        out = sum(rows.detach())
        scale = 1.0
        if reduction == "mean" and ignore_index >= 0:
            # over the rows kept: their count, all-reduced on the axes that shard rows
            count = x._wrap(upload(np.asarray(valid.sum(), np.int64), x.mesh.device), (),
                            [Partial() if isinstance(p, Shard) else R for p in x.placements])
            scale = 1.0 / max(int(host(reshard(count, x.mesh, [R] * x.mesh.ndim)._local).item()), 1)
            out = out * scale
        elif reduction == "mean":
            # a negative ignore_index (the default -100): over every row, the ignored ones counting 0
            scale = 1.0 / max(math.prod(x.shape[:-1]), 1)
            out = out * scale

    def back(g: DistTensor) -> list[DistTensor]:
        lg: Any
        if scale is None:
            g = _grad_like(g, rows.placements)
            lg = g._local.reshape(*g._local.shape, 1)
        else:
            g = _replicate_axes(g, [a for a, p in enumerate(x.placements)
                                    if isinstance(p, Shard) and isinstance(g.placements[a], Partial)])
            gl: Any = g._local
            lg = gl * scale
        want = [p if isinstance(p, Shard) else g.placements[a] for a, p in enumerate(x.placements)]
        # softmax - onehot on the rows kept (a row's one-hot sums to 1, an ignored row's to 0)
        grad = apply(lambda t, oh, gg: ((log_softmax(t).exp() * oh.sum(axis=last, keepdims=True) - oh) * gg),
                     xl.shape, xl, onehot, lg)
        return [x._wrap(grad, x.shape, want)]
    return _record(out if scale is None else _rewrap(out), [x], back)


def _rewrap(t: DistTensor) -> DistTensor:
    """``t`` as a new leaf of the graph (its own recorded history dropped)."""
    return t._wrap(t._local, t.shape, t.placements)
