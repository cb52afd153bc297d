"""The simulated chips' phi kernels, with Paddle's CPU fallback off
(FLAGS_enable_api_kernel_fallback=0, set by the caller): every op below must run on the
device's own kernels or fail, and so must an MLP's whole AdamW step. Inputs are small
integers and powers of two, so every result is exact and is compared with NumPy's for
equality (exp / log / softmax of general values to float32 rounding), and some also with Paddle's
CPU place's. Prints one JSON line:
{name: true | "what differed"}; tests/paddle_provider/test_paddle_provider.py runs it."""
import json
import sys

import numpy as np
import paddle

F = np.float32


def t(a, grad: bool = False):
    return paddle.to_tensor(np.asarray(a), stop_gradient=not grad)


def forward(out: dict) -> None:
    x = np.arange(12, dtype=F).reshape(3, 4) - 5
    r = np.array([1, 2, 4, 8], F)
    X, R = t(x), t(r)
    m = np.arange(8, dtype=F).reshape(4, 2) - 3
    b3 = np.arange(24, dtype=F).reshape(2, 3, 4) - 7
    cases = {
        "add_broadcast": ((X + R).numpy(), x + r),
        "subtract": ((X - R).numpy(), x - r),
        "multiply": ((X * R).numpy(), x * r),
        "divide": ((X / R).numpy(), x / r),
        "maximum": (paddle.maximum(X, R).numpy(), np.maximum(x, r)),
        "minimum": (paddle.minimum(X, R).numpy(), np.minimum(x, r)),
        "add_int32": ((t(x.astype(np.int32)) + t(r.astype(np.int32))).numpy(), (x + r).astype(np.int32)),
        "multiply_int64": ((t(x.astype(np.int64)) * 3).numpy(), x.astype(np.int64) * 3),
        "add_float64": ((t(x.astype(np.float64)) + 0.5).numpy(), x.astype(np.float64) + 0.5),
        "matmul": (paddle.matmul(X, t(m)).numpy(), x @ m),
        "matmul_tx": (paddle.matmul(t(x.T.copy()), t(m), transpose_x=True).numpy(), x @ m),
        "matmul_ty": (paddle.matmul(X, t(m.T.copy()), transpose_y=True).numpy(), x @ m),
        "matmul_batched": (paddle.matmul(t(b3), t(m)).numpy(), b3 @ m),
        "matmul_vector": (paddle.matmul(X, R).numpy(), x @ r),
        "relu": (paddle.nn.functional.relu(X).numpy(), np.maximum(x, 0)),
        "square": (paddle.square(X).numpy(), x * x),
        "scale": (paddle.scale(X, scale=2.0, bias=1.0).numpy(), x * 2 + 1),
        "cast_int32": (t(x / 4).astype("int32").numpy(), (x / 4).astype(np.int32)),
        "cast_float64": (X.astype("float64").numpy(), x.astype(np.float64)),
        "sum": (X.sum().numpy(), np.array(x.sum())),
        "sum_axis0": (X.sum(axis=0).numpy(), x.sum(axis=0)),
        "sum_keepdim": (X.sum(axis=1, keepdim=True).numpy(), x.sum(axis=1, keepdims=True)),
        "sum_axes_0_2": (t(b3).sum(axis=[0, 2]).numpy(), b3.sum(axis=(0, 2))),
        "sum_int64": (t(x.astype(np.int64)).sum().numpy(), np.array(x.astype(np.int64).sum())),
        "sum_int32_is_int64": (t(x.astype(np.int32)).sum(axis=0).numpy(), x.astype(np.int64).sum(axis=0)),
        "mean": (X.mean().numpy(), np.array(x.mean(), F)),
        "mean_axis1": (X.mean(axis=1).numpy(), x.mean(axis=1)),
        "mean_axes_0_2": (t(b3).mean(axis=[0, 2]).numpy(), b3.mean(axis=(0, 2))),
        "full": (paddle.full([2, 3], 7.0).numpy(), np.full([2, 3], 7.0, F)),
        "full_int64": (paddle.full([2], 2 ** 40 + 1, dtype="int64").numpy(), np.full([2], 2 ** 40 + 1, np.int64)),
        "zeros_like": (paddle.zeros_like(X).numpy(), np.zeros_like(x)),
        "ones_like": (paddle.ones_like(X).numpy(), np.ones_like(x)),
        "softmax_uniform": (paddle.nn.functional.softmax(paddle.zeros([2, 4])).numpy(), np.full([2, 4], 0.25, F)),
    }
    for name, (got, want) in cases.items():
        ok = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
        out[name] = True if ok else f"got {got.dtype}{list(got.shape)} {got.tolist()} want {want.tolist()}"
    x = np.linspace(-2, 2, 12, dtype=F).reshape(3, 4)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    close = {
        "exp": (paddle.exp(t(x)).numpy(), np.exp(x)),
        "log": (paddle.log(t(np.abs(x) + 1)).numpy(), np.log(np.abs(x) + 1)),
        "softmax": (paddle.nn.functional.softmax(t(x), axis=1).numpy(), e / e.sum(axis=1, keepdims=True)),
    }
    for name, (got, want) in close.items():
        ok = got.shape == want.shape and np.allclose(got, want, rtol=2e-7, atol=0)
        out[name] = True if ok else f"got {got.tolist()} want {want.tolist()}"


def backward(out: dict) -> None:
    x = np.arange(12, dtype=F).reshape(3, 4) - 5
    w = np.array([1, 2, 4, 8], F)
    m = np.arange(8, dtype=F).reshape(4, 2) - 3
    c = np.array([1, 2, 3, 4], F)

    def grads(fn, *arrays):
        ts = [t(a, grad=True) for a in arrays]
        fn(*ts).backward()
        return [v.grad.numpy() for v in ts]

    cases = {
        # d/dx sum(x * w + w) = w; d/dw = sum over rows of x, plus 3 (the broadcast of w's add)
        "multiply_add": (grads(lambda a, b: (a * b + b).sum(), x, w), [np.broadcast_to(w, x.shape), x.sum(0) + 3]),
        "subtract": (grads(lambda a, b: (a - b).sum(), x, w), [np.ones_like(x), np.full_like(w, -3)]),
        "divide": (grads(lambda a, b: (a / b).sum(), x, w), [np.broadcast_to(1 / w, x.shape),
                                                                -(x / w / w).sum(0)]),
        "matmul": (grads(lambda a, b: paddle.matmul(a, b).sum(), x, m),
                   [np.ones((3, 2), F) @ m.T, x.T @ np.ones((3, 2), F)]),
        "matmul_ty": (grads(lambda a, b: paddle.matmul(a, b, transpose_y=True).sum(), x, m.T.copy()),
                      [np.ones((3, 2), F) @ m.T, (x.T @ np.ones((3, 2), F)).T]),
        "matmul_batched": (grads(lambda a, b: paddle.matmul(a, b).sum(), np.stack([x, 2 * x]), m),
                           [np.stack([np.ones((3, 2), F) @ m.T] * 2), 3 * x.T @ np.ones((3, 2), F)]),
        "matmul_vector": (grads(lambda a, b: paddle.matmul(a, b).sum(), x, w),
                          [np.broadcast_to(w, x.shape), x.sum(0)]),
        "relu": (grads(lambda a: paddle.nn.functional.relu(a).sum(), x), [(x > 0).astype(F)]),
        "square_mean": (grads(lambda a: paddle.square(a).mean(), x[:2]), [x[:2] / 4]),       # 2 x / 8
        "mean_axis": (grads(lambda a: a.mean(axis=1).sum(), x), [np.full_like(x, 0.25)]),
        "sum_axis": (grads(lambda a: (a.sum(axis=0) * t(c)).sum(), x), [np.broadcast_to(c, x.shape)]),
        "exp": (grads(lambda a: paddle.exp(a).sum(), np.zeros(4, F)), [np.ones(4, F)]),
        "log": (grads(lambda a: paddle.log(a).sum(), w), [1 / w]),
        # softmax of a constant row is 1/4 each: dx = y * (c - sum(c * y)) = (c - 2.5) / 4
        "softmax": (grads(lambda a: (paddle.nn.functional.softmax(a) * t(c)).sum(), np.zeros((2, 4), F)),
                    [np.broadcast_to((c - 2.5) / 4, (2, 4))]),
    }
    for name, (got, want) in cases.items():
        bad = [f"grad {i}: got {g.tolist()} want {np.asarray(v).tolist()}"
               for i, (g, v) in enumerate(zip(got, want, strict=True))
               if g.shape != np.shape(v) or not np.array_equal(g, v)]
        out["grad_" + name] = True if not bad else "; ".join(bad)


def sgd_step(out: dict) -> None:
    """paddle.optimizer.SGD's update (the sgd_ kernel): p - lr * grad, exactly."""
    c = np.array([1, 2, 3, 4], F)
    p = t(np.array([1, 2, 4, 8], F), grad=True)
    opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=[p])
    (p * t(c)).sum().backward()
    opt.step()
    got, want = p.numpy(), np.array([1, 2, 4, 8], F) - 0.5 * c
    out["sgd_step"] = True if np.array_equal(got, want) else f"got {got.tolist()} want {want.tolist()}"


def against_cpu(out: dict) -> None:
    """The same ops, and a gradient, on Paddle's CPU place and on the device: equal values, dtypes and
    shapes (small-integer inputs: both are exact)."""
    dev = paddle.get_device()
    x = np.arange(12, dtype=F).reshape(3, 4) - 5
    m = np.arange(8, dtype=F).reshape(4, 2) - 3

    def run(place: str) -> dict:
        paddle.set_device(place)
        X, M, G = t(x), t(m), t(x, grad=True)
        (paddle.nn.functional.relu(paddle.matmul(G, M)) * t(np.array([1, 2], F))).sum().backward()
        return {"add": (X + X).numpy(), "multiply": (X * t(np.array([1, 2, 4, 8], F))).numpy(),
                "matmul": paddle.matmul(X, M).numpy(),
                "relu": paddle.nn.functional.relu(X).numpy(), "sum": X.sum(axis=1).numpy(),
                "mean": X.mean(axis=0).numpy(), "softmax": paddle.nn.functional.softmax(paddle.zeros([2, 4])).numpy(),
                "cast": t(x / 4).astype("int32").numpy(), "full": paddle.full([2, 3], 7.0).numpy(),
                "matmul_relu_grad": G.grad.numpy()}
    cpu, got = run("cpu"), run(dev)
    paddle.set_device(dev)
    for name, want in cpu.items():
        g = got[name]
        ok = g.dtype == want.dtype and g.shape == want.shape and np.array_equal(g, want)
        out["cpu_" + name] = True if ok else f"got {g.dtype}{list(g.shape)} {g.tolist()} want {want.tolist()}"


def mlp_coverage(out: dict) -> None:
    """An MLP's AdamW training step without fallback: forward, backward and the update run on
    the device, and give the parameters the same step on Paddle's CPU gives them (to float32
    rounding: the device sums in its own order)."""
    dev = paddle.get_device()
    params = {}
    for place in ("cpu", dev):
        paddle.set_device(place)
        paddle.set_flags({"FLAGS_enable_api_kernel_fallback": True})    # initialisation draws random numbers
        paddle.seed(1)
        model = paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 4))
        opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.1)
        x = t(np.random.RandomState(0).randn(16, 8).astype(F))
        target = t(np.random.RandomState(1).randn(16, 4).astype(F))
        paddle.set_flags({"FLAGS_enable_api_kernel_fallback": place == "cpu"})
        try:
            for _ in range(2):
                loss = paddle.nn.functional.mse_loss(model(x), target)
                loss.backward()
                opt.step()
                opt.clear_grad()
        except RuntimeError as exc:
            text = str(exc)
            out["mlp_step"] = text.split("of kernel `", 1)[1].split("`", 1)[0] + " is not registered" \
                if "is not registered" in text else text[:300]
            return
        params[place] = [p.numpy() for p in model.parameters()]
    bad = [i for i, (a, b) in enumerate(zip(params["cpu"], params[dev], strict=True))
           if not np.allclose(a, b, rtol=1e-6, atol=1e-7)]
    out["mlp_step"] = True if not bad else f"parameters {bad} differ from Paddle-CPU's"
    paddle.set_device(dev)


def main() -> None:
    paddle.set_device(sys.argv[1])
    out: dict = {}
    forward(out)
    backward(out)
    sgd_step(out)
    against_cpu(out)
    mlp_coverage(out)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
