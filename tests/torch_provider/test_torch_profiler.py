"""The profiler's device time: PrivateUse1's profiler stubs over plugin.h's events
(csrc/torch/profiler.cpp), which a profile asking for the device (use_device="anychip") records
around each op; and for torch.profiler, PrivateUse1's Kineto activity profiler
(csrc/torch/kineto.cpp), which times each kernel and copy on its stream."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CHILD_SECONDS, build_template_wrapper

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


# ---- torch.profiler (Kineto): the device's activities (csrc/torch/kineto.cpp) ---------------------

def _kineto(at, program, activities=None):
    """torch.profiler.profile of program() with the CPU's and the device's activities (or those
    given), the device drained before it starts."""
    from torch.profiler import ProfilerActivity, profile
    at.synchronize()
    if activities is None:
        activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    with profile(activities=activities) as prof:
        program()
    return prof



def _device_events(prof):
    from torch.autograd import DeviceType
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _matmul_add(device="anychip:0"):
    a = torch.randn(64, 64, device=device)
    b = torch.randn(64, 64, device=device)

    def program():
        c = a @ b               # the CPU's kernel through the fallback: the device's copies
        d = c + a               # the chip's kernel (the table's binary entry)
        d.t()                   # a view: nothing on the device
        return d.cpu()
    return program


def test_torch_profiler_has_the_devices_kernels_and_copies_timed_on_their_stream(at):
    # (before: no activity profiler registered, the trace had the ops and no device activity)
    from torch.autograd import DeviceType
    program = _matmul_add()
    start = time.perf_counter_ns()
    prof = _kineto(at, program)
    wall_us = (time.perf_counter_ns() - start) / 1000
    device = _device_events(prof)
    # mm's fallback downloads its two operands and uploads its result; add is one kernel; .cpu()
    # one download: every activity on anychip 0, stream 0
    assert sorted(e.name for e in device) == ["Memcpy DtoH"] * 3 + ["Memcpy HtoD", "binary"]
    assert {(e.device_index, e.device_resource_id) for e in device} == {(0, 0)}
    assert all(e.time_range.elapsed_us() > 0 for e in device)
    assert sum(e.time_range.elapsed_us() for e in device) <= wall_us
    # the host side of each: the plugin.h call, on the CPU
    runtime = sorted(e.name for e in prof.events() if e.name in ("copy_async", "kernels.binary"))
    assert runtime == ["copy_async"] * 4 + ["kernels.binary"]
    assert all(e.time_range.elapsed_us() >= 0 for e in prof.events())
    # each op has the device time of what it enqueued (its children's included), the others none
    by_name = {e.key: e for e in prof.key_averages()}
    for op in ("aten::matmul", "aten::mm", "aten::add", "aten::to", "aten::copy_"):
        assert 0 < by_name[op].device_time_total <= wall_us, op
    assert by_name["aten::add"].self_device_time_total == by_name["aten::add"].device_time_total
    assert by_name["aten::matmul"].self_device_time_total == 0
    for op in ("aten::t", "aten::transpose", "aten::empty", "aten::as_strided"):
        assert by_name[op].device_time_total == 0 and by_name[op].self_device_time_total == 0, op
    assert all(e.device_time_total >= 0 and e.self_device_time_total >= 0 for e in prof.key_averages())
    # the kernel is linked to the op that launched it, and ran after the launch
    add = next(e for e in prof.events() if e.name == "aten::add" and e.device_type == DeviceType.CPU)
    binary = next(e for e in device if e.name == "binary")
    assert [(k.name, k.device) for k in add.kernels] == [("binary", 0)]
    assert add.kernels[0].duration == binary.time_range.elapsed_us()
    assert binary.linked_correlation_id == add.id
    launch = next(e for e in prof.events() if e.name == "kernels.binary")
    assert add.time_range.start <= launch.time_range.start <= binary.time_range.start
    # the two downloads of mm's operands belong to one op, each its own flow
    downloads = [e for e in device if e.name == "Memcpy DtoH"][:2]
    assert downloads[0].linked_correlation_id == downloads[1].linked_correlation_id
    assert downloads[0].flow_id != downloads[1].flow_id


def test_a_second_device_has_its_own_rows(at):
    from torch.autograd import DeviceType
    x = torch.ones(32, 32, device="anychip:1")
    s = torch.anychip.Stream(1)

    def program():
        with torch.anychip.stream(s):
            (x + x).cpu()
    prof = _kineto(at, program)
    device = _device_events(prof)
    assert sorted(e.name for e in device) == ["Memcpy DtoH", "binary"]
    assert {(e.device_index, e.device_resource_id) for e in device} == {(1, s.stream_id)} and s.stream_id > 0
    add = next(e for e in prof.events() if e.name == "aten::add" and e.device_type == DeviceType.CPU)
    assert [(k.name, k.device) for k in add.kernels] == [("binary", 1)]


def test_the_chrome_trace_has_the_device_rows_and_flows(at, tmp_path):
    prof = _kineto(at, _matmul_add())
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert [e["name"] for e in kernels] == ["binary"] and len(copies) == 4
    assert all(e["pid"] == 0 and e["tid"] == 0 and e["dur"] > 0 for e in kernels + copies)
    assert {e["args"]["device"] for e in kernels + copies} == {"0"}
    # the ops run in this process: the device rows are apart from the CPU's
    cpu = next(e for e in events if e.get("name") == "aten::add" and e.get("ph") == "X")
    assert cpu["pid"] != 0 and kernels[0]["args"]["External id"] == cpu["args"]["External id"]
    # one flow from each launch to its work on the device
    starts = {e["id"] for e in events if e.get("cat") == "ac2g" and e["ph"] == "s"}
    ends = {e["id"] for e in events if e.get("cat") == "ac2g" and e["ph"] == "f"}
    assert len(starts) == 5 and starts == ends
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["pid"] == 0}
    assert rows == {"anychip 0 stream 0"}
    assert all(e["dur"] >= 0 for e in events if "dur" in e)


def test_a_cpu_only_profile_records_nothing_of_the_device(at):
    from torch.profiler import ProfilerActivity
    prof = _kineto(at, _matmul_add(), activities=[ProfilerActivity.CPU])
    assert _device_events(prof) == []
    assert not any(e.name in ("copy_async", "kernels.binary") for e in prof.events())
    assert all(e.device_time_total == 0 for e in prof.key_averages())
    assert "aten::add" in {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("variant, device", [
    ("GOOD", ["Memcpy DtoH", "binary"]),       # the generated C plugin: timed events, copy_async
    ("MINIMAL", []),                            # no events at all (nor copy_async): no session
])
@pytest.mark.slow
def test_a_c_plugin_with_and_without_timed_events(tmp_path, variant, device):
    # a plugin of tests/c/plugin_variants.c, profiled in a process of its own (profile_plugin.py)
    from anychip.scaffold import new_plugin
    root = Path(__file__).parent.parent.parent
    project = new_plugin("tmpl", "c", tmp_path)
    lib = build_template_wrapper(os.environ.get("CC", "cc"), project, root / "tests" / "c" / "plugin_variants.c",
                                 tmp_path / "libtprof.so", '-DNAME="tprof"', f"-DVARIANT_{variant}",
                                 roots=(tmp_path,))
    env = {**os.environ, "ANYCHIP_TORCH": "tprof", "ANYCHIP_PLUGIN_PATH": str(lib)}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "profile_plugin.py")],
                          capture_output=True, text=True, env=env, timeout=CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["sum"] == 128.0
    assert {"aten::add", "aten::to", "aten::copy_"} <= set(result["ops"])
    assert sorted(result["device"]) == device
    assert (result["device_time"] > 0) == bool(device)
