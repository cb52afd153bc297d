"""Running the suite on one backend: the ranks, the progress bar, the killed-rank job.

The main job runs with ``anychip launch`` (:func:`anychip.collectives.launch.launch`):
N ranks of ``python -m anychip.conformance._rank``, rank r on ``BACKEND:r`` (or r mod
the backend's device count). Rank 0 gathers every rank's outcome and writes the records;
this process reads them as they come. Each rank finds its backend through the registry
on its own (built-ins, entry points, ``ANYCHIP_PLUGIN_PATH``), so any plugin a fresh
process can discover can be certified.

The killed-rank case needs ranks that outlive a dead peer, which the launcher (rightly)
stops when one rank fails; its ranks are started directly, with the same variables.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .cases import CASE_NAMES, COMM_CASES, DEVICE_CASES, FAULT_CASES, OPS, Config, names_rank, plan

__all__ = ["run_backend", "available_backends", "Progress"]

_RANK_MODULE = "anychip.conformance._rank"


def available_backends() -> list[tuple[str, bool, str]]:
    """(name, available, reason) of every backend the registry knows, in priority order."""
    from ..runtime.registry import backends
    return [(b.name, b.available, b.reason) for b in backends()]


class Progress:
    """A one-line progress bar on a stream (stderr), redrawn at most 10 times a second."""

    def __init__(self, stream: Any = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._last = 0.0
        self._shown = False

    def update(self, label: str, done: int, total: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        self.stream.write(f"\r{label:<12} [{'#' * fill}{'.' * (self.width - fill)}] {done}/{total}")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def _read(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break                    # a line being written
    return out


def _job_env(cfg: Config, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["ANYCHIP_COLLECTIVE_TIMEOUT"] = str(cfg.timeout)
    env.pop("ANYCHIP_COLLECTIVE_CHECK", None)
    env.update(extra or {})
    return env


def _main_job(backend: str, cfg: Config, tmp: str, on_record: Callable[[int], None]) -> tuple[int, list[dict]]:
    from ..collectives.launch import launch
    out = os.path.join(tmp, "records.jsonl")
    run = os.path.join(tmp, "run.json")
    with open(run, "w", encoding="utf-8") as f:
        json.dump({"job": "main", "config": cfg.to_json(), "out": out}, f)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            on_record(len(_read(out)))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        rc = launch(cfg.ranks, ["-m", _RANK_MODULE, run], device=backend, env=_job_env(cfg))
    finally:
        stop.set()
        t.join()
    records = _read(out)
    on_record(len(records))
    return rc, records


def killed_rank(backend: str, cfg: Config, tmp: str) -> dict:
    """The killed-rank case: the last of ``cfg.ranks`` ranks is SIGKILLed while the others
    all_reduce with it; each survivor must raise CollectiveError naming it within 10 s."""
    n = cfg.ranks
    case: dict[str, Any] = {"name": "killed_rank", "group": "fault", "status": "passed", "detail": "",
                            "expected": "", "got": "", "seconds": 0.0, "rank": None, "extra": {}}
    if n < 2:
        case.update(status="skipped", detail="needs at least 2 ranks")
        return case
    run = os.path.join(tmp, "killed.json")
    with open(run, "w", encoding="utf-8") as f:
        json.dump({"job": "killed", "config": cfg.to_json(), "out": None}, f)
    job = f"conformance-{os.getpid()}-{secrets.token_hex(4)}"
    env = _job_env(cfg, {"ANYCHIP_COLLECTIVE_TIMEOUT": "30", "ANYCHIP_WORLD_SIZE": str(n),
                         "ANYCHIP_LOCAL_SIZE": str(n), "ANYCHIP_JOB_ID": job, "ANYCHIP_LAUNCH_DEVICE": backend,
                         "PYTHONUNBUFFERED": "1"})
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", _RANK_MODULE, run],
                              env={**env, "ANYCHIP_RANK": str(r), "ANYCHIP_LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    outs = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        outs.append((p.returncode, so, se))
    case["seconds"] = time.perf_counter() - t
    want = f"CollectiveError naming missing rank {n - 1} within 10 s"
    problems = []
    if outs[-1][0] != -9:
        rc, _, err = outs[-1]
        problems.append((n - 1, f"rank {n - 1} exited with {rc} instead of being killed: {err[-300:]}"))
    for r, (rc, so, se) in enumerate(outs[:-1]):
        line = next((x for x in so.splitlines() if x.startswith("CONFORMANCE-RESULT ")), None)
        if rc != 0 or line is None:
            problems.append((r, f"exit {rc} without a result: {(se or so).strip()[-400:]}"))
            continue
        got = json.loads(line.split(" ", 1)[1])
        ok = (got["error"] in ("CollectiveError", "CollectiveTimeout") and names_rank(got["message"], n - 1)
              and got["seconds"] < 10)
        if not ok:
            problems.append((r, f"{got['error']} after {got['seconds']:.1f} s: {got['message'] or 'no error'}"))
    if problems:
        r, msg = problems[0]
        case.update(status="failed", rank=r, detail=f"rank {r}: expected {want}, got {msg}", expected=want, got=msg)
    return case


def _missing(name: str, rc: int) -> dict:
    group = "device" if name in DEVICE_CASES else ("fault" if name in FAULT_CASES else "collective")
    why = f"not run: the job ended with exit code {rc} before this case (the ranks' output is above)"
    return {"name": name, "group": group, "status": "failed", "detail": why, "expected": "a result", "got": why,
            "seconds": 0.0, "rank": None, "extra": {}}


def run_backend(backend: str, cfg: Config, progress: Progress | None = None) -> dict:
    """Run the suite on ``backend`` with ``cfg.ranks`` ranks; the backend's result (see
    :mod:`.report` for its shape)."""
    from ..runtime.registry import backend as lookup
    info = lookup(backend)
    result: dict[str, Any] = {"backend": backend, "ranks": cfg.ranks, "cases": [], "rows": [], "exit_code": 0}
    if info is None or not info.available:
        result["unavailable"] = "unknown backend" if info is None else info.reason
        return result
    plugin = info.plugin
    result["simulated"] = bool(info.simulated)
    result["kind"] = "host" if not getattr(plugin, "accelerator", True) else (
        "simulated" if info.simulated else "real")
    rows = len(plan(cfg))
    wanted = [c for c in CASE_NAMES if c in DEVICE_CASES or c in cfg.ops or (cfg.faults and c in FAULT_CASES)
              or (c in COMM_CASES and any(op in cfg.ops for op in OPS))]
    total = rows + len(wanted) + 2

    def on_record(k: int) -> None:
        if progress is not None:
            progress.update(backend, min(k, total), total)

    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anychip-conformance-") as tmp:
        rc, records = _main_job(backend, cfg, tmp, on_record)
        start = next((r for r in records if r["type"] == "start"), {})
        result.update(device=start.get("device"), transport=start.get("transport"), exit_code=rc)
        result["rows"] = [{k: v for k, v in r.items() if k != "type"} for r in records if r["type"] == "row"]
        cases = {r["name"]: {k: v for k, v in r.items() if k != "type"} for r in records if r["type"] == "case"}
        if cfg.faults and "killed_rank" in wanted and rc not in (130, 143):      # not after Ctrl-C / SIGTERM
            cases["killed_rank"] = killed_rank(backend, cfg, tmp)
    if progress is not None:
        progress.update(backend, total, total, force=True)
        progress.close()
    result["cases"] = [cases.get(name) or _missing(name, rc) for name in wanted]
    result["seconds"] = time.perf_counter() - t
    return result


def ops_of(cfg: Config) -> list[str]:
    return [op for op in OPS if op in cfg.ops]
