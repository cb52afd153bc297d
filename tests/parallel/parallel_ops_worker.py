"""Rank program for tests/parallel/test_parallel.py: the transformer ops (forward and gradient) for
every input placement against NumPy, the collectives that Megatron's column -> row pair and
gradient accumulation derive (counted), and ZeRO's memory per rank. Prints ``PASS <n> cases``.

    anychip launch -n 2 --device cpu tests/parallel/parallel_ops_worker.py ops|megatron|accumulate|zero
"""
from __future__ import annotations

import gc
import itertools
import math
import sys

import numpy as np
from parallel_worker import make

from anychip import parallel as dist
from anychip.parallel import Partial, ProcessMesh, Replicate, Shard, _reshard

cases = 0
R = Replicate()


def check(cond: bool, what: str) -> None:
    global cases
    if not cond:
        raise AssertionError(what)
    cases += 1


def close(got: np.ndarray, want: np.ndarray, what: str, tol: float = 2e-5) -> None:
    check(got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol),
          f"{what}: got {np.asarray(got).ravel()[:6]} ({got.shape}) want {np.asarray(want).ravel()[:6]} ({want.shape})")


def rand(shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


_erf = np.vectorize(math.erf)


def placements(mesh: ProcessMesh, ndim: int, partial: bool = True, every: int = 1) -> list[list]:
    """Every placement of an ``ndim``-d tensor on ``mesh`` (beyond 2 ranks, with ``every`` > 1,
    every ``every``-th of them on a 2-D mesh and every other one on a 1-D mesh, to keep the run
    short: each axis' options still all appear)."""
    options = [R] + [Shard(d) for d in range(ndim)] + ([Partial()] if partial else [])
    combos = [list(p) for p in itertools.product(options, repeat=mesh.ndim)]
    if mesh.size <= 2 or every == 1:
        return combos
    return combos[::every] if mesh.ndim > 1 else combos[::2]


def counted(fn):
    """(fn's result, the collectives reshard issued while it ran)."""
    with Spent() as spent:
        out = fn()
    return out, spent


class Spent(dict):
    """The collectives reshard issued inside the ``with`` block, by kind."""

    def __enter__(self) -> Spent:
        self.before = dict(_reshard.counts)
        return self

    def __exit__(self, *exc: object) -> None:
        self.update({k: n - self.before.get(k, 0) for k, n in _reshard.counts.items() if n != self.before.get(k, 0)})


# -- ops: forward and gradient for every placement of the input -----------------------------------

def unary_ops(mesh: ProcessMesh) -> None:
    x = rand((4, 6), 1)
    c = rand((4, 6), 2)
    sm = np.exp(x - x.max(1, keepdims=True))
    sm /= sm.sum(1, keepdims=True)
    sm0 = np.exp(x - x.max(0, keepdims=True))
    sm0 /= sm0.sum(0, keepdims=True)
    phi = 0.5 * (1 + _erf(x / np.sqrt(2)))
    th = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))
    refs = {
        "neg": (lambda t: -t, -x, -c),
        "pow": (lambda t: t ** 3, x ** 3, 3 * x ** 2 * c),
        "div": (lambda t: t / 2.0, x / 2, c / 2),
        "rdiv": (lambda t: 1.0 / (t * t + 1.0), 1 / (x * x + 1), -2 * x / (x * x + 1) ** 2 * c),
        "exp": (lambda t: t.exp(), np.exp(x), np.exp(x) * c),
        "tanh": (lambda t: t.tanh(), np.tanh(x), (1 - np.tanh(x) ** 2) * c),
        "relu": (lambda t: t.relu(), np.maximum(x, 0), (x > 0) * c),
        "gelu": (dist.gelu, x * phi, (phi + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)) * c),
        "gelu_tanh": (lambda t: dist.gelu(t, approximate=True), 0.5 * x * (1 + th),
                      (0.5 * (1 + th) + 0.5 * x * (1 - th ** 2) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x * x)) * c),
        "softmax": (dist.softmax, sm, sm * (c - (c * sm).sum(1, keepdims=True))),
        "softmax0": (lambda t: dist.softmax(t, axis=0), sm0, sm0 * (c - (c * sm0).sum(0, keepdims=True))),
    }
    C = dist.shard_tensor(c, mesh, [R] * mesh.ndim)
    for name, (fn, fwd, grad) in refs.items():
        for pl in placements(mesh, 2):
            X = make(x, mesh, pl)
            X.requires_grad = True
            Y = fn(X)
            tag = f"{name} {pl} on {mesh.shape}"
            close(Y.numpy(), fwd, tag)
            (Y * C).sum().backward()
            close(X.grad.numpy(), grad, f"grad {tag}", 1e-4)


def layer_norm_ops(mesh: ProcessMesh) -> None:
    x, c = rand((2, 3, 8), 3, 2.0), rand((2, 3, 8), 4)
    w, b = rand((8,), 5) + 1, rand((8,), 6)
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    xh = (x - mu) * rstd
    dxh = c * w
    dx = rstd * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    C = dist.shard_tensor(c, mesh, [R] * mesh.ndim)
    for pl in placements(mesh, 3):
        for wpl in ([R] * mesh.ndim, [Shard(0)] + [R] * (mesh.ndim - 1)):
            X = make(x, mesh, pl)
            X.requires_grad = True
            W = dist.shard_tensor(w, mesh, wpl, stop_gradient=False)
            B = dist.shard_tensor(b, mesh, [R] * mesh.ndim, stop_gradient=False)
            Y = dist.layer_norm(X, 8, W, B)
            tag = f"layer_norm {pl} weight {wpl}"
            close(Y.numpy(), xh * w + b, tag, 1e-4)
            (Y * C).sum().backward()
            close(X.grad.numpy(), dx, f"grad x {tag}", 1e-4)
            close(W.grad.numpy(), (c * xh).sum((0, 1)), f"grad w {tag}", 1e-4)
            close(B.grad.numpy(), c.sum((0, 1)), f"grad b {tag}", 1e-4)


def linear_grad(name: str, c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The gradient of a linear shape op: its transpose applied to ``c``."""
    if name in ("split", "merge", "merge_last", "keep0"):
        return c.reshape(shape)
    if name == "transpose":
        return c.transpose(1, 0, 2)
    if name == "transpose_last":
        return c.transpose(0, 2, 1)
    if name == "sum1":
        return np.broadcast_to(c[:, None], shape)
    if name in ("sum_keep", "sum_all"):
        return np.broadcast_to(c, shape)
    if name == "mean_all":
        return np.broadcast_to(c / math.prod(shape), shape)
    return np.broadcast_to(c[:, :, None] / shape[2], shape)


def shape_ops(mesh: ProcessMesh) -> None:
    x = rand((4, 6, 8), 7)
    cases_ = {
        "split": (lambda t: t.reshape([4, 6, 2, 4]), x.reshape(4, 6, 2, 4)),
        "merge": (lambda t: dist.reshape(t, [24, 8]), x.reshape(24, 8)),
        "merge_last": (lambda t: t.reshape([4, -1]), x.reshape(4, 48)),
        "keep0": (lambda t: t.reshape([0, 2, 3, 8]), x.reshape(4, 2, 3, 8)),
        "transpose": (lambda t: dist.transpose(t, [1, 0, 2]), x.transpose(1, 0, 2)),
        "transpose_last": (lambda t: t.transpose([0, 2, 1]), x.transpose(0, 2, 1)),
        "sum1": (lambda t: t.sum(axis=1), x.sum(1)),
        "sum_keep": (lambda t: dist.sum(t, -1, keepdim=True), x.sum(-1, keepdims=True)),
        "sum_all": (lambda t: t.sum(), x.sum()),
        "mean_all": (dist.mean, x.mean()),
        "mean2": (lambda t: t.mean(axis=2), x.mean(2)),
    }
    for name, (fn, fwd) in cases_.items():
        c = rand(fwd.shape, 8)
        C = dist.shard_tensor(c, mesh, [R] * mesh.ndim)
        for pl in placements(mesh, 3, every=3):
            X = make(x, mesh, pl)
            X.requires_grad = True
            Y = fn(X)
            tag = f"{name} {pl} on {mesh.shape} -> {list(Y.placements)}"
            close(Y.numpy(), fwd, tag, 1e-4)
            (Y * C).sum().backward()
            want = linear_grad(name, c, x.shape)
            close(X.grad.numpy(), want, f"grad {tag}", 1e-4)
    # heads: a Shard of the feature dimension splits into a Shard of the heads, no communication
    if mesh.ndim == 1 and mesh.shape[0] > 1 and 8 % mesh.shape[0] == 0:
        X = dist.shard_tensor(x, mesh, [Shard(2)])
        Y, spent = counted(lambda: X.reshape([4, 6, mesh.shape[0], 8 // mesh.shape[0]]))
        check(Y.placements == (Shard(2),) and spent == {}, f"heads split: {Y.placements} {spent}")


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    g = g.sum(tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(tuple(d for d, n in enumerate(shape) if n == 1 and g.shape[d] != 1), keepdims=True)


def matmul_ops(mesh: ProcessMesh) -> None:
    pairs = {
        "3d@2d": ((2, 3, 4), (4, 5), False, False),
        "3d@2d.T": ((2, 3, 4), (5, 4), False, True),
        "3d.T@2d": ((2, 4, 3), (4, 5), True, False),
        "4d@4d.T": ((2, 2, 3, 4), (2, 2, 5, 4), False, True),
        "3d.T@3d": ((2, 4, 3), (2, 4, 5), True, False),
        "bcast": ((1, 3, 4), (2, 4, 5), False, False),
    }
    for name, (sa, sb, ta, tb) in pairs.items():
        a, b = rand(sa, 9), rand(sb, 10)
        av = np.swapaxes(a, -1, -2) if ta else a
        bv = np.swapaxes(b, -1, -2) if tb else b
        ref = av @ bv
        c = rand(ref.shape, 11)
        C = dist.shard_tensor(c, mesh, [R] * mesh.ndim)
        ga = unbroadcast(c @ np.swapaxes(bv, -1, -2), av.shape)
        gb = unbroadcast(np.swapaxes(av, -1, -2) @ c, bv.shape)
        ga = np.swapaxes(ga, -1, -2) if ta else ga
        gb = np.swapaxes(gb, -1, -2) if tb else gb
        for pa in placements(mesh, len(sa), every=5):
            for pb in placements(mesh, len(sb), partial=False)[:4]:
                A, B = make(a, mesh, pa), make(b, mesh, pb)
                A.requires_grad = B.requires_grad = True
                Y = dist.matmul(A, B, transpose_x=ta, transpose_y=tb)
                tag = f"{name} {pa} @ {pb} on {mesh.shape} -> {list(Y.placements)}"
                close(Y.numpy(), ref, tag, 1e-4)
                (Y * C).sum().backward()
                close(A.grad.numpy(), ga, f"grad a {tag}", 1e-4)
                close(B.grad.numpy(), gb, f"grad b {tag}", 1e-4)
    # a dense left operand is replicated (Paddle's paddle.matmul(x, w) with an unsharded batch)
    x, w = rand((3, 4), 12), rand((4, 6), 13)
    W = dist.shard_tensor(w, mesh, [Shard(1)] + [R] * (mesh.ndim - 1), stop_gradient=False)
    for y in (x @ W, dist.matmul(x, W), W.__rmatmul__(x)):
        check(y.placements[0] == Shard(1), f"dense @ column-parallel: {y.placements}")
        close(y.numpy(), x @ w, "dense @ W")


def embedding_and_loss(mesh: ProcessMesh) -> None:
    w = rand((10, 6), 14)
    ids = np.array([[1, 3, 9, 0], [9, 2, 1, 1]], np.int64)
    c = rand((2, 4, 6), 15)
    C = dist.shard_tensor(c, mesh, [R] * mesh.ndim)
    for padding in (None, 9):
        # Paddle's padding_idx: zeros in the result there, and no gradient for that row
        pad = np.ones(ids.shape, np.float32) if padding is None else (ids != padding).astype(np.float32)
        gw = np.zeros_like(w)
        np.add.at(gw, ids, c * pad[..., None])
        for wpl in placements(mesh, 2, partial=False):
            for ipl in ([R] * mesh.ndim, [Shard(0)] + [R] * (mesh.ndim - 1), [R] * (mesh.ndim - 1) + [Shard(1)]):
                W = dist.shard_tensor(w, mesh, wpl, stop_gradient=False)
                Ids = dist.shard_tensor(ids, mesh, ipl)
                Y = dist.embedding(Ids, W, padding_idx=padding)
                tag = f"embedding weight {wpl} ids {ipl} padding {padding} -> {list(Y.placements)}"
                close(Y.numpy(), w[ids] * pad[..., None], tag)
                (Y * C).sum().backward()
                close(W.grad.numpy(), gw, f"grad {tag}")
    logits = rand((8, 5), 16, 2.0)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    # Paddle's mean: over every row for a negative ignore_index (the default), over the rows kept
    # for one >= 0
    for ignore, labels in ((-100, np.array([0, 4, 2, -100, 1, 1, 3, -100])), (4, np.array([0, 4, 2, 4, 1, 1, 3, 0]))):
        keep = labels != ignore
        onehot = np.eye(5, dtype=np.float32)[np.where(keep, labels, 0)] * keep[:, None]
        rows = -np.log((p * onehot).sum(1) + (~keep))
        n = keep.sum() if ignore >= 0 else labels.size
        for pl in placements(mesh, 2):
            for reduction, want, grad in (("mean", rows.sum() / n, (p - onehot) * keep[:, None] / n),
                                          ("sum", rows.sum(), (p - onehot) * keep[:, None])):
                X = make(logits, mesh, pl)
                X.requires_grad = True
                L = dist.cross_entropy(X, labels[:, None], ignore_index=ignore, reduction=reduction)
                tag = f"cross_entropy {reduction} ignore {ignore} {pl} -> {list(L.placements)}"
                close(np.asarray(L.numpy()), np.asarray(want, np.float32), tag, 1e-5)
                L.backward()
                close(X.grad.numpy(), grad, f"grad {tag}", 1e-5)
        X = dist.shard_tensor(logits, mesh, [Shard(0)] + [R] * (mesh.ndim - 1))
        close(dist.cross_entropy(X, labels, ignore_index=ignore, reduction="none").numpy(), rows * keep,
              "cross_entropy none")


def partial_reductions(mesh: ProcessMesh) -> None:
    """Partial(prod / any / all / avg / min) reduced by reshard, from rank-dependent parts."""
    if mesh.ndim != 1:
        return
    r, n = mesh.coordinate[0], mesh.shape[0]
    base = np.array([[1.0, 2.0], [0.0, 1.0]], np.float32)
    mask = np.array([[1, 0], [0, 0]], np.float32) if r == 0 else np.array([[0, 0], [1, 0]], np.float32)
    want = {"prod": base ** n * math.factorial(n + 1), "avg": base + (n - 1) / 2, "min": base,
            "any": np.array([[1, 0], [1, 0]], np.float32) if n > 1 else mask,
            "all": np.zeros((2, 2), np.float32) if n > 1 else mask}
    parts = {"prod": base * (r + 2), "avg": base + r, "min": base + r, "any": mask, "all": mask}
    for op, part in parts.items():
        for pl in (Partial(op), Partial(reduce_type=dist.ReduceType(op))):
            X = dist.dtensor_from_local(part, mesh, [pl])
            close(dist.reshard(X, mesh, [R]).numpy(), want[op], f"Partial({op}) reduced")
    if n > 1:
        close(dist.reshard(dist.dtensor_from_local(base, mesh, [Partial("prod")]), mesh, [Shard(0)]).numpy(),
              base ** n, "Partial(prod) reduce-scattered")


def ops(mesh: ProcessMesh) -> None:
    partial_reductions(mesh)
    unary_ops(mesh)
    layer_norm_ops(mesh)
    shape_ops(mesh)
    matmul_ops(mesh)
    embedding_and_loss(mesh)


# -- collectives derived ---------------------------------------------------------------------------

def megatron(mesh: ProcessMesh) -> None:
    """Column-parallel then row-parallel on a 1-D tensor-parallel mesh: one all_reduce forward
    (where the Partial output meets the bias), one backward (where the Partial input gradient
    meets the residual's), nothing else; the parameters' gradients need no reduction."""
    x, c = rand((3, 4, 8), 20), rand((3, 4, 8), 21)
    w1, b1, w2, b2 = rand((8, 16), 22), rand((16,), 23), rand((16, 8), 24), rand((8,), 25)
    X = dist.shard_tensor(x, mesh, [R], stop_gradient=False)
    W1 = dist.shard_tensor(w1, mesh, [Shard(1)], stop_gradient=False)
    B1 = dist.shard_tensor(b1, mesh, [Shard(0)], stop_gradient=False)
    W2 = dist.shard_tensor(w2, mesh, [Shard(0)], stop_gradient=False)
    B2 = dist.shard_tensor(b2, mesh, [R], stop_gradient=False)
    C = dist.shard_tensor(c, mesh, [R])

    def forward():
        h = dist.gelu(X @ W1 + B1)
        return X + (h @ W2 + B2)
    Y, fwd = counted(forward)
    L = (Y * C).sum()
    _, bwd = counted(L.backward)
    check(fwd == {"all_reduce": 1}, f"forward collectives {fwd}")
    check(bwd == {"all_reduce": 1}, f"backward collectives {bwd}")
    h = x @ w1 + b1
    g = 0.5 * h * (1 + _erf(h / np.sqrt(2)))
    close(Y.numpy(), x + g @ w2 + b2, "megatron forward", 1e-4)
    dg = c @ w2.T
    dh = dg * (0.5 * (1 + _erf(h / np.sqrt(2))) + h * np.exp(-h * h / 2) / np.sqrt(2 * np.pi))
    for P, want in ((W1, x.reshape(-1, 8).T @ dh.reshape(-1, 16)), (B1, dh.sum((0, 1))),
                    (W2, g.reshape(-1, 16).T @ c.reshape(-1, 8)), (B2, c.sum((0, 1))), (X, c + dh @ w1.T)):
        check(P.grad.placements == P.placements, f"grad placed {P.grad.placements}, parameter {P.placements}")
        close(P.grad.numpy(), want, "megatron grad", 1e-4)


def sequence(mesh: ProcessMesh) -> None:
    """Sequence parallel: [B, S, H] sharded on S stays sharded through the row-wise ops (layer
    norm, a replicated projection, gelu, the residual) with no collective; attention's q @ k^T
    gathers the keys (one all_gather) and the result keeps the queries' rows sharded."""
    x, w = rand((2, 4, 8), 50), rand((8, 8), 51)
    X = dist.shard_tensor(x, mesh, [Shard(1)])
    W = dist.shard_tensor(w, mesh, [R])
    with Spent() as rowwise:
        H = X + dist.gelu(dist.layer_norm(X, 8) @ W)
    check(rowwise == {} and H.placements == (Shard(1),), f"row-wise ops: {dict(rowwise)}, {H.placements}")
    with Spent() as attn:
        S = dist.matmul(H, H, transpose_y=True)
    check(attn == {"all_gather": 1} and S.placements == (Shard(1),), f"q @ k^T: {dict(attn)}, {S.placements}")
    mu = x.mean(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    h = ln @ w
    want = x + 0.5 * h * (1 + _erf(h / np.sqrt(2)))
    close(H.numpy(), want, "sequence-parallel rows", 1e-4)
    close(S.numpy(), want @ want.transpose(0, 2, 1), "sequence-parallel scores", 1e-4)


def accumulate(mesh: ProcessMesh) -> None:
    """k micro-batches of data parallelism: the gradients stay Partial through every backward
    and the optimizer step reduces each once."""
    k = 3
    x, t = rand((k, 4, 6), 30), rand((k, 4, 3), 31)
    model = dist.shard_layer(dist.Linear(6, 3, seed=5), mesh)
    w0, b0 = np.array(model.weight.numpy()), np.array(model.bias.numpy())     # copies (cpu shares memory)
    opt = dist.AdamW(0.1, parameters=model.parameters())
    dp = [Shard(0)] + [R] * (mesh.ndim - 1)
    spent_backward: dict = {}
    for i in range(k):
        X, T = dist.shard_tensor(x[i], mesh, dp), dist.shard_tensor(t[i], mesh, dp)
        d = model(X) - T
        loss = (d * d).mean()
        _, spent = counted(loss.backward)
        for kind, n in spent.items():
            spent_backward[kind] = spent_backward.get(kind, 0) + n
    check(spent_backward == {}, f"backward of {k} micro-batches issued {spent_backward}")
    check(model.weight.grad.placements[0] == Partial(), f"accumulated grad {model.weight.grad.placements}")
    _, step = counted(opt.step)
    check(step == ({"all_reduce": 2} if mesh.shape[0] > 1 else {}), f"the step issued {step} for 2 parameters")
    # against NumPy: the summed gradient of the k micro-batches
    gw, gb = np.zeros_like(w0), np.zeros_like(b0)
    for i in range(k):
        dy = 2 * (x[i] @ w0 + b0 - t[i]) / t[i].size
        gw += x[i].T @ dy
        gb += dy.sum(0)
    for P, p0, g in ((model.weight, w0, gw), (model.bias, b0, gb)):
        want = p0 * (1 - 0.1 * 0.01) - 0.1 * g / (np.abs(g) + 1e-8)
        close(P.numpy(), want, "accumulated AdamW step", 1e-5)


def zero(mesh: ProcessMesh) -> None:
    """ZeRO stages 1-3 over the data-parallel axis: the same updates as unsharded AdamW, the
    collectives each stage derives, and the memory its states take on this rank."""
    x, t = rand((8, 64), 40), rand((8, 64), 41)
    dp = [Shard(0)] + [R] * (mesh.ndim - 1)
    results = {}
    dev = mesh.device
    for stage in (0, 1, 2, 3):
        gc.collect()
        base = dev.memory_stats()["allocated_bytes.all.current"]
        dev.reset_peak_memory_stats()
        model = dist.shard_layer(dist.Linear(64, 64, seed=6), mesh)
        opt = dist.AdamW(0.01, parameters=model.parameters())
        if stage:
            opt = dist.shard_optimizer(opt, getattr(dist, f"ShardingStage{stage}")(0, mesh))
        X, T = dist.shard_tensor(x, mesh, dp), dist.shard_tensor(t, mesh, dp)
        losses = []
        for _ in range(2):
            with Spent() as forward:
                d = model(X) - T
            loss = (d * d).mean()
            with Spent() as spent:
                loss.backward()
                opt.step()
            opt.clear_grad()
            losses.append(loss.item())
        collectives = {"forward": dict(forward), "backward and step": dict(spent)}
        state = sum(m.nbytes + v.nbytes for m, v in opt._state.values())
        params = sum(p.local_tensor().nbytes for p in opt.params)
        del d, loss
        gc.collect()
        stats = dev.memory_stats()
        held = stats["allocated_bytes.all.current"] - base, stats["allocated_bytes.all.peak"] - base
        results[stage] = (losses, collectives, state, params, held)
        del model, opt, X, T
    n = mesh.shape[0]
    full_state = 2 * 4 * (64 * 64 + 64)
    check(results[0][2] == full_state, f"unsharded states {results[0][2]}")
    for stage in (1, 2, 3):
        close(np.array(results[stage][0]), np.array(results[0][0]), f"stage {stage} losses", 1e-5)
        check(results[stage][2] == full_state // n, f"stage {stage} states {results[stage][2]} of {full_state}")
    # the step reduces the gradients (all_reduce; ZeRO 2: reduce_scatter) and all-gathers the updated
    # chunks (ZeRO 1, 2); ZeRO 3 gathers the weight and bias where the forward needs them and its
    # backward reduce-scatters their gradients to the chunks (the gradient of that gather)
    want = {0: ({}, {"all_reduce": 2}), 1: ({}, {"all_reduce": 2, "all_gather": 2}),
            2: ({}, {"reduce_scatter": 2, "all_gather": 2}), 3: ({"all_gather": 2}, {"reduce_scatter": 2})}
    for stage, (fwd, rest) in want.items():
        got = results[stage][1]
        check(got == {"forward": fwd, "backward and step": rest}, f"stage {stage} collectives {got}")
    check(results[3][3] == results[0][3] // n, f"stage 3 parameters {results[3][3]} of {results[0][3]}")
    # what the device's allocator holds for the model and its optimizer after the steps, and at
    # its peak, against the unsharded run: the states' (and with ZeRO 3 the parameters') share saved
    held0 = results[0][4][0]
    for stage, saved in ((1, full_state // 2), (2, full_state // 2), (3, full_state // 2 + results[0][3] // 2)):
        if n == 2:
            got = held0 - results[stage][4][0]
            check(abs(got - saved) <= 1024, f"stage {stage} holds {got} B less than unsharded, want about {saved}")
    if mesh.rank == 0:
        for stage, (losses, spent, state, params, (held, peak)) in results.items():
            print(f"zero stage {stage}: optimizer states {state} B, parameters {params} B; allocator (memory_stats) "
                  f"holds {held} B after the steps, peak {peak} B; collectives {spent}; losses "
                  f"{[round(v, 6) for v in losses]}", flush=True)


def dump(path: str) -> None:
    """examples/transformer_parallel.py's GPT (small) on the 2x2 mesh for 3 steps: the data, the
    initial weights, the first step's gradients, the losses and the final weights saved to
    ``path`` (rank 0) for tests/parallel/paddle_gpt.py to compare with Paddle."""
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    import transformer_parallel as example
    mesh = ProcessMesh([[0, 1], [2, 3]], ["dp", "tp"])
    cfg = dict(vocab=64, seq=8, d=32, heads=4, layers=2, batch=4)
    ids = np.random.default_rng(0).integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1))
    dist.seed(1)
    model = dist.shard_layer(example.GPT(cfg["vocab"], cfg["seq"], cfg["d"], cfg["heads"], cfg["layers"]), mesh,
                             example.shard_fn)
    saved = {"init/" + n: np.array(p.numpy()) for n, p in model.named_parameters()}
    opt = dist.AdamW(learning_rate=3e-3, parameters=model.parameters(), weight_decay=0.01)
    X, Y = (dist.shard_tensor(a, mesh, [Shard(0), R]) for a in (ids[:, :-1], ids[:, 1:]))
    losses = []
    for step in range(3):
        loss = dist.cross_entropy(model(X), Y)
        loss.backward()
        if step == 0:
            saved.update({"grad/" + n: np.array(p.grad.numpy()) for n, p in model.named_parameters()})
        opt.step()
        opt.clear_grad()
        losses.append(loss.item())
    saved.update({"final/" + n: np.array(p.numpy()) for n, p in model.named_parameters()})
    check(len(saved) == 3 * len(opt.params), "dumped every parameter")
    if mesh.rank == 0:
        np.savez(path, ids=ids, losses=np.array(losses), **saved)


def main() -> None:
    suite = sys.argv[1]
    world = dist.world()
    n = world.size
    mesh1 = ProcessMesh(list(range(n)), ["x"])
    if suite == "ops":
        ops(mesh1)
        if n == 4:
            ops(ProcessMesh([[0, 1], [2, 3]], ["x", "y"]))
    elif suite == "megatron":
        megatron(mesh1)
        sequence(mesh1)
    elif suite == "accumulate":
        accumulate(mesh1)
        if n == 4:
            accumulate(ProcessMesh([[0, 1], [2, 3]], ["x", "y"]))
    elif suite == "zero":
        zero(mesh1)
    elif suite == "dump":
        dump(sys.argv[2])
    print(f"PASS {cases} cases", flush=True)
    world.destroy()


if __name__ == "__main__":
    main()
