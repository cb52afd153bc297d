"""Two c10d groups of one process with different timeouts (run by test_torch_c10d.py under
`anychip launch -n 2`): the world's is WORLD seconds, a second group's SHORT.

    two_timeouts.py WORLD SHORT

Rank 1 skips an all_reduce on the short group: rank 0's fails after that group's timeout
(printed: 'SHORT <seconds>|<message>'); then both ranks all_reduce on the world, which still
works ('WORLD <value>'). Every rank prints 'ENV <ANYCHIP_COLLECTIVE_TIMEOUT or unset>' after
the groups are made (the backend must not write it), and 'SET <error>' for the short group's
set_timeout, which is refused."""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import anychip.torch.distributed  # noqa: F401  (registers the backend)

world_s, short_s = float(sys.argv[1]), float(sys.argv[2])
before = os.environ.get("ANYCHIP_COLLECTIVE_TIMEOUT", "unset")
dist.init_process_group("anychip", timeout=timedelta(seconds=world_s))
short = dist.new_group([0, 1], timeout=timedelta(seconds=short_s))
rank = dist.get_rank()
after = os.environ.get("ANYCHIP_COLLECTIVE_TIMEOUT", "unset")
print(f"ENV {before} {after}", flush=True)
try:                                          # a group's timeout is fixed when it is made: refused
    short.set_timeout(timedelta(seconds=60))
    print("SET none", flush=True)
except NotImplementedError as exc:
    print(f"SET {exc}", flush=True)
dev = torch.device("anychip", torch.accelerator.current_device_index())
t = torch.ones(1 << 10, device=dev)
dist.all_reduce(t, group=short)               # both ranks are up, on both groups
dist.all_reduce(t)
store = dist.distributed_c10d._get_default_store()
if rank == 0:
    start = time.monotonic()
    try:
        dist.all_reduce(t, group=short)       # rank 1 never joins this one
        print("SHORT none", flush=True)
    except dist.DistBackendError as exc:
        print(f"SHORT {time.monotonic() - start:.2f}|{exc}".replace("\n", " "), flush=True)
    store.set("short_failed", "1")
else:
    store.get("short_failed")                 # (the store's own wait: until rank 0 is past its failure)
dist.destroy_process_group(short)
w = torch.full((4,), float(rank + 1), device=dev)
dist.all_reduce(w)                            # the world's long timeout: unaffected
print(f"WORLD {w.cpu().tolist()}", flush=True)
dist.destroy_process_group()
