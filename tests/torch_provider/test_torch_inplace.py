"""In-place and out= forms of the device's ops, and the allocator's C path (docs/torch.md,
"In-place and out= forms"): each against torch's CPU in the same process, exactly.

The functional, in-place and out= forms of add, sub, mul, div, the comparisons, maximum,
minimum, neg, sqrt, addcmul, addcdiv and lerp share one implementation per op over torch's own
meta functions; they run on the chip's kernel table where the operands fit, else the CPU kernel's
values are written into the output."""
from __future__ import annotations

import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

D = "anychip:0"


def _by_entry(at) -> dict:
    return dict(at._C.kernel_launches()[2])


def _delta(at, before: dict) -> dict:
    return {k: v - before[k] for k, v in _by_entry(at).items() if v != before[k]}


def _same(got, want) -> None:
    assert got.device.type == "anychip" and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def _error(fn, *args) -> str:
    with pytest.raises(RuntimeError) as info:
        fn(*args)
    return str(info.value)


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
          torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place_and_out_forms_run_the_kernel_table_and_equal_the_cpu(at, dtype):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(5, 3, 7, generator=g) * 20).to(dtype)
    b = (torch.randn(3, 7, generator=g) * 20).to(dtype)              # broadcast to (5, 3, 7)
    if dtype.is_floating_point:
        b[0, :2] = torch.tensor([0.0, float("nan")])
    ops = [("add_", lambda x, y: x.add_(y)), ("sub_", lambda x, y: x.sub_(y)), ("mul_", lambda x, y: x.mul_(y)),
           ("add out", lambda x, y: torch.add(x, y, out=x)), ("mul out", lambda x, y: torch.mul(y, x, out=x))]
    if dtype.is_floating_point:
        ops += [("div_", lambda x, y: x.div_(y)), ("div out", lambda x, y: torch.div(x, y, out=x))]
    for name, f in ops:
        want = a.clone()
        f(want, b)
        got = a.to(D)
        before = _by_entry(at)
        assert f(got, b.to(D)) is got
        assert _delta(at, before) == {"binary": 1}, (name, dtype)
        _same(got, want)
    # a Python number: written on the device by the fill entry, then the binary kernel (as the
    # CPU reads it: float16 / bfloat16 take it in float, so only a value they hold exactly)
    for value in (2, 0.5, -3, 300, 2**24 + 1, True):     # (300 wraps in 8 bits; 2**24 + 1 rounds in float32)
        if not dtype.is_floating_point and isinstance(value, float):
            continue
        if dtype is torch.float16 and value == 2**24 + 1:
            continue                                # (float16 does not hold it: below)
        for name, f in (("add_", lambda x, v: x.add_(v)), ("mul_", lambda x, v: x.mul_(v)),
                        ("sub_", lambda x, v: x.sub_(v))):
            if value is True and name == "sub_":
                continue                            # (refused: bool subtraction)
            want = a.clone()
            f(want, value)
            got = a.to(D)
            before = _by_entry(at)
            f(got, value)
            assert _delta(at, before) == {"fill": 1, "binary": 1}, (name, dtype, value)
            _same(got, want)
    if dtype in (torch.float16, torch.bfloat16):
        for value in (0.1, 70000.5):                # not held in the dtype: the CPU kernel's
            got, want = a.to(D), a.clone()
            before = _by_entry(at)
            got.mul_(value)
            want.mul_(value)
            assert _delta(at, before) == {}
            _same(got, want)
    if dtype.is_floating_point:
        got, want = a.to(D), a.clone()
        before = _by_entry(at)
        got.div_(4.0)
        want.div_(4.0)
        assert _delta(at, before) == {"fill": 1, "binary": 1}
        _same(got, want)


def test_what_the_table_does_not_compute_as_the_cpu_takes_the_cpus_kernel(at):
    """alpha other than +-1 (the CPU fuses the multiply-add), a float16 scalar it does not hold, a
    promotion and bool arithmetic: the CPU kernel's values, no launch (but the bool's compare)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 6, generator=g)
    b = torch.randn(4, 6, generator=g)
    cases = [(lambda x, y: x.add_(y, alpha=0.1), a, b), (lambda x, y: x.sub_(y, alpha=3), a, b),
             (lambda x, y: x.mul_(0.1), a.half(), b), (lambda x, y: x.add_(y), a.double(), b),
             (lambda x, y: x.mul_(y), a > 0, b > 0), (lambda x, y: x.addcmul_(y, y, value=0.1), a, b),
             (lambda x, y: x.addcdiv_(y, x, value=-0.5), a, b), (lambda x, y: x.lerp_(y, 0.1), a, b),
             (lambda x, y: torch.lerp(x, y, 0.7, out=x), a, b)]
    for i, (f, x, y) in enumerate(cases):
        want = x.clone()
        f(want, y)
        got = x.to(D)
        before = _by_entry(at)
        f(got, y.to(D))
        assert _delta(at, before) == {}, i
        _same(got, want)
    for op, args in ((torch.addcmul, (a, b, b + 3)), (torch.addcdiv, (a, b, b + 3)), (torch.lerp, (a, b, 0.3))):
        _same(op(*(t.to(D) if isinstance(t, torch.Tensor) else t for t in args)), op(*args))   # functional


def test_in_place_on_views_writes_through_to_the_base(at):
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    x = torch.arange(8, dtype=torch.float32)
    dev = base.to(D)
    xd = x.to(D)
    for f in (lambda t, v: t[1:3].add_(v),              # a contiguous slice: the kernel writes it
              lambda t, v: t[:, 2].mul_(3),              # a strided column: a temporary, copied in
              lambda t, v: t.t()[::2].sub_(1),           # a transposed, strided view
              lambda t, v: t.t().neg_(),                 # dense, transposed: the kernel in its order
              lambda t, v: t[4].sqrt_(),
              lambda t, v: torch.mul(t[2:4], v, out=t[2:4]),
              lambda t, v: t.view(-1)[10:20].div_(2)):
        f(base, x)
        f(dev, xd)
        _same(dev, base)


def test_aliasing_out_of_an_input_partial_overlap_and_non_contiguous_out(at):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 5, generator=g)
    b = torch.randn(4, 5, generator=g)
    ad, bd = a.to(D), b.to(D)
    for f in (lambda x, y: torch.add(x, y, out=y), lambda x, y: torch.mul(x, x, out=x),
              lambda x, y: torch.maximum(x, y, out=y), lambda x, y: torch.sub(y, x, out=x.t().t()),
              lambda x, y: torch.neg(x, out=x), lambda x, y: torch.lt(x, y, out=torch.empty_like(x, dtype=torch.bool)),
              lambda x, y: x.eq_(y.round()), lambda x, y: torch.addcmul(x, x, y, out=x)):
        want = f(a, b)
        got = f(ad, bd)
        _same(got, want)
        _same(ad, a)
        _same(bd, b)
    # an out= of other strides: the CPU's values in the out's own layout
    out_cpu = torch.empty(5, 4).t()
    out_dev = torch.empty(5, 4, device=D).t()
    torch.add(a, b, out=out_cpu)
    torch.add(ad, bd, out=out_dev)
    _same(out_dev, out_cpu)
    assert out_dev.stride() == out_cpu.stride() == (1, 4)
    # partial overlap: torch's error, as on the CPU
    cpu = torch.arange(10.0)
    dev = cpu.to(D)
    want = _error(lambda: torch.add(cpu[:8], 1, out=cpu[2:]))
    assert _error(lambda: torch.add(dev[:8], 1, out=dev[2:])) == want
    assert "some elements of the input tensor and the written-to tensor refer to a single memory location" in want
    # an expanded (self-overlapping) in-place target
    want = _error(lambda: torch.zeros(1).expand(3).add_(1))
    assert _error(lambda: torch.zeros(1, device=D).expand(3).add_(1)) == want


def test_out_is_resized_with_torchs_warning_and_its_dtype_checked(at):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for out_shape in ((0,), (7, 1)):                  # empty: silently; with elements: torch's warning
        outs = []
        for device in ("cpu", D):
            out = torch.ones(out_shape, device=device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.mul(a.to(device), 2, out=out)
            outs.append((out, [str(w.message) for w in caught]))
        _same(outs[1][0], outs[0][0])
        assert outs[1][1] == outs[0][1]
        assert bool(outs[0][1]) == (out_shape == (7, 1))
    wide = torch.empty(2, 3, dtype=torch.float64)
    wide_d = wide.to(D)
    torch.div(a, 3, out=wide)
    torch.div(a.to(D), 3, out=wide_d)
    _same(wide_d, wide)                               # computed in float32, written as float64


def test_errors_are_the_cpus(at):
    i = torch.arange(6).reshape(2, 3)
    f = torch.rand(2, 3)
    cases = [
        lambda d: i.to(d).add_(f.to(d)),              # result type Float can't be cast to ... Long
        lambda d: i.to(d).mul_(0.5),
        lambda d: i.to(d).div_(2),
        lambda d: i.to(d).sqrt_(),
        lambda d: torch.add(f.to(d), 1, out=torch.empty(2, 3, dtype=torch.long, device=d)),
        lambda d: f[:, :1].to(d).add_(f.to(d)),       # output with shape [2, 1] doesn't match ...
        lambda d: (f > 0).to(d).sub_((f > 0).to(d)),  # subtraction with two bool tensors
        lambda d: (f > 0).to(d).neg_(),
        lambda d: torch.add(f.to(d), f.to(d), alpha=0.5j),
        lambda d: i.to(d).add_(i.to(d), alpha=0.5),   # alpha must not be a floating point number
        lambda d: i.to(d).lerp_(i.to(d), 0.5),
    ]
    for k, case in enumerate(cases):
        assert _error(case, D) == _error(case, "cpu"), k
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        f.to(D).add_(f)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(f, f, out=torch.empty(2, 3, device=D))


def test_unary_in_place_and_out_forms(at):
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = (torch.randn(3, 5, generator=g) * 4).to(dtype)
        x[0, :3] = torch.tensor([-0.0, float("nan"), float("inf")])
        # sqrt: the CPU kernel's (the CPU's vectorized square root is not the correctly rounded one
        # the table computes: the last bit of 1 float32 value in 6 differs)
        for name, f, launches in (("neg_", lambda t: t.neg_(), 1), ("relu_", lambda t: t.relu_(), 1),
                                  ("neg out", lambda t: torch.neg(t, out=torch.empty_like(t)), 1),
                                  ("sqrt_", lambda t: t.sqrt_(), 0), ("sqrt out", lambda t: torch.sqrt(t, out=t), 0)):
            want = f(x.clone())
            got = x.to(D)
            before = _by_entry(at)
            res = f(got)
            assert _delta(at, before) == ({"unary": launches} if launches else {}), (name, dtype)
            _same(res, want)
            assert (res is got) == (name != "neg out")
    i = torch.arange(-3, 9, dtype=torch.int32)
    _same(torch.sqrt(i.to(D)), torch.sqrt(i))          # promotes to float: the CPU's kernel
    _same(i.to(D).neg_(), i.clone().neg_())
    _same(i.to(D).relu_(), i.clone().relu_())


def _train(opt_cls, device, steps, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
    opt = opt_cls(model.parameters(), **kw)
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(8, 6, generator=g) for _ in range(steps)]
    ys = [torch.randint(0, 3, (8,), generator=g) for _ in range(steps)]
    counts = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
        import anychip.torch as at
        before = _by_entry(at)
        opt.step()
        counts.append(_delta(at, before))
    return [p.detach().cpu() for p in model.parameters()], counts


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("opt", ["SGD", "AdamW"])
def test_an_optimizer_step_runs_the_kernel_table_and_equals_the_cpus(at, opt, foreach):
    """Each step's element-wise ops by a scalar or tensor (SGD's momentum, AdamW's decay, second
    moment and denominator) run on the chip's kernels; the fused ones (add with alpha, addcmul,
    addcdiv, lerp) and sqrt the CPU's: the parameters equal the CPU's bit for bit (before: no
    launch at all, every in-place op through the CPU fallback)."""
    cls, kw = ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}) if opt == "SGD"
               else (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}))
    want, _ = _train(cls, "cpu", 3, foreach=foreach, **kw)
    got, counts = _train(cls, D, 3, foreach=foreach, **kw)
    for g, w in zip(got, want, strict=True):
        assert g.equal(w)
    n = 4                                             # parameters
    if opt == "SGD":                                  # buf.mul_(momentum) (a scalar: fill + binary), .add_(grad)
        assert counts[1:] == [{"fill": n, "binary": 2 * n}] * 2
    else:                                             # mul_ (decay), mul_(beta2), / bias, add_(eps)
        assert counts[1:] == [{"fill": 4 * n, "binary": 4 * n}] * 2


def test_the_allocator_runs_no_python_per_tensor_and_its_statistics_stay_exact(at):
    """A tensor's memory comes from the allocator's compiled core through C (Core.buffer): no
    Python function runs for it (before: anychip.torch's callback and Device.alloc, four Python
    frames per tensor); the statistics are the allocator's own, exact to the byte."""
    torch.empty(100, device=D)                         # (the allocator made, its blocks cached)
    torch.empty(100, device=D, dtype=torch.float64)
    s = torch.Stream(device=D)
    with s:
        torch.empty(100, device=D)
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    base = at.memory_allocated(0)
    sys.setprofile(profile)
    try:
        keep = [torch.empty(100, device=D) for _ in range(20)]          # 400 bytes: 512-byte blocks
        with s:
            keep.append(torch.empty(100, device=D, dtype=torch.float64))   # 800 bytes: 1,024
    finally:
        sys.setprofile(None)
    assert [c for c in calls if "anychip" in c] == []
    stats = at.memory_stats(0)
    assert at.memory_allocated(0) - base == 20 * 512 + 1024
    assert stats == at._state.devices[0].memory_stats()
    assert torch.accelerator.memory_allocated(0) == at.memory_allocated(0)
    buf = at.buffer_of(keep[0])
    assert buf.ptr == keep[0].data_ptr() and buf.nbytes == 400
    del keep, buf
    assert at.memory_allocated(0) == base
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.empty(1 << 50, dtype=torch.uint8, device=D)
