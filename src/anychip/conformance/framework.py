"""``anychip conformance --framework torch|paddle``: certify a framework on a chip — what it
computes and its collectives — with the framework's own API, one runner for both.

Each rank of the framework's job (PyTorch: ``anychip launch`` with the ``anychip`` c10d backend
on the PrivateUse1 device bound to the backend, ``ANYCHIP_TORCH``; Paddle:
``python -m paddle.distributed.launch`` on the Paddle device type anychip provides, docs/paddle.md)
runs its framework's worker (torch_worker.py, paddle_worker.py) with ``--compute``: first the
compute checks on its device against the framework's CPU in the same process (torch_compute.py,
paddle_compute.py: ops forward and backward on every layout, optimizer steps, a 2-layer
Transformer eager and compiled / ``to_static``, float16 AMP, two streams and every device,
repeated), then every collective value-checked, then all_reduce, all_gather, broadcast and
reduce_scatter timed per size with their values checked, printed as nccl-tests tables.
Certifying a chip this way certifies "PyTorch on this chip" / "Paddle on this chip".

Every line a worker prints that the runner reads: ``RANK r of n on DEVICE``, ``CHECK name ok``
or ``CHECK name FAIL detail``, ``ROW op bytes seconds ok|WRONG``, ``DONE r failures=N``.

Backends: the simulated chips (ascend, kunlun, hygon) and C plugins (PyTorch: those with an
``anychip/plugin.h`` face; Paddle: the bridge installed with anychip for the simulated chips,
one compiled for the run for a C plugin).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..collectives._engine import sweep_segments
from ..runtime.errors import InvalidArgumentError, UnsupportedError
from ._stop import Stopped

__all__ = ["run", "run_launcher", "run_paddle_launch", "FRAMEWORKS"]

HERE = Path(__file__).resolve().parent
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "broadcast": lambda n: 1.0, "reduce_scatter": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class Framework:
    """What differs between the frameworks: the worker, how its job starts, where its ranks write."""

    name: str
    api: str                  # what the collectives go through (the tables' titles)
    launcher: str
    worker: Path

    def job(self, backend: str, nranks: int, args: list[str], tmp: Path) -> tuple[list[str], dict[str, str]]:
        if self.name == "paddle":
            env = _paddle_environment(backend, tmp)
            return ([sys.executable, "-m", "paddle.distributed.launch", "--log_dir", str(tmp / "logs"),
                     "--devices", ",".join(map(str, range(nranks))), str(self.worker), *args], env)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        env["ANYCHIP_TORCH"] = backend
        return [sys.executable, "-m", "anychip", "launch", "-n", str(nranks), "--device", backend, str(self.worker),
                               *args], env

    def rank_texts(self, nranks: int, output: str, tmp: Path) -> list[str]:
        """Each rank's lines: Paddle's launcher writes a log per rank, anychip's prefixes them."""
        if self.name == "paddle":
            logs = [tmp / "logs" / f"workerlog.{r}" for r in range(nranks)]
            return [p.read_text(errors="replace") if p.exists() else "" for p in logs]
        return ["\n".join(ln[len(f"[{r}] "):] for ln in output.splitlines() if ln.startswith(f"[{r}] "))
                for r in range(nranks)]


FRAMEWORKS = {
    "torch": Framework("torch", "torch.distributed", "anychip launch, c10d backend anychip", HERE / "torch_worker.py"),
    "paddle": Framework("paddle", "paddle.distributed", "paddle.distributed.launch", HERE / "paddle_worker.py"),
}


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


def _torch_face_problem(name: str) -> str | None:
    """Why backend ``name`` cannot be the PyTorch device (None when it can): the PrivateUse1
    device drives an anychip/plugin.h face, which built-in host backends and Python plugins lack."""
    from ..runtime import registry
    info = registry.backend(name)
    if info is None:
        return f"anychip has no backend {name!r}"
    if info.plugin is None or not info.available:
        return f"backend {name} is unavailable: {info.reason}"
    if not isinstance(getattr(info.plugin, "path", None) or getattr(info.plugin, "library_path", None), str):
        return (f"backend {name} ({info.source}) has no anychip/plugin.h face, which PyTorch's device and Paddle's "
                "run on (the simulated chips and C plugins have one; a Python plugin cannot)")
    return None


def _paddle_environment(name: str, tmp: Path) -> dict[str, str]:
    from .. import paddle_provider
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_"))}
    env["GLOG_minloglevel"] = "2"
    if name in paddle_provider.SIMULATED:
        bridge = paddle_provider.simulator_bridge()
        if bridge is None:
            raise UnsupportedError("this anychip was built without the Paddle bridge")
        if not env.get("CUSTOM_DEVICE_ROOT"):          # (importing paddle sets it to "")
            env["CUSTOM_DEVICE_ROOT"] = str(bridge.parent)
        env["ANYCHIP_PADDLE"] = name
        return env
    lib = _plugin_library(name)
    if lib is None:
        raise InvalidArgumentError(f"conformance --framework paddle: {name!r} is neither a simulated chip "
                                   f"({', '.join(paddle_provider.SIMULATED)}) nor a C plugin anychip finds "
                                   "(ANYCHIP_PLUGIN_PATH / the anychip.plugin_libraries entry point)")
    print(f"conformance --framework paddle: compiling the Paddle bridge for {name} ({lib})", file=sys.stderr,
          flush=True)
    paddle_provider.build_bridge(lib, tmp / "bridge")
    env["CUSTOM_DEVICE_ROOT"] = str(tmp / "bridge")
    env["ANYCHIP_PADDLE"] = "none"
    return env


def run_launcher(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=...)`` for a job's launcher (``anychip launch``, or Paddle's
    launcher, which starts each worker in a session of its own): when the job times out or
    this process is interrupted (Ctrl-C, SIGTERM turned into an exception), the launcher gets
    SIGTERM first, on which it stops its ranks, and SIGKILL only 10 s later (or at a further
    interrupt), so that no rank is left behind; then ``TimeoutExpired`` is raised as
    ``subprocess.run`` raises it, or the interrupt goes on."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _stop(p)
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        except BaseException:               # interrupted: the launcher and its ranks go first
            _stop(p)
            raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


run_paddle_launch = run_launcher


def _stop(p: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM to a launcher, SIGKILL after 10 s or at a further interrupt; its output. Then the
    segments of communicators its ranks were still making go (sweep_segments)."""
    p.terminate()
    try:
        return p.communicate(timeout=10)
    except BaseException:  # noqa: BLE001 - the 10 s passed, or a second Ctrl-C / SIGTERM: no more waiting
        p.kill()
        out, err = p.communicate()
        return out or "", err or ""
    finally:
        sweep_segments()


def _build_torch(backend: str, env: dict[str, str]) -> None:
    """``import anychip.torch`` once, as a rank would, before any job starts and outside its
    deadline: the first run on a machine compiles the extension here, showing its progress
    (the ``anychip.torch:`` lines), and a backend PyTorch cannot take is refused in one line.
    Interrupted, the import stops its compilers and removes their files (SIGTERM becomes an
    exception in it)."""
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))\n"
            "import anychip.torch\n")
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env) as p:
        kept = []
        try:
            assert p.stderr is not None
            for line in p.stderr:
                if line.startswith("anychip.torch: "):
                    print(f"conformance --framework torch: {line[len('anychip.torch: '):]}", end="",
                          file=sys.stderr, flush=True)
                else:
                    kept.append(line)
            p.wait()
        except BaseException:
            _stop(p)
            raise
    if p.returncode != 0:
        last = next((ln.strip() for ln in reversed(kept) if ln.strip()), f"exit code {p.returncode}")
        raise UnsupportedError(f"conformance --framework torch: import anychip.torch with ANYCHIP_TORCH={backend} "
                               f"failed: {last}")


def parse(texts: list[str]) -> dict[str, Any]:
    """What the ranks' lines say: the checks, the rows, the device, whether every rank finished."""
    checks = [re.findall(r"^CHECK (\S+) (ok|FAIL.*)$", t, flags=re.M) for t in texts]
    rows = [re.findall(r"^ROW (\S+) (\d+) (\S+) (ok|WRONG)$", t, flags=re.M) for t in texts]
    device = next((m.group(1) for t in texts for m in [re.search(r"^RANK 0 of \d+ on (.+)$", t, flags=re.M)] if m),
                  None)
    failed: dict[str, tuple[list[int], str]] = {}         # check -> (ranks, the first rank's detail)
    for r, cs in enumerate(checks):
        for name, verdict in cs:
            if verdict != "ok":
                ranks, detail = failed.setdefault(name, ([], verdict[len("FAIL"):].strip()))
                ranks.append(r)
    finished = all(re.search(rf"^DONE {r} failures=\d+", t, flags=re.M) for r, t in enumerate(texts))
    return {"checks": sum(len(c) for c in checks), "failed": failed, "rows": rows, "device": device,
            "finished": finished}


def _one(fw: Framework, name: str, nranks: int, sizes: tuple[int, int, int], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"anychip-{fw.name}-conf-") as tmpdir:
        tmp = Path(tmpdir)
        cmd, env = fw.job(name, nranks, ["--compute", "--sizes", ",".join(map(str, sizes))], tmp)
        if fw.name == "torch":
            _build_torch(name, env)                  # a first run's compile: before the job's clock starts
        try:
            done = run_launcher(cmd, timeout, env=env, cwd=tmp if fw.name == "paddle" else None)
            rc: int | str = done.returncode
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:     # the launcher was stopped: its ranks go with it
            rc = f"timed out after {timeout:.0f} s"
            out = exc.stdout or ""
            output = out.decode(errors="replace") if isinstance(out, bytes) else out
        texts = fw.rank_texts(nranks, output, tmp)
    res = parse(texts)
    ok = rc == 0 and not res["failed"] and res["finished"]
    ended_badly = not res["finished"] or (rc != 0 and not res["failed"])     # not (only) failed checks
    tail = next((t[-1500:] for t in texts if "Traceback" in t), output[-2000:]) if ended_badly else ""
    return {"backend": name, "ranks": nranks, "rc": rc, "ok": ok, "tail": tail, **res}


def _table(res: dict[str, Any], api: str) -> str:
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


@contextmanager
def _stoppable() -> Iterator[None]:
    """While it lasts, SIGTERM raises :class:`Stopped` (as Ctrl-C raises KeyboardInterrupt, which
    becomes Stopped too): a job being run stops its launcher and ranks on the way out
    (:func:`run_launcher`), and the run ends in one line (``anychip conformance``'s)."""
    def on_term(signum: int, frame: object) -> None:
        raise Stopped(128 + signum)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main else None
    try:
        yield
    except KeyboardInterrupt:
        raise Stopped(130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run(framework: str, devices: str | None, nranks: int, min_bytes: int, max_bytes: int, factor: int,
        timeout: float) -> int:
    """Certify ``framework`` on each named backend; print the failed checks and the tables; 0 when all pass."""
    fw = FRAMEWORKS[framework]
    import importlib.util
    if importlib.util.find_spec(fw.name) is None:          # (not imported here: the ranks import it)
        raise UnsupportedError(f"--framework {fw.name} needs {'PyTorch' if fw.name == 'torch' else 'PaddlePaddle'}: "
                               f"pip install 'anychip[{fw.name}]'")
    if nranks < 2:
        raise InvalidArgumentError(f"--framework {fw.name} needs at least 2 ranks, got -n {nranks}")
    names = [t.strip().lower() for t in (devices or "ascend").split(",") if t.strip()]
    for name in names if fw.name == "torch" else ():         # (the Paddle path refuses in _paddle_environment)
        problem = _torch_face_problem(name)
        if problem:
            raise InvalidArgumentError(f"conformance --framework torch: {problem}")
    with _stoppable():
        results = _run_all(fw, names, nranks, (min_bytes, max_bytes, factor), timeout)
    for res in results:
        print(f"{res['backend']:<12} {'PASS' if res['ok'] else 'FAIL'}")
    failed = [r["backend"] for r in results if not r["ok"]]
    print(f"\nconformance ({fw.name}): {'FAIL on ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0


def _run_all(fw: Framework, names: list[str], nranks: int, sizes: tuple[int, int, int],
             timeout: float) -> list[dict[str, Any]]:
    """Each backend's job in turn, its report printed as it ends; a job stopped by a signal
    (its launcher's 130 / 143) stops the run (:class:`Stopped`)."""
    results = []
    for name in names:
        res = _one(fw, name, nranks, sizes, timeout)
        if res["rc"] in (130, 143):
            raise Stopped(int(res["rc"]))
        results.append(res)
        print(f"# anychip conformance --framework {fw.name}: {name} as {res['device'] or '?'}, {nranks} ranks "
              f"under {fw.launcher}")
        print(_table(res, fw.api))
        print(f"# {res['checks']} value checks, {sum(len(r) for r, _ in res['failed'].values())} failed")
        for check, (ranks, detail) in res["failed"].items():
            print(f"#   FAIL {check} (rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}): {detail}")
        if res["tail"]:
            print(f"# the job ended with {res['rc']}:\n{res['tail']}")
        print()
    return results
