#!/usr/bin/env python3
"""Cost of a cached alloc+free pair through ``Device.alloc`` / ``Buffer.free``
against the backend's raw malloc+free (and CuPy's MemoryPool on CUDA), and
against a NumPy ``np.empty(512)`` + ``del`` pair measured in the same run (the
yardstick for a machine whose speed varies from day to day).

    python benchmarks/bench_allocator.py [--device cpu:0 --device ascend:0] [--repeat 7] [--json]

Each cell is the median over ``--repeat`` rounds of the mean time of one pair.
Goal: the cached 512-byte pair (split from a free 2 MiB segment and merged back)
costs at most 1.5 µs and at most 3.7x the NumPy pair, and beats raw at every size.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import anychip

SIZES = [512, 64 << 10, 1 << 20, 64 << 20]
GOAL_US, GOAL_RATIO = 1.5, 3.7


def fmt_size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def median_pair_us(fn, iters: int, repeat: int) -> float:
    fn(max(1, iters // 10))                        # warm up (fills the cache)
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(iters)
        rounds.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(rounds)


def numpy_pair_us(repeat: int) -> float:
    def pair(n: int) -> None:
        empty = np.empty
        for _ in range(n):
            a = empty(512)
            del a
    return median_pair_us(pair, 20000, repeat)


def bench(dev: anychip.Device, size: int, repeat: int) -> dict:
    plugin, index = dev.plugin, dev.index
    stream = dev.default_stream

    def cached(n: int) -> None:
        alloc = dev.alloc
        for _ in range(n):
            alloc(size, stream).free()

    def raw(n: int) -> None:
        malloc, free = plugin._malloc, plugin._free
        for _ in range(n):
            free(index, malloc(index, size))

    big = size >= 16 << 20
    row = {"size": size,
           "anychip_us": median_pair_us(cached, 20000, repeat),
           "raw_us": median_pair_us(raw, 200 if big else 2000, repeat)}
    if dev.backend == "cuda":
        import cupy
        with cupy.cuda.Device(index):
            pool = cupy.cuda.MemoryPool()

            def cupy_pool(n: int) -> None:
                for _ in range(n):
                    pool.malloc(size)      # the MemoryPointer is freed back to the pool at once
            row["cupy_pool_us"] = median_pair_us(cupy_pool, 20000, repeat)
            pool.free_all_blocks()
    return row


def report(dev: anychip.Device, rows: list[dict], numpy_us: float, repeat: int) -> None:
    print(f"# alloc+free pair on {dev.name} ({dev.properties.get('name')}), Python {platform.python_version()}, "
          f"median of {repeat} rounds")
    has_cupy = any("cupy_pool_us" in r for r in rows)
    head = f"{'size':>8}  {'anychip µs':>10}  {'raw µs':>9}  {'raw/anychip':>11}  {'/numpy':>7}"
    print(head + (f"  {'cupy pool µs':>12}  {'cupy/anychip':>12}" if has_cupy else ""))
    for r in rows:
        line = (f"{fmt_size(r['size']):>8}  {r['anychip_us']:>10.2f}  {r['raw_us']:>9.2f}  "
                f"{r['raw_us'] / r['anychip_us']:>10.1f}x  {r['anychip_us'] / numpy_us:>6.2f}x")
        if has_cupy:
            line += f"  {r['cupy_pool_us']:>12.2f}  {r['cupy_pool_us'] / r['anychip_us']:>11.2f}x"
        print(line)
    pair = rows[0]["anychip_us"]
    ratio = pair / numpy_us
    faster = all(r["raw_us"] > r["anychip_us"] for r in rows)
    print(f"numpy np.empty(512)+del pair: {numpy_us:.3f} µs")
    print(f"goal: 512 B pair <= {GOAL_US} µs: {'met' if pair <= GOAL_US else 'NOT met'} ({pair:.2f} µs); "
          f"<= {GOAL_RATIO}x numpy: {'met' if ratio <= GOAL_RATIO else 'NOT met'} ({ratio:.2f}x); "
          f"faster than raw at every size: {'met' if faster else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", action="append", help="device to measure (repeatable; default cpu:0)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = []
    for name in args.device or ["cpu:0"]:
        dev = anychip.device(name)
        numpy_before = numpy_pair_us(args.repeat)
        rows = [bench(dev, size, args.repeat) for size in SIZES]
        numpy_us = statistics.median([numpy_before, numpy_pair_us(args.repeat)])   # around the device rows
        dev.empty_cache()
        out.append({"device": dev.name, "numpy_pair_us": numpy_us,
                    "ratio_512": rows[0]["anychip_us"] / numpy_us, "rows": rows})
        if not args.json:
            report(dev, rows, numpy_us, args.repeat)
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
