"""The binary ops' gradients in default eager mode, for every broadcast pattern from 1-D to 3-D
(either operand broadcast along each dimension, both at once, a 0-d operand), each op's
gradients on the device type and on Paddle's CPU place in the same process: add, subtract,
multiply, divide, maximum and minimum, with dout given to backward() and with dout made by an
op before them, with both operands needing a gradient and with one. Inputs are small integers
and y a power of two, so every gradient is exact and must equal the CPU's bit for bit. (Paddle
hands add_grad's and subtract_grad's x_grad out_grad's own buffer: the bridge wrote x's reduced
gradient over dout's first elements before y's gradient read them.)
Prints RESULT {name: true | "what differed"}; tests/paddle_provider/test_paddle_provider.py
runs it."""
import json
import sys

import numpy as np
import paddle

DEV = sys.argv[1]
CPU = paddle.CPUPlace()
OPS = {"add": paddle.add, "subtract": paddle.subtract, "multiply": paddle.multiply, "divide": paddle.divide,
       "maximum": paddle.maximum, "minimum": paddle.minimum}
# (x's shape, y's shape): each broadcast against the other, to outputs of 1 to 3 dimensions
SHAPES = [((5,), (5,)), ((1,), (5,)), ((), (5,)),
          ((4, 5), (4, 5)), ((4, 1), (4, 5)), ((1, 5), (4, 5)), ((5,), (4, 5)), ((1, 1), (4, 5)), ((4, 1), (1, 5)),
          ((2, 3, 4), (2, 3, 4)), ((1, 3, 4), (2, 3, 4)), ((2, 1, 4), (2, 3, 4)), ((2, 3, 1), (2, 3, 4)),
          ((3, 4), (2, 3, 4)), ((4,), (2, 3, 4)), ((3, 1), (2, 3, 4)), ((2, 1, 1), (2, 3, 4)),
          ((1, 1, 4), (2, 3, 4)), ((2, 1, 4), (1, 3, 1))]
PATTERNS = SHAPES + [(ys, xs) for xs, ys in SHAPES if xs != ys]


def arrays(xs: tuple, ys: tuple, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(-6, 7, xs).astype(np.float32)
    y = (rng.choice([-4, -2, -1, 1, 2, 4], ys) * rng.choice([1, 0.5], ys)).astype(np.float32)
    return x, y


def grads(place, op, x: np.ndarray, y: np.ndarray, dout: np.ndarray, chained: bool, y_grad: bool) -> list:
    a, b = paddle.to_tensor(x, place=place), paddle.to_tensor(y, place=place)
    a.stop_gradient, b.stop_gradient = False, not y_grad
    out = op(a, b)
    d = paddle.to_tensor(dout, place=place)
    if chained:                                   # dout made by multiply_grad, not handed in
        (out * d).sum().backward()
    else:
        out.backward(d)
    return [out.numpy(), a.grad.numpy(), None if b.grad is None else b.grad.numpy()]


def main() -> None:
    paddle.set_device(DEV)
    res: dict = {}
    for n, (xs, ys) in enumerate(PATTERNS):
        x, y = arrays(xs, ys, n)
        dout = np.random.default_rng(100 + n).integers(-3, 4, np.broadcast_shapes(xs, ys)).astype(np.float32)
        for name, op in OPS.items():
            for chained in (False, True):
                for y_grad in (True, False):
                    key = f"{name}.{list(xs)}x{list(ys)}.{'chained' if chained else 'direct'}" + \
                          ("" if y_grad else ".x_only")
                    try:
                        want = grads(CPU, op, x, y, dout, chained, y_grad)
                        got = grads(None, op, x, y, dout, chained, y_grad)
                    except Exception as exc:  # noqa: BLE001 -- reported by name
                        res[key] = "ERR " + " ".join(str(exc).split())[:300]
                        continue
                    bad = [f"{what}: got {g.tolist()} want {w.tolist()}"
                           for what, g, w in zip(("out", "x.grad", "y.grad"), got, want, strict=True)
                           if (g is None) != (w is None) or (g is not None and not (
                               g.shape == w.shape and g.dtype == w.dtype and np.array_equal(g, w)))]
                    res[key] = True if not bad else "; ".join(bad)[:600]
    print("RESULT", json.dumps(res))


if __name__ == "__main__":
    main()
