"""``anychip launch -n N [--device BACKEND] [-m] PROGRAM args...``: N ranks on this machine.

Rank r runs ``python prog.py args...`` (``python -m module args...`` with ``-m``; an
executable that is not a .py file runs as it is), importing the launcher's own anychip
whatever the current directory holds (see :mod:`anychip._spawn`), with ``ANYCHIP_RANK=r``, ``ANYCHIP_WORLD_SIZE=N``,
``ANYCHIP_LOCAL_RANK=r``, ``ANYCHIP_LOCAL_SIZE=N``, a fresh ``ANYCHIP_JOB_ID`` and, with
``--device``, ``ANYCHIP_LAUNCH_DEVICE`` (so :func:`anychip.collectives.init` puts rank r on
``BACKEND:r``). Every line a rank prints is prefixed with ``[r]``. When a rank fails, the
others are stopped (SIGTERM, then SIGKILL after ``--grace`` seconds) and the launcher exits
with the first failing rank's exit code (128 + signal number for a signal), as torchrun does.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from .._spawn import python_command

__all__ = ["launch", "add_parser", "main"]


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
    procs, pumps = _start(nprocs, argv, device, dict(os.environ if env is None else env))
    failed = _watch(procs)
    if failed is not None:
        _stop(procs, grace)
    for p in procs:
        p.wait()
    for t in pumps:
        t.join(timeout=5)
    return failed or 0


def _start(nprocs: int, argv: Sequence[str], device: str | None,
           base: dict[str, str]) -> tuple[list[subprocess.Popen], list[threading.Thread]]:
    """The ranks, with threads copying their output, each line prefixed with the rank."""
    job = f"launch-{os.getpid()}-{secrets.token_hex(4)}"
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    cmd = python_command(argv) if argv[0].endswith(".py") or argv[0] in ("-c", "-m") else list(argv)
    for r in range(nprocs):
        e = dict(base)
        e.update(ANYCHIP_RANK=str(r), ANYCHIP_WORLD_SIZE=str(nprocs), ANYCHIP_LOCAL_RANK=str(r),
                 ANYCHIP_LOCAL_SIZE=str(nprocs), ANYCHIP_JOB_ID=job, PYTHONUNBUFFERED="1")
        if device:
            e["ANYCHIP_LAUNCH_DEVICE"] = device
        p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        for src, dst in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            t = threading.Thread(target=_pump, args=(src, dst, f"[{r}] ", lock), daemon=True)
            t.start()
            pumps.append(t)
    return procs, pumps


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
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


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


def _cmd(args: argparse.Namespace) -> int:
    from ..runtime.errors import InvalidArgumentError
    if args.nprocs < 1:
        raise InvalidArgumentError(f"launch: -n must be at least 1, got {args.nprocs}")
    argv = ["-m", args.program, *args.args] if args.module else [args.program, *args.args]
    return launch(args.nprocs, argv, device=args.device, grace=args.grace)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anychip")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["launch", *(sys.argv[1:] if argv is None else argv)])
    return _cmd(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
