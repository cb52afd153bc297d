"""What Paddle's test/custom_runtime/process_group_xccl.py checks, with its value checks on (the
original has them commented out) and for every op it lists: core.ProcessGroupCustom over a
TCPStore on the device type, all_reduce (SUM, MAX), broadcast, barrier, all_gather, alltoall,
reduce and scatter, each task's wait(). Run by Paddle's launcher, 2 ranks; argv[1] is the store's
port. Prints RESULT {check: true | "what differed"} and, for the original's
`assert task.is_completed()` right after `wait()`, how often that held over 20 broadcasts
(Paddle defines wait() as ordering the compute stream only: docs/paddle.md).
"""
import json
import sys

import numpy as np
import paddle
from paddle.base import core

env = paddle.distributed.ParallelEnv()
rank, nranks = env.local_rank, env.nranks
paddle.set_device(f"{env.device_type}:{env.dev_id}")
store = core.TCPStore("127.0.0.1", int(sys.argv[1]), rank == 0, nranks)
pg = core.ProcessGroupCustom.create(store, env.device_type, rank, nranks)
res = {}


def check(name, got, want):
    res[name] = True if np.array_equal(np.asarray(got), np.asarray(want)) else f"{got} != {want}"


def inputs(shape=(2, 10, 5)):
    rng = np.random.default_rng(2022)                    # the same on both ranks: each knows the other's
    return [rng.random(shape).astype("float32") for _ in range(nranks)]


xs = inputs()
t = paddle.to_tensor(xs[rank])
pg.all_reduce(t, core.ReduceOp.SUM, sync_op=True).wait()
check("all_reduce_sum", t.numpy(), xs[0] + xs[1])
xs = inputs()
t = paddle.to_tensor(xs[rank])
pg.all_reduce(t, core.ReduceOp.MAX, sync_op=True).wait()
check("all_reduce_max", t.numpy(), np.maximum(xs[0], xs[1]))

completed = 0
for i in range(20):
    xs = inputs((1 << 16,))
    t = paddle.to_tensor(xs[rank])
    task = pg.broadcast(t, 0, sync_op=True)
    task.wait()
    completed += bool(task.is_completed())
    check(f"broadcast_{i}", t.numpy(), xs[0])
    paddle.device.synchronize()
    res[f"broadcast_{i}_completed_after_synchronize"] = task.is_completed()
res["completed_right_after_wait"] = completed

task = pg.barrier(env.dev_id)
task.wait()
res["barrier_completed_after_wait"] = task.is_completed()     # Paddle's barrier wait() synchronizes the device

xs = inputs()
out = paddle.to_tensor(np.zeros((4, 10, 5), "float32"))
pg.all_gather(out, paddle.to_tensor(xs[rank]), sync_op=True).wait()
check("all_gather", out.numpy(), np.concatenate(xs))
xs = inputs()
out = paddle.to_tensor(np.zeros((2, 10, 5), "float32"))
pg.all_to_all_tensor(out, paddle.to_tensor(xs[rank]), True).wait()      # dist.alltoall_single's call
check("alltoall", out.numpy(), np.concatenate([xs[0][rank:rank + 1], xs[1][rank:rank + 1]]))
xs = inputs()                                       # the original's pg.alltoall(in, out), documented so
t, out = paddle.to_tensor(xs[rank]), paddle.to_tensor(np.zeros((2, 10, 5), "float32"))
pg.alltoall(t, out).wait()
check("alltoall_legacy_fills_its_first_argument", t.numpy(), np.concatenate([np.zeros((1, 10, 5), "float32")] * 2))
xs = inputs()
t = paddle.to_tensor(xs[rank])
pg.reduce(t, 0).wait()
if rank == 0:
    check("reduce", t.numpy(), xs[0] + xs[1])
xs = inputs((4, 10, 5))
out = paddle.to_tensor(np.zeros((2, 10, 5), "float32"))
pg.scatter(paddle.to_tensor(xs[rank]), out, 0).wait()
check("scatter", out.numpy(), xs[0][2 * rank:2 * rank + 2])
print("RESULT " + json.dumps(res), flush=True)
