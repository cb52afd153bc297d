"""A c10d fault on the anychip backend: `kill` (rank 1 dies by SIGKILL), `timeout` (rank 1 never
joins) or `late` (rank 1 joins 1.5 s late: rank 0's Work.wait(timeout=0.3 s) runs out first) or `abort`
(rank 1 never joins; rank 0 aborts its process group under the pending op).
Rank 0 prints PATH direct|python: whether its all_reduce took the process group's C++ path."""
import os
import signal
import sys
import time
from datetime import timedelta

import short_timeout_group
import torch
import torch.distributed as dist

import anychip.torch.distributed

fault = sys.argv[1]
short_timeout_group.init(float(sys.argv[2]))
rank = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
t = torch.ones(1 << 12, device=dev)
dist.all_reduce(t)                       # both ranks are up
if rank == 1:
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "late":
        time.sleep(1.5)
        dist.all_reduce(t)
        dist.destroy_process_group()
        sys.exit(0)
    time.sleep(float(sys.argv[2]) * 3)     # never joins the next op
    sys.exit(0)
work = dist.all_reduce(t, async_op=True)
print(f"PATH {'python' if isinstance(work, anychip.torch.distributed.WorkAnychip) else 'direct'}", flush=True)
fut = work.get_future()
if fault == "abort":
    time.sleep(0.2)
    start = time.monotonic()
    dist.distributed_c10d._get_default_group().abort()
    try:
        work.wait()
    except dist.DistBackendError as exc:
        print(f"ABORTED {type(exc).__name__}: {exc}", flush=True)
    print(f"AFTER completed={work.is_completed()} failed={work.exception() is not None} "
          f"quick={time.monotonic() - start < 5}", flush=True)
    try:
        fut.wait()
    except dist.DistBackendError as fexc:
        print(f"FUTURE {type(fexc).__name__}: {fexc}", flush=True)
    sys.exit(4)
if fault == "late":
    try:
        work.wait(timeout=timedelta(seconds=0.3))
    except dist.DistBackendError as exc:
        print(f"WAIT {type(exc).__name__}: {exc}", flush=True)
    print(f"PENDING completed={work.is_completed()} exception={work.exception()} future_done={fut.done()}",
          flush=True)
    work.wait()                          # no limit: rank 1 joins
    print(f"DONE completed={work.is_completed()} exception={work.exception()} value={t[0].item()} "
          f"future={fut.wait()[0][0].item()}", flush=True)
    dist.destroy_process_group()
    sys.exit(0)
try:
    work.wait()
except dist.DistBackendError as exc:
    print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    assert work.is_completed() and work.exception() is not None
    try:
        fut.wait()
    except dist.DistBackendError as fexc:
        print(f"FUTURE {type(fexc).__name__}: {fexc}", flush=True)
    sys.exit(3)
print("no error", flush=True)
