"""One rank of tests/collectives/test_twohost.py, across two "hosts" (network namespaces).

    twohost_worker.py          a small and a large all_reduce; prints ``RANK r HOST h VIA
                               transport SUMS s1,s2``: the sums over each result of rank r's
                               values (r + 1) * (i + 1)
    twohost_worker.py loop S   all_reduces for S seconds (a fault is made meanwhile); prints
                               ``RANK r HOST h AFTER n ERROR Class: message`` when one fails
"""
from __future__ import annotations

import socket
import sys
import time

import numpy as np

from anychip import AnychipError, collectives

comm = collectives.init(device="cpu")
if sys.argv[1:2] == ["loop"]:
    buf = comm.device.alloc(4 * 50_000)
    n, end = 0, time.monotonic() + float(sys.argv[2])
    try:
        while time.monotonic() < end:
            comm.all_reduce(buf).wait()
            n += 1
    except AnychipError as exc:
        print(f"RANK {comm.rank} HOST {socket.gethostname()} AFTER {n} ERROR {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
    print(f"RANK {comm.rank} HOST {socket.gethostname()} AFTER {n} NO FAULT", flush=True)
    comm.destroy()
    sys.exit(0)
sums = []
for n in (100, 50_000):
    buf = comm.device.alloc(4 * n).copy_from(np.arange(1, n + 1, dtype=np.float32) * (comm.rank + 1))
    comm.all_reduce(buf).wait()
    got = buf.to_numpy(np.float32)
    want = np.arange(1, n + 1, dtype=np.float32) * (comm.size * (comm.size + 1) // 2)
    sums.append(str(int(got.astype(np.float64).sum())) if np.array_equal(got, want) else "WRONG")
print(f"RANK {comm.rank} HOST {socket.gethostname()} VIA {comm.transport.name} SUMS {','.join(sums)}", flush=True)
comm.destroy()
