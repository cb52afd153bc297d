"""Rank program for tests/parallel/test_parallel.py: many reshard, matmul and autograd checks
against NumPy in one launch. Prints ``PASS <n> cases`` when every check holds."""
from __future__ import annotations

import itertools
import sys

import numpy as np

from anychip import parallel as dist
from anychip.parallel import Partial, ProcessMesh, Replicate, Shard, _reshard
from anychip.parallel._sharding import local_box

cases = 0


def check(cond: bool, what: str) -> None:
    global cases
    if not cond:
        raise AssertionError(what)
    cases += 1


def data(shape: tuple[int, ...]) -> np.ndarray:
    """Small integers: every sum is exact in float32."""
    return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) % 11) - 4


def make(arr: np.ndarray, mesh: ProcessMesh, pl: list) -> dist.DistTensor:
    """A DistTensor of ``arr`` placed ``pl``; Partial axes hold rank-dependent parts
    whose reduction is ``arr`` (so a Partial really needs its collective)."""
    coord = mesh.coordinate
    off, size = local_box(arr.shape, pl, mesh.shape, coord)
    block = arr[tuple(slice(o, o + s) for o, s in zip(off, size, strict=True))]
    axes = [a for a, p in enumerate(pl) if isinstance(p, Partial)]
    if axes:
        op = pl[axes[0]].op
        combos = list(itertools.product(*[range(mesh.shape[a]) for a in axes]))
        mine = tuple(coord[a] for a in axes)

        def noise(c: tuple) -> np.ndarray:
            return ((np.arange(block.size, dtype=np.float32).reshape(block.shape) + 3 * combos.index(c)) % 5) + 1
        if op == "sum":
            block = block - sum(noise(c) for c in combos[1:]) if mine == combos[0] else noise(mine)
        else:  # max: one rank holds the value, the others less
            block = block if mine == combos[0] else block - noise(mine)
    return dist.dtensor_from_local(np.ascontiguousarray(block, dtype=np.float32), mesh, pl, arr.shape)


def expected_local(arr: np.ndarray, mesh: ProcessMesh, pl: list, src: list) -> np.ndarray | None:
    coord = mesh.coordinate
    off, size = local_box(arr.shape, pl, mesh.shape, coord)
    block = arr[tuple(slice(o, o + s) for o, s in zip(off, size, strict=True))]
    for a, p in enumerate(pl):
        if isinstance(p, Partial):
            if src[a] == p:
                return None            # kept as it was: only the reduction is defined
            if p.op == "sum" and coord[a] != 0:
                block = np.zeros_like(block)
    return block


def reshard_all(mesh: ProcessMesh, shapes: list[tuple[int, ...]], extra: list) -> None:
    for shape in shapes:
        arr = data(shape)
        options = [Replicate(), Partial()] + [Shard(d) for d in range(len(shape))] + extra
        for src in itertools.product(options, repeat=mesh.ndim):
            if len({p.op for p in src if isinstance(p, Partial)}) > 1:
                continue
            x = make(arr, mesh, list(src))
            for dst in itertools.product(options, repeat=mesh.ndim):
                y = dist.reshard(x, mesh, list(dst))
                tag = f"{shape} {list(src)} -> {list(dst)} on {mesh.shape} rank {mesh.rank}"
                check(y.placements == tuple(dst) and y.shape == shape, f"placements/shape {tag}")
                want = expected_local(arr, mesh, list(dst), list(src))
                got = y.local_tensor().numpy()
                if want is not None:
                    check(got.shape == want.shape and np.array_equal(got, want),
                          f"local block {tag}: got {got.tolist()} want {want.tolist()}")
                check(np.array_equal(y.numpy(), arr), f"whole tensor {tag}")


def matmul_all(mesh: ProcessMesh) -> None:
    a_np, b_np = data((6, 5)), data((5, 7)) / 2
    ref = a_np @ b_np
    options = [Replicate(), Shard(0), Shard(1), Partial()]
    for pa in itertools.product(options, repeat=mesh.ndim):
        for pb in itertools.product(options, repeat=mesh.ndim):
            c = make(a_np, mesh, list(pa)) @ make(b_np, mesh, list(pb))
            check(np.array_equal(c.numpy(), ref), f"matmul {list(pa)} @ {list(pb)}")
    # the two Megatron layouts keep their data where it is
    rest = [Replicate()] * (mesh.ndim - 1)
    col = make(a_np, mesh, [Replicate(), *rest]) @ make(b_np, mesh, [Shard(1), *rest])
    check(col.placements[0] == Shard(1), f"column parallel gives {col.placements}")
    row = make(a_np, mesh, [Shard(1)] + [Replicate()] * (mesh.ndim - 1)) @ \
        make(b_np, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    check(row.placements[0] == Partial(), f"row parallel gives {row.placements}")
    check(np.array_equal(row.numpy(), ref), "row parallel value")


def mlp_grads(mesh: ProcessMesh) -> None:
    """x @ w1 + b1 -> relu -> @ w2 + b2 -> mean((y - t)^2): gradients against NumPy."""
    rng = np.random.default_rng(7)
    x, t = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    w1, b1 = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    w2, b2 = rng.standard_normal((10, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    # NumPy reference
    h = x @ w1 + b1
    r = np.maximum(h, 0)
    y = r @ w2 + b2
    loss = np.mean((y - t) ** 2)
    dy = 2 * (y - t) / y.size
    gw2, gb2 = r.T @ dy, dy.sum(0)
    dh = (dy @ w2.T) * (h > 0)
    gw1, gb1 = x.T @ dh, dh.sum(0)
    last = mesh.ndim - 1       # tensor parallel on the last mesh axis, data parallel on the first
    dp = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    rep = [Replicate()] * mesh.ndim
    col, row = list(rep), list(rep)
    col[last], row[last] = Shard(1), Shard(0)
    colb = list(rep)
    colb[last] = Shard(0)
    params = {"w1": (w1, col), "b1": (b1, colb), "w2": (w2, row), "b2": (b2, rep)}
    if mesh.ndim == 1:
        dp = rep                   # a 1-D mesh: tensor parallel only
    P = {k: dist.shard_tensor(v, mesh, pl, requires_grad=True) for k, (v, pl) in params.items()}
    X, T = dist.shard_tensor(x, mesh, dp), dist.shard_tensor(t, mesh, dp)
    Y = (X @ P["w1"] + P["b1"]).relu() @ P["w2"] + P["b2"]
    D = Y - T
    L = (D * D).mean()
    L.backward()
    check(abs(L.item() - loss) <= 1e-5 * abs(loss), f"loss {L.item()} vs {loss}")
    for k, ref in (("w1", gw1), ("b1", gb1), ("w2", gw2), ("b2", gb2)):
        g = P[k].grad
        # Partial on the data-parallel axis (left for the optimizer), the parameter's placement elsewhere
        want = [Partial() if dp[0] == Shard(0) and a == 0 else p for a, p in enumerate(P[k].placements)]
        check(g is not None and list(g.placements) == want, f"grad {k} placed {g and g.placements}, want {want}")
        check(np.allclose(g.numpy(), ref, rtol=1e-5, atol=1e-6), f"grad {k}: {g.numpy()} vs {ref}")
        before = dict(_reshard.counts)
        reduced = dist.reshard(g, mesh, P[k].placements)
        spent = {kind: n - before.get(kind, 0) for kind, n in _reshard.counts.items() if n != before.get(kind, 0)}
        check(spent == ({"all_reduce": 1} if dp[0] == Shard(0) and mesh.shape[0] > 1 else {}),
              f"grad {k}: reducing it took {spent}")
        check(np.allclose(reduced.numpy(), ref, rtol=1e-5, atol=1e-6), f"reduced grad {k}")


def partial_seed(mesh: ProcessMesh) -> None:
    """backward(grad=) with a Partial gradient: each rank passes its own part on."""
    x = data((5, 3))
    for pl in ([Replicate()] * mesh.ndim, [Shard(0)] + [Replicate()] * (mesh.ndim - 1)):
        X = dist.shard_tensor(x, mesh, pl, requires_grad=True)
        seed = dist.shard_tensor(np.float32(2.0), mesh, [Partial()] * mesh.ndim)
        X.mean().backward(grad=seed)
        check(np.allclose(X.grad.numpy(), np.full((5, 3), 2.0 / 15, np.float32)), f"mean grad {pl}: {X.grad.numpy()}")


def main() -> None:
    suite = sys.argv[1]
    world = dist.world()
    n = world.size
    if suite == "all":
        mesh1 = ProcessMesh(list(range(n)), ["x"])
        reshard_all(mesh1, [(8, 4), (5, 7), (3, 2), (3, 5, 2)], [Partial("max")])
        matmul_all(mesh1)
        mlp_grads(mesh1)
        partial_seed(mesh1)
        if n == 4:
            mesh2 = ProcessMesh([[0, 1], [2, 3]], ["x", "y"])
            reshard_all(mesh2, [(4, 6), (5, 3)], [])
            matmul_all(mesh2)
            mlp_grads(mesh2)
            partial_seed(mesh2)
    print(f"PASS {cases} cases", flush=True)
    world.destroy()


if __name__ == "__main__":
    main()
