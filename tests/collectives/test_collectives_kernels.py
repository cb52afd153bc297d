"""The engine's local reduction kernel (ccl_reduce_local): half-precision conversions and
rounding, integer wrap-around, avg, and every rank combining sources in the same order."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import CHILD_SECONDS

from anychip.collectives._engine import DTYPES, REDOPS, engine


def reduce_local(arrays: list[np.ndarray], dtype: str, op: str, out: np.ndarray | None = None) -> np.ndarray:
    ffi, lib = engine()
    out = np.empty_like(arrays[0]) if out is None else out
    srcs = ffi.new("void *[]", [ffi.cast("void *", a.ctypes.data) for a in arrays])
    rc = lib.ccl_reduce_local(ffi.cast("void *", out.ctypes.data), srcs, len(arrays), out.size, DTYPES[dtype],
                              REDOPS[op], len(arrays))
    assert rc == 0
    return out


def bf16_round(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_float16_every_bit_pattern_survives_a_one_source_reduce() -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = reduce_local([bits], "float16", "sum")
    vals = bits.view(np.float16)
    finite = ~np.isnan(vals)
    assert np.array_equal(got[finite], bits[finite])
    assert np.isnan(got.view(np.float16)[~finite]).all()


def test_float16_sum_rounds_once_from_float32() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(100_000).astype(np.float16)
    b = (rng.standard_normal(100_000) * 1e-3).astype(np.float16)
    with np.errstate(over="ignore"):
        c = rng.uniform(-70000, 70000, 100_000).astype(np.float32).astype(np.float16)   # infs included
    expect = ((a.astype(np.float32) + b.astype(np.float32)) + c.astype(np.float32)).astype(np.float16)
    got = reduce_local([a.view(np.uint16), b.view(np.uint16), c.view(np.uint16)], "float16", "sum")
    assert np.array_equal(got, expect.view(np.uint16))
    # ties to even at the bottom of the subnormals, and 65520 (half way to the next power) -> inf
    a = np.array([2.0**-12, 3 * 2.0**-12, 1.25 * 2.0**-12], dtype=np.float16)
    b = np.array([2.0**-13, 2.0**-13, 2.0**-12], dtype=np.float16)
    got = reduce_local([a.view(np.uint16), b.view(np.uint16)], "float16", "prod")
    assert got.tolist() == [0x0000, 0x0002, 0x0001]
    a = np.array([65504, 65504], dtype=np.float16)
    b = np.array([16, 15], dtype=np.float16)
    assert reduce_local([a.view(np.uint16), b.view(np.uint16)], "float16", "sum").tolist() == [0x7C00, 0x7BFF]


def test_bfloat16_rounds_to_nearest_even() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal(50_000).astype(np.float32)
    b = rng.standard_normal(50_000).astype(np.float32)
    ab, bb = bf16_round(a), bf16_round(b)
    fa = (ab.astype(np.uint32) << 16).view(np.float32)
    fb = (bb.astype(np.uint32) << 16).view(np.float32)
    got = reduce_local([ab, bb], "bfloat16", "avg")
    assert np.array_equal(got, bf16_round((fa + fb) / np.float32(2)))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_integers_wrap_and_avg_truncates(dtype: str) -> None:
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 7, -7 if info.min else 7, 5], dtype=dtype)
    b = np.array([1, -1 if info.min else 1, 2, -2 if info.min else 2, 5], dtype=dtype)
    with np.errstate(over="ignore"):
        assert np.array_equal(reduce_local([a, b], dtype, "sum"), (a + b).astype(dtype))
        assert np.array_equal(reduce_local([a, b], dtype, "prod"), (a * b).astype(dtype))
    assert np.array_equal(reduce_local([a, b], dtype, "max"), np.maximum(a, b))
    assert np.array_equal(reduce_local([a, b], dtype, "min"), np.minimum(a, b))
    lo = 2 if dtype == "int64" else 0          # (int64 sums of the extremes wrap before the division)
    wide = a[lo:].astype(np.int64) + b[lo:].astype(np.int64)
    assert np.array_equal(reduce_local([a[lo:].copy(), b[lo:].copy()], dtype, "avg"), np.fix(wide / 2).astype(dtype))


def test_sources_combine_in_order_so_results_do_not_depend_on_the_caller() -> None:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(10_000).astype(np.float32) * 10.0**k for k in range(4)]
    expect = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    assert np.array_equal(reduce_local(xs, "float32", "sum"), expect)


def test_unaligned_sources_and_destination() -> None:
    raw = np.zeros(3 * (4 * 1000 + 8), dtype=np.uint8)
    a = np.frombuffer(raw.data, dtype=np.float32, count=1000, offset=3)
    b = np.frombuffer(raw.data, dtype=np.float32, count=1000, offset=4 * 1000 + 9)
    out = np.frombuffer(raw.data, dtype=np.float32, count=1000, offset=2 * (4 * 1000 + 8) + 1)
    assert (a.ctypes.data % 4, b.ctypes.data % 4, out.ctypes.data % 4) == (3, 1, 1)
    a[:] = np.arange(1000)
    b[:] = 2.0
    reduce_local([a, b], "float32", "max", out=out)
    assert np.array_equal(out, np.maximum(np.arange(1000, dtype=np.float32), 2))


def test_c_program_on_the_engine_api(tmp_path) -> None:
    """tests/c/ccl_api.c: the C API (ccl_run, groups, tasks, check mode) from forked C ranks."""
    import os
    import shutil
    import subprocess

    from anychip.runtime._libs import find_library
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lib = find_library("libanychip_ccl")
    libdir, libfile = os.path.split(lib)
    exe = tmp_path / "ccl_api"
    build = subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-I", os.path.join(root, "csrc"), "-o", str(exe),
                            os.path.join(root, "tests", "c", "ccl_api.c"), f"-L{libdir}", f"-l:{libfile}",
                            f"-Wl,-rpath,{libdir}"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    for n in (2, 3):
        p = subprocess.run([str(exe), f"ccl-api-{os.getpid()}-{n}", str(n)], capture_output=True, text=True,
                           timeout=CHILD_SECONDS)
        assert (p.returncode, p.stdout) == (0, "ccl ok\n"), p.stderr
