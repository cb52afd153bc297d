"""Step time of examples/auto_parallel.py (``--model mlp``) or examples/transformer_parallel.py
(``--model transformer``): 4 ranks on a 2 x 2 mesh against the same step in one process, and the
share of the distributed step spent in collectives.

    python benchmarks/bench_parallel.py [--model mlp|transformer] [--device ascend] [--steps 5] [--small] [--zero]

Launches ``anychip launch -n 4 --device DEVICE examples/<example>.py --json``. Rank 0
reports its step times on the mesh, then the same model's step times on a one-rank mesh
(the same code on one device, run while the other ranks are idle), and the seconds rank 0
spent in reshard's collectives (issue to completion, so waiting for a slower peer counts).
The first step (allocations, first-touch of device memory, communicator set-up) is shown
apart; the table uses the median of the others.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = {"mlp": os.path.join(os.path.dirname(HERE), "examples", "auto_parallel.py"),
            "transformer": os.path.join(os.path.dirname(HERE), "examples", "transformer_parallel.py")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="ascend")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--model", choices=sorted(EXAMPLES), default="mlp")
    ap.add_argument("--zero", action="store_true", help="transformer: ZeRO stage 1 on dp")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="OPENBLAS_NUM_THREADS and OMP_NUM_THREADS for the job (default: the environment's; four "
                         "ranks each with a BLAS thread per core oversubscribe a small machine, which is why "
                         "torchrun sets OMP_NUM_THREADS=1 for its workers)")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(args.blas_threads)
    cmd = [sys.executable, "-m", "anychip", "launch", "-n", "4", "--device", args.device, EXAMPLES[args.model],
           "--json", "--steps", str(args.steps)] + (["--small"] if args.small else []) + \
        (["--zero"] if args.zero and args.model == "transformer" else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout + p.stderr, file=sys.stderr)
        return p.returncode
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("[0] {"))
    r = json.loads(line[4:])
    dist, single = r["dist_step_s"], r["single_step_s"]
    d, s = statistics.median(dist[1:] or dist), statistics.median(single[1:] or single)
    coll = sum(r["collective_s"].values())
    if "sizes" in r:
        b, di, h, do = r["sizes"]
        model = f"MLP {di}x{h}x{do}, batch {b}"
    else:
        model = r["model"] + (", ZeRO 1" if args.zero else "")
    threads = f"; BLAS threads {args.blas_threads}" if args.blas_threads is not None else ""
    print(f"{model}, float32, {args.device}{threads}; {len(dist)} AdamW steps; "
          f"first step: {dist[0] * 1e3:.0f} ms on the mesh, {single[0] * 1e3:.0f} ms on one device")
    print("| | step time (median) | one process / this | step time (mean) | in collectives (rank 0, mean) "
          "| share of step |")
    print("|---|---|---|---|---|---|")
    print(f"| 4 ranks, 2x2 mesh | {d * 1e3:.0f} ms | {s / d:.2f} | {statistics.mean(dist) * 1e3:.0f} ms | "
          f"{coll / len(dist) * 1e3:.0f} ms | {coll / sum(dist):.0%} |")
    print(f"| 1 process | {s * 1e3:.0f} ms | 1.00 | {statistics.mean(single) * 1e3:.0f} ms | - | - |")
    per_step = {k: v / len(dist) for k, v in r["collectives"].items()}
    print("collectives per step on rank 0: " + ", ".join(f"{k} {v:g}" for k, v in sorted(per_step.items())))
    print("time in them per step: " + ", ".join(f"{k} {v / len(dist) * 1e3:.1f} ms"
                                                 for k, v in sorted(r["collective_s"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
