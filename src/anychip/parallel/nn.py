"""Layers (``Layer``, ``Linear``, ``LayerNorm``, ``Embedding``), initializers and ``shard_layer``
over DistTensors, with Paddle's signatures (``paddle.nn``)."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError
from ._ops import embedding, layer_norm, matmul
from .dtensor import DistTensor, Parameter, shard_tensor
from .mesh import ProcessMesh
from .placement import Replicate

__all__ = ["Parameter", "Layer", "Linear", "LayerNorm", "Embedding", "Constant", "Normal", "Uniform",
           "XavierUniform", "shard_layer", "seed"]

#: draws the initial values of parameters made without a seed of their own: every rank makes
#: the same layers in the same order, so every rank draws the same values
_generator = np.random.default_rng(0)


def seed(value: int) -> None:
    """Restart the generator that initializes parameters made without a seed of their own
    (Paddle's ``paddle.seed``)."""
    global _generator
    _generator = np.random.default_rng(value)


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
