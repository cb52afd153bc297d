"""c10d on a C plugin's collectives (tests/c/plugin_variants.c, VARIANT_CCL_SHM: all_reduce of
int32 / int64 / float32 / float64 with sum, min or max, all_gather and broadcast), on 2 ranks:
the ops the plugin has take the process group's C++ path, a float16 all_reduce (outside its
masks) the communicator's, all by value. Prints RESULT <backend> <values ok> <C++ path counts>."""
import json

import torch
import torch.distributed as dist

import anychip.torch
import anychip.torch.distributed  # noqa: F401

dist.init_process_group("anychip")
r = dist.get_rank()
dev = torch.device("anychip", torch.accelerator.current_device_index())
x = torch.full((1000,), float(r + 1), device=dev)
dist.all_reduce(x)
m = torch.full((5,), r + 7, dtype=torch.int64, device=dev)
dist.all_reduce(m, op=dist.ReduceOp.MIN)
h = torch.full((10,), float(r + 1), dtype=torch.float16, device=dev)
dist.all_reduce(h)
g = torch.empty(2000, device=dev)
dist.all_gather_into_tensor(g, x)
b = torch.full((7,), float(r), device=dev)
dist.broadcast(b, 1)
ok = bool((x.cpu() == 3).all() and (m.cpu() == 7).all() and (h.cpu() == 3).all() and (g.cpu() == 3).all()
          and (b.cpu() == 1).all())
direct = getattr(dist.distributed_c10d._get_default_group(), "_direct", None)
print(f"RESULT {anychip.torch.backend()} {ok} {json.dumps(direct.issued() if direct else None, sort_keys=True)}",
      flush=True)
dist.destroy_process_group()
