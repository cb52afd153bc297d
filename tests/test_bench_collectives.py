"""The collective benchmark's own logic: the goal lines it prints, the sizes it runs and the
results it checks (benchmarks/bench_collectives.py; no job is started here)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


bc = _load("bench_collectives")


def test_sizes_include_the_goal_sizes_within_the_range() -> None:
    assert bc.size_list(8, 64 << 20, 64) == [8, 512, 32768, 262144, 2097152, 64 << 20]
    assert bc.size_list(4096, 65536, 4) == [4096, 16384, 32768, 65536]


def test_layout_and_expected_values_per_op() -> None:
    assert bc.layout("all_gather", 64, 2) == (8, 8, 16)
    assert bc.layout("reduce_scatter", 64, 4) == (4, 16, 4)
    assert bc.layout("all_to_all", 64, 2) == (8, 16, 16)
    assert bc.layout("broadcast", 8, 4) == (2, 2, 2)
    assert bc.layout("all_gather", 8, 4) == (1, 1, 4)       # at least one element per block
    np.testing.assert_array_equal(bc.expected("all_to_all", 1, 3, 2), [1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(bc.expected("send_recv", 0, 4, 2), [4, 4])
    np.testing.assert_array_equal(bc.expected("reduce_scatter", 2, 4, 1), [10])
    assert bc.expected("reduce", 1, 2, 5) is None            # only the root's recv is written


def test_goal_lines_against_the_faster_mpi_and_the_traffic_model() -> None:
    small, mid, big = 8, 32 << 10, 64 << 20
    results = {
        "staged": {f"broadcast/{small}": 3e-6, f"broadcast/{mid}": 4e-6, f"broadcast/{big}": 8e-3},
        "zero-copy": {f"broadcast/{small}": 7e-6, f"broadcast/{mid}": 2e-6, f"broadcast/{big}": 5e-3},
        "any-mpi": {f"broadcast/{small}": 5e-6},
        "mpich": {f"broadcast/{small}": 2e-6, f"broadcast/{mid}": 5e-6, f"broadcast/{big}": 9e-3},
        "ompi": {f"broadcast/{small}": 2.5e-6, f"broadcast/{mid}": 3e-6, f"broadcast/{big}": 1e-2},
    }
    memcpy = 10.0                                            # GB/s
    lines = bc.goals(results, memcpy, ["broadcast"], [small, mid, big], 2)
    assert lines == [
        "met  broadcast staged: 8 B in 3.0 us = 1.50x mpich's 2.0 us (goal <= 1.5x)",
        "MISS broadcast zero-copy: 8 B in 7.0 us = 3.50x mpich's 2.0 us (goal <= 3.0x)",
        "MISS broadcast any-mpi: 8 B in 5.0 us = 2.50x raw mpi4py on MPICH's 2.0 us (goal <= 2x)",
        "met  broadcast zero-copy: busbw >= the faster of mpich/ompi at every size >= 32 KiB: "
        "worst 1.50x (32 KiB, against ompi)",
        "MISS broadcast staged: busbw >= the faster of mpich/ompi at every size >= 32 KiB: "
        "worst 0.75x (32 KiB, against ompi)",
        "met  broadcast zero-copy: 64 MiB busbw 13.42 GB/s = 134% of memcpy 10.00 GB/s (goal >= 70%)",
        "met  broadcast staged: 64 MiB busbw 8.39 GB/s = 84% of memcpy 10.00 GB/s (goal >= 70%)",
    ]
    # a largest size the caches hold gives no line against memcpy (it would be a cache's speed)
    assert not [ln for ln in bc.goals(results, memcpy, ["broadcast"], [small, mid], 2) if "memcpy" in ln]
    # the model's limit for the reducing ops, as a multiple of memcpy's bandwidth
    assert bc.MODEL["all_reduce"](2) == 1.0
    assert bc.MODEL["reduce_scatter"](2) == pytest.approx(2 / 3)
    assert bc.MODEL["all_gather"](4) == 0.75


def test_bench_native_ccl_refuses_an_unknown_op(monkeypatch: pytest.MonkeyPatch) -> None:
    nc = _load("bench_native_ccl")
    monkeypatch.setattr(sys, "argv", ["bench_native_ccl.py", "--ops", "all_reduce,allreduce"])
    with pytest.raises(SystemExit, match="--ops: 'allreduce' is not one of all_reduce, all_gather"):
        nc.main()
