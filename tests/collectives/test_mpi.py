"""The MPI host transport and the hierarchical (shared memory + MPI) transport.

Each test starts one job under the mpich wheel's ``mpiexec``; every rank of it runs this
file as a program (``main`` below): every op x dtype x reduce op with exact expected
bits, in-place and odd-offset views, a send/recv ring in a group, split sub-groups,
check mode, and (flat MPI) a timeout. Ranks print ``RESULT rank=R checks=N failures=F``.
Two "hosts" on one machine are made with ``ANYCHIP_HOSTID``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
REDOPS = ("sum", "prod", "min", "max", "avg")
COUNTS = (0, 1, 7, 1000)
BIG = (1 << 20) + 3
STORE = {"bfloat16": np.uint16}


# -- the cases, shared by the job and by the test that counts them --------------------------------

def plan(size: int, full: bool) -> list[tuple]:
    """(kind, dtype, count, op, root, in_place, offset) of every checked op.
    ``full``: every dtype and count; else the staged-device subset."""
    cases = []
    dtypes = DTYPES if full else ("int32", "bfloat16", "float32")
    for dtype in dtypes:
        for count in (COUNTS if full else (0, 7, 1000)):
            off = 3 if count == 7 else 0
            for op in REDOPS:
                cases.append(("all_reduce", dtype, count, op, -1, False, off))
                cases.append(("reduce", dtype, count, op, size - 1, False, off))
                cases.append(("reduce_scatter", dtype, count, op, -1, False, off))
            for kind in ("broadcast", "all_gather", "all_to_all"):
                cases.append((kind, dtype, count, "sum", 1 % size if kind == "broadcast" else -1, False, off))
            if count:
                for kind, op in (("all_reduce", "avg"), ("all_reduce", "max"), ("reduce", "sum"),
                                 ("broadcast", "sum"), ("all_gather", "sum"), ("reduce_scatter", "sum"),
                                 ("all_to_all", "sum")):
                    root = {"reduce": 0, "broadcast": size - 1}.get(kind, -1)
                    cases.append((kind, dtype, count, op, root, True, off))
    cases.append(("all_reduce", "float32", BIG, "sum", -1, False, 0))
    cases.append(("all_reduce", "bfloat16", BIG, "avg", -1, True, 0))
    return cases


def inputs(rank: int, n: int, dtype: str, op: str) -> np.ndarray:
    """Rank ``rank``'s values, small integers that every dtype holds exactly (float64)."""
    i = np.arange(n, dtype=np.int64)
    signed = dtype not in ("uint8",)
    if op == "prod":
        v = (i + rank) % 3 + 1
        if signed:
            v = np.where((i + rank) % 2 == 1, -v, v)
    else:
        v = (i * 5 + rank * 3) % 7 - (3 if signed else 0)
    return v.astype(np.float64)


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """values as the bytes of dtype (bfloat16: float32 rounded to nearest even; no NaNs here)."""
    if dtype == "bfloat16":
        x = values.astype(np.float32).view(np.uint32)
        return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16).view(np.uint8)
    return values.astype(dtype).view(np.uint8)


def reduced(per_rank: list[np.ndarray], dtype: str, op: str) -> np.ndarray:
    stack = np.stack(per_rank)
    if op in ("sum", "avg"):
        out = stack.sum(axis=0)
    else:
        out = {"prod": np.prod, "min": np.min, "max": np.max}[op](stack, axis=0)
    if op == "avg":      # the exact sum divided once, in the type the engine accumulates in
        if dtype in ("int8", "uint8", "int32", "int64"):
            return np.trunc(out / len(per_rank))
        acc = np.float64 if dtype == "float64" else np.float32
        return out.astype(acc) / acc(len(per_rank))
    return out


def expected(kind: str, size: int, rank: int, n: int, dtype: str, op: str, root: int) -> np.ndarray | None:
    """The bytes recv must hold afterwards (None: recv is not written on this rank)."""
    if kind in ("all_reduce", "reduce"):
        if kind == "reduce" and rank != root:
            return None
        return to_bits(reduced([inputs(r, n, dtype, op) for r in range(size)], dtype, op), dtype)
    if kind == "reduce_scatter":
        full = [inputs(r, size * n, dtype, op) for r in range(size)]
        return to_bits(reduced([f[rank * n:(rank + 1) * n] for f in full], dtype, op), dtype)
    if kind == "broadcast":
        return to_bits(inputs(root, n, dtype, op), dtype)
    if kind == "all_gather":
        return to_bits(np.concatenate([inputs(r, n, dtype, op) for r in range(size)]), dtype)
    # all_to_all: block j of rank r's send is inputs(r, size*n)[j*n:(j+1)*n]
    return to_bits(np.concatenate([inputs(r, size * n, dtype, op)[rank * n:(rank + 1) * n] for r in range(size)]),
                   dtype)


# -- the program every rank runs ----------------------------------------------------------------

class Checker:
    def __init__(self, rank: int) -> None:
        self.rank, self.checks, self.failures = rank, 0, []

    def equal(self, what: str, got: np.ndarray, want: np.ndarray) -> None:
        self.checks += 1
        if got.tobytes() != want.tobytes():
            g, w = np.frombuffer(got.tobytes(), np.uint8), np.frombuffer(want.tobytes(), np.uint8)
            bad = int(np.flatnonzero(g != w)[0]) if g.size == w.size else -1
            self.failures.append(f"{what}: first differing byte {bad} (got {g[:16].tolist()} want {w[:16].tolist()})")

    def true(self, what: str, ok: bool) -> None:
        self.checks += 1
        if not ok:
            self.failures.append(what)


def run_case(comm, chk: Checker, case: tuple) -> None:
    kind, dtype, n, op, root, in_place, off = case
    dev, size, rank = comm.device, comm.size, comm.rank
    es = np.dtype(STORE.get(dtype, dtype)).itemsize
    s_mult = size if kind in ("reduce_scatter", "all_to_all") else 1
    r_mult = size if kind in ("all_gather", "all_to_all") else 1
    src = to_bits(inputs(rank, s_mult * n, dtype, op), dtype)
    base = dev.alloc(off + max(s_mult, r_mult) * n * es + 64)
    if in_place:
        recv = base.view(off, r_mult * n * es)
        start = {"all_gather": rank * n * es}.get(kind, 0)
        send = recv.view(start, s_mult * n * es) if kind != "reduce_scatter" else None
        if kind == "reduce_scatter":
            send = base.view(off, s_mult * n * es)
            recv = send.view(rank * n * es, n * es)
        send.copy_from(src)
    else:
        send = base.view(off, s_mult * n * es)
        send.copy_from(src)
        other = dev.alloc(off + r_mult * n * es + 8)
        recv = other.view(off, r_mult * n * es)
        recv.memset(0xEE)
    before = recv.to_numpy()
    args = dict(count=n, dtype=dtype)
    if kind in ("all_reduce", "reduce", "reduce_scatter"):
        args["op"] = op
    if kind in ("reduce", "broadcast"):
        args["root"] = root
    getattr(comm, kind)(send, recv, **args).wait()
    want = expected(kind, size, rank, n, dtype, op, root)
    got = recv.to_numpy()
    chk.equal(f"{case}", got, before if want is None else want)


def ring(comm, chk: Checker) -> None:
    dev, size, rank = comm.device, comm.size, comm.rank
    out, inc = dev.alloc(40), dev.alloc(40)
    out.copy_from(np.arange(10, dtype=np.int32) + 100 * rank)
    with comm.group():
        comm.send(out, (rank + 1) % size, dtype="int32")
        w = comm.recv(inc, (rank - 1) % size, dtype="int32")
    w.wait()
    chk.equal("group ring", inc.to_numpy(np.int32), np.arange(10, dtype=np.int32) + 100 * ((rank - 1) % size))


def splits(comm, chk: Checker, names: dict) -> None:
    dev, size, rank = comm.device, comm.size, comm.rank
    for how, color in (("parity", rank % 2), ("halves", rank // max(size // 2, 1))):
        sub = comm.split(color, key=-rank)
        members = sorted((r for r in range(size) if (r % 2 if how == "parity" else r // max(size // 2, 1)) == color),
                         reverse=True)
        chk.true(f"split {how}: rank {sub.rank} of {sub.size}, want {members.index(rank)} of {len(members)}",
                 (sub.rank, sub.size) == (members.index(rank), len(members)))
        want_name = names.get(how)
        if want_name:
            chk.true(f"split {how}: transport {sub.transport.name}, want {want_name}",
                     sub.transport.name == want_name)
        b = dev.alloc(8 * 5)
        b.copy_from(np.full(5, rank + 1, dtype=np.int64))
        sub.all_reduce(b, dtype="int64").wait()
        chk.equal(f"split {how} all_reduce", b.to_numpy(np.int64), np.full(5, sum(m + 1 for m in members), np.int64))
        sub.destroy()
    none = comm.split(None if rank == 0 else 7)
    chk.true("split(None) gives None", (none is None) == (rank == 0))
    if none is not None:
        none.destroy()


def check_mode(comm, chk: Checker) -> None:
    from anychip import CollectiveError
    b = comm.device.alloc(64)
    os.environ["ANYCHIP_COLLECTIVE_CHECK"] = "1"
    try:
        comm.all_reduce(b, count=4 + comm.rank).wait()
        chk.true("check mode: mismatched counts raised nothing", False)
    except CollectiveError as e:
        msg = str(e)
        chk.true(f"check mode message: {msg}", "called different collectives" in msg
                 and "rank 0: all_reduce(count=4, dtype=float32, op=sum, root=-1)" in msg
                 and "rank 1: all_reduce(count=5, dtype=float32, op=sum, root=-1)" in msg)
    b.copy_from(np.ones(16, dtype=np.float32))
    comm.all_reduce(b, count=16).wait()
    os.environ.pop("ANYCHIP_COLLECTIVE_CHECK")
    chk.equal("check mode: matching ops still run", b.to_numpy(np.float32), np.full(16, comm.size, np.float32))


def timeout(comm, chk: Checker) -> None:
    """Rank 0 calls an all_reduce that rank 1 joins only after rank 0 gave up."""
    from mpi4py import MPI

    from anychip import CollectiveError, CollectiveTimeout
    os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = "0.5"
    sub = comm.split(0)
    os.environ.pop("ANYCHIP_COLLECTIVE_TIMEOUT")
    b = comm.device.alloc(16)
    late = sub.transport.comm
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            sub.all_reduce(b).wait()
            chk.true("timeout: all_reduce without peers returned", False)
        except CollectiveTimeout as e:
            took = time.monotonic() - t0
            others = list(range(1, comm.size))
            missing = ("rank 1 has not called it" if len(others) == 1 else
                       f"ranks {', '.join(map(str, others))} have not called it")
            chk.true(f"timeout after {took:.2f} s: {e}", 0.5 <= took < 5 and str(e) == (
                f"all_reduce (op #1) on group {sub.transport.label} (MPI) did not complete within 0.5 s on rank 0 "
                f"(ANYCHIP_COLLECTIVE_TIMEOUT=0.5): {missing} (no answer in 0.5 s: busy elsewhere, or stuck outside "
                "MPI)"))
        try:
            sub.all_reduce(b).wait()
            chk.true("timeout: the failed communicator accepted another op", False)
        except CollectiveError as e:
            chk.true(f"after timeout: {e}", "failed earlier" in str(e) and "all_reduce timed out" in str(e))
    comm.barrier().wait()
    if comm.rank != 0:
        # (the transport's collectives are MPI's nonblocking ones, which match only their own kind)
        late.Iallreduce(MPI.IN_PLACE, [np.zeros(4, np.float32), MPI.FLOAT], MPI.SUM).Wait()
    comm.barrier().wait()       # rank 0's MPI progress completes the abandoned all_reduce meanwhile
    if comm.size > 2:
        # every rank but the last calls it: each one that times out names only the last
        last = comm.size - 1
        os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = "0.5"
        sub = comm.split(0)
        os.environ.pop("ANYCHIP_COLLECTIVE_TIMEOUT")
        late = sub.transport.comm
        if comm.rank != last:
            try:
                sub.all_reduce(b).wait()
                chk.true("timeout: all_reduce without the last rank returned", False)
            except CollectiveTimeout as e:
                chk.true(f"timeout without rank {last}: {e}", str(e) == (
                    f"all_reduce (op #1) on group {sub.transport.label} (MPI) did not complete within 0.5 s on rank "
                    f"{comm.rank} (ANYCHIP_COLLECTIVE_TIMEOUT=0.5): rank {last} has not called it (no answer in 0.5 s: "
                    "busy elsewhere, or stuck outside MPI)"))
        comm.barrier().wait()
        if comm.rank == last:
            late.Iallreduce(MPI.IN_PLACE, [np.zeros(4, np.float32), MPI.FLOAT], MPI.SUM).Wait()
        comm.barrier().wait()


def main(argv: list[str]) -> int:
    import faulthandler

    import anychip  # noqa: F401
    from anychip import collectives
    opts = dict(a.split("=", 1) for a in argv)
    faulthandler.dump_traceback_later(float(opts.get("hang", 200)), exit=True)   # a hang shows where
    chk = None
    if opts.get("smoke") == "1":             # auto on one host: the engine, MPI never initialised
        comm = collectives.init("cpu")
        chk = Checker(comm.rank)
        chk.true(f"transport {comm.transport.name}, want shm/host", comm.transport.name == "shm/host")
        b = comm.device.alloc(12).copy_from(np.arange(3, dtype=np.int32) + comm.rank)
        comm.all_reduce(b, dtype="int32").wait()
        chk.equal("all_reduce", b.to_numpy(np.int32), np.arange(3, dtype=np.int32) * comm.size + 1)
        chk.true("mpi4py was imported", "mpi4py" not in sys.modules)
        opts["devices"] = ""
    for name in filter(None, opts["devices"].split(",")):
        comm = collectives.init(name)
        chk = chk or Checker(comm.rank)
        chk.true(f"transport {comm.transport.name}, want {opts['transport']}", comm.transport.name == opts["transport"])
        for case in plan(comm.size, name.startswith("cpu")):
            run_case(comm, chk, case)
        ring(comm, chk)
        if name.startswith("cpu"):
            splits(comm, chk, {"parity": opts.get("parity", ""), "halves": opts.get("halves", "")})
            check_mode(comm, chk)
            if opts.get("timeout") == "1":
                timeout(comm, chk)
        comm.destroy()
    assert chk is not None
    for f in chk.failures[:20]:
        print(f"FAIL rank={chk.rank}: {f}", flush=True)
    print(f"RESULT rank={chk.rank} checks={chk.checks} failures={len(chk.failures)}", flush=True)
    return 1 if chk.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- the tests ----------------------------------------------------------------------------------

import pytest  # noqa: E402


def _mpiexec() -> str | None:
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))


def _skip_reason() -> str | None:
    exe = _mpiexec()
    if exe is None:
        return "mpiexec not found (pip install anychip[mpi] installs the mpich wheel's)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install anychip[mpi])"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "HYDRA" not in out:
        return f"{exe} is not MPICH's (Hydra) launcher; these jobs use its -env option"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def job(groups: list[tuple[int, dict]], args: dict, env: dict | None = None,
        timeout: float | None = None) -> list[dict]:
    """Run this file under mpiexec: one (ranks, variables) per host group (MPMD)."""
    from conftest import CHILD_SECONDS  # not at the top: the ranks run this file as a program

    timeout = CHILD_SECONDS if timeout is None else timeout
    cmd = [_mpiexec()]
    for i, (n, variables) in enumerate(groups):
        if i:
            cmd.append(":")
        cmd += ["-n", str(n)]
        for k, v in variables.items():
            cmd += ["-env", k, v]
        cmd += [sys.executable, __file__] + [f"{k}={v}" for k, v in args.items()]
    full_env = dict(os.environ, ANYCHIP_SIMULATE="always", **(env or {}))
    full_env.pop("ANYCHIP_DEVICES", None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    results = [dict(rank=int(m[1]), checks=int(m[2]), failures=int(m[3]))
               for m in re.finditer(r"RESULT rank=(\d+) checks=(\d+) failures=(\d+)", p.stdout)]
    assert p.returncode == 0 and len(results) == sum(n for n, _ in groups), \
        f"rc={p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-4000:]}"
    return results


def planned(size: int, devices: list[str], rank: int, timeout: bool = False, named: bool = True) -> int:
    """Checks rank ``rank`` makes: transport, cases, ring; on cpu the splits (2 x 3 + 1, or
    2 x 2 + 1 without transport names), check mode (2), on rank 0 the timeout (2) and, with more
    than 2 ranks, on every rank but the last the timeout without the last (1)."""
    total = 0
    for d in devices:
        total += 1 + len(plan(size, d == "cpu")) + 1
        if d == "cpu":
            total += (7 if named else 5) + 2 + (2 if timeout and rank == 0 else 0)
            total += 1 if timeout and size > 2 and rank < size - 1 else 0
    return total


def outcome(res: list[dict]) -> list[tuple[int, int]]:
    return [(r["checks"], r["failures"]) for r in sorted(res, key=lambda r: r["rank"])]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.slow
def test_flat_mpi_every_op_dtype_and_redop(n: int) -> None:
    devices = ["cpu", "ascend"] if n == 2 else ["cpu"]
    res = job([(n, {})], dict(devices=",".join(devices), transport="mpi", parity="mpi", halves="mpi",
                              timeout="1"), env={"ANYCHIP_HOST_TRANSPORT": "mpi"})
    assert outcome(res) == [(planned(n, devices, r, timeout=True), 0) for r in range(n)]


@pytest.mark.slow
def test_hierarchical_two_hosts_of_two_ranks() -> None:
    # hosts {0, 1} and {2, 3}: parity sub-groups span both hosts with one rank each,
    # halves sub-groups are one host each (the shared-memory engine)
    res = job([(2, {"ANYCHIP_HOSTID": "node-a"}), (2, {"ANYCHIP_HOSTID": "node-b"})],
              dict(devices="cpu,ascend", transport="host/shm+mpi", parity="host/shm+mpi", halves="shm/host"))
    assert outcome(res) == [(planned(4, ["cpu", "ascend"], r), 0) for r in range(4)]


@pytest.mark.slow
def test_uneven_hosts_fall_back_to_flat_mpi() -> None:
    res = job([(2, {"ANYCHIP_HOSTID": "a"}), (1, {"ANYCHIP_HOSTID": "b"})],
              dict(devices="cpu", transport="mpi", parity="", halves=""))
    assert outcome(res) == [(planned(3, ["cpu"], r, named=False), 0) for r in range(3)]


def test_one_host_under_mpiexec_uses_the_engine_without_mpi() -> None:
    res = job([(2, {})], dict(devices="", smoke="1"), env={"ANYCHIP_HOST_TRANSPORT": "auto"})
    assert outcome(res) == [(3, 0), (3, 0)]
