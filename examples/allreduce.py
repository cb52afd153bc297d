"""All-reduce across ranks: run with `anychip launch -n 4 --device ascend examples/allreduce.py`.

Rank r contributes [r, r + 1, ..., r + 7]; every rank prints the sum over ranks and
checks it against the formula.
"""
import numpy as np

from anychip import collectives

comm = collectives.init()
n = 8
x = np.arange(n, dtype=np.float32) + comm.rank
buf = comm.device.alloc(x.nbytes).copy_from(x)

comm.all_reduce(buf, op="sum").wait()

result = buf.to_numpy(np.float32)
expected = np.arange(n, dtype=np.float32) * comm.size + sum(range(comm.size))
status = "correct" if np.array_equal(result, expected) else f"WRONG (expected {expected})"
print(f"rank {comm.rank} of {comm.size} on {comm.device}: {result.tolist()} {status}")
comm.destroy()
raise SystemExit(0 if status == "correct" else 1)
