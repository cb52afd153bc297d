"""One rank of the native-library tests (run by tests/collectives/test_native_ccl.py).

    native_ccl_worker.py matrix COUNTS BIG   every op x dtype x reduce op (tests/collectives/ccl_worker.py's
                                             cases) on the native transport, which it asserts
    native_ccl_worker.py timeout SECONDS     the last rank never joins the op: the others print
                                             'RESULT <exception>|<seconds>|<message>'
    native_ccl_worker.py kill                rank 1 dies with an op enqueued and not started: the same line
    native_ccl_worker.py stuck SECONDS       every rank's op is enqueued behind a held stream, so it never
                                             runs: the watchdog fails it after the timeout (the same line),
                                             then the hold is released and the next call fails at once
    native_ccl_worker.py two SECONDS         two communicators of one process, made with timeouts of 60 s
                                             and SECONDS: the last rank skips an op of the short one (the
                                             others print the same line), then every rank all_reduces on
                                             the long one ('LONG <sum>'); 'ENV ...' says the variable is
                                             untouched
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ccl_worker  # noqa: E402

import anychip  # noqa: E402
from anychip import collectives  # noqa: E402


def two(short_s: float) -> None:
    """Each communicator has its own timeout (collectives.init(timeout=...))."""
    long = collectives.init(timeout=60.0)
    short = collectives.init(timeout=short_s)      # made once every rank is up (long's init)
    print(f"ENV {os.environ.get('ANYCHIP_COLLECTIVE_TIMEOUT', 'unset')} {short.transport.name}", flush=True)
    dev, r = short.device, short.rank
    buf = dev.alloc(4 * 1000).copy_from(np.ones(1000, dtype=np.float32))
    if r != short.size - 1:
        t = time.perf_counter()
        try:
            short.all_reduce(buf).wait()
            outcome, msg = "none", ""
        except anychip.AnychipError as exc:
            outcome, msg = type(exc).__name__, str(exc)
        print(f"RESULT {outcome}|{time.perf_counter() - t:.3f}|{msg}", flush=True)
    x = dev.alloc(4 * 4).copy_from(np.full(4, r + 1, dtype=np.float32))
    long.all_reduce(x).wait()          # the last rank waits here while the others time out on short
    print(f"LONG {x.to_numpy(np.float32).tolist()}", flush=True)
    short.destroy()                    # (the last rank's, only now: a peer that leaves fails the op at once)
    long.destroy()


def main() -> None:
    suite = sys.argv[1]
    if suite == "two":
        two(float(sys.argv[2]))
        return
    comm = collectives.init()
    name = comm.transport.name
    assert name.startswith("native/"), name
    if suite == "matrix":
        counts = [int(c) for c in sys.argv[2].split(",")]
        big = int(sys.argv[3]) or None
        n = ccl_worker.matrix(comm, counts, big, ("float32", "bfloat16", "int8", "float64"))
        comm.destroy()
        print(f"PASS {n} cases via {name}", flush=True)
        return
    if suite in ("timeout", "stuck"):
        # the short timeout applies to a communicator made once every rank is up (a rank's
        # interpreter can start seconds after the others on a loaded machine)
        os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = sys.argv[2]
        comm = comm.split(0)
    dev, r = comm.device, comm.rank
    buf = dev.alloc(4 * 100_000).copy_from(np.ones(100_000, dtype=np.float32))
    if suite == "kill" and r == 1:
        # enqueued behind a held stream, so it has certainly not run when the process dies
        stream = dev.current_stream()
        dev.plugin.sim_hold_stream(dev.index, stream._live())
        comm.all_reduce(buf)
        os.kill(os.getpid(), signal.SIGKILL)
    stream = dev.current_stream()
    if suite == "stuck":
        dev.plugin.sim_hold_stream(dev.index, stream._live())
    if suite == "timeout" and r == comm.size - 1:
        sys.stdin.read()                      # alive, but never joins
        return
    t = time.perf_counter()
    try:
        comm.all_reduce(buf).wait()
        outcome, msg = "none", ""
    except anychip.AnychipError as exc:
        outcome, msg = type(exc).__name__, str(exc)
    print(f"RESULT {outcome}|{time.perf_counter() - t:.3f}|{msg}", flush=True)
    if suite == "stuck":
        dev.plugin.sim_release_stream(dev.index, stream._live())
        stream.synchronize()
        try:
            comm.all_reduce(buf)
        except anychip.AnychipError as exc:
            print(f"LATER {type(exc).__name__}|{exc}", flush=True)


if __name__ == "__main__":
    main()
