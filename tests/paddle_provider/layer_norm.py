"""`layer_norm` and `layer_norm_grad` on a device type anychip provides (argv[1]; argv[2]: the bridge
library Paddle loads for it) against Paddle's CPU place in the same process, for several shapes and
begin_norm_axis values, with and without scale and bias, in float32 and float64: the output, mean and
variance from a static program (the executor's kernel entry; eager Paddle returns only the output), and
the output and the gradients of x, scale and bias in eager mode (the other entry); then a scale that
needs no gradient, and a paddle.jit.to_static step of layer_norm alone, where the bridge's counters show
whether it ran on the device or in Paddle's CPU fallback (which copies its inputs to the host and back).
Each case reports its worst difference relative to the largest magnitude of the value it checks.
Prints one JSON line: RESULT {...}; tests/paddle_provider/test_paddle_provider.py runs it."""
import ctypes
import json
import sys

import numpy as np
import paddle

DEVICE, BRIDGE = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(BRIDGE)                                  # the copy Paddle loaded
for fn in (lib.anychip_paddle_calls, lib.anychip_paddle_kernel_calls):
    fn.restype, fn.argtypes = ctypes.c_ulonglong, [ctypes.c_char_p]

#: (shape, begin_norm_axis): the last dimension, several, all but the first, a 4-d tensor at every axis
CASES = [((4, 9, 16), 2), ((4, 9, 16), 1), ((6, 33), 1), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 3),
         ((3, 1, 7), 2), ((5, 256), 1)]
EPS = 1e-5


def forward(place: str, xv, wv, bv, axis: int) -> dict:
    """out, mean and variance from a static program on `place`"""
    paddle.enable_static()
    try:
        main = paddle.static.Program()
        with paddle.static.program_guard(main):
            x = paddle.static.data("x", xv.shape, str(xv.dtype))
            w = None if wv is None else paddle.static.data("w", wv.shape, str(wv.dtype))
            b = None if bv is None else paddle.static.data("b", bv.shape, str(bv.dtype))
            outs = paddle._pir_ops.layer_norm(x, w, b, EPS, axis).get_defining_op().results()
        where = paddle.CPUPlace() if place == "cpu" else paddle.CustomPlace(*place.split(":")[0:1], 0)
        feed = {k: v for k, v in (("x", xv), ("w", wv), ("b", bv)) if v is not None}
        got = paddle.static.Executor(where).run(main, feed=feed, fetch_list=list(outs))
    finally:
        paddle.disable_static()
    return dict(zip(("out", "mean", "variance"), got, strict=True))


def run(place: str, xv, wv, bv, dyv, axis: int, frozen_scale: bool = False) -> dict:
    """out and the gradients in eager mode on `place`"""
    paddle.set_device(place)
    x = paddle.to_tensor(xv, stop_gradient=False)
    w = None if wv is None else paddle.to_tensor(wv, stop_gradient=frozen_scale)
    b = None if bv is None else paddle.to_tensor(bv, stop_gradient=False)
    out = paddle._C_ops.layer_norm(x, w, b, EPS, axis)
    paddle.autograd.backward([out], [paddle.to_tensor(dyv)])
    got = {"out": out.numpy(), "x_grad": x.grad.numpy()}
    if w is not None and not frozen_scale:
        got["scale_grad"] = w.grad.numpy()
    if b is not None:
        got["bias_grad"] = b.grad.numpy()
    return got


class Step(paddle.nn.Layer):
    def __init__(self, ln):
        super().__init__()
        self.ln = ln

    def forward(self, x):
        return (self.ln(x) * x).sum()


def worst(got: dict, want: dict) -> float:
    if got.keys() != want.keys():
        return float("inf")
    return max(float(np.abs(got[k].astype(np.float64) - want[k]).max() / max(np.abs(want[k]).max(), 1e-30))
               for k in want)


def main() -> None:
    rng = np.random.default_rng(0)
    out: dict = {"static": {}, "eager": {}, "equal": {}}
    before = {k: lib.anychip_paddle_kernel_calls(k.encode()) for k in ("layer_norm", "layer_norm_grad")}
    ran = 0
    for dtype in ("float32", "float64"):
        for shape, axis in CASES:
            right = int(np.prod(shape[axis:]))
            xv = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
            dyv = rng.standard_normal(shape).astype(dtype)
            wv, bv = rng.standard_normal(right).astype(dtype), rng.standard_normal(right).astype(dtype)
            for with_w, with_b in ((True, True), (True, False), (False, True), (False, False)):
                w, b = (wv if with_w else None), (bv if with_b else None)
                name = f"{dtype} {shape} axis {axis}{' scale' if with_w else ''}{' bias' if with_b else ''}"
                got, want = forward(DEVICE, xv, w, b, axis), forward("cpu", xv, w, b, axis)
                out["static"][name] = worst(got, want)
                equal = [k for k in want if np.array_equal(got[k], want[k])]
                got, want = run(DEVICE, xv, w, b, dyv, axis), run("cpu", xv, w, b, dyv, axis)
                out["eager"][name] = worst(got, want)
                out["equal"][name] = sorted(equal + [f"eager {k}" for k in want if np.array_equal(got[k], want[k])])
                ran += 1
    out["cases"] = ran
    out["kernel_calls"] = {k: lib.anychip_paddle_kernel_calls(k.encode()) - v for k, v in before.items()}

    # a scale that needs no gradient: x's gradient is still that of the scaled output (Paddle's GPU kernel's;
    # its CPU kernel then leaves the scale out of x's gradient)
    xv, dyv = rng.standard_normal((4, 8)).astype("float32"), rng.standard_normal((4, 8)).astype("float32")
    wv = rng.standard_normal(8).astype("float32")
    frozen, trained = run(DEVICE, xv, wv, None, dyv, 1, True), run("cpu", xv, wv, None, dyv, 1)
    trained.pop("scale_grad")
    out["frozen_scale"] = worst(frozen, trained)
    out["frozen_scale_cpu"] = worst(run("cpu", xv, wv, None, dyv, 1, True), trained)

    # to_static: the op in a program; the device's kernels make no asynchronous copy, the fallback does
    paddle.set_device(DEVICE)
    ln = paddle.nn.LayerNorm(16)
    fn = paddle.jit.to_static(Step(ln), full_graph=True)
    xv = rng.standard_normal((4, 9, 16)).astype("float32")
    losses = []
    for i in range(3):
        if i == 1:
            counts = {k: lib.anychip_paddle_calls(k.encode()) for k in ("async_copy",)}
            counts.update({k: lib.anychip_paddle_kernel_calls(k.encode()) for k in ("layer_norm", "layer_norm_grad")})
        x = paddle.to_tensor(xv, stop_gradient=False)
        loss = fn(x)
        loss.backward()
        grads = [x.grad, ln.weight.grad, ln.bias.grad]
        paddle.device.synchronize()
        after = {k: lib.anychip_paddle_calls(k.encode()) for k in ("async_copy",)}
        after.update({k: lib.anychip_paddle_kernel_calls(k.encode()) for k in ("layer_norm", "layer_norm_grad")})
        losses.append([float(loss), *[float(np.abs(g.numpy()).sum()) for g in grads]])
        ln.clear_gradients()
    out["static_calls"] = {k: (after[k] - counts[k]) / 2 for k in after}
    paddle.set_device("cpu")
    cpu_ln = paddle.nn.LayerNorm(16)
    cpu_ln.set_state_dict(ln.state_dict())
    x = paddle.to_tensor(xv, stop_gradient=False)
    loss = paddle.jit.to_static(Step(cpu_ln), full_graph=True)(x)
    loss.backward()
    want = [float(loss), *[float(np.abs(g.numpy()).sum()) for g in (x.grad, cpu_ln.weight.grad, cpu_ln.bias.grad)]]
    out["static_rel"] = max(abs(g - w) / max(abs(w), 1e-30) for g, w in zip(losses[-1], want, strict=True))
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
