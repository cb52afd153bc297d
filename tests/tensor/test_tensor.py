"""Tensor: construction, views, conversion and every op against NumPy on every device."""
from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.tensor import Tensor

INT_DTYPES = ["int8", "uint8", "int32", "int64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
ALL_NUMERIC = INT_DTYPES + FLOAT_DTYPES


def _data(dtype: str, shape: tuple[int, ...], seed: int = 0, positive: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        lo = 1 if positive else (0 if np.dtype(dtype).kind == "u" else -50)
        return rng.integers(lo, 50, size=shape).astype(dtype)
    x = rng.standard_normal(shape) * 4
    if positive:
        x = np.abs(x) + 0.5
    return x.astype(dtype)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        tol = {2: 2e-3, 4: 1e-5, 8: 1e-12}[want.dtype.itemsize]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


# -- construction ------------------------------------------------------------------

def test_factories(device: anychip.Device) -> None:
    z = anychip.zeros(2, 3, dtype="int32", device=device)
    assert (z.shape, z.dtype, z.device, z.strides) == ((2, 3), "int32", device, (3, 1))
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3), np.int32))
    np.testing.assert_array_equal(anychip.ones((4,), device=device).numpy(), np.ones(4, np.float32))
    f = anychip.full((2, 2), 7, dtype="int64", device=device)
    np.testing.assert_array_equal(f.numpy(), np.full((2, 2), 7, np.int64))
    a = anychip.arange(2, 11, 3, device=device)
    assert a.dtype == "int64"
    np.testing.assert_array_equal(a.numpy(), np.arange(2, 11, 3))
    e = anychip.empty((0, 5), device=device)
    assert e.shape == (0, 5) and e.numpy().shape == (0, 5)


def test_tensor_from_python_and_numpy(device: anychip.Device) -> None:
    t = anychip.tensor([[1.5, 2.5]], device=device)
    assert t.dtype == "float32" and t.shape == (1, 2)        # Python floats: float32, as torch.tensor
    assert anychip.tensor([1, 2], device=device).dtype == "int64"
    assert anychip.tensor([True, False], device=device).dtype == "bool"
    src = np.arange(12, dtype=np.int8).reshape(3, 4)
    t = anychip.tensor(src, device=device)
    assert t.dtype == "int8"
    np.testing.assert_array_equal(t.numpy(), src)
    src[0, 0] = 99                                          # tensor() copies
    assert t.numpy()[0, 0] == 0
    assert anychip.tensor(3.5, device=device).item() == 3.5
    assert anychip.tensor(src, dtype="float64", device=device).dtype == "float64"


def test_item_and_errors(device: anychip.Device) -> None:
    assert anychip.tensor([[42]], device=device).item() == 42
    with pytest.raises(anychip.InvalidArgumentError, match=r"item\(\) needs a tensor with one element, "
                                                           r"this one has shape \(2,\) \(2 elements\)"):
        anychip.tensor([1, 2], device=device).item()
    with pytest.raises(anychip.UnsupportedError, match="dtype 'complex64' is not supported by anychip tensors"):
        anychip.zeros(2, dtype="complex64", device=device)
    with pytest.raises(anychip.UnsupportedError,
                       match="dtype 'uint16' is not supported by anychip tensors; use one of bool, int8"):
        anychip.tensor(np.zeros(2, np.uint16), device=device)


# -- views -------------------------------------------------------------------------

def test_slicing_views_share_memory(device: anychip.Device) -> None:
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = anychip.tensor(base, device=device)
    for key in [(1,), (slice(None), 2), (Ellipsis, 1), (slice(0, 3, 2), slice(1, None), slice(None, None, -2)),
                (None, 1, slice(None, None, -1)), (-1, -1, -1), (slice(5, 9),)]:
        v = t[key]
        assert v.buffer is t.buffer
        np.testing.assert_array_equal(v.numpy(), base[key])
    assert t[1, 2].strides == (1,) and t[:, ::2].strides == (20, 10, 1)
    t[0, 0] = 100.0                                          # writes go through views
    assert t.numpy()[0, 0, 3] == 100.0


def test_slicing_errors(device: anychip.Device) -> None:
    t = anychip.zeros(3, 4, device=device)
    with pytest.raises(anychip.InvalidArgumentError, match="index 3 is out of range for dimension 0 of size 3"):
        t[3]
    with pytest.raises(anychip.InvalidArgumentError, match="too many indices: 3 for a tensor of 2 dimension"):
        t[0, 0, 0]
    with pytest.raises(anychip.UnsupportedError, match="basic indexing"):
        t[[0, 1]]


def test_reshape_and_transpose(device: anychip.Device) -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    t = anychip.tensor(base, device=device)
    r = t.reshape(2, -1, 3)
    assert r.buffer is t.buffer and r.shape == (2, 4, 3)
    np.testing.assert_array_equal(r.numpy(), base.reshape(2, -1, 3))
    tt = t.T
    assert tt.shape == (6, 4) and tt.strides == (1, 6) and not tt.is_contiguous()
    np.testing.assert_array_equal(tt.numpy(), base.T)
    np.testing.assert_array_equal(tt.reshape(-1).numpy(), base.T.reshape(-1))   # copies first
    np.testing.assert_array_equal(tt.contiguous().numpy(), base.T)
    with pytest.raises(anychip.InvalidArgumentError,
                       match=r"cannot reshape a tensor of shape \(4, 6\) \(24 elements\) into \(5, 5\)"):
        t.reshape(5, 5)


# -- movement and DLPack -----------------------------------------------------------

def test_to_every_device(device: anychip.Device) -> None:
    src = np.arange(10, dtype=np.float64)
    t = anychip.tensor(src, device="cpu")
    moved = t.to(device)
    assert moved.device is device
    np.testing.assert_array_equal(moved.numpy(), src)
    np.testing.assert_array_equal(moved[::3].to("cpu").numpy(), src[::3])
    assert moved.to(device) is moved
    assert moved.to(dtype="int32").dtype == "int32"


def test_dlpack_numpy_roundtrip_is_zero_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = anychip.from_dlpack(a)
    assert t.device.backend == "cpu" and t.shape == (3, 4)
    a[1, 1] = -1.0
    assert t[1, 1].item() == -1.0                            # shares a's memory
    back = np.from_dlpack(t.T)
    assert back.shape == (4, 3) and back[1, 1] == -1.0
    back[0, 0] = 5.0
    assert a[0, 0] == 5.0
    own = anychip.tensor([1, 2, 3], device="cpu")
    view = np.from_dlpack(own)
    del own                                                  # the export keeps the memory alive
    np.testing.assert_array_equal(view, [1, 2, 3])


def test_dlpack_device_memory_needs_a_copy(device: anychip.Device) -> None:
    t = anychip.tensor([1.0, 2.0], device=device)
    if device.backend == "cpu":
        assert t.__dlpack_device__() == (1, 0)
        return
    assert t.__dlpack_device__()[0] != 1
    with pytest.raises(anychip.DLPackError, match="cannot be read through DLPack"):
        np.from_dlpack(t)
    host = np.from_dlpack(t, device="cpu", copy=True)
    np.testing.assert_array_equal(host, [1.0, 2.0])


# -- ops ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_arithmetic(device: anychip.Device, op: str, dtype: str) -> None:
    a, b = _data(dtype, (5, 7), 1), _data(dtype, (7,), 2, positive=True)
    ta, tb = anychip.tensor(a, device=device), anychip.tensor(b, device=device)
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide}[op]
    with np.errstate(all="ignore"):
        want = fn(a, b)
        got = {"add": ta + tb, "sub": ta - tb, "mul": ta * tb, "div": ta / tb}[op]
        _close(got.numpy(), want)
        scalar = {"add": ta + 3, "sub": 3 - ta, "mul": ta * 3, "div": ta / 3}[op]
        _close(scalar.numpy(), {"add": a + 3, "sub": 3 - a, "mul": a * 3, "div": a / 3}[op])


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(device: anychip.Device, op: str) -> None:
    a, b = _data("int32", (4, 6), 3) % 5, _data("int32", (4, 1), 4) % 5
    ta, tb = anychip.tensor(a, device=device), anychip.tensor(b, device=device)
    got = getattr(ta, f"__{op}__")(tb).numpy()
    want = getattr(a, f"__{op}__")(b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


def test_broadcast_and_promotion(device: anychip.Device) -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3, 1)
    b = np.linspace(0, 1, 4, dtype=np.float32)
    got = (anychip.tensor(a, device=device) + anychip.tensor(b, device=device)).numpy()
    _close(got, a + b)
    i8 = anychip.tensor(np.array([100, -100], np.int8), device=device)
    np.testing.assert_array_equal((i8 + i8).numpy(), np.array([100, -100], np.int8) * 2)   # wraps as NumPy


def test_op_errors(device: anychip.Device) -> None:
    a = anychip.zeros(2, 3, device=device)
    with pytest.raises(anychip.InvalidArgumentError, match=r"\+: shapes \(2, 3\) and \(4,\) cannot be broadcast"):
        a + anychip.zeros(4, device=device)
    with pytest.raises(anychip.InvalidArgumentError, match=r"matmul: shapes \(2, 3\) and \(2, 3\) do not match"):
        a @ a
    other = "cpu:0" if device.backend != "cpu" else None
    if other is not None:
        with pytest.raises(anychip.InvalidArgumentError,
                           match=f"tensors on different devices \\({device} and cpu:0\\)"):
            a + anychip.zeros(2, 3, device=other)


@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_matmul(device: anychip.Device, dtype: str) -> None:
    a, b = _data(dtype, (5, 8), 5) % 7, _data(dtype, (8, 3), 6) % 7
    ta, tb = anychip.tensor(a, device=device), anychip.tensor(b, device=device)
    acc = np.float32 if dtype == "float16" else a.dtype
    want = (a.astype(acc) @ b.astype(acc)).astype(dtype)
    _close((ta @ tb).numpy(), want)
    _close((tb.T @ ta.T).numpy(), want.T)                    # strided operands
    _close((ta[1] @ tb).numpy(), want[1])                    # vector @ matrix
    _close((ta @ tb[:, 0]).numpy(), want[:, 0])


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", ALL_NUMERIC)
def test_reductions(device: anychip.Device, op: str, dtype: str) -> None:
    x = _data(dtype, (4, 5, 6), 7)
    t = anychip.tensor(x, device=device)
    fn = getattr(np, op)
    for axis in (None, 0, 1, -1):
        kw = {}
        if op != "max":
            kw["dtype"] = (np.int64 if op == "sum" else np.float64) if x.dtype.kind in "iu" else \
                (np.float32 if dtype == "float16" else x.dtype)
        want = np.asarray(fn(x, axis=axis, **kw))
        if dtype == "float16":
            want = want.astype(np.float16)
        got = getattr(t, op)(axis=axis)
        _close(got.numpy(), want)
    assert getattr(t, op)(axis=1, keepdims=True).shape == (4, 1, 6)
    strided = getattr(t[:, ::2], op)(axis=2).numpy()
    _close(strided, getattr(t[:, ::2].contiguous(), op)(axis=2).numpy())


@pytest.mark.parametrize("op", ["relu", "exp", "log"])
@pytest.mark.parametrize("dtype", ["int32", "float16", "float32", "float64"])
def test_unary(device: anychip.Device, op: str, dtype: str) -> None:
    x = _data(dtype, (3, 9), 8, positive=(op == "log"))
    if op == "exp" and x.dtype.kind == "f":
        x = (x / 4).astype(dtype)
    t = anychip.tensor(x, device=device)
    want = np.maximum(x, x.dtype.type(0)) if op == "relu" else getattr(np, op)(x)
    _close(getattr(t, op)().numpy(), want)


@pytest.mark.parametrize("src", ALL_NUMERIC + ["bool"])
@pytest.mark.parametrize("dst", ALL_NUMERIC + ["bool"])
def test_cast(device: anychip.Device, src: str, dst: str) -> None:
    x = _data(src, (11,), 9) if src != "bool" else np.array([True, False] * 5 + [True])
    if src.startswith("float") and dst in INT_DTYPES:
        x = np.trunc(x).clip(0 if dst == "uint8" else -100, 100).astype(src)   # defined conversions only
    with np.errstate(all="ignore"):
        want = x.astype(dst)
    got = anychip.tensor(x, device=device).cast(dst).numpy()
    np.testing.assert_array_equal(got, want)


def test_bfloat16(device: anychip.Device) -> None:
    x = np.array([1.0, 1.00390625, -3.5, 1e-3, 65504.0, np.inf], dtype=np.float32)
    t = anychip.tensor(x, dtype="bfloat16", device=device)
    assert t.dtype == "bfloat16" and t.itemsize == 2
    back = t.cast("float32").numpy()
    np.testing.assert_array_equal(back, [1.0, 1.0, -3.5, 0.00099945068359375, 65536.0, np.inf])
    s = (t + t).cast("float32").numpy()
    np.testing.assert_array_equal(s, back * 2)
    assert (t + 1).dtype == "bfloat16" and (t + anychip.ones(6, device=device)).dtype == "float32"


def test_tensor_class_is_exported() -> None:
    assert anychip.Tensor is Tensor
    import sys
    assert sys.modules["anychip.tensor"].Tensor is Tensor
    assert callable(anychip.tensor)


# -- where the ops run ---------------------------------------------------------------

SIM = [d for d in ("ascend:0", "kunlun:0", "hygon:0") if any(x.name == d for x in anychip.devices())]


@pytest.mark.parametrize("name", SIM)
def test_sim_ops_are_kernels_on_the_stream(name: str) -> None:
    """On a simulated chip the ops are enqueued on the stream (held here, so nothing runs)
    and run on its worker over device memory: no host round trip that would wait."""
    dev = anychip.device(name)
    x = anychip.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev)
    w = anychip.tensor(np.ones((4, 2), np.float32), device=dev)
    dev.synchronize()
    stream = dev.current_stream()
    dev.plugin.sim_hold_stream(dev.index, stream._live())
    try:
        y = ((x * 2 + x.T.contiguous().T) @ w).relu().sum(axis=0)
        c = (x > 5).cast("int32").sum()
        assert not stream.query()                    # enqueued behind the hold, not run
    finally:
        dev.plugin.sim_release_stream(dev.index, stream._live())
    np.testing.assert_array_equal(y.numpy(), [198.0, 198.0])
    assert c.item() == 6


@pytest.mark.parametrize("name", SIM)
def test_sim_kernel_checks_memory(name: str) -> None:
    dev = anychip.device(name)
    k = dev.plugin.kernels
    buf = dev.alloc(16)
    with pytest.raises(anychip.DeviceError, match="elementwise output"):
        k.elementwise(dev.index, "add", (buf, 1 << 40), (buf, 0, (1,)), (buf, 0, (1,)), (4,), "float32",
                      dev.current_stream())
    with pytest.raises(anychip.InvalidArgumentError, match="a buffer of cpu:0, but the kernel runs on"):
        k.gemm(dev.index, (anychip.device("cpu").alloc(4), 0), (buf, 0, (1, 1)), (buf, 0, (1, 1)), 1, 1, 1,
               "float32", dev.current_stream())


@pytest.mark.skipif(not any(d.backend == "opencl" for d in anychip.devices()), reason="no OpenCL platform")
def test_opencl_runs_its_kernels_where_the_layout_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = anychip.devices("opencl")[0]
    k = dev.plugin.kernels
    calls: list[str] = []
    for name in ("binary", "matmul", "sum", "cast"):
        real = getattr(k, name)
        monkeypatch.setattr(k, name, lambda *a, _real=real, _name=name, **kw: (calls.append(_name), _real(*a, **kw)))
    x = anychip.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=dev)
    np.testing.assert_array_equal((x + x).numpy(), np.arange(6).reshape(2, 3) * 2)
    np.testing.assert_array_equal((x @ x.T.contiguous()).numpy(), [[5, 14], [14, 50]])
    assert x.sum().item() == 15.0
    assert x.cast("int32").dtype == "int32"
    assert calls == ["binary", "matmul", "sum", "cast"]
    calls.clear()
    np.testing.assert_array_equal((x + x[0]).numpy(), [[0, 2, 4], [3, 5, 7]])     # broadcast: host fallback
    np.testing.assert_array_equal((x @ x.T).numpy(), [[5, 14], [14, 50]])          # strided: host fallback
    assert calls == []


@pytest.mark.parametrize("name", SIM)
def test_tensor_copies_the_array_before_returning(name: str) -> None:
    """The host-to-device copy is queued; the caller's array may change at once."""
    dev = anychip.device(name)
    src = np.arange(4, dtype=np.float32)
    stream = dev.current_stream()
    dev.plugin.sim_hold_stream(dev.index, stream._live())
    try:
        t = anychip.tensor(src, device=dev)
        part = anychip.zeros(4, device=dev)
        part[1:3] = src[:2]
        src[:] = -1.0
    finally:
        dev.plugin.sim_release_stream(dev.index, stream._live())
    np.testing.assert_array_equal(t.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(part.numpy(), [0, 0, 1, 0])


def test_dlpack_import_reshapes_as_a_view() -> None:
    a = np.arange(12, dtype=np.int32)
    t = anychip.from_dlpack(a).reshape(3, 4)
    a[5] = 50
    assert t[1, 1].item() == 50
    assert t.T.reshape(-1).numpy().tolist() == a.reshape(3, 4).T.reshape(-1).tolist()
    with pytest.raises(anychip.UnsupportedError, match="imported through DLPack, which has no anychip Buffer"):
        _ = t.buffer
    assert isinstance(t.clone().buffer, anychip.Buffer)


def test_dtype_objects() -> None:
    assert anychip.float32 == "float32" == anychip.tensor([1.0], device="cpu").dtype
    assert anychip.int64 == np.int64 and anychip.bfloat16 != "float16"
    from anychip.tensor import dtype
    assert dtype("bf16") is anychip.bfloat16 and dtype(np.dtype("uint8")) is anychip.uint8
    with pytest.raises(anychip.InvalidArgumentError, match="is not a dtype"):
        dtype(object())


def test_bfloat16_numpy_needs_ml_dtypes() -> None:
    t = anychip.tensor([1.5], dtype="bfloat16", device="cpu")
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(anychip.UnsupportedError, match=r"NumPy has no bfloat16.*\.cast\('float32'\)"):
            t.numpy()
    else:
        assert t.numpy().dtype.name == "bfloat16"
    assert t.item() == 1.5 and t.tolist() == [1.5]


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize(("dtype", "scalar"), [("uint8", -2), ("uint8", 256), ("int8", 1000), ("int8", -1000),
                                               ("int32", 2**40), ("int64", -(2**70))])
def test_comparison_with_a_python_integer_out_of_the_dtypes_range(device: anychip.Device, op: str, dtype: str,
                                                                   scalar: int) -> None:
    info = np.iinfo(dtype)
    values = np.array([info.min, 0, 5, info.max], dtype=dtype)
    t = anychip.tensor(values, device=device)
    fn = getattr(np, {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
                      "ge": "greater_equal"}[op])
    sym = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}[op]
    np.testing.assert_array_equal(getattr(t, sym)(scalar).numpy(), fn(values, scalar))     # the exact value


def test_arithmetic_with_a_python_integer_out_of_range_is_refused(device: anychip.Device) -> None:
    i8 = anychip.tensor(np.array([5, 127, -3], np.int8), device=device)
    with pytest.raises(anychip.InvalidArgumentError) as info:
        i8 + 300
    assert str(info.value) == ("+: the Python integer 300 is out of bounds for int8 (NumPy raises OverflowError); "
                               "use a tensor of a wider dtype")
    np.testing.assert_array_equal((i8 + 100).numpy(), np.array([5, 127, -3], np.int8) + 100)   # in range: wraps


def test_numpy_scalars_are_strong(device: anychip.Device) -> None:
    """NEP 50: a NumPy scalar takes part in promotion with its dtype, a Python scalar does not."""
    assert anychip.tensor(np.float64(2.5), device=device).dtype.name == "float64"
    assert anychip.tensor(2.5, device=device).dtype.name == "float32"
    f32 = anychip.tensor(np.ones(3, np.float32), device=device)
    got = f32 + np.float64(1.5)
    assert got.dtype.name == "float64" and got.numpy().tolist() == [2.5, 2.5, 2.5]
    assert (f32 + 1.5).dtype.name == "float32"
    i8 = anychip.tensor(np.array([5, 127, -3], np.int8), device=device)
    got = i8 + np.int64(300)
    assert got.dtype.name == "int64" and got.numpy().tolist() == [305, 427, 297]
    assert (np.int16(2) * i8).dtype.name == "int16"
    assert (i8 < np.int64(1000)).numpy().tolist() == [True, True, True]


def test_integer_mean_accumulates_in_float64(device: anychip.Device) -> None:
    values = np.full(7, 5 * 10**18, dtype=np.int64)         # their int64 sum wraps
    got = anychip.tensor(values, device=device).mean()
    assert got.dtype.name == "float64" and got.item() == np.mean(values) == 5e18
    m = anychip.tensor(values.reshape(7, 1), device=device).mean(axis=0)
    assert m.numpy().tolist() == [5e18]


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
def test_reductions_of_an_empty_tensor(device: anychip.Device, dtype: str) -> None:
    e = anychip.tensor(np.zeros(0, dtype), device=device)
    s = e.sum()
    assert s.shape == () and s.item() == 0
    assert np.isnan(e.mean().item())
    z = anychip.tensor(np.zeros((0, 3), dtype), device=device)
    assert z.sum(axis=0).numpy().tolist() == [0, 0, 0]
    assert z.sum(axis=1).shape == (0,)
    with pytest.raises(anychip.InvalidArgumentError, match="there is no maximum of zero elements"):
        e.max()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_matmul_with_an_empty_dimension(device: anychip.Device, dtype: str) -> None:
    # an empty inner dimension gives zeros, as NumPy (the chips' GEMM kernels refuse k = 0)
    for m, k, n in ((3, 0, 2), (1, 0, 1), (0, 4, 2), (3, 4, 0)):
        a, b = np.ones((m, k), dtype), np.ones((k, n), dtype)
        got = (anychip.tensor(a, device=device) @ anychip.tensor(b, device=device)).numpy()
        assert got.dtype == dtype and got.shape == (m, n) and np.array_equal(got, a @ b)
    v = anychip.tensor(np.ones(0, dtype), device=device)
    assert (v @ v).numpy().tolist() == 0
    assert (anychip.tensor(np.ones((2, 0), dtype), device=device) @ v).numpy().tolist() == [0, 0]


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparing_int8_with_uint8(device: anychip.Device, op: str) -> None:
    # NumPy compares them as int16, which tensors do not have: exact in int32, bool as NumPy
    a = np.array([-128, -1, 0, 1, 127, 5], np.int8)
    b = np.array([255, 255, 0, 1, 128, 5], np.uint8)
    ta, tb = anychip.tensor(a, device=device), anychip.tensor(b, device=device)
    fn = getattr(np, {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
                      "ge": "greater_equal"}[op])
    for x, y, tx, ty in ((a, b, ta, tb), (b, a, tb, ta), (a[:, None], b, ta[:, None], tb)):
        got = getattr(tx, f"__{op}__")(ty).numpy()
        assert got.dtype == np.bool_ and np.array_equal(got, fn(x, y))


def test_arithmetic_without_a_result_dtype_is_refused(device: anychip.Device) -> None:
    a, b = anychip.tensor(np.ones(2, np.int8), device=device), anychip.tensor(np.ones(2, np.uint8), device=device)
    with pytest.raises(anychip.UnsupportedError, match=r"int8 \+ uint8 gives int16 in NumPy, which anychip "
                       r"tensors do not support"):
        a + b
    with pytest.raises(anychip.UnsupportedError, match=r"matmul of int8 and uint8 gives int16 in NumPy, which "
                       r"anychip tensors do not support; cast one operand \(e.g. to int32\) first"):
        a @ b


def test_the_spellings_in_the_tensor_docs_exist() -> None:
    # every anychip.<name>[.<name>...] that docs/tensor.md writes is reachable from `import anychip`
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "tensor.md").read_text()
    for module in re.findall(r"^import (anychip\.\w+)", text, re.M):      # what its snippets import
        __import__(module)
    names = sorted(set(re.findall(r"\banychip(?:\.[A-Za-z_]\w*)+", text)))
    assert "anychip.maximum" in names and "anychip.matmul" in names
    missing = []
    for name in names:
        obj: object = anychip
        for part in name.split(".")[1:]:
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert missing == [], f"docs/tensor.md names what does not exist: {missing}"
    from anychip.tensor import matmul, maximum
    assert anychip.maximum is maximum and anychip.matmul is matmul


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_tanh_sqrt_erf_and_pow(device: anychip.Device, dtype: str) -> None:
    import math
    x = _data(dtype, (3, 4), 9, positive=True)
    t = anychip.tensor(x, device=device)
    _close(t.tanh().numpy(), np.tanh(x))
    _close(anychip.sqrt(t).numpy(), np.sqrt(x))
    want = np.array([math.erf(v) for v in x.astype(np.float64).ravel()]).reshape(x.shape).astype(np.tanh(x).dtype)
    _close(t.erf().numpy(), want)
    _close((t ** 2).numpy(), x ** 2)
    _close((2 ** t).numpy(), 2 ** x)
    _close((t ** t).numpy(), x ** x)
    if dtype == "int32":
        with pytest.raises(anychip.InvalidArgumentError, match=r"\*\*: Integers to negative integer powers"):
            t ** -t


def test_float32_erf_is_within_one_ulp() -> None:
    import math
    x = np.concatenate([np.linspace(-6, 6, 20001), np.logspace(-30, 1, 2000), -np.logspace(-30, 1, 2000),
                        [0.0, 0.5, -0.5, np.inf, -np.inf]]).astype(np.float32)
    got = anychip.tensor(x, device="cpu").erf().numpy().astype(np.float64)
    want = np.array([math.erf(float(v)) for v in x])
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0 and got[-2:].tolist() == [1.0, -1.0]
    assert np.isnan(anychip.tensor([np.nan], device="cpu").erf().item())
