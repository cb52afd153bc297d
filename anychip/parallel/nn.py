"""A minimal layer container, ``Linear``, ``shard_layer`` and ``AdamW`` over DistTensors."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError
from ..tensor import Tensor
from ._local import upload
from .dtensor import DistTensor, Parameter, shard_tensor
from .mesh import ProcessMesh
from .placement import Replicate

__all__ = ["Parameter", "Layer", "Linear", "shard_layer", "AdamW"]


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

    def forward(self, *args: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)


class Linear(Layer):
    """``y = x @ weight + bias`` with ``weight`` of shape [in_features, out_features] (Paddle's
    layout), initialised uniformly in ±1/sqrt(in_features) from ``seed``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, seed: int = 0,
                 dtype: Any = np.float32) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(rng.uniform(-bound, bound, (in_features, out_features)).astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, (out_features,)).astype(dtype)) if bias else None

    def forward(self, x: DistTensor) -> DistTensor:
        if isinstance(self.weight, Parameter):
            raise InvalidArgumentError("Linear: its parameters are not placed on a mesh yet; call "
                                       "shard_layer(layer, mesh) first")
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


def shard_layer(layer: Layer, mesh: ProcessMesh,
                shard_fn: Callable[[str, Layer, ProcessMesh], None] | None = None) -> Layer:
    """Place every parameter of ``layer`` on ``mesh``: ``shard_fn(name, sublayer, mesh)`` is called for
    each sub-layer and may set its parameters to ``shard_tensor(...)``; the rest are replicated."""
    if not isinstance(layer, Layer):
        raise InvalidArgumentError(f"shard_layer: expected a Layer, got {type(layer).__name__}")
    for name, sub in list(layer.named_sublayers()):
        if shard_fn is not None:
            shard_fn(name, sub, mesh)
        for pname, p in list(sub._params.items()):
            if isinstance(p, Parameter):
                setattr(sub, pname, shard_tensor(p.data, mesh, [Replicate()] * mesh.ndim, requires_grad=True))
            elif isinstance(p, DistTensor):
                p.requires_grad = True
    return layer


class AdamW:
    """Adam with decoupled weight decay (Paddle's ``AdamW``: p -= lr * weight_decay * p, then the
    Adam step). Each rank updates its own block; the states have the parameter's placements."""

    def __init__(self, parameters: Any, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.params = [p for p in parameters]
        for p in self.params:
            if not isinstance(p, DistTensor):
                raise InvalidArgumentError(f"AdamW: parameters must be DistTensors placed on a mesh "
                                           f"(shard_layer), got {type(p).__name__}")
        self.lr, self.beta1, self.beta2, self.eps, self.wd = learning_rate, beta1, beta2, epsilon, weight_decay
        self._t = 0
        self._state: dict[int, tuple[Tensor, Tensor]] = {}

    def step(self) -> None:
        self._t += 1
        b1, b2, t = self.beta1, self.beta2, self._t
        for p in self.params:
            if p.grad is None:
                continue
            if p.grad.placements != p.placements:
                raise InvalidArgumentError(f"AdamW: a gradient placed {list(p.grad.placements)} for a parameter "
                                           f"placed {list(p.placements)}")
            local = p.local_tensor()
            w, g = np.array(local.numpy()), p.grad.local_tensor().numpy()
            if id(p) not in self._state:
                zeros = np.zeros_like(w)
                self._state[id(p)] = (upload(zeros, local.device), upload(zeros, local.device))
            ms, vs = self._state[id(p)]
            m, v = np.array(ms.numpy()), np.array(vs.numpy())
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            w *= 1 - self.lr * self.wd
            denom = np.sqrt(v / (1 - b2 ** t))
            denom += self.eps
            w -= (self.lr / (1 - b1 ** t)) * m / denom
            for dst, val in ((local, w), (ms, m), (vs, v)):
                if val.size:
                    dst.buffer.copy_from(np.ascontiguousarray(val).reshape(-1).view(np.uint8), offset=dst.offset)

    def clear_grad(self) -> None:
        for p in self.params:
            p.grad = None
