"""The ascend / kunlun / hygon backends on the simulator, through their raw methods.

Every failure must come back as an anychip error carrying the vendor's own code
name; asynchrony is checked with the simulator's hold/release control, never with
sleeps.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from anychip.chips.ascend import AscendPlugin
from anychip.chips.hygon import HygonPlugin
from anychip.chips.kunlun import KunlunPlugin
from anychip.runtime.errors import DeviceError, OutOfMemoryError, UnsupportedError
from anychip.runtime.plugin import D2D, D2H, H2D

PLUGINS = {"ascend": AscendPlugin, "kunlun": KunlunPlugin, "hygon": HygonPlugin}

# the vendor code name each failure must carry
BAD_FREE = {"ascend": "ACL_ERROR_RT_PARAM_INVALID", "kunlun": "XPUERR_INVALID_PARAM",
            "hygon": "hipErrorInvalidValue"}
OUT_OF_RANGE = {"ascend": "ACL_ERROR_RT_PARAM_INVALID", "kunlun": "XPUERR_INVALID_PARAM",
                "hygon": "hipErrorInvalidValue"}
DEAD_STREAM = {"ascend": "ACL_ERROR_RT_INVALID_HANDLE", "kunlun": "XPUERR_USEAFCLOSE",
               "hygon": "hipErrorInvalidHandle"}
DEAD_EVENT = {"ascend": "ACL_ERROR_RT_INVALID_HANDLE", "kunlun": "XPUERR_INVALID_PARAM",
              "hygon": "hipErrorInvalidHandle"}
OOM = {"ascend": "ACL_ERROR_RT_MEMORY_ALLOCATION", "kunlun": "XPUERR_NOMEM", "hygon": "hipErrorOutOfMemory"}
ASYNC_FAULT = {"ascend": "ACL_ERROR_RT_SYS_DMA", "kunlun": "XPUERR_DMAABORT", "hygon": "hipErrorIllegalAddress"}


@pytest.fixture(params=sorted(PLUGINS))
def plugin(request):
    p = PLUGINS[request.param]()
    ok, reason = p.available()
    if not ok:
        pytest.skip(f"{request.param} unavailable: {reason}")
    if not p.simulated:
        pytest.skip(f"{request.param} runs on the vendor's library; these tests need the simulator")
    return p


@pytest.fixture
def stream(plugin):
    s = plugin._stream_create(0)
    yield s
    try:
        plugin._stream_destroy(0, s)
    except DeviceError:
        pass


def pattern(n: int, seed: int = 1) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) >> 7).astype(np.uint8)


def test_identity(plugin):
    ok, reason = plugin.available()
    assert ok and "simulated" in reason and plugin.library_path in reason
    assert plugin.device_count() >= 1
    props = plugin.properties(0)
    assert props["simulated"] is True and props["total_memory"] > 0 and props["name"]
    free, total = plugin._mem_info(0)
    assert 0 < free <= total == props["total_memory"]


def test_roundtrip_offsets_and_d2d(plugin, stream):
    n = (1 << 20) + 77
    a, b = plugin._malloc(0, n), plugin._malloc(0, n)
    data = pattern(n)
    out = np.zeros(n + 10, np.uint8)
    plugin._copy(0, a, 0, data, 0, n, H2D, stream)
    plugin._copy(0, b, 5, a, 0, n - 5, D2D, stream)
    plugin._copy(0, out, 10, b, 5, n - 5, D2H, stream)
    plugin._stream_synchronize(0, stream)
    assert np.array_equal(out[10:n + 5], data[:n - 5])
    assert plugin._pointer(a, 7) == a + 7
    plugin._free(0, a)
    plugin._free(0, b)


def test_memset_default_stream(plugin):
    n = 3 * (1 << 20) + 5          # more than the kunlun fallback's fill buffer
    h = plugin._malloc(0, n)
    s = plugin._default_stream(0)
    plugin._memset(0, h, 0, 0xA5, n, s)
    plugin._memset(0, h, 100, 7, 50, s)
    out = np.zeros(n, np.uint8)
    plugin._copy(0, out, 0, h, 0, n, D2H, s)
    plugin._stream_synchronize(0, s)
    expected = np.full(n, 0xA5, np.uint8)
    expected[100:150] = 7
    assert np.array_equal(out, expected)
    plugin._free(0, h)


def test_bad_free_is_a_vendor_error(plugin):
    h = plugin._malloc(0, 4096)
    with pytest.raises(DeviceError) as exc:
        plugin._free(0, h + 512)
    assert exc.value.code_name == BAD_FREE[plugin.name] and exc.value.backend == plugin.name
    assert "not at its start" in str(exc.value)
    plugin._free(0, h)
    with pytest.raises(DeviceError) as exc:
        plugin._free(0, h)                      # already freed
    assert exc.value.code_name == BAD_FREE[plugin.name]
    assert "already freed" in str(exc.value)


def test_copy_past_an_allocation(plugin, stream):
    h = plugin._malloc(0, 1000)
    host = np.zeros(2000, np.uint8)
    for call in (lambda: plugin._copy(0, host, 0, h, 0, 1001, D2H, stream),
                 lambda: plugin._copy(0, h, 500, host, 0, 501, H2D, stream),
                 lambda: plugin._copy(0, h, 0, h, 1, 1000, D2D, stream),
                 lambda: plugin._memset(0, h, 999, 0, 2, stream)):
        with pytest.raises(DeviceError) as exc:
            call()
        assert exc.value.code_name == OUT_OF_RANGE[plugin.name], exc.value
        assert "runs past the end" in str(exc.value)
    plugin._stream_synchronize(0, stream)       # nothing bad was queued
    plugin._free(0, h)


def test_destroyed_stream_and_event(plugin):
    s = plugin._stream_create(0)
    plugin._stream_destroy(0, s)
    h = plugin._malloc(0, 64)
    # a second hipStreamDestroy is clr's hipErrorContextIsDestroyed (709)
    destroy_again = "hipErrorContextIsDestroyed" if plugin.name == "hygon" else DEAD_STREAM[plugin.name]
    for call, want in ((lambda: plugin._stream_synchronize(0, s), DEAD_STREAM[plugin.name]),
                       (lambda: plugin._copy(0, h, 0, np.zeros(64, np.uint8), 0, 64, H2D, s),
                        DEAD_STREAM[plugin.name]),
                       (lambda: plugin._stream_destroy(0, s), destroy_again)):
        with pytest.raises(DeviceError) as exc:
            call()
        assert exc.value.code_name == want, exc.value
    e = plugin._event_create(0)
    plugin._event_destroy(0, e)
    with pytest.raises(DeviceError) as exc:
        plugin._event_synchronize(0, e)
    assert exc.value.code_name == DEAD_EVENT[plugin.name]
    plugin._free(0, h)


def test_out_of_memory(plugin):
    free, total = plugin._mem_info(0)
    with pytest.raises(OutOfMemoryError) as exc:
        plugin._malloc(0, total + 1)
    err = exc.value
    assert err.code_name == OOM[plugin.name] and err.requested == total + 1
    assert err.total == total and err.backend == plugin.name and isinstance(err, MemoryError)


def test_held_stream_really_is_asynchronous(plugin, stream):
    n = 1 << 16
    data = pattern(n, 3)
    dev = plugin._malloc(0, n)
    out = np.zeros(n, np.uint8)
    start, end = plugin._event_create(0), plugin._event_create(0)
    plugin.sim_hold_stream(0, stream)
    plugin._event_record(0, start, stream)
    plugin._copy(0, dev, 0, data, 0, n, H2D, stream)
    plugin._copy(0, out, 0, dev, 0, n, D2H, stream)
    plugin._event_record(0, end, stream)
    assert plugin._stream_query(0, stream) is False
    assert plugin._event_query(0, end) is False
    assert not out.any()                        # queued, not run
    plugin.sim_release_stream(0, stream)
    plugin._stream_synchronize(0, stream)
    assert plugin._stream_query(0, stream) is True
    assert plugin._event_query(0, end) is True
    assert np.array_equal(out, data)
    assert plugin._event_elapsed_ms(0, start, end) >= 0
    for e in (start, end):
        plugin._event_destroy(0, e)
    plugin._free(0, dev)


def test_cross_stream_wait_and_default_stream_hold(plugin, stream):
    n = 4096
    data = pattern(n, 9)
    a, b = plugin._malloc(0, n), plugin._malloc(0, n)
    out = np.zeros(n, np.uint8)
    default = plugin._default_stream(0)
    ev = plugin._event_create(0)
    plugin.sim_hold_stream(0, default)
    plugin._copy(0, a, 0, data, 0, n, H2D, default)
    plugin._event_record(0, ev, default)
    plugin._stream_wait_event(0, stream, ev)     # `stream` must wait for the held default stream
    plugin._copy(0, b, 0, a, 0, n, D2D, stream)
    plugin._copy(0, out, 0, b, 0, n, D2H, stream)
    assert plugin._stream_query(0, stream) is False
    plugin.sim_release_stream(0, default)
    plugin._stream_synchronize(0, stream)
    assert np.array_equal(out, data)
    plugin._synchronize(0)
    plugin._event_destroy(0, ev)
    plugin._free(0, a)
    plugin._free(0, b)


def test_destroy_drains_a_held_stream(plugin):
    n = 1 << 12
    s = plugin._stream_create(0)
    dev = plugin._malloc(0, n)
    out = np.zeros(n, np.uint8)
    data = pattern(n, 5)
    plugin.sim_hold_stream(0, s)
    plugin._copy(0, dev, 0, data, 0, n, H2D, s)
    plugin._copy(0, out, 0, dev, 0, n, D2H, s)
    plugin._stream_destroy(0, s)                 # releases, runs what was queued, then stops
    assert np.array_equal(out, data)
    plugin._free(0, dev)


def test_memory_freed_under_queued_work_is_never_written(plugin, stream):
    n = 1 << 14
    dev = plugin._malloc(0, n)
    ee = np.full(n, 0xEE, np.uint8)              # host memory must outlive the async copy
    plugin.sim_hold_stream(0, stream)
    plugin._copy(0, dev, 0, ee, 0, n, H2D, stream)
    plugin._free(0, dev)                         # the queued copy now targets freed memory
    again = plugin._malloc(0, n)                 # very likely the same address
    plugin._memset(0, again, 0, 0, n, plugin._default_stream(0))
    plugin._stream_synchronize(0, plugin._default_stream(0))
    plugin.sim_release_stream(0, stream)
    with pytest.raises(DeviceError) as exc:
        plugin._stream_synchronize(0, stream)    # the fault is reported once, at synchronize
    assert exc.value.code_name == ASYNC_FAULT[plugin.name]
    assert "freed before it ran" in str(exc.value)
    plugin._stream_synchronize(0, stream)        # and then cleared
    out = np.ones(n, np.uint8)
    plugin._copy(0, out, 0, again, 0, n, D2H, stream)
    plugin._stream_synchronize(0, stream)
    assert not out.any()                         # the new owner's memory was not touched
    plugin._free(0, again)


def test_host_callbacks_run_in_order(plugin, stream):
    from anychip.chips._adapter import _sim_controls
    ffi, lib = _sim_controls(), plugin._sim          # the simulator's controls (anychip/sim.h)
    seen = []
    n = 256
    dev = plugin._malloc(0, n)
    out = np.zeros(n, np.uint8)

    @ffi.callback("void(void *)")
    def note(arg):
        seen.append((int(ffi.cast("intptr_t", arg)), int(out[0])))

    plugin.sim_hold_stream(0, stream)
    assert lib.anychip_sim_stream_enqueue_host_fn(plugin._handle(stream), note, ffi.cast("void *", 1)) == 0
    fortytwo = np.full(n, 42, np.uint8)
    plugin._copy(0, dev, 0, fortytwo, 0, n, H2D, stream)
    plugin._copy(0, out, 0, dev, 0, n, D2H, stream)
    assert lib.anychip_sim_stream_enqueue_host_fn(plugin._handle(stream), note, ffi.cast("void *", 2)) == 0
    assert seen == []
    plugin.sim_release_stream(0, stream)
    plugin._stream_synchronize(0, stream)
    assert seen == [(1, 0), (2, 42)]
    plugin._free(0, dev)


def test_peer_copy(plugin):
    if plugin.device_count() < 2:
        pytest.skip("needs two devices")
    n = 1 << 16
    data = pattern(n, 11)
    a, b = plugin._malloc(0, n), plugin._malloc(1, n)
    s0 = plugin._default_stream(0)
    plugin._copy(0, a, 0, data, 0, n, H2D, s0)
    plugin._copy_peer(1, b, 0, 0, a, 0, n, s0)
    plugin._stream_synchronize(0, s0)
    out = np.zeros(n, np.uint8)
    s1 = plugin._default_stream(1)
    plugin._copy(1, out, 0, b, 0, n, D2H, s1)
    plugin._stream_synchronize(1, s1)
    assert np.array_equal(out, data)
    if plugin.name != "ascend":                 # HIP and XPU name both devices, so they can check them
        with pytest.raises(DeviceError):
            plugin._copy_peer(1, a, 0, 0, b, 0, n, s0)
    plugin._free(0, a)
    plugin._free(1, b)


def test_threads_keep_their_own_current_device(plugin):
    if plugin.device_count() < 2:
        pytest.skip("needs two devices")
    errors = []

    def work(index):
        try:
            for _ in range(50):
                h = plugin._malloc(index, 4096)
                s = plugin._default_stream(index)
                data = pattern(4096, index)
                out = np.zeros(4096, np.uint8)
                plugin._copy(index, h, 0, data, 0, 4096, H2D, s)
                plugin._copy(index, out, 0, h, 0, 4096, D2H, s)
                plugin._stream_synchronize(index, s)
                assert np.array_equal(out, data)
                plugin._free(index, h)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i % 2,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_simulator_controls_only_on_the_simulator(plugin):
    plugin.simulated = False
    try:
        with pytest.raises(UnsupportedError):
            plugin.sim_hold_stream(0, plugin._default_stream(0))
    finally:
        plugin.simulated = True


def test_kunlun_on_the_vendor_runtime_takes_the_fallbacks(monkeypatch, tmp_path):
    """What a real libxpurt.so offers: the adapter built for the vendor's libraries leaves out
    memset on a stream and event timing (the C plugin fallbacks serve: a fill from host copies,
    event timing unsupported) and reports the capacity as free memory. (A copy of the simulator
    under the vendor's file name stands for the vendor's runtime.)"""
    import shutil

    from anychip.runtime._libs import find_library
    (tmp_path / "lib64").mkdir()
    shutil.copy(find_library("libkunlun_sim"), tmp_path / "lib64" / "libxpurt.so")
    monkeypatch.setenv("XPU_HOME", str(tmp_path))
    p = KunlunPlugin()
    ok, reason = p.available()
    assert ok and not p.simulated and "libanychip_xpu" in p.path, reason
    assert p.t.fill_async == p.ffi.NULL and p.t.event_elapsed_ms == p.ffi.NULL
    free0, total = p._mem_info(0)
    h = p._malloc(0, 5 << 20)
    assert p._mem_info(0) == (free0, total) == (total, p.properties(0)["total_memory"])
    s = p._stream_create(0)
    p._memset(0, h, 0, 0x3C, 5 << 20, s)
    out = np.zeros(5 << 20, np.uint8)
    p._copy(0, out, 0, h, 0, out.nbytes, D2H, s)
    p._synchronize(0)
    assert (out == 0x3C).all() and p._stream_query(0, s)
    e = p._event_create(0)
    p._event_record(0, e, s)
    with pytest.raises(UnsupportedError):
        p._event_elapsed_ms(0, e, e)
    p._event_destroy(0, e)
    p._stream_destroy(0, s)
    p._free(0, h)


#: the vendor API's current-device calls (header, get, set)
CURRENT_DEVICE = {"ascend": ("acl/acl.h", "aclrtGetDevice", "aclrtSetDevice"),
                  "kunlun": ("xpu/runtime.h", "xpu_current_device", "xpu_set_device"),
                  "hygon": ("hip/hip_runtime_api.h", "hipGetDevice", "hipSetDevice")}


def test_the_backend_asks_the_library_for_the_current_device(plugin):
    """The library's current device is the thread's, shared with the application (and with
    anychip.torch and the Paddle bridge, which drive the same adapter): after the application
    switches it through the vendor API, the backend's next call on its device switches back,
    or the NULL stream and new streams land on the wrong device (docs/torch.md, "The current
    device"). The adapter asks the library; it keeps no copy of its own."""
    import cffi

    from anychip.chips._headers import cdef_of

    header, get, set_ = CURRENT_DEVICE[plugin.name]
    ffi = cffi.FFI()
    ffi.cdef(cdef_of(header))
    lib = ffi.dlopen(plugin.library_path)
    out = ffi.new(ffi.typeof(getattr(lib, get)).args[0])

    def current() -> int:
        assert getattr(lib, get)(out) == 0
        return int(out[0])

    for _ in range(2):
        plugin._mem_info(1)
        assert current() == 1
        assert getattr(lib, set_)(0) == 0 and current() == 0     # the application's switch
        plugin._mem_info(1)
        assert current() == 1


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_float32_gemm_runs_numpys_blas(name):
    """The simulator's GEMM is handed NumPy's CBLAS when the adapter loads it: the product is
    NumPy's to the bit (the simulator's own loop sums in another order: 5e-5 off here)."""
    import anychip
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 513)).astype(np.float32)
    b = rng.standard_normal((513, 33)).astype(np.float32)
    dev = anychip.device(f"{name}:0")
    got = (anychip.tensor(a, device=dev) @ anychip.tensor(b, device=dev)).numpy()
    assert np.array_equal(got, a @ b)
