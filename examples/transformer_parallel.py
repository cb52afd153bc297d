"""A small GPT trained data x tensor parallel on a 2 x 2 ProcessMesh, checked against one device.

    anychip launch -n 4 --device ascend examples/transformer_parallel.py [--small] [--steps N] [--zero]

The mesh is [[0, 1], [2, 3]] with dim_names ["dp", "tp"]. The batch is sharded on "dp" (data
parallel). Each block is tensor parallel on "tp" the Megatron way, from placements alone: the
query / key / value and first MLP weights are column parallel ([Replicate(), Shard(1)]), so the
attention runs on each rank's heads (the head dimension comes out of a reshape of a sharded
feature dimension, sharded); the attention output and second MLP weights are row parallel
([Replicate(), Shard(0)]), whose Partial outputs are all-reduced where they meet the bias. The
embedding, layer norms and the language-model head are replicated. The model code never calls
a collective; the gradients stay Partial on "dp" until AdamW's step reduces each once.
``--zero`` shards AdamW's states over "dp" (ZeRO stage 1).

Rank 0 then trains the same model from the same initial weights and data on a one-rank mesh
and prints both loss curves and the collectives each step of the mesh run derived.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from anychip import parallel as dist
from anychip.parallel import Replicate, Shard


class Block(dist.Layer):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = dist.LayerNorm(d), dist.LayerNorm(d)
        self.q, self.k, self.v = dist.Linear(d, d), dist.Linear(d, d), dist.Linear(d, d)
        self.o = dist.Linear(d, d)
        self.fc1, self.fc2 = dist.Linear(d, 4 * d), dist.Linear(4 * d, d)

    def attention(self, x: dist.DistTensor, mask: np.ndarray) -> dist.DistTensor:
        b, s, d = x.shape
        hd = d // self.heads

        def heads(t: dist.DistTensor) -> dist.DistTensor:            # [b, s, d] -> [b, heads, s, hd]
            return t.reshape([b, s, self.heads, hd]).transpose([0, 2, 1, 3])
        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = dist.matmul(q, k, transpose_y=True) * (1 / math.sqrt(hd)) + mask
        ctx = dist.matmul(dist.softmax(scores, axis=-1), v)
        return self.o(ctx.transpose([0, 2, 1, 3]).reshape([b, s, d]))

    def forward(self, x: dist.DistTensor, mask: np.ndarray) -> dist.DistTensor:
        x = x + self.attention(self.ln1(x), mask)
        return x + self.fc2(dist.gelu(self.fc1(self.ln2(x)), approximate=True))     # GPT-2's gelu


class GPT(dist.Layer):
    def __init__(self, vocab: int, seq: int, d: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tok = dist.Embedding(vocab, d)
        self.pos = self.create_parameter([seq, d], default_initializer=dist.Normal(0.0, 0.02))
        self.blocks = [Block(d, heads) for _ in range(layers)]
        for i, blk in enumerate(self.blocks):
            setattr(self, f"block{i}", blk)
        self.ln_f = dist.LayerNorm(d)
        self.head = dist.Linear(d, vocab, bias_attr=False)
        # causal: position i attends to positions <= i
        self.mask = np.triu(np.full((seq, seq), -1e9, np.float32), 1)

    def forward(self, ids: dist.DistTensor) -> dist.DistTensor:
        x = self.tok(ids) + self.pos
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))


def shard_fn(name: str, layer: dist.Layer, mesh: dist.ProcessMesh) -> None:
    leaf = name.rsplit(".", 1)[-1]
    col, row = [Replicate(), Shard(1)], [Replicate(), Shard(0)]
    if leaf in ("q", "k", "v", "fc1"):        # column parallel: output features (heads) split on "tp"
        layer.weight = dist.shard_tensor(layer.weight, mesh, col)
        layer.bias = dist.shard_tensor(layer.bias, mesh, row)
    elif leaf in ("o", "fc2"):                 # row parallel: input features split on "tp"
        layer.weight = dist.shard_tensor(layer.weight, mesh, row)


def train(mesh: dist.ProcessMesh, cfg: dict, steps: int, zero: bool) -> tuple[list, list, list]:
    """Losses, step times and the collectives of each step on ``mesh``."""
    from anychip.parallel import _reshard
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    dist.seed(1)                           # the same initial weights on every run (Paddle's paddle.seed)
    model = dist.shard_layer(GPT(cfg["vocab"], cfg["seq"], cfg["d"], cfg["heads"], cfg["layers"]), mesh, shard_fn)
    opt = dist.AdamW(learning_rate=3e-3, parameters=model.parameters(), weight_decay=0.01)
    if zero:
        opt = dist.shard_optimizer(opt, dist.ShardingStage1("dp", mesh))
    dp = [Shard(0), Replicate()]
    X, Y = dist.shard_tensor(inputs, mesh, dp), dist.shard_tensor(labels, mesh, dp)
    losses, times, spent = [], [], []
    for _ in range(steps):
        before = dict(_reshard.counts)
        t0 = time.perf_counter()
        loss = dist.cross_entropy(model(X), Y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        value = loss.item()
        mesh.device.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(value)
        spent.append({k: n - before.get(k, 0) for k, n in sorted(_reshard.counts.items()) if n != before.get(k, 0)})
    return losses, times, spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a small model (for CI)")
    ap.add_argument("--steps", type=int, default=None, help="AdamW steps (default 5, 3 with --small)")
    ap.add_argument("--zero", action="store_true", help="shard AdamW's states over dp (ZeRO stage 1)")
    ap.add_argument("--device", default=None, help="backend to run on (default: the launcher's --device)")
    ap.add_argument("--json", action="store_true", help="rank 0 prints the results as one JSON line")
    args = ap.parse_args()
    if args.device:
        os.environ["ANYCHIP_LAUNCH_DEVICE"] = args.device
    steps = args.steps or (3 if args.small else 5)
    cfg = dict(vocab=64, seq=8, d=32, heads=4, layers=2, batch=4) if args.small else \
        dict(vocab=512, seq=64, d=256, heads=8, layers=4, batch=8)
    world = dist.world()
    if world.size != 4:
        print(f"transformer_parallel.py needs 4 ranks (a 2 x 2 mesh), got {world.size}; run it with "
              "`anychip launch -n 4 [--device BACKEND] examples/transformer_parallel.py`", file=sys.stderr)
        return 2
    from anychip.parallel import _reshard
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "tp"])
    losses, times, spent = train(mesh, cfg, steps, args.zero)
    coll = dict(_reshard.seconds)
    world.barrier().wait()
    if world.rank != 0:
        world.destroy()
        return 0
    single = dist.ProcessMesh([[0]], dim_names=["dp", "tp"])        # rank 0 alone, same code
    ref, ref_times, _ = train(single, cfg, steps, False)
    model = (f"GPT: {cfg['layers']} blocks, d {cfg['d']}, {cfg['heads']} heads, vocab {cfg['vocab']}, "
             f"seq {cfg['seq']}, batch {cfg['batch']}")
    print(f"{model}, float32, {steps} AdamW steps on {world.device}: 2x2 mesh (batch on dp, heads and MLP on tp"
          f"{', ZeRO 1 on dp' if args.zero else ''}) vs one device")
    print(f"{'step':>4}  {'2x2 mesh loss':>15}  {'1 device loss':>15}  {'rel diff':>9}  collectives (rank 0)")
    worst = 0.0
    for i, (a, b) in enumerate(zip(losses, ref, strict=True)):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        print(f"{i:>4}  {a:>15.8f}  {b:>15.8f}  {rel:>9.2e}  " + ", ".join(f"{k} {n}" for k, n in spent[i].items()))
    ok = worst <= 1e-5
    print(f"losses {'match' if ok else 'DIFFER'}: worst relative difference {worst:.2e} (tolerance 1e-05)")
    if args.json:
        print(json.dumps({"model": model, "steps": steps, "dist_step_s": times, "single_step_s": ref_times,
                          "collective_s": coll, "collectives": {k: sum(s.get(k, 0) for s in spent)
                                                                for k in _reshard.counts},
                          "losses": losses, "ref_losses": ref}))
    world.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
