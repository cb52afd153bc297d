"""One rank of the collective tests (run by tests/test_collectives*.py through `anychip launch`).

    anychip launch -n N --device B tests/collectives/ccl_worker.py SUITE [COUNTS]

Every rank computes what every other rank sent (inputs are seeded by case and rank),
so each checks its own results exactly. Inputs are small integers, which every dtype
holds exactly, and whose sums, products and averages (over up to 4 ranks) are exact
too, so the expected values do not depend on the order of reduction.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import anychip
from anychip import collectives

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
REDOPS = ("sum", "prod", "min", "max", "avg")
STORAGE = {"bfloat16": np.uint16}


def storage(dtype: str) -> np.dtype:
    return np.dtype(STORAGE.get(dtype, dtype))


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """int64 / float64 values -> the dtype's bytes (bfloat16 as the top half of float32)."""
    if dtype == "bfloat16":     # round to nearest even, as the engine does
        u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return values.astype(storage(dtype))


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64 if raw.dtype.kind == "f" else np.int64)


def inputs(case: int, rank: int, n: int, dtype: str, op: str | None) -> np.ndarray:
    rng = np.random.default_rng(case * 1000 + rank)
    if op == "prod":
        lo, hi = (1, 4) if dtype == "uint8" else (-3, 4)
    else:
        lo, hi = (0, 60) if dtype == "uint8" else (-20, 21)
    return rng.integers(lo, hi, size=n).astype(np.int64)


def reduce_values(arrs: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    stack = np.stack(arrs)
    if op in ("sum", "avg"):
        out = stack.sum(axis=0)
    elif op == "prod":
        out = stack.prod(axis=0)
    elif op == "min":
        out = stack.min(axis=0)
    else:
        out = stack.max(axis=0)
    if op == "avg":     # the engine divides the (exact) sum in the accumulation type: float32 for halves
        if dtype.startswith(("int", "uint")):
            out = np.fix(out / len(arrs)).astype(np.int64)
        elif dtype == "float64":
            out = out / len(arrs)
        else:
            out = (out.astype(np.float32) / np.float32(len(arrs))).astype(np.float64)
    return decode(encode(out, dtype), dtype)    # integer results wrap like the dtype


class Case:
    def __init__(self, comm, case: int, kind: str, dtype: str, op: str | None, count: int, inplace: bool,
                 offset: int) -> None:
        self.comm, self.case, self.kind, self.dtype, self.op = comm, case, kind, dtype, op
        self.count, self.inplace, self.offset = count, inplace, offset
        self.root = case % comm.size

    def alloc(self, nbytes: int, fill: np.ndarray | None = None):
        dev = self.comm.device
        base = dev.alloc(nbytes + self.offset + 8)
        base.memset(0xAB)
        buf = base.view(self.offset, nbytes)
        if fill is not None and fill.nbytes:
            buf.copy_from(fill)
        return base, buf

    def run(self) -> None:
        comm, kind, dt, n, N, r = self.comm, self.kind, self.dtype, self.count, self.comm.size, self.comm.rank
        es = storage(dt).itemsize
        send_n = n * N if kind in ("reduce_scatter", "all_to_all") else n
        recv_n = n * N if kind in ("all_gather", "all_to_all") else n
        xs = [inputs(self.case, k, send_n, dt, self.op) for k in range(N)]
        mine = encode(xs[r], dt)
        keep = []
        if self.inplace and kind == "all_gather":
            base, recv = self.alloc(recv_n * es)
            recv.copy_from(mine, offset=r * n * es) if n else None
            send = recv.view(r * n * es, n * es)
        elif self.inplace and kind == "reduce_scatter":
            base, send = self.alloc(send_n * es, mine)
            recv = send.view(r * n * es, n * es)
        elif self.inplace:
            base, send = self.alloc(send_n * es, mine)
            recv = None
        else:
            base, send = self.alloc(send_n * es, mine)
            b2, recv = self.alloc(recv_n * es)
            keep.append(b2)
        keep.append(base)
        kw = {"count": n, "dtype": dt}
        if kind in REDUCING:
            kw["op"] = self.op
        if kind in ("broadcast", "reduce"):
            kw["root"] = self.root
        args = (send, recv) if kind not in ("all_gather", "reduce_scatter") else (send, recv)
        work = getattr(comm, kind)(*args, **kw)
        work.wait()
        assert work.is_completed() and work.exception() is None
        out = recv if recv is not None else send
        got = decode(out.to_numpy(storage(dt), (recv_n,)), dt) if recv_n else np.zeros(0)
        expect = self.expected(xs)
        if expect is None:     # reduce on a non-root rank: recv untouched
            if recv is not None and recv_n:
                raw = recv.to_numpy(np.uint8)
                assert (raw == 0xAB).all(), f"{self}: non-root recv was written"
            return
        if not np.array_equal(got, expect):
            bad = np.flatnonzero(got != expect)
            raise AssertionError(f"{self}: {len(bad)} wrong, first at {bad[0]}: got {got[bad[0]]}, "
                                 f"expected {expect[bad[0]]}")

    def expected(self, xs: list[np.ndarray]) -> np.ndarray | None:
        kind, dt, n, r = self.kind, self.dtype, self.count, self.comm.rank
        if kind == "all_reduce":
            return reduce_values(xs, self.op, dt)
        if kind == "reduce":
            return reduce_values(xs, self.op, dt) if r == self.root else None
        if kind == "broadcast":
            return decode(encode(xs[self.root], dt), dt)
        if kind == "all_gather":
            return decode(encode(np.concatenate(xs), dt), dt)
        if kind == "reduce_scatter":
            return reduce_values([x[r * n:(r + 1) * n] for x in xs], self.op, dt)
        return decode(encode(np.concatenate([x[r * n:(r + 1) * n] for x in xs]), dt), dt)

    def __str__(self) -> str:
        return (f"case {self.case}: {self.kind}({self.dtype}, {self.op}, count={self.count}, root={self.root}, "
                f"inplace={self.inplace}, offset={self.offset}) on {self.comm.device} rank {self.comm.rank}")


def matrix(comm, counts: list[int], big: int | None, big_dtypes: tuple[str, ...]) -> int:
    case = 0
    for count in counts:
        for dt in DTYPES:
            for kind in OPS:
                for op in (REDOPS if kind in REDUCING else (None,)):
                    Case(comm, case, kind, dt, op, count, inplace=case % 3 == 1, offset=3 if case % 2 else 0).run()
                    case += 1
    if big:
        for dt in big_dtypes:
            for kind in OPS:
                for op in (("sum", "max") if kind in REDUCING else (None,)):
                    Case(comm, case, kind, dt, op, big, inplace=case % 3 == 1, offset=3 if case % 2 else 0).run()
                    case += 1
    return case


def p2p(comm) -> int:
    dev, r, N = comm.device, comm.rank, comm.size
    cases = 0
    for count in (0, 1, 1000, 2**20 + 3):
        src = dev.alloc(count * 4).copy_from(np.arange(count, dtype=np.float32) + r) if count else dev.alloc(0)
        dst = dev.alloc(count * 4)
        with comm.group():
            w1 = comm.send(src, (r + 1) % N, count=count)
            w2 = comm.recv(dst, (r - 1) % N, count=count)
        w1.wait()
        w2.wait()
        expect = np.arange(count, dtype=np.float32) + (r - 1) % N
        assert np.array_equal(dst.to_numpy(np.float32, (count,)) if count else expect, expect), count
        cases += 1
    # pairs without a group: even ranks send first
    if N % 2 == 0:
        peer = r ^ 1
        a = dev.alloc(4096).copy_from(np.full(1024, r, dtype=np.int32))
        b = dev.alloc(4096)
        if r % 2 == 0:
            comm.send(a, peer, dtype="int32").wait()
            comm.recv(b, peer, dtype="int32").wait()
        else:
            comm.recv(b, peer, dtype="int32").wait()
            comm.send(a, peer, dtype="int32").wait()
        assert (b.to_numpy(np.int32) == peer).all()
        cases += 1
    return cases


def groups(comm) -> int:
    dev, r, N = comm.device, comm.rank, comm.size
    # split: even / odd ranks, ordered by descending world rank
    sub = comm.split(r % 2, key=-r)
    members = [k for k in range(N) if k % 2 == r % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == sorted(members, reverse=True).index(r), (sub.rank, r)
    buf = dev.alloc(8 * 100).copy_from(np.full(100, r, dtype=np.int64))
    sub.all_reduce(buf, dtype="int64").wait()
    assert (buf.to_numpy(np.int64) == sum(members)).all()
    gathered = sub.exchange(r)
    assert gathered == sorted(members, reverse=True), gathered
    none = comm.split(None if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none is not None:
        none.barrier().wait()
        none.destroy()
    sub.destroy()
    # collectives mixed into one group, with a stream given explicitly
    s = anychip.Stream(dev)
    x = dev.alloc(4 * 10).copy_from(np.full(10, r + 1, dtype=np.float32))
    y = dev.alloc(4 * 10 * N)
    with comm.group():
        wa = comm.all_reduce(x, stream=s)
        wb = comm.all_gather(x, y, stream=s)
    wa.wait()
    wb.wait()
    s.synchronize()
    total = N * (N + 1) / 2
    assert (x.to_numpy(np.float32) == total).all()
    assert (y.to_numpy(np.float32) == total).all()
    comm.barrier().wait()
    return 4


def late_ring(comm, leave: str) -> int:
    """A ring in one group (send to r+1, recv from r-1) whose last rank enters 0.5 s late:
    first with large messages (several channel halves), then with small ones (in the channel
    at once), after which rank 1, its part done, leaves at once (``leave``: destroy or exit)
    while rank 2 has not received its message yet: it is still delivered, and nobody fails."""
    dev, r, N = comm.device, comm.rank, comm.size
    cases = 0
    for count in (300_000, 1000):
        if r == N - 1:
            time.sleep(0.5)
        a = dev.alloc(4 * count).copy_from(np.arange(count, dtype=np.int32) + 1000 * r)
        b = dev.alloc(4 * count).copy_from(np.full(count, -1, dtype=np.int32))
        with comm.group():
            comm.send(a, (r + 1) % N, dtype="int32")
            w = comm.recv(b, (r - 1) % N, dtype="int32")
        w.wait()
        prev = (r - 1) % N
        assert (b.to_numpy(np.int32) == np.arange(count, dtype=np.int32) + 1000 * prev).all(), (count, r)
        cases += 1
        if r == 1 and count == 1000:
            if leave == "exit":
                print(f"PASS {cases} cases (rank 1 exits after its group)", flush=True)
                os._exit(0)
            comm.destroy()
            return cases
    return cases


def failures(comm, suite: str) -> int:
    """Prints one line 'RESULT <exception type>|<seconds>|<message>' for the test to check."""
    import signal
    dev, r = comm.device, comm.rank
    n = 2**20 + 3
    buf = dev.alloc(4 * n).copy_from(np.ones(n, dtype=np.float32))
    if suite == "kill" and r == 1:
        if comm.transport.mode == "sim":
            # enqueued behind a held stream: the others wait in the op for a rank that never comes
            stream = dev.current_stream()
            dev.plugin.sim_hold_stream(dev.index, stream._handle)
            comm.all_reduce(buf, count=n, stream=stream)
        else:
            # one round of the chunked all_reduce with the others, then die while they are mid-op
            comm.all_reduce(buf, count=1024 * 256).wait()
        os.kill(os.getpid(), signal.SIGKILL)
    if suite == "timeout":
        # the join ran under the environment's long timeout (ranks start seconds apart on a
        # loaded machine); the op under test gets the short one
        comm.transport._lib.ccl_comm_set_timeout(comm.transport._comm, float(os.environ["CCL_TEST_OP_TIMEOUT"]))
    if suite == "timeout" and r == comm.size - 1:
        sys.stdin.read()                      # alive, but never joins; the test closes stdin at the end
        return 0
    count = n if suite != "check" else 10 + r
    t = time.perf_counter()
    try:
        if suite == "p2p_mismatch":
            if r == 0:
                comm.send(buf, 1, count=10).wait()
                comm.barrier().wait()        # fails: rank 1 aborted the communicator
            else:
                comm.recv(buf, 0, count=11).wait()
        else:
            comm.all_reduce(buf, count=count).wait()
        outcome = "none"
        msg = ""
    except anychip.AnychipError as exc:
        outcome = type(exc).__name__
        msg = str(exc)
    print(f"RESULT {outcome}|{time.perf_counter() - t:.3f}|{msg}", flush=True)
    return 1


def ipc_cache(comm) -> int:
    """More distinct allocations than the engine keeps mapped (64): mappings are evicted and
    made again, and every zero-copy result stays right."""
    dev, r, N = comm.device, comm.rank, comm.size
    count = 1 << 14                                        # 64 KiB of float32: the zero-copy path
    bufs = [dev.alloc(12 << 20) for _ in range(70)]        # 12 MiB each: a segment of its own
    cases = 0
    for rep in range(2):
        assert len({b._check().handle for b in bufs}) == 70
        for i, b in enumerate(bufs):
            b.copy_from(np.full(count, i + r + rep, dtype=np.float32))
            comm.all_reduce(b, count=count).wait()
            got = b.to_numpy(np.float32, (count,))
            assert (got == N * (i + rep) + N * (N - 1) // 2).all(), (rep, i, got[:3])
            cases += 1
    return cases


def main() -> None:
    suite = sys.argv[1]
    comm = collectives.init()
    t = time.perf_counter()
    if suite == "matrix":
        counts = [int(c) for c in sys.argv[2].split(",")]
        big = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "0" else None
        big_dtypes = tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ("float32", "bfloat16", "int8", "float64")
        n = matrix(comm, counts, big, big_dtypes)
    elif suite == "p2p":
        n = p2p(comm) + groups(comm)
    elif suite == "late_ring":
        n = late_ring(comm, sys.argv[2])
        if comm.rank == 1:
            print(f"PASS {n} cases (rank 1 left after its group)", flush=True)
            return
    elif suite == "ipc_cache":
        n = ipc_cache(comm)
    elif suite in ("kill", "timeout", "check", "p2p_mismatch"):
        failures(comm, suite)
        return
    else:
        raise SystemExit(f"unknown suite {suite}")
    comm.destroy()
    print(f"PASS {n} cases on {comm.device} ({comm.transport.name}) in {time.perf_counter() - t:.1f} s "
          f"pid {os.getpid()}")


if __name__ == "__main__":
    main()
