"""A training step of a nanoGPT-style model on anychip's simulated Ascend (anychip.torch,
docs/torch.md) against the same step on torch's CPU, in the same run:

    python benchmarks/bench_torch_step.py [--parts gpt,ddp] [--steps 30] [--profile]

gpt   one process: a model on anychip:0 and the same model on the CPU (same weights, same
      batches), stepped in turn (device step, CPU step; the next round the other first), with
      AdamW; the step time of each is the median over the rounds, "ratio" the median of the
      rounds' ratios (a drift of the machine's load between rounds cancels out), and the same for
      the process's CPU time per step (all its threads, the simulator's stream workers with them),
      which a loaded machine perturbs far less than the wall time. It checks that
      the two models' losses stay equal, and gives the chip's kernel-table launches per step and
      the ops that took the CPU fallback in one step (each pays a copy of its inputs to the host
      and of its outputs back, but where the device's memory is host memory, as on the simulated
      chips: there the CPU kernel reads its inputs and writes its out= arguments in place, and
      only a functional result is copied back). --profile adds torch.profiler's table of the
      device step's ops.
ddp   2 ranks (``anychip launch``): DistributedDataParallel over the ``anychip`` c10d backend on
      the device against DistributedDataParallel over Gloo on the CPU in the same job, stepped in
      turn the same way; the median of the rounds' ratios (the slower rank's step each round).

The machine's load (os.getloadavg) is printed with each part: the figures are for that load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_paddle_provider import _result  # noqa: E402  (rank 0's RESULT line, read the same way)

GPT = r'''
import math, torch, torch.nn as nn, torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """nanoGPT's shape: token and position embeddings, pre-norm blocks, the LM head tied to the
    token embedding."""

    def __init__(self, vocab=65, block=64, dim=64, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make(device, seed=0, lr=1e-3):
    torch.manual_seed(seed)
    model = GPT().to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def batches(n, batch=8, block=64, vocab=65, seed=1):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (n, batch, block + 1), generator=g)
    return [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    opt.step()
    return loss
'''


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def _gpt_module():
    import types
    mod = types.ModuleType("bench_gpt")
    exec(compile(GPT, "bench_gpt", "exec"), mod.__dict__)   # noqa: S102  (the model above)
    return mod


def fallback_ops(fn) -> dict[str, int]:
    """The ops that took the CPU fallback while fn ran, by name: those whose device inputs were
    copied to the host (aten::_to_cpu under them) in torch.profiler's record."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    counts: dict[str, int] = {}
    for e in events:
        if e.name == "aten::_to_cpu" and e.cpu_parent is not None:
            parent = e.cpu_parent
            while parent.cpu_parent is not None and parent.name in ("aten::to", "aten::_to_copy"):
                parent = parent.cpu_parent
            counts[parent.name] = counts.get(parent.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def part_gpt(steps: int, show_profile: bool) -> None:
    import torch

    import anychip.torch as at
    g = _gpt_module()
    data = g.batches(steps + 2)
    dev_model, dev_opt = g.make("anychip")
    cpu_model, cpu_opt = g.make("cpu")

    def dev_step(i):
        x, y = data[i]
        loss = g.step(dev_model, dev_opt, x.to("anychip"), y.to("anychip"))
        return loss.item()                     # (waits for the device: the step is done)

    def cpu_step(i):
        x, y = data[i]
        return g.step(cpu_model, cpu_opt, x, y).item()

    assert dev_step(0) == cpu_step(0)          # (the optimizer's state is made in the first step)
    print(f"\ngpt: nanoGPT-style (2 blocks, dim 64, 4 heads, 64 tokens x 8, AdamW), anychip:0 ({at.backend()}) "
          f"against torch's CPU ({torch.get_num_threads()} threads), {steps} rounds; {_load()}")
    dev, cpu, dev_used, cpu_used, equal = [], [], [], [], 0
    for i in range(1, steps + 1):
        order = (("dev", dev_step), ("cpu", cpu_step)) if i % 2 else (("cpu", cpu_step), ("dev", dev_step))
        losses, times, used = {}, {}, {}
        for name, fn in order:
            t0, c0 = time.perf_counter(), time.process_time()
            losses[name] = fn(i)
            times[name], used[name] = time.perf_counter() - t0, time.process_time() - c0
        dev.append(times["dev"])
        cpu.append(times["cpu"])
        dev_used.append(used["dev"])
        cpu_used.append(used["cpu"])
        equal += losses["dev"] == losses["cpu"]
    ratio = statistics.median(d / c for d, c in zip(dev, cpu, strict=True))
    used_ratio = statistics.median(d / c for d, c in zip(dev_used, cpu_used, strict=True))
    before = at._C.kernel_launches()[0]
    fell = fallback_ops(lambda: dev_step(steps + 1))
    per = at._C.kernel_launches()[0] - before
    print(f"  step, ms: anychip {statistics.median(dev) * 1e3:.2f}, cpu {statistics.median(cpu) * 1e3:.2f}; "
          f"ratio {ratio:.2f} (paired median; range {min(d / c for d, c in zip(dev, cpu, strict=True)):.2f}-"
          f"{max(d / c for d, c in zip(dev, cpu, strict=True)):.2f}); losses equal in {equal} of {steps} steps")
    print(f"  CPU time of the process per step, ms (every thread: the simulator's too): anychip "
          f"{statistics.median(dev_used) * 1e3:.2f}, cpu {statistics.median(cpu_used) * 1e3:.2f}; "
          f"ratio {used_ratio:.2f} (paired median)")
    print(f"  kernel-table launches per step: {per}; ops through the CPU fallback per step: {sum(fell.values())}")
    print("  " + ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in fell.items()))
    if show_profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            dev_step(steps + 1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


DDP = r'''
import json, statistics, sys, time, torch, torch.distributed as dist
import anychip.torch, anychip.torch.distributed
from torch.nn.parallel import DistributedDataParallel as DDP
exec(sys.argv[2])
steps = int(sys.argv[1])
dist.init_process_group("anychip")
gloo = dist.new_group(backend="gloo")
r = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
data = batches(steps + 1, seed=1 + r)
models = {}
for name, device, group in (("anychip", dev, None), ("gloo", "cpu", gloo)):
    model, opt = make(device)
    models[name] = (DDP(model, process_group=group), opt, device)

def run(name, i):
    model, opt, device = models[name]
    x, y = data[i]
    return step(model, opt, x.to(device), y.to(device)).item()

assert run("anychip", 0) == run("gloo", 0)
times = {"anychip": [], "gloo": []}
equal = 0
for i in range(1, steps + 1):
    order = ("anychip", "gloo") if i % 2 else ("gloo", "anychip")
    losses = {}
    for name in order:
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        losses[name] = run(name, i)
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        times[name].append(t.item())
    equal += losses["anychip"] == losses["gloo"]
if r == 0:
    print("RESULT " + json.dumps({"times": times, "equal": equal}), flush=True)
dist.destroy_process_group()
'''


def part_ddp(steps: int) -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp_step.py"
        script.write_text(DDP)
        env = {**os.environ, "ANYCHIP_TORCH": "ascend"}
        load = _load()
        done = subprocess.run([sys.executable, "-m", "anychip", "launch", "-n", "2", "--device", "ascend", str(script),
                               str(steps), GPT], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"ddp failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    res: dict[Any, Any] = _result(done.stdout)
    dev, gloo = res["times"]["anychip"], res["times"]["gloo"]
    ratios = [d / c for d, c in zip(dev, gloo, strict=True)]
    print(f"\nddp: the same model, DistributedDataParallel on 2 ranks: anychip backend on the device against Gloo on "
          f"the CPU, {steps} rounds; {load} (at the start)")
    print(f"  step, ms: anychip {statistics.median(dev) * 1e3:.2f}, gloo {statistics.median(gloo) * 1e3:.2f}; "
          f"ratio {statistics.median(ratios):.2f} (paired median; range {min(ratios):.2f}-{max(ratios):.2f}); "
          f"losses equal in {res['equal']} of {steps} steps (rank 0)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="gpt,ddp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="torch.profiler's table of one device step")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if "gpt" in parts:
        part_gpt(args.steps, args.profile)
    if "ddp" in parts:
        part_ddp(args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
