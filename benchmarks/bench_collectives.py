#!/usr/bin/env python3
"""Collective bandwidth and latency: anychip next to MPI (mpi4py) and Gloo, in one run.

    python benchmarks/bench_collectives.py [-b 8] [-e 64M] [-f 8] [--ops all_reduce,all_gather,broadcast]
                                           [--rounds 3] [--torch-python PATH] [--no-hier] [--json FILE]

Two ranks, float32, sizes from ``-b`` to ``-e`` (times ``-f`` each step, plus 256 KiB
and 2 MiB, the goal's range). Contenders, each a separate 2-process job:

* ``zero-copy``: anychip on a simulated chip (ascend), the shared-memory engine reducing
  straight from the peer's device memory;
* ``staged``: anychip on cpu, the shared-memory engine through its staging slots;
* ``any-mpi``: anychip on cpu with ``ANYCHIP_HOST_TRANSPORT=mpi`` (anychip's MPI transport);
* ``mpich``: mpi4py on the mpich wheel, NumPy buffers (Allreduce / Allgather / Bcast);
* ``gloo``: torch.distributed with Gloo, when torch imports in ``--torch-python``
  (default: this interpreter).

Time per op as nccl-tests measures it: after a warm-up, ``iters`` ops back to back (on
the stream, for anychip), synchronized at the end; the slowest rank's time / iters.
The driver runs ``--rounds`` rounds, each launching every contender once in turn, and
keeps each cell's best (a shared machine only ever makes a run slower). Sizes as
nccl-tests: all_gather's size is the gathered total; algbw = size / time; busbw = algbw
x 2(n-1)/n (all_reduce), (n-1)/n (all_gather), 1 (broadcast). Ratios are anychip busbw /
the peer's.

The ceilings come from ``collective_ceiling.c`` (compiled and run here, best of the
rounds): the fastest 2-process all_reduce of the largest size through shared memory,
zero-copy and staged (the staged ceiling is the better of whole-message copies and
256 KiB rounds that stay in cache).
With ``--hier`` (default on), also 4 ranks as 2 hosts x 2 (``ANYCHIP_HOSTID``: the
hierarchical transport) against flat MPICH with 4 ranks, all_reduce only.

Goals (all_reduce): 8 B latency <= 1.5x MPICH's; 256 KiB - 2 MiB busbw >= MPICH's;
largest size zero-copy >= 70% of the zero-copy ceiling; staged >= 70% of the staged
ceiling and >= MPICH; faster than Gloo at every size. Reported, not enforced.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from anychip._spawn import python_command

HERE = Path(__file__).resolve().parent
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
ANYCHIP_KINDS = {"zero-copy": "ascend", "staged": "cpu", "any-mpi": "cpu", "hier": "cpu"}


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)


def human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def iterations(size: int) -> int:
    return max(5, min(2000, (1 << 27) // max(size, 1)))


# ------------------------------------------------------------------ workers (one per rank)

def _timed(run: Any, start: Any, sync: Any, iters: int) -> float:
    """Seconds per op on this rank: warm-up, then ``iters`` ops back to back."""
    for _ in range(min(iters, 10)):
        run()
    sync()
    start()
    t = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    return (time.perf_counter() - t) / iters


def worker_anychip(args: argparse.Namespace) -> tuple[int, dict]:
    from anychip import collectives
    comm = collectives.init()           # the launcher's device: <backend>:<local rank>
    n, dev = comm.size, comm.device
    stream = dev.current_stream()
    last: list = [None]

    def sync() -> None:
        if last[0] is not None:
            last[0].wait()
        stream.synchronize()

    out: dict = {"transport": comm.transport.name}
    for op in args.ops:
        for size in args.sizes:
            count = size // 4 // (n if op == "all_gather" else 1)
            send = dev.alloc(count * 4).copy_from(np.full(count, comm.rank + 1, np.float32))
            recv = dev.alloc(count * 4 * (n if op == "all_gather" else 1))
            fn = {"all_reduce": comm.all_reduce, "all_gather": comm.all_gather,
                  "broadcast": lambda s, r, c: comm.broadcast(s, r, c, root=0)}[op]

            def run(fn: Any = fn, send: Any = send, recv: Any = recv, count: int = count) -> None:
                last[0] = fn(send, recv, count)
            t = _timed(run, lambda: comm.barrier().wait(), sync, iterations(size))
            out[f"{op}/{size}"] = max(comm.exchange(t))
            _verify(op, recv.to_numpy(np.float32), n, count)
    comm.destroy()
    return comm.rank, out


def worker_mpich(args: argparse.Namespace) -> tuple[int, dict]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n = comm.size
    out: dict = {"transport": MPI.Get_library_version().splitlines()[0].strip()}
    for op in args.ops:
        for size in args.sizes:
            count = size // 4 // (n if op == "all_gather" else 1)
            send = np.full(count, comm.rank + 1, np.float32)
            recv = np.zeros(count * (n if op == "all_gather" else 1), np.float32)
            if op == "broadcast":        # MPI_Bcast is in place: the root's recv holds the data
                recv[:] = send
            run = {"all_reduce": lambda s=send, r=recv: comm.Allreduce(s, r, MPI.SUM),
                   "all_gather": lambda s=send, r=recv: comm.Allgather(s, r),
                   "broadcast": lambda r=recv: comm.Bcast(r, 0)}[op]
            t = _timed(run, comm.Barrier, lambda: None, iterations(size))
            out[f"{op}/{size}"] = comm.allreduce(t, op=MPI.MAX)
            _verify(op, recv, n, count)
    return comm.rank, out


def worker_gloo(args: argparse.Namespace) -> tuple[int, dict]:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {"transport": f"torch {torch.__version__} gloo"}
    for op in args.ops:
        for size in args.sizes:
            count = size // 4 // (n if op == "all_gather" else 1)
            send = torch.full((count,), float(rank + 1), dtype=torch.float32)
            recv = torch.zeros(count * (n if op == "all_gather" else 1), dtype=torch.float32)
            if op != "all_gather":       # Gloo's all_reduce and broadcast work in place
                recv.copy_(send)
            run = {"all_reduce": lambda r=recv: dist.all_reduce(r),
                   "all_gather": lambda s=send, r=recv: dist.all_gather_into_tensor(r, s),
                   "broadcast": lambda r=recv: dist.broadcast(r, 0)}[op]
            t = torch.tensor([_timed(run, dist.barrier, lambda: None, iterations(size))])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[f"{op}/{size}"] = float(t)
            if op == "all_reduce":       # repeated in place: the last value is not checkable
                recv.copy_(send)
                dist.all_reduce(recv)
            _verify(op, recv.numpy(), n, count)
    dist.destroy_process_group()
    return rank, out


def _verify(op: str, recv: np.ndarray, n: int, count: int) -> None:
    if op == "all_reduce":
        want = np.full(count, n * (n + 1) / 2, np.float32)
    elif op == "all_gather":
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
    else:
        want = np.full(count, 1, np.float32)
    if not np.array_equal(recv[:want.size], want):
        raise SystemExit(f"{op} of {count} floats gave a wrong result")


def worker_main(args: argparse.Namespace) -> None:
    fn = {"mpich": worker_mpich, "gloo": worker_gloo}.get(args.worker, worker_anychip)
    rank, out = fn(args)
    if rank == 0:
        print("BENCH " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ launching the jobs

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "MPI_", "ANYCHIP_RANK", "ANYCHIP_LOCAL", "ANYCHIP_WORLD",
                                "ANYCHIP_JOB", "ANYCHIP_HOST", "ANYCHIP_LAUNCH"))}
    env.update(ANYCHIP_SIMULATE="always", **extra)
    return env


def _worker_args(kind: str, args: argparse.Namespace) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", kind, "--ops", ",".join(args.ops),
            "--sizes", ",".join(map(str, args.sizes))]


def mpiexec() -> str | None:
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def run_job(kind: str, args: argparse.Namespace, nranks: int = 2) -> dict | str:
    """Run contender ``kind`` as its own job; its results, or why it did not run."""
    py = [sys.executable]
    if kind in ("mpich", "any-mpi", "hier"):
        exe = mpiexec()
        if exe is None:
            return "mpiexec not found (pip install anychip[mpi])"
        env = _clean_env(ANYCHIP_HOST_TRANSPORT="mpi" if kind == "any-mpi" else "auto",
                         ANYCHIP_LAUNCH_DEVICE=ANYCHIP_KINDS.get(kind, "cpu"))
        if kind == "hier":
            half = nranks // 2
            cmd = [exe, "-n", str(half), "-env", "ANYCHIP_HOSTID", "a", *py, *_worker_args(kind, args), ":",
                   "-n", str(nranks - half), "-env", "ANYCHIP_HOSTID", "b", *py, *_worker_args(kind, args)]
        else:
            cmd = [exe, "-n", str(nranks), *py, *_worker_args(kind, args)]
        procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    else:
        if kind == "gloo":
            py = [args.torch_python or sys.executable]
            probe = subprocess.run([*py, "-c", "import torch.distributed"], capture_output=True, text=True)
            if probe.returncode:
                return f"torch not importable by {py[0]}"
            port = str(_free_port())
        procs = []
        if kind == "gloo":
            for r in range(nranks):
                env = _clean_env(RANK=str(r), WORLD_SIZE=str(nranks), LOCAL_RANK=str(r),
                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
                env.pop("PYTHONPATH", None)
                procs.append(subprocess.Popen([*py, *_worker_args(kind, args)], env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
        else:
            cmd = [*python_command(["-m", "anychip", "launch"]), "-n", str(nranks), "--device", ANYCHIP_KINDS[kind],
                   *_worker_args(kind, args)]
            procs.append(subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (so, se) in zip(procs, outs, strict=True):
        if p.returncode:
            return f"failed (exit {p.returncode}): {(se or so).strip()[-400:]}"
    for so, _ in outs:
        for line in so.splitlines():
            if "BENCH " in line:
                return json.loads(line.split("BENCH ", 1)[1])
    return "no result printed"


def best_of(old: dict | str | None, new: dict | str) -> dict | str:
    """Cell-wise minimum time of two results (a failed run keeps the other's)."""
    if not isinstance(new, dict):
        return old if isinstance(old, dict) else new
    if not isinstance(old, dict):
        return new
    return {k: min(v, old.get(k, v)) if isinstance(v, float) else v for k, v in new.items()}


def ceilings(size: int) -> dict | str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler"
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "collective_ceiling")
        subprocess.run([cc, "-O3", "-march=native", "-o", exe, str(HERE / "collective_ceiling.c")], check=True)
        out = subprocess.run([exe, str(size), "10"], capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        way, nbytes, secs = line.split()
        res[way] = int(nbytes) / float(secs) / 1e9
    # the staged ceiling is the better of whole-message and cache-sized rounds
    res["staged_best"] = max(res["staged"], res.get("staged_chunked", 0.0))
    return res


# ------------------------------------------------------------------ report

def busbw(op: str, size: int, secs: float, n: int) -> float:
    return size / secs / 1e9 * FACTORS[op](n)


def print_tables(results: dict, args: argparse.Namespace, names: list[str], n: int, title: str) -> None:
    have = [k for k in names if isinstance(results.get(k), dict)]
    ours = [k for k in have if k in ANYCHIP_KINDS]
    peers = [k for k in have if k not in ANYCHIP_KINDS]
    for op in args.ops:
        if not all(f"{op}/{s}" in results[k] for k in have for s in args.sizes):
            continue
        print(f"\n{op}, {title}: time (us) | busbw (GB/s) | busbw ratio anychip/peer")
        head = f"{'size':>9} | " + " ".join(f"{k:>10}" for k in have) + " | " + " ".join(f"{k:>10}" for k in have)
        ratios = [f"{o}/{p}" for o in ours for p in peers]
        print(head + " | " + " ".join(f"{r:>16}" for r in ratios))
        for s in args.sizes:
            t = {k: results[k][f"{op}/{s}"] for k in have}
            bw = {k: busbw(op, s, t[k], n) for k in have}
            line = f"{human(s):>9} | " + " ".join(f"{t[k] * 1e6:10.1f}" for k in have) + " | "
            line += " ".join(f"{bw[k]:10.3f}" for k in have) + " | "
            line += " ".join(f"{bw[o] / bw[p]:16.2f}" for o in ours for p in peers)
            print(line)


def goals(results: dict, ceil: dict | str, args: argparse.Namespace) -> list[str]:
    if "all_reduce" not in args.ops:
        return []
    out = []
    sizes, big = args.sizes, max(args.sizes)

    def t(k: str, s: int) -> float | None:
        r = results.get(k)
        return r.get(f"all_reduce/{s}") if isinstance(r, dict) else None

    def verdict(ok: bool) -> str:
        return "met " if ok else "MISS"

    for k in ("zero-copy", "staged"):
        small = min(sizes)
        if t(k, small) and t("mpich", small):
            r = t(k, small) / t("mpich", small)
            out.append(f"{verdict(r <= 1.5)} {k}: {human(small)} latency {t(k, small) * 1e6:.1f} us = {r:.2f}x "
                       f"MPICH's {t('mpich', small) * 1e6:.1f} us (goal <= 1.5x)")
        mid = [s for s in sizes if 256 << 10 <= s <= 2 << 20]
        if mid and t("mpich", mid[0]) and t(k, mid[0]):
            worst = min(t("mpich", s) / t(k, s) for s in mid)
            out.append(f"{verdict(worst >= 1)} {k}: 256 KiB - 2 MiB busbw >= MPICH's: worst ratio {worst:.2f}")
        if t("gloo", small) and t(k, small):
            worst_g = min(t("gloo", s) / t(k, s) for s in sizes)
            out.append(f"{verdict(worst_g > 1)} {k}: faster than Gloo at every size: worst speed-up {worst_g:.2f}x")
    if isinstance(ceil, dict):
        for k, way in (("zero-copy", "zero_copy"), ("staged", "staged_best")):
            if t(k, big):
                bw = busbw("all_reduce", big, t(k, big), 2)
                frac = bw / ceil[way]
                out.append(f"{verdict(frac >= 0.7)} {k}: {human(big)} busbw {bw:.2f} GB/s = {frac:.0%} of the "
                           f"{k} ceiling {ceil[way]:.2f} GB/s (goal >= 70%)")
        if t("staged", big) and t("mpich", big):
            r = t("mpich", big) / t("staged", big)
            out.append(f"{verdict(r >= 1)} staged: {human(big)} busbw = {r:.2f}x MPICH's (goal >= 1)")
    return out


def size_list(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... up to hi, plus hi and, within [lo, hi], 256 KiB and 2 MiB (the goal's range)."""
    sizes, s = set(), lo
    while s <= hi:
        sizes.add(s)
        s *= factor
    sizes |= {x for x in (256 << 10, 2 << 20, hi) if lo <= x <= hi}
    return sorted(x for x in sizes if x % 8 == 0 or x == lo)


def run_rounds(names: list[str], args: argparse.Namespace, nranks: int) -> dict:
    """Each round runs every contender once, in turn; each cell keeps its best time."""
    results: dict = {}
    for rnd in range(args.rounds):
        for kind in names:
            print(f"#   round {rnd + 1}/{args.rounds}: {kind} ({nranks} ranks)", file=sys.stderr, flush=True)
            results[kind] = best_of(results.get(kind), run_job(kind, args, nranks))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--begin", default="8")
    ap.add_argument("-e", "--end", default="64M")
    ap.add_argument("-f", "--factor", type=int, default=8)
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--torch-python", default=None, help="a Python with torch installed, for the Gloo peer")
    ap.add_argument("--only", default=None, help="comma-separated contenders (default: all)")
    ap.add_argument("--hier", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", default=None, help="also write the raw results to this file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    for op in args.ops:
        if op not in FACTORS:
            raise SystemExit(f"--ops: {op!r} is not one of {', '.join(FACTORS)}")
    if args.worker:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        return worker_main(args)
    args.sizes = size_list(parse_size(args.begin), parse_size(args.end), args.factor)
    names = ["zero-copy", "staged", "any-mpi", "mpich", "gloo"]
    if args.only:
        names = [k for k in names if k in args.only.split(",")]
    print(f"# bench_collectives: 2 ranks, float32, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    results = run_rounds(names, args, 2)
    for kind in names:
        r = results[kind]
        print(f"#   {kind:10} {r['transport'] if isinstance(r, dict) else 'not run: ' + r}", flush=True)
    ceil = best_of(None, ceilings(max(args.sizes)))
    for _ in range(args.rounds - 1):
        again = ceilings(max(args.sizes))
        if isinstance(ceil, dict) and isinstance(again, dict):
            ceil = {k: max(v, again[k]) for k, v in ceil.items()}
    if isinstance(ceil, dict):
        print(f"#   ceilings at {human(max(args.sizes))} (collective_ceiling.c, busbw): zero-copy "
              f"{ceil['zero_copy']:.2f} GB/s, staged {ceil['staged']:.2f} GB/s whole / "
              f"{ceil['staged_chunked']:.2f} GB/s in 256 KiB rounds; memcpy {ceil['memcpy']:.2f} GB/s")
    print_tables(results, args, names, 2, "2 ranks")
    lines = goals(results, ceil, args)
    if lines:
        print("\ngoals (all_reduce):")
        for line in lines:
            print("  " + line)
    if args.hier and "all_reduce" in args.ops:
        hargs = argparse.Namespace(**{**vars(args), "ops": ["all_reduce"]})
        hier = run_rounds(["hier", "mpich"], hargs, 4)
        for k, r in hier.items():
            print(f"\n#   4 ranks {k:6} {r['transport'] if isinstance(r, dict) else 'not run: ' + r}", end="")
        print()
        print_tables(hier, hargs, ["hier", "mpich"], 4, "4 ranks as 2 hosts x 2 (ANYCHIP_HOSTID) vs flat MPICH")
        results["4 ranks"] = hier
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": args.sizes, "results": results, "ceilings": ceil}, indent=1))


if __name__ == "__main__":
    main()
