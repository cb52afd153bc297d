"""init_process_group("anychip") with a short group timeout for the rank scripts that test it.

The group's timeout bounds its collectives. Given to init_process_group alone, it would also bound
the rendezvous (every rank connecting to rank 0's TCP store), and on a busy machine a rank that
starts two seconds after the other fails there, before the fault under test happens. So the store
is made here with a minute to gather the ranks, and the group gets the short timeout."""
import os
from datetime import timedelta

import torch.distributed as dist


def init(seconds: float) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("anychip", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=seconds))
