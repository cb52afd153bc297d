"""The cost of HCCL's stream rule for anychip's default stream, in one run.

    ANYCHIP_COLLECTIVE_TRANSPORT=native anychip launch -n 2 --device ascend \
        benchmarks/bench_hccl_default_stream.py

HCCL refuses the NULL stream, which is the ascend backend's default stream, so ops issued on
it run on a stream of the transport's own joined to the default stream both ways
(collectives/transports/native.py, _side_enter). Two ranks time an 8-float all_reduce on the default
stream and on a created stream (no join), best of 3 rounds of 2000 ops each; with
``--device hygon`` (RCCL takes the NULL stream) both paths are the same."""
import contextlib
import time

import numpy as np

import anychip
from anychip import collectives

N = 2000


def per_op(comm, buf, stream):
    """Best seconds per all_reduce over 3 rounds, issued on ``stream`` (None: the default)."""
    best = float("inf")
    for _ in range(3):
        comm.barrier()
        t = time.perf_counter()
        with stream if stream is not None else contextlib.nullcontext():
            for _ in range(N):
                comm.all_reduce(buf)
        comm.device.synchronize()
        best = min(best, (time.perf_counter() - t) / N)
    return best


def main() -> None:
    comm = collectives.init()
    buf = comm.device.alloc(32).copy_from(np.ones(8, dtype=np.float32))
    default = per_op(comm, buf, None)
    created = per_op(comm, buf, anychip.Stream(comm.device))
    if comm.rank == 0:
        print(f"{comm.transport.name}: default stream {default * 1e6:.1f} us/op, "
              f"created stream {created * 1e6:.1f} us/op")
    comm.destroy()


if __name__ == "__main__":
    main()
