"""anychip's chips as PyTorch's PrivateUse1 device (anychip.torch, docs/torch.md).

This process binds PrivateUse1 to the simulated Ascend (one backend per process); the
other simulated chips are checked in child processes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'anychip[torch]')")

from conftest import CHILD_SECONDS, LONG_CHILD_SECONDS, LONG_TEST_SECONDS  # noqa: E402

import anychip  # noqa: E402


# the first import on a fresh machine compiles the extension (a minute or two)
@pytest.mark.timeout(LONG_TEST_SECONDS)
def test_the_extension_builds_into_the_cache_and_binds_the_ascend(at):
    from anychip.torch import _build
    assert at.backend() == "ascend"
    assert torch._C._get_privateuse1_backend_name() == "anychip"
    assert at.device_count() == len(anychip.devices("ascend"))
    assert torch.accelerator.current_accelerator() == torch.device("anychip")
    assert list(_build.cache_dir().glob(f"*/{_build.MODULE}*.so"))
    assert torch.anychip is at


@pytest.mark.slow
def test_a_second_environment_with_the_same_torch_loads_the_cached_build(at, tmp_path):
    """The build is keyed by the torch version and the sources, not by where they are installed:
    torch and anychip imported through other paths (as a second virtual environment has them)
    find this environment's build and compile nothing (the key held the paths: it recompiled)."""
    from pathlib import Path

    from anychip.torch import _build
    (tmp_path / "other").symlink_to(Path(anychip.__file__).parent.parent)
    (tmp_path / "torch").symlink_to(Path(torch.__file__).parent)
    code = textwrap.dedent("""
        from pathlib import Path
        import torch
        import anychip.torch
        from anychip.torch import _build
        print("FROM", torch.__file__, anychip.__file__)
        print("KEY", _build._key(_build._commands(Path("OUT"))))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "other"), str(tmp_path)])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["FROM"] == f"{tmp_path}/torch/__init__.py {tmp_path}/other/anychip/__init__.py"
    assert lines["KEY"] == _build._key(_build._commands(Path("OUT")))
    assert "compiling" not in done.stderr, done.stderr


def test_each_source_is_one_compile_and_the_key_covers_every_source(tmp_path, monkeypatch):
    """The build compiles each C++ file of csrc/torch as a translation unit of its own and links
    their objects; the cache key does not depend on where the sources are, and changes with any
    of them, the internal header included (a build of other sources is never loaded)."""
    import shutil
    from pathlib import Path

    from anychip.torch import _build
    here = _build.source_dir()
    assert here == Path(anychip.__file__).resolve().parents[2] / "csrc" / "torch"
    *compiles, link = _build._commands(Path("OUT"))
    assert sorted(Path(c[c.index("-c") + 1]) for c in compiles) == sorted(here.glob("*.cpp"))
    assert [a for a in link if a.endswith(".o")] == [c[c.index("-o") + 1] for c in compiles]
    key = _build._key([*compiles, link])
    copy = tmp_path / "torch"
    shutil.copytree(here, copy)
    monkeypatch.setattr(_build, "source_dir", lambda: copy)
    assert _build._key(_build._commands(Path("OUT"))) == key
    for name in ("device.h", "hooks.cpp"):
        (copy / name).write_text((copy / name).read_text() + "// changed\n")
        changed = _build._key(_build._commands(Path("OUT")))
        assert changed != key, name
        key = changed


@pytest.mark.slow
def test_a_failing_compile_says_which_command_failed_and_leaves_no_build(tmp_path):
    env = {**os.environ, "CXX": "/bin/false", "ANYCHIP_TORCH_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import anychip.torch"], capture_output=True, text=True, env=env,
                          timeout=CHILD_SECONDS)
    assert done.returncode == 1
    assert "AnychipError: compiling anychip's torch extension failed (/bin/false -O2 " in done.stderr, done.stderr
    assert re.search(r"-c \S+/torch/\w+\.cpp -o ", done.stderr), done.stderr[-2000:]
    (build,) = tmp_path.iterdir()
    assert sorted(p.name for p in build.iterdir()) == ["lock"]     # no object, no library left


def test_three_lines(at):
    x = torch.tensor([1.5, -2.0, 3.25], device="anychip")
    assert x.device == torch.device("anychip", 0)
    assert (x * 2).cpu().tolist() == [3.0, -4.0, 6.5]


def test_strided_views_and_copies_exact(at):
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    x = a.to("anychip")
    assert x.t().cpu().equal(a.t())
    assert x[1:, ::2].cpu().equal(a[1:, ::2])
    assert x.t().contiguous().cpu().equal(a.t().contiguous())
    y = torch.zeros(6, 4, device="anychip")
    y.copy_(x.t())                                  # device strided -> device dense
    assert y.cpu().equal(a.t())
    z = torch.zeros(6, 4, device="anychip").t()     # into a transposed view
    z.copy_(a)
    assert z.cpu().equal(a)
    x[:, 0] = -1.0                                  # into a column: the other elements stay
    a[:, 0] = -1.0
    assert x.cpu().equal(a)
    x[2] = torch.tensor([9.0, 8, 7, 6, 5, 4])       # host -> a row of the device tensor
    a[2] = torch.tensor([9.0, 8, 7, 6, 5, 4])
    assert x.cpu().equal(a)
    assert x.to(torch.int64).cpu().tolist() == a.to(torch.int64).tolist()
    assert x.to(torch.float16).cpu().equal(a.to(torch.float16))
    e = torch.empty(0, 3, device="anychip")
    assert e.cpu().shape == (0, 3)


def test_cross_device_copies(at):
    a = torch.arange(10, dtype=torch.float64)
    x0 = a.to("anychip:0")
    x1 = x0.to("anychip:1")
    assert x1.device == torch.device("anychip", 1)
    assert x1.cpu().equal(a)
    assert x0[::3].to("anychip:1").cpu().equal(a[::3])
    y = torch.empty(10, dtype=torch.float64, device="anychip:1")
    y.copy_(x0 * 2)
    assert y.cpu().equal(a * 2)


def test_fill_zero_and_scalars(at):
    f = torch.empty(7, dtype=torch.float32, device="anychip").fill_(2.5)
    assert f.cpu().tolist() == [2.5] * 7
    z = torch.ones(3, 3, dtype=torch.int32, device="anychip").zero_()
    assert z.cpu().tolist() == [[0] * 3] * 3
    m = torch.full((4,), -1, dtype=torch.int16, device="anychip")   # one repeated byte: a memset
    assert m.cpu().tolist() == [-1] * 4
    t = torch.zeros(3, 4, device="anychip")
    t[:, 1].fill_(5.0)
    assert t.cpu().tolist() == [[0.0, 5.0, 0.0, 0.0]] * 3
    assert torch.tensor([3.5], device="anychip").item() == 3.5
    assert torch.tensor(7, device="anychip").sum().item() == 7


def test_memory_comes_from_anychips_caching_allocator(at):
    dev = at.anychip_device(0)
    at.empty_cache()
    before = dev.memory_stats()["allocated_bytes.all.current"]
    x = torch.empty(1000, dtype=torch.float32, device="anychip")        # 4000 B, rounded to 4096
    assert at.memory_allocated() - before == 4096
    buf = dev.alloc(512)                                                 # anychip's own Buffer: same pool
    assert at.memory_allocated() - before == 4096 + 512
    assert torch.accelerator.memory_allocated(0) == at.memory_allocated()
    assert torch.accelerator.memory_stats(0)["allocated_bytes.all.current"] == at.memory_allocated()
    view = at.buffer_of(x)
    assert view.nbytes == 4000 and view.ptr == x.data_ptr()
    del x, view
    buf.free()
    assert at.memory_allocated() == before
    assert at.max_memory_allocated() >= before + 4608


def test_out_of_memory_is_torchs_error_with_anychips_message(at):
    free, total = at.mem_get_info(0)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.empty(total + (1 << 30), dtype=torch.uint8, device="anychip")


def test_streams_and_events_are_the_devices(at):
    d = torch.device("anychip:0")
    s = torch.Stream(device=d)
    assert s.device_type == 20 and s.stream_id > 0
    assert at.anychip_stream(s) is not at.anychip_device(0).default_stream
    x = torch.arange(4096, dtype=torch.float32, device=d)
    with s:
        assert torch.accelerator.current_stream(0) == s
        y = torch.empty_like(x)
        y.copy_(x)                        # a device-to-device copy enqueued on s
        x.record_stream(s)
    start = torch.Event(device=d, enable_timing=True)
    end = torch.Event(device=d, enable_timing=True)
    start.record(s)
    end.record(s)
    torch.accelerator.current_stream(0).wait_event(end)
    end.synchronize()
    assert end.query() and s.query()
    assert start.elapsed_time(end) >= 0.0
    assert y.cpu().equal(torch.arange(4096, dtype=torch.float32))
    s.synchronize()
    at.synchronize()


def _held(at, stream):
    """The simulator's hold on a stream: work queued on it waits until release."""
    plugin = at.anychip_device(0).plugin
    handle = at.anychip_stream(stream)._handle
    plugin.sim_hold_stream(0, handle)
    return lambda: plugin.sim_release_stream(0, handle)


def test_work_on_a_stream_is_asynchronous_and_events_see_it(at):
    d = torch.device("anychip:0")
    s = torch.Stream(device=d)
    x = torch.arange(1 << 14, dtype=torch.float32, device=d)
    y = torch.zeros(1 << 14, device=d)
    ev = torch.Event(device=d)
    s.wait_stream(torch.accelerator.current_stream(0))     # after x and y are written (y's fill is a memset)
    release = _held(at, s)
    try:
        with s:
            y.copy_(x)                    # device to device: enqueued, not done
        ev.record(s)
        assert not s.query() and not ev.query()
    finally:
        release()
    ev.synchronize()
    assert s.query() and ev.query()
    assert y.cpu().equal(torch.arange(1 << 14, dtype=torch.float32))


def test_record_stream_keeps_the_block_from_reuse_until_the_stream_is_done(at):
    d = torch.device("anychip:0")
    n = 3 << 16
    at.synchronize()
    at.empty_cache()                                      # no cached block but the ones made here
    x = torch.ones(n, device=d)
    ptr = x.data_ptr()
    del x
    assert torch.empty(n, device=d).data_ptr() == ptr     # freed on its stream: reused at once
    s = torch.Stream(device=d)
    x = torch.ones(n, device=d)
    ptr = x.data_ptr()
    release = _held(at, s)
    try:
        x.record_stream(s)
        del x
        y = torch.empty(n, device=d)                      # s has not reached the point: not reused
        assert y.data_ptr() != ptr
    finally:
        release()
    s.synchronize()
    del y
    at.synchronize()
    assert torch.empty(n, device=d).data_ptr() == ptr     # s is done: the block is free again


def test_pinned_memory_and_non_blocking_copies_ordered_on_the_stream(at):
    import threading
    d = torch.device("anychip:0")
    n = 1 << 14
    assert torch.empty(8, pin_memory=True).is_pinned() and not torch.empty(8).is_pinned()
    src = torch.arange(n, dtype=torch.float32).pin_memory()
    assert src.is_pinned() and src[1:].is_pinned()               # any address inside the block
    out = torch.zeros(n, pin_memory=True)
    x = torch.empty(n, device=d)
    s = torch.Stream(device=d)
    s.wait_stream(torch.accelerator.current_stream(0))
    release = _held(at, s)
    freed = threading.Event()
    try:
        with s:
            x.copy_(src, non_blocking=True)       # pinned host to device: enqueued, not waited for
            out.copy_(x, non_blocking=True)       # device to pinned host: after it, on the same stream
        assert not s.query()
        assert out.equal(torch.zeros(n))          # nothing has run yet
        src_ref = [src]
        del src

        def drop():
            src_ref.clear()                       # the last reference: its deleter waits for the copy
            freed.set()
        dropper = threading.Thread(target=drop)
        dropper.start()
        dropper.join(0.5)
        assert not freed.is_set()                 # held until the copy reading it has run
    finally:
        release()
    dropper.join()
    s.synchronize()
    assert freed.is_set()
    assert out.equal(torch.arange(n, dtype=torch.float32)) and x.cpu().equal(out)
    pageable = torch.arange(n, dtype=torch.float32) * 2
    x.copy_(pageable, non_blocking=True)          # pageable memory: copied before the call returns
    assert x.cpu().equal(pageable)
    from torch.utils.data import DataLoader, TensorDataset
    batch = next(iter(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)))[0]
    assert batch.is_pinned() and batch.equal(torch.arange(4.0))


def test_add_sub_mul_div_run_the_chips_kernels_where_they_fit_else_the_cpus(at):
    launches = lambda: at._C.kernel_launches()[0]       # noqa: E731
    assert at._C.kernel_launches()[1] is True             # the simulated Ascend has them
    d = torch.device("anychip:0")
    g = torch.Generator().manual_seed(0)
    kernel = 0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
                  torch.uint8):
        a = (torch.randn(5, 1, 7, generator=g) * 50).to(dtype)
        b = (torch.randn(3, 7, generator=g) * 50).to(dtype)      # broadcast to (5, 3, 7)
        for f in (torch.add, torch.sub, torch.mul, torch.div):
            if f is torch.div and not dtype.is_floating_point:
                continue                          # (true division of integers promotes: below)
            before = launches()
            got = f(a.to(d), b.to(d))
            assert launches() == before + 1, (dtype, f)
            assert got.cpu().equal(f(a, b)), (dtype, f)
            kernel += 1
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    xd = x.to(d)
    before = launches()
    for got, want in (((xd + 2).cpu(), x + 2),                    # a CPU scalar: filled on the device
                      ((xd.t() * xd.t()).cpu(), x.t() * x.t())):  # transposed: written in its order
        assert got.equal(want) and got.dtype == want.dtype
    assert launches() == before + 3 and (xd.t() * xd.t()).stride() == (x.t() * x.t()).stride() == (1, 3)
    before = launches()
    for got, want in ((torch.add(xd, xd, alpha=3).cpu(), torch.add(x, x, alpha=3)),   # alpha: a fused op
                      ((xd * xd.to(torch.float64)).cpu(), x * x.to(torch.float64)),   # promotion
                      ((xd.bool() * xd.bool()).cpu(), x.bool() * x.bool()),           # bool
                      ((xd.int() / (xd.int() + 1)).cpu(), x.int() / (x.int() + 1))):  # promotes to float
        assert got.equal(want) and got.dtype == want.dtype
    assert launches() == before + 2                               # (the int + 1: fill and add)
    s = torch.Stream(device=d)
    y = torch.full((6,), 1.5, device=d)
    s.wait_stream(torch.accelerator.current_stream(0))
    release = _held(at, s)
    try:
        with s:
            z = torch.add(y, y)              # the kernel is enqueued on s, behind the hold
        assert not s.query()
    finally:
        release()
    s.synchronize()
    assert z.cpu().equal(torch.full((6,), 3.0)) and kernel == 28


def _by_entry(at) -> dict:
    return dict(at._C.kernel_launches()[2])


def _delta(at, before: dict) -> dict:
    return {k: v - before[k] for k, v in _by_entry(at).items() if v != before[k]}


def test_comparisons_maximum_minimum_and_neg_run_the_kernel_table_exactly(at):
    d = torch.device("anychip:0")
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
                  torch.bool):
        a = (torch.randn(4, 1, 6, generator=g) * 3).round().to(dtype)
        b = (torch.randn(5, 6, generator=g) * 3).round().to(dtype)          # broadcast to (4, 5, 6)
        if dtype.is_floating_point:
            a[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
            b[1, :3] = torch.tensor([1.0, float("nan"), 0.0])
        for f in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.maximum, torch.minimum):
            before = _by_entry(at)
            got = f(a.to(d), b.to(d))
            assert _delta(at, before) == {"binary": 1}, (dtype, f)
            want = f(a, b)
            assert got.dtype == want.dtype and got.shape == want.shape, (dtype, f)
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
        if dtype is not torch.bool:
            before = _by_entry(at)
            got = torch.neg(a.to(d))
            assert _delta(at, before) == {"unary": 1}, dtype
            torch.testing.assert_close(got.cpu(), torch.neg(a), rtol=0, atol=0, equal_nan=True)


def test_relu_fill_and_integer_sums_run_the_kernel_table_exactly(at):
    """relu, fill_ and sums of integers run on the chip's kernel table (one launch each, the
    CPU's values bit for bit); float sums and mm stay on the CPU's kernels by default."""
    d = torch.device("anychip:0")
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8):
        x = (torch.randn(4, 6, generator=g) * 20).to(dtype)
        x[0, 0] = 0
        xd = x.to(d)
        before = _by_entry(at)
        got = torch.relu(xd)
        assert _delta(at, before) == {"unary": 1}, dtype
        assert got.cpu().equal(torch.relu(x)) and got.dtype == dtype
    nan = torch.tensor([float("nan"), -1.0, 2.0], device=d)
    assert torch.relu(nan).cpu().tolist()[1:] == [0.0, 2.0] and torch.relu(nan).cpu()[0].isnan()
    before = _by_entry(at)
    assert torch.relu(xd.t()).cpu().equal(torch.relu(x.t()))             # not contiguous: the CPU's
    assert _delta(at, before) == {}
    for dtype, value in ((torch.float32, 1.5), (torch.float16, 0.1), (torch.bfloat16, 0.1), (torch.float64, -0.25),
                         (torch.int64, 2**62 + 1), (torch.int32, -7)):
        t = torch.empty(9, dtype=dtype, device=d)
        before = _by_entry(at)
        t.fill_(value)
        assert _delta(at, before) == {"fill": 1}, dtype
        assert t.cpu().equal(torch.full((9,), value, dtype=dtype)), dtype
    before = _by_entry(at)
    assert torch.zeros(5, device=d).cpu().equal(torch.zeros(5))           # one repeated byte: a memset
    assert torch.ones(3, dtype=torch.bool, device=d).cpu().all()
    assert torch.full((3,), 200, dtype=torch.uint8, device=d).cpu().tolist() == [200] * 3   # one byte
    assert _delta(at, before) == {}
    for dtype in (torch.int32, torch.int64, torch.int8, torch.uint8):
        info = torch.iinfo(dtype)
        x = torch.randint(info.min, info.max, (3, 4, 5), generator=g, dtype=torch.int64).to(dtype)
        xd = x.to(d)
        for args, kwargs in (((), {}), ((1,), {}), ((0,), {"keepdim": True}), ((-1,), {})):
            before = _by_entry(at)
            got = xd.sum(*args, **kwargs)
            assert _delta(at, before) == {"reduce": 1}, (dtype, args, kwargs)
            want = x.sum(*args, **kwargs)
            assert got.cpu().equal(want) and got.dtype == torch.int64 and got.shape == want.shape
    before = _by_entry(at)
    f = torch.randn(3, 4, generator=g)
    for got, want in ((xd.sum((0, 1)), x.sum((0, 1))),                    # two dims: the CPU's
                      (f.to(d).sum(), f.sum()), (f.to(d).sum(1), f.sum(1)),   # float sums: the CPU's
                      (f.to(d) @ f.t().to(d), f @ f.t()),                 # mm: the CPU's
                      (torch.ones(4, dtype=torch.bool, device=d).sum(), torch.tensor(4))):   # no bool in its mask
        assert got.cpu().equal(want)
    assert _delta(at, before) == {}


KERNELS_PROGRAM = textwrap.dedent("""
    import json, torch, anychip.torch as at
    d = torch.device("anychip:0")
    g = torch.Generator().manual_seed(3)
    def by_entry():
        return dict(at._C.kernel_launches()[2])
    out = {"backend": at.backend(), "has": at._C.kernel_launches()[1], "ops": {}}
    a = torch.randn(5, 7, generator=g)
    b = torch.randn(7, 3, generator=g)
    i = torch.randint(-9, 9, (5, 7), generator=g)
    for name, fn, args in (("add", torch.add, (a, a)), ("mul", torch.mul, (i, i)), ("relu", torch.relu, (a,)),
                           ("mm", torch.mm, (a, b)), ("mm_t", torch.mm, (b.t(), a.t())),
                           ("mm_int_valued", torch.mm, (i.float(), i.float().t())),
                           ("sum_f32", torch.sum, (a,)), ("sum_i64", torch.sum, (i,)),
                           ("fill", lambda t: torch.empty_like(t).fill_(2.5), (a,)),
                           ("add_", lambda t, u: t.clone().add_(u), (a, a)),
                           ("mul_number", lambda t: t.clone().mul_(0.5), (a,)),
                           ("sub_out", lambda t, u: torch.sub(t, u, out=t.clone()), (a, i.float()))):
        before = by_entry()
        got = fn(*(x.to(d) for x in args)).cpu()
        want = fn(*args)
        delta = {k: v - before[k] for k, v in by_entry().items() if v != before[k]}
        out["ops"][name] = [delta, bool(got.equal(want)), bool(torch.allclose(got, want, rtol=1e-5, atol=1e-5))]
    print(json.dumps(out))
""")


@pytest.mark.parametrize("setting", ["all", "0", "c plugin"])
@pytest.mark.slow
def test_the_kernel_table_setting_and_a_c_plugins_table(setting, scaffold_plugin):
    """ANYCHIP_TORCH_KERNELS=all adds mm and float sums (close to the CPU's, rounded in the chip's
    order), =0 turns the table off; a C plugin's table (the scaffold's loops) serves as the
    simulated chips' does, in-place and out= forms included."""
    env = {**os.environ, "ANYCHIP_TORCH": "ascend", "ANYCHIP_TORCH_KERNELS": setting}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    if setting == "c plugin":
        env.update(ANYCHIP_TORCH=scaffold_plugin.name, ANYCHIP_PLUGIN_PATH=scaffold_plugin.path,
                   ANYCHIP_TORCH_KERNELS="1")
    done = subprocess.run([sys.executable, "-c", KERNELS_PROGRAM], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    ops = out["ops"]
    assert out["backend"] == ("ascend" if setting != "c plugin" else scaffold_plugin.name)
    assert out["has"] is (setting != "0")
    exact = {"add": {"binary": 1}, "mul": {"binary": 1}, "relu": {"unary": 1}, "sum_i64": {"reduce": 1},
             "fill": {"fill": 1}, "add_": {"binary": 1}, "mul_number": {"fill": 1, "binary": 1},
             "sub_out": {"binary": 1}}
    if setting == "0":
        assert all(delta == {} and same for delta, same, _ in ops.values()), ops
        return
    for name, delta in exact.items():
        assert ops[name][:2] == [delta, True], (name, ops[name])
    chip = {"mm": {"gemm": 1}, "mm_t": {"gemm": 1}, "mm_int_valued": {"gemm": 1}, "sum_f32": {"reduce": 1}}
    for name, delta in chip.items():
        assert ops[name][0] == (delta if setting == "all" else {}), (name, ops[name])
        assert ops[name][2] is True                                       # close to the CPU's
    assert ops["mm_int_valued"][1] is True                                # small integers: exact in any order


@pytest.mark.filterwarnings("error")
def test_autograd_linear_sgd_matches_the_cpu_exactly(at):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("anychip")
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_d = torch.optim.SGD(dev.parameters(), lr=0.05, momentum=0.9)
    data = torch.randn(5, 32, 8)
    target = torch.randn(5, 32, 3)
    losses_r, losses_d = [], []
    for _ in range(5):
        for model, opt, losses, where in ((ref, opt_r, losses_r, "cpu"), (dev, opt_d, losses_d, "anychip")):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data[0].to(where)), target[0].to(where))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses_d == losses_r
    assert losses_r[-1] < losses_r[0]
    assert dev[0].weight.grad.device == torch.device("anychip", 0)
    for p, q in zip(ref.parameters(), dev.parameters(), strict=True):
        assert q.cpu().equal(p.detach())


def test_numpy_values_through_the_device(at):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    t = torch.from_numpy(a)
    x = t.to("anychip")
    np.testing.assert_array_equal((x @ x.T).cpu().numpy(), (t @ t.T).numpy())     # the CPU kernel, bit for bit
    np.testing.assert_array_equal(x.cpu().numpy(), a)
    assert x.is_anychip and x.anychip().device.type == "anychip"


def test_bad_device_index_names_the_range(at):
    n = at.device_count()
    with pytest.raises(Exception, match=f"anychip device index {n} is out of range: ascend has {n} device"):
        torch.empty(2, device=f"anychip:{n}")
    with pytest.raises(anychip.InvalidArgumentError, match=f"anychip:{n} does not exist"):
        at.memory_stats(n)


PROGRAM = textwrap.dedent("""
    import torch, anychip.torch as at
    x = torch.arange(6, dtype=torch.float32, device="anychip:1").reshape(2, 3)
    y = (x.t() * 2).to("anychip:0")
    print(at.backend(), at.anychip_device(1).name, y.cpu().flatten().tolist())
""")


@pytest.mark.parametrize("chip", ["kunlun", "hygon"])
@pytest.mark.slow
def test_the_other_simulated_chips_serve_the_device(chip):
    env = {**os.environ, "ANYCHIP_TORCH": chip}
    env.pop("ANYCHIP_LAUNCH_DEVICE", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == f"{chip} {chip}:1 [0.0, 6.0, 2.0, 8.0, 4.0, 10.0]"


@pytest.mark.slow
def test_a_bad_kernel_setting_is_refused_naming_the_choices():
    env = {**os.environ, "ANYCHIP_TORCH_KERNELS": "fast"}
    done = subprocess.run([sys.executable, "-c", "import anychip.torch"], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 1
    assert "anychip.runtime.errors.InvalidArgumentError: ANYCHIP_TORCH_KERNELS='fast' is invalid: want one of 0, 1, " \
           "all" in done.stderr


@pytest.mark.slow
def test_an_unknown_backend_is_refused_naming_the_choices():
    env = {**os.environ, "ANYCHIP_TORCH": "nosuchchip"}
    done = subprocess.run([sys.executable, "-c", "import anychip.torch"], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 1
    assert "ANYCHIP_TORCH=nosuchchip: anychip has no backend 'nosuchchip'" in done.stderr
    assert "set ANYCHIP_TORCH to one of ascend, kunlun, hygon" in done.stderr
    assert sys.executable


@pytest.mark.slow
def test_simulated_chips_with_no_devices_are_named_as_such():
    """ANYCHIP_SIM_DEVICES=0: the simulated chips are built but have no device; the error says so
    (it said they "need anychip's built simulator libraries")."""
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    env["ANYCHIP_SIM_DEVICES"] = "0"
    done = subprocess.run([sys.executable, "-c", "import anychip.torch"], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "anychip.runtime.errors.InvalidArgumentError: anychip.torch: no anychip backend with an anychip/plugin.h "
        "face is available here (the simulated chips (ascend, kunlun, hygon) have 0 devices: ANYCHIP_SIM_DEVICES=0)")
    assert "built simulator libraries" not in done.stderr


@pytest.mark.slow
def test_a_forked_child_is_told_to_use_spawn():
    """In a child forked after the device was set up, allocating and reading the parent's tensor
    say "forked child ... 'spawn' start method", as CUDA does (they named a destroyed stream and an
    unknown source pointer); the parent's device still works."""
    code = textwrap.dedent("""
        import os, torch, anychip.torch
        x = torch.arange(4.0, device="anychip")
        pid = os.fork()
        if pid == 0:
            print("CHILD bad fork", torch.anychip._is_in_bad_fork(), flush=True)
            for what, fn in (("alloc", lambda: torch.empty(4, device="anychip")), ("read", lambda: x.cpu())):
                try:
                    fn()
                    print("CHILD", what, "ok", flush=True)
                except RuntimeError as exc:
                    print("CHILD", what, str(exc).splitlines()[0], flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("PARENT", torch.anychip._is_in_bad_fork(), (x + 1).cpu().tolist(), flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("ANYCHIP_TORCH", "ANYCHIP_LAUNCH_DEVICE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=LONG_CHILD_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    want = ("anychip ascend: this is a forked child of the process that set up the anychip device (import "
            "anychip.torch): its device memory, tensors and streams do not survive fork(); use the 'spawn' start "
            "method (multiprocessing.get_context('spawn'), torch.multiprocessing.set_start_method('spawn'))")
    assert done.stdout.splitlines() == ["CHILD bad fork True", f"CHILD alloc {want}", f"CHILD read {want}",
                                        "PARENT False [1.0, 2.0, 3.0, 4.0]"], done.stdout + done.stderr[-2000:]
