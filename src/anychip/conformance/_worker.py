"""What the framework workers (torch_worker.py, paddle_worker.py) share: the lines the runner
(framework.py) reads, and the timed size sweep of the nccl-tests tables."""
from __future__ import annotations

import time
from collections.abc import Callable

#: the ops of the tables, timed per size (float32, sum)
TABLE_OPS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")


class Lines:
    """A rank's ``CHECK name ok|FAIL detail`` lines, counted, and its last line ``DONE``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.checks = self.failures = 0

    def report(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks += 1
        self.failures += not ok
        print(f"CHECK {name} {'ok' if ok else 'FAIL ' + ' '.join(detail.split())}", flush=True)

    def row(self, op: str, nbytes: int, seconds: float, ok: bool) -> None:
        self.failures += not ok
        print(f"ROW {op} {nbytes} {seconds:.9f} {'ok' if ok else 'WRONG'}", flush=True)

    def done(self) -> int:
        """Print the last line; the process's exit status (1 when anything failed)."""
        print(f"DONE {self.rank} failures={self.failures} checks={self.checks}", flush=True)
        return 1 if self.failures else 0


def table(lines: Lines, n: int, sizes: str, case: Callable[[str, int], tuple[Callable[[], object],
                                                                          Callable[[], bool]]],
          synchronize: Callable[[], None], barrier: Callable[[], None]) -> None:
    """For each size of ``sizes`` ("min,max,factor" in bytes) and each of TABLE_OPS: ``case(op,
    count)`` gives (run: enqueue the op once, check: run it once more on fresh inputs and say
    whether its values are right); the op is timed over enough iterations (the slowest rank
    counts, in the runner), then checked; one ROW line each."""
    lo, hi, factor = (int(v) for v in sizes.split(","))
    size = lo
    while size <= hi:
        count = max(1, size // 4 // n) * n             # divisible for all_gather / reduce_scatter
        iters = max(2, min(20, (1 << 24) // max(size, 1)))
        for op in TABLE_OPS:
            run, check = case(op, count)
            run()
            synchronize()
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            synchronize()
            lines.row(op, count * 4, (time.perf_counter() - t0) / iters, check())
        size *= factor
