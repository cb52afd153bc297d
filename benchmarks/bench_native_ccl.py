"""The simulated chips' native collective libraries (HCCL / BKCL / RCCL in the simulator)
against the engine transport on the same chips, in one run.

    python benchmarks/bench_native_ccl.py [--chips hygon,ascend,kunlun] [--ops all_reduce]
                                          [--min 8] [--max 64M] [--factor 8] [--repeat 2]

Two ranks, float32, out of place, measured with bench_collectives.py's anychip worker
(time per op after warm-up, slowest rank; busbw with nccl-tests' factors), once with
ANYCHIP_COLLECTIVE_TRANSPORT=native (the vendor library's C entry points through cffi)
and once with =host (the engine's own simulated-stream path). Both end on the same
engine, zero-copy from 64 KiB; the difference is the cost of the front ends.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_collectives as bc  # noqa: E402

from anychip._spawn import python_command  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chips", default="hygon,ascend,kunlun")
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="rounds (the best time is kept)")
    args = ap.parse_args()
    ops = args.ops.split(",")
    szs = bc.sizes(bc.parse_size(args.min), bc.parse_size(args.max), args.factor)
    worker = [os.path.join(HERE, "bench_collectives.py"), "--ops", args.ops, "--min", args.min, "--max", args.max,
              "--factor", str(args.factor), "--worker", "anychip"]
    results: dict[tuple[str, str], dict] = {}
    for _ in range(args.repeat):
        for chip in args.chips.split(","):
            for transport in ("native", "host"):
                cmd = [*python_command(["-m", "anychip", "launch"]), "-n", str(bc.NRANKS), "--device", chip, *worker]
                got = bc.collect(cmd, env={"ANYCHIP_COLLECTIVE_TRANSPORT": transport})
                best = results.setdefault((chip, transport), {})
                for key, t in got.items():
                    best[key] = min(t, best.get(key, t))
    print(f"{bc.NRANKS} ranks, float32, out of place; time in us, busbw in GB/s; ratio = native / host busbw")
    for op in ops:
        for chip in args.chips.split(","):
            print(f"\n{op} on {chip}")
            print(f"{'size':>6} {'native us':>12}{'busbw':>8}{'host us':>12}{'busbw':>8}{'ratio':>8}")
            for s in szs:
                tn = results.get((chip, "native"), {}).get((op, s))
                th = results.get((chip, "host"), {}).get((op, s))
                if tn is None or th is None:
                    print(f"{bc.fmt_size(s):>6} {'-':>12}")
                    continue
                bn, bh = s / tn / 1e9 * bc.BUS[op], s / th / 1e9 * bc.BUS[op]
                print(f"{bc.fmt_size(s):>6} {tn * 1e6:>12.1f}{bn:>8.2f}{th * 1e6:>12.1f}{bh:>8.2f}{bn / bh:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
