"""CUDA backend.

Without a GPU these tests cover what needs none: the reasons the backend gives
when CuPy is missing, fails to load or finds no GPU (in subprocesses, with a
stand-in ``cupy`` package on ``sys.path``); ``CUDA_VISIBLE_DEVICES`` parsing;
the CUDA error table and translation; NCCL unique-id normalisation; and the
plugin's call logic (pointers + offsets, copy kinds, current device and
contexts, streams and their queries, the CuPy allocator bridge) against
``tests/devices/cupy_standin.py``, a stand-in for the parts of CuPy the backend calls
that behaves like CuPy where the backend depends on it (checked against the
real classes when CuPy is importable). The stand-in proves the plugin passes
the right arguments, not that CUDA behaves: the tests marked ``gpu`` run the
same paths on a real GPU (``ci/gpu-check``) and skip here with the reason.
"""
from __future__ import annotations

import inspect
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import CHILD_SECONDS

from anychip.chips import cuda as cuda_mod
from anychip.chips.cuda import (
    CUDAPlugin,
    cuda_error_name,
    nccl_unique_id_for_cupy,
    normalize_nccl_unique_id,
    parse_cuda_visible_devices,
    translate_cuda_error,
)
from anychip.runtime.errors import DeviceError, InvalidArgumentError, OutOfMemoryError
from anychip.runtime.plugin import D2D, D2H, H2D

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

# ---------------------------------------------------------------- the real thing, when present

_REAL = CUDAPlugin()
_REAL_OK, _REAL_REASON = _REAL.available()
gpu = pytest.mark.skipif(not _REAL_OK, reason=f"needs a CUDA GPU with CuPy: {_REAL_REASON}")


# ---------------------------------------------------------------- a stand-in for CuPy

STANDIN = Path(__file__).with_name("cupy_standin.py")
_CUPY_MODULES = ("cupy", "cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.driver", "cupy.cuda.memory",
                 "cupy.cuda.nccl")


def _load_standin(monkeypatch) -> types.ModuleType:
    """Run tests/devices/cupy_standin.py as ``cupy`` until the test ends (a real CuPy comes back after)."""
    for name in _CUPY_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    mod = types.ModuleType("cupy")
    mod.__file__ = str(STANDIN)
    sys.modules["cupy"] = mod
    exec(compile(STANDIN.read_text(), str(STANDIN), "exec"), mod.__dict__)
    return mod


@pytest.fixture
def fake_cupy(monkeypatch):
    """The stand-in as ``cupy`` for this test; yields the module."""
    yield _load_standin(monkeypatch)


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
    (pkg / "__init__.py").write_text(STANDIN.read_text() + "\n" + textwrap.dedent(extra))
    return str(tmp_path)


def test_unavailable_when_no_gpu(tmp_path):
    path = _write_fake_package(tmp_path, "runtime.fail_count = CUDARuntimeError(100)\n")
    out = _run("""
        from anychip.chips.cuda import CUDAPlugin
        print(CUDAPlugin().available())
    """, path=path)
    assert out.returncode == 0, out.stderr
    assert "False" in out.stdout and "no usable CUDA GPU (cudaErrorNoDevice)" in out.stdout


def test_unavailable_reason_names_hiding_visible_devices(tmp_path):
    path = _write_fake_package(tmp_path, "COUNT = 0\n")
    out = _run("""
        from anychip.chips.cuda import CUDAPlugin
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
    assert props["uuid"] == "GPU-8f2a1c3e-aa55-bb66-cc77-dd88ee99ff02"
    assert props["nccl_available"] is False
    assert p.native_ccl() is None
    fake_cupy.NCCL_AVAILABLE = True
    sys.modules.pop("cupy.cuda.nccl")
    del fake_cupy.cuda.nccl
    p = CUDAPlugin()
    ok, reason = p.available()
    assert ok and reason.endswith("; NCCL available")
    assert p.nccl_available() and p.native_ccl() is fake_cupy.cuda.nccl


@pytest.mark.parametrize("uuid, luid, expected", [
    (bytes.fromhex("8f2a1c3eaa00bb66cc77dd88ee99ff01"), bytes(8), None),          # a zero byte cuts it
    (bytes.fromhex("00000000000000000000000000000001"), bytes(8), None),
    (bytes.fromhex("8f2a1c3eaa55bb66cc77dd88ee99ff00"), bytes(8), None),          # 15 bytes
    (bytes.fromhex("8f2a1c3eaa55bb66cc77dd88ee99ff01"), b"\x11\x22" + bytes(6),   # runs on into luid
     "GPU-8f2a1c3e-aa55-bb66-cc77-dd88ee99ff01"),
], ids=["zero-inside", "zero-first", "zero-last", "runs-on"])
def test_uuid_as_cupy_returns_it(fake_cupy, uuid, luid, expected):
    fake_cupy.UUIDS[0], fake_cupy.LUID = uuid, luid
    assert len(fake_cupy.cuda.runtime.getDeviceProperties(0)["uuid"]) != 16
    p = CUDAPlugin()
    assert p.available()[0]
    assert p.properties(0)["uuid"] == expected


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


_STICKY = (700, 702, 710, 714, 715, 716, 717, 718, 719, 911)


@pytest.mark.parametrize("status", [1, 46, 101, 400, 600, 701, 720, 999, *_STICKY])
def test_translate_other_errors(status):
    err = translate_cuda_error(_FakeRuntimeError(status), "cudaMemcpyAsync", device="cuda:0")
    assert type(err) is DeviceError
    assert err.code == status and err.code_name == cuda_error_name(status)
    assert "cudaMemcpyAsync failed on cuda:0" in str(err)
    assert ("(the CUDA context is now unusable; restart the process)" in str(err)) == (status in _STICKY)


def test_sticky_error_names():
    assert [cuda_error_name(s) for s in (717, 718, 911)] == [
        "cudaErrorInvalidAddressSpace", "cudaErrorInvalidPc", "cudaErrorExternalDevice"]


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
    rt.setDevice(0)                                           # as a CuPy user would have
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
    rt = fake_cupy.cuda.runtime
    s = fplugin._stream_create(1)
    assert s.cupy_stream.is_non_blocking and s.cupy_stream.device_id == 1
    e0, e1 = fplugin._event_create(1), fplugin._event_create(1)
    assert rt.events[e0.ptr] == {"device": 1, "flags": 0, "time": None}     # timing on
    fplugin._event_record(1, e0, s)
    fplugin._event_record(1, e1, s)
    assert fplugin._event_query(1, e1)
    fplugin._event_synchronize(1, e1)
    assert fplugin._event_elapsed_ms(1, e0, e1) == pytest.approx(1.5)
    s2 = fplugin._stream_create(1)
    fplugin._stream_wait_event(1, s2, e1)
    assert rt.calls[-1] == ("streamWaitEvent", s2.ptr, e1.ptr)
    assert fplugin._stream_query(1, s2)
    fplugin._stream_destroy(1, s2)
    assert s2.cupy_stream is None and s2.ptr not in rt.streams        # CuPy destroyed it
    fplugin._synchronize(1)
    assert ("deviceSynchronize", 1) in fake_cupy.cuda.runtime.calls


def test_pinned_empty(fplugin, fake_cupy):
    arr = fplugin.pinned_empty(100)
    assert arr.dtype == np.uint8 and arr.size == 100 and arr.flags.writeable
    assert fake_cupy.cuda.runtime.calls[-1] == ("hostAlloc", 0, 100, 1)     # portable, on GPU 0


def test_cupy_allocator_bridge(fake_cupy, monkeypatch):
    """The bridge hands CuPy memory from anychip's caching allocator (front end + fake CuPy)."""
    import anychip

    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    anychip.runtime.registry.reset()
    try:
        before = fake_cupy.cuda.get_allocator()
        previous = cuda_mod.use_anychip_allocator_for_cupy()
        assert previous == before                                 # CuPy's pool
        alloc = fake_cupy.cuda.get_allocator()
        fake_cupy.cuda.runtime.setDevice(1)
        mp = alloc(1000)
        buf = mp.mem._owner
        assert isinstance(buf, anychip.Buffer) and buf.device.name == "cuda:1"
        assert mp.ptr == buf.ptr and mp.mem.size == 1000 and mp.mem.device_id == 1
        stats = buf.device.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 1000
        del mp, buf
        import gc

        gc.collect()
        assert anychip.device("cuda:1").memory_stats()["allocated_bytes.all.current"] == 0
        empty = alloc(0)
        assert empty.ptr == 0 and empty.mem._owner is None
        with pytest.raises(InvalidArgumentError):
            cuda_mod.use_anychip_allocator_for_cupy("cpu:0")
        cuda_mod.use_anychip_allocator_for_cupy(0)
        assert fake_cupy.cuda.get_allocator()(64).mem._owner.device.name == "cuda:0"
    finally:
        anychip.runtime.registry.reset()


def test_cupy_allocator_bridge_raises_cupys_out_of_memory(fake_cupy, monkeypatch):
    """cub.pyx and CuPy's users catch cupy.cuda.memory.OutOfMemoryError."""
    import anychip

    monkeypatch.delenv("ANYCHIP_DEVICES", raising=False)
    anychip.runtime.registry.reset()
    try:
        cuda_mod.use_anychip_allocator_for_cupy("cuda:1")
        keep = fake_cupy.cuda.get_allocator()(1 << 20)
        with pytest.raises(fake_cupy.cuda.memory.OutOfMemoryError) as ei:
            fake_cupy.cuda.get_allocator()(fake_cupy.CAPACITY)
        err = ei.value
        assert isinstance(err.__cause__, OutOfMemoryError) and str(err) == str(err.__cause__)
        assert str(err).startswith(f"out of memory on cuda:1: tried to allocate {fake_cupy.CAPACITY / 2**20:.2f} MiB")
        assert err._size == fake_cupy.CAPACITY and err._total == 1 << 20
        del keep
    finally:
        anychip.runtime.registry.reset()


# ---------------------------------------------------------------- queries, contexts, events

@pytest.mark.parametrize("kind", ["stream", "event"])
def test_queries_raise_errors_instead_of_not_done(fplugin, fake_cupy, kind):
    rt = fake_cupy.cuda.runtime
    s = fplugin._stream_create(1)
    if kind == "stream":
        handle, query, what = s, fplugin._stream_query, "cudaStreamQuery"
    else:
        handle, query, what = fplugin._event_create(1), fplugin._event_query, "cudaEventQuery"
        fplugin._event_record(1, handle, s)
    assert query(1, handle) is True
    rt.query_status[handle.ptr] = 600                          # cudaErrorNotReady
    assert query(1, handle) is False
    rt.query_status[handle.ptr] = 700                          # sticky: CuPy's done says False
    with pytest.raises(DeviceError) as ei:
        query(1, handle)
    assert ei.value.code == 700 and ei.value.code_name == "cudaErrorIllegalAddress"
    assert str(ei.value) == (f"[cuda] {what} failed on cuda:1: cudaErrorIllegalAddress: stand-in error 700 "
                             "(the CUDA context is now unusable; restart the process) (cudaErrorIllegalAddress = 700)")


def _in_new_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_new_thread_creates_no_context_on_gpu0(fplugin, fake_cupy):
    """cudaGetDevice() is 0 in a new thread; setting it back would create GPU 0's context."""
    rt = fake_cupy.cuda.runtime

    def work():
        h = fplugin._malloc(1, 4096)
        info = fplugin._mem_info(1)
        fplugin._free(1, h)
        return rt.current, info

    assert _in_new_thread(work) == (1, (fake_cupy.CAPACITY - 4096, fake_cupy.CAPACITY))
    assert rt.contexts == {1}
    assert _in_new_thread(lambda: fplugin.pinned_empty(64, 1).size) == 64
    assert rt.contexts == {1} and rt.calls[-1] == ("hostAlloc", 1, 64, 1)    # pinned, on the intended GPU


def test_exclusive_process_gpu0_does_not_hide_the_result(fplugin, fake_cupy):
    rt = fake_cupy.cuda.runtime
    rt.exclusive.add(0)                                        # held by another process
    h = _in_new_thread(lambda: fplugin._malloc(1, 512))
    assert rt.allocs[h][1] == 1 and rt.contexts == {1}
    with pytest.raises(DeviceError) as ei:                     # GPU 0 itself: a clear error
        fplugin._malloc(0, 512)
    assert ei.value.code_name == "cudaErrorDevicesUnavailable" and "cudaMalloc failed on cuda:0" in str(ei.value)


def test_failed_restore_is_logged_and_the_result_kept(fplugin, fake_cupy, monkeypatch, caplog):
    rt = fake_cupy.cuda.runtime
    rt.setDevice(0)
    set_device = rt.setDevice

    def refuse_zero(d):
        if d == 0:
            raise fake_cupy.CUDARuntimeError(700)
        set_device(d)

    monkeypatch.setattr(rt, "setDevice", refuse_zero)
    with caplog.at_level(logging.WARNING, logger="anychip"):
        h = fplugin._malloc(1, 512)
    assert rt.allocs[h][1] == 1
    assert [r.getMessage() for r in caplog.records] == [
        "cuda: could not make cuda:0 current again after cudaMalloc: cudaErrorIllegalAddress: stand-in error 700"]


def test_untimed_events(fplugin, fake_cupy):
    rt = fake_cupy.cuda.runtime
    s = fplugin._stream_create(1)
    a, b = fplugin._event_create_untimed(1), fplugin._event_create_untimed(1)
    assert rt.events[a.ptr] == {"device": 1, "flags": rt.eventDisableTiming, "time": None}
    fplugin._event_record(1, a, s)
    fplugin._event_record(1, b, s)
    assert fplugin._event_query(1, b)
    with pytest.raises(DeviceError) as ei:                     # no timing data, as in CUDA
        fplugin._event_elapsed_ms(1, a, b)
    assert ei.value.code_name == "cudaErrorInvalidResourceHandle"


def test_probe_keeps_nccl_warning_quiet_and_info_reports_it(tmp_path):
    path = _write_fake_package(tmp_path)
    out = _run("""
        import warnings
        warnings.simplefilter("always")
        from anychip.cli import main
        main(["info"])
    """, path=path)
    assert out.returncode == 0, out.stderr
    assert "nccl library could not be loaded" not in out.stderr and "Warning" not in out.stderr
    line = next(x for x in out.stdout.splitlines() if x.strip().startswith("cuda "))
    assert line.endswith("2 CUDA GPUs via CuPy 14.2.0: Fake GPU 0; Fake GPU 1; NCCL unavailable: ImportError "
                         "(libnccl.so.2: cannot open shared object file: No such file or directory); "
                         'install it with: pip install "nvidia-nccl-cu12>=2.18.1,<3"'), line


# ---------------------------------------------------------------- the stand-in against CuPy

def _names(obj) -> set:
    return {n for n in dir(obj) if not n.startswith("__")}


def test_standin_names_match_cupy(monkeypatch):
    """Every name the stand-in offers exists in the installed CuPy, with the same
    signatures and constants, and the behaviour the backend relies on holds."""
    cupy = pytest.importorskip("cupy")
    cuda = cupy.cuda
    if hasattr(cuda.runtime, "KNOBS"):
        pytest.skip("the cupy on sys.path is this stand-in")
    event = cuda.Event.__new__(cuda.Event)
    try:
        event.__init__()                     # sets ptr = 0, then needs a GPU
    except Exception:  # noqa: BLE001
        pass
    mem = cuda.UnownedMemory(0, 0, None, 0)
    real = {
        "cuda": _names(cuda), "runtime": _names(cuda.runtime), "driver": _names(cuda.driver),
        "memory": _names(cuda.memory), "Stream": _names(cuda.Stream.null), "Event": _names(event),
        "UnownedMemory": _names(mem), "MemoryPointer": _names(cuda.MemoryPointer(mem, 0)),
        "OutOfMemoryError": _names(cuda.memory.OutOfMemoryError(1, 0)),
    }
    signatures = {c: str(inspect.signature(getattr(cuda, c).__init__)) for c in ("Stream", "Event")}
    signatures["OutOfMemoryError"] = str(inspect.signature(cuda.memory.OutOfMemoryError.__init__))
    assert cuda.Stream.null.device_id == -1 and mem._owner is None
    previous = cuda.get_allocator()
    cuda.set_allocator(None)
    assert cuda.get_allocator() is cuda.memory._malloc
    cuda.set_allocator(previous)

    fake = _load_standin(monkeypatch)
    fcuda, frt = fake.cuda, fake.cuda.runtime
    fmem = fcuda.UnownedMemory(0, 0, None, 0)
    mine = {
        "cuda": _names(fcuda),
        "runtime": {n for n in _names(type(frt)) | _names(frt) if n[0] != "_"} - frt.KNOBS - _names(types.ModuleType),
        "driver": _names(fcuda.driver), "memory": _names(fcuda.memory), "Stream": _names(fcuda.Stream.null),
        "Event": _names(fcuda.Event()), "UnownedMemory": _names(fmem),
        "MemoryPointer": _names(fcuda.MemoryPointer(fmem, 0)),
        "OutOfMemoryError": _names(fcuda.memory.OutOfMemoryError(1, 0)),
    }
    for key, names in mine.items():
        assert names <= real[key], f"{key}: the stand-in has names CuPy lacks: {sorted(names - real[key])}"
    for c, sig in signatures.items():
        cls = fcuda.memory.OutOfMemoryError if c == "OutOfMemoryError" else getattr(fcuda, c)
        assert str(inspect.signature(cls.__init__)) == sig, c
    for n in ("streamDefault", "streamNonBlocking", "streamLegacy", "streamPerThread", "eventDefault",
              "eventBlockingSync", "eventDisableTiming", "eventInterprocess", "hostAllocPortable"):
        assert getattr(frt, n) == getattr(cuda.runtime, n), n


def test_real_cupy_nccl_probe_is_quiet():
    """Against the installed CuPy (no GPU needed): its NCCL warning is kept quiet and parsed."""
    cupy = pytest.importorskip("cupy")
    if hasattr(cupy.cuda.runtime, "KNOBS"):
        pytest.skip("the cupy on sys.path is this stand-in")
    out = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent("""
        from anychip.chips.cuda.interop import _load_nccl
        nccl, why = _load_nccl()
        print(nccl is not None, why, sep="|")
    """)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    loaded, why = out.stdout.strip().split("|", 1)
    if loaded == "True":
        assert why == ""
    else:
        assert re.fullmatch(r"\w+Error \(.+\); install it with: \S.*", why), why


def test_cuda_extra_works_with_only_the_driver():
    """CuPy 14's [ctk] extra brings NVRTC and the other CUDA libraries as wheels, and
    nvidia-nccl-cu12 the NCCL that CuPy looks for (what its missing-NCCL warning names)."""
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    root = Path(__file__).resolve().parent.parent.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cuda"] == ["cupy-cuda12x[ctk]>=14", "nvidia-nccl-cu12>=2.18.1,<3"]


@pytest.mark.slow
def test_device_api_body_on_the_stand_in(tmp_path):
    """The shared device-API tests (front end + allocator) drive this plugin end to end;
    two stand-in GPUs, so cross-device copies take the peer path."""
    body = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "test_device_api.py")
    path = _write_fake_package(tmp_path)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, ANYCHIP_DEVICES="cuda", FAKE_CUPY_CAPACITY=str(1 << 30),
               PYTHONPATH=path + os.pathsep + repo)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", body],
                         capture_output=True, text=True, timeout=CHILD_SECONDS, env=env, cwd=repo)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 10, out.stdout[-2000:]


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
        pinned = p.pinned_empty(4096, 0)                      # page-locked: a DMA copy each way
        pinned[:] = data[:4096]
        p._copy(0, h, 0, pinned, 0, 4096, H2D, s)
        pinned[:] = 0
        p._copy(0, pinned, 0, h, 0, 4096, D2H, s)
        p._stream_synchronize(0, s)
        np.testing.assert_array_equal(pinned, data[:4096])
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


def _kernels_unavailable() -> str | None:
    """Why CuPy cannot compile kernels here (no NVRTC), or None."""
    try:
        import cupy

        cupy.cuda.nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError, CUDA errors
        return (f"CuPy cannot compile kernels here ({type(exc).__name__}: {exc}); NVRTC comes with "
                "pip install 'cupy-cuda12x[ctk]' (CuPy 14) or a CUDA toolkit")
    return None


@gpu
def test_gpu_cupy_bridge_shares_the_pool():
    """CuPy arrays in anychip's pool, filled and read by copies (no kernel, so no NVRTC);
    out of memory raises CuPy's class."""
    import gc

    import cupy

    import anychip

    previous = cuda_mod.use_anychip_allocator_for_cupy("cuda:0")
    try:
        dev = anychip.device("cuda:0")
        before = dev.memory_stats()["allocated_bytes.all.current"]
        data = np.arange(1 << 20, dtype=np.int64)
        with cupy.cuda.Device(0):
            x = cupy.empty(data.shape, data.dtype)
            x.set(data)
            np.testing.assert_array_equal(x.get(), data)
            assert x.data.mem._owner.device.name == "cuda:0"
            assert dev.memory_stats()["allocated_bytes.all.current"] >= before + x.nbytes
            del x
            gc.collect()
            assert dev.memory_stats()["allocated_bytes.all.current"] == before
            with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as ei:
                cupy.empty(dev.mem_info()[1] * 2, cupy.uint8)
        assert isinstance(ei.value.__cause__, OutOfMemoryError) and "out of memory on cuda:0" in str(ei.value)
    finally:
        cupy.cuda.set_allocator(previous)


@gpu
def test_gpu_cupy_kernels_on_the_bridge():
    why = _kernels_unavailable()
    if why:
        pytest.skip(why)
    import cupy

    previous = cuda_mod.use_anychip_allocator_for_cupy("cuda:0")
    try:
        with cupy.cuda.Device(0):
            x = cupy.arange(1 << 20, dtype=cupy.int64)
            assert int(x.sum()) == (1 << 20) * ((1 << 20) - 1) // 2
    finally:
        cupy.cuda.set_allocator(previous)


@gpu
def test_gpu_new_thread_has_no_context_until_used():
    """What the device restore relies on: a new thread reports device 0 and no context."""
    import cupy

    p, last = _REAL, _REAL.device_count() - 1

    def work():
        fresh = (cupy.cuda.runtime.getDevice(), cupy.cuda.driver.ctxGetCurrent())
        p._free(last, p._malloc(last, 512))
        return fresh, cupy.cuda.runtime.getDevice(), cupy.cuda.driver.ctxGetCurrent() != 0

    assert _in_new_thread(work) == ((0, 0), last, True)


@gpu
def test_gpu_stream_query_and_untimed_events():
    p = _REAL
    s = p._stream_create(0)
    a, b = p._event_create_untimed(0), p._event_create_untimed(0)
    h = p._malloc(0, 1 << 20)
    try:
        p._event_record(0, a, s)
        p._memset(0, h, 0, 3, 1 << 20, s)
        p._event_record(0, b, s)
        p._stream_synchronize(0, s)
        assert p._stream_query(0, s) is True and p._event_query(0, b) is True
        with pytest.raises(DeviceError) as ei:
            p._event_elapsed_ms(0, a, b)
        assert ei.value.code_name == "cudaErrorInvalidResourceHandle"
    finally:
        p._free(0, h)
        p._stream_destroy(0, s)


@gpu
def test_gpu_uuid_matches_nvidia_smi():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    listed = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                            text=True, timeout=30).stdout.split()
    uuid = _REAL.properties(0)["uuid"]
    if uuid is None:       # only when the UUID holds a zero byte, which CuPy's bytes cut off
        assert any(0 in bytes.fromhex(u.split("-", 1)[1].replace("-", "")) for u in listed), listed
    else:
        assert uuid in listed


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


def test_fork_child_refuses_cuda_initialized_in_the_parent(fplugin, fake_cupy):
    from anychip.chips.cuda import FORK_REASON
    fplugin._after_fork_in_child()               # what the registry's at-fork hook calls in the child
    assert fplugin.available() == (False, FORK_REASON)
    assert "'spawn' start method" in FORK_REASON
    fresh = CUDAPlugin()                         # never probed in the parent: usable in the child
    fresh._after_fork_in_child()
    ok, reason = fresh.available()
    assert ok, reason
