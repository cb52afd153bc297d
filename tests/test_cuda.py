"""CUDA backend.

Without a GPU these tests cover what needs none: the reasons the backend gives
when CuPy is missing, fails to load or finds no GPU (in subprocesses, with a
stand-in ``cupy`` package on ``sys.path``); ``CUDA_VISIBLE_DEVICES`` parsing;
the CUDA error table and translation; NCCL unique-id normalisation; and the
plugin's call logic (pointers + offsets, copy kinds, current device, streams,
the CuPy allocator bridge) against ``FakeCuPy`` below, an in-memory stand-in
for the few ``cupy.cuda`` calls the backend makes. The fake proves the plugin
passes the right arguments, not that CUDA behaves: the tests marked ``gpu``
run the same paths on a real GPU (``ci/gpu-check``) and skip here with the reason.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from anychip.devices import cuda as cuda_mod
from anychip.devices.cuda import (
    CUDAPlugin,
    cuda_error_name,
    nccl_unique_id_for_cupy,
    normalize_nccl_unique_id,
    parse_cuda_visible_devices,
    translate_cuda_error,
)
from anychip.runtime.errors import DeviceError, InvalidArgumentError, OutOfMemoryError
from anychip.runtime.plugin import D2D, D2H, H2D

# ---------------------------------------------------------------- the real thing, when present

_REAL = CUDAPlugin()
_REAL_OK, _REAL_REASON = _REAL.available()
gpu = pytest.mark.skipif(not _REAL_OK, reason=f"needs a CUDA GPU with CuPy: {_REAL_REASON}")


# ---------------------------------------------------------------- a stand-in for cupy.cuda

FAKE_CUPY_SOURCE = r'''
"""Stand-in for the parts of cupy.cuda the anychip CUDA backend calls (tests only)."""
import ctypes, types, sys

__version__ = "14.0.0"
import os
COUNT = 2
CAPACITY = int(os.environ.get("FAKE_CUPY_CAPACITY", 1 << 24))


class CUDARuntimeError(RuntimeError):
    _names = {1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation", 100: "cudaErrorNoDevice",
              101: "cudaErrorInvalidDevice", 400: "cudaErrorInvalidResourceHandle"}

    def __init__(self, status):
        self.status = status
        super().__init__(f"{self._names.get(status, 'cudaErrorUnknown')}: fake error {status}")


class _Runtime(types.ModuleType):
    def __init__(self):
        super().__init__("cupy.cuda.runtime")
        self.CUDARuntimeError = CUDARuntimeError
        self.current = 0
        self.allocs = {}          # ptr -> (ctypes buffer, device, size)
        self.used = [0] * COUNT
        self.calls = []
        self.fail_count = None    # an exception to raise from getDeviceCount

    def getDeviceCount(self):
        if self.fail_count is not None:
            raise self.fail_count
        return COUNT

    def _dev(self, d):
        if not 0 <= d < COUNT:
            raise CUDARuntimeError(101)

    def getDevice(self):
        return self.current

    def setDevice(self, d):
        self._dev(d)
        self.current = d

    def getDeviceProperties(self, d):
        self._dev(d)
        return {"name": b"Fake GPU %d" % d, "totalGlobalMem": CAPACITY, "major": 9, "minor": 0,
                "multiProcessorCount": 132, "pciBusID": 0x10 + d, "pciDeviceID": 0, "pciDomainID": 0,
                "uuid": bytes(range(16))}

    def runtimeGetVersion(self):
        return 12040

    def driverGetVersion(self):
        return 12040

    def memGetInfo(self):
        return CAPACITY - self.used[self.current], CAPACITY

    def malloc(self, n):
        d = self.current
        if self.used[d] + n > CAPACITY:
            raise CUDARuntimeError(2)
        buf = ctypes.create_string_buffer(max(n, 1))
        ptr = ctypes.addressof(buf)
        self.allocs[ptr] = (buf, d, n)
        self.used[d] += n
        self.calls.append(("malloc", d, n))
        return ptr

    def free(self, ptr):
        if ptr not in self.allocs:
            raise CUDARuntimeError(1)
        buf, d, n = self.allocs.pop(ptr)
        assert d == self.current, "cudaFree with another device current"
        self.used[d] -= n
        self.calls.append(("free", d, n))

    def _check_dev_range(self, ptr, n, device):
        for base, (buf, d, size) in self.allocs.items():
            if base <= ptr and ptr + n <= base + size:
                assert d == device, f"pointer of device {d} used on device {device}"
                return
        raise CUDARuntimeError(1)

    def _check_stream(self, stream):
        s = _streams.get(stream)
        if s is not None:
            assert s.device == self.current, "stream of another device used"

    def memcpyAsync(self, dst, src, n, kind, stream):
        self._check_stream(stream)
        if kind in (1, 3):
            self._check_dev_range(dst, n, self.current)
        if kind in (2, 3):
            self._check_dev_range(src, n, self.current)
        self.calls.append(("memcpyAsync", kind, n, stream))
        ctypes.memmove(dst, src, n)

    def memcpyPeerAsync(self, dst, dst_dev, src, src_dev, n, stream):
        self._check_stream(stream)
        self._check_dev_range(dst, n, dst_dev)
        self._check_dev_range(src, n, src_dev)
        self.calls.append(("memcpyPeerAsync", dst_dev, src_dev, n))
        ctypes.memmove(dst, src, n)

    def memsetAsync(self, ptr, value, n, stream):
        self._check_stream(stream)
        self._check_dev_range(ptr, n, self.current)
        ctypes.memset(ptr, value, n)

    def deviceSynchronize(self):
        self.calls.append(("deviceSynchronize", self.current))


runtime = _Runtime()
_streams = {}


class Device:
    def __init__(self, d):
        self.id = d

    def __enter__(self):
        self._prev = runtime.current
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):
        runtime.current = self._prev


class Stream:
    _next = 0x1000

    def __init__(self, null=False, non_blocking=False):
        if null:
            self.ptr, self.device = 0, None
        else:
            Stream._next += 0x10
            self.ptr, self.device = Stream._next, runtime.current
            _streams[self.ptr] = self
        self.non_blocking = non_blocking
        self.waited = []

    done = True

    def synchronize(self):
        runtime.calls.append(("streamSynchronize", self.ptr))

    def wait_event(self, event):
        self.waited.append(event)


Stream.null = Stream(null=True)


class Event:
    _clock = 0.0

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.device = runtime.current
        self.time = None

    def record(self, stream=None):
        Event._clock += 1.5
        self.time = Event._clock

    def synchronize(self):
        pass

    @property
    def done(self):
        return True


def get_elapsed_time(a, b):
    return b.time - a.time


def alloc_pinned_memory(n):
    return bytearray(n)


class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


_allocator = None


def set_allocator(fn=None):
    global _allocator
    _allocator = fn


def get_allocator():
    return _allocator


nccl = types.ModuleType("cupy.cuda.nccl")
nccl.available = False

cuda = types.ModuleType("cupy.cuda")
for _name in ("runtime", "Device", "Stream", "Event", "get_elapsed_time", "alloc_pinned_memory",
              "UnownedMemory", "MemoryPointer", "set_allocator", "get_allocator", "nccl"):
    setattr(cuda, _name, globals()[_name])
sys.modules["cupy.cuda"] = cuda
sys.modules["cupy.cuda.runtime"] = runtime
sys.modules["cupy.cuda.nccl"] = nccl
'''


@pytest.fixture
def fake_cupy(monkeypatch):
    """Install the stand-in as ``cupy`` for this test; yields the module."""
    mod = types.ModuleType("cupy")
    for name in ("cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.nccl"):
        monkeypatch.setitem(sys.modules, name, None)   # restored (or removed) after the test
    monkeypatch.setitem(sys.modules, "cupy", mod)
    exec(compile(FAKE_CUPY_SOURCE, "<fake cupy>", "exec"), mod.__dict__)
    mod.cuda = sys.modules["cupy.cuda"]
    yield mod


@pytest.fixture
def fplugin(fake_cupy):
    p = CUDAPlugin()
    ok, reason = p.available()
    assert ok, reason
    return p


def _run(code: str, *, env_extra: dict | None = None, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(env_extra or {})
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, env=env)


# ---------------------------------------------------------------- availability (subprocesses)

def test_unavailable_when_cupy_missing():
    out = _run("""
        import sys
        sys.modules["cupy"] = None          # import cupy -> ImportError
        import anychip
        info = {b.name: b for b in anychip.backends()}["cuda"]
        assert not info.available
        print(info.reason)
    """)
    assert out.returncode == 0, out.stderr
    assert "CuPy is not installed" in out.stdout and "anychip[cuda]" in out.stdout


def test_unavailable_when_cupy_fails_to_load(tmp_path):
    pkg = tmp_path / "cupy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file: No such file or directory')\n")
    out = _run("""
        import anychip
        info = {b.name: b for b in anychip.backends()}["cuda"]
        assert not info.available
        print(info.reason)
    """, path=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "CuPy failed to load: OSError: libcudart.so.12" in out.stdout


def _write_fake_package(tmp_path, extra: str = "") -> str:
    pkg = tmp_path / "cupy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKE_CUPY_SOURCE + "\n" + textwrap.dedent(extra))
    return str(tmp_path)


def test_unavailable_when_no_gpu(tmp_path):
    path = _write_fake_package(tmp_path, "runtime.fail_count = CUDARuntimeError(100)\n")
    out = _run("""
        from anychip.devices.cuda import CUDAPlugin
        print(CUDAPlugin().available())
    """, path=path)
    assert out.returncode == 0, out.stderr
    assert "False" in out.stdout and "no usable CUDA GPU (cudaErrorNoDevice)" in out.stdout


def test_unavailable_reason_names_hiding_visible_devices(tmp_path):
    path = _write_fake_package(tmp_path, "COUNT = 0\n")
    out = _run("""
        from anychip.devices.cuda import CUDAPlugin
        ok, reason = CUDAPlugin().available()
        assert not ok
        print(reason)
    """, path=path, env_extra={"CUDA_VISIBLE_DEVICES": "-1"})
    assert out.returncode == 0, out.stderr
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in out.stdout


def test_available_with_fake_gpus(fplugin):
    ok, desc = fplugin.available()
    assert ok and "2 CUDA GPUs" in desc and "Fake GPU 0" in desc
    assert fplugin.device_count() == 2


def test_cupy_missing_in_process(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    ok, reason = CUDAPlugin().available()
    assert not ok and "CuPy is not installed" in reason


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES

@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("", []),
    ("-1", []),
    ("0", ["0"]),
    ("1,0", ["1", "0"]),
    (" 2 , 3 ", ["2", "3"]),
    ("0,2,-1,1", ["0", "2"]),
    ("0,x,1", ["0"]),
    ("1,1,2", ["1"]),
    ("007", ["7"]),
    ("GPU-8f2a1c3e-aaaa-bbbb-cccc-0123456789ab,1",
     ["GPU-8f2a1c3e-aaaa-bbbb-cccc-0123456789ab", "1"]),
    ("MIG-GPU-1/2/0", ["MIG-GPU-1/2/0"]),
    ("GPU-", []),
])
def test_parse_cuda_visible_devices(value, expected):
    assert parse_cuda_visible_devices(value) == expected


def test_visible_devices_change_after_init_warns(fplugin, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with caplog.at_level(logging.WARNING, logger="anychip"):
        fplugin.device_count()
        fplugin.device_count()
    msgs = [r.getMessage() for r in caplog.records if "CUDA_VISIBLE_DEVICES changed" in r.getMessage()]
    assert len(msgs) == 1 and "no effect" in msgs[0]


def test_properties_record_visibility_and_nccl(fake_cupy, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    p = CUDAPlugin()
    assert p.available()[0]
    props = p.properties(1)
    assert props["name"] == "Fake GPU 1"
    assert props["cuda_visible_devices"] == "3,1"
    assert props["total_memory"] == fake_cupy.CAPACITY
    assert props["compute_capability"] == "9.0"
    assert props["pci_bus_id"] == "0000:11:00"
    assert props["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert props["nccl_available"] is False
    assert p.native_ccl() is None
    fake_cupy.cuda.nccl.available = True
    assert p.nccl_available() and p.native_ccl() is fake_cupy.cuda.nccl


# ---------------------------------------------------------------- errors

def test_error_table():
    assert cuda_error_name(2) == "cudaErrorMemoryAllocation"
    assert cuda_error_name(100) == "cudaErrorNoDevice"
    assert cuda_error_name(700) == "cudaErrorIllegalAddress"
    assert cuda_error_name(999) == "cudaErrorUnknown"
    assert cuda_error_name(4242, "cudaErrorBrandNew: something") == "cudaErrorBrandNew"
    assert cuda_error_name(4242, "not a name") == "cudaError4242"
    assert len(set(cuda_mod.CUDA_ERROR_NAMES.values())) == len(cuda_mod.CUDA_ERROR_NAMES)


class _FakeRuntimeError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__(f"{cuda_error_name(status)}: text")


def test_translate_oom():
    err = translate_cuda_error(_FakeRuntimeError(2), "cudaMalloc", device="cuda:1", requested=1 << 30,
                               mem_info=(5, 10))
    assert isinstance(err, OutOfMemoryError)
    assert err.code == 2 and err.code_name == "cudaErrorMemoryAllocation"
    assert err.requested == 1 << 30 and err.free == 5 and err.total == 10 and err.backend == "cuda"
    assert "cuda:1" in str(err)


@pytest.mark.parametrize("status", [1, 101, 400, 700, 719])
def test_translate_other_errors(status):
    err = translate_cuda_error(_FakeRuntimeError(status), "cudaMemcpyAsync", device="cuda:0")
    assert type(err) is DeviceError
    assert err.code == status and err.code_name == cuda_mod.CUDA_ERROR_NAMES[status]
    assert "cudaMemcpyAsync failed on cuda:0" in str(err)
    assert ("unusable" in str(err)) == (status in (700, 719))


def test_translate_without_status():
    err = translate_cuda_error(ValueError("odd"), "cudaFree")
    assert type(err) is DeviceError and err.code is None


def test_plugin_oom_from_malloc(fplugin, fake_cupy):
    with pytest.raises(OutOfMemoryError) as ei:
        fplugin._malloc(1, fake_cupy.CAPACITY + 1)
    err = ei.value
    assert err.code_name == "cudaErrorMemoryAllocation" and err.total == fake_cupy.CAPACITY
    assert err.requested == fake_cupy.CAPACITY + 1 and "cuda:1" in str(err)


def test_plugin_translates_bad_free(fplugin):
    with pytest.raises(DeviceError) as ei:
        fplugin._free(0, 12345)
    assert ei.value.code_name == "cudaErrorInvalidValue"


# ---------------------------------------------------------------- NCCL unique id

def _signed(b: bytes) -> tuple:
    return tuple(x - 256 if x > 127 else x for x in b)


def test_unique_id_from_bytes_and_tuple():
    raw = bytes(range(128))[::-1]
    assert normalize_nccl_unique_id(raw) == raw
    assert normalize_nccl_unique_id(bytearray(raw)) == raw
    assert normalize_nccl_unique_id(_signed(raw)) == raw          # CuPy < 14: signed chars
    assert normalize_nccl_unique_id(list(raw)) == raw             # unsigned ints accepted too


@pytest.mark.parametrize("bad", [b"short", tuple(range(127)), (300,) * 128, "x" * 128, None, (1.5,) * 128])
def test_unique_id_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        normalize_nccl_unique_id(bad)


def test_unique_id_back_to_cupy_shape():
    raw = bytes((i * 37) % 256 for i in range(128))
    assert nccl_unique_id_for_cupy(raw, cupy_version="14.0.1") == raw
    old = nccl_unique_id_for_cupy(raw, cupy_version="13.3.0")
    assert old == _signed(raw) and all(-128 <= v <= 127 for v in old)
    assert nccl_unique_id_for_cupy(raw, like=(0,) * 128) == _signed(raw)
    assert nccl_unique_id_for_cupy(raw, like=b"") == raw
    # round trip through the old shape
    assert normalize_nccl_unique_id(nccl_unique_id_for_cupy(raw, cupy_version="12.0")) == raw


# ---------------------------------------------------------------- plugin logic against the fake

def test_malloc_free_on_the_right_device(fplugin, fake_cupy):
    rt = fake_cupy.cuda.runtime
    h = fplugin._malloc(1, 4096)
    assert rt.allocs[h][1] == 1 and rt.current == 0           # device restored after the call
    assert fplugin._mem_info(1) == (fake_cupy.CAPACITY - 4096, fake_cupy.CAPACITY)
    assert fplugin._pointer(h, 100) == h + 100
    fplugin._free(1, h)
    assert ("free", 1, 4096) in rt.calls


def test_copies_use_offsets_and_kinds(fplugin, fake_cupy):
    rt = fake_cupy.cuda.runtime
    s = fplugin._stream_create(1)
    a, b = fplugin._malloc(1, 1024), fplugin._malloc(1, 1024)
    data = np.arange(256, dtype=np.uint8)
    fplugin._copy(1, a, 100, data, 10, 200, H2D, s)
    fplugin._copy(1, b, 7, a, 100, 200, D2D, s)
    out = np.zeros(300, np.uint8)
    fplugin._copy(1, out, 50, b, 7, 200, D2H, s)
    fplugin._stream_synchronize(1, s)
    np.testing.assert_array_equal(out[50:250], data[10:210])
    assert not out[:50].any() and not out[250:].any()
    kinds = [c[1] for c in rt.calls if c[0] == "memcpyAsync"]
    assert kinds == [1, 3, 2]
    assert all(c[3] == s.ptr for c in rt.calls if c[0] == "memcpyAsync")
    fplugin._memset(1, a, 3, 0xCD, 5, s)
    fplugin._copy(1, out, 0, a, 0, 10, D2H, s)
    assert out[:10].tolist() == [0, 0, 0] + [0xCD] * 5 + [0, 0]
    fplugin._copy(1, a, 0, data, 0, 0, H2D, s)                 # zero bytes: no call
    with pytest.raises(InvalidArgumentError):
        fplugin._copy(1, a, 0, data, 0, 1, "h2h", s)


def test_peer_copy(fplugin):
    a, b = fplugin._malloc(0, 64), fplugin._malloc(1, 64)
    s = fplugin._stream_create(0)
    fplugin._copy(0, a, 0, np.arange(64, dtype=np.uint8), 0, 64, H2D, s)
    fplugin._copy_peer(1, b, 16, 0, a, 8, 32, s)
    out = np.zeros(64, np.uint8)
    s1 = fplugin._default_stream(1)
    fplugin._copy(1, out, 0, b, 0, 64, D2H, s1)
    np.testing.assert_array_equal(out[16:48], np.arange(8, 40, dtype=np.uint8))


def test_default_stream_is_the_legacy_stream_per_device(fplugin):
    s0, s1 = fplugin._default_stream(0), fplugin._default_stream(1)
    assert s0.ptr == 0 and s1.ptr == 0 and s0 is not s1 and s0.index == 0 and s1.index == 1
    assert fplugin._default_stream(0) is s0
    fplugin._stream_destroy(0, s0)                           # ignored
    assert s0.cupy_stream is not None


def test_streams_and_events(fplugin, fake_cupy):
    s = fplugin._stream_create(1)
    assert s.cupy_stream.non_blocking and s.cupy_stream.device == 1
    e0, e1 = fplugin._event_create(1), fplugin._event_create(1)
    assert e0.device == 1
    fplugin._event_record(1, e0, s)
    fplugin._event_record(1, e1, s)
    assert fplugin._event_query(1, e1)
    fplugin._event_synchronize(1, e1)
    assert fplugin._event_elapsed_ms(1, e0, e1) == pytest.approx(1.5)
    s2 = fplugin._stream_create(1)
    fplugin._stream_wait_event(1, s2, e1)
    assert s2.cupy_stream.waited == [e1]
    assert fplugin._stream_query(1, s2)
    fplugin._stream_destroy(1, s2)
    assert s2.cupy_stream is None
    fplugin._synchronize(1)
    assert ("deviceSynchronize", 1) in fake_cupy.cuda.runtime.calls


def test_pinned_empty(fplugin):
    arr = fplugin.pinned_empty(100)
    assert arr.dtype == np.uint8 and arr.size == 100 and arr.flags.writeable


def test_cupy_allocator_bridge(fake_cupy, monkeypatch):
    """The bridge hands CuPy memory from anychip's caching allocator (front end + fake CuPy)."""
    import anychip

    if not _front_end_allocates():
        pytest.skip("the caching allocator (anychip.runtime.allocator) is not in this tree yet")
    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    anychip.runtime.registry.reset()
    try:
        previous = cuda_mod.use_anychip_allocator_for_cupy()
        assert previous is None
        alloc = fake_cupy.cuda.get_allocator()
        fake_cupy.cuda.runtime.current = 1
        mp = alloc(1000)
        buf = mp.mem.owner
        assert isinstance(buf, anychip.Buffer) and buf.device.name == "cuda:1"
        assert mp.ptr == buf.ptr and mp.mem.size == 1000 and mp.mem.device_id == 1
        stats = buf.device.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 1000
        del mp, buf
        import gc

        gc.collect()
        assert anychip.device("cuda:1").memory_stats()["allocated_bytes.all.current"] == 0
        empty = alloc(0)
        assert empty.ptr == 0 and empty.mem.owner is None
        with pytest.raises(InvalidArgumentError):
            cuda_mod.use_anychip_allocator_for_cupy("cpu:0")
        cuda_mod.use_anychip_allocator_for_cupy(0)
        fake_cupy.cuda.runtime.current = 1
        assert fake_cupy.cuda.get_allocator()(64).mem.owner.device.name == "cuda:0"
    finally:
        fake_cupy.cuda.runtime.current = 0
        anychip.runtime.registry.reset()


def test_device_api_body_on_the_stand_in(tmp_path):
    """The shared device-API tests (front end + allocator) drive this plugin end to end;
    two stand-in GPUs, so cross-device copies take the peer path."""
    body = os.path.join(os.path.dirname(__file__), "test_device_api.py")
    if not os.path.exists(body):
        pytest.skip("tests/test_device_api.py is not in this tree")
    path = _write_fake_package(tmp_path)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, ANYCHIP_DEVICES="cuda", FAKE_CUPY_CAPACITY=str(1 << 30),
               PYTHONPATH=path + os.pathsep + repo)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", body],
                         capture_output=True, text=True, timeout=120, env=env, cwd=repo)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 10, out.stdout[-2000:]


def _front_end_allocates() -> bool:
    try:
        import anychip.runtime.allocator  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- on a real GPU

@gpu
def test_gpu_roundtrip_and_offsets():
    p = _REAL
    s = p._stream_create(0)
    h = p._malloc(0, 1 << 20)
    try:
        data = np.random.default_rng(0).integers(0, 256, 1 << 19, dtype=np.uint8)
        p._copy(0, h, 4096, data, 0, data.size, H2D, s)
        p._memset(0, h, 0, 7, 4096, s)
        out = np.empty((1 << 19) + 4096, np.uint8)
        p._copy(0, out, 0, h, 0, out.size, D2H, s)
        p._stream_synchronize(0, s)
        assert (out[:4096] == 7).all()
        np.testing.assert_array_equal(out[4096:], data)
    finally:
        p._free(0, h)
        p._stream_destroy(0, s)


@gpu
def test_gpu_events_and_oom():
    p = _REAL
    s = p._stream_create(0)
    e0, e1 = p._event_create(0), p._event_create(0)
    h = p._malloc(0, 64 << 20)
    p._event_record(0, e0, s)
    p._memset(0, h, 0, 1, 64 << 20, s)
    p._event_record(0, e1, s)
    p._event_synchronize(0, e1)
    assert p._event_query(0, e1) and p._event_elapsed_ms(0, e0, e1) >= 0
    p._free(0, h)
    free, total = p._mem_info(0)
    with pytest.raises(OutOfMemoryError) as ei:
        p._malloc(0, total * 4)
    assert ei.value.code_name == "cudaErrorMemoryAllocation"


@gpu
def test_gpu_cupy_bridge_shares_the_pool():
    import cupy

    import anychip

    previous = cuda_mod.use_anychip_allocator_for_cupy("cuda:0")
    try:
        dev = anychip.device("cuda:0")
        before = dev.memory_stats()["allocated_bytes.all.current"]
        with cupy.cuda.Device(0):
            x = cupy.arange(1 << 20, dtype=cupy.float32)
            assert float(x.sum()) == float(np.arange(1 << 20, dtype=np.float32).sum(dtype=np.float64))
        assert dev.memory_stats()["allocated_bytes.all.current"] >= before + x.nbytes
        del x
        import gc

        gc.collect()
        assert dev.memory_stats()["allocated_bytes.all.current"] == before
    finally:
        cupy.cuda.set_allocator(previous)


@gpu
def test_gpu_nccl_unique_id_shape():
    p = _REAL
    if not p.nccl_available():
        pytest.skip("CuPy has no NCCL here")
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    raw = normalize_nccl_unique_id(uid)
    assert len(raw) == 128
    again = nccl_unique_id_for_cupy(raw, like=uid)
    assert again == uid
