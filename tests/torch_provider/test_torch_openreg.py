"""PyTorch's own tests of its OpenReg example device (test/cpp_extensions/open_registration_extension/
torch_openreg/tests/*.py in the pytorch repository), run on the anychip device: OPENREG_VERDICTS
says, for each of them, whether it passes here or why it does not apply (what it tests is
OpenReg's own: its custom ops, its compile backend, its C++ backend metadata, its messages, ...).

The tests are PyTorch's, not this project's, so they are not copied here: point
ANYCHIP_OPENREG_TESTS at that folder of a PyTorch checkout and the slow test below ports them as
the verdicts were taken (only the device's name and module change: "openreg" / "OpenReg" /
"OPENREG" become "anychip" / "ANYCHIP", ``import torch_openreg`` becomes ``import anychip.torch``),
runs them with the simulated Ascend's two devices (OpenReg has two) and checks every verdict.
Without it the test is skipped; the fixes it led to have their own tests
(test_torch_cpu_paths.py, test_torch_module.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from conftest import LONG_CHILD_SECONDS, LONG_TEST_SECONDS

_OWN_OPS = "n/a: OpenReg's own custom ops (torch.ops.openreg.custom_*), which the device has no reason to have"
_COMPILE_BACKEND = ("n/a: OpenReg registers a torch.compile backend named after the device; anychip's device "
                    "compiles with torch's backends (aot_eager, inductor: docs/torch.md)")
_BACKEND_META = ("n/a: OpenReg's own C++ backend metadata (TensorBackendMetaRegistry's serialization hooks); the "
                 "device keeps none")
_QUANTIZED = "n/a: quantized tensors: the device has dense float and integer tensors only (docs/torch.md)"
_SDPA_OVERRIDEABLE = ("n/a: OpenReg implements the 'overrideable' fused attention kernel; anychip's device answers the "
                      "CPU's kernel choice (flash for these inputs) so that attention gives the CPU's values")
_NEWER_TORCH = "n/a: written for a later torch than 2.13"

#: the tests (file::class::test, named as after the port: openreg -> anychip) that do not pass
#: here: why each does not apply ("n/a: ..."), or where the device falls short ("fail: ...");
#: every other test passes
OPENREG_VERDICTS: dict[str, str] = {
    "test_opinfo.py": _NEWER_TORCH + ": it imports skip and skipOps from common_methods_invocations, which 2.13 lacks",
    "test_autocast.py::TestAutocast::test_anychip_autocast_error_message":
        _NEWER_TORCH + ": torch 2.13's warning for an unsupported autocast dtype does not name the dtype",
    "test_autocast.py::TestAutocast::test_anychip_autocast_float32_supported":
        "n/a: OpenReg's own autocast lists put dot in float32; the device follows CUDA's lists (dot promotes)",
    "test_autograd.py::TestAutograd::test_autograd_init":
        "n/a: it imports psutil, which the test environment lacks; the threads it looks for are there "
        "(pt_autograd_0 .. pt_autograd_N-1 after a backward on the device, read from /proc)",
    "test_rng.py::TestRNG::test_offset_unsupported":
        "n/a: OpenReg's generator has no offset; the device's is a Philox seed and offset, as CUDA's",
    "test_compile.py::TestFakeTensor::test_backend_metadata_propagation": _BACKEND_META,
    "test_device.py::TestDevice::test_device_capability": _QUANTIZED + " (the test wants the quantized dtypes listed)",
    "test_device.py::TestDevice::test_device_properties":
        _NEWER_TORCH + ": it wants torch.accelerator.get_memory_info() as a dict; 2.13's is (free, total)",
    "test_device.py::TestDevice::test_invalid_device_index":
        "n/a: OpenReg's own message; the device says 'anychip device index 2 is out of range: ascend has 2 "
        "device(s) here (0..1)'",
    "test_ops.py::TestFactory::test_empty":
        "n/a: torch 2.13 refuses torch.empty([2, 3, 4, 5], names=...) on the CPU too ('unexpected keyword argument')",
    "test_ops.py::TestQuantization::test_quantize": _QUANTIZED,
    "test_ops.py::TestAutogradFunction::test_compile_autograd_function_aliasing": _OWN_OPS,
    "test_ops.py::TestAutogradFunction::test_compile_autograd_function_returns_self": _OWN_OPS,
    "test_ops.py::TestSTUBExtended::test_custom_abs": _OWN_OPS,
    "test_ops.py::TestCustomAutogradFunctions::test_custom_autograd_fn_aliasing_basic": _OWN_OPS,
    "test_ops.py::TestCustomAutogradFunctions::test_custom_autograd_fn_aliasing_no_grad": _OWN_OPS,
    "test_ops.py::TestCustomAutogradFunctions::test_custom_autograd_fn_returns_self_basic": _OWN_OPS,
    "test_ops.py::TestCustomAutogradFunctions::test_custom_autograd_fn_returns_self_no_grad": _OWN_OPS,
    "test_ops.py::TestSDPA::test_fused_sdp_choice_privateuseone": _SDPA_OVERRIDEABLE,
    "test_ops.py::TestSDPA::test_scaled_dot_product_fused_attention_overrideable_backward": _SDPA_OVERRIDEABLE,
    "test_ops.py::TestSDPAExtended::test_fused_sdp_choice_with_mask": _SDPA_OVERRIDEABLE,
    "test_sdpa.py::TestSDPAPrivateUse1Only::test_fused_sdp_choice_privateuseone": _SDPA_OVERRIDEABLE,
    "test_sdpa.py::TestSDPAPrivateUse1Only::test_scaled_dot_product_fused_attention_overrideable_backward":
        _SDPA_OVERRIDEABLE,
    "test_storage.py::TestSerialization::test_serialization": _BACKEND_META,
    "test_storage.py::TestSerialization::test_copy_backend_meta": _BACKEND_META,
    "test_storage.py::TestSerialization::test_serialization_metadata_preservation": _BACKEND_META,
    "test_storage.py::TestSerialization::test_fake_tensor_metadata_preservation": _BACKEND_META,
    "test_storage.py::TestSerialization::test_fake_tensor_metadata_preservation_functional": _BACKEND_META,
}
OPENREG_VERDICTS.update({f"test_compile.py::{t}": _COMPILE_BACKEND for t in (
    "TestBackendRegistration::test_backend_in_list", "TestGraphCapture::test_simple_compile",
    "TestGraphCapture::test_compile_fullgraph_multiple_ops", "TestGuards::test_backend_recompilation",
    "TestGuards::test_recompilation_on_shape_change", "TestExecution::test_autograd", "TestExecution::test_nn_module",
    "TestDynamicShapes::test_dynamic_shapes", "TestGraphBreaks::test_device_transfer_traces_fully",
    "TestGraphBreaks::test_graph_break_resilience", "TestAutocast::test_compile_with_autocast",
    "TestDefaultDevice::test_compile_with_default_device")})


def port(text: str) -> str:
    """One OpenReg test file as run here: the device's name and module changed, nothing else."""
    text = re.sub(r"^import torch_openreg\b.*$", "import anychip.torch  # noqa: F401", text, flags=re.M)
    text = text.replace("openreg", "anychip").replace("OpenReg", "anychip").replace("OPENREG", "ANYCHIP")
    # OpenReg's device is loaded by torch's autoload entry point; anychip's, by its import
    return "import anychip.torch  # noqa: F401\n" + text


def _test_id(case: ET.Element) -> str:
    """file::class::test, or the file alone for a file that could not be collected."""
    module, _, cls = case.get("classname", "").rpartition(".")
    return f"{module}.py::{cls}::{case.get('name')}" if module else f"{case.get('name')}.py"


def _verdict_of(case: ET.Element) -> str:
    if case.find("skipped") is not None:
        return "skipped"
    return "fail" if case.find("failure") is not None or case.find("error") is not None else "pass"


def test_the_verdicts_give_reasons():
    assert all(v.startswith(("n/a: ", "fail: ")) and len(v) > 40 for v in OPENREG_VERDICTS.values())


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_pytorchs_openreg_tests_on_the_device(tmp_path):
    src = os.environ.get("ANYCHIP_OPENREG_TESTS")
    if not src:
        pytest.skip("ANYCHIP_OPENREG_TESTS names no folder of PyTorch's OpenReg tests "
                    "(test/cpp_extensions/open_registration_extension/torch_openreg/tests)")
    files = sorted(Path(src).glob("test_*.py"))
    assert files, f"{src} has no test_*.py"
    for f in files:
        (tmp_path / f.name).write_text(port(f.read_text()))
    env = {**os.environ, "ANYCHIP_SIM_DEVICES": "2", "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"}
    env.pop("ANYCHIP_TORCH", None)
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                    f"--junitxml={report}",
                    "--timeout", "120", *[f.name for f in files]], cwd=tmp_path, env=env,
                   capture_output=True, text=True, timeout=LONG_CHILD_SECONDS)
    got = {_test_id(c): _verdict_of(c) for c in ET.parse(report).iter("testcase")}
    counts = Counter("skipped" if v == "skipped" else "pass" if v == "pass" else
                     "n/a" if OPENREG_VERDICTS.get(k, "").startswith("n/a") else "fail" for k, v in got.items())
    print(f"\nPyTorch's OpenReg tests on anychip: {dict(counts)} of {len(got)}")
    wrong = {k: v for k, v in got.items() if v == "fail" and k not in OPENREG_VERDICTS}
    assert wrong == {}, "tests that fail here with no verdict: fix the device or give the reason"
    now_pass = sorted(k for k, v in got.items() if v == "pass" and k in OPENREG_VERDICTS)
    assert now_pass == [], "tests with a verdict that now pass: remove them from OPENREG_VERDICTS"
