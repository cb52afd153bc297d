"""``anychip conformance --framework paddle``: the collective cases driven through
PaddlePaddle's own API (``paddle.distributed`` under ``python -m paddle.distributed.launch``),
on the Paddle device type anychip provides for a backend (docs/paddle.md): every collective
value-checked on every rank (anychip/conformance/paddle_worker.py), then all_reduce,
all_gather, broadcast and reduce_scatter timed per size with their values checked, printed
as nccl-tests tables. Certifying a chip this way certifies "Paddle on this chip".

Backends: the simulated chips (ascend, kunlun, hygon: the bridge installed with anychip,
ANYCHIP_PADDLE picking the chip) and C plugins (their bridge compiled for the run).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import paddle_provider
from ..runtime.errors import InvalidArgumentError, UnsupportedError

__all__ = ["run", "run_paddle_launch"]

WORKER = Path(__file__).resolve().parent / "paddle_worker.py"
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "broadcast": lambda n: 1.0, "reduce_scatter": lambda n: (n - 1) / n}


def _plugin_library(name: str) -> str | None:
    from ..runtime import registry
    from ..runtime.errors import PluginError
    for path, _how in registry._plugin_libraries():
        try:
            symbol, probe = registry._library_probe(path)
            if symbol == "anychip_plugin_init" and probe(path)[0] == name:
                return path
        except PluginError:
            continue
    return None


def _environment(name: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env["GLOG_minloglevel"] = "2"
    if name in paddle_provider.SIMULATED:
        bridge = paddle_provider.simulator_bridge()
        if bridge is None:
            raise UnsupportedError("this anychip was built without the Paddle bridge")
        env.setdefault("CUSTOM_DEVICE_ROOT", str(bridge.parent))
        env["ANYCHIP_PADDLE"] = name
        return env
    lib = _plugin_library(name)
    if lib is None:
        raise InvalidArgumentError(f"conformance --framework paddle: {name!r} is neither a simulated chip "
                                   f"({', '.join(paddle_provider.SIMULATED)}) nor a C plugin anychip finds "
                                   "(ANYCHIP_PLUGIN_PATH / the anychip.plugin_libraries entry point)")
    paddle_provider.build_bridge(lib, tmp / "bridge")
    env["CUSTOM_DEVICE_ROOT"] = str(tmp / "bridge")
    env["ANYCHIP_PADDLE"] = "none"
    return env


def run_paddle_launch(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=...)`` for Paddle's launcher, which starts each worker in a
    session of its own: on a timeout the launcher gets SIGTERM first, on which it stops its
    workers, and SIGKILL only 10 s later, so that no worker is left behind; then
    ``TimeoutExpired`` is raised as ``subprocess.run`` raises it."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        except BaseException:               # interrupted: the launcher goes, as subprocess.run does
            p.kill()
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _one(name: str, nranks: int, sizes: tuple[int, int, int], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="anychip-paddle-conf-") as tmpdir:
        tmp = Path(tmpdir)
        env = _environment(name, tmp)
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp / "logs"), "--devices",
               ",".join(map(str, range(nranks))), str(WORKER), "--sizes", ",".join(map(str, sizes))]
        try:
            done = run_paddle_launch(cmd, timeout, env=env, cwd=tmp)
            rc: int | str = done.returncode
        except subprocess.TimeoutExpired:
            rc = f"timed out after {timeout:.0f} s"
        logs = [(tmp / "logs" / f"workerlog.{r}") for r in range(nranks)]
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
    checks = [re.findall(r"^CHECK (\S+) (ok|FAIL.*)$", t, flags=re.M) for t in texts]
    rows = [re.findall(r"^ROW (\S+) (\d+) (\S+) (ok|WRONG)$", t, flags=re.M) for t in texts]
    device = next((m.group(1) for t in texts for m in [re.search(r"^RANK 0 of \d+ on (\S+)$", t, flags=re.M)] if m),
                  None)
    fails = [f"rank {r}: {c} {v}" for r, cs in enumerate(checks) for c, v in cs if v != "ok"]
    done_all = all(re.search(rf"^DONE {r} failures=0$", t, flags=re.M) for r, t in enumerate(texts))
    tail = next((t[-1500:] for t in texts if "Traceback" in t or "Error" in t), "")
    ok = rc == 0 and not fails and done_all
    return {"backend": name, "device": device, "ranks": nranks, "rc": rc, "checks": sum(len(c) for c in checks),
            "failures": fails, "rows": rows, "ok": ok, "tail": "" if ok else tail}


def _table(res: dict[str, Any], api: str = "paddle.distributed") -> str:
    n = res["ranks"]
    merged: dict[tuple[str, int], tuple[float, bool]] = {}
    for rank_rows in res["rows"]:
        for op, size, secs, ok in rank_rows:
            key = (op, int(size))
            old = merged.get(key, (0.0, True))
            merged[key] = (max(old[0], float(secs)), old[1] and ok == "ok")   # the slowest rank
    out = []
    for op in BUS:
        lines = [(size, t, ok) for (o, size), (t, ok) in sorted(merged.items()) if o == op]
        if not lines:
            continue
        out.append(f"# {op} ({api}), float32, sum")
        out.append(f"#{'size':>12}{'count':>12}{'time(us)':>12}{'algbw':>9}{'busbw':>9}{'#wrong':>8}")
        for size, t, ok in lines:
            alg = size / t / 1e9 if t > 0 else 0.0
            out.append(f" {size:>12}{size // 4:>12}{t * 1e6:>12.1f}{alg:>9.3f}{alg * BUS[op](n):>9.3f}"
                       f"{0 if ok else 1:>8}")
    return "\n".join(out)


def run(devices: str | None, nranks: int, min_bytes: int, max_bytes: int, factor: int, timeout: float) -> int:
    """Run the Paddle conformance on each named backend; print the tables; 0 when all pass."""
    try:
        import paddle  # noqa: F401
    except ImportError:
        raise UnsupportedError("--framework paddle needs PaddlePaddle: pip install 'anychip[paddle]'") from None
    if nranks < 2:
        raise InvalidArgumentError(f"--framework paddle needs at least 2 ranks, got -n {nranks}")
    names = [t.strip().lower() for t in (devices or "ascend").split(",") if t.strip()]
    results = []
    for name in names:
        res = _one(name, nranks, (min_bytes, max_bytes, factor), timeout)
        results.append(res)
        print(f"# anychip conformance --framework paddle: {name} as {res['device'] or '?'}, {nranks} ranks "
              f"under paddle.distributed.launch")
        print(_table(res))
        print(f"# {res['checks']} value checks, {len(res['failures'])} failed")
        for f in res["failures"]:
            print(f"#   FAIL {f}")
        if res["tail"]:
            print(f"# the job ended with {res['rc']}:\n{res['tail']}")
        print()
    for res in results:
        print(f"{res['backend']:<12} {'PASS' if res['ok'] else 'FAIL'}")
    failed = [r["backend"] for r in results if not r["ok"]]
    print(f"\nconformance (paddle): {'FAIL on ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0
