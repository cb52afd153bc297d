"""DLPack with torch (its CPU build) and with CuPy on a GPU: zero-copy both ways.

Both skip, with the reason, where the library or the GPU is missing. torch's CPU
build comes from download.pytorch.org/whl/cpu; the PyPI build pulls in several GB
of CUDA libraries and does not import without them.
"""
from __future__ import annotations

import numpy as np
import pytest

import anychip


def _torch():
    try:
        import torch
    except ImportError as exc:
        pytest.skip(f"torch is not importable ({exc}); install its CPU build: "
                    "pip install torch --index-url https://download.pytorch.org/whl/cpu")
    return torch


def test_torch_to_anychip_shares_memory() -> None:
    torch = _torch()
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = anychip.from_dlpack(t)
    assert a.device.backend == "cpu" and a.shape == (3, 4) and a.dtype == "float32"
    t[1, 2] = -7.0
    assert a[1, 2].item() == -7.0
    strided = anychip.from_dlpack(t.t())
    assert strided.strides == (1, 4)
    np.testing.assert_array_equal(strided.numpy(), t.t().numpy())
    np.testing.assert_array_equal((a @ strided).numpy(), (t @ t.t()).numpy())


def test_anychip_to_torch_shares_memory_and_keeps_it_alive() -> None:
    torch = _torch()
    a = anychip.tensor(np.arange(6, dtype=np.int64).reshape(2, 3), device="cpu")
    t = torch.from_dlpack(a.T)
    assert t.shape == (3, 2) and t.stride() == (1, 3) and t.dtype == torch.int64
    t[0, 1] = 100
    assert a[1, 0].item() == 100
    del a
    assert t.sum().item() == 0 + 1 + 2 + 100 + 4 + 5


def test_device_tensor_to_torch_through_a_host_copy() -> None:
    torch = _torch()
    x = anychip.tensor([1.0, 2.0, 3.0], device=anychip.devices()[0])
    if x.device.backend == "cpu":
        pytest.skip("the first selected device is the host")
    t = torch.from_dlpack(x.__dlpack__(dl_device=(1, 0), copy=True))
    assert t.tolist() == [1.0, 2.0, 3.0]


def _cuda():
    cuda = [d for d in anychip.devices() if d.backend == "cuda"]
    if not cuda:
        pytest.skip("no CUDA device is selected (no GPU or no CuPy)")
    import cupy
    return cupy, cuda[0]


def test_cupy_roundtrip_is_zero_copy() -> None:
    cp, dev = _cuda()
    with cp.cuda.Device(dev.index):
        c = cp.arange(12, dtype=cp.float32).reshape(3, 4)
    a = anychip.from_dlpack(c)
    assert a.device is dev and a.shape == (3, 4)
    c[0, 1] = 42.0
    assert a[0, 1].item() == 42.0
    back = cp.from_dlpack(a.T)
    assert back.shape == (4, 3) and int(back.data.ptr) == int(c.data.ptr)
    np.testing.assert_array_equal(cp.asnumpy(back), cp.asnumpy(c).T)
    own = anychip.tensor(np.arange(5, dtype=np.int32), device=dev)
    view = cp.from_dlpack(own)
    assert int(view.data.ptr) == own.buffer.ptr
    np.testing.assert_array_equal(cp.asnumpy(view), np.arange(5))


def test_cuda_ops_run_on_cupy() -> None:
    cp, dev = _cuda()
    x = anychip.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=dev)
    assert dev.plugin.kernels.supports(dev.index, "matmul", "float32")
    np.testing.assert_array_equal((x @ x.T + 1).numpy(), [[6, 15], [15, 51]])
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), [3, 5, 7])
