"""One process on one Paddle device type that anychip provides: tensors, copies, ops with
exact values, backward(), and an MLP trained with AdamW whose losses equal Paddle-CPU's.
Prints one JSON line with what it checked; tests/paddle_provider/test_paddle_provider.py runs it."""
import json
import sys

import numpy as np
import paddle


def check_ops(dev: str) -> dict:
    paddle.set_device(dev)
    out = {}
    a_np = np.arange(12, dtype=np.float32).reshape(3, 4)
    b_np = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 4
    a, b = paddle.to_tensor(a_np), paddle.to_tensor(b_np)
    out["place"] = str(a.place)
    out["roundtrip"] = bool(np.array_equal(a.numpy(), a_np))
    c = a.clone()                                   # device -> device
    out["clone"] = bool(np.array_equal(c.numpy(), a_np))
    cpu = a.cpu()                                   # device -> host
    out["to_cpu"] = bool(np.array_equal(cpu.numpy(), a_np)) and "cpu" in str(cpu.place).lower()
    back = cpu._copy_to(paddle.CustomPlace(dev.split(":")[0], 0), False)   # host -> device
    out["to_device"] = bool(np.array_equal(back.numpy(), a_np))
    results = {
        "add": ((a + 1.5).numpy(), a_np + 1.5),
        "mul": ((a * a).numpy(), a_np * a_np),
        "matmul": (paddle.matmul(a, b).numpy(), a_np @ b_np),
        "relu": (paddle.nn.functional.relu(a - 5).numpy(), np.maximum(a_np - 5, 0)),
        "sum": (a.sum().numpy(), a_np.sum()),
        "mean_axis": (a.mean(axis=1).numpy(), a_np.mean(axis=1)),
        "exp": (paddle.exp(a / 10).numpy(), np.exp(a_np / 10)),
        "softmax": (paddle.nn.functional.softmax(a, axis=1).numpy(), None),
        "cast": (a.astype("int32").numpy(), a_np.astype(np.int32)),
        "full": (paddle.full([2, 3], 7.0).numpy(), np.full([2, 3], 7.0, np.float32)),
        "zeros_like": (paddle.zeros_like(a).numpy(), np.zeros_like(a_np)),
    }
    e = np.exp(a_np - a_np.max(axis=1, keepdims=True))
    results["softmax"] = (results["softmax"][0], e / e.sum(axis=1, keepdims=True))
    for name, (got, want) in results.items():
        out[name] = bool(np.allclose(got, want, rtol=1e-6, atol=1e-6)) and got.shape == np.shape(want)
    x = paddle.to_tensor(a_np, stop_gradient=False)
    y = (x * x).sum()
    y.backward()
    out["backward"] = bool(np.array_equal(x.grad.numpy(), 2 * a_np)) and dev.split(":")[0] in str(x.grad.place)
    out["ones_times_3"] = (paddle.ones([2, 2]) * 3).numpy().tolist()
    return out


def train(dev: str, steps: int = 5) -> list:
    paddle.set_device(dev)
    paddle.seed(2026)
    np.random.seed(7)
    model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.01)
    x = paddle.to_tensor(np.random.RandomState(1).randn(64, 16).astype("float32"))
    t = paddle.to_tensor(np.random.RandomState(2).randn(64, 4).astype("float32"))
    losses = []
    for _ in range(steps):
        loss = paddle.nn.functional.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss.numpy()))
    return losses


def main() -> None:
    dev = sys.argv[1]
    report = {"ops": check_ops(dev)}
    report["losses_device"] = train(dev)
    report["losses_cpu"] = train("cpu")
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
