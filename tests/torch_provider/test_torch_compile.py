"""torch.compile on the anychip device with the default backend (inductor): dynamo's device
interface, registered only when dynamo is imported; inductor's C++ kernels on the simulated
chips' host memory, ordered after the device's streams; and the fallback of a device whose memory
is not host memory (docs/torch.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS, cached_compile  # noqa: E402

F = torch.nn.functional


# ---- dynamo's device interface ---------------------------------------------------------------------

LAZY_PROGRAM = """
import sys, time
import torch
t = time.perf_counter()
import anychip.torch
took = time.perf_counter() - t
before = "torch._dynamo" in sys.modules
from torch._dynamo.device_interface import get_interface_for_device
iface = get_interface_for_device("anychip")
print(before, iface.__name__, iface.current_device(), iface.device_count() == torch.anychip.device_count(),
      get_interface_for_device("anychip:1") is iface, f"{took:.2f}")
"""


@pytest.mark.slow
def test_dynamos_device_interface_is_registered_when_dynamo_is_imported_not_before(at):
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    done = subprocess.run([sys.executable, "-c", LAZY_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:5] == ["False", "AnychipInterface", "0", "True", "True"]


@pytest.mark.slow
def test_the_device_interface_answers_as_the_device_module(at):
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device("anychip")
    assert iface.device_count() == torch.anychip.device_count() >= 2
    with iface.device(1):
        assert iface.current_device() == 1 == torch.anychip.current_device()
        s = iface.Stream()
        assert isinstance(s, torch.Stream) and s.device == torch.device("anychip", 1)
        with iface.stream(s):
            assert iface.current_stream() == s
            assert iface.get_raw_stream(1) != 0
    assert iface.current_device() == 0
    assert iface.exchange_device(1) == 0 and iface.exchange_device(0) == 1
    assert iface.get_compute_capability() == 0 and iface.is_available() and not iface.is_triton_capable()
    assert iface.get_device_properties(1).index == 1
    assert iface.Worker.get_device_properties(1).index == 1
    e = iface.Event()
    e.record()
    iface.synchronize()
    assert e.query()


# ---- inductor: the generated kernels on the device's memory -------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc, self.out = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).tril().logical_not(), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(torch.nn.Module):
    """nanoGPT's shape: token and position embeddings, pre-norm blocks, a tied LM head."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 2, blocks: int = 2, seq: int = 16):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(seq, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_compiled(device: str, steps: int, data: tuple) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = NanoGPT().to(device)
    step_model = torch.compile(model)                     # the default backend: inductor
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx, targets = (d.to(device) for d in data)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = step_model(idx, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.head.weight.detach().cpu()


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_a_nanogpt_trains_with_torch_compile_as_on_the_cpu(at):
    # (before: InductorError: KeyError: 'anychip' in torch/_inductor/codegen/common.py)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    data = (torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
    cpu, cpu_w = train_compiled("cpu", 8, data)
    dev, dev_w = train_compiled("anychip", 8, data)
    # the fused kernels are the same generated C++ on both; the matmuls are the device's gemm
    # against the CPU's BLAS (another summation order), so the two agree to float32 rounding
    # carried through 8 AdamW steps, not bit for bit
    assert dev == pytest.approx(cpu, rel=1e-4)
    assert cpu[-1] < cpu[0] - 0.5
    torch.testing.assert_close(dev_w, cpu_w, rtol=1e-3, atol=1e-4)


def test_a_compiled_graph_waits_for_the_device_kernels_it_reads(at):
    # a compiled pointwise + reduction graph (host C++ kernels) reads the result of an element-wise
    # kernel still queued on the device's stream, then writes memory the allocator just gave back:
    # without the wait before each host kernel, 216 of 300 repetitions read a stale buffer
    torch._dynamo.reset()

    @torch.compile
    def f(a, b):
        return (a * 2 + b).relu().sum(1)

    x, w = torch.randn(512, 2048), torch.randn(512, 2048)
    want = f(x * w - 1, x)
    dx, dw = x.to("anychip"), w.to("anychip")
    wrong = 0
    for _ in range(300):
        a = dx * dw - 1                      # queued on the current stream
        got = f(a, dx)
        del a
        wrong += not torch.allclose(got.cpu(), want, rtol=1e-4, atol=1e-3)
    assert wrong == 0


def test_compiled_outputs_are_device_tensors_from_the_devices_allocator(at):
    torch._dynamo.reset()
    f = torch.compile(lambda a: (a.sin() + 1).cumsum(0))
    x = torch.randn(1000)
    before = torch.anychip.memory_stats()["allocation.all.allocated"]
    y = f(x.to("anychip"))
    assert y.device == torch.device("anychip", 0)
    assert torch.anychip.memory_stats()["allocation.all.allocated"] > before
    torch.testing.assert_close(y.cpu(), f(x))


PLUGIN_PROGRAM = """
import torch, anychip.torch
torch.manual_seed(0)
f = torch.compile(lambda e, i, w: (torch.nn.functional.embedding(i, e) @ w).softmax(-1).sum(0))
e, i, w = torch.randn(64, 32), torch.randint(0, 64, (48,)), torch.randn(32, 16)
want = f(e, i, w)
de, di, dw = e.to("anychip"), i.to("anychip"), w.to("anychip")
wrong = sum(not torch.allclose(f(de, di, dw @ torch.eye(16, device="anychip")).cpu(), want, rtol=1e-4, atol=1e-5)
            for _ in range(100))
print(anychip.torch.backend(), wrong)
"""


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_inductor_runs_on_a_c_plugins_host_memory_as_on_the_cpu(scaffold_plugin):
    # the scaffolded C plugin: posix_memalign'ed memory, its own streams and kernel table
    env = {**os.environ, "ANYCHIP_TORCH": scaffold_plugin.name, "ANYCHIP_PLUGIN_PATH": scaffold_plugin.path}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", PLUGIN_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == f"{scaffold_plugin.name} 0"


@pytest.mark.slow
def test_a_graph_on_the_second_device_allocates_there(at):
    # (before: its buffers were allocated on the current device, anychip:0: the outputs came back on
    # anychip:0 and backward refused the gradient, "expected device anychip:1 but got anychip:0")
    torch._dynamo.reset()

    def f(q):
        y = (q @ q.transpose(1, 2)).softmax(-1) @ q
        return torch.autograd.grad(F.layer_norm(y, (16,)).pow(2).sum(), q)[0], y

    x = torch.randn(4, 8, 16)
    grad, y = torch.compile(f)(x.to("anychip:1").requires_grad_())
    want_grad, want_y = torch.compile(f)(x.clone().requires_grad_())
    assert grad.device == y.device == torch.device("anychip", 1) and torch.anychip.current_device() == 0
    torch.testing.assert_close(y.cpu(), want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.cpu(), want_grad, rtol=1e-4, atol=1e-4)


# ---- a device whose memory is not host memory -------------------------------------------------------

FALLBACK_PROGRAM = """
import warnings
import torch, anychip.torch
x, y = torch.randn(8, 8), torch.randn(8, 8)
f = torch.compile(lambda a, b: (a @ b).relu() * 2 + 1)
g = torch.compile(lambda a: a.sin() * 2)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    got = [f(x.to("anychip"), y.to("anychip")).cpu() for _ in range(3)] + [g(x.to("anychip")).cpu()]
    on_cpu = f(x, y)            # the CPU's graphs still compile with inductor
print([str(m.message) for m in w if "not host memory" in str(m.message)])
print(all(torch.allclose(r, (x @ y).relu() * 2 + 1, atol=1e-5) for r in got[:3]),
      torch.allclose(got[3], x.sin() * 2), torch.allclose(on_cpu, (x @ y).relu() * 2 + 1, atol=1e-5))
from torch._inductor import compile_fx
try:
    torch.compile(lambda a: a.cos(), backend=compile_fx.compile_fx)(x.to("anychip"))   # inductor itself
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0])
"""


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_a_device_without_host_memory_compiles_through_aot_eager_with_one_warning(tmp_path):
    # the scaffolded C plugin without ANYCHIP_PLUGIN_HOST_MEMORY, as a real chip's plugin is
    from anychip.scaffold import new_plugin

    project = new_plugin("devmem", "c", tmp_path)
    src = project / "src" / "devmem.c"
    text = src.read_text()
    flag = "    p->flags |= ANYCHIP_PLUGIN_HOST_MEMORY;"
    assert flag in text
    src.write_text(text.replace(flag, "    /* device memory: not host memory */"))
    lib = project / "libdevmem.so"
    cached_compile(["cc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-fPIC",
                    f"-I{project / 'include'}", "-shared", "-o", str(lib),
                    *(str(p) for p in sorted((project / "src").glob("*.c"))), "-lpthread", "-lm"], lib,
                   roots=(tmp_path,))
    env = {**os.environ, "ANYCHIP_TORCH": "devmem", "ANYCHIP_PLUGIN_PATH": str(lib)}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", FALLBACK_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    warned, results, refused = done.stdout.splitlines()[-3:]
    from anychip.torch import NOT_HOST_MEMORY_FALLBACK
    from anychip.torch._inductor import NOT_HOST_MEMORY

    assert eval(warned) == [NOT_HOST_MEMORY_FALLBACK.format(name="anychip", backend="devmem")]    # once
    assert results == "True True True"
    # inductor called as a backend of its own (not torch.compile's default) is refused, saying why
    assert refused == "InductorError RuntimeError: " + NOT_HOST_MEMORY.format(name="anychip", backend="devmem")


def test_the_host_memory_flag_is_set_by_the_simulated_chips_and_the_scaffold(at, scaffold_plugin):
    assert all(d.plugin.host_memory for d in at._state.devices)
    assert scaffold_plugin.host_memory
