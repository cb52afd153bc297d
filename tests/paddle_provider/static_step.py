"""One training step of a paddle.jit.to_static program on a device type anychip provides (argv[1]; argv[2]:
the bridge library Paddle loads for it), with Paddle's CPU fallback on: y = x @ w is used twice,
(y ** 2).sum() + (y * 3).sum(), so its gradient is the add_n of two (the device's kernel), and `pow`
and `pow_grad` have no device kernel (the fallback: the executor copies their inputs to the host and
their results back with memcpy_h2d). Inputs are small integers, so every value is exact and is compared
with NumPy's for equality. argv[3] steps run; the bridge's counters (anychip_paddle_calls: how its
copies and its stream order went; anychip_paddle_kernel_calls) are reported for each step after the
first. Prints one JSON line: {"checks": {name: true | "what differed"}, "steps": [{counter: delta}]};
tests/paddle_provider/test_paddle_provider.py runs it."""
import ctypes
import json
import sys

import numpy as np
import paddle

F = np.float32
COUNTERS = ("h2d_staged", "h2d_direct", "d2h_enqueued", "d2h_direct", "sync_copy", "async_copy")


def main() -> None:
    device, bridge, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lib = ctypes.CDLL(bridge)                              # the copy Paddle loaded
    for fn in (lib.anychip_paddle_calls, lib.anychip_paddle_kernel_calls):
        fn.restype, fn.argtypes = ctypes.c_ulonglong, [ctypes.c_char_p]

    def counters() -> dict:
        out = {k: lib.anychip_paddle_calls(k.encode()) for k in COUNTERS}
        out["add_n"] = lib.anychip_paddle_kernel_calls(b"add_n")
        return out

    paddle.set_device(device)

    def f(x, w):
        y = paddle.matmul(x, w)
        return (y ** 2).sum() + (y * 3.0).sum()

    step_fn = paddle.jit.to_static(f, full_graph=True)
    xv = np.array([[1, 2, 3], [-1, 0, 2], [4, -2, 1], [0, 1, -1]], F)
    wv = np.array([[1, -2], [0, 1], [-1, 2]], F)
    checks: dict = {}
    deltas: list = []
    for step in range(steps):
        before = counters()
        x, w = paddle.to_tensor(xv), paddle.to_tensor(wv, stop_gradient=False)
        loss = step_fn(x, w)
        loss.backward()
        got_loss, got_dw = loss.numpy(), w.grad.numpy()
        after = counters()
        if step:
            deltas.append({k: after[k] - before[k] for k in after})
        y = xv @ wv
        want_loss, want_dw = np.array((y * y).sum() + (3 * y).sum(), F), xv.T @ (2 * y + 3)
        for name, got, want in (("loss", got_loss, want_loss), ("dw", got_dw, want_dw)):
            same = got.shape == want.shape and np.array_equal(got, want)
            checks[f"step{step}.{name}"] = True if same else f"got {got.tolist()} want {want.tolist()}"
    print("RESULT " + json.dumps({"checks": checks, "steps": deltas}), flush=True)


if __name__ == "__main__":
    main()
