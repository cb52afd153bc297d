"""The device computes what the CPU computes where torch takes another path for a device than for
the CPU (docs/torch.md, "The CPU's computation"), each against the CPU in the same process:
views of any layout reaching the CPU fallback as they are, the CPU kernels of silu's and mish's
gradients, attention on the CPU's fused kernel (its training steps bit-equal to the CPU's), the
LSTM and GRU cells torch runs fused on every device but the CPU, and init() in a forked child."""
from __future__ import annotations

import multiprocessing

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")
F = torch.nn.functional


def _pair(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=gen).to(dtype)
    return cpu, cpu.to("anychip")


# ---- views reach the CPU fallback with their own layout --------------------------------------

VIEWS = {
    "strided slice": lambda x: x[:, ::2],
    "expanded row": lambda x: x[:1].expand(64, 33),
    "transpose": lambda x: x.t(),
    "offset slice": lambda x: x[3:, 1:],
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_fallback_ops_over_a_view_give_the_cpus_bits(at, view):
    # the fallback copied a view that is not dense (a strided slice, an expanded row) to the host
    # contiguous, so the CPU kernel summed it in another order: x[:, ::2].sum() differed by
    # 1.9e-6 and the expanded row's sum by 3.8e-5 (the cause of cartesian_prod's gradient, which
    # sums an expanded gradient, differing from the CPU's)
    cpu, dev = _pair(64, 33)
    v = VIEWS[view]
    for op in (lambda t: t.sum(), lambda t: t.sum(0), lambda t: t.mean(1), lambda t: t.cumsum(1), torch.linalg.norm):
        want, got = op(v(cpu)), op(v(dev)).cpu()
        assert torch.equal(want, got), (view, (want - got).abs().max().item())


def test_an_in_place_op_through_a_strided_view_reaches_the_base(at):
    cpu, dev = _pair(8, 9)
    cpu[:, ::3].mul_(3).add_(cpu[:, 1::3])
    dev[:, ::3].mul_(3).add_(dev[:, 1::3])
    assert torch.equal(dev.cpu(), cpu)


def test_an_ops_inputs_copied_to_the_host_together_keep_their_layouts_and_order(at):
    # the fallback and the host kernels enqueue all of an op's input copies, then wait once: each
    # input keeps its view's layout and offset, a value written by a kernel just before is read
    # (the copies are ordered after it on the stream), on a second stream too
    cpu, dev = _pair(64, 33)
    views = [v(cpu) for v in VIEWS.values()] + [cpu[5:9, 2:30:3]]
    dviews = [v(dev) for v in VIEWS.values()] + [dev[5:9, 2:30:3]]
    assert torch.equal(torch.cat([v.flatten() for v in dviews]).cpu(), torch.cat([v.flatten() for v in views]))
    s = torch.Stream(device="anychip")
    with s:
        for _ in range(3):
            a, b, c = dev[:8, :8] + 1, dev[8:16, :8].t(), dev[:1, :8].expand(8, 8)     # (the table's add)
            got = torch.addcmul(a, b, c, value=0.5)                     # (the CPU's kernel, three inputs)
            got.addcdiv_(a, c.abs() + 1, value=2)
            stacked = torch.stack([got, a, b, c])                       # (the fallback, four inputs)
        s.synchronize()
    ca, cb, cc = cpu[:8, :8] + 1, cpu[8:16, :8].t(), cpu[:1, :8].expand(8, 8)
    want = torch.addcmul(ca, cb, cc, value=0.5)
    want.addcdiv_(ca, cc.abs() + 1, value=2)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(stacked.cpu(), torch.stack([want, ca, cb, cc]))
    # an op over tensors of anychip:1 (not the current device): copied from anychip:1
    x1 = dev.to("anychip:1")
    assert torch.equal(torch.stack([x1[:2], x1[2:4].t().t()]).cpu(), torch.stack([cpu[:2], cpu[2:4]]))


_SEEN: dict[str, tuple[int, tuple[int, ...]]] = {}


@pytest.fixture(scope="module")
def probe_ops():
    """Two ops with a CPU kernel only (so the device runs them through the CPU fallback), each
    noting the address and strides of the host tensor its kernel was handed: peek reads its input,
    poke writes it."""
    lib = torch.library.Library("anychip_fallback_probe", "DEF")
    lib.define("peek(Tensor x) -> Tensor")
    lib.define("poke(Tensor(a!) x) -> ()")

    def peek(x):
        _SEEN["peek"] = (x.data_ptr(), x.stride())
        return x * 2

    def poke(x):
        _SEEN["poke"] = (x.data_ptr(), x.stride())
        x.add_(1)

    lib.impl("peek", peek, "CPU")
    lib.impl("poke", poke, "CPU")
    yield torch.ops.anychip_fallback_probe
    lib._destroy()


def test_the_fallback_reads_host_memory_devices_inputs_in_place(at, probe_ops):
    # the simulated chips' device memory is host memory (plugin.h's ANYCHIP_PLUGIN_HOST_MEMORY): an
    # op the CPU fallback runs reads its inputs where they are, after the stream's earlier work, instead
    # of copies (before, each input was copied to a new host block, each op, every step)
    cpu, dev = _pair(16, 9)
    y = dev * 3                                 # (the table's kernel, enqueued just before)
    for t in (y, y[3:, 1:], y.t(), y[:1].expand(16, 9)):
        got = probe_ops.peek(t)
        assert _SEEN["peek"] == (t.data_ptr(), t.stride())
        assert got.device == t.device and torch.equal(got.cpu(), t.cpu() * 2)
    assert torch.equal(probe_ops.peek(y).cpu(), cpu * 3 * 2)
    # an op that writes an argument writes it where it is too (before: a copy, written back)
    z = y.clone()
    probe_ops.poke(z)
    assert _SEEN["poke"] == (z.data_ptr(), z.stride())
    assert torch.equal(z.cpu(), cpu * 3 + 1)
    w = y.clone().t()
    probe_ops.poke(w[2:])
    assert _SEEN["poke"] == (w[2:].data_ptr(), w.stride())
    want = (cpu * 3).t()
    want[2:] += 1
    assert torch.equal(w.cpu(), want)


def test_the_fallbacks_out_forms_give_the_cpus_values(at):
    # an op the fallback runs in its out= form (a structured op such as gelu, addmm, cat or log_softmax:
    # torch's generic kernel makes the device output and calls out=) writes the output where it is
    # (test_the_fallback_reads_host_memory_devices_inputs_in_place; before: the inputs and the output
    # copied to the host, the output copied back, for each such op of a training step)
    (x, xd), (w, wd), (b, bd) = _pair(8, 16), _pair(4, 16, seed=1), _pair(4, seed=2)
    got = [F.gelu(xd), torch.addmm(bd, xd, wd.t()), torch.cat([xd, xd * 2]), torch.log_softmax(xd, 1)]
    out = torch.empty(8, 16, device="anychip")
    torch.exp(xd, out=out)
    want = [F.gelu(x), torch.addmm(b, x, w.t()), torch.cat([x, x * 2]), torch.log_softmax(x, 1), x.exp()]
    for g, v in zip([*got, out], want, strict=True):
        assert torch.equal(g.cpu(), v)
    # an out= argument the CPU kernel resizes past its memory gets host memory, copied back resized
    small = torch.empty(3, device="anychip")
    with pytest.warns(UserWarning, match="resized"):
        torch.exp(xd, out=small)
    assert small.shape == (8, 16) and torch.equal(small.cpu(), x.exp())


def test_mm_writes_its_device_output_in_place(at):
    # mm (19 of a nanoGPT step's ops) runs the CPU kernel of mm.out into a device output made first,
    # through the fallback, which writes it where it is (before: the functional fallback, whose host
    # result was copied to the device: aten::to, _to_copy, empty_strided, copy_ and _copy_from)
    from torch.profiler import ProfilerActivity, profile
    (a, ad), (b, bd) = _pair(8, 16), _pair(16, 4, seed=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = ad @ bd
    assert [e.name for e in prof.events()] == ["aten::matmul", "aten::mm", "aten::empty", "aten::_to_cpu",
                                               "aten::resolve_conj", "aten::resolve_conj", "aten::resolve_conj",
                                               "aten::_copy_from_and_resize"]
    assert torch.equal(got.cpu(), a @ b)
    assert torch.equal((ad.t() @ ad).cpu(), a.t() @ a)         # (a transposed operand, as on the CPU)


def test_the_fallbacks_out_forms_see_an_overlap_as_the_cpu_does(at):
    # the views of one device storage share one host storage in the fallback, so the CPU kernel's
    # overlap checks see the device's overlaps: the CPU's error (before: separate copies, so a
    # partially overlapping out= was computed and written back without one)
    x, xd = _pair(10)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.exp(x[:-1], out=x[1:])
    with pytest.raises(RuntimeError) as dev_err:
        torch.exp(xd[:-1], out=xd[1:])
    assert "refer to a single memory location" in str(cpu_err.value)
    assert str(dev_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]
    assert torch.equal(xd.cpu(), x)
    torch.exp(xd, out=xd)                       # (a full overlap, in place, as on the CPU)
    x.exp_()
    assert torch.equal(xd.cpu(), x)


def test_while_the_profiler_traces_the_device_the_fallbacks_inputs_are_copies_on_the_stream(at, probe_ops):
    from torch.profiler import ProfilerActivity, profile
    _, dev = _pair(16, 9)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        probe_ops.peek(dev)
    assert _SEEN["peek"][0] != dev.data_ptr()
    assert [e.name for e in prof.events() if e.name == "copy_async"] == ["copy_async"] * 2


def test_the_host_kernels_of_an_optimizers_ops_write_the_device_output_where_it_is(at):
    # addcmul, addcdiv, lerp and sqrt run the CPU's kernel (the table's would round differently); on
    # a device whose memory is host memory, its out= form writes the device output in place (before:
    # a host result, then a copy of it to the device, for each parameter's each op in Adam's step)
    from torch.profiler import ProfilerActivity, profile
    (x, xd), (a, ad) = _pair(16, 9), _pair(16, 9, seed=1)
    sq, sqd = x * x, xd * xd
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        xd.addcmul_(ad, ad, value=0.5)
        rd = sqd.sqrt()
        ld = xd.lerp(ad, 0.3)
        xd.addcdiv_(ad, rd, value=-2)
    assert [e.name for e in prof.events() if e.name in ("aten::copy_", "aten::_copy_from")] == []
    x.addcmul_(a, a, value=0.5)
    r = sq.sqrt()
    lerped = x.lerp(a, 0.3)
    x.addcdiv_(a, r, value=-2)
    for got, want in ((xd, x), (rd, r), (ld, lerped)):
        assert torch.equal(got.cpu(), want)


# ---- silu's and mish's gradients: the CPU kernels, not their decompositions ---------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fn", ["silu", "mish"])
def test_silu_and_mish_gradients_are_the_cpus(at, fn, dtype):
    # silu_backward and mish_backward have a CompositeImplicitAutograd kernel besides the CPU's,
    # which a backend without its own takes before its fallback: the device differed from the CPU
    # in 9 of 20 (silu) and 7 of 20 (mish) float32 gradients of OpInfo's sample, by one ulp
    cpu, dev = _pair(4, 50, dtype=dtype)
    cpu.requires_grad_()
    dev.requires_grad_()
    g_cpu, g_dev = _pair(4, 50, dtype=dtype, seed=1)
    want = torch.autograd.grad(getattr(F, fn)(cpu), cpu, g_cpu)[0]
    got = torch.autograd.grad(getattr(F, fn)(dev), dev, g_dev)[0]
    assert torch.equal(got.cpu(), want)


# ---- attention on the CPU's kernel --------------------------------------------------------------

def _qkv(dtype, seq=16, requires_grad=False):
    out = []
    for seed in range(3):
        cpu, dev = _pair(2, 4, seq, 16, dtype=dtype, seed=seed)
        out.append((cpu.requires_grad_(requires_grad), dev.requires_grad_(requires_grad)))
    return out


@pytest.mark.parametrize("case", ["float32", "float32 causal", "float16 masked", "bfloat16 grad", "dropout"])
def test_attention_chooses_the_cpus_kernel(at, case):
    # torch asks the device's _fused_sdp_choice_stub; none registered meant the math decomposition
    # (SDPBackend.math, 0) on the device where the CPU runs its flash kernel (1)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(case.split()[0], torch.float32)
    (qc, qd), (kc, kd), (vc, vd) = _qkv(dtype, requires_grad="grad" in case)
    kw = {"is_causal": "causal" in case, "dropout_p": 0.1 if case == "dropout" else 0.0}
    mc = md = None
    if "masked" in case:
        mc = torch.ones(16, 16, dtype=torch.bool).tril()
        md = mc.to("anychip")
    want = torch._fused_sdp_choice(qc, kc, vc, mc, **kw)
    assert torch._fused_sdp_choice(qd, kd, vd, md, **kw) == want
    assert want == (0 if case == "dropout" else 1)
    if case != "dropout":
        got = F.scaled_dot_product_attention(qd, kd, vd, md, **kw).cpu()
        assert torch.equal(got, F.scaled_dot_product_attention(qc, kc, vc, mc, **kw))


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 50)

    def forward(self, idx):
        b, t = idx.shape
        q, k, v = self.qkv(self.emb(idx)).split(32, dim=2)
        q, k, v = (z.view(b, t, 4, 8).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 32)
        return self.out(y)


def test_attention_training_steps_equal_the_cpus(at):
    # a causal attention layer trained 10 steps with SGD: every loss, and the weights after, equal
    # the CPU's bit for bit. (Before, the device's math decomposition gave the CPU's values in only
    # 23 of 30 steps of a nanoGPT; the CPU's own math path differs from its flash kernel here.)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    model = _Attention()
    dev_model = _Attention().to("anychip")
    dev_model.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 50, (4, 24), generator=gen) for _ in range(10)]
    losses = {}
    for name, m in (("cpu", model), ("dev", dev_model)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses[name] = []
        for idx in batches:
            idx = idx.to(next(m.parameters()).device)
            loss = F.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert losses["dev"] == losses["cpu"]
    for (name, p), q in zip(model.named_parameters(), dev_model.parameters(), strict=True):
        assert torch.equal(q.detach().cpu(), p.detach()), name
    # the comparison can tell the two paths apart: on the CPU, the math path's attention of this
    # layer's shape differs from the kernel's
    (q, _), (k, _), (v, _) = (_pair(4, 4, 23, 8, seed=s) for s in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        math = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.equal(math, F.scaled_dot_product_attention(q, k, v, is_causal=True))


# ---- the LSTM and GRU cells torch runs fused on a device ------------------------------------

@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_run_on_the_device_as_on_the_cpu(at, kind):
    # torch runs the cells of nn.LSTM / nn.GRU as _thnn_fused_lstm_cell / _thnn_fused_gru_cell on
    # every device but the CPU, ops with CUDA and XPU kernels only: the device refused both
    # ("Could not run 'aten::_thnn_fused_lstm_cell' with arguments from the 'CPU' backend").
    # The values agree with the CPU's within float32 rounding, not bit for bit: the CPU's layer
    # projects the whole sequence's inputs at once, the fused cell step by step.
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(8, 16, num_layers=2, bidirectional=True, batch_first=True)
    dev_layer = getattr(torch.nn, kind)(8, 16, num_layers=2, bidirectional=True, batch_first=True).to("anychip")
    dev_layer.load_state_dict(layer.state_dict())
    x, xd = _pair(3, 5, 8)
    out, _ = layer(x)
    out_d, _ = dev_layer(xd)
    torch.testing.assert_close(out_d.cpu(), out, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    out_d.square().sum().backward()
    for (name, p), q in zip(layer.named_parameters(), dev_layer.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)


# ---- a forked child ----------------------------------------------------------------------------

def _init_in_child(q) -> None:
    try:
        torch.anychip.init()
        q.put("initialized")
    except RuntimeError as exc:
        q.put(str(exc))


def test_init_in_a_forked_child_is_refused(at):
    torch.anychip.init()                     # nothing to do in the process that set the device up
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_init_in_child, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.get(timeout=10).startswith("Cannot re-initialize anychip in forked subprocess. To use anychip with "
                                        "multiprocessing, you must use the 'spawn' start method")
