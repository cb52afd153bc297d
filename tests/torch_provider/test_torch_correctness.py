"""Results the anychip device must never get silently wrong (docs/torch.md): reads ordered after
the work they read while the current device changes, views that alias, tied parameters that stay
tied, and the devices of mixed CPU / device arguments, each against the CPU in the same process.

This process binds PrivateUse1 to the simulated Ascend; the other chips run in child processes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS  # noqa: E402

HERE = Path(__file__).parent


# the first import on a fresh machine compiles the extension (a minute or two)
@pytest.mark.timeout(LONG_TEST_SECONDS)
def test_this_process_binds_the_ascend(at):
    assert at.backend() == "ascend"


# ---- the current device: reads ordered after the work they read ------------------------------

@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.parametrize("chip", ["ascend", "kunlun", "hygon"])
@pytest.mark.slow
def test_pending_results_read_right_while_the_current_device_changes(chip):
    # tests/torch_provider/device_switch.py: the first uses of anychip:1 and anychip:2 while
    # anychip:0's kernel is pending, then 100 rounds over 4 devices and 3 streams each, with
    # anychip's runtime using another device between the kernel and the read. Before the fix
    # (the library's current device remembered by each of its callers), about 1 round in 10
    # read stale values on each chip, and on the Ascend 1 in 3 failed on a stream of another
    # device; the first uses read [0, 0, 0, 0]
    env = {**os.environ, "ANYCHIP_TORCH": chip}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, str(HERE / "device_switch.py"), "100"], capture_output=True, text=True,
                          env=env, timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:3] == ["FIRST anychip:1 [2.0, 2.0, 2.0, 2.0]", "FIRST anychip:2 [3.0, 3.0, 3.0, 3.0]",
                         "ROUNDS 100 STALE 0 ERRORS 0"], done.stdout


# ---- views alias ---------------------------------------------------------------------------

def _f(*shape):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) - 5


def _c(*shape):
    return torch.complex(_f(*shape), -_f(*shape) / 2)


def _dual(f):
    def run(x):
        with torch.autograd.forward_ad.dual_level():
            return f(x)
    return run


A = torch.ops.aten
# view op (aten name) -> (base, the view(s) of it, how to write through it: "add" adds 1 + k to
# view k in place, "read" writes the base and reads the view (views whose elements overlap))
VIEWS = {
    "alias": (_f(4, 6), A.alias, "add"),
    "detach": (_f(4, 6), torch.detach, "add"),
    "lift_fresh": (_f(4, 6), A.lift_fresh, "add"),
    "diagonal": (_f(4, 6), lambda x: x.diagonal(1), "add"),
    "linalg_diagonal": (_f(4, 6), lambda x: torch.linalg.diagonal(x, offset=-1), "add"),
    "expand": (_f(1, 6), lambda x: x.expand(4, 6), "read"),
    "expand_as": (_f(1, 6), lambda x: x.expand_as(_f(3, 6)), "read"),
    "broadcast_to": (_f(6), lambda x: torch.broadcast_to(x, (2, 6)), "read"),
    "permute": (_f(2, 3, 4), lambda x: x.permute(2, 0, 1), "add"),
    "t": (_f(4, 6), torch.t, "add"),
    "transpose": (_f(2, 3, 4), lambda x: x.transpose(0, 2), "add"),
    "adjoint": (_c(4, 6), torch.adjoint, "add"),
    "mT": (_f(2, 4, 6), lambda x: x.mT, "add"),
    "mH": (_c(4, 6), lambda x: x.mH, "add"),
    "matrix_H": (_c(4, 6), lambda x: x.adjoint(), "add"),
    "numpy_T": (_f(4, 6), lambda x: x.T, "add"),
    "swapaxes": (_f(2, 3, 4), lambda x: x.swapaxes(0, 1), "add"),
    "swapdims": (_f(2, 3, 4), lambda x: x.swapdims(1, 2), "add"),
    "movedim": (_f(2, 3, 4), lambda x: x.movedim(0, 2), "add"),
    "moveaxis": (_f(2, 3, 4), lambda x: x.moveaxis([0, 1], [2, 0]), "add"),
    "select": (_f(4, 6), lambda x: x[2], "add"),
    "slice": (_f(4, 6), lambda x: x[1:4:2, 1:], "add"),
    "slice_inverse": (_f(4, 6), lambda x: A.slice_inverse(x[1:3], x, 0, 1, 3, 1), "add"),
    "narrow": (_f(4, 6), lambda x: x.narrow(1, 2, 3), "add"),
    "narrow.Tensor": (_f(4, 6), lambda x: x.narrow(0, torch.tensor(1), 2), "add"),
    "split": (_f(5, 6), lambda x: x.split(2), "add"),
    "split.sizes": (_f(5, 6), lambda x: x.split([1, 4]), "add"),
    "split_with_sizes": (_f(5, 6), lambda x: x.split_with_sizes([2, 3], 0), "add"),
    "chunk": (_f(4, 6), lambda x: x.chunk(3, 1), "add"),
    "unbind": (_f(3, 4), torch.unbind, "add"),
    "tensor_split": (_f(4, 6), lambda x: x.tensor_split(4, 1), "add"),
    "tensor_split.indices": (_f(4, 6), lambda x: x.tensor_split([1, 3]), "add"),
    "tensor_split.tensor": (_f(4, 6), lambda x: x.tensor_split(torch.tensor([2]), 1), "add"),
    "hsplit": (_f(4, 6), lambda x: x.hsplit(3), "add"),
    "vsplit": (_f(4, 6), lambda x: x.vsplit([1]), "add"),
    "dsplit": (_f(2, 2, 6), lambda x: x.dsplit(2), "add"),
    "squeeze": (_f(1, 4, 1, 6), torch.squeeze, "add"),
    "squeeze.dim": (_f(1, 4, 1, 6), lambda x: x.squeeze(2), "add"),
    "squeeze.dims": (_f(1, 4, 1, 6), lambda x: x.squeeze((0, 2)), "add"),
    "unsqueeze": (_f(4, 6), lambda x: x.unsqueeze(1), "add"),
    "view": (_f(4, 6), lambda x: x.view(3, 8), "add"),
    "view.dtype": (_f(4, 6), lambda x: x.view(torch.int32), "add"),
    "view_as": (_f(4, 6), lambda x: x.view_as(_f(2, 12)), "add"),
    "reshape": (_f(4, 6), lambda x: x.reshape(2, 12), "add"),
    "reshape_as": (_f(4, 6), lambda x: x.reshape_as(_f(6, 4)), "add"),
    "_reshape_alias": (_f(4, 6), lambda x: A._reshape_alias(x, [6, 4], [4, 1]), "add"),
    "flatten": (_f(2, 3, 4), lambda x: x.flatten(1), "add"),
    "unflatten": (_f(4, 6), lambda x: x.unflatten(1, (2, 3)), "add"),
    "ravel": (_f(4, 6), torch.ravel, "add"),
    "as_strided": (_f(4, 6), lambda x: x.as_strided((3, 3), (6, 2), 1), "add"),
    "unfold": (_f(4, 6), lambda x: x.unfold(1, 2, 2), "add"),
    "unfold (overlapping)": (_f(4, 6), lambda x: x.unfold(1, 3, 1), "read"),
    "view_as_real": (_c(3, 4), torch.view_as_real, "add"),
    "view_as_complex": (_f(3, 4, 2), torch.view_as_complex, "add"),
    "real": (_c(3, 4), torch.real, "add"),
    "imag": (_c(3, 4), torch.imag, "add"),
    "_conj": (_c(3, 4), torch.conj, "add"),
    "conj": (_c(3, 4), lambda x: x.conj(), "read"),
    "_neg_view": (_f(3, 4), A._neg_view, "read"),
    "resolve_conj": (_f(3, 4), torch.resolve_conj, "add"),
    "resolve_neg": (_f(3, 4), torch.resolve_neg, "add"),
    "positive": (_f(3, 4), torch.positive, "add"),
    "contiguous": (_f(3, 4), lambda x: x.contiguous(), "add"),
    "to": (_f(3, 4), lambda x: x.to(x.device), "add"),
    "to.dtype": (_f(3, 4), lambda x: x.to(torch.float32), "add"),
    "to.dtype_layout": (_f(3, 4), lambda x: x.to(device=x.device, dtype=x.dtype), "add"),
    "to.other": (_f(3, 4), lambda x: x.to(x), "add"),
    "_fw_primal": (_f(3, 4), _dual(lambda x: A._fw_primal(x, 0)), "add"),
    "_make_dual": (_f(3, 4), _dual(lambda x: A._make_dual(x, torch.zeros_like(x), 0)), "add"),
    "_unpack_dual": (_f(3, 4), _dual(lambda x: A._unpack_dual(x, 0)[0]), "add"),
    "_test_autograd_multiple_dispatch_view": (_f(3, 4), A._test_autograd_multiple_dispatch_view, "add"),
}
# view ops with no dense tensor to view: sparse and nested layouts, which the device does not
# have (torch's CPU refuses them for a dense tensor too), autocast's and pinned memory's
NOT_DENSE = {"_indices", "_values", "indices", "values", "crow_indices", "col_indices", "ccol_indices",
             "row_indices", "coalesce", "_sparse_broadcast_to", "_nested_get_values", "_nested_view_from_buffer",
             "_nested_view_from_jagged", "_autocast_to_full_precision", "_autocast_to_reduced_precision",
             "pin_memory"}


def _views(x, make):
    v = make(x)
    return list(v) if isinstance(v, (tuple, list)) else [v]


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_view_op_aliases_its_base_as_on_the_cpu(at, name):
    base, make, how = VIEWS[name]
    cpu, dev = base.clone(), base.to("anychip")
    cpu_views, dev_views = _views(cpu, make), _views(dev, make)
    for cv, dv in zip(cpu_views, dev_views, strict=True):
        assert dv.device == dev.device and dv.shape == cv.shape and dv.dtype == cv.dtype
        assert dv.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr(), f"{name} made a copy"
        assert dv.cpu().equal(cv)
    if how == "add":
        for k, (cv, dv) in enumerate(zip(cpu_views, dev_views, strict=True)):
            cv.add_(k + 1)
            dv.add_(k + 1)
        assert dev.cpu().equal(cpu), f"a write through {name} did not reach its base as on the cpu"
    else:
        cpu.mul_(3).add_(1)
        dev.mul_(3).add_(1)
        for cv, dv in zip(cpu_views, dev_views, strict=True):
            assert dv.cpu().equal(cv), f"{name} does not see a write to its base"


def _view_op_names() -> set[str]:
    """The aten ops whose schema returns an alias of an input without writing it (torch's views)."""
    names = set()
    for s in torch._C._jit_get_all_schemas():
        if s.name.startswith("aten::") and any(r.alias_info is not None and not r.alias_info.is_write
                                               for r in s.returns):
            name = s.name + ("." + s.overload_name if s.overload_name else "")
            try:
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
            except RuntimeError:
                continue            # a TorchScript builtin (dict and list ops), not a dispatcher op
            names.add(name)
    return names


def test_the_table_has_every_view_op_of_torch_and_each_has_a_device_kernel(at):
    names = _view_op_names()
    assert len(names) > 80
    bases = {n[len("aten::"):].split(".")[0] for n in names}
    tested = {k.split(" ")[0].split(".")[0] for k in VIEWS}
    assert bases - tested - NOT_DENSE == set(), "view ops of torch neither tested nor listed"
    # each dense view runs a kernel of the device's own or a generic one, never the CPU fallback
    generic = ("PrivateUse1", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
               "CompositeImplicitAutograd")
    fallback = sorted(n for n in names if not any(torch._C._dispatch_has_kernel_for_dispatch_key(n, k)
                                                  for k in generic))
    assert {n[len("aten::"):].split(".")[0] for n in fallback} <= NOT_DENSE, fallback


def test_a_view_op_left_to_the_fallback_is_refused_not_copied(at):
    with pytest.raises(RuntimeError, match=r"aten::_indices is a view op \(its result shares its input's memory\) "
                                           r"with no implementation on the anychip device: the CPU fallback would "
                                           r"return a copy, so writes through it would be lost"):
        torch.ones(3, device="anychip")._indices()


def test_the_issues_views_write_through(at):
    c = torch.tensor([1 + 2j, 3 - 1j], device="anychip")
    torch.view_as_real(c).fill_(5)
    assert c.cpu().tolist() == [5 + 5j, 5 + 5j]
    z = torch.zeros(2, 2, device="anychip")
    torch.view_as_complex(z).add_(1 + 1j)
    assert z.cpu().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    x = torch.ones(2, 4, device="anychip")
    x.unfold(1, 2, 2).mul_(0)
    assert x.cpu().tolist() == [[0.0] * 4] * 2


@pytest.mark.parametrize("foreach", [False, True])
def test_adam_moves_a_complex_parameter_as_on_the_cpu(at, foreach):
    # (before: the device's parameter never moved, as Adam steps a complex one through view_as_real)
    torch.manual_seed(0)
    start = torch.randn(8, dtype=torch.complex64)
    params = {}
    for device in ("cpu", "anychip"):
        p = torch.nn.Parameter(start.clone().to(device))
        opt = torch.optim.Adam([p], lr=0.1, foreach=foreach)
        for step in range(3):
            opt.zero_grad()
            (p.abs() ** 2 * (step + 1)).sum().backward()
            opt.step()
        params[device] = p.detach().cpu()
    assert (params["cpu"] - start).abs().sum() > 0.1
    assert params["anychip"].equal(params["cpu"])



@pytest.mark.slow
def test_c10d_reduces_complex_tensors_in_place(at):
    # torch runs a complex tensor's all_reduce / broadcast / all_gather through view_as_real
    # (before: the input came back unreduced, without an error)
    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_TORCH"}
    done = subprocess.run([sys.executable, "-m", "anychip", "launch", "-n", "2", "--device", "ascend",
                                          str(HERE / "complex_c10d.py")],
                          capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for rank in (0, 1):
        assert f"RANK {rank} [(3+6j), -9j] [(10+2j)] [-1j, (1-1j)]" in done.stdout, done.stdout[-2000:]

# ---- module.to keeps tied parameters tied -----------------------------------------------------

class TinyGPT(torch.nn.Module):
    """An embedding tied to the LM head, as GPT-2 / nanoGPT tie theirs."""

    def __init__(self, vocab: int = 16, dim: int = 8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.block = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.block(self.emb(idx))))


@pytest.mark.parametrize("move", ["to", "anychip"])
def test_module_to_the_device_keeps_tied_weights_tied_and_trains_as_on_the_cpu(at, move):
    # (before: 2 parameters on the device after .to, training apart from the CPU's)
    torch.manual_seed(0)
    cpu = TinyGPT()
    dev = TinyGPT()
    dev.load_state_dict(cpu.state_dict())
    emb = dev.emb.weight
    dev = dev.to("anychip") if move == "to" else dev.anychip()
    assert dev.head.weight is dev.emb.weight is emb            # the same Parameter object, moved
    assert emb.device == torch.device("anychip", 0)
    assert len(list(dev.parameters())) == len(list(cpu.parameters())) == 3
    idx = torch.randint(0, 16, (4, 6))
    losses = {}
    for name, model in (("cpu", cpu), ("anychip", dev)):
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        losses[name] = []
        for _ in range(10):
            opt.zero_grad()
            logits = model(idx.to(next(model.parameters()).device))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten().to(logits.device))
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
        assert model.head.weight is model.emb.weight
    assert losses["anychip"] == losses["cpu"]
    assert losses["cpu"][-1] < losses["cpu"][0]
    back = dev.cpu()
    assert back.head.weight is back.emb.weight and back.emb.weight.device.type == "cpu"
    assert back.emb.weight.equal(cpu.emb.weight)


# ---- CPU scalars with device tensors -----------------------------------------------------------

def _mixed_cases():
    s = torch.tensor(2.0)                  # a 0-dim CPU tensor: a scalar, as on CUDA
    v = torch.tensor([2.0, 2.0, 2.0])      # a CPU tensor with dimensions: refused, as on CUDA
    ok = {
        "2 - t": lambda t, c: 2 - t,
        "2 // t": lambda t, c: 2 // t,
        "rsub(t, 2)": lambda t, c: torch.rsub(t, 2),
        "s - t": lambda t, c: s - t,
        "s + t": lambda t, c: s + t,
        "s * t": lambda t, c: s * t,
        "s / t": lambda t, c: s / t,
        "s > t": lambda t, c: s > t,
        "sub(s, t, alpha=2)": lambda t, c: torch.sub(s, t, alpha=2),
        "s.long() + t": lambda t, c: s.long() + t,
        "maximum(s, t)": lambda t, c: torch.maximum(s, t),
        "where(c, s, t)": lambda t, c: torch.where(c, s, t),
        "where(cpu 0-dim c, t, s)": lambda t, c: torch.where(torch.tensor(True), t, s),
        "t - s": lambda t, c: t - s,
        "t ** s": lambda t, c: t ** s,
        "s ** t": lambda t, c: s ** t,
        "atan2(s, t)": lambda t, c: torch.atan2(s, t),
        "lerp(t, u, s)": lambda t, c: torch.lerp(t, t * 3, s),
        "masked_fill(c, s)": lambda t, c: t.masked_fill(c, s),
        "t.add_(s)": lambda t, c: t.clone().add_(s),
        "t[c] = s": lambda t, c: t.clone().index_put_((c,), s),
        "t[cpu index]": lambda t, c: t[torch.tensor([2, 0])],
        "t[cpu mask] = 1": lambda t, c: t.clone().index_put_((torch.tensor([True, False, True]),), torch.tensor(1.0)),
    }
    same = "Expected all tensors to be on the same device, but found at least two devices, anychip:0 and cpu!"
    refused = {
        "t + v": (lambda t, c: t + v, same),
        "v + t": (lambda t, c: v + t, same),
        "where(c, v, t)": (lambda t, c: torch.where(c, v, t), same),
        "cat([t, v])": (lambda t, c: torch.cat([t, v]), same),
        "mm(t, cpu)": (lambda t, c: torch.mm(t.reshape(1, 3), v.reshape(3, 1)), same),
        "dot(t, v)": (lambda t, c: torch.dot(t, v), same),
        "index_select(t, cpu index)": (lambda t, c: t.index_select(0, torch.tensor([0, 2])), same),
        "cpu 0-dim written": (lambda t, c: torch.tensor(1.0).add_(t[0]), same),
        "anychip:0 with anychip:1": (lambda t, c: t + t.to("anychip:1"),
                                     "Expected all tensors to be on the same device, but found at least two devices, "
                                     "anychip:0 and anychip:1!"),
    }
    return ok, refused


OK_CASES, REFUSED_CASES = _mixed_cases()


@pytest.mark.parametrize("case", sorted(OK_CASES))
def test_cpu_scalars_with_device_tensors_compute_on_the_device(at, case):
    # (before: the results of the scalar-first cases were left on the CPU)
    c = torch.tensor([True, False, True])
    t = torch.tensor([1.0, -2.0, 3.0])
    want = OK_CASES[case](t, c)
    got = OK_CASES[case](t.to("anychip"), c.to("anychip"))
    assert got.device == torch.device("anychip", 0)
    assert got.cpu().equal(want)


@pytest.mark.parametrize("case", sorted(REFUSED_CASES))
def test_cpu_tensors_with_dimensions_are_refused_as_on_cuda(at, case):
    # (before: computed on the host, some of them with the result on the CPU)
    fn, message = REFUSED_CASES[case]
    t = torch.tensor([1.0, -2.0, 3.0], device="anychip")
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fn(t, t > 0)



# ---- a C plugin's events across devices ----------------------------------------------------------

EVENTS_PROGRAM = textwrap.dedent("""
    import torch, anychip.torch as at
    out = []
    with torch.accelerator.device_index(0):              # the current device is anychip:0 throughout
        s1 = torch.Stream(device="anychip:1")
        with s1:
            x = torch.ones(1 << 16, device="anychip:1") * 3
        e = torch.Event(device="anychip:1", enable_timing=True)
        e.record(s1)
        out.append(f"query {e.query() in (True, False)}")
        e.synchronize()
        out.append(f"after synchronize {e.query()}")
        start = torch.Event(device="anychip:1", enable_timing=True)
        start.record(s1)
        with s1:
            y = x * 2
        end = torch.Event(device="anychip:1", enable_timing=True)
        end.record(s1)
        end.synchronize()
        out.append(f"elapsed {start.elapsed_time(end) >= 0}")
        s0 = torch.Stream(device="anychip:0")
        s0.wait_stream(s1)                              # across devices
        s0.wait_event(end)
        with s1:
            z = y + 1
        s0.synchronize()
        s1.synchronize()        # z is read below on anychip:1's current stream, which does not wait for s1
        out.append(f"values {y[:2].cpu().tolist()} {z[-1].item()}")
    print("; ".join(out))
""")


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_a_c_plugins_events_work_on_another_device_than_the_current_one(scaffold_plugin):
    # (before: "event_query failed: status 1 (invalid argument): event_query: not an event of
    # device 0" for an event of anychip:1, and the cross-device wait_stream refused)
    env = {**os.environ, "ANYCHIP_TORCH": scaffold_plugin.name, "ANYCHIP_PLUGIN_PATH": scaffold_plugin.path}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", EVENTS_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "query True; after synchronize True; elapsed True; values [6.0, 6.0] 7.0"
