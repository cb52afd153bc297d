"""The simulated chips' native collective libraries (HCCL / BKCL / RCCL in the simulator)
against the engine transport on the same chips, in one run.

    python benchmarks/bench_native_ccl.py [--chips hygon,ascend,kunlun] [--ops all_reduce] [-n 2]
                                          [--min 8] [--max 64M] [--factor 8] [--repeat 2]

``-n`` ranks (default 2), float32, measured with bench_collectives.py's anychip worker
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chips", default="hygon,ascend,kunlun")
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="rounds (the best time is kept)")
    args = ap.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    for op in ops:
        if op not in bc.FACTORS:
            raise SystemExit(f"--ops: {op!r} is not one of {', '.join(bc.FACTORS)}")
    chips = [c for c in args.chips.split(",") if c]
    sizes = bc.size_list(bc.parse_size(args.min), bc.parse_size(args.max), args.factor)
    n = args.nranks
    results: dict[tuple[str, str], dict] = {}
    for _ in range(args.repeat):
        for chip in chips:
            for transport in ("native", "host"):
                got = bc.run_anychip(chip, n, ops, sizes, ANYCHIP_COLLECTIVE_TRANSPORT=transport)
                if not isinstance(got, dict):
                    raise SystemExit(f"{chip} with ANYCHIP_COLLECTIVE_TRANSPORT={transport}: {got}")
                results[(chip, transport)] = bc.best_of(results.get((chip, transport)), got)  # type: ignore[assignment]
    print(f"{n} ranks, float32; time in us, busbw in GB/s; ratio = native / host busbw")
    for op in ops:
        for chip in chips:
            native, host = results[(chip, "native")], results[(chip, "host")]
            print(f"\n{op} on {chip} ({native['transport']} / {host['transport']})")
            print(f"{'size':>8} {'native us':>12}{'busbw':>8}{'host us':>12}{'busbw':>8}{'ratio':>8}")
            for s in sizes:
                tn, th = native[f"{op}/{s}"], host[f"{op}/{s}"]
                bn, bh = bc.busbw(op, s, tn, n), bc.busbw(op, s, th, n)
                print(f"{bc.human(s):>8} {tn * 1e6:>12.1f}{bn:>8.2f}{th * 1e6:>12.1f}{bh:>8.2f}{bn / bh:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
