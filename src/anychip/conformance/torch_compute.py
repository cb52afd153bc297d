"""What PyTorch computes on the chip, against PyTorch's CPU in the same process: the compute
checks of ``anychip conformance --framework torch`` (run by torch_worker.py with ``--compute``
on each rank's device before the collectives).

Every check runs the same program on the CPU and on the device, from the same inputs, and
compares the device's values (moved to the CPU) with ``torch.testing.assert_close`` at the
dtype's default tolerances (NaN equal to NaN): ops forward and backward on contiguous,
broadcast, strided, sliced and transposed inputs; optimizer steps (SGD with momentum, Adam,
AdamW); a 2-layer Transformer's training steps, eager and under
``torch.compile(backend="aot_eager")``; float16 autocast; work on two streams ordered by an
event, and on every other device of the process; each repeated enough times, without
synchronizing in between, for an ordering defect to show.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

from ._compare import Report, check, compare, one_line

#: how many times the ordered checks run their program without a synchronize in between
REPEATS = 20


def _close(got: Any, want: Any, rtol: float | None = None, atol: float | None = None) -> str:
    """'' when ``got`` (device) matches ``want`` (CPU), else what differs."""
    def same(g: torch.Tensor, w: torch.Tensor) -> str:
        try:
            torch.testing.assert_close(g.detach().cpu(), w.detach(), equal_nan=True, rtol=rtol, atol=atol)
        except AssertionError as exc:
            return one_line(exc)
        return ""
    return compare(got, want, same)


# -- ops, forward and backward ------------------------------------------------------------------

def _inputs(seed: int, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def _layouts(x: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Ways to hand an op a (4, 6) operand: made from a larger or permuted tensor on its device."""
    return {
        "contiguous": lambda t: t,
        "transposed": lambda t: t.t().contiguous().t(),
        "strided": lambda t: torch.cat([t, t], 1)[:, ::2],
        "sliced": lambda t: torch.nn.functional.pad(t, (2, 1, 1, 0))[1:, 2:-1],
        "expanded": lambda t: t[:1].expand(4, 6),
    }


#: op name -> (function, input shapes): forward on every layout of the first input, and backward
UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "relu": torch.relu, "exp": torch.exp, "log": lambda t: torch.log(t.abs() + 0.5),
    "sqrt": lambda t: torch.sqrt(t.abs() + 0.1), "tanh": torch.tanh, "sigmoid": torch.sigmoid, "gelu": F.gelu,
    "square": torch.square, "sum": torch.sum, "sum_dim": lambda t: t.sum(1), "mean": lambda t: t.mean(0),
    "softmax": lambda t: torch.softmax(t, -1), "log_softmax": lambda t: torch.log_softmax(t, 0),
    "layer_norm": lambda t: F.layer_norm(t, (6,)), "scale": lambda t: t * 2.5 + 1,
}
BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum, "minimum": torch.minimum, "where": lambda a, b: torch.where(a > b, a, b),
}
COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


def _forward_backward(fn: Callable[..., torch.Tensor], cpu_inputs: list[torch.Tensor], dev: torch.device,
                      layout: Callable[[torch.Tensor], torch.Tensor]) -> str:
    xs_c = [x.clone().requires_grad_(x.is_floating_point()) for x in cpu_inputs]
    xs_d = [x.detach().to(dev).requires_grad_(x.is_floating_point()) for x in cpu_inputs]
    out_c = fn(*[layout(x) if i == 0 else x for i, x in enumerate(xs_c)])
    out_d = fn(*[layout(x) if i == 0 else x for i, x in enumerate(xs_d)])
    problem = _close(out_d, out_c)
    if problem or not out_c.is_floating_point():
        return problem and f"forward {problem}"
    grad = _inputs(99, tuple(out_c.shape))[0]
    out_c.backward(grad)
    out_d.backward(grad.to(dev))
    problem = _close([x.grad for x in xs_d], [x.grad for x in xs_c])
    return problem and f"backward {problem}"


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _compare(cmp: Callable[..., torch.Tensor], a: torch.Tensor, b: torch.Tensor, dev: torch.device) -> str:
    return _close(cmp(a.to(dev), b.to(dev)), cmp(a, b))


def _add_mul(x: torch.Tensor, y: torch.Tensor, dev: torch.device) -> str:
    return _close((x.to(dev) + y.to(dev)) * y.to(dev), (x + y) * y)


def ops(report: Report, dev: torch.device) -> None:
    a, b = _inputs(1, (4, 6), (4, 6))
    for name, fn in UNARY.items():
        for lname, lay in _layouts(a).items():
            check(report, f"torch.{name}.{lname}", partial(_forward_backward, fn, [a], dev, lay))
    row, col = _inputs(2, (6,), (4, 1))
    for name, fn2 in BINARY.items():
        for lname, lay in _layouts(a).items():
            check(report, f"torch.{name}.{lname}", partial(_forward_backward, fn2, [a, b], dev, lay))
        check(report, f"torch.{name}.broadcast_row", partial(_forward_backward, fn2, [a, row], dev, _same))
        check(report, f"torch.{name}.broadcast_col", partial(_forward_backward, fn2, [col, a], dev, _same))
    for name, cmp in COMPARE.items():                 # half the pairs equal, so eq / le / ge see ties
        bb = torch.where(torch.arange(24).reshape(4, 6) % 2 == 0, a, b)
        check(report, f"torch.{name}", partial(_compare, cmp, a, bb, dev))
    ones = torch.ones(3)
    check(report, "torch.add.ones", lambda: _close(ones.to(dev) + ones.to(dev), ones + ones))
    for dtype in (torch.int32, torch.int64, torch.float64, torch.float16, torch.bfloat16):
        x, y = (t * 100 for t in _inputs(3, (5, 7), (5, 7)))
        x, y = x.to(dtype), y.to(dtype)
        check(report, f"torch.add_mul.{str(dtype)[6:]}", partial(_add_mul, x, y, dev))
    m1, m2, m3 = _inputs(4, (5, 7), (7, 3), (3, 4, 7))
    check(report, "torch.mm", lambda: _forward_backward(lambda p, q: p @ q, [m1, m2], dev, lambda t: t))
    check(report, "torch.mm.transposed", lambda: _forward_backward(lambda p, q: p.t() @ q, [m1.t().contiguous(),
                                                                                          m2], dev, lambda t: t))
    check(report, "torch.matmul.batched", lambda: _forward_backward(lambda p, q: p @ q, [m3, m1.t().contiguous()],
                                                                     dev, lambda t: t))
    w, bias = _inputs(5, (3, 7), (3,))
    check(report, "torch.linear", lambda: _forward_backward(lambda x, w, b: F.linear(x, w, b), [m1, w, bias], dev,
                                                             lambda t: t))
    target = torch.tensor([0, 2, 1, 1, 0])
    check(report, "torch.cross_entropy", lambda: _forward_backward(
        lambda x: F.cross_entropy(x, target.to(x.device)), [m1[:, :3].contiguous()], dev, lambda t: t))


# -- optimizers, a Transformer, AMP ----------------------------------------------------------------

def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _train(model: Callable[[torch.Tensor], torch.Tensor], opt: torch.optim.Optimizer, x: torch.Tensor,
           y: torch.Tensor, steps: int, loss_fn: Callable[..., torch.Tensor] = F.mse_loss) -> list[torch.Tensor]:
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}


def optimizers(report: Report, dev: torch.device) -> None:
    x, y = _inputs(6, (32, 8), (32, 4))
    for name, make in OPTIMIZERS.items():
        def run(make: Callable[[Any], torch.optim.Optimizer] = make) -> str:
            cpu, mine = _mlp(), _mlp().to(dev)
            lc = _train(cpu, make(cpu.parameters()), x, y, 3)
            ld = _train(mine, make(mine.parameters()), x.to(dev), y.to(dev), 3)
            return _close(ld, lc, rtol=1e-5, atol=1e-6) or _close(list(mine.parameters()), list(cpu.parameters()),
                                                                   rtol=1e-5, atol=1e-6)
        check(report, f"torch.optim.{name}", run)


class TinyTransformer(torch.nn.Module):
    """Two encoder layers and a head: a language model's training step in miniature."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(11, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 11)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens))).flatten(0, 1)


def transformer(report: Report, dev: torch.device, compiled: bool = True) -> None:
    g = torch.Generator().manual_seed(7)
    tokens, labels = torch.randint(0, 11, (4, 6), generator=g), torch.randint(0, 11, (24,), generator=g)

    def run(compile_it: bool) -> str:
        cpu, mine = TinyTransformer(), TinyTransformer().to(dev)
        step = torch.compile(mine, backend="aot_eager") if compile_it else mine
        # SGD: Adam would turn the rounding noise of the key bias's gradient (zero in exact
        # arithmetic: softmax ignores it) into whole steps of lr
        lc = _train(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9), tokens, labels, 3, F.cross_entropy)
        ld = _train(step, torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9), tokens.to(dev), labels.to(dev), 3,
                    F.cross_entropy)
        return _close(ld, lc, rtol=1e-4, atol=1e-5) or _close(list(mine.parameters()), list(cpu.parameters()),
                                                              rtol=1e-4, atol=1e-5)
    check(report, "torch.transformer.eager", lambda: run(False))
    if compiled:
        check(report, "torch.transformer.compile_aot_eager", lambda: run(True))


def amp(report: Report, dev: torch.device) -> None:
    x, y = _inputs(8, (32, 8), (32, 4))

    def run() -> str:
        cpu, mine = _mlp(), _mlp().to(dev)
        with torch.autocast("cpu", dtype=torch.float16):
            out_c = cpu(x)
        with torch.autocast(dev.type, dtype=torch.float16):
            out_d = mine(x.to(dev))
        if out_d.dtype != torch.float16:
            return f"autocast on {dev.type}: the output is {out_d.dtype}, want torch.float16"
        problem = _close(out_d, out_c, rtol=1e-2, atol=1e-2)
        if problem:
            return f"forward {problem}"
        F.mse_loss(out_c.float(), y).backward()
        F.mse_loss(out_d.float(), y.to(dev)).backward()
        return _close([p.grad for p in mine.parameters()], [p.grad for p in cpu.parameters()], rtol=1e-2, atol=1e-2)
    check(report, "torch.amp.float16", run)


# -- order: repeated chains, two streams, other devices -----------------------------------------------

def ordering(report: Report, dev: torch.device) -> None:
    import anychip.torch as at
    base = _inputs(9, (64, 64))[0]

    def chain() -> str:                             # REPEATS rounds of dependent ops, one synchronize
        x_c, x_d = base.clone(), base.to(dev)
        for i in range(REPEATS):
            x_c = torch.tanh(x_c @ base.t() / 64 + i)
            x_d = torch.tanh(x_d @ base.to(dev).t() / 64 + i)
        return _close(x_d, x_c)
    check(report, "torch.order.chain", chain)

    def two_streams() -> str:                       # produced on one stream, consumed on another
        s1, s2 = torch.Stream(device=dev), torch.Stream(device=dev)
        got, want, keep = [], [], []
        for i in range(REPEATS):
            with s1:
                y = (base.to(dev) * (i + 1)).sum(0)
                done = s1.record_event()
            with s2:
                s2.wait_event(done)
                z = y + 1
            got.append(z)
            keep.append(y)                          # y's memory must not be reused before s2 reads it
            want.append((base * (i + 1)).sum(0) + 1)
        at.synchronize(dev)
        return _close(got, want)
    check(report, "torch.order.two_streams", two_streams)

    def devices() -> str:                           # every other device of the process, and back
        n = at.device_count()
        got, want = [], []
        for i in range(REPEATS):
            x = base.to(dev) + i
            for k in range(n):
                other = torch.device(dev.type, (dev.index + 1 + k) % n)
                x = x.to(other) * 2
            got.append(x)
            want.append((base + i) * 2 ** n)
        return _close(got, want)
    check(report, f"torch.order.devices_{at.device_count()}", devices)


def run_all(report: Report, dev: torch.device, compiled: bool = True) -> None:
    """Every compute check on ``dev``; each prints its CHECK line through ``report``."""
    ops(report, dev)
    optimizers(report, dev)
    amp(report, dev)
    ordering(report, dev)
    transformer(report, dev, compiled)
