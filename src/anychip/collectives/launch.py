"""``anychip launch -n N [--device BACKEND] [-m] PROGRAM args...``: N ranks on this machine.

Rank r runs ``python prog.py args...`` (``python -m module args...`` with ``-m``; an
executable that is not a .py file runs as it is) with the launcher's interpreter, with
``ANYCHIP_RANK=r``, ``ANYCHIP_WORLD_SIZE=N``,
``ANYCHIP_LOCAL_RANK=r``, ``ANYCHIP_LOCAL_SIZE=N``, a fresh ``ANYCHIP_JOB_ID`` and, with
``--device``, ``ANYCHIP_LAUNCH_DEVICE`` (so :func:`anychip.collectives.init` puts rank r on
``BACKEND:r``); torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (a free port) too, so that ``torch.distributed``'s
``init_process_group`` finds its rendezvous. Unless the environment sets it,
``OMP_NUM_THREADS`` is the ranks' share of the CPUs (CPUs // N, at least 1), which
OpenBLAS, OpenMP and torch read: N ranks each starting a BLAS thread per CPU slow a job
down severalfold (torchrun sets it to 1). Every line a rank prints is prefixed with ``[r]``. When a rank fails, the
others are stopped (SIGTERM, then SIGKILL after ``--grace`` seconds) and the launcher exits
with the first failing rank's exit code (128 + signal number for a signal), as torchrun does.

The launcher always reaps its ranks: a second Ctrl-C (or SIGTERM) while it waits out the
grace period kills them at once; when a rank cannot be started, the ranks already started
are killed; on Linux each rank gets SIGKILL when the launcher dies (a parent-death
signal), so a SIGKILLed launcher leaves no rank behind.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from ._engine import sweep_segments

__all__ = ["launch", "add_parser", "main", "MAX_RANKS"]

#: most ranks of a job: those of one communicator of the collective engine (CCL_MAX_RANKS, csrc/ccl/ccl.h),
#: the cap of `anychip conformance -n` too
MAX_RANKS = 64


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _pump(src: IO[bytes], dst: IO[str], prefix: str, lock: threading.Lock) -> None:
    """Copy a rank's output line by line, prefixed. When the reader of ``dst`` goes away
    (``anychip launch ... | head``) the rest is drained and dropped, so ranks never block."""
    reader_gone = False
    for raw in iter(src.readline, b""):
        if reader_gone:
            continue
        line = raw.decode("utf-8", "replace")
        if not line.endswith("\n"):
            line += "\n"
        with lock:
            try:
                dst.write(prefix + line)
                dst.flush()
            except BrokenPipeError:
                reader_gone = True
                # as Python's docs advise: no second error when the interpreter flushes at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), dst.fileno())
    src.close()


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def launch(nprocs: int, argv: Sequence[str], device: str | None = None, grace: float = 5.0,
           env: dict[str, str] | None = None) -> int:
    """Run ``python argv...`` as ``nprocs`` ranks; returns the exit code (0 when all succeed)."""
    if nprocs < 1:
        raise ValueError(f"-n must be >= 1, got {nprocs}")
    if not argv:
        raise ValueError("no program given: anychip launch -n N prog.py [args...]")
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    try:
        _start(nprocs, argv, device, dict(os.environ if env is None else env), procs, pumps)
        failed = _watch(procs)
        if failed is not None:
            _stop(procs, grace)
        for p in procs:
            p.wait()
    except KeyboardInterrupt:            # while the ranks were starting
        failed = 130
    finally:
        _kill(procs)                    # whatever ended the launcher, no rank outlives it
        sweep_segments()                # ranks stopped while joining a communicator left its segment
    for t in pumps:
        t.join(timeout=5)
    return failed or 0


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL the ranks still running and reap them all."""
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        p.wait()


def _die_with_launcher(launcher: int) -> Callable[[], None] | None:
    """A function for Popen's preexec_fn that makes the rank get SIGKILL when the launcher
    dies (prctl(PR_SET_PDEATHSIG), Linux); None elsewhere. It runs between fork and exec,
    so it only calls a C function looked up beforehand."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher:     # the launcher died before the call: nobody to wait for us
            os._exit(1)

    return preexec


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(nprocs: int, argv: Sequence[str], device: str | None, base: dict[str, str],
           procs: list[subprocess.Popen], pumps: list[threading.Thread]) -> None:
    """The ranks (appended to ``procs`` as they start), with threads copying their output,
    each line prefixed with the rank."""
    job = f"launch-{os.getpid()}-{secrets.token_hex(4)}"
    lock = threading.Lock()
    preexec = _die_with_launcher(os.getpid())
    cmd = [sys.executable, *argv] if argv[0].endswith(".py") or argv[0] in ("-c", "-m") else list(argv)
    port = _free_port()
    threads = {} if "OMP_NUM_THREADS" in base else {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nprocs))}
    for r in range(nprocs):
        e = dict(base)
        e.update(threads)
        e.update(ANYCHIP_RANK=str(r), ANYCHIP_WORLD_SIZE=str(nprocs), ANYCHIP_LOCAL_RANK=str(r),
                 ANYCHIP_LOCAL_SIZE=str(nprocs), ANYCHIP_JOB_ID=job, PYTHONUNBUFFERED="1")
        # torch.distributed's env:// rendezvous (rank 0 serves its store on the port)
        e.update(RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nprocs),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if device:
            e["ANYCHIP_LAUNCH_DEVICE"] = device
        try:
            p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)
        except OSError as exc:
            from ..runtime.errors import AnychipError
            raise AnychipError(f"launch: starting rank {r} of {nprocs} ({' '.join(argv)}) failed: {exc}"
                               + (f"; the {r} rank(s) already started were stopped" if r else "")) from None
        procs.append(p)
        for src, dst in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=_pump, args=(src, dst, f"[{r}] ", lock), daemon=True)
            t.start()
            pumps.append(t)


def _watch(procs: list[subprocess.Popen]) -> int | None:
    """Wait until every rank has exited (None) or one failed (its exit code); SIGTERM or
    Ctrl-C to the launcher count as failures too."""

    def on_term(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, on_term)     # a stopped launcher stops its ranks
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = next((c for c in codes if c), None)
            if bad is not None:
                return _exit_code(bad)
            if all(c is not None for c in codes):
                return None
            time.sleep(0.02)
    except KeyboardInterrupt:
        return 130
    except _Stopped as stop:
        return 128 + stop.signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, or at once on a further Ctrl-C or
    SIGTERM to the launcher (a rank that traps SIGTERM to checkpoint may take its time;
    the user who presses Ctrl-C again does not want to wait for it)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)

    def escalate(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, escalate) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
    except (_Stopped, KeyboardInterrupt):
        pass                             # _kill below
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _kill(procs)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("launch", help="run a program as N collective ranks on this machine",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    p.add_argument("--device", default=None, help="backend of the ranks' devices (rank r uses BACKEND:r)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("-m", "--module", action="store_true", help="PROGRAM is a module, run as python -m PROGRAM")
    p.add_argument("program", help="the Python program (prog.py), a module with -m, or an executable")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=_cmd)
    return p


def _check_device(device: str) -> str:
    """``--device``: a backend that is available here (checked before any rank starts)."""
    from ..runtime import registry
    from ..runtime.errors import InvalidArgumentError
    name = device.strip().lower()
    if ":" in name:
        raise InvalidArgumentError(f"launch: --device takes a backend name (rank r runs on BACKEND:r), got "
                                   f"{device!r}; e.g. --device {name.partition(':')[0] or 'cpu'}")
    info = registry.backend(name)
    if info is None:
        known = ", ".join(b.name for b in registry.backends())
        raise InvalidArgumentError(f"launch: --device {device!r} is not a known backend; known: {known}")
    if not info.available:
        raise InvalidArgumentError(f"launch: --device {name} is unavailable here: {info.reason}")
    return name


def _cmd(args: argparse.Namespace) -> int:
    import math

    from ..runtime.errors import InvalidArgumentError
    if not 1 <= args.nprocs <= MAX_RANKS:
        raise InvalidArgumentError(f"launch: -n must be from 1 to {MAX_RANKS} (the collective engine's limit), "
                                   f"got {args.nprocs}")
    if not (args.grace >= 0 and math.isfinite(args.grace)):
        raise InvalidArgumentError(f"launch: --grace must be a number of seconds >= 0, got {args.grace}")
    if args.device is not None:
        args.device = _check_device(args.device)
    argv = ["-m", args.program, *args.args] if args.module else [args.program, *args.args]
    return launch(args.nprocs, argv, device=args.device, grace=args.grace)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anychip")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", *(sys.argv[1:] if argv is None else argv)])
    return _cmd(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
