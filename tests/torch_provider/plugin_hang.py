"""c10d on a C plugin whose all_reduce never completes (tests/c/plugin_variants.c,
VARIANT_CCL_HANG with CCL_HANG_RANKS=all), with init_process_group's timeout of argv[1] s.
Prints PATH direct|python (whether the op took the process group's C++ path), then RAISED
<seconds> <error> once Work.wait fails, and FUTURE <error> for the op's future."""
import sys
import time

import short_timeout_group
import torch
import torch.distributed as dist

import anychip.torch.distributed

short_timeout_group.init(float(sys.argv[1]))
dev = torch.device("anychip", torch.accelerator.current_device_index())
x = torch.ones(1024, device=dev)
start = time.monotonic()
work = dist.all_reduce(x, async_op=True)
print(f"PATH {'python' if isinstance(work, anychip.torch.distributed.WorkAnychip) else 'direct'}", flush=True)
fut = work.get_future()
try:
    work.wait()
except dist.DistBackendError as exc:
    print(f"RAISED {time.monotonic() - start:.1f} {exc}", flush=True)
try:
    fut.wait()
except dist.DistBackendError as exc:
    print(f"FUTURE {exc}", flush=True)
dist.destroy_process_group()
