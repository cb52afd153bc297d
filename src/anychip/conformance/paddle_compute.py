"""What PaddlePaddle computes on the chip, against Paddle's CPU in the same process: the compute
checks of ``anychip conformance --framework paddle`` (run by paddle_worker.py with ``--compute``
on each rank's device before the collectives).

Every check runs the same program on the CPU (tensors placed on ``paddle.CPUPlace()``) and on
the device, from the same inputs, and compares the device's values with NumPy's
``assert_allclose`` (float32: rtol 1e-5, atol 1e-6): the ops the bridge registers (add,
subtract, multiply, divide, maximum, minimum, relu, exp, log, square, cast, scale, full, sum,
mean, softmax, matmul) forward and grad, on contiguous, broadcast, strided, sliced and
transposed inputs; optimizer steps (SGD, Momentum, Adam, AdamW); a 2-layer Transformer's
training steps, eager and under ``paddle.jit.to_static``; float16 autocast (``paddle.amp``);
work on two streams ordered by an event, and on every other device; each repeated enough
times, without synchronizing in between, for an ordering defect to show.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812 - Paddle's own spelling

from ._compare import Report, check, compare, one_line

#: how many times the ordered checks run their program without a synchronize in between
REPEATS = 20
CPU = paddle.CPUPlace()


def _np(t: Any) -> np.ndarray:
    if t.dtype in (paddle.bfloat16, paddle.float16):
        t = t.astype("float32")
    return np.asarray(t.numpy())


def _close(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-6) -> str:
    """'' when ``got`` (device) matches ``want`` (CPU), else what differs."""
    def same(g: Any, w: Any) -> str:
        gn, wn = _np(g), _np(w)
        if gn.shape != wn.shape:
            return f"shape {list(gn.shape)}, want {list(wn.shape)}"
        try:
            np.testing.assert_allclose(gn.astype(np.float64), wn.astype(np.float64), rtol=rtol, atol=atol)
        except AssertionError as exc:
            return one_line(exc)
        return ""
    return compare(got, want, same)


def _arrays(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _pair(arr: np.ndarray, grad: bool = True) -> tuple[Any, Any]:
    """The array as a CPU tensor and as a device tensor."""
    c, d = paddle.to_tensor(arr, place=CPU), paddle.to_tensor(arr)
    c.stop_gradient = d.stop_gradient = not grad
    return c, d


LAYOUTS: dict[str, Callable[[Any], Any]] = {
    "contiguous": lambda t: t,
    "transposed": lambda t: paddle.transpose(paddle.transpose(t, [1, 0]) * 1.0, [1, 0]),
    "strided": lambda t: paddle.concat([t, t], 1)[:, ::2],
    "sliced": lambda t: F.pad(t, [1, 0, 2, 1])[1:, 2:-1],
    "expanded": lambda t: paddle.expand(t[:1], [4, 6]),
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "relu": F.relu, "exp": paddle.exp, "log": lambda t: paddle.log(paddle.abs(t) + 0.5), "square": paddle.square,
    "scale": lambda t: paddle.scale(t, 2.5, 1.0), "sum": paddle.sum, "sum_axis": lambda t: paddle.sum(t, 1),
    "mean": paddle.mean, "mean_axis": lambda t: paddle.mean(t, 0), "softmax": lambda t: F.softmax(t, -1),
    "cast": lambda t: paddle.cast(paddle.cast(t, "float64") * 3, "float32"), "tanh": paddle.tanh,
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": paddle.add, "subtract": paddle.subtract, "multiply": paddle.multiply,
    "divide": lambda a, b: paddle.divide(a, paddle.abs(b) + 0.5), "maximum": paddle.maximum,
    "minimum": paddle.minimum, "matmul": lambda a, b: paddle.matmul(a, b, transpose_y=True),
}


def _forward_grad(fn: Callable[..., Any], arrays: list[np.ndarray], layout: Callable[[Any], Any]) -> str:
    pairs = [_pair(a) for a in arrays]
    out_c = fn(*[layout(c) if i == 0 else c for i, (c, _) in enumerate(pairs)])
    out_d = fn(*[layout(d) if i == 0 else d for i, (_, d) in enumerate(pairs)])
    problem = _close(out_d, out_c)
    if problem:
        return f"forward {problem}"
    g = _arrays(99, tuple(out_c.shape))[0]
    out_c.backward(paddle.to_tensor(g, place=CPU))
    out_d.backward(paddle.to_tensor(g))
    problem = _close([d.grad for _, d in pairs], [c.grad for c, _ in pairs])
    return problem and f"grad {problem}"


def ops(report: Report) -> None:
    a, b, row, col = _arrays(1, (4, 6), (4, 6), (6,), (4, 1))
    for name, fn in UNARY.items():
        for lname, lay in LAYOUTS.items():
            check(report, f"paddle.{name}.{lname}", partial(_forward_grad, fn, [a], lay))
    for name, fn2 in BINARY.items():
        for lname, lay in LAYOUTS.items():
            check(report, f"paddle.{name}.{lname}", partial(_forward_grad, fn2, [a, b], lay))
        if name != "matmul":
            check(report, f"paddle.{name}.broadcast_row", partial(_forward_grad, fn2, [a, row], LAYOUTS["contiguous"]))
            check(report, f"paddle.{name}.broadcast_col", partial(_forward_grad, fn2, [col, a], LAYOUTS["contiguous"]))
    m1, m2 = _arrays(2, (5, 7), (7, 3))
    check(report, "paddle.matmul.5x7x3", lambda: _forward_grad(paddle.matmul, [m1, m2], lambda t: t))
    ones = np.ones(3, np.float32)
    check(report, "paddle.add.ones", lambda: _close(paddle.add(_pair(ones)[1], _pair(ones)[1]),
                                                     paddle.add(_pair(ones)[0], _pair(ones)[0])))
    for dtype in ("int32", "int64", "float64", "float16", "bfloat16"):
        x, y = (np.round(v * 100) for v in _arrays(3, (5, 7), (5, 7)))

        def typed(dtype: Any = dtype, x: np.ndarray = x, y: np.ndarray = y) -> str:
            (xc, xd), (yc, yd) = _pair(x, False), _pair(y, False)
            xd, yd = paddle.cast(xd, dtype), paddle.cast(yd, dtype)
            if dtype in ("float16", "bfloat16"):      # Paddle's CPU adds neither: float32, rounded at the end
                want = paddle.cast(paddle.multiply(paddle.add(xc, yc), yc), dtype)
                return _close(paddle.multiply(paddle.add(xd, yd), yd), want, 1e-2, 1e-2)
            xc, yc = paddle.cast(xc, dtype), paddle.cast(yc, dtype)
            return _close(paddle.multiply(paddle.add(xd, yd), yd), paddle.multiply(paddle.add(xc, yc), yc))
        check(report, f"paddle.add_multiply.{dtype}", typed)
    check(report, "paddle.full", lambda: _close(paddle.full([3, 5], 2.5), paddle.full([3, 5], 2.5).cpu()))


# -- optimizers, a Transformer, AMP ----------------------------------------------------------------

def _same_init(*models: Any) -> None:
    """Every model's parameters set to the same values (from NumPy)."""
    rng = np.random.default_rng(0)
    for ps in zip(*(m.parameters() for m in models), strict=True):
        v = (rng.standard_normal(ps[0].shape) * 0.3).astype(np.float32)
        for p in ps:
            p.set_value(v)


def _on_cpu(make: Callable[[], Any]) -> Any:
    here = paddle.device.get_device()
    paddle.set_device("cpu")
    try:
        return make()
    finally:
        paddle.set_device(here)


def _mlp() -> Any:
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 4))


def _train(model: Any, opt: Any, x: Any, y: Any, steps: int, loss_fn: Callable[..., Any] = F.mse_loss,
           step: Callable[[Any], Any] | None = None) -> list[Any]:
    losses = []
    for _ in range(steps):
        loss = loss_fn((step or model)(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(loss.detach())
    return losses


OPTIMIZERS: dict[str, Callable[[Any], Any]] = {
    "SGD": lambda p: paddle.optimizer.SGD(0.1, parameters=p),
    "Momentum": lambda p: paddle.optimizer.Momentum(0.1, 0.9, parameters=p),
    "Adam": lambda p: paddle.optimizer.Adam(0.01, parameters=p),
    "AdamW": lambda p: paddle.optimizer.AdamW(0.01, parameters=p, weight_decay=0.1),
}


def optimizers(report: Report) -> None:
    x, y = _arrays(6, (32, 8), (32, 4))
    for name, make in OPTIMIZERS.items():
        def run(make: Callable[[Any], Any] = make) -> str:
            cpu, mine = _on_cpu(_mlp), _mlp()
            _same_init(cpu, mine)
            lc = _on_cpu(lambda: _train(cpu, make(cpu.parameters()), _pair(x, False)[0], _pair(y, False)[0], 3))
            ld = _train(mine, make(mine.parameters()), _pair(x, False)[1], _pair(y, False)[1], 3)
            return _close(ld, lc) or _close(list(mine.parameters()), list(cpu.parameters()))
        check(report, f"paddle.optimizer.{name}", run)


class TinyTransformer(paddle.nn.Layer):
    """Two encoder layers and a head: a language model's training step in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = paddle.nn.Linear(11, 16)      # one-hot tokens: an embedding through matmul
        layer = paddle.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
        self.encoder = paddle.nn.TransformerEncoder(layer, 2)
        self.head = paddle.nn.Linear(16, 11)

    def forward(self, tokens: Any) -> Any:
        return paddle.reshape(self.head(self.encoder(self.embed(tokens))), [-1, 11])


def transformer(report: Report, static: bool = True) -> None:
    rng = np.random.default_rng(7)
    tokens = np.eye(11, dtype=np.float32)[rng.integers(0, 11, (4, 6))]
    labels = rng.integers(0, 11, (24,)).astype(np.int64)

    def run(to_static: bool) -> str:
        cpu, mine = _on_cpu(TinyTransformer), TinyTransformer()
        _same_init(cpu, mine)
        # Momentum: Adam(W) would turn the rounding noise of the key projection's bias gradient
        # (zero in exact arithmetic: softmax ignores it) into steps of lr, different on every device
        lc = _on_cpu(lambda: _train(cpu, paddle.optimizer.Momentum(0.1, 0.9, parameters=cpu.parameters()),
                                    _pair(tokens, False)[0], _pair(labels, False)[0], 2, F.cross_entropy))
        step = paddle.jit.to_static(mine, full_graph=True) if to_static else mine
        ld = _train(mine, paddle.optimizer.Momentum(0.1, 0.9, parameters=mine.parameters()), _pair(tokens, False)[1],
                    _pair(labels, False)[1], 2, F.cross_entropy, step)
        return _close(ld, lc, 1e-4, 1e-5) or _close(list(mine.parameters()), list(cpu.parameters()), 1e-4, 1e-5)
    check(report, "paddle.transformer.eager", lambda: run(False))
    if static:
        check(report, "paddle.transformer.to_static", lambda: run(True))


def amp(report: Report) -> None:
    x, y = _arrays(8, (32, 8), (32, 4))

    def run() -> str:
        cpu, mine = _on_cpu(_mlp), _mlp()
        _same_init(cpu, mine)
        out_c = cpu(_pair(x, False)[0])
        # O2 (the parameters in float16): Paddle's O1 lists cast nothing on a custom device
        mine = paddle.amp.decorate(models=mine, level="O2", dtype="float16")
        with paddle.amp.auto_cast(dtype="float16", level="O2"):
            out_d = mine(_pair(x, False)[1])
        if out_d.dtype != paddle.float16:
            return f"auto_cast float16 (O2) on the device: the output is {out_d.dtype}, want paddle.float16"
        problem = _close(out_d, out_c, 1e-2, 1e-2)
        if problem:
            return f"forward {problem}"
        F.mse_loss(out_c, _pair(y, False)[0]).backward()
        F.mse_loss(paddle.cast(out_d, "float32"), _pair(y, False)[1]).backward()
        return _close([p.grad for p in mine.parameters()], [p.grad for p in cpu.parameters()], 2e-2, 2e-2)
    check(report, "paddle.amp.float16", run)


# -- order: repeated chains, two streams, other devices -----------------------------------------------

def ordering(report: Report) -> None:
    base = _arrays(9, (64, 64))[0]

    def chain() -> str:                             # REPEATS rounds of dependent ops, one synchronize
        (xc, xd), (bc, bd) = _pair(base, False), _pair(base, False)
        for i in range(REPEATS):
            xc = paddle.tanh(paddle.matmul(xc, bc, transpose_y=True) / 64 + i)
            xd = paddle.tanh(paddle.matmul(xd, bd, transpose_y=True) / 64 + i)
        return _close(xd, xc)
    check(report, "paddle.order.chain", chain)

    def two_streams() -> str:                       # produced on one stream, consumed on another
        dev = paddle.device.get_device()
        s1, s2 = paddle.device.Stream(dev), paddle.device.Stream(dev)
        got, want, keep = [], [], []
        bc, bd = _pair(base, False)
        for i in range(REPEATS):
            with paddle.device.stream_guard(s1):
                y = paddle.sum(bd * (i + 1), 0)
                done = s1.record_event()
            with paddle.device.stream_guard(s2):
                s2.wait_event(done)
                z = y + 1
            got.append(z)
            keep.append(y)                          # y's memory must not be reused before s2 reads it
            want.append(paddle.sum(bc * (i + 1), 0) + 1)
        paddle.device.synchronize()
        return _close(got, want, 1e-4, 1e-4)          # (sums of 64 terms, in another order)
    check(report, "paddle.order.two_streams", two_streams)

    def devices() -> str:                           # every other device of the process, and back
        dev = paddle.device.get_device()
        kind, index = dev.split(":")
        # the devices this process may use: under Paddle's launcher, its own (FLAGS_selected_<type>s)
        selected = os.environ.get(f"FLAGS_selected_{kind}s")
        ids = [int(v) for v in selected.split(",")] if selected else [
            int(d.split(":")[1]) for d in paddle.device.get_available_custom_device() or [] if d.startswith(kind + ":")]
        at = ids.index(int(index)) if int(index) in ids else 0
        ids = ids[at + 1:] + ids[:at + 1]            # the others first, this one last
        n = len(ids)
        got, want = [], []
        bc, bd = _pair(base, False)
        for i in range(REPEATS):
            x = bd + i
            for k in ids:
                x = x._copy_to(paddle.CustomPlace(kind, k), False) * 2
            got.append(x)
            want.append((bc + i) * 2 ** n)
        return _close(got, want)
    check(report, "paddle.order.devices", devices)


def run_all(report: Report, static: bool = True) -> None:
    """Every compute check on the current device; each prints its CHECK line through ``report``."""
    ops(report)
    optimizers(report)
    amp(report)
    ordering(report)
    transformer(report, static)
