"""PyTorch on anychip's simulated Ascend (anychip.torch, docs/torch.md), each figure against
its peer in the same run:

    python benchmarks/bench_torch_provider.py [--parts ops,allreduce] [--repeat 3]

ops        time per eager op on anychip:0 (the CPU kernel between device-to-host and
           host-to-device copies, through the fallback) against the same op on torch's CPU;
allreduce  float32 all_reduce on 2 ranks, in place: torch.distributed on the ``anychip`` c10d
           backend against anychip's own collectives API on the same chip and library
           (``anychip launch``, native transport = the simulator's HCCL, both); busbw with
           nccl-tests' factor 2(n-1)/n (= 1 for 2 ranks). The best of --repeat rounds of each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from anychip._spawn import python_command

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_paddle_provider import _result  # noqa: E402  (rank 0's RESULT line, read the same way)

SIZES = [1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26]


def _best(fn, repeat: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def part_ops() -> None:
    import torch

    import anychip.torch as at
    print(f"\nops: one eager op, anychip:0 ({at.backend()}) against torch's CPU, us (best of 5)")
    print(f"{'op':<28}{'anychip':>12}{'cpu':>12}")
    for label, shape, fn in (("add, 1,024 elements", (1024,), lambda x: x + x),
                             ("relu, 1,024 elements", (1024,), torch.relu),
                             ("matmul 64 x 64", (64, 64), lambda x: x @ x),
                             ("matmul 512 x 512", (512, 512), lambda x: x @ x),
                             ("sum, 1M elements", (1 << 20,), torch.sum)):
        cpu = torch.randn(*shape)
        dev = cpu.to("anychip")
        n = 200 if cpu.numel() <= 4096 else 10
        t_dev = _best(lambda dev=dev, fn=fn: fn(dev), 5, n)
        t_cpu = _best(lambda cpu=cpu, fn=fn: fn(cpu), 5, n)
        print(f"{label:<28}{t_dev * 1e6:>12.1f}{t_cpu * 1e6:>12.1f}")


TORCH_AR = r"""
import json, sys, time, torch, torch.distributed as dist
import anychip.torch, anychip.torch.distributed
dist.init_process_group("anychip")
r = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
out = {}
for size in json.loads(sys.argv[1]):
    x = torch.full((size // 4,), float(r + 1), device=dev)
    iters = max(5, min(200, (1 << 26) // size))
    for _ in range(3):
        dist.all_reduce(x)
    anychip.torch.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        w = dist.all_reduce(x, async_op=True)
    w.wait()
    anychip.torch.synchronize()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out[size] = t.item()
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""

ANYCHIP_AR = r"""
import json, sys, time, numpy as np
from anychip import collectives
comm = collectives.init()
dev = comm.device
stream = dev.current_stream()
out = {}
for size in json.loads(sys.argv[1]):
    count = size // 4
    buf = dev.alloc(size).copy_from(np.full(count, comm.rank + 1, np.float32))
    iters = max(5, min(200, (1 << 26) // size))
    for _ in range(3):
        comm.all_reduce(buf, count=count).wait()
    comm.barrier().wait()
    t0 = time.perf_counter()
    for _ in range(iters):
        last = comm.all_reduce(buf, count=count)
    last.wait()
    stream.synchronize()
    out[size] = max(comm.exchange((time.perf_counter() - t0) / iters))
if comm.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
comm.destroy()
"""


def _job(script: Path, sizes: str) -> dict[int, float]:
    env = {**os.environ, "ANYCHIP_COLLECTIVE_TRANSPORT": "native", "ANYCHIP_TORCH": "ascend"}
    done = subprocess.run(python_command(["-m", "anychip", "launch", "-n", "2", "--device", "ascend", str(script),
                                          sizes]), env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{script.name} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return _result(done.stdout)


def part_allreduce(repeat: int) -> None:
    sizes = json.dumps(SIZES)
    best_t: dict[int, float] = {}
    best_a: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tscript, ascript = Path(tmp) / "torch_ar.py", Path(tmp) / "anychip_ar.py"
        tscript.write_text(TORCH_AR)
        ascript.write_text(ANYCHIP_AR)
        for _ in range(repeat):         # interleaved, so that both see the same machine
            for k, v in _job(tscript, sizes).items():
                best_t[k] = min(v, best_t.get(k, v))
            for k, v in _job(ascript, sizes).items():
                best_a[k] = min(v, best_a.get(k, v))
    print(f"\nallreduce: float32, in place, 2 ranks on the simulated Ascend (HCCL), best of {repeat}; busbw GB/s")
    print(f"{'size':>9}{'c10d us':>12}{'busbw':>8}{'anychip us':>12}{'busbw':>8}{'ratio':>8}")
    for s in SIZES:
        t, a = best_t[s], best_a[s]
        bt, ba = s / t / 1e9, s / a / 1e9
        print(f"{s:>9}{t * 1e6:>12.1f}{bt:>8.2f}{a * 1e6:>12.1f}{ba:>8.2f}{bt / ba:>8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="ops,allreduce")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the all_reduce jobs (the best is kept)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if "ops" in parts:
        part_ops()
    if "allreduce" in parts:
        part_allreduce(args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
