#!/usr/bin/env python3
"""Copy bandwidth and small-copy latency through anychip's public API.

    python benchmarks/bench_copies.py [--device ascend:0] [-b 4K] [-e 256M] [-f 2]
                                      [--vs raw] [--pinned] [--repeat 5] [--json]

For every size from ``-b`` to ``-e`` (multiplied by ``-f`` each step, as in
nccl-tests) it measures host->device, device->host and device->device copies
enqueued on one ``anychip.Stream`` and then synchronized, and reports GB/s
(10^9 bytes/s of payload) next to a plain NumPy copy of the same size (host
memcpy, the physical limit of a CPU-backed device) as a ratio. It also
measures the round trip of an 8-byte asynchronous copy followed by
``Stream.synchronize()`` (host->device and device->host).

``--vs raw`` runs the same copies through the backend's own Python binding in
the same run, with the ratio anychip/raw:
  * ``opencl:N``: raw pyopencl, ``cl.enqueue_copy`` on an in-order queue of
    its own, non-blocking, then ``queue.finish()``, on the same buffer memory
    as anychip (see ``RawOpenCL``);
  * ``cuda:N``: raw CuPy, ``MemoryPointer.copy_{from,to}_host_async`` /
    ``copy_from_device_async`` on a ``cupy.cuda.Stream``, then ``synchronize()``.

Every cell is the median over ``--repeat`` rounds. Goals (issue 4, reported,
not enforced): OpenCL through anychip >= 0.9 of raw pyopencl bandwidth at
64 MiB and an 8-byte copy+sync <= 1.3x raw; CUDA >= 0.95 of raw CuPy.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

try:
    import anychip
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import anychip

DIRECTIONS = ("h2d", "d2h", "d2d")
TITLES = {"h2d": "host -> device", "d2h": "device -> host", "d2d": "device -> device"}


# ---------------------------------------------------------------- helpers

def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def iterations_for(size: int) -> int:
    """Copies per timed round: about 256 MiB moved, between 2 and 500 copies."""
    return max(2, min(500, (256 << 20) // max(size, 1)))


def median_rounds(runs: dict[str, Callable[[int], None]], iters: int, repeat: int) -> dict[str, float]:
    """Median seconds per copy of each contender over ``repeat`` rounds of ``iters`` copies.

    The contenders take turns round by round (after one warm-up round each), and
    the one that goes first rotates, so a slow spell of the machine or the state
    the previous contender left behind hits all of them rather than one.
    """
    for run in runs.values():
        run(max(1, iters // 4))
    rounds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeat):
        for name in names[r % len(names):] + names[:r % len(names)]:   # who goes first rotates
            t0 = time.perf_counter()
            runs[name](iters)
            rounds[name].append((time.perf_counter() - t0) / iters)
    return {name: statistics.median(r) for name, r in rounds.items()}


def median_latencies_us(ops: dict[str, Callable[[], None]], n: int) -> dict[str, float]:
    """Median µs of one call of each operation, the operations alternating call by call."""
    for op in ops.values():
        for _ in range(max(10, n // 10)):
            op()
    samples: dict[str, list[float]] = {name: [] for name in ops}
    clock = time.perf_counter
    for _ in range(n):
        for name, op in ops.items():
            t0 = clock()
            op()
            samples[name].append(clock() - t0)
    return {name: statistics.median(v) * 1e6 for name, v in samples.items()}


# ---------------------------------------------------------------- the three contenders

class AnychipCopies:
    label = "anychip"

    def __init__(self, dev: anychip.Device, max_size: int) -> None:
        self.dev = dev
        self.stream = anychip.Stream(dev)
        self.a = dev.alloc(max_size, stream=self.stream)
        self.b = dev.alloc(max_size, stream=self.stream)
        self.a.memset(1)
        self.b.memset(2)

    def runner(self, direction: str, size: int, host_src: np.ndarray, host_dst: np.ndarray) -> Callable[[int], None]:
        s, copy = self.stream, anychip.copy
        src = host_src[:size]
        dst = host_dst[:size]
        a, b = self.a, self.b

        if direction == "h2d":
            def run(n: int) -> None:
                for _ in range(n):
                    copy(a, src, size, stream=s)
                s.synchronize()
        elif direction == "d2h":
            def run(n: int) -> None:
                for _ in range(n):
                    copy(dst, a, size, stream=s)
                s.synchronize()
        else:
            def run(n: int) -> None:
                for _ in range(n):
                    copy(b, a, size, stream=s)
                s.synchronize()
        return run

    def small(self, direction: str, host8: np.ndarray) -> Callable[[], None]:
        s, a, copy = self.stream, self.a, anychip.copy
        if direction == "h2d":
            def once() -> None:
                copy(a, host8, 8, stream=s)
                s.synchronize()
        else:
            def once() -> None:
                copy(host8, a, 8, stream=s)
                s.synchronize()
        return once

    def close(self) -> None:
        self.stream.synchronize()
        self.a.free()
        self.b.free()
        self.dev.empty_cache()


class RawOpenCL:
    """Raw pyopencl: ``cl.enqueue_copy`` on an in-order queue of its own.

    It copies to and from the *same* ``cl.Buffer`` memory as the anychip
    contender (the segments anychip allocated, at the same offsets), so the two
    differ only in the software path. On CPU devices such as PoCL the speed of a
    large copy depends on which physical pages a buffer got (two raw buffers of
    the same size can differ by 20%), which would otherwise swamp the comparison.
    """

    label = "raw pyopencl"

    def __init__(self, dev: anychip.Device, ours: AnychipCopies) -> None:
        import pyopencl as cl

        self.cl = cl
        self.a, self.a_off = ours.a.handle, ours.a.offset
        self.b, self.b_off = ours.b.handle, ours.b.offset
        cl_device = self.a.context.devices[0]
        self.q = cl.CommandQueue(self.a.context, cl_device)

    def runner(self, direction: str, size: int, host_src: np.ndarray, host_dst: np.ndarray) -> Callable[[int], None]:
        cl, q, a, b, a_off, b_off = self.cl, self.q, self.a, self.b, self.a_off, self.b_off
        src, dst = host_src[:size], host_dst[:size]
        enqueue = cl.enqueue_copy

        if direction == "h2d":
            def run(n: int) -> None:
                # keep the NannyEvents: dropping one waits for its copy
                evs = [enqueue(q, a, src, dst_offset=a_off, is_blocking=False) for _ in range(n)]
                q.finish()
                del evs
        elif direction == "d2h":
            def run(n: int) -> None:
                evs = [enqueue(q, dst, a, src_offset=a_off, is_blocking=False) for _ in range(n)]
                q.finish()
                del evs
        else:
            def run(n: int) -> None:
                for _ in range(n):
                    enqueue(q, b, a, byte_count=size, src_offset=a_off, dst_offset=b_off)
                q.finish()
        return run

    def small(self, direction: str, host8: np.ndarray) -> Callable[[], None]:
        cl, q, a, a_off = self.cl, self.q, self.a, self.a_off
        enqueue = cl.enqueue_copy
        if direction == "h2d":
            def once() -> None:
                ev = enqueue(q, a, host8, dst_offset=a_off, is_blocking=False)
                q.finish()
                del ev
        else:
            def once() -> None:
                ev = enqueue(q, host8, a, src_offset=a_off, is_blocking=False)
                q.finish()
                del ev
        return once

    def close(self) -> None:
        self.q.finish()


class RawCuPy:
    label = "raw CuPy"

    def __init__(self, dev: anychip.Device, max_size: int) -> None:
        import cupy

        self.cupy = cupy
        self.index = dev.index
        with cupy.cuda.Device(self.index):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.a = cupy.cuda.alloc(max_size)
            self.b = cupy.cuda.alloc(max_size)
            self.a.memset(1, max_size)
            self.b.memset(2, max_size)
            cupy.cuda.runtime.deviceSynchronize()

    def runner(self, direction: str, size: int, host_src: np.ndarray, host_dst: np.ndarray) -> Callable[[int], None]:
        s, a, b, index, cupy = self.stream, self.a, self.b, self.index, self.cupy
        src, dst = host_src[:size], host_dst[:size]
        # ctypes pointers: what every CuPy version's copy_*_host_async accepts
        src_ptr, dst_ptr = ctypes.c_void_p(src.ctypes.data), ctypes.c_void_p(dst.ctypes.data)

        def run(n: int) -> None:
            with cupy.cuda.Device(index):
                if direction == "h2d":
                    for _ in range(n):
                        a.copy_from_host_async(src_ptr, size, s)
                elif direction == "d2h":
                    for _ in range(n):
                        a.copy_to_host_async(dst_ptr, size, s)
                else:
                    for _ in range(n):
                        b.copy_from_device_async(a, size, s)
                s.synchronize()
        return run

    def small(self, direction: str, host8: np.ndarray) -> Callable[[], None]:
        s, a, ptr = self.stream, self.a, ctypes.c_void_p(host8.ctypes.data)
        if direction == "h2d":
            def once() -> None:
                a.copy_from_host_async(ptr, 8, s)
                s.synchronize()
        else:
            def once() -> None:
                a.copy_to_host_async(ptr, 8, s)
                s.synchronize()
        return once

    def close(self) -> None:
        self.stream.synchronize()
        self.a = self.b = None


def numpy_runner(size: int, host_src: np.ndarray, host_dst: np.ndarray) -> Callable[[int], None]:
    src, dst = host_src[:size], host_dst[:size]

    def run(n: int) -> None:
        for _ in range(n):
            np.copyto(dst, src)
    return run


# ---------------------------------------------------------------- driver

def run_benchmark(device: str, begin: int, end: int, factor: float, repeat: int, vs_raw: bool,
                  latency_iters: int, pinned: bool = False) -> dict:
    dev = anychip.device(device)
    sizes = []
    size = begin
    while size <= end:
        sizes.append(size)
        nxt = int(size * factor)
        size = nxt if nxt > size else size + 1
    max_size = sizes[-1]
    if pinned:
        if not hasattr(dev.plugin, "pinned_empty"):
            raise SystemExit(f"bench_copies: --pinned needs a backend with page-locked host memory (cuda), "
                             f"not {dev.backend}")
        host_src, host_dst = dev.plugin.pinned_empty(max_size, dev.index), dev.plugin.pinned_empty(max_size, dev.index)
        host_src[:] = np.random.default_rng(0).integers(0, 256, max_size, dtype=np.uint8)
        host_dst[:] = 1
    else:
        host_src = np.random.default_rng(0).integers(0, 256, max_size, dtype=np.uint8)
        host_dst = np.ones(max_size, dtype=np.uint8)      # touched: no first-use page faults in the timing

    ours = AnychipCopies(dev, max_size)
    raw: Any = None
    raw_note = None
    if vs_raw:
        if dev.backend == "opencl":
            raw = RawOpenCL(dev, ours)
        elif dev.backend == "cuda":
            raw = RawCuPy(dev, max_size)
        else:
            raw_note = f"--vs raw: no raw binding to compare for {dev.backend} (opencl and cuda have one)"
    rows = []
    try:
        for size in sizes:
            iters = iterations_for(size)
            row: dict[str, Any] = {"size": size, "iters": iters}
            for d in DIRECTIONS:
                runs = {"anychip": ours.runner(d, size, host_src, host_dst),
                        "numpy": numpy_runner(size, host_src, host_dst)}
                if raw is not None:
                    runs["raw"] = raw.runner(d, size, host_src, host_dst)
                t = median_rounds(runs, iters, repeat)
                row[f"{d}_gbps"] = size / t["anychip"] / 1e9
                row[f"{d}_numpy_gbps"] = size / t["numpy"] / 1e9
                if raw is not None:
                    row[f"{d}_raw_gbps"] = size / t["raw"] / 1e9
            rows.append(row)
        host8 = np.arange(8, dtype=np.uint8)
        latency: dict[str, float] = {}
        for d in ("h2d", "d2h"):
            ops = {"anychip": ours.small(d, host8)}
            if raw is not None:
                ops["raw"] = raw.small(d, np.arange(8, dtype=np.uint8))
            lat = median_latencies_us(ops, latency_iters)
            latency[f"{d}_us"] = lat["anychip"]
            if raw is not None:
                latency[f"{d}_raw_us"] = lat["raw"]
    finally:
        ours.close()
        if raw is not None:
            raw.close()
    return {
        "device": dev.name,
        "device_name": dev.properties.get("name"),
        "simulated": dev.simulated,
        "python": platform.python_version(),
        "repeat": repeat,
        "host_memory": "pinned" if pinned else "pageable",
        "raw": raw.label if raw is not None else None,
        "raw_note": raw_note,
        "rows": rows,
        "latency": latency,
        "goals": goals(dev.backend, rows, latency, raw is not None),
    }


def goals(backend: str, rows: list[dict], latency: dict, have_raw: bool) -> list[dict]:
    out: list[dict] = []
    if not have_raw:
        return out
    want_bw = {"opencl": 0.9, "cuda": 0.95}.get(backend)
    at = next((r for r in rows if r["size"] == 64 << 20), None)
    if want_bw is not None and at is not None:
        for d in DIRECTIONS:
            ratio = at[f"{d}_gbps"] / at[f"{d}_raw_gbps"]
            out.append({"goal": f"{d} bandwidth at 64 MiB >= {want_bw} x raw", "value": round(ratio, 3),
                        "met": ratio >= want_bw})
    if backend == "opencl":
        for d in ("h2d", "d2h"):
            ratio = latency[f"{d}_us"] / latency[f"{d}_raw_us"]
            out.append({"goal": f"8-byte {d} copy+sync <= 1.3 x raw", "value": round(ratio, 3), "met": ratio <= 1.3})
    return out


def print_report(res: dict) -> None:
    raw = res["raw"]
    sim = " (simulated)" if res["simulated"] else ""
    print(f"# copies on {res['device']}{sim}: {res['device_name']}; Python {res['python']}; "
          f"{res['host_memory']} host memory; median of {res['repeat']} rounds; GB/s = 1e9 bytes/s")
    if res["raw_note"]:
        print(f"# {res['raw_note']}")
    for d in DIRECTIONS:
        print(f"\n## {TITLES[d]}")
        head = f"{'size':>9}  {'anychip GB/s':>12}"
        if raw:
            head += f"  {raw + ' GB/s':>17}  {'anychip/raw':>11}"
        head += f"  {'numpy GB/s':>10}  {'anychip/numpy':>13}"
        print(head)
        for r in res["rows"]:
            ours = r[f"{d}_gbps"]
            line = f"{fmt_size(r['size']):>9}  {ours:>12.2f}"
            if raw:
                theirs = r[f"{d}_raw_gbps"]
                line += f"  {theirs:>17.2f}  {ours / theirs:>11.2f}"
            line += f"  {r[f'{d}_numpy_gbps']:>10.2f}  {ours / r[f'{d}_numpy_gbps']:>13.2f}"
            print(line)
    lat = res["latency"]
    print("\n## 8-byte async copy + stream synchronize (median µs)")
    for d in ("h2d", "d2h"):
        line = f"{d}: anychip {lat[f'{d}_us']:.1f} µs"
        if raw:
            line += f", {raw} {lat[f'{d}_raw_us']:.1f} µs, anychip/raw {lat[f'{d}_us'] / lat[f'{d}_raw_us']:.2f}"
        print(line)
    if res["goals"]:
        print("\n## goals")
        for g in res["goals"]:
            print(f"{g['goal']}: {g['value']:.2f} {'met' if g['met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="ascend:0", help="device to measure (default: ascend:0)")
    ap.add_argument("-b", "--minbytes", default="4K", help="smallest size (default 4K)")
    ap.add_argument("-e", "--maxbytes", default="256M", help="largest size (default 256M)")
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplier per step (default 2)")
    ap.add_argument("--vs", choices=["raw"], help="also run the copies through the raw binding (opencl, cuda)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds per cell; the median is reported (default 5)")
    ap.add_argument("--latency-iters", type=int, default=2000, help="8-byte copies timed (default 2000)")
    ap.add_argument("--pinned", action="store_true",
                    help="page-locked host arrays (cuda: plugin.pinned_empty) instead of ordinary NumPy memory")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    args = ap.parse_args(argv)
    begin, end = parse_size(args.minbytes), parse_size(args.maxbytes)
    if begin <= 0 or end < begin or args.stepfactor < 1:
        ap.error("need 0 < minbytes <= maxbytes and stepfactor >= 1")
    try:
        res = run_benchmark(args.device, begin, end, args.stepfactor, args.repeat, args.vs == "raw",
                            args.latency_iters, args.pinned)
    except anychip.SelectionError as exc:
        print(f"bench_copies: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
