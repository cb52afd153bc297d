"""The kernel-set interface: every backend's set implements anychip.runtime.KernelSet, and the
runtime's front end refuses bad arguments once, with one message, before any backend sees them."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SCAFFOLD

import anychip
from anychip.chips._plugin_kernels import PluginKernels
from anychip.chips.cuda.kernels import CudaKernels
from anychip.chips.opencl.kernels import OpenCLKernels
from anychip.runtime import KernelSet, kernels_of
from anychip.runtime.kernels import ELEMENTWISE_OPS, kernel_set_problem

#: one device of every backend with a kernel set that runs here
WITH_KERNELS = [d.name for d in anychip.devices() if d.index == 0 and d.plugin.kernels is not None]
#: and the scaffolded C plugin's kernel table (plugin.h minor 1), registered by a fixture
ALL = [*WITH_KERNELS, f"{SCAFFOLD}:0"]
METHODS = ("elementwise", "unary", "reduce", "gemm")


def _device(name: str, request: pytest.FixtureRequest) -> anychip.Device:
    if name.startswith(f"{SCAFFOLD}:"):
        return request.getfixturevalue("scaffold_device")
    return anychip.device(name)


def test_the_backends_with_kernel_sets_here() -> None:
    # the simulated chips always; OpenCL where an ICD is installed, cuda where CuPy runs
    assert {"ascend:0", "kunlun:0", "hygon:0"} <= set(WITH_KERNELS)
    # the simulated chips' kernels are their adapters' kernel tables, as for any C plugin
    for name in ("ascend:0", "kunlun:0", "hygon:0"):
        assert type(anychip.device(name).plugin.kernels) is PluginKernels


@pytest.mark.parametrize("cls", [OpenCLKernels, CudaKernels, PluginKernels])
def test_every_backends_set_implements_the_protocol(cls: type) -> None:
    assert kernel_set_problem(cls) is None


@pytest.mark.parametrize("name", ALL)
def test_the_live_sets_implement_the_protocol(name: str, request: pytest.FixtureRequest) -> None:
    dev = _device(name, request)
    assert isinstance(dev.plugin.kernels, KernelSet)
    assert kernel_set_problem(dev.plugin.kernels) is None
    assert kernels_of(dev).set is dev.plugin.kernels


def test_the_backends_without_a_set_take_the_host_fallback() -> None:
    cpu = anychip.device("cpu")
    assert cpu.plugin.kernels is None and kernels_of(cpu) is None
    assert (anychip.tensor([1.0, 2.0], device=cpu) * 3).tolist() == [3.0, 6.0]


class _NoGemm:
    def supports(self, index: int, op: str, dtype: str) -> bool:
        return True

    def elementwise(self, index: int, op: str, out: Any, a: Any, b: Any, shape: Any, dtype: str,
                    stream: Any) -> None: ...

    def unary(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, shape: Any,
              stream: Any) -> None: ...

    def reduce(self, index: int, op: str, out: Any, out_dtype: str, x: Any, dtype: str, outer: int, n: int,
               inner: int, stream: Any) -> None: ...


class _SwappedGemm(_NoGemm):
    def gemm(self, index: int, out: Any, a: Any, b: Any, m: int, n: int, k: int, dtype: str, stream: Any) -> None:
        ...


def test_a_set_off_the_protocol_is_named() -> None:
    assert kernel_set_problem(_NoGemm) == "_NoGemm has no gemm()"
    assert kernel_set_problem(_NoGemm()) == "_NoGemm has no gemm()"
    assert kernel_set_problem(_SwappedGemm()) == ("gemm(index, out, a, b, m, n, k, dtype, stream) should take "
                                                  "(index, out, a, b, m, k, n, dtype, stream)")


def test_a_backend_with_a_set_off_the_protocol_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = anychip.device("cpu")
    monkeypatch.setattr(cpu.plugin, "kernels", _SwappedGemm())
    x = anychip.tensor([1.0, 2.0], device=cpu)
    with pytest.raises(anychip.PluginError, match=r"^the kernel set of cpu:0 \(_SwappedGemm\) does not implement "
                                                  r"anychip.runtime.KernelSet: gemm\(index, out, a, b, m, n, k"):
        x + x


@pytest.mark.parametrize("name", ALL)
def test_a_checked_call_runs_on_every_backend(name: str, request: pytest.FixtureRequest) -> None:
    dev = _device(name, request)
    k = kernels_of(dev)
    assert k is not None and k.supports("add", "float32") and not k.supports("add", "complex64")
    a = dev.alloc(16)
    a.copy_from(np.array([1, 2, 3, 4], np.float32))
    out = dev.alloc(16)
    k.elementwise("add", (out, 0), (a, 0, (1,)), (a, 0, (1,)), (4,), "float32")
    dev.synchronize()
    assert out.to_numpy(np.float32).tolist() == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("name", ["ascend:0", "kunlun:0", "hygon:0", f"{SCAFFOLD}:0"])
def test_sqrt_runs_on_the_chips_kernel_where_the_set_has_it(name: str, request: pytest.FixtureRequest) -> None:
    # the simulated chips' C kernel and the plugin table both have sqrt (float types only); the
    # values are the correctly rounded roots, NaN for a negative input
    dev = _device(name, request)
    k = kernels_of(dev)
    assert k is not None and k.supports("sqrt", "float32") and k.supports("sqrt", "float64")
    assert not k.supports("sqrt", "int32") and not k.supports("sqrt", "bool")
    x = np.array([0.0, 2.0, 9.0, -1.0, 1e-30], np.float32)
    a = dev.alloc(x.nbytes)
    a.copy_from(x)
    out = dev.alloc(x.nbytes)
    k.unary("sqrt", (out, 0), "float32", (a, 0, (1,)), "float32", (5,))
    dev.synchronize()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out.to_numpy(np.float32), np.sqrt(x))


def _bad_calls(dev: anychip.Device) -> list[tuple[Any, str]]:
    buf = dev.alloc(16)
    freed = dev.alloc(16)
    freed.free()
    cpu = anychip.device("cpu").alloc(16)
    other = anychip.Stream(anychip.device("cpu"))
    ok = (buf, 0, (1,))
    ops = ", ".join(ELEMENTWISE_OPS)
    return [
        (lambda k: k.elementwise("xor", (buf, 0), ok, ok, (4,), "int32"),
         f"elementwise: unknown op 'xor'; expected one of {ops}"),
        (lambda k: k.elementwise("add", (buf, 0), ok, ok, (4,), "complex64"),
         "elementwise: unknown dtype 'complex64'; expected one of bool, int8, uint8, int32, int64, float16, bfloat16, "
         "float32, float64"),
        (lambda k: k.elementwise("add", (buf, 0), ok, ok, (-4,), "float32"),
         "elementwise: shape[0] must be >= 0, got -4"),
        (lambda k: k.elementwise("add", (buf, 0), ok, ok, [4], "float32"),
         "elementwise: shape must be a tuple of ints, got list [4]"),
        (lambda k: k.elementwise("add", (buf, 0), (buf, 0, (1, 1)), ok, (4,), "float32"),
         "elementwise a: strides must be a tuple of 1 ints (one per dimension of (4,)), got (1, 1)"),
        (lambda k: k.elementwise("add", (buf, 0), ok, ok, (8,), "float32"),
         "elementwise out: 32 bytes from byte 0 run past the end of its 16-byte storage"),
        (lambda k: k.elementwise("add", (buf, 0), (buf, 0, (-1,)), ok, (4,), "float32"),
         "elementwise a: shape (4,) with strides (-1,) reads bytes [-12, 4), outside its 16-byte storage"),
        (lambda k: k.elementwise("add", (buf, -4), ok, ok, (1,), "float32"),
         "elementwise out offset must be >= 0, got -4"),
        (lambda k: k.elementwise("add", (cpu, 0), ok, ok, (4,), "float32"),
         f"elementwise out: a buffer of cpu:0, but the kernel runs on {dev}"),
        (lambda k: k.elementwise("add", (freed, 0), ok, ok, (4,), "float32"),
         f"use of a freed buffer (16 bytes on {dev})"),
        (lambda k: k.elementwise("add", (np.zeros(4), 0), ok, ok, (4,), "float32"),
         f"elementwise out: storage must be an anychip.Buffer of {dev} or the array of a DLPack import on it, "
         "got ndarray"),
        (lambda k: k.elementwise("add", (buf, 0), ok, ok, (4,), "float32", stream=other),
         f"elementwise: stream must be an anychip.Stream of {dev}, got {other!r}"),
        (lambda k: k.unary("relu", (buf, 0), "float64", ok, "float32", (4,)),
         "unary: relu writes its input's dtype; got float32 in and float64 out (only copy converts)"),
        (lambda k: k.reduce("sum", (buf, 0), "float32", (buf, 0), "float32", 1, -1, 1),
         "reduce: n must be >= 0, got -1"),
        (lambda k: k.reduce("prod", (buf, 0), "float32", (buf, 0), "float32", 1, 4, 1),
         "reduce: unknown op 'prod'; expected one of sum, mean, max"),
        (lambda k: k.gemm((buf, 0), (buf, 0, (3, 1)), (buf, 0, (1, 1)), 2, 3, 1, "float32"),
         "gemm a: shape (2, 3) with strides (3, 1) reads bytes [0, 24), outside its 16-byte storage"),
        (lambda k: k.gemm((buf, 0), (buf, 0), (buf, 0, (1, 1)), 1, 1, 1, "float32"),
         f"gemm a must be (storage, byte offset, strides), got {(buf, 0)!r}"),
    ]


@pytest.mark.parametrize("case", range(17))
@pytest.mark.parametrize("name", ALL)
def test_bad_arguments_are_refused_once_with_one_message(name: str, case: int, monkeypatch: pytest.MonkeyPatch,
                                                         request: pytest.FixtureRequest) -> None:
    dev = _device(name, request)
    call, message = _bad_calls(dev)[case]
    k = kernels_of(dev)
    reached: list[str] = []
    for method in METHODS:          # the backend's own methods, still run, but counted
        real = getattr(k.set, method)
        monkeypatch.setattr(k.set, method, lambda *a, _real=real, _m=method: (reached.append(_m), _real(*a)))
    with pytest.raises(anychip.InvalidArgumentError) as info:
        call(k)
    assert str(info.value) == message
    assert reached == []
    dev.synchronize()


def test_the_bad_calls_are_counted() -> None:
    assert len(_bad_calls(anychip.device("ascend:0"))) == 17
