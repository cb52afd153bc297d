"""Data + tensor parallel training of an MLP on a 2 x 2 ProcessMesh, checked against one device.

    anychip launch -n 4 --device ascend examples/auto_parallel.py [--small] [--steps N]

The mesh is [[0, 1], [2, 3]] with dim_names ["x", "y"]: the batch is sharded on "x" (data
parallel), the two [4096, 4096] weights on "y" (tensor parallel, Megatron style): the first
column-parallel ([Replicate(), Shard(1)]), the second row-parallel ([Replicate(), Shard(0)]).
The model code never calls a collective: matmul propagates placements, the row-parallel output
comes out Partial and is reduced where the loss needs it, and each weight's gradient (Partial
on "x", since the batch is split there) stays Partial until AdamW's step all-reduces it.

Rank 0 then trains the same model, from the same initial weights and data, on a one-rank mesh
on its own device and prints both loss curves side by side; they must agree to 1e-5 relative.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from anychip import parallel as dist
from anychip.parallel import Replicate, Shard


class MLP(dist.Layer):
    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = dist.Linear(d_in, hidden, seed=1)
        self.fc2 = dist.Linear(hidden, d_out, seed=2)

    def forward(self, x: dist.DistTensor) -> dist.DistTensor:
        return self.fc2(self.fc1(x).relu())


def shard_fn(name: str, layer: dist.Layer, mesh: dist.ProcessMesh) -> None:
    if name == "fc1":      # column parallel: output features split on "y"
        layer.weight = dist.shard_tensor(layer.weight, mesh, [Replicate(), Shard(1)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [Replicate(), Shard(0)])
    elif name == "fc2":    # row parallel: input features split on "y"
        layer.weight = dist.shard_tensor(layer.weight, mesh, [Replicate(), Shard(0)])


def train(mesh: dist.ProcessMesh, sizes: tuple[int, int, int, int], steps: int, lr: float) -> tuple[list, list]:
    """Losses and step times of ``steps`` AdamW steps on ``mesh``."""
    batch, d_in, hidden, d_out = sizes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    teacher = rng.standard_normal((d_in, d_out)).astype(np.float32) / np.sqrt(d_in)
    target = np.tanh(x @ teacher).astype(np.float32)
    model = dist.shard_layer(MLP(d_in, hidden, d_out), mesh, shard_fn)
    opt = dist.AdamW(learning_rate=lr, parameters=model.parameters(), weight_decay=0.01)
    X = dist.shard_tensor(x, mesh, [Shard(0), Replicate()])
    T = dist.shard_tensor(target, mesh, [Shard(0), Replicate()])
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        diff = model(X) - T
        loss = (diff * diff).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        value = loss.item()
        mesh.device.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(value)
    return losses, times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a small model (for CI)")
    ap.add_argument("--steps", type=int, default=None, help="AdamW steps (default 5, 3 with --small)")
    ap.add_argument("--device", default=None, help="backend to run on (default: the launcher's --device)")
    ap.add_argument("--json", action="store_true", help="rank 0 prints the results as one JSON line")
    args = ap.parse_args()
    if args.device:
        os.environ["ANYCHIP_LAUNCH_DEVICE"] = args.device
    steps = args.steps or (3 if args.small else 5)
    sizes = (8, 64, 64, 32) if args.small else (16, 4096, 4096, 4096)
    lr = 1e-3

    world = dist.world()
    if world.size != 4:
        print(f"auto_parallel.py needs 4 ranks (a 2 x 2 mesh), got {world.size}; run it with "
              "`anychip launch -n 4 [--device BACKEND] examples/auto_parallel.py`", file=sys.stderr)
        return 2
    from anychip.parallel import _reshard
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["x", "y"])
    losses, times = train(mesh, sizes, steps, lr)
    coll, counts = dict(_reshard.seconds), dict(_reshard.counts)
    world.barrier().wait()
    if world.rank != 0:
        world.destroy()
        return 0
    single = dist.ProcessMesh([[0]], dim_names=["x", "y"])        # rank 0 alone, same code
    ref, ref_times = train(single, sizes, steps, lr)
    worst = 0.0
    print(f"MLP {sizes[1]}x{sizes[2]}x{sizes[3]}, batch {sizes[0]}, {steps} AdamW steps on {world.device} "
          f"(2x2 mesh, batch on x, weights on y) vs one device")
    print(f"{'step':>4}  {'2x2 mesh loss':>15}  {'1 device loss':>15}  {'rel diff':>9}")
    for i, (a, b) in enumerate(zip(losses, ref, strict=True)):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"{i:>4}  {a:>15.8f}  {b:>15.8f}  {rel:>9.2e}")
    ok = worst <= 1e-5
    print(f"losses {'match' if ok else 'DIFFER'}: worst relative difference {worst:.2e} (tolerance 1e-05)")
    if args.json:
        print(json.dumps({"sizes": sizes, "steps": steps, "dist_step_s": times, "single_step_s": ref_times,
                          "collective_s": coll, "collectives": counts, "losses": losses, "ref_losses": ref}))
    world.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
