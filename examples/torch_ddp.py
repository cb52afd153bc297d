"""Data-parallel training with PyTorch's DistributedDataParallel over the ``anychip`` c10d backend.

    anychip launch -n 2 --device ascend examples/torch_ddp.py
    python -m torch.distributed.run --nproc-per-node 2 examples/torch_ddp.py     # the same, under torchrun

An MLP (32-64-4) trained with SGD and momentum on the ``anychip`` device (the simulated
Ascend; ``ANYCHIP_TORCH`` picks another backend, docs/torch.md). Each rank trains on its
share of every global batch; DDP all-reduces the gradients through the ``anychip`` backend
(the chip's collective library: HCCL on the simulated Ascend). The printed loss is the
global batch's. With ``--check``, rank 0 then trains the same model on one device, shard by
shard, summing the gradients as the all-reduce does, and exits non-zero unless every loss
is equal to the distributed run's.
"""
import argparse
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import anychip.torch.distributed  # noqa: F401  (registers the "anychip" backend)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 32, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(steps)]


def single_device(data, n: int, device: torch.device) -> list[float]:
    """One device, the global batch in n shards: the grads summed in rank order, as DDP's all-reduce."""
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in data:
        grads, loss_sum = None, None
        for xs, ys in zip(x.chunk(n), y.chunk(n), strict=True):
            net.zero_grad()
            loss = torch.nn.functional.mse_loss(net(xs.to(device)), ys.to(device))
            loss.backward()
            g = [p.grad / n for p in net.parameters()]          # DDP divides by the world size, then sums
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        for p, g in zip(net.parameters(), grads, strict=True):
            p.grad = g
        opt.step()
        losses.append((loss_sum / n).item())
    return losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=64, help="global batch size")
    p.add_argument("--check", action="store_true", help="compare every loss with a single-device run")
    args = p.parse_args()

    dist.init_process_group("anychip")
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("anychip", torch.accelerator.current_device_index())
    net = DistributedDataParallel(model().to(device))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    data = batches(args.steps, args.batch)
    losses = []
    for step, (x, y) in enumerate(data):
        xs, ys = x.chunk(n)[rank].to(device), y.chunk(n)[rank].to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append((total / n).item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}", flush=True)
    status = 0
    if args.check and rank == 0:
        ref = single_device(data, n, device)
        if ref == losses:
            print(f"losses equal one device's ({len(ref)} steps, {n} ranks on {anychip.torch.backend()})")
        else:
            print(f"MISMATCH: distributed {losses}\n          one device  {ref}")
            status = 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
