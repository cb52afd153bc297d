"""PyTorch's own OpInfo database (torch.testing._internal.common_methods_invocations.op_db) on
the anychip device against the CPU: every op with float32 samples, run on both, compared
exactly (the device runs the CPU kernels through the fallback, so every value must be
equal, NaNs included). The samples are made twice from one seed, once for each device, so
that arguments an op takes on the host (indices, sizes) stay there, as in PyTorch's own
device tests; the device samples' tensors then get the CPU samples' values (their random
tensors drew from the device's own generator), and a random op runs on the CPU with the CPU
generator the device's generator hands its op. EXPECTED_FAILURES names every op that does
not agree, with the reason; the list must not grow, and an op on it that starts to agree
fails the test until it is removed.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys

import pytest
from conftest import LONG_CHILD_SECONDS, LONG_TEST_SECONDS

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")
pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (pip install expecttest)")

#: (op name, variant) -> why it does not agree on the device
_SPARSE = ("sparse layouts: the device has dense (strided) tensors only; the sparse kernels have no PrivateUse1 "
           "implementation and the CPU fallback moves dense tensors only")
EXPECTED_FAILURES: dict[tuple[str, str], str] = {
    ("sparse.sampled_addmm", ""): _SPARSE,
    ("sparse.mm", "reduce"): _SPARSE,
    ("to_sparse", ""): _SPARSE,
}

#: dtype -> (op name, variant) -> why its gradients do not agree on the device
_SPARSE_GRAD = _SPARSE + " (their gradients included)"
_LCE = ("torch's chunked linear_cross_entropy picks its algorithm by device type (torch/nn/modules/"
        "linear_cross_entropy_options.py, _AUTO_DEFAULTS): the CPU's half types accumulate in float32 "
        "('accurate'), any device it does not list takes 'compact', accumulating in the input's dtype")
_LCE_HALF = {("nn.functional.linear_cross_entropy", "chunked"): _LCE,
             ("nn.functional.linear_cross_entropy", "chunked_none"): _LCE}
EXPECTED_BACKWARD_FAILURES: dict[torch.dtype, dict[tuple[str, str], str]] = {
    torch.float32: {("sparse.sampled_addmm", ""): _SPARSE_GRAD, ("sparse.mm", "reduce"): _SPARSE_GRAD,
                    ("to_sparse", ""): _SPARSE_GRAD},
    torch.float16: {("sparse.mm", "reduce"): _SPARSE_GRAD, **_LCE_HALF},
    torch.bfloat16: {("sparse.mm", "reduce"): _SPARSE_GRAD, **_LCE_HALF},
}

#: the backward loop's fast share: ops whose gradients differed from the CPU's before the fixes
#: (silu and mish: their gradients' decompositions; cartesian_prod: a sum over an expanded view)
#: and common ones of training code
BACKWARD_SUBSET = {"nn.functional.silu", "nn.functional.mish", "cartesian_prod", "linalg.householder_product",
                   "nn.functional.scaled_dot_product_attention", "nn.functional.linear", "nn.functional.layer_norm",
                   "nn.functional.cross_entropy", "softmax", "matmul", "sum", "mean", "nn.functional.gelu"}

#: ops whose outputs are uninitialized memory: only shapes, strides and dtypes are compared
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_permuted", "empty_strided"}

#: the fast loop's share: common ops of training code
SUBSET = {"add", "mul", "sub", "div", "matmul", "mm", "bmm", "addmm", "sum", "mean", "softmax", "log_softmax",
          "nn.functional.relu", "nn.functional.gelu", "nn.functional.linear", "nn.functional.cross_entropy",
          "nn.functional.conv2d", "nn.functional.layer_norm", "nn.functional.embedding", "exp", "log", "sqrt",
          "where", "cat", "stack", "transpose", "reshape", "view", "index_select", "gather", "scatter_add",
          "max", "argmax", "clamp", "pow", "tanh", "sigmoid", "cumsum", "topk", "sort"}

SAMPLES_PER_OP = int(os.environ.get("ANYCHIP_TORCH_OPINFO_SAMPLES", "3"))


@pytest.fixture(scope="module")
def op_db():
    os.environ.pop("ANYCHIP_TORCH", None)
    from torch.testing._internal.common_methods_invocations import op_db

    import anychip.torch  # noqa: F401
    return op_db


def _samples(op, device: str, seed: int) -> list:
    # the generator itself: OpInfo.sample_inputs wraps it in a tracker that walks the Python
    # stack (inspect.stack) for every sample, seconds per op under pytest
    torch.manual_seed(seed)
    random.seed(seed)                     # some generators draw scalars (margins, deltas) from random
    return list(itertools.islice(op.sample_inputs_func(op, device, torch.float32, False), SAMPLES_PER_OP))


def _with_the_cpus_values(cpu: list, dev: list) -> list:
    """The device samples holding the CPU samples' values (their random tensors and numbers drew
    from the device's own generator, docs/torch.md "Random numbers"): each device tensor (and
    the tensor it views) gets the CPU's values, each host tensor and number is the CPU sample's.
    A sample whose structure followed its random values (a different shape or argument count)
    is the CPU sample with its tensors moved to the device."""
    tree = torch.utils._pytree
    for i, (c, d) in enumerate(zip(cpu, dev, strict=True)):
        cl, _ = tree.tree_flatten((c.input, c.args, c.kwargs))
        dl, spec = tree.tree_flatten((d.input, d.args, d.kwargs))
        try:
            leaves = [_cpu_value(want, have) for want, have in zip(cl, dl, strict=True)]
        except (ValueError, RuntimeError):
            dev[i] = c.transform(lambda t: t.detach().to("anychip").requires_grad_(t.requires_grad)
                                 if isinstance(t, torch.Tensor) else t)
            continue
        d.input, d.args, d.kwargs = tree.tree_unflatten(leaves, spec)
    return dev


def _cpu_value(want, have):
    if isinstance(have, torch.Tensor) and have.device.type == "anychip":
        if have.layout == torch.strided:        # (the sparse samples fail as they are: EXPECTED_FAILURES)
            if have.shape != want.shape:
                raise ValueError("the samples differ in shape")
            with torch.no_grad():
                if have._base is not None and want._base is not None and have._base.shape == want._base.shape:
                    have._base.copy_(want._base)
                else:
                    have.copy_(want)
        return have
    if isinstance(have, (torch.Tensor, bool, int, float, complex)):
        return want         # a host tensor or a number (drawn, perhaps, from a generator)
    return have             # the device, the dtype, ...


@contextlib.contextmanager
def _cpu_draws_as_the_devices():
    """``torch.manual_seed`` that also gives the CPU's generator the state the device's next draw
    takes (the OpInfo entries of random ops seed inside), so a random op's first draw on the CPU
    is the device's."""
    real = torch.manual_seed

    def seed(value):
        gen = real(value)
        torch.set_rng_state(torch.anychip._C.next_draw_state(0))
        return gen

    torch.manual_seed = seed
    try:
        yield
    finally:
        torch.manual_seed = real


def _to_cpu(x):
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def _compare(op, got, want) -> None:
    if op.name in UNINITIALIZED:
        gl, wl = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
        assert [(t.shape, t.stride(), t.dtype) for t in gl] == [(t.shape, t.stride(), t.dtype) for t in wl]
        return
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def run_op(op) -> str:
    """'pass', 'fail: <why>' or 'no sample'."""
    if torch.float32 not in op.supported_dtypes("cpu"):
        return "no sample"
    try:
        cpu = _samples(op, "cpu", 0)
        dev = _with_the_cpus_values(cpu, _samples(op, "anychip", 0))
    except Exception as exc:  # noqa: BLE001 - a sample generator that cannot run here counts as no sample
        return f"no sample ({type(exc).__name__})"
    if not cpu or len(cpu) != len(dev):
        return "no sample"
    ran = 0
    for i, (c, d) in enumerate(zip(cpu, dev, strict=True)):
        # a random op on the device draws from its own generator, through a CPU generator made
        # from the generator's Philox seed and offset (docs/torch.md): the CPU runs with that one
        with _cpu_draws_as_the_devices():
            torch.manual_seed(i)
            try:
                want = op(c.input, *c.args, **c.kwargs)
            except Exception:  # noqa: BLE001 - a sample the CPU itself refuses says nothing about the device
                continue
        ran += 1
        torch.manual_seed(i)
        try:
            got = op(d.input, *d.args, **d.kwargs)
            _compare(op, got if op.name in UNINITIALIZED else _to_cpu(got), want)
        except Exception as exc:  # noqa: BLE001 - the verdict, with its reason
            return f"fail: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return "pass" if ran else "no sample"


def _grad_samples(op, device: str, dtype, seed: int) -> list:
    torch.manual_seed(seed)
    random.seed(seed)
    return list(itertools.islice(op.sample_inputs_func(op, device, dtype, True), SAMPLES_PER_OP))


def _grads(op, sample, seed: int):
    """The gradients of the sample's inputs that require one, for the sum of its outputs weighted
    by cotangents drawn on the CPU from ``seed`` (the same on both devices); None: nothing to
    differentiate."""
    out = op(sample.input, *sample.args, **sample.kwargs)
    tree = torch.utils._pytree
    outs = [o for o in tree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    ins = [x for x in tree.tree_leaves((sample.input, sample.args, sample.kwargs))
           if isinstance(x, torch.Tensor) and x.requires_grad]
    if not outs or not ins:
        return None
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype).to(o.device) for o in outs]
    return torch.autograd.grad(outs, ins, cotangents, allow_unused=True)


def run_backward(op, dtype=torch.float32) -> str:
    """The gradients of the op's samples of ``dtype`` on the device against the CPU's, exactly:
    'pass', 'fail: <why>' or 'no sample'."""
    if not op.supports_autograd or dtype not in op.supported_backward_dtypes("cpu"):
        return "no sample"
    try:
        cpu = _grad_samples(op, "cpu", dtype, 0)
        dev = _with_the_cpus_values(cpu, _grad_samples(op, "anychip", dtype, 0))
    except Exception as exc:  # noqa: BLE001 - a sample generator that cannot run here counts as no sample
        return f"no sample ({type(exc).__name__})"
    if not cpu or len(cpu) != len(dev):
        return "no sample"
    ran = 0
    for i, (c, d) in enumerate(zip(cpu, dev, strict=True)):
        with _cpu_draws_as_the_devices():
            torch.manual_seed(i)
            try:
                want = _grads(op, c, i)
            except Exception:  # noqa: BLE001 - a sample the CPU itself refuses says nothing about the device
                continue
        if want is None:
            continue
        ran += 1
        torch.manual_seed(i)
        try:
            got = _grads(op, d, i)
            torch.testing.assert_close(_to_cpu(got), want, rtol=0, atol=0, equal_nan=True)
        except Exception as exc:  # noqa: BLE001 - the verdict, with its reason
            return f"fail: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return "pass" if ran else "no sample"


def _check(ops) -> dict[str, list]:
    verdicts = {(op.name, op.variant_test_name): run_op(op) for op in ops}
    out: dict[str, list] = {"pass": [], "fail": [], "no sample": []}
    for key, v in verdicts.items():
        out["pass" if v == "pass" else "fail" if v.startswith("fail") else "no sample"].append((key, v))
    new = [f"{k}: {v}" for k, v in out["fail"] if k not in EXPECTED_FAILURES]
    fixed = [k for k, v in out["pass"] if k in EXPECTED_FAILURES]
    assert new == [], "ops that do not agree with the CPU (and are not expected to):\n" + "\n".join(new)
    assert fixed == [], f"expected failures that now agree: remove them from EXPECTED_FAILURES: {fixed}"
    return out


def test_the_expected_failures_are_ops_of_the_database_with_reasons(op_db):
    names = {(op.name, op.variant_test_name) for op in op_db}
    assert sorted(k for k in EXPECTED_FAILURES if k not in names) == []
    assert all(len(why) > 20 for why in EXPECTED_FAILURES.values())


def test_opinfo_subset_agrees_with_the_cpu(op_db):
    ops = [op for op in op_db if op.name in SUBSET]
    assert len(ops) >= len(SUBSET)
    out = _check(ops)
    assert len(out["pass"]) >= len(SUBSET) - len([k for k in EXPECTED_FAILURES if k[0] in SUBSET])


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_opinfo_every_float32_op_agrees_with_the_cpu(op_db):
    out = _check(op_db)
    print(f"\nOpInfo float32 on anychip ({len(op_db)} entries): {len(out['pass'])} agree, {len(out['fail'])} fail "
          f"(all expected), {len(out['no sample'])} without a float32 sample")
    assert len(out["pass"]) + len(out["fail"]) + len(out["no sample"]) == len(op_db)
    assert len(out["fail"]) == len(EXPECTED_FAILURES)


def _check_backward(ops, dtype) -> dict[str, list]:
    verdicts = {(op.name, op.variant_test_name): run_backward(op, dtype) for op in ops}
    out: dict[str, list] = {"pass": [], "fail": [], "no sample": []}
    for key, v in verdicts.items():
        out["pass" if v == "pass" else "fail" if v.startswith("fail") else "no sample"].append((key, v))
    expected = EXPECTED_BACKWARD_FAILURES[dtype]
    new = [f"{k}: {v}" for k, v in out["fail"] if k not in expected]
    fixed = [k for k, v in out["pass"] if k in expected]
    assert new == [], f"ops whose {dtype} gradients do not agree with the CPU's:\n" + "\n".join(new)
    assert fixed == [], f"expected failures that now agree: remove them from EXPECTED_BACKWARD_FAILURES: {fixed}"
    return out


def test_the_expected_backward_failures_are_ops_of_the_database_with_reasons(op_db):
    names = {(op.name, op.variant_test_name) for op in op_db}
    for expected in EXPECTED_BACKWARD_FAILURES.values():
        assert sorted(k for k in expected if k not in names) == []
        assert all(len(why) > 20 for why in expected.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_opinfo_backward_subset_agrees_with_the_cpu(op_db, dtype):
    # before: silu's and mish's gradients differed (in every dtype) and cartesian_prod's in float32
    ops = [op for op in op_db if op.name in BACKWARD_SUBSET]
    out = _check_backward(ops, dtype)
    passed = {k[0] for k, _ in out["pass"]}
    assert {"nn.functional.silu", "nn.functional.mish", "nn.functional.scaled_dot_product_attention"} <= passed
    if dtype == torch.float32:
        assert {"cartesian_prod", "linalg.householder_product"} <= passed


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_opinfo_every_op_backward_agrees_with_the_cpu(op_db):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        out = _check_backward(op_db, dtype)
        print(f"\nOpInfo {dtype} gradients on anychip ({len(op_db)} entries): {len(out['pass'])} agree, "
              f"{len(out['fail'])} fail (all expected), {len(out['no sample'])} without a sample")
        assert len(out["fail"]) == len(EXPECTED_BACKWARD_FAILURES[dtype])


#: the subset in a child process whose PyTorch device is the scaffolded C plugin: its kernel
#: table (src/kernels.c) runs the elementwise ops, relu, neg, fill_ and integer sums
C_PLUGIN_SUBSET = """
import json, sys
sys.path[:0] = sys.argv[1:3]
import anychip.torch as at
from torch.testing._internal.common_methods_invocations import op_db
import test_torch_opinfo as t
ops = [op for op in op_db if op.name in t.SUBSET]
verdicts = {f"{op.name}.{op.variant_test_name}": t.run_op(op) for op in ops}
print("RESULT " + json.dumps({"backend": at.backend(), "launches": at._C.kernel_launches()[2],
                              "fail": {k: v for k, v in verdicts.items() if v.startswith("fail")}}))
"""


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_opinfo_subset_on_a_c_plugins_kernel_table(scaffold_plugin):
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "ANYCHIP_TORCH": scaffold_plugin.name, "ANYCHIP_PLUGIN_PATH": scaffold_plugin.path}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", C_PLUGIN_SUBSET, str(here.parent), str(here)], capture_output=True,
                          text=True, env=env, timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert out["backend"] == scaffold_plugin.name
    assert out["fail"] == {}
    assert out["launches"]["binary"] > 0 and out["launches"]["fill"] > 0 and out["launches"]["unary"] > 0
