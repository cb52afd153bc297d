"""Collective benchmark: anychip against MPI (mpi4py) and, when torch is installed, Gloo.

    python benchmarks/bench_collectives.py [--ops all_reduce,all_gather,broadcast]
                                           [--min 8] [--max 64M] [--factor 8] [--json out.json]

Two ranks, float32; all_reduce and all_gather out of place, broadcast in place (as MPI_Bcast).
Contenders, all in one run:
  anychip zero-copy  simulated hygon chips (device memory mapped by the peer)
  anychip staged     cpu (host memory through the engine's shared slots)
  mpich              mpi4py on the `mpich` wheel (`mpiexec -n 2`), when installed
  gloo               torch.distributed with Gloo, when torch is installed
and the machine's ceilings from shm_ceiling.c (compiled with cc when available).

Time per op as nccl-tests measures it: after warm-up, `iters` ops back to back, the total
divided by iters, slowest rank. algbw = size / time; busbw = algbw x factor: all_reduce
2(n-1)/n, all_gather (n-1)/n (size = the gathered total), broadcast 1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NRANKS = 2
BUS = {"all_reduce": 2 * (NRANKS - 1) / NRANKS, "all_gather": (NRANKS - 1) / NRANKS, "broadcast": 1.0}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def iters_for(nbytes: int) -> int:
    return max(5, min(2000, (256 << 20) // max(nbytes, 1) // 4))


# -- workers (one per rank) -------------------------------------------------------------------

def _time(call, it: int, sync) -> float:
    """Seconds per op: warm-up, then `it` ops back to back, synchronized at the end."""
    for _ in range(min(it, 10)):
        call()
    sync()
    t = time.perf_counter()
    for _ in range(it):
        call()
    sync()
    return (time.perf_counter() - t) / it


def worker_anychip(ops: list[str], szs: list[int]) -> None:
    import functools

    import numpy as np

    from anychip import collectives
    comm = collectives.init()
    dev = comm.device
    stream = dev.current_stream()
    state: dict = {}

    def sync() -> None:
        w = state.get("w")
        if w is not None:
            w.wait()
        stream.synchronize()
        comm.barrier().wait()

    def run(fn, *args, **kw) -> None:
        state["w"] = fn(*args, **kw)

    for op in ops:
        for size in szs:
            n = max(size // 4, 1)
            per = max(n // NRANKS, 1) if op == "all_gather" else n
            send = dev.alloc(per * 4).copy_from(np.ones(per, dtype=np.float32))
            recv = dev.alloc(per * 4 * (NRANKS if op == "all_gather" else 1))
            call = {"all_reduce": functools.partial(run, comm.all_reduce, send, recv, count=n),
                    "all_gather": functools.partial(run, comm.all_gather, send, recv, count=per),
                    "broadcast": functools.partial(run, comm.broadcast, send, count=n, root=0)}[op]
            slow = max(comm.exchange(_time(call, iters_for(size), sync)))
            if comm.rank == 0:
                print("BENCH " + json.dumps({"op": op, "size": size, "time": slow}), flush=True)
    comm.destroy()


def worker_mpi(ops: list[str], szs: list[int]) -> None:
    import functools

    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    for op in ops:
        for size in szs:
            n = max(size // 4, 1)
            per = max(n // NRANKS, 1) if op == "all_gather" else n
            send = np.ones(per, dtype=np.float32)
            recv = np.empty(per * (NRANKS if op == "all_gather" else 1), dtype=np.float32)
            call = {"all_reduce": functools.partial(comm.Allreduce, send, recv, op=MPI.SUM),
                    "all_gather": functools.partial(comm.Allgather, send, recv),
                    "broadcast": functools.partial(comm.Bcast, send, root=0)}[op]
            slow = comm.allreduce(_time(call, iters_for(size), comm.Barrier), op=MPI.MAX)
            if comm.rank == 0:
                print("BENCH " + json.dumps({"op": op, "size": size, "time": slow}), flush=True)


def worker_gloo(ops: list[str], szs: list[int]) -> None:
    import functools

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    for op in ops:
        for size in szs:
            n = max(size // 4, 1)
            per = max(n // NRANKS, 1) if op == "all_gather" else n
            x = torch.ones(per)
            outs = [torch.empty(per) for _ in range(NRANKS)]
            call = {"all_reduce": functools.partial(dist.all_reduce, x),
                    "all_gather": functools.partial(dist.all_gather, outs, x),
                    "broadcast": functools.partial(dist.broadcast, x, 0)}[op]
            dt = torch.tensor([_time(call, iters_for(size), dist.barrier)])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if dist.get_rank() == 0:
                print("BENCH " + json.dumps({"op": op, "size": size, "time": float(dt)}), flush=True)
    dist.destroy_process_group()


# -- driver ---------------------------------------------------------------------------------------

def collect(cmd: list[str], env: dict | None = None, timeout: float = 1800) -> dict[tuple[str, int], float]:
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    if p.returncode != 0:
        print(f"  ({' '.join(cmd[:4])} ... failed: {p.stderr.strip()[-400:]})", file=sys.stderr)
        return {}
    out = {}
    for line in p.stdout.splitlines():
        if "BENCH " in line:
            rec = json.loads(line.split("BENCH ", 1)[1])
            out[(rec["op"], rec["size"])] = rec["time"]
    return out


def ceilings(mib: int = 64) -> dict[str, float]:
    """busbw (GB/s) of shm_ceiling.c's zero-copy and staged 2-rank all_reduce."""
    src = os.path.join(HERE, "shm_ceiling.c")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not (cc and os.path.exists(src)):
        return {}
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "shm_ceiling")
        if subprocess.run([cc, "-O3", "-march=native", "-o", exe, src]).returncode:
            return {}
        text = subprocess.run([exe, str(mib), "10"], capture_output=True, text=True).stdout
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("zero-copy", "staged") and "busbw" in parts:
            out[parts[0]] = float(parts[parts.index("busbw") + 1])
    return out


def fmt_size(n: int) -> str:
    for unit, f in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def contenders(me: list[str]) -> dict[str, list[str]]:
    """name -> the command that runs its two ranks (MPICH and Gloo when installed)."""
    launch = [sys.executable, "-m", "anychip.cli", "launch", "-n", str(NRANKS)]
    out = {"zero-copy": [*launch, "--device", "hygon", *me, "--worker", "anychip"],
           "staged": [*launch, "--device", "cpu", *me, "--worker", "anychip"]}
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
        if mpiexec is not None:
            out["mpich"] = [mpiexec, "-n", str(NRANKS), sys.executable, *me, "--worker", "mpi"]
    except ImportError:
        pass
    try:
        import torch  # noqa: F401
        out["gloo"] = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={NRANKS}", *me,
                       "--worker", "gloo"]
    except ImportError:
        pass
    return out


def measure(cmds: dict[str, list[str]], repeat: int) -> tuple[dict[str, dict], dict[str, float]]:
    """Rounds alternate the contenders; the best time of each (op, size) and the best ceilings
    are kept, since a shared machine only ever makes a run slower."""
    results: dict[str, dict] = {name: {} for name in cmds}
    ceil: dict[str, float] = {}
    for rnd in range(repeat):
        for name, cmd in cmds.items():
            print(f"round {rnd + 1}/{repeat}: {name} ...", file=sys.stderr)
            for key, t in collect(cmd).items():
                results[name][key] = min(t, results[name].get(key, t))
        for k, v in ceilings().items():
            ceil[k] = max(v, ceil.get(k, 0.0))
    return results, ceil


def table(op: str, szs: list[int], results: dict[str, dict], ceil: dict[str, float]) -> None:
    names = [k for k, v in results.items() if v]
    peers = [n for n in names if n not in ("zero-copy", "staged")]
    print(f"\n{op}")
    head = f"{'size':>6} " + "".join(f"{n + ' us':>14}{'busbw':>8}" for n in names)
    print(head + "".join(f"{'zc/' + p:>10}{'st/' + p:>10}" for p in peers))
    bw: dict[str, float] = {}
    for s in szs:
        row = f"{fmt_size(s):>6} "
        bw = {}
        for n in names:
            t = results[n].get((op, s))
            if t is None:
                row += f"{'-':>14}{'-':>8}"
                continue
            bw[n] = s / t / 1e9 * BUS[op]
            row += f"{t * 1e6:>14.1f}{bw[n]:>8.2f}"
        for p in peers:
            for a in ("zero-copy", "staged"):
                row += f"{bw[a] / bw[p]:>10.2f}" if a in bw and p in bw else f"{'-':>10}"
        print(row)
    if op == "all_reduce" and szs[-1] >= 64 << 20:      # the ceilings are for 64 MiB
        for a in ("zero-copy", "staged"):
            if a in bw and a in ceil:
                print(f"  {a} at {fmt_size(szs[-1])}: {bw[a]:.2f} GB/s = {bw[a] / ceil[a]:.0%} of the {a} ceiling")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="rounds over all contenders (best time is kept)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", choices=("anychip", "mpi", "gloo"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    ops = args.ops.split(",")
    szs = sizes(parse_size(args.min), parse_size(args.max), args.factor)
    if args.worker:
        {"anychip": worker_anychip, "mpi": worker_mpi, "gloo": worker_gloo}[args.worker](ops, szs)
        return 0
    me = [os.path.abspath(__file__), "--ops", args.ops, "--min", args.min, "--max", args.max,
          "--factor", str(args.factor)]
    results, ceil = measure(contenders(me), args.repeat)
    print(f"\n{NRANKS} ranks, float32 (broadcast in place, the others out of place); time in us, busbw in "
          "GB/s (nccl-tests factors); ratio = anychip / peer busbw")
    if ceil:
        print(f"ceilings (shm_ceiling.c, 64 MiB all_reduce busbw): zero-copy {ceil.get('zero-copy', 0):.2f} GB/s, "
              f"staged {ceil.get('staged', 0):.2f} GB/s")
    for op in ops:
        table(op, szs, results, ceil)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "results": {n: {f"{o}:{s}": t for (o, s), t in r.items()}
                                                     for n, r in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
