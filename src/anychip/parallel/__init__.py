"""The parallel layer: a model author says how to split, the runtime decides how to move.

    >>> from anychip import parallel as dist
    >>> mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["x", "y"])
    >>> w = dist.shard_tensor(np.ones((8, 8), np.float32), mesh, [dist.Replicate(), dist.Shard(0)])
    >>> w2 = dist.reshard(w, mesh, [dist.Shard(1), dist.Replicate()])     # all_to_all... as planned

Names follow Paddle's auto-parallel API (``paddle.distributed``). See docs/parallel.md.
"""
from __future__ import annotations

from . import _ops, dtensor
from ._ops import (
    cross_entropy,
    embedding,
    exp,
    gelu,
    layer_norm,
    matmul,
    mean,
    relu,
    reshape,
    softmax,
    sum,
    tanh,
    transpose,
)
from .dtensor import (
    DistTensor,
    dtensor_from_fn,
    dtensor_from_local,
    dtensor_to_local,
    no_grad,
    reshard,
    shard_tensor,
    unshard_dtensor,
)
from .mesh import ProcessMesh, get_mesh, set_mesh, world
from .nn import (
    Constant,
    Embedding,
    Layer,
    LayerNorm,
    Linear,
    Normal,
    Parameter,
    Uniform,
    XavierUniform,
    seed,
    shard_layer,
)
from .optimizer import AdamW, ShardingStage1, ShardingStage2, ShardingStage3, shard_optimizer
from .placement import Partial, Placement, ReduceType, Replicate, Shard

dtensor.install(_ops)     # DistTensor's operator methods (see dtensor.py)

__all__ = [
    # meshes and placements
    "ProcessMesh", "world", "set_mesh", "get_mesh", "Placement", "Shard", "Replicate", "Partial", "ReduceType",
    # distributed tensors
    "DistTensor", "shard_tensor", "reshard", "dtensor_from_local", "dtensor_to_local", "dtensor_from_fn",
    "unshard_dtensor", "no_grad",
    # ops
    "matmul", "transpose", "reshape", "relu", "exp", "tanh", "gelu", "softmax", "layer_norm", "sum", "mean",
    "embedding", "cross_entropy",
    # layers and optimizers
    "Layer", "Linear", "LayerNorm", "Embedding", "Parameter", "Constant", "Normal", "Uniform", "XavierUniform",
    "seed", "shard_layer", "AdamW", "shard_optimizer", "ShardingStage1", "ShardingStage2", "ShardingStage3",
]
