"""OpenCL backend: raw plugin calls, the kernel set (exact against NumPy), error
translation and availability reasons. Runs on any OpenCL platform (PoCL in CI);
without one, the tests that need a device skip with the reason.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from anychip.chips.opencl import OpenCLPlugin, cl_code_name
from anychip.runtime.errors import DeviceError, InvalidArgumentError, OutOfMemoryError, UnsupportedError
from anychip.runtime.plugin import D2D, D2H, H2D

_PLUGIN = OpenCLPlugin()
_OK, _REASON = _PLUGIN.available()
needs_opencl = pytest.mark.skipif(not _OK, reason=f"OpenCL unavailable: {_REASON}")

DTYPES = ("float32", "float64", "int32", "int64")


@pytest.fixture(scope="module")
def plugin() -> OpenCLPlugin:
    if not _OK:
        pytest.skip(f"OpenCL unavailable: {_REASON}")
    return _PLUGIN


class Mem:
    """A raw segment for the tests (freed at the end of the test)."""

    def __init__(self, plugin: OpenCLPlugin, nbytes: int, index: int = 0) -> None:
        self.plugin, self.index, self.nbytes = plugin, index, nbytes
        self.handle = plugin._malloc(index, nbytes)

    def put(self, arr: np.ndarray, off: int = 0) -> None:
        p = self.plugin
        s = p._default_stream(self.index)
        p._copy(self.index, self.handle, off, np.ascontiguousarray(arr).reshape(-1).view(np.uint8), 0,
                arr.nbytes, H2D, s)
        p._stream_synchronize(self.index, s)

    def get(self, dtype: str, count: int, off: int = 0) -> np.ndarray:
        p = self.plugin
        out = np.empty(count, dtype=dtype)
        s = p._default_stream(self.index)
        p._copy(self.index, out.view(np.uint8), 0, self.handle, off, out.nbytes, D2H, s)
        p._stream_synchronize(self.index, s)
        return out

    def free(self) -> None:
        self.plugin._free(self.index, self.handle)


@pytest.fixture
def mem(plugin):
    made: list[Mem] = []

    def make(nbytes: int) -> Mem:
        m = Mem(plugin, nbytes)
        made.append(m)
        return m

    yield make
    plugin._synchronize(0)
    for m in made:
        m.free()


# ---------------------------------------------------------------- availability

def _fake_pyopencl(get_platforms):
    mod = types.ModuleType("pyopencl")
    mod.get_platforms = get_platforms
    return mod


def test_unavailable_without_pyopencl(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # makes `import pyopencl` raise ImportError
    ok, reason = OpenCLPlugin().available()
    assert not ok
    assert "pyopencl is not importable" in reason


def test_unavailable_without_platform(monkeypatch):
    class FakeLogicError(Exception):
        code = -1001

    def no_platform():
        raise FakeLogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setitem(sys.modules, "pyopencl", _fake_pyopencl(no_platform))
    p = OpenCLPlugin()
    ok, reason = p.available()
    assert not ok
    assert "pyopencl found no OpenCL platform" in reason
    assert "pocl-opencl-icd" in reason
    assert p.device_count() == 0


def test_unavailable_with_empty_platform_list(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", _fake_pyopencl(lambda: []))
    ok, reason = OpenCLPlugin().available()
    assert not ok and "no OpenCL platform" in reason


def test_platform_without_devices(monkeypatch):
    class Platform:
        name = "Empty"

        def get_devices(self):
            raise RuntimeError("DEVICE_NOT_FOUND")

    monkeypatch.setitem(sys.modules, "pyopencl", _fake_pyopencl(lambda: [Platform()]))
    ok, reason = OpenCLPlugin().available()
    assert not ok and "Empty" in reason and "no devices" in reason


def test_import_anychip_without_pyopencl_lists_reason():
    code = textwrap.dedent("""
        import sys
        sys.modules["pyopencl"] = None
        import anychip
        info = {b.name: b for b in anychip.backends()}["opencl"]
        assert not info.available
        print(info.reason)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pyopencl is not importable" in out.stdout


# ---------------------------------------------------------------- devices

@needs_opencl
def test_device_order_is_platforms_then_devices(plugin):
    import pyopencl as cl

    expected = [(pi, di, d.name.strip()) for pi, p in enumerate(cl.get_platforms())
                for di, d in enumerate(_devices_or_empty(p))]
    got = [(plugin.properties(i)["platform_index"], plugin.properties(i)["device_in_platform"],
            plugin.properties(i)["name"]) for i in range(plugin.device_count())]
    assert got == expected


def _devices_or_empty(platform):
    try:
        return platform.get_devices()
    except Exception:  # noqa: BLE001
        return []


@needs_opencl
def test_properties(plugin):
    props = plugin.properties(0)
    for key in ("name", "platform", "version", "total_memory", "max_alloc", "type", "vendor"):
        assert key in props, key
    assert props["total_memory"] > 0 and 0 < props["max_alloc"] <= props["total_memory"]
    assert props["version"].startswith("OpenCL")


@needs_opencl
def test_available_description(plugin):
    ok, desc = plugin.available()
    assert ok and "OpenCL device" in desc and plugin.properties(0)["name"] in desc


# ---------------------------------------------------------------- memory

@needs_opencl
def test_malloc_accounting_and_mem_info(plugin):
    free0, total = plugin._mem_info(0)
    h = plugin._malloc(0, 1 << 20)
    free1, total1 = plugin._mem_info(0)
    assert total1 == total and free1 == free0 - (1 << 20)
    plugin._free(0, h)
    assert plugin._mem_info(0)[0] == free0


@needs_opencl
def test_malloc_zero_bytes(plugin):
    h = plugin._malloc(0, 0)
    plugin._free(0, h)


@needs_opencl
def test_malloc_above_max_alloc_is_refused(plugin):
    max_alloc = plugin.properties(0)["max_alloc"]
    with pytest.raises(OutOfMemoryError) as ei:
        plugin._malloc(0, max_alloc + 1)
    err = ei.value
    assert err.code_name == "CL_INVALID_BUFFER_SIZE" and err.backend == "opencl"
    assert "CL_DEVICE_MAX_MEM_ALLOC_SIZE" in str(err) and err.requested == max_alloc + 1


@needs_opencl
def test_malloc_beyond_global_memory_is_oom(plugin):
    props = plugin.properties(0)
    chunk = props["max_alloc"]
    held = []
    try:
        with pytest.raises(OutOfMemoryError) as ei:
            for _ in range(props["total_memory"] // chunk + 2):
                held.append(plugin._malloc(0, chunk))
        assert ei.value.code_name == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
        assert ei.value.total == props["total_memory"]
        assert "opencl:0" in str(ei.value)
    finally:
        for h in held:
            plugin._free(0, h)
    assert plugin._mem_info(0)[0] == props["total_memory"]


# ---------------------------------------------------------------- errors

@needs_opencl
def test_cl_errors_are_translated(plugin):
    import pyopencl as cl

    def boom(exc):
        with plugin._translate("clEnqueueWriteBuffer", 0, requested=64):
            raise exc

    with pytest.raises(OutOfMemoryError) as ei:
        boom(cl.MemoryError(cl._cl._ErrorRecord("clEnqueueWriteBuffer", -4, "")))
    assert ei.value.code == -4 and ei.value.code_name == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
    assert ei.value.requested == 64
    with pytest.raises(OutOfMemoryError) as ei:
        boom(cl.RuntimeError(cl._cl._ErrorRecord("clEnqueueWriteBuffer", -5, "")))
    assert ei.value.code_name == "CL_OUT_OF_RESOURCES"
    with pytest.raises(DeviceError) as ei:
        boom(cl.LogicError(cl._cl._ErrorRecord("clEnqueueWriteBuffer", -38, "")))
    assert not isinstance(ei.value, OutOfMemoryError)
    assert ei.value.code_name == "CL_INVALID_MEM_OBJECT" and "opencl:0" in str(ei.value)
    # outside allocation-like calls CL_OUT_OF_RESOURCES is a plain device error
    with pytest.raises(DeviceError) as ei, plugin._translate("clFinish", 0):
        raise cl.RuntimeError(cl._cl._ErrorRecord("clFinish", -5, ""))
    assert type(ei.value) is DeviceError and ei.value.code_name == "CL_OUT_OF_RESOURCES"


def test_cl_code_names():
    assert cl_code_name(-4) == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
    assert cl_code_name(-5) == "CL_OUT_OF_RESOURCES"
    assert cl_code_name(-61) == "CL_INVALID_BUFFER_SIZE"
    assert cl_code_name(-123456).startswith("CL_")
    assert cl_code_name(None) is None


@needs_opencl
def test_real_cl_error_is_translated(plugin, mem):
    # the front end never passes an out-of-range copy; the raw call reports OpenCL's error
    a, b = mem(64), mem(64)
    s = plugin._default_stream(0)
    with pytest.raises(DeviceError) as ei:
        plugin._copy(0, b.handle, 0, a.handle, 32, 64, D2D, s)
    assert ei.value.code_name == "CL_INVALID_VALUE" and ei.value.code == -30
    assert "clEnqueueCopyBuffer" in str(ei.value)


# ---------------------------------------------------------------- copies

@needs_opencl
def test_copies_with_offsets(plugin, mem):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 10_000, dtype=np.uint8)
    a, b = mem(20_000), mem(20_000)
    s = plugin._stream_create(0)
    try:
        plugin._copy(0, a.handle, 333, data, 0, data.size, H2D, s)
        plugin._copy(0, b.handle, 1001, a.handle, 333, data.size, D2D, s)
        out = np.zeros(10_000 + 7, dtype=np.uint8)
        plugin._copy(0, out, 7, b.handle, 1001, data.size, D2H, s)
        plugin._stream_synchronize(0, s)
        assert np.array_equal(out[7:], data) and not out[:7].any()
        # host source with an offset, partial length
        plugin._copy(0, a.handle, 0, data, 100, 50, H2D, s)
        part = np.empty(50, dtype=np.uint8)
        plugin._copy(0, part, 0, a.handle, 0, 50, D2H, s)
        plugin._stream_synchronize(0, s)
        assert np.array_equal(part, data[100:150])
    finally:
        plugin._stream_destroy(0, s)


@needs_opencl
def test_zero_byte_copies_are_noops(plugin, mem):
    a = mem(64)
    s = plugin._default_stream(0)
    plugin._copy(0, a.handle, 0, np.empty(0, np.uint8), 0, 0, H2D, s)
    plugin._memset(0, a.handle, 0, 1, 0, s)
    plugin._stream_synchronize(0, s)


@needs_opencl
def test_memset_with_offset(plugin, mem):
    a = mem(4096)
    a.put(np.zeros(4096, np.uint8))
    s = plugin._default_stream(0)
    plugin._memset(0, a.handle, 5, 0xAB, 1000, s)
    plugin._stream_synchronize(0, s)
    got = a.get("uint8", 4096)
    assert not got[:5].any() and (got[5:1005] == 0xAB).all() and not got[1005:].any()


@needs_opencl
def test_host_copies_stay_async_and_nanny_events_are_held(plugin, mem):
    a = mem(1 << 20)
    s = plugin._stream_create(0)
    try:
        host = np.full(1 << 20, 9, np.uint8)
        plugin._copy(0, a.handle, 0, host, 0, host.size, H2D, s)
        back = np.zeros_like(host)
        plugin._copy(0, back, 0, a.handle, 0, host.size, D2H, s)
        # the NannyEvents live on the stream (dropping them would block until the copy ends)
        assert len(s.pending) == 2
        plugin._stream_synchronize(0, s)
        assert not s.pending
        assert (back == 9).all()
    finally:
        plugin._stream_destroy(0, s)


@needs_opencl
def test_pending_host_events_are_pruned(plugin, mem):
    a = mem(64)
    s = plugin._stream_create(0)
    try:
        src = np.arange(64, dtype=np.uint8)
        for i in range(300):
            plugin._copy(0, a.handle, 0, src, 0, 64, H2D, s)
            if i == 199:
                s.queue.finish()    # the first 200 are complete: the prune at the 256th drops them
        assert len(s.pending) <= 100
        plugin._stream_synchronize(0, s)
        assert plugin._stream_query(0, s)
    finally:
        plugin._stream_destroy(0, s)


# ---------------------------------------------------------------- streams and events

@needs_opencl
def test_cross_stream_ordering_with_event(plugin, mem):
    n = 4 << 20
    a, b = mem(n), mem(n)
    s1, s2 = plugin._stream_create(0), plugin._stream_create(0)
    try:
        host = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
        ev = plugin._event_create(0)
        plugin._copy(0, a.handle, 0, host, 0, n, H2D, s1)
        plugin._event_record(0, ev, s1)
        plugin._stream_wait_event(0, s2, ev)
        plugin._copy(0, b.handle, 0, a.handle, 0, n, D2D, s2)
        out = np.empty(n, np.uint8)
        plugin._copy(0, out, 0, b.handle, 0, n, D2H, s2)
        plugin._stream_synchronize(0, s2)
        assert plugin._event_query(0, ev)
        assert np.array_equal(out, host)
        plugin._event_destroy(0, ev)
    finally:
        plugin._stream_destroy(0, s1)
        plugin._stream_destroy(0, s2)


@needs_opencl
def test_events_query_sync_elapsed(plugin, mem):
    a = mem(8 << 20)
    s = plugin._stream_create(0)
    try:
        e0, e1 = plugin._event_create(0), plugin._event_create(0)
        assert plugin._event_query(0, e0)  # never recorded counts as done
        with pytest.raises(DeviceError):
            plugin._event_elapsed_ms(0, e0, e1)
        plugin._event_record(0, e0, s)
        plugin._memset(0, a.handle, 0, 1, 8 << 20, s)
        plugin._event_record(0, e1, s)
        plugin._event_synchronize(0, e1)
        assert plugin._event_query(0, e0) and plugin._event_query(0, e1)
        ms = plugin._event_elapsed_ms(0, e0, e1)
        assert ms >= 0.0
        assert plugin._stream_query(0, s)
        # re-recording moves the event
        plugin._event_record(0, e0, s)
        plugin._stream_synchronize(0, s)
        assert plugin._event_elapsed_ms(0, e1, e0) >= 0.0
    finally:
        plugin._stream_destroy(0, s)


@needs_opencl
def test_wait_on_unrecorded_event_is_noop(plugin):
    s = plugin._default_stream(0)
    plugin._stream_wait_event(0, s, plugin._event_create(0))
    plugin._stream_synchronize(0, s)


@needs_opencl
def test_default_stream_is_shared_and_survives_destroy(plugin):
    s = plugin._default_stream(0)
    assert plugin._default_stream(0) is s
    plugin._stream_destroy(0, s)  # ignored for the default stream
    assert s.queue is not None
    assert plugin._stream_query(0, s)


@needs_opencl
def test_device_synchronize_waits_for_every_stream(plugin, mem):
    a = mem(1 << 20)
    streams = [plugin._stream_create(0) for _ in range(3)]
    try:
        outs = []
        for i, s in enumerate(streams):
            plugin._memset(0, a.handle, i * 1000, i + 1, 1000, s)
            out = np.zeros(1000, np.uint8)
            plugin._copy(0, out, 0, a.handle, i * 1000, 1000, D2H, s)
            outs.append(out)
        plugin._synchronize(0)
        for i, (s, out) in enumerate(zip(streams, outs, strict=True)):
            assert plugin._stream_query(0, s)
            assert (out == i + 1).all()
    finally:
        for s in streams:
            plugin._stream_destroy(0, s)


# ---------------------------------------------------------------- kernels

def _rand(dtype: str, n: int, rng, low=-1000, high=1000) -> np.ndarray:
    if dtype.startswith("float"):
        return (rng.standard_normal(n) * 100).astype(dtype)
    return rng.integers(low, high, n).astype(dtype)


def _fp64_or_skip(plugin, dtype):
    if dtype not in plugin.cl_kernels.supported_dtypes(0):
        pytest.skip(f"{plugin.properties(0)['name']} has no {dtype} (cl_khr_fp64)")


@needs_opencl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_kernels_exact(plugin, mem, op, dtype):
    _fp64_or_skip(plugin, dtype)
    rng = np.random.default_rng(2)
    n = 10_007
    x, y = _rand(dtype, n, rng), _rand(dtype, n, rng)
    item = np.dtype(dtype).itemsize
    if op == "div" and dtype.startswith("int"):
        y[:50] = 0                     # NumPy: x // 0 == 0
        y[50:100] = -1
        x[100:120] = -7
        y[100:120] = 2                 # floor, not truncation: -7 // 2 == -4
    seg = mem(4 * n * item)
    a_off, b_off, o_off = 0, n * item + 64, 2 * n * item + 512
    seg.put(x, a_off)
    seg.put(y, b_off)
    getattr(plugin.cl_kernels, op)(0, (seg.handle, o_off), (seg.handle, a_off), (seg.handle, b_off), n, dtype)
    got = seg.get(dtype, n, o_off)
    with np.errstate(all="ignore"):
        ref = {"add": x + y, "sub": x - y, "mul": x * y,
               "div": (x / y) if dtype.startswith("float") else (x // y)}[op]
    assert got.dtype == ref.dtype
    assert np.array_equal(got, ref, equal_nan=dtype.startswith("float"))


@needs_opencl
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_kernels_wrap_like_numpy(plugin, mem, dtype):
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, info.max, info.min, info.min, 3], dtype=dtype)
    y = np.array([1, -1, 2, info.max, -1, -1], dtype=dtype)
    seg = mem(3 * 64)
    seg.put(x, 0)
    seg.put(y, 64)
    for op, ref in (("add", x + y), ("sub", x - y), ("mul", x * y)):
        plugin.cl_kernels.binary(0, op, (seg.handle, 128), (seg.handle, 0), (seg.handle, 64), x.size, dtype)
        assert np.array_equal(seg.get(dtype, x.size, 128), ref), op
    plugin.cl_kernels.div(0, (seg.handle, 128), (seg.handle, 0), (seg.handle, 64), x.size, dtype)
    with np.errstate(all="ignore"):
        assert np.array_equal(seg.get(dtype, x.size, 128), x // y)


@needs_opencl
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_in_place(plugin, mem, dtype):
    _fp64_or_skip(plugin, dtype)
    x = np.arange(1000).astype(dtype)
    seg = mem(x.nbytes)
    seg.put(x)
    plugin.cl_kernels.add(0, (seg.handle, 0), (seg.handle, 0), (seg.handle, 0), x.size, dtype)
    assert np.array_equal(seg.get(dtype, x.size), x + x)


@needs_opencl
@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_kernel(plugin, mem, dtype):
    _fp64_or_skip(plugin, dtype)
    n = 3001
    item = np.dtype(dtype).itemsize
    seg = mem((n + 4) * item)
    seg.put(np.zeros(n + 4, dtype))
    value = -2.5 if dtype.startswith("float") else -123456
    plugin.cl_kernels.fill(0, (seg.handle, 2 * item), n, value, dtype)
    got = seg.get(dtype, n + 4)
    ref = np.zeros(n + 4, dtype)
    ref[2:2 + n] = value
    assert np.array_equal(got, ref)


@needs_opencl
@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_cast_kernel(plugin, mem, src, dst):
    _fp64_or_skip(plugin, src)
    _fp64_or_skip(plugin, dst)
    rng = np.random.default_rng(3)
    n = 5000
    if src.startswith("float"):
        x = (rng.standard_normal(n) * 1e5).astype(src)    # in range of every integer type
        x[:4] = [0.5, -0.5, 1.99, -1.99]                   # truncation toward zero
    else:
        x = rng.integers(-(2**31), 2**31 - 1, n).astype(src)
        if src == "int64":
            x[:3] = [2**53 + 1, -(2**62) + 3, 2**40 + 2**24 + 1]  # rounding to nearest even
    seg = mem(n * 16 + 1024)
    seg.put(x, 0)
    out_off = n * 8 + 512
    plugin.cl_kernels.cast(0, (seg.handle, out_off), dst, (seg.handle, 0), src, n)
    assert np.array_equal(seg.get(dst, n, out_off), x.astype(dst))


@needs_opencl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 255, 100_003])
def test_sum_kernel(plugin, mem, dtype, n):
    _fp64_or_skip(plugin, dtype)
    rng = np.random.default_rng(4)
    # integer-valued floats: every order of summation gives the exact result
    x = rng.integers(-1000, 1000, n).astype(dtype)
    item = np.dtype(dtype).itemsize
    seg = mem(max(n, 1) * item + 1024)
    seg.put(x, 512) if n else None
    seg.put(np.full(1, 77, dtype), 0)
    plugin.cl_kernels.sum(0, (seg.handle, 0), (seg.handle, 512), n, dtype)
    assert seg.get(dtype, 1)[0] == np.sum(x, dtype=dtype)


@needs_opencl
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_sum_kernel_wraps(plugin, mem, dtype):
    x = np.full(1000, np.iinfo(dtype).max // 10, dtype=dtype)
    seg = mem(x.nbytes + 64)
    seg.put(x, 64)
    plugin.cl_kernels.sum(0, (seg.handle, 0), (seg.handle, 64), x.size, dtype)
    assert seg.get(dtype, 1)[0] == np.sum(x, dtype=dtype)


@needs_opencl
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (17, 33, 9), (64, 64, 64), (5, 0, 3), (130, 7, 1)])
def test_matmul_kernel(plugin, mem, dtype, mkn):
    _fp64_or_skip(plugin, dtype)
    m, k, n = mkn
    rng = np.random.default_rng(5)
    a = rng.integers(-50, 50, (m, k)).astype(dtype)
    b = rng.integers(-50, 50, (k, n)).astype(dtype)
    item = np.dtype(dtype).itemsize
    a_off = 0
    b_off = -(-a.nbytes // 512) * 512 + 512
    c_off = b_off + -(-b.nbytes // 512) * 512 + 512
    seg = mem(c_off + m * n * item)
    if a.size:
        seg.put(a, a_off)
    if b.size:
        seg.put(b, b_off)
    plugin.cl_kernels.matmul(0, (seg.handle, c_off), (seg.handle, a_off), (seg.handle, b_off), m, k, n, dtype)
    assert np.array_equal(seg.get(dtype, m * n, c_off).reshape(m, n), a @ b)


@needs_opencl
def test_matmul_float_is_exact_in_k_order(plugin, mem):
    """Non-integer floats: the kernel sums products in increasing k without FMA."""
    rng = np.random.default_rng(6)
    m, k, n = 8, 37, 5
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = np.zeros((m, n), np.float32)
    for kk in range(k):
        ref = ref + a[:, kk:kk + 1] * b[kk:kk + 1, :]   # product rounded, then sum rounded
    seg = mem(a.nbytes + b.nbytes + ref.nbytes + 2048)
    seg.put(a, 0)
    seg.put(b, 1024 + a.nbytes)
    c_off = 2048 + a.nbytes + b.nbytes
    plugin.cl_kernels.matmul(0, (seg.handle, c_off), (seg.handle, 0), (seg.handle, 1024 + a.nbytes), m, k, n,
                          "float32")
    assert np.array_equal(seg.get("float32", m * n, c_off).reshape(m, n), ref)


@needs_opencl
def test_kernels_on_a_stream_and_ordering(plugin, mem):
    n = 100_000
    seg = mem(3 * n * 4)
    s = plugin._stream_create(0)
    try:
        k = plugin.cl_kernels
        k.fill(0, (seg.handle, 0), n, 3, "int32", stream=s)
        k.fill(0, (seg.handle, 4 * n), n, 4, "int32", stream=s)
        k.mul(0, (seg.handle, 8 * n), (seg.handle, 0), (seg.handle, 4 * n), n, "int32", stream=s)
        k.sum(0, (seg.handle, 0), (seg.handle, 8 * n), n, "int32", stream=s)
        out = np.empty(1, np.int32)
        plugin._copy(0, out.view(np.uint8), 0, seg.handle, 0, 4, D2H, s)
        plugin._stream_synchronize(0, s)
        assert out[0] == 12 * n
    finally:
        plugin._stream_destroy(0, s)


@needs_opencl
def test_kernels_accept_an_anychip_stream(plugin):
    import anychip

    dev = anychip.device("opencl:0")
    plugin = dev.plugin  # the registry's instance: its contexts own the buffers
    s = anychip.Stream(dev)
    buf = dev.alloc(4 * 100, stream=s)
    plugin.cl_kernels.fill(0, (buf.handle, buf.offset), 100, 2.5, "float32", stream=s)
    s.synchronize()
    assert (buf.to_numpy(np.float32) == 2.5).all()
    with pytest.raises(InvalidArgumentError):
        plugin.cl_kernels.fill(0, (buf.handle, buf.offset), 1, 0, "float32", stream=object())


@needs_opencl
def test_kernel_argument_errors(plugin, mem):
    seg = mem(64)
    k = plugin.cl_kernels
    with pytest.raises(InvalidArgumentError):
        k.add(0, (seg.handle, 2), (seg.handle, 0), (seg.handle, 0), 1, "float32")
    with pytest.raises(UnsupportedError):
        k.add(0, (seg.handle, 0), (seg.handle, 0), (seg.handle, 0), 1, "float16")
    with pytest.raises(InvalidArgumentError):
        k.binary(0, "pow", (seg.handle, 0), (seg.handle, 0), (seg.handle, 0), 1, "float32")


@needs_opencl
def test_kernel_program_is_built_once_per_context(plugin):
    st = plugin._state(0)
    plugin.cl_kernels._kernel(0, "add_float32")
    program = st.program
    plugin.cl_kernels._kernel(0, "mul_int64")
    assert st.program is program and "add_float32" in st.kernels


# ---------------------------------------------------------------- kernel bounds

@pytest.fixture
def dev():
    if not _OK:
        pytest.skip(f"OpenCL unavailable: {_REASON}")
    import anychip
    return anychip.device("opencl:0")


@needs_opencl
def test_fill_past_a_buffer_is_refused_and_the_neighbour_kept(dev):
    a = dev.alloc(4096)
    b = dev.alloc(4096)                      # the neighbour in the same segment
    assert a.handle is b.handle
    b.copy_from(np.full(1024, 5, np.float32))
    k = dev.plugin.cl_kernels
    with pytest.raises(InvalidArgumentError) as info:
        k.fill(0, a, 2048, 1.0, "float32")
    assert str(info.value) == ("out: 2048 elements of 4 bytes from byte 0 need 8192 bytes, past the end of its "
                               "4096-byte allocation")
    with pytest.raises(InvalidArgumentError, match="^out: 2048 elements of 4 bytes from byte 0 need 8192 bytes, "
                                                   "past the end of its 4096-byte allocation$"):
        k.fill(0, (a.handle, a.offset, a.nbytes), 2048, 1.0, "float32")
    k.fill(0, a, 1024, 1.0, "float32")       # exactly the buffer: fine
    k.fill(0, a.view(2048), 512, 2.0, "float32")
    dev.synchronize()
    assert a.to_numpy(np.float32).tolist() == [1.0] * 512 + [2.0] * 512
    assert (b.to_numpy(np.float32) == 5).all()


@needs_opencl
def test_kernel_ranges_checked_against_raw_allocations(plugin, mem):
    seg = mem(4096)
    k = plugin.cl_kernels
    with pytest.raises(InvalidArgumentError) as info:
        k.sum(0, (seg.handle, 0), (seg.handle, 64), 10**6, "float32")
    assert str(info.value) == ("x: 1000000 elements of 4 bytes from byte 64 need 4000000 bytes, past the end of "
                               "its 4096-byte allocation")
    with pytest.raises(InvalidArgumentError, match="^out: 1 elements of 8 bytes from byte 4096 need 8 bytes"):
        k.sum(0, (seg.handle, 4096), (seg.handle, 0), 0, "float64")
    with pytest.raises(InvalidArgumentError, match=r"^b: \[0, 8192\) lies outside its 4096-byte cl.Buffer$"):
        k.add(0, (seg.handle, 0, 16), (seg.handle, 0, 16), (seg.handle, 0, 8192), 4, "int32")
    with pytest.raises(InvalidArgumentError, match="^a: 3 elements of 4 bytes from byte 4088 need 12 bytes"):
        k.matmul(0, (seg.handle, 0), (seg.handle, 4088), (seg.handle, 0), 1, 3, 1, "int32")
    with pytest.raises(InvalidArgumentError, match="^out: 2000 elements of 4 bytes from byte 0 need 8000 bytes"):
        k.cast(0, (seg.handle, 0), "int32", (seg.handle, 0), "float32", 2000)


@needs_opencl
@pytest.mark.parametrize(("call", "message"), [
    (lambda k, h: k.fill(0, (h, 0), -1, 1.0, "float32"), "n must be >= 0, got -1"),
    (lambda k, h: k.add(0, (h, 0), (h, 0), (h, 0), -1, "int32"), "n must be >= 0, got -1"),
    (lambda k, h: k.sum(0, (h, 0), (h, 0), 2.0, "int32"), "n must be an integer, got float 2.0"),
    (lambda k, h: k.matmul(0, (h, 0), (h, 0), (h, 0), 1, -2, 1, "int32"), "k must be >= 0, got -2"),
    (lambda k, h: k.fill(5, (h, 0), 1, 1.0, "float32"),
     "there is no opencl:5; the OpenCL backend has 1 device (0..0)"),
    (lambda k, h: k.supported_dtypes(5), "there is no opencl:5; the OpenCL backend has 1 device (0..0)"),
    (lambda k, h: k.fill(-1, (h, 0), 1, 1.0, "float32"),
     "there is no opencl:-1; the OpenCL backend has 1 device (0..0)"),
    (lambda k, h: k.fill("0", (h, 0), 1, 1.0, "float32"), "device index must be an int, got str '0'"),
    (lambda k, h: k.fill(0, (h, -4), 1, 1.0, "float32"), "out offset must be >= 0, got -4"),
    (lambda k, h: k.fill(0, (h, 2), 1, 1.0, "float32"), "out: offset 2 is not a multiple of the element size 4"),
    (lambda k, h: k.fill(0, (np.zeros(4), 0), 1, 1.0, "float32"), "out: ndarray is not an OpenCL buffer handle"),
    (lambda k, h: k.fill(0, h, 1, 1.0, "float32"), "out must be an anychip.Buffer, (handle, offset, nbytes) or "
                                                    "(handle, offset) of a raw allocation, got <pyopencl"),
    (lambda k, h: k.fill(0, (h, 0), 1, 2**40, "int32"), "fill value 1099511627776 cannot be a int32"),
])
def test_kernel_bad_arguments(plugin, mem, call, message):
    if plugin.device_count() != 1 and "opencl:5" in message:
        pytest.skip("the message names the device count of a one-device platform")
    seg = mem(64)
    with pytest.raises(InvalidArgumentError) as info:
        call(plugin.cl_kernels, seg.handle)
    assert str(info.value).startswith(message)


@needs_opencl
def test_kernel_refuses_a_buffer_of_another_device_or_freed(dev):
    import anychip
    k = dev.plugin.cl_kernels
    cpu = anychip.device("cpu:0").alloc(16)
    with pytest.raises(InvalidArgumentError, match="^out: a buffer of cpu:0, but the kernel runs on opencl:0$"):
        k.fill(0, cpu, 1, 1.0, "float32")
    b = dev.alloc(16)
    b.free()
    with pytest.raises(InvalidArgumentError, match="^use of a freed buffer"):
        k.fill(0, b, 1, 1.0, "float32")
