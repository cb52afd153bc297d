"""A C plugin whose kernel table takes only some dtypes (argv[1]: its Paddle device, argv[2]: the
bridge Paddle loads for it), with Paddle's CPU fallback on: the ops and dtypes its masks allow run
on the device's kernels (the bridge's counters move), the others through the fallback (they do
not), and both give NumPy's exact values; a cast to a dtype the plugin's unary kernel does not take
converts on the host, and a sum to a dtype its reduce kernel does not take is refused, saying so.
Prints one JSON line: {"checks": {name: true | "what differed"}, "calls": {case: {kernel: calls}}};
tests/paddle_provider/test_paddle_provider.py runs it."""
import ctypes
import json
import sys

import numpy as np
import paddle

KERNELS = ("add", "matmul", "cast", "sum", "relu", "relu_grad")


def main() -> None:
    paddle.set_device(sys.argv[1])
    lib = ctypes.CDLL(sys.argv[2])
    lib.anychip_paddle_kernel_calls.restype = ctypes.c_ulonglong
    lib.anychip_paddle_kernel_calls.argtypes = [ctypes.c_char_p]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    m = np.arange(8, dtype=np.float32).reshape(4, 2) - 3

    def t(a, grad=False):
        return paddle.to_tensor(np.asarray(a), stop_gradient=not grad)

    def relu_grad():
        v = t(x, grad=True)
        paddle.nn.functional.relu(v).sum().backward()
        return v.grad.numpy()

    cases = {
        "add_float32": (lambda: (t(x) + t(x)).numpy(), x + x),
        "add_int64": (lambda: (t(x.astype(np.int64)) + t(x.astype(np.int64))).numpy(), (x + x).astype(np.int64)),
        "add_float64": (lambda: (t(x.astype(np.float64)) + 0.5).numpy(), x.astype(np.float64) + 0.5),
        "add_int32": (lambda: (t(x.astype(np.int32)) + t(x.astype(np.int32))).numpy(), (x + x).astype(np.int32)),
        "matmul_float32": (lambda: paddle.matmul(t(x), t(m)).numpy(), x @ m),
        "cast_float32_to_int64": (lambda: t(x / 4).astype("int64").numpy(), (x / 4).astype(np.int64)),
        "cast_float32_to_int32": (lambda: t(x / 4).astype("int32").numpy(), (x / 4).astype(np.int32)),
        "cast_float32_to_float16": (lambda: t(x / 3).astype("float16").numpy(), (x / 3).astype(np.float16)),
        "sum_float32": (lambda: t(x).sum(axis=0).numpy(), x.sum(axis=0)),
        "relu_grad_float32": (relu_grad, (x > 0).astype(np.float32)),
    }
    checks, calls = {}, {}
    for name, (fn, want) in cases.items():
        before = {k: lib.anychip_paddle_kernel_calls(k.encode()) for k in KERNELS}
        got = fn()
        after = {k: lib.anychip_paddle_kernel_calls(k.encode()) for k in KERNELS}
        calls[name] = {k: after[k] - before[k] for k in KERNELS if after[k] != before[k]}
        ok = got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
        checks[name] = True if ok else f"got {got.dtype} {got.tolist()} want {want.dtype} {want.tolist()}"
    try:                                  # an output dtype the plugin's reduce does not take: refused, saying so
        got = paddle.sum(t(x), dtype="float64").numpy()
        checks["sum_to_float64"] = f"no error: {got.dtype} {got.tolist()}"
    except RuntimeError as exc:           # Paddle's error for a kernel that raised
        want = ("sum kernel of anychip_narrow: the plugin's reduce kernel does not take float64 (its kernel "
                "table's dtype mask)")
        checks["sum_to_float64"] = True if want in str(exc) else str(exc)[-600:]
    print("RESULT " + json.dumps({"checks": checks, "calls": calls}), flush=True)


if __name__ == "__main__":
    main()
