"""Tensor ops on a device against NumPy on the same sizes, as ratios.

    python benchmarks/bench_tensor.py [--device ascend:0] [--repeat 20] [--json]

Each op is timed as a user sees it: the call plus a synchronize of the device's
stream (so the work itself is included), median of ``--repeat`` runs after a warm-up.
NumPy runs the same op on host arrays of the same size. ratio = NumPy time /
device time (>= 1: the device is as fast as NumPy or faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

import anychip


def _median_time(fn: Callable[[], object], sync: Callable[[], None], repeat: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cases(n: int, m: int) -> list[tuple[str, str, Callable, Callable]]:
    """(name, size, NumPy op on (x, y, a, b), tensor op on the same)."""
    return [
        ("add", f"{n} float32", lambda x, y, a, b: x + y, lambda x, y, a, b: x + y),
        ("mul", f"{n} float32", lambda x, y, a, b: x * y, lambda x, y, a, b: x * y),
        ("div", f"{n} float32", lambda x, y, a, b: x / y, lambda x, y, a, b: x / y),
        ("gt", f"{n} float32", lambda x, y, a, b: x > y, lambda x, y, a, b: x > y),
        ("relu", f"{n} float32", lambda x, y, a, b: np.maximum(x, np.float32(0)), lambda x, y, a, b: x.relu()),
        ("exp", f"{n} float32", lambda x, y, a, b: np.exp(x), lambda x, y, a, b: x.exp()),
        ("sum", f"{n} float32", lambda x, y, a, b: x.sum(), lambda x, y, a, b: x.sum()),
        ("cast f32->f16", f"{n}", lambda x, y, a, b: x.astype(np.float16), lambda x, y, a, b: x.cast("float16")),
        ("matmul", f"{m}x{m} float32", lambda x, y, a, b: a @ b, lambda x, y, a, b: a @ b),
        ("matmul a@b.T", f"{m}x{m} float32", lambda x, y, a, b: a @ b.T, lambda x, y, a, b: a @ b.T),
        ("sum axis 0", f"{m}x{m} float32", lambda x, y, a, b: a.sum(axis=0), lambda x, y, a, b: a.sum(axis=0)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="ascend:0")
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--matrix", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    dev = anychip.device(args.device)
    rng = np.random.default_rng(0)
    hx, hy = (rng.standard_normal(args.elements).astype(np.float32) for _ in range(2))
    ha, hb = (rng.standard_normal((args.matrix, args.matrix)).astype(np.float32) for _ in range(2))
    tx, ty, ta, tb = (anychip.tensor(v, device=dev) for v in (hx, hy, ha, hb))
    stream = dev.current_stream()
    rows = []
    for name, size, np_op, t_op in cases(args.elements, args.matrix):
        t_np = _median_time(lambda np_op=np_op: np_op(hx, hy, ha, hb), lambda: None, args.repeat)
        t_dev = _median_time(lambda t_op=t_op: t_op(tx, ty, ta, tb), stream.synchronize, args.repeat)
        rows.append({"op": name, "size": size, "numpy_ms": t_np * 1e3, "device_ms": t_dev * 1e3,
                     "ratio": t_np / t_dev})
    if args.json:
        print(json.dumps({"device": str(dev), "rows": rows}, indent=2))
        return
    print(f"# tensor ops on {dev} vs NumPy (median of {args.repeat}); ratio = NumPy time / device time")
    print(f"{'op':>14} {'size':>18} {'numpy ms':>10} {'device ms':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['op']:>14} {r['size']:>18} {r['numpy_ms']:>10.3f} {r['device_ms']:>10.3f} {r['ratio']:>7.2f}")


if __name__ == "__main__":
    main()
