"""``AdamW`` and ZeRO's ``shard_optimizer`` (``ShardingStage1/2/3``) over DistTensors, with
Paddle's signatures (``paddle.optimizer.AdamW``, ``paddle.distributed.shard_optimizer``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.errors import InvalidArgumentError
from ..tensor import Tensor
from ._local import upload
from .dtensor import DistTensor, reshard
from .mesh import ProcessMesh
from .placement import Placement, Replicate, Shard

__all__ = ["AdamW", "shard_optimizer", "ShardingStage1", "ShardingStage2", "ShardingStage3"]


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
