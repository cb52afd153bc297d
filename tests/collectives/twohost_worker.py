"""One rank of tests/collectives/test_twohost.py: an all_reduce across two "hosts" (network namespaces).

Prints ``RANK r HOST h VIA transport SUMS s1,s2`` where s1 / s2 are the sums over the result of
a small (scatter skipped) and a large all_reduce of rank r's values (r + 1) * (i + 1)."""
from __future__ import annotations

import socket

import numpy as np

from anychip import collectives

comm = collectives.init(device="cpu")
sums = []
for n in (100, 50_000):
    buf = comm.device.alloc(4 * n).copy_from(np.arange(1, n + 1, dtype=np.float32) * (comm.rank + 1))
    comm.all_reduce(buf).wait()
    got = buf.to_numpy(np.float32)
    want = np.arange(1, n + 1, dtype=np.float32) * (comm.size * (comm.size + 1) // 2)
    sums.append(str(int(got.astype(np.float64).sum())) if np.array_equal(got, want) else "WRONG")
print(f"RANK {comm.rank} HOST {socket.gethostname()} VIA {comm.transport.name} SUMS {','.join(sums)}", flush=True)
comm.destroy()
