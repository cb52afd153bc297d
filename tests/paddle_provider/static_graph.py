"""A static Paddle program (paddle.static: Paddle's executor, not eager mode) on a device type
anychip provides (argv[1]; argv[2]: the bridge library Paddle loads for it, the simulated chips'
by default): a forward pass, a loss, its gradients and an SGD update built with paddle.static and run
by paddle.static.Executor on the device's place, with Paddle's CPU fallback off
(FLAGS_enable_api_kernel_fallback=0, set by the caller). Inputs are small integers and powers of
two, so every fetched value is exact and is compared with NumPy's for equality; the bridge's
kernel counters (anychip_paddle_kernel_calls) say which of its kernels each run called. Prints one
JSON line: {"checks": {name: true | "what differed"}, "calls": {kernel: calls per run}};
tests/paddle_provider/test_paddle_provider.py runs it."""
import ctypes
import json
import sys

import numpy as np
import paddle

from anychip.paddle_provider import simulator_bridge

F = np.float32
KERNELS = ("matmul", "add", "relu", "subtract", "square", "mean", "scale", "sum", "full", "full_like", "multiply",
           "matmul_grad", "add_grad", "relu_grad", "subtract_grad", "square_grad", "mean_grad", "sgd")


def main() -> None:
    device = sys.argv[1]
    kind, _, index = device.partition(":")
    lib = ctypes.CDLL(sys.argv[2] if len(sys.argv) > 2 else str(simulator_bridge()))   # the copy Paddle loaded
    lib.anychip_paddle_kernel_calls.restype = ctypes.c_ulonglong
    lib.anychip_paddle_kernel_calls.argtypes = [ctypes.c_char_p]

    def calls() -> dict:
        return {k: lib.anychip_paddle_kernel_calls(k.encode()) for k in KERNELS}

    paddle.enable_static()
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, startup):
        x = paddle.static.data("x", [4, 3], "float32")
        target = paddle.static.data("target", [4, 2], "float32")
        w = paddle.static.create_parameter([3, 2], "float32", name="w",
                                           default_initializer=paddle.nn.initializer.Assign(
                                               np.array([[1, -2], [0.5, 1], [-1, 0.25]], F)))
        b = paddle.static.create_parameter([2], "float32", name="b",
                                           default_initializer=paddle.nn.initializer.Assign(np.array([1, -1], F)))
        h = paddle.nn.functional.relu(paddle.matmul(x, w) + b)
        loss = paddle.mean(paddle.square(h - target))
        total = paddle.sum(paddle.scale(h, scale=2.0, bias=1.0) * h + paddle.full_like(h, 0.5) * 2.0)
        paddle.optimizer.SGD(learning_rate=0.5).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace() if kind == "cpu" else paddle.CustomPlace(kind, int(index or 0)))
    exe.run(startup)

    xv = np.array([[1, 2, 3], [-1, 0, 2], [4, -2, 1], [0, 1, -1]], F)
    tv = np.array([[1, 0], [0, 1], [2, 2], [-1, 1]], F)
    wv, bv = np.array([[1, -2], [0.5, 1], [-1, 0.25]], F), np.array([1, -1], F)
    checks: dict = {}
    per_run: list = []
    for step in range(2):
        before = calls()
        h_got, loss_got, total_got, w_got, b_got = exe.run(main_prog, feed={"x": xv, "target": tv},
                                                           fetch_list=[h, loss, total, w, b])
        after = calls()
        per_run.append({k: after[k] - before[k] for k in KERNELS})
        pre = xv @ wv + bv                               # NumPy, in float32: the same exact values
        h_want = np.maximum(pre, 0)
        diff = h_want - tv
        loss_want = np.array((diff * diff).mean(), F)
        total_want = np.array(((2 * h_want + 1) * h_want + 1).sum(), F)
        dh = 2 * diff / diff.size * (pre > 0)
        wv, bv = wv - 0.5 * (xv.T @ dh), bv - 0.5 * dh.sum(axis=0)
        for name, got, want in (("h", h_got, h_want), ("loss", loss_got, loss_want),
                                ("total", total_got, total_want), ("w", w_got, wv), ("b", b_got, bv)):
            same = got.shape == want.shape and np.array_equal(got, want)
            checks[f"step{step}.{name}"] = True if same else f"got {got.tolist()} want {want.tolist()}"
    print("RESULT " + json.dumps({"checks": checks, "calls": per_run}), flush=True)


if __name__ == "__main__":
    main()
