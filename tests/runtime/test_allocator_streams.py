"""The caching allocator across streams, destroyed streams and absurd sizes, on
every selected device (and the simulator's memory limit in a fresh process)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import CHILD_SECONDS

import anychip
from anychip import InvalidArgumentError, OutOfMemoryError

KiB, MiB = 1 << 10, 1 << 20


def reserved(device) -> int:
    return device.memory_stats()["reserved_bytes.all.current"]


def settle(device) -> None:
    device.synchronize()
    device.empty_cache()


def test_blocks_freed_on_two_streams_coalesce(device):
    settle(device)
    s1, s2 = anychip.Stream(device), anychip.Stream(device)
    a, b = device.alloc(4 * KiB, stream=s1), device.alloc(4 * KiB, stream=s1)
    a.free()
    c, d = device.alloc(4 * KiB, stream=s2), device.alloc(4 * KiB, stream=s2)
    for buf in (b, c, d):
        buf.free()
    device.synchronize()
    device.empty_cache()
    stats = device.memory_stats()
    assert (stats["reserved_bytes.all.current"], stats["segment.all.current"]) == (0, 0)
    assert stats["inactive_split.all.current"] == 0


def test_destroyed_stream_gives_its_memory_back(device):
    settle(device)
    s = anychip.Stream(device)
    data = np.arange(64 * KiB, dtype=np.uint8)
    live = device.alloc(64 * KiB, stream=s).copy_from(data, stream=s)
    cached = device.alloc(4 * KiB, stream=s)
    cached.free()                                   # cached for s
    s.destroy()
    # later allocations on the device work, on any stream, and see the old memory
    other = anychip.Stream(device)
    bufs = [device.alloc(4 * KiB, stream=st) for st in (device.default_stream, other)]
    np.testing.assert_array_equal(live.to_numpy(), data)
    live.free()                                     # allocated on s: freed after s is gone
    for buf in bufs:
        buf.free()
    device.synchronize()
    device.empty_cache()
    assert reserved(device) == 0


def test_alloc_on_a_destroyed_stream_is_refused(device):
    s = anychip.Stream(device)
    s.destroy()
    with pytest.raises(InvalidArgumentError, match=r"pass a live Stream of"):
        device.alloc(512, stream=s)
    with s.__class__(device) as current:
        current.destroy()
        with pytest.raises(InvalidArgumentError, match=r"pass a live Stream of"):
            device.alloc(512)                       # the current stream, destroyed


def test_record_stream_then_destroy_that_stream(device):
    settle(device)
    s = anychip.Stream(device)
    buf = device.alloc(8 * KiB)
    buf.record_stream(s)
    s.destroy()
    buf.free()                                      # no event is recorded on the destroyed stream
    device.synchronize()
    device.empty_cache()
    assert reserved(device) == 0


@pytest.mark.parametrize("nbytes", [2**62, 2**63, 2**64, 10**30])
def test_absurd_sizes_are_out_of_memory(device, nbytes):
    with pytest.raises(OutOfMemoryError) as info:
        device.alloc(nbytes)
    err = info.value
    assert err.requested == nbytes and err.device == device.name
    assert f"{nbytes} bytes were requested: no device can hold it" in str(err)
    buf = device.alloc(4096)                        # nothing else changed
    buf.free()


def test_many_threads_then_everything_returns(device):
    settle(device)
    streams = [anychip.Stream(device) for _ in range(3)]
    errors = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        live = []
        try:
            for _ in range(300):
                if live and rng.random() < 0.45:
                    live.pop(int(rng.integers(len(live)))).free()
                else:
                    s = streams[int(rng.integers(len(streams)))]
                    n = int(rng.choice([512, 3000, 64 * KiB, MiB + 1]))
                    buf = device.alloc(n, stream=s)
                    buf.memset(seed & 0xFF, 16, stream=s)
                    live.append(buf)
            for buf in live:
                buf.free()
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    settle(device)
    stats = device.memory_stats()
    assert {k: stats[f"{k}.all.current"] for k in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                                     "segment", "inactive_split")} == dict.fromkeys(
        ("allocated_bytes", "reserved_bytes", "active_bytes", "segment", "inactive_split"), 0)


def test_buffer_of_a_numpy_size(device):
    buf = device.allocator.buffer(device, np.int64(1000), device.default_stream)
    assert (buf.nbytes, type(buf.nbytes), buf.device) == (1000, int, device)
    buf.free()
    assert buf.freed


def test_buffers_collected_in_reference_cycles_are_freed(device):
    settle(device)

    class Holder:
        pass

    for _ in range(20):
        h = Holder()
        h.me, h.buf, h.view = h, device.alloc(4096), None
        h.view = h.buf.view(0, 16)
    del h
    gc.collect()
    stats = device.memory_stats()
    assert (stats["allocated_bytes.all.current"], stats["allocation.all.current"]) == (0, 0)


def test_buffer_cannot_be_constructed_directly(capfd):
    with pytest.raises(InvalidArgumentError, match=r"cannot be constructed directly; use Device.alloc\(nbytes\)"):
        anychip.Buffer()
    assert capfd.readouterr().err == ""


SIM_MEMORY_SCRIPT = textwrap.dedent("""
    import anychip
    dev = anychip.device("ascend:0")
    s1, s2 = anychip.Stream(dev), anychip.Stream(dev)
    a, b = dev.alloc(4096, stream=s1), dev.alloc(4096, stream=s1)
    a.free()
    c, d = dev.alloc(4096, stream=s2), dev.alloc(4096, stream=s2)
    for x in (b, c, d):
        x.free()
    dev.synchronize()
    dev.empty_cache()
    print(dev.memory_stats()["reserved_bytes.all.current"])
    big = dev.alloc(64 << 20)
    print(big.nbytes)
""")


@pytest.mark.slow
def test_whole_simulated_memory_after_cross_stream_frees():
    if "ascend:0" not in [d.name for d in anychip.devices()]:
        pytest.skip("ascend:0 is not selected")
    env = dict(os.environ, ANYCHIP_SIM_MEMORY="64MiB", ANYCHIP_DEVICES="ascend:0")
    out = subprocess.run([sys.executable, "-c", SIM_MEMORY_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=CHILD_SECONDS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", str(64 << 20)]


def test_allocator_orders_reuse_with_untimed_events():
    """The allocator's events only order work; it asks for untimed ones (CUDA: disable_timing)."""
    from anychip.chips.cpu import CPUPlugin
    from anychip.runtime.device import Device
    from anychip.runtime.registry import BackendInfo

    class Counting(CPUPlugin):
        def __init__(self) -> None:
            super().__init__()
            self.created = {"timed": 0, "untimed": 0}

        def _event_create(self, index):
            self.created["timed"] += 1
            return super()._event_create(index)

        def _event_create_untimed(self, index):
            self.created["untimed"] += 1
            return CPUPlugin._event_create(self, index)

    plugin = Counting()
    dev = Device(BackendInfo("cpu", "test", loader=lambda: plugin, plugin=plugin, available=True), 0)
    other = anychip.Stream(dev)
    buf = dev.alloc(4096)
    buf.record_stream(other)            # the free must wait for an event on `other`
    buf.free()
    assert plugin.created == {"timed": 0, "untimed": 1}
