"""The device API, one body run against every selected device (cpu, opencl, the
simulated vendor chips, cuda where present). Nothing here knows the backend."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import anychip
from anychip import InvalidArgumentError, OutOfMemoryError


@pytest.mark.parametrize("nbytes", [1, 511, 512, 4096, (1 << 20) + 3])
def test_roundtrip_sizes(device, nbytes):
    data = (np.arange(nbytes, dtype=np.uint32) * 2654435761 >> 13).astype(np.uint8)
    buf = device.alloc(nbytes)
    assert buf.nbytes == nbytes and buf.device is device
    buf.copy_from(data)
    np.testing.assert_array_equal(buf.to_numpy(), data)
    buf.free()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"])
def test_roundtrip_dtypes(device, dtype):
    data = (np.arange(1000) - 500).astype(dtype)
    buf = device.alloc(data.nbytes).copy_from(data)
    out = buf.to_numpy(dtype, (10, 100))
    assert out.dtype == np.dtype(dtype) and out.shape == (10, 100)
    np.testing.assert_array_equal(out.reshape(-1), data)


def test_zero_size(device):
    buf = device.alloc(0)
    assert buf.nbytes == 0
    assert buf.to_numpy().shape == (0,)
    buf.copy_from(np.empty(0, np.uint8))
    buf.free()


def test_copies_with_offsets(device):
    src = np.arange(256, dtype=np.uint8)
    buf = device.alloc(1024)
    buf.memset(0)
    buf.copy_from(src, 100, offset=300, src_offset=50)          # host[50:150] -> buf[300:400]
    out = buf.to_numpy()
    np.testing.assert_array_equal(out[300:400], src[50:150])
    assert not out[:300].any() and not out[400:].any()
    host = np.full(64, 7, np.uint8)
    buf.copy_to(host, 16, offset=310, dst_offset=8)              # buf[310:326] -> host[8:24]
    np.testing.assert_array_equal(host[8:24], src[60:76])
    assert (host[:8] == 7).all() and (host[24:] == 7).all()


def test_device_to_device_and_views(device):
    a = device.alloc(4096).copy_from(np.arange(1024, dtype=np.int32))
    b = device.alloc(4096)
    b.memset(0xFF)
    anychip.copy(b, a, 400, dst_offset=1000, src_offset=40)
    out = b.to_numpy()
    np.testing.assert_array_equal(out[1000:1400], np.arange(1024, dtype=np.int32).view(np.uint8)[40:440])
    assert (out[:1000] == 0xFF).all() and (out[1400:] == 0xFF).all()
    v = a.view(400, 40)
    np.testing.assert_array_equal(v.to_numpy(np.int32), np.arange(100, 110, dtype=np.int32))
    v.memset(0)
    assert a.to_numpy(np.int32)[99:111].tolist() == [99] + [0] * 10 + [110]
    with pytest.raises(InvalidArgumentError, match="free the buffer it views"):
        v.free()
    a.free()
    with pytest.raises(InvalidArgumentError, match="use of a freed buffer"):
        v.to_numpy()


def test_memset(device):
    buf = device.alloc(1000)
    buf.memset(0xAB)
    buf.memset(1, 10, offset=5)
    out = buf.to_numpy()
    assert (out[5:15] == 1).all() and (out[:5] == 0xAB).all() and (out[15:] == 0xAB).all()
    s = anychip.Stream(device)
    buf.memset(3, stream=s)
    s.synchronize()
    assert (buf.to_numpy() == 3).all()


def test_stream_order(device):
    """h2d, d2d, memset and d2h queued on one stream run in order."""
    s = anychip.Stream(device)
    n = 1 << 16
    data = np.arange(n, dtype=np.uint8)
    a, b = device.alloc(n, stream=s), device.alloc(n, stream=s)
    host = np.zeros(n, np.uint8)
    a.copy_from(data, stream=s)
    anychip.copy(b, a, stream=s)
    a.memset(0, stream=s)
    b.copy_to(host, stream=s)
    s.synchronize()
    assert s.query()
    np.testing.assert_array_equal(host, data)
    assert not a.to_numpy().any()


def test_async_copy_keeps_host_memory_alive(device):
    s = anychip.Stream(device)
    buf = device.alloc(1 << 20)
    buf.copy_from(np.full(1 << 20, 9, np.uint8), stream=s)      # the temporary must outlive the copy
    gc.collect()
    s.synchronize()
    assert (buf.to_numpy() == 9).all()


def test_events_and_cross_stream_wait(device):
    s1, s2 = anychip.Stream(device), anychip.Stream(device)
    n = 1 << 20
    a, b = device.alloc(n), device.alloc(n)
    start = anychip.Event(device).record(s1)
    a.copy_from(np.full(n, 5, np.uint8), stream=s1)
    done = s1.record_event()
    s2.wait_event(done)
    anychip.copy(b, a, stream=s2)
    end = s2.record_event()
    end.synchronize()
    assert done.query() and end.query()
    assert (b.to_numpy() == 5).all()
    ms = start.elapsed_ms(done)
    assert 0.0 <= ms < 60_000
    with pytest.raises(InvalidArgumentError, match="both events recorded"):
        anychip.Event(device).elapsed_ms(end)


def test_current_device_and_stream(device):
    with device:
        assert anychip.current_device() is device
        s = anychip.Stream()
        assert s.device is device
        assert anychip.current_stream() is device.default_stream
        with s:
            assert anychip.current_stream() is s
            assert device.current_stream() is s
        assert anychip.current_stream() is device.default_stream


def test_memory_accounting(device):
    stats0 = device.memory_stats()
    buf = device.alloc(3000)
    stats = device.memory_stats()
    assert stats["allocated_bytes.all.current"] - stats0["allocated_bytes.all.current"] == 3072
    assert stats["allocation.all.current"] - stats0["allocation.all.current"] == 1
    buf.free()
    assert device.memory_stats()["allocated_bytes.all.current"] == stats0["allocated_bytes.all.current"]
    device.empty_cache()
    free, total = device.mem_info()
    assert 0 <= free <= total and total > 0
    props = device.properties
    assert props["total_memory"] > 0 and props["name"]
    assert props["backend"] == device.backend


def test_out_of_memory_is_clear_and_recoverable(device):
    free, total = device.mem_info()
    with pytest.raises(OutOfMemoryError) as info:
        device.alloc(total * 4)
    err = info.value
    assert err.requested == total * 4
    assert "out of memory" in str(err) and device.name in str(err)
    buf = device.alloc(4096).copy_from(np.ones(4096, np.uint8))   # the allocator still works
    assert buf.to_numpy().sum() == 4096


def test_bad_arguments(device):
    buf = device.alloc(100)
    with pytest.raises(InvalidArgumentError, match="runs past the end of the 100-byte destination"):
        buf.copy_from(np.zeros(200, np.uint8))
    with pytest.raises(InvalidArgumentError, match="runs past the end of the 100-byte source"):
        buf.copy_to(np.zeros(200, np.uint8), 101)
    with pytest.raises(InvalidArgumentError, match="nbytes must be >= 0"):
        device.alloc(-1)
    with pytest.raises(InvalidArgumentError, match="nbytes must be an integer"):
        device.alloc(1.5)
    with pytest.raises(InvalidArgumentError, match="byte 0..255"):
        buf.memset(256)
    with pytest.raises(InvalidArgumentError, match="range \\[90, 110\\) runs past the end"):
        buf.memset(0, 20, offset=90)
    with pytest.raises(InvalidArgumentError, match="must be C-contiguous"):
        buf.copy_to(np.zeros((20, 20), np.uint8)[:, :5])
    with pytest.raises(InvalidArgumentError, match="read-only"):
        buf.copy_to(np.frombuffer(b"x" * 100, np.uint8))
    with pytest.raises(InvalidArgumentError, match="at least one anychip.Buffer"):
        anychip.copy(np.zeros(4), np.zeros(4))
    with pytest.raises(InvalidArgumentError, match="view \\[50, 150\\) lies outside"):
        buf.view(50, 100)
    buf.free()
    with pytest.raises(InvalidArgumentError, match="double free"):
        buf.free()
    with pytest.raises(InvalidArgumentError, match="use of a freed buffer"):
        buf.copy_from(b"abc")
    s = anychip.Stream(device)
    s.destroy()
    with pytest.raises(InvalidArgumentError, match="was destroyed"):
        device.alloc(10).copy_from(b"abc", stream=s)
    with pytest.raises(InvalidArgumentError, match="default stream of a device cannot be destroyed"):
        device.default_stream.destroy()


def test_bytes_like_sources(device):
    buf = device.alloc(8)
    buf.copy_from(b"anychip!")
    assert buf.to_numpy().tobytes() == b"anychip!"
    ba = bytearray(8)
    buf.copy_to(ba)
    assert bytes(ba) == b"anychip!"


def test_record_stream_and_reuse(device):
    s = anychip.Stream(device)
    buf = device.alloc(1 << 16)
    buf.record_stream(s)
    buf.copy_from(np.ones(1 << 16, np.uint8), stream=s)
    buf.free()
    s.synchronize()
    again = device.alloc(1 << 16)
    again.copy_from(np.full(1 << 16, 2, np.uint8))
    assert (again.to_numpy() == 2).all()


def test_stream_of_another_device_is_refused(device):
    others = [d for d in anychip.devices() if d is not device]
    if not others:
        pytest.skip("needs a second selected device")
    s = anychip.Stream(others[0])
    with pytest.raises(InvalidArgumentError, match=f"pass a Stream of {device.name}"):
        device.alloc(16, stream=s)
    buf = device.alloc(16)
    with pytest.raises(InvalidArgumentError, match="cannot run work of"):
        buf.copy_from(b"x" * 16, stream=s)


def test_copy_to_every_other_device(device):
    """Device-to-device copies across backends (staged through the host) and
    across devices of one backend (peer copy where the backend has it)."""
    data = np.arange(5000, dtype=np.uint16)
    src = device.alloc(data.nbytes).copy_from(data)
    targets = [d for d in anychip.devices() if d is not device][:6]
    if not targets:
        pytest.skip("needs a second selected device")
    for other in targets:
        dst = other.alloc(data.nbytes + 10)
        dst.memset(0)
        anychip.copy(dst, src, dst_offset=10)
        np.testing.assert_array_equal(dst.to_numpy(np.uint16, offset=10), data)
        back = device.alloc(data.nbytes)
        anychip.copy(back, dst, data.nbytes, src_offset=10)
        np.testing.assert_array_equal(back.to_numpy(np.uint16), data)
