"""The profiler's device time (csrc/torch/profiler.cpp): PrivateUse1's profiler stubs over
plugin.h's events, which a profile asking for the device (use_device="anychip") records around
each op."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


def _profile(at, **kw):
    from torch.autograd.profiler import profile
    a = torch.randn(256, 256, device="anychip")
    b = torch.randn(256, 256, device="anychip")
    at.synchronize()
    with profile(use_device="anychip", **kw) as prof:
        for _ in range(3):
            c = a @ b           # (the CPU's kernel, through the fallback)
            d = c + a           # (the chip's kernel)
            d.relu_()
        at.synchronize()
    return prof


def test_each_op_on_the_device_has_device_time_and_no_duration_is_negative(at):
    # (before: no stubs registered, so the ops' device events were never recorded and every
    # duration came from two clocks: aten::randn from 7.4e15 to 1.2e6 us)
    prof = _profile(at)
    events = prof.function_events
    assert all(e.time_range.elapsed_us() >= 0 for e in events)
    by_name = {e.key: e for e in prof.key_averages()}
    for op in ("aten::mm", "aten::add", "aten::relu_"):
        assert by_name[op].count == 3
        assert by_name[op].device_time_total > 0, op
        assert by_name[op].device_time_total >= 0 and by_name[op].self_device_time_total >= 0
    # each device op has its kernel: the device time between its start and end events
    adds = [e for e in events if e.name == "aten::add"]
    assert len(adds) == 3 and all(len(e.kernels) == 1 and e.kernels[0].duration > 0 for e in adds)
    # the table has the device columns (torch names them after the backend)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self ANYCHIP" in table and "aten::mm" in table


def test_the_chrome_trace_parses(at, tmp_path):
    prof = _profile(at)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len([e for e in events if e.get("name") == "aten::mm" and e.get("ph") == "X"]) == 3
    assert all(e["dur"] >= 0 for e in events if "dur" in e)


def test_two_devices_and_a_plain_profile(at):
    # an op on anychip:1 is timed on anychip:1's stream; a CPU-only profile records no device time
    from torch.autograd.profiler import profile
    x1 = torch.randn(64, 64, device="anychip:1")
    with profile(use_device="anychip") as prof:
        (x1 + x1).cpu()
    add = next(e for e in prof.key_averages() if e.key == "aten::add")
    assert add.device_time_total > 0
    with profile() as plain:
        (x1 + x1).cpu()
    assert all(e.device_time_total == 0 for e in plain.key_averages())
