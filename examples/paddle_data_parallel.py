"""Data-parallel training with unmodified PaddlePaddle on anychip's simulated Ascend chips.

    python -m paddle.distributed.launch --devices 0,1,2,3 examples/paddle_data_parallel.py
    python examples/paddle_data_parallel.py --single          # the same steps on one device

A [4096, 4096] parameter, paddle.matmul, AdamW; each rank trains on its quarter of every
global batch under paddle.DataParallel (the gradients are all-reduced through HCCL on the
simulated chips). The printed loss is the global batch's, so every rank prints the same
lines as the single-device run. Paddle sees the chip as the device type anychip_ascend
(ANYCHIP_PADDLE picks another simulated chip; docs/paddle.md).
"""
import argparse

import numpy as np
import paddle
import paddle.distributed as dist


class Model(paddle.nn.Layer):
    def __init__(self, dim: int) -> None:
        super().__init__()
        init = paddle.nn.initializer.Assign(np.random.RandomState(0).randn(dim, dim).astype("float32") / dim ** 0.5)
        self.w = self.create_parameter([dim, dim], attr=paddle.ParamAttr(initializer=init))

    def forward(self, x):
        return paddle.matmul(x, self.w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--single", action="store_true", help="train on one device, without the launcher")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16, help="global batch (a multiple of the number of ranks)")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()

    device = paddle.device.get_all_custom_device_type()
    if not device:
        raise SystemExit("no anychip device in Paddle: pip install 'anychip[paddle]' (or set CUSTOM_DEVICE_ROOT, "
                         "see docs/paddle.md)")
    rank, world = 0, 1
    if not args.single:
        dist.init_parallel_env()
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        paddle.set_device(f"{device[0]}:0")
    where = f"on {world} rank{'s' if world > 1 else ''} of {paddle.device.get_device().split(':')[0]}"
    print(f"training a [{args.dim}, {args.dim}] parameter {where}", flush=True)
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} is not a multiple of the {world} ranks")

    model = Model(args.dim)
    opt = paddle.optimizer.AdamW(learning_rate=2e-4, parameters=model.parameters(), weight_decay=0.01)
    train = model if args.single else paddle.DataParallel(model)
    data = np.random.RandomState(1)
    x = data.randn(args.batch, args.dim).astype("float32")
    t = data.randn(args.batch, args.dim).astype("float32")
    share = args.batch // world
    lo, hi = rank * share, (rank + 1) * share
    xs, ts = paddle.to_tensor(x[lo:hi]), paddle.to_tensor(t[lo:hi])
    for step in range(args.steps):
        loss = paddle.mean((train(xs) - ts) ** 2)
        loss.backward()
        opt.step()
        opt.clear_grad()
        global_loss = loss.detach().clone()
        if world > 1:
            dist.all_reduce(global_loss)
            global_loss = global_loss / world
        print(f"step {step} loss {float(global_loss.numpy()):.6f}", flush=True)


if __name__ == "__main__":
    main()
