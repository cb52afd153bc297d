"""PyTorch's parallel APIs on the ``anychip`` device, on 4 ranks (a 2 x 2 mesh): tensor
parallel, FSDP2, 2-D FSDP x TP, each trained a few steps and compared with the same model
trained on one device; torch.distributed.checkpoint save / load; DTensor's random ops with
``[Replicate(), Shard(0)]`` placements. Run under ``anychip launch -n 4 --device ascend``
with a directory for the checkpoint as the argument.

Prints LOSSES <stage> <max |loss - one device's|> <losses>, CHECK <what> ok|FAIL lines and
DONE <rank> failures=<n>."""
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import anychip.torch  # noqa: F401
import anychip.torch.distributed  # noqa: F401

STEPS, BATCH = 4, 8
dist.init_process_group("anychip")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("anychip", (2, 2), mesh_dim_names=("dp", "tp"))
dev = torch.device("anychip", torch.anychip.current_device())
failures = 0


def check(what: str, ok: bool, detail: object = "") -> None:
    global failures
    failures += not ok
    print(f"CHECK {what} {'ok' if ok else 'FAIL'} {detail if not ok else ''}".rstrip(), flush=True)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def model() -> MLP:
    torch.manual_seed(0)
    return MLP()


g = torch.Generator().manual_seed(1)
DATA = [(torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 16, generator=g)) for _ in range(STEPS)]


def train(net: torch.nn.Module, shard: int, shards: int, group: dist.ProcessGroup | None) -> list[float]:
    """STEPS of SGD on this rank's share of each batch; the loss of the whole batch (the shares'
    mean over ``group``)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for x, y in DATA:
        xs, ys = x.chunk(shards)[shard].to(dev), y.chunk(shards)[shard].to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if group is not None:
            dist.all_reduce(total, group=group)
            total /= shards
        losses.append(total.item())
    return losses


def compare(stage: str, losses: list[float], tol: float) -> None:
    diff = max(abs(a - b) for a, b in zip(losses, ONE, strict=True))
    print(f"LOSSES {stage} {diff:.3g} {' '.join(f'{v:.7f}' for v in losses)}", flush=True)
    check(f"{stage}.losses", diff <= tol, f"{losses} vs {ONE}")


ONE = train(model().to(dev), 0, 1, None)
print(f"LOSSES one_device 0 {' '.join(f'{v:.7f}' for v in ONE)}", flush=True)
PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}

# tensor parallel over the mesh's "tp" dimension (each "dp" row trains the whole batch)
tp = parallelize_module(model().to(dev), mesh["tp"], PLAN)
check("tp.sharded", tuple(tp.up.weight.to_local().shape) == (16, 16) and tp.up.weight.placements == (Shard(0),))
compare("tensor_parallel", train(tp, 0, 1, None), 1e-6)

# FSDP2 over all 4 ranks (a 1-D mesh), each rank a quarter of the batch
flat = init_device_mesh("anychip", (world,))
fsdp = model().to(dev)     # (FSDP2's own move of CPU parameters swaps .data across device types: item 3's)
fully_shard(fsdp, mesh=flat)
check("fsdp.sharded", fsdp.up.weight.to_local().shape[0] == 32 // world and fsdp.up.weight.device == dev)
compare("fsdp2", train(fsdp, rank, world, dist.group.WORLD), 1e-6)

# 2-D: tensor parallel within "tp", FSDP2 across "dp"; each "dp" row trains half the batch
two_d = parallelize_module(model().to(dev), mesh["tp"], PLAN)
fully_shard(two_d, mesh=mesh["dp"])
dp_rank = mesh.get_local_rank("dp")
compare("fsdp_x_tp", train(two_d, dp_rank, 2, mesh.get_group("dp")), 1e-6)

# DCP: the 2-D model's state saved, loaded into a fresh 2-D model, equal to the trained one
dcp.save(two_d.state_dict(), checkpoint_id=sys.argv[1])
fresh = parallelize_module(model().to(dev), mesh["tp"], PLAN)
fully_shard(fresh, mesh=mesh["dp"])
state = fresh.state_dict()
dcp.load(state, checkpoint_id=sys.argv[1])
fresh.load_state_dict(state)
same = all(torch.equal(a.full_tensor().cpu(), b.full_tensor().cpu())
           for a, b in zip(two_d.state_dict().values(), fresh.state_dict().values(), strict=True))
changed = not torch.equal(fresh.up.weight.full_tensor().cpu(), model().up.weight)
check("dcp.load_equals_saved", same and changed)

# DTensor random ops on [Replicate(), Shard(0)]: the rows of "dp" hold the same shard, the two
# shards of "tp" differ; the same seed gives the same tensor; every rank's generator ends equal
torch.manual_seed(5)
a = torch.distributed.tensor.randn(8, 4, device_mesh=mesh, placements=[Replicate(), Shard(0)])
local = a.to_local().cpu()
peers = [torch.empty_like(local) for _ in range(world)]
dist.all_gather_object(peers, local)
coords = [divmod(r, 2) for r in range(world)]          # rank -> (dp, tp)
replicas = all(torch.equal(peers[r], peers[s]) for r in range(world) for s in range(world)
               if coords[r][1] == coords[s][1])
shards_differ = not torch.equal(peers[0], peers[1])
check("dtensor.random_replicas_equal", replicas, peers)
check("dtensor.random_shards_differ", shards_differ)
full = a.full_tensor().cpu()
check("dtensor.random_values", full.shape == (8, 4) and 0.3 < full.std().item() < 3 and full.abs().sum() > 0)
states = [None] * world
dist.all_gather_object(states, torch.anychip.get_rng_state().tolist())
check("dtensor.generators_in_step", all(s == states[0] for s in states))
torch.manual_seed(5)
again = torch.distributed.tensor.randn(8, 4, device_mesh=mesh, placements=[Replicate(), Shard(0)])
check("dtensor.random_reproduces", torch.equal(again.full_tensor().cpu(), full))
init = distribute_tensor(torch.zeros(8, 4, device=dev), mesh, [Replicate(), Shard(0)])
torch.nn.init.uniform_(init, -1, 1)
box = init.full_tensor().cpu()
check("dtensor.uniform_init", bool((box.abs() <= 1).all()) and len(box.unique()) == 32)

print(f"DONE {rank} failures={failures}", flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
