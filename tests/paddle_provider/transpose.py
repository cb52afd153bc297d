"""`transpose` and `transpose_grad` on the device (argv[1]) in a to_static program, where they are
real ops rather than views, against Paddle's CPU place in the same process: the loss, a transposed
output and both inputs' gradients bit for bit, how many times the device kernels ran (the bridge's
counters, argv[2] the bridge library), and an int64 transpose with the stride kernels off (eager
mode then runs the kernel too). Prints one JSON line: RESULT {...}; tests/paddle_provider/
test_paddle_provider.py runs it."""
import ctypes
import json
import sys

import numpy as np
import paddle

DEV, LIB = sys.argv[1], sys.argv[2]
calls = ctypes.CDLL(LIB).anychip_paddle_kernel_calls
calls.argtypes, calls.restype = [ctypes.c_char_p], ctypes.c_long
rng = np.random.default_rng(0)
XV, WV = rng.standard_normal((3, 4, 5)).astype("float32"), rng.standard_normal((4, 5, 3)).astype("float32")


def f(x, w):
    t = paddle.transpose(x, [2, 0, 1])                    # [5, 3, 4]
    u = paddle.transpose(w, [-1, 0, 1])                   # [3, 4, 5], a negative axis
    return (t.transpose([1, 2, 0]) * u).sum() + (t * t).sum(), t


def run(place: str) -> list[np.ndarray]:
    paddle.set_device(place)
    x, w = paddle.to_tensor(XV, stop_gradient=False), paddle.to_tensor(WV, stop_gradient=False)
    loss, t = paddle.jit.to_static(f, full_graph=True)(x, w)
    loss.backward()
    return [loss.numpy(), t.numpy(), x.grad.numpy(), w.grad.numpy()]


before = calls(b"transpose"), calls(b"transpose_grad")
got, want = run(DEV), run("cpu")
out = {"static_equal": all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)),
       "transpose_calls": calls(b"transpose") - before[0], "transpose_grad_calls": calls(b"transpose_grad") - before[1]}
paddle.set_device(DEV)
paddle.set_flags({"FLAGS_use_stride_kernel": False})
iv = np.arange(24, dtype="int64").reshape(2, 3, 4)
n = calls(b"transpose")
out["int64_equal"] = bool((paddle.transpose(paddle.to_tensor(iv), [1, 2, 0]).numpy() == iv.transpose(1, 2, 0)).all())
out["int64_calls"] = calls(b"transpose") - n
try:
    paddle.transpose(paddle.to_tensor(iv), [0, 0, 1])
    out["repeated_axis"] = "ran"
except (ValueError, RuntimeError) as exc:                 # Paddle's own check, or the kernel's
    out["repeated_axis"] = type(exc).__name__
print("RESULT " + json.dumps(out), flush=True)
