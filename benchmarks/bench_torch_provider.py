"""PyTorch on anychip's simulated Ascend (anychip.torch, docs/torch.md), each figure against
its peer in the same run:

    python benchmarks/bench_torch_provider.py [--parts ops,inplace,allreduce] [--repeat 3]

ops        time per eager op on anychip:0 (add on the chip's own kernel; the others: the CPU
           kernel between device-to-host and host-to-device copies, through the fallback)
           against the same op on torch's CPU;
inplace    in-place and out= ops, a tensor's allocation and one optimizer step (AdamW, SGD with
           momentum; foreach and not) on anychip:0 against torch's CPU, with the chip's kernel
           launches per step;
allreduce  float32 all_reduce on 2 ranks, in place: torch.distributed on the ``anychip`` c10d
           backend against anychip's own collectives API on the same chip and library
           (``anychip launch``, native transport = the simulator's HCCL, both); busbw with
           nccl-tests' factor 2(n-1)/n (= 1 for 2 ranks). In each of --repeat jobs both run
           --rounds times, interleaved (the best of each counts); "comm": a second group of
           the same process group with ANYCHIP_TORCH_C10D_DIRECT=0 (every op through
           anychip's communicator, not the C++ path), in the same job; a plain anychip job (no
           torch) runs beside; --before FILE also runs another build's process group (its
           src/anychip/torch/distributed.py) in the same jobs, for before / after figures.
           "paired": the median, over every round of every job, of the ratio of the API's
           time to the process group's in the same round (a drift of the load between
           rounds cancels out). "cpu": the issuing thread's CPU time per op
           (time.thread_time, best round, the slower rank); where every core is busy (each
           rank's stream workers spin for their next op) that is what the process group
           adds to the op, and it is far steadier under load than the wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_paddle_provider import _result  # noqa: E402  (rank 0's RESULT line, read the same way)

SIZES = [1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26]


def _best(fn, repeat: int, number: int, sync=lambda: None) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()                  # (the device's kernels are asynchronous: their completion counts)
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def part_ops() -> None:
    import torch

    import anychip.torch as at
    print(f"\nops: one eager op, anychip:0 ({at.backend()}; add on the chip's kernel, the others through the CPU "
          "fallback) against torch's CPU, us (best of 5, until the device is done)")
    print(f"{'op':<28}{'anychip':>12}{'cpu':>12}")
    for label, shape, fn in (("add, 1,024 elements", (1024,), lambda x: x + x),
                             ("relu, 1,024 elements", (1024,), torch.relu),
                             ("matmul 64 x 64", (64, 64), lambda x: x @ x),
                             ("matmul 512 x 512", (512, 512), lambda x: x @ x),
                             ("sum, 1M elements", (1 << 20,), torch.sum)):
        cpu = torch.randn(*shape)
        dev = cpu.to("anychip")
        n = 200 if cpu.numel() <= 4096 else 10
        t_dev = _best(lambda dev=dev, fn=fn: fn(dev), 5, n, at.synchronize)
        t_cpu = _best(lambda cpu=cpu, fn=fn: fn(cpu), 5, n)
        print(f"{label:<28}{t_dev * 1e6:>12.1f}{t_cpu * 1e6:>12.1f}")


def part_inplace() -> None:
    import torch

    import anychip.torch as at
    launches = lambda: at._C.kernel_launches()[0]       # noqa: E731
    print(f"\ninplace: anychip:0 ({at.backend()}) against torch's CPU, us (best of 5, until the device is done)")
    print(f"{'op':<34}{'anychip':>12}{'cpu':>12}{'launches':>10}")
    for label, fn in (("a + b, 1,024 elements", lambda a, b: a + b),
                      ("a.add_(b)", lambda a, b: a.add_(b)),
                      ("a.mul_(0.9)", lambda a, b: a.mul_(0.9)),
                      ("torch.add(a, b, out=a)", lambda a, b: torch.add(a, b, out=a)),
                      ("a.add_(b, alpha=0.1)", lambda a, b: a.add_(b, alpha=0.1)),
                      ("a.addcmul_(b, b, value=0.1)", lambda a, b: a.addcmul_(b, b, value=0.1)),
                      ("torch.empty(1024)", lambda a, b: torch.empty(1024, device=a.device))):
        cpu_a, cpu_b = torch.rand(1024), torch.rand(1024)
        dev_a, dev_b = cpu_a.to("anychip"), cpu_b.to("anychip")
        before = launches()
        fn(dev_a, dev_b)
        at.synchronize()
        per = launches() - before
        t_dev = _best(lambda fn=fn, a=dev_a, b=dev_b: fn(a, b), 5, 200, at.synchronize)
        t_cpu = _best(lambda fn=fn, a=cpu_a, b=cpu_b: fn(a, b), 5, 200)
        print(f"{label:<34}{t_dev * 1e6:>12.1f}{t_cpu * 1e6:>12.1f}{per:>10}")
    print(f"\n{'optimizer step (MLP 256-256-10)':<34}{'anychip':>12}{'cpu':>12}{'ratio':>8}{'launches':>10}"
          "\n(medians of 30 rounds, each a device step then a CPU step; ratio: the median of the rounds' ratios)")
    for label, make in (("AdamW, foreach", lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True)),
                        ("AdamW, for loop", lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False)),
                        ("SGD momentum, foreach", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True)),
                        ("SGD momentum, for loop", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9,
                                                                             foreach=False))):
        opts = {}
        for device in ("anychip", "cpu"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
            model.to(device)
            for p in model.parameters():
                p.grad = torch.rand_like(p)
            opts[device] = make(model.parameters())
            opts[device].step()                     # (the state is made in the first step)
        at.synchronize()
        before = launches()
        opts["anychip"].step()
        at.synchronize()
        per = launches() - before
        dev, cpu = [], []
        for _ in range(30):
            t0 = time.perf_counter()
            opts["anychip"].step()
            at.synchronize()
            t1 = time.perf_counter()
            opts["cpu"].step()
            t2 = time.perf_counter()
            dev.append(t1 - t0)
            cpu.append(t2 - t1)
        ratio = statistics.median(d / c for d, c in zip(dev, cpu, strict=True))
        print(f"{label:<34}{statistics.median(dev) * 1e6:>12.1f}{statistics.median(cpu) * 1e6:>12.1f}"
              f"{ratio:>8.1f}{per:>10}")


TORCH_AR = r"""
import json, os, sys, time, numpy as np, torch, torch.distributed as dist
import anychip.torch, anychip.torch.distributed
from anychip import collectives
dist.init_process_group("anychip")
comm = collectives.init()          # anychip's own API in the same job: its own communicator, same chip and library
groups = [None]
os.environ["ANYCHIP_TORCH_C10D_DIRECT"] = "0"     # a second group of this build: every op through the communicator
groups.append(dist.new_group(backend="anychip"))
del os.environ["ANYCHIP_TORCH_C10D_DIRECT"]
if len(sys.argv) > 3:              # another build's process group (--before), registered under another name
    import importlib.util
    spec = importlib.util.spec_from_file_location("anychip.torch._before", sys.argv[3])
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    groups.append(dist.new_group(backend="anychip_before"))
r = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
stream = anychip.torch.anychip_stream()
rounds = int(sys.argv[2])
out = {}
for size in json.loads(sys.argv[1]):
    count = size // 4
    x = torch.full((count,), float(r + 1), device=dev)
    buf = comm.device.alloc(size).copy_from(np.full(count, r + 1, np.float32))
    iters = max(20, min(200, (1 << 28) // size))

    def c10d(group=None):
        for _ in range(iters):
            w = dist.all_reduce(x, group=group, async_op=True)
        w.wait()

    def api():
        for _ in range(iters):
            w = comm.all_reduce(buf, count=count, stream=stream)
        w.wait()

    fns = [c10d, api] + [lambda g=g: c10d(g) for g in groups[1:]]
    best = [float("inf")] * len(fns)
    cpu = [float("inf")] * len(fns)    # the issuing thread's CPU time per op (the slower rank's)
    seen = []                          # each round's times, for the paired ratios
    for k in range(rounds):            # interleaved, in turn first: all see the same machine
        seen.append([0.0] * len(fns))
        for i in range(k % len(fns), k % len(fns) + len(fns)):
            i %= len(fns)
            fn = fns[i]
            fn()
            anychip.torch.synchronize()
            comm.barrier().wait()
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            anychip.torch.synchronize()
            wall, used = zip(*comm.exchange(((time.perf_counter() - t0) / iters, (time.thread_time() - c0) / iters)))
            best[i] = min(best[i], max(wall))
            cpu[i] = min(cpu[i], max(used))
            seen[-1][i] = max(wall)
    out[size] = {"wall": best, "cpu": cpu, "rounds": seen}
if r == 0:
    print("RESULT " + json.dumps(out), flush=True)
comm.destroy()
dist.destroy_process_group()
"""

ANYCHIP_AR = r"""
import json, sys, time, numpy as np
from anychip import collectives
comm = collectives.init()
dev = comm.device
stream = dev.current_stream()
rounds = int(sys.argv[2])
out = {}
for size in json.loads(sys.argv[1]):
    count = size // 4
    buf = dev.alloc(size).copy_from(np.full(count, comm.rank + 1, np.float32))
    iters = max(20, min(200, (1 << 28) // size))
    best = cpu = float("inf")
    for _ in range(rounds):
        for _ in range(iters):
            comm.all_reduce(buf, count=count)
        stream.synchronize()
        comm.barrier().wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            last = comm.all_reduce(buf, count=count)
        last.wait()
        stream.synchronize()
        wall, used = zip(*comm.exchange(((time.perf_counter() - t0) / iters, (time.thread_time() - c0) / iters)))
        best, cpu = min(best, max(wall)), min(cpu, max(used))
    out[size] = {"wall": [best], "cpu": [cpu]}
if comm.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
comm.destroy()
"""


def _job(script: Path, sizes: str, rounds: int, *extra: str) -> dict[int, dict[str, Any]]:
    env = {**os.environ, "ANYCHIP_COLLECTIVE_TRANSPORT": "native", "ANYCHIP_TORCH": "ascend"}
    done = subprocess.run([sys.executable, "-m", "anychip", "launch", "-n", "2", "--device", "ascend", str(script),
                                          sizes, str(rounds), *extra], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{script.name} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return _result(done.stdout)  # type: ignore[return-value]  # (seconds per op here)


def part_allreduce(repeat: int, rounds: int, before: str | None) -> None:
    """c10d against anychip's API in the same job and in a plain one; with ``before`` (the
    distributed.py of another build) that build's process group runs in the same job too."""
    sizes = json.dumps(SIZES)
    extra: list[str] = []
    runs: list[tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]]] = []
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tscript, ascript = Path(tmp) / "torch_ar.py", Path(tmp) / "anychip_ar.py"
        tscript.write_text(TORCH_AR)
        ascript.write_text(ANYCHIP_AR)
        if before is not None:
            old = Path(tmp) / "before.py"
            source = Path(before).read_text()
            old.write_text(source.replace("register_backend(BACKEND,", 'register_backend("anychip_before",'))
            extra.append(str(old))
        for _ in range(repeat):         # the jobs interleaved too
            runs.append((_job(tscript, sizes, rounds, *extra), _job(ascript, sizes, rounds)))
    print(f"\nallreduce: float32, in place, 2 ranks on the simulated Ascend (HCCL); busbw GB/s. c10d and anychip's API "
          f"in the same job, {rounds} rounds interleaved, best of each; a plain anychip job (no torch) after it; "
          f"{repeat} jobs: the best, and the range of the jobs' ratios; paired: the median over all rounds of the "
          f"ratio of the two in the same round; cpu: the issuing thread's CPU time per op (best round). Load "
          f"average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'size':>9}{'c10d us':>10}{'busbw':>7}{'api us':>10}{'busbw':>7}{'ratio':>7}{'range':>12}"
          f"{'plain us':>10}{'ratio':>7}{'range':>12}{'paired':>8}{'c10d cpu':>10}{'api cpu':>9}"
          f"{'comm us':>9}{'ratio':>7}{'paired':>8}{'cpu':>7}")

    def best(j: int, s: int, i: int, what: str = "wall") -> float:
        return min(r[j][s][what][i] for r in runs)

    def paired(s: int, i: int) -> float:
        """The median over every job's rounds of API time / method i's time in the same round."""
        return statistics.median(rnd[1] / rnd[i] for r in runs for rnd in r[0][s]["rounds"])

    for s in SIZES:
        t, a, p = best(0, s, 0), best(0, s, 1), best(1, s, 0)
        same = [r[0][s]["wall"][1] / r[0][s]["wall"][0] for r in runs]
        plain = [r[1][s]["wall"][0] / r[0][s]["wall"][0] for r in runs]
        print(f"{s:>9}{t * 1e6:>10.1f}{s / t / 1e9:>7.2f}{a * 1e6:>10.1f}{s / a / 1e9:>7.2f}{a / t:>7.2f}"
              f"{f'{min(same):.2f}-{max(same):.2f}':>12}{p * 1e6:>10.1f}{p / t:>7.2f}"
              f"{f'{min(plain):.2f}-{max(plain):.2f}':>12}{paired(s, 0):>8.2f}{best(0, s, 0, 'cpu') * 1e6:>10.1f}"
              f"{best(0, s, 1, 'cpu') * 1e6:>9.1f}{best(0, s, 2) * 1e6:>9.1f}{a / best(0, s, 2):>7.2f}"
              f"{paired(s, 2):>8.2f}{best(0, s, 2, 'cpu') * 1e6:>7.1f}")
    if before is not None:
        print(f"\nthe same jobs, the process group of {before} (before) against this one, busbw ratio to the API "
              "in the same job")
        print(f"{'size':>9}{'before us':>11}{'ratio':>7}{'range':>12}{'paired':>8}{'cpu':>7}{'now us':>10}"
              f"{'ratio':>7}{'range':>12}{'paired':>8}{'cpu':>7}")
        for s in SIZES:
            b, t, a = best(0, s, 3), best(0, s, 0), best(0, s, 1)
            rb = [r[0][s]["wall"][1] / r[0][s]["wall"][3] for r in runs]
            rt = [r[0][s]["wall"][1] / r[0][s]["wall"][0] for r in runs]
            print(f"{s:>9}{b * 1e6:>11.1f}{a / b:>7.2f}{f'{min(rb):.2f}-{max(rb):.2f}':>12}{paired(s, 3):>8.2f}"
                  f"{best(0, s, 3, 'cpu') * 1e6:>7.1f}{t * 1e6:>10.1f}{a / t:>7.2f}"
                  f"{f'{min(rt):.2f}-{max(rt):.2f}':>12}{paired(s, 0):>8.2f}{best(0, s, 0, 'cpu') * 1e6:>7.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="ops,inplace,allreduce")
    ap.add_argument("--repeat", type=int, default=3, help="all_reduce jobs of each kind")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of each method in one job")
    ap.add_argument("--before", help="src/anychip/torch/distributed.py of another build, measured in the same jobs")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if "ops" in parts:
        part_ops()
    if "inplace" in parts:
        part_inplace()
    if "allreduce" in parts:
        part_allreduce(args.repeat, args.rounds, args.before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
