"""Layers (``Layer``, ``Linear``, ``LayerNorm``, ``Embedding``), initializers, ``shard_layer``,
``AdamW`` and ZeRO's ``shard_optimizer`` over DistTensors, with Paddle's signatures."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError
from ..tensor import Tensor
from ._local import upload
from ._ops import embedding, layer_norm, matmul
from .dtensor import DistTensor, Parameter, reshard, shard_tensor
from .mesh import ProcessMesh
from .placement import Placement, Replicate, Shard

__all__ = ["Parameter", "Layer", "Linear", "LayerNorm", "Embedding", "Constant", "Normal", "Uniform",
           "XavierUniform", "shard_layer", "AdamW", "shard_optimizer", "ShardingStage1", "ShardingStage2",
           "ShardingStage3"]

#: draws the initial values of parameters made without a seed of their own: every rank makes
#: the same layers in the same order, so every rank draws the same values
_generator = np.random.default_rng(0)


# -- initializers (Paddle's paddle.nn.initializer names) -------------------------------------------

class Constant:
    """Every element ``value``."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def __call__(self, shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
        return np.full(tuple(shape), self.value, dtype=dtype)


class Normal:
    """Normally distributed with ``mean`` and ``std``."""

    def __init__(self, mean: float = 0.0, std: float = 1.0) -> None:
        self.mean, self.std = mean, std

    def __call__(self, shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(self.mean, self.std, tuple(shape)).astype(dtype)


class Uniform:
    """Uniform in [low, high)."""

    def __init__(self, low: float = -1.0, high: float = 1.0) -> None:
        self.low, self.high = low, high

    def __call__(self, shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high, tuple(shape)).astype(dtype)


class XavierUniform:
    """Uniform in ±sqrt(6 / (fan_in + fan_out)); for a [in, out] weight fan_in = in, fan_out = out
    (Paddle's default for weights)."""

    def __init__(self, fan_in: float | None = None, fan_out: float | None = None) -> None:
        self.fan_in, self.fan_out = fan_in, fan_out

    def __call__(self, shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
        dims = tuple(shape)
        fan_in = self.fan_in if self.fan_in is not None else (dims[0] if dims else 1)
        fan_out = self.fan_out if self.fan_out is not None else (dims[1] if len(dims) > 1 else fan_in)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, dims).astype(dtype)


def _initializer(attr: Any, default: Any, what: str) -> Any:
    """The initializer of a Paddle ``weight_attr`` / ``bias_attr``: None (the default), an
    initializer, or an object with an ``initializer`` attribute (Paddle's ParamAttr)."""
    if attr is None:
        return default
    init = getattr(attr, "initializer", attr)
    if init is None:
        return default
    if not callable(init):
        raise InvalidArgumentError(f"{what}: expected an initializer (Constant, Normal, Uniform, XavierUniform, or "
                                   f"a callable (shape, dtype, rng) -> array), got {attr!r}")
    return init


class Layer:
    """Holds parameters (``Parameter`` or, once placed, ``DistTensor``) and sub-layers as
    attributes; calling it runs ``forward``."""

    _params: dict[str, Any]
    _layers: dict[str, Layer]

    def __init__(self) -> None:
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_layers", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, (Parameter, DistTensor)) and (isinstance(value, Parameter) or value.requires_grad
                                                           or name in self._params):
            self._params[name] = value
        elif isinstance(value, Layer):
            self._layers[name] = value
        object.__setattr__(self, name, value)

    def named_sublayers(self, prefix: str = "") -> Iterator[tuple[str, Layer]]:
        """This layer (named ``prefix``) and every sub-layer, depth first."""
        yield prefix, self
        for name, layer in self._layers.items():
            yield from layer.named_sublayers(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        for lname, layer in self.named_sublayers():
            for pname in layer._params:
                yield (f"{lname}.{pname}" if lname else pname), getattr(layer, pname)

    def parameters(self) -> list[Any]:
        return [p for _, p in self.named_parameters()]

    def create_parameter(self, shape: Sequence[int], dtype: Any = None, default_initializer: Any = None,
                         is_bias: bool = False, attr: Any = None) -> Parameter:
        """A new host ``Parameter`` of ``shape`` (Paddle's signature): ``default_initializer``, or
        zeros for a bias and XavierUniform for a weight; ``attr`` may carry an initializer. Assign
        it to an attribute to register it; ``shard_layer`` places it."""
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"create_parameter: shape must be a list of ints, got {shape!r}") from None
        if any(d < 0 for d in dims):
            raise InvalidArgumentError(f"create_parameter: shape {dims} has a negative dimension")
        init = _initializer(attr, default_initializer or (Constant(0.0) if is_bias else XavierUniform()),
                            "create_parameter")
        return Parameter(np.asarray(init(dims, np.dtype(dtype or "float32"), _generator),
                                    dtype=np.dtype(dtype or "float32")))

    def forward(self, *args: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any) -> Any:
        fns = self.__dict__.get("_shard_io")
        if fns is not None and fns[0] is not None:
            args = fns[0](args, fns[2])
            args = args if isinstance(args, tuple) else (args,)
        out = self.forward(*args)
        if fns is not None and fns[1] is not None:
            out = fns[1](out, fns[2])
        return out


class Linear(Layer):
    """``y = x @ weight + bias`` with ``weight`` of shape [in_features, out_features] (Paddle's layout
    and signature). ``weight_attr`` / ``bias_attr``: None (weight XavierUniform, bias zeros, as
    Paddle), an initializer, or a ParamAttr-like object with ``initializer``; ``bias_attr=False``:
    no bias. ``seed``: draw from a generator of this seed instead of the module's."""

    def __init__(self, in_features: int, out_features: int, weight_attr: Any = None, bias_attr: Any = None,
                 name: str | None = None, *, seed: int | None = None, dtype: Any = "float32") -> None:
        super().__init__()
        rng = _generator if seed is None else np.random.default_rng(seed)
        dt = np.dtype(dtype)
        w_init = _initializer(weight_attr, XavierUniform(), "Linear weight_attr")
        self.weight = Parameter(np.asarray(w_init([in_features, out_features], dt, rng), dtype=dt))
        if bias_attr is False:
            self.bias = None
        else:
            b_init = _initializer(bias_attr, Constant(0.0), "Linear bias_attr")
            self.bias = Parameter(np.asarray(b_init([out_features], dt, rng), dtype=dt))

    def forward(self, x: Any) -> DistTensor:
        if isinstance(self.weight, Parameter):
            raise InvalidArgumentError("Linear: its parameters are not placed on a mesh yet; call "
                                       "shard_layer(layer, mesh) first")
        y = matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


class LayerNorm(Layer):
    """Paddle's ``nn.LayerNorm`` over the last dimension: weight ones, bias zeros."""

    def __init__(self, normalized_shape: int | Sequence[int], epsilon: float = 1e-05, weight_attr: Any = None,
                 bias_attr: Any = None, name: str | None = None) -> None:
        super().__init__()
        n = normalized_shape if isinstance(normalized_shape, int) else list(normalized_shape)[-1]
        self.normalized_shape, self.epsilon = normalized_shape, epsilon
        self.weight = None if weight_attr is False else \
            self.create_parameter([n], default_initializer=Constant(1.0), attr=weight_attr)
        self.bias = None if bias_attr is False else self.create_parameter([n], is_bias=True, attr=bias_attr)

    def forward(self, x: DistTensor) -> DistTensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.epsilon)


class Embedding(Layer):
    """Paddle's ``nn.Embedding``: a [num_embeddings, embedding_dim] weight (XavierUniform)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 sparse: bool = False, weight_attr: Any = None, name: str | None = None) -> None:
        super().__init__()
        self.padding_idx = padding_idx
        self.weight = self.create_parameter([num_embeddings, embedding_dim], attr=weight_attr)
        if padding_idx is not None:
            self.weight.data[padding_idx] = 0

    def forward(self, x: Any) -> DistTensor:
        if isinstance(self.weight, Parameter):
            raise InvalidArgumentError("Embedding: its weight is not placed on a mesh yet; call "
                                       "shard_layer(layer, mesh) first")
        return embedding(x, self.weight, self.padding_idx)


def shard_layer(layer: Layer, mesh: ProcessMesh,
                shard_fn: Callable[[str, Layer, ProcessMesh], None] | None = None,
                input_fn: Callable[[Any, ProcessMesh], Any] | None = None,
                output_fn: Callable[[Any, ProcessMesh], Any] | None = None) -> Layer:
    """Place every parameter of ``layer`` on ``mesh`` (Paddle's signature): ``shard_fn(name,
    sublayer, mesh)`` is called for each sub-layer and may set its parameters to
    ``shard_tensor(...)``; the rest are replicated. ``input_fn(inputs, mesh)`` /
    ``output_fn(outputs, mesh)``, when given, run before / after ``layer``'s forward."""
    if not isinstance(layer, Layer):
        raise InvalidArgumentError(f"shard_layer: expected a Layer, got {type(layer).__name__}")
    if not isinstance(mesh, ProcessMesh):
        raise InvalidArgumentError(f"shard_layer: mesh must be a ProcessMesh, got {type(mesh).__name__}")
    for name, sub in list(layer.named_sublayers()):
        if shard_fn is not None:
            shard_fn(name, sub, mesh)
        for pname, p in list(sub._params.items()):
            if isinstance(p, Parameter):
                setattr(sub, pname, shard_tensor(p.data, mesh, [Replicate()] * mesh.ndim, requires_grad=True))
            elif isinstance(p, DistTensor):
                p.requires_grad = True
    if input_fn is not None or output_fn is not None:
        object.__setattr__(layer, "_shard_io", (input_fn, output_fn, mesh))
    return layer


# -- ZeRO --------------------------------------------------------------------------------------------

class _Sharding:
    stage = 0

    def __init__(self, sharding_mesh_dim: int | str, mesh: ProcessMesh | None = None) -> None:
        self.sharding_mesh_dim, self.mesh = sharding_mesh_dim, mesh

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sharding_mesh_dim!r})"


class ShardingStage1(_Sharding):
    """ZeRO stage 1 over a mesh axis: the optimizer states sharded (each rank updates its chunk
    of every parameter that axis replicates, then the chunks are all-gathered)."""
    stage = 1


class ShardingStage2(_Sharding):
    """ZeRO stage 2: stage 1, and the gradients reduce-scattered to the chunks instead of
    all-reduced."""
    stage = 2


class ShardingStage3(_Sharding):
    """ZeRO stage 3: stage 2, and the parameters themselves sharded over the axis (the ops'
    placement rules all-gather them where the forward and backward need them whole)."""
    stage = 3


def _zero_dim(p: DistTensor, axis: int) -> int | None:
    """The dimension ZeRO shards ``p`` on along mesh ``axis``: the first one that no other mesh
    axis shards and that has at least as many elements as the axis has ranks."""
    taken = {q.dim for q in p.placements if isinstance(q, Shard)}
    for d, n in enumerate(p.shape):
        if d not in taken and n >= p.mesh.shape[axis]:
            return d
    return None


def shard_optimizer(optimizer: AdamW, shard_fn: _Sharding | None = None) -> AdamW:
    """Paddle's ``dist.shard_optimizer``: ``optimizer`` with ZeRO ``shard_fn``
    (``ShardingStage1/2/3(sharding_mesh_dim, mesh=None)``); None keeps it unsharded. Stage 3
    reshards the parameters now, in place (each rank keeps its chunk)."""
    if not isinstance(optimizer, AdamW):
        raise InvalidArgumentError(f"shard_optimizer: expected an AdamW, got {type(optimizer).__name__}")
    if shard_fn is None:
        return optimizer
    if not isinstance(shard_fn, _Sharding):
        raise InvalidArgumentError(f"shard_optimizer: shard_fn must be ShardingStage1, ShardingStage2 or "
                                   f"ShardingStage3, got {shard_fn!r}")
    if optimizer._state:
        raise InvalidArgumentError("shard_optimizer: the optimizer has already stepped; shard it before the first "
                                   "step")
    for p in optimizer.params:
        mesh = shard_fn.mesh or p.mesh
        if mesh != p.mesh:
            raise InvalidArgumentError(f"shard_optimizer: {shard_fn!r} names {mesh}, a parameter lives on {p.mesh}")
        axis = p.mesh.axis(shard_fn.sharding_mesh_dim)
        if shard_fn.stage == 3 and isinstance(p.placements[axis], Replicate):
            d = _zero_dim(p, axis)
            if d is not None:
                pl = list(p.placements)
                pl[axis] = Shard(d)
                with_grad = p.requires_grad
                moved = reshard(p.detach(), p.mesh, pl)
                p._local, p.placements, p.requires_grad = moved._local, moved.placements, with_grad
    optimizer._sharding = shard_fn
    return optimizer


class AdamW:
    """Adam with decoupled weight decay, Paddle's ``paddle.optimizer.AdamW`` and its signature
    (``learning_rate`` first): p -= lr * weight_decay * p, then the bias-corrected Adam step.
    ``step()`` reshards each gradient to its parameter's placements first (the one reduction of
    a data-parallel gradient, however many backward passes accumulated it); each rank then
    updates its own block, the moments in device memory beside it. Under ``shard_optimizer``
    the update runs on this rank's ZeRO chunk."""

    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-08, parameters: Any = None, weight_decay: float = 0.01,
                 name: str | None = None) -> None:
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
            raise InvalidArgumentError(f"AdamW: learning_rate must be a number, got {type(learning_rate).__name__} "
                                       "(Paddle's order: AdamW(learning_rate, beta1, beta2, epsilon, parameters, "
                                       "weight_decay); pass the parameters as parameters=)")
        if parameters is None:
            raise InvalidArgumentError("AdamW: parameters= is required (e.g. model.parameters())")
        self.params = [p for p in parameters]
        for p in self.params:
            if not isinstance(p, DistTensor):
                raise InvalidArgumentError(f"AdamW: parameters must be DistTensors placed on a mesh "
                                           f"(shard_layer), got {type(p).__name__}")
        self.lr, self.beta1, self.beta2, self.eps, self.wd = learning_rate, beta1, beta2, epsilon, weight_decay
        self._t = 0
        self._state: dict[int, tuple[Tensor, Tensor]] = {}
        self._sharding: _Sharding | None = None

    def _layout(self, p: DistTensor) -> list[Placement]:
        """Where ``p``'s update runs: its placements, or its ZeRO chunk (stages 1 and 2)."""
        pl = list(p.placements)
        z = self._sharding
        if z is not None and z.stage < 3:
            axis = p.mesh.axis(z.sharding_mesh_dim)
            d = _zero_dim(p, axis) if isinstance(pl[axis], Replicate) else None
            if d is not None:
                pl[axis] = Shard(d)
        return pl

    def step(self) -> None:
        self._t += 1
        b1, b2, t = self.beta1, self.beta2, self._t
        for p in self.params:
            if p.grad is None:
                continue
            layout = self._layout(p)
            if self._sharding is not None and self._sharding.stage == 1:
                g = reshard(reshard(p.grad, p.mesh, p.placements), p.mesh, layout)    # all_reduce, local slice
            else:
                g = reshard(p.grad, p.mesh, layout)     # all_reduce / reduce_scatter of a Partial gradient
            chunk = p if layout == list(p.placements) else reshard(p.detach(), p.mesh, layout)   # a local slice
            local = chunk.local_tensor()
            w, gl = np.array(local.numpy()), g.local_tensor().numpy()
            if id(p) not in self._state:
                zeros = np.zeros_like(w)
                self._state[id(p)] = (upload(zeros, local.device), upload(zeros, local.device))
            ms, vs = self._state[id(p)]
            m, v = np.array(ms.numpy()), np.array(vs.numpy())
            m *= b1
            m += (1 - b1) * gl
            v *= b2
            v += (1 - b2) * (gl * gl)
            w *= 1 - self.lr * self.wd
            denom = np.sqrt(v / (1 - b2 ** t))
            denom += self.eps
            w -= (self.lr / (1 - b1 ** t)) * m / denom
            for dst, val in ((local, w), (ms, m), (vs, v)):
                if val.size:
                    dst.buffer.copy_from(np.ascontiguousarray(val).reshape(-1).view(np.uint8), offset=dst.offset)
            if chunk is not p:              # ZeRO 1 / 2: the updated chunks all-gathered into the parameter
                whole = reshard(chunk, p.mesh, p.placements).local_tensor()
                if whole.nbytes:
                    p.local_tensor().buffer.copy_from(whole.buffer, whole.nbytes, offset=p.local_tensor().offset,
                                                      src_offset=whole.offset)

    def clear_grad(self) -> None:
        for p in self.params:
            p.grad = None
