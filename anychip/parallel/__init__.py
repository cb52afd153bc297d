"""The parallel layer: a model author says how to split, the runtime decides how to move.

    >>> from anychip import parallel as dist
    >>> mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["x", "y"])
    >>> w = dist.shard_tensor(np.ones((8, 8), np.float32), mesh, [dist.Replicate(), dist.Shard(0)])
    >>> w2 = dist.reshard(w, mesh, [dist.Shard(1), dist.Replicate()])     # all_to_all... as planned

Names follow Paddle's auto-parallel API (``paddle.distributed``). See docs/parallel.md.
"""
from __future__ import annotations

from .dtensor import DistTensor, dtensor_from_local, matmul, mean, no_grad, relu, reshard, shard_tensor, transpose
from .mesh import ProcessMesh, world
from .nn import AdamW, Layer, Linear, Parameter, shard_layer
from .placement import Partial, Placement, Replicate, Shard

__all__ = ["ProcessMesh", "world", "Placement", "Shard", "Replicate", "Partial", "DistTensor",
           "shard_tensor", "reshard", "dtensor_from_local", "matmul", "transpose", "relu", "mean", "no_grad",
           "Layer", "Linear", "Parameter", "shard_layer", "AdamW"]
