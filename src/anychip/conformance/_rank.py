"""One rank of a conformance job: ``python -m anychip.conformance._rank RUN.json``.

The runner starts it on every rank (``anychip launch``). Every rank runs every case on
its own device; after each case the ranks exchange their outcomes and rank 0 writes the
merged record, one JSON object a line, to the run's output file (the runner reads it as
it grows, for the progress bar and the report). ``RUN.json`` holds the
:class:`~.cases.Config`, the output path and the job: ``main`` (device API, collectives,
faults) or ``killed`` (the last rank dies mid-job; the others print what they saw).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, TextIO

from .cases import OPS, Config, Outcome, Row, collective_row, comm_cases, device_cases, fault_cases, plan

RESULT_PREFIX = "CONFORMANCE-RESULT "


def merge(name: str, group: str, per_rank: list[dict]) -> dict:
    """One record from every rank's outcome of a case: failed when any rank failed (the
    first such rank's detail), skipped when every rank skipped, else passed."""
    failed = [(r, o) for r, o in enumerate(per_rank) if o["status"] == "failed"]
    out = dict(per_rank[0])
    out.update(name=name, group=group, seconds=max(o["seconds"] for o in per_rank))
    if failed:
        r, o = failed[0]
        out.update(o, seconds=out["seconds"], rank=r, detail=f"rank {r}: {o['detail']}")
        out["failed_ranks"] = [r for r, _ in failed]
    elif all(o["status"] == "skipped" for o in per_rank):
        out["status"] = "skipped"
    elif any(o["status"] == "skipped" for o in per_rank):
        r = next(r for r, o in enumerate(per_rank) if o["status"] == "skipped")
        out.update(status="skipped", detail=f"rank {r}: {per_rank[r]['detail']}")
    else:
        out["status"] = "passed"
    return out


class _Writer:
    def __init__(self, path: str | None) -> None:
        self.f: TextIO | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def write(self, kind: str, **record: Any) -> None:
        if self.f is not None:
            self.f.write(json.dumps({"type": kind, **record}) + "\n")
            self.f.flush()


class Deadline:
    """A watchdog per case: a case that has not finished on this rank ``seconds`` after it began
    fails with "no answer in N s" (naming the case and the rank), written straight to the run's
    output, and the rank exits, which ends the job (the launcher stops the other ranks)."""

    def __init__(self, path: str, rank: int, seconds: float) -> None:
        import threading
        self.path, self.rank, self.seconds = path, rank, seconds
        self._case: tuple[str, str] | None = None
        self._since = 0.0
        self._limit = seconds
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="conformance-deadline", daemon=True).start()

    def case(self, name: str, group: str, seconds: float | None = None) -> None:
        """A new case begins; it has ``seconds`` (default: the deadline given at the start)."""
        with self._lock:
            self._case, self._since = (name, group), time.monotonic()
            self._limit = self.seconds if seconds is None else seconds

    def _watch(self) -> None:
        while True:
            time.sleep(0.25)
            with self._lock:
                late = self._case is not None and time.monotonic() - self._since > self._limit
                case, limit = self._case, self._limit
            if late and case is not None:
                name, group = case
                why = f"rank {self.rank}: no answer in {limit:.4g} s (case {name})"
                _Writer(self.path).write("case", name=name, group=group, status="failed", detail=why,
                                         expected=f"an outcome within {limit:.4g} s", got=why,
                                         seconds=limit, rank=self.rank, extra={})
                print(f"anychip conformance: {why}", file=sys.stderr, flush=True)
                os._exit(3)


def _row_record(row: Row, per_rank: list[dict], n: int) -> dict:
    rec: dict[str, Any] = {"op": row.op, "size": row.nbytes, "count": row.count, "dtype": row.dtype,
                           "redop": row.redop, "root": row.root}
    errors = [(r, d["error"]) for r, d in enumerate(per_rank) if "error" in d]
    if errors:
        r, msg = errors[0]
        rec["error"] = f"rank {r}: {msg}"
        rec["status"] = "skipped" if all(d.get("unsupported") for d in per_rank) else "failed"
        return rec
    from .cases import busbw
    for place in ("oop", "ip"):
        if place not in per_rank[0]:
            continue
        secs = sum(d[place]["seconds"] for d in per_rank) / n
        alg, bus = busbw(row, secs, n)
        rec[place] = {"time_us": secs * 1e6, "algbw": alg, "busbw": bus,
                      "wrong": sum(d[place]["wrong"] for d in per_rank)}
    wrong = sum(rec[p]["wrong"] for p in ("oop", "ip") if p in rec)
    rec["status"] = "passed" if wrong == 0 else "failed"
    return rec


def traffic(row: Row, cfg: Config, timed: bool) -> int:
    """Bytes a row moves on a rank (its larger buffer, once per op run: the checked repetitions,
    the timed and untimed iterations, in each placement)."""
    placements = 1 if row.op == "sendrecv" else 2
    checks = (cfg.checks + 1 if timed else 2) if cfg.checks else 0
    ops = checks + (cfg.iters + cfg.warmup if timed else min(1, cfg.iters))
    return row.nbytes * placements * max(1, ops)


class RowDeadlines:
    """Deadlines of the collective rows scaled with the bandwidth measured so far: a row has the
    run's deadline or 8 times what its traffic takes at the slowest rate seen on rows of 1 MiB
    or more, whichever is longer (a correct library that is slow, or slowed by load, is not
    failed; a hang is still stopped). An explicit ``--deadline`` is kept as given."""

    def __init__(self, cfg: Config, base: float) -> None:
        self.cfg, self.base = cfg, base
        self.rate: float | None = None            # bytes per second

    def of(self, row: Row, timed: bool) -> float:
        if self.cfg.deadline or not self.rate:
            return self.base
        return max(self.base, 8 * traffic(row, self.cfg, timed) / self.rate)

    def saw(self, row: Row, timed: bool, seconds: float) -> None:
        if row.nbytes >= 1 << 20 and seconds > 0:
            rate = traffic(row, self.cfg, timed) / seconds
            self.rate = rate if self.rate is None else min(self.rate, rate)


def _run_row(comm: Any, row: Row, cfg: Config, index: int, timed: bool = True) -> dict:
    from ..runtime.errors import UnsupportedError
    try:
        return collective_row(comm, row, cfg, index, timed)
    except UnsupportedError as exc:
        return {"error": f"unsupported: {exc}", "unsupported": True}
    except Exception as exc:  # noqa: BLE001 - reported as the row's failure
        return {"error": f"{type(exc).__name__}: {exc}"}


def _op_case(op: str, records: list[dict]) -> dict:
    bad = [r for r in records if r["status"] == "failed"]
    out = Outcome(op, "collective").to_json()
    del out["seconds"]
    wrong = sum(r.get(p, {}).get("wrong", 0) for r in records for p in ("oop", "ip"))
    out["extra"] = {"rows": len(records), "wrong": wrong}
    if bad:
        first = bad[0]
        where = f"{first['op']} {first['size']} B {first['dtype']} {first['redop']} root {first['root']}"
        out["status"] = "failed"
        if "error" in first:
            out.update(detail=f"{len(bad)} of {len(records)} rows failed; first ({where}): {first['error']}",
                       expected="no error", got=first["error"])
        else:
            w = sum(first.get(p, {}).get("wrong", 0) for p in ("oop", "ip"))
            out.update(detail=f"{len(bad)} of {len(records)} rows wrong ({wrong} wrong elements); first: {where}",
                       expected="#wrong 0", got=f"#wrong {w}")
    elif records and all(r["status"] == "skipped" for r in records):
        out.update(status="skipped", detail=records[0]["error"])
    return out


def main_job(cfg: Config, path: str) -> int:
    import anychip

    from .. import collectives
    comm = collectives.init()
    dev, n, rank = comm.device, comm.size, comm.rank
    lead = rank == 0
    out = _Writer(path if lead else None)
    base = cfg.deadline or max(10.0, 0.75 * cfg.timeout)
    deadline = Deadline(path, rank, base)
    row_deadlines = RowDeadlines(cfg, base)
    per_device = -(-n // max(1, dev.plugin.device_count()))
    if lead:
        out.write("start", device=str(dev), backend=dev.backend, simulated=bool(dev.simulated),
                  accelerator=bool(getattr(dev.plugin, "accelerator", True)), ranks=n,
                  transport=comm.transport.name, version=anychip.__version__)
    from .cases import DEVICE_CASES
    for name in DEVICE_CASES:
        deadline.case(name, "device")
        o = device_cases(dev, (name,), per_device, cfg.largest_copy)[0]
        merged = merge(o.name, "device", comm.exchange(o.to_json()))
        if lead:
            out.write("case", **merged)
    rows = plan(cfg)
    from .cases import sweep_rows
    timed = sweep_rows(cfg)
    for op in OPS:
        mine = [(i, r) for i, r in enumerate(rows) if r.op == op]
        if not mine:
            continue
        records = []
        t = time.perf_counter()
        for i, row in mine:
            deadline.case(op, "collective", row_deadlines.of(row, row in timed))
            t_row = time.perf_counter()
            rec = _row_record(row, comm.exchange(_run_row(comm, row, cfg, i, row in timed)), n)
            row_deadlines.saw(row, row in timed, time.perf_counter() - t_row)
            records.append(rec)
            if lead:
                out.write("row", **rec)
        if lead:
            out.write("case", **_op_case(op, records), seconds=time.perf_counter() - t)
    from .cases import COMM_CASES, FAULT_CASES
    later = [(name, "collective") for name in COMM_CASES if any(op in cfg.ops for op in OPS)]
    later += [(name, "fault") for name in FAULT_CASES if cfg.faults and name != "killed_rank"]
    for name, group in later:
        deadline.case(name, group)
        o = (comm_cases(comm, cfg, per_device, (name,)) if group == "collective" else fault_cases(comm, (name,)))[0]
        merged = merge(o.name, group, comm.exchange(o.to_json()))
        if lead:
            out.write("case", **merged)
    deadline.case("end of the job", "fault")
    comm.barrier().wait()
    comm.destroy()
    if lead:
        out.write("end")
    return 0


def killed_job() -> int:
    """The last rank dies (SIGKILL) while the others are in an all_reduce with it; each
    survivor prints what it got (the runner checks it)."""
    import anychip

    from .. import collectives
    comm = collectives.init()
    n, rank = comm.size, comm.rank
    buf = comm.device.alloc(4 << 20)
    comm.barrier().wait()
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.perf_counter()
    try:
        comm.all_reduce(buf, count=1 << 20).wait()
        kind, msg = "none", ""
    except anychip.AnychipError as exc:
        kind, msg = type(exc).__name__, str(exc)
    print(RESULT_PREFIX + json.dumps({"rank": rank, "error": kind, "message": msg,
                                      "seconds": time.perf_counter() - t}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        run = json.load(f)
    if run["job"] == "killed":
        return killed_job()
    return main_job(Config.from_json(run["config"]), run["out"])


if __name__ == "__main__":
    sys.exit(main())
