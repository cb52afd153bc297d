"""Every paddle.distributed collective on a device type anychip provides, value-checked on
each rank (run under `python -m paddle.distributed.launch`). Each check prints a line
"CHECK <name> ok" or "CHECK <name> FAIL <detail>"; the process exits 1 if any failed.
tests/paddle_provider/test_paddle_provider.py and `anychip conformance --framework paddle` run it;
with --sizes it also times all_reduce, all_gather, broadcast and reduce_scatter per size
(value-checked) and prints "ROW <op> <bytes> <seconds> <ok>" lines; with --compute it first runs the
compute checks of paddle_compute.py on the rank's device."""
import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from anychip.conformance._worker import Lines, table

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
lines = Lines(-1)


def report(name: str, got, want) -> None:
    got_a, want_a = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    same = got_a.shape == want_a.shape and np.array_equal(got_a, want_a)
    lines.report(name, same, f"got {got_a.tolist()} want {want_a.tolist()}")


def host(t) -> np.ndarray:
    if t.dtype == paddle.bfloat16:
        t = t.astype("float32")
    return t.numpy()


def tensor(values: Any, dtype: Any) -> Any:
    arr = np.asarray(values, dtype=np.float32)
    t = paddle.to_tensor(arr)
    return t.astype(dtype)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default=None, help="min,max,factor in bytes: time the ops per size")
    parser.add_argument("--compute", action="store_true", help="first, what Paddle computes on the device against "
                                                               "its CPU (anychip/conformance/paddle_compute.py)")
    args = parser.parse_args()
    dist.init_parallel_env()
    r, n = dist.get_rank(), dist.get_world_size()
    lines.rank = r
    dev = paddle.device.get_device()
    print(f"RANK {r} of {n} on {dev}", flush=True)
    if args.compute:                     # to_static once per job: on rank 0
        from anychip.conformance.paddle_compute import run_all
        run_all(lines.report, static=r == 0)
        dist.barrier()
    base = np.arange(6, dtype=np.float64)

    for dt in DTYPES:                                     # all_reduce: every type, every op
        ops: dict[str, tuple[Any, Any]] = {"SUM": (dist.ReduceOp.SUM, sum(base + k + 1 for k in range(n))),
               "MAX": (dist.ReduceOp.MAX, base + n),
               "MIN": (dist.ReduceOp.MIN, base + 1),
               "PROD": (dist.ReduceOp.PROD, np.prod([base + k + 1 for k in range(n)], axis=0))}
        for op_name, (op, want) in ops.items():
            if dt in ("int8", "uint8") and op_name == "PROD":
                want = np.prod([base % 2 + k + 1 for k in range(n)], axis=0)   # 8 bits hold 5! / 1
                x = tensor(base % 2 + r + 1, dt)
            else:
                x = tensor(base + r + 1, dt)
            dist.all_reduce(x, op=op)
            report(f"all_reduce.{dt}.{op_name}", host(x), want)

    # AVG: Paddle 3.3.1 offers none on a custom device (paddle.distributed.all_reduce asks
    # core.nccl_version(), which a build without CUDA lacks; the stream API reaches the process
    # group, which refuses it); a Paddle that offers it fails this check, to be value-checked then
    try:
        dist.stream.all_reduce(tensor(base, "float32"), op=dist.ReduceOp.AVG)
        refused = "accepted"
    except ValueError as exc:
        refused = str(exc).split("\n")[0]
    report("all_reduce.AVG.refused_by_paddle",
           [refused == "(InvalidArgument) Invalid CustomCCL reduction. Must be Min | Max | Prod | Sum"], [True])

    for src in range(n):                                  # broadcast from every src
        x = tensor(base * (r + 1) + 100 * r, "float32")
        dist.broadcast(x, src=src)
        report(f"broadcast.src{src}", host(x), base * (src + 1) + 100 * src)

    for dst in range(n):                                  # reduce to every dst
        x = tensor(base + r, "float32")
        dist.reduce(x, dst=dst)
        if r == dst:
            report(f"reduce.dst{dst}", host(x), sum(base + k for k in range(n)))

    for dt in ("float32", "bfloat16", "int64"):          # all_gather into a list, used at once
        big = 1 << 18
        parts: list = []
        dist.all_gather(parts, tensor(np.full(big, r + 1), dt))
        sums = [float(host(p).astype(np.float64).sum()) for p in parts]
        report(f"all_gather.list.{dt}", sums, [float(big * (k + 1)) for k in range(n)])
    out = paddle.empty([n * 3], "float32")
    parts = []
    dist.all_gather(parts, tensor(np.full(3, r), "float32"))
    report("all_gather.concat", host(paddle.concat(parts)), np.repeat(np.arange(n), 3))
    del out

    x = tensor(np.arange(n * 2) + 10 * r, "float32")      # reduce_scatter
    out = paddle.empty([2], "float32")
    dist.reduce_scatter(out, list(paddle.split(x, n)))
    report("reduce_scatter", host(out), sum(np.arange(n * 2)[2 * r:2 * r + 2] + 10 * k for k in range(n)))

    ins = [tensor(np.full(2, 10 * r + k), "float32") for k in range(n)]   # alltoall
    outs: list = []
    dist.alltoall(outs, ins)
    report("alltoall", np.concatenate([host(o) for o in outs]), np.concatenate([np.full(2, 10 * k + r)
                                                                                for k in range(n)]))

    if n >= 2:                                            # send / recv around a ring
        x = tensor(np.full(4, r + 1), "float32")
        y = paddle.empty([4], "float32")
        if r % 2 == 0:
            dist.send(x, dst=(r + 1) % n)
            dist.recv(y, src=(r - 1) % n)
        else:
            dist.recv(y, src=(r - 1) % n)
            dist.send(x, dst=(r + 1) % n)
        report("send_recv", host(y), np.full(4, (r - 1) % n + 1))

    x = tensor(np.full(1 << 16, r + 1), "float32")        # async: wait() and is_completed()
    task = dist.all_reduce(x, sync_op=False)
    task.wait()
    report("all_reduce.async.value", [float(host(x)[0]), float(host(x)[-1])], [n * (n + 1) / 2] * 2)
    deadline = time.monotonic() + 30
    while not task.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    report("all_reduce.async.is_completed", [task.is_completed()], [True])

    dist.barrier()
    report("barrier", [1], [1])
    if args.sizes:
        table(lines, n, args.sizes, partial(case, r, n), paddle.device.synchronize, dist.barrier)
    return lines.done()


def case(r: int, n: int, op: str, count: int) -> tuple[Callable[[], object], Callable[[], bool]]:
    """(run the op once, check it once more on fresh inputs) for _worker.table."""
    out = paddle.empty([count // n], "float32")
    got: list = []
    state: dict[str, Any] = {}

    def fresh() -> None:
        state["x"] = tensor(np.full(count, r + 1), "float32")
        state["parts"] = list(paddle.split(state["x"], n))

    def run() -> None:
        x, parts = state["x"], state["parts"]
        if op == "all_reduce":
            dist.all_reduce(x)
        elif op == "all_gather":
            got.clear()
            dist.all_gather(got, parts[0])
        elif op == "broadcast":
            dist.broadcast(x, src=0)
        else:
            dist.reduce_scatter(out, parts)

    def check() -> bool:
        fresh()
        run()
        want = {"all_reduce": n * (n + 1) / 2, "broadcast": 1.0, "reduce_scatter": n * (n + 1) / 2}
        if op == "all_gather":
            return all(float(host(g).min()) == float(host(g).max()) == k + 1 for k, g in enumerate(got))
        return bool(np.all(host(out if op == "reduce_scatter" else state["x"]) == want[op]))
    fresh()
    return run, check

if __name__ == "__main__":
    sys.exit(main())
