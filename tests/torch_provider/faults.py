"""A c10d fault on the anychip backend: `kill` (rank 1 dies by SIGKILL) or `timeout` (rank 1 never joins)."""
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import anychip.torch.distributed  # noqa: F401

fault = sys.argv[1]
dist.init_process_group("anychip", timeout=timedelta(seconds=float(sys.argv[2])))
rank = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
t = torch.ones(1 << 12, device=dev)
dist.all_reduce(t)                       # both ranks are up
if rank == 1:
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(sys.argv[2]) * 3)     # never joins the next op
    sys.exit(0)
work = dist.all_reduce(t, async_op=True)
try:
    work.wait()
except dist.DistBackendError as exc:
    print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    assert work.is_completed() and work.exception() is not None
    sys.exit(3)
print("no error", flush=True)
