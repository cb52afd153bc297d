"""Programs whose device work is queued on several streams or outlives the host memory it
reads (docs/paddle.md, "Ordering"), on a device type anychip provides (argv[1]), against
NumPy or Paddle's CPU place in the same process; argv[2] names the case, argv[3] how many
times it runs. Prints one JSON line: {"bad": [what differed, per failing run], "runs": n, ...};
tests/paddle_provider/test_paddle_provider.py runs it.

- pow: a to_static program in which `pow` has no device kernel and takes Paddle's CPU
  fallback: its result comes back by an asynchronous H2D copy whose host source Paddle frees
  at once; the gradients of (x @ y) ** 2 summed, against NumPy's.
- transposed: two transposed projections multiplied in a to_static program: `transpose`
  takes the fallback, and the executor copies both results on its H2D stream into memory the
  compute stream's matmul of the first may still have to read.
- empty_cache: a tensor filled on the device, freed and the cache emptied at once, then the
  next op: the free must wait for the fill.
- lm: a 2-layer TransformerEncoder LM trained with to_static (fallback on) for some steps,
  its losses against the same model on Paddle's CPU place."""
import json
import sys

import numpy as np
import paddle

F = np.float32


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def pow_case(runs: int) -> dict:
    def f(x, y):
        return (paddle.matmul(x, y) ** 2).sum()

    rng, bad = np.random.default_rng(0), []
    for run in range(runs):
        xv, yv = rng.standard_normal((16, 32)).astype(F), rng.standard_normal((32, 8)).astype(F)
        x, y = paddle.to_tensor(xv, stop_gradient=False), paddle.to_tensor(yv, stop_gradient=False)
        paddle.jit.to_static(f, full_graph=True)(x, y).backward()
        m = xv.astype(np.float64) @ yv
        err = max(rel(x.grad.numpy(), 2 * m @ yv.T), rel(y.grad.numpy(), xv.T @ (2 * m)))
        if err > 1e-5:
            bad.append(f"run {run}: gradients off by {err:.3g} (relative)")
    return {"bad": bad}


def transposed_case(runs: int) -> dict:
    def f(x, w1, w2):
        a = paddle.matmul(x, paddle.transpose(w1, [1, 0]))
        b = paddle.matmul(x, paddle.transpose(w2, [1, 0]))
        return a, (a * b).sum()

    rng, bad = np.random.default_rng(0), []
    for run in range(runs):
        xv, w1v, w2v = (rng.standard_normal(s).astype(F) for s in ((16, 32), (24, 32), (24, 32)))
        a, total = paddle.jit.to_static(f, full_graph=True)(*(paddle.to_tensor(v) for v in (xv, w1v, w2v)))
        a_want = xv.astype(np.float64) @ w1v.T
        terms = a_want * (xv.astype(np.float64) @ w2v.T)     # the sum cancels: its error is the terms'
        err = max(rel(a.numpy(), a_want), abs(float(total) - terms.sum()) / np.abs(terms).sum())
        if err > 1e-5:
            bad.append(f"run {run}: off by {err:.3g} (relative)")
    return {"bad": bad}


def empty_cache_case(runs: int) -> dict:
    bad = []
    for run in range(runs):
        z = paddle.full([1 << 20], float(run + 1))
        del z
        paddle.device.empty_cache()
        got = (paddle.full([1 << 16], 2.0) * 3).numpy()
        if not (got == 6).all():
            bad.append(f"run {run}: {int((got != 6).sum())} wrong values")
    return {"bad": bad}


def lm_case(runs: int, device: str) -> dict:
    vocab, d, steps = 96, 32, 4

    class LM(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(vocab, d)
            layer = paddle.nn.TransformerEncoderLayer(d, 2, 64, dropout=0.0)
            self.enc = paddle.nn.TransformerEncoder(layer, 2)
            self.out = paddle.nn.Linear(d, vocab)

        def forward(self, ids):
            return self.out(self.enc(self.emb(ids)))

    data = np.random.default_rng(0).integers(0, vocab, (steps, 4, 9))

    def train(place: str) -> np.ndarray:
        paddle.set_device(place)
        paddle.seed(0)
        model = LM()
        opt = paddle.optimizer.AdamW(1e-2, parameters=model.parameters())

        def loss_of(x, y):
            return paddle.nn.functional.cross_entropy(model(x).reshape([-1, vocab]), y.reshape([-1]))

        step = paddle.jit.to_static(loss_of, full_graph=True)
        losses = []
        for i in range(steps):
            loss = step(paddle.to_tensor(data[i, :, :-1]), paddle.to_tensor(data[i, :, 1:]))
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses.append(float(loss))
        return np.array(losses)

    want = train("cpu")
    bad, worst = [], 0.0
    for run in range(runs):
        err = rel(train(device), want)
        worst = max(worst, err)
        if err > 1e-5:
            bad.append(f"run {run}: losses off by {err:.3g} (relative)")
    return {"bad": bad, "worst": worst}


def main() -> None:
    device, case, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paddle.set_device(device)
    if case == "lm":
        out = lm_case(runs, device)
    else:
        out = {"pow": pow_case, "transposed": transposed_case, "empty_cache": empty_cache_case}[case](runs)
    out["runs"] = runs
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
