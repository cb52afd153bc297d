"""c10d on complex tensors, which torch runs through view_as_real (all_reduce, broadcast,
all_gather): the values must be reduced in the caller's complex tensor. Prints RANK <r> <values>."""
import torch
import torch.distributed as dist

import anychip.torch
import anychip.torch.distributed  # noqa: F401

dist.init_process_group("anychip")
rank = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
x = torch.tensor([1 + 2j, -3j], device=dev) * (rank + 1)
dist.all_reduce(x)
b = torch.tensor([5 + 1j], device=dev) * (rank + 1)
dist.broadcast(b, 1)
g = [torch.zeros(1, dtype=torch.complex64, device=dev) for _ in range(dist.get_world_size())]
dist.all_gather(g, torch.tensor([rank - 1j], device=dev))
print("RANK", rank, x.cpu().tolist(), b.cpu().tolist(), [t.item() for t in g], flush=True)
dist.destroy_process_group()
