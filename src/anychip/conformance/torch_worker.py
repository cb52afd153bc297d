"""Every c10d op of the ``anychip`` backend, value-checked on each rank (run under
``anychip launch``; ``ANYCHIP_TORCH`` picks the chip). Each check prints "CHECK <name> ok" or
"CHECK <name> FAIL <detail>"; the process exits 1 if any failed. tests/torch_provider/test_torch_c10d.py and
``anychip conformance --framework torch`` run it (the latter with --compute: first the compute checks of
torch_compute.py on the rank's device); with --sizes it also times all_reduce,
all_gather, broadcast and reduce_scatter per size (value-checked) and prints
"ROW <op> <bytes> <seconds> <ok>" lines. Last, "DIRECT {op: count}": the ops the process
group's C++ path enqueued (null without it)."""
import argparse
import json
import sys

import torch
import torch.distributed as dist

import anychip.torch
import anychip.torch.distributed  # noqa: F401  (registers the backend)
from anychip.conformance._worker import Lines, table

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default=None, help="min,max,factor in bytes: time the ops per size")
parser.add_argument("--compute", action="store_true", help="first, what PyTorch computes on the device against its "
                                                           "CPU (anychip/conformance/torch_compute.py)")
args = parser.parse_args()
dist.init_process_group("anychip")
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("anychip", torch.accelerator.current_device_index())
print(f"RANK {rank} of {n} on {dev} ({anychip.torch.anychip_device(dev.index).name})", flush=True)
lines = Lines(rank)


def check(what, got, want):
    got = got.cpu()
    name = what.replace(" ", ".").replace("torch.", "").replace("RedOpType.", "")
    lines.report(name, got.dtype == want.dtype and torch.equal(got, want), f"got {got.tolist()} want {want.tolist()}")


FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]


def vals(r, dtype, k=5):
    return (torch.arange(k) + 1 + r).to(dtype)


if args.compute:                         # torch.compile once per job: on rank 0
    from anychip.conformance.torch_compute import run_all
    run_all(lines.report, dev, compiled=rank == 0)
    dist.barrier()

OPS = {dist.ReduceOp.SUM: lambda xs: sum(xs[1:], xs[0]),
       dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0),
       dist.ReduceOp.MIN: lambda xs: torch.stack(xs).min(0).values,
       dist.ReduceOp.MAX: lambda xs: torch.stack(xs).max(0).values}
for dtype in FLOATS + INTS:
    inputs = [vals(r, dtype) for r in range(n)]
    for op, ref in OPS.items():
        t = inputs[rank].to(dev)
        dist.all_reduce(t, op=op)
        if dtype in (torch.float16, torch.bfloat16):      # accumulated wide, rounded once
            want = ref([x.to(torch.float64) for x in inputs]).to(dtype)
        else:
            want = ref(inputs).to(dtype)
        check(f"all_reduce {op} {dtype}", t, want)
    if dtype in FLOATS:
        t = inputs[rank].to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        check(f"all_reduce avg {dtype}", t, (sum(x.to(torch.float64) for x in inputs) / n).to(dtype))
    else:
        for op, f in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                      (dist.ReduceOp.BXOR, torch.bitwise_xor)):
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=op)
            want = inputs[0]
            for x in inputs[1:]:
                want = f(want, x)
            check(f"all_reduce {op} {dtype}", t, want)
    # broadcast from every root
    for root in range(n):
        t = vals(rank * 10, dtype).to(dev)
        dist.broadcast(t, src=root)
        check(f"broadcast {root} {dtype}", t, vals(root * 10, dtype))
    # reduce to every root
    for root in range(n):
        t = inputs[rank].to(dev)
        dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
        check(f"reduce {root} {dtype}", t, inputs[n - 1] if rank == root else inputs[rank])
    # all_gather (list and into a tensor)
    outs = [torch.zeros(5, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_gather(outs, inputs[rank].to(dev))
    for r in range(n):
        check(f"all_gather {r} {dtype}", outs[r], inputs[r])
    out = torch.zeros(n * 5, dtype=dtype, device=dev)
    dist.all_gather_single(out, inputs[rank].to(dev))
    check(f"all_gather_into_tensor {dtype}", out, torch.cat(inputs))
    # reduce_scatter (list and tensor)
    full = [(torch.arange(n * 3) + r).to(dtype) for r in range(n)]
    total = torch.stack([x.to(torch.float64) for x in full]).sum(0).to(dtype)
    o = torch.zeros(3, dtype=dtype, device=dev)
    dist.reduce_scatter_single(o, full[rank].to(dev))
    check(f"reduce_scatter_tensor {dtype}", o, total[rank * 3:(rank + 1) * 3])
    o = torch.zeros(3, dtype=dtype, device=dev)
    dist.reduce_scatter(o, [c.to(dev) for c in full[rank].chunk(n)])
    check(f"reduce_scatter {dtype}", o, total[rank * 3:(rank + 1) * 3])
    # all_to_all (single even and uneven, list)
    src = (torch.arange(n * 2) + 100 * rank).to(dtype)
    o = torch.zeros(n * 2, dtype=dtype, device=dev)
    dist.all_to_all_single(o, src.to(dev))
    want = torch.cat([(torch.arange(n * 2) + 100 * r).to(dtype)[rank * 2:rank * 2 + 2] for r in range(n)])
    check(f"all_to_all_single {dtype}", o, want)
    in_splits = [r + 1 for r in range(n)]                  # rank sends r+1 rows to rank r
    srcu = torch.full((sum(in_splits),), rank + 1).to(dtype)
    out_splits = [rank + 1] * n
    o = torch.zeros(sum(out_splits), dtype=dtype, device=dev)
    dist.all_to_all_single(o, srcu.to(dev), out_splits, in_splits)
    want = torch.cat([torch.full((rank + 1,), r + 1).to(dtype) for r in range(n)])
    check(f"all_to_all_single uneven {dtype}", o, want)
    outs = [torch.zeros(2, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), 10 * rank + j).to(dtype).to(dev) for j in range(n)])
    for r in range(n):
        check(f"all_to_all {r} {dtype}", outs[r], torch.full((2,), 10 * r + rank).to(dtype))
    # send / recv in a ring
    t = vals(rank, dtype).to(dev)
    r_ = torch.zeros(5, dtype=dtype, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, (rank + 1) % n),
                                   dist.P2POp(dist.irecv, r_, (rank - 1) % n)])
    for q in reqs:
        q.wait()
    check(f"send/recv {dtype}", r_, vals((rank - 1) % n, dtype))
    if rank == 0:
        dist.send(vals(7, dtype).to(dev), 1)
    elif rank == 1:
        r_ = torch.zeros(5, dtype=dtype, device=dev)
        dist.recv(r_, 0)
        check(f"recv {dtype}", r_, vals(7, dtype))

# bool: sum is any, product all
b = torch.tensor([rank == 0, True, False]).to(dev)
dist.all_reduce(b)
check("all_reduce bool sum", b, torch.tensor([True, True, False]))
# async op: Work API and future
t = torch.full((1 << 16,), float(rank + 1), device=dev)
w = dist.all_reduce(t, async_op=True)
fut = w.get_future()
assert w.wait() is True and w.is_completed() and w.exception() is None
check("async all_reduce", t, torch.full((1 << 16,), float(n * (n + 1) // 2)))
check("future", fut.wait()[0], torch.full((1 << 16,), float(n * (n + 1) // 2)))
# gather / scatter, CPU tensors (staged through the device), objects
g = [torch.zeros(3) for _ in range(n)] if rank == 0 else None
dist.gather(torch.full((3,), float(rank)), g, dst=0)
if g is not None:
    for r in range(n):
        check(f"gather {r}", g[r], torch.full((3,), float(r)))
s = torch.zeros(2)
dist.scatter(s, [torch.full((2,), float(r * 3)) for r in range(n)] if rank == 0 else None, src=0)
check("scatter", s, torch.full((2,), float(rank * 3)))
objs = [None] * n
dist.all_gather_object(objs, {"rank": rank})
assert objs == [{"rank": r} for r in range(n)], objs
dist.barrier()
try:
    dist.all_reduce(torch.zeros(4, 4, device=dev).t())
    refused = "accepted"
except ValueError as exc:
    refused = str(exc)
check("refuses.non_contiguous", torch.tensor("tensors must be contiguous" in refused), torch.tensor(True))


def case(op, count):
    """(run the op once, check it once more on fresh inputs) for _worker.table."""
    x = torch.full((count,), float(rank + 1), device=dev)
    part = torch.full((count // n,), float(rank + 1), device=dev)
    out = torch.empty(count // n if op == "reduce_scatter" else count, device=dev)

    def run():
        if op == "all_reduce":
            dist.all_reduce(x)
        elif op == "all_gather":
            dist.all_gather_single(out, part)
        elif op == "broadcast":
            dist.broadcast(x, src=0)
        else:
            dist.reduce_scatter_single(out, x)

    def check():
        x.fill_(float(rank + 1))
        part.fill_(float(rank + 1))
        run()
        if op == "all_gather":
            return torch.equal(out.cpu(), torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(count // n))
        if op == "reduce_scatter":
            return torch.equal(out.cpu(), torch.full((count // n,), float(n * (n + 1) // 2)))
        if op == "broadcast":
            return torch.equal(x.cpu(), torch.full((count,), 1.0))
        return torch.equal(x.cpu(), torch.full((count,), float(n * (n + 1) // 2)))
    return run, check


if args.sizes:
    table(lines, n, args.sizes, case, anychip.torch.synchronize, dist.barrier)
direct = getattr(dist.distributed_c10d._get_default_group(), "_direct", None)   # what the C++ path enqueued
print(f"DIRECT {json.dumps(direct.issued() if direct is not None else None, sort_keys=True)}", flush=True)
dist.destroy_process_group()
sys.exit(lines.done())
