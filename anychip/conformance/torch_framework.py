"""``anychip conformance --framework torch``: the collective cases driven through PyTorch's
``torch.distributed`` on the ``anychip`` c10d backend (docs/torch.md), under ``anychip launch``,
on the PrivateUse1 device ``anychip`` bound to the backend (``ANYCHIP_TORCH``): every c10d op
value-checked on every rank on every dtype it takes (anychip/conformance/torch_worker.py),
then all_reduce, all_gather, broadcast and reduce_scatter timed per size with their values
checked, printed as nccl-tests tables. Certifying a chip this way certifies "PyTorch on this
chip".

Backends: those with an ``anychip/plugin.h`` face: the simulated chips and C plugins.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from .._spawn import python_command
from ..runtime.errors import InvalidArgumentError, UnsupportedError
from .paddle_framework import _table

__all__ = ["run"]

WORKER = Path(__file__).resolve().parent / "torch_worker.py"


def _one(name: str, nranks: int, sizes: tuple[int, int, int], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["ANYCHIP_TORCH"] = name
    cmd = python_command(["-m", "anychip", "launch", "-n", str(nranks), "--device", name, str(WORKER),
                          "--sizes", ",".join(map(str, sizes))])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        rc: int | str = done.returncode
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:     # the launcher was killed: its ranks die with it
        rc = f"timed out after {timeout:.0f} s"
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    per_rank = [[ln[len(f"[{r}] "):] for ln in text.splitlines() if ln.startswith(f"[{r}] ")] for r in range(nranks)]
    texts = ["\n".join(lines) for lines in per_rank]
    checks = [re.findall(r"^CHECK (\S+) (ok|FAIL.*)$", t, flags=re.M) for t in texts]
    rows = [re.findall(r"^ROW (\S+) (\d+) (\S+) (ok|WRONG)$", t, flags=re.M) for t in texts]
    device = next((m.group(1) for t in texts for m in [re.search(r"^RANK 0 of \d+ on (.+)$", t, flags=re.M)] if m),
                  None)
    fails = [f"rank {r}: {c} {v}" for r, cs in enumerate(checks) for c, v in cs if v != "ok"]
    done_all = all(re.search(rf"^DONE {r} failures=0 ", t, flags=re.M) for r, t in enumerate(texts))
    ok = rc == 0 and not fails and done_all
    return {"backend": name, "device": device, "ranks": nranks, "rc": rc, "checks": sum(len(c) for c in checks),
            "failures": fails, "rows": rows, "ok": ok, "tail": "" if ok else text[-2000:]}


def run(devices: str | None, nranks: int, min_bytes: int, max_bytes: int, factor: int, timeout: float) -> int:
    """Run the torch conformance on each named backend; print the tables; 0 when all pass."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UnsupportedError("--framework torch needs PyTorch: pip install 'anychip[torch]'") from None
    if nranks < 2:
        raise InvalidArgumentError(f"--framework torch needs at least 2 ranks, got -n {nranks}")
    names = [t.strip().lower() for t in (devices or "ascend").split(",") if t.strip()]
    results = []
    for name in names:
        res = _one(name, nranks, (min_bytes, max_bytes, factor), timeout)
        results.append(res)
        print(f"# anychip conformance --framework torch: {name} as {res['device'] or '?'}, {nranks} ranks "
              "under anychip launch, c10d backend anychip")
        print(_table(res, "torch.distributed"))
        print(f"# {res['checks']} value checks, {len(res['failures'])} failed")
        for f in res["failures"]:
            print(f"#   FAIL {f}")
        if res["tail"]:
            print(f"# the job ended with {res['rc']}:\n{res['tail']}")
        print()
    for res in results:
        print(f"{res['backend']:<12} {'PASS' if res['ok'] else 'FAIL'}")
    failed = [r["backend"] for r in results if not r["ok"]]
    print(f"\nconformance (torch): {'FAIL on ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0
